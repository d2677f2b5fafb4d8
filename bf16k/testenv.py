"""One Python environment for every session that needs the test dependencies.

`tests`, `verify_recall`, `bisect` and `bench` all need the project's `.[test]` extra, whose CUDA
build of torch (the one PyPI's torchvision loads beside) takes about 6 GiB. nox gives each session
its own venv, so four sessions meant four copies. They now run with nox's `python=False` and call
`python -m bf16k test-env -- ARGS`, which keeps one venv at `.nox/test-env`, installs `.[test]`
into it when it is new or `pyproject.toml` changed (a stamp records what was installed), and runs
`<that python> ARGS`.

Temporary files of the run (pytest's `tmp_path`, bisect's scratch clones) go to
`build/tmp/<label>-<pid>/` through `TMPDIR`, which is removed when the command succeeds and kept,
for a look, when it fails (the next run of the same label removes it).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bf16k.errors import ToolError
from bf16k.project import SUBMODULE_PATH

ENV_DIR = Path(".nox") / "test-env"
STAMP = "bf16k-test-env.json"
EXTRA = "test"
# Per-session venvs that earlier versions made for the same extra; each held its own torch.
OLD_SESSION_VENVS = ("tests", "verify_recall", "bisect", "bench")


def env_dir(root: Path) -> Path:
    return root / ENV_DIR


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def wanted(root: Path) -> dict[str, str]:
    """What the environment must have been installed from; a change reinstalls."""
    pyproject = (root / "pyproject.toml").read_bytes()
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "extra": EXTRA,
        "pyproject_sha256": hashlib.sha256(pyproject).hexdigest(),
    }


def _read_stamp(env: Path) -> dict[str, str]:
    try:
        data = json.loads((env / STAMP).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Two sessions started at once must not install into the same venv together."""
    lock_path = root / ".nox" / "test-env.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def old_session_venvs(root: Path) -> list[Path]:
    """Venvs an earlier version left in .nox/ for sessions that now share the test environment."""
    found = [root / ".nox" / name for name in OLD_SESSION_VENVS]
    return [path for path in found if (path / "pyvenv.cfg").is_file()]


def ensure(root: Path) -> Path:
    """The environment's python, created and installed first when needed."""
    env = env_dir(root)
    python = python_of(env)
    want = wanted(root)
    with _locked(root):
        stamp = _read_stamp(env)
        if python.is_file() and stamp == want:
            return python
        if not python.is_file() or stamp.get("python", want["python"]) != want["python"]:
            # Half made (an interrupted creation), or made by another Python: start it again.
            if env.exists():
                shutil.rmtree(env)
            print(f"test environment: creating {ENV_DIR} (Python {want['python']})", flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        print(
            f"test environment: installing .[{EXTRA}] into {ENV_DIR} (the first time about 6 GiB, "
            "mostly a CUDA build of torch; later runs reuse it)",
            flush=True,
        )
        (env / STAMP).unlink(missing_ok=True)
        proc = subprocess.run(
            # --no-compile: bytecode is written for the modules that are imported, when they are,
            # not for all of torch & co. up front (about 0.3 GiB less on disk).
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-compile",
                "-e",
                f"{root}[{EXTRA}]",
            ],
            cwd=root,
            check=False,
        )
        if proc.returncode != 0:
            raise ToolError(
                f"pip could not install .[{EXTRA}] into {env} (exit {proc.returncode}, its output is "
                "above); run the session again to retry, or remove the folder to start it afresh"
            )
        (env / STAMP).write_text(json.dumps(want, indent=2, sort_keys=True) + "\n")
    for path in old_session_venvs(root):
        print(
            f"note: {path.relative_to(root)} is the venv an earlier version made for that session alone "
            f"(a CUDA-torch venv, several GiB); the sessions now share {ENV_DIR}. Free the room with "
            f"`rm -rf {path.relative_to(root)}`."
        )
    return python


def has_cuda(python: Path) -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([str(python), "-c", probe], capture_output=True, check=False).returncode == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop_stale_tmp(tmp_root: Path, label: str) -> None:
    """Folders a failed earlier run of this label kept (its process is gone)."""
    for path in tmp_root.glob(f"{label}-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if path.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def run(root: Path, args: Sequence[str], *, label: str) -> int:
    """`<environment python> ARGS` in the repository root; its exit status."""
    python = ensure(root)
    tmp_root = root / "build" / "tmp"
    _drop_stale_tmp(tmp_root, label)
    tmp = tmp_root / f"{label}-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp)
    paths = [str(root / SUBMODULE_PATH / "python"), str(root), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    if "TRITON_INTERPRET" not in env and not has_cuda(python):
        env["TRITON_INTERPRET"] = "1"  # no GPU: Triton kernels run under its interpreter
    proc = subprocess.run([str(python), *args], cwd=root, env=env, check=False)
    if proc.returncode == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(
            f"note: the temporary files of this failed run are kept in {tmp.relative_to(root)} "
            "(the next run removes them)"
        )
    return proc.returncode
