"""Read-path benchmark (GPU): bf16 paged logits vs an fp8 baseline vs the naive gather, side by side.

    PYTHONPATH=<repo>:<patched tree>/python python -m verify.bench.read --out DIR [--profile quick]

Per shape, in one process on one GPU:

- **bf16**: patch 4's Triton kernel (``bf16_paged_mqa_logits``), its default config and a sweep
  of its block configs (``CONFIG_SWEEP``, then keys-per-program variants of the best); the best
  is reported.
- **fp8**: ``verify.core.fp8_twin`` -- a Triton twin of the bf16 kernel over upstream's fp8
  index-K pages (132 B per key), swept over the same small config set; beside it DeepGEMM's own
  ``fp8_paged_mqa_logits`` where a working DeepGEMM imports (the GPU runner's ``USE_DEEPGEMM=1``,
  :mod:`verify.bench.deepgemm_arm`), checked against the twin before it is timed.
- **gather**: gather each row's pages into a bf16 ``[rows, len, 128]`` copy, then bmm (what
  upstream's torch fallbacks do); skipped where its transient memory would pass
  ``--gather-limit-gb`` (40 by default) or the free memory.

Shapes: decode (rows = batch 1..64, every row ``keys`` long, its own pages), decode in a wide
output (a CUDA graph's capture width: the length-aware split against the best fixed split, both
as the indexer calls it, ``clean_logits=False``), prefill chunks (rows = the query tokens of one
request with causal lengths, one shared table), and, in ``verify.bench.read_scenarios``, MTP
verify (2 rows per request in groups against 1 row) and long prefill (one request of 8K-128K
tokens: the series' prefill kernel ``bf16_mqa_logits`` as the dispatch runs it, a sweep of its
configs (``--prefill-configs``), the paged kernel one row at a time, the fp8 twin, TileLang and
DeepGEMM's non-paged ``fp8_mqa_logits``, against the physical floors and the same run's dense
matmul rates, with issue 25's targets per length). ``compile`` (first, in fresh processes:
``verify.bench.compile_cost``): the kernel variants the scorers compile at CUDA-graph capture of
upstream's default batch sizes and in eager prefill, and their time, cold and on warm JIT caches,
bf16 beside upstream's fp8 path. The run also times ``torch.matmul`` (bf16) and
``torch._scaled_mm`` (fp8) at 8192^3 and the device copy: the roofs the figures are read against.
Times are medians of CUDA-graph replays (``verify.bench.timing``: calls captured back to back over enough replicas of
the keys that each call starts with a cold L2, as in a model step; a decode kernel of a few
microseconds timed eagerly measures Python's launch, not the GPU); ``--timing eager`` uses
``triton.testing.do_bench`` (L2 cleared before every run) instead. Bytes are the keys a row-by-row read
moves (sum of lengths x 256 B for bf16, x 132 B for fp8); for prefill the rows share keys, so
most reads hit L2 and "% of HBM" exceeds what HBM could do alone -- the unique key bytes are
reported beside it. Peak extra memory is ``max_memory_allocated`` over the call minus what was
allocated before it (the logits included; "beyond" subtracts them).

Writes ``DIR/bench_read.json`` and ``DIR/bench_read.csv`` (``DIR/bench_compile.json`` for the
compile section); prints the tables last.
``--dry-run`` lists shapes and memory estimates without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from verify.bench.read_scenarios import (
    LONG_PREFILL_TOKENS,
    MTP_SHAPES,
    PREFILL_SWEEP_SMALL,
    LongPrefillResult,
    MtpResult,
    long_prefill_table,
    mtp_table,
    run_long_prefill,
    run_mtp,
)
from verify.bench.targets import HBM_BYTES_PER_S, evaluate
from verify.bench.timing import graph_ms, replicas_for, replicate_pages
from verify.core.provenance import SERIES_HASH, series_hash
from verify.core.read_reference import (
    BF16_SLOT_BYTES,
    DIM,
    FP8_SLOT_BYTES,
    PAGE,
    causal_lengths,
    gather_peak_bytes,
    make_read_case,
    naive_gather_logits,
    pack_fp8_pages,
)

DECODE_BATCHES = {"full": [1, 2, 4, 8, 16, 32, 64], "quick": [1, 8, 64]}
DECODE_KEYS = {
    "full": [2048, 4096, 8192, 16384, 32768, 65536, 131072],
    "quick": [2048, 8192, 32768, 131072],
}
# Decode rows whose output is far wider than their keys, as under a CUDA graph captured for
# long contexts: the -inf fill past the keys costs writes; timed with and without it.
WIDE_DECODE = {
    "full": [(1, 8192, 131072), (8, 2048, 131072), (64, 8192, 131072), (64, 32768, 131072)],
    "quick": [(8, 2048, 131072), (64, 8192, 131072)],
}
# (query tokens, final compressed keys): chunks of long prompts (a chunked prefill's last chunk);
# whole single-request prefills are read_scenarios' long-prefill cases.
PREFILL_SHAPES = {
    "full": [(8192, 8192), (8192, 32768), (4096, 131072)],
    "quick": [(8192, 32768)],
}
SPLIT_VARIANTS = [256, 512, 1024, 2048, 4096, 8192]
MODES = ("decode", "prefill", "mtp", "long_prefill", "compile")
# Fixed splits the wide shapes' length-aware default is measured against, per block config
# (block_n, num_warps, num_stages): the decode default's and the prefill-style tiles.
WIDE_SPLITS = [128, 256, 512, 1024, 2048]
WIDE_BLOCKS = [(64, 4, 4), (128, 4, 3)]


@dataclass
class Shape:
    mode: str  # decode | prefill
    rows: int
    keys: int  # keys per row (decode) or the request's final keys (prefill)
    width: int = 0  # output width in keys; 0: one page past the keys (a graph-captured
    # decode has its capture-time width, often far wider than the live lengths)

    @property
    def name(self) -> str:
        wide = f",width={self.width}" if self.width else ""
        return f"{self.mode}[rows={self.rows},keys={self.keys}{wide}]"

    def lengths(self) -> list[int]:
        if self.mode == "decode":
            return [self.keys] * self.rows
        return causal_lengths(self.rows, self.keys)

    def extra_pages(self) -> int:
        return max(1, -(-(self.width - self.keys) // PAGE)) if self.width else 1

    def pool_pages(self) -> int:
        per_row = -(-self.keys // PAGE)
        return (per_row * self.rows if self.mode == "decode" else per_row) + 1

    def logits_bytes(self) -> int:
        return self.rows * (-(-self.keys // PAGE) + self.extra_pages()) * PAGE * 4

    def setup_bytes(self) -> int:
        """Pool (bf16 + fp8 copies) and a few logits buffers alive at once."""
        pages = self.pool_pages()
        return pages * PAGE * (BF16_SLOT_BYTES + FP8_SLOT_BYTES) + 3 * self.logits_bytes()


@dataclass
class Timing:
    label: str
    ms: float | None = None
    error: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    note: str | None = None  # e.g. graph capture failed, timed eagerly


@dataclass
class ShapeResult:
    shape: dict[str, Any]
    key_bytes_bf16: int
    key_bytes_fp8: int
    unique_key_bytes_bf16: int
    bf16_default: Timing | None = None
    bf16_best: Timing | None = None
    fp8_best: Timing | None = None
    # DeepGEMM's fp8_paged_mqa_logits where a working DeepGEMM imports (else its reason)
    fp8_deepgemm: Timing | None = None
    gather: Timing | None = None
    peak_extra_bytes: dict[str, int] = field(default_factory=dict)
    sweep: list[Timing] = field(default_factory=list)
    fp8_sweep: list[Timing] = field(default_factory=list)
    bf16_no_tail_fill: Timing | None = None  # wide shapes: the best config, fill_tail=False
    # Wide shapes, as the indexer calls the kernel (clean_logits=False): the default (length-
    # aware split) and the best of fixed splits WIDE_SPLITS x WIDE_BLOCKS.
    bf16_default_lean: Timing | None = None
    bf16_best_split_lean: Timing | None = None
    split_sweep_lean: list[Timing] = field(default_factory=list)
    skipped: str | None = None
    replicas: int = 1  # copies of the keys one graph replay rotates through (cold L2 per call)

    def derived(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        bf16 = self.bf16_best.ms if self.bf16_best else None
        fp8 = self.fp8_best.ms if self.fp8_best else None
        gather = self.gather.ms if self.gather else None
        if bf16:
            out["bf16_tb_s"] = self.key_bytes_bf16 / (bf16 * 1e-3) / 1e12
            out["bf16_hbm_pct"] = 100 * self.key_bytes_bf16 / (bf16 * 1e-3) / HBM_BYTES_PER_S
        if fp8:
            out["fp8_tb_s"] = self.key_bytes_fp8 / (fp8 * 1e-3) / 1e12
            out["fp8_hbm_pct"] = 100 * self.key_bytes_fp8 / (fp8 * 1e-3) / HBM_BYTES_PER_S
        if bf16 and fp8:
            out["ratio_bf16_over_fp8"] = bf16 / fp8
        deepgemm = self.fp8_deepgemm.ms if self.fp8_deepgemm else None
        if deepgemm:
            out["deepgemm_hbm_pct"] = 100 * self.key_bytes_fp8 / (deepgemm * 1e-3) / HBM_BYTES_PER_S
            if self.bf16_default and self.bf16_default.ms:
                out["ratio_bf16_over_deepgemm"] = self.bf16_default.ms / deepgemm
        if bf16 and gather:
            out["ratio_gather_over_bf16"] = gather / bf16
        if self.bf16_default and self.bf16_default.ms:
            out["bf16_default_hbm_pct"] = (
                100 * self.key_bytes_bf16 / (self.bf16_default.ms * 1e-3) / HBM_BYTES_PER_S
            )
            # The physical fp8 floor: its key bytes (132 B a key) at 4.8 TB/s.
            out["ratio_bf16_over_fp8_floor"] = (
                self.bf16_default.ms * 1e-3 / (self.key_bytes_fp8 / HBM_BYTES_PER_S)
            )
        lean, best_split = self.bf16_default_lean, self.bf16_best_split_lean
        if lean and lean.ms and best_split and best_split.ms:
            out["ratio_default_over_best_split_lean"] = lean.ms / best_split.ms
        return out


def shapes_for(profile: str, modes: list[str]) -> list[Shape]:
    shapes: list[Shape] = []
    if "decode" in modes:
        shapes += [Shape("decode", b, k) for k in DECODE_KEYS[profile] for b in DECODE_BATCHES[profile]]
        shapes += [Shape("decode", b, k, w) for b, k, w in WIDE_DECODE[profile]]
    if "prefill" in modes:
        shapes += [Shape("prefill", t, k) for t, k in PREFILL_SHAPES[profile]]
    return shapes


def bench_ms(fn: Callable[[], Any], warmup: int, rep: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def peak_extra(fn: Callable[[], Any]) -> int:
    """Bytes allocated at the call's peak beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return int(peak)


def timed(
    label: str,
    calls: list[Callable[[], Any]],
    args: argparse.Namespace,
    config: dict[str, Any] | None = None,
) -> Timing:
    """Times one implementation: ``calls`` are the same call on each replica of the inputs
    (graph timing rotates through them; eager timing uses the first)."""
    timing = Timing(label, config=config or {})
    try:
        calls[0]()  # compile / first-touch outside the timing
        torch.cuda.synchronize()
        if args.timing == "graph":
            try:
                timing.ms = graph_ms(calls, args.rep_ms)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as error:  # noqa: BLE001 - a call that cannot be captured is timed eagerly
                torch.cuda.synchronize()
                timing.note = f"graph capture failed ({type(error).__name__}); timed eagerly"
                timing.ms = bench_ms(calls[0], args.warmup_ms, args.rep_ms)
        else:
            timing.ms = bench_ms(calls[0], args.warmup_ms, args.rep_ms)
    except torch.cuda.OutOfMemoryError as error:
        timing.error = f"out of memory: {str(error).splitlines()[0][:120]}"
    except Exception as error:  # noqa: BLE001 - a config that does not compile (shared memory) is skipped
        timing.error = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    finally:
        torch.cuda.empty_cache()
    return timing


def best(timings: list[Timing]) -> Timing | None:
    done = [t for t in timings if t.ms is not None]
    return min(done, key=lambda t: t.ms or math.inf) if done else None


def sweep_configs(module: Any, level: str) -> list[Any]:
    sweep = list(module.CONFIG_SWEEP)
    if level == "full":
        return sweep
    if level == "none":
        return []
    wanted = [
        (64, 4, True, 3),
        (64, 4, True, 4),
        (64, 4, True, 5),
        (64, 4, False, 4),
        (128, 4, True, 3),
        (128, 8, True, 4),
        (256, 8, True, 2),
    ]
    return [c for c in sweep if (c.block_n, c.num_warps, c.swap_ab, c.num_stages) in wanted]


def deepgemm_paged(
    case: Any, fp8_view: torch.Tensor, tables: list[torch.Tensor], args: argparse.Namespace
) -> Timing:
    """DeepGEMM's paged fp8 scorer on the same pages as the twin, checked against it first."""
    from verify.bench import deepgemm_arm
    from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

    label = "DeepGEMM fp8_paged_mqa_logits"
    dg, how = deepgemm_arm.load()
    if dg is None:
        return Timing(label, error=how)
    try:
        calls, diff = deepgemm_arm.paged_decode_calls(dg, case, fp8_view, tables, fp8_paged_mqa_logits_twin)
    except Exception as error:  # noqa: BLE001 - a crash or a disagreement is the arm's result
        return Timing(label, error=f"{type(error).__name__}: {error}"[:300])
    timing = timed(label, calls, args)
    timing.note = "; ".join(filter(None, [timing.note, f"calc_diff vs the twin {diff:.1e}", how]))
    return timing


def run_shape(shape: Shape, module: Any, args: argparse.Namespace) -> ShapeResult:
    from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

    lengths = shape.lengths()
    visible = sum(lengths)
    result = ShapeResult(
        shape=asdict(shape),
        key_bytes_bf16=visible * BF16_SLOT_BYTES,
        key_bytes_fp8=visible * FP8_SLOT_BYTES,
        unique_key_bytes_bf16=(visible if shape.mode == "decode" else shape.keys) * BF16_SLOT_BYTES,
    )
    free, _ = torch.cuda.mem_get_info()
    if shape.setup_bytes() > 0.85 * free:
        result.skipped = f"needs ~{shape.setup_bytes() / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        return result
    case = make_read_case(
        lengths,
        heads=args.heads,
        seed=args.seed,
        shared_table=shape.mode == "prefill",
        extra_pages=shape.extra_pages(),
        device="cuda",
    )
    fp8_pool, _ = pack_fp8_pages(case.pool, dequantized=False)
    # Replicas of the keys (same pages and order, distinct memory) for graph timing.
    copies = (
        replicas_for(result.unique_key_bytes_bf16, result.key_bytes_bf16) if args.timing == "graph" else 1
    )
    result.replicas = copies
    bf16_pool, tables = replicate_pages(case.pool, case.page_table, copies)
    fp8_big, _ = replicate_pages(fp8_pool, case.page_table, copies)
    fp8_view = fp8_big.view(-1, PAGE, 1, FP8_SLOT_BYTES)
    bf16_view = bf16_pool.view(-1, PAGE, 1, DIM)
    with_config = module.bf16_paged_mqa_logits_with_config

    def bf16(config: Any = None, fill_tail: bool = True) -> list[Callable[[], torch.Tensor]]:
        return [
            partial(
                with_config,
                case.q,
                bf16_view,
                case.weights,
                case.seq_lens,
                table,
                case.max_seq_len,
                config,
                fill_tail=fill_tail,
            )
            for table in tables
        ]

    def fp8(config: Any = None) -> list[Callable[[], torch.Tensor]]:
        return [
            partial(
                fp8_paged_mqa_logits_twin,
                case.q,
                fp8_view,
                case.weights,
                case.seq_lens,
                table,
                None,
                case.max_seq_len,
                config=config,
            )
            for table in tables
        ]

    def gather() -> list[Callable[[], torch.Tensor]]:
        return [
            partial(
                naive_gather_logits, case.q, bf16_pool, case.weights, case.seq_lens, table, case.max_seq_len
            )
            for table in tables
        ]

    default_cfg = module.select_config(case.rows, case.max_seq_len, case.heads)
    cls = type(default_cfg)
    result.bf16_default = timed("bf16 default", bf16(None), args, asdict(default_cfg))
    if shape.width:
        # A wide output is timed as the indexer calls the kernel (clean_logits=False): the
        # length-aware default against fixed splits (the block-config sweep is the full-width
        # shapes' business).
        result.bf16_default_lean = timed(
            "bf16 default, clean_logits=False", bf16(None, fill_tail=False), args, asdict(default_cfg)
        )
        result.bf16_no_tail_fill = result.bf16_default_lean
        for block_n, warps, stages in WIDE_BLOCKS:
            for split in WIDE_SPLITS:
                if split < 2 * block_n:
                    continue
                fixed = cls(block_n=block_n, num_warps=warps, num_stages=stages, split_n=split)
                result.split_sweep_lean.append(
                    timed(
                        "bf16 fixed split, clean_logits=False",
                        bf16(fixed, fill_tail=False),
                        args,
                        asdict(fixed),
                    )
                )
        result.bf16_best_split_lean = best(result.split_sweep_lean)
    else:
        configs = sweep_configs(module, args.sweep)
        result.sweep = [timed("bf16", bf16(c), args, asdict(c)) for c in configs]
        top = best([result.bf16_default] + result.sweep)
        if top is not None and args.sweep != "none":
            base = {k: v for k, v in top.config.items() if k != "split_n"}
            for split in SPLIT_VARIANTS:
                if split >= base["block_n"] * 2 and split <= max(case.max_seq_len, base["block_n"] * 2):
                    cfg = cls(split_n=split, **base)
                    result.sweep.append(timed("bf16", bf16(cfg), args, asdict(cfg)))
    result.bf16_best = best([result.bf16_default] + result.sweep)

    # The baseline gets the same block-config sweep (not the split variants), so the
    # bf16/fp8 ratio compares each format at its best.
    fp8_configs = [None] + sweep_configs(module, args.sweep)
    result.fp8_sweep = [
        timed("fp8 twin", fp8(c), args, asdict(c) if c else {"default": True}) for c in fp8_configs
    ]
    result.fp8_best = best(result.fp8_sweep)
    if not shape.width:
        result.fp8_deepgemm = deepgemm_paged(case, fp8_view, tables, args)

    gather_bytes = gather_peak_bytes(case.rows, case.page_table.shape[1], case.heads)
    free, _ = torch.cuda.mem_get_info()
    limit = min(args.gather_limit_gb * 1e9, 0.9 * free)
    if args.no_gather:
        result.gather = Timing("gather", error="disabled (--no-gather)")
    elif gather_bytes > limit:
        result.gather = Timing(
            "gather",
            error=f"skipped: needs ~{gather_bytes / 1e9:.1f} GB > limit {limit / 1e9:.1f} GB (would OOM)",
        )
    else:
        result.gather = timed("gather", gather(), args)

    best_cfg = result.bf16_best.config if result.bf16_best else None
    memory_fns: dict[str, Callable[[], Any]] = {
        "bf16": bf16(type(default_cfg)(**best_cfg) if best_cfg else None)[0],
        "fp8": fp8(None)[0],
    }
    if result.gather and result.gather.ms is not None:
        memory_fns["gather"] = gather()[0]
    for name, fn in memory_fns.items():
        try:
            result.peak_extra_bytes[name] = peak_extra(fn)
        except torch.cuda.OutOfMemoryError:
            result.peak_extra_bytes[name] = -1
        torch.cuda.empty_cache()
    result.peak_extra_bytes["logits"] = case.rows * case.max_seq_len * 4
    return result


def dense_matmul(args: argparse.Namespace, n: int = 8192) -> dict[str, Any]:
    """The same run's dense matmul rates, ``n``^3: bf16 (``torch.matmul``) and fp8 e4m3 with fp32
    scales (``torch._scaled_mm``, bf16 out), as TFLOP/s -- the MMA roof the long prefill is
    measured against."""
    out: dict[str, Any] = {"n": n}
    a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    ms = bench_ms(lambda: torch.matmul(a, b), args.warmup_ms, args.rep_ms)
    out["bf16_ms"], out["bf16_tflops"] = ms, 2 * n**3 / (ms * 1e-3) / 1e12
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # column-major B
        one = torch.ones((), device="cuda")
        ms8 = bench_ms(
            lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), args.warmup_ms, args.rep_ms
        )
        out["fp8_ms"], out["fp8_tflops"] = ms8, 2 * n**3 / (ms8 * 1e-3) / 1e12
    except Exception as error:  # noqa: BLE001 - recorded; the bf16 rate is the one the targets use
        out["fp8_error"] = f"{type(error).__name__}: {error}"[:200]
    return out


def copy_ceiling(args: argparse.Namespace) -> dict[str, float]:
    """Device-to-device copy of 2 GiB: bytes read plus written per second (the practical ceiling)."""
    n = 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), args.warmup_ms, args.rep_ms)
    return {"copy_ms": ms, "copy_tb_s": 2 * n / (ms * 1e-3) / 1e12}


def _fmt_ms(t: Timing | None) -> str:
    if t is None:
        return "-"
    return f"{t.ms * 1e3:9.1f}" if t.ms is not None else f"{'n/a':>9}"


def _cfg_tag(t: Timing | None) -> str:
    if t is None or t.ms is None or not t.config or "block_n" not in t.config:
        return "-"
    c = t.config
    split = c["split_n"] or "auto"
    return f"n{c['block_n']}/w{c['num_warps']}/s{c['num_stages']}/{'swap' if c['swap_ab'] else 'qk'}/k{split}"


def table(results: list[ShapeResult], ceiling: dict[str, float]) -> str:
    head = (
        f"{'shape':<40} {'bf16 us':>9} {'TB/s':>5} {'%4.8':>5} {'fp8 us':>9} {'%4.8':>5} {'bf16/fp8':>8} "
        f"{'gather us':>9} {'g/bf16':>7} {'MB extra bf16/gather':>21}  best bf16 config"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        name = Shape(**r.shape).name
        if r.skipped:
            lines.append(f"{name:<40} skipped: {r.skipped}")
            continue
        d = r.derived()
        extra_bf16 = r.peak_extra_bytes.get("bf16", -1) - r.peak_extra_bytes.get("logits", 0)
        extra_gather = r.peak_extra_bytes.get("gather")
        gather_mb = f"{(extra_gather - r.peak_extra_bytes['logits']) / 2**20:.0f}" if extra_gather else "-"
        lines.append(
            f"{name:<40} {_fmt_ms(r.bf16_best)} {d.get('bf16_tb_s', 0):5.2f} {d.get('bf16_hbm_pct', 0):5.0f} "
            f"{_fmt_ms(r.fp8_best)} {d.get('fp8_hbm_pct', 0):5.0f} {d.get('ratio_bf16_over_fp8', float('nan')):8.2f} "
            f"{_fmt_ms(r.gather)} {d.get('ratio_gather_over_bf16', float('nan')):7.1f} "
            f"{extra_bf16 / 2**20:>10.1f}/{gather_mb:>10}  {_cfg_tag(r.bf16_best)}"
            + (f"  no tail fill: {_fmt_ms(r.bf16_no_tail_fill).strip()} us" if r.bf16_no_tail_fill else "")
        )
    lines.append("-" * len(head))
    lines.append(
        f"copy ceiling: {ceiling.get('copy_tb_s', float('nan')):.2f} TB/s read+write "
        f"({100 * ceiling.get('copy_tb_s', 0) * 1e12 / HBM_BYTES_PER_S:.0f}% of 4.8)"
    )
    return "\n".join(lines)


def write_outputs(
    out_dir: Path,
    meta: dict[str, Any],
    results: list[ShapeResult],
    mtp: list[MtpResult] | None = None,
    long_prefill: list[LongPrefillResult] | None = None,
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "suite": "bench_read",
        "meta": meta,
        "results": [{**asdict(r), "derived": r.derived()} for r in results],
    }
    if mtp is not None:
        payload["mtp"] = [{**asdict(r), "derived": r.derived()} for r in mtp]
        _write_csv(out_dir / "bench_mtp.csv", payload["mtp"])
    if long_prefill is not None:
        payload["long_prefill"] = [{**asdict(r), "derived": r.derived()} for r in long_prefill]
        _write_csv(out_dir / "bench_long_prefill.csv", payload["long_prefill"])
    (out_dir / "bench_read.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    with (out_dir / "bench_read.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "mode",
                "rows",
                "keys",
                "width",
                "key_bytes_bf16",
                "bf16_us",
                "bf16_default_us",
                "bf16_config",
                "bf16_hbm_pct",
                "fp8_us",
                "fp8_hbm_pct",
                "ratio_bf16_over_fp8",
                "gather_us",
                "ratio_gather_over_bf16",
                "peak_extra_bf16",
                "peak_extra_fp8",
                "peak_extra_gather",
                "logits_bytes",
                "bf16_no_tail_fill_us",
                "bf16_default_lean_us",
                "bf16_best_split_lean_us",
                "bf16_best_split_lean_config",
                "note",
            ]
        )
        for r in results:
            d = r.derived()

            def us(t: Timing | None) -> str:
                return f"{t.ms * 1e3:.2f}" if t is not None and t.ms is not None else ""

            writer.writerow(
                [
                    r.shape["mode"],
                    r.shape["rows"],
                    r.shape["keys"],
                    r.shape.get("width", 0),
                    r.key_bytes_bf16,
                    us(r.bf16_best),
                    us(r.bf16_default),
                    _cfg_tag(r.bf16_best),
                    f"{d.get('bf16_hbm_pct', '')}",
                    us(r.fp8_best),
                    f"{d.get('fp8_hbm_pct', '')}",
                    f"{d.get('ratio_bf16_over_fp8', '')}",
                    us(r.gather),
                    f"{d.get('ratio_gather_over_bf16', '')}",
                    r.peak_extra_bytes.get("bf16", ""),
                    r.peak_extra_bytes.get("fp8", ""),
                    r.peak_extra_bytes.get("gather", ""),
                    r.peak_extra_bytes.get("logits", ""),
                    us(r.bf16_no_tail_fill),
                    us(r.bf16_default_lean),
                    us(r.bf16_best_split_lean),
                    _cfg_tag(r.bf16_best_split_lean),
                    r.skipped or (r.gather.error if r.gather and r.gather.error else ""),
                ]
            )
    return out_dir / "bench_read.json"


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """One line per scenario: its scalar fields, each arm's milliseconds, the derived figures."""
    flat: list[dict[str, Any]] = []
    for row in rows:
        line: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(value, dict) and "ms" in value:
                line[f"{key}_ms"] = value.get("ms")
            elif isinstance(value, dict):
                for sub, item in value.items():
                    if isinstance(item, dict):
                        line[f"{key}.{sub}_ms"] = item.get("ms")
                    elif not isinstance(item, (list, str)) or key == "derived":
                        line[f"{key}.{sub}"] = item
            elif not isinstance(value, list):
                line[key] = value
        flat.append(line)
    names = list(dict.fromkeys(k for line in flat for k in line))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        writer.writerows(flat)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("verify/results/bench"))
    parser.add_argument("--profile", choices=["full", "quick"], default="full")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=list(MODES),
        default=list(MODES),
        help="decode (incl. wide outputs), prefill (chunks of long prompts), mtp (verify rows), "
        "long_prefill (one request of 8K-128K tokens), compile (kernel variants compiled at graph capture "
        "and in eager prefill, and their time: verify.bench.compile_cost)",
    )
    parser.add_argument(
        "--prefill-configs",
        nargs="*",
        default=None,
        metavar="SPEC",
        help="the long prefill's sweep of the prefill kernel: each SPEC 'field=value[,field=value]' over its "
        "default config (e.g. block_r=32 num_warps=4,maxnreg=none); default: PREFILL_SWEEP_SMALL unless --sweep none; "
        "no SPEC: none",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        default=Path("/tmp/bf16k-compile-cost"),
        help="where the compile section's passes keep their JIT caches (emptied first)",
    )
    parser.add_argument("--sweep", choices=["none", "small", "full"], default="small")
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gather-limit-gb", type=float, default=40.0)
    parser.add_argument("--no-gather", action="store_true")
    parser.add_argument(
        "--timing",
        choices=["graph", "eager"],
        default="graph",
        help="graph: CUDA-graph replay over cold replicas (default); eager: triton do_bench per launch",
    )
    parser.add_argument("--warmup-ms", type=int, default=10)
    parser.add_argument("--rep-ms", type=int, default=40)
    parser.add_argument(
        "--dry-run", action="store_true", help="list shapes and memory estimates; no GPU needed"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = shapes_for(args.profile, args.modes)
    if args.dry_run:
        for requests, keys, next_n in MTP_SHAPES[args.profile] if "mtp" in args.modes else []:
            print(f"mtp[requests={requests},keys={keys},rows/request={next_n}]")
        for tokens in LONG_PREFILL_TOKENS[args.profile] if "long_prefill" in args.modes else []:
            print(f"long_prefill[tokens={tokens},keys={tokens // 4}]")
        for s in shapes:
            g = gather_peak_bytes(s.rows, -(-s.keys // PAGE) + s.extra_pages(), args.heads)
            note = "gather skipped" if g > args.gather_limit_gb * 1e9 else "gather runs"
            print(
                f"{s.name:<40} setup ~{s.setup_bytes() / 2**30:6.2f} GiB  gather ~{g / 1e9:8.1f} GB ({note})"
            )
        return 0
    if not torch.cuda.is_available():
        print("the read bench needs a CUDA GPU (use --dry-run to list shapes)", file=sys.stderr)
        return 2
    import triton

    from verify.core.upstream import load_bf16_kernel_module

    module, route = load_bf16_kernel_module()
    meta: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "gpu": torch.cuda.get_device_name(),
        "kernel_module": getattr(module, "__file__", "?"),
        "kernel_route": route,
        "fp8_baseline": "verify.core.fp8_twin (Triton twin over upstream's 132-B fp8 pages); DeepGEMM's own arm where it imports",
        "timing": (
            f"CUDA-graph replay median per call, rep {args.rep_ms} ms, keys replicated to >= 256 MiB per replay (cold L2)"
            if args.timing == "graph"
            else f"triton.testing.do_bench median, warmup {args.warmup_ms} ms, rep {args.rep_ms} ms, L2 cleared per run"
        ),
        "profile": args.profile,
        "sweep": args.sweep,
        "heads": args.heads,
        SERIES_HASH: series_hash(),
    }
    ceiling = copy_ceiling(args)
    meta["copy_ceiling"] = ceiling
    matmul = dense_matmul(args)
    meta["dense_matmul"] = matmul
    args.dense_bf16_tflops, args.dense_fp8_tflops = matmul.get("bf16_tflops"), matmul.get("fp8_tflops")
    if args.prefill_configs is None:
        args.prefill_configs = [] if args.sweep == "none" else list(PREFILL_SWEEP_SMALL)
    try:
        from verify.core.upstream import load_bf16_prefill_module

        prefill_module, prefill_route = load_bf16_prefill_module()
        meta["prefill_kernel_module"] = getattr(prefill_module, "__file__", "?")
        meta["prefill_kernel_route"] = prefill_route
    except Exception as error:  # noqa: BLE001 - a series without the prefill kernel: the paged arm is dispatched
        prefill_module = None
        meta["prefill_kernel_module"] = f"not loaded: {type(error).__name__}: {error}"[:200]
    print(json.dumps(meta), flush=True)
    compile_result: dict[str, Any] | None = None
    if "compile" in args.modes:
        # First, in fresh processes: the cold pass must meet empty JIT caches.
        from verify.bench import compile_cost

        t0 = time.time()
        compile_result = compile_cost.run_passes(args.out, args.compile_cache)
        print(compile_cost.table(compile_result), flush=True)
        print(f"compile passes: {time.time() - t0:.1f}s", flush=True)
    results: list[ShapeResult] = []
    mtp: list[MtpResult] | None = [] if "mtp" in args.modes else None
    long_prefill: list[LongPrefillResult] | None = [] if "long_prefill" in args.modes else None
    start = time.time()

    def save() -> Path:  # after every case: a run cut short keeps what it measured
        return write_outputs(args.out, meta, results, mtp, long_prefill)

    def time_shape(shape: Shape) -> None:
        t0 = time.time()
        try:
            r = run_shape(shape, module, args)
        except torch.cuda.OutOfMemoryError as error:
            r = ShapeResult(
                asdict(shape), 0, 0, 0, skipped=f"out of memory: {str(error).splitlines()[0][:120]}"
            )
            torch.cuda.empty_cache()
        results.append(r)
        d = r.derived()
        print(
            f"{shape.name:<40} {time.time() - t0:5.1f}s  bf16 {_fmt_ms(r.bf16_best)} us "
            f"({d.get('bf16_hbm_pct', 0):.0f}% of 4.8 TB/s, {_cfg_tag(r.bf16_best)})  fp8 {_fmt_ms(r.fp8_best)} us  "
            f"gather {_fmt_ms(r.gather)} us"
            + (
                f"  default/best split (clean_logits=False) {d['ratio_default_over_best_split_lean']:.2f}"
                if "ratio_default_over_best_split_lean" in d
                else ""
            )
            + f" {r.skipped or ''}",
            flush=True,
        )
        save()

    # What this run is for first (MTP, wide outputs, long prefill), then the grids.
    for requests, keys, next_n in MTP_SHAPES[args.profile] if mtp is not None else []:
        assert mtp is not None
        t0 = time.time()
        try:
            m = run_mtp(
                requests,
                keys,
                next_n,
                module,
                args,
                timed,
                deepgemm=lambda case, view, tables: deepgemm_paged(case, view, tables, args),
            )
        except torch.cuda.OutOfMemoryError as error:
            m = MtpResult(
                requests, keys, next_n, 0, skipped=f"out of memory: {str(error).splitlines()[0][:120]}"
            )
            torch.cuda.empty_cache()
        mtp.append(m)
        print(
            f"mtp[{requests}x{keys}x{next_n}] {time.time() - t0:5.1f}s {m.derived()} {m.skipped or ''}",
            flush=True,
        )
        save()
    for shape in [s for s in shapes if s.width]:
        time_shape(shape)
    for tokens in LONG_PREFILL_TOKENS[args.profile] if long_prefill is not None else []:
        assert long_prefill is not None
        t0 = time.time()
        try:
            p = run_long_prefill(tokens, module, args, timed, prefill_module=prefill_module)
        except torch.cuda.OutOfMemoryError as error:
            p = LongPrefillResult(
                tokens, tokens // 4, 0, skipped=f"out of memory: {str(error).splitlines()[0][:120]}"
            )
            torch.cuda.empty_cache()
        long_prefill.append(p)
        print(f"long_prefill[{tokens}] {time.time() - t0:5.1f}s {p.derived()} {p.skipped or ''}", flush=True)
        save()
    for shape in [s for s in shapes if not s.width]:
        time_shape(shape)
    meta["seconds"] = round(time.time() - start, 1)
    path = save()
    print(f"\nresults: {path}")
    print(table(results, ceiling))
    if mtp:
        print(mtp_table(mtp))
    if long_prefill:
        print(long_prefill_table(long_prefill))
    if compile_result is not None:
        from verify.bench import compile_cost

        print(compile_cost.table(compile_result))
    targets = evaluate(json.loads(path.read_text()))  # the README's target lines, for this run
    print(
        "Targets (each: the target, then how many shapes meet it):\n"
        + "\n".join(f"- {line}" for line in targets)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
