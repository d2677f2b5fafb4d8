"""What the new release changed where a carry stopped: per conflict, per failing test.

Both cut upstream's change between the two releases down to scopes (:mod:`bf16k.pyscope`): the
scope around each conflict hunk, or the functions a failing test executed. The rest of the file
is one `git diff` away, and the stop says which.
"""

from __future__ import annotations

from pathlib import Path

from bf16k import gitutil, pyscope
from bf16k.pyscope import ScopeChange
from bf16k.reasons import Hunk

PER_SCOPE_LINES = 40
TOTAL_LINES = 220


class _Changes:
    """Upstream's scope changes per file between two revisions, computed once per file."""

    def __init__(self, repo: Path, old: str, new: str) -> None:
        self.repo, self.old, self.new = repo, old, new
        self._cache: dict[str, list[ScopeChange]] = {}
        changed = gitutil.out(["diff", "--name-only", "--no-renames", old, new], repo)
        self.changed = set(changed.splitlines())

    def of(self, path: str) -> list[ScopeChange]:
        if path not in self.changed:
            return []
        if path not in self._cache:
            self._cache[path] = (
                pyscope.release_changes(self.repo, self.old, self.new, path) if path.endswith(".py") else []
            )
        return self._cache[path]


def _marker_block(repo: Path, hunk: Hunk) -> list[str]:
    """The first side of the conflict block at ``hunk.line`` (what the release + carried patches hold)."""
    f = repo / hunk.path
    if not f.is_file() or hunk.line <= 0:
        return []
    lines = f.read_text(errors="replace").split("\n")
    out = []
    for line in lines[hunk.line :]:
        if line.startswith(("=======", "||||||| ")):
            break
        out.append(line)
    return out


def _locate(lines: list[str], block: list[str]) -> tuple[int, int] | None:
    """1-based line range of ``block`` in ``lines`` (the first match), if it is there."""
    body = [b for b in block if b.strip()]
    if not body:
        return None
    n = len(block)
    for i in range(len(lines) - n + 1):
        if lines[i : i + n] == block:
            return i + 1, i + n
    first = body[0]
    for i, line in enumerate(lines):
        if line == first:
            return i + 1, i + 1
    return None


def _render(
    selected: list[ScopeChange], header: str, repo_label: str, old_ref: str, new_ref: str
) -> list[str]:
    if not selected:
        return []
    out = [header]
    used = 0
    paths: list[str] = []
    for change in selected:
        if used >= TOTAL_LINES:
            out.append(f"  ... ({len(selected) - selected.index(change)} more scope(s) left out)")
            break
        body = pyscope.clip(change.diff, PER_SCOPE_LINES)
        out.append(f"  {change.label}:")
        out += [f"    {line}" for line in body]
        used += len(body) + 1
        if change.path not in paths:
            paths.append(change.path)
    out.append(f"  whole files: git -C {repo_label} diff {old_ref} {new_ref} -- {' '.join(paths)}")
    return out


def for_conflicts(
    repo: Path,
    old: str,
    new: str,
    hunks: list[Hunk],
    *,
    version: str,
    repo_label: str,
    old_ref: str,
    new_ref: str,
) -> list[str]:
    """Upstream's change to the scopes of the conflict hunks (function-level, release to release)."""
    changes = _Changes(repo, old, new)
    selected: list[ScopeChange] = []
    functions: dict[str, set[str]] = {}
    for hunk in hunks:
        found = changes.of(hunk.path)
        new_text = gitutil.git(["show", f"{new}:{hunk.path}"], repo, check=False).stdout.decode(
            "utf-8", errors="replace"
        )
        if hunk.path not in functions:
            functions[hunk.path] = {s.qualname for s in pyscope.scopes(new_text) if s.is_function}
        in_function = hunk.scope in functions[hunk.path]
        # The function around the conflict (a class or the module holds far more than the
        # conflict: there only location counts), and whatever upstream changed right there.
        picked = [
            c
            for c in found
            if in_function and c.scope and (c.scope == hunk.scope or c.scope.startswith(hunk.scope + "."))
        ]
        where = _locate(new_text.split("\n"), _marker_block(repo, hunk))
        if where is not None:
            picked += [c for c in found if pyscope.near(c, where) and c not in picked]
        for c in picked:
            if c not in selected:
                selected.append(c)
    header = f"what upstream changed there, {version} (upstream only, per function):"
    lines = _render(selected, header, repo_label, old_ref, new_ref)
    if not lines:
        files = sorted({h.path for h in hunks})
        lines = [
            "upstream's change around these hunks is not inside one function; see it with",
            f"  git -C {repo_label} diff {old_ref} {new_ref} -- {' '.join(files)}",
        ]
    return lines


def for_tests(
    repo: Path,
    old: str,
    new: str,
    calls: dict[str, dict[str, set[str]]],
    *,
    version: str,
    repo_label: str,
    old_ref: str,
    new_ref: str,
    hint: str = "",
) -> list[str]:
    """Upstream's change to the functions the failing tests executed.

    Functions named in ``hint`` (the failures' tracebacks) come first: that is where it broke.
    """
    changes = _Changes(repo, old, new)
    selected: list[ScopeChange] = []
    for per_file in calls.values():
        for path, qualnames in sorted(per_file.items()):
            names = {pyscope.normalize(q) for q in qualnames}
            body_ran = "<module>" in qualnames  # the module itself was executed during the test
            for c in changes.of(path):
                ran = c.function and any(n == c.scope or n.startswith(c.scope + ".") for n in names)
                ran = ran or (body_ran and c.scope == pyscope.MODULE)
                if ran and c not in selected:
                    selected.append(c)

    def rank(c: ScopeChange) -> int:
        if c.scope and c.scope.rsplit(".", 1)[-1] in hint:
            return 0  # named in a traceback: where it broke
        return 1 if c.scope == pyscope.MODULE else 2  # a module the test itself executed

    selected.sort(key=rank)
    header = f"upstream's change in functions the failing tests ran, {version}:"
    lines = _render(selected, header, repo_label, old_ref, new_ref)
    if not lines:
        files = sorted({p for per_file in calls.values() for p in per_file} & changes.changed)
        if files:
            lines = [
                "the functions the failing tests ran did not change, but these files they ran did:",
                *[f"  {p}" for p in files[:12]],
                f"  git -C {repo_label} diff {old_ref} {new_ref} -- <file>",
            ]
        else:
            lines = [
                (
                    "no upstream code the failing tests ran changed between the releases "
                    "(look at the test itself, or at data it reads)"
                )
            ]
    return lines
