"""The cost figures of each index-K format: computed into one JSON-ready dict, rendered as markdown.

:func:`measure` runs upstream's configurator and the byte / FLOP counts; :func:`markdown` renders
what ``python -m verify.cost`` prints and what ``verify.figures``' ``cost`` block quotes, from the
dict alone (so a committed artifact renders without upstream).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from verify.core.provenance import SERIES_HASH, series_hash

from . import capacity as C
from .models import ModelShape
from .speed import Bench, factor
from .traffic import decode_bytes, prefill_flops

LENGTHS = (8192, 32768, 131072, 524288, 1048576)

ASSUMPTIONS = (
    (
        "KV-pool tokens are upstream's DSV4PoolConfigurator.calculate_pool_sizes on the budget "
        "gpu_memory x mem_fraction_static - weights (KVCacheConfigurator._profile_available_bytes for a GPU "
        "that starts empty), page size 256, no speculative decoding, one attention-DP rank, radix cache on. "
        "Defaults: an H200 (140 GiB), --mem-fraction-static 0.9, weights = the checkpoint's download size "
        "(~160 GB Flash, ~865 GB Pro) over TP 4 (Flash) or TP 16 (Pro: on 8 GPUs its weights leave less than "
        "the cap-mode SWA pool needs)."
    ),
    (
        "'ratio': --swa-full-tokens-ratio (0.1 by default: upstream's DeepSeek-V4 override); 'cap': the ratio unset, "
        "the SWA pool sized from --max-running-requests (256 by default: upstream's DeepSeek-V4 default) and "
        "--chunked-prefill-size (8192 by default)."
    ),
    (
        "With --max-running-requests set (upstream always sets it for DeepSeek-V4) the context length does not "
        "enter the configurator: the fixed bytes (SWA cap pool, c128 compress state) are the same for every "
        "format, so the full pool shrinks by the ratio of bytes per full token at every length. Issue #23 "
        "estimated -13.3% at 8K to -14.5% at 1M; the configurator charges no context-dependent term to the "
        "format, so its figure is one for every length."
    ),
    (
        "Upstream 0.5.21 budgets NVIDIA fp4 index keys at fp8's 132 B (the configurator: 'The NVIDIA FP4 path keeps "
        "the FP8 estimate'; only HIP counts 68 B), so on NVIDIA fp4 gets exactly fp8's pool: it saves no tokens, "
        "and (132 - 68) / 4 B per full token per C4A layer of the pool stays unused."
    ),
    (
        "Decode KV bytes per generated token (one request): every layer's window (min(128, L) rows of 584 B), each "
        "C4A layer's min(topk, L/4) selected rows of 584 B and its indexer's L/4 keys (132 / 68 / 256 B), each "
        "C128A layer's L/128 rows of 584 B; weights, q, logits and top-k traffic not counted."
    ),
    (
        "Prefill FLOPs of an L-token prompt: 2 x activated parameters x L (model card: 13B Flash, 49B Pro), plus "
        "attention scores (2 x heads x (512 + 512) per attended key: window, top-k or L/128 compressed keys per layer "
        "type) plus the indexer (2 x 64 x 128 + 2 x 64 per scored key, t/4 keys per C4A layer at token t); the "
        "FLOPs do not depend on the index-K format."
    ),
    (
        "TTFT factor = 1 + (indexer share of prefill FLOPs) x (measured bf16 / DeepGEMM non-paged fp8 indexer prefill "
        "time - 1): prefill time taken to split like its FLOPs. Decode factor = 1 + (fp8 indexer share of decode KV "
        "bytes) x (measured bf16 / DeepGEMM fp8_paged_mqa_logits decode time - 1): a step taken to cost its KV reads "
        "(the large-batch, long-context end; an upper bound where weight reads matter). A length the H200 bench did not "
        "measure takes the nearest measured point at or below it."
    ),
    (
        "fp4: no TTFT / decode factor. Upstream's fp4 indexer calls DeepGEMM's fp8_fp4_paged_mqa_logits, which has "
        "no Hopper build, and upstream refuses --enable-deepseek-v4-fp4-indexer below SM100 (serving_hook.py)."
    ),
)


def measure(
    models: Sequence[ModelShape],
    serving: Mapping[str, C.Serving],
    bench: Bench,
    lengths: Sequence[int],
    decode_rows: int,
) -> dict[str, Any]:
    """Every figure, per model: ``serving`` maps a model's name to the memory it is sized for."""
    from sglang.version import __version__ as sglang_version

    out: dict[str, Any] = {
        "suite": "verify.cost (KV capacity, decode bytes, prefill FLOPs per index-K format)",
        "schema": 1,
        "upstream": {
            "sglang": sglang_version,
            "configurator": "sglang.srt.model_executor.pool_configurator.DSV4PoolConfigurator",
            "format_selected_by": sorted(C.format_overrides("bf16")),
        },
        SERIES_HASH: series_hash(),  # the series the configurator above ran with
        "bench": {"source": bench.source, "sha256": bench.sha256, "gpu": bench.gpu},
        "lengths": list(lengths),
        "decode_rows": decode_rows,
        "assumptions": list(ASSUMPTIONS),
        "models": [],
    }
    for model in models:
        srv = serving[model.name]
        caps = [C.capacity(model, fmt, mode, srv, max(lengths)) for mode in C.MODES for fmt in C.FORMATS]
        cap = next(c for c in caps if c.mode == "ratio" and c.fmt == "fp8")
        index_bytes = {c.fmt: c.index_bytes_allocated for c in caps if c.mode == "ratio"}
        rows = []
        for n in lengths:
            dec = {fmt: decode_bytes(model, n, cap.kv_row_bytes, b) for fmt, b in index_bytes.items()}
            pre = prefill_flops(model, n)
            d_ratio = bench.decode_ratio(decode_rows, n // 4)
            p_ratio = bench.prefill_ratio(n)
            rows.append(
                {
                    "tokens": n,
                    "decode_bytes": {
                        fmt: {**asdict(d), "total": d.total, "indexer_share": d.indexer_share}
                        for fmt, d in dec.items()
                    },
                    "prefill_flops": {**asdict(pre), "total": pre.total, "indexer_share": pre.indexer_share},
                    "bench_decode": asdict(d_ratio),
                    "bench_prefill": asdict(p_ratio),
                    "ttft_factor": {"bf16": factor(pre.indexer_share, p_ratio.ratio), "fp4": None},
                    "decode_factor": {"bf16": factor(dec["fp8"].indexer_share, d_ratio.ratio), "fp4": None},
                }
            )
        out["models"].append(
            {
                "shape": model.as_dict(),
                "serving": {**asdict(srv), "budget_bytes": srv.budget_bytes},
                "capacity": [asdict(c) for c in caps],
                "per_length": rows,
            }
        )
    return out


def _tokens_label(n: int) -> str:
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def markdown(data: Mapping[str, Any]) -> str:
    """The tables ``python -m verify.cost`` prints and the figures block quotes."""
    out: list[str] = []
    for m in data["models"]:
        shape, srv = m["shape"], m["serving"]
        layers = shape["layers"]
        out.append(
            f"**{shape['name']}** ({layers['4']} C4A + {layers['128']} C128A + {layers['0']} SWA-only layers, "
            f"index top-k {shape['index_topk']}; budget {srv['budget_bytes'] / 2**30:.1f} GiB per GPU = "
            f"{srv['gpu_memory_gib']:g} GiB x {srv['mem_fraction_static']:g} - {srv['weights_gib']:.1f} GiB of weights)"
        )
        out.append("")
        out.append(
            "| SWA sizing | index K | B/key budgeted | B/key allocated | B per full token | KV-pool tokens | vs fp8 | "
            f"{_tokens_label(max(data['lengths']))}-token requests |"
        )
        out.append("|---|---|---|---|---|---|---|---|")
        base = {c["mode"]: c for c in m["capacity"] if c["fmt"] == "fp8"}
        for c in m["capacity"]:
            sizing = (
                f"ratio {srv['swa_ratio']:g}"
                if c["mode"] == "ratio"
                else f"cap ({srv['max_running_requests']} requests)"
            )
            if c["full_tokens"] is None:
                out.append(
                    f"| {sizing} | {c['fmt']} | {c['index_bytes_budgeted']} | {c['index_bytes_allocated']} | "
                    f"{c['bytes_per_full_token']:,.2f} | does not fit: {c['error'].split('.')[0]} | - | - |"
                )
                continue
            ref = base[c["mode"]]["full_tokens"]
            vs = "-" if c["fmt"] == "fp8" or not ref else _pct(c["full_tokens"] / ref - 1)
            out.append(
                f"| {sizing} | {c['fmt']} | {c['index_bytes_budgeted']} | {c['index_bytes_allocated']} | "
                f"{c['bytes_per_full_token']:,.2f} | {c['full_tokens']:,} | {vs} | "
                f"{c['full_tokens'] // max(data['lengths'])} |"
            )
        out.append("")
        out.append(
            "| context | decode KV MB / token, fp8 / fp4 / bf16 | bf16 / fp8 | fp4 / fp8 | indexer's share, fp8 / bf16 | "
            "prefill PFLOP | indexer's share | TTFT bf16 / fp8 | decode bf16 / fp8 (upper bound) |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in m["per_length"]:
            d = r["decode_bytes"]
            mb = " / ".join(f"{d[f]['total'] / 1e6:.1f}" for f in ("fp8", "fp4", "bf16"))
            pre = r["prefill_flops"]
            out.append(
                f"| {_tokens_label(r['tokens'])} | {mb} | {d['bf16']['total'] / d['fp8']['total']:.2f}x | "
                f"{d['fp4']['total'] / d['fp8']['total']:.2f}x | {100 * d['fp8']['indexer_share']:.0f}% / "
                f"{100 * d['bf16']['indexer_share']:.0f}% | {pre['total'] / 1e15:.2f} | {100 * pre['indexer_share']:.1f}% | "
                f"{r['ttft_factor']['bf16']:.2f}x ({r['bench_prefill']['ratio']:.2f}x at {r['bench_prefill']['at']}) | "
                f"{r['decode_factor']['bf16']:.2f}x ({r['bench_decode']['ratio']:.2f}x at {r['bench_decode']['at']}) |"
            )
        out.append("")
    bench = data["bench"]
    out.append(
        f"Kernel ratios: `{bench['source']}` ({bench['gpu']}); fp4 has none (no Hopper kernel). "
        f"Upstream {data['upstream']['sglang']} budgets NVIDIA fp4 keys at fp8's 132 B, so fp4 saves no pool "
        "tokens there. How each figure is counted: `assumptions` in the JSON (`python -m verify.cost` prints them)."
    )
    return "\n".join(out) + "\n"


def assumptions_text(data: Mapping[str, Any]) -> str:
    return "\n".join(f"- {a}" for a in data["assumptions"]) + "\n"
