"""Read-bench scenarios production spends its time in (GPU): MTP verify rows and long prefill.

**MTP verify.** With MTP speculative decoding the target model verifies ``next_n`` draft tokens
per request; the indexer flattens them into ``next_n`` consecutive rows with one page table
and causal lengths. Timed per shape (``requests x keys``), as the indexer calls the kernel
(``clean_logits=False``, default launch config, CUDA-graph replay over cold copies of the keys):

- ``one_row``: one row per request (what decode without MTP reads);
- ``grouped``: ``next_n`` rows per request in ``group_rows=next_n`` mode (what the dispatch
  runs): each key tile is read once per request;
- ``ungrouped``: the same rows one at a time (each row re-reads its request's keys);
- ``fp8``: the fp8 twin over the same rows, one at a time (upstream's indexer flattens the rows
  the same way and hands DeepGEMM ``next_n = 1``); ``deepgemm``: DeepGEMM's own
  ``fp8_paged_mqa_logits`` on those rows where a working DeepGEMM imports (else why not);
- ``grouped_sweep`` (unless ``--sweep none``): the grouped mode under other launch configs
  (``grouped_sweep_configs``), each checked against the default's logits before it is timed;
  ``grouped_best`` is the fastest, the default included. A measurement of what a config change
  could buy, not what the dispatch runs.

Target (:mod:`verify.bench.targets`): ``grouped <= 1.15 x one_row``.

**Long prefill.** One request of ``tokens`` prompt tokens: ``tokens`` query rows with causal
lengths over ``tokens / 4`` compressed keys, scored in row chunks whose logits fit
``LOGITS_CHUNK_BYTES`` (upstream chunks by a free-memory budget; one chunk's logits are live at a
time), every chunk in one timed graph:

- ``bf16``: the paged bf16 kernel, one row at a time (the prefill config): what the dispatch
  runs (grouped rows need the kernel's length-aware split, which prefill sizes do not take);
- ``fp8_twin``: the Triton fp8 twin over upstream's 132-B pages (upstream's fp8 *paged* path's
  shape); ``tilelang``: upstream's TileLang fp8 paged kernel when ``tilelang`` is installed;
- floors: upstream's default for this case is the *non-paged* DeepGEMM ``fp8_mqa_logits`` over a
  gathered copy of the request's keys. Where a working DeepGEMM imports (GPU runner:
  ``USE_DEEPGEMM=1``) that call is timed too (``deepgemm_nonpaged``, ``verify.bench.deepgemm_arm``);
  the floor is always computed, as the physical bound, not a measurement: ``max(bytes / 4.8 TB/s, FLOPs / dense fp8 peak)``
  with the bytes it must move (q, weights, the gather of the keys and the logits it writes) and
  the MMA work of ``sum_r len_r`` keys x 64 heads x 128 dims. The same floor at the bf16 peak is
  what bf16 could reach.

Writes ``mtp`` and ``long_prefill`` sections into the read bench's JSON and CSV files.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import torch

from verify.bench.shared_memory import grouped_smem_bytes
from verify.bench.targets import HBM_BYTES_PER_S
from verify.bench.timing import replicas_for, replicate_pages
from verify.core.read_reference import (
    BF16_SLOT_BYTES,
    DIM,
    FP8_SLOT_BYTES,
    PAGE,
    ReadCase,
    causal_lengths,
    make_read_case,
    pack_fp8_pages,
    verify_lengths,
)

# H200 SXM datasheet, dense tensor-core peaks.
BF16_PEAK_FLOPS = 989.4e12
FP8_PEAK_FLOPS = 1978.9e12
# Rows of at most this many keys get an empty range from the dispatch (the sgl-kernel top-k takes
# them whole without reading logits): upstream's non-paged plan, for fp8 and bf16 alike.
INDEX_TOPK = 512
# The prefill kernel's sweep (--prefill-configs): each spec overrides fields of the default config.
PREFILL_SWEEP_SMALL = (
    "block_r=32",
    "block_r=128",
    "num_warps=4",
    "maxnreg=none",
    "block_k=128",
    "block_k=128,num_warps=4",
)
LOGITS_CHUNK_BYTES = 4 * 2**30
# (requests, final keys, rows per request)
MTP_SHAPES = {
    "full": [(8, 8192, 2), (8, 32768, 2), (64, 8192, 2), (64, 32768, 2), (8, 131072, 2), (8, 32768, 4)],
    "quick": [(8, 32768, 2), (64, 32768, 2)],
}
LONG_PREFILL_TOKENS = {"full": [8192, 32768, 131072], "quick": [32768]}


@dataclass
class MtpResult:
    requests: int
    keys: int
    next_n: int
    key_bytes_bf16: int  # keys one read of every request's keys moves
    one_row: dict[str, Any] | None = None
    grouped: dict[str, Any] | None = None
    ungrouped: dict[str, Any] | None = None
    fp8: dict[str, Any] | None = None
    deepgemm: dict[str, Any] | None = None  # DeepGEMM's paged fp8 scorer, rows one at a time
    grouped_sweep: list[dict[str, Any]] = field(default_factory=list)
    grouped_best: dict[str, Any] | None = None  # fastest grouped timing, the default included
    replicas: int = 1
    skipped: str | None = None

    def derived(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        arms = ("one_row", "grouped", "ungrouped", "fp8", "deepgemm", "grouped_best")
        ms = {k: (getattr(self, k) or {}).get("ms") for k in arms}
        if ms["one_row"] and ms["grouped"]:
            out["ratio_grouped_over_one_row"] = ms["grouped"] / ms["one_row"]
        if ms["one_row"] and ms["grouped_best"]:
            out["ratio_best_grouped_over_one_row"] = ms["grouped_best"] / ms["one_row"]
        if ms["grouped"] and ms["deepgemm"]:
            out["ratio_grouped_over_deepgemm"] = ms["grouped"] / ms["deepgemm"]
        if ms["one_row"] and ms["ungrouped"]:
            out["ratio_ungrouped_over_one_row"] = ms["ungrouped"] / ms["one_row"]
        if ms["grouped"] and ms["fp8"]:
            out["ratio_grouped_over_fp8"] = ms["grouped"] / ms["fp8"]
        if ms["grouped"]:
            out["grouped_hbm_pct"] = 100 * self.key_bytes_bf16 / (ms["grouped"] * 1e-3) / HBM_BYTES_PER_S
        return out


@dataclass
class LongPrefillResult:
    tokens: int
    keys: int
    rows_per_chunk: int
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    floors: dict[str, Any] = field(default_factory=dict)
    peak_extra_bytes: dict[str, int] = field(default_factory=dict)
    dispatch_arm: str = ""
    skipped: str | None = None
    # the prefill kernel under other launch configs (each checked against the default's logits)
    prefill_sweep: list[dict[str, Any]] = field(default_factory=list)
    dense_bf16_tflops: float | None = None  # the same run's dense bf16 matmul rate
    dense_fp8_tflops: float | None = None

    def derived(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        ms = {k: v.get("ms") for k, v in self.arms.items()}
        flops = self.floors.get("flops")
        for name, value in ms.items():
            if value and flops:
                out[f"{name}_tflops"] = flops / (value * 1e-3) / 1e12
        done = [t for t in self.prefill_sweep if t.get("ms")]
        if done and flops:
            top = min(done, key=lambda t: t["ms"])
            out["bf16_prefill_best_swept_tflops"] = flops / (top["ms"] * 1e-3) / 1e12
        prefill, nonpaged = ms.get("bf16_prefill"), ms.get("deepgemm_nonpaged")
        if prefill and nonpaged:
            out["ratio_bf16_prefill_over_deepgemm_nonpaged"] = prefill / nonpaged
        if ms.get("bf16_prefill") and self.dense_bf16_tflops and flops:
            out["bf16_prefill_pct_of_dense_bf16"] = 100 * out["bf16_prefill_tflops"] / self.dense_bf16_tflops
        bf16 = ms.get(self.dispatch_arm)
        if bf16 and ms.get("fp8_twin"):
            out["ratio_dispatch_over_fp8_twin"] = bf16 / ms["fp8_twin"]
        if bf16 and ms.get("tilelang"):
            out["ratio_dispatch_over_tilelang"] = bf16 / ms["tilelang"]
        if bf16 and ms.get("deepgemm_nonpaged"):
            out["ratio_dispatch_over_deepgemm_nonpaged"] = bf16 / ms["deepgemm_nonpaged"]
        if bf16 and self.floors.get("fp8_nonpaged_ms"):
            out["ratio_dispatch_over_fp8_nonpaged_floor"] = bf16 / self.floors["fp8_nonpaged_ms"]
        if bf16 and self.floors.get("bf16_ms"):
            out["dispatch_pct_of_bf16_floor"] = 100 * self.floors["bf16_ms"] / bf16
        return out


def dispatch_ranges(lengths: list[int], topk: int | None = None) -> list[int]:
    """``ke`` per row as upstream's non-paged plan hands it to the scorer: a row of at most
    ``topk`` (default ``INDEX_TOPK``) keys gets an empty range (``ke = ks = 0``)."""
    topk = INDEX_TOPK if topk is None else topk
    return [n if n > topk else 0 for n in lengths]


def prefill_floors(lengths: list[int], keys: int, heads: int) -> dict[str, Any]:
    """Physical floors of one long prefill's logits (ms): the bytes each path must move at
    4.8 TB/s and its MMA work at the dense peak. The non-paged fp8 path reads q (fp8) and the
    head weights, gathers the keys (read 132 B, write 132 B) and reads the copy once, and
    writes the logits of every visible position (clean_logits=False); the paged bf16 path reads
    q, weights and the bf16 keys once (later reads come from L2) and writes the same logits."""
    rows = len(lengths)
    visible = sum(lengths)
    flops = 2.0 * heads * DIM * visible
    q_bytes = rows * heads * (DIM + 4)  # fp8 q + fp32 weights
    logits_bytes = 4 * visible
    fp8_bytes = q_bytes + 3 * keys * FP8_SLOT_BYTES + logits_bytes
    bf16_bytes = q_bytes + keys * BF16_SLOT_BYTES + logits_bytes
    fp8_mem, fp8_mma = fp8_bytes / HBM_BYTES_PER_S * 1e3, flops / FP8_PEAK_FLOPS * 1e3
    bf16_mem, bf16_mma = bf16_bytes / HBM_BYTES_PER_S * 1e3, flops / BF16_PEAK_FLOPS * 1e3
    return {
        "flops": flops,
        "fp8_nonpaged_bytes": fp8_bytes,
        "fp8_nonpaged_memory_ms": fp8_mem,
        "fp8_nonpaged_compute_ms": fp8_mma,
        "fp8_nonpaged_ms": max(fp8_mem, fp8_mma),
        "bf16_bytes": bf16_bytes,
        "bf16_memory_ms": bf16_mem,
        "bf16_compute_ms": bf16_mma,
        "bf16_ms": max(bf16_mem, bf16_mma),
        # what the dispatch scores of them (rows of at most top-k keys get empty ranges)
        "flops_dispatch": 2.0 * heads * DIM * sum(dispatch_ranges(lengths)),
        "source": "physical floor (not measured): the least time DeepGEMM's fp8_mqa_logits could take",
    }


def expand_to_verify_rows(case: ReadCase, next_n: int, seed: int) -> ReadCase:
    """``next_n`` verify rows per row of ``case`` (a request), sharing its page table, with
    causal lengths ending at its length, fresh queries and weights."""
    gen = torch.Generator(device=case.q.device).manual_seed(seed)
    rows = case.rows * next_n
    q = torch.randn((rows, 1, case.heads, DIM), generator=gen, device=case.q.device).to(case.q.dtype)
    weights = torch.randn((rows, case.heads), generator=gen, device=case.q.device) * case.heads**-0.5
    lengths = verify_lengths(case.seq_lens.tolist(), next_n)
    # verify_lengths counts a request's last row as seeing exactly the request's keys.
    return replace(
        case,
        q=q,
        weights=weights,
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=case.q.device),
        page_table=case.page_table.repeat_interleave(next_n, dim=0).contiguous(),
    )


def _timing(label: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any]:
    """A read bench ``Timing`` as a dict (the JSON form)."""
    return asdict(fn(label, *args, **kw))


# Grouped-mode launch configs the MTP sweep tries besides the default: (block_n, num_warps,
# num_stages, swap_ab). A group's query columns (rows x heads) widen the score tile, so smaller key
# tiles and more warps per tile are candidates the one-row sweep never needed. 64/w4 at two and
# four stages: what groups of 4 run on sm_120 and ran before the stages followed shared memory;
# 64/w8/s3: groups of 4 without sm_100's register spills (verify.bench.read_compile).
GROUPED_SWEEP_SMALL = [
    (32, 4, 4, True),
    (32, 4, 6, True),
    (64, 4, 2, True),
    (64, 4, 3, True),
    (64, 4, 4, True),
    (64, 4, 5, True),
    (64, 8, 3, True),
    (64, 8, 4, True),
    (64, 4, 4, False),
    (128, 4, 3, True),
    (128, 8, 3, True),
    (128, 8, 4, True),
]
GROUPED_SPLIT_CAPS = [1024, 4096]  # max_split_n variants of the fastest block config
SMEM_LIMIT = 220 * 1024  # an H100/H200 program's shared memory, with headroom


def grouped_sweep_configs(module: Any, next_n: int, heads: int, level: str) -> list[Any]:
    """Length-aware configs (the only ones grouped rows run under) for ``level`` (none, small,
    full), the default left out and shared-memory misfits dropped: ``stages`` key tiles of
    ``block_n`` x 256 B plus the group's query tile."""
    if level == "none":
        return []
    # what the dispatch runs for such a group (the kernel module's own rule, whatever it is)
    default = module.select_config(1, 0, heads, next_n)
    cls = type(default)
    if level == "full":
        points = [
            (bn, nw, ns, swap)
            for bn in (32, 64, 128)
            for nw in (4, 8)
            for ns in (2, 3, 4, 5, 6)
            for swap in (True, False)
        ]
    else:
        points = GROUPED_SWEEP_SMALL
    out = []
    for bn, nw, ns, swap in points:
        if grouped_smem_bytes(bn, ns, next_n, heads) > SMEM_LIMIT:
            continue
        cfg = replace(default, block_n=bn, num_warps=nw, num_stages=ns, swap_ab=swap)
        if cfg != default:
            out.append(cls(**asdict(cfg)))
    return out


def _disagreement(got: torch.Tensor, want: torch.Tensor, lengths: torch.Tensor) -> str | None:
    """None when ``got`` matches ``want`` where each row reads keys (finite, within 1e-3 of the
    largest logit; one wrong key is off by about a logit, so this catches it), else why not."""
    keep = torch.arange(got.shape[1], device=got.device)[None, :] < lengths.reshape(-1, 1)
    x, y = got[keep].double(), want[keep].double()
    if not bool(torch.isfinite(x).all()):
        return "non-finite logits where the row reads keys"
    err = float((x - y).abs().max()) if x.numel() else 0.0
    scale = float(y.abs().max()) if y.numel() else 0.0
    return None if err <= 1e-3 * max(scale, 1e-30) else f"max error {err:.3g} (largest logit {scale:.3g})"


def run_mtp(
    requests: int,
    keys: int,
    next_n: int,
    module: Any,
    args: Any,
    timed: Callable[..., Any],
    device: str = "cuda",
    deepgemm: Callable[[ReadCase, torch.Tensor, list[torch.Tensor]], Any] | None = None,
) -> MtpResult:
    """``timed(label, calls, args, config=None)`` times one arm (the read bench's ``timed``;
    a CPU smoke test passes one that runs each call once). ``deepgemm(case, fp8_view, tables)``
    times DeepGEMM's paged scorer over those rows (the read bench's ``deepgemm_paged``)."""
    from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

    result = MtpResult(requests, keys, next_n, requests * keys * BF16_SLOT_BYTES)
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        need = requests * -(-keys // PAGE) * PAGE * (BF16_SLOT_BYTES + FP8_SLOT_BYTES) * 3
        if need > 0.6 * free:
            result.skipped = f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            return result
    base = make_read_case([keys] * requests, heads=args.heads, seed=args.seed, device=device)
    verify = expand_to_verify_rows(base, next_n, seed=args.seed + 1)
    fp8_pool, _ = pack_fp8_pages(base.pool, dequantized=False)
    copies = replicas_for(result.key_bytes_bf16, result.key_bytes_bf16)
    result.replicas = copies
    bf16_pool, _ = replicate_pages(base.pool, base.page_table, copies)
    fp8_big, _ = replicate_pages(fp8_pool, base.page_table, copies)
    pages = base.pool.shape[0]
    bf16_view = bf16_pool.view(-1, PAGE, 1, DIM)
    fp8_view = fp8_big.view(-1, PAGE, 1, FP8_SLOT_BYTES)

    def calls(case: ReadCase, config: Any = None, **kw: Any) -> list[Callable[[], torch.Tensor]]:
        # clean_logits=False, as the indexer calls it
        return [
            partial(
                module.bf16_paged_mqa_logits_with_config,
                case.q,
                bf16_view,
                case.weights,
                case.seq_lens,
                case.page_table + r * pages,
                case.max_seq_len,
                config,
                fill_tail=False,
                **kw,
            )
            for r in range(copies)
        ]

    result.one_row = _timing("bf16, 1 row/request", timed, calls(base), args)
    grouped_label = f"bf16, {next_n} rows/request, group_rows={next_n}"
    default = module.select_config(requests, verify.max_seq_len, verify.heads, next_n)
    result.grouped = _timing(grouped_label, timed, calls(verify, group_rows=next_n), args, asdict(default))
    result.ungrouped = _timing(f"bf16, {next_n} rows/request, one at a time", timed, calls(verify), args)
    result.grouped_sweep = _grouped_sweep(module, verify, next_n, args, timed, calls, grouped_label)
    done = [t for t in [result.grouped, *result.grouped_sweep] if t and t.get("ms")]
    result.grouped_best = min(done, key=lambda t: t["ms"]) if done else None
    fp8_calls = [
        partial(
            fp8_paged_mqa_logits_twin,
            verify.q,
            fp8_view,
            verify.weights,
            verify.seq_lens,
            verify.page_table + r * pages,
            None,
            verify.max_seq_len,
        )
        for r in range(copies)
    ]
    result.fp8 = _timing(f"fp8 twin, {next_n} rows/request", timed, fp8_calls, args)
    if deepgemm is not None:
        tables = [verify.page_table + r * pages for r in range(copies)]
        result.deepgemm = asdict(deepgemm(verify, fp8_view, tables))
    return result


def _grouped_sweep(
    module: Any,
    verify: ReadCase,
    next_n: int,
    args: Any,
    timed: Callable[..., Any],
    calls: Callable[..., list[Callable[[], torch.Tensor]]],
    label: str,
) -> list[dict[str, Any]]:
    """The grouped mode under each of ``grouped_sweep_configs``, then the split caps of the
    fastest; a config whose logits disagree with the default's (or that fails to build) is
    reported with its error and not timed."""
    configs = grouped_sweep_configs(module, next_n, verify.heads, getattr(args, "sweep", "none"))
    if not configs:
        return []
    want = calls(verify, group_rows=next_n)[0]()

    def one(cfg: Any) -> dict[str, Any]:
        try:
            got = calls(verify, cfg, group_rows=next_n)
            why = _disagreement(got[0](), want, verify.seq_lens)
            error = why and f"disagrees with the default: {why}"
        except Exception as exc:  # noqa: BLE001 - a config that does not build is its result
            error = f"{type(exc).__name__}: {exc}"[:200]
        if error:
            return {"label": label, "ms": None, "error": error, "config": asdict(cfg), "note": None}
        return _timing(label, timed, got, args, asdict(cfg))

    sweep = [one(c) for c in configs]
    timed_ok = [t for t in sweep if t.get("ms")]
    if timed_ok:
        top = min(timed_ok, key=lambda t: t["ms"])["config"]
        cls = type(configs[0])
        sweep += [
            one(cls(**{**top, "max_split_n": cap})) for cap in GROUPED_SPLIT_CAPS if cap != top["max_split_n"]
        ]
    return sweep


def _chunked(
    fn: Callable[..., torch.Tensor], case: ReadCase, kv: torch.Tensor, rows_per_chunk: int, **kw: Any
) -> Callable[[], None]:
    """One prefill's logits, row chunk by row chunk (each chunk's logits dropped before the
    next, as the indexer reduces them to top-k in between)."""

    def run() -> None:
        for start in range(0, case.rows, rows_per_chunk):
            rows = slice(start, min(case.rows, start + rows_per_chunk))
            out = fn(
                case.q[rows],
                kv,
                case.weights[rows],
                case.seq_lens[rows],
                case.page_table[rows],
                None,
                case.max_seq_len,
                False,
                **kw,
            )
            del out

    return run


def _tilelang_reader() -> tuple[Callable[..., torch.Tensor] | None, str]:
    try:
        import tilelang  # noqa: F401
        from sglang.kernels.ops.attention.dsa.tilelang_kernel import tilelang_fp8_paged_mqa_logits
    except Exception as error:  # noqa: BLE001 - any import failure means the arm cannot run
        return (
            None,
            f"not run: upstream's TileLang kernel does not import here ({type(error).__name__}: {error})"[
                :300
            ],
        )
    return tilelang_fp8_paged_mqa_logits, "upstream's tilelang_fp8_paged_mqa_logits"


def _deepgemm_nonpaged(
    case: ReadCase,
    fp8_pool: torch.Tensor,
    keys: int,
    chunk: int,
    args: Any,
    timed: Callable[..., Any],
    result: LongPrefillResult,
    empty_at_most: int = 0,
) -> dict[str, Any]:
    """Upstream's default for this case, DeepGEMM's non-paged fp8_mqa_logits, where it imports;
    checked against the twin on the same pages before it is timed. ``empty_at_most``: rows of
    at most that many keys get an empty range, as upstream's plan gives them (the bf16 prefill
    kernel is timed on the same ranges)."""
    from verify.bench import deepgemm_arm
    from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

    label = "DeepGEMM fp8_mqa_logits (non-paged)"
    dg, how = deepgemm_arm.load()
    if dg is None:
        return {"label": label, "ms": None, "error": how}
    try:
        run, diff, gathered = deepgemm_arm.nonpaged_prefill_call(
            dg, case, fp8_pool, keys, chunk, fp8_paged_mqa_logits_twin, empty_at_most=empty_at_most
        )
    except Exception as error:  # noqa: BLE001 - a crash or a disagreement is the arm's result
        return {"label": label, "ms": None, "error": f"{type(error).__name__}: {error}"[:300]}
    result.peak_extra_bytes["deepgemm_gathered_keys"] = gathered
    timing = _timing(label, timed, [run], args)
    timing["note"] = "; ".join(
        filter(
            None,
            [
                timing.get("note"),
                f"calc_diff vs the twin {diff:.1e}",
                "the one gather of the request's keys not timed",
                how,
            ],
        )
    )
    return timing


def parse_prefill_config(module: Any, spec: str) -> Any:
    """A prefill-kernel launch config from ``field=value[,field=value...]`` over the module's
    default (``select_prefill_config()``): ints, and 0/1/true/false for flags."""
    default = module.select_prefill_config()
    fields: dict[str, Any] = {}
    for part in filter(None, spec.split(",")):
        name, _, value = part.partition("=")
        current = getattr(default, name.strip())
        if isinstance(current, bool):
            fields[name.strip()] = value.strip().lower() in ("1", "true", "yes")
        elif current is None or isinstance(current, int):
            fields[name.strip()] = None if value.strip().lower() == "none" else int(value)
        else:
            raise ValueError(f"{name}: cannot set a {type(current).__name__} from {value!r}")
    return replace(default, **fields)


def _prefill_chunks(
    fn: Callable[..., torch.Tensor],
    q: torch.Tensor,
    kv: torch.Tensor,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    table: torch.Tensor,
    width: int,
    rows_per_chunk: int,
    config: Any = None,
) -> Callable[[], None]:
    """One prefill's logits through the prefill kernel, row chunk by row chunk, as the dispatch
    runs its non-paged plan (the request's table, ``clean_logits=False``)."""

    def run() -> None:
        for start in range(0, q.shape[0], rows_per_chunk):
            rows = slice(start, min(q.shape[0], start + rows_per_chunk))
            out = fn(
                q[rows],
                kv,
                weights[rows],
                ks[rows],
                ke[rows],
                width,
                page_table=table,
                clean_logits=False,
                config=config,
            )
            del out

    return run


def _prefill_sweep(
    module: Any,
    specs: list[str],
    inputs: tuple[Any, ...],
    chunk: int,
    args: Any,
    timed: Callable[..., Any],
) -> list[dict[str, Any]]:
    """The prefill kernel under each spec's config: its first and last chunk's logits against the
    default config's (where each row reads keys) before it is timed; a config that disagrees or
    does not build is reported, not timed."""
    q, kv, weights, ks, ke, table, width = inputs
    fn = module.bf16_mqa_logits_with_config
    last = (q.shape[0] - 1) // chunk * chunk
    out = []
    for spec in specs:
        label = f"bf16 prefill kernel, {spec}"
        try:
            config = parse_prefill_config(module, spec)
            error = None
            for lo in sorted({0, last}):
                rows = slice(lo, min(q.shape[0], lo + chunk))
                want = fn(q[rows], kv, weights[rows], ks[rows], ke[rows], width, page_table=table)
                got = fn(
                    q[rows], kv, weights[rows], ks[rows], ke[rows], width, page_table=table, config=config
                )
                why = _disagreement(got, want, ke[rows])
                if why:
                    error = f"disagrees with the default: {why}"
                    break
        except Exception as exc:  # noqa: BLE001 - a config that does not build is its result
            config, error = None, f"{type(exc).__name__}: {exc}"[:200]
        if error:
            out.append(
                {
                    "label": label,
                    "ms": None,
                    "error": error,
                    "config": asdict(config) if config is not None else {"spec": spec},
                    "note": None,
                }
            )
            continue
        run = _prefill_chunks(fn, q, kv, weights, ks, ke, table, width, chunk, config)
        out.append(_timing(label, timed, [run], args, asdict(config)))
    return out


def run_long_prefill(
    tokens: int,
    module: Any,
    args: Any,
    timed: Callable[..., Any],
    device: str = "cuda",
    chunk_bytes: int = LOGITS_CHUNK_BYTES,
    prefill_module: Any = None,
) -> LongPrefillResult:
    """One request's prefill, every row. ``prefill_module``: the series' prefill kernel module
    (``bf16_mqa_logits``), the dispatch's scorer here (without it, the paged kernel one row at a
    time is, as before the prefill kernel)."""
    from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

    keys = tokens // 4
    lengths = causal_lengths(tokens, keys)
    width = (-(-keys // PAGE) + 1) * PAGE
    rows_per_chunk = max(4, chunk_bytes // (4 * width) // 4 * 4)  # whole groups of up to 4
    result = LongPrefillResult(tokens, keys, min(rows_per_chunk, tokens))
    result.dense_bf16_tflops = getattr(args, "dense_bf16_tflops", None)
    result.dense_fp8_tflops = getattr(args, "dense_fp8_tflops", None)
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        need = tokens * args.heads * DIM * 5 + min(tokens, rows_per_chunk) * width * 4 * 2
        if need > 0.8 * free:
            result.skipped = f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            return result
    case = make_read_case(lengths, heads=args.heads, seed=args.seed, shared_table=True, device=device)
    bf16_kv = case.pool_view()
    fp8_pool, _ = pack_fp8_pages(case.pool, dequantized=False)
    fp8_kv = fp8_pool.view(-1, PAGE, 1, FP8_SLOT_BYTES)
    result.floors = prefill_floors(lengths, keys, args.heads)
    chunk = result.rows_per_chunk

    def fn(*call_args: Any, **kw: Any) -> torch.Tensor:  # the paged kernel, one row at a time
        return module.bf16_paged_mqa_logits_with_config(*call_args[:5], call_args[6], None, fill_tail=False)

    bf16_arm = _chunked(fn, case, bf16_kv, chunk)
    result.dispatch_arm = "bf16"
    result.arms["bf16"] = _timing("bf16, one row at a time", timed, [bf16_arm], args)
    dispatch_run = bf16_arm
    if prefill_module is not None:
        # As the dispatch's non-paged plan: the request's table, every row's [0, ke) with rows of at
        # most top-k keys emptied, max_seqlen_k the request's keys rounded up to a page.
        q = case.q[:, 0].contiguous()
        ke = torch.tensor(dispatch_ranges(lengths), dtype=torch.int32, device=case.q.device)
        ks = torch.zeros_like(ke)
        # the request's table: the longest row's (each row of a ReadCase lists only its own pages)
        table = case.page_table[int(case.seq_lens.argmax())].contiguous()
        max_seqlen_k = -(-keys // PAGE) * PAGE
        inputs = (q, bf16_kv, case.weights, ks, ke, table, max_seqlen_k)
        prefill_run = _prefill_chunks(prefill_module.bf16_mqa_logits_with_config, *inputs, chunk)
        default = prefill_module.select_prefill_config(
            prefill_module._device_shared_memory(case.q.device), args.heads
        )
        result.arms["bf16_prefill"] = _timing(
            "bf16 prefill kernel (bf16_mqa_logits), as dispatched",
            timed,
            [prefill_run],
            args,
            asdict(default),
        )
        result.dispatch_arm, dispatch_run = "bf16_prefill", prefill_run
        specs = list(getattr(args, "prefill_configs", None) or [])
        result.prefill_sweep = _prefill_sweep(prefill_module, specs, inputs, chunk, args, timed)
    twin = _chunked(fp8_paged_mqa_logits_twin, case, fp8_kv, chunk)
    result.arms["fp8_twin"] = _timing("fp8 twin (paged)", timed, [twin], args)
    reader, how = _tilelang_reader()
    if reader is None:
        result.arms["tilelang"] = {"label": "TileLang fp8 (paged)", "ms": None, "error": how}
    else:
        result.arms["tilelang"] = _timing(
            "TileLang fp8 (paged)", timed, [_chunked(reader, case, fp8_kv, chunk)], args
        )
    result.peak_extra_bytes = {"one_chunk_logits": chunk * width * 4}
    result.arms["deepgemm_nonpaged"] = _deepgemm_nonpaged(
        case,
        fp8_pool,
        keys,
        chunk,
        args,
        timed,
        result,
        empty_at_most=INDEX_TOPK if prefill_module is not None else 0,
    )
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        dispatch_run()
        torch.cuda.synchronize()
        result.peak_extra_bytes["dispatch_arm"] = int(torch.cuda.max_memory_allocated() - before)
        del case, fp8_pool
        torch.cuda.empty_cache()
    return result


def mtp_table(results: list[MtpResult]) -> str:
    head = (
        f"{'MTP verify':<34} {'1 row us':>9} {'grouped us':>10} {'ratio':>6} {'ungrouped us':>12} "
        f"{'ratio':>6} {'fp8 twin us':>11} {'%4.8':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        name = f"{r.requests} req x {r.keys} keys x {r.next_n} rows"
        if r.skipped:
            lines.append(f"{name:<34} skipped: {r.skipped}")
            continue
        d = r.derived()

        def us(t: dict[str, Any] | None) -> str:
            return f"{t['ms'] * 1e3:.1f}" if t and t.get("ms") else "n/a"

        lines.append(
            f"{name:<34} {us(r.one_row):>9} {us(r.grouped):>10} {d.get('ratio_grouped_over_one_row', math.nan):6.2f} "
            f"{us(r.ungrouped):>12} {d.get('ratio_ungrouped_over_one_row', math.nan):6.2f} {us(r.fp8):>11} "
            f"{d.get('grouped_hbm_pct', math.nan):5.0f}"
        )
    return "\n".join(lines)


def long_prefill_table(results: list[LongPrefillResult]) -> str:
    lines = []
    for r in results:
        if r.skipped:
            lines.append(f"long prefill {r.tokens} tokens: skipped: {r.skipped}")
            continue
        f = r.floors
        lines.append(
            f"long prefill {r.tokens} tokens ({r.keys} keys, chunks of {r.rows_per_chunk} rows): "
            f"fp8 non-paged floor {f['fp8_nonpaged_ms']:.2f} ms (memory {f['fp8_nonpaged_memory_ms']:.2f}, "
            f"compute {f['fp8_nonpaged_compute_ms']:.2f}); bf16 floor {f['bf16_ms']:.2f} ms"
        )
        for name, arm in r.arms.items():
            value = f"{arm['ms']:.2f} ms" if arm.get("ms") else f"n/a ({arm.get('error') or ''})"[:120]
            lines.append(f"    {name:<34} {value}{'  <- dispatch' if name == r.dispatch_arm else ''}")
        d = r.derived()
        lines.append(
            "    "
            + ", ".join(f"{k} {v:.2f}" for k, v in d.items())
            + f"; peak extra {r.peak_extra_bytes.get('dispatch_arm', -1) / 2**30:.2f} GiB"
        )
        for t in r.prefill_sweep:
            value = f"{t['ms']:.2f} ms" if t.get("ms") else f"n/a ({t.get('error') or ''})"[:120]
            lines.append(f"    sweep {t['label'][len('bf16 prefill kernel, ') :]:<28} {value}")
    return "\n".join(lines)
