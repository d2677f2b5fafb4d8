"""A carry is done only when the series' own tests pass on the carried tree: the test gate, and
the small things around a carry (status, older releases, unknown releases, --continue).

Real repositories on the real wheels (0.5.21 pinned, 0.5.23 from PyPI, cached by the bf16k cache),
on the probe series of ``carry_probe``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bf16k import carried, patches, project, series
from bf16k.carry import releases

from .carry_probe import NODE, NOTES_PATCH, PROBE, PROBE_PATCH, REL, _tree, make_probe_product
from .conftest import REPO_ROOT, Product
from .rebase_support import _cli


@pytest.fixture
def probe_product(product: Product, monkeypatch: pytest.MonkeyPatch) -> Product:
    return make_probe_product(product, monkeypatch)


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
    assert (
        f"carry: to sglang {REL} in progress in build/upstream/{REL}, stopped: 1 series test failing"
        in status
    )

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
    assert [(r.patch, r.path, r.kind, r.why) for r in info.resolutions] == [
        (PROBE_PATCH, PROBE, "tests", why)
    ]
    assert info.verified.tests == "1 passed, 0 skipped" and info.verified.bisect == "2 of 2 prefixes"
    assert set(info.from_blobs) == {PROBE_PATCH, NOTES_PATCH}
    # The range-diff is a PR description: the hand-merged file, the hunk once, the reason.
    md = (nxt / "range-diff.md").read_text()
    assert (
        f"| 1 → 1 | `{PROBE_PATCH}` | content-changed | `test/registered/unit/test_release_probe.py` |" in md
    )
    assert md.count('++    assert _release() == "0.5.23"') == 1 and why in md
    assert "git range-diff" not in md
    # The CHANGELOG entry is wrapped, carries the reason, and the carry said it wrote it.
    changelog = (p.root / "CHANGELOG.md").read_text()
    entry = changelog.split("### Changed\n", 1)[1].split("\n\n", 1)[0]
    assert entry.startswith("- Carried the series (2 patches") and all(
        len(ln) <= 100 for ln in entry.splitlines()
    )
    assert why in " ".join(entry.split()) and "Its tests pass there (1 passed, 0 skipped, CPU)" in " ".join(
        entry.split()
    )
    assert f"CHANGELOG.md: added the [Unreleased] entry for {REL}, with the reasons" in out
    # `check --upstream` says which release it applied on.
    notes = patches.check(project.target(p.root, REL)).notes
    assert f"2 patches apply on sglang {REL} (the carried release) and export byte-identically" in notes
    # `tests --upstream V` runs the series' tests on that tree alone.
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(p.root), "tests", "--upstream", REL],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"series tests on sglang {REL} ({_tree(p)})" in proc.stdout
    assert f"sglang {REL}: 1 passed, 0 skipped" in proc.stdout
    # The pinned tree's copy of the probe holds there: running both in one go would have mixed trees.
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(p.root), "tests", "--upstream", "0.5.21"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "sglang 0.5.21: 1 passed" in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- small things


def test_status_lists_the_carried_series_and_says_series_once(probe_product: Product) -> None:
    text = "\n".join(patches.status(probe_product.target))
    assert "series in series/" in text and "series series" not in text
    assert "carry: none in progress" in text
    assert "carried series: none" in text


def test_older_releases_are_a_port_everywhere(probe_product: Product) -> None:
    code, _, err = _cli(probe_product.root, "rebase", "0.5.20")
    assert (
        code == 2 and "older than the pinned 0.5.21" in err and "nox -s rebase -- 0.5.20 --allow-older" in err
    )
    code, _, err = _cli(probe_product.root, "rebase", "0.5.20", "--commit", "a" * 40)
    assert code == 2 and "the pin only moves forward" in err
    # apply's hint for a release without a carried series is a command that is not refused.
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(probe_product.root), "apply", "--upstream", "0.5.20"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "nox -s rebase -- 0.5.20 --allow-older" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(probe_product.root), "apply", "--upstream", "0.5.24"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "nox -s rebase -- 0.5.24`" in proc.stderr and "--allow-older" not in proc.stderr


def test_a_release_that_does_not_exist_is_one_line(probe_product: Product) -> None:
    code, _, err = _cli(probe_product.root, "rebase", "9.9.9")
    assert code == 2
    assert re.fullmatch(
        r"error: sglang 9\.9\.9 does not exist on the package index; the nearest releases are "
        r"\S+, \S+, \S+ \(newest \S+\)\n",
        err,
    ), err
    assert "--wheel-file" not in err


def test_nearest_releases() -> None:
    versions = ["0.5.23", "0.5.22", "0.5.21", "0.5.20", "0.5.15.post1", "0.5.15", "0.5.24rc1"]
    assert releases.nearest_releases("9.9.9", versions) == ["0.5.21", "0.5.22", "0.5.23"]
    assert releases.nearest_releases("0.5.16", versions) == ["0.5.15", "0.5.15.post1", "0.5.20"]
    assert releases.nearest_releases("0.0.1", versions) == ["0.5.15", "0.5.15.post1", "0.5.20"]


def test_continue_messages_need_continue(probe_product: Product) -> None:
    code, _, err = _cli(probe_product.root, "rebase", REL, "-m", "why")
    assert code == 2 and "-m/--message-file go with --continue" in err
