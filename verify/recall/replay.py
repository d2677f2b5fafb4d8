"""Tier 2 on a captured indexer call: turn a :class:`Capture` into a :class:`Problem`.

Reference keys (what the oracle scores and every arm stores): ``k_ref`` when the capture has it,
else the captured pool decoded exactly (fp8 codes x scale, or the bf16 values). So:

* a bf16 capture (patched server) measures what fp8 / fp4 storage would lose on real keys;
* an fp8 capture (upstream server) has only fp8-rounded keys: its oracle is their exact
  dequantization, which tests the fp8 *read* path on the user's real pages (arm ``captured``:
  the captured bytes scored as they are), not fp8's precision.

Rows are bucketed by length (the smallest configured length >= the row's token count, tokens =
``row_tokens`` or ``4 * seq_len``) and, where ``needle_pos`` is known, by depth (nearest
configured depth), so the same tables, heatmaps and gate apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verify.core import formats as F

from .backend import QueryInputs
from .generator import Problem
from .replay_format import Capture


def reference_keys(cap: Capture, device: torch.device) -> tuple[torch.Tensor, str]:
    if cap.k_ref is not None:
        return cap.k_ref.to(device).float(), "k_ref (unrounded keys in the capture)"
    pages = cap.index_k_pages.to(device)
    slots = torch.arange(cap.num_pages * F.PAGE_SLOTS, device=device)
    if cap.index_k_format == "fp8":
        codes, scale = F.fp8_read(pages, slots)
        return F.fp8_dequantize(codes, scale), "dequantized captured fp8 pages (exact)"
    return F.bf16_read(pages, slots), "captured bf16 pages"


def bucket(value: int, edges: Sequence[int]) -> int:
    for e in sorted(edges):
        if value <= e:
            return int(e)
    return int(value)


def load_problem(
    cap: Capture,
    topks: Sequence[int],
    lengths: Sequence[int],
    depths: Sequence[float],
    device: torch.device,
    name: str,
) -> tuple[Problem, dict[str, tuple[str, torch.Tensor]], str]:
    """Returns (problem, preset pools ``{"captured": (fmt, pool)}``, description of reference keys)."""
    keys, ref_desc = reference_keys(cap, device)
    rows: list[dict[str, Any]] = []
    seq_l, topk_l, qidx_l, needle_l, pt_rows = [], [], [], [], []
    for r in range(cap.rows):
        seq_len = int(cap.seq_lens[r])
        if seq_len == 0:
            continue
        tokens = int(cap.row_tokens[r]) if cap.row_tokens is not None else 4 * seq_len
        needle = int(cap.needle_pos[r]) if cap.needle_pos is not None else -1
        depth = None
        if needle >= 0:
            frac = needle / max(seq_len - 1, 1)
            depth = min(depths, key=lambda d: abs(d - frac))
        for topk in topks:
            rows.append(
                {
                    "length_tokens": bucket(tokens, lengths),
                    "tokens": tokens,
                    "n_keys": seq_len,
                    "seq_len": seq_len,
                    "topk": topk,
                    "k": min(topk, seq_len),
                    "kind": "captured",
                    "mode": None,
                    "margin": None,
                    "depth": depth,
                    "residue": needle % 4 if needle >= 0 else None,
                    "needle_pos": needle,
                    "group": r,
                    "seq_id": 0,
                }
            )
            seq_l.append(seq_len)
            topk_l.append(topk)
            qidx_l.append(r)
            needle_l.append(needle)
            pt_rows.append(r)
    pt = cap.page_table[torch.tensor(pt_rows, dtype=torch.long)].clamp(min=0).to(device)
    q = cap.q.to(device)
    q_ref = cap.q_ref.to(device).float() if cap.q_ref is not None else None
    w_ref = cap.weights_ref.to(device).float() if cap.weights_ref is not None else None
    if q_ref is None or w_ref is None:
        q_ref, w_ref = None, None
    problem = Problem(
        length_tokens=max((int(r["length_tokens"]) for r in rows), default=0),
        n_keys=max(seq_l, default=0),
        keys_ref=keys,
        written_slots=torch.arange(keys.shape[0], device=device),
        canary_pages=torch.empty(0, dtype=torch.long, device=device),
        page_table=pt.to(torch.int32),
        seq_lens=torch.tensor(seq_l, dtype=torch.int32, device=device),
        topk=torch.tensor(topk_l, dtype=torch.int64, device=device),
        q_index=torch.tensor(qidx_l, dtype=torch.int64, device=device),
        needle_pos=torch.tensor(needle_l, dtype=torch.int64, device=device),
        # weights_ref already carries weight_scale (it is the unfolded fp32 weight), hence 1.0
        queries=QueryInputs(None, None, None, q_ref, w_ref, 1.0),
        rows=rows,
        q_fp8=q,
        w=cap.weights.to(device).float(),
        source=f"replay:{name}",
    )
    preset = {"captured": (cap.index_k_format, cap.index_k_pages.to(device).clone())}
    return problem, preset, ref_desc


def capture_from_problem(
    problem: Problem, path, index_k_format: str = "bf16", topk: int | None = None, with_ref: bool = True
):
    """Write a synthetic problem's rows of one ``index_topk`` as a capture file (what the capture
    patch will dump from a live server), with needles and, if ``with_ref``, the unrounded keys and
    unquantized q (a live fp8 server has neither)."""
    from .replay_format import write_capture

    assert problem.q_fp8 is not None and problem.w is not None
    topk = int(problem.topk[0]) if topk is None else topk
    rows = (problem.topk == topk).nonzero(as_tuple=True)[0]
    pool = F.new_pool(index_k_format, problem.num_pages, problem.keys_ref.device)
    store = F.fp8_store if index_k_format == "fp8" else F.bf16_store
    store(pool, problem.written_slots, problem.keys_ref[problem.written_slots])
    qi = problem.queries
    qidx = problem.q_index[rows]
    return write_capture(
        path,
        q=problem.q_fp8[qidx],
        weights=problem.w[qidx],
        index_k_pages=pool,
        page_table=problem.page_table[rows],
        seq_lens=problem.seq_lens[rows],
        index_k_format=index_k_format,
        index_topk=topk,
        metadata={"source": "verify.recall synthetic", "length_tokens": problem.length_tokens},
        needle_pos=problem.needle_pos[rows],
        k_ref=problem.keys_ref if with_ref else None,
        q_ref=qi.q_rot[qidx] if with_ref and qi.q_rot is not None else None,
        weights_ref=(qi.w_raw.float() * qi.weight_scale)[qidx] if with_ref and qi.w_raw is not None else None,
        row_tokens=torch.full((rows.numel(),), problem.length_tokens, dtype=torch.int64),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verify.recall.replay --synthetic OUT.pt [--length N] [--format bf16|fp8]``:
    write an example capture (to try ``--replay`` or to check a capture writer against)."""
    import argparse

    from .backend import EmulationBackend
    from .generator import GenConfig, PlanConfig, build_planted

    ap = argparse.ArgumentParser(prog="python -m verify.recall.replay")
    ap.add_argument("--synthetic", type=Path, required=True)
    ap.add_argument("--length", type=int, default=8000)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--format", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-ref", action="store_true", help="leave out k_ref/q_ref (like a live fp8 capture)")
    args = ap.parse_args(argv)
    be = EmulationBackend(device=torch.device("cpu"))
    plan = PlanConfig(topks=(args.topk,), residues="staggered", sequences=1)
    problem = build_planted(args.length, plan, GenConfig(seed=args.seed), be.quantize_q)
    path = capture_from_problem(problem, args.synthetic, args.format, args.topk, with_ref=not args.no_ref)
    print(f"wrote {path} ({problem.num_rows} rows, {args.format})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
