"""`bisect`: every prefix of the series leaves a working tree (imports, compiles, its tests pass).

The patches are applied one at a time in a scratch clone (the user's sglang-upstream is not
touched), each leaving a commit. Each prefix is then checked on its own: byte-compile the Python
files the series has touched so far, import each touched module that imported on the unpatched
base, and run the series' upstream-style tests that exist at that point (the test files the series
has added under test/registered/). This is `stg rebase --exec`'s per-patch check, run on the pin.
A carry runs the same check over its carried commits (:func:`check_commits`).

The imports and the tests of a prefix share one Python process (importing sglang costs ~15-30 s a
process), and prefixes are checked ``BF16K_TEST_JOBS`` (default 2) at a time, each in its own
clone: the checks are independent, and CPU-bound in one interpreter each.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import gitutil, patches, series, seriestests, upstream
from bf16k.errors import ToolError
from bf16k.project import Target
from bf16k.seriestests import TestPython, is_series_test


@dataclass
class Step:
    index: int
    name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[seriestests.Failure] = field(default_factory=list)


def _module_name(path: str) -> str | None:
    if not path.endswith(".py") or not path.startswith("python/"):
        return None
    parts = path[len("python/") : -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if "test" in parts:  # tests are run, not imported
        return None
    return ".".join(parts)


_IMPORT_ALL = """
import importlib, json, sys, traceback
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - reported per module
        errors[name] = (traceback.format_exception_only(type(exc), exc) or ["?"])[-1].strip()
print(json.dumps(errors))
"""


def importable(repo: Path, modules: list[str], python: TestPython) -> dict[str, str]:
    """module -> "" if it imports, else the last line of the error.

    One process for all of them (importing sglang costs ~15 s a process on a CPU machine; one per
    module made a prefix's check take minutes), each import caught on its own.
    """
    if not modules:
        return {}
    proc = subprocess.run(
        [python.path, "-c", _IMPORT_ALL, *modules],
        cwd=repo,
        env=python.env(repo),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        errors = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {m: f"the import process died: {tail}" for m in modules}
    return {m: str(errors.get(m, "")) for m in modules}


# A pytest plugin that imports the touched modules first (each caught on its own) and writes what
# failed, so a prefix's imports and tests cost one interpreter start.
_IMPORT_PLUGIN = """
import importlib, json, os, traceback


def pytest_configure(config):
    errors = {}
    for name in filter(None, os.environ["BF16K_IMPORT_MODULES"].split(",")):
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - reported per module
            errors[name] = (traceback.format_exception_only(type(exc), exc) or ["?"])[-1].strip()
    with open(os.environ["BF16K_IMPORT_OUT"], "w") as fh:
        json.dump(errors, fh)
"""


def _local_python() -> TestPython:
    """The running interpreter (the bisect session's venv), with its CUDA answer."""
    probed = seriestests._probe(sys.executable)
    return probed or TestPython(sys.executable, cuda=False)


def base_imports(repo: Path, touched: list[str], created: set[str], python: TestPython) -> dict[str, str]:
    """Which touched modules import on the unpatched base checked out in ``repo`` (a module that
    did not import there is not required to import later)."""
    modules = [(m, p) for m, p in ((_module_name(p), p) for p in touched) if m]
    return importable(repo, [m for m, p in modules if p not in created], python)


class _Checker:
    """What one prefix, checked out in ``repo``, must satisfy."""

    def __init__(self, repo: Path, base_import: dict[str, str], python: TestPython) -> None:
        self.repo, self.python, self.base_import = repo, python, base_import

    def check(self, step: Step, seen: list[str], run_tests: bool) -> None:
        repo = self.repo
        present = [f for f in seen if (repo / f).is_file()]
        py_files = [str(repo / f) for f in present if f.endswith(".py")]
        if py_files:
            proc = subprocess.run(
                [self.python.path, "-m", "py_compile", *py_files], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                step.problems.append(f"does not byte-compile: {proc.stderr.strip()[-1500:]}")
        mods = [m for m in (_module_name(f) for f in present) if m]
        wanted = [m for m in mods if self.base_import.get(m, "") == ""]
        tests = [f for f in present if is_series_test(f)] if run_tests else []
        if tests:
            errors, result = self._import_and_test(wanted, tests)
        else:
            errors, result = importable(repo, wanted, self.python), None
        for module, error in errors.items():
            if error:
                step.problems.append(f"import {module} fails: {error}")
        step.notes.append(f"imported {len(wanted)} touched module(s)")
        if result is not None and not result.ok:
            step.failures = result.failures
            step.problems.append(f"series tests fail: {result.summary()}\n{result.output[-3000:]}")
        elif result is not None:
            step.notes.append(f"series tests: {result.summary()}")

    def _import_and_test(
        self, modules: list[str], tests: list[str]
    ) -> tuple[dict[str, str], seriestests.TestRun]:
        """The imports (by a plugin, before collection) and the tests in one pytest process."""
        with tempfile.TemporaryDirectory(prefix="bf16k-imports-") as tmp:
            plugin_dir = Path(tmp)
            (plugin_dir / "bf16k_importcheck.py").write_text(_IMPORT_PLUGIN)
            out = plugin_dir / "errors.json"
            env = {
                "BF16K_IMPORT_MODULES": ",".join(modules),
                "BF16K_IMPORT_OUT": str(out),
                "PYTHONPATH": os.pathsep.join([self.python.env(self.repo)["PYTHONPATH"], str(plugin_dir)]),
            }
            result = seriestests.run(
                self.python, self.repo, select=tests, extra=["-x", "-p", "bf16k_importcheck"], env=env
            )
            try:
                found = json.loads(out.read_text())
            except (FileNotFoundError, ValueError):
                found = {m: "the test process died before the imports were checked" for m in modules}
        return {m: str(found.get(m, "")) for m in modules}, result


def _say(index: int, total: int, step: Step) -> None:
    print(
        f"[{index + 1}/{total}] {step.name}: "
        + ("FAIL" if step.problems else "ok")
        + (f" ({'; '.join(step.notes)})" if step.notes else ""),
        flush=True,
    )


def run(t: Target, *, python: TestPython | None = None, run_tests: bool = True) -> list[Step]:
    python = python or _local_python()
    names = series.read_order(t.series_dir)
    if not names:
        print("bisect: the series is empty")
        return []
    up = upstream.obtain(t, quiet=True)
    with patches.scratch_clone(up) as repo:
        base = gitutil.rev_parse(repo, "HEAD")
        commits: list[str] = []
        for index, name in enumerate(names):
            failure = patches.run_am(repo, patches.mbox(t.series_dir, [name]), [name], offset=index)
            if failure:
                step = Step(index, name, problems=[patches.conflict_message(failure, up, "bisect")])
                patches.abort_am(repo)
                _say(index, len(names), step)
                return [*check_commits(repo, base, commits, names[:index], python, run_tests=run_tests), step]
            commits.append(gitutil.rev_parse(repo, "HEAD"))
        return check_commits(repo, base, commits, names, python, run_tests=run_tests)


@contextmanager
def _worktree(repo: Path) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="bf16k-bisect-"))
    try:
        clone = tmp / "upstream"
        gitutil.git(["clone", "-q", "--shared", "--no-checkout", str(repo), str(clone)], tmp)
        yield clone
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_commits(
    repo: Path,
    base: str,
    commits: list[str],
    names: list[str],
    python: TestPython,
    *,
    run_tests: bool = True,
    skip_last_tests: bool = False,
) -> list[Step]:
    """The bisect checks on each of ``commits`` (prefixes of a series on ``base``), ``BF16K_TEST_JOBS``
    at a time, each worker in its own scratch clone; the steps in series order.

    ``skip_last_tests``: the whole series' tests just passed on the last commit, so only its
    imports are checked again.
    """
    if not commits:
        return []
    files_per_commit = [
        gitutil.out(["diff-tree", "--no-commit-id", "--name-only", "-r", c], repo).splitlines()
        for c in commits
    ]
    touched = sorted({f for files in files_per_commit for f in files})
    created = {
        f
        for f in touched
        if not gitutil.has_commit(repo, base)
        or gitutil.git(["cat-file", "-e", f"{base}:{f}"], repo, check=False).returncode != 0
    }
    seen_at: list[list[str]] = []
    seen: list[str] = []
    for files in files_per_commit:
        seen = seen + [f for f in files if f not in seen]
        seen_at.append(seen)
    jobs = max(1, min(len(commits), int(os.environ.get(seriestests.JOBS_ENV, "2"))))
    steps: dict[int, Step] = {}
    todo: queue.Queue[int] = queue.Queue()
    for index in range(len(commits)):
        todo.put(index)
    lock = threading.Lock()

    def work(clone: Path, checker: _Checker) -> None:
        while True:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            step = Step(index, names[index])
            gitutil.git(["checkout", "-q", "-f", commits[index]], clone)
            gitutil.git(["clean", "-q", "-fdx"], clone)
            last = index == len(commits) - 1
            checker.check(step, seen_at[index], run_tests and not (last and skip_last_tests))
            if last and skip_last_tests and run_tests:
                step.notes.append("series tests: the full run above")
            with lock:
                steps[index] = step
                _say(index, len(commits), step)

    with ExitStack() as stack:
        clones = [stack.enter_context(_worktree(repo)) for _ in range(jobs)]
        gitutil.git(["checkout", "-q", "-f", base], clones[0])
        on_base = base_imports(clones[0], touched, created, python)
        workers = [
            threading.Thread(target=work, args=(clone, _Checker(clone, on_base, python))) for clone in clones
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return [steps[i] for i in sorted(steps)]


def report(steps: list[Step]) -> None:
    bad = [s for s in steps if s.problems]
    if bad:
        lines = []
        for s in bad:
            lines += [f"patch {s.index + 1} '{s.name}':"] + [f"  {p}" for p in s.problems]
        raise ToolError("bisect: a prefix of the series does not leave a working tree\n" + "\n".join(lines))
    print(f"bisect: all {len(steps)} prefixes of the series import, compile and pass their tests")
