"""Replay a prepared case through the indexer compressor's production entry point.

``CompressorBackendMixin.forward_unified`` is what the attention backend calls for every C4
layer: it picks the fused store or the series' unfused path (compress; RMSNorm + RoPE; Hadamard;
``set_index_k_bf16``) from the pool's index-K format and ``SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR``.
This module gives it a real bf16 ``DeepSeekV4IndexerPool`` behind the token pool's layer
mapping, the same plans, out_loc and compress inputs as the kernel-level arms, and a freshly
zeroed compress state pool, so the keys it stores can be compared with the other arms'.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch

from verify.core.store_cases import COMPRESS_RATIO
from verify.core.store_driver import HEAD_DIM, PAGE_SIZE, SCORE_WIDTH, Prepared

UNFUSED_ENV = "SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR"
LAYER_ID = 1  # model layer 1 = the first C4 layer (layer 0 is a plain one in this mapping)


def make_bf16_token_pool(num_pages: int, device: torch.device) -> tuple[Any, torch.Tensor]:
    """A ``DeepSeekV4TokenToKVPool`` holding one bf16 C4 indexer pool; returns it and its buffer.

    Only the indexer part is set up (``object.__new__``): building the whole token pool needs
    the model runner's context, which this suite does not have.
    """
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import (
        DeepSeekV4IndexerPool,
        DeepSeekV4LayerItem,
        DeepSeekV4TokenToKVPool,
    )

    pool = DeepSeekV4IndexerPool(
        num_pages * PAGE_SIZE,
        PAGE_SIZE,
        torch.float8_e4m3fn,  # KV dtype argument; the indexer buffers are uint8 regardless
        HEAD_DIM,
        1,
        str(device),
        False,
        index_k_format="bf16",
    )
    token_pool = object.__new__(DeepSeekV4TokenToKVPool)
    token_pool.index_pools = {4: pool}
    token_pool.layer_mapping = [DeepSeekV4LayerItem(0, 0), DeepSeekV4LayerItem(4, 0)]
    token_pool.start_layer = 0
    token_pool.layer_transfer_counter = None
    token_pool.uniform_fp8 = False
    return token_pool, pool.index_k_with_scale_buffer[0]


class _Backend:
    """The attributes ``forward_unified`` reads from ``DeepseekV4AttnBackend``."""

    def __init__(self, token_to_kv_pool: Any) -> None:
        self.token_to_kv_pool = token_to_kv_pool
        self.enable_deepseek_v4_fp4_indexer = False
        self.forward_metadata: Any = None


def _backend_class() -> type:
    from sglang.srt.layers.attention.dsv4.compressor_v2 import CompressorBackendMixin

    return type("ParityBackend", (_Backend, CompressorBackendMixin), {})


@contextmanager
def unfused_env(enabled: bool) -> Iterator[None]:
    """Set or clear the A/B env for the duration of one replay."""
    from sglang.srt.environ import envs

    field = getattr(envs, UNFUSED_ENV)
    if enabled:
        with field.override(True):
            yield
    else:
        import os

        saved = os.environ.pop(UNFUSED_ENV, None)
        try:
            yield
        finally:
            if saved is not None:
                os.environ[UNFUSED_ENV] = saved


def replay_through_compressor(
    prepared: Prepared, token_pool: Any, device: torch.device, unfused: bool
) -> None:
    """Run ``forward_unified`` for every plan of ``prepared`` (fused or unfused store)."""
    backend = _backend_class()(token_pool)
    state = torch.zeros(
        prepared.state_pool_pages, COMPRESS_RATIO, SCORE_WIDTH, dtype=torch.float32, device=device
    )
    state_pool = SimpleNamespace(kv_score_buffer=SimpleNamespace(kv_score=state))
    compressor = SimpleNamespace(
        is_in_indexer=True,
        ratio=COMPRESS_RATIO,
        head_dim=HEAD_DIM,
        rotate=True,
        ape=prepared.ape,
        norm=SimpleNamespace(weight=prepared.weight, variance_epsilon=prepared.eps),
        freqs_cis=prepared.freqs_cis,
        # forward_unified asks the compressor for its projection output; the prepared scores are it.
        compute_kv_score=lambda x, forward_batch: x,
        get_state_pool=lambda _backend: state_pool,
    )
    forward_batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False))
    with unfused_env(unfused):
        for plan, out_loc, scores in zip(prepared.plans, prepared.out_loc, prepared.scores):
            backend.forward_metadata = SimpleNamespace(
                c4_compress_metadata=plan,
                core_metadata=SimpleNamespace(c4_out_loc=out_loc),
            )
            backend.forward_unified(scores, forward_batch, LAYER_ID, compressor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
