"""Default-path parity: fp8 store bytes of the patched tree vs unpatched upstream, byte for byte.

Both trees ship a module named ``sglang``, so they cannot share a process: each one runs this
file as a worker in its own subprocess (``python -m verify.parity.store_baseline``) with its
tree first on PYTHONPATH and its own ``SGLANG_JIT_CACHE_DIR`` (a JIT cache shared between the
trees could hand one tree the other's build). The parent saves the compressed keys, plans and
out_loc once; each worker only runs upstream's fp8 store (``compress_norm_rope_store`` with no
bf16 argument) into identically canary-filled buffers and saves the bytes, which the parent
then compares byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from verify.core.store_driver import PAGE_SIZE, Prepared
from verify.core.store_layout import FP8_LAYOUT, fill_canary
from verify.core.upstream import worker_env

WORKER_TIMEOUT_S = 1200


def save_inputs(path: Path, prepared: list[Prepared]) -> None:
    """Everything a worker needs to repeat the fp8 store of each case, on the CPU."""
    cases = []
    for p in prepared:
        plans = [
            {
                "decode": bool(plan.is_decode),
                "tensors": [t.cpu() for t in plan[1:3] if isinstance(t, torch.Tensor)],
            }
            for plan in p.plans
        ]
        cases.append(
            {
                "name": p.name,
                "plans": plans,
                "kv": [kv.cpu() for kv in p.kv],
                "out_loc": [o.cpu() for o in p.out_loc],
                "num_pages": p.num_pages,
                "weight": p.weight.cpu(),
                "eps": p.eps,
                "seed": p.seed,
            }
        )
    freqs = prepared[0].freqs_cis.cpu() if prepared else torch.empty(0, 32, dtype=torch.complex64)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"freqs_cis": freqs, "cases": cases}, path)


def _tree_of_imported_sglang() -> Path:
    import sglang

    return Path(sglang.__file__).resolve().parent.parent


def run_worker(tree: Path, inputs: Path, output: Path, jit_cache: Path | None, log: Path) -> dict[str, Any]:
    """Run the fp8 store of every saved case under ``tree``; returns the worker's saved result."""
    if not (tree / "sglang" / "__init__.py").exists():
        raise FileNotFoundError(f"{tree} is not a python/ dir holding an sglang package")
    cmd = [
        sys.executable,
        "-m",
        "verify.parity.store_baseline",
        "--inputs",
        str(inputs),
        "--output",
        str(output),
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        proc = subprocess.run(
            cmd,
            env=worker_env(tree, jit_cache),
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=WORKER_TIMEOUT_S,
            check=False,
        )
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"worker for {tree} exited with {proc.returncode}; log {log}:\n{tail}")
    result: dict[str, Any] = torch.load(output, map_location="cpu", weights_only=False)
    return result


def compare_outputs(patched: dict[str, Any], baseline: dict[str, Any], keep: int = 5) -> dict[str, Any]:
    """Per case: identical bytes, or how many differ and where (page, byte)."""
    per_case: dict[str, Any] = {}
    for name, base_buf in baseline["buffers"].items():
        mine = patched["buffers"].get(name)
        if mine is None:
            per_case[name] = {"identical": False, "reason": "missing in patched run"}
            continue
        if mine.shape != base_buf.shape:
            per_case[name] = {
                "identical": False,
                "reason": f"shape {tuple(mine.shape)} vs {tuple(base_buf.shape)}",
            }
            continue
        diff = torch.nonzero((mine != base_buf).flatten()).flatten()
        page_bytes = base_buf.shape[1] if base_buf.dim() == 2 else FP8_LAYOUT.page_bytes
        per_case[name] = {
            "identical": diff.numel() == 0,
            "bytes_differing": int(diff.numel()),
            "first": [
                {"page": int(o) // page_bytes, "byte": int(o) % page_bytes} for o in diff[:keep].tolist()
            ],
            "sha256": hashlib.sha256(mine.numpy().tobytes()).hexdigest(),
        }
    for name in patched["buffers"]:
        if name not in baseline["buffers"]:
            per_case[name] = {"identical": False, "reason": "missing in baseline run"}
    return per_case


def _worker_main(inputs: Path, output: Path) -> None:
    """Runs under one tree: fp8-store every saved case, save the resulting pool bytes."""
    import importlib

    import sglang

    from verify.core import upstream as U

    got = U.load("compress_store")  # the one loader, from whichever tree this worker imports
    if isinstance(got, U.Missing):
        raise SystemExit(f"store baseline worker: {got.reason}")
    compress_norm_rope_store = got.obj
    compress = importlib.import_module(compress_norm_rope_store.__module__)
    CompressorDecodePlan, CompressorPrefillPlan = (
        compress.CompressorDecodePlan,
        compress.CompressorPrefillPlan,
    )

    # cuda on the GPU machine; cpu only for the tests of this plumbing (with a stand-in tree).
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.load(inputs, map_location="cpu", weights_only=False)
    freqs = data["freqs_cis"].to(device)
    buffers: dict[str, torch.Tensor] = {}
    for case in data["cases"]:
        buffer = torch.empty(case["num_pages"], FP8_LAYOUT.page_bytes, dtype=torch.uint8, device=device)
        fill_canary(buffer, case["seed"] + 7)
        weight = case["weight"].to(device)
        for plan_info, kv, out_loc in zip(case["plans"], case["kv"], case["out_loc"]):
            tensors = [t.to(device) for t in plan_info["tensors"]]
            if plan_info["decode"]:
                plan = CompressorDecodePlan(4, tensors[0])
            else:
                plan = CompressorPrefillPlan(4, tensors[0], tensors[1])
            # No bf16 argument at all: this is the call the default path makes in both trees.
            compress_norm_rope_store(
                kv.to(device),
                plan,
                norm_weight=weight,
                norm_eps=case["eps"],
                freq_cis=freqs,
                out_loc=out_loc.to(device),
                kvcache=buffer,
                page_size=PAGE_SIZE,
            )
        if device.type == "cuda":
            torch.cuda.synchronize()
        buffers[case["name"]] = buffer.cpu()
        print(f"stored {case['name']}", flush=True)
    torch.save({"sglang": sglang.__file__, "buffers": buffers}, output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    _worker_main(args.inputs, args.output)


if __name__ == "__main__":
    main()
