"""The tier-2 gate on the bf16 arm (fp8 and fp4-sim are reported, never gated).

1. needle: every row where the oracle selects the needle with a margin of at least 1% over the best
   key it does not select (see :mod:`verify.core.metrics` for the margin's unit) has the needle
   selected by the bf16 arm;
2. loss ratio: at every (index_topk, length), bf16's mean recall loss ``1 - tie-aware recall`` is at
   most a quarter of fp8's;
3. cells: in every (index_topk, length, depth) cell, bf16's mean tie-aware recall is not below fp8's.

Near-ties make an absolute target like 0.9999 unreachable for any rounding, hence relative gates.

The gate's oracle is the *same-q* one (``recall_tie``): the unrounded keys scored with the
production fp8 q, which every gated arm also uses, so the gate compares key storage alone.
:func:`evaluate_exact_q` runs the same conditions against the *exact-q* oracle (unquantized q,
``recall_tie_unq``), reported beside it and never deciding the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from verify.core.metrics import GATE_MARGIN, aggregate

LOSS_RATIO = 0.25
#: float noise allowed when comparing two means of the same rows (not a precision allowance)
MEAN_EPS = 1e-12


@dataclass
class Condition:
    name: str
    passed: bool
    detail: str
    failures: list[dict[str, Any]] = field(default_factory=list)


SAME_Q = "same-q oracle: unrounded keys, the production fp8 q (dequantized)"
EXACT_Q = "exact-q oracle: unrounded keys, the unquantized fp32 q"


@dataclass
class GateResult:
    passed: bool
    conditions: list[Condition]
    arm: str = "bf16"
    reference: str = "fp8"
    oracle: str = SAME_Q

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _by(
    entries: Sequence[Mapping[str, Any]], arm: str, keys: Sequence[str]
) -> dict[tuple, Mapping[str, Any]]:
    return {tuple(e[k] for k in keys): e for e in entries if e["arm"] == arm}


def evaluate(records: Sequence[Mapping[str, Any]], arm: str = "bf16", reference: str = "fp8") -> GateResult:
    arms = {r["arm"] for r in records}
    if arm not in arms or reference not in arms:
        return GateResult(
            False, [Condition("arms", False, f"need arms {arm!r} and {reference!r}, have {sorted(arms)}")]
        )

    misses = [
        {k: r.get(k) for k in ("length_tokens", "topk", "depth", "residue", "kind", "mode", "margin", "row")}
        | {"oracle_margin": r.get("oracle_margin_nonselected")}
        for r in records
        if r["arm"] == arm and r.get("gated") == 1.0 and r.get("needle_hit") != 1.0
    ]
    n_gated = sum(1 for r in records if r["arm"] == arm and r.get("gated") == 1.0)
    needle = Condition(
        "needle",
        not misses,
        f"{arm} selects {n_gated - len(misses)}/{n_gated} needles the oracle selects with a margin >= {GATE_MARGIN:.0%}",
        misses,
    )

    per_length = aggregate(records, ["topk", "length_tokens"])
    a = _by(per_length, arm, ("topk", "length_tokens"))
    b = _by(per_length, reference, ("topk", "length_tokens"))
    ratio_fail: list[dict[str, Any]] = []
    for key in sorted(a):
        la, lb = float(a[key]["loss"]), float(b[key]["loss"])
        if la > LOSS_RATIO * lb + MEAN_EPS:
            ratio_fail.append(
                {"topk": key[0], "length_tokens": key[1], f"loss_{arm}": la, f"loss_{reference}": lb}
            )
    ratio = Condition(
        "loss_ratio",
        not ratio_fail,
        f"{arm} mean recall loss <= {LOSS_RATIO} x {reference}'s at each of {len(a)} (topk, length) groups",
        ratio_fail,
    )

    cells = aggregate(records, ["topk", "length_tokens", "depth"])
    ca = _by(cells, arm, ("topk", "length_tokens", "depth"))
    cb = _by(cells, reference, ("topk", "length_tokens", "depth"))
    cell_fail: list[dict[str, Any]] = []
    for key in sorted(ca, key=str):
        ma = float(ca[key]["recall_tie"]["mean"])
        mb = float(cb[key]["recall_tie"]["mean"])
        if ma < mb - MEAN_EPS:
            cell_fail.append(
                {"topk": key[0], "length_tokens": key[1], "depth": key[2], arm: ma, reference: mb}
            )
    cell = Condition(
        "cells",
        not cell_fail,
        f"{arm} mean tie-aware recall >= {reference}'s in each of {len(ca)} (topk, length, depth) cells",
        cell_fail,
    )
    conds = [needle, ratio, cell]
    return GateResult(all(c.passed for c in conds), conds, arm, reference)


def evaluate_exact_q(
    records: Sequence[Mapping[str, Any]], arm: str = "bf16", reference: str = "fp8"
) -> GateResult | None:
    """The gate's conditions against the exact-q oracle (needle hits still as the same-q oracle
    placed them); None when the records carry no exact-q recall."""
    if not any(r.get("recall_tie_unq") is not None for r in records):
        return None
    swapped = [
        {**r, "recall_tie": r.get("recall_tie_unq")} for r in records if r.get("recall_tie_unq") is not None
    ]
    result = evaluate(swapped, arm, reference)
    result.oracle = EXACT_Q
    return result
