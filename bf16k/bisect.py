"""`bisect`: every prefix of the series leaves a working tree (imports, compiles, its tests pass).

The patches are applied one at a time in a scratch clone (the user's sglang-upstream is not
touched). After each one: byte-compile the Python files the series has touched so far, import each
touched module that imported on the unpatched base, and run the series' upstream-style tests that
exist at that point (`python/sglang/test/dsv4_bf16_index_k/`). This is `stg rebase --exec`'s
per-patch check, run on the pin.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import patches, series, upstream
from bf16k.errors import ToolError
from bf16k.project import Target

SERIES_TESTS = "python/sglang/test/dsv4_bf16_index_k"


@dataclass
class Step:
    index: int
    name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _module_name(path: str) -> str | None:
    if not path.endswith(".py") or not path.startswith("python/"):
        return None
    parts = path[len("python/") : -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if "test" in parts:  # tests are run, not imported
        return None
    return ".".join(parts)


def _env(repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo / "python")
    env.setdefault("SGLANG_JIT_CACHE_DIR", str(repo.parent / "jit-cache"))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def importable(repo: Path, modules: list[str], python: str) -> dict[str, str]:
    """module -> "" if it imports, else the last line of the error (one process per module)."""
    result = {}
    for module in modules:
        proc = subprocess.run(
            [python, "-c", f"import importlib; importlib.import_module({module!r})"],
            cwd=repo, env=_env(repo), capture_output=True, text=True, check=False,
        )  # fmt: skip
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        result[module] = "" if proc.returncode == 0 else tail
    return result


def run(t: Target, *, python: str | None = None, run_tests: bool = True) -> list[Step]:
    python = python or sys.executable
    names = series.read_order(t.series_dir)
    if not names:
        print("bisect: the series is empty")
        return []
    up = upstream.obtain(t, quiet=True)
    touched_all, created = series.touched_files(t.series_dir)
    modules_all = [m for m in (_module_name(p) for p in touched_all) if m]
    steps: list[Step] = []
    with patches.scratch_clone(up) as repo:
        base_import = importable(repo, [m for m, p in zip(modules_all, touched_all) if p not in created], python)
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
            present = [f for f in seen if (repo / f).is_file()]
            py_files = [str(repo / f) for f in present if f.endswith(".py")]
            if py_files:
                proc = subprocess.run(
                    [python, "-m", "py_compile", *py_files], capture_output=True, text=True, check=False
                )
                if proc.returncode != 0:
                    step.problems.append(f"does not byte-compile: {proc.stderr.strip()[-1500:]}")
            mods = [m for m in (_module_name(f) for f in present) if m]
            wanted = [m for m in mods if base_import.get(m, "") == ""]
            for module, error in importable(repo, wanted, python).items():
                if error:
                    step.problems.append(f"import {module} fails: {error}")
            step.notes.append(f"imported {len(wanted)} touched module(s)")
            tests_dir = repo / SERIES_TESTS
            if run_tests and tests_dir.is_dir():
                proc = subprocess.run(
                    [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(tests_dir)],
                    cwd=repo, env=_env(repo), capture_output=True, text=True, check=False,
                )  # fmt: skip
                summary = (proc.stdout.strip().splitlines() or ["?"])[-1]
                if proc.returncode not in (0, 5):  # 5: no tests collected
                    step.problems.append(f"series tests fail: {summary}\n{proc.stdout[-3000:]}")
                else:
                    step.notes.append(f"series tests: {summary}")
            print(f"[{index + 1}/{len(names)}] {name}: " + ("FAIL" if step.problems else "ok")
                  + (f" ({'; '.join(step.notes)})" if step.notes else ""))
    return steps


def report(steps: list[Step]) -> None:
    bad = [s for s in steps if s.problems]
    if bad:
        lines = []
        for s in bad:
            lines += [f"patch {s.index + 1} '{s.name}':"] + [f"  {p}" for p in s.problems]
        raise ToolError("bisect: a prefix of the series does not leave a working tree\n" + "\n".join(lines))
    print(f"bisect: all {len(steps)} prefixes of the series import, compile and pass their tests")
