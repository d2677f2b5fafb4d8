import pytest

from verify import platform as P


@pytest.fixture(scope="session", autouse=True)
def upstream_importable():
    if P.sglang_root() is None:
        pytest.skip("the patched upstream tree is not importable (run nox -s apply)")
