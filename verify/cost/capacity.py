"""KV-pool capacity per index-K format, from upstream's own ``DSV4PoolConfigurator``.

The configurator (``srt/model_executor/pool_configurator.py``) turns a byte budget into pool
sizes as ``full tokens = (budget - fixed bytes) / bytes per full token``; the index-K format
enters through ``resolve_dsv4_index_k_format()`` (``srt/mem_cache/deepseek_v4_memory_pool.py``,
read off ``get_exec().kernel``), which this module selects through upstream's scoped server-args
override, as upstream's own tests do. Two SWA sizings:

* ``ratio``: ``--swa-full-tokens-ratio 0.1``, the value upstream's DeepSeek-V4 override sets
  (``arg_groups/model_overrides/deepseek_v4.py``): SWA slots = 0.1 x full tokens, priced in the
  per-token coefficient;
* ``cap``: the ratio left unset, so the SWA pool is sized from the request cap
  (``compute_swa_request_cap``: ``--max-running-requests``, 256 by upstream's DeepSeek-V4 hook,
  plus radix headroom) and charged as fixed bytes.

The budget mirrors ``KVCacheConfigurator._profile_available_bytes``: free memory after the
weights minus ``(1 - mem_fraction_static)`` of the memory before them, i.e.
``gpu_memory * mem_fraction_static - weights`` for a GPU that starts empty.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from .models import ModelShape

FORMATS = ("fp8", "fp4", "bf16")
MODES = ("ratio", "cap")
PAGE_SIZE = 256  # upstream's DeepSeek-V4 override (model_overrides/deepseek_v4.py)
DEFAULT_SWA_RATIO = 0.1


def format_overrides(fmt: str) -> dict[str, object]:
    """The ServerArgs fields a server resolves for index-K format ``fmt``: the option, and the
    deprecated fp4 flag that server-arg resolution keeps consistent with it."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown index-K format {fmt!r}; known: {FORMATS}")
    return {"deepseek_v4_indexer_k_dtype": fmt, "enable_deepseek_v4_fp4_indexer": fmt == "fp4"}


@dataclass(frozen=True)
class Serving:
    """The server arguments and memory the pool is sized for."""

    gpu_memory_gib: float = 140.0  # an H200 (141 GB of HBM3e)
    mem_fraction_static: float = 0.9
    weights_gib: float = 37.0
    max_running_requests: int = 256  # upstream's DeepSeek-V4 default (deepseek_v4_hook.py)
    chunked_prefill_size: int = 8192
    swa_ratio: float = DEFAULT_SWA_RATIO

    @property
    def budget_bytes(self) -> int:
        return int((self.gpu_memory_gib * self.mem_fraction_static - self.weights_gib) * 2**30)


def mode_overrides(mode: str, serving: Serving) -> dict[str, object]:
    common: dict[str, object] = {
        "page_size": PAGE_SIZE,
        "max_running_requests": serving.max_running_requests,
        "chunked_prefill_size": serving.chunked_prefill_size,
    }
    if mode == "ratio":
        return {
            **common,
            "swa_full_tokens_ratio": serving.swa_ratio,
            "_swa_full_tokens_ratio_explicitly_set": True,
        }
    if mode == "cap":
        return {**common, "_swa_full_tokens_ratio_explicitly_set": False}
    raise ValueError(f"unknown SWA sizing {mode!r}; known: {MODES}")


@contextmanager
def upstream_args(fmt: str, mode: str, serving: Serving) -> Iterator[None]:
    """Upstream's runtime context with the server arguments of one (format, SWA sizing)."""
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(**format_overrides(fmt), **mode_overrides(mode, serving)):
        yield


def configurator(model: ModelShape, context_len: int, serving: Serving) -> Any:
    """A real ``DSV4PoolConfigurator`` for ``model`` under the current server arguments, built
    from the fields it reads (as upstream's ``test_dispatch.make_configurator`` builds one)."""
    from sglang.srt.model_executor.pool_configurator import DSV4PoolConfigurator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    model_config = SimpleNamespace(
        qk_nope_head_dim=model.qk_nope_head_dim,
        qk_rope_head_dim=model.qk_rope_head_dim,
        index_head_dim=model.index_head_dim,
        context_len=context_len,
        compress_ratios=list(model.compress_ratios),
        hf_config=SimpleNamespace(kv_source_layer_ids=[]),
        window_size=model.window_size,
    )
    kvc = SimpleNamespace(
        kv_cache_dtype_str="auto",
        model_config=model_config,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        layer_info=SimpleNamespace(start_layer=0, end_layer=len(model.compress_ratios)),
        pp_size=1,
        sliding_window_size=model.window_size,
        page_size=PAGE_SIZE,
        attn_dp_size=1,
        spec_aux_config=None,
    )
    return DSV4PoolConfigurator(kvc)


@dataclass(frozen=True)
class Capacity:
    model: str
    mode: str
    fmt: str
    index_bytes_budgeted: int  # per C4 key, as the configurator prices it
    index_bytes_allocated: int  # per C4 key, as the pool allocates it
    bytes_per_full_token: float
    fixed_bytes: float
    full_tokens: int | None  # None: the configurator refused the budget (``error`` says why)
    swa_tokens: int | None
    swa_cap_tokens: int | None
    kv_row_bytes: int
    error: str | None = None


def capacity(model: ModelShape, fmt: str, mode: str, serving: Serving, context_len: int) -> Capacity:
    """The pool the server would allocate for ``model`` in ``fmt`` under SWA sizing ``mode``."""
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import get_dsv4_indexer_bytes_per_token

    logging.getLogger("sglang.srt.model_executor.pool_configurator").setLevel(logging.WARNING)
    with upstream_args(fmt, mode, serving):
        conf = configurator(model, context_len, serving)
        mrr = conf._resolve_max_running_requests_per_worker(serving.budget_bytes)
        # calculate_pool_sizes' fixed bytes: no unified ring, no c2 layers on DeepSeek-V4
        fixed = conf._get_c128_state_fixed_bytes(mrr) + conf._get_swa_fixed_bytes()
        try:
            sizes = conf.calculate_pool_sizes(serving.budget_bytes, PAGE_SIZE)
            full, swa, error = int(sizes.full_max_total_num_tokens), int(sizes.swa_max_total_num_tokens), None
        except RuntimeError as exc:  # the SWA cap alone exceeds the budget: upstream refuses to start
            full, swa, error = None, None, str(exc)
        return Capacity(
            model=model.name,
            mode=mode,
            fmt=fmt,
            index_bytes_budgeted=int(conf.indexer_bytes_per_token),
            index_bytes_allocated=get_dsv4_indexer_bytes_per_token(model.index_head_dim, index_k_format=fmt),
            bytes_per_full_token=float(conf.bytes_per_full_token),
            fixed_bytes=float(fixed),
            full_tokens=full,
            swa_tokens=swa,
            swa_cap_tokens=conf.swa_cap_tokens,
            kv_row_bytes=int(conf.kv_bytes),
            error=error,
        )
