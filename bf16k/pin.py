"""The pin record: which upstream release a series applies to, where to get it, and its fingerprint.

`pin.toml` at the repository root pins the series in `series/`; a carried series in
`series/next/<version>/` has its own `pin.toml` whose `commit` is empty until the release's
upstream commit is known (a commit id is never guessed).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bf16k.errors import ToolError

ABSENT = "absent"  # fingerprint value for a file the series creates (upstream must not have it)
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class WheelPin:
    filename: str
    sha256: str
    # Id of the deterministic base commit materialised from this wheel (same on every machine).
    base_commit: str = ""


@dataclass
class Pin:
    version: str
    tag: str
    commit: str  # upstream commit id; "" when not known (carried series)
    repository: str
    wheel: WheelPin
    fingerprint: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    @property
    def commit_known(self) -> bool:
        return bool(self.commit)


def load(path: Path) -> Pin:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ToolError(f"pin record {path} is missing") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(f"pin record {path} is not valid TOML: {exc}") from exc
    try:
        wheel = data["wheel"]
        pin = Pin(
            version=str(data["version"]),
            tag=str(data.get("tag", "")),
            commit=str(data.get("commit", "")),
            repository=str(data["repository"]),
            wheel=WheelPin(
                filename=str(wheel["filename"]),
                sha256=str(wheel["sha256"]).lower(),
                base_commit=str(wheel.get("base_commit", "")),
            ),
            fingerprint={str(k): str(v) for k, v in data.get("fingerprint", {}).items()},
            path=path,
        )
    except KeyError as exc:
        raise ToolError(f"pin record {path} lacks the field {exc}") from exc
    validate(pin)
    return pin


def validate(pin: Pin) -> None:
    where = pin.path or "pin record"
    if pin.commit and not _HEX40.match(pin.commit):
        raise ToolError(f"{where}: commit {pin.commit!r} is not a 40-hex git commit id")
    if not _SHA256.match(pin.wheel.sha256):
        raise ToolError(f"{where}: wheel sha256 {pin.wheel.sha256!r} is not 64 hex digits")
    if pin.wheel.base_commit and not _HEX40.match(pin.wheel.base_commit):
        raise ToolError(f"{where}: wheel base_commit {pin.wheel.base_commit!r} is not a commit id")
    for path, blob in pin.fingerprint.items():
        if blob != ABSENT and not _HEX40.match(blob):
            raise ToolError(f"{where}: fingerprint of {path} is {blob!r}, not a blob id or 'absent'")


def _q(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dumps(pin: Pin) -> str:
    lines = [
        "# Upstream SGLang release this series applies to (written by the bf16k tooling).",
        "# `commit` is the upstream git commit of the release; empty when it is not known yet",
        "# (a carried series): it is never guessed.",
        f"version = {_q(pin.version)}",
        f"tag = {_q(pin.tag)}",
        f"commit = {_q(pin.commit)}",
        f"repository = {_q(pin.repository)}",
        "",
        "# The same release on PyPI, used when the submodule cannot be fetched. base_commit is the",
        "# deterministic git commit the tooling builds from this wheel (python/sglang/... layout).",
        "[wheel]",
        f"filename = {_q(pin.wheel.filename)}",
        f"sha256 = {_q(pin.wheel.sha256)}",
        f"base_commit = {_q(pin.wheel.base_commit)}",
        "",
        "# Git blob id of every upstream file the series touches ('absent' for files it creates),",
        "# checked against whichever source was used before anything is patched.",
        "[fingerprint]",
    ]
    for path in sorted(pin.fingerprint):
        lines.append(f"{_q(path)} = {_q(pin.fingerprint[path])}")
    return "\n".join(lines) + "\n"


def save(pin: Pin, path: Path) -> None:
    validate(pin)
    path.write_text(dumps(pin))
    pin.path = path
