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
import tomllib
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bf16k import gitutil
from bf16k.errors import ToolError
from bf16k.pin import ABSENT, Pin, WheelPin
from bf16k.pin import load as pinload
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
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--implementation",
        py[:2],
        "--python-version",
        py[2:],
        "--abi",
        abi,
        "--platform",
        plat,
        "-d",
        str(dest),
        f"{name}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolError(
            f"could not download {pin.wheel.filename} from the package index "
            f"(pip exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}\n"
            "Provide it with --wheel-file PATH or BF16K_WHEEL_FILE=PATH."
        )


def _pypi_json_download(pin: Pin, dest: Path) -> None:
    name, version, *_ = _wheel_tags(pin.wheel.filename)
    url = f"https://pypi.org/pypi/{name}/{version}/json"
    with urllib.request.urlopen(url, timeout=60) as resp:
        meta = json.load(resp)
    for entry in meta.get("urls", []):
        if entry.get("filename") == pin.wheel.filename:
            with urllib.request.urlopen(entry["url"], timeout=600) as resp:
                (dest / pin.wheel.filename).write_bytes(resp.read())
            return
    raise ToolError(f"PyPI lists no file {pin.wheel.filename} for {name} {version}")


def given_wheel(wheel_file: Path | None = None) -> Path | None:
    """The wheel the user handed over: --wheel-file, else BF16K_WHEEL_FILE, else None."""
    env = os.environ.get("BF16K_WHEEL_FILE")
    return wheel_file or (Path(env) if env else None)


def fetch_wheel(pin: Pin, wheel_file: Path | None = None) -> Path:
    """The pinned wheel, sha256-checked: a given file, else the cache, else a download."""
    given = given_wheel(wheel_file)
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
            + (
                f"Nothing was changed. Give the pinned {pin.wheel.filename} (--wheel-file or "
                "BF16K_WHEEL_FILE), or neither to download it."
                if given is not None
                else "Nothing was extracted. If the file is corrupt, delete it and run again; if the pin "
                "is wrong, fix the pin."
            )
        )
    return path


def _has_pip() -> bool:
    proc = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False)
    return proc.returncode == 0


def _fast_import_stream(
    wheel: Path,
    pin: Pin,
    *,
    ref: str = "refs/heads/upstream-base",
    parent: Pin | None = None,
    parent_commit: str = "",
) -> bytes:
    """A fast-import stream of one commit holding the wheel's sglang/ tree under python/.

    With ``parent_commit`` the commit is a child of it (a carried release on top of the pinned
    one, so 3-way merges and range-diff see the change between the releases); ``deleteall``
    first, so files the new release dropped are gone. Without it the stream is byte-identical to
    what it always was, which keeps the pinned base commit id.
    """
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
    )
    if parent_commit:
        label = f"sglang {parent.version} ({parent.wheel.filename})" if parent else parent_commit
        message += f"Parent: the import of {label}, so merges and range-diff see the release change.\n"
    data_msg = message.encode()
    commit = [f"commit {ref}\n".encode(), b"author " + ident + b"\n", b"committer " + ident + b"\n"]
    commit.append(b"data %d\n" % len(data_msg) + data_msg)
    if parent_commit:
        commit.append(f"from {parent_commit}\ndeleteall\n".encode())
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


# --------------------------------------------------------------------------- carried releases

IMPORTS_REPO = "imports.git"  # bare repo under cache_dir(): every wheel import, made once
IMPORT_FORMAT = "1"  # bump when _fast_import_stream changes, so stale cache entries are not reused
CARRIED_FILE = "carried.toml"  # in series/next/<version>/: what the carried base was built on
PARENT_REF = "refs/bf16k/parent-base"  # in a carried tree: the pinned base its base descends from


def _imports_repo() -> Path:
    repo = cache_dir() / IMPORTS_REPO
    if not (repo / "HEAD").is_file():
        repo.mkdir(parents=True, exist_ok=True)
        gitutil.git(["init", "-q", "--bare"], repo)
    return repo


def import_key(pin: Pin, parent_commit: str = "") -> str:
    """Everything the import's commit id depends on besides the wheel bytes (named by sha256)."""
    fields = (IMPORT_FORMAT, pin.version, pin.tag, pin.wheel.filename, pin.wheel.sha256, parent_commit)
    text = "\0".join(fields)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_import(
    pin: Pin, *, parent: Pin | None = None, parent_commit: str = "", wheel_file: Path | None = None
) -> tuple[Path, str, str]:
    """(cache repo, ref, commit) of the wheel of ``pin`` imported, as a child of ``parent_commit``.

    A wheel import costs ~10 s (inflate + hash + deflate of ~6000 files); a local fetch of it
    ~2 s. The cache lives outside any repository, so checks stay non-mutating. The wheel is only
    fetched (and sha256-checked) when the cache lacks the import; the key names the checksum.
    """
    cache = _imports_repo()
    ref = f"refs/imports/{import_key(pin, parent_commit)}"
    proc = gitutil.git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], cache, check=False)
    if proc.returncode == 0:
        return cache, ref, proc.stdout.decode().strip()
    wheel = fetch_wheel(pin, wheel_file)
    stream = _fast_import_stream(wheel, pin, ref=ref, parent=parent, parent_commit=parent_commit)
    gitutil.git(["fast-import", "--quiet", "--force"], cache, input_bytes=stream)
    return cache, ref, gitutil.rev_parse(cache, ref)


def fetch_import(repo: Path, cache: Path, src_ref: str, dst_ref: str) -> None:
    """Copy an import (objects and a ref) from the cache into ``repo``, creating it if needed."""
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        if any(repo.iterdir()):
            raise ToolError(
                f"{repo} exists, is not empty and is not a git repository: move its contents away"
            )
        gitutil.git(["init", "-q"], repo)
    # --update-head-ok: the ref may be the checked-out branch of a hand-made tree; callers reset.
    gitutil.git(["fetch", "-q", "--no-tags", "--update-head-ok", str(cache), f"+{src_ref}:{dst_ref}"], repo)


def read_carried(series_dir: Path) -> dict[str, dict[str, object]]:
    path = series_dir / CARRIED_FILE
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(f"{path} is not valid TOML: {exc}") from exc


def parent_pin(t: Target) -> Pin:
    """The release a carried base was imported on top of: carried.toml's [parent], else the pin.

    Recording it keeps the carried base id reproducible after the pin itself has moved on.
    """
    parent = read_carried(t.series_dir).get("parent")
    if not parent:
        return pinload(t.root / "pin.toml")
    try:
        result = Pin(
            version=str(parent["version"]),
            tag=str(parent.get("tag", "")),
            commit="",
            repository="",
            wheel=WheelPin(
                filename=str(parent["filename"]),
                sha256=str(parent["sha256"]).lower(),
                base_commit=str(parent.get("base_commit", "")),
            ),
            path=t.series_dir / CARRIED_FILE,
        )
    except KeyError as exc:
        raise ToolError(f"{t.series_dir / CARRIED_FILE}: [parent] lacks {exc}") from exc
    return result


def materialize_carried(repo: Path, pin: Pin, parent: Pin, wheel_file: Path | None = None) -> tuple[str, str]:
    """(parent base, carried base) in ``repo``: the pinned import first, the release on top.

    The carried base id depends on its parent, so it is only reproducible when the parent is the
    same deterministic wheel import everywhere (not a submodule commit someone happens to have).
    """
    cache, pref, pbase = cached_import(parent)
    if parent.wheel.base_commit and pbase != parent.wheel.base_commit:
        raise ToolError(
            f"the import of {parent.wheel.filename} is {pbase}, but {parent.path} records "
            f"{parent.wheel.base_commit}: the wheel or the materialisation changed"
        )
    cache, ref, base = cached_import(pin, parent=parent, parent_commit=pbase, wheel_file=wheel_file)
    fetch_import(repo, cache, pref, PARENT_REF)
    fetch_import(repo, cache, ref, "refs/heads/upstream-base")
    if pin.wheel.base_commit and base != pin.wheel.base_commit:
        raise ToolError(
            f"the carried base built from {pin.wheel.filename} on {parent.version} is {base}, but "
            f"{pin.path} records {pin.wheel.base_commit}: the wheel or its parent changed. Re-carry "
            f"with `nox -s rebase -- {pin.version}`. Nothing was patched."
        )
    return pbase, base


def _materialize(t: Target, pin: Pin, repo: Path, wheel_file: Path | None) -> str:
    """The wheel-built base of the target in ``repo``: standalone for the pin, a child for a carry."""
    if t.carried:
        return materialize_carried(repo, pin, parent_pin(t), wheel_file)[1]
    if pin.wheel.base_commit and wheel_file is None:
        cache, ref, base = cached_import(pin)
        if base == pin.wheel.base_commit:  # else: rebuild from the wheel, which says what is wrong
            fetch_import(repo, cache, ref, "refs/heads/upstream-base")
            return base
    return materialize_wheel(fetch_wheel(pin, wheel_file), repo, pin)


# --------------------------------------------------------------------------- repo helpers


def git_dir(repo: Path) -> Path:
    path = Path(gitutil.out(["rev-parse", "--git-dir"], repo))
    return path if path.is_absolute() else (repo / path).resolve()


def read_state(repo: Path) -> dict[str, str]:
    try:
        data = json.loads((git_dir(repo) / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def write_state(repo: Path, state: dict[str, str]) -> None:
    (git_dir(repo) / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def install_local_excludes(repo: Path) -> None:
    exclude = git_dir(repo) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.exists() else ""
    missing = [line for line in LOCAL_EXCLUDES if line not in text.splitlines()]
    if missing:
        exclude.write_text(
            text + ("" if text.endswith("\n") or not text else "\n") + "\n".join(missing) + "\n"
        )


# --------------------------------------------------------------------------- submodule


def _try_submodule(root: Path, pin: Pin, timeout: float) -> tuple[bool, str]:
    """Run `git submodule update --init`; leave nothing half-made behind when it fails."""
    sub = root / SUBMODULE_PATH
    existed = sub.exists()
    ok = False
    try:
        proc = gitutil.git(
            ["submodule", "update", "--init", "--", SUBMODULE_PATH], root, check=False, timeout=timeout
        )
    except ToolError as exc:
        reason = str(exc)
    else:
        # git's first "fatal:" line says why (e.g. "Could not resolve host"); the last only that
        # it gave up.
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        fatal = [line for line in lines if line.startswith("fatal:")]
        reason = (fatal or lines or [""])[0]
        ok = proc.returncode == 0 and gitutil.has_commit(sub, pin.commit)
    if ok:
        return True, "git submodule update --init"
    # A failed clone leaves an empty folder and maybe a partial .git/modules entry; remove only
    # what is empty or was created by this attempt.
    if sub.is_dir() and not existed:
        shutil.rmtree(sub, ignore_errors=True)
    modules = root / ".git" / "modules" / SUBMODULE_PATH
    if modules.is_dir() and not gitutil.has_commit(modules, pin.commit):
        shutil.rmtree(modules, ignore_errors=True)
    return False, reason or "unknown error"


def obtain(
    t: Target, *, source: str = "auto", wheel_file: Path | None = None, quiet: bool = False
) -> Upstream:
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
    # A given wheel is checked even where the tree needs none: a wrong or missing file is an
    # error, never silently ignored, and the run says whether the file was used.
    given = given_wheel(wheel_file)
    if given is not None:
        fetch_wheel(pin, given)
    wheel_note = "" if given is None else f"--wheel-file {given} matches the pin (sha256)"

    up: Upstream | None = None
    if gitutil.is_repo(repo):
        state = read_state(repo)
        if pin.commit and source != "wheel" and gitutil.has_commit(repo, pin.commit):
            up = Upstream(
                repo, gitutil.rev_parse(repo, pin.commit), "submodule", f"submodule at {pin.commit}"
            )
            if wheel_note:
                wheel_note += (
                    " but is not used: the submodule has the pinned commit (--source wheel uses the wheel)"
                )
        elif state.get("source") == "wheel" and source != "submodule":
            base = state.get("base", "")
            if (
                base
                and gitutil.has_commit(repo, base)
                and (not pin.wheel.base_commit or base == pin.wheel.base_commit)
            ):
                up = Upstream(repo, base, "wheel", f"PyPI wheel {pin.wheel.filename} (already built)")
                if wheel_note:
                    wheel_note += f" and is not needed: {repo.name}/ is already built from that wheel"
            else:
                base = _materialize(t, pin, repo, wheel_file)
                up = Upstream(repo, base, "wheel", f"PyPI wheel {pin.wheel.filename}, sha256 checked")
        elif source == "wheel" or not pin.commit:
            if gitutil.has_commit(repo, "refs/heads/upstream-base") or state.get("source") == "wheel":
                base = _materialize(t, pin, repo, wheel_file)
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
            base = _materialize(t, pin, repo, wheel_file)
            up = Upstream(repo, base, "wheel", f"{tried}PyPI wheel {pin.wheel.filename}, sha256 checked")
    if wheel_note:
        up.detail += f"; {wheel_note}"
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
    wrong = [
        (p, pin.fingerprint[p], actual[p]) for p in sorted(pin.fingerprint) if actual[p] != pin.fingerprint[p]
    ]
    if wrong:
        lines = "\n".join(f"  {p}: pin {want}, {up.source} {got}" for p, want, got in wrong)
        raise ToolError(
            f"fingerprint mismatch: upstream from the {up.source} ({up.base[:12]}) is not the pinned "
            f"{pin.version} for {len(wrong)} file(s) the series touches:\n{lines}\nNothing was patched."
        )
