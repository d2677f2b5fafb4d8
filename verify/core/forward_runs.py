"""Forward-tier runs read back: one device call writes one folder, and a figure or a verdict
needs them together; a recorded flag-off comparison read as a verdict."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def merge_runs(paths: Sequence[Path]) -> dict[str, Any]:
    """The ``results.json`` of several forward-tier folders as one: in the given order, a later
    run of the same profile and arm replaces an earlier one (steps and all), and a later
    flag-off comparison of a profile replaces an earlier one (``baseline_from``: the run each
    profile's comparison was taken from)."""
    merged: dict[str, Any] = {"arms": [], "steps": [], "baseline": {}, "baseline_from": {}, "versions": {}}
    by_arm: dict[tuple[str, str], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for path in paths:
        res = json.loads((path / "results.json" if path.is_dir() else path).read_text())
        for meta in res["arms"]:
            key = (meta["profile"], meta["arm"])
            by_arm[key] = (meta, [s for s in res["steps"] if (s["profile"], s["arm"]) == key])
        merged["baseline"].update(res.get("baseline", {}))
        merged["baseline_from"].update({profile: path for profile in res.get("baseline", {})})
        merged["versions"] = res.get("versions", {})
    for meta, steps in by_arm.values():
        merged["arms"].append(meta)
        merged["steps"] += steps
    return merged


def flag_off_status(entry: dict[str, Any]) -> tuple[str, str]:
    """The verdict and detail of a recorded flag-off comparison. Records written before the
    comparison classified differences (no ``differing_steps``) called any differing selection a
    failure; where their pool bytes agreed and no step was missing, what they measured cannot
    tell a changed path from upstream's own tie-breaking, so they read as ``incomplete``."""
    status, detail = str(entry.get("status", "error")), str(entry.get("detail", ""))
    if status == "fail" and "differing_steps" not in entry and "pool bytes [], missing []" in detail:
        return "incomplete", (
            detail + " (recorded before differences were classified: pool bytes identical, "
            "selected sets differ, no unpatched rerun as control; re-measure with the current harness)"
        )
    return status, detail
