"""Tier 2 for one problem: store every arm's keys, score, select, compare with the oracles.

Arms (all but ``bf16q`` and ``fp4`` use the production fp8 q, so only key storage differs):

* ``bf16``: keys through the bf16 store, scored by the bf16 scorer (the series);
* ``fp8``: keys through upstream's fp8 store, scored by the fp8 scorer (upstream default);
* ``fp4``: upstream's own fp4 C4 indexer (``--enable-deepseek-v4-fp4-indexer``): its fp4 q and
  its 68-B fp4 keys, both rounded by its thresholds (:func:`verify.core.formats.
  fp4_upstream_codes`), scored in fp32 as DeepGEMM's ``fp8_fp4_paged_mqa_logits`` would --
  emulated on every backend: that kernel exists for SM100 only, none for Hopper, and upstream
  refuses the flag below SM100 (``serving_hook.py``);
* ``fp4sim``: keys through DeepSeek's fp4 QAT rounding, stored and scored as bf16, read with the
  production fp8 q (the key format alone);
* ``fp8_emul`` (GPU only): the exact torch emulation of the fp8 path on the same inputs -- what a
  correct fp8 path must reproduce; the diagnosis compares ``fp8`` against it;
* ``bf16q``: the bf16 arm's keys scored with q *before* its fp8 rounding (bf16 q, unfolded head
  weights), emulated: what the production fp8 q costs on top of the keys;
* ``int8sim`` / ``fp8b32sim``: candidate formats with fp8's 132 bytes per key, emulated: int8
  with one fp32 scale per key, and e4m3 with one power-of-two (ue8m0) scale per 32 values.

Oracles: the *same-q* oracle scores the unrounded keys with the production fp8 q (dequantized) --
every arm but ``bf16q`` / ``fp4`` uses that q, so it isolates what key storage costs
(``recall_tie``, the gate's oracle); the *exact-q* oracle uses the unquantized fp32 q (``*_unq``
fields): what a user gets against exact scores; the *reference* oracle is DeepSeek's own
indexer numerics, fp4 q x fp4 keys (:mod:`verify.core.deepseek_reference`, ``*_ref`` fields):
the selection the model was trained with. Each arm's overlap with each is a tie-aware recall;
``ref_recall_tie`` / ``ref_recall_tie_unq`` are the reference selection's own against the
same-q / exact-q oracles. None of them is model quality.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from verify.core import formats as F
from verify.core.deepseek_reference import ReferenceIndexer
from verify.core.metrics import row_metrics
from verify.core.scoring import SlotKeys, grouped_row_logits, torch_select

from .backend import Backend, EmulationBackend, QueryInputs
from .generator import Problem

ARM_FORMAT: dict[str, str] = {
    "bf16": "bf16",
    "fp8": "fp8",
    "fp4": "fp4",
    "fp4sim": "bf16",
    "fp8_emul": "fp8",
    "bf16q": "bf16",
    "int8sim": "f32",
    "fp8b32sim": "bf16",
}
BASE_ARMS = ("bf16", "fp8", "fp4", "fp4sim", "bf16q", "int8sim", "fp8b32sim")
#: arms scored with a q made from the unquantized one instead of the production fp8 q
UNQ_Q_ARMS = ("bf16q", "fp4")
#: arms whose pool is another arm's (same keys, different q)
SHARED_POOL = {"bf16q": "bf16"}
ROW_FIELDS = (
    "length_tokens",
    "tokens",
    "n_keys",
    "seq_len",
    "topk",
    "k",
    "kind",
    "mode",
    "margin",
    "depth",
    "residue",
    "needle_pos",
    "group",
    "seq_id",
)


def arm_keys(arm: str, keys: torch.Tensor) -> torch.Tensor:
    sim = {"fp4sim": F.fp4_sim, "int8sim": F.int8_sim, "fp8b32sim": F.fp8_block32_sim}.get(arm)
    return sim(keys) if sim is not None else keys


def arm_query(
    arm: str, q_fp8: torch.Tensor, w: torch.Tensor, qi: QueryInputs
) -> tuple[torch.Tensor, torch.Tensor]:
    """The q and head weights ``arm`` is scored with: the production fp8 q with its folded
    weights, or (``UNQ_Q_ARMS``) a q made from the unquantized one with the plain weights."""
    if arm not in UNQ_Q_ARMS:
        return q_fp8, w
    assert qi.q_rot is not None and qi.w_raw is not None
    w_unq = qi.w_raw.float() * qi.weight_scale
    if arm == "fp4":
        return F.fp4_upstream_q(qi.q_rot), w_unq
    return qi.q_rot.to(torch.bfloat16), w_unq


def _ops(arm: str, backend: Backend, control: EmulationBackend | None) -> Backend:
    if arm == "fp8_emul":
        assert control is not None, "fp8_emul needs an emulation control backend"
        return control
    return backend


def store_arms(
    problem: Problem, backend: Backend, arms: Sequence[str], control: EmulationBackend | None
) -> dict[str, torch.Tensor]:
    pools: dict[str, torch.Tensor] = {}
    slots = problem.written_slots
    keys = problem.keys_ref[slots]
    for arm in arms:
        if arm in SHARED_POOL and SHARED_POOL[arm] in pools:
            pools[arm] = pools[SHARED_POOL[arm]]
            continue
        ops = _ops(arm, backend, control)
        pool = ops.new_pool(ARM_FORMAT[arm], problem.num_pages)
        ops.store(ARM_FORMAT[arm], pool, slots, arm_keys(arm, keys))
        pools[arm] = pool
    return pools


def canary_intact(pool: torch.Tensor, canary_pages: torch.Tensor) -> bool:
    return bool((pool[canary_pages] == 0).all())


def batch_rows(problem: Problem, budget_bytes: int) -> list[torch.Tensor]:
    """Row batches (rows of one query stay together where possible) within a memory budget."""
    width = problem.page_table.shape[1] * F.PAGE_SLOTS
    # ~1 KiB per logit position covers the torch fp8 fallback's gather (132 B + bf16 copy + bf16
    # and fp32 per-head products are per *row*, 64 heads) -- the largest consumer.
    per_row = max(1, width * 1024)
    size = max(1, min(problem.num_rows, budget_bytes // per_row))
    order = torch.argsort(problem.q_index.cpu(), stable=True)
    return [order[i : i + size].to(problem.q_index.device) for i in range(0, problem.num_rows, size)]


def run_problem(
    problem: Problem,
    backend: Backend,
    arms: Sequence[str] = BASE_ARMS,
    control: EmulationBackend | None = None,
    budget_bytes: int = 1 << 30,
    preset: dict[str, tuple[str, torch.Tensor]] | None = None,
) -> dict[str, Any]:
    """Returns ``{"records": [...], "timing": {...}, "canary": {...}}``; one record per (row, arm).

    ``preset`` maps extra arms to ready pools ``(format, pool)`` scored as they are (replay's
    ``captured`` arm: the deployment's own bytes)."""
    assert problem.q_fp8 is not None and problem.w is not None
    preset = preset or {}
    fmt_of = {**ARM_FORMAT, **{a: fmt for a, (fmt, _) in preset.items()}}
    t0 = time.perf_counter()
    ordered = sorted((a for a in arms if a not in preset), key=lambda a: a in SHARED_POOL)
    pools = store_arms(problem, backend, ordered, control)
    pools.update({a: pool for a, (_, pool) in preset.items() if a in arms})
    sync(problem.keys_ref.device)
    t_store = time.perf_counter() - t0
    canary = {arm: canary_intact(p, problem.canary_pages) for arm, p in pools.items()}

    ref = SlotKeys(problem.keys_ref, None, "fp32")
    q_deq = problem.q_fp8.float()
    qi = problem.queries
    has_unq = qi.q_rot is not None and qi.w_raw is not None
    w_unq = qi.w_raw.float() * qi.weight_scale if has_unq and qi.w_raw is not None else None
    arms = [a for a in arms if a not in UNQ_Q_ARMS or has_unq]
    queries = {arm: arm_query(arm, problem.q_fp8, problem.w, qi) for arm in arms}
    t1 = time.perf_counter()
    reference = ReferenceIndexer.of(problem.keys_ref) if has_unq else None
    t_oracle = time.perf_counter() - t1
    records: list[dict[str, Any]] = []
    t_score = 0.0
    for rows in batch_rows(problem, budget_bytes):
        qidx = problem.q_index[rows]
        seq = problem.seq_lens[rows]
        pt = problem.page_table[rows]
        t1 = time.perf_counter()
        oracle = grouped_row_logits(ref, q_deq, problem.w, qidx, pt, seq)
        oracle_unq = grouped_row_logits(ref, qi.q_rot, w_unq, qidx, pt, seq) if has_unq else None
        oracle_ref, ref_sel = (
            reference.select(qi.q_rot, w_unq, qidx, pt, seq, problem.topk[rows])
            if reference is not None
            else (None, None)
        )
        sync(oracle.device)
        t_oracle += time.perf_counter() - t1
        t1 = time.perf_counter()
        logits = {
            arm: _ops(arm, backend, control).score(fmt_of[arm], pools[arm], *queries[arm], qidx, seq, pt)
            for arm in arms
        }
        sync(oracle.device)
        t_score += time.perf_counter() - t1
        topks = problem.topk[rows]
        for topk in sorted(set(topks.tolist())):
            sub = (topks == topk).nonzero(as_tuple=True)[0]
            r_ids = rows[sub]
            o_sub = oracle[sub]
            needle = problem.needle_pos[r_ids]
            sels = {
                arm: _ops(arm, backend, control).select(logits[arm][sub], seq[sub], pt[sub], topk)
                for arm in arms
            }
            q_quant = ref_same = ref_unq = None
            if oracle_unq is not None:
                o_sel = torch_select(o_sub, seq[sub], topk)
                q_quant = row_metrics(oracle_unq[sub], seq[sub], topk, o_sel)["recall_tie"]
            if oracle_ref is not None and ref_sel is not None and oracle_unq is not None:
                r_sel = ref_sel[sub, :topk]
                ref_same = row_metrics(o_sub, seq[sub], topk, r_sel)["recall_tie"]
                ref_unq = row_metrics(oracle_unq[sub], seq[sub], topk, r_sel)["recall_tie"]
            bf16_sel = sels.get("bf16")
            for arm in arms:
                m = row_metrics(o_sub, seq[sub], topk, sels[arm], needle)
                if oracle_unq is not None:
                    m["recall_tie_unq"] = row_metrics(oracle_unq[sub], seq[sub], topk, sels[arm])[
                        "recall_tie"
                    ]
                    m["q_quant_recall"] = q_quant
                if oracle_ref is not None:
                    m["recall_tie_ref"] = row_metrics(oracle_ref[sub], seq[sub], topk, sels[arm])[
                        "recall_tie"
                    ]
                    m["ref_recall_tie"] = ref_same
                    m["ref_recall_tie_unq"] = ref_unq
                if bf16_sel is not None:
                    m["agree_bf16"] = _agreement(sels[arm], bf16_sel, m["k"])
                cols = {name: t.detach().cpu().tolist() for name, t in m.items() if t is not None}
                for j, r in enumerate(r_ids.tolist()):
                    meta = problem.rows[r]
                    rec: dict[str, Any] = {f: meta.get(f) for f in ROW_FIELDS}
                    rec["row"] = r
                    rec["arm"] = arm
                    rec["source"] = problem.source
                    for name, vals in cols.items():
                        rec[name] = vals[j]
                    records.append(rec)
    return {
        "records": records,
        "timing": {"store_s": t_store, "oracle_s": t_oracle, "score_select_s": t_score},
        "canary": canary,
    }


def _agreement(a: torch.Tensor, b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """|A & B| / k for two selections ``[B, K]`` (-1 padded)."""
    width = int(max(a.max().item(), b.max().item(), 0)) + 1
    ma = torch.zeros(a.shape[0], width + 1, dtype=torch.bool, device=a.device)
    mb = torch.zeros_like(ma)
    ma.scatter_(1, a.clamp(min=-1) + 1, True)
    mb.scatter_(1, b.clamp(min=-1) + 1, True)
    both = (ma & mb)[:, 1:].sum(1).float()
    return both / k.clamp(min=1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
