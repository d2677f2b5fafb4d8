"""Each PR's commits as upstream gets them: the series' patches without the series-only trailers,
numbered per PR for ``git am --keep-non-patch``, and what each changes (git's own diffstat)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bf16k import diffs, gitutil, prs, series

# Trailers that only mean something inside this series; the upstream commit does not carry them.
SERIES_ONLY_TRAILERS = ("Forwarded", "Last-Update", "Applied-Upstream", "Patch-Filename", "Origin")


@dataclass
class FileStat:
    path: str
    added: str  # numbers as git prints them ("-" for binary)
    deleted: str
    status: str  # "new", "deleted" or ""


@dataclass
class Patch:
    name: str
    info: series.PatchInfo
    stats: list[FileStat]

    @property
    def stem(self) -> str:
        return self.name[: -len(".patch")]


def diffstat(patch: bytes, cwd: Path) -> list[FileStat]:
    """Per-file added/deleted lines (git's own count) and whether the patch creates or deletes it."""
    _, diff = series.split_message(patch)
    text = gitutil.git(["apply", "--numstat", "-"], cwd, input_bytes=diff).stdout.decode()
    files = diffs.parse(diff.decode(errors="replace"))
    created = {fd.old_path for fd in files if fd.new_file}
    removed = {fd.old_path for fd in files if fd.deleted}
    stats = []
    for line in text.splitlines():
        added, deleted, path = line.split("\t", 2)
        status = "new" if path in created else "deleted" if path in removed else ""
        stats.append(FileStat(path, added, deleted, status))
    return stats


def upstream_patch(data: bytes) -> bytes:
    """The series patch as an upstream commit: no series-only trailers (the subject is kept)."""
    head, diff = series.split_message(data)
    header, sep, message = head.partition(b"\n\n")
    text = message.rstrip(b"\n")
    cut = text.rfind(b"\n\n")
    prose, block = (text[: cut + 2], text[cut + 2 :]) if cut >= 0 else (b"", text)
    block_lines = block.split(b"\n")
    if all(series.TRAILER.match(line.decode("utf-8", errors="replace")) for line in block_lines):
        block_lines = [
            line
            for line in block_lines
            if not any(line.startswith(f"{t}:".encode()) for t in SERIES_ONLY_TRAILERS)
        ]
    body = (prose + b"\n".join(block_lines)).rstrip(b"\n") + b"\n"
    return header + sep + body + diff


def write_pr_patches(series_dir: Path, prmap: prs.PRMap, dest: Path) -> dict[str, Path]:
    """Each PR's patches, numbered from 0001 within the PR, in ``dest/<id>/``."""
    dirs: dict[str, Path] = {}
    for pr in prmap.prs:
        d = dest / pr.id
        d.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(pr.patches, start=1):
            (d / f"{i:04d}-{name}").write_bytes(upstream_patch((series_dir / name).read_bytes()))
        dirs[pr.id] = d
    return dirs
