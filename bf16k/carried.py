"""``series/next/<version>/carried.toml``: how a carried series was made, checked and resolved.

Written by ``rebase``; read by ``apply --upstream`` (its ``[parent]``), ``rebase --commit``
(``[carried] from_series``), a re-carry (``[from]``: the patch files it was carried from, so
its resolutions can be replayed; ``[[resolution]]``: why each hand-made hunk is what it is),
``range_diff`` and ``status``.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.pin import Pin
from bf16k.reasons import Reason

FILE = "carried.toml"


def blob_id(data: bytes) -> str:
    """Git's blob id of ``data`` (what `git hash-object` prints), without running git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Verified:
    """The carry's own checks on the release (CPU, Triton's interpreter), as measured then."""

    tests: str = ""  # "112 passed, 16 skipped"
    tests_seconds: int = 0
    bisect: str = ""  # "6 of 6 prefixes"
    bisect_seconds: int = 0


@dataclass
class Carried:
    parent: dict[str, str] = field(default_factory=dict)
    from_series: str = ""
    from_blobs: dict[str, str] = field(default_factory=dict)  # patch name -> blob id in series/
    dropped: dict[str, str] = field(default_factory=dict)
    verified: Verified = field(default_factory=Verified)
    resolutions: list[Reason] = field(default_factory=list)


def load(series_dir: Path) -> Carried:
    path = series_dir / FILE
    if not path.is_file():
        return Carried()
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(f"{path} is not valid TOML: {exc}") from exc
    c = Carried()
    c.parent = {str(k): str(v) for k, v in dict(data.get("parent", {})).items()}
    c.from_series = str(dict(data.get("carried", {})).get("from_series", ""))
    c.from_blobs = {str(k): str(v) for k, v in dict(data.get("from", {})).items()}
    c.dropped = {str(k): str(v) for k, v in dict(data.get("dropped", {})).items()}
    v = dict(data.get("verified", {}))
    c.verified = Verified(
        str(v.get("tests", "")),
        int(v.get("tests_seconds", 0)),
        str(v.get("bisect", "")),
        int(v.get("bisect_seconds", 0)),
    )
    for item in list(data.get("resolution", [])):
        try:
            c.resolutions.append(
                Reason(
                    str(item["patch"]),
                    str(item["path"]),
                    str(item.get("scope", "")),
                    str(item["why"]),
                    str(item.get("kind", "conflict")),
                )
            )
        except (KeyError, TypeError) as exc:
            raise ToolError(f"{path}: a [[resolution]] lacks {exc}") from exc
    return c


def render(parent: Pin, c: Carried) -> str:
    q = pinmod._q
    lines = [
        "# How this carried series was made (written by `bf16k rebase`, read by `apply --upstream`).",
        "# The base commit in pin.toml is the release's wheel imported as a child of [parent]'s import,",
        "# so rebuilding it needs that parent even after the pin has moved on.",
        "[parent]",
        f"version = {q(parent.version)}",
        f"tag = {q(parent.tag)}",
        f"filename = {q(parent.wheel.filename)}",
        f"sha256 = {q(parent.wheel.sha256)}",
        f"base_commit = {q(parent.wheel.base_commit)}",
        "",
        "[carried]",
        "# series hash of the series/ it was carried from: `rebase --commit` promotes it only if unchanged",
        f"from_series = {q(c.from_series)}",
        "",
        "# git blob id of each series/ patch file it was carried from: a re-carry replays this",
        "# series' resolutions onto what changed in series/ since (the blobs are in git history)",
        "[from]",
        *[f"{q(name)} = {q(blob)}" for name, blob in c.from_blobs.items()],
        "",
        "# patches left out because the release already contains them (name = release)",
        "[dropped]",
        *[f"{q(name)} = {q(v)}" for name, v in sorted(c.dropped.items())],
        "",
        "# the carry's own checks on this release (CPU, Triton interpreter; seconds as measured then)",
        "[verified]",
        f"tests = {q(c.verified.tests)}",
        f"tests_seconds = {c.verified.tests_seconds}",
        f"bisect = {q(c.verified.bisect)}",
        f"bisect_seconds = {c.verified.bisect_seconds}",
    ]
    if c.resolutions:
        lines += ["", "# every hand-made hunk of the carry and why (the maintainer's words at --continue)"]
    for r in c.resolutions:
        lines += [
            "",
            "[[resolution]]",
            f"patch = {q(r.patch)}",
            f"path = {q(r.path)}",
            f"scope = {q(r.scope)}",
            f"kind = {q(r.kind)}",
            f"why = {q(r.why)}",
        ]
    return "\n".join(lines) + "\n"
