"""Read-side hazards of the fp8 C4 path, each a check the diagnosis runs with the platform's own
scorer and top-k (see :mod:`verify.recall.diagnose`).

Upstream's scorers differ in what they leave past a row's length: DeepGEMM and the bf16 kernel
write ``-inf``; upstream's torch fallback writes 0; the TileLang scorer sm_120 runs writes real
scores of whatever keys the last page holds between the row's length and the page end (stale
keys of an earlier request, or never-written slots) and never writes the columns past that
(``new_empty``: whatever the allocator hands back). Whether the selection survives then rests on
the top-k masking by length -- on every path the platform uses. So:

- :func:`check_topk_poisoned_tails`: the platform's top-k on logits whose columns past each
  row's length hold NaN, +inf, huge and stale-looking values, at lengths around page and top-k
  boundaries (63..65, 511..513, 1023..1025 keys) and the field's 4,500 / 5,200 tokens;
- :func:`check_scorer_then_topk`: the platform's scorer then top-k, with the CUDA caching
  allocator first handed NaN-filled blocks (so never-written columns read NaN), pages past each
  row's end holding high-scoring stale keys, padded page tables, and MTP-style row pairs (one
  request's rows at lengths L and L+1 with one page table);
- :func:`check_graph_long_replay` (diagnose): capture at short lengths, replay at long ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verify.core import formats as F
from verify.core.metrics import SCORER_BOUND, TIE_REL, row_metrics, tie_aware_recall
from verify.core.scoring import calc_diff, mask_past_len, row_slots

SelectFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# keys (compressed positions); tokens = 4 x keys
BOUNDARY_LENS = (1, 63, 64, 65, 511, 512, 513, 1023, 1024, 1025, 1125, 1300, 2049, 4100)


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Hand the caching allocator NaN-filled blocks, then free them: a kernel's ``new_empty``
    output of a similar size then starts out holding NaN where it writes nothing."""
    if device.type != "cuda":
        return
    blocks = [torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device=device) for _ in range(4)]
    torch.cuda.synchronize(device)
    del blocks


def _poisoned_logits(
    lens: list[int], width: int, device: torch.device, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random finite logits on valid columns, poison past each row's length; with planted ties."""
    b = len(lens)
    logits = torch.randn(b, width, generator=g).to(device)
    logits[:, ::7] = torch.round(logits[:, ::7] * 4) / 4  # ties
    poisons = torch.tensor([float("nan"), float("inf"), 3.0e38, 1.0e4, -float("inf"), 0.0])
    for i, n in enumerate(lens):
        tail = width - n
        if tail > 0:
            logits[i, n:] = poisons[torch.arange(tail) % poisons.numel()].to(device)
            logits[i, n : min(width, n + 64)] = 50.0  # a stale page tail: higher than any valid score
    return logits, torch.tensor(lens, dtype=torch.int32, device=device)


def check_topk_poisoned_tails(
    select: SelectFn, device: torch.device, topks: tuple[int, ...] = (512, 1024)
) -> dict[str, Any]:
    """The top-k reads only each row's first ``seq_len`` columns, whatever lies past them."""
    g = torch.Generator().manual_seed(41)
    lens = list(BOUNDARY_LENS)
    width = (max(lens) // F.PAGE_SLOTS + 2) * F.PAGE_SLOTS
    logits, seq = _poisoned_logits(lens, width, device, g)
    pages = width // F.PAGE_SLOTS
    pt = (
        torch.stack([torch.randperm(4 * pages, generator=g)[:pages] for _ in lens]).to(torch.int32).to(device)
    )
    worst, beyond = 1.0, 0
    for topk in topks:
        sel = select(logits.clone(), seq, pt, topk)
        clean = logits.clone()
        mask_past_len(clean, seq)
        m = row_metrics(clean.nan_to_num(nan=float("-inf")), seq, topk, sel)
        worst = min(worst, float(m["recall_tie"].min()))
        beyond += int(((sel.long() >= seq.long().unsqueeze(1)) & (sel >= 0)).sum())
    ok = worst == 1.0 and beyond == 0
    return {
        "ok": ok,
        "recall_tie_min": worst,
        "selected_past_len": beyond,
        "lengths_keys": lens,
        "detail": (
            f"top-{'/'.join(map(str, topks))} on logits poisoned past each row's length (NaN, +inf, 3e38, stale "
            f"scores 50x the valid ones) at {len(lens)} boundary lengths: tie-aware recall {worst:.4f}, "
            f"{beyond} selections past the length"
        ),
    }


def scorer_hazard_case(device: torch.device, seed: int = 43) -> dict[str, torch.Tensor]:
    """Keys in pages, rows over them: boundary lengths, MTP pairs (L, L+1 on one page table),
    page tables padded past the row's last page with page 0, and every page's slots past a row's
    end holding keys crafted to outscore the row's real keys (stale keys of a finished request)."""
    g = torch.Generator().manual_seed(seed)
    lens = list(BOUNDARY_LENS) + [1125, 1126, 1300, 1301]  # the last four: two MTP pairs
    max_pages = max(lens) // F.PAGE_SLOTS + 2
    rows = len(lens)
    num_pages = rows * max_pages + 2
    perm = torch.randperm(num_pages - 1, generator=g) + 1
    pt = perm[: rows * max_pages].view(rows, max_pages).clone()
    for r in (len(lens) - 3, len(lens) - 1):  # MTP pairs share their request's page table
        pt[r] = pt[r - 1]
    for r, n in enumerate(lens):
        used = -(-n // F.PAGE_SLOTS)
        pt[r, used + 1 :] = 0  # graph-style padding: page 0 past the row's pages (+1 spare real page)
    keys = torch.randn(num_pages * F.PAGE_SLOTS, F.HEAD_DIM, generator=g) * 0.5
    q = torch.randn(rows, 64, F.HEAD_DIM, generator=g)
    w = torch.rand(rows, 64, generator=g) + 0.1
    slots = row_slots(pt)
    for r, n in enumerate(lens):  # stale: slots past n in the row's pages align with its q
        stale = slots[r, n:].tolist()
        keys[stale] = (q[r].mean(0) * 4.0).expand(len(stale), -1)
    return {
        "keys": keys.to(device),
        "q": q.to(device),
        "w": w.to(device),
        "pt": pt.to(torch.int32).to(device),
        "seq": torch.tensor(lens, dtype=torch.int32, device=device),
        "num_pages": torch.tensor(num_pages),
    }


def check_scorer_then_topk(
    fmt: str,
    store: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None],
    new_pool: Callable[[int], torch.Tensor],
    score: ScoreFn,
    select: SelectFn,
    quantize_q: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    topk: int = 512,
) -> dict[str, Any]:
    """The platform's scorer, then its top-k, on :func:`scorer_hazard_case` with a poisoned
    allocator; selection against the fp64 oracle over the keys as stored."""
    case = scorer_hazard_case(device)
    pool = new_pool(int(case["num_pages"]))
    all_slots = torch.arange(pool.shape[0] * F.PAGE_SLOTS, device=device)
    store(pool, all_slots, case["keys"])
    q8, w = quantize_q(case["q"], case["w"])
    if fmt == "fp8":
        codes, scale = F.fp8_read(pool, all_slots)
        stored = F.fp8_dequantize(codes, scale)
    else:
        stored = F.bf16_read(pool, all_slots)
    slots = row_slots(case["pt"])
    oracle = torch.empty(slots.shape, dtype=torch.float64, device=device)
    for r in range(slots.shape[0]):
        oracle[r] = torch.relu(stored[slots[r]].double() @ q8[r].double().t()) @ w[r].double()
    mask_past_len(oracle, case["seq"])
    width = slots.shape[1]
    poison_allocator(device, case["seq"].numel() * width * 4)
    logits = score(pool, q8, w, case["seq"], case["pt"])
    valid = torch.isfinite(oracle)
    got = logits[:, :width][valid]
    diff = calc_diff(got, oracle[valid])
    finite = bool(torch.isfinite(got).all())
    past = logits[:, :width][~valid]
    past_kind = (
        "-inf"
        if past.numel() == 0 or bool(torch.isneginf(past).all())
        else "0"
        if bool((past == 0).all())
        else "NaN / stale / unwritten values"
    )
    sel = select(logits, case["seq"], case["pt"], topk)
    m = row_metrics(oracle.float(), case["seq"], topk, sel)
    strict_tie = float(m["recall_tie"].min())
    beyond = int(((sel.long() >= case["seq"].long().unsqueeze(1)) & (sel >= 0)).sum())
    scorer_ok = diff < SCORER_BOUND and finite
    # Per row, two questions: did the top-k pick the top of the logits it read (its own input,
    # masked at the length), and is every pick within the top-k of the oracle up to what the
    # scorer's own error on that row can flip (twice its largest error; the scorer itself must
    # stay within DeepGEMM's bound)? A torch fallback that rounds per-head dots to bf16 flips
    # near-ties that an fp64 oracle orders strictly; that is precision, not a read-side bug.
    own_min, tol_min = 1.0, 1.0
    for r, n in enumerate(case["seq"].tolist()):
        if n == 0:
            continue
        ch = sel[r].long()
        ch = torch.where((ch >= 0) & (ch < n), ch, torch.full_like(ch, -1)).unsqueeze(0)
        lg = logits[r : r + 1, :n].double().nan_to_num(float("-inf"))
        own_min = min(
            own_min,
            float(
                tie_aware_recall(
                    lg, ch, topk, lg.abs().nan_to_num(0, posinf=0, neginf=0).amax(1) * 1e-6
                ).min()
            ),
        )
        o = oracle[r : r + 1, :n]
        err = (logits[r : r + 1, :n].double() - o).abs().nan_to_num(float("inf")).amax(1)
        tol = torch.maximum(o.abs().amax(1) * TIE_REL, 2 * err) if scorer_ok else o.abs().amax(1) * TIE_REL
        tol_min = min(tol_min, float(tie_aware_recall(o, ch, topk, tol).min()))
    ok = scorer_ok and own_min == 1.0 and tol_min == 1.0 and beyond == 0
    blame = []
    if not scorer_ok:
        blame.append("scorer")
    if own_min < 1.0 or beyond:
        blame.append("top-k")
    return {
        "ok": ok,
        "calc_diff": diff,
        "finite_on_valid": finite,
        "past_len": past_kind,
        "recall_tie_min": tol_min,
        "recall_tie_strict_oracle_min": strict_tie,
        "topk_recall_on_its_logits_min": own_min,
        "selected_past_len": beyond,
        "detail": (
            f"{fmt} scorer then top-{topk} over {case['seq'].numel()} rows (boundary lengths, MTP pairs, "
            f"padded page tables, stale high-scoring keys past each row's end, NaN-poisoned allocator): "
            f"calc_diff {diff:.1e} on valid columns ({'finite' if finite else 'NON-FINITE'}), past the length: "
            f"{past_kind}; top-k on its own logits: recall {own_min:.4f}, {beyond} past the length; "
            f"vs the fp64 oracle: recall {tol_min:.4f} with ties within the scorer's own error "
            f"({strict_tie:.4f} with exact ties only)"
            + (f"; FAULT in the {' and '.join(blame)}" if blame else "")
        ),
    }
