"""The backend interface tier 2 runs through, and the CPU (exact torch emulation) backend.

A backend owns the four production steps whose correctness is in question: q quantization,
index-K store (per pool format), paged scoring and top-k selection. The runner never touches a
pool except through it, so the same tier-2 code measures either the emulation (CPU, CI) or the
production kernels (GPU, :mod:`verify.recall.gpu_backend`).

Faults (``--inject-fault``) are a harness self-test: they corrupt one store path the way real
bugs did, so a run can show that the gate and the diagnosis notice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from verify.core import formats as F
from verify.core.scoring import SlotKeys, grouped_row_logits, torch_select

FAULTS: dict[str, str] = {
    "bf16-slot-shift": "bf16 store writes every key one slot later within its page (bad slot mapping)",
    "fp8-slot-shift": "fp8 store writes every key one slot later within its page (bad slot mapping)",
    "fp8-interleaved": "fp8 store writes a token-interleaved page; readers expect block-planar (vllm #50576)",
}


def shift_slots(slots: torch.Tensor) -> torch.Tensor:
    """Move each slot to the next offset of its page (wrapping), i.e. a broken slot mapping."""
    slots = slots.long()
    return (slots // F.PAGE_SLOTS) * F.PAGE_SLOTS + (slots + 1) % F.PAGE_SLOTS


@dataclass
class QueryInputs:
    """What the production q kernel consumes, plus its fp32 emulation for the information oracle."""

    q_pre: torch.Tensor | None  # [Q,H,128] bf16, before RoPE and Hadamard
    cos: torch.Tensor | None  # [Q,32] fp32 RoPE cos at each query's position
    sin: torch.Tensor | None  # [Q,32] fp32
    q_rot: torch.Tensor | None  # [Q,H,128] fp32: RoPE + Hadamard of q_pre (unquantized q)
    w_raw: torch.Tensor | None  # [Q,H] bf16 head weights before weight_scale and q scale
    weight_scale: float


@dataclass
class Backend:
    """Base: fault handling and bookkeeping; subclasses implement the ``_``-prefixed steps."""

    device: torch.device
    faults: tuple[str, ...] = ()
    #: which implementation each step used, with reasons for fallbacks (goes into results.json)
    paths: dict[str, str] = field(default_factory=dict)
    name: str = "base"

    def __post_init__(self) -> None:
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {sorted(FAULTS)}")

    # -- public, fault-aware --------------------------------------------------------------------
    def new_pool(self, fmt: str, num_pages: int) -> torch.Tensor:
        return F.new_pool(fmt, num_pages, self.device)

    def store(self, fmt: str, pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
        if f"{fmt}-slot-shift" in self.faults:
            slots = shift_slots(slots)
        self._store(fmt, pool, slots, keys)
        if fmt == "fp8" and "fp8-interleaved" in self.faults:
            pool.copy_(F.fp8_to_interleaved(pool))

    def quantize_q(self, qi: QueryInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return self._quantize_q(qi)

    def score(
        self,
        fmt: str,
        pool: torch.Tensor,
        q_fp8: torch.Tensor,
        w: torch.Tensor,
        q_index: torch.Tensor,
        seq_lens: torch.Tensor,
        page_table: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[B, P*64]`` fp32; positions past ``seq_len`` hold -inf or garbage (the
        selection masks them, as production's top-k does)."""
        return self._score(fmt, pool, q_fp8, w, q_index, seq_lens, page_table)

    def select(
        self, logits: torch.Tensor, seq_lens: torch.Tensor, page_table: torch.Tensor, topk: int
    ) -> torch.Tensor:
        """Raw positions ``[B, topk]`` int64 chosen by the production top-k, ``-1`` padded."""
        return self._select(logits, seq_lens, page_table, topk)

    # -- implementation -------------------------------------------------------------------------
    def _store(self, fmt: str, pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
        raise NotImplementedError

    def _quantize_q(self, qi: QueryInputs) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _score(self, fmt, pool, q_fp8, w, q_index, seq_lens, page_table) -> torch.Tensor:
        raise NotImplementedError

    def _select(self, logits, seq_lens, page_table, topk) -> torch.Tensor:
        raise NotImplementedError


def decode_pool(fmt: str, pool: torch.Tensor, fp8_scorer: str = "fp8-fp32acc") -> SlotKeys:
    """Read every slot of a pool the way the emulated scorer for ``fmt`` reads it."""
    n = pool.shape[0] * F.PAGE_SLOTS
    slots = torch.arange(n, device=pool.device)
    if fmt == "fp8":
        codes, scale = F.fp8_read(pool, slots)
        return SlotKeys(F.fp8_codes_to_float(codes), scale, fp8_scorer)
    if fmt == "f32":
        return SlotKeys(F.f32_read(pool, slots), None, "fp32")
    if fmt == "fp4":
        return SlotKeys(F.fp4_read(pool, slots), None, "fp32")
    return SlotKeys(F.bf16_read(pool, slots), None, "fp32")


@dataclass
class EmulationBackend(Backend):
    """Exact torch emulation of upstream's fp8 store, the patched bf16 store, and the scorers.

    Runs on any device (the GPU backend reuses it for its emulated control arm).
    ``fp8_scorer`` picks the fp8 read semantics: ``fp8-fp32acc`` (DeepGEMM, the production
    default on Hopper/Blackwell) or ``fp8-torch`` (upstream's torch fallback).
    """

    fp8_scorer: str = "fp8-fp32acc"
    fp8_input_dtype: torch.dtype = torch.float32
    name: str = "cpu-emulation"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.paths.setdefault("q", "emulation of fused_q_indexer_rope_hadamard_quant (torch)")
        self.paths.setdefault("store_fp8", "emulation of fused_store_cache(type='indexer') (torch)")
        self.paths.setdefault("store_bf16", "emulation of DeepSeekV4IndexerPool.set_index_k_bf16 (torch)")
        self.paths.setdefault("score_fp8", f"emulation ({self.fp8_scorer})")
        self.paths.setdefault("score_bf16", "emulation of bf16_paged_mqa_logits (fp32)")
        self.paths.setdefault("select", "torch.topk with topk_transform_paged semantics")
        self.paths.setdefault(
            "store_fp4",
            "emulation of DeepSeekV4IndexerPool.set_index_fp4 (store_fp4_index_k_cache, rne=False)",
        )
        self.paths.setdefault("q_fp4", "emulation of fused_q_indexer_rope_hadamard_fp4_quant (torch)")
        self.paths.setdefault(
            "score_fp4",
            "emulation of deep_gemm.fp8_fp4_paged_mqa_logits (fp32; the kernel is SM100-only, "
            "none exists for Hopper)",
        )
        self.paths.setdefault(
            "reference",
            "DeepSeek inference/model.py indexer numerics: fp4 q x fp4 k in bf16, "
            "scores in fp64 (verify.core.deepseek_reference)",
        )
        self._decoded: dict[int, tuple[int, SlotKeys]] = {}

    def _store(self, fmt: str, pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
        if fmt == "fp8":
            F.fp8_store(pool, slots, keys.to(self.fp8_input_dtype))
        elif fmt == "f32":
            F.f32_store(pool, slots, keys)
        elif fmt == "fp4":
            F.fp4_store(pool, slots, keys.float())
        else:
            F.bf16_store(pool, slots, keys)
        self._decoded.pop(pool.data_ptr(), None)

    def _quantize_q(self, qi: QueryInputs) -> tuple[torch.Tensor, torch.Tensor]:
        assert qi.q_rot is not None and qi.w_raw is not None
        return F.quantize_q(qi.q_rot, qi.w_raw, qi.weight_scale)

    def _keys(self, fmt: str, pool: torch.Tensor) -> SlotKeys:
        # Decoding a whole pool per batch would dominate CPU time; cache it per pool buffer.
        key = pool.data_ptr()
        hit = self._decoded.get(key)
        if hit is None or hit[0] != pool.shape[0]:
            hit = (pool.shape[0], decode_pool(fmt, pool, self.fp8_scorer))
            self._decoded[key] = hit
        return hit[1]

    def _score(self, fmt, pool, q_fp8, w, q_index, seq_lens, page_table) -> torch.Tensor:
        return grouped_row_logits(self._keys(fmt, pool), q_fp8.float(), w, q_index, page_table, seq_lens)

    def _select(self, logits, seq_lens, page_table, topk) -> torch.Tensor:
        return torch_select(logits, seq_lens, topk)

    def forget(self, pools: Sequence[torch.Tensor]) -> None:
        for p in pools:
            self._decoded.pop(p.data_ptr(), None)
