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


def _in_test_env(session: nox.Session, *args: str) -> None:
    """Run python ARGS in the one venv tests/verify_recall/bisect/bench share (.nox/test-env):
    one CUDA-torch install instead of one per session. bf16k.testenv says how."""
    session.run(*TOOL, "test-env", "--label", session.name, "--", *args, external=True)


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
    # System site-packages: a deployment's own torch compiles the JIT cache it will look up (the
    # cache key names the torch version). Without one, the test environment's torch does, instead
    # of a second multi-GiB torch in this venv.
    has_torch = subprocess.run(
        [f"{session.bin}/python", "-c", "import torch"], capture_output=True, check=False
    )
    if has_torch.returncode:
        _in_test_env(session, "-m", "bf16k", "build", *session.posargs)
        return
    session.install("--no-compile", "-e", ".[kernels-build]")  # bytecode only for what is imported
    session.run("python", "-m", "bf16k", "build", *session.posargs)


@nox.session(python=False, tags=["ci"], default=False)
def tests(session: nox.Session) -> None:
    """The project's tests and the series' own upstream tests; `-- --upstream V`: that tree's alone."""
    # bf16k applies the series first; `-- --upstream 0.5.23` runs the series' tests on that tree
    # alone. The shared test environment sets TRITON_INTERPRET=1 where there is no GPU.
    _in_test_env(session, "-m", "bf16k", "tests", *session.posargs)


@nox.session(python=PYTHON, tags=["ci"], default=False)
def lint(session: nox.Session) -> None:
    """ruff check and format, mypy (--strict over bf16k, every function body of verify); the applied series against upstream's format, production-code and CI-registration rules."""
    session.install("ruff==0.17.6", "mypy==2.4.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")  # the product's own Python, pyproject's settings
    session.run("mypy")  # packages and strictness from pyproject's [tool.mypy]
    session.run("python", "-m", "bf16k.upstreamlint", *session.posargs)  # bf16k.upstreamlint says what


@nox.session(python=False, tags=["verify"], default=False)
def verify_recall(session: nox.Session) -> None:
    """Recall verification: tier 1 parity (GPU), tier 2 indexer recall; `-- --server URL` for tier 3."""
    live = any(a == "--server" or a.startswith("--server=") for a in session.posargs)
    if not live:
        session.run(*TOOL, "apply", external=True)
    _in_test_env(session, "-m", "verify", *session.posargs)


@nox.session(python=PYTHON, reuse_venv=False, tags=["verify", "ci"], default=False)
def live_install(session: nox.Session) -> None:
    """The live tier from its extra alone: a fresh venv, `pip install .[live]`, `python -m verify.live --help`."""
    session.install(".[live]")  # not editable: the installed package must hold the tier
    session.chdir(session.create_tmp())  # away from the checkout, so `verify` is the installed one
    session.run("python", "-m", "verify.live", "--help", silent=True)
    # The heatmaps' import works too, and the extra brought no torch with it.
    session.run(
        "python", "-c", "import matplotlib.pyplot, importlib.util as u; assert not u.find_spec('torch')"
    )


@nox.session(python=False, tags=["verify"], default=False)
def cost(session: nox.Session) -> None:
    """What each index-K format costs (KV-pool tokens from upstream's configurator, decode bytes, prefill FLOPs); no GPU."""
    session.run(*TOOL, "apply", external=True)
    _in_test_env(session, "-m", "verify.cost", *session.posargs)


@nox.session(python=False, tags=["verify"], default=False)
def bench(session: nox.Session) -> None:
    """Kernel benchmarks on a CUDA GPU, side by side: bf16 read vs fp8 vs naive gather; bf16 vs fp8 store."""
    session.run(*TOOL, "apply", external=True)
    _in_test_env(session, "-m", "verify.bench", *session.posargs)


@nox.session(python=False, tags=["series", "ci"], default=False)
def bisect(session: nox.Session) -> None:
    """Apply each prefix of the series in a scratch clone: imports, byte-compiles, its tests pass."""
    _in_test_env(session, "-m", "bf16k", "bisect", *session.posargs)


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
    """The upstream PR set (series/prs.toml): a draft per PR, a cover, git am-ready patches; `-- --check` tests each PR."""
    _tool(session, "pr-drafts")
