"""Per-row recall metrics against an oracle, and their aggregation (mean / p1 / min).

Definitions (per row, ``n`` visible keys, ``k = min(index_topk, n)``, oracle scores ``s*``,
selected set ``S``):

* tie-aware recall ``|S & T*| / k`` with ``T* = {j : s*_j >= s*_(k)}`` (every key tied with or above
  the k-th oracle score), so legitimate tie-breaking is not a loss;
* strict recall ``|S & topk(s*)| / k`` (one arbitrary tie-break of the oracle);
* score-mass recall ``sum_{j in S} relu(s*_j) / sum_{j in topk(s*)} relu(s*_j)``;
* needle hit: the needle's position is in ``S``;
* the oracle's own view of the needle: selected (``s*_needle >= s*_(k)``) and its margin over the
  best key the oracle does not select, ``(s*_needle - s*_(k+1)) / |S|`` (inf when n <= k), where
  ``S = max_{j != needle} s*_j`` is the row's score scale. For a needle at the top of its row this
  is the plain relative margin over the best other key; at the selection boundary, scores sit in
  the bulk of the distribution (s*_(k+1) is typically 1-4% of S and often negative), where a
  margin relative to ``|s*_(k+1)|`` would be degenerate -- rounding that is negligible against
  S moves such a score by more than 1% of itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

#: the gate's needle margin, with a relative tolerance so a needle planted at exactly 1% counts
GATE_MARGIN = 0.01
GATE_MARGIN_TOL = 1e-4


def row_metrics(
    oracle: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    selected: torch.Tensor,
    needle: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Metrics for ``B`` rows. ``oracle [B, L]`` fp32 (any value past ``seq_len``; it is masked),
    ``selected [B, K]`` raw positions (``-1`` padding; out-of-range positions count as misses),
    ``needle [B]`` position or -1."""
    b, width = oracle.shape
    dev = oracle.device
    seq = seq_lens.long().to(dev)
    pos = torch.arange(width, device=dev).unsqueeze(0)
    valid = pos < seq.unsqueeze(1)
    s = oracle.float().masked_fill(~valid, float("-inf"))
    k = seq.clamp(max=topk)  # [B]
    kk = min(topk + 1, width)
    vals, idx = s.topk(kk, dim=1, sorted=True)
    kth = vals.gather(1, (k - 1).clamp(min=0).unsqueeze(1))  # [B,1]
    nxt = torch.where(
        seq > k,
        vals.gather(1, k.clamp(max=kk - 1).unsqueeze(1)).squeeze(1),
        torch.full((b,), float("nan"), device=dev),
    )
    sel = selected.long().to(dev)
    sel_ok = (sel >= 0) & (sel < seq.unsqueeze(1))
    sel_c = sel.clamp(min=0, max=width - 1)
    # de-duplicate defensively: a buggy selection listing one key twice must not score twice
    sel_sorted, _ = torch.where(sel_ok, sel_c, -1 - torch.arange(sel.shape[1], device=dev)).sort(dim=1)
    dup = torch.zeros_like(sel_sorted, dtype=torch.bool)
    dup[:, 1:] = (sel_sorted[:, 1:] == sel_sorted[:, :-1]) & (sel_sorted[:, 1:] >= 0)
    uniq_ok = (sel_sorted >= 0) & ~dup
    sel_u = sel_sorted.clamp(min=0)

    tie_set = s >= kth
    in_tie = tie_set.gather(1, sel_u) & uniq_ok
    rank_ok = torch.arange(kk, device=dev).unsqueeze(0) < k.unsqueeze(1)
    strict_set = torch.zeros_like(valid)
    strict_set.scatter_(1, idx, rank_ok)
    in_strict = strict_set.gather(1, sel_u) & uniq_ok
    relu = torch.relu(s.masked_fill(~valid, 0.0)).double()
    mass_sel = (relu.gather(1, sel_u) * uniq_ok).sum(1)
    mass_top = torch.relu(vals.masked_fill(~rank_ok, 0.0).nan_to_num(neginf=0.0)).double().sum(1)
    kf = k.float().clamp(min=1)
    out = {
        "recall_tie": in_tie.sum(1).float() / kf,
        "recall_strict": in_strict.sum(1).float() / kf,
        "mass": torch.where(
            mass_top > 0, mass_sel / mass_top.clamp(min=1e-300), torch.ones_like(mass_top)
        ).float(),
        "changed": (k - in_strict.sum(1)).float(),
        "k": k.float(),
    }
    if needle is not None:
        nd = needle.long().to(dev)
        has = nd >= 0
        nd_c = nd.clamp(min=0)
        s_needle = s.gather(1, nd_c.unsqueeze(1)).squeeze(1)
        hit = ((sel == nd.unsqueeze(1)) & sel_ok).any(1) & has
        o_sel = has & (s_needle >= kth.squeeze(1))
        s_wo = s.clone()
        s_wo.scatter_(1, nd_c.unsqueeze(1), float("-inf"))
        best_other = s_wo.max(1).values
        scale = best_other.abs().clamp(min=1e-30)
        margin = torch.where(torch.isnan(nxt), torch.full_like(nxt, float("inf")), (s_needle - nxt) / scale)
        out.update(
            {
                "needle_hit": hit.float().masked_fill(~has, float("nan")),
                "oracle_needle_selected": o_sel.float().masked_fill(~has, float("nan")),
                "oracle_margin_nonselected": margin.masked_fill(~has, float("nan")),
                "oracle_margin_best_other": ((s_needle - best_other) / scale).masked_fill(~has, float("nan")),
                "gated": (o_sel & (margin >= GATE_MARGIN * (1 - GATE_MARGIN_TOL))).float(),
            }
        )
    return out


def summarize(values: Iterable[float]) -> dict[str, float]:
    """mean / p1 (1st percentile, linear interpolation as numpy's default) / min / n, ignoring NaN."""
    arr = torch.tensor([v for v in values if v is not None and not math.isnan(v)], dtype=torch.float64)
    if arr.numel() == 0:
        return {"mean": float("nan"), "p1": float("nan"), "min": float("nan"), "n": 0}
    return {
        "mean": float(arr.mean()),
        "p1": float(torch.quantile(arr, 0.01)),
        "min": float(arr.min()),
        "n": int(arr.numel()),
    }


METRICS = ("recall_tie", "recall_strict", "mass")
#: aggregated when the records carry them (synthetic problems do; a capture without q_rot not):
#: the arm against the exact-q and the reference oracles, the reference's own selection against
#: the same-q and exact-q oracles
OPTIONAL_METRICS = ("recall_tie_unq", "recall_tie_ref", "ref_recall_tie", "ref_recall_tie_unq")


def aggregate(
    records: Sequence[Mapping[str, Any]], keys: Sequence[str], arm_field: str = "arm"
) -> list[dict[str, Any]]:
    """Group long-format records (one per row x arm) by ``(arm, *keys)`` and summarize each metric,
    the needle hit rate and the gated needle hits."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec[arm_field], *(rec[k] for k in keys)), []).append(rec)
    out: list[dict[str, Any]] = []
    for gkey in sorted(
        groups, key=lambda t: tuple(str(x) if not isinstance(x, (int, float)) else x for x in t)
    ):
        recs = groups[gkey]
        entry: dict[str, Any] = {arm_field: gkey[0], **dict(zip(keys, gkey[1:])), "rows": len(recs)}
        for m in METRICS:
            entry[m] = summarize(float(r[m]) for r in recs)
        for m in OPTIONAL_METRICS:
            vals = [float(r[m]) for r in recs if r.get(m) is not None]
            if vals:
                entry[m] = summarize(vals)
        entry["loss"] = 1.0 - entry["recall_tie"]["mean"]
        needles = [r for r in recs if r.get("needle_pos", -1) not in (-1, None)]
        entry["needles"] = len(needles)
        entry["needle_hits"] = int(sum(1 for r in needles if r["needle_hit"] == 1.0))
        gated = [r for r in needles if r.get("gated") == 1.0]
        entry["gated_needles"] = len(gated)
        entry["gated_hits"] = int(sum(1 for r in gated if r["needle_hit"] == 1.0))
        out.append(entry)
    return out


#: DeepGEMM's calc_diff bound for a paged-logits kernel: a scorer within it is right
SCORER_BOUND = 5e-6
#: gaps within this fraction of a row's largest |score| count as ties (a top-k may order them either way)
TIE_REL = 2e-5


def tie_aware_recall(
    scores: torch.Tensor, chosen: torch.Tensor, k: int, tie_abs: torch.Tensor
) -> torch.Tensor:
    """Per row: fraction of ``chosen`` (key indices, -1 = none) that are in the top-k of
    ``scores`` allowing ties within ``tie_abs``; rows with <= k keys must choose them all."""
    r, n = scores.shape
    chosen = chosen.to(scores.device)
    kk = min(k, n)
    if kk == 0:
        return torch.ones(r, dtype=torch.float64, device=scores.device)
    kth = scores.topk(kk, dim=1).values[:, -1:]
    acceptable = scores >= kth - tie_abs.unsqueeze(1)
    valid = chosen >= 0
    hit = acceptable.gather(1, chosen.clamp(min=0)) & valid
    count = valid.sum(1).clamp(min=1)
    out = hit.sum(1).double() / count
    # a row that selected fewer keys than it must is wrong whatever it selected
    short = valid.sum(1) < kk
    return torch.where(short, out * valid.sum(1) / kk, out)
