"""Unified diffs as git prints them, read in one place: the files, their headers and their hunks.

A hunk's body is read for as many lines as its ``@@`` header counts, so a removed line that
starts with ``--`` or an added one that starts with ``++`` is never taken for a file header.
Lines before the first ``diff --git`` (a patch's message and diffstat) and after a file's last
hunk (format-patch's signature) belong to no file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)")
NO_NEWLINE = "\\"  # "\ No newline at end of file": belongs to the line before it, counts as none


@dataclass
class Hunk:
    header: str  # the @@ line
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[str] = field(default_factory=list)  # the body, each line with its marker


@dataclass
class FileDiff:
    old_path: str  # the a/ path ("" when the header cannot be read)
    path: str  # the b/ path, where the file ends up ("" when the header cannot be read)
    header: list[str]  # diff --git, then the mode, index, --- and +++ lines
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def new_file(self) -> bool:
        return any(line.startswith("new file mode") for line in self.header)

    @property
    def deleted(self) -> bool:
        return any(line.startswith("deleted file mode") for line in self.header)

    @property
    def removed(self) -> list[str]:
        """The removed lines, hunk by hunk, without their markers."""
        return [line[1:] for h in self.hunks for line in h.lines if line.startswith("-")]

    @property
    def added(self) -> list[str]:
        """The added lines, hunk by hunk, without their markers."""
        return [line[1:] for h in self.hunks for line in h.lines if line.startswith("+")]

    def runs(self, marker: str) -> list[list[str]]:
        """Runs of consecutive ``marker`` ("+" or "-") lines, without the marker; none spans hunks."""
        found: list[list[str]] = []
        for hunk in self.hunks:
            kind = ""
            for line in hunk.lines:
                if line.startswith(NO_NEWLINE):
                    continue
                if line[:1] != kind:
                    kind = line[:1]
                    if kind == marker:
                        found.append([])
                if kind == marker:
                    found[-1].append(line[1:])
        return found


def _count(group: str | None) -> int:
    return int(group) if group is not None else 1  # "@@ -5 +5 @@": one line each side


def parse(text: str) -> list[FileDiff]:
    """Every file of a unified git diff (a patch file's text is fine too), in order."""
    files: list[FileDiff] = []
    hunk: Hunk | None = None
    old_left = new_left = 0
    for line in text.split("\n"):
        if hunk is not None and (old_left > 0 or new_left > 0):
            hunk.lines.append(line)
            kind = line[:1]
            if kind in (" ", "-", ""):  # "": a blank context line whose space was stripped
                old_left -= 1
            if kind in (" ", "+", ""):
                new_left -= 1
            continue
        if hunk is not None and line.startswith(NO_NEWLINE):  # after the hunk's last line
            hunk.lines.append(line)
            continue
        if line.startswith("diff --git "):
            m = _GIT_HEADER.match(line)
            files.append(FileDiff(m.group(1) if m else "", m.group(2) if m else "", [line]))
            hunk = None
            continue
        if not files:
            continue
        m = HUNK_HEADER.match(line)
        if m:
            hunk = Hunk(line, int(m.group(1)), _count(m.group(2)), int(m.group(3)), _count(m.group(4)))
            files[-1].hunks.append(hunk)
            old_left, new_left = hunk.old_count, hunk.new_count
        elif hunk is None:
            files[-1].header.append(line)
    return files
