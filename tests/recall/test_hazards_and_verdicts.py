"""The diagnosis's read-side hazards and its verdict per component, on CPU: the checks pass the
exact emulation of the production semantics and fail the faults they exist for (a top-k that does
not mask by length, a scorer whose columns past the length bleed into the valid ones)."""

import torch

from verify.recall import diagnose
from verify.recall import hazards as H
from verify.recall.backend import EmulationBackend, torch_select
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


def _scorer_case(backend, score=None):
    return H.check_scorer_then_topk(
        "fp8",
        store=lambda pool, slots, keys: backend.store("fp8", pool, slots, keys),
        new_pool=lambda n: backend.new_pool("fp8", n),
        score=score or (lambda pool, q8, w, seq, pt: backend.score("fp8", pool, q8, w, torch.arange(q8.shape[0]), seq, pt)),
        select=backend.select,
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
    lines = component_verdicts("sm120", diag, backend.paths, None)
    status = {line.component.split(" (")[0]: line.status for line in lines}
    assert "pass" not in status.values()
    assert status["fp8 index-K store"] == "emulated"
    assert status["CUDA-graph capture / replay"] == "not run"
    assert lines[-1].status == "unsettled" and "python -m verify.forward --platform auto" in lines[-1].evidence


def test_verdict_takes_the_forward_tier():
    backend = EmulationBackend(device=CPU)
    diag = diagnose.run(backend)
    step = {"profile": "sm90", "arm": "fp8/fused", "status": "fail", "run": "eager", "scenario": "chunked",
            "keys": [{"ok": False}], "detail": "x"}
    lines = component_verdicts("sm90", diag, backend.paths, {"steps": [step], "baseline": {}})
    by = {line.component.split(" (")[0]: line for line in lines}
    assert by["fp8 index-K store"].status == "fail" and by["fp8 forward"].status == "fail"
