"""The diagnosis's read-side hazards and its verdict per component, on CPU: the checks pass the
exact emulation of the production semantics and fail the faults they exist for (a top-k that does
not mask by length, a scorer whose columns past the length bleed into the valid ones)."""

import pytest
import torch

from verify.core import platform as P
from verify.core.scoring import torch_select
from verify.recall import diagnose
from verify.recall import hazards as H
from verify.recall.backend import EmulationBackend
from verify.recall.verdicts import component_verdicts

CPU = torch.device("cpu")


def test_topk_over_poisoned_tails_passes_a_length_masking_topk():
    res = H.check_topk_poisoned_tails(lambda lg, seq, pt, k: torch_select(lg, seq, k), CPU)
    assert res["ok"], res["detail"]


def test_topk_that_reads_past_the_length_is_caught():
    def unmasked(lg, seq, pt, k):  # ranks the whole width: stale scores past the length win
        return lg.nan_to_num(nan=-1e30).topk(k, dim=1).indices

    res = H.check_topk_poisoned_tails(unmasked, CPU)
    assert not res["ok"] and res["selected_past_len"] > 0


def _scorer_case(backend, score=None, select=None):
    return H.check_scorer_then_topk(
        "fp8",
        store=lambda pool, slots, keys: backend.store("fp8", pool, slots, keys),
        new_pool=lambda n: backend.new_pool("fp8", n),
        score=score
        or (
            lambda pool, q8, w, seq, pt: backend.score("fp8", pool, q8, w, torch.arange(q8.shape[0]), seq, pt)
        ),
        select=select or backend.select,
        quantize_q=lambda q, w: diagnose.F.quantize_q(q, w, 1.0),
        device=CPU,
    )


def test_scorer_then_topk_passes_the_emulation():
    res = _scorer_case(EmulationBackend(device=CPU))
    assert res["ok"], res["detail"]


def test_a_scorer_that_shifts_a_row_by_one_key_is_caught():
    backend = EmulationBackend(device=CPU)

    def off_by_one(pool, q8, w, seq, pt):
        lg = backend.score("fp8", pool, q8, w, torch.arange(q8.shape[0]), seq, pt)
        return torch.roll(lg, 1, dims=1)  # a page-offset style fault

    res = _scorer_case(backend, off_by_one)
    assert not res["ok"] and (not res["finite_on_valid"] or res["calc_diff"] > 5e-6)


def test_verdict_per_component_on_cpu_is_emulated_never_pass():
    backend = EmulationBackend(device=CPU)
    diag = diagnose.run(backend)
    lines = component_verdicts("sm120", diag, backend.paths, None, local=P.local_profile())
    status = {line.component.split(" (")[0]: line.status for line in lines}
    assert "pass" not in status.values()
    assert status["fp8 index-K store"] == "emulated"
    assert status["CUDA-graph capture / replay"] == "not run"
    assert (
        lines[-1].status == "unsettled" and "python -m verify.forward --platform auto" in lines[-1].evidence
    )


def test_verdict_takes_the_forward_tier():
    backend = EmulationBackend(device=CPU)
    diag = diagnose.run(backend)
    step = {
        "profile": "sm90",
        "arm": "fp8/fused",
        "status": "fail",
        "run": "eager",
        "scenario": "chunked",
        "keys": [{"ok": False}],
        "detail": "x",
    }
    lines = component_verdicts(
        "sm90", diag, backend.paths, {"steps": [step], "baseline": {}}, local=P.local_profile()
    )
    by = {line.component.split(" (")[0]: line for line in lines}
    assert by["fp8 index-K store"].status == "fail" and by["fp8 forward"].status == "fail"


def test_near_ties_a_precise_scorer_flips_are_precision_not_a_fault():
    """A scorer within DeepGEMM's bound whose error flips near-ties the fp64 oracle orders
    strictly (upstream's torch fallback rounds per-head dots to bf16) passes; the strict number
    shows the flips happened."""
    backend = EmulationBackend(device=CPU)
    g = torch.Generator().manual_seed(5)

    def noisy(pool, q8, w, seq, pt):
        lg = backend.score("fp8", pool, q8, w, torch.arange(q8.shape[0]), seq, pt)
        scale = lg.nan_to_num(0, posinf=0, neginf=0).abs().amax(1, keepdim=True)
        return lg + torch.randn(lg.shape, generator=g) * scale * 3e-4

    res = _scorer_case(backend, noisy)
    assert res["calc_diff"] < 5e-6 and res["recall_tie_strict_oracle_min"] < 1.0, res["detail"]
    assert res["ok"], res["detail"]


def test_a_topk_that_drops_a_top_key_is_caught_and_blamed():
    backend = EmulationBackend(device=CPU)

    def drops_best(lg, seq, pt, k):
        sel = backend.select(lg, seq, pt, k).clone()
        valid = lg.nan_to_num(float("-inf")).masked_fill(
            torch.arange(lg.shape[1]) >= seq.unsqueeze(1), float("-inf")
        )
        worst = valid.masked_fill(torch.isinf(valid), float("inf")).argmin(1)
        best = valid.argmax(1)
        long_rows = seq > 2 * k
        sel[long_rows] = torch.where(
            sel[long_rows] == best[long_rows].unsqueeze(1),
            worst[long_rows].unsqueeze(1).to(sel.dtype),
            sel[long_rows],
        )
        return sel

    res = _scorer_case(backend, select=drops_best)
    assert (
        not res["ok"] and res["topk_recall_on_its_logits_min"] < 1.0 and "FAULT in the top-k" in res["detail"]
    )


def test_scorer_determinism_reads_only_the_columns_the_topk_reads():
    """Garbage past the last written page differs run to run (an unwritten ``new_empty``): not
    a fault. A valid column that differs between reruns is."""
    backend = EmulationBackend(device=CPU)
    case = diagnose.score_case(CPU, 256)
    base = diagnose.backend_score_fn(backend, "fp8")
    calls = {"n": 0}

    def garbage_past(pool, q8, w, seq, pt):
        lg = base(pool, q8, w, seq, pt).clone()
        calls["n"] += 1
        past = torch.arange(lg.shape[1]) >= seq.unsqueeze(1)
        return torch.where(past, torch.full_like(lg, float(calls["n"])), lg)

    res = diagnose.check_scorer("fp8", "garbage past", garbage_past, case, True)
    assert (
        res.status == "pass" and res.numbers["deterministic"] and not res.numbers["deterministic_past_len"]
    ), res.detail

    def flaky(pool, q8, w, seq, pt):
        lg = base(pool, q8, w, seq, pt).clone()
        calls["n"] += 1
        lg[0, 0] += calls["n"] * 1e-6
        return lg

    res = diagnose.check_scorer("fp8", "flaky", flaky, case, True)
    assert (
        res.status == "fail" and not res.numbers["deterministic"] and "DIFFER on valid columns" in res.detail
    )


def test_other_scorers_are_reported_as_other_never_as_the_platforms_scorer():
    """Upstream's torch fp8 fallbacks run on CPU against the pinned tree; their checks must land
    in the 'other fp8 scorer' component, not in the platform's own scorer line."""
    backend = EmulationBackend(device=CPU)
    checks = diagnose.other_scorer_checks(backend, diagnose.score_case(CPU, 256))
    torch_fallbacks = [c for c in checks if "fp8_paged_mqa_logits_torch" in c.kernel]
    assert torch_fallbacks and all(c.status in ("pass", "fail") for c in torch_fallbacks), [
        c.detail for c in checks
    ]
    assert {c.name for c in checks} <= {"other fp8 scorer", "other fp8 scorer then top-k (hazards)"}
    assert all(not c.fp8_path for c in checks)


def test_the_h200_torch_fallback_near_tie_is_reproduced_here_and_passes_the_scorer_aware_check():
    """On the H200 upstream's torch fp8 fallbacks keep tie-aware recall below 1 on the hazard case
    against the strict oracle (exact ties only) and 1 with ties within the scorer's own error (an
    earlier harness, which had only the strict number, failed them). The same upstream functions
    on CPU give the same calc_diff and both numbers -- precision of bf16-rounded dots, not the
    GPU -- and pass."""
    import json
    from pathlib import Path

    recorded = json.loads(
        (
            Path(__file__).resolve().parents[2] / "verify/results/h200/diagnose/sm120/diagnosis.json"
        ).read_text()
    )
    gpu = {
        c["kernel"]: c["numbers"]
        for c in recorded["diagnosis"]["checks"]
        if c["name"] == "other fp8 scorer then top-k (hazards)"
        and "fp8_paged_mqa_logits_torch" in c["kernel"]
    }
    assert gpu, "the committed H200 diagnosis lost its torch-fallback hazard checks"
    backend = EmulationBackend(device=CPU)
    here = {
        c.kernel: c
        for c in diagnose.other_scorer_checks(backend, diagnose.score_case(CPU, 256))
        if c.name == "other fp8 scorer then top-k (hazards)"
    }
    for kernel, numbers in gpu.items():
        got = here[kernel]
        assert got.status == "pass", got.detail
        assert abs(got.numbers["calc_diff"] - numbers["calc_diff"]) < 1e-3 * numbers["calc_diff"]
        assert got.numbers["recall_tie_strict_oracle_min"] == numbers["recall_tie_strict_oracle_min"] < 1.0
        assert got.numbers["recall_tie_min"] == numbers["recall_tie_min"] == 1.0


@pytest.mark.parametrize("profile", ["sm90", "sm100", "sm120"])
def test_committed_diagnosis_is_its_measured_checks_folded_with_the_committed_forward_runs(tmp_path, profile):
    # README's diagnosis figures come from diagnose/<profile>/diagnosis.json; that file is the GPU
    # run's measured checks (diagnose-measured/...) folded with the forward runs it names, by code
    import json
    from pathlib import Path

    from verify.recall import diagnose

    root = Path(__file__).resolve().parents[2]
    committed = json.loads((root / f"verify/results/h200/diagnose/{profile}/diagnosis.json").read_text())
    how = committed["refolded"]
    assert how["forward_from"], "folded with no forward run"
    code = diagnose.main(
        [
            "--refold",
            str(root / how["checks_from"]),
            "--forward",
            *[str(root / f) for f in how["forward_from"]],
            "--out",
            str(tmp_path),
        ]
    )
    again = json.loads((tmp_path / "diagnosis.json").read_text())
    assert again["components"] == committed["components"]
    assert code == (1 if any(c["status"] == "fail" for c in committed["components"]) else 0)


def test_unsettled_says_what_stood_in_for_deepgemm():
    from verify.recall.verdicts import unsettled

    twin = unsettled(
        "sm100",
        "verify.core.fp8_twin.fp8_paged_mqa_logits_twin standing in for deep_gemm.fp8_paged_mqa_logits",
    )
    real = unsettled("sm100", "deep_gemm.fp8_paged_mqa_logits")
    assert "a Triton twin stood in here" in twin and "twin" not in real
    assert "DeepGEMM's sm_90 build ran here in its place" in real
    assert "a Triton twin stood in here" in unsettled("sm100")  # nothing known: the weaker claim
