"""The reference oracle (DeepSeek's fp4 q x fp4 k numerics) and upstream's own fp4 indexer, held
to the pinned upstream: its Triton fp4 store run in the interpreter on CPU, its torch fp4 fake
quant, and the CUDA q kernel's source; and the tie rule that tells the two apart."""

import re

import pytest
import torch

from verify.core import formats as F
from verify.core import upstream as U
from verify.core.deepseek_reference import (
    ReferenceIndexer,
    dense_page_table,
    fp4_rule_differences,
    pad_to_pages,
)
from verify.recall.generator import GenConfig, hadamard, make_haystack

TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def test_upstream_rounds_three_of_the_seven_midpoints_toward_zero_where_the_reference_rounds_to_even():
    x = torch.tensor(TIES + [-t for t in TIES])
    upstream = F.fp4_code_values(F.fp4_upstream_codes(x))
    reference = F.round_e2m1(x)
    assert upstream[:7].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert reference[:7].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert torch.equal(upstream[7:], -upstream[:7]) and torch.equal(reference[7:], -reference[:7])
    off = torch.tensor([0.3, 0.8, 1.3, 1.8, 2.6, 3.6, 5.1, 6.5])  # off the midpoints both are nearest
    assert torch.equal(F.fp4_code_values(F.fp4_upstream_codes(off)), F.round_e2m1(off.clamp(max=6)))
    assert F.fp4_upstream_codes(torch.tensor([-0.1])).item() == 0  # no negative zero


def _sglang():
    if U.sglang_root() is None:
        pytest.skip("the patched upstream tree is not importable (run nox -s apply)")


def _keys_with_ties(n: int = 61) -> torch.Tensor:
    """Structured keys in fp32, plus rows whose blocks (amax 6, scale 1) sit exactly on the ties."""
    keys = make_haystack(GenConfig(seed=3), 4 * n, 0, n)
    tie_rows = torch.tensor(TIES + [6.0] * 25).repeat(4)[None, :] * torch.tensor([[1.0], [-1.0], [0.5]])
    return torch.cat([keys, tie_rows])


def test_the_fp4_store_emulation_writes_upstreams_c4_pool_bytes():
    """upstream's ``store_fp4_index_k_cache(rne=False)`` (what the C4 pool's ``set_index_fp4``
    calls) in Triton's interpreter against formats.fp4_store: the same 68-B pages, byte for byte."""
    _sglang()
    import inspect

    from sglang.kernels.ops.attention.dsv4.fp4_indexer import store_fp4_index_k_cache
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool

    # the C4 pool keeps threshold rounding (only the low-ratio pools switch to rne)
    assert "self.index_k_rne = False" in inspect.getsource(DeepSeekV4IndexerPool.__init__)
    assert "rne=self.index_k_rne" in inspect.getsource(DeepSeekV4IndexerPool.set_index_fp4)
    keys = _keys_with_ties()
    pages = -(-keys.shape[0] // F.PAGE_SLOTS) + 2
    slots = torch.randperm(pages * F.PAGE_SLOTS, generator=torch.Generator().manual_seed(1))[: keys.shape[0]]
    theirs = F.new_pool("fp4", pages)
    store_fp4_index_k_cache(keys, theirs, slots, page_size=F.PAGE_SLOTS, rne=False)
    ours = F.new_pool("fp4", pages)
    F.fp4_store(ours, slots, keys)
    assert theirs.shape == (pages, 64 * 68) and torch.equal(ours, theirs)
    # read back: the scorer's view is the grid values times the block scales, and the tie rows
    # took the grid point nearer zero
    got = F.fp4_read(ours, slots)
    assert got[-3, :7].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    # the reference's rounding is upstream's other mode (rne=True, its low-ratio V4.1 pools)
    rne = F.new_pool("fp4", pages)
    store_fp4_index_k_cache(keys, rne, slots, page_size=F.PAGE_SLOTS, rne=True)
    assert torch.equal(F.fp4_read(rne, slots), F.fp4_sim(keys))
    assert not torch.equal(rne, theirs)


def test_the_reference_fp4_is_upstreams_torch_fake_quant_on_the_bf16_container():
    """upstream's pure-torch ``fake_quant_fp4`` (per-32 ue8m0, ties to even: the reference's
    ``fp4_act_quant``) applied to the bf16 tensor the reference holds = formats.fp4_reference."""
    _sglang()
    from sglang.kernels.ops.attention.dsv4.torch_quant import FP4_AMAX_FLOOR, fake_quant_fp4

    assert FP4_AMAX_FLOOR == F.FP4_AMAX_FLOOR
    x = torch.cat([_keys_with_ties(), torch.randn(64, 128) * torch.exp(2 * torch.randn(64, 1))])
    theirs = fake_quant_fp4(x.to(torch.bfloat16))
    assert theirs.dtype == torch.bfloat16
    assert torch.equal(theirs.float(), F.fp4_reference(x))


def test_the_fp4_q_emulation_follows_the_pinned_q_kernels_source():
    """The CUDA q kernel cannot run here: its source is read instead -- the thresholds, the amax
    floor before the division by 6, the bf16 rounding of the Hadamard output and the head weights
    without a q scale."""
    _sglang()
    src = (U.sglang_root() / "kernels/jit/csrc/deepseek_v4/main_norm_rope.cuh").read_text()
    quant = src[src.index("uint8_t quant_fp4_e2m1(float x)") :]
    quant = quant[: quant.index("}")]
    assert (
        tuple(float(t) for t in re.findall(r"idx \+= ax > ([\d.]+)f;", quant)) == F.E2M1_UPSTREAM_THRESHOLDS
    )
    kernel = src[src.index("fused_q_indexer_rope_hadamard_fp4_quant(const") :]
    kernel = kernel[: kernel.index("struct FusedQIndexerRopeHadamardFp4QuantKernel")]
    assert (
        "fmaxf(1e-4f, local_max) / 6.0f" in kernel and "warp::reduce_max<8>" in kernel
    )  # 8 lanes x 4 = 32 values
    after_hadamard = kernel.split("data[i] *= kHadamardScale;")[1]
    assert after_hadamard.lstrip().startswith(
        "#pragma unroll\n    for (int i = 0; i < kVecSize; ++i)\n"
        "      data[i] = cast<float>(cast<DType>(data[i]));"
    )
    assert "params.weights_out[work_id] = weight_val * params.weight_scale;" in kernel
    # and the emulation on a q whose blocks sit on the ties (amax 6 -> scale 1)
    q = torch.tensor(TIES + [6.0] * 25).repeat(4).view(1, 1, 128)
    assert F.fp4_upstream_q(q)[0, 0, :7].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert F.fp4_reference(q)[0, 0, :7].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_the_reference_selection_is_relu_weighted_head_sum_of_fp4_q_and_fp4_k():
    """ReferenceIndexer against the reference's formula written out densely: keys and q rounded to
    bf16 then fp4, head weights to bf16, ``sum_h relu(q_h . k) w_h``, top-k of the visible keys."""
    g = torch.Generator().manual_seed(5)
    keys = make_haystack(GenConfig(seed=5), 4 * 700, 0, 700)
    q = torch.randn(3, 64, 128, generator=g) @ hadamard()
    w = torch.randn(3, 64, generator=g) * 0.01
    lens = torch.tensor([700, 600, 300], dtype=torch.int32)
    topk = torch.tensor([512, 256, 512])
    indexer = ReferenceIndexer.of(pad_to_pages(keys))
    scores, chosen = indexer.select(q, w, torch.arange(3), dense_page_table(700, 3), lens, topk)
    kq, qq = F.fp4_sim(keys.to(torch.bfloat16).float()), F.fp4_sim(q.to(torch.bfloat16).float())
    wq = w.to(torch.bfloat16).double()
    for r in range(3):
        n, k = int(lens[r]), int(topk[r])
        want = torch.relu(qq[r].double() @ kq[:n].double().T).T @ wq[r]
        torch.testing.assert_close(scores[r, :n].double(), want, rtol=1e-6, atol=0)
        assert torch.isneginf(scores[r, n:]).all()
        picked = chosen[r][chosen[r] >= 0]
        if n <= k:  # every key, as upstream's and the reference's top-k take them
            assert sorted(picked.tolist()) == list(range(n))
        else:
            kth = want.topk(k).values[-1]
            assert picked.numel() == k and bool((want[picked] >= kth * (1 - 1e-6)).all())
    # Hadamard-rotated inputs: the generator's transform is the orthonormal one the reference uses
    h = hadamard().double()
    torch.testing.assert_close(h @ h.T, torch.eye(128, dtype=torch.float64))
    torch.testing.assert_close(h.abs(), torch.full_like(h, 128**-0.5))


def test_upstreams_fp4_and_the_reference_round_a_few_values_differently():
    keys = make_haystack(GenConfig(seed=9), 4 * 2048, 0, 2048)
    q = torch.randn(8, 64, 128, generator=torch.Generator().manual_seed(9)) @ hadamard()
    diff = fp4_rule_differences(q, keys)
    # q: both start from the same bf16 values, only the ties differ (~1/128 of values in a binade)
    assert 0.001 < diff["q_values_rounded_differently"] < 0.02
    # keys: upstream quantizes the compressor's fp32 output, the reference its bf16 copy
    assert 0.001 < diff["key_values_rounded_differently"] < 0.02
    exact = F.fp4_sim(keys).to(torch.bfloat16).float()  # values both grids hold: no difference
    assert fp4_rule_differences(F.fp4_reference(q), exact) == {
        "q_values_rounded_differently": 0.0,
        "key_values_rounded_differently": 0.0,
    }
