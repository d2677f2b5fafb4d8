"""The forward tier's scaffold on CPU: upstream's real pool, DeepSeek-V4 attention backend and
C4Indexer build as the tier builds them on the GPU; ForwardBatches of every mode are well formed;
and PD disaggregation's buffer descriptors move a request's index-K pages between two real pools
with different page assignments, for fp8 and bf16 -- and a wrong descriptor is caught."""

import pytest
import torch

from verify.core import platform as P
from verify.core.rig import PAGE_TOKENS, Rig, RigConfig
from verify.forward import pd


@pytest.fixture
def make_rig():
    rigs = []

    def make(flag: bool, seed: int = 1234, draft_tokens: int = 0) -> Rig:
        cfg = RigConfig(
            device="cpu",
            flag=flag,
            max_reqs=4,
            full_tokens=1 << 14,
            max_context_len=1 << 13,
            topk_backend="torch",
            seed=seed,
            draft_tokens=draft_tokens,
        )
        rig = Rig(cfg, (9, 0))
        rigs.append(rig)
        return rig

    with P.applied("sm90"):
        yield make
        for rig in reversed(rigs):
            rig.close()


@pytest.mark.parametrize("flag, fmt, row_bytes", [(True, "bf16", 16384), (False, "fp8", 8448)])
def test_rig_is_upstreams_objects(make_rig, flag, fmt, row_bytes):
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
    from sglang.srt.layers.attention.dsv4.indexer import C4Indexer

    rig = make_rig(flag)
    assert isinstance(rig.backend, DeepseekV4AttnBackend) and isinstance(rig.indexer, C4Indexer)
    assert rig.pool.index_k_format(0) == fmt
    assert rig.pool.get_index_k_with_scale_buffer(0).shape[1] == row_bytes
    assert rig.indexer.use_bf16_index_k is flag
    # the ape went in through the module's own loader (its layout hotfix applied)
    assert rig.indexer.compressor.ape_converted
    assert any("_create_flashmla_metadata" in r for r in rig.replaced)


def test_requests_interleave_and_reuse_pages(make_rig):
    rig = make_rig(True)
    a, b = rig.new_request(1), rig.new_request(2)
    rig.reserve(a, 3 * PAGE_TOKENS)
    rig.reserve(b, 2 * PAGE_TOKENS)
    assert not set(a.pages) & set(b.pages) and 0 not in a.pages + b.pages
    row = rig.runner.req_to_token_pool.req_to_token[a.rid]
    assert int(row[PAGE_TOKENS + 5]) == a.pages[1] * PAGE_TOKENS + 5
    freed = list(a.pages)
    rig.finish(a)
    c = rig.new_request(3)
    rig.reserve(c, PAGE_TOKENS)
    assert c.pages[0] == freed[0]  # the finished request's page, keys left in it


def test_batches_of_every_mode(make_rig):
    rig = make_rig(True)
    a, b = rig.new_request(1), rig.new_request(2)
    fb = rig.batch([a, b], [300, 5], "mixed")
    assert fb.forward_mode.name == "MIXED" and fb.extend_seq_lens_cpu == [300, 5]
    assert fb.positions.tolist()[:2] == [0, 1] and fb.out_cache_loc.numel() == 305
    rig.commit([a, b], [300, 5])
    fb = rig.batch([a, b], [1, 1], "decode")
    assert fb.seq_lens.tolist() == [301, 6] and fb.positions.tolist() == [300, 5]
    x, q = rig.inputs([a, b], [1, 1])
    assert x.shape == (2, rig.cfg.hidden_size) and q.dtype == torch.bfloat16


def test_target_verify_batch(make_rig):
    rig = make_rig(True, draft_tokens=2)
    a = rig.new_request(1)
    rig.commit([a], [0])
    a.length = 700
    fb = rig.batch([a], [2], "target_verify")
    assert fb.forward_mode.name == "TARGET_VERIFY" and fb.seq_lens.tolist() == [700]
    assert fb.spec_info.draft_token_num == 2 and fb.positions.tolist() == [700, 701]


@pytest.mark.parametrize("flag", [False, True])
def test_pd_descriptors_move_every_page(make_rig, flag):
    src_rig, dst_rig = make_rig(flag), make_rig(flag, seed=99)
    src, dst = src_rig.new_request(3), dst_rig.new_request(3)
    src_rig.reserve(src, 5200)
    dst_rig.reserve(dst, 5200)
    assert src.pages != dst.pages
    rows = src_rig.pool.get_index_k_with_scale_buffer(0)
    rows.copy_(
        torch.randint(0, 256, rows.shape, generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    )
    target = dst_rig.pool.get_index_k_with_scale_buffer(0)
    target.fill_(0xAB)
    canary = dst_rig.free_pages[:5]
    before = target[canary].clone()
    moved = pd.transfer(src_rig.pool, dst_rig.pool, src.pages, dst.pages)
    cmp = pd.compare_indexer_pages(src_rig.pool, dst_rig.pool, src.pages, dst.pages, canary, before)
    assert cmp.ok and cmp.pages == 21
    assert rows.shape[1] in moved.item_lens


def test_a_wrong_descriptor_is_caught(make_rig, monkeypatch):
    """An fp8 item size on a bf16 pool: the first page lands, the rest do not."""
    src_rig, dst_rig = make_rig(True), make_rig(True, seed=99)
    src, dst = src_rig.new_request(3), dst_rig.new_request(3)
    src_rig.reserve(src, 5200)
    dst_rig.reserve(dst, 5200)
    rows = src_rig.pool.get_index_k_with_scale_buffer(0)
    rows.copy_(
        torch.randint(0, 256, rows.shape, generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    )
    real = type(src_rig.pool).get_contiguous_buf_infos

    def fp8_item_len(self):
        ptrs, lens, items = real(self)
        return ptrs, lens, [8448 if i == 16384 else i for i in items]

    monkeypatch.setattr(type(src_rig.pool), "get_contiguous_buf_infos", fp8_item_len)
    pd.transfer(src_rig.pool, dst_rig.pool, src.pages, dst.pages)
    cmp = pd.compare_indexer_pages(src_rig.pool, dst_rig.pool, src.pages, dst.pages, [], torch.empty(0))
    assert not cmp.ok and cmp.identical_pages < cmp.pages
