"""rebase-check runs each carried series' own tests on its release, and fails clearly without a
Python to run them.

Real repositories on the real wheels (0.5.21 pinned, 0.5.23 from PyPI, cached by the bf16k cache),
on the probe series of ``carry_probe``.
"""

from __future__ import annotations

import pytest

from bf16k import gitutil, patches, project, seriestests

from .carry_probe import NODE, PROBE, PROBE_PATCH, REL, _carry_probe_with_fix, _commit, make_probe_product
from .conftest import Product
from .rebase_support import _cli


@pytest.fixture
def probe_product(product: Product, monkeypatch: pytest.MonkeyPatch) -> Product:
    return make_probe_product(product, monkeypatch)


# --------------------------------------------------------------------------- rebase-check


@pytest.mark.slow
def test_rebase_check_fails_when_a_carried_series_test_fails(probe_product: Product) -> None:
    p = probe_product
    _carry_probe_with_fix(p)
    _commit(p, "carried")
    # --releases 0.5.21: no newer release to try, only the carried series to check.
    code, out, err = _cli(p.root, "rebase-check", "--releases", "0.5.21")
    assert code == 0, out + err
    assert "Newer releases checked: none." in out
    assert (
        f"`series/next/{REL}/`: applies on its release, exports byte-identically, its series tests pass (1 passed"
        in out
    )
    # Deliberately break the carried test, the way a patch is changed (it still applies and
    # round-trips): edit in the carried tree, fixup, export.
    t = project.target(p.root, REL)
    patches.apply(t)
    probe = t.upstream_dir / PROBE
    probe.write_text(probe.read_text().replace('== "0.5.23"', '== "0.5.99"'))
    gitutil.git(["commit", "-q", "-a", "--fixup", "HEAD~1"], t.upstream_dir)
    gitutil.git(["rebase", "-q", "-i", "--autosquash", "refs/patches/upstream-head"], t.upstream_dir)
    patches.export(t)
    assert '== "0.5.99"' in (p.root / "series" / "next" / REL / PROBE_PATCH).read_text()
    code, out, err = _cli(p.root, "rebase-check", "--releases", "0.5.21")
    assert code == 1, out + err
    assert f"`series/next/{REL}/`: applies and exports byte-identically, but its series tests **FAIL**" in out
    assert f"`{NODE}`" in out and "Result: FAILED" in out


def test_rebase_check_without_a_test_python_fails_clearly(
    probe_product: Product, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(seriestests.PYTHON_ENV, "/nonexistent/python")
    code, _, err = _cli(probe_product.root, "rebase-check", "--releases", "0.5.21")
    assert code == 2 and "cannot run the series' tests" in err
