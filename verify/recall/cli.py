"""``python -m verify.recall``: tier 2 (indexer recall) and the fp8 diagnosis.

Examples::

    # CI / laptop: exact emulation, reduced sizes (< 1 min on 2 cores)
    python -m verify.recall --out verify/results/recall-cpu --backend cpu

    # GPU, production kernels of the patched tree on PYTHONPATH, full sizes
    PYTHONPATH=$PWD:$PWD/sglang-upstream/python python -m verify.recall --out verify/results/recall-gpu --backend gpu

    # a capture from a deployment (see verify/recall/REPLAY.md)
    python -m verify.recall --out DIR --replay capture.pt

Exit status: 0 when the bf16 gate passes, 1 when it fails, 2 on usage or runtime errors.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from verify.core.deepseek_reference import fp4_rule_differences
from verify.core.metrics import aggregate
from verify.core.provenance import SERIES_HASH, series_hash

from . import diagnose
from .backend import FAULTS, Backend
from .backend_choice import make_backend
from .gate import evaluate, evaluate_exact_q
from .generator import GenConfig, PlanConfig, build_planted
from .report import (
    CSV_FIELDS,
    flat_cells,
    heatmaps,
    per_length_with_sizes,
    summary_markdown,
    write_csv,
    write_json,
)
from .runner import BASE_ARMS, run_problem

LENGTHS_FULL = (338, 2048, 4509, 5200, 8000, 12000, 22597, 32768, 65536, 131072)
LENGTHS_CI = (338, 2048, 4509, 5200, 8000)
DEPTHS_PCT = (0, 10, 25, 50, 75, 90, 100)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m verify.recall",
        description="Tier 2 indexer recall (bf16 vs fp8 vs fp4 index keys, against exact math and DeepSeek's "
        "reference numerics) and the fp8 diagnosis.",
        epilog="Exit status 0: bf16 gate passes; 1: it fails; 2: error.",
    )
    ap.add_argument("--out", type=Path, required=True, help="output directory (created)")
    ap.add_argument(
        "--backend", choices=("cpu", "gpu"), default=None, help="default: gpu when CUDA is available"
    )
    ap.add_argument(
        "--lengths", type=int, nargs="+", default=None, help="prompt lengths in tokens (keys = tokens // 4)"
    )
    ap.add_argument(
        "--topk",
        type=int,
        nargs="+",
        default=None,
        help="index_topk values (default 512 1024; replay: the capture's)",
    )
    ap.add_argument(
        "--depths", type=float, nargs="+", default=list(DEPTHS_PCT), help="needle depths in percent"
    )
    ap.add_argument(
        "--margins",
        type=float,
        nargs="+",
        default=[0.002, 0.01, 0.05, 0.2],
        help="needle margins (fractions)",
    )
    ap.add_argument("--modes", nargs="+", choices=("top", "boundary"), default=["top", "boundary"])
    ap.add_argument(
        "--residues",
        choices=("all", "staggered"),
        default=None,
        help="needle positions mod 4 per depth (default: gpu all, cpu staggered)",
    )
    ap.add_argument(
        "--sequences", type=int, default=None, help="haystacks per length (default: gpu 2, cpu 1)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--replay", type=Path, default=None, help="score a capture file instead of synthetic data (REPLAY.md)"
    )
    ap.add_argument(
        "--fp8-scorer",
        default="auto",
        help="gpu: auto (the platform's)|torch|torch-sm120|triton-twin|deepgemm|tilelang|emulation; cpu: auto (fp32-accumulating fp8 math)|torch (upstream torch-fallback math)",
    )
    ap.add_argument(
        "--platform",
        default="auto",
        help="profile whose fp8 scorer and top-k the fp8 arm runs: auto (the local GPU's), sm90, sm100, sm120, hip (verify.core.platform)",
    )
    ap.add_argument(
        "--arms",
        nargs="+",
        default=None,
        help=f"arms to run (default: {' '.join(BASE_ARMS)}; fp8_emul added on gpu)",
    )
    ap.add_argument(
        "--inject-fault",
        action="append",
        default=[],
        choices=sorted(FAULTS),
        help="harness self-test: corrupt a store path",
    )
    ap.add_argument("--no-diagnose", action="store_true")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--budget-gb", type=float, default=None, help="per-batch working-set budget (default: gpu 4, cpu 0.5)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: cpu 1, gpu torch's default)",
    )
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def _git_head(repo: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions(backend: Backend) -> dict[str, Any]:
    from verify.core import upstream

    repo = Path(__file__).resolve().parents[2]
    v: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "sglang": upstream.sglang_version(),
        "product_git_head": _git_head(repo),
        SERIES_HASH: series_hash(),
    }
    for mod in ("numpy", "matplotlib", "triton"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            v[mod] = None
    if backend.device.type == "cuda":
        props = torch.cuda.get_device_properties(backend.device)
        v["device"] = f"{props.name} sm_{props.major}{props.minor}"
        v["cuda"] = torch.version.cuda
    else:
        v["device"] = "cpu"
    return v


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    kind = args.backend or ("gpu" if torch.cuda.is_available() else "cpu")
    gpu = kind == "gpu"

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, flush=True)

    if args.threads or not gpu:
        # The CPU work is many small matmuls: on shared CI cores OpenMP threads mostly spin and
        # wait (measured 10x slower with 2 threads under load than with 1).
        torch.set_num_threads(args.threads or 1)
    backend = make_backend(kind, tuple(args.inject_fault), args.fp8_scorer, args.platform)
    arms: list[str] = list(args.arms or BASE_ARMS) + (["fp8_emul"] if gpu and not args.arms else [])
    control = getattr(backend, "emul", None)
    budget = int((args.budget_gb or (4.0 if gpu else 0.5)) * (1 << 30))
    depths = tuple(d / 100.0 for d in args.depths)
    lengths = tuple(args.lengths or (LENGTHS_FULL if gpu else LENGTHS_CI))
    plan = PlanConfig(
        topks=tuple(args.topk or (512, 1024)),
        depths=depths,
        residues=args.residues or ("all" if gpu else "staggered"),
        margins=tuple(args.margins),
        modes=tuple(args.modes),
        sequences=args.sequences or (2 if gpu else 1),
    )
    gen = GenConfig(seed=args.seed)
    records: list[dict[str, Any]] = []
    per_problem: list[dict[str, Any]] = []
    source = "synthetic"
    if args.replay is not None:
        from .replay import load_problem
        from .replay_format import read_capture

        cap = read_capture(args.replay)
        topks = tuple(args.topk or (cap.index_topk,))
        problem, preset, ref_desc = load_problem(
            cap, topks, lengths, depths, backend.device, args.replay.name
        )
        arms.append("captured")
        source = f"replay:{args.replay}"
        backend.paths["replay_reference_keys"] = ref_desc
        backend.paths["replay_captured_format"] = cap.index_k_format
        log(
            f"[recall] replay {args.replay}: {cap.rows} rows, {cap.num_pages} pages ({cap.index_k_format}), topk {topks}"
        )
        out = run_problem(problem, backend, arms, control, budget, preset=preset)
        records.extend(out["records"])
        per_problem.append(
            {
                "source": source,
                "rows": problem.num_rows,
                "timing": out["timing"],
                "canary": out["canary"],
                "metadata": cap.metadata,
            }
        )
    else:
        for length in lengths:
            t0 = time.perf_counter()
            problem = build_planted(length, plan, gen, backend.quantize_q, backend.device)
            t_build = time.perf_counter() - t0
            out = run_problem(problem, backend, arms, control, budget)
            records.extend(out["records"])
            unplaceable = sum(1 for r in problem.rows if r.get("needle_unplaceable"))
            rounding = fp4_rule_differences(problem.queries.q_rot, problem.keys_ref[problem.written_slots])
            per_problem.append(
                {
                    "length_tokens": length,
                    "n_keys": problem.n_keys,
                    "rows": problem.num_rows,
                    "pages": problem.num_pages,
                    "needles_unplaceable": unplaceable,
                    "fp4_upstream_vs_reference_rounding": rounding,
                    "timing": {"build_s": t_build, **out["timing"], "total_s": time.perf_counter() - t0},
                    "canary": out["canary"],
                }
            )
            log(
                f"[recall] {length:>7} tokens: {problem.num_rows} rows x {len(arms)} arms in {time.perf_counter() - t0:.1f} s"
            )
            del problem
            if gpu:
                torch.cuda.empty_cache()

    gate = evaluate(records)
    gate_exact = evaluate_exact_q(records)
    diag = None
    if not args.no_diagnose:
        t0 = time.perf_counter()
        diag = diagnose.run(backend, records)
        log(f"[recall] diagnosis in {time.perf_counter() - t0:.1f} s")
    per_length = per_length_with_sizes(records)
    per_depth = aggregate(records, ["topk", "depth"])
    cells = aggregate(records, ["topk", "length_tokens", "depth"])

    args.out.mkdir(parents=True, exist_ok=True)
    files = ["results.json", "results.csv", "cells.csv", "summary.md"]
    if not args.no_plots:
        drawn = heatmaps(args.out, cells, arms)
        files += drawn
        if not drawn:
            log(
                "[recall] matplotlib missing: no heatmaps; draw them anywhere with python -m verify.recall.report DIR"
            )
    write_csv(args.out / "results.csv", records, CSV_FIELDS)
    write_csv(
        args.out / "cells.csv", flat_cells(cells), list(flat_cells(cells[:1])[0].keys()) if cells else ["arm"]
    )
    elapsed = time.perf_counter() - t_start
    meta = {
        "backend": backend.name,
        "source": source,
        "seed": args.seed,
        "rows": len({(r["source"], r["length_tokens"], r["row"]) for r in records}),
        "elapsed_s": elapsed,
        "paths": backend.paths,
    }
    write_json(
        args.out / "results.json",
        {
            "suite": "verify.recall (tier 2: indexer recall)",
            "schema": 1,
            "command": [sys.executable, "-m", "verify.recall", *(argv if argv is not None else sys.argv[1:])],
            "config": {
                "backend": kind,
                "lengths": list(lengths),
                "plan": asdict(plan),
                "generator": asdict(gen),
                "fp8_scorer": args.fp8_scorer,
                "platform": args.platform,
                "faults": list(args.inject_fault),
                "replay": str(args.replay) if args.replay else None,
                "arms": arms,
                "budget_bytes": budget,
            },
            "seed": args.seed,
            "backend": {
                "name": backend.name,
                "device": str(backend.device),
                "paths": backend.paths,
                "stats": getattr(backend, "stats", {}),
            },
            "versions": versions(backend),
            "elapsed_s": elapsed,
            "per_problem": per_problem,
            "gate": gate.to_dict(),
            "gate_exact_q": gate_exact.to_dict() if gate_exact else None,
            "diagnosis": diag.to_dict() if diag else None,
            "per_length": per_length,
            "per_depth": per_depth,
            "cells": cells,
            # one line per (row, arm) is in results.csv; repeating it here would triple the size
            "rows_csv": "results.csv",
        },
    )
    details: list[str] = []
    if diag:
        details = [f"- {c.status} `{c.name}` ({c.kernel}): {c.detail}" for c in diag.checks]
        if diag.topk_agreement_fp8_bf16 is not None:
            details.append(
                f"- top-k agreement fp8 vs bf16 (|S_fp8 & S_bf16| / k, rows where the indexer must choose): "
                f"{diag.topk_agreement_fp8_bf16:.4f}"
            )
        if diag.oracle_recall is not None:
            details.extend(diagnose.oracle_lines(diag.oracle_recall))
    (args.out / "summary.md").write_text(
        summary_markdown(
            meta,
            per_length,
            per_depth,
            arms,
            gate,
            diag.verdict if diag else None,
            files,
            details,
            gate_exact,
        )
    )
    log(
        f"[recall] gate (bf16): {'PASS' if gate.passed else 'FAIL'}"
        + "".join(f"; {c.name}: {'ok' if c.passed else 'FAIL'}" for c in gate.conditions)
    )
    if diag:
        log(f"[recall] diagnosis: {diag.verdict}")
    log(f"[recall] wrote {args.out} in {elapsed:.1f} s")
    return 0 if gate.passed else 1


def entry(argv: Sequence[str] | None = None) -> int:
    try:
        return main(argv)
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 -- exit 2 distinguishes a crash from a failed gate
        import traceback

        traceback.print_exc()
        print(f"[recall] error: {exc}", file=sys.stderr)
        return 2
