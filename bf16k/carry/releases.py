"""The release a carry goes to: which one a target names, its wheel, its pin, what the index has."""

from __future__ import annotations

import bisect as bisect_pos
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from bf16k import diffs, gitutil, upstream
from bf16k.carry.state import Release
from bf16k.errors import ToolError
from bf16k.pin import Pin, WheelPin
from bf16k.project import cache_dir, version_key

DSV4_MODEL = "sglang/srt/models/deepseek_v4.py"  # a release without it cannot carry the series
_RELEASE = re.compile(r"^\d+(\.\d+)+(\.post\d+)?$")  # final releases only (no a/b/rc/dev/local)
_TAG = re.compile(r"^(?:refs/tags/)?v?(\d+(?:\.\d+)+(?:\.post\d+)?)$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


def resolve_target(
    pin: Pin, target: str, version: str | None, commit: str | None, allow_older: bool = False
) -> Release:
    if commit is not None and not _HEX40.match(commit):
        raise ToolError(f"--commit expects a full 40-hex commit id, got {commit!r}")
    if _RELEASE.match(target):
        rel = Release(target, f"v{target}", "wheel", "", commit or "")
    else:
        m = _TAG.match(target)
        found = version or (m.group(1) if m else None)
        if not found or not _RELEASE.match(found):
            raise ToolError(
                f"cannot tell which release {target!r} is: the pin records releases, so give "
                "--version X.Y.Z with a git ref that is not a vX.Y.Z tag"
            )
        tag = target.removeprefix("refs/tags/") if m else f"v{found}"
        rel = Release(found, tag, "ref", target, commit or "")
    if rel.version == pin.version:
        raise ToolError(f"{rel.version} is already the pinned release")
    if version_key(rel.version) < version_key(pin.version):
        if commit:
            raise ToolError(
                f"{rel.version} is older than the pinned {pin.version}: the pin only moves forward "
                f"(port the series with `nox -s rebase -- {rel.version} --allow-older`, without --commit)"
            )
        if not allow_older:
            raise ToolError(
                f"{rel.version} is older than the pinned {pin.version}: carrying backwards is a port "
                "(upstream's newer code is taken out under the patches). To port anyway, into "
                f"series/next/{rel.version}/: nox -s rebase -- {rel.version} --allow-older"
            )
        rel.older = True
    return rel


def _wheel_name(like: Pin, version: str) -> str:
    name, _, py, abi, plat = upstream._wheel_tags(like.wheel.filename)
    return f"{name}-{version}-{py}-{abi}-{plat}.whl"


def release_wheel(version: str, like: Pin, wheel_file: Path | None = None) -> Path:
    """The wheel of ``version`` with the pinned wheel's tags: a given file, the cache, or pip."""
    if wheel_file is not None:
        path = wheel_file.expanduser().resolve()
        if not path.is_file():
            raise ToolError(f"wheel file {path} does not exist")
        return path
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wanted = _wheel_name(like, version)
    if (wheels / wanted).is_file():
        return wheels / wanted
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=wheels))
    try:
        probe = Pin(version, "", "", like.repository, WheelPin(wanted, "0" * 64))
        upstream._pip_download(probe, staging)  # same tags as the pinned wheel
        found = sorted(staging.glob("*.whl"))
        if not found:
            raise ToolError(f"pip downloaded no wheel for sglang {version}")
        target = wheels / found[0].name
        found[0].replace(target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def release_pin(like: Pin, rel: Release, wheel: Path, base_commit: str = "") -> Pin:
    """A pin record for the target release (commit only when known)."""
    return Pin(
        rel.version,
        rel.tag,
        rel.commit,
        like.repository,
        WheelPin(wheel.name, upstream.sha256_file(wheel), base_commit),
    )


def wheel_has_dsv4(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return DSV4_MODEL in zf.namelist()


def index_versions(name: str) -> list[str]:
    """Versions the package index offers (pip's view, so the user's index configuration counts)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", name, "--disable-pip-version-check"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise ToolError(
        f"could not list the releases of {name} (pip exit {proc.returncode}): "
        f"{proc.stderr.strip()[-500:]}\nName them with --releases X.Y.Z ..."
    )


def newer_releases(pin: Pin, versions: list[str]) -> list[str]:
    """Final releases newer than the pin, oldest first (pre-releases are skipped)."""
    keep = {v for v in versions if _RELEASE.match(v) and version_key(v) > version_key(pin.version)}
    return sorted(keep, key=version_key)


def nearest_releases(version: str, versions: list[str], count: int = 3) -> list[str]:
    """The final releases around ``version`` (below and above it), oldest first."""
    finals = sorted({v for v in versions if _RELEASE.match(v)}, key=version_key)
    at = bisect_pos.bisect_left([version_key(v) for v in finals], version_key(version))
    lo = max(0, min(at - count + 1, len(finals) - count))
    return finals[lo : lo + count]


def check_release_exists(version: str, like: Pin) -> None:
    """Refuse, in one line, a release the index does not have (instead of pip's version dump).

    Only when the index can be listed: offline, the download itself says what is wrong.
    """
    if (cache_dir() / "wheels" / _wheel_name(like, version)).is_file():
        return
    try:
        versions = index_versions("sglang")
    except ToolError:
        return
    if version in versions:
        return
    near = nearest_releases(version, versions)
    newest = max((v for v in versions if _RELEASE.match(v)), key=version_key, default="?")
    raise ToolError(
        f"sglang {version} does not exist on the package index; the nearest releases are "
        f"{', '.join(near)} (newest {newest})"
    )


def new_pin_for(pin: Pin, rel: Release, wheel: Path) -> Pin:
    """The moved pin: its base commit is the standalone wheel import `apply` builds for a pin."""
    new_pin = release_pin(pin, rel, wheel)
    _, _, base = upstream.cached_import(new_pin, wheel_file=wheel)
    new_pin.wheel.base_commit = base
    return new_pin


# --------------------------------------------------------------------------- "upstream contains it"


def _has_run(lines: list[str], run: list[str]) -> bool:
    n = len(run)
    return any(lines[i : i + n] == run for i in range(len(lines) - n + 1))


def upstream_contains(repo: Path, base: str, diff: str) -> tuple[bool, str]:
    """Whether ``base`` already holds the patch's change; (answer, why not).

    Upstream's version of a change rarely matches the patch's context line for line (that is
    why it conflicts), so this does not re-apply the patch: it asks whether every run of lines
    the patch adds is in the file at ``base`` and no run it removes is still there (runs of
    blank lines prove nothing and are ignored).
    """
    for fd in diffs.parse(diff):
        proc = gitutil.git(["cat-file", "-p", f"{base}:{fd.path}"], repo, check=False)
        exists = proc.returncode == 0
        if fd.deleted:
            if exists:
                return False, f"{fd.path} still exists upstream (the patch deletes it)"
            continue
        if not exists:
            return False, f"{fd.path} does not exist upstream"
        lines = proc.stdout.decode("utf-8", errors="replace").split("\n")
        for run in fd.runs("+"):
            if not _has_run(lines, run):
                return False, f"{fd.path}: the added line {run[0].strip()!r} is not upstream"
        for run in fd.runs("-"):
            if any(line.strip() for line in run) and _has_run(lines, run):
                return False, f"{fd.path}: the removed line {run[0].strip()!r} is still upstream"
    return True, ""
