"""Where things live in the product repository, for the pinned release or a carried one."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bf16k import pin as pinmod
from bf16k.errors import ToolError

SUBMODULE_PATH = "sglang-upstream"
_VERSION = re.compile(r"^\d+\.\d+\.\d+([.\w+-]*)$")


def find_root(start: Path | None = None) -> Path:
    """The product repository root: the nearest folder holding pin.toml and series/."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pin.toml").is_file() and (candidate / "series").is_dir():
            return candidate
    raise ToolError(f"not inside the product repository (no pin.toml + series/ above {here})")


def cache_dir() -> Path:
    """Downloads and scratch repositories outside the repo tree (kept between runs)."""
    env = os.environ.get("BF16K_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "bf16k").resolve()


@dataclass(frozen=True)
class Target:
    """One upstream release and the series that applies to it.

    The pinned release uses `series/`, `pin.toml` and the `sglang-upstream` submodule path; a
    carried release (`--upstream 0.5.23`) uses `series/next/<version>/` with its own pin.toml and
    a wheel-built tree under `build/upstream/<version>`.
    """

    root: Path
    version: str | None  # None: the pinned release
    # Where to build the upstream tree instead of the usual place: lets a check (rebase-check)
    # work on a carried release in a scratch folder and leave the repository untouched.
    work: Path | None = None

    @property
    def carried(self) -> bool:
        return self.version is not None

    @property
    def series_dir(self) -> Path:
        if self.version is None:
            return self.root / "series"
        return self.root / "series" / "next" / self.version

    @property
    def pin_path(self) -> Path:
        if self.version is None:
            return self.root / "pin.toml"
        return self.series_dir / "pin.toml"

    @property
    def upstream_dir(self) -> Path:
        if self.work is not None:
            return self.work
        if self.version is None:
            return self.root / SUBMODULE_PATH
        return self.root / "build" / "upstream" / self.version

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    def load_pin(self) -> pinmod.Pin:
        return pinmod.load(self.pin_path)

    @property
    def label(self) -> str:
        return "pinned release" if self.version is None else f"carried release {self.version}"


def target(root: Path, upstream: str | None) -> Target:
    if upstream is None:
        return Target(root, None)
    if not _VERSION.match(upstream):
        raise ToolError(f"--upstream expects a release version like 0.5.23, got {upstream!r}")
    pinned = pinmod.load(root / "pin.toml")
    if upstream == pinned.version:
        return Target(root, None)
    t = Target(root, upstream)
    if not t.pin_path.is_file():
        available = sorted(p.name for p in (root / "series" / "next").glob("*") if p.is_dir())
        older = version_key(upstream) < version_key(pinned.version)
        make = (
            f"port the series back to it with `nox -s rebase -- {upstream} --allow-older` (older than the "
            f"pinned {pinned.version}: a port)"
            if older
            else f"create one with `nox -s rebase -- {upstream}`"
        )
        raise ToolError(
            f"no carried series for {upstream} (expected {t.pin_path}); "
            f"available: {', '.join(available) or 'none'}; {make}"
        )
    return t


def version_key(version: str) -> tuple[int, ...]:
    """Sort key of a release version (0.5.9 < 0.5.23; .postN after the release): the only one."""
    return tuple(int(n) for n in re.findall(r"\d+", version))


def carried_versions(root: Path) -> list[str]:
    """The releases with a carried series (series/next/<version>/pin.toml), oldest first."""
    nxt = root / "series" / "next"
    found = [p.name for p in nxt.iterdir() if (p / "pin.toml").is_file()] if nxt.is_dir() else []
    return sorted(found, key=version_key)
