"""DeepSeek-V4's reference indexer numerics: the selection its ``inference/model.py`` makes.

What the reference does in the C4 indexer (DeepSeek-V4 ``inference/model.py``):

* ``Compressor.forward`` with ``rotate=True`` (the indexer's own compressor): RMSNorm of the
  pooled kv in bf16, RoPE on the last 64 dims, ``rotate_activation`` (the orthonormal 128-point
  Hadamard, scale ``128**-0.5``), then ``fp4_act_quant(kv, fp4_block_size, True)`` -- a
  quantize-dequantize written back into the bf16 tensor -- before ``kv_cache[...] = kv``;
* ``Indexer.forward``: ``q = wq_b(qr)``, RoPE, ``rotate_activation(q)``, ``fp4_act_quant(q,
  fp4_block_size, True)``; ``weights = weights_proj(x) * (softmax_scale * n_heads ** -0.5)``
  (bf16); ``index_score = einsum(q, kv_cache)``, ``(relu(index_score) * weights).sum(heads)``,
  then ``topk(min(index_topk, end_pos // ratio))``. Beside the einsum: "We performed QAT here, kv
  could also use fp8 format, though current implementation uses bf16".

So bf16 is the reference's *container*; the precision of its q and keys is fp4 (e2m1, one
power-of-two scale per 32 values, round to nearest even: :func:`verify.core.formats.fp4_sim`).
The inputs here are already RoPE'd and Hadamard-rotated (tier 2's generator applies
``rope_hadamard``; the forward tier's ``reference_keys`` / ``reference_q`` end with the same
transform), so only the bf16 container and the fp4 rounding remain to apply.

Scores are accumulated in fp64 and rounded once, like every other oracle here. The reference's
own bf16 einsum also rounds each per-head dot and the head sum to bf16; that is not reproduced:
bf16 scores tie at a top-k boundary, and which of the tied keys the reference keeps is
``torch.topk``'s tie-breaking, not a property of the model.

Neither this oracle nor the exact one is model quality: both say which keys a scorer keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import formats as F
from .scoring import SlotKeys, grouped_row_logits, torch_select

REFERENCE = "reference oracle: DeepSeek's inference/model.py numerics (fp4 q x fp4 k in a bf16 container)"


def reference_query(q_rot: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q_rot [..., H, 128]`` (RoPE'd and rotated, unquantized) and head weights ``w [..., H]``
    (``weights_proj(x) * 128**-0.5 * 64**-0.5``) -> the reference's q (fp4 in bf16) and its bf16
    head weights, as fp32 tensors."""
    return F.fp4_reference(q_rot), w.to(torch.bfloat16).float()


@dataclass
class ReferenceIndexer:
    """The reference's key cache over a set of slots, and the selection it makes from it."""

    keys: SlotKeys  # fp4-in-bf16 key values by physical slot

    @classmethod
    def of(cls, keys_by_slot: torch.Tensor) -> ReferenceIndexer:
        """``keys_by_slot [S, 128]`` unrounded rotated keys -> the reference's ``kv_cache``."""
        return cls(SlotKeys(F.fp4_reference(keys_by_slot), None, "fp32"))

    def select(
        self,
        q_rot: torch.Tensor,
        w: torch.Tensor,
        q_index: torch.Tensor,
        page_table: torch.Tensor,
        seq_lens: torch.Tensor,
        topk: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's scores ``[B, P*64]`` (-inf past each row's length) and selection
        ``[B, max(topk)]`` (-1 padded; row r keeps ``min(topk[r], seq_len[r])`` keys) for rows
        reading their keys through ``page_table``; ``q_rot`` / ``w`` are per query, ``q_index``
        maps rows to queries, as :func:`verify.core.scoring.grouped_row_logits` takes them."""
        q, wq = reference_query(q_rot, w)
        scores = grouped_row_logits(self.keys, q, wq, q_index, page_table, seq_lens)
        width = int(topk.max())
        chosen = torch.full((scores.shape[0], width), -1, dtype=torch.int64, device=scores.device)
        for k in sorted(set(topk.tolist())):
            rows = (topk == k).nonzero(as_tuple=True)[0]
            chosen[rows, :k] = torch_select(scores[rows], seq_lens[rows], k)
        return scores, chosen


def dense_page_table(n_keys: int, rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A page table ``[rows, pages]`` under which position j of every row is slot j: for keys
    held in one dense ``[n_keys, 128]`` tensor (the forward tier's reference keys)."""
    pages = -(-max(n_keys, 1) // F.PAGE_SLOTS)
    return torch.arange(pages, dtype=torch.int32, device=device).unsqueeze(0).expand(rows, -1)


def pad_to_pages(keys: torch.Tensor) -> torch.Tensor:
    """Dense keys ``[n, 128]`` padded with zero keys to whole pages (rows never see the padding)."""
    pad = -keys.shape[0] % F.PAGE_SLOTS
    return torch.cat([keys, keys.new_zeros(pad, keys.shape[1])]) if pad else keys


def fp4_rule_differences(q_rot: torch.Tensor, keys: torch.Tensor) -> dict[str, float]:
    """Fraction of q and key values that upstream's fp4 quantizers (:func:`verify.core.formats.
    fp4_upstream_q`, :func:`~verify.core.formats.fp4_upstream_quantize_keys`) round to another
    value than the reference's (:func:`~verify.core.formats.fp4_reference`) on the same inputs."""
    q_up = F.fp4_upstream_q(q_rot)
    codes, exps = F.fp4_upstream_quantize_keys(keys)
    scale = (exps.to(torch.int32) << 23).view(torch.float32).repeat_interleave(F.FP4_BLOCK, dim=-1)
    k_up = F.fp4_code_values(codes) * scale
    nonzero = keys.abs().amax(-1) > 0  # unwritten slots are zero in both
    return {
        "q_values_rounded_differently": float((q_up != F.fp4_reference(q_rot)).float().mean()),
        "key_values_rounded_differently": float((k_up != F.fp4_reference(keys))[nonzero].float().mean()),
    }
