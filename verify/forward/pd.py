"""PD disaggregation: move a request's pages between two pools the way the transfer engine does.

The prefill side registers, for every paged buffer of ``DeepSeekV4TokenToKVPool``, a pointer, a
length and an item size per page (``get_contiguous_buf_infos``); a transfer then copies, for each
buffer, ``item_len`` bytes at ``page * item_len`` from the sender's page to the receiver's page,
for the FULL page ids of the request on each side. :func:`transfer` does exactly that, reading
nothing but those descriptors (it finds each pointer's owning tensor only to address memory), and
:func:`compare_indexer_pages` then checks every page of the receiver's C4 indexer region against
the sender's through the pool's own per-layer accessor, plus canary pages the transfer must not
touch. A descriptor that is wrong for a format (an fp8 item size on a bf16 pool, a pointer off by
a region) moves the first page right and the rest wrong, or writes outside the request: the field
deployment was PD-disaggregated, and a needle in the first 256 tokens survived where one at token
4,500 did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def _tensors(obj: Any, depth: int = 0, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` through attributes, lists, tuples and dicts."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or depth > 4:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[torch.Tensor] = []
    if isinstance(obj, (list, tuple)):
        for item in obj:
            out += _tensors(item, depth + 1, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            out += _tensors(item, depth + 1, seen)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("sglang"):
        for item in vars(obj).values():
            out += _tensors(item, depth + 1, seen)
    return out


def _region(tensors: list[torch.Tensor], ptr: int, length: int) -> torch.Tensor:
    """The bytes [ptr, ptr + length) as a flat uint8 view of the tensor that owns them."""
    for t in tensors:
        storage = t.untyped_storage()
        base = storage.data_ptr()
        if base <= ptr and ptr + length <= base + storage.nbytes():
            flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            return flat[ptr - base : ptr - base + length]
    raise LookupError(f"no tensor of the pool owns [{ptr:#x}, +{length})")


@dataclass
class Transfer:
    buffers: int
    pages: int
    bytes_moved: int
    item_lens: list[int] = field(default_factory=list)


def transfer(src_pool: Any, dst_pool: Any, src_pages: list[int], dst_pages: list[int]) -> Transfer:
    """Copy a request's pages from ``src_pool`` to ``dst_pool`` by the pools' PD descriptors."""
    if len(src_pages) != len(dst_pages):
        raise ValueError("sender and receiver page lists differ in length")
    sp, sl, si = src_pool.get_contiguous_buf_infos()
    dp, dl, di = dst_pool.get_contiguous_buf_infos()
    if si != di or len(sp) != len(dp):
        raise ValueError(f"PD layouts differ: item lens {si} vs {di}")
    src_t, dst_t = _tensors(src_pool), _tensors(dst_pool)
    moved = 0
    for ptr_s, len_s, ptr_d, len_d, item in zip(sp, sl, dp, dl, si):
        src = _region(src_t, ptr_s, len_s)
        dst = _region(dst_t, ptr_d, len_d)
        for s, d in zip(src_pages, dst_pages):
            dst[d * item : (d + 1) * item].copy_(src[s * item : (s + 1) * item])
            moved += item
    return Transfer(len(sp), len(src_pages), moved, list(si))


@dataclass
class PageComparison:
    pages: int
    identical_pages: int
    first_bad_page: int | None
    canaries_untouched: bool

    @property
    def ok(self) -> bool:
        return self.identical_pages == self.pages and self.canaries_untouched


def indexer_rows(pool: Any, layer_id: int = 0) -> torch.Tensor:
    """The C4 indexer's page rows of ``layer_id`` through the pool's own accessor."""
    buf: torch.Tensor = pool.get_index_k_with_scale_buffer(layer_id)
    return buf


def compare_indexer_pages(
    src_pool: Any,
    dst_pool: Any,
    src_pages: list[int],
    dst_pages: list[int],
    canary_pages: list[int],
    canary_before: torch.Tensor,
) -> PageComparison:
    src, dst = indexer_rows(src_pool), indexer_rows(dst_pool)
    same = [bool(torch.equal(src[s], dst[d])) for s, d in zip(src_pages, dst_pages)]
    first = next((i for i, ok in enumerate(same) if not ok), None)
    canary_ok = bool(torch.equal(dst[canary_pages].cpu(), canary_before.cpu())) if canary_pages else True
    return PageComparison(len(same), sum(same), first, canary_ok)
