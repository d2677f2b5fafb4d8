"""Drive upstream's production store entry points on the GPU (no re-implementations).

A case is prepared once: upstream's planner (``CompressorPrefillPlan`` / ``CompressorDecodePlan``
through ``sglang.test.kernels.deepseek_v4.common.make_paged_context``) and upstream's compress
kernel (``compress_forward``) produce the fp32 compressed keys exactly as the indexer compressor
does. Every arm then stores those same keys: ``compress_norm_rope_store`` with the fp8 store or
the bf16 store (the fused kernel), or the series' unfused bf16 path, into a canary-filled pool
buffer behind a shuffled page table. Only APIs that unpatched upstream also has are touched by
the fp8 arm, so the same code runs against the baseline tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from verify.core.store_cases import (
    COMPRESS_RATIO,
    DecodeCase,
    PrefillCase,
    key_index,
    rope_position,
)
from verify.core.store_layout import (
    SLOTS_PER_PAGE,
    IndexKLayout,
    fill_canary,
    make_page_table,
    slots_for_keys,
)

HEAD_DIM = 128
ROPE_DIM = 64
PAGE_SIZE = SLOTS_PER_PAGE  # indexer page: 64 compressed slots (one 256-token full page)
NORM_EPS = 1e-6
ROPE_THETA = 40000.0  # DeepSeek-V4's compress_rope_theta; any fixed table would do
SCORE_WIDTH = 2 * HEAD_DIM * 2  # c4 kv-score row: (kv, score) x overlap


@dataclass
class Prepared:
    """Compressed keys of one case, ready to be stored by any arm."""

    name: str
    plans: list[Any]  # upstream plan objects, one per prefill chunk (or one decode plan)
    kv: list[torch.Tensor]  # compress_forward output per plan, fp32 [rows, 128]
    out_loc: list[torch.Tensor]  # int64 per plan, indexed like the kernel indexes it
    store_rows: list[torch.Tensor]  # rows of kv[i] that must be stored (decode: boundary rows)
    positions: torch.Tensor  # RoPE position per stored key, concatenated over plans
    slots: torch.Tensor  # pool slot per stored key, concatenated over plans
    num_pages: int
    weight: torch.Tensor
    eps: float
    freqs_cis: torch.Tensor  # complex64 [max_pos, 32]
    seed: int
    scores: list[torch.Tensor]  # compress_forward input per plan (replayed by compressor-level arms)
    ape: torch.Tensor
    state_pool_pages: int  # compress state pool size; replays start from a fresh zeroed one
    info: dict[str, Any] = field(default_factory=dict)

    def stored_kv(self) -> torch.Tensor:
        """fp32 [num_keys, 128]: the compressed keys that must end up in the pool, in slot order."""
        parts = [kv[rows] for kv, rows in zip(self.kv, self.store_rows)]
        return torch.cat(parts) if parts else torch.empty(0, HEAD_DIM, device=self.weight.device)


def upstream_ops() -> dict[str, Any]:
    """Import upstream's entry points; an ImportError here names what the GPU machine lacks."""
    from sglang.kernels.ops.attention.dsv4.compress import (
        CompressorDecodePlan,
        CompressorPrefillPlan,
        compress_forward,
        compress_norm_rope_store,
    )
    from sglang.test.kernels.deepseek_v4.common import make_paged_context, make_state_pool

    return {
        "CompressorDecodePlan": CompressorDecodePlan,
        "CompressorPrefillPlan": CompressorPrefillPlan,
        "compress_forward": compress_forward,
        "compress_norm_rope_store": compress_norm_rope_store,
        "make_paged_context": make_paged_context,
        "make_state_pool": make_state_pool,
    }


def make_freqs_cis(max_pos: int, device: torch.device) -> torch.Tensor:
    """complex64 [max_pos, 32] rotation table (computed in fp64 on the CPU: deterministic)."""
    inv_freq = ROPE_THETA ** (-torch.arange(0, ROPE_DIM, 2, dtype=torch.float64) / ROPE_DIM)
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64).to(device)


def _gen(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _norm_weight(seed: int, device: torch.device) -> torch.Tensor:
    # Not all ones: a kernel that skips the weight must show up.
    return 1.0 + 0.25 * torch.randn(HEAD_DIM, generator=_gen(seed + 1, device), device=device)


def _ape(seed: int, device: torch.device) -> torch.Tensor:
    return 0.5 * torch.randn(2 * COMPRESS_RATIO, HEAD_DIM, generator=_gen(seed + 2, device), device=device)


def _compress(
    ops: dict[str, Any], state_pool: Any, score: torch.Tensor, ape: torch.Tensor, plan: Any
) -> torch.Tensor:
    """Upstream's C4 indexer compress step (head_dim 128, ratio 4) over one plan's scores."""
    kv: torch.Tensor = ops["compress_forward"](
        kv_score_buffer=state_pool,
        kv_score_input=score,
        ape=ape,
        plan=plan,
        head_dim=HEAD_DIM,
        compress_ratio=COMPRESS_RATIO,
    )
    return kv


# Upstream's convention: rows that store no key (decode rows inside a window, prefill tokens that
# close none) carry out_loc 0, a slot the allocator never hands out. The fused kernel skips them;
# the unfused path writes zeros there to keep shapes static. Page 0 is therefore kept out of
# every page table, and what lands in it is checked per arm.
DUMP_SLOT = 0


def _pool_pages(num_logical_pages: int) -> int:
    """Pool pages: the used ones, the dump page 0, and spare pages that must stay canary-only."""
    return num_logical_pages + max(3, num_logical_pages // 4) + 1


def _decode_plan_fields(plan_tensor: torch.Tensor) -> dict[str, list[int]]:
    """seq_len and ragged_id as upstream's plan structs lay them out (compress_v2.cuh)."""
    raw = plan_tensor.cpu()
    seq_len = raw[:, 0:4].contiguous().view(torch.int32).flatten()
    ragged = raw[:, 4:6].contiguous().view(torch.int16).flatten().to(torch.int32) & 0xFFFF
    return {"seq_len": seq_len.tolist(), "ragged_id": ragged.tolist()}


def prepare_prefill(
    ops: dict[str, Any], case: PrefillCase, freqs_cis: torch.Tensor, device: torch.device
) -> Prepared:
    """Plan and compress every chunk of ``case`` with upstream's kernels; pick slots and out_loc."""
    if case.seq_len + COMPRESS_RATIO > freqs_cis.shape[0]:
        raise ValueError(
            f"freqs_cis has {freqs_cis.shape[0]} rows, case needs {case.seq_len + COMPRESS_RATIO}"
        )
    swa_pages = -(-case.seq_len // 256) + 1
    ctx = ops["make_paged_context"](
        bs=1,
        compress_ratio=COMPRESS_RATIO,
        head_dim=HEAD_DIM,
        num_swa_pages_per_req=swa_pages,
        max_tokens_per_req=swa_pages * 256,
        num_reqs_capacity=1,
    )
    state_pool = ops["make_state_pool"](ctx.num_pages, COMPRESS_RATIO, HEAD_DIM)
    num_pages = _pool_pages(case.num_logical_pages)
    page_table = make_page_table(
        case.num_logical_pages, num_pages, torch.Generator().manual_seed(case.seed), (0,)
    )
    gen = _gen(case.seed, device)
    ape = _ape(case.seed, device)

    plans, kvs, out_locs, rows, positions, slots, scores = [], [], [], [], [], [], []
    for chunk in case.chunks:
        plan = ctx.make_prefill_plan(
            torch.tensor([chunk.seq_len], dtype=torch.int64),
            torch.tensor([chunk.extend_len], dtype=torch.int64),
            chunk.extend_len,
        )
        score = torch.randn(chunk.extend_len, SCORE_WIDTH, generator=gen, device=device)
        kv = _compress(ops, state_pool, score, ape, plan)
        key_pos = chunk.key_positions()
        fields = _decode_plan_fields(plan[1])
        expected_seq = [p + 1 for p in key_pos]
        expected_ragged = [p - chunk.prefix_len for p in key_pos]
        if (
            fields["seq_len"] != expected_seq
            or fields["ragged_id"] != expected_ragged
            or kv.shape[0] != len(key_pos)
        ):
            raise RuntimeError(
                f"{case.name}: upstream planner disagrees with the case model at chunk {chunk}: "
                f"{len(fields['seq_len'])} plan rows, {kv.shape[0]} kv rows, expected {len(key_pos)}"
            )
        keys = torch.tensor([key_index(p) for p in key_pos], dtype=torch.int64, device=device)
        key_slots = slots_for_keys(page_table.to(device), keys)
        out_loc = torch.full((chunk.extend_len,), DUMP_SLOT, device=device, dtype=torch.int64)
        out_loc[torch.tensor(expected_ragged, dtype=torch.int64, device=device)] = key_slots
        plans.append(plan)
        scores.append(score)
        kvs.append(kv)
        out_locs.append(out_loc)
        rows.append(torch.arange(kv.shape[0], device=device))
        positions.append(torch.tensor([rope_position(p) for p in key_pos], dtype=torch.int64, device=device))
        slots.append(key_slots)

    return Prepared(
        name=case.name,
        plans=plans,
        kv=kvs,
        out_loc=out_locs,
        store_rows=rows,
        positions=torch.cat(positions),
        slots=torch.cat(slots),
        num_pages=num_pages,
        weight=_norm_weight(case.seed, device),
        eps=NORM_EPS,
        freqs_cis=freqs_cis,
        seed=case.seed,
        scores=scores,
        ape=ape,
        state_pool_pages=int(state_pool.shape[0]),
        info={"tokens": case.seq_len, "chunks": len(case.chunks), "pool_pages": num_pages},
    )


def prepare_decode(
    ops: dict[str, Any], case: DecodeCase, freqs_cis: torch.Tensor, device: torch.device
) -> Prepared:
    """One decode step for a batch of requests, each with its own shuffled pages."""
    bs = len(case.seq_lens)
    max_len = max(case.seq_lens)
    swa_pages = -(-max_len // 256) + 1
    ctx = ops["make_paged_context"](
        bs=bs,
        compress_ratio=COMPRESS_RATIO,
        head_dim=HEAD_DIM,
        num_swa_pages_per_req=swa_pages,
        max_tokens_per_req=swa_pages * 256,
        num_reqs_capacity=bs,
    )
    state_pool = ops["make_state_pool"](ctx.num_pages, COMPRESS_RATIO, HEAD_DIM)
    pages_per_req = -(-max_len // (COMPRESS_RATIO * PAGE_SIZE))
    num_pages = _pool_pages(bs * pages_per_req)
    page_table = make_page_table(
        bs * pages_per_req, num_pages, torch.Generator().manual_seed(case.seed), (0,)
    )
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int64, device=device)
    plan = ctx.make_decode_plan(seq_lens)
    score = torch.randn(bs, SCORE_WIDTH, generator=_gen(case.seed, device), device=device)
    ape = _ape(case.seed, device)
    kv = _compress(ops, state_pool, score, ape, plan)
    writers = [r for r in range(bs) if case.writes_key(r)]
    keys = torch.tensor([key_index(case.seq_lens[r] - 1) for r in writers], dtype=torch.int64, device=device)
    owners = torch.tensor(writers, dtype=torch.int64, device=device)
    # Request r owns logical pages [r * pages_per_req, (r + 1) * pages_per_req) of the table.
    key_slots = slots_for_keys(page_table.to(device), keys + owners * pages_per_req * PAGE_SIZE)
    out_loc = torch.full((bs,), DUMP_SLOT, device=device, dtype=torch.int64)
    out_loc[owners] = key_slots
    return Prepared(
        name=case.name,
        plans=[plan],
        kv=[kv],
        out_loc=[out_loc],
        store_rows=[owners],
        positions=torch.tensor(
            [rope_position(case.seq_lens[r] - 1) for r in writers], dtype=torch.int64, device=device
        ),
        slots=key_slots,
        num_pages=num_pages,
        weight=_norm_weight(case.seed, device),
        eps=NORM_EPS,
        freqs_cis=freqs_cis,
        seed=case.seed,
        scores=[score],
        ape=ape,
        state_pool_pages=int(state_pool.shape[0]),
        info={"batch": bs, "writing_rows": len(writers), "pool_pages": num_pages},
    )


def new_pool_buffer(
    prepared: Prepared, layout: IndexKLayout, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A canary-filled 2-D uint8 pool buffer for ``layout`` and the canary copy to compare with."""
    buffer = torch.empty(prepared.num_pages, layout.page_bytes, dtype=torch.uint8, device=device)
    return buffer, fill_canary(buffer, prepared.seed + 7)


def store_fused(ops: dict[str, Any], prepared: Prepared, buffer: torch.Tensor, bf16_store: bool) -> None:
    """Upstream's fused norm + RoPE + Hadamard + store, fp8 (``bf16_store=False``) or bf16."""
    for plan, kv, out_loc in zip(prepared.plans, prepared.kv, prepared.out_loc):
        ops["compress_norm_rope_store"](
            kv,
            plan,
            norm_weight=prepared.weight,
            norm_eps=prepared.eps,
            freq_cis=prepared.freqs_cis,
            out_loc=out_loc,
            kvcache=buffer,
            page_size=PAGE_SIZE,
            bf16_store=bf16_store,
        )


PreparedCase = PrefillCase | DecodeCase


def max_position(cases: list[PreparedCase]) -> int:
    """Rows the rotation table needs for all ``cases``."""
    longest = 0
    for case in cases:
        longest = max(longest, case.seq_len if isinstance(case, PrefillCase) else max(case.seq_lens))
    return int(math.ceil((longest + COMPRESS_RATIO) / 1024) * 1024)
