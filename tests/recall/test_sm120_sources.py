"""What sm_120 compiles differently, without an sm_120: TileLang's source for upstream's fp8
scorer, and one of the C4 path's JIT kernels built for sm_90a and sm_120f through upstream's own
loader (nvcc only). The committed full report is verify/results/sm120/."""

import shutil

import pytest

from verify.recall import sm120

pytestmark = pytest.mark.slow


def test_tilelang_sm120_source_is_the_mma_sync_variant_of_sm90():
    pytest.importorskip("tilelang")
    info = sm120.describe_sources(sm120.tilelang_sources())
    assert info["sm_120_equals_sm_90a_no_wgmma"] is True
    assert info["sm_120"]["mma_sync"] and not info["sm_120"]["wgmma"]
    assert info["sm_90a"]["wgmma"]  # Hopper's default build is a different kernel


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not __import__("os").path.exists("/usr/local/cuda/bin/nvcc"),
    reason="needs nvcc",
)
def test_topk_v1_built_for_both_targets(tmp_path):
    res = sm120.compare_builds("top-k v1", tmp_path)
    assert res["source_lines"]["sm_90a"] > 100
    assert res["code_path_diff"] == []  # no #if picks different top-k v1 code on sm_120
    assert any("kMaxVecBytes" in line for line in res["arch_valued_lines"])
    regs = {t: [r["registers"] for r in v] for t, v in res["resources"].items()}
    assert regs["sm_90a"] and regs["sm_120f"]


def test_arch_conditions_evaluate_per_target():
    assert (
        sm120._eval_condition("SGL_CUDA_ARCH >= 1000 && SGL_CUDA_ARCH < 1100", sm120.ARCH_MACROS["sm_120f"])
        is False
    )
    assert sm120._eval_condition("SGL_ARCH_BLACKWELL_OR_GREATER", sm120.ARCH_MACROS["sm_120f"]) is True
    assert sm120._eval_condition("SGL_ARCH_BLACKWELL_OR_GREATER", sm120.ARCH_MACROS["sm_90a"]) is False
    assert sm120._eval_condition("FOO_UNKNOWN > 1", sm120.ARCH_MACROS["sm_90a"]) is None
