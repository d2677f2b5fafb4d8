"""The committed carried series under series/next/: each was carried through the test gate, every
hunk a human changed has its reason, and the README's carry timings are the recorded ones."""

from __future__ import annotations

import re

from bf16k import carried, project, rangediff, reasons, series

from .conftest import REPO_ROOT

CARRIED = ("0.5.22", "0.5.23")


def test_both_releases_are_carried() -> None:
    assert set(CARRIED) <= set(project.carried_versions(REPO_ROOT))


def test_each_carried_series_records_its_checks_inputs_and_reasons() -> None:
    for version in CARRIED:
        d = REPO_ROOT / "series" / "next" / version
        info = carried.load(d)
        names = series.read_order(d)
        assert re.fullmatch(r"\d+ passed, \d+ skipped", info.verified.tests), (version, info.verified)
        assert info.verified.bisect == f"{len(names)} of {len(names)} prefixes", version
        assert info.verified.tests_seconds > 0 and info.verified.bisect_seconds > 0
        assert set(names) | set(info.dropped) == set(info.from_blobs), (
            version
        )  # what a re-carry replays against
        md = (d / "range-diff.md").read_text()
        assert "*no reason recorded*" not in md, version
        # Every recorded reason is shown in the PR description, once for each hunk it explains
        # (a reason for a whole file, or for module-level lines, explains each of its hunks).
        rd, _ = rangediff.series_range_diff(REPO_ROOT, version)
        for r in info.resolutions:
            explains = sum(
                1
                for e in rd.entries
                for h in e.hunks
                if any(x is r for x in reasons.lookup(info.resolutions, e.name, h.path, h.scope))
            )
            shown = sum(
                line.startswith(f"- `{rangediff.short(r.path)}`") and line.endswith(": " + r.why)
                for line in md.splitlines()
            )
            assert shown == max(explains, 1), (version, r.path, r.scope, shown, explains)


def test_readme_carry_timings_are_the_recorded_ones() -> None:
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    m = re.search(
        r"the 0\.5\.22 carry ran the series' tests in (\d+) s and bisected its (\d+) prefixes in (\d+) s; "
        r"0\.5\.23's took (\d+) s and (\d+) s",
        readme,
    )
    assert m, "README's carrying section lost its measured timings"
    a, b = (carried.load(REPO_ROOT / "series" / "next" / v).verified for v in CARRIED)
    n = len(series.read_order(REPO_ROOT / "series" / "next" / "0.5.22"))
    assert [int(x) for x in m.groups()] == [
        a.tests_seconds,
        n,
        a.bisect_seconds,
        b.tests_seconds,
        b.bisect_seconds,
    ]


def test_committed_range_diffs_are_what_the_tooling_writes() -> None:
    """range-diff.md (the PR description) is generated from the committed series and reasons."""
    for version in CARRIED:
        _, md = rangediff.series_range_diff(REPO_ROOT, version)
        assert (REPO_ROOT / "series" / "next" / version / "range-diff.md").read_text() == md, version
