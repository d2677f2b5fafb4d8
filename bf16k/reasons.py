"""Hand-made hunks of a carry and the maintainer's one-line reason for each.

Every change a carry needs a human for (a conflict resolved, a patch or test fixed because the
new release broke it) is a *hunk*: a file and the Python scope it sits in. At ``--continue`` the
maintainer says why, one line per hunk::

    python/sglang/srt/disaggregation/common/conn.py (PrefillServerInfo): 0.5.22 added ...
    test_mempool.py: the pool's page count is upstream's, whatever its formula

A path may be shortened to any tail of it; without ``(scope)`` the line covers every hunk of
that file. The reasons are kept in the carried series (``carried.toml``) and become the
range-diff's per-hunk notes and the CHANGELOG entry.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from bf16k import diffs, gitutil, pyscope
from bf16k.errors import ToolError

_LINE = re.compile(
    r"^\s*(?:[-*]\s+)?(?P<path>[A-Za-z0-9_./-]+?)(?:\s+\((?P<scope>[^)]*)\))?\s*:\s+(?P<why>\S.*)$"
)
MARKERS = ("<<<<<<< ", "=======", ">>>>>>> ", "||||||| ")


@dataclass(frozen=True)
class Hunk:
    path: str
    scope: str  # pyscope qualname, "" for module level
    line: int  # first line in the file as it is now

    @property
    def label(self) -> str:
        return f"{self.path} ({self.scope})" if self.scope else self.path


@dataclass(frozen=True)
class Reason:
    patch: str
    path: str
    scope: str
    why: str
    kind: str  # "conflict", "tests" or "replay"

    def as_dict(self) -> dict[str, str]:
        return {
            "patch": self.patch,
            "path": self.path,
            "scope": self.scope,
            "kind": self.kind,
            "why": self.why,
        }


def unique(hunks: list[Hunk]) -> list[Hunk]:
    seen: set[tuple[str, str]] = set()
    out = []
    for h in hunks:
        if (h.path, h.scope) not in seen:
            seen.add((h.path, h.scope))
            out.append(h)
    return out


def marker_hunks(repo: Path, paths: list[str]) -> list[Hunk]:
    """One hunk per conflict-marker block in the worktree files."""
    found = []
    for path in paths:
        f = repo / path
        if not f.is_file():
            found.append(Hunk(path, pyscope.MODULE, 0))
            continue
        lines = f.read_bytes().decode("utf-8", errors="replace").split("\n")
        for i, line in enumerate(lines, start=1):
            if line.startswith("<<<<<<< "):
                found.append(Hunk(path, pyscope.scope_at(lines, i + 1), i))
    return found


def tree_hunks(repo: Path, a: str, b: str, paths: list[str] | None = None) -> list[Hunk]:
    """One hunk per -U0 change between two trees (or commits), scoped in the file it ends up in."""
    args = ["diff", "-U0", "--no-color", "--no-renames", a, b]
    if paths:
        args += ["--", *paths]
    text = gitutil.git(args, repo).stdout.decode("utf-8", errors="replace")
    cache: dict[tuple[str, str], list[str]] = {}

    def lines_at(rev: str, path: str) -> list[str]:
        if (rev, path) not in cache:
            proc = gitutil.git(["show", f"{rev}:{path}"], repo, check=False)
            ok = proc.returncode == 0
            cache[(rev, path)] = proc.stdout.decode("utf-8", errors="replace").split("\n") if ok else []
        return cache[(rev, path)]

    found: list[Hunk] = []
    for fd in diffs.parse(text):
        for h in fd.hunks if fd.path else []:
            lines, at = (
                (lines_at(b, fd.path), h.new_start) if h.new_count else (lines_at(a, fd.path), h.old_start)
            )
            found.append(Hunk(fd.path, pyscope.scope_at(lines, max(at, 1)) if lines else "", h.new_start))
    return found


def _path_matches(given: str, path: str) -> bool:
    return path == given or path.endswith("/" + given.lstrip("/"))


def covers(reason_path: str, reason_scope: str, hunk: Hunk) -> bool:
    if not _path_matches(reason_path, hunk.path):
        return False
    if not reason_scope:
        return True
    return pyscope.normalize(reason_scope) == hunk.scope or hunk.scope.startswith(reason_scope + ".")


def parse(
    text: str, hunks: list[Hunk], patch_of: dict[tuple[str, str], str], kind: str
) -> tuple[list[Reason], list[Hunk]]:
    """(reasons, hunks still without one) from the maintainer's message.

    Lines that do not name a file of a hunk are free text: kept, attached to every hunk's patch
    as a note (path "") only if no hunk line was given at all.
    """
    reasons: list[Reason] = []
    covered: set[tuple[str, str]] = set()
    free: list[str] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        hit = False
        if m:
            rpath, rscope, why = m.group("path"), (m.group("scope") or "").strip(), m.group("why").strip()
            for h in hunks:
                if covers(rpath, rscope, h):
                    hit = True
                    covered.add((h.path, h.scope))
                    reasons.append(Reason(patch_of.get((h.path, h.scope), ""), h.path, h.scope, why, kind))
        if not hit and line.strip():
            free.append(line.strip())
    missing = [h for h in unique(hunks) if (h.path, h.scope) not in covered]
    if free and hunks and len(unique(hunks)) == 1 and missing:
        # One hunk and one free-text reason: it can only be about that hunk.
        h = missing[0]
        reasons.append(Reason(patch_of.get((h.path, h.scope), ""), h.path, h.scope, " ".join(free), kind))
        missing = []
    return dedupe(reasons), missing


def require(
    text: str,
    hunks: list[Hunk],
    patch_of: dict[tuple[str, str], str],
    kind: str,
    which: str,
    name_patch: bool = False,
) -> list[Reason]:
    """``parse``, refusing (changing nothing) while a hunk has no reason: the error lists those
    hunks (with their patch when ``name_patch``) and the ``--continue`` command to give them.
    ``which`` says which hunks need one ("hand-made hunk", "hunk you changed")."""
    found, missing = parse(text, hunks, patch_of, kind)
    if missing:
        raise ToolError(
            f"say why for each {which} (it goes into carried.toml, the range-diff and the "
            "CHANGELOG entry); no reason for:\n"
            + "\n".join(
                f"  {h.label}" + (f" (patch '{patch_of[(h.path, h.scope)]}')" if name_patch else "")
                for h in missing
            )
            + "\nrun:\n  nox -s rebase -- --continue "
            + " ".join(template(unique(hunks)))
            + "\n(nothing was changed: your edits are where you left them)"
        )
    return found


def dedupe(reasons: list[Reason]) -> list[Reason]:
    """One reason per (patch, path, scope); a later one replaces an earlier one."""
    by_key: dict[tuple[str, str, str], Reason] = {}
    for r in reasons:
        by_key[(r.patch, r.path, r.scope)] = r
    return list(by_key.values())


def template(hunks: list[Hunk]) -> list[str]:
    """The `-m` arguments a maintainer fills in, one per hunk."""
    return [f'-m "{h.label}: <why>"' for h in unique(hunks)]


def lookup(reasons: list[Reason], patch: str, path: str, scope: str) -> list[Reason]:
    """The reasons recorded for a hunk of ``patch``: its scope, a scope around it, else its file."""
    mine = [r for r in reasons if r.patch == patch and r.path == path]
    exact = [r for r in mine if r.scope == scope]
    if exact:
        return exact
    around = [
        r for r in mine if r.scope and (scope.startswith(r.scope + ".") or r.scope.startswith(scope + "."))
    ]
    if around:
        return around
    return [r for r in mine if not r.scope]


# --------------------------------------------------------------------------- CHANGELOG


def wrap_bullet(text: str, width: int = 100) -> list[str]:
    """A Keep-a-Changelog bullet wrapped like the rest of the file (two-space continuation)."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent="- ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
