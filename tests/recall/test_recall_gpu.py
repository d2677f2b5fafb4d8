"""GPU-only checks of the production paths (skipped without CUDA).

They check: upstream's fp8 index-K store writes exactly the bytes the emulation predicts
(block-planar 132-B pages); patch 4's bf16 scorer matches the fp64 oracle (calc_diff < 5e-6);
and a short tier-2 run through the production kernels passes the bf16 gate with an fp8 verdict.
Run them on the GPU machine with the patched tree on PYTHONPATH.
"""

import json

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and the patched upstream tree"),
]


@pytest.fixture(scope="module")
def backend():
    from verify.recall.gpu_backend import make_gpu_backend

    return make_gpu_backend()


def test_fp8_store_bytes_match_emulation(backend):
    from verify.core import formats as F

    if "FALLBACK" in backend.paths["store_fp8"]:
        pytest.skip(backend.paths["store_fp8"])
    keys = torch.randn(4096, 128, device="cuda") * torch.exp(torch.randn(4096, 1, device="cuda"))
    slots = torch.randperm(64 * 80, device="cuda")[:4096]
    got = backend.new_pool("fp8", 80)
    backend.store("fp8", got, slots, keys)
    want = F.new_pool("fp8", 80, "cuda")
    F.fp8_store(want, slots, keys.to(backend.fp8_input_dtype))
    assert torch.equal(got, want)


def test_bf16_scorer_against_oracle(backend):
    from verify.recall import diagnose

    if "FALLBACK" in backend.paths["score_bf16"]:
        pytest.skip(backend.paths["score_bf16"])
    case = diagnose.score_case(backend.device, 8192)
    chk = diagnose.check_scorer(
        "bf16", backend.paths["score_bf16"], diagnose.backend_score_fn(backend, "bf16"), case, False
    )
    assert chk.status == "pass", chk.detail


def test_short_tier2_run(tmp_path):
    from verify.recall.cli import main

    rc = main(
        ["--out", str(tmp_path), "--backend", "gpu", "--lengths", "4509", "22597", "--quiet", "--no-plots"]
    )
    res = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0, res["gate"]
    assert "fp8 path" in res["diagnosis"]["verdict"]
