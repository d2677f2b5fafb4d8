"""Sessions of the bf16 index-K series. The logic lives in the `bf16k` package; these stay thin.

Main job: `nox -s apply build`. Tests: `nox -s tests`. `nox -l` lists every session.
"""

from __future__ import annotations

import subprocess
import sys

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["apply", "build"]
nox.options.reuse_venv = "yes"

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# Sessions that only drive git and pip run in nox's own interpreter: no venv to build.
TOOL = [sys.executable, "-m", "bf16k"]


def _tool(session: nox.Session, *args: str) -> None:
    session.run(*TOOL, *args, *session.posargs, external=True)


@nox.session(python=False, tags=["series"])
def apply(session: nox.Session) -> None:
    """Obtain upstream at the pin (submodule, else the PyPI wheel) and `git am -3` the series."""
    _tool(session, "apply")


@nox.session(python=False, tags=["series"], default=False)
def export(session: nox.Session) -> None:
    """Regenerate series/ byte-deterministically from the patch commits in sglang-upstream."""
    _tool(session, "export")


@nox.session(python=False, tags=["series", "ci"], default=False)
def check(session: nox.Session) -> None:
    """Series hygiene, header lint, gitlink = pin, apply + export round trip in a scratch clone."""
    _tool(session, "check")


@nox.session(python=False, tags=["series"], default=False)
def status(session: nox.Session) -> None:
    """What is applied, against which base and source, and drift from series/."""
    _tool(session, "status")


@nox.session(python=PYTHON, venv_params=["--system-site-packages"], tags=["kernels"])
def build(session: nox.Session) -> None:
    """Compile every CUDA kernel instantiation the bf16 path uses (local GPU, else sm_90a/100a/120a)."""
    # System site-packages: a deployment's own torch satisfies the pin instead of a new download.
    session.install("-e", ".[kernels-build]")
    if subprocess.run([f"{session.bin}/python", "-c", "import torch"], capture_output=True).returncode:
        session.install("torch==2.13.0")  # sglang 0.5.21's own pin
    session.run("python", "-m", "bf16k", "build", *session.posargs)


@nox.session(python=PYTHON, tags=["ci"], default=False)
def tests(session: nox.Session) -> None:
    """The project's test suite (tooling, CPU-level checks of the patched upstream)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "bf16k", "apply")
    session.run("python", "-m", "pytest", *(session.posargs or ["tests"]))


@nox.session(python=PYTHON, tags=["series", "ci"], default=False)
def bisect(session: nox.Session) -> None:
    """Apply each prefix of the series in a scratch clone: imports, byte-compiles, its tests pass."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "bf16k", "bisect", *session.posargs)
