"""The series as chains of commits in the carried tree: series/ on the old base (the "before"), and
for a re-carry the three chains it merges (:mod:`bf16k.replay`), from the inputs the carried
series records.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bf16k import carried, gitutil, patches, replay, series, upstream
from bf16k.carry.messages import plural
from bf16k.carry.state import REPLAY_REF, Bases, ReplayPlan, rel
from bf16k.errors import ToolError
from bf16k.project import Target


def apply_old_series(repo: Path, base: str, series_dir: Path, names: list[str]) -> str:
    """series/ applied on the pinned base; the tip (range-diff's "before")."""
    patches.reset_to(repo, base)
    failure = patches.run_am(repo, patches.mbox(series_dir, names), names)
    if failure:
        patches.abort_am(repo)
        raise ToolError(
            f"series/ does not apply on its own pin (patch {failure.index + 1} '{failure.name}'): "
            "fix that first (`nox -s check`)"
        )
    return gitutil.rev_parse(repo, "HEAD")


def apply_chain(repo: Path, base: str, datas: list[bytes], names: list[str], ref: str) -> list[str] | None:
    """Apply patches on ``base`` one by one; the commit after each (kept under ``ref``)."""
    patches.reset_to(repo, base)
    failure = patches.run_am(repo, b"".join(d if d.endswith(b"\n") else d + b"\n" for d in datas), names)
    if failure:
        patches.abort_am(repo)
        return None
    tip = gitutil.rev_parse(repo, "HEAD")
    gitutil.git(["update-ref", ref, tip], repo)
    made = gitutil.out(["rev-list", "--reverse", f"{base}..{tip}"], repo).split()
    return made if len(made) == len(names) else None


def stash_series(repo: Path, series_dir: Path, names: list[str]) -> None:
    """Keep the series as it was at start: a stopped carry goes on with those bytes."""
    keep = stashed(repo)
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    for name in names:
        shutil.copyfile(series_dir / name, keep / name)


def stashed(repo: Path) -> Path:
    return upstream.git_dir(repo) / "bf16k-series"


# --------------------------------------------------------------------------- what a re-carry replays


def blobs_now(root: Path, names: list[str]) -> dict[str, str]:
    return {n: carried.blob_id((root / "series" / n).read_bytes()) for n in names}


def what_would_change(root: Path, version: str) -> str:
    """What a re-carry over ``series/next/<version>/`` would do, from its carried.toml."""
    d = Target(root, version).series_dir
    info = carried.load(d)
    names = series.read_order(root / "series")
    now = blobs_now(root, names)
    prev = series.read_order(d)
    head = (
        f"series/next/{version}/ exists: {plural(len(prev), 'patch', 'patches')} carried from series "
        f"{info.from_series[:12] or '?'}, {plural(len(info.resolutions), 'recorded resolution')}."
    )
    if info.from_blobs:
        changed = [n for n in names if n in info.from_blobs and info.from_blobs[n] != now[n]]
        added = [n for n in names if n not in info.from_blobs]
        removed = [n for n in info.from_blobs if n not in now]
    elif info.from_series == series.series_hash(root / "series"):
        changed, added, removed = [], [], []
    else:
        return head + (
            " series/ changed since (its carried.toml predates per-patch records, so which patches is "
            "not known); a re-carry replays what it can find in git history."
        )
    if not (changed or added or removed):
        return head + (
            " series/ is unchanged since: a re-carry reproduces the same patches and rewrites "
            "range-diff.md, carried.toml and the CHANGELOG entry."
        )
    parts = []
    if changed:
        parts.append("changed: " + ", ".join(changed))
    if added:
        parts.append("new: " + ", ".join(added))
    if removed:
        parts.append("gone: " + ", ".join(removed))
    kept = len([n for n in names if n not in changed and n not in added])
    return head + (
        f" Since then series/ changed ({'; '.join(parts)}). A re-carry keeps the carried version of "
        f"{plural(kept, 'unchanged patch', 'unchanged patches')}, replays the recorded resolutions "
        "onto the changed ones (stopping only where a change meets a resolved region), reruns the "
        f"tests and bisect, and rewrites series/next/{version}/ and its CHANGELOG entry."
    )


def series_hash_at(root: Path, commit: str) -> tuple[str, dict[str, bytes]]:
    """series/ as ``commit`` has it: its series hash and its patch files ("" and none without one)."""

    def show(name: str) -> bytes | None:
        proc = gitutil.git(["show", f"{commit}:series/{name}"], root, check=False)
        return proc.stdout if proc.returncode == 0 else None

    order = show(series.SERIES_FILE)
    if order is None:
        return "", {}
    files: dict[str, bytes] = {}
    for name in series.parse_order(order.decode()):
        data = show(name)
        files[name] = series.MISSING if data is None else data
    return series.series_hash(lambda name: order if name == series.SERIES_FILE else files.get(name)), files


def _previous_inputs(root: Path, info: carried.Carried, names: list[str]) -> dict[str, bytes] | None:
    """The series/ patch files a carried series was made from (what a replay merges against)."""
    if info.from_blobs:
        found: dict[str, bytes] = {}
        for name in names:
            blob = info.from_blobs.get(name)
            proc = gitutil.git(["cat-file", "blob", blob], root, check=False) if blob else None
            if proc is None or proc.returncode != 0:
                print(
                    f"note: {name} as it was carried ({(blob or '?')[:12]}) is not in this repository's "
                    "objects: its resolutions cannot be replayed"
                )
                return None
            found[name] = proc.stdout
        return found
    if info.from_series == series.series_hash(root / "series"):
        return {n: (root / "series" / n).read_bytes() for n in names}
    log = gitutil.git(["log", "--format=%H", "-n", "400", "--", "series"], root, check=False)
    for commit in log.stdout.decode().split():
        shash, files = series_hash_at(root, commit)
        if shash == info.from_series:
            return files
    print(
        f"note: the series/ that was carried (series {info.from_series[:12]}) is not in git history: "
        "its resolutions cannot be replayed"
    )
    return None


def replay_plan(root: Path, repo: Path, bases: Bases, prev_dir: Path, names: list[str]) -> ReplayPlan | None:
    """The three chains a re-carry merges (see :mod:`bf16k.replay`), or None (then plain `git am`)."""
    info = carried.load(prev_dir)
    prev_names = series.read_order(prev_dir)
    olds = _previous_inputs(root, info, [n for n in names if n in info.from_blobs or not info.from_blobs])
    if olds is None:
        return None
    count = 0
    for a, b in zip(names, prev_names, strict=False):
        if a != b or a not in olds or a in info.dropped:
            break
        count += 1
    if count == 0:
        return None
    then = apply_chain(
        repo, bases.old_base, [olds[n] for n in names[:count]], names[:count], f"{REPLAY_REF}/then"
    )
    was = apply_chain(
        repo,
        bases.new_base,
        [(prev_dir / n).read_bytes() for n in names[:count]],
        names[:count],
        f"{REPLAY_REF}/carried",
    )
    now = gitutil.out(["rev-list", "--reverse", f"{bases.old_base}..{bases.old_tip}"], repo).split()
    if then is None or was is None:
        print("note: the carried series or what it was carried from no longer applies: no replay")
        return None
    base_tree = replay.tree_of(repo, bases.new_base)
    return ReplayPlan(count, then, was, now[:count], rel(root, prev_dir), base_tree, base_tree)
