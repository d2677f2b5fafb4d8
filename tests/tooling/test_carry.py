"""A carry is done only when the series' own tests pass on the carried tree, and its resolutions
are kept: the test gate, re-carrying with replayed resolutions, rebase-check running the carried
series' tests, and the reasons that become the PR description and the CHANGELOG entry.

Real repositories on the real wheels (0.5.21 pinned, 0.5.23 from PyPI, cached by the bf16k cache).
The probe series is light on purpose: a series test that only holds on the release it was written
for (it reads the tree's own ``sglang/_version.py``) and a data file, so the gate's bisect has no
heavy module to import and each carry takes seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bf16k import carried, gitutil, patches, project, rebase, series, seriestests

from .conftest import REPO_ROOT, TRAILERS, WHY, Product
from .test_rebase import _cli

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


@pytest.fixture
def probe_product(product: Product, monkeypatch: pytest.MonkeyPatch) -> Product:
    """Two patches: the probe test (fails on 0.5.23) and a data file; committed as a user would."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    monkeypatch.setenv(seriestests.PYTHON_ENV, sys.executable)  # the tests venv runs the series tests
    product.commit_patch(PROBE, None, PROBE_TEXT, "[DSV4] add a release probe test", WHY, TRAILERS)
    product.commit_patch(NOTES, None, "bf16 index keys: probe notes\n", "[DSV4] add the probe notes", WHY, TRAILERS)
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
    code, out, err = _cli(p.root, "rebase", "--continue", "-m", "test_release_probe.py: the series is on 0.5.23 now")
    assert code == 0, out + err


# --------------------------------------------------------------------------- the test gate


@pytest.mark.slow
def test_failing_series_test_stops_the_carry_and_a_fix_finishes_it(probe_product: Product) -> None:
    p = probe_product
    before_notes = (p.root / "series" / NOTES_PATCH).read_bytes()
    code, out, err = _cli(p.root, "rebase", REL)
    assert code == 1, out + err
    # The stop names the test, its patch, the failure, upstream's change it ran into and the next step.
    assert f"carry to sglang {REL} stopped: the series' tests fail on the carried tree" in out
    assert NODE in out
    assert f"patch 1 '{PROBE_PATCH}'" in out and "0.5.23" in out and "0.5.21" in out
    assert "python/sglang/_version.py" in out  # the upstream file the failing test ran, and that changed
    assert "nox -s rebase -- --continue" in out and "nox -s rebase -- --abort" in out
    assert not (p.root / "series" / "next" / REL).exists()  # nothing is written before the tests pass
    status = "\n".join(patches.status(p.target))
    assert f"carry: to sglang {REL} in progress in build/upstream/{REL}, stopped: 1 series test failing" in status

    # --continue without the fix runs the tests again and stops again, changing nothing.
    code, out, _ = _cli(p.root, "rebase", "--continue")
    assert code == 1 and NODE in out

    # Fix by intent; --continue wants a reason for the hunk and names it.
    probe = _tree(p) / PROBE
    probe.write_text(probe.read_text().replace('== "0.5.21"', '== "0.5.23"'))
    code, _, err = _cli(p.root, "rebase", "--continue")
    assert code == 2 and "no reason for" in err
    assert "test_release_probe.py (test_release_is_the_one_the_series_was_written_for)" in err
    assert '== "0.5.23"' in probe.read_text()  # the edit is still there

    why = "the series is on 0.5.23 now, so the probe expects that release"
    code, out, err = _cli(p.root, "rebase", "--continue", "-m", f"test_release_probe.py: {why}")
    assert code == 0, out + err
    assert f"into patch 1 '{PROBE_PATCH}'" in out  # the fix went into the patch the test belongs to
    nxt = p.root / "series" / "next" / REL
    assert '+    assert _release() == "0.5.23"' in (nxt / PROBE_PATCH).read_text()
    assert series.split_message((nxt / NOTES_PATCH).read_bytes())[1] == series.split_message(before_notes)[1]
    # DEP-3: the changed patch's Last-Update is today's (SOURCE_DATE_EPOCH), the other one's is kept.
    assert "Last-Update: 2031-01-01" in (nxt / PROBE_PATCH).read_text()
    assert "Last-Update: 2026-11-29" in (nxt / NOTES_PATCH).read_text()
    assert f"Last-Update: set to 2031-01-01 on {PROBE_PATCH}" in out
    info = carried.load(nxt)
    assert [(r.patch, r.path, r.kind, r.why) for r in info.resolutions] == [(PROBE_PATCH, PROBE, "tests", why)]
    assert info.verified.tests == "1 passed, 0 skipped" and info.verified.bisect == "2 of 2 prefixes"
    assert set(info.from_blobs) == {PROBE_PATCH, NOTES_PATCH}
    # The range-diff is a PR description: the hand-merged file, the hunk once, the reason.
    md = (nxt / "range-diff.md").read_text()
    assert f"| 1 → 1 | `{PROBE_PATCH}` | content-changed | `test/registered/unit/test_release_probe.py` |" in md
    assert md.count('++    assert _release() == "0.5.23"') == 1 and why in md
    assert "git range-diff" not in md
    # The CHANGELOG entry is wrapped, carries the reason, and the carry said it wrote it.
    changelog = (p.root / "CHANGELOG.md").read_text()
    entry = changelog.split("### Changed\n", 1)[1].split("\n\n", 1)[0]
    assert entry.startswith("- Carried the series (2 patches") and all(len(ln) <= 100 for ln in entry.splitlines())
    assert why in " ".join(entry.split()) and "Its tests pass there (1 passed, 0 skipped, CPU)" in " ".join(entry.split())
    assert f"CHANGELOG.md: added the [Unreleased] entry for {REL}, with the reasons" in out
    # `check --upstream` says which release it applied on.
    notes = patches.check(project.target(p.root, REL)).notes
    assert f"2 patches apply on sglang {REL} (the carried release) and export byte-identically" in notes
    # `tests --upstream V` runs the series' tests on that tree alone.
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(p.root), "tests", "--upstream", REL],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"series tests on sglang {REL} ({_tree(p)})" in proc.stdout
    assert f"sglang {REL}: 1 passed, 0 skipped" in proc.stdout
    # The pinned tree's copy of the probe holds there: running both in one go would have mixed trees.
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(p.root), "tests", "--upstream", "0.5.21"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "sglang 0.5.21: 1 passed" in proc.stdout, proc.stdout + proc.stderr


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
    probe.write_text(probe.read_text().replace('assert _release() == "0.5.21"', 'assert _release() == "0.5.21", "probe"'))
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
    code, out, err = _cli(p.root, "rebase", "--continue", "-m", "test_release_probe.py: keep 0.5.23 and the message")
    assert code == 0, out + err
    assert '+    assert _release() == "0.5.23", "probe"' in (p.root / "series" / "next" / REL / PROBE_PATCH).read_text()


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
    assert f"`series/next/{REL}/`: applies on its release, exports byte-identically, its series tests pass (1 passed" in out
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


def test_rebase_check_without_a_test_python_fails_clearly(probe_product: Product, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(seriestests.PYTHON_ENV, "/nonexistent/python")
    code, _, err = _cli(probe_product.root, "rebase-check", "--releases", "0.5.21")
    assert code == 2 and "cannot run the series' tests" in err


# --------------------------------------------------------------------------- small things


def test_status_lists_the_carried_series_and_says_series_once(probe_product: Product) -> None:
    text = "\n".join(patches.status(probe_product.target))
    assert "series in series/" in text and "series series" not in text
    assert "carry: none in progress" in text
    assert "carried series: none" in text


def test_older_releases_are_a_port_everywhere(probe_product: Product) -> None:
    code, _, err = _cli(probe_product.root, "rebase", "0.5.20")
    assert code == 2 and "older than the pinned 0.5.21" in err and "nox -s rebase -- 0.5.20 --allow-older" in err
    code, _, err = _cli(probe_product.root, "rebase", "0.5.20", "--commit", "a" * 40)
    assert code == 2 and "the pin only moves forward" in err
    # apply's hint for a release without a carried series is a command that is not refused.
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(probe_product.root), "apply", "--upstream", "0.5.20"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "nox -s rebase -- 0.5.20 --allow-older" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(probe_product.root), "apply", "--upstream", "0.5.24"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert "nox -s rebase -- 0.5.24`" in proc.stderr and "--allow-older" not in proc.stderr


def test_a_release_that_does_not_exist_is_one_line(probe_product: Product) -> None:
    code, _, err = _cli(probe_product.root, "rebase", "9.9.9")
    assert code == 2
    assert re.fullmatch(
        r"error: sglang 9\.9\.9 does not exist on the package index; the nearest releases are "
        r"\S+, \S+, \S+ \(newest \S+\)\n", err
    ), err
    assert "--wheel-file" not in err


def test_nearest_releases() -> None:
    versions = ["0.5.23", "0.5.22", "0.5.21", "0.5.20", "0.5.15.post1", "0.5.15", "0.5.24rc1"]
    assert rebase.nearest_releases("9.9.9", versions) == ["0.5.21", "0.5.22", "0.5.23"]
    assert rebase.nearest_releases("0.5.16", versions) == ["0.5.15", "0.5.15.post1", "0.5.20"]
    assert rebase.nearest_releases("0.0.1", versions) == ["0.5.15", "0.5.15.post1", "0.5.20"]


def test_continue_messages_need_continue(probe_product: Product) -> None:
    code, _, err = _cli(probe_product.root, "rebase", REL, "-m", "why")
    assert code == 2 and "-m/--message-file go with --continue" in err


