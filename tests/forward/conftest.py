import pytest

from verify.core import upstream as U


@pytest.fixture(scope="session", autouse=True)
def upstream_importable():
    if U.sglang_root() is None:
        pytest.skip("the patched upstream tree is not importable (run nox -s apply)")
