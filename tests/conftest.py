"""Test-wide setup: the patched upstream tree (after `nox -s apply`) is importable as `sglang`.

Subprocesses the tests start see it too (PYTHONPATH). Upstream's JIT kernels compile into a
cache under build/, and nvcc is found through CUDA_HOME (the `nvcc` on PATH may be a wrapper).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_PY = ROOT / "sglang-upstream" / "python"

if (UPSTREAM_PY / "sglang").is_dir():
    if str(UPSTREAM_PY) not in sys.path:
        sys.path.insert(0, str(UPSTREAM_PY))
    parts = [str(UPSTREAM_PY), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(ROOT / "build" / "jit-cache-tests"))
if Path("/usr/local/cuda/bin/nvcc").exists():
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
