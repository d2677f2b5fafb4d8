"""Kernel timing for the benches: CUDA-graph replay, so small kernels are timed, not Python.

A decode step's indexer kernels take a few microseconds, less than the Python side of one eager
launch (argument checks, ``torch.empty``, Triton's launcher). Timed eagerly, they measure the
host, not the GPU -- the first H200 run read 14-18 us for reads of 0.5-8 MB of keys for exactly
that reason. Production decode runs them inside a captured CUDA graph, so that is how they are
timed here: ``calls`` (one per replica of the inputs) are captured back to back in one graph,
the graph is replayed, and the time per call is the replay time over ``len(calls)``.

Replicas exist for the cache: a call whose keys fit in L2 (50 MB on an H200) would read them
from L2 on every replay. ``replicas_for`` picks enough copies, each with its own keys, that
one replay streams at least ``L2_ROTATION_BYTES`` of distinct keys, so every call starts cold
as it would in a model step, where the other layers' keys pass through L2 in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Five times an H200's 50 MB L2: a replay's keys cannot stay resident between calls.
L2_ROTATION_BYTES = 256 * 2**20
MAX_REPLICAS = 256


def replicas_for(unique_bytes: int, bytes_read_per_call: int) -> int:
    """Copies of the inputs one graph replay rotates through (1 when a call alone streams
    more than ``L2_ROTATION_BYTES``: whatever it left in L2 is then a rounding error)."""
    if bytes_read_per_call >= L2_ROTATION_BYTES or unique_bytes <= 0:
        return 1
    return max(1, min(MAX_REPLICAS, math.ceil(L2_ROTATION_BYTES / unique_bytes)))


def graph_ms(calls: Sequence[Callable[[], Any]], rep_ms: float, min_reps: int = 5) -> float:
    """Median milliseconds per call of ``calls`` captured back to back in one CUDA graph.

    Each call is run once eagerly on a side stream first (compilation, allocator warm-up, as
    ``torch.cuda.graph`` requires); raises whatever capture raises (a call that syncs the host
    cannot be captured), so the caller can fall back to eager timing and say so."""
    if not calls:
        raise ValueError("graph_ms needs at least one call")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for fn in calls:
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        one = max(float(start.elapsed_time(end)), 1e-3)
        reps = max(min_reps, min(1000, int(rep_ms / one)))
        samples: list[float] = []
        for _ in range(reps):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(float(start.elapsed_time(end)))
    finally:
        del graph
        torch.cuda.synchronize()
    samples.sort()
    return samples[len(samples) // 2] / len(calls)


def replicate_pages(
    pool: torch.Tensor, page_table: torch.Tensor, copies: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``copies`` copies of a paged pool (pages on dim 0) and, per copy, the page table that
    addresses it: the same keys and page order, in distinct memory."""
    pages = pool.shape[0]
    big = pool.repeat(copies, *([1] * (pool.dim() - 1))) if copies > 1 else pool
    tables = [page_table + r * pages for r in range(copies)]
    return big, tables
