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
    """Compile every CUDA kernel instantiation the bf16 path uses (local GPU, else sm_90a/100a/120f)."""
    # System site-packages: a deployment's own torch satisfies the pin instead of a new download.
    session.install("-e", ".[kernels-build]")
    has_torch = subprocess.run([f"{session.bin}/python", "-c", "import torch"], capture_output=True, check=False)
    if has_torch.returncode:
        session.install("torch==2.13.0")  # sglang 0.5.21's own pin
    session.run("python", "-m", "bf16k", "build", *session.posargs)


def _has_cuda(session: nox.Session) -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    proc = subprocess.run([f"{session.bin}/python", "-c", probe], capture_output=True, check=False)
    return proc.returncode == 0


@nox.session(python=PYTHON, tags=["ci"], default=False)
def tests(session: nox.Session) -> None:
    """The project's tests and the series' own upstream tests; `-- --upstream V`: that tree's alone."""
    session.install("-e", ".[test]")
    # Without a GPU, Triton kernels run under Triton's interpreter (the CPU tests need that).
    env = {} if _has_cuda(session) else {"TRITON_INTERPRET": "1"}
    # Applies the series first; `-- --upstream 0.5.23` runs the series' tests on that tree alone.
    session.run("python", "-m", "bf16k", "tests", *session.posargs, env=env)


@nox.session(python=PYTHON, tags=["ci"], default=False)
def lint(session: nox.Session) -> None:
    """ruff over the product's Python, mypy --strict over the bf16k package (pinned tool versions)."""
    session.install("ruff==0.17.6", "mypy==2.4.1")
    session.run("ruff", "check", ".")
    session.run("mypy")  # packages and strictness from pyproject's [tool.mypy]


@nox.session(python=PYTHON, tags=["verify"], default=False)
def verify_recall(session: nox.Session) -> None:
    """Recall verification: tier 1 parity (GPU), tier 2 indexer recall; `-- --server URL` for tier 3."""
    session.install("-e", ".[test]")
    live = any(a == "--server" or a.startswith("--server=") for a in session.posargs)
    if not live:
        session.run("python", "-m", "bf16k", "apply")
    env = {"PYTHONPATH": "sglang-upstream/python"}
    if not live and not _has_cuda(session):
        env["TRITON_INTERPRET"] = "1"
    session.run("python", "-m", "verify", *session.posargs, env=env)


@nox.session(python=PYTHON, tags=["verify"], default=False)
def bench(session: nox.Session) -> None:
    """Kernel benchmarks on a CUDA GPU, side by side: bf16 read vs fp8 vs naive gather; bf16 vs fp8 store."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "bf16k", "apply")
    session.run("python", "-m", "verify.bench", *session.posargs, env={"PYTHONPATH": "sglang-upstream/python"})


@nox.session(python=PYTHON, tags=["series", "ci"], default=False)
def bisect(session: nox.Session) -> None:
    """Apply each prefix of the series in a scratch clone: imports, byte-compiles, its tests pass."""
    session.install("-e", ".[test]")
    env = {} if _has_cuda(session) else {"TRITON_INTERPRET": "1"}
    session.run("python", "-m", "bf16k", "bisect", *session.posargs, env=env)


@nox.session(python=False, tags=["series"], default=False)
def rebase(session: nox.Session) -> None:
    """Carry the series to a newer upstream: `-- 0.5.23` (PyPI) or `-- v0.5.23` (git); --continue/--skip/--abort."""
    _tool(session, "rebase")


@nox.session(python=False, tags=["series"], default=False)
def range_diff(session: nox.Session) -> None:
    """Classify each patch of series/ vs a carried series: unchanged/context-only/content-changed/dropped/new."""
    _tool(session, "range-diff")


@nox.session(python=False, tags=["series", "ci"], default=False)
def rebase_check(session: nox.Session) -> None:
    """Try the series on each newer DSV4 release (a report) and check every carried series (fails if one broke)."""
    _tool(session, "rebase-check")


@nox.session(python=False, tags=["deploy"], default=False)
def wheel(session: nox.Session) -> None:
    """A patched sglang wheel (pinned wheel + applied series, version +bf16k.<series hash>) in build/wheel/."""
    _tool(session, "wheel")


@nox.session(python=False, tags=["series"], default=False)
def pr_drafts(session: nox.Session) -> None:
    """Upstream PR drafts (one per patch + a cover) and git am-ready patches in build/pr-drafts/<version>/."""
    _tool(session, "pr-drafts")
