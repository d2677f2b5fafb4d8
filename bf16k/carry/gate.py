"""The carry's gate: it is done only once the series' own tests pass on the carried tree and every
prefix of the carried series bisects.

The engine is handed a :data:`Gate` and calls it with every patch carried; the command line
hands it :func:`series_gate`. A gate either records what it measured (``state.verified``) and
returns None, or stops the carry like a conflict, with an :class:`Outcome` naming what failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from bf16k import bisect, gitutil, rangediff, seriestests
from bf16k.carried import Verified
from bf16k.carry import messages
from bf16k.carry.messages import Outcome, Owners, Stop, plural
from bf16k.carry.state import Carry, StopRecord
from bf16k.errors import ToolError

Gate = Callable[[Carry], Outcome | None]


def series_gate(carry: Carry) -> Outcome | None:
    """The series' tests on the carried tree (what failed last time first), then every prefix bisected."""
    state = carry.state
    try:
        python = seriestests.find_python(carry.root, state.python)
    except ToolError as exc:
        _stop(carry, "tests", "no Python to run the series' tests")
        return Outcome(Stop("tests", total=len(state.names)), messages.no_python(carry, str(exc)))
    commits, names = _carried_commits(carry)
    verified = Verified("no series tests", 0, "", 0)
    if seriestests.series_test_files(carry.repo, state.bases.new_base):
        mode = "CUDA" if python.cuda else "CPU, TRITON_INTERPRET=1"
        print(f"series tests on {carry.where} ({mode}, {python.path}) ...", flush=True)
        if state.failing:  # what failed last time first: a quick answer after a fix
            quick = seriestests.run(python, carry.repo, select=list(state.failing))
            if quick.collected and quick.failures:
                return _tests_stop(carry, python, quick, commits, names)
        result = seriestests.run(python, carry.repo, base=state.bases.new_base)
        if not result.ok:
            return _tests_stop(carry, python, result, commits, names)
        print(f"series tests: {result.summary()}", flush=True)
        verified.tests = f"{result.passed} passed, {result.skipped} skipped"
        verified.tests_seconds = round(result.seconds)
    state.failing = []
    began = time.monotonic()
    print(f"bisect: each of the {len(commits)} carried prefixes on its own ...", flush=True)
    steps = bisect.check_commits(
        carry.repo, state.bases.new_base, commits, names, python, skip_last_tests=True
    )
    bad = [s for s in steps if s.problems]
    if bad:
        return _bisect_stop(carry, python, bad[0], commits, names)
    verified.bisect = f"{len(steps)} of {len(commits)} prefixes"
    verified.bisect_seconds = round(time.monotonic() - began)
    state.verified = verified
    carry.save()
    return None


def _stop(carry: Carry, kind: str, summary: str) -> None:
    carry.state.stop = StopRecord(kind, summary, gitutil.rev_parse(carry.repo, "HEAD"))
    carry.save()


def _carried_commits(carry: Carry) -> tuple[list[str], list[str]]:
    commits = gitutil.out(
        ["rev-list", "--reverse", f"{carry.state.bases.new_base}..HEAD"], carry.repo
    ).split()
    return commits, [rangediff.patch_name(carry.repo, c) for c in commits]


def owners(repo: Path, commits: list[str], names: list[str]) -> Owners:
    """file -> (index, patch) of the first carried patch that touches it."""
    owner: Owners = {}
    for i, c in enumerate(commits):
        for f in gitutil.out(["diff-tree", "--no-commit-id", "--name-only", "-r", c], repo).splitlines():
            owner.setdefault(f, (i, names[i]))
    return owner


def _tests_stop(
    carry: Carry,
    python: seriestests.TestPython,
    result: seriestests.TestRun,
    commits: list[str],
    names: list[str],
) -> Outcome:
    owner = owners(carry.repo, commits, names)
    carry.state.failing = [f.nodeid for f in result.failures]
    n = len(result.failures)
    _stop(carry, "tests", f"{plural(n, 'series test')} failing" if n else "series tests crashed")
    return Outcome(Stop("tests", total=len(names)), messages.tests_failed(carry, python, result, owner))


def _bisect_stop(
    carry: Carry, python: seriestests.TestPython, step: bisect.Step, commits: list[str], names: list[str]
) -> Outcome:
    carry.state.failing = [f.nodeid for f in step.failures]
    _stop(carry, "bisect", f"patch {step.index + 1} '{step.name}' does not leave a working tree")
    rerun = carry.state.failing or seriestests.series_test_files(carry.repo, carry.state.bases.new_base)
    text = messages.prefix_failed(carry, python, step, owners(carry.repo, commits, names), rerun)
    return Outcome(Stop("bisect", total=len(names), index=step.index, name=step.name), text)
