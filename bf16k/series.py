"""The patch series on disk: order file, patch files, DEP-3 style headers, hygiene and lint.

Order lives only in ``series/series`` (one file name a line, ``#`` comments allowed); file names
carry no numbers, so adding or dropping a patch touches one line (Electron's ``.patches``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from email.header import decode_header, make_header
from pathlib import Path

from bf16k import diffs
from bf16k.errors import ToolError

SERIES_FILE = "series"
ALLOWED_PREFIX = "python/sglang/"  # the wheel holds only the sglang package
# New files here apply to any upstream tree (the wheel-built one has none of these folders); the
# wheel leaves them out. Upstream keeps its tests and docs there.
NEW_FILE_PREFIXES = ("test/", "docs/")


def outside_wheel(path: str) -> bool:
    """A new file the series may add although the wheel cannot carry it (a test, a doc)."""
    return path.startswith(NEW_FILE_PREFIXES)


_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*\.patch$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$")
KNOWN_TRAILERS = {
    "Forwarded",
    "Last-Update",
    "Bug",
    "Ref",
    "Applied-Upstream",
    "Origin",
    "Author",
    "Reviewed-by",
    "Patch-Filename",
    "Signed-off-by",
    "Co-authored-by",
}


@dataclass
class PatchInfo:
    name: str
    path: Path
    subject: str
    body: str  # message body without trailers
    trailers: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # a/ paths of every diff
    new_files: list[str] = field(default_factory=list)


PatchReader = Callable[[str], bytes | None]  # a series folder's file by name; None when it is missing
MISSING = b"<missing>"  # what a listed patch that is not there hashes as


def parse_order(text: str) -> list[str]:
    """The patch names an order file lists (``#`` comments and blank lines skipped)."""
    names = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.append(line)
    return names


def read_order(series_dir: Path) -> list[str]:
    path = series_dir / SERIES_FILE
    if not path.is_file():
        raise ToolError(f"{path} is missing (the series order file; may be empty)")
    return parse_order(path.read_text())


def write_order(series_dir: Path, names: list[str]) -> None:
    (series_dir / SERIES_FILE).write_text("".join(f"{n}\n" for n in names))


def series_hash(series: Path | PatchReader) -> str:
    """Hash of the order and every listed patch's bytes: what `apply` records, the wheel's tag.

    ``series`` is the folder, or a reader of its files by name (series/ as a commit has it).
    """
    if isinstance(series, Path):
        names, read = read_order(series), _folder_reader(series)
    else:
        order = series(SERIES_FILE)
        if order is None:
            raise ToolError(f"no {SERIES_FILE} order file to hash")
        names, read = parse_order(order.decode()), series
    digest = hashlib.sha256()
    for name in names:
        data = read(name)
        digest.update(name.encode() + b"\0" + (MISSING if data is None else data) + b"\0")
    return digest.hexdigest()


def _folder_reader(folder: Path) -> PatchReader:
    def read(name: str) -> bytes | None:
        path = folder / name
        return path.read_bytes() if path.is_file() else None

    return read


def hygiene(series_dir: Path) -> list[str]:
    """Problems with the order file vs the patch files: missing, unlisted, duplicate, bad names."""
    problems = []
    names = read_order(series_dir)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            problems.append(f"{name}: listed twice in {series_dir / SERIES_FILE}")
        seen.add(name)
        if not _NAME.match(name):
            problems.append(f"{name}: file names are lower-case, unnumbered-friendly and end in .patch")
        if not (series_dir / name).is_file():
            problems.append(f"{name}: listed in {SERIES_FILE} but the file is missing")
    for path in sorted(series_dir.glob("*.patch")):
        if path.name not in seen:
            problems.append(f"{path.name}: patch file not listed in {SERIES_FILE}")
    return problems


def _decode_subject(raw: str) -> str:
    return str(make_header(decode_header(raw)))


def split_message(data: bytes) -> tuple[bytes, bytes]:
    """(mail header + message, diff): the message ends where `git am` stops reading it."""
    m = re.search(rb"^(---\n|diff --git )", data, re.MULTILINE)
    if not m:
        return data, b""
    return data[: m.start()], data[m.start() :]


def parse_patch(path: Path) -> PatchInfo:
    data = path.read_bytes()
    head, diff = split_message(data)
    if not data.startswith(b"From ") or b"\nSubject:" not in head:
        raise ToolError(f"{path.name}: not a git format-patch file (no From/Subject header)")
    text = head.decode("utf-8", errors="replace")
    header_part, _, message = text.partition("\n\n")
    subject_lines: list[str] = []
    in_subject = False
    for line in header_part.splitlines():
        if line.startswith("Subject:"):
            subject_lines = [line[len("Subject:") :].strip()]
            in_subject = True
        elif in_subject and line[:1] in (" ", "\t"):
            subject_lines.append(line.strip())
        else:
            in_subject = False
    if not subject_lines:
        raise ToolError(f"{path.name}: no Subject: header")
    subject = _decode_subject(" ".join(subject_lines))
    body_lines: list[str] = []
    trailers: dict[str, str] = {}
    for line in message.splitlines():
        m = TRAILER.match(line)
        if m and m.group(1) in KNOWN_TRAILERS:
            trailers[m.group(1)] = m.group(2).strip()
        else:
            body_lines.append(line)
    diffed = diffs.parse(diff.decode("utf-8", errors="replace"))
    files = [fd.old_path for fd in diffed]
    new_files = [fd.old_path for fd in diffed if fd.new_file]
    return PatchInfo(path.name, path, subject, "\n".join(body_lines).strip(), trailers, files, new_files)


def lint(info: PatchInfo, created: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """DEP-3 style header rules; every problem names the patch. ``created``: the out-of-wheel
    files earlier patches of the series added, which later ones may change."""
    problems = []
    p = info.name
    words = len(re.findall(r"[A-Za-z]{2,}", info.body))
    if words < 12:
        problems.append(f"{p}: the message must say why the patch exists (a paragraph, got {words} words)")
    fwd = info.trailers.get("Forwarded")
    if fwd is None:
        problems.append(f"{p}: missing 'Forwarded:' (no, not-needed, or the upstream PR URL)")
    elif fwd not in ("no", "not-needed") and not fwd.startswith("https://"):
        problems.append(f"{p}: 'Forwarded: {fwd}' must be no, not-needed or an https URL")
    last = info.trailers.get("Last-Update")
    if last is None:
        problems.append(f"{p}: missing 'Last-Update:' (YYYY-MM-DD)")
    elif not _DATE.match(last):
        problems.append(f"{p}: 'Last-Update: {last}' is not YYYY-MM-DD")
    fname = info.trailers.get("Patch-Filename")
    if fname is not None and fname != info.name:
        problems.append(f"{p}: 'Patch-Filename: {fname}' does not match the file name")
    if not info.files:
        problems.append(f"{p}: contains no diff")
    for f in info.files:
        if f.startswith(ALLOWED_PREFIX) or f in created or (f in info.new_files and outside_wheel(f)):
            continue
        problems.append(
            f"{p}: touches {f}; only {ALLOWED_PREFIX}** exists in the wheel source (and new files "
            f"under {' or '.join(NEW_FILE_PREFIXES)} apply to any tree)"
        )
    return problems


def touched_files(series_dir: Path) -> tuple[list[str], set[str]]:
    """(every upstream path the series touches, the subset the series itself creates)."""
    touched: list[str] = []
    created: set[str] = set()
    for name in read_order(series_dir):
        info = parse_patch(series_dir / name)
        for f in info.new_files:
            if f not in touched:
                created.add(f)
        for f in info.files:
            if f not in touched:
                touched.append(f)
    return sorted(touched), created


def slug(subject: str) -> str:
    """File name for a new patch from its subject (Electron munges the subject the same way)."""
    s = re.sub(r"^\[[^\]]*\]\s*", "", subject).lower()
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return (s[:60].rstrip("-") or "patch") + ".patch"
