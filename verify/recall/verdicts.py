"""One verdict line per component of the C4 indexer path on a platform profile.

The evidence is what this machine ran: the diagnosis's kernel-level checks (with the profile's
scorer and top-k), the forward tier's steps under the profile (upstream's real forward, flag off =
the fp8 path, flag on = the series), the dispatch probe (what upstream picks there) and, for
sm_120 on another GPU, what differs in the sources (:mod:`verify.recall.sm120`). A component with
no evidence is ``not run``, never a pass; for a profile that is not this machine's GPU, what only
that hardware can settle is said, with the command its owner runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verify.core import platform as P


@dataclass
class Line:
    component: str
    status: str  # pass | fail | incomplete | not run | emulated (CPU: no kernel ran) | unsettled
    evidence: str


def _checks(diag: Any, *names: str) -> list[Any]:
    return [c for c in diag.checks if c.name in names]


def _status(checks: Sequence[Any], forward_ok: bool | None = None) -> str:
    states = [c.status for c in checks]
    if "fail" in states or forward_ok is False:
        return "fail"
    if not states and forward_ok is None:
        return "not run"
    if "error" in states:
        return "not run"
    if all(s == "skipped" for s in states) and forward_ok is None:
        return "not run"
    return "pass"


def _forward_steps(forward: Mapping[str, Any] | None, profile: str, fmt: str) -> list[Mapping[str, Any]]:
    if not forward:
        return []
    return [s for s in forward.get("steps", []) if s["profile"] == profile and s["arm"].startswith(fmt + "/")]


def _forward_summary(steps: Sequence[Mapping[str, Any]], what: str) -> tuple[bool | None, str]:
    if not steps:
        return None, "forward tier: not run for this profile"
    bad = [s for s in steps if s["status"] != "pass"]
    if what == "keys":
        n = sum(len(s["keys"]) for s in steps)
        bad_keys = [s for s in steps if any(not k["ok"] for k in s["keys"])]
        return (
            (not bad_keys),
            f"forward tier: pool keys = one-shot fp32 reference in {n - sum(len(s['keys']) for s in bad_keys)}/{n} checks",
        )
    if what == "graph":
        graph = [s for s in steps if s["run"] == "graph"]
        if not graph:
            return None, "forward tier: no graph steps"
        gbad = [s for s in graph if s["status"] != "pass"]
        return (
            not gbad
        ), f"forward tier: {len(graph) - len(gbad)}/{len(graph)} graph replays = eager and the oracles"
    return (
        not bad
    ), f"forward tier: {len(steps) - len(bad)}/{len(steps)} steps pass (keys, selection, calls)"


def component_verdicts(
    profile: str, diag: Any, paths: Mapping[str, str], forward: Mapping[str, Any] | None, *, local: str | None
) -> list[Line]:
    """``local``: the profile of the GPU the checks ran on (``P.local_profile()`` where they ran
    here; None: no GPU)."""
    lines = _component_verdicts(profile, diag, paths, forward, local)
    if getattr(diag, "emulated", False):
        # an emulation agrees with itself: it can fail (a harness bug) but never clear a kernel
        for line in lines:
            if line.status == "pass":
                line.status = "emulated"
    return lines


def _component_verdicts(
    profile: str, diag: Any, paths: Mapping[str, str], forward: Mapping[str, Any] | None, local: str | None
) -> list[Line]:
    lines: list[Line] = []
    fp8 = _forward_steps(forward, profile, "fp8")
    bf16 = _forward_steps(forward, profile, "bf16")
    emulated = bool(getattr(diag, "emulated", False))
    tag = " (CPU emulation: agrees with itself by construction)" if emulated else ""

    store = _checks(diag, "fp8 index-K store", "fp8 fused norm+rope+hadamard store")
    ok, ev = _forward_summary(fp8, "keys")
    lines.append(
        Line(
            "fp8 index-K store (fused_norm_rope_v2 / fused_store_cache)",
            _status(store, ok),
            "; ".join([f"{c.status}: {c.detail}" for c in store] + [ev]) + tag,
        )
    )
    q = _checks(diag, "fp8 q quantization")
    lines.append(
        Line(
            "q quantisation (fused_q_indexer_rope_hadamard_quant)",
            _status(q),
            "; ".join(f"{c.status}: {c.detail}" for c in q) + tag,
        )
    )
    scorer = _checks(diag, "fp8 scorer", "fp8 scorer then top-k (hazards)")
    lines.append(
        Line(
            f"fp8 scorer ({paths.get('score_fp8', '?')})",
            _status(scorer),
            "; ".join(f"{c.status}: {c.detail}" for c in scorer) + tag,
        )
    )
    topk = _checks(diag, "top-k selection", "top-k over poisoned tails")
    lines.append(
        Line(
            f"top-k ({paths.get('select', '?')})",
            _status(topk),
            "; ".join(f"{c.status}: {c.detail}" for c in topk) + tag,
        )
    )
    graph = _checks(diag, "fp8 scorer + top-k under CUDA-graph replay")
    gok, gev = _forward_summary(fp8, "graph")
    lines.append(
        Line(
            "CUDA-graph capture / replay (fp8)",
            _status(graph, gok),
            "; ".join([f"{c.status}: {c.detail}" for c in graph] + [gev]),
        )
    )
    fok, fev = _forward_summary(fp8, "all")
    base = (forward or {}).get("baseline", {}).get(profile)
    fstatus = "not run" if fok is None else "pass" if fok else "fail"
    if base:
        from verify.core.forward_runs import flag_off_status

        bstatus, bdetail = flag_off_status(base)
        fev += f"; flag off vs unpatched tree: {bstatus}: {bdetail}"
        if bstatus == "fail":
            fstatus = "fail"
        elif bstatus != "pass" and fstatus == "pass":
            # the forward's own oracles passed, but whether the series leaves the flag-off path
            # as upstream has it is not settled
            fstatus = "incomplete"
    lines.append(
        Line(
            "fp8 forward (compressor -> store -> q -> scorer -> top-k, upstream's forward_c4_indexer)",
            fstatus,
            fev,
        )
    )
    pd = [s for s in (forward or {}).get("steps", []) if s["profile"] == profile and s["scenario"] == "pd"]
    lines.append(
        Line(
            "PD transfer of indexer pages (get_contiguous_buf_infos)",
            "not run" if not pd else "pass" if all(s["status"] == "pass" for s in pd) else "fail",
            "; ".join(f"{s['arm']}: {s['detail']}" for s in pd) or "forward tier: no pd scenario",
        )
    )
    bok, bev = _forward_summary(bf16, "all")
    bchecks = _checks(diag, "bf16 index-K store", "bf16 scorer", "bf16 scorer then top-k (hazards)")
    lines.append(
        Line(
            "bf16 path (the series)",
            _status(bchecks, bok),
            "; ".join([f"{c.status}: {c.detail}" for c in bchecks] + [bev]),
        )
    )
    others = _checks(diag, "other fp8 scorer", "other fp8 scorer then top-k (hazards)")
    if others:
        ran = [c for c in others if c.status != "skipped"]
        lines.append(
            Line(
                "other fp8 scorers upstream has (not this platform's; reported)",
                "fail" if any(c.status == "fail" for c in ran) else "pass" if ran else "not run",
                "; ".join(f"{c.status}: {c.kernel}: {c.detail}" for c in others),
            )
        )
    if profile != local:
        lines.append(
            Line(f"{profile} hardware itself", "unsettled", unsettled(profile, paths.get("score_fp8", "")))
        )
    return lines


def unsettled(profile: str, fp8_scorer: str = "") -> str:
    """What only ``profile``'s own hardware can settle; ``fp8_scorer`` (what scored fp8 in these
    checks) says whether DeepGEMM itself or a Triton twin stood in for DeepGEMM's kernel."""
    stood_in = (
        "DeepGEMM's sm_90 build ran here in its place"
        if fp8_scorer.startswith("deep_gemm.")
        else "a Triton twin stood in here"
    )
    cmd = (
        "python -m verify.forward --platform auto --out OUT/forward && "
        "python -m verify.recall.diagnose --backend gpu --platform auto --forward OUT/forward --out OUT/diagnose"
    )
    what = {
        "sm120": (
            "the sm_120f binaries nvcc builds for the fused store, the c4 compressor, the q quantiser and top-k v1 "
            "(same source as sm_90's, checked here; their SASS was never executed), TileLang's sm_120 cubin "
            "(its CUDA source is byte-identical to the sm_90 mma.sync variant that ran here), FlashMLA's sm120 "
            "kernel after the top-k, SGLANG_OPT_SM120_DIRECT_SWA_KV, and the deployment's PD transport"
        ),
        "sm100": f"DeepGEMM's sm_100 fp8_paged_mqa_logits ({stood_in}) and top-k v2's Blackwell branch",
        "hip": "aiter's fp8 paged MQA logits, the HIP top-k and fnuz fp8 (nothing of the HIP path ran here)",
        "sm90": f"DeepGEMM's sm_90 fp8_paged_mqa_logits ({stood_in})",
    }[profile]
    return f"only {P.HARDWARE[profile]} can settle: {what}. On such a machine with the patched tree: {cmd}"


def render(profile: str, lines: Sequence[Line], diag: Any) -> str:
    out = [f"# fp8 C4 path on {profile} ({P.HARDWARE[profile]}): one verdict per component", ""]
    out.append(f"Summary: {diag.verdict}")
    out.append("")
    for line in lines:
        out.append(f"- **{line.status}** {line.component}: {line.evidence}")
    return "\n".join(out) + "\n"
