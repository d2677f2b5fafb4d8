"""`bisect`: every prefix of the series leaves a working tree (imports, compiles, its tests pass).

The patches are applied one at a time in a scratch clone (the user's sglang-upstream is not
touched). After each one: byte-compile the Python files the series has touched so far, import each
touched module that imported on the unpatched base, and run the series' upstream-style tests that
exist at that point (`python/sglang/test/dsv4_bf16_index_k/`). This is `stg rebase --exec`'s
per-patch check, run on the pin. A carry runs the same check over its carried commits
(:func:`check_commits`): each commit is a prefix, so nothing is applied twice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
        cwd=repo, env=python.env(repo), capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        errors = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {m: f"the import process died: {tail}" for m in modules}
    return {m: str(errors.get(m, "")) for m in modules}


def _local_python() -> TestPython:
    """The running interpreter (the bisect session's venv), with its CUDA answer."""
    probed = seriestests._probe(sys.executable)
    return probed or TestPython(sys.executable, cuda=False)


class _Checker:
    """What one prefix must satisfy, given every file the series touches."""

    def __init__(self, repo: Path, touched: list[str], created: set[str], python: TestPython) -> None:
        self.repo, self.python = repo, python
        modules = [(m, p) for m, p in ((_module_name(p), p) for p in touched) if m]
        self.base_import = importable(repo, [m for m, p in modules if p not in created], python)

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
        for module, error in importable(repo, wanted, self.python).items():
            if error:
                step.problems.append(f"import {module} fails: {error}")
        step.notes.append(f"imported {len(wanted)} touched module(s)")
        tests = [f for f in present if is_series_test(f)]
        if run_tests and tests:
            result = seriestests.run(self.python, repo, select=tests, extra=["-x"])
            if not result.ok:
                step.failures = result.failures
                step.problems.append(f"series tests fail: {result.summary()}\n{result.output[-3000:]}")
            else:
                step.notes.append(f"series tests: {result.summary()}")


def _say(index: int, total: int, step: Step) -> None:
    print(f"[{index + 1}/{total}] {step.name}: " + ("FAIL" if step.problems else "ok")
          + (f" ({'; '.join(step.notes)})" if step.notes else ""), flush=True)  # fmt: skip


def run(t: Target, *, python: TestPython | None = None, run_tests: bool = True) -> list[Step]:
    python = python or _local_python()
    names = series.read_order(t.series_dir)
    if not names:
        print("bisect: the series is empty")
        return []
    up = upstream.obtain(t, quiet=True)
    touched_all, created = series.touched_files(t.series_dir)
    steps: list[Step] = []
    with patches.scratch_clone(up) as repo:
        checker = _Checker(repo, touched_all, created, python)
        seen: list[str] = []
        for index, name in enumerate(names):
            step = Step(index, name)
            steps.append(step)
            failure = patches.run_am(repo, patches.mbox(t.series_dir, [name]), [name], offset=index)
            if failure:
                step.problems.append(patches.conflict_message(failure, up, "bisect"))
                patches.abort_am(repo)
                break
            info = series.parse_patch(t.series_dir / name)
            seen += [f for f in info.files if f not in seen]
            checker.check(step, seen, run_tests)
            _say(index, len(names), step)
    return steps


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
    """The bisect checks on each of ``commits`` (prefixes of a series on ``base``), in a scratch clone.

    Stops at the first prefix that fails: later ones include it. ``skip_last_tests``: the whole
    series' tests just passed on the last commit, so only its imports are checked again.
    """
    files_per_commit = [
        gitutil.out(["diff-tree", "--no-commit-id", "--name-only", "-r", c], repo).splitlines() for c in commits
    ]
    touched = sorted({f for files in files_per_commit for f in files})
    created = {f for f in touched if not gitutil.has_commit(repo, base) or
               gitutil.git(["cat-file", "-e", f"{base}:{f}"], repo, check=False).returncode != 0}  # fmt: skip
    steps: list[Step] = []
    with _worktree(repo) as clone:
        gitutil.git(["checkout", "-q", "-f", base], clone)
        checker = _Checker(clone, touched, created, python)
        seen: list[str] = []
        for index, (commit, name) in enumerate(zip(commits, names, strict=True)):
            step = Step(index, name)
            steps.append(step)
            gitutil.git(["checkout", "-q", "-f", commit], clone)
            gitutil.git(["clean", "-q", "-fdx"], clone)
            seen += [f for f in files_per_commit[index] if f not in seen]
            last = index == len(commits) - 1
            checker.check(step, seen, run_tests and not (last and skip_last_tests))
            if last and skip_last_tests and run_tests:
                step.notes.append("series tests: the full run above")
            _say(index, len(commits), step)
            if step.problems:
                break
    return steps


def report(steps: list[Step]) -> None:
    bad = [s for s in steps if s.problems]
    if bad:
        lines = []
        for s in bad:
            lines += [f"patch {s.index + 1} '{s.name}':"] + [f"  {p}" for p in s.problems]
        raise ToolError("bisect: a prefix of the series does not leave a working tree\n" + "\n".join(lines))
    print(f"bisect: all {len(steps)} prefixes of the series import, compile and pass their tests")
