"""Where a carry stands, for `status`: a stopped carry and the carried series under series/next/.

Kept apart from `rebase` (which imports the apply/export machinery) so `status` can read the
state a stopped carry leaves without importing the carry itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bf16k import carried, project, series

STATE_FILE = "bf16k-rebase.json"  # in the carried tree's git dir while a carry is stopped


def find_in_progress(root: Path) -> Path | None:
    """The carried tree holding a stopped carry, if any (one at a time)."""
    trees = root / "build" / "upstream"
    if not trees.is_dir():
        return None
    for repo in sorted(trees.iterdir()):
        if (repo / ".git" / STATE_FILE).is_file():
            return repo
    return None


def read_state(repo: Path) -> dict[str, Any]:
    data = json.loads((repo / ".git" / STATE_FILE).read_text())
    return data if isinstance(data, dict) else {}


def _rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def in_progress_lines(root: Path) -> list[str]:
    repo = find_in_progress(root)
    if repo is None:
        return ["carry: none in progress"]
    try:
        state = read_state(repo)
    except (OSError, ValueError):
        return [f"carry: a stopped carry in {_rel(root, repo)} (its state file is unreadable)"]
    stop = state.get("stop") or {}
    where = stop.get("summary") or f"phase {state.get('phase', '?')}"
    lines = [
        f"carry: to sglang {state.get('version', '?')} in progress in {_rel(root, repo)}, stopped: {where}",
        ("  next: resolve, then `nox -s rebase -- --continue -m \"<file> (<scope>): <why>\"`; "
        "or `nox -s rebase -- --abort`"),
    ]
    queue = state.get("queue") or []
    if queue:
        lines.append(f"  then re-carries: {', '.join(queue)}")
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
        state = "carried from today's series/" if info.from_series == current else (
            "series/ changed since: re-carry with `nox -s rebase -- --recarry`"
        )
        checked = f"; tests {info.verified.tests}" if info.verified.tests else ""
        n = len(names)
        lines.append(f"  {v}: {n} {'patch' if n == 1 else 'patches'}, {state}{checked}")
    return lines
