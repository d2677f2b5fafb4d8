"""Metric definitions on hand-built rows (tie-aware vs strict recall, score mass, needles, gate)."""

import math

import pytest
import torch

from verify.core.metrics import aggregate, row_metrics, summarize
from verify.recall.gate import evaluate


def _m(scores, sel, topk, seq_len=None, needle=None):
    s = torch.tensor([scores], dtype=torch.float32)
    n = len(scores) if seq_len is None else seq_len
    out = row_metrics(
        s,
        torch.tensor([n]),
        topk,
        torch.tensor([sel + [-1] * (topk - len(sel))]),
        None if needle is None else torch.tensor([needle]),
    )
    return {k: float(v[0]) for k, v in out.items()}


def test_exact_selection_is_perfect():
    m = _m([5.0, 4.0, 3.0, 2.0], [1, 0], 2)
    assert m["recall_tie"] == m["recall_strict"] == m["mass"] == 1.0
    assert m["changed"] == 0


def test_ties_count_for_tie_aware_recall_only():
    # k=2: the 2nd best score 4 is tied three ways, so T* = {0,1,2,3}; strict top-2 keeps one of them.
    scores = [5.0, 4.0, 4.0, 4.0, 1.0]
    tie = _m(scores, [0, 3], 2)
    assert tie["recall_tie"] == 1.0
    assert tie["recall_strict"] <= tie["recall_tie"]
    # every legitimate tie-break is a perfect tie-aware selection
    for j in (1, 2, 3):
        assert _m(scores, [0, j], 2)["recall_tie"] == 1.0
    miss = _m(scores, [0, 4], 2)
    assert miss["recall_tie"] == 0.5 and miss["recall_strict"] == 0.5


def test_score_mass_catches_what_tie_recall_forgives():
    # Both tied keys but not the top one: tie-aware 1.0, mass (4+4)/(5+4).
    m = _m([5.0, 4.0, 4.0, 1.0], [1, 2], 2)
    assert m["recall_tie"] == 1.0
    assert m["mass"] == pytest.approx(8.0 / 9.0)


def test_score_mass_relus_negative_scores():
    m = _m([3.0, -1.0, -2.0, 1.0], [0, 1], 2)
    assert m["mass"] == pytest.approx(3.0 / 4.0)


def test_positions_past_seq_len_are_invisible():
    # the huge score at position 4 is past seq_len=4: not in the oracle, a miss if selected
    m = _m([3.0, 2.0, 1.0, 0.5, 100.0], [4, 0], 2, seq_len=4)
    assert m["recall_tie"] == 0.5
    short = _m([1.0, 2.0, 3.0], [0, 1, 2], 8)  # n <= k: k = n
    assert short["k"] == 3 and short["recall_tie"] == 1.0


def test_duplicate_selection_does_not_double_count():
    assert _m([5.0, 4.0, 3.0], [0, 0], 2)["recall_tie"] == 0.5


def test_needle_fields():
    # needle at 1 (score 6), k=2: best non-selected 5, row scale = best other = 10
    scores = [10.0, 6.0, 5.0, 4.0, 3.0]
    hit = _m(scores, [0, 1], 2, needle=1)
    assert hit["needle_hit"] == 1.0 and hit["oracle_needle_selected"] == 1.0
    assert hit["oracle_margin_nonselected"] == pytest.approx(0.1)
    assert hit["oracle_margin_best_other"] == pytest.approx(-0.4)
    assert hit["gated"] == 1.0
    miss = _m(scores, [0, 2], 2, needle=1)
    assert miss["needle_hit"] == 0.0 and miss["gated"] == 1.0
    thin = _m([10.0, 5.05, 5.0, 1.0], [0, 1], 2, needle=1)  # margin 0.005 of the scale: not gated
    assert thin["gated"] == 0.0
    none = _m(scores, [0, 1], 2, needle=-1)
    assert math.isnan(none["needle_hit"]) and none["gated"] == 0.0


def test_summarize_and_aggregate():
    s = summarize([1.0, 0.5, float("nan"), 0.75])
    assert s["n"] == 3 and s["min"] == 0.5 and s["mean"] == pytest.approx(0.75)
    assert 0.5 <= s["p1"] < 0.52
    recs = [
        {
            "arm": "a",
            "topk": 1,
            "recall_tie": 1.0,
            "recall_strict": 1.0,
            "mass": 1.0,
            "needle_pos": 3,
            "needle_hit": 1.0,
            "gated": 1.0,
        },
        {
            "arm": "a",
            "topk": 1,
            "recall_tie": 0.5,
            "recall_strict": 0.5,
            "mass": 0.9,
            "needle_pos": 3,
            "needle_hit": 0.0,
            "gated": 0.0,
        },
    ]
    (agg,) = aggregate(recs, ["topk"])
    assert agg["rows"] == 2 and agg["loss"] == pytest.approx(0.25)
    assert (agg["needles"], agg["needle_hits"], agg["gated_needles"], agg["gated_hits"]) == (2, 1, 1, 1)


def _rec(arm, recall, depth=0.5, length=4509, gated=0.0, hit=1.0):
    return {
        "arm": arm,
        "topk": 512,
        "length_tokens": length,
        "depth": depth,
        "recall_tie": recall,
        "recall_strict": recall,
        "mass": 1.0,
        "needle_pos": 10,
        "needle_hit": hit,
        "gated": gated,
        "row": 0,
    }


def test_gate_conditions():
    ok = [_rec("bf16", 0.999), _rec("fp8", 0.99)]
    assert evaluate(ok).passed
    ratio = evaluate([_rec("bf16", 0.995), _rec("fp8", 0.99)])  # loss 0.005 > 0.25 * 0.01
    assert not ratio.passed and [c.name for c in ratio.conditions if not c.passed] == ["loss_ratio"]
    cell = evaluate(
        [_rec("bf16", 1.0, 0.0), _rec("fp8", 0.98, 0.0), _rec("bf16", 0.97, 1.0), _rec("fp8", 0.98, 1.0)]
    )
    assert "cells" in [c.name for c in cell.conditions if not c.passed]
    needle = evaluate([_rec("bf16", 1.0, gated=1.0, hit=0.0), _rec("fp8", 0.9)])
    assert [c.name for c in needle.conditions if not c.passed] == ["needle"]
    assert not evaluate([_rec("fp8", 1.0)]).passed  # no bf16 arm: cannot pass
