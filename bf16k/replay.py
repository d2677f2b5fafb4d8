"""Replaying a carried series' resolutions when the series is carried to the same release again.

A carried series ``series/next/<v>/`` is the record of every resolution made for ``<v>``: the
conflicts resolved by hand and the fixes its tests needed. When ``series/`` changes afterwards
(a patch is edited) the carry is redone, and those resolutions must not be redone by hand. For
each prefix ``k`` of the series three trees are known:

- ``O_k``: the series the carried one was made from, patches 1..k, on the old base;
- ``C_k``: the carried series, patches 1..k, on the release (the resolved result);
- ``N_k``: today's series, patches 1..k, on the old base.

Today's carry of prefix ``k`` is ``merge3(base=O_k, ours=C_k, theirs=N_k)``: the carried result
with the series' own edits since then applied to it. Upstream's change is in ``C_k`` already,
so only the files the series edited are merged; a conflict appears only where a series edit
meets a region the carry had to change. A hand resolution at prefix ``k`` is chained into the
next prefixes the same way: ``T_k+1 = merge3(base=I_k, ours=T_k, theirs=I_k+1)`` (``I``: the
automatic result, ``T``: what was committed), so it is kept wherever patch ``k+1`` leaves it.

rerere is not used: it records conflict text, not the fixes a failing test needed, and a
silently replayed rerere resolution has no reason attached.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import gitutil

LABEL_CARRIED = "carried"  # conflict marker labels: constant, so chained merges see equal text
LABEL_BEFORE = "series-then"
LABEL_SERIES = "series-now"


@dataclass
class Merge:
    tree: str
    conflicts: list[str] = field(default_factory=list)  # paths holding conflict markers (or structural)
    structural: list[str] = field(default_factory=list)  # add/add or delete/edit: no markers to show


def tree_of(repo: Path, rev: str) -> str:
    return gitutil.out(["rev-parse", f"{rev}^{{tree}}"], repo)


def _entry(repo: Path, tree: str, path: str) -> tuple[str, str] | None:
    """(mode, blob) of path in tree, None if absent."""
    text = gitutil.out(["ls-tree", "--full-tree", tree, "--", path], repo)
    if not text:
        return None
    meta = text.split("\t", 1)[0].split()
    return meta[0], meta[2]


def _blob(repo: Path, blob: str) -> bytes:
    return gitutil.git(["cat-file", "blob", blob], repo).stdout


def merge_file(
    repo: Path, base: bytes, ours: bytes, theirs: bytes, labels: tuple[str, str, str]
) -> tuple[bytes, bool]:
    """(merged bytes, clean) of a 3-way text merge, markers labelled ``labels`` (ours, base, theirs)."""
    with tempfile.TemporaryDirectory(prefix="bf16k-merge-") as tmp:
        d = Path(tmp)
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (d / name).write_bytes(data)
            paths.append(str(d / name))
        # --diff3: the marker block also shows the base side (what the patch was then).
        proc = gitutil.git(
            ["merge-file", "-p", "--diff3", "-L", labels[0], "-L", labels[1], "-L", labels[2], *paths],
            d,
            check=False,
        )
        if proc.returncode < 0 or proc.returncode > 127:
            raise RuntimeError(proc.stderr.decode(errors="replace"))
        return proc.stdout, proc.returncode == 0


def merge_trees(
    repo: Path,
    base: str,
    ours: str,
    theirs: str,
    labels: tuple[str, str, str] = (LABEL_CARRIED, LABEL_BEFORE, LABEL_SERIES),
) -> Merge:
    """``ours`` with ``base``->``theirs`` applied, file by file, over the files ``theirs`` changed.

    ``ours`` may differ from ``base`` in thousands of files (a whole release); only the few that
    ``theirs`` changed are merged, so this stays fast. Deleting a file on one side while the
    other edits it is a conflict (the edited side is kept, with the path named).
    """
    changed = gitutil.out(["diff", "--name-only", "--no-renames", base, theirs], repo).splitlines()
    result = Merge(tree_of(repo, ours))
    if not changed:
        return result
    updates: list[tuple[str, tuple[str, str] | None]] = []
    for path in changed:
        b, o, t = _entry(repo, base, path), _entry(repo, ours, path), _entry(repo, theirs, path)
        if o == b or o == t:
            updates.append((path, t))
            continue
        if t == b:
            continue
        if b is None or o is None or t is None:  # add/add, or delete against edit
            result.conflicts.append(path)
            result.structural.append(path)
            updates.append((path, o if o is not None else t))
            continue
        merged, clean = merge_file(repo, _blob(repo, b[1]), _blob(repo, o[1]), _blob(repo, t[1]), labels)
        blob = gitutil.git(["hash-object", "-w", "--stdin"], repo, input_bytes=merged).stdout.decode().strip()
        updates.append((path, (o[0], blob)))
        if not clean:
            result.conflicts.append(path)
    with tempfile.TemporaryDirectory(prefix="bf16k-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        gitutil.git(["read-tree", ours], repo, env=env)
        for path, entry in updates:
            if entry is None:
                gitutil.git(["update-index", "--force-remove", "--", path], repo, env=env)
            else:
                gitutil.git(
                    ["update-index", "--add", "--cacheinfo", f"{entry[0]},{entry[1]},{path}"], repo, env=env
                )
        result.tree = gitutil.out(["write-tree"], repo, env=env)
    return result


def merge_messages(repo: Path, before: str, carried: str, now: str) -> tuple[str, bool]:
    """The commit message a replayed patch gets: the carry's edits and the series' edits together."""
    if now == before:
        return carried, True
    if carried == before:
        return now, True
    merged, clean = merge_file(
        repo, before.encode(), carried.encode(), now.encode(), ("carried", "then", "now")
    )
    return (merged.decode() if clean else now), clean


def commit_tree(repo: Path, tree: str, parent: str, message: str, author: tuple[str, str, str]) -> str:
    """A commit like `git am` makes: the patch's author and date, committer date = author date."""
    name, email, date = author
    env = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }
    return (
        gitutil.git(["commit-tree", tree, "-p", parent], repo, input_bytes=message.encode(), env=env)
        .stdout.decode()
        .strip()
    )


def author_of(repo: Path, commit: str) -> tuple[str, str, str]:
    text = gitutil.out(["log", "-1", "--format=%an%x00%ae%x00%ad", "--date=raw", commit], repo)
    name, email, date = text.split("\x00")
    return name, email, date


def message_of(repo: Path, commit: str) -> str:
    # %B of a commit made by am/commit-tree: the raw message, trailing newline normalised.
    raw = gitutil.git(["cat-file", "commit", commit], repo).stdout.decode("utf-8", errors="replace")
    return raw.split("\n\n", 1)[1] if "\n\n" in raw else ""


def diff_tree_names(repo: Path, a: str, b: str) -> list[str]:
    return gitutil.out(["diff", "--name-only", "--no-renames", a, b], repo).splitlines()


def checkout_tree(repo: Path, head: str, tree: str) -> None:
    """Leave ``tree`` (possibly with conflict markers) in the worktree on top of ``head``, unstaged."""
    gitutil.git(["checkout", "-q", "-f", head], repo)
    gitutil.git(["clean", "-q", "-fd"], repo)
    with tempfile.TemporaryDirectory(prefix="bf16k-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        gitutil.git(["read-tree", tree], repo, env=env)
        gitutil.git(["checkout-index", "-a", "-f"], repo, env=env)
    for path in diff_tree_names(repo, head, tree):
        if gitutil.git(["cat-file", "-e", f"{tree}:{path}"], repo, check=False).returncode != 0:
            (repo / path).unlink(missing_ok=True)


def worktree_tree(repo: Path) -> str:
    """The tree of the worktree as it is (tracked files and new, not ignored, ones)."""
    with tempfile.TemporaryDirectory(prefix="bf16k-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        gitutil.git(["read-tree", "HEAD"], repo, env=env)
        gitutil.git(["add", "-A"], repo, env=env)
        return gitutil.out(["write-tree"], repo, env=env)
