"""Where a carry stands, for `status`: a stopped carry and the carried series under series/next/.

It reads only the state a stopped carry leaves (:mod:`bf16k.carry.state`), not the carry itself.
"""

from __future__ import annotations

from pathlib import Path

from bf16k import carried, project, series
from bf16k.carry.state import CarryState, find_in_progress, rel


def in_progress_lines(root: Path) -> list[str]:
    repo = find_in_progress(root)
    if repo is None:
        return ["carry: none in progress"]
    try:
        state = CarryState.load(repo)
    except (OSError, ValueError, KeyError, TypeError):
        return [f"carry: a stopped carry in {rel(root, repo)} (its state file is unreadable)"]
    where = (state.stop.summary if state.stop else "") or f"phase {state.phase.value}"
    lines = [
        f"carry: to sglang {state.version} in progress in {rel(root, repo)}, stopped: {where}",
        (
            '  next: resolve, then `nox -s rebase -- --continue -m "<file> (<scope>): <why>"`; '
            "or `nox -s rebase -- --abort`"
        ),
    ]
    if state.queue:
        lines.append(f"  then re-carries: {', '.join(state.queue)}")
    return lines


def carried_lines(root: Path) -> list[str]:
    nxt = root / "series" / "next"
    versions = project.carried_versions(root)
    if not versions:
        return ["carried series: none (carry one with `nox -s rebase -- VERSION`)"]
    current = series.series_hash(root / "series")
    lines = ["carried series (series/next/):"]
    for v in versions:
        d = nxt / v
        info = carried.load(d)
        names = series.read_order(d)
        state = (
            "carried from today's series/"
            if info.from_series == current
            else ("series/ changed since: re-carry with `nox -s rebase -- --recarry`")
        )
        checked = f"; tests {info.verified.tests}" if info.verified.tests else ""
        n = len(names)
        lines.append(f"  {v}: {n} {'patch' if n == 1 else 'patches'}, {state}{checked}")
    return lines
