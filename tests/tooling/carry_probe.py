"""The probe series the carry tests share: a series test that only holds on the release it was
written for (it reads the tree's own ``sglang/_version.py``) and a data file, so a carry's gate
has no heavy module to import and each carry takes seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bf16k import gitutil, patches, seriestests

from .conftest import TRAILERS, WHY, Product
from .rebase_support import _cli

REL = "0.5.23"
PROBE = "test/registered/unit/test_release_probe.py"
PROBE_PATCH = "add-a-release-probe-test.patch"
NOTES = "python/sglang/srt/layers/attention/dsv4/BF16K_PROBE.txt"
NOTES_PATCH = "add-the-probe-notes.patch"
PROBE_TEXT = '''"""Holds only on the release the series was written for: the tooling tests' probe."""
import importlib.util
from pathlib import Path


def _release():
    path = Path(__file__).resolve().parents[3] / "python" / "sglang" / "_version.py"
    spec = importlib.util.spec_from_file_location("sglang_release_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.__version__


def test_release_is_the_one_the_series_was_written_for():
    assert _release() == "0.5.21"
'''
NODE = f"{PROBE}::test_release_is_the_one_the_series_was_written_for"
EPOCH = "1924992000"  # 2031-01-01: the date a changed patch's Last-Update gets here


def make_probe_product(product: Product, monkeypatch: pytest.MonkeyPatch) -> Product:
    """Two patches: the probe test (fails on 0.5.23) and a data file; committed as a user would."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    monkeypatch.setenv(seriestests.PYTHON_ENV, sys.executable)  # the tests venv runs the series tests
    product.commit_patch(PROBE, None, PROBE_TEXT, "[DSV4] add a release probe test", WHY, TRAILERS)
    product.commit_patch(
        NOTES, None, "bf16 index keys: probe notes\n", "[DSV4] add the probe notes", WHY, TRAILERS
    )
    patches.export(product.target)
    _commit(product, "series")
    return product


def _commit(p: Product, message: str) -> None:
    gitutil.git(["add", "-A", "series", "pin.toml"], p.root)
    if (p.root / "CHANGELOG.md").is_file():
        gitutil.git(["add", "CHANGELOG.md"], p.root)
    gitutil.git(["commit", "-q", "-m", message], p.root)


def _tree(p: Product) -> Path:
    return p.root / "build" / "upstream" / REL


def _carry_probe_with_fix(p: Product) -> None:
    """Carry to 0.5.23: the probe fails, is fixed by intent, the carry finishes."""
    code, out, err = _cli(p.root, "rebase", REL)
    assert code == 1, out + err
    probe = _tree(p) / PROBE
    probe.write_text(probe.read_text().replace('== "0.5.21"', '== "0.5.23"'))
    code, out, err = _cli(
        p.root, "rebase", "--continue", "-m", "test_release_probe.py: the series is on 0.5.23 now"
    )
    assert code == 0, out + err
