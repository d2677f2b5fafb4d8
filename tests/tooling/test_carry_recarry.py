"""Re-carrying a carried series: it needs --force, says what changes and replays the kept
resolutions and their reasons.

Real repositories on the real wheels (0.5.21 pinned, 0.5.23 from PyPI, cached by the bf16k cache),
on the probe series of ``carry_probe``.
"""

from __future__ import annotations

import pytest

from bf16k import carried, gitutil, patches

from .carry_probe import (
    NOTES,
    NOTES_PATCH,
    PROBE,
    PROBE_PATCH,
    REL,
    _carry_probe_with_fix,
    _commit,
    _tree,
    make_probe_product,
)
from .conftest import Product
from .rebase_support import _cli


@pytest.fixture
def probe_product(product: Product, monkeypatch: pytest.MonkeyPatch) -> Product:
    return make_probe_product(product, monkeypatch)


# --------------------------------------------------------------------------- re-carrying


@pytest.mark.slow
def test_recarry_needs_force_says_what_changes_and_replays_the_resolutions(probe_product: Product) -> None:
    p = probe_product
    _carry_probe_with_fix(p)
    _commit(p, "carried")
    nxt = p.root / "series" / "next" / REL
    # Another engineer changes the notes patch in series/.
    notes = p.upstream / NOTES
    notes.write_text("bf16 index keys: probe notes, second edition\n")
    gitutil.git(["commit", "-q", "-a", "--fixup", "HEAD"], p.upstream)
    gitutil.git(["rebase", "-q", "-i", "--autosquash", "refs/patches/upstream-head"], p.upstream)
    patches.export(p.target)
    _commit(p, "notes changed")

    code, _, err = _cli(p.root, "rebase", REL)
    assert code == 2
    assert f"series/next/{REL}/ exists: 2 patches carried from series" in err
    assert f"changed: {NOTES_PATCH}" in err and "replays the recorded resolutions" in err
    assert f"nox -s rebase -- {REL} --force" in err and "--recarry" in err

    code, out, err = _cli(p.root, "rebase", "--recarry")
    assert code == 0, out + err
    assert f"replaying series/next/{REL}/ for the first 2 patches" in out
    # The test fix made at the first carry is still there; the notes edit came along.
    assert '+    assert _release() == "0.5.23"' in (nxt / PROBE_PATCH).read_text()
    assert "second edition" in (nxt / NOTES_PATCH).read_text()
    assert [r.kind for r in carried.load(nxt).resolutions] == ["tests"]  # the reason was kept
    assert f"CHANGELOG.md: replaced the [Unreleased] entry for {REL}" in out
    assert (p.root / "CHANGELOG.md").read_text().count(f"`series/next/{REL}/`") == 1
    _commit(p, "re-carried")

    # Now series/ changes the very line the carry fixed: the replay stops there.
    probe = p.upstream / PROBE
    probe.write_text(
        probe.read_text().replace('assert _release() == "0.5.21"', 'assert _release() == "0.5.21", "probe"')
    )
    gitutil.git(["commit", "-q", "-a", "--fixup", "HEAD~1"], p.upstream)
    gitutil.git(["rebase", "-q", "-i", "--autosquash", "refs/patches/upstream-head"], p.upstream)
    patches.export(p.target)
    _commit(p, "probe changed")
    code, out, err = _cli(p.root, "rebase", "--recarry", REL)
    assert code == 1, out + err
    assert f"re-carry to sglang {REL} stopped at patch 1 of 2: '{PROBE_PATCH}'" in out
    assert "the carried series resolved these before, saying:" in out and "the series is on 0.5.23 now" in out
    text = (_tree(p) / PROBE).read_text()
    assert "<<<<<<< carried" in text and "||||||| series-then" in text and ">>>>>>> series-now" in text
    lines = text.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("<<<<<<< "))
    end = next(i for i, ln in enumerate(lines) if ln.startswith(">>>>>>> "))
    lines[start : end + 1] = ['    assert _release() == "0.5.23", "probe"']
    (_tree(p) / PROBE).write_text("\n".join(lines))
    code, out, err = _cli(
        p.root, "rebase", "--continue", "-m", "test_release_probe.py: keep 0.5.23 and the message"
    )
    assert code == 0, out + err
    assert (
        '+    assert _release() == "0.5.23", "probe"'
        in (p.root / "series" / "next" / REL / PROBE_PATCH).read_text()
    )
