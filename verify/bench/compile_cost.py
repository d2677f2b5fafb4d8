"""Compile cost of the C4 indexer's scorers (GPU): the kernel variants a server compiles, and
their time, bf16 beside upstream's fp8 path.

A server compiles its scorers' kernels lazily: at CUDA-graph capture, once per captured batch
size unless the variant is already there, and in eager prefill for each new shape the
specialisation rules tell apart. This module replays what the indexer hands its scorers on both
occasions and counts what gets compiled:

- **capture**: for every decode batch size upstream captures by default (its own
  ``generate_decode_cuda_graph_batch_sizes`` for an H200 server at tp 8: max batch 512), the
  scorer is called once eagerly (the graph runner's warm-up, where compilation happens) and
  captured in a CUDA graph, as the graph runner does, with 1-token rows and a page table as wide
  as the server's context; ``mtp``: the same for target verify with 2 draft tokens per request
  (upstream's speculative capture sizes; bf16 scores each request's rows as one group);
- **prefill**: eager prefill chunks of one request, from 1 row to 16,384 rows (the paged path
  below ``SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS`` rows, the prefill kernel / the
  non-paged fp8 path from there).

bf16: the series' Triton kernels; a variant is a new entry in the ``JITFunction``'s per-device
cache (``device_caches[device][0]``), counted per kernel. fp8: upstream's sm_90 path --
upstream's JIT ``get_paged_mqa_logits_metadata`` and DeepGEMM's ``fp8_paged_mqa_logits`` /
``fp8_mqa_logits``; its variants are the compiled kernels (cubins, shared objects) that appear in
DeepGEMM's and sglang's JIT cache folders (``DG_JIT_CACHE_DIR``, ``SGLANG_JIT_CACHE_DIR``),
counted per folder (DeepGEMM keeps no in-process count to read). Where DeepGEMM does not import, the fp8 side says so.

Run twice by the bench, each time in a fresh process: ``--pass cold`` with empty cache folders
(``TRITON_CACHE_DIR``, ``DG_JIT_CACHE_DIR``, ``SGLANG_JIT_CACHE_DIR`` under ``--cache``): what a
server pays the first time; ``--pass warm`` with the folders the cold pass filled: what a server
started on a machine whose JIT caches a build (or warm-up) session filled pays -- loading, not
compiling. Times are wall seconds of the calls that compiled (or loaded) a variant and the total
over all calls, capture included::

    python -m verify.bench.compile_cost --pass cold --cache /tmp/bf16k-compile --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verify.core.provenance import SERIES_HASH, series_hash

HEADS = 64
DIM = 128
PAGE = 64
CONTEXT_KEYS = 32768  # a capture page table as wide as 128K tokens of context (32K keys)
MTP_DRAFT_TOKENS = 2
H200_TP8_MAX_BS = 512  # upstream's decode max_bs for an H200 (141 GB) at tp >= 4 (memory_hook)
# Prefill chunks of one request: the paged path's rows (256 and more take the prefill config) and
# the prefill kernel's (the non-paged path from 8,192 rows on).
PAGED_PREFILL_ROWS = (1, 100, 255, 256, 1000, 2048, 4096, 8191)
NONPAGED_PREFILL_ROWS = (8192, 12288, 16384)
ENV_FOLDERS = ("TRITON_CACHE_DIR", "DG_JIT_CACHE_DIR", "SGLANG_JIT_CACHE_DIR")


def capture_sizes(speculative: bool = False, max_bs: int = H200_TP8_MAX_BS) -> list[int]:
    """Upstream's default decode capture batch sizes (its own generator, on a DeepSeek-V4 server's
    args; ``speculative``: with EAGLE/MTP, whose list differs)."""
    import argparse as _argparse

    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
    from sglang.srt.server_args import ServerArgs

    from verify.core import platform as P

    parser = _argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    config_dir = P._stand_in_config_dir()
    try:
        argv = ["--model-path", str(config_dir)]
        if speculative:
            argv += [
                "--speculative-algorithm",
                "EAGLE",
                "--speculative-num-draft-tokens",
                str(MTP_DRAFT_TOKENS),
            ]
        args = ServerArgs.from_cli_args(parser.parse_args(argv))
        return list(generate_decode_cuda_graph_batch_sizes(args, max_bs))
    finally:
        for f in config_dir.iterdir():
            f.unlink()
        config_dir.rmdir()


@dataclass
class Call:
    """One scorer call (and its capture, at graph capture)."""

    what: str
    seconds: float
    new_variants: dict[str, int] = field(default_factory=dict)


@dataclass
class Phase:
    name: str  # capture | mtp | prefill
    fmt: str  # bf16 | fp8
    calls: list[Call] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        variants: dict[str, int] = {}
        for c in self.calls:
            for k, v in c.new_variants.items():
                variants[k] = variants.get(k, 0) + v
        compiling = [c for c in self.calls if any(c.new_variants.values())]
        return {
            "calls": len(self.calls),
            "variants": variants,
            "variants_total": sum(variants.values()),
            "seconds_total": round(sum(c.seconds for c in self.calls), 3),
            "seconds_in_compiling_calls": round(sum(c.seconds for c in compiling), 3),
            "compiling_calls": [c.what for c in compiling],
            "error": self.error,
        }


# What a JIT cache holds per compiled kernel: DeepGEMM a cubin per kernel folder, sglang's loader
# (tvm-ffi) a shared object per module, Triton a cubin per variant.
ARTIFACT_SUFFIXES = (".cubin", ".so")


def count_artifacts(path: Path) -> int:
    """Compiled kernels in a JIT cache folder (at any depth)."""
    if not path.is_dir():
        return 0
    return sum(1 for p in path.rglob("*") if p.is_file() and p.suffix in ARTIFACT_SUFFIXES)


class Counter:
    """New kernel variants since the last ``take``: Triton kernels by their per-device cache,
    JIT cache folders by their entries."""

    def __init__(self, kernels: dict[str, Any], folders: dict[str, Path]) -> None:
        self.kernels = kernels
        self.folders = folders
        self.last = self._now()

    def _now(self) -> dict[str, int]:
        import torch

        out = {}
        device = torch.cuda.current_device()
        for name, fn in self.kernels.items():
            caches = getattr(fn, "device_caches", None)
            out[name] = len(caches[device][0]) if caches is not None and device in caches else 0
        for name, path in self.folders.items():
            out[name] = count_artifacts(path)
        return out

    def take(self) -> dict[str, int]:
        now = self._now()
        new = {k: now[k] - self.last.get(k, 0) for k in now if now[k] != self.last.get(k, 0)}
        self.last = now
        return new


def _timed(what: str, fn: Callable[[], Any], counter: Counter, capture: bool) -> Call:
    """``fn`` once eagerly (compiles what is missing), then -- ``capture`` -- captured in a CUDA
    graph, as the graph runner warms up and captures each batch size."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    if capture:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        del graph
    return Call(what, round(time.perf_counter() - t0, 4), counter.take())


# ------------------------------------------------------------------------- inputs


def _decode_inputs(rows: int, fp8: bool) -> dict[str, Any]:
    import torch

    pages = CONTEXT_KEYS // PAGE
    dev = "cuda"
    q = torch.zeros(rows, 1, HEADS, DIM, device=dev).to(torch.float8_e4m3fn)
    w = torch.ones(rows, HEADS, device=dev)
    lens = torch.ones(rows, dtype=torch.int32, device=dev)
    table = torch.zeros(rows, pages, dtype=torch.int32, device=dev)
    slot = DIM + 4 if fp8 else DIM * 2
    kv = torch.zeros(pages + 1, PAGE * slot, dtype=torch.uint8, device=dev)
    view = kv.view(pages + 1, PAGE, 1, slot) if fp8 else kv.view(torch.bfloat16).view(pages + 1, PAGE, 1, DIM)
    return {"q": q, "w": w, "lens": lens, "table": table, "kv": view, "width": pages * PAGE}


def _prefill_inputs(rows: int, keys: int) -> dict[str, Any]:
    import torch

    dev = "cuda"
    pages = -(-keys // PAGE)
    lens = torch.clamp((torch.arange(rows, device=dev) + keys - rows + 1), min=1).to(torch.int32)
    return {
        "q": torch.zeros(rows, HEADS, DIM, device=dev).to(torch.float8_e4m3fn),
        "w": torch.ones(rows, HEADS, device=dev),
        "ks": torch.zeros(rows, dtype=torch.int32, device=dev),
        "ke": lens,
        "table": torch.arange(pages, dtype=torch.int32, device=dev),
        "kv_bf16": torch.zeros(pages, PAGE, 1, DIM, dtype=torch.bfloat16, device=dev),
        "k_fp8": torch.zeros(pages * PAGE, DIM, device=dev).to(torch.float8_e4m3fn),
        "k_scale": torch.ones(pages * PAGE, device=dev),
        "width": pages * PAGE,
        "pages": pages,
    }


# ------------------------------------------------------------------------- the two formats


def bf16_phases(sizes: list[int], mtp_sizes: list[int]) -> list[Phase]:
    from verify.core.upstream import load_bf16_kernel_module, load_bf16_prefill_module

    paged, _ = load_bf16_kernel_module()
    prefill, _ = load_bf16_prefill_module()
    counter = Counter(
        {
            "bf16_paged_mqa_logits": paged._bf16_paged_mqa_logits_kernel,
            "bf16_mqa_logits": prefill._bf16_mqa_logits_kernel,
        },
        {},
    )
    out = []
    for name, rows_per_req, bss in (("capture", 1, sizes), ("mtp", MTP_DRAFT_TOKENS, mtp_sizes)):
        phase = Phase(name, "bf16")
        try:
            for bs in bss:
                rows = bs * rows_per_req
                x = _decode_inputs(rows, fp8=False)
                group = rows_per_req if rows_per_req > 1 and rows <= paged.MAX_GROUPED_ROWS else 1

                def call(x: dict[str, Any] = x, group: int = group) -> Any:
                    return paged.bf16_paged_mqa_logits(
                        x["q"],
                        x["kv"],
                        x["w"],
                        x["lens"],
                        x["table"],
                        None,
                        x["width"],
                        False,
                        group_rows=group,
                    )

                phase.calls.append(
                    _timed(f"bs={bs} ({rows} rows, group_rows={group})", call, counter, capture=True)
                )
        except Exception as error:  # noqa: BLE001 - recorded, the other phases go on
            phase.error = f"{type(error).__name__}: {error}"[:300]
        out.append(phase)
    phase = Phase("prefill", "bf16")
    try:
        for rows in PAGED_PREFILL_ROWS:
            x = _decode_inputs(rows, fp8=False)
            x["lens"].copy_(_prefill_inputs(rows, x["width"])["ke"])

            def paged_call(x: dict[str, Any] = x) -> Any:
                return paged.bf16_paged_mqa_logits(
                    x["q"], x["kv"], x["w"], x["lens"], x["table"], None, x["width"], False
                )

            phase.calls.append(_timed(f"paged, {rows} rows", paged_call, counter, capture=False))
        for rows in NONPAGED_PREFILL_ROWS:
            keys = rows // 4 + 1000  # a prefix before the chunk: every chunk's own key count
            x = _prefill_inputs(rows, keys)

            def nonpaged_call(x: dict[str, Any] = x) -> Any:
                return prefill.bf16_mqa_logits(
                    x["q"],
                    x["kv_bf16"],
                    x["w"],
                    x["ks"],
                    x["ke"],
                    x["width"],
                    page_table=x["table"],
                    clean_logits=False,
                )

            phase.calls.append(
                _timed(f"prefill kernel, {rows} rows x {keys} keys", nonpaged_call, counter, capture=False)
            )
    except Exception as error:  # noqa: BLE001
        phase.error = f"{type(error).__name__}: {error}"[:300]
    out.append(phase)
    return out


def fp8_phases(sizes: list[int], mtp_sizes: list[int], folders: dict[str, Path]) -> tuple[list[Phase], str]:
    import torch

    from verify.bench import deepgemm_arm
    from verify.core import upstream as U

    dg, how = deepgemm_arm.load()
    if dg is None:
        return [], how
    meta = U.load("metadata_jit")
    if isinstance(meta, U.Missing):
        return [], f"not run: upstream's JIT metadata kernel does not load ({meta.reason})"
    metadata = meta.obj
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    counter = Counter({}, {k: v for k, v in folders.items() if k != "TRITON_CACHE_DIR"})
    out = []
    for name, rows_per_req, bss in (("capture", 1, sizes), ("mtp", MTP_DRAFT_TOKENS, mtp_sizes)):
        phase = Phase(name, "fp8")
        try:
            for bs in bss:
                rows = bs * rows_per_req  # upstream hands DeepGEMM the flattened verify rows, next_n = 1
                x = _decode_inputs(rows, fp8=True)
                lens2 = x["lens"].reshape(-1, 1)

                def call(x: dict[str, Any] = x, lens2: Any = lens2) -> Any:
                    schedule = metadata(x["lens"], PAGE, sms)
                    return dg.fp8_paged_mqa_logits(
                        x["q"], x["kv"], x["w"], lens2, x["table"], schedule, x["width"], False
                    )

                phase.calls.append(_timed(f"bs={bs} ({rows} rows)", call, counter, capture=True))
        except Exception as error:  # noqa: BLE001
            phase.error = f"{type(error).__name__}: {error}"[:300]
        out.append(phase)
    phase = Phase("prefill", "fp8")
    try:
        for rows in PAGED_PREFILL_ROWS:
            x = _decode_inputs(rows, fp8=True)
            x["lens"].copy_(_prefill_inputs(rows, x["width"])["ke"])

            def paged_call(x: dict[str, Any] = x) -> Any:
                schedule = metadata(x["lens"], PAGE, sms)
                return dg.fp8_paged_mqa_logits(
                    x["q"], x["kv"], x["w"], x["lens"].reshape(-1, 1), x["table"], schedule, x["width"], False
                )

            phase.calls.append(_timed(f"paged, {rows} rows", paged_call, counter, capture=False))
        for rows in NONPAGED_PREFILL_ROWS:
            keys = rows // 4 + 1000
            x = _prefill_inputs(rows, keys)

            def nonpaged_call(x: dict[str, Any] = x) -> Any:
                return dg.fp8_mqa_logits(
                    x["q"],
                    (x["k_fp8"], x["k_scale"]),
                    x["w"],
                    x["ks"],
                    x["ke"],
                    clean_logits=False,
                    max_seqlen_k=x["width"],
                )

            phase.calls.append(
                _timed(
                    f"non-paged fp8_mqa_logits, {rows} rows x {keys} keys",
                    nonpaged_call,
                    counter,
                    capture=False,
                )
            )
    except Exception as error:  # noqa: BLE001
        phase.error = f"{type(error).__name__}: {error}"[:300]
    out.append(phase)
    return out, f"{how}; metadata: {meta.name}"


def run(pass_name: str, cache: Path) -> dict[str, Any]:
    import torch
    import triton

    folders = {k: Path(os.environ[k]) for k in ENV_FOLDERS if os.environ.get(k)}
    for path in folders.values():
        path.mkdir(parents=True, exist_ok=True)
    sizes, mtp_sizes = capture_sizes(), capture_sizes(speculative=True)
    t0 = time.perf_counter()
    bf16 = bf16_phases(sizes, mtp_sizes)
    fp8, fp8_how = fp8_phases(sizes, mtp_sizes, folders)
    return {
        "suite": "bench_compile",
        "pass": pass_name,
        "cache": str(cache),
        "cache_folders": {k: str(v) for k, v in folders.items()},
        "gpu": torch.cuda.get_device_name(),
        "triton": triton.__version__,
        "capture_sizes": sizes,
        "mtp_capture_sizes": mtp_sizes,
        "context_keys": CONTEXT_KEYS,
        "fp8": fp8_how,
        "seconds": round(time.perf_counter() - t0, 2),
        "phases": [
            {"name": p.name, "format": p.fmt, **p.summary(), "calls_detail": [asdict(c) for c in p.calls]}
            for p in bf16 + fp8
        ],
    }


def child_env(cache: Path) -> dict[str, str]:
    """The process environment of a pass: every JIT cache folder under ``cache``."""
    env = dict(os.environ)
    for name in ENV_FOLDERS:
        env[name] = str(cache / name.lower())
    return env


def run_passes(out: Path, cache: Path, timeout: float = 150.0) -> dict[str, Any]:
    """The cold pass, then the warm one, each in its own process (the bench calls this); returns
    ``{"cold": ..., "warm": ...}`` (a pass that failed holds its error) and writes
    ``out/bench_compile.json``."""
    import shutil
    import subprocess

    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    result: dict[str, Any] = {}
    for name in ("cold", "warm"):
        path = out / f"compile-{name}.json"
        cmd = [
            sys.executable,
            "-m",
            "verify.bench.compile_cost",
            "--pass",
            name,
            "--cache",
            str(cache),
            "--out",
            str(path),
        ]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, env=child_env(cache), capture_output=True, text=True, timeout=timeout, check=False
            )
            ok = proc.returncode == 0 and path.is_file()
            result[name] = (
                json.loads(path.read_text())
                if ok
                else {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}"}
            )
        except subprocess.TimeoutExpired:
            result[name] = {"error": f"timed out after {timeout:.0f} s"}
        result[name]["wall_seconds"] = round(time.perf_counter() - t0, 2)
        if path.is_file():
            path.unlink()
    result[SERIES_HASH] = series_hash()
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_compile.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def table(result: dict[str, Any]) -> str:
    """Per phase and format: variants compiled and seconds, cold beside warm."""
    cold, warm = result.get("cold", {}), result.get("warm", {})
    lines = [
        (
            f"{'compile':<10} {'format':<6} {'calls':>5} {'variants (cold)':>16} {'s in compiling calls':>21} "
            f"{'s total (cold)':>15} {'s total (warm)':>15}  variants by kernel / cache"
        )
    ]
    by_warm = {(p["name"], p["format"]): p for p in warm.get("phases", [])}
    for p in cold.get("phases", []):
        w = by_warm.get((p["name"], p["format"]), {})
        lines.append(
            f"{p['name']:<10} {p['format']:<6} {p['calls']:>5} {p['variants_total']:>16} "
            f"{p['seconds_in_compiling_calls']:>21.2f} {p['seconds_total']:>15.2f} "
            f"{w.get('seconds_total', float('nan')):>15.2f}  {p['variants']}"
            + (f"  ERROR {p['error']}" if p.get("error") else "")
        )
    for name, res in (("cold", cold), ("warm", warm)):
        if "error" in res:
            lines.append(f"{name} pass: {res['error'][:300]}")
    if cold.get("fp8"):
        lines.append(f"fp8: {cold['fp8']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="pass_name", choices=("cold", "warm"), required=True)
    parser.add_argument("--cache", type=Path, required=True, help="the JIT cache folders' parent (child_env)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("compile cost needs a CUDA GPU", file=sys.stderr)
        return 2
    res = run(args.pass_name, args.cache)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
