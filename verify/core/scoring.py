"""Indexer score math in torch: the fp32 oracle and the emulated production scorers.

All scorers compute ``logit[j] = sum_h relu(q[h] . k[j]) * w[h]`` with ``q`` the e4m3 codes (the
q scale lives in ``w``), differing only in how ``k`` is read and how the per-head dots are rounded:

* ``fp32``: dots of exact values, head sum, one fp32 result. This is the oracle on unrounded keys
  and, on decoded bf16 / fp4-sim keys, the bf16 Triton kernel's math (fp8 x bf16 products are
  exact in fp32; the kernel's fp32 accumulation order is the only difference).
* ``fp8-fp32acc``: DeepGEMM's fp8 math, ``(sum_h relu(q[h] . code[j]) * w[h]) * scale[j]``.
* ``fp8-torch``: upstream's ``fp8_paged_mqa_logits_torch``, whose bf16 ``bmm`` rounds each
  per-head dot to bf16 before the ReLU.

Keys are addressed through the page table exactly as the paged kernels do
(``slot = page_table[r, j // 64] * 64 + j % 64``), but the dots are computed once per (query,
slot) and gathered per row: rows of one query share a haystack, so this is the same math at a
fraction of the cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import PAGE_SLOTS

SCORER_KINDS = ("fp32", "fp8-fp32acc", "fp8-torch")


@dataclass
class SlotKeys:
    """Keys as a scorer reads them, indexed by physical slot."""

    values: torch.Tensor  # [num_slots, 128] fp32: exact key values (fp8: the codes, unscaled)
    scale: torch.Tensor | None = None  # [num_slots] fp32 per-key scale (fp8 only)
    kind: str = "fp32"

    @property
    def num_slots(self) -> int:
        return int(self.values.shape[0])


def score_slots(keys: SlotKeys, slots: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 scores of ``slots`` for one query: ``q [H,128]`` (code values), ``w [H]``.

    Accumulated in fp64 and rounded once: an fp32 GEMM's rounding depends on the matrix shape
    (BLAS picks kernels by size), which would make a key's score -- and near-tie selections --
    depend on how rows were batched or grouped. fp64 keeps every emulated score (and the oracle)
    a function of the key and the query alone, on any device.
    """
    k = keys.values[slots].double()
    dots = k @ q.double().t()
    if keys.kind == "fp8-torch":
        # bf16 bmm: exact products, accumulated, result rounded to bf16 (upstream's fallback).
        dots = dots.to(torch.bfloat16).double()
    s = torch.relu(dots) @ w.double()
    if keys.scale is not None:
        s = s * keys.scale[slots].double()
    return s.float()


def row_slots(page_table: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` page table -> ``[B, P*64]`` physical slot of every logical position."""
    ar = torch.arange(PAGE_SLOTS, device=page_table.device)
    return (page_table.long().unsqueeze(-1) * PAGE_SLOTS + ar).flatten(1)


def mask_past_len(logits: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Set positions ``>= seq_len`` to -inf (in place) and return ``logits``."""
    pos = torch.arange(logits.shape[1], device=logits.device)
    logits.masked_fill_(pos.unsqueeze(0) >= seq_lens.long().unsqueeze(1), float("-inf"))
    return logits


def grouped_row_logits(
    keys: SlotKeys,
    q: torch.Tensor,
    w: torch.Tensor,
    q_index: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_chunk: int = 65536,
) -> torch.Tensor:
    """Paged logits ``[B, P*64]`` (-inf past each row's length) for rows reading ``keys``.

    ``q [Q,H,128]`` / ``w [Q,H]`` are per query, ``q_index [B]`` maps rows to queries.
    """
    slots_per_row = row_slots(page_table)
    out = torch.empty(slots_per_row.shape, dtype=torch.float32, device=keys.values.device)
    for u in torch.unique(q_index).tolist():
        rows = (q_index == u).nonzero(as_tuple=True)[0]
        need = torch.unique(slots_per_row[rows])
        vec = torch.empty(keys.num_slots, dtype=torch.float32, device=keys.values.device)
        for start in range(0, need.numel(), slot_chunk):
            part = need[start : start + slot_chunk]
            vec[part] = score_slots(keys, part, q[u].float(), w[u].float())
        out[rows] = vec[slots_per_row[rows]]
    return mask_past_len(out, seq_lens)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity ``1 - 2 sum(xy) / sum(x^2 + y^2)`` in float64 (0 = identical)."""
    x = x.double()
    y = y.double()
    denom = (x * x + y * y).sum()
    if denom == 0:
        return 0.0
    return float(1.0 - 2.0 * (x * y).sum() / denom)


def torch_select(logits: torch.Tensor, seq_lens: torch.Tensor, topk: int) -> torch.Tensor:
    """Production selection semantics in torch (``topk_transform_paged_torch``'s contract):
    k = min(topk, seq_len); rows with seq_len <= topk take 0..seq_len-1 (no scores read)."""
    b, width = logits.shape
    seq = seq_lens.long().unsqueeze(1)
    pos = torch.arange(width, device=logits.device).unsqueeze(0)
    masked = logits.masked_fill(pos >= seq, float("-inf"))
    kk = min(topk, width)
    idx = masked.topk(kk, dim=1, sorted=False).indices
    if kk < topk:
        idx = torch.cat([idx, idx.new_full((b, topk - kk), -1)], dim=1)
    sequential = torch.arange(topk, device=logits.device).unsqueeze(0).expand(b, -1)
    short = seq <= topk
    out = torch.where(short, sequential, idx)
    valid = torch.arange(topk, device=logits.device).unsqueeze(0) < seq.clamp(max=topk)
    return torch.where(valid, out, torch.full_like(out, -1)).long()
