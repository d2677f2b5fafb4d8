"""``python -m verify.forward``: the forward tier (``nox -s verify_recall -- --tiers forward``).

Examples::

    # any machine: which function upstream's C4 indexer calls on each GPU (the dispatch probe)
    python -m verify.forward --probe-only --out build/verify/forward

    # a CUDA GPU: the probe, then every scenario for the local GPU's profile and for sm120's dispatch
    python -m verify.forward --platform auto sm120 --out build/verify/forward

Exit status: 0 when every step passed, 1 when one failed, 2 on errors (incomplete: a scenario
that could not run is never a pass), 3 when the scenarios need a GPU this machine lacks (the probe
ran and is written).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from verify.core import platform as P
from verify.core import probe as probe_mod
from verify.core import upstream as U
from verify.core.provenance import SERIES_HASH, applied_state, series_hash


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m verify.forward",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--platform",
        nargs="+",
        default=["auto"],
        help="profiles whose dispatch the scenarios run under: auto (the local GPU's), sm90, sm100, sm120, hip",
    )
    ap.add_argument("--formats", nargs="+", choices=("bf16", "fp8"), default=["bf16", "fp8"])
    ap.add_argument("--compressors", nargs="+", choices=("fused", "unfused"), default=["fused", "unfused"])
    ap.add_argument("--no-mtp", action="store_true", help="skip the target-verify (MTP) arms")
    ap.add_argument(
        "--mtp-drafts",
        nargs="+",
        type=int,
        default=[2],
        choices=(2, 3, 4),
        help="draft tokens per request of the target-verify arms (default: 2)",
    )
    ap.add_argument(
        "--arms",
        nargs="+",
        default=None,
        help="run only these arms, e.g. fp8/fused bf16/fused fp8/fused/mtp2; PROFILE:ARM runs an arm on that "
        "profile only, e.g. sm120:fp8/fused (overrides the three above)",
    )
    ap.add_argument("--quick", action="store_true", help="short lengths (no 131K request)")
    ap.add_argument(
        "--scenarios",
        nargs="+",
        default=None,
        metavar="NAME",
        help="run only these scenarios (verify.forward.tier.SCENARIOS; default: all), e.g. "
        "bounded bounded_large; the flag-off control runs the same ones",
    )
    ap.add_argument(
        "--arm-scenarios",
        nargs="+",
        default=[],
        metavar="ARM=NAMES",
        help="per arm, instead of --scenarios: ARM=NAME[,NAME...], ARM an arm name or PROFILE:ARM, e.g. "
        "sm90:fp8/fused=bounded",
    )
    ap.add_argument("--probe-only", action="store_true")
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help=(
            "an unpatched upstream python/ dir: the flag-off arm must select the same slots and leave the same "
            "pool bytes; where selections differ, the unpatched tree runs again as the control"
        ),
    )
    ap.add_argument("--worker-baseline", type=Path, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def run_probe(out: Path) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[probe_mod.Dispatch] = []
    errors: list[str] = []
    for profile in P.PROFILE_NAMES:
        for flag in (False, True):
            try:
                rows += probe_mod.probe(profile, flag)
            except Exception as exc:  # noqa: BLE001 -- recorded: a profile that cannot be probed is incomplete
                errors.append(f"{profile} flag={'on' if flag else 'off'}: {U.short_error(exc)}")
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "dispatch": probe_mod.as_dicts(rows),
        "errors": errors,
        SERIES_HASH: series_hash(),
    }
    (out / "dispatch.json").write_text(json.dumps(data, indent=1))
    (out / "dispatch.md").write_text(
        "# Which function upstream's C4 indexer calls, per platform (dispatch probe)\n\n"
        + probe_mod.table(rows)
        + "\n\nReplacements: "
        + "; ".join(rows[0].replaced if rows else [])
        + "\n"
        + ("\nErrors:\n" + "\n".join(f"- {e}" for e in errors) + "\n" if errors else "")
    )
    print(probe_mod.table(rows))
    for e in errors:
        print("probe error:", e)
    return data["dispatch"], errors


def _sizes(quick: bool, scenarios: Sequence[str] | None) -> Any:
    from dataclasses import replace

    from .tier import QUICK, SCENARIOS, Sizes

    if scenarios:
        unknown = sorted(set(scenarios) - set(SCENARIOS))
        if unknown:
            raise SystemExit(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    return replace(QUICK if quick else Sizes(), only=tuple(scenarios) if scenarios else None)


def _baseline_worker(profile: str, quick: bool, out: Path, scenarios: Sequence[str] | None = None) -> int:
    """Runs under the unpatched tree: the flag-off fused arm's selections, pool digests and the
    oracle checks' verdict per step."""
    from verify.core.stand_ins import install_deep_gemm_stand_in

    from .tier import ArmSpec, run_arm

    install_deep_gemm_stand_in()  # the unpatched tree imports DeepGEMM at module level as well
    # The scorer built as the patched run builds it: a TileLang kernel lowered otherwise (wgmma
    # instead of sm_120's mma.sync) sums in another order and breaks near-ties its own way.
    scorer_build = _tilelang_for(profile)
    with P.applied(profile) as applied:
        arm = run_arm(applied, ArmSpec("fp8", "fused"), _sizes(quick, scenarios))
    torch.save(
        {
            "selections": arm.selections,
            "pool_digest": arm.pool_digest,
            "step_status": arm.step_status,
            "scorer_build": scorer_build,
            "logits_digest": arm.logits_digest,
            "errors": [r.detail for r in arm.results if r.status == "error"],
        },
        out,
    )
    return 0


def _run_baseline(
    tree: Path, profile: str, quick: bool, out: Path, tag: str, scenarios: Sequence[str] | None = None
) -> dict[str, Any] | str:
    """One unpatched-tree worker; its saved record, or why there is none."""
    path = out / f"baseline-{profile}{tag}.pt"
    cmd = (
        [
            sys.executable,
            "-m",
            "verify.forward",
            "--out",
            str(out),
            "--platform",
            profile,
            "--worker-baseline",
            str(path),
        ]
        + (["--quick"] if quick else [])
        + (["--scenarios", *scenarios] if scenarios else [])
    )
    # The unpatched tree's JIT builds live beside that tree, not among the results (hundreds of
    # MB), and serve the control run and later calls on the same machine.
    env = U.worker_env(tree, jit_cache=tree.parent / f".jit-cache-{profile}")
    log = out / f"baseline-{profile}{tag}.log"
    with open(log, "w") as handle:
        proc = subprocess.run(
            cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False, timeout=1800
        )
    if proc.returncode != 0 or not path.exists():
        return f"baseline worker exited {proc.returncode}; see {log.name}"
    base = torch.load(path, weights_only=False)
    path.unlink()  # selections of every step: large, and summarised in results.json
    if base["errors"]:
        return f"baseline run errors: {base['errors'][:1]}"
    return dict(base)


def compare_with_baseline(
    arm: Any,
    tree: Path,
    profile: str,
    quick: bool,
    out: Path,
    scorer_build: str | None,
    rerun_patched: Callable[[], Any],
    scenarios: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Flag off, the patched tree against the unpatched one (see :func:`checks.compare_flag_off`);
    where selections differ, the unpatched tree runs a second time as the control, and where that
    leaves a difference unexplained, the patched arm runs a second time too (``rerun_patched``).
    ``scorer_build`` is how this run built the profile's scorer (:func:`_tilelang_for`)."""
    from .checks import compare_flag_off

    def record(a: Any) -> dict[str, Any]:
        return {
            "selections": a.selections,
            "pool_digest": a.pool_digest,
            "step_status": a.step_status,
            "scorer_build": scorer_build,
            "logits_digest": getattr(a, "logits_digest", {}),
        }

    base = _run_baseline(tree, profile, quick, out, "", scenarios)
    if isinstance(base, str):
        return {"status": "error", "detail": base}
    patched = record(arm)
    differs = bool(compare_flag_off(patched, base)["differing_steps"])
    control: dict[str, Any] | None = None
    errors = []
    if differs:
        again = _run_baseline(tree, profile, quick, out, "-control", scenarios)
        if isinstance(again, str):
            errors.append(f"the unpatched control run failed: {again}")
        else:
            control = again
    patched_control: dict[str, Any] | None = None
    if differs and compare_flag_off(patched, base, control)["status"] != "pass":
        try:
            patched_control = record(rerun_patched())
        except Exception as exc:  # noqa: BLE001 -- recorded: the verdict then stands without it
            errors.append(f"the patched rerun failed: {U.short_error(exc)}")
    res = compare_flag_off(patched, base, control, patched_control)
    if errors:
        res["control_error"] = "; ".join(errors)
        res["detail"] += "; " + "; ".join(errors)
    return res


def summary_markdown(
    results: list[dict[str, Any]], arms_meta: list[dict[str, Any]], baseline: dict[str, Any]
) -> str:
    lines = ["# Forward tier: upstream's C4 indexer forward, as the server runs it", ""]
    for meta in arms_meta:
        lines.append(
            f"- **{meta['profile']} / {meta['arm']}**: {meta['steps']} steps, {meta['failed']} failed, "
            f"{meta['errors']} errors; scorer {meta['scorers']}, top-k {meta['topks']}"
        )
    lines += [
        "",
        (
            "| profile | arm | scenario | run | steps | pass | same-input agreement (min) | exact recall (mean) | "
            "scorer | top-k | peak MiB (max) | logits MiB (max) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["profile"], r["arm"], r["scenario"], r["run"]), []).append(r)
    for (prof, arm, scen, run), rows in groups.items():
        sel = [s for r in rows for s in r["selection"]]
        same = min((s["numbers"]["min_recall_same_input"] for s in sel), default=float("nan"))
        exact = sum(s["recall_exact"] for s in sel) / len(sel) if sel else float("nan")
        peak = max((r["peak_mb"] or 0 for r in rows), default=0)
        logits = max((r["logits_mb"] or 0 for r in rows), default=0)
        scorer = sorted({x for r in rows for x in r["scorer"]})
        topk = sorted({x for r in rows for x in r["topk"]})
        passed = sum(r["status"] == "pass" for r in rows)
        lines.append(
            f"| {prof} | {arm} | {scen} | {run} | {len(rows)} | {passed} | {same:.4f} | {exact:.4f} | "
            f"{', '.join(scorer)} | {', '.join(topk)} | {peak:.1f} | {logits:.1f} |"
        )
    bounded = [
        r
        for r in results
        if r["scenario"].startswith("bounded")
        and r.get("logits_phase_peak_mb") is not None
        and r.get("indexer_plan", {}).get("budget_bytes") is not None
    ]
    if bounded:
        lines += [
            "",
            "## Logits under a memory budget (bounded scenarios)",
            "",
            (
                "| profile | arm | step | path | budget MiB | in one piece MiB | chunks | largest chunk MiB | "
                "logits phase peak MiB | DeepGEMM schedules | status |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in bounded:
            plan = r["indexer_plan"]
            lines.append(
                f"| {r['profile']} | {r['arm']} | {r['label']} | {'non-paged' if plan.get('nonpaged') else 'paged'} | "
                f"{plan['budget_bytes'] / 2**20:.1f} | {plan['unchunked_logits_bytes'] / 2**20:.1f} | "
                f"{r['scorer_calls']} | {r['logits_chunk_max_mb']} | {r['logits_phase_peak_mb']} | "
                f"{plan.get('deep_gemm_metadata')} | {r['status']} |"
            )
    bad = [r for r in results if r["status"] != "pass"]
    lines += ["", "## Flag off vs the unpatched tree", ""]
    for prof, b in baseline.items():
        lines.append(f"- {prof}: {b['status']}: {b['detail']}")
    if not baseline:
        lines.append("- not run (no --baseline-tree)")
    lines += ["", "## Failures and errors", ""]
    lines += [
        f"- {r['profile']} {r['arm']} {r['scenario']} {r['run']} {r['label']}: {r['status']}: {r['detail'][:600]}"
        for r in bad
    ] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_baseline is not None:
        return _baseline_worker(P.resolve(args.platform[0]), args.quick, args.worker_baseline, args.scenarios)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    _, probe_errors = run_probe(out)
    if args.probe_only:
        return 2 if probe_errors else 0
    if not torch.cuda.is_available():
        print(
            "forward tier: the scenarios run upstream's JIT kernels and need a CUDA GPU; the dispatch probe "
            f"above ran and is in {out}/dispatch.md. The H200 run is in verify/results/h200/forward/."
        )
        return 2 if probe_errors else 3
    from verify.core.stand_ins import install_deep_gemm_stand_in

    from .tier import arm_specs, run_arm

    stand_in = install_deep_gemm_stand_in()
    profiles = list(dict.fromkeys(P.resolve(p) for p in args.platform))
    sizes = _sizes(args.quick, args.scenarios)
    results: list[dict[str, Any]] = []
    arms_meta: list[dict[str, Any]] = []
    baseline: dict[str, Any] = {}
    per_arm: dict[str, list[str]] = {}
    for entry in args.arm_scenarios:
        arm_name, sep, names = entry.partition("=")
        if not sep or not names:
            raise SystemExit(f"--arm-scenarios {entry!r}: expected ARM=NAME[,NAME...]")
        per_arm[arm_name] = names.split(",")
        _sizes(args.quick, per_arm[arm_name])  # refuses unknown names
    for profile in profiles:
        tilelang_note = _tilelang_for(profile)
        specs = arm_specs(
            tuple(args.formats), tuple(args.compressors), mtp=not args.no_mtp, drafts=tuple(args.mtp_drafts)
        )
        if args.arms:
            every = arm_specs(drafts=(2, 3, 4))
            known = {sp.name for sp in every}
            unknown = {a.split(":", 1)[-1] for a in args.arms} - known
            if unknown:
                raise SystemExit(f"unknown arm(s) {sorted(unknown)}; known: {sorted(known)}")
            specs = [sp for sp in every if sp.name in args.arms or f"{profile}:{sp.name}" in args.arms]
        for spec in specs:
            scenarios = per_arm.get(f"{profile}:{spec.name}", per_arm.get(spec.name, args.scenarios))
            arm_sizes = _sizes(args.quick, scenarios)
            with P.applied(profile) as applied:
                print(
                    f"=== {profile} {spec.name}"
                    + (f" (scenarios {', '.join(scenarios)})" if scenarios else ""),
                    flush=True,
                )
                arm = run_arm(applied, spec, arm_sizes)
            rows = [asdict(r) for r in arm.results]
            results += rows
            arms_meta.append(
                {
                    "profile": profile,
                    "arm": spec.name,
                    "steps": len(rows),
                    "scenarios": scenarios or "all",
                    "failed": sum(r["status"] == "fail" for r in rows),
                    "errors": sum(r["status"] == "error" for r in rows),
                    "scorers": sorted({x for r in rows for x in r["scorer"]}),
                    "topks": sorted({x for r in rows for x in r["topk"]}),
                    "replaced": arm.rig.replaced
                    + ([stand_in] if stand_in else [])
                    + ([tilelang_note] if tilelang_note else [])
                    + applied.replaced,
                    "hook_env": applied.hook_env,
                }
            )
            for r in rows:
                if r["status"] != "pass":
                    print(
                        f"  {r['status'].upper()} {r['scenario']} {r['run']} {r['label']}: {r['detail'][:300]}",
                        flush=True,
                    )
            if (
                args.baseline_tree is not None
                and spec.fmt == "fp8"
                and spec.compressor == "fused"
                and not spec.draft_tokens
            ):

                def rerun_patched(
                    spec: Any = spec, profile: str = profile, arm_sizes: Any = arm_sizes
                ) -> Any:
                    with P.applied(profile) as again:
                        return run_arm(again, spec, arm_sizes)

                baseline[profile] = compare_with_baseline(
                    arm, args.baseline_tree, profile, args.quick, out, tilelang_note, rerun_patched, scenarios
                )
                print(
                    f"  flag off vs unpatched tree: {baseline[profile]['status']}: {baseline[profile]['detail']}",
                    flush=True,
                )
            # written after every arm: a run cut off at its time limit keeps what it measured
            _write(out, arms_meta, results, baseline, sizes)
    _write(out, arms_meta, results, baseline, sizes)
    failed = any(r["status"] == "fail" for r in results) or any(
        b["status"] == "fail" for b in baseline.values()
    )
    errored = (
        any(r["status"] == "error" for r in results)
        or any(b["status"] in ("error", "incomplete") for b in baseline.values())
        or bool(probe_errors)
    )
    print((out / "summary.md").read_text())
    return 1 if failed else 2 if errored else 0


def _write(
    out: Path,
    arms_meta: list[dict[str, Any]],
    results: list[dict[str, Any]],
    baseline: dict[str, Any],
    sizes: Any,
) -> None:
    (out / "results.json").write_text(
        json.dumps(
            {
                "arms": arms_meta,
                "steps": results,
                "baseline": baseline,
                "sizes": asdict(sizes),
                "versions": _versions(),
            },
            indent=1,
            default=str,
        )
    )
    (out / "summary.md").write_text(summary_markdown(results, arms_meta, baseline))


def _tilelang_for(profile: str) -> str | None:
    """On a non-sm_120 GPU, make upstream's TileLang scorer take sm_120's lowering (mma.sync +
    ldmatrix instead of wgmma: TileLang 0.1.12 emits byte-identical CUDA for the two, see
    verify.recall.sm120) -- the closest this machine gets to the kernel sm_120 runs."""
    if profile != "sm120" or P.local_profile() == "sm120" or not U.module_available("tilelang"):
        return None
    return P.force_mma_sync_lowering()


def _versions() -> dict[str, Any]:
    import platform as _platform

    info: dict[str, Any] = {
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    info["sglang"] = str(U.sglang_root())
    # which series the tree carries, so a result names the code it ran
    info[SERIES_HASH], info["tree_head"] = series_hash(), applied_state().get("head")
    return info
