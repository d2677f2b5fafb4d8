"""``python -m verify.cost``: KV capacity, decode bytes, prefill FLOPs and speed factors per index-K format.

Examples::

    python -m verify.cost                                   # both published models, printed
    python -m verify.cost --out verify/results/cost/cost.json
    python -m verify.cost --config path/to/config.json --activated-params 13 --weights-gib 40

Needs the patched upstream tree on PYTHONPATH (its configurator runs here), no GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from .capacity import Serving
from .models import MODELS, WEIGHTS_GIB, ModelShape, from_config
from .report import LENGTHS, assumptions_text, markdown, measure
from .speed import BENCH, Bench

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m verify.cost", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", choices=[*MODELS, "all"], default="all", help="a published model (default: both)"
    )
    ap.add_argument(
        "--config", type=Path, default=None, help="a DeepSeek-V4 config.json instead of the published models"
    )
    ap.add_argument(
        "--activated-params",
        type=float,
        default=None,
        help="with --config: activated parameters, in billions",
    )
    ap.add_argument("--gpu-memory-gib", type=float, default=Serving.gpu_memory_gib)
    ap.add_argument("--mem-fraction-static", type=float, default=Serving.mem_fraction_static)
    ap.add_argument(
        "--weights-gib",
        type=float,
        default=None,
        help="weight memory per GPU (default: the checkpoint over TP 4 for Flash, 8 for Pro)",
    )
    ap.add_argument("--max-running-requests", type=int, default=Serving.max_running_requests)
    ap.add_argument("--chunked-prefill-size", type=int, default=Serving.chunked_prefill_size)
    ap.add_argument(
        "--swa-full-tokens-ratio", type=float, default=Serving.swa_ratio, help="the ratio-mode SWA sizing"
    )
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="context lengths in tokens")
    ap.add_argument(
        "--decode-rows", type=int, default=64, help="the bench's decode batch whose kernel ratio is used"
    )
    ap.add_argument("--bench", type=Path, default=ROOT / BENCH, help="bench_read.json with the kernel ratios")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON artifact here")
    return ap.parse_args(argv)


def selected_models(args: argparse.Namespace) -> list[ModelShape]:
    if args.config is not None:
        if args.activated_params is None:
            raise SystemExit("--config needs --activated-params (billions; config.json does not say it)")
        return [from_config(args.config, args.activated_params * 1e9)]
    return list(MODELS.values()) if args.model == "all" else [MODELS[args.model]]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    models = selected_models(args)
    serving = {
        m.name: Serving(
            args.gpu_memory_gib,
            args.mem_fraction_static,
            args.weights_gib if args.weights_gib is not None else WEIGHTS_GIB.get(m.name, 37.0),
            args.max_running_requests,
            args.chunked_prefill_size,
            args.swa_full_tokens_ratio,
        )
        for m in models
    }
    bench_source = (
        args.bench.resolve().relative_to(ROOT).as_posix()
        if args.bench.resolve().is_relative_to(ROOT)
        else str(args.bench)
    )
    # The configurator logs every sizing it computes; quiet it for this call only, so a caller in
    # the same process (a test run) keeps its logging.
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        data = measure(models, serving, Bench.load(args.bench, bench_source), args.lengths, args.decode_rows)
    finally:
        logging.disable(previous)
    print("Assumptions:\n" + assumptions_text(data))
    print(markdown(data))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0
