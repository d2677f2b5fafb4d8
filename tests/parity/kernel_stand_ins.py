"""Torch stand-ins for the series' two bf16 logits kernels, for CPU tests of the code *around* them
(tier 1's checks, the bench's scenarios). They are not the kernels: the Triton interpreter
misreads bf16 and the kernels carry no interpreter branch, so their numerics are GPU tests
(tier 1 on the H200, the series' CUDA tests). A stand-in computes the kernel's documented contract
in fp64 -- which positions get a score, which ``-inf``, which stay unwritten with
``clean_logits=False`` -- and takes every launch-logic name (configs, selection, shared memory,
limits) from the real module, so a check that passes on it is a check of the harness, and the
broken variants (``faults``) show that the checks catch a kernel that misbehaves.
"""

from __future__ import annotations

import types
from typing import Any

import torch

PAGE, DIM = 64, 128


def _keys_of(kv: torch.Tensor, page_table: torch.Tensor | None, n: int) -> torch.Tensor:
    """Keys 0..n-1 in fp64 ``[n, 128]`` from any input form the kernels accept."""
    if page_table is None:
        return kv[:n].double()
    if kv.dtype == torch.uint8:
        kv = kv.reshape(kv.shape[0], -1).view(torch.bfloat16)
    flat = kv.reshape(kv.shape[0], PAGE, DIM)
    table = page_table.reshape(-1).long()
    j = torch.arange(n)
    return flat[table[j // PAGE], j % PAGE].double()


def prefill_stand_in(
    real: Any, faults: tuple[str, ...] = (), block_k: int | None = None
) -> types.SimpleNamespace:
    """``bf16_mqa_logits`` as its docstring states it. ``faults``: ``"one_key_past_ke"`` (a row
    also scores key ``ke``), ``"writes_everywhere"`` (``-inf`` outside the row's tiles even with
    ``clean_logits=False``), ``"ignores_ks"`` (rows start at key 0). ``block_k``: the default
    config's key tile (small tiles make small test shapes cross them)."""
    from dataclasses import replace

    def select(*args: Any, **kwargs: Any) -> Any:
        config = real.select_prefill_config(*args, **kwargs)
        return replace(config, block_k=block_k, block_r=64) if block_k else config

    def with_config(
        q: torch.Tensor,
        kv: torch.Tensor,
        weights: torch.Tensor,
        ks: torch.Tensor,
        ke: torch.Tensor,
        max_seqlen_k: int,
        page_table: torch.Tensor | None = None,
        clean_logits: bool = False,
        config: Any = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rows = q.shape[0]
        config = config or select()
        block = config.block_k
        width = int(max_seqlen_k)
        n_keys = (page_table.reshape(-1).shape[0] * PAGE) if page_table is not None else kv.shape[0]
        cap = min(width, n_keys)
        out = torch.empty((rows, width), dtype=torch.float32) if out is None else out
        if clean_logits or "writes_everywhere" in faults:
            out.fill_(float("-inf"))
        lo_all = ks.long().clamp(min=0)
        hi_all = ke.long().clamp(max=cap)
        top = int(hi_all.max()) if rows else 0
        keys = _keys_of(kv, page_table, min(n_keys, top + 1)) if top > 0 else None
        for r in range(rows):
            lo, hi = int(lo_all[r]), int(hi_all[r])
            if "ignores_ks" in faults:
                lo = 0
            if lo >= hi:
                continue
            t0, t1 = lo // block * block, min(width, -(-hi // block) * block)
            span = torch.full((t1 - t0,), float("-inf"), dtype=torch.float64)
            end = min(hi + 1, t1, keys.shape[0]) if "one_key_past_ke" in faults else hi
            s = (keys[lo:end] @ q[r].double().T).clamp_min(0) @ weights[r].double()
            span[lo - t0 : end - t0] = s
            out[r, t0:t1] = span.float()
        return out

    ns = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    ns.select_prefill_config = select
    ns.bf16_mqa_logits_with_config = with_config
    ns.bf16_mqa_logits = lambda *a, **kw: with_config(*a, **kw)
    ns.__file__ = f"torch stand-in of {getattr(real, '__file__', '?')}"
    return ns


def paged_stand_in(real: Any) -> types.SimpleNamespace:
    """``bf16_paged_mqa_logits`` as its docstring states it (the first row's table per group;
    ``-inf`` to the end of the row's last 64-key tile, nothing after it without the fill)."""

    def with_config(
        q: torch.Tensor,
        kv: torch.Tensor,
        weights: torch.Tensor,
        seq_lens: torch.Tensor,
        page_table: torch.Tensor,
        max_seq_len: int,
        config: Any = None,
        fill_tail: bool = True,
        group_rows: int = 1,
    ) -> torch.Tensor:
        q = q[:, 0] if q.dim() == 4 else q
        rows, width = q.shape[0], int(max_seq_len)
        lens = seq_lens.reshape(-1).long()
        out = torch.empty((rows, width), dtype=torch.float32)
        if fill_tail:
            out.fill_(float("-inf"))
        for r in range(rows):
            table = page_table[r - r % group_rows]
            n = min(max(int(lens[r]), 0), width, table.shape[0] * PAGE)
            end = min(width, -(-n // PAGE) * PAGE)
            span = torch.full((end,), float("-inf"), dtype=torch.float64)
            if n:
                keys = _keys_of(kv, table, n)
                span[:n] = (keys @ q[r].double().T).clamp_min(0) @ weights[r].double()
            out[r, :end] = span.float()
        return out

    ns = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    ns.bf16_paged_mqa_logits_with_config = with_config

    def plain(
        q: Any,
        kv: Any,
        weights: Any,
        seq_lens: Any,
        page_table: Any,
        schedule: Any,
        max_seq_len: int,
        clean_logits: bool = True,
        group_rows: int = 1,
    ) -> torch.Tensor:
        return with_config(
            q, kv, weights, seq_lens, page_table, max_seq_len, fill_tail=clean_logits, group_rows=group_rows
        )

    ns.bf16_paged_mqa_logits = plain
    ns.__file__ = f"torch stand-in of {getattr(real, '__file__', '?')}"
    return ns
