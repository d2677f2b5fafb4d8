"""The diagnosis on the CPU backend: emulation agrees with itself, injected faults are named."""

import torch

from verify.recall import diagnose
from verify.recall.backend import EmulationBackend


def _checks(faults=()):
    be = EmulationBackend(device=torch.device("cpu"), faults=faults)
    d = diagnose.run(be, quick=True)
    return d, {c.name: c for c in d.checks}


def test_emulation_passes_and_says_so():
    d, checks = _checks()
    assert d.emulated
    for name in (
        "fp8 index-K store",
        "bf16 index-K store",
        "fp8 q quantization",
        "fp8 scorer",
        "bf16 scorer",
        "top-k selection",
    ):
        assert checks[name].status == "pass", (name, checks[name].detail)
    assert checks["fp8 scorer"].numbers["calc_diff"] < diagnose.SCORER_BOUND
    assert d.verdict.startswith("CPU emulation only") and "fp8 path correct" in d.verdict


def test_torch_fallback_semantics_within_deepgemm_bound():
    be = EmulationBackend(device=torch.device("cpu"), fp8_scorer="fp8-torch")
    case = diagnose.score_case(be.device, 2048)
    chk = diagnose.check_scorer("fp8", "fp8-torch", diagnose.backend_score_fn(be, "fp8"), case, True)
    assert chk.status == "pass" and 0 < chk.numbers["calc_diff"] < diagnose.SCORER_BOUND


def test_slot_shift_named_in_verdict():
    d, checks = _checks(("fp8-slot-shift",))
    assert checks["fp8 index-K store"].status == "fail"
    assert d.verdict.startswith("fp8 path disagrees with its own oracle") and "fp8-slot-shift" in d.verdict
    d2, checks2 = _checks(("bf16-slot-shift",))
    assert checks2["bf16 index-K store"].status == "fail"  # reported; not an fp8 verdict
    assert "fp8 path correct" in d2.verdict
