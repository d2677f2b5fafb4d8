"""Test-wide setup: the patched upstream tree (after `nox -s apply`) is importable as `sglang`.

Subprocesses the tests start see it too (PYTHONPATH). Upstream's JIT kernels compile into a
cache under build/, and nvcc is found through CUDA_HOME (the `nvcc` on PATH may be a wrapper).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_PY = ROOT / "sglang-upstream" / "python"

if (UPSTREAM_PY / "sglang").is_dir():
    if str(UPSTREAM_PY) not in sys.path:
        sys.path.insert(0, str(UPSTREAM_PY))
    parts = [str(UPSTREAM_PY), str(ROOT)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(ROOT / "build" / "jit-cache-tests"))
if Path("/usr/local/cuda/bin/nvcc").exists():
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")

# Test files over this many seconds are named at the end of a run (issue 28: CI's budget is
# kept by files that stay small enough to split work across).
SLOW_FILE_SECONDS = 180.0
_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _file_seconds:
        return
    slowest = sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:10]
    terminalreporter.write_sep("=", "slowest test files (setup + call + teardown)")
    for path, seconds in slowest:
        flag = f"  over {SLOW_FILE_SECONDS:.0f} s" if seconds > SLOW_FILE_SECONDS else ""
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}{flag}")
