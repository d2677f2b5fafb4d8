"""Python scopes (``Class.method``) of source lines, and upstream's change limited to some of them.

A carry's stop shows what the new release changed where the series collides with it. Whole-file
diffs between two releases are hundreds of lines (829 for ``conn.py`` against one conflicting
field), so the change is cut to the scopes that matter: the functions around a conflict, or the
functions a failing test ran. A scope is a qualified name as Python spells ``co_qualname``
without ``<locals>`` (``DeepSeekV4IndexerPool._create_buffer``); module-level lines have ``""``.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import diffs, gitutil

MODULE = ""  # the scope of module-level lines
_DEF = re.compile(r"^(\s*)(?:async\s+def|def|class)\s+([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Scope:
    qualname: str
    start: int  # 1-based, first line (decorators included)
    end: int  # 1-based, last line
    is_function: bool


def normalize(qualname: str) -> str:
    """``f.<locals>.g`` -> ``f.g``; a trailing ``<listcomp>``/``<lambda>`` belongs to its function."""
    parts = [p for p in qualname.split(".") if p != "<locals>"]
    while parts and parts[-1].startswith("<"):
        parts.pop()
    return ".".join(parts)


def scopes(text: str) -> list[Scope]:
    """Every def and class of a module, outermost first; [] when the text does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    found: list[Scope] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                end = child.end_lineno or child.lineno
                found.append(Scope(name, start, end, not isinstance(child, ast.ClassDef)))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def scope_at(lines: list[str], lineno: int) -> str:
    """The scope holding 1-based ``lineno``, read from indentation alone.

    Works on files that do not parse (conflict markers, a half-made resolution): the nearest
    ``def``/``class`` above with less indentation than the line, then its parents likewise.
    """
    if not lines:
        return MODULE
    i = min(max(lineno, 1), len(lines)) - 1
    # Indentation of the line itself (or the next non-blank, non-marker one).
    indent = None
    for j in range(i, len(lines)):
        text = lines[j]
        if text.strip() and not text.startswith(("<<<<<<<", "=======", ">>>>>>>", "|||||||")):
            indent = len(text) - len(text.lstrip())
            break
    if indent is None:
        return MODULE
    names: list[str] = []
    own = _DEF.match(lines[i])
    if own and len(own.group(1)) == indent:  # the line is a def/class line: its own scope
        names.append(own.group(2))
        if indent == 0:
            return own.group(2)
    for j in range(i, -1, -1):
        m = _DEF.match(lines[j])
        if m and len(m.group(1)) < indent:
            names.append(m.group(2))
            indent = len(m.group(1))
            if indent == 0:
                break
        elif (
            j < i
            and lines[j].strip()
            and not lines[j][0].isspace()
            and not lines[j].startswith(("<<<<<<<", "=======", ">>>>>>>", "|||||||", "#", ")", "]", "}"))
        ):
            break  # a top-level statement: we left every def/class
    return ".".join(reversed(names))


def innermost(found: list[Scope], start: int, end: int) -> Scope | None:
    """The innermost function around lines start..end, else the innermost class, else None."""
    around = [s for s in found if s.start <= start and end <= s.end]
    funcs = [s for s in around if s.is_function]
    pick = funcs or around
    return max(pick, key=lambda s: s.start) if pick else None


# --------------------------------------------------------------------------- release diffs


@dataclass
class ScopeChange:
    """Upstream's change to one scope of one file between two revisions."""

    path: str
    scope: str  # qualname, or MODULE
    old_range: tuple[int, int]  # lines in the old file (0, 0: the scope is new)
    new_range: tuple[int, int]  # lines in the new file (0, 0: the scope is gone)
    diff: list[str] = field(default_factory=list)  # unified diff lines of just that scope
    function: bool = False  # the whole function's diff (else one change outside any function)

    @property
    def label(self) -> str:
        return f"{self.path} ({self.scope})" if self.scope else f"{self.path} (module level)"


def _show(repo: Path, rev: str, path: str) -> str:
    proc = gitutil.git(["show", f"{rev}:{path}"], repo, check=False)
    return proc.stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else ""


def _hunks(repo: Path, old: str, new: str, path: str) -> list[tuple[int, int, int, int]]:
    """(old start, old count, new start, new count) of each -U0 hunk of path between revs."""
    text = gitutil.git(["diff", "-U0", "--no-color", old, new, "--", path], repo).stdout.decode(
        "utf-8", errors="replace"
    )
    return [
        (h.old_start, h.old_count, h.new_start, h.new_count) for fd in diffs.parse(text) for h in fd.hunks
    ]


def _span(start: int, count: int) -> tuple[int, int]:
    """Lines a -U0 hunk side covers; a pure insertion (count 0) sits after ``start``."""
    return (start, start + count - 1) if count else (start, start)


def _trim(lines: list[str], start: int, count: int) -> tuple[int, int]:
    """The span a -U0 hunk side covers, without the blank lines at its ends."""
    if not count:
        return start, start
    lo, hi = start, start + count - 1
    while lo < hi and not lines[lo - 1].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    return lo, hi


def release_changes(repo: Path, old: str, new: str, path: str) -> list[ScopeChange]:
    """Upstream's change to ``path`` between ``old`` and ``new``: one entry per function it touches
    (that function's own diff), and one per change outside any function (a class body, module
    level) with three lines of context."""
    old_text, new_text = _show(repo, old, path), _show(repo, new, path)
    old_lines, new_lines = old_text.split("\n"), new_text.split("\n")
    old_scopes, new_scopes = scopes(old_text), scopes(new_text)
    old_funcs = [s for s in old_scopes if s.is_function]
    new_funcs = [s for s in new_scopes if s.is_function]
    by_key: dict[str, ScopeChange] = {}
    loose: list[ScopeChange] = []
    for os_, oc, ns, nc in _hunks(repo, old, new, path):
        nspan, ospan = _trim(new_lines, ns, nc), _trim(old_lines, os_, oc)
        func = innermost(new_funcs, *nspan) if nc else None
        if func is None and oc:
            func = innermost(old_funcs, *ospan)
        if func is None:
            holder = (innermost(new_scopes, *nspan) if nc else None) or (
                innermost(old_scopes, *ospan) if oc else None
            )
            # -U0 numbers a pure insertion/deletion after the line it follows: three lines each side.
            o_lo = max((os_ - 3) if oc else (os_ - 2), 1)
            n_lo = max((ns - 3) if nc else (ns - 2), 1)
            a = old_lines[o_lo - 1 : (os_ + oc + 2) if oc else (os_ + 3)]
            b = new_lines[n_lo - 1 : (ns + nc + 2) if nc else (ns + 3)]
            diff = list(difflib.unified_diff(a, b, lineterm="", n=3))[2:]
            scope = holder.qualname if holder else MODULE
            loose.append(ScopeChange(path, scope, _span(os_, oc), _span(ns, nc), _renumber(diff, o_lo, n_lo)))
            continue
        name = func.qualname
        if name in by_key:
            continue
        olds = [s for s in old_funcs if s.qualname == name]
        news = [s for s in new_funcs if s.qualname == name]
        o = (olds[0].start, olds[0].end) if olds else (0, 0)
        n = (news[0].start, news[0].end) if news else (0, 0)
        a = old_lines[o[0] - 1 : o[1]] if olds else []
        b = new_lines[n[0] - 1 : n[1]] if news else []
        diff = list(difflib.unified_diff(a, b, lineterm="", n=3))[2:]  # drop the ---/+++ lines
        by_key[name] = ScopeChange(path, name, o, n, _renumber(diff, o[0], n[0]), function=True)
    return sorted([*by_key.values(), *loose], key=lambda c: c.new_range[0] or c.old_range[0])


def _renumber(diff: list[str], old_first: int, new_first: int) -> list[str]:
    """difflib numbers lines from the slice it saw; make hunk headers say file lines."""
    out = []
    for line in diff:
        m = diffs.HUNK_HEADER.match(line)
        if m and old_first and new_first:
            old_count, new_count = (f",{g}" if g is not None else "" for g in (m.group(2), m.group(4)))
            line = f"@@ -{int(m.group(1)) + old_first - 1}{old_count} +{int(m.group(3)) + new_first - 1}{new_count} @@"
        elif m:
            line = "@@ " + line.split("@@")[1].strip() + " @@"
        out.append(line)
    return out


def covers(change: ScopeChange, scope: str) -> bool:
    """Whether a change to ``change.scope`` is the change to ``scope`` or to what holds it."""
    if change.scope == MODULE:
        return False
    return (
        scope == change.scope or scope.startswith(change.scope + ".") or change.scope.startswith(scope + ".")
    )


def near(change: ScopeChange, lines: tuple[int, int], slack: int = 3) -> bool:
    """Whether a change touches (new-file) lines ``lines`` or sits within ``slack`` of them."""
    lo, hi = change.new_range
    if (lo, hi) == (0, 0):
        return False
    return lo - slack <= lines[1] and lines[0] <= hi + slack


def clip(diff: list[str], limit: int) -> list[str]:
    """At most ``limit`` lines of a diff, saying how many were left out."""
    if len(diff) <= limit:
        return diff
    return diff[:limit] + [f"... ({len(diff) - limit} more lines)"]
