"""The GPU backend's paged-scorer calls, exercised on CPU with real code:

* upstream's ``fp8_paged_mqa_logits_torch`` (compiled from an upstream source tree) against the
  emulation of its semantics (bf16-rounded per-head dots) -- checks the views, shapes and flags
  ``call_paged_scorer`` passes, and that the emulation the CPU backend uses is that function;
* the read bench's Triton fp8 twin under ``TRITON_INTERPRET=1`` against the fp64 oracle.

The upstream tree is ``$VERIFY_SGLANG_TREE`` or ``sglang-upstream/python/sglang`` of this repo.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verify.core import upstream as U
from verify.recall import diagnose
from verify.recall.backend import EmulationBackend

REPO = Path(__file__).resolve().parents[2]


def _tree():
    for cand in (os.environ.get("VERIFY_SGLANG_TREE"), REPO / "sglang-upstream/python/sglang"):
        if cand and (Path(cand) / "srt/layers/attention/dsv4/indexer.py").exists():
            return Path(cand)
    return None


@pytest.mark.skipif(
    _tree() is None, reason="no upstream source tree (set VERIFY_SGLANG_TREE or apply the submodule)"
)
def test_upstream_torch_fallback_matches_its_emulation():
    got = U.fp8_torch_scorer(_tree())
    assert isinstance(got, U.Found), got
    case = diagnose.score_case(torch.device("cpu"), 1024)
    real = diagnose.scorer_fn(got, "fp8")(case.pool["fp8"], case.q8, case.w, case.seq_lens, case.page_table)
    emu = diagnose.backend_score_fn(
        EmulationBackend(device=torch.device("cpu"), fp8_scorer="fp8-torch"), "fp8"
    )(case.pool["fp8"], case.q8, case.w, case.seq_lens, case.page_table)
    valid = torch.isfinite(emu)
    assert diagnose.calc_diff(real[valid], emu[valid]) < 1e-9
    assert bool((real[~valid] == 0).all())  # upstream's fallback leaves 0 past seq_len (clean_logits=False)
    chk = diagnose.check_scorer("fp8", got.name, diagnose.scorer_fn(got, "fp8"), case, True)
    assert chk.status == "pass", chk.detail


TWIN_PROBE = """
import json, torch
from verify.core import upstream as U
from verify.recall import diagnose
twin = U.fp8_triton_twin()
assert isinstance(twin, U.Found), twin
case = diagnose.score_case(torch.device("cpu"), 256)
chk = diagnose.check_scorer("fp8", twin.name, diagnose.scorer_fn(twin, "fp8"), case, True)
print("RESULT " + json.dumps({"status": chk.status, "detail": chk.detail}))
"""


@pytest.mark.skipif(not (REPO / "verify/core/fp8_twin.py").exists(), reason="verify/core/fp8_twin.py absent")
def test_triton_fp8_twin_interpreted():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", TWIN_PROBE],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-2000:]
    res = json.loads(line[7:])
    assert res["status"] == "pass", res["detail"]
