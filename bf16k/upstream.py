"""Getting upstream SGLang at the pin: the submodule when it can be had, else the PyPI wheel.

The wheel holds only the ``sglang`` package. It is laid out as upstream lays it out
(``python/sglang/...``) in a git repository with one base commit written by ``git fast-import``
with a fixed author, date and message, so the same wheel gives the same commit id on any machine
and ``git am -3`` / ``format-patch`` / ``range-diff`` behave as on a real clone (patch blob ids
resolve because the wheel's files are upstream's files).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bf16k import gitutil
from bf16k.errors import ToolError
from bf16k.pin import ABSENT, Pin
from bf16k.project import SUBMODULE_PATH, Target, cache_dir

BASE_DATE = "946684800 +0000"  # 2000-01-01T00:00:00Z: fixed so the base commit id is stable
PACKAGE_PREFIX = "sglang/"
LAYOUT_PREFIX = "python/"
BASE_REF = "refs/patches/upstream-head"  # Electron's name: patches are BASE_REF..HEAD
STATE_FILE = "bf16k-state.json"  # inside the upstream repo's git dir
# Keep build litter out of `git status`, so "dirty" means real edits.
LOCAL_EXCLUDES = ("__pycache__/", "*.pyc", ".pytest_cache/", "*.egg-info/")


@dataclass
class Upstream:
    repo: Path
    base: str  # commit the series applies to
    source: str  # "submodule" or "wheel"
    detail: str  # human-readable provenance


# --------------------------------------------------------------------------- wheel


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _wheel_tags(filename: str) -> tuple[str, str, str, str, str]:
    if not filename.endswith(".whl"):
        raise ToolError(f"pinned wheel file name {filename!r} does not end in .whl")
    parts = filename[:-4].split("-")
    if len(parts) != 5:
        raise ToolError(f"cannot read the tags of wheel file name {filename!r}")
    name, version, py, abi, plat = parts
    return name, version, py, abi, plat


def _pip_download(pin: Pin, dest: Path) -> None:
    name, version, py, abi, plat = _wheel_tags(pin.wheel.filename)
    # Ask for exactly the pinned file's tags: the running interpreter may be another Python.
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet",
        "--implementation", py[:2], "--python-version", py[2:], "--abi", abi,
        "--platform", plat, "-d", str(dest), f"{name}=={version}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolError(
            f"could not download {pin.wheel.filename} from the package index "
            f"(pip exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}\n"
            "Provide it with --wheel-file PATH or BF16K_WHEEL_FILE=PATH."
        )


def _pypi_json_download(pin: Pin, dest: Path) -> None:
    name, version, *_ = _wheel_tags(pin.wheel.filename)
    url = f"https://pypi.org/pypi/{name}/{version}/json"
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 (fixed https URL)
        meta = json.load(resp)
    for entry in meta.get("urls", []):
        if entry.get("filename") == pin.wheel.filename:
            with urllib.request.urlopen(entry["url"], timeout=600) as resp:  # noqa: S310
                (dest / pin.wheel.filename).write_bytes(resp.read())
            return
    raise ToolError(f"PyPI lists no file {pin.wheel.filename} for {name} {version}")


def fetch_wheel(pin: Pin, wheel_file: Path | None = None) -> Path:
    """The pinned wheel, sha256-checked: a given file, else the cache, else a download."""
    given = wheel_file or (Path(os.environ["BF16K_WHEEL_FILE"]) if os.environ.get("BF16K_WHEEL_FILE") else None)
    if given is not None:
        path = given.expanduser().resolve()
        if not path.is_file():
            raise ToolError(f"wheel file {path} does not exist")
    else:
        wheels = cache_dir() / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        path = wheels / pin.wheel.filename
        if not path.is_file():
            staging = wheels / f".download-{os.getpid()}"
            staging.mkdir(exist_ok=True)
            try:
                try:
                    _pip_download(pin, staging)
                except ToolError:
                    if shutil.which("pip") is None and not _has_pip():
                        _pypi_json_download(pin, staging)
                    else:
                        raise
                got = staging / pin.wheel.filename
                if not got.is_file():
                    found = ", ".join(p.name for p in staging.iterdir()) or "nothing"
                    raise ToolError(f"download gave {found}, not {pin.wheel.filename}")
                got.replace(path)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    actual = sha256_file(path)
    if actual != pin.wheel.sha256:
        raise ToolError(
            f"checksum mismatch for {path}:\n  expected sha256 {pin.wheel.sha256} (pin {pin.path})\n"
            f"  got      sha256 {actual}\n"
            "Nothing was extracted. If the file is corrupt, delete it and run again; if the pin is "
            "wrong, fix the pin."
        )
    return path


def _has_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def _fast_import_stream(wheel: Path, pin: Pin) -> bytes:
    """A fast-import stream of one commit holding the wheel's sglang/ tree under python/."""
    chunks: list[bytes] = []
    entries: list[tuple[str, str, int]] = []
    with zipfile.ZipFile(wheel) as zf:
        infos = sorted(
            (i for i in zf.infolist() if i.filename.startswith(PACKAGE_PREFIX) and not i.is_dir()),
            key=lambda i: i.filename,
        )
        if not infos:
            raise ToolError(f"{wheel.name} holds no {PACKAGE_PREFIX} package")
        for mark, info in enumerate(infos, start=1):
            data = zf.read(info)
            chunks.append(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)) + data + b"\n")
            executable = (info.external_attr >> 16) & 0o111
            entries.append((LAYOUT_PREFIX + info.filename, "100755" if executable else "100644", mark))
    ident = f"{gitutil.TOOL_NAME} <{gitutil.TOOL_EMAIL}> {BASE_DATE}".encode()
    message = (
        f"Import sglang {pin.version} from the PyPI wheel\n\n"
        f"Wheel: {pin.wheel.filename}\nsha256: {pin.wheel.sha256}\n"
        f"Upstream tag: {pin.tag or 'unknown'}\n"
        "The wheel's sglang/ package laid out as upstream lays it out (python/sglang/...).\n"
    ).encode()
    commit = [b"commit refs/heads/upstream-base\n", b"author " + ident + b"\n", b"committer " + ident + b"\n"]
    commit.append(b"data %d\n" % len(message) + message)
    for path, mode, mark in entries:
        commit.append(f"M {mode} :{mark} {path}\n".encode())
    chunks.append(b"".join(commit) + b"\n")
    return b"".join(chunks)


def materialize_wheel(wheel: Path, repo: Path, pin: Pin) -> str:
    """Create (or reuse) the wheel-built base commit in ``repo``; return its id."""
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        if any(repo.iterdir()):
            raise ToolError(
                f"{repo} exists, is not empty and is not a git repository: refusing to build the "
                "upstream tree there (move its contents away first)"
            )
        gitutil.git(["init", "-q"], repo)
    gitutil.git(["fast-import", "--quiet", "--force"], repo, input_bytes=_fast_import_stream(wheel, pin))
    base = gitutil.rev_parse(repo, "refs/heads/upstream-base")
    if pin.wheel.base_commit and base != pin.wheel.base_commit:
        raise ToolError(
            f"the base commit built from {wheel.name} is {base}, but the pin records "
            f"{pin.wheel.base_commit}: the wheel or the materialisation changed. Nothing was patched."
        )
    return base


# --------------------------------------------------------------------------- repo helpers


def git_dir(repo: Path) -> Path:
    path = Path(gitutil.out(["rev-parse", "--git-dir"], repo))
    return path if path.is_absolute() else (repo / path).resolve()


def read_state(repo: Path) -> dict[str, str]:
    try:
        return json.loads((git_dir(repo) / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_state(repo: Path, state: dict[str, str]) -> None:
    (git_dir(repo) / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def install_local_excludes(repo: Path) -> None:
    exclude = git_dir(repo) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.exists() else ""
    missing = [line for line in LOCAL_EXCLUDES if line not in text.splitlines()]
    if missing:
        exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + "\n".join(missing) + "\n")


# --------------------------------------------------------------------------- submodule


def _try_submodule(root: Path, pin: Pin, timeout: float) -> tuple[bool, str]:
    """Run `git submodule update --init`; leave nothing half-made behind when it fails."""
    sub = root / SUBMODULE_PATH
    existed = sub.exists()
    try:
        proc = gitutil.git(
            ["submodule", "update", "--init", "--", SUBMODULE_PATH], root, check=False, timeout=timeout
        )
    except ToolError as exc:
        proc = None
        reason = str(exc)
    else:
        reason = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        reason = reason[0]
    if proc is not None and proc.returncode == 0 and gitutil.has_commit(sub, pin.commit):
        return True, "git submodule update --init"
    # A failed clone leaves an empty folder and maybe a partial .git/modules entry; remove only
    # what is empty or was created by this attempt.
    if sub.is_dir() and not existed:
        shutil.rmtree(sub, ignore_errors=True)
    modules = root / ".git" / "modules" / SUBMODULE_PATH
    if modules.is_dir() and not gitutil.has_commit(modules, pin.commit):
        shutil.rmtree(modules, ignore_errors=True)
    return False, reason or "unknown error"


def obtain(t: Target, *, source: str = "auto", wheel_file: Path | None = None, quiet: bool = False) -> Upstream:
    """Make sure ``t.upstream_dir`` holds upstream at the pin; say which source was used."""
    pin = t.load_pin()
    repo = t.upstream_dir
    env_source = os.environ.get("BF16K_UPSTREAM_SOURCE")
    if source == "auto" and env_source:
        source = env_source
    if source not in ("auto", "submodule", "wheel"):
        raise ToolError(f"unknown upstream source {source!r} (auto, submodule or wheel)")
    if t.carried and source == "submodule" and not pin.commit_known:
        raise ToolError(f"the upstream commit of {pin.version} is not known: only the wheel can be used")

    up: Upstream | None = None
    if gitutil.is_repo(repo):
        state = read_state(repo)
        if pin.commit and source != "wheel" and gitutil.has_commit(repo, pin.commit):
            up = Upstream(repo, gitutil.rev_parse(repo, pin.commit), "submodule", f"submodule at {pin.commit}")
        elif state.get("source") == "wheel" and source != "submodule":
            base = state.get("base", "")
            if base and gitutil.has_commit(repo, base) and (not pin.wheel.base_commit or base == pin.wheel.base_commit):
                up = Upstream(repo, base, "wheel", f"PyPI wheel {pin.wheel.filename} (already built)")
            else:
                wheel = fetch_wheel(pin, wheel_file)
                base = materialize_wheel(wheel, repo, pin)
                up = Upstream(repo, base, "wheel", f"PyPI wheel {pin.wheel.filename}, sha256 checked")
        elif source == "wheel" or not pin.commit:
            if gitutil.has_commit(repo, "refs/heads/upstream-base") or state.get("source") == "wheel":
                wheel = fetch_wheel(pin, wheel_file)
                base = materialize_wheel(wheel, repo, pin)
                up = Upstream(repo, base, "wheel", f"PyPI wheel {pin.wheel.filename}, sha256 checked")
            else:
                raise ToolError(
                    f"{repo} is a git repository that is not a wheel-built tree; remove it or use "
                    "--source submodule"
                )
        else:
            raise ToolError(
                f"{repo} is a git repository without the pinned commit {pin.commit}; fetch it "
                f"(git -C {repo} fetch origin {pin.tag or pin.commit}) or remove the folder to use the wheel"
            )
    else:
        if repo.exists() and any(repo.iterdir()):
            raise ToolError(f"{repo} holds files but is not a git repository: move them away first")
        tried = ""
        if not t.carried and source in ("auto", "submodule") and pin.commit:
            timeout = float(os.environ.get("BF16K_SUBMODULE_TIMEOUT", "120"))
            ok, why = _try_submodule(t.root, pin, timeout)
            if ok:
                up = Upstream(repo, pin.commit, "submodule", f"submodule at {pin.commit} (freshly cloned)")
            elif source == "submodule":
                raise ToolError(f"the submodule could not be fetched: {why}")
            else:
                tried = f"submodule unavailable ({why}); "
        if up is None:
            wheel = fetch_wheel(pin, wheel_file)
            base = materialize_wheel(wheel, repo, pin)
            up = Upstream(repo, base, "wheel", f"{tried}PyPI wheel {pin.wheel.filename}, sha256 checked")
    install_local_excludes(repo)
    state = read_state(repo)
    if state.get("source") != up.source or state.get("base") != up.base:
        state.update({"source": up.source, "base": up.base, "version": pin.version})
        write_state(repo, state)
    verify_fingerprint(up, pin)
    if not quiet:
        print(f"upstream {pin.version}: {up.detail}; base {up.base[:12]}")
    return up


# --------------------------------------------------------------------------- fingerprint


def blob_ids(repo: Path, commit: str, paths: list[str]) -> dict[str, str]:
    """Blob id of each path at ``commit``; ABSENT where the file does not exist."""
    result = {p: ABSENT for p in paths}
    if not paths:
        return result
    text = gitutil.out(["ls-tree", "-r", "--full-tree", commit, "--", *paths], repo)
    for line in text.splitlines():
        meta, path = line.split("\t", 1)
        result[path] = meta.split()[2]
    return result


def verify_fingerprint(up: Upstream, pin: Pin) -> None:
    actual = blob_ids(up.repo, up.base, sorted(pin.fingerprint))
    wrong = [(p, pin.fingerprint[p], actual[p]) for p in sorted(pin.fingerprint) if actual[p] != pin.fingerprint[p]]
    if wrong:
        lines = "\n".join(f"  {p}: pin {want}, {up.source} {got}" for p, want, got in wrong)
        raise ToolError(
            f"fingerprint mismatch: upstream from the {up.source} ({up.base[:12]}) is not the pinned "
            f"{pin.version} for {len(wrong)} file(s) the series touches:\n{lines}\nNothing was patched."
        )
