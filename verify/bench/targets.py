"""The bench's speed targets (the project's own; issue 25 added the long-prefill ones), one
table, and the one evaluator of them.

Every speed target the read and store benches are held to is a constant below. :func:`evaluate`
reads a run in its JSON form (``bench_read.json`` and ``bench_store.json``, or the payload a run is
about to write) and says, target by target, how many shapes meet it, and why a target is out of
reach where the run's own floors say so. README's speed block (:mod:`verify.bench.report`) and the
read bench's printout both show its lines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

HBM_BYTES_PER_S = 4.8e12  # H200 datasheet: the roof the decode targets are read against
# The run that measures what a target or a table says is not measured.
BENCH_COMMAND = "`verify/gpu/run.sh setup tier1_read bench`"

# Decode from 8 x 32K keys up at >= 88% of HBM_BYTES_PER_S (the kernel's default config).
TARGET_HBM_PCT, TARGET_HBM_MIN_ROWS, TARGET_HBM_MIN_KEYS = 88.0, 8, 32768
# Decode rows of >= 8K keys: bf16 over fp8 within the key-byte ratio, and >= 10x the naive gather.
TARGET_MIN_KEYS = 8192
TARGET_RATIO_VS_FP8 = 256 / 132
TARGET_GATHER_SPEEDUP = 10.0
TARGET_EXTRA_MEMORY_SLACK = 2 * 2**20  # beyond the logits; the caching allocator rounds blocks up
TARGET_WIDE_VS_BEST_SPLIT = 1.2  # short rows in a wide output vs the best fixed split
TARGET_MTP_VS_ONE_ROW = 1.15  # MTP verify rows scored in groups vs one row per request
TARGET_PREFILL_VS_FP8 = 1.2  # long prefill vs upstream's fp8 prefill path, for runs before the prefill kernel
# Issue 25's long-prefill targets for the prefill kernel (one request, every row, causal): effective
# TFLOP/s on the causal FLOPs at 32K and 131K tokens, and its time over DeepGEMM's non-paged
# fp8_mqa_logits per length.
TARGET_PREFILL_TFLOPS = 600.0
TARGET_PREFILL_TFLOPS_TOKENS = (32768, 131072)
TARGET_PREFILL_VS_DEEPGEMM = {8192: 2.0, 32768: 1.7, 131072: 1.7}


def timing_ms(timing: Mapping[str, Any] | None) -> float | None:
    """A timing's milliseconds (None where it did not run)."""
    return timing.get("ms") if timing else None


def hbm_pct(r: Mapping[str, Any], ms: float) -> float:
    """A decode shape's bf16 key bytes at ``ms``, as a share of HBM_BYTES_PER_S."""
    return 100 * r["key_bytes_bf16"] / (ms * 1e-3) / HBM_BYTES_PER_S


def fp8_floor_ms(r: Mapping[str, Any]) -> float:
    """The time fp8's key bytes of a shape take at HBM_BYTES_PER_S."""
    return r["key_bytes_fp8"] / HBM_BYTES_PER_S * 1e3


def prefill_kernel_measured(read: Mapping[str, Any]) -> bool:
    """Whether the run timed the series' prefill kernel (bf16_mqa_logits) on the long prefill."""
    return any(
        timing_ms(p.get("arms", {}).get("bf16_prefill"))
        for p in read.get("long_prefill", [])
        if not p.get("skipped")
    )


def _prefill_kernel_lines(long_prefill: list[Mapping[str, Any]]) -> list[str]:
    """Issue 25's long-prefill targets, met or missed per length: the prefill kernel's effective
    TFLOP/s on the causal FLOPs (>= 600 at 32K and 131K tokens) beside the same run's dense bf16
    matmul rate, and its time over DeepGEMM's non-paged fp8_mqa_logits (<= 1.7x at 32K and 131K,
    <= 2.0x at 8K)."""

    lines = []
    rows = [
        (r, t)
        for r in long_prefill  # each run of the prefill kernel, with its time
        if not r.get("skipped") and (t := timing_ms(r["arms"].get("bf16_prefill")))
    ]
    dense = next((r["dense_bf16_tflops"] for r, _ in rows if r.get("dense_bf16_tflops")), None)
    tf = []
    for r, t in rows:
        if r["tokens"] in TARGET_PREFILL_TFLOPS_TOKENS:
            rate = r["floors"]["flops"] / (t * 1e-3) / 1e12
            tf.append(f"{r['tokens']:,}: {rate:.0f} {'met' if rate >= TARGET_PREFILL_TFLOPS else 'MISSED'}")
    if tf:
        head = f"long prefill >= {TARGET_PREFILL_TFLOPS:.0f} TFLOP/s effective (causal FLOPs"
        dense_note = f"; the same run's dense bf16 matmul: {dense:.0f} TFLOP/s" if dense else ""
        lines.append(f"{head}{dense_note}): " + "; ".join(tf))
    vs = []
    for r, t in rows:
        bound = TARGET_PREFILL_VS_DEEPGEMM.get(r["tokens"])
        anchor = timing_ms(r["arms"].get("deepgemm_nonpaged"))
        if bound is None:
            continue
        if not anchor:
            vs.append(f"{r['tokens']:,}: DeepGEMM not measured")
            continue
        ratio = t / anchor
        vs.append(f"{r['tokens']:,}: {ratio:.2f}x (<= {bound}) {'met' if ratio <= bound else 'MISSED'}")
    if vs:
        lines.append("long prefill vs DeepGEMM's non-paged fp8_mqa_logits: " + "; ".join(vs))
    return lines


def _prefill_reach(read: Mapping[str, Any]) -> str:
    """Why the long-prefill target is out of reach, from the run's own floors and timings: the
    logits are compute-bound, and bf16's MMA floor over fp8's is what it is; within the target
    bf16 would have to reach that many times the fp8 path's share of its own floor."""
    rows = [p for p in read.get("long_prefill", []) if not p.get("skipped")]
    ratios = [
        p["floors"]["bf16_ms"] / p["floors"]["fp8_nonpaged_ms"]
        for p in rows
        if p["floors"].get("bf16_ms") and p["floors"].get("fp8_nonpaged_ms")
    ]
    bound = [
        p
        for p in rows
        if p["floors"].get("fp8_nonpaged_compute_ms", 0) >= p["floors"].get("fp8_nonpaged_memory_ms", 1)
    ]
    if not ratios or len(bound) != len(rows):
        return ""

    def share(arm: str | None, floor: str) -> list[float]:  # arm None: the one the dispatch runs
        return [
            100 * p["floors"][floor] / ms
            for p in rows
            if (ms := timing_ms(p["arms"].get(arm or p["dispatch_arm"]))) and p["floors"].get(floor)
        ]

    shares = [
        (label, v)
        for label, v in (
            ("bf16 as dispatched", share(None, "bf16_ms")),
            ("fp8 twin", share("fp8_twin", "fp8_nonpaged_ms")),
            ("TileLang", share("tilelang", "fp8_nonpaged_ms")),
            ("DeepGEMM non-paged", share("deepgemm_nonpaged", "fp8_nonpaged_ms")),
        )
        if v
    ]
    need = min(ratios) / TARGET_PREFILL_VS_FP8
    low, high = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
    spread = low if low == high else f"{low}-{high}"
    return (
        f"; every length is compute-bound, and bf16's MMA floor is {spread}x fp8's, "
        f"so within {TARGET_PREFILL_VS_FP8}x bf16 must reach {need:.2f}x the fp8 path's share of its own "
        "floor; "
        "measured shares of their floors: "
        + ", ".join(f"{label} {min(v):.0f}-{max(v):.0f}%" for label, v in shares)
    )


Row = Mapping[str, Any]


def _count(values: list[float], ok: Callable[[float], bool]) -> str:
    return f"{sum(bool(ok(v)) for v in values)}/{len(values)}"


def _ratios(rows: Iterable[Row], over: Callable[[Row], Any], under: Callable[[Row], Any]) -> list[float]:
    """``over / under`` (two timings) of every row where both ran."""
    return [a / b for r in rows if (a := timing_ms(over(r))) and (b := timing_ms(under(r)))]


def _plain_decode(results: list[Row]) -> list[Row]:
    return [r for r in results if r["shape"]["mode"] == "decode" and not r["shape"].get("width")]


def _hbm_lines(read: Row, decode: list[Row]) -> list[str]:
    shapes = [
        r
        for r in decode
        if r["shape"]["rows"] >= TARGET_HBM_MIN_ROWS and r["shape"]["keys"] >= TARGET_HBM_MIN_KEYS
    ]
    big = [hbm_pct(r, ms) for r in shapes if (ms := timing_ms(r.get("bf16_default")))]
    if not big:
        return []
    swept = [hbm_pct(r, ms) for r in shapes if r.get("sweep") and (ms := timing_ms(r.get("bf16_best")))]
    # DeepGEMM's share for its own (fp8) key bytes, as the decode table's column
    anchor = [100 * fp8_floor_ms(r) / ms for r in shapes if (ms := timing_ms(r.get("fp8_deepgemm")))]
    copy_tb_s = read["meta"].get("copy_ceiling", {}).get("copy_tb_s", float("nan"))
    return [
        f"decode from {TARGET_HBM_MIN_ROWS} x {TARGET_HBM_MIN_KEYS:,} keys up at >= {TARGET_HBM_PCT:.0f}% of "
        f"4.8 TB/s: {_count(big, lambda v: v >= TARGET_HBM_PCT)} shapes (default config, "
        f"{min(big):.0f}-{max(big):.0f}%"
        + (
            f"; the best swept config per shape: {_count(swept, lambda v: v >= TARGET_HBM_PCT)}, "
            f"{min(swept):.0f}-{max(swept):.0f}%"
            if swept
            else ""
        )
        + (
            f"; DeepGEMM's fp8 scorer on the same shapes: {min(anchor):.0f}-{max(anchor):.0f}% of "
            "4.8 TB/s for its own key bytes"
            if anchor
            else ""
        )
        + f"; the device copy ceiling measured in the same run: {100 * copy_tb_s * 1e12 / HBM_BYTES_PER_S:.0f}%)"
    ]


def _long_decode_lines(decode: list[Row]) -> list[str]:
    """bf16 against the fp8 twin and DeepGEMM, and the naive gather against bf16, on decode rows
    of >= TARGET_MIN_KEYS keys (the kernel's default config)."""
    rows = [r for r in decode if r["shape"]["keys"] >= TARGET_MIN_KEYS and timing_ms(r.get("bf16_default"))]
    ratio = _ratios(rows, lambda r: r["bf16_default"], lambda r: r.get("fp8_best"))
    anchor = _ratios(rows, lambda r: r["bf16_default"], lambda r: r.get("fp8_deepgemm"))
    gather = _ratios(rows, lambda r: r.get("gather"), lambda r: r["bf16_default"])
    out = []
    if ratio:
        out.append(
            f"bf16 / fp8 twin <= {TARGET_RATIO_VS_FP8:.2f} (decode, >= {TARGET_MIN_KEYS:,} keys): "
            f"{_count(ratio, lambda v: v <= TARGET_RATIO_VS_FP8)} (max {max(ratio):.2f})"
        )
    if anchor:
        out.append(
            f"bf16 / DeepGEMM <= {TARGET_RATIO_VS_FP8:.2f}, the key-byte ratio (decode, >= "
            f"{TARGET_MIN_KEYS:,} keys, default config): "
            f"{_count(anchor, lambda v: v <= TARGET_RATIO_VS_FP8)} (max {max(anchor):.2f})"
        )
    if gather:
        out.append(
            f">= {TARGET_GATHER_SPEEDUP:.0f}x over the naive gather: "
            f"{_count(gather, lambda v: v >= TARGET_GATHER_SPEEDUP)} (min {min(gather):.1f}x)"
        )
    return out


def _memory_lines(results: list[Row]) -> list[str]:
    beyond = [
        r["peak_extra_bytes"]["bf16"] - r["peak_extra_bytes"]["logits"]
        for r in results
        if "bf16" in r.get("peak_extra_bytes", {}) and "logits" in r.get("peak_extra_bytes", {})
    ]
    if not beyond:
        return []
    within = _count(beyond, lambda v: v <= TARGET_EXTRA_MEMORY_SLACK)
    return [(f"no memory beyond the logits: {within} shapes (at most {max(beyond):,} B beyond)")]


def _wide_lines(results: list[Row]) -> list[str]:
    wide = [r for r in results if r["shape"].get("width")]
    lean = _ratios(wide, lambda r: r.get("bf16_default_lean"), lambda r: r.get("bf16_best_split_lean"))
    if lean:
        return [
            (
                f"short rows in a wide output within {TARGET_WIDE_VS_BEST_SPLIT}x of the best fixed split: "
                f"{_count(lean, lambda v: v <= TARGET_WIDE_VS_BEST_SPLIT)} (max {max(lean):.2f}x)"
            )
        ]
    if not wide:
        return []
    old = _ratios(wide, lambda r: r.get("bf16_default"), lambda r: r.get("bf16_best"))
    return [
        (
            f"short rows in a wide output within {TARGET_WIDE_VS_BEST_SPLIT}x of the best split: not "
            f"measured with the length-aware split yet ({BENCH_COMMAND}); the committed run before it was "
            f"up to {max(old):.2f}x off"
        )
    ]


def _mtp_lines(read: Row) -> list[str]:
    mtp = read.get("mtp", [])
    grouped = _ratios(mtp, lambda m: m.get("grouped"), lambda m: m.get("one_row"))
    swept = _ratios(
        [m for m in mtp if m.get("grouped_sweep")],
        lambda m: m.get("grouped_best"),
        lambda m: m.get("one_row"),
    )
    # What the fp8 anchor pays for a request's second row: DeepGEMM scores the flattened verify rows
    # one at a time; its decode timing at the same requests x keys is its one-row time.
    one_row_dg = {
        (r["shape"]["rows"], r["shape"]["keys"]): ms
        for r in _plain_decode(read.get("results", []))
        if (ms := timing_ms(r.get("fp8_deepgemm")))
    }
    anchor = [
        ms / one_row_dg[(m["requests"], m["keys"])]
        for m in mtp
        if m["next_n"] == 2
        and (ms := timing_ms(m.get("deepgemm")))
        and (m["requests"], m["keys"]) in one_row_dg
    ]
    return [
        f"MTP verify (grouped) <= {TARGET_MTP_VS_ONE_ROW}x one row per request: "
        + (
            f"{_count(grouped, lambda v: v <= TARGET_MTP_VS_ONE_ROW)} (max {max(grouped):.2f}x)"
            if grouped
            else f"not measured ({BENCH_COMMAND})"
        )
        + (
            f"; with the best swept grouped config per shape "
            f"{_count(swept, lambda v: v <= TARGET_MTP_VS_ONE_ROW)} (max {max(swept):.2f}x)"
            if swept
            else ""
        )
        + (
            f"; DeepGEMM's fp8 scorer takes {min(anchor):.2f}-{max(anchor):.2f}x its one-row time for two "
            "rows per request (its decode timing at the same requests and keys)"
            if anchor
            else ""
        )
    ]


def _old_prefill_lines(read: Row) -> list[str]:
    """Runs before the prefill kernel: the bf16 dispatch against upstream's fp8 prefill paths."""
    long = [p for p in read.get("long_prefill", []) if not p.get("skipped")]

    def dispatched(p: Row) -> Any:
        return p["arms"].get(p["dispatch_arm"])

    real = _ratios(long, dispatched, lambda p: p["arms"].get("deepgemm_nonpaged"))
    twin = _ratios(long, dispatched, lambda p: p["arms"].get("fp8_twin"))
    floor = [
        b / f for p in long if (b := timing_ms(dispatched(p))) and (f := p["floors"].get("fp8_nonpaged_ms"))
    ]
    bound = TARGET_PREFILL_VS_FP8
    measured = (
        (
            (
                f"{_count(real, lambda v: v <= bound)} against DeepGEMM's non-paged `fp8_mqa_logits` (upstream's "
                f"default there; max {max(real):.2f}x), "
                if real
                else ""
            )
            + f"{_count(twin, lambda v: v <= bound)} against the fp8 twin (max {max(twin):.2f}x), "
            f"{_count(floor, lambda v: v <= bound)} against the non-paged fp8 floor (max {max(floor):.2f}x)"
        )
        if twin and floor
        else f"not measured ({BENCH_COMMAND})"
    )
    return [f"long prefill within {bound}x of upstream's fp8 prefill path: {measured}{_prefill_reach(read)}"]


def _store_lines(store: Row | None) -> list[str]:
    ratios = [row["bf16_over_fp8"] for row in (store or {}).get("rows", []) if "bf16_over_fp8" in row]
    if not ratios:
        return []
    return [
        (
            f"fused bf16 store no slower than the fp8 store: {_count(ratios, lambda v: v <= 1.0)} sizes "
            f"({min(ratios):.2f}-{max(ratios):.2f}x its time)"
        )
    ]


def evaluate(read: Row, store: Row | None = None) -> list[str]:
    """Every target, one line each, from a read bench run (``bench_read.json``'s form) and, where
    given, a store bench run (``bench_store.json``'s)."""
    results = [r for r in read.get("results", []) if not r.get("skipped")]
    decode = _plain_decode(results)
    prefill = (
        _prefill_kernel_lines(read.get("long_prefill", []))
        if prefill_kernel_measured(read)
        else _old_prefill_lines(read)
    )
    return [
        *_hbm_lines(read, decode),
        *_long_decode_lines(decode),
        *_memory_lines(results),
        *_wide_lines(results),
        *_mtp_lines(read),
        *prefill,
        *_store_lines(store),
    ]
