"""Hardware counters (Nsight Compute) for the read kernels at the shapes the bench reports.

Run under ``ncu`` (what ``verify/gpu/run.sh ncu`` does)::

    ncu --clock-control none --profile-from-start off --csv --page raw \\
        --metrics "$(python -m verify.bench.ncu_probe --print-metrics)" \\
        --log-file DIR/ncu.csv python -m verify.bench.ncu_probe --out DIR
    python -m verify.bench.ncu_probe --report DIR     # DIR/ncu.md from ncu.csv + launches.json

Each probed launch (bf16 kernel at its default config, and at the ``--config`` given; the fp8
Triton twin at its default) runs once warm outside the profiled range, then exactly once
inside ``cudaProfilerStart``/``Stop``, so the n-th profiled kernel is the n-th entry of
``launches.json``. ncu flushes the caches before each profiled kernel (its default), so every
launch starts with a cold L2, as in a model step.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from verify.core.read_reference import BF16_SLOT_BYTES, FP8_SLOT_BYTES, PAGE, make_read_case, pack_fp8_pages

METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "sm__cycles_active.avg",
    "gpc__cycles_elapsed.max",
    "lts__t_sector_hit_rate.pct",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_registers",
    "launch__waves_per_multiprocessor",
)

# The kernel each arm launches (the report checks ncu's order against launches.json with it).
KERNEL_NAMES = {"bf16": "_bf16_paged_mqa_logits_kernel", "fp8 twin": "_fp8_paged_mqa_logits_twin_kernel"}

# (rows, keys per row): decode shapes, the ones that miss a target first.
SHAPES = [
    (1, 8192),
    (8, 8192),
    (64, 8192),
    (1, 32768),
    (8, 32768),
    (64, 32768),
    (1, 131072),
    (8, 131072),
    (64, 131072),
]


def probe(out: Path, configs: list[str]) -> None:
    from verify.core.fp8_twin import fp8_paged_mqa_logits_twin
    from verify.core.upstream import load_bf16_kernel_module

    module, _ = load_bf16_kernel_module()
    cls = module.Bf16IndexLogitsConfig
    extra = [cls(**json.loads(c)) for c in configs]
    launches: list[dict[str, Any]] = []
    for rows, keys in SHAPES:
        case = make_read_case([keys] * rows, heads=64, seed=0, device="cuda")
        fp8_pool, _ = pack_fp8_pages(case.pool, dequantized=False)
        default = module.select_config(case.rows, case.max_seq_len, case.heads)
        bf16_args = (case.q, case.pool_view(), case.weights, case.seq_lens, case.page_table, case.max_seq_len)
        arms: list[tuple[str, dict[str, Any], Callable[[], Any]]] = [
            (
                "bf16",
                {"default": True, **asdict(default)},
                partial(module.bf16_paged_mqa_logits_with_config, *bf16_args, default),
            )
        ]
        arms += [
            ("bf16", asdict(cfg), partial(module.bf16_paged_mqa_logits_with_config, *bf16_args, cfg))
            for cfg in extra
        ]
        arms.append(
            (
                "fp8 twin",
                {"default": True},
                partial(
                    fp8_paged_mqa_logits_twin,
                    case.q,
                    fp8_pool.view(-1, PAGE, 1, FP8_SLOT_BYTES),
                    case.weights,
                    case.seq_lens,
                    case.page_table,
                    None,
                    case.max_seq_len,
                ),
            )
        )
        for arm, config, fn in arms:
            fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            slot = BF16_SLOT_BYTES if arm == "bf16" else FP8_SLOT_BYTES
            launches.append(
                {"rows": rows, "keys": keys, "arm": arm, "config": config, "key_bytes": rows * keys * slot}
            )
        arms.clear()  # drop this shape's tensors before the next one is built
        torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    (out / "launches.json").write_text(json.dumps(launches, indent=2) + "\n")
    print(f"{len(launches)} profiled launches -> {out / 'launches.json'}")


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def report(out: Path) -> Path:
    """Joins ncu's raw CSV with launches.json into ncu.md (and ncu.json)."""
    launches = json.loads((out / "launches.json").read_text())
    lines = (out / "ncu.csv").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))
    rows = [r for r in rows if r.get("ID", "").isdigit()]  # drop the units row
    if len(rows) != len(launches):
        raise SystemExit(f"ncu profiled {len(rows)} kernels, launches.json lists {len(launches)}")
    joined = []
    for i, (launch, row) in enumerate(zip(launches, rows)):
        expected = KERNEL_NAMES[launch["arm"]]
        if row.get("Kernel Name") != expected:
            raise SystemExit(
                f"ncu kernel {i} is {row.get('Kernel Name')!r}, launches.json expects {expected!r} ({launch['arm']})"
            )
        ns = _number(row["gpu__time_duration.sum"])  # ncu reports ns for this metric in raw mode
        joined.append(
            {
                **launch,
                "kernel": row.get("Kernel Name", ""),
                "us": ns / 1e3,
                "effective_tb_s": launch["key_bytes"] / (ns * 1e-9) / 1e12 if ns else float("nan"),
                **{m: _number(row.get(m, "nan")) for m in METRICS if m != "gpu__time_duration.sum"},
            }
        )
    (out / "ncu.json").write_text(json.dumps(joined, indent=2) + "\n")
    md = [
        "| rows x keys | arm | config | us | key TB/s | DRAM % peak | DRAM MB read | SM % peak | warps active % | theor. occ. % | grid | waves/SM | regs | smem KB | L2 hit % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for j in joined:
        c = j["config"]
        tag = (
            ("default " if c.get("default") else "")
            + (
                f"n{c['block_n']}/w{c['num_warps']}/s{c['num_stages']}/k{c['split_n'] or 'auto'}"
                if "block_n" in c
                else ""
            )
        ).strip()
        md.append(
            f"| {j['rows']} x {j['keys']} | {j['arm']} | {tag} | {j['us']:.1f} | {j['effective_tb_s']:.2f} | "
            f"{j['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.0f} | {j['dram__bytes_read.sum'] / 1e6:.1f} | "
            f"{j['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.0f} | "
            f"{j['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f} | "
            f"{j['sm__maximum_warps_per_active_cycle_pct']:.0f} | {j['launch__grid_size']:.0f} | "
            f"{j['launch__waves_per_multiprocessor']:.2f} | {j['launch__registers_per_thread']:.0f} | "
            f"{j['launch__shared_mem_per_block_dynamic'] / 1024:.0f} | {j['lts__t_sector_hit_rate.pct']:.0f} |"
        )
    path = out / "ncu.md"
    path.write_text("\n".join(md) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verify.bench.ncu_probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=Path("build/ncu"))
    parser.add_argument("--report", type=Path, help="join DIR/ncu.csv and DIR/launches.json into DIR/ncu.md")
    parser.add_argument("--print-metrics", action="store_true", help="the --metrics list for ncu")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help='an extra bf16 config to probe at every shape, as JSON: {"block_n": 128, "num_warps": 4, ...}',
    )
    args = parser.parse_args(argv)
    if args.print_metrics:
        print(",".join(METRICS))
        return 0
    if args.report:
        print(report(args.report).read_text())
        return 0
    if not torch.cuda.is_available():
        print("ncu_probe needs a CUDA GPU", file=sys.stderr)
        return 2
    probe(args.out, args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
