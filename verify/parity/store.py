"""Tier-1 store parity (GPU): bf16 index keys as the patched fused kernel and the unfused path
write them, against an fp32 reference; exact read-back; canaries; fp8 default path vs upstream.

Run on the GPU machine with the patched upstream first on PYTHONPATH::

    PYTHONPATH=/path/to/patched/python:/path/to/repo \\
        python -m verify.parity.store --out verify/results/parity \\
        --baseline-tree /path/to/unpatched/python

Checks (each runs on its own; one failing or erroring does not stop the others):

- ``fused_bf16/<case>``: ``compress_norm_rope_store(..., bf16_store=True)`` into a canary-filled
  pool behind a shuffled page table. Every key within 1 bf16 ulp of the fp32 reference rounded
  once (values below the fp32 noise floor of their row excepted, reported separately); the bytes
  read back through the dense bf16 view equal an explicit little-endian decode; no byte outside
  the written slots changed (page 0, where skipped rows point, included).
- ``unfused_bf16/<case>``: the same keys through ``forward_unified`` with
  ``SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR=1`` into a real bf16 ``DeepSeekV4IndexerPool``: the
  same bounds against the reference and against the fused keys; only slot 0 (the dump slot)
  may change besides the written ones.
- ``fused_via_compressor/<case>``: ``forward_unified`` with the env unset takes the fused kernel
  for a bf16 pool and writes exactly the bytes of the kernel-level arm.
- ``pool_readback``: ``set_index_k_bf16`` / ``get_index_k_bf16_buffer`` round trip is exact.
- ``fp8_sanity/<case>``: the fp8 store dequantizes to the reference within fp8 precision.
- ``fp8_default_vs_upstream``: fp8 store bytes of this tree and of ``--baseline-tree``, each run
  in its own subprocess with its own JIT cache, are identical for every case.

Results: ``<out>/store.json`` and a summary table on stdout. Exit status 0 only if nothing failed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from verify.core.store_cases import (
    DEFAULT_DECODE_SEQ_LENS,
    DEFAULT_LENGTHS,
    DecodeCase,
    PrefillCase,
    make_prefill_case,
)
from verify.core.store_driver import (
    DUMP_SLOT,
    Prepared,
    make_freqs_cis,
    max_position,
    new_pool_buffer,
    prepare_decode,
    prepare_prefill,
    store_fused,
    upstream_ops,
)
from verify.core.store_layout import (
    BF16_LAYOUT,
    FP8_LAYOUT,
    bf16_slot_view,
    canary_report,
    decode_bf16_slots,
    decode_fp8_slots,
    fill_canary,
    written_byte_mask,
)
from verify.core.store_reference import Bf16Comparison, compare_bf16, index_k_reference
from verify.parity import store_baseline
from verify.parity.store_report import (
    CheckResult,
    CheckSkipped,
    Status,
    run_check,
    summary_table,
    write_json,
)

SUITE = "parity.store"
# e4m3 keeps 3 mantissa bits: a value is within 2**-4 of itself, plus the subnormal step of the
# per-key scale (absmax / 448) -- generous bounds, this is a sanity check of the fp8 arm only.
FP8_REL_TOL = 0.07
FP8_ROW_ABS_TOL = 0.004

Case = PrefillCase | DecodeCase


@dataclass
class Suite:
    """Shared state of one run: options, lazily imported upstream, prepared cases, results."""

    out: Path
    device: torch.device
    cases: list[Case]
    baseline_tree: Path | None
    baseline_jit_cache: Path
    keep_artifacts: bool
    _ops: dict[str, Any] | None = None
    _freqs: torch.Tensor | None = None
    _prepared: dict[str, Prepared] = field(default_factory=dict)
    _fused: dict[str, torch.Tensor] = field(default_factory=dict)  # bf16 keys per case

    @property
    def ops(self) -> dict[str, Any]:
        if self._ops is None:
            self._ops = upstream_ops()
        return self._ops

    def prepared(self, case: Case) -> Prepared:
        if case.name not in self._prepared:
            if self._freqs is None:
                self._freqs = make_freqs_cis(max_position(self.cases), self.device)
            if isinstance(case, PrefillCase):
                self._prepared[case.name] = prepare_prefill(self.ops, case, self._freqs, self.device)
            else:
                self._prepared[case.name] = prepare_decode(self.ops, case, self._freqs, self.device)
        return self._prepared[case.name]

    def reference(self, p: Prepared) -> torch.Tensor:
        return index_k_reference(p.stored_kv(), p.weight, p.eps, p.freqs_cis, p.positions)

    def fused_keys(self, case: Case) -> torch.Tensor:
        """bf16 keys of the kernel-level fused arm (runs it if its check has not)."""
        if case.name not in self._fused:
            p = self.prepared(case)
            buffer, _ = new_pool_buffer(p, BF16_LAYOUT, self.device)
            store_fused(self.ops, p, buffer, bf16_store=True)
            self._fused[case.name] = decode_bf16_slots(buffer, p.slots)
        return self._fused[case.name]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _cmp_summary(cmp: Bf16Comparison) -> str:
    exact = cmp.exact / cmp.elements if cmp.elements else 1.0
    floor = f", {cmp.noise_floor_only} at noise floor" if cmp.noise_floor_only else ""
    return f"max {cmp.max_ulp} ulp, {exact:.2%} exact{floor}, {cmp.failures} bad"


def _verdict(name: str, parts: dict[str, bool], summary: str, details: dict[str, Any]) -> CheckResult:
    failed = [k for k, ok in parts.items() if not ok]
    status = Status.PASS if not failed else Status.FAIL
    if failed:
        summary = f"FAILED {', '.join(failed)}; {summary}"
    return CheckResult(name, status, summary, {"parts": parts, **details})


# ------------------------------------------------------------------------------------ checks


def check_fused_bf16(suite: Suite, case: Case) -> CheckResult:
    p = suite.prepared(case)
    buffer, canary = new_pool_buffer(p, BF16_LAYOUT, suite.device)
    store_fused(suite.ops, p, buffer, bf16_store=True)
    _sync()
    keys = decode_bf16_slots(buffer, p.slots)
    suite._fused[case.name] = keys
    cmp = compare_bf16(keys, suite.reference(p))
    readback_exact = torch.equal(bf16_slot_view(buffer)[p.slots].view(torch.int16), keys.view(torch.int16))
    mask = written_byte_mask(BF16_LAYOUT, p.slots, buffer.shape[0])
    canary_ok = canary_report(canary, buffer, mask, BF16_LAYOUT.page_bytes)
    return _verdict(
        f"fused_bf16/{case.name}",
        {"reference": cmp.ok, "readback": readback_exact, "canary": bool(canary_ok["ok"])},
        f"{p.slots.numel()} keys: {_cmp_summary(cmp)}",
        {"case": p.info, "vs_reference": cmp.to_json(), "canary": canary_ok},
    )


def _pool_arm(suite: Suite, case: Case, unfused: bool) -> tuple[Prepared, torch.Tensor, torch.Tensor]:
    """Replay through forward_unified into a canary-filled real bf16 pool; (prepared, buffer, canary)."""
    from verify.parity.store_compressor import make_bf16_token_pool, replay_through_compressor

    p = suite.prepared(case)
    token_pool, buffer = make_bf16_token_pool(p.num_pages, suite.device)
    if buffer.dim() != 2 or buffer.shape[1] != BF16_LAYOUT.page_bytes or buffer.shape[0] < p.num_pages:
        raise RuntimeError(f"bf16 pool buffer is {tuple(buffer.shape)}, expected [>= {p.num_pages}, 16384]")
    canary = fill_canary(buffer, p.seed + 7)
    replay_through_compressor(p, token_pool, suite.device, unfused=unfused)
    return p, buffer, canary


def _vs_fused(
    suite: Suite, case: Case, keys: torch.Tensor, reference: torch.Tensor
) -> tuple[dict[str, bool], dict[str, Any]]:
    """Compare with the kernel-level fused keys if that arm runs; its failure is its own check's."""
    try:
        fused = suite.fused_keys(case)
    except Exception as error:  # noqa: BLE001 - reported, not raised: this arm is checked elsewhere
        return {}, {"vs_fused": f"unavailable: {type(error).__name__}: {error}"[:300]}
    # Same bound as against the reference; the row scale comes from the fp32 reference.
    cmp = compare_bf16(keys, fused, row_scale=reference.abs().amax(dim=-1, keepdim=True))
    return {"fused": cmp.ok}, {"vs_fused": cmp.to_json()}


def check_unfused_bf16(suite: Suite, case: Case) -> CheckResult:
    p, buffer, canary = _pool_arm(suite, case, unfused=True)
    keys = decode_bf16_slots(buffer, p.slots)
    reference = suite.reference(p)
    cmp_ref = compare_bf16(keys, reference)
    fused_parts, fused_details = _vs_fused(suite, case, keys, reference)
    allowed = written_byte_mask(
        BF16_LAYOUT, torch.cat([p.slots, p.slots.new_tensor([DUMP_SLOT])]), buffer.shape[0]
    )
    canary_ok = canary_report(canary, buffer, allowed, BF16_LAYOUT.page_bytes)
    dump_written = bool((buffer.view(-1)[:256] != canary.view(-1)[:256]).any())
    dump_zero = bool((bf16_slot_view(buffer)[DUMP_SLOT] == 0).all()) if dump_written else True
    vs_fused = fused_details["vs_fused"]
    fused_note = (
        f"vs fused max {vs_fused['max_ulp']} ulp" if isinstance(vs_fused, dict) else "fused arm unavailable"
    )
    return _verdict(
        f"unfused_bf16/{case.name}",
        {
            "reference": cmp_ref.ok,
            **fused_parts,
            "canary": bool(canary_ok["ok"]),
            "dump_slot_zero": dump_zero,
        },
        f"{p.slots.numel()} keys: ref {_cmp_summary(cmp_ref)}; {fused_note}",
        {
            "case": p.info,
            "vs_reference": cmp_ref.to_json(),
            **fused_details,
            "canary": canary_ok,
            "dump_slot_written": dump_written,
        },
    )


def check_fused_via_compressor(suite: Suite, case: Case) -> CheckResult:
    p, buffer, canary = _pool_arm(suite, case, unfused=False)
    keys = decode_bf16_slots(buffer, p.slots)
    cmp_ref = compare_bf16(keys, suite.reference(p))
    mask = written_byte_mask(BF16_LAYOUT, p.slots, buffer.shape[0])
    canary_ok = canary_report(canary, buffer, mask, BF16_LAYOUT.page_bytes)
    parts = {"reference": cmp_ref.ok, "canary": bool(canary_ok["ok"])}
    try:
        # The compressor must hand the kernel the same keys, slots and pages as a direct call.
        same: bool | None = torch.equal(keys.view(torch.int16), suite.fused_keys(case).view(torch.int16))
        parts["bitwise_equal_kernel_arm"] = bool(same)
        note = "bit-identical to" if same else "DIFFERENT from"
    except Exception as error:  # noqa: BLE001 - the kernel arm's failure is reported by its own check
        same, note = None, f"kernel arm unavailable ({type(error).__name__}), not compared with"
    return _verdict(
        f"fused_via_compressor/{case.name}",
        parts,
        f"{p.slots.numel()} keys: {note} the kernel-level fused store; ref {_cmp_summary(cmp_ref)}",
        {
            "case": p.info,
            "vs_reference": cmp_ref.to_json(),
            "canary": canary_ok,
            "bitwise_equal_kernel_arm": same,
        },
    )


def check_pool_readback(suite: Suite) -> CheckResult:
    """set_index_k_bf16 -> get_index_k_bf16_buffer returns the bf16 rounding of what was set."""
    from verify.parity.store_compressor import make_bf16_token_pool

    num_pages = 40
    token_pool, buffer = make_bf16_token_pool(num_pages, suite.device)
    canary = fill_canary(buffer, 99)
    gen = torch.Generator(device="cpu").manual_seed(5)
    slots = (torch.randperm(num_pages * 64 - 64, generator=gen)[:700] + 64).to(suite.device)  # not slot 0
    values = (torch.randn(700, 128, generator=gen) * 4).to(suite.device)
    token_pool.set_index_k_bf16(1, slots, values)
    _sync()
    view = token_pool.get_index_k_bf16_buffer(1)
    got = view.reshape(-1, 128)[slots]
    expected = values.to(torch.bfloat16)
    exact = torch.equal(got.view(torch.int16), expected.view(torch.int16))
    raw_exact = torch.equal(decode_bf16_slots(buffer, slots).view(torch.int16), expected.view(torch.int16))
    shape_ok = tuple(view.shape) == (buffer.shape[0], 64, 128) and view.data_ptr() == buffer.data_ptr()
    canary_ok = canary_report(
        canary, buffer, written_byte_mask(BF16_LAYOUT, slots, buffer.shape[0]), BF16_LAYOUT.page_bytes
    )
    return _verdict(
        "pool_readback",
        {
            "accessor_exact": exact,
            "raw_bytes_exact": raw_exact,
            "view_no_copy": shape_ok,
            "canary": bool(canary_ok["ok"]),
        },
        f"700 keys at shuffled slots, fp32 in: {'exact' if exact and raw_exact else 'MISMATCH'} bf16 read-back",
        {"view_shape": list(view.shape), "canary": canary_ok},
    )


def check_fp8_sanity(suite: Suite, case: Case) -> CheckResult:
    p = suite.prepared(case)
    buffer, canary = new_pool_buffer(p, FP8_LAYOUT, suite.device)
    store_fused(suite.ops, p, buffer, bf16_store=False)
    _sync()
    deq = decode_fp8_slots(buffer, p.slots)
    ref = suite.reference(p)
    row_max = ref.abs().amax(dim=-1, keepdim=True) if ref.numel() else ref
    err = (deq - ref).abs()
    bound = FP8_REL_TOL * ref.abs() + FP8_ROW_ABS_TOL * row_max
    bad = int((err > bound).sum()) if ref.numel() else 0
    rel = float((err / row_max.clamp_min(1e-30)).max()) if ref.numel() else 0.0
    canary_ok = canary_report(
        canary, buffer, written_byte_mask(FP8_LAYOUT, p.slots, buffer.shape[0]), FP8_LAYOUT.page_bytes
    )
    return _verdict(
        f"fp8_sanity/{case.name}",
        {"within_fp8_precision": bad == 0, "canary": bool(canary_ok["ok"])},
        f"{p.slots.numel()} keys: max err {rel:.4f} of row max, {bad} beyond fp8 bound",
        {"case": p.info, "max_err_rel_row": rel, "beyond_bound": bad, "canary": canary_ok},
    )


def check_fp8_default_vs_upstream(suite: Suite) -> CheckResult:
    if suite.baseline_tree is None:
        raise CheckSkipped("no --baseline-tree given (unpatched upstream python/ dir)")
    work = suite.out / "store_work"
    inputs = work / "fp8_inputs.pt"
    prepared, unprepared = [], {}
    for case in suite.cases:
        try:
            prepared.append(suite.prepared(case))
        except Exception as error:  # noqa: BLE001 - compare the cases that could be prepared
            unprepared[case.name] = f"{type(error).__name__}: {error}"[:300]
    if not prepared:
        raise RuntimeError(f"no case could be prepared: {unprepared}")
    store_baseline.save_inputs(inputs, prepared)
    patched_tree = store_baseline._tree_of_imported_sglang()
    patched = store_baseline.run_worker(
        patched_tree, inputs, work / "fp8_patched.pt", None, work / "fp8_patched.log"
    )
    baseline = store_baseline.run_worker(
        suite.baseline_tree,
        inputs,
        work / "fp8_baseline.pt",
        suite.baseline_jit_cache,
        work / "fp8_baseline.log",
    )
    per_case = store_baseline.compare_outputs(patched, baseline)
    identical = [n for n, r in per_case.items() if r.get("identical")]
    if not suite.keep_artifacts:
        for name in ("fp8_inputs.pt", "fp8_patched.pt", "fp8_baseline.pt"):
            (work / name).unlink(missing_ok=True)
    return _verdict(
        "fp8_default_vs_upstream",
        {
            "all_identical": len(identical) == len(per_case) and bool(per_case),
            "all_cases_prepared": not unprepared,
        },
        f"{len(identical)}/{len(per_case)} cases byte-identical to unpatched upstream",
        {
            "unprepared": unprepared,
            "patched_tree": str(patched_tree),
            "patched_sglang": patched.get("sglang"),
            "baseline_tree": str(suite.baseline_tree),
            "baseline_sglang": baseline.get("sglang"),
            "per_case": per_case,
        },
    )


# ------------------------------------------------------------------------------------ running


def build_checks(suite: Suite) -> list[tuple[str, Callable[[], CheckResult]]]:
    """All checks in run order; names are what --only matches."""
    checks: list[tuple[str, Callable[[], CheckResult]]] = [
        ("fp8_default_vs_upstream", partial(check_fp8_default_vs_upstream, suite)),
    ]
    per_case: list[tuple[str, Callable[[Suite, Case], CheckResult]]] = [
        ("fused_bf16", check_fused_bf16),
        ("unfused_bf16", check_unfused_bf16),
        ("fused_via_compressor", check_fused_via_compressor),
    ]
    for prefix, fn in per_case:
        checks += [(f"{prefix}/{case.name}", partial(fn, suite, case)) for case in suite.cases]
    checks.append(("pool_readback", partial(check_pool_readback, suite)))
    checks += [(f"fp8_sanity/{case.name}", partial(check_fp8_sanity, suite, case)) for case in suite.cases]
    return checks


def _cuda_alive() -> bool:
    try:
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure means the context is gone
        return False


def run_in_process(suite: Suite, selected: list[tuple[str, Callable[[], CheckResult]]]) -> list[CheckResult]:
    results: list[CheckResult] = []
    lost_after: str | None = None
    for name, fn in selected:
        if lost_after is not None:
            results.append(
                CheckResult(
                    name,
                    Status.ERROR,
                    f"not run: CUDA context lost after {lost_after} (rerun with --isolate)",
                )
            )
            continue
        result = run_check(name, fn, after=_sync)
        results.append(result)
        print(f"[{result.status.value.upper():5}] {name}: {result.summary}", flush=True)
        if result.status is Status.ERROR and not _cuda_alive():
            lost_after = name
    return results


def run_isolated(args: argparse.Namespace, names: list[str]) -> list[CheckResult]:
    """One subprocess per check: a kernel fault then costs only its own check."""
    results: list[CheckResult] = []
    for index, name in enumerate(names):
        sub_out = args.out / "isolated" / f"{index:03d}"
        cmd = [sys.executable, "-m", "verify.parity.store", "--out", str(sub_out), "--only", name]
        cmd += _passthrough_args(args)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        (sub_out).mkdir(parents=True, exist_ok=True)
        (sub_out / "log.txt").write_text(proc.stdout + proc.stderr)
        try:
            payload = json.loads((sub_out / "store.json").read_text())
            for r in payload["results"]:
                results.append(
                    CheckResult(r["name"], Status(r["status"]), r["summary"], r["details"], r["seconds"])
                )
        except (OSError, KeyError, ValueError) as error:
            results.append(
                CheckResult(
                    name,
                    Status.ERROR,
                    f"subprocess exited {proc.returncode}: {error}",
                    {"log": (proc.stdout + proc.stderr)[-4000:]},
                )
            )
        print(f"[{results[-1].status.value.upper():5}] {name}: {results[-1].summary}", flush=True)
    return results


def _passthrough_args(args: argparse.Namespace) -> list[str]:
    extra = ["--lengths", ",".join(str(n) for n in args.lengths), "--seed", str(args.seed)]
    if args.baseline_tree is not None:
        extra += [
            "--baseline-tree",
            str(args.baseline_tree),
            "--baseline-jit-cache",
            str(args.baseline_jit_cache),
        ]
    if args.keep_artifacts:
        extra.append("--keep-artifacts")
    if args.no_decode:
        extra.append("--no-decode")
    return extra


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "jit_cache": os.environ.get("SGLANG_JIT_CACHE_DIR"),
        "lengths": args.lengths,
        "seed": args.seed,
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    try:
        import sglang

        meta["sglang"] = sglang.__file__
    except ImportError as error:
        meta["sglang"] = f"not importable: {error}"
    meta["nvcc"] = shutil.which("nvcc")
    return meta


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m verify.parity.store", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="results folder (store.json goes here)")
    parser.add_argument(
        "--baseline-tree", type=Path, help="unpatched upstream python/ dir for the fp8 default-path check"
    )
    parser.add_argument(
        "--baseline-jit-cache",
        type=Path,
        help="JIT cache of the baseline run (default <out>/jit-cache-baseline)",
    )
    parser.add_argument(
        "--lengths",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=list(DEFAULT_LENGTHS),
        help="compressed-key counts of the prefill cases (default %(default)s)",
    )
    parser.add_argument("--no-decode", action="store_true", help="leave out the decode case")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--only", action="append", default=[], help="glob over check names; repeatable")
    parser.add_argument("--isolate", action="store_true", help="run every check in its own subprocess")
    parser.add_argument("--keep-artifacts", action="store_true", help="keep the saved inputs and pool bytes")
    parser.add_argument("--list", action="store_true", help="print the check names and exit")
    args = parser.parse_args(argv)
    if args.baseline_jit_cache is None:
        args.baseline_jit_cache = args.out / "jit-cache-baseline"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases: list[Case] = [make_prefill_case(n, seed=args.seed + i) for i, n in enumerate(args.lengths)]
    if not args.no_decode:
        cases.append(DecodeCase(DEFAULT_DECODE_SEQ_LENS, seed=args.seed + 1000))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    suite = Suite(args.out, device, cases, args.baseline_tree, args.baseline_jit_cache, args.keep_artifacts)
    checks = build_checks(suite)
    if args.only:
        checks = [(n, f) for n, f in checks if any(fnmatch.fnmatch(n, pat) for pat in args.only)]
    if args.list:
        print("\n".join(n for n, _ in checks))
        return 0
    if device.type != "cuda":
        results = [
            CheckResult(n, Status.ERROR, "no CUDA device: this suite runs on the GPU machine")
            for n, _ in checks
        ]
    elif args.isolate:
        results = run_isolated(args, [n for n, _ in checks])
    else:
        results = run_in_process(suite, checks)
    write_json(args.out / "store.json", SUITE, results, _meta(args))
    print()
    print(summary_table(results))
    print(f"\nresults: {args.out / 'store.json'}")
    return 0 if all(r.status in (Status.PASS, Status.SKIP) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
