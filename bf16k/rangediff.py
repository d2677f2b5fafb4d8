"""`range-diff`: what a carry to another upstream did to each patch, for the PR that lands it.

`git range-diff` pairs the commits of the series before and after by patch similarity and marks
each pair `=` (identical diff), `!` (something differs), `<` (only before) or `>` (only after).
`!` lumps together "upstream moved the lines around the patch" and "the patch itself changed";
a reviewer only needs to read the second. So each `!` pair is split by comparing the patch's own
`+`/`-` lines, file by file: the same lines -> context-only, anything else -> content-changed.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import carried, diffs, gitutil, patches, project, pyscope, series, upstream
from bf16k.errors import ToolError
from bf16k.project import Target
from bf16k.reasons import Reason, lookup

UNCHANGED = "unchanged"
CONTEXT_ONLY = "context-only"
CONTENT_CHANGED = "content-changed"
DROPPED = "dropped"
NEW = "new"
CLASSES = (UNCHANGED, CONTEXT_ONLY, CONTENT_CHANGED, DROPPED, NEW)

# `1:  0123456789ab = 1:  ba9876543210 subject` (numbers/hashes are `-` on the missing side)
_PAIR = re.compile(r"^\s*(\d+|-):\s+([0-9a-f]+|-+)\s+([=!<>])\s+(\d+|-):\s+([0-9a-f]+|-+)\s?(.*)$")

# Per file: (removed lines, added lines), in order.
ChangedLines = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


@dataclass
class HunkChange:
    """One place where a patch's own +/- lines differ between the two series (context ignored)."""

    path: str  # a file, or MESSAGE for the commit message
    scope: str  # pyscope qualname in the new patch's result ("" module level)
    lines: list[str]  # interdiff: outer marker + the patch line (` +x`, `-+y`, `++z`)


MESSAGE = "commit message"


@dataclass
class Entry:
    cls: str
    old_pos: int | None  # 1-based position in the old series
    new_pos: int | None
    old_name: str
    new_name: str
    subject: str
    note: str = ""
    body: list[str] = field(default_factory=list)  # range-diff's diff-of-diffs for this pair
    hunks: list[HunkChange] = field(default_factory=list)  # the patch's own changed hunks, each once

    @property
    def name(self) -> str:
        return self.new_name or self.old_name


@dataclass
class RangeDiff:
    entries: list[Entry]
    raw: str  # git range-diff's own output

    def count(self, cls: str) -> int:
        return sum(1 for e in self.entries if e.cls == cls)

    def summary(self) -> str:
        parts = []
        for cls in CLASSES:
            names = [e.name for e in self.entries if e.cls == cls]
            text = f"{len(names)} {cls}"
            if names and cls != UNCHANGED:
                text += " (" + ", ".join(f"`{n}`" for n in names) + ")"
            parts.append(text)
        return ", ".join(parts)


# --------------------------------------------------------------------------- per-commit facts


def commits(repo: Path, base: str, tip: str) -> list[str]:
    return gitutil.out(["rev-list", "--reverse", f"{base}..{tip}"], repo).split()


def patch_name(repo: Path, commit: str) -> str:
    """The patch file a commit exports to: its Patch-Filename line, else its subject's slug."""
    message = gitutil.out(["log", "-1", "--format=%B", commit], repo)
    for line in message.splitlines():
        if line.startswith("Patch-Filename:"):
            return line.split(":", 1)[1].strip()
    return series.slug(gitutil.out(["log", "-1", "--format=%s", commit], repo))


def changed_lines(repo: Path, commit: str) -> ChangedLines:
    """The commit's removed/added lines per file, without context (-U0, counted by hunk header).

    Hunk headers give the line counts, so a removed line that itself starts with `--` is not
    mistaken for a file header.
    """
    return {fd.path: (tuple(fd.removed), tuple(fd.added)) for fd in _show_u0(repo, commit)}


def _show_u0(repo: Path, commit: str) -> list[diffs.FileDiff]:
    text = gitutil.git(["show", "--format=", "--no-color", "-U0", "--no-ext-diff", commit], repo).stdout
    return diffs.parse(text.decode("utf-8", errors="replace"))


def describe_change(old: ChangedLines, new: ChangedLines) -> str:
    """One line saying which files' +/- lines differ (for the content-changed note)."""
    parts = []
    for path in sorted(set(old) | set(new)):
        if path not in new:
            parts.append(f"{path}: no longer touched")
        elif path not in old:
            parts.append(f"{path}: newly touched")
        elif old[path] != new[path]:
            (om, op), (nm, np_) = old[path], new[path]
            parts.append(f"{path}: -{len(om)}/+{len(op)} lines became -{len(nm)}/+{len(np_)}")
    return "; ".join(parts)


@dataclass
class _Block:
    """One -U0 hunk of a patch: a run of removed and added lines at one place."""

    path: str
    new_start: int
    lines: list[str]  # with their +/- markers

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(self.lines)


def _blocks(repo: Path, commit: str) -> dict[str, list[_Block]]:
    return {
        fd.path: [_Block(fd.path, h.new_start, [x for x in h.lines if x[:1] in ("+", "-")]) for h in fd.hunks]
        for fd in _show_u0(repo, commit)
    }


_TRAILER_NOISE = re.compile(r"^(Last-Update|Patch-Filename):.*$")


def _message_lines(repo: Path, commit: str) -> list[str]:
    return [line for line in _message(repo, commit).splitlines() if not _TRAILER_NOISE.match(line)]


def hunk_changes(repo: Path, old_commit: str, new_commit: str) -> list[HunkChange]:
    """Where the patch's own +/- lines differ, one entry per changed place, in file order.

    Compared as -U0 blocks, so context lines and how git groups nearby changes into hunks do
    not count; a block is scoped in the new patch's resulting file.
    """
    old, new = _blocks(repo, old_commit), _blocks(repo, new_commit)
    changes: list[HunkChange] = []
    files: dict[str, list[str]] = {}

    def scope(path: str, line: int) -> str:
        if path not in files:
            proc = gitutil.git(["show", f"{new_commit}:{path}"], repo, check=False)
            files[path] = (
                proc.stdout.decode("utf-8", errors="replace").split("\n") if proc.returncode == 0 else []
            )
        return pyscope.scope_at(files[path], max(line, 1)) if files[path] else ""

    for path in list(new) + [p for p in old if p not in new]:
        a, b = old.get(path, []), new.get(path, [])
        sm = difflib.SequenceMatcher(a=[x.key for x in a], b=[x.key for x in b], autojunk=False)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                continue
            pairs: list[tuple[list[_Block], list[_Block]]]
            if tag == "replace" and i2 - i1 == j2 - j1:
                pairs = [([a[i1 + n]], [b[j1 + n]]) for n in range(i2 - i1)]
            else:
                pairs = [(a[i1:i2], b[j1:j2])]
            for olds, news in pairs:
                before = [line for blk in olds for line in blk.lines]
                after = [line for blk in news for line in blk.lines]
                start = news[0].new_start if news else (olds[0].new_start if olds else 1)
                # A block can be a whole new file: one entry per place that differs inside it.
                matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
                for group in matcher.get_grouped_opcodes(2):
                    lines: list[str] = []
                    first_change = None
                    for op, a1, a2, b1, b2 in group:
                        if op == "equal":
                            lines += [" " + x for x in before[a1:a2]]
                            continue
                        if first_change is None:
                            first_change = b1
                        lines += ["-" + x for x in before[a1:a2]] + ["+" + x for x in after[b1:b2]]
                    # File line of the first changed place: the block's start plus the added
                    # lines before it (a -U0 block's new side is its + lines).
                    at = start + sum(1 for x in after[: first_change or 0] if x.startswith("+"))
                    changes.append(HunkChange(path, scope(path, at), lines))
    ma, mb = _message_lines(repo, old_commit), _message_lines(repo, new_commit)
    if ma != mb:
        lines = list(difflib.unified_diff(ma, mb, lineterm="", n=1))[2:]
        changes.append(HunkChange(MESSAGE, "", lines))
    return changes


# --------------------------------------------------------------------------- classification


def run_range_diff(repo: Path, old_base: str, old_tip: str, new_base: str, new_tip: str) -> str:
    args = ["range-diff", "--no-color", "--no-notes", f"{old_base}..{old_tip}", f"{new_base}..{new_tip}"]
    return gitutil.git(args, repo).stdout.decode("utf-8", errors="replace")


def classify(
    repo: Path, old_base: str, old_tip: str, new_base: str, new_tip: str, notes: dict[str, str] | None = None
) -> RangeDiff:
    """Classify every patch of old_base..old_tip against new_base..new_tip (commits in ``repo``).

    ``notes`` adds a note per patch name (e.g. why a patch was dropped).
    """
    old = commits(repo, old_base, old_tip)
    new = commits(repo, new_base, new_tip)
    raw = run_range_diff(repo, old_base, old_tip, new_base, new_tip)
    entries: list[Entry] = []
    for line in raw.splitlines():
        m = _PAIR.match(line)
        if not m:
            if entries and line.startswith("    "):
                entries[-1].body.append(line[4:])
            continue
        opos = int(m.group(1)) if m.group(1) != "-" else None
        npos = int(m.group(4)) if m.group(4) != "-" else None
        mark, subject = m.group(3), m.group(6)
        oc = old[opos - 1] if opos else ""
        nc = new[npos - 1] if npos else ""
        entry = Entry(
            cls="",
            old_pos=opos,
            new_pos=npos,
            subject=subject,
            old_name=patch_name(repo, oc) if oc else "",
            new_name=patch_name(repo, nc) if nc else "",
        )
        if mark == "=":
            entry.cls = UNCHANGED
        elif mark == "<":
            entry.cls = DROPPED
        elif mark == ">":
            entry.cls = NEW
        if mark == "!":
            _classify_pair(repo, entry, oc, nc)
        if entry.old_name and entry.new_name and entry.old_name != entry.new_name:
            entry.note = (entry.note + "; " if entry.note else "") + f"renamed from `{entry.old_name}`"
        entries.append(entry)
    entries = _pair_by_name(repo, entries, old, new)
    for e in entries:
        extra = (notes or {}).get(e.name)
        if extra:
            e.note = (e.note + "; " if e.note else "") + extra
    return RangeDiff(entries, raw)


def _classify_pair(repo: Path, entry: Entry, oc: str, nc: str) -> None:
    """Split a changed pair: the same +/- lines in every file is context-only."""
    before, after = changed_lines(repo, oc), changed_lines(repo, nc)
    if before == after:
        entry.cls = CONTEXT_ONLY
        entry.note = "upstream changed the lines around it; its own +/- lines are identical"
        if _message(repo, oc) != _message(repo, nc):
            entry.note += "; the commit message changed"
    else:
        entry.cls = CONTENT_CHANGED
        entry.note = describe_change(before, after)
        entry.hunks = hunk_changes(repo, oc, nc)


def _pair_by_name(repo: Path, entries: list[Entry], old: list[str], new: list[str]) -> list[Entry]:
    """Re-pair a `<` and a `>` that carry the same patch file name.

    range-diff pairs by similarity, so a small patch whose resolution rewrote most of it comes out
    as dropped + new. Patch-Filename is the series' own identity of a patch, so trust it.
    """
    dropped = {e.old_name for e in entries if e.cls == DROPPED}
    twins = {e.new_name: e for e in entries if e.cls == NEW and e.new_name in dropped}
    result = []
    for e in entries:
        if e.cls == NEW and e.new_name in twins:
            continue  # merged into its dropped twin below
        twin = twins.get(e.old_name) if e.cls == DROPPED else None
        if twin is None:
            result.append(e)
            continue
        assert e.old_pos is not None and twin.new_pos is not None
        oc, nc = old[e.old_pos - 1], new[twin.new_pos - 1]
        merged = Entry("", e.old_pos, twin.new_pos, e.old_name, twin.new_name, twin.subject)
        _classify_pair(repo, merged, oc, nc)
        one = [
            "range-diff",
            "--no-color",
            "--no-notes",
            "--creation-factor=100",
            f"{oc}^..{oc}",
            f"{nc}^..{nc}",
        ]
        text = gitutil.git(one, repo).stdout.decode("utf-8", errors="replace")
        merged.body = [line[4:] for line in text.splitlines() if line.startswith("    ")]
        result.append(merged)
    return result


def _message(repo: Path, commit: str) -> str:
    return gitutil.out(["log", "-1", "--format=%B", commit], repo)


# --------------------------------------------------------------------------- markdown


def short(path: str) -> str:
    """A path as a PR reader needs it: upstream's package prefix dropped."""
    return path.removeprefix("python/sglang/")


def hand_merged(entry: Entry, reasons: list[Reason]) -> list[str]:
    """Files of a patch a human touched in the carry: changed hunks and recorded resolutions."""
    files = [h.path for h in entry.hunks if h.path != MESSAGE]
    files += [r.path for r in reasons if r.patch == entry.name and r.path]
    return list(dict.fromkeys(files))


def to_markdown(
    rd: RangeDiff, title: str, old_label: str, new_label: str, reasons: list[Reason] | None = None
) -> str:
    """The PR-description form: per patch its class and hand-merged files, then every changed
    hunk once with the maintainer's reason (``reasons``, from the carry's ``--continue``)."""
    reasons = reasons or []

    def pos(p: int | None) -> str:
        return str(p) if p is not None else "–"

    lines = [f"## {title}", "", f"Before: {old_label}  ", f"After: {new_label}", ""]
    lines += ["| # | patch | result | hand-merged files | note |", "| --- | --- | --- | --- | --- |"]
    for e in rd.entries:
        note = e.note.replace("|", "\\|")
        if e.cls == CONTENT_CHANGED:
            n = len(e.hunks)
            note = f"{n} changed hunk{'s' if n != 1 else ''}, below"
        files = ", ".join(f"`{short(f)}`" for f in hand_merged(e, reasons)) or "–"
        lines.append(f"| {pos(e.old_pos)} → {pos(e.new_pos)} | `{e.name}` | {e.cls} | {files} | {note} |")
    lines += ["", f"Summary: {rd.summary()}.", ""]
    for e in rd.entries:
        mine = [r for r in reasons if r.patch == e.name]
        if not e.hunks and not mine:
            continue
        lines += [f"### `{e.name}` ({e.cls})", ""]
        used: set[int] = set()
        for h in e.hunks:
            found = lookup(reasons, e.name, h.path, h.scope)
            used |= {id(r) for r in found}
            if h.path == MESSAGE:  # the message says why itself
                head = "- The commit message" + (": " + "; ".join(r.why for r in found) if found else "")
            else:
                why = "; ".join(r.why for r in found) or "*no reason recorded*"
                head = f"- `{short(h.path)}`" + (f" (`{h.scope}`)" if h.scope else "") + f": {why}"
            lines += [head, "", "  ```diff", *[f"  {line}" for line in h.lines], "  ```", ""]
        rest = [r for r in mine if id(r) not in used]
        if rest:
            lines += ["Hand-merged, the patch's own lines kept as they were:", ""]
            for r in rest:
                lines.append(f"- `{short(r.path)}`" + (f" (`{r.scope}`)" if r.scope else "") + f": {r.why}")
            lines.append("")
    return "\n".join(lines)


def unexplained(rd: RangeDiff, reasons: list[Reason]) -> list[str]:
    """Changed hunks no recorded reason covers (the commit message's own edits excepted)."""
    return [
        f"{e.name}: {h.path}" + (f" ({h.scope})" if h.scope else "")
        for e in rd.entries
        for h in e.hunks
        if h.path != MESSAGE and not lookup(reasons, e.name, h.path, h.scope)
    ]


# --------------------------------------------------------------------------- series against series


def apply_on(repo: Path, base: str, series_dir: Path) -> str:
    """Apply ``series_dir`` on ``base`` in the scratch ``repo``; return the tip."""
    patches.reset_to(repo, base)
    names = series.read_order(series_dir)
    failure = patches.run_am(repo, patches.mbox(series_dir, names), names)
    if failure:
        patches.abort_am(repo)
        raise ToolError(
            f"{series_dir}: patch {failure.index + 1} '{failure.name}' does not apply on {base[:12]} "
            f"(files: {', '.join(failure.files) or '?'}); run `nox -s check`"
        )
    return gitutil.rev_parse(repo, "HEAD")


def series_range_diff(root: Path, version: str) -> tuple[RangeDiff, str]:
    """series/ on the pin against series/next/<version>/ on its carried base; (result, markdown)."""
    t = project.target(root, version)
    if not t.carried:
        raise ToolError(f"{version} is the pinned release: there is nothing to compare series/ with")
    pin = t.load_pin()
    old_pin = project.Target(root, None).load_pin()
    up = upstream.obtain(t, quiet=True)
    old_base = parent_base(t, up)
    with patches.scratch_clone(up) as repo:
        old_tip = apply_on(repo, old_base, root / "series")
        new_tip = apply_on(repo, up.base, t.series_dir)
        rd = classify(repo, old_base, old_tip, up.base, new_tip, notes=dropped_notes(t.series_dir))
    md = to_markdown(
        rd,
        f"Range-diff: series on sglang {old_pin.version} → {pin.version}",
        f"`series/` on sglang {old_pin.version} (base `{old_base[:12]}`)",
        f"`series/next/{version}/` on sglang {pin.version} "
        f"(PyPI wheel `{pin.wheel.filename}`, base `{up.base[:12]}`)",
        carried.load(t.series_dir).resolutions,
    )
    return rd, md


def parent_base(t: Target, up: upstream.Upstream) -> str:
    """The pinned import a carried base descends from (rebuilt if the tree predates the ref)."""
    proc = gitutil.git(
        ["rev-parse", "--verify", "-q", f"{upstream.PARENT_REF}^{{commit}}"], up.repo, check=False
    )
    if proc.returncode == 0:
        return proc.stdout.decode().strip()
    return upstream.materialize_carried(up.repo, t.load_pin(), upstream.parent_pin(t))[0]


def dropped_notes(series_dir: Path) -> dict[str, str]:
    """Notes for patches a carry dropped, from carried.toml (range-diff shows them as `<`)."""
    dropped = upstream.read_carried(series_dir).get("dropped", {})
    if not isinstance(dropped, dict):
        return {}
    return {str(name): f"Applied-Upstream: {value}" for name, value in dropped.items()}
