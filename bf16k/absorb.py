"""At a tests stop, the maintainer's fixes go into the patches they belong to.

The series must stay bisectable, so a fix to a test of patch 1 cannot become part of patch 6.
Each edited hunk goes into the patch that last changed the lines it edits (``git blame`` over
the carried commits; for lines upstream wrote, the last patch touching the file), as a
``fixup!`` commit squashed into it (``git rebase --autosquash``). ``fixup!`` commits the
maintainer made by hand are squashed the same way; any other new commit is refused (a carry
does not add patches), as is a new untracked file (``git add`` it to its patch by hand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import diffs, gitutil, pyscope, rangediff
from bf16k import reasons as reasonsmod
from bf16k.errors import ToolError
from bf16k.reasons import Hunk, Reason

_FIXUP = re.compile(r"^(fixup|squash|amend)! (.*)$")


@dataclass
class _DiffHunk:
    path: str
    header: list[str]  # the file's diff header lines (diff --git, index, ---, +++)
    old_start: int
    old_count: int
    new_start: int
    lines: list[str] = field(default_factory=list)  # the @@ line and its body

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return self.path, tuple(self.lines[1:])


def dirty_hunks(repo: Path) -> list[_DiffHunk]:
    """Tracked edits against HEAD, one entry per -U0 hunk."""
    text = gitutil.git(
        ["diff", "-U0", "--no-color", "--no-renames", "--no-ext-diff", "HEAD"], repo
    ).stdout.decode("utf-8", errors="replace")
    return [
        _DiffHunk(fd.path, list(fd.header), h.old_start, h.old_count, h.new_start, [h.header, *h.lines])
        for fd in diffs.parse(text)
        for h in fd.hunks
    ]


def _file_lines(repo: Path, rev: str, path: str) -> int:
    proc = gitutil.git(["show", f"{rev}:{path}"], repo, check=False)
    return proc.stdout.count(b"\n") if proc.returncode == 0 else 0


def _target(
    repo: Path, hunk: _DiffHunk, index_of: dict[str, int], touchers: dict[str, list[int]], where: str
) -> int:
    """The patch (index) an edited hunk belongs to."""
    length = _file_lines(repo, "HEAD", hunk.path)
    if hunk.old_count:
        lo, hi = hunk.old_start, hunk.old_start + hunk.old_count - 1
    else:  # an insertion: the lines around it say whose code it extends
        lo, hi = max(hunk.old_start, 1), hunk.old_start + 1
    hi = min(hi, max(length, 1))
    lo = min(lo, hi)
    found: list[int] = []
    if length:
        out = gitutil.git(
            ["blame", "--porcelain", "-L", f"{lo},{hi}", "HEAD", "--", hunk.path], repo, check=False
        )
        for line in out.stdout.decode("utf-8", errors="replace").split("\n"):
            sha = line.split(" ", 1)[0]
            if len(sha) == 40 and sha in index_of:
                found.append(index_of[sha])
    if found:
        return max(found)
    if touchers.get(hunk.path):
        return max(touchers[hunk.path])
    raise ToolError(
        f"{hunk.path}: no patch of the series touches it, and a carry does not add patches. Put the "
        f"change into the patch it belongs to by hand (`git -C {where} add {hunk.path} && git -C {where} "
        "commit --fixup <patch commit>`) and --continue"
    )


def absorb(repo: Path, base: str, tip: str, text: str) -> tuple[list[str], list[Reason]]:
    """Squash the edits made at a tests stop into their patches; (notes, the reasons given).

    ``base``: the carried tree's base; ``tip``: HEAD when the carry stopped ("": HEAD now).
    """
    where = str(repo)
    tip = tip or gitutil.rev_parse(repo, "HEAD")
    commits = gitutil.out(["rev-list", "--reverse", f"{base}..{tip}"], repo).split()
    names = [rangediff.patch_name(repo, c) for c in commits]
    index_of = {c: i for i, c in enumerate(commits)}
    by_subject = {gitutil.out(["log", "-1", "--format=%s", c], repo): i for i, c in enumerate(commits)}
    touchers: dict[str, list[int]] = {}
    for i, c in enumerate(commits):
        for f in gitutil.out(["diff-tree", "--no-commit-id", "--name-only", "-r", c], repo).splitlines():
            touchers.setdefault(f, []).append(i)

    hunks: list[Hunk] = []
    patch_of: dict[tuple[str, str], str] = {}
    extra = gitutil.out(["rev-list", "--reverse", f"{tip}..HEAD"], repo).split()
    for c in extra:
        subject = gitutil.out(["log", "-1", "--format=%s", c], repo)
        m = _FIXUP.match(subject)
        if not m or m.group(2) not in by_subject:
            raise ToolError(
                f"commit {c[:12]} '{subject}' is not a fixup of a patch of the series: a carry does not "
                "add patches. Make it `git commit --fixup <patch commit>`, or drop it, and --continue"
            )
        for h in reasonsmod.tree_hunks(repo, f"{c}^", c):
            hunks.append(h)
            patch_of[(h.path, h.scope)] = names[by_subject[m.group(2)]]
    gitutil.git(["reset", "-q"], repo)  # the index is HEAD again; the edits stay in the worktree
    untracked = gitutil.out(["ls-files", "--others", "--exclude-standard"], repo).splitlines()
    if untracked:
        raise ToolError(
            f"new file(s) {', '.join(untracked[:5])}: add each to the patch it belongs to "
            f"(`git -C {where} add FILE && git -C {where} commit --fixup <patch commit>`), or delete them, "
            "and --continue"
        )
    dirty = dirty_hunks(repo)
    targets: dict[tuple[str, tuple[str, ...]], int] = {}
    for d in dirty:
        target = _target(repo, d, index_of, touchers, where)
        targets[d.key] = target
        lines = (repo / d.path).read_text(errors="replace").split("\n") if (repo / d.path).is_file() else []
        h = Hunk(d.path, pyscope.scope_at(lines, max(d.new_start, 1)) if lines else "", d.new_start)
        hunks.append(h)
        patch_of[(h.path, h.scope)] = names[target]
    if not hunks:
        return ["nothing was edited since the stop: running the tests again"], []
    found = reasonsmod.require(text, hunks, patch_of, "tests", "hunk you changed", name_patch=True)
    notes: list[str] = []
    while True:
        pending = dirty_hunks(repo)
        if not pending:
            break
        keyed = [(targets.get(d.key, -1), d) for d in pending]
        unknown = [d for t, d in keyed if t < 0]
        for d in unknown:  # shifted beyond recognition by an earlier fixup: ask blame again
            targets[d.key] = _target(repo, d, index_of, touchers, where)
        keyed = [(targets[d.key], d) for d in pending]
        first = min(t for t, _ in keyed)
        group = [d for t, d in keyed if t == first]
        patch = _as_patch(group)
        gitutil.git(["apply", "--cached", "--unidiff-zero", "-"], repo, input_bytes=patch.encode())
        gitutil.git(["commit", "-q", "--no-verify", f"--fixup={commits[first]}"], repo)
        files = sorted({d.path for d in group})
        notes.append(
            f"absorbed {len(group)} edited hunk(s) of {', '.join(files)} into patch {first + 1} '{names[first]}'"
        )
    proc = gitutil.git(["rebase", "-q", "-i", "--autosquash", base], repo, check=False)
    if proc.returncode != 0:
        gitutil.git(["rebase", "--abort"], repo, check=False)
        raise ToolError(
            "squashing the fixups into their patches failed (a later patch conflicts with the fix):\n"
            + proc.stderr.decode(errors="replace").strip()[-1500:]
            + f"\nthe fixup commits are in {where} (git log {tip[:12]}..HEAD); squash them by hand "
            f"(git -C {where} rebase -i --autosquash {base[:12]}) and --continue"
        )
    after = gitutil.out(["rev-list", "--reverse", f"{base}..HEAD"], repo).split()
    if [rangediff.patch_name(repo, c) for c in after] != names:
        raise ToolError(
            "after squashing the fixups the patches are not the series any more; --abort and carry again"
        )
    return notes, found


def _as_patch(group: list[_DiffHunk]) -> str:
    out: list[str] = []
    current = ""
    for d in group:
        if d.path != current:
            out += d.header
            current = d.path
        out += d.lines
    return "\n".join(out) + "\n"
