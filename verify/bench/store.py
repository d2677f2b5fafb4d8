"""Fused index-K store timing: bf16 store vs the fp8 store it replaces, side by side (GPU).

Times upstream's ``compress_norm_rope_store`` alone (the store kernel; the compress step before
it is shared by both formats and prepared once), for decode batches and prefill chunks of
several sizes. Timing: the median of CUDA-graph replays of ``GRAPH_CALLS`` stores captured back
to back (``verify.bench.timing``; a store of a few microseconds timed eagerly measures Python's
launch), or with ``--timing eager`` ``triton.testing.do_bench``. Target (:mod:`verify.bench.targets`): the bf16 store is no slower than fp8, which it replaces.

    PYTHONPATH=/path/to/patched/python:/path/to/repo python -m verify.bench.store --out DIR

Writes ``DIR/bench_store.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from verify.bench.timing import graph_ms
from verify.core.provenance import SERIES_HASH, series_hash
from verify.core.store_cases import DecodeCase, PrefillCase, make_prefill_case
from verify.core.store_driver import (
    Prepared,
    make_freqs_cis,
    max_position,
    new_pool_buffer,
    prepare_decode,
    prepare_prefill,
    store_fused,
    upstream_ops,
)
from verify.core.store_layout import BF16_LAYOUT, FP8_LAYOUT

# Decode: one key per request at most; prefill: one chunk of this many keys (<= 16384, the
# planner's 65536-token limit).
DEFAULT_DECODE_BATCHES = (1, 32, 256, 1024)
DEFAULT_PREFILL_KEYS = (512, 4096, 16383)
# Stores per captured graph: enough that the graph launch itself is noise.
GRAPH_CALLS = 32


def time_ms(fn: Callable[[], None], warmup_ms: int, rep_ms: int) -> float:
    """Median milliseconds per call."""
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    except ImportError:
        return _time_with_events(fn, warmup_ms, rep_ms)


def _time_with_events(fn: Callable[[], None], warmup_ms: int, rep_ms: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / one))):
        fn()
    samples: list[float] = []
    for _ in range(max(5, int(rep_ms / one))):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(float(start.elapsed_time(end)))
    samples.sort()
    return samples[len(samples) // 2]


def store_ms(fn: Callable[[], None], timing: str, warmup_ms: int, rep_ms: int) -> tuple[float, str | None]:
    """(median ms per store, a note when graph timing fell back to eager)."""
    if timing == "graph":
        try:
            return graph_ms([fn] * GRAPH_CALLS, rep_ms), None
        except Exception as error:  # noqa: BLE001 - a store that syncs the host is timed eagerly
            torch.cuda.synchronize()
            note = f"graph capture failed ({type(error).__name__}); timed eagerly"
            return time_ms(fn, warmup_ms, rep_ms), note
    return time_ms(fn, warmup_ms, rep_ms), None


def bench_case(
    ops: dict[str, Any], prepared: Prepared, warmup_ms: int, rep_ms: int, timing: str = "graph"
) -> dict[str, Any]:
    """Both formats on the same compressed keys; bytes = keys read (fp32) + keys written."""
    device = torch.device("cuda")
    row: dict[str, Any] = {"case": prepared.name, "keys": int(prepared.slots.numel()), **prepared.info}
    rows_in = sum(int(kv.shape[0]) for kv in prepared.kv)
    for label, layout, bf16 in (("fp8", FP8_LAYOUT, False), ("bf16", BF16_LAYOUT, True)):
        buffer, _ = new_pool_buffer(prepared, layout, device)
        ms, note = store_ms(
            partial(store_fused, ops, prepared, buffer, bf16_store=bf16), timing, warmup_ms, rep_ms
        )
        if note:
            row[f"{label}_note"] = note
        moved = rows_in * 128 * 4 + int(prepared.slots.numel()) * layout.slot_bytes
        row[f"{label}_us"] = ms * 1e3
        row[f"{label}_gbps"] = moved / (ms * 1e-3) / 1e9
    row["bf16_over_fp8"] = row["bf16_us"] / row["fp8_us"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verify.bench.store", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--decode-batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(DEFAULT_DECODE_BATCHES),
    )
    parser.add_argument(
        "--prefill-keys", type=lambda s: [int(x) for x in s.split(",")], default=list(DEFAULT_PREFILL_KEYS)
    )
    parser.add_argument("--timing", choices=["graph", "eager"], default="graph")
    parser.add_argument("--warmup-ms", type=int, default=50)
    parser.add_argument("--rep-ms", type=int, default=300)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs on the GPU machine", file=sys.stderr)
        return 2

    device = torch.device("cuda")
    ops = upstream_ops()
    cases: list[PrefillCase | DecodeCase] = [
        # Every row ends a window, so every row writes a key: the store's full decode cost.
        DecodeCase(tuple(4 * (1 + (i * 37) % 1000) for i in range(b)), seed=100 + b)
        for b in args.decode_batches
    ]
    cases += [make_prefill_case(n, seed=200 + n, max_chunk_tokens=65536) for n in args.prefill_keys]
    freqs = make_freqs_cis(max_position(cases), device)

    rows: list[dict[str, Any]] = []
    for case in cases:
        name = case.name if isinstance(case, PrefillCase) else f"decode/bs={len(case.seq_lens)}"
        try:
            prepared = (
                prepare_prefill(ops, case, freqs, device)
                if isinstance(case, PrefillCase)
                else prepare_decode(ops, case, freqs, device)
            )
            prepared.name = name
            row = bench_case(ops, prepared, args.warmup_ms, args.rep_ms, args.timing)
        except Exception as error:  # noqa: BLE001 - one failing size must not hide the others
            row = {"case": name, "error": f"{type(error).__name__}: {error}"}
        rows.append(row)
        print(json.dumps(row), flush=True)

    meta = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "statistic": "median",
        "timing": args.timing,
        SERIES_HASH: series_hash(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_store.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")

    print(f"\n{'case':<22} {'keys':>7} {'fp8 us':>9} {'bf16 us':>9} {'bf16/fp8':>9} {'bf16 GB/s':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<22} ERROR {r['error'][:80]}")
        else:
            print(
                f"{r['case']:<22} {r['keys']:>7} {r['fp8_us']:>9.2f} {r['bf16_us']:>9.2f} "
                f"{r['bf16_over_fp8']:>9.3f} {r['bf16_gbps']:>10.1f}"
            )
    print(f"\nresults: {args.out / 'bench_store.json'}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
