"""What the forward tier asserts after each forward: the keys in the pool and the selected top-k.

Keys: the pool's bytes for a request, decoded in its format, against the one-shot fp32
reference compression of the request's whole sequence rounded once to that format (bf16: within
1 ulp, or the fp32 noise floor of tiny values; fp8: within fp8 rounding of the value at the
stored scale, scale = absmax / 448 to 1e-4). The first wrong key is reported with its page, so a
fault that leaves the first page right and the rest wrong shows as such.

Selection: each row's selected pool slots (``c4_sparse_page_indices``, what the sparse attention
reads), mapped back to key indices through the request's pages, against
- the same-input oracle: fp64 scores over the keys as stored and the q the production kernel
  produced (its fp8 codes times its folded weights). The selection must be the oracle's top-k up
  to ties: gaps within ``TIE_REL`` of the row's largest |score| or, when the logits the top-k read
  are known, within twice the scorer's own largest error on that row (the scorer itself must stay
  within calc_diff 5e-6 of the oracle); any other key is a fault in the scorer, the top-k, the
  page table or the transport;
- the exact oracle: fp64 scores over the fp32 reference keys and the unquantized q. Its
  tie-aware recall is what precision costs; reported, gated only against gross loss;
- the reference oracle: DeepSeek's own indexer numerics over the same keys and q (fp4 q x fp4 k
  in a bf16 container, :func:`verify.forward.reference.reference_indexer`): the selection the
  model was trained with. Its tie-aware recall, and the reference selection's own recall against
  the exact oracle, are reported and never gate -- neither oracle is model quality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from verify.core.metrics import SCORER_BOUND, TIE_REL, tie_aware_recall
from verify.core.store_reference import compare_bf16

from .reference import reference_indexer, reference_selection, scores64

FP8_MAX = 448.0
# Exact-oracle recall below this means keys or queries unrelated to the reference, not precision
# (tier 2 measures precision at ~0.99 for fp8 and ~0.999 for bf16 on structured keys).
GROSS_RECALL = 0.9


@dataclass
class KeyCheck:
    keys: int
    ok: bool
    detail: str
    first_bad_key: int | None = None
    first_bad_page: int | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


def decode_pool_keys(
    pool_buf: torch.Tensor, slots: torch.Tensor, fmt: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stored keys of ``slots`` from the 2-D uint8 indexer buffer: bf16 ``[n,128]`` (and None),
    or fp8 dequantized fp32 ``[n,128]`` and the fp32 scales."""
    slots = slots.long().to(pool_buf.device)
    page, off = slots // 64, slots % 64
    if fmt == "bf16":
        rows = pool_buf.view(pool_buf.shape[0], 64, 256)[page, off]
        return rows.contiguous().view(torch.bfloat16), None
    vals = pool_buf[:, : 64 * 128].reshape(pool_buf.shape[0], 64, 128)[page, off]
    scale = (
        pool_buf[:, 64 * 128 :].reshape(pool_buf.shape[0], 64, 4)[page, off].contiguous().view(torch.float32)
    )
    codes = vals.contiguous().view(torch.float8_e4m3fn).float()
    return codes * scale, scale.squeeze(-1)


def fp8_half_ulp(y: torch.Tensor) -> torch.Tensor:
    """Half the e4m3 spacing at |y| (subnormal spacing 2^-9 below 2^-6)."""
    a = y.abs().clamp(min=2.0**-6)
    return torch.exp2(torch.floor(torch.log2(a)) - 3) / 2


def check_keys(pool_buf: torch.Tensor, slots: torch.Tensor, ref: torch.Tensor, fmt: str) -> KeyCheck:
    n = int(ref.shape[0])
    if n == 0:
        return KeyCheck(0, True, "no complete window yet")
    stored, scale = decode_pool_keys(pool_buf, slots, fmt)
    ref = ref.to(stored.device).float()
    if fmt == "bf16":
        cmp = compare_bf16(stored, ref)
        bad_rows = torch.zeros(n, dtype=torch.bool, device=stored.device)
        if not cmp.ok:
            from verify.core.store_reference import DEFAULT_NOISE_REL, bf16_ulp_distance

            ulp = bf16_ulp_distance(stored, ref.to(torch.bfloat16))
            near = (stored.float() - ref).abs() <= DEFAULT_NOISE_REL * ref.abs().amax(1, keepdim=True)
            bad_rows = ((ulp > 1) & ~near).any(1)
        detail = (
            f"{cmp.exact}/{cmp.elements} values bit-exact vs one RNE rounding of the fp32 reference, "
            f"{cmp.failures} beyond 1 ulp / noise floor (max {cmp.max_ulp} ulp)"
        )
        numbers: dict[str, Any] = cmp.to_json()
    else:
        assert scale is not None
        amax = ref.abs().amax(1)
        exp_scale = amax / FP8_MAX
        scale_ok = (scale - exp_scale).abs() <= 1e-4 * exp_scale.abs() + 1e-30
        bound = fp8_half_ulp(ref / exp_scale.unsqueeze(1)) * exp_scale.unsqueeze(
            1
        ) * 1.01 + 1e-5 * amax.unsqueeze(1)
        within = (stored - ref).abs() <= bound
        bad_rows = ~(within.all(1) & scale_ok)
        detail = (
            f"{int(within.sum())}/{within.numel()} values within fp8 rounding of the fp32 reference, "
            f"{int(scale_ok.sum())}/{n} scales = absmax/448"
        )
        numbers = {"values_within": float(within.float().mean()), "scales_ok": float(scale_ok.float().mean())}
    bad = torch.nonzero(bad_rows).flatten()
    first = int(bad[0]) if bad.numel() else None
    numbers["bad_keys"] = int(bad.numel())
    if first is not None:
        numbers["bad_keys_in_first_page"] = int((bad < 64).sum())
        detail += f"; {bad.numel()} wrong keys, first at key {first} (request page {first // 64})"
    return KeyCheck(n, first is None, detail, first, None if first is None else first // 64, numbers)


@dataclass
class SelectionCheck:
    rows: int
    ok: bool
    detail: str
    recall_same_input: float
    recall_exact: float
    numbers: dict[str, Any] = field(default_factory=dict)
    #: mean tie-aware recall against DeepSeek's reference selection (reported, not gated)
    recall_reference: float | None = None


def check_selection(
    chosen: torch.Tensor,
    row_lens: torch.Tensor,
    q_prod: torch.Tensor,
    w_prod: torch.Tensor,
    stored_keys: torch.Tensor,
    q_exact: torch.Tensor,
    w_exact: torch.Tensor,
    ref_keys: torch.Tensor,
    k: int,
    prod_logits: torch.Tensor | None = None,
) -> SelectionCheck:
    """``chosen`` ``[R, k]`` key indices (-1 none) for rows seeing ``row_lens`` keys of one
    request; q/w ``[R, H, 128]`` / ``[R, H]``; keys ``[K, 128]`` (K >= max row_lens)."""
    rows = int(chosen.shape[0])
    rec_same, rec_exact, rec_ref, ref_exact = [], [], [], []
    indexer = reference_indexer(ref_keys)
    wrong_rows = []
    # With the logits the top-k read (``prod_logits``), a wrong row is attributed: the scorer
    # (its logits differ from the same-input oracle) or the top-k (it did not pick the top of
    # its own input).
    scorer_diff: list[float] = []
    scorer_finite = True
    topk_own: list[float] = []
    gaps: list[float] = []
    for lens in sorted(set(row_lens.tolist())):
        idx = torch.nonzero(row_lens == lens).flatten()
        ch = chosen[idx].long()
        if lens == 0:
            ok = bool((ch < 0).all())
            rec_same.append(torch.full((idx.numel(),), 1.0 if ok else 0.0, dtype=torch.float64))
            rec_exact.append(rec_same[-1])
            if not ok:
                wrong_rows += idx.tolist()
            continue
        beyond = (ch >= lens).any(1)  # a key past the row's length, or a slot of another request
        if bool(beyond.any()):
            wrong_rows += idx[beyond.cpu()].tolist()
        ch_valid = torch.where(ch < lens, ch, torch.full_like(ch, -1))
        s_same = scores64(q_prod[idx], w_prod[idx], stored_keys[:lens])
        tie = s_same.abs().amax(1) * TIE_REL
        # A row of at most k keys takes them all: upstream's top-k does not read its logits, and
        # the non-paged fp8 path hands DeepGEMM an empty range for it (ke = ks), so its logits
        # are -inf by design. The scorer is held to its oracle where the top-k reads it.
        if prod_logits is not None and lens > k:
            from verify.core.scoring import calc_diff

            lg = prod_logits[idx.to(prod_logits.device)][:, :lens].double().to(s_same.device)
            finite = bool(torch.isfinite(lg).all())
            diff = float(calc_diff(lg.nan_to_num(0.0), s_same))
            scorer_finite = scorer_finite and finite
            scorer_diff.append(diff)
            if finite and diff <= SCORER_BOUND:
                # a near-tie is a gap the (correct) scorer's own error on this row can flip
                tie = torch.maximum(tie, 2 * (lg - s_same).abs().amax(1))
            own = tie_aware_recall(
                lg.nan_to_num(float("-inf")), ch_valid, k, lg.abs().nan_to_num(0).amax(1) * 1e-6
            )
            topk_own.append(float(own.min()))
        r_same = tie_aware_recall(s_same, ch_valid, k, tie)
        s_ex = scores64(q_exact[idx], w_exact[idx], ref_keys[:lens])
        r_ex = tie_aware_recall(s_ex, ch_valid, k, s_ex.abs().amax(1) * TIE_REL)
        rec_same.append(r_same.cpu())
        rec_exact.append(r_ex.cpu())
        s_ref, ref_chosen = reference_selection(indexer, q_exact[idx], w_exact[idx], lens, k)
        s_ref = s_ref.double().to(s_ex.device)
        rec_ref.append(tie_aware_recall(s_ref, ch_valid, k, s_ref.abs().amax(1) * TIE_REL).cpu())
        ref_exact.append(
            tie_aware_recall(s_ex, ref_chosen.to(s_ex.device), k, s_ex.abs().amax(1) * TIE_REL).cpu()
        )
        bad = (r_same < 1.0).cpu()
        wrong_rows += idx[bad].tolist()
        if bool(bad.any()):
            kth = s_same.topk(min(k, lens), dim=1).values[:, -1]
            picked = s_same.gather(1, ch_valid.to(s_same.device).clamp(min=0))
            picked = torch.where(
                ch_valid.to(s_same.device) >= 0, picked, torch.full_like(picked, float("inf"))
            )
            gap = (kth - picked.min(1).values) / s_same.abs().amax(1).clamp(min=1e-300)
            gaps += gap[bad.to(gap.device)].tolist()

    same = torch.cat(rec_same) if rec_same else torch.ones(0, dtype=torch.float64)
    exact = torch.cat(rec_exact) if rec_exact else torch.ones(0, dtype=torch.float64)
    r_same_mean = float(same.mean()) if same.numel() else 1.0
    r_exact_mean = float(exact.mean()) if exact.numel() else 1.0
    r_ref_mean = float(torch.cat(rec_ref).mean()) if rec_ref else None
    ref_exact_mean = float(torch.cat(ref_exact).mean()) if ref_exact else None
    wrong = sorted(set(wrong_rows))
    scorer_ok = scorer_finite and max(scorer_diff, default=0.0) <= SCORER_BOUND
    ok = not wrong and r_exact_mean >= GROSS_RECALL and scorer_ok
    detail = (
        f"{rows} rows: selection = same-input fp64 oracle's top-{k} on {rows - len(wrong)}/{rows} rows "
        f"(ties within {TIE_REL:g} of the row max); exact-oracle tie-aware recall {r_exact_mean:.4f}"
    )
    if r_ref_mean is not None and ref_exact_mean is not None:
        detail += (
            f"; vs DeepSeek's reference selection (fp4 q x fp4 k, reported) {r_ref_mean:.4f}, "
            f"which itself keeps {ref_exact_mean:.4f} of the exact oracle's"
        )
    numbers: dict[str, Any] = {
        "wrong_rows": wrong[:50],
        "min_recall_same_input": float(same.min()) if same.numel() else 1.0,
        "min_recall_exact": float(exact.min()) if exact.numel() else 1.0,
        "reference_recall_exact": ref_exact_mean,
    }
    if prod_logits is not None:
        numbers |= {
            "scorer_calc_diff_max": max(scorer_diff, default=0.0),
            "scorer_finite": scorer_finite,
            "topk_recall_on_its_logits_min": min(topk_own, default=1.0),
        }
    if not scorer_ok:
        detail += (
            f"; SCORER off its oracle (calc_diff {max(scorer_diff, default=0.0):.1e}, finite {scorer_finite})"
        )
    if wrong:
        detail += f"; WRONG rows (first {wrong[:5]}): min same-input recall {float(same.min()):.4f}"
        numbers["worst_gap_below_kth_rel"] = max(gaps, default=0.0)
        detail += f", a selected key up to {numbers['worst_gap_below_kth_rel']:.2e} x row max below the k-th"
        if prod_logits is not None:
            blame = []
            if not scorer_ok:
                blame.append(
                    f"scorer (calc_diff {numbers['scorer_calc_diff_max']:.1e} vs the same-input oracle)"
                )
            if numbers["topk_recall_on_its_logits_min"] < 1.0:
                blame.append(
                    f"top-k (recall {numbers['topk_recall_on_its_logits_min']:.4f} on its own input)"
                )
            detail += "; " + (
                " and ".join(blame)
                if blame
                else "scorer within 5e-6 and top-k exact on its input: a near-tie"
            )
    return SelectionCheck(rows, ok, detail, r_same_mean, r_exact_mean, numbers, r_ref_mean)


def logits_row_digests(
    logits: torch.Tensor, lens: torch.Tensor, min_keys: int, chunk: int = 4096
) -> torch.Tensor:
    """One int64 per row: the sum of the fp32 bit patterns of the row's first ``lens[r]`` logits
    (the columns a top-k reads), 0 for rows of at most ``min_keys`` keys (the top-k takes all of
    their keys without reading logits, and upstream's non-paged path leaves them unwritten). Two
    runs whose digests agree on a row gave the top-k the same scores there (up to a collision);
    columns past a row's length (stale, NaN or never written) do not count."""
    rows, width = logits.shape
    lens = lens.reshape(-1).to(logits.device).long().clamp(0, width)
    out = torch.zeros(rows, dtype=torch.int64, device=logits.device)
    cols = torch.arange(width, device=logits.device)
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        bits = logits[lo:hi].float().contiguous().view(torch.int32).long()
        keep = (cols[None, :] < lens[lo:hi, None]) & (lens[lo:hi, None] > min_keys)
        out[lo:hi] = torch.where(keep, bits, torch.zeros((), dtype=torch.int64, device=logits.device)).sum(1)
    return out.cpu()


def _differing_rows(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """Rows whose selected sets differ, and the most slots one such row differs by."""
    if a.shape != b.shape:
        return int(max(a.shape[0], b.shape[0])), int(max(a.shape[-1], b.shape[-1]))
    rows = (a != b).any(1)
    worst = 0
    for r in torch.nonzero(rows).flatten().tolist():
        sa, sb = set(a[r].tolist()), set(b[r].tolist())
        worst = max(worst, len(sa - sb))
    return int(rows.sum()), worst


def compare_flag_off(
    patched: dict[str, Any],
    base: dict[str, Any],
    control: dict[str, Any] | None = None,
    patched_control: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Flag off, the patched tree must leave the same pool bytes and select the same slots as the
    unpatched tree. Each record: ``selections`` (step -> sorted slots), ``pool_digest`` (step ->
    digest), ``step_status`` (step -> the oracle checks' verdict).

    A step whose selected sets differ is a fault unless all of these hold: the pool bytes agree,
    both trees' selections pass the same-input oracle up to ties, and the unpatched tree run a
    second time (``control``) or the patched tree run a second time (``patched_control``) differs
    from its own first run on that step -- upstream's kernels, which both trees run with the flag
    off, then break ties differently run to run, which no patch can be asked to reproduce. Without
    a control such a step stays unexplained: the verdict is ``incomplete``, not a pass.

    Both records also name how the profile's scorer was built (``scorer_build``: e.g. TileLang
    forced to sm_120's lowering, or None); runs whose scorers were built differently are not
    comparable -- another reduction order breaks near-ties its own way -- and end in ``error``."""
    builds = [
        r.get("scorer_build")
        for r in (patched, base, *(c for c in (control, patched_control) if c is not None))
    ]
    if len(set(builds)) > 1:
        return {
            "status": "error",
            "steps": len(patched["selections"]),
            "differing_steps": {},
            "detail": f"not comparable: the scorer was built differently in the patched and unpatched runs ({builds})",
        }
    ps, bs = patched["selections"], base["selections"]
    pool = sorted(k for k, v in patched["pool_digest"].items() if base["pool_digest"].get(k) != v)
    missing = sorted(k for k in bs if k not in ps)
    extra = sorted(k for k in ps if k not in bs)
    differing: dict[str, dict[str, Any]] = {}
    for k, v in ps.items():
        if k in bs and not torch.equal(v, bs[k]):
            rows, worst = _differing_rows(v, bs[k])
            entry: dict[str, Any] = {
                "rows": rows,
                "of_rows": int(v.shape[0]),
                "max_slots_per_row": worst,
                "patched_oracle_check": patched.get("step_status", {}).get(k, "unknown"),
                "unpatched_oracle_check": base.get("step_status", {}).get(k, "unknown"),
            }
            if control is not None:
                cs = control["selections"].get(k)
                entry["unpatched_rerun_differs"] = cs is not None and not torch.equal(cs, bs[k])
            if patched_control is not None:
                pcs = patched_control["selections"].get(k)
                entry["patched_rerun_differs"] = pcs is not None and not torch.equal(pcs, v)
            # whether the two trees' scorers handed the top-k the same scores on the rows whose
            # selections differ: tells a scorer difference from a top-k one
            pd, bd = patched.get("logits_digest", {}).get(k), base.get("logits_digest", {}).get(k)
            if pd is not None and bd is not None and pd.shape == bd.shape and v.shape == bs[k].shape:
                rows = (v != bs[k]).any(1)
                entry["scores_differ_on_those_rows"] = bool((pd[rows] != bd[rows]).any())
            differing[k] = entry
    tie_breaks = [
        k
        for k, e in differing.items()
        if e["patched_oracle_check"] == "pass"
        and e["unpatched_oracle_check"] == "pass"
        and (e.get("unpatched_rerun_differs") is True or e.get("patched_rerun_differs") is True)
    ]
    unexplained = [k for k in differing if k not in tie_breaks]
    controlled = control is not None or patched_control is not None
    n = len(ps)
    if (
        pool
        or missing
        or extra
        or any(
            e["patched_oracle_check"] != "pass" or e["unpatched_oracle_check"] != "pass"
            for e in differing.values()
        )
    ):
        status = "fail"
    elif unexplained and not controlled:
        status = "incomplete"
    elif unexplained:
        status = "fail"
    else:
        status = "pass"
    if not differing and status == "pass":
        detail = f"flag off: all {n} steps select the same slots and leave the same pool bytes as the unpatched tree"
    else:
        parts = [
            f"flag off, {n} steps: pool bytes {'identical' if not pool else 'DIFFER at ' + str(pool[:5])}"
        ]
        if missing or extra:
            parts.append(f"steps missing {missing[:5]}, extra {extra[:5]}")
        if differing:
            rows = sum(e["rows"] for e in differing.values())
            parts.append(
                f"selections differ on {len(differing)} steps ({rows} rows, at most "
                f"{max(e['max_slots_per_row'] for e in differing.values())} slots a row)"
            )
        if tie_breaks:
            parts.append(
                f"{len(tie_breaks)} of them: both trees pass the same-input oracle up to ties and one tree "
                "differs from itself on a rerun there (run-to-run tie-breaking of the kernels both run)"
            )
        if unexplained and not controlled:
            parts.append(f"unexplained on {len(unexplained)} (no rerun of either tree to compare with)")
        elif unexplained:
            parts.append(f"NOT explained by either tree's own variation on {unexplained[:5]}")
        detail = "; ".join(parts)
    reruns = [name for name, c in (("unpatched", control), ("patched", patched_control)) if c is not None]
    return {
        "status": status,
        "steps": n,
        "detail": detail,
        "differing_steps": differing,
        "pool_differs": pool,
        "missing": missing,
        "extra": extra,
        "control": " and ".join(f"{t} tree run twice" for t in reruns) or None,
    }
