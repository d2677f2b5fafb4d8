"""The series' own upstream-style tests, run on an applied tree (pinned or carried).

The tests live in the tree they test, where upstream keeps its own (``test/registered/...``), and
import ``sglang`` from it, so one run covers one tree. They are the test files the applied series
adds (``is_series_test``): a real upstream checkout holds thousands of others. They need a Python with torch, triton and pytest
(the ``tests`` venv); the git-only sessions (``rebase``, ``rebase_check``) run in nox's own
interpreter, so they find one: ``--python``, else ``BF16K_TEST_PYTHON``, else the running
interpreter, else a venv nox built under ``.nox/``. Without CUDA, Triton kernels run under its
interpreter (``TRITON_INTERPRET=1``).

For a failing test the run can be repeated under a profiler that records which upstream
functions it executed (``co_qualname`` per file): that is what cuts "what upstream changed" down
to the functions the test actually ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import gitutil
from bf16k.errors import ToolError

# The ref `apply` records the upstream base in (bf16k.upstream.BASE_REF; not imported, to keep
# this module free of the upstream-obtaining code).
BASE_REF = "refs/patches/upstream-head"

# Where upstream keeps tests: its registered suites, and the shipped sglang.test package.
TEST_ROOTS = ("test/", "python/sglang/test/")
PYTHON_ENV = "BF16K_TEST_PYTHON"
JOBS_ENV = "BF16K_TEST_JOBS"
_PROBE = "import json, torch, triton, pytest\nprint(json.dumps({'cuda': bool(torch.cuda.is_available())}))\n"
_CUDA_HOME = "/usr/local/cuda"


def is_series_test(path: str) -> bool:
    """Whether a tree-relative path is a pytest file in upstream's test folders."""
    name = path.rsplit("/", 1)[-1]
    return path.startswith(TEST_ROOTS) and name.startswith("test_") and name.endswith(".py")


def series_test_files(repo: Path, base: str | None = None) -> list[str]:
    """The test files the applied series adds to ``repo`` (``base..HEAD``; by default since the
    base ``apply`` records), tree-relative and sorted; [] when there is no such base."""
    ref = base or BASE_REF
    if gitutil.git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], repo, check=False).returncode:
        return []
    added = gitutil.out(["diff", "--name-only", "--no-renames", "--diff-filter=A", ref, "HEAD"], repo)
    return sorted(p for p in added.splitlines() if is_series_test(p) and (repo / p).is_file())


@dataclass(frozen=True)
class TestPython:
    path: str
    cuda: bool

    def env(self, repo: Path) -> dict[str, str]:
        """The environment a series test run of ``repo`` needs."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(repo / "python")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.setdefault("SGLANG_JIT_CACHE_DIR", str(repo.parent / f"jit-cache-{repo.name}"))
        if not self.cuda:
            env.setdefault("TRITON_INTERPRET", "1")
        if "CUDA_HOME" not in env and Path(_CUDA_HOME, "bin", "nvcc").exists():
            env["CUDA_HOME"] = _CUDA_HOME
        return env


_probed: dict[str, TestPython | None] = {}


def _probe(python: str) -> TestPython | None:
    """Whether ``python`` imports the test dependencies, and sees CUDA (asked once per process)."""
    if python not in _probed:
        _probed[python] = _ask(python)
    return _probed[python]


def _ask(python: str) -> TestPython | None:
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=180, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return TestPython(python, bool(info.get("cuda")))


def candidates(root: Path) -> list[str]:
    """Interpreters to try, best first: the running one, then the venvs nox made here."""
    found = [sys.executable]
    nox_dir = root / ".nox"
    if nox_dir.is_dir():
        preferred = ["test-env", "tests", "bisect"]
        venvs = sorted(p for p in nox_dir.iterdir() if (p / "bin" / "python").exists())
        venvs.sort(key=lambda p: (preferred.index(p.name) if p.name in preferred else len(preferred), p.name))
        found += [str(p / "bin" / "python") for p in venvs]
    return list(dict.fromkeys(found))


def find_python(root: Path, given: str | None = None) -> TestPython:
    """A Python that can run the series' tests; a clear error naming how to get one."""
    wanted = given or os.environ.get(PYTHON_ENV)
    if wanted:
        found = _probe(wanted)
        if found is None:
            raise ToolError(
                f"{wanted} cannot run the series' tests (it does not import torch, triton and pytest)"
            )
        return found
    tried = candidates(root)
    for python in tried:
        found = _probe(python)
        if found is not None:
            return found
    raise ToolError(
        "the series' tests need a Python with torch, triton and pytest, and none was found "
        f"(tried {', '.join(tried)}). Build the shared test environment once with "
        f"`python -m bf16k test-env -- -c pass` (about 6 GiB), or name one with {PYTHON_ENV}=/path/to/python "
        "(or --python)."
    )


# --------------------------------------------------------------------------- running


@dataclass
class Failure:
    nodeid: str  # relative to the tree: test/registered/.../test_x.py::test_y[param]
    message: str  # the first line pytest gives for it
    text: str = ""  # the whole report (traceback included)

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]


@dataclass
class TestRun:
    repo: Path
    passed: int = 0
    skipped: int = 0
    failures: list[Failure] = field(default_factory=list)
    collected: bool = True  # False: pytest could not even collect (or crashed)
    seconds: float = 0.0
    output: str = ""  # the last part of pytest's output
    absent: bool = False  # the tree holds no series tests (a series without them)

    @property
    def ok(self) -> bool:
        return self.collected and not self.failures

    def summary(self) -> str:
        if self.absent:
            return "no series tests in this tree"
        if not self.collected:
            return "the series' tests could not be collected or crashed"
        text = f"{self.passed} passed, {self.skipped} skipped"
        if self.failures:
            text = f"{len(self.failures)} failed, " + text
        return text + f" in {self.seconds:.0f} s"


def _command(python: TestPython, repo: Path, junit: Path, select: list[str], extra: list[str]) -> list[str]:
    targets = select
    # -c /dev/null with --rootdir: node ids relative to the tree, no product ini, no cache dir.
    return [
        python.path,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        os.devnull,
        f"--rootdir={repo}",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit1",
        *extra,
        *targets,
    ]


def _parse_junit(path: Path, run: TestRun) -> None:
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, FileNotFoundError):
        run.collected = False
        return
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        file = case.get("file") or (classname.replace(".", "/") + ".py")
        module = file[: -len(".py")].replace("/", ".")
        within = classname[len(module) + 1 :].replace(".", "::") if classname.startswith(module + ".") else ""
        nodeid = "::".join(p for p in (file, within, name) if p)
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            run.failures.append(Failure(nodeid, message[0][:300] if message else "", bad.text or ""))
        elif case.find("skipped") is not None:
            run.skipped += 1
        else:
            run.passed += 1
    # A collection error is an <error> in a testcase with an empty name, already counted.


@dataclass
class _Job:
    repo: Path
    proc: subprocess.Popen[bytes]
    junit: Path
    log: Path
    started: float


def _start(
    python: TestPython,
    repo: Path,
    tmp: Path,
    select: list[str],
    extra: list[str],
    stream: bool = False,
    env: dict[str, str] | None = None,
) -> _Job:
    tmp.mkdir(parents=True, exist_ok=True)
    junit, log = tmp / "junit.xml", tmp / "pytest.log"
    log.touch()
    cmd = _command(python, repo, junit, select, extra)
    run_env = {**python.env(repo), **(env or {})}
    if stream:  # a person is watching: pytest talks to the terminal
        proc = subprocess.Popen(cmd, cwd=repo, env=run_env)
    else:
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, cwd=repo, env=run_env, stdout=fh, stderr=subprocess.STDOUT)
    return _Job(repo, proc, junit, log, time.monotonic())


def _finish(job: _Job) -> TestRun:
    code = job.proc.wait()
    run = TestRun(job.repo, seconds=time.monotonic() - job.started)
    text = job.log.read_text(errors="replace")
    run.output = text[-6000:]
    _parse_junit(job.junit, run)
    if code not in (0, 1, 5):  # 2: interrupted/collection errors, 3: internal, 4: usage
        run.collected = False
    return run


def run(
    python: TestPython,
    repo: Path,
    select: list[str] | None = None,
    extra: list[str] | None = None,
    stream: bool = False,
    base: str | None = None,
    env: dict[str, str] | None = None,
) -> TestRun:
    """Run the series' tests (those the series adds on ``base``, or ``select``ed node ids) on
    ``repo``, with ``env`` over the test environment; never raises on failures."""
    select = select or series_test_files(repo, base)
    if not select:
        return TestRun(repo, absent=True)
    with tempfile.TemporaryDirectory(prefix="bf16k-tests-") as tmp:
        return _finish(_start(python, repo, Path(tmp), select, extra or [], stream, env))


def run_many(python: TestPython, repos: list[Path]) -> list[TestRun]:
    """The series' tests on several trees, up to BF16K_TEST_JOBS (default 2) at a time."""
    jobs_max = max(1, int(os.environ.get(JOBS_ENV, "2")))
    results: dict[Path, TestRun] = {}
    with tempfile.TemporaryDirectory(prefix="bf16k-tests-") as tmp:
        pending = list(enumerate(repos))
        running: list[_Job] = []
        while pending or running:
            while pending and len(running) < jobs_max:
                i, repo = pending.pop(0)
                tests = series_test_files(repo)
                if not tests:
                    results[repo] = TestRun(repo, absent=True)
                    continue
                running.append(_start(python, repo, Path(tmp) / str(i), tests, []))
            if not running:
                continue
            job = running.pop(0)
            results[job.repo] = _finish(job)
    return [results[r] for r in repos]


# --------------------------------------------------------------------------- what a test ran

_TRACE_PLUGIN = '''
"""pytest plugin (written by bf16k): record the upstream functions each test executes."""
import json, os, sys, threading
import pytest

_ROOT = os.environ["BF16K_TRACE_ROOT"]
_SKIP = tuple(os.environ["BF16K_TRACE_SKIP"].split(os.pathsep))
_seen = set()


def _profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        name = code.co_filename
        if name.startswith(_ROOT) and not name.startswith(_SKIP):
            _seen.add((name[len(_ROOT):], code.co_qualname))


_calls = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _seen.clear()
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        _calls[item.nodeid] = sorted(_seen)


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["BF16K_TRACE_OUT"], "w") as fh:
        json.dump(_calls, fh)
'''


def executed(python: TestPython, repo: Path, nodeids: list[str]) -> dict[str, dict[str, set[str]]]:
    """nodeid -> {tree-relative file: qualnames} of the upstream code each test ran (tests excluded)."""
    if not nodeids:
        return {}
    with tempfile.TemporaryDirectory(prefix="bf16k-trace-") as tmp:
        d = Path(tmp)
        (d / "bf16k_calltrace.py").write_text(_TRACE_PLUGIN)
        out = d / "calls.json"
        env = python.env(repo)
        env["PYTHONPATH"] = os.pathsep.join([str(repo / "python"), str(d)])
        env["BF16K_TRACE_ROOT"] = str(repo.resolve()) + os.sep
        env["BF16K_TRACE_SKIP"] = os.pathsep.join(str((repo / r).resolve()) + os.sep for r in TEST_ROOTS)
        env["BF16K_TRACE_OUT"] = str(out)
        cmd = [
            python.path,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            os.devnull,
            f"--rootdir={repo}",
            "-p",
            "bf16k_calltrace",
            *nodeids,
        ]
        subprocess.run(cmd, cwd=repo, env=env, capture_output=True, check=False, timeout=3600)
        try:
            data = json.loads(out.read_text())
        except (FileNotFoundError, ValueError):
            return {}
    result: dict[str, dict[str, set[str]]] = {}
    for nodeid, calls in data.items():
        per: dict[str, set[str]] = {}
        for path, qualname in calls:
            per.setdefault(path, set()).add(qualname)
        result[nodeid] = per
    return result
