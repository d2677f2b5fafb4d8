"""What one request costs per layer type: KV bytes a decode step reads, FLOPs a prefill does.

Decode, per generated token at context ``L`` (one request): every layer's attention reads its
sliding window, ``min(window, L)`` latent rows of ``kv_row`` bytes (584: 448 fp8 + 64 bf16 +
8 scale bytes); a C4A layer also reads its ``min(topk, L // 4)`` selected compressed rows and its
indexer reads all ``L // 4`` index keys at the format's bytes per key (fp8 132, fp4 68, bf16 256:
upstream's ``get_dsv4_indexer_bytes_per_token``); a C128A layer reads all ``L // 128`` compressed
rows. Not counted: weights (shared by the batch), q, logits, the top-k's own traffic.

Prefill of an ``L``-token prompt (one request, no cached prefix), in FLOPs: 2 per activated
parameter per token (every projection, MoE expert and the LM head: the model card's count);
attention scores, 2 x heads x (qk dims 512 + v dims 512) per attended key -- token ``t`` (1-based)
attends ``min(window, t)`` window keys in every layer, plus ``min(topk, t // 4)`` in a C4A layer
and ``t // 128`` in a C128A layer; the indexer, 2 x index heads x 128 + 2 x index heads (the head
dots, then the weighted head sum) per key it scores, ``t // 4`` keys per C4A layer. These FLOPs
do not depend on the index-K format.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import ModelShape


@dataclass(frozen=True)
class DecodeBytes:
    window: int  # every layer's sliding-window reads
    sparse: int  # C4A layers' selected compressed rows
    c128: int  # C128A layers' compressed rows
    indexer: int  # C4A indexers' keys

    @property
    def total(self) -> int:
        return self.window + self.sparse + self.c128 + self.indexer

    @property
    def indexer_share(self) -> float:
        return self.indexer / self.total


def decode_bytes(model: ModelShape, context: int, kv_row: int, index_bytes: int) -> DecodeBytes:
    """KV bytes one decode step of one request reads at ``context`` tokens (module docstring)."""
    c4, c128 = model.layers(4), model.layers(128)
    n4 = context // 4
    return DecodeBytes(
        window=len(model.compress_ratios) * min(model.window_size, context) * kv_row,
        sparse=c4 * min(model.index_topk, n4) * kv_row,
        c128=c128 * (context // 128) * kv_row,
        indexer=c4 * n4 * index_bytes,
    )


@dataclass(frozen=True)
class PrefillFlops:
    dense: float
    attention: float
    indexer: float

    @property
    def total(self) -> float:
        return self.dense + self.attention + self.indexer

    @property
    def indexer_share(self) -> float:
        return self.indexer / self.total


def prefill_flops(model: ModelShape, tokens: int) -> PrefillFlops:
    """FLOPs of prefilling a ``tokens``-token prompt (module docstring)."""
    t = torch.arange(1, tokens + 1, dtype=torch.float64)
    window = torch.clamp(t, max=model.window_size).sum().item()
    n4 = torch.floor(t / 4)
    sparse = torch.clamp(n4, max=model.index_topk).sum().item()
    c128 = torch.floor(t / 128).sum().item()
    per_key = (
        2 * model.num_attention_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    )
    attended = len(model.compress_ratios) * window + model.layers(4) * sparse + model.layers(128) * c128
    per_index_key = 2 * model.index_n_heads * model.index_head_dim + 2 * model.index_n_heads
    return PrefillFlops(
        dense=2.0 * model.activated_params * tokens,
        attention=float(per_key) * attended,
        indexer=float(per_index_key) * model.layers(4) * n4.sum().item(),
    )
