"""The forward tier's oracles: DeepSeek-V4's reference math, one shot, in fp32 / fp64.

- :func:`reference_keys`: the C4 index keys of a whole token sequence compressed in one call
  (never chunked, never incremental): ``kv = x Wkv``, ``score = x Wgate + ape``, each key pools
  its own 4 tokens' second-half projections and the previous 4 tokens' first-half projections
  under a per-dimension softmax over the 8, then RMSNorm, RoPE on the last 64 dims at position
  ``4 i`` and the 128-point Hadamard transform -- all in fp32, rounded only when a pool format
  is asked for. The norm / RoPE / Hadamard tail is :func:`verify.core.store_reference.
  index_k_reference`, the same math tier 1 checks the store kernels against.
- :func:`reference_q`: the indexer query before any quantization (``q_lora Wq_b``, RoPE at the
  token's position, Hadamard) and the head weights ``x Wproj * 128^-0.5 * 64^-0.5``.
- :func:`scores64`: ``sum_h relu(q_h . k) w_h`` in fp64.
- :func:`reference_indexer`: DeepSeek's reference indexer numerics over the reference keys (fp4 q x
  fp4 k in a bf16 container, :mod:`verify.core.deepseek_reference`): the selection the model
  was trained with, a third oracle beside the same-input and exact ones (reported, not gated).
"""

from __future__ import annotations

import torch

from verify.core.deepseek_reference import ReferenceIndexer, dense_page_table, pad_to_pages
from verify.core.rig import INDEX_HEADS, RATIO, Weights
from verify.core.store_reference import INDEX_HEAD_DIM, fwht, index_k_reference, rope_tail

WEIGHT_SCALE = INDEX_HEAD_DIM**-0.5 * INDEX_HEADS**-0.5


def compressed_kv(x: torch.Tensor, w: Weights) -> torch.Tensor:
    """``[T, hidden]`` tokens -> ``[T // 4, 128]`` fp32 pooled kv (before norm): one shot."""
    d = INDEX_HEAD_DIM
    n_keys = x.shape[0] // RATIO
    xf = x[: n_keys * RATIO].float()
    kv = (xf @ w.wkv.to(xf.device).T).view(n_keys, RATIO, 2 * d)
    score = (xf @ w.wgate.to(xf.device).T).view(n_keys, RATIO, 2 * d) + w.ape.to(xf.device)
    # Window i: the previous window's first-half dims (overlap) then its own second half.
    kv8 = kv.new_zeros(n_keys, 2 * RATIO, d)
    sc8 = score.new_full((n_keys, 2 * RATIO, d), float("-inf"))
    kv8[:, RATIO:] = kv[:, :, d:]
    sc8[:, RATIO:] = score[:, :, d:]
    kv8[1:, :RATIO] = kv[:-1, :, :d]
    sc8[1:, :RATIO] = score[:-1, :, :d]
    return (kv8 * sc8.softmax(dim=1)).sum(dim=1)


def reference_keys(x: torch.Tensor, w: Weights, freqs_cis: torch.Tensor) -> torch.Tensor:
    """The index keys of tokens ``x`` (a request's whole sequence so far), fp32 ``[T // 4, 128]``."""
    kv = compressed_kv(x, w)
    positions = torch.arange(kv.shape[0], device=kv.device) * RATIO
    return index_k_reference(kv, w.norm.to(kv.device), w.eps, freqs_cis.to(kv.device), positions)


def reference_q(
    x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor, w: Weights, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (unquantized) indexer query ``[T, 64, 128]`` and head weights ``[T, 64]``, fp32."""
    t = q_lora.shape[0]
    q = (q_lora.float() @ w.wq_b.to(q_lora.device).T).view(t * INDEX_HEADS, INDEX_HEAD_DIM)
    freqs = freqs_cis.to(q.device)[positions.long()].repeat_interleave(INDEX_HEADS, dim=0)
    q = fwht(rope_tail(q, freqs)) * INDEX_HEAD_DIM**-0.5
    weights = (x.float() @ w.weights_proj.to(x.device).T) * WEIGHT_SCALE
    return q.view(t, INDEX_HEADS, INDEX_HEAD_DIM), weights


def scores64(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``[R, H, 128]`` q, ``[R, H]`` weights, ``[K, 128]`` keys -> ``[R, K]`` fp64 index scores."""
    dots = torch.einsum("rhd,kd->rhk", q.double(), keys.double()).relu_()
    return torch.einsum("rhk,rh->rk", dots, w.double())


def reference_indexer(ref_keys: torch.Tensor) -> ReferenceIndexer:
    """DeepSeek's reference indexer over a request's fp32 reference keys ``[K, 128]`` (already
    normed, RoPE'd and rotated: it adds the bf16 container and the fp4 rounding)."""
    return ReferenceIndexer.of(pad_to_pages(ref_keys.float()))


def reference_selection(
    indexer: ReferenceIndexer, q_exact: torch.Tensor, w_exact: torch.Tensor, n_keys: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``q_exact [R, H, 128]`` / ``w_exact [R, H]`` all seeing the first ``n_keys`` keys:
    the reference's scores ``[R, n_keys]`` and its top-``k`` ``[R, k]`` (-1 padded)."""
    rows = q_exact.shape[0]
    dev = indexer.keys.values.device
    scores, chosen = indexer.select(
        q_exact.to(dev),
        w_exact.to(dev),
        torch.arange(rows, device=dev),
        dense_page_table(n_keys, rows, dev),
        torch.full((rows,), n_keys, dtype=torch.int32, device=dev),
        torch.full((rows,), k, dtype=torch.int64, device=dev),
    )
    return scores[:, :n_keys], chosen
