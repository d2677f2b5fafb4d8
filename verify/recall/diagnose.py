"""Which explanation do the measurements support: fp8 precision, or a bug in an fp8 path?

Precision alone (fp8 keeps ~98-99% of the top-k) cannot explain "every needle lost beyond 4.5K
tokens"; a bug in an fp8 store or read path on the user's GPU would (vllm #50576: a writer and a
reader disagreeing on the page layout; vllm #52492: a short-context shortcut baked into a CUDA
graph). So every production fp8 path available is run on the local device against its *own*
dequantized-input oracle:

* store: the bytes a store kernel wrote, decoded in the block-planar layout, must equal the
  quantization of its input within fp8 rounding (scale exact); a pool decoded in the
  token-interleaved layout is tried too, to name a layout mismatch; canary pages stay zero;
* q: the fused q kernel's codes and folded weights against the emulated quantization;
* scorers: logits against an fp64 oracle on the dequantized stored keys, DeepGEMM's bound
  ``calc_diff < 5e-6``, finite on valid positions, bitwise-deterministic reruns on the columns the top-k reads;
* top-k: tie-aware recall 1.0 on its own logits (ties planted), sequential short rows, slot
  translation;
* CUDA graphs: a scorer + top-k captured at short lengths and replayed at long ones equals eager;
* end to end (tier 2): the production fp8 arm against the emulated fp8 arm on identical inputs,
  and top-k agreement with the bf16 arm; beside them, every arm's overlap with the three oracles
  (same-q, exact-q and DeepSeek's reference numerics, :mod:`verify.core.deepseek_reference`),
  reported, never part of the verdict.

The verdict is one line: ``fp8 path correct, loses X% of top-k to precision`` or ``fp8 path
disagrees with its own oracle: bug in <kernel>``. On the CPU backend the "production" paths are
the emulation itself, which agrees with itself by construction; the line says so.

Run standalone (no tier 2): ``python -m verify.recall.diagnose [--backend gpu] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from verify.core import formats as F
from verify.core.metrics import SCORER_BOUND, row_metrics
from verify.core.scoring import calc_diff, mask_past_len, row_slots
from verify.core.upstream import Found, Missing

from .backend import Backend, EmulationBackend, QueryInputs
from .generator import (
    WEIGHT_SCALE,
    GenConfig,
    hadamard,
    make_haystack,
    make_query,
    rope_cos_sin,
    rope_hadamard,
)


@dataclass
class Check:
    name: str
    kernel: str
    status: str  # pass | fail | skipped | error
    detail: str
    fp8_path: bool = True  # counts toward the fp8 verdict
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass
class Diagnosis:
    verdict: str
    checks: list[Check]
    emulated: bool
    topk_agreement_fp8_bf16: float | None = None
    #: per arm, mean tie-aware recall against each oracle (rows where the indexer must choose):
    #: ``{"same-q": {...}, "exact-q": {...}, "reference": {...}}``; the reference's own selection
    #: against the other two is under the arm name ``reference``
    oracle_recall: dict[str, dict[str, float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _guard(name: str, kernel: str, fn: Callable[[], Check], fp8_path: bool = True) -> Check:
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 -- a crashing check is reported, not fatal
        return Check(name, kernel, "error", f"{type(exc).__name__}: {exc}"[:400], fp8_path)


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------


def _keys(n: int, device: torch.device, seed: int = 7) -> torch.Tensor:
    """Structured keys (heavy-tailed norms, sinks, Hadamard-rotated) from the tier-2 generator."""
    return make_haystack(GenConfig(seed=seed), 4 * n, 0, n).to(device)


def _queries(rows: int, device: torch.device, seed: int = 7):
    cfg = GenConfig(seed=seed)
    qs, ws = zip(*(make_query(cfg, 0, 0, i, 100 + i) for i in range(rows)))
    q_pre = torch.stack(qs)
    cos, sin = rope_cos_sin(torch.arange(rows) + 100, cfg.rope_theta)
    q_rot = rope_hadamard(q_pre, cos.unsqueeze(1), sin.unsqueeze(1))
    return QueryInputs(
        q_pre.to(device),
        cos.to(device),
        sin.to(device),
        q_rot.to(device),
        torch.stack(ws).to(device),
        WEIGHT_SCALE,
    )


# ---------------------------------------------------------------------------------------------
# store checks
# ---------------------------------------------------------------------------------------------


def _fp8_store_verdict(
    pool: torch.Tensor,
    slots: torch.Tensor,
    x: torch.Tensor,
    canary: torch.Tensor,
    scale_rtol: float,
    abs_slack: float,
) -> dict[str, Any]:
    """Compare a stored fp8 pool against the quantization of ``x`` (the store's fp32 input)."""
    exp_codes, exp_scale = F.fp8_quantize_rows(x)
    codes, scale = F.fp8_read(pool, slots)
    deq = F.fp8_dequantize(codes, scale)
    bound = F.fp8_half_ulp(x / exp_scale.unsqueeze(1)) * exp_scale.unsqueeze(1) * (1 + 1e-6)
    amax = x.abs().amax(1, keepdim=True)
    within = (deq - x).abs() <= bound + abs_slack * amax
    scale_ok = ((scale - exp_scale).abs() <= scale_rtol * exp_scale.abs()) & torch.isfinite(scale)
    ci, si = F.fp8_read_interleaved(pool, slots)
    deq_i = F.fp8_dequantize(ci, si)
    within_i = ((deq_i - x).abs() <= bound + abs_slack * amax) & torch.isfinite(deq_i)
    return {
        "keys": int(x.shape[0]),
        "codes_bit_exact": float((codes == exp_codes).float().mean()),
        "scales_bit_exact": float((scale == exp_scale).float().mean()),
        "values_within_rounding": float(within.float().mean()),
        "scales_ok": float(scale_ok.float().mean()),
        "interleaved_values_within_rounding": float(within_i.float().mean()),
        "canary_pages_untouched": bool((pool[canary] == 0).all()),
        "max_abs_err_over_amax": float(((deq - x).abs() / amax.clamp(min=1e-30)).nan_to_num(1e9).max()),
    }


def _store_status(nums: Mapping[str, Any]) -> tuple:
    ok = nums["values_within_rounding"] == 1.0 and nums["scales_ok"] == 1.0 and nums["canary_pages_untouched"]
    if ok:
        return "pass", (
            f"stored values within fp8 rounding of the input on all {nums['keys']} keys "
            f"(codes bit-exact {nums['codes_bit_exact']:.4%}, scales {nums['scales_bit_exact']:.4%}), canaries intact"
        )
    why = []
    if nums["values_within_rounding"] != 1.0:
        why.append(f"only {nums['values_within_rounding']:.2%} of values within fp8 rounding")
    if nums["scales_ok"] != 1.0:
        why.append(f"only {nums['scales_ok']:.2%} of scales match")
    if not nums["canary_pages_untouched"]:
        why.append("wrote into canary pages")
    if float(nums["interleaved_values_within_rounding"]) > 0.99:
        why.append(
            "the pool decodes correctly as TOKEN-INTERLEAVED (128 B + 4 B per slot) while readers expect "
            "block-planar (64x128 B then 64x4 B): layout mismatch, vllm #50576 class"
        )
    return "fail", "; ".join(why)


def _layout(num_keys: int, device: torch.device, seed: int):
    pages_used = -(-num_keys // F.PAGE_SLOTS) * 2
    num_pages = pages_used + 3
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)
    canary = perm[:3].to(device)
    slots_all = (perm[3:].unsqueeze(1) * F.PAGE_SLOTS + torch.arange(F.PAGE_SLOTS)).flatten()
    slots = slots_all[torch.randperm(slots_all.numel(), generator=g)[:num_keys]].to(device)
    return num_pages, canary, slots


def check_fp8_store(backend: Backend, num_keys: int, label: str) -> Check:
    """The backend's fp8 store (fault-aware) against the emulated quantization of its input."""
    dev = backend.device
    num_pages, canary, slots = _layout(num_keys, dev, 11)
    x = _keys(num_keys, dev)
    pool = backend.new_pool("fp8", num_pages)
    backend.store("fp8", pool, slots, x)
    dtype = getattr(backend, "fp8_input_dtype", torch.float32)
    x_in = x.to(dtype).float()
    # Codes must be bit-exact; the fp32 scale absmax/448 may differ from torch in its last bits
    # (the GPU division is not always correctly rounded), which changes no stored value.
    nums = _fp8_store_verdict(pool, slots, x_in, canary, scale_rtol=1e-6, abs_slack=0.0)
    status, detail = _store_status(nums)
    return Check("fp8 index-K store", label, status, detail, True, nums)


def check_bf16_store(backend: Backend, num_keys: int, label: str) -> Check:
    dev = backend.device
    num_pages, canary, slots = _layout(num_keys, dev, 12)
    x = _keys(num_keys, dev)
    pool = backend.new_pool("bf16", num_pages)
    backend.store("bf16", pool, slots, x)
    got = F.bf16_read(pool, slots)
    exact = float((got == x.to(torch.bfloat16).float()).all(1).float().mean())
    canary_ok = bool((pool[canary] == 0).all())
    status = "pass" if exact == 1.0 and canary_ok else "fail"
    detail = f"{exact:.2%} of keys read back as one RNE rounding of the input; canaries {'intact' if canary_ok else 'OVERWRITTEN'}"
    return Check(
        "bf16 index-K store", label, status, detail, False, {"keys_exact": exact, "canary": canary_ok}
    )


def check_fused_norm_rope_store(device: torch.device, num_keys: int = 4096) -> Check:
    """Production's default fp8 writer: compress_norm_rope_store's indexer kernel (decode plans)."""
    from verify.core import upstream as U

    got = U.fused_norm_rope_store()
    if isinstance(got, U.Missing):
        return Check("fp8 fused norm+rope+hadamard store", "compress_norm_rope_store", "skipped", got.reason)
    store, plan_cls = got.obj
    num_pages, canary, slots = _layout(num_keys, device, 13)
    g = torch.Generator().manual_seed(13)
    kv = (
        torch.randn(num_keys, F.HEAD_DIM, generator=g)
        * torch.exp(0.5 * torch.randn(num_keys, 1, generator=g))
    ).to(device)
    weight = (1.0 + 0.2 * torch.randn(F.HEAD_DIM, generator=g)).to(device)
    eps = 1e-6
    positions = torch.arange(num_keys, device=device) * 4  # seq_len = 4(i+1): one entry per token
    cos, sin = rope_cos_sin(torch.arange(num_keys * 4 + 4), GenConfig().rope_theta)
    freqs = torch.complex(cos, sin).to(device)
    plan = torch.zeros(num_keys, 4, dtype=torch.int32, device=device)
    plan[:, 0] = (positions + 4).to(torch.int32)  # DecodePlan.seq_len; position = seq_len - ratio
    pool = F.new_pool("fp8", num_pages, device)
    store(
        kv.float().contiguous(),
        plan_cls(4, plan.view(torch.uint8).view(num_keys, 16)),
        norm_weight=weight.float(),
        norm_eps=eps,
        freq_cis=freqs,
        out_loc=slots.long(),
        kvcache=pool,
        page_size=F.PAGE_SLOTS,
    )
    torch.cuda.synchronize(device)
    # fp64 oracle of the kernel's math: RMSNorm * weight, RoPE (last 64 dims), Hadamard
    x = kv.double()
    y = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + eps) * weight.double()
    c, s = cos[positions.cpu()].double().to(device), sin[positions.cpu()].double().to(device)
    re, im = y[:, 64::2].clone(), y[:, 65::2].clone()
    y[:, 64::2], y[:, 65::2] = re * c - im * s, re * s + im * c
    y = (y @ hadamard().double().to(device)).float()
    # fp32 rounding order and rsqrt differ from the oracle: allow 1e-5 of the row max on top of
    # fp8 rounding, and scales to 1e-5 relative.
    nums = _fp8_store_verdict(pool, slots, y, canary, scale_rtol=1e-5, abs_slack=1e-5)
    status, detail = _store_status(nums)
    return Check(
        "fp8 fused norm+rope+hadamard store",
        "compress_norm_rope_store (fused_norm_rope_v2.cuh indexer)",
        status,
        detail,
        True,
        nums,
    )


# ---------------------------------------------------------------------------------------------
# q check
# ---------------------------------------------------------------------------------------------


def check_q(backend: Backend, label: str) -> Check:
    qi = _queries(32, backend.device)
    q8, w = backend.quantize_q(qi)
    e8, ew = F.quantize_q(qi.q_rot, qi.w_raw, qi.weight_scale)
    codes_exact = float((q8.view(torch.uint8) == e8.view(torch.uint8)).float().mean())
    scale = F.fp8_row_scale(qi.q_rot)
    deq = q8.float() * (w / (qi.w_raw.float() * qi.weight_scale)).unsqueeze(-1)
    x = qi.q_rot
    bound = F.fp8_half_ulp(x / scale.unsqueeze(-1)) * scale.unsqueeze(-1)
    within = float(((deq - x).abs() <= bound * 1.001 + 1e-5 * x.abs().amax(-1, keepdim=True)).float().mean())
    w_rel = float(((w - ew).abs() / ew.abs().clamp(min=1e-30)).max())
    ok = within == 1.0 and w_rel <= 1e-4
    detail = f"q codes bit-exact {codes_exact:.3%} vs emulation, dequantized q within fp8 rounding {within:.3%}, folded weights max rel err {w_rel:.1e}"
    return Check(
        "fp8 q quantization",
        label,
        "pass" if ok else "fail",
        detail,
        True,
        {"codes_bit_exact": codes_exact, "within_rounding": within, "weights_max_rel_err": w_rel},
    )


# ---------------------------------------------------------------------------------------------
# scorer checks
# ---------------------------------------------------------------------------------------------


@dataclass
class ScoreCase:
    pool: dict[str, torch.Tensor]
    q8: torch.Tensor
    w: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor
    keys_deq: dict[str, torch.Tensor]  # fmt -> [num_slots,128] fp64 dequantized stored keys


def score_case(device: torch.device, long_len: int) -> ScoreCase:
    """Rows of mixed length (around ``long_len`` +-30%, a short one, a page-exact one) over random
    pages; keys stored by the *emulated* stores so the scorer is tested alone."""
    g = torch.Generator().manual_seed(21)
    lens = [int(long_len * (0.7 + 0.6 * float(torch.rand(1, generator=g)))) for _ in range(3)]
    lens += [100, 64 * (long_len // 128), 64 * (long_len // 128) + 1]
    rows = len(lens)
    max_pages = -(-max(lens) // F.PAGE_SLOTS) + 1
    num_pages = rows * max_pages + 4
    perm = torch.randperm(num_pages, generator=g)
    page_table = perm[: rows * max_pages].view(rows, max_pages).to(torch.int32)
    keys = _keys(num_pages * F.PAGE_SLOTS, device, seed=21)
    slots = torch.arange(num_pages * F.PAGE_SLOTS, device=device)
    pool = {"fp8": F.new_pool("fp8", num_pages, device), "bf16": F.new_pool("bf16", num_pages, device)}
    F.fp8_store(pool["fp8"], slots, keys)
    F.bf16_store(pool["bf16"], slots, keys)
    codes, scale = F.fp8_read(pool["fp8"], slots)
    keys_deq = {
        "fp8": F.fp8_dequantize(codes, scale).double(),
        "bf16": F.bf16_read(pool["bf16"], slots).double(),
    }
    qi = _queries(rows, device, seed=21)
    q8, w = F.quantize_q(qi.q_rot, qi.w_raw, qi.weight_scale)
    return ScoreCase(
        pool, q8, w, torch.tensor(lens, dtype=torch.int32, device=device), page_table.to(device), keys_deq
    )


def oracle64(case: ScoreCase, fmt: str) -> torch.Tensor:
    """fp64 ``sum_h relu(q.k) w`` on the dequantized stored keys, -inf past each row's length."""
    slots = row_slots(case.page_table)
    out = torch.empty(slots.shape, dtype=torch.float64, device=slots.device)
    for r in range(slots.shape[0]):
        k = case.keys_deq[fmt][slots[r]]
        out[r] = torch.relu(k @ case.q8[r].double().t()) @ case.w[r].double()
    return mask_past_len(out, case.seq_lens)


ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def check_scorer(fmt: str, label: str, fn: ScoreFn, case: ScoreCase, fp8_path: bool, name: str = "") -> Check:
    """``fn(pool, q8 [B,H,128], w [B,H], seq_lens, page_table) -> logits [B, P*64]``; ``name``
    the check's component (default ``"<fmt> scorer"``, the platform's own)."""
    ref = oracle64(case, fmt)
    # the oracle's columns of each of three runs
    runs = [
        fn(case.pool[fmt], case.q8, case.w, case.seq_lens, case.page_table)[:, : ref.shape[1]]
        for _ in range(3)
    ]
    out = runs[0]
    valid = torch.isfinite(ref)
    got = out[valid]
    diff = calc_diff(got, ref[valid])
    finite = bool(torch.isfinite(got).all())
    # Determinism is asked of what the top-k reads: a scorer that leaves columns past the last
    # page unwritten (TileLang's ``new_empty``) hands back whatever the allocator held there.
    same = all(torch.equal(got, r[valid]) for r in runs[1:])
    past = out[~valid]
    same_past = all(torch.equal(past.nan_to_num(0.0), r[~valid].nan_to_num(0.0)) for r in runs[1:])
    if past.numel() == 0 or bool(torch.isneginf(past).all()):
        mask = "-inf past seq_len"
    elif bool((past == 0).all()):
        mask = "0 past seq_len (clean_logits=False; the top-k's seq_len mask must drop them)"
    else:
        mask = "unmasked values past seq_len (the top-k's seq_len mask must drop them)"
    ok = diff < SCORER_BOUND and finite and same
    detail = (
        f"calc_diff {diff:.2e} vs fp64 oracle on its dequantized stored keys (bound {SCORER_BOUND:.0e}); "
        f"{'finite' if finite else 'NON-FINITE'}; reruns {'bitwise identical' if same else 'DIFFER'} on valid columns"
        f"{'' if same_past else ' (past seq_len they differ: columns the scorer leaves unwritten)'}; {mask}"
    )
    return Check(
        name or f"{fmt} scorer",
        label,
        "pass" if ok else "fail",
        detail,
        fp8_path,
        {
            "calc_diff": diff,
            "finite": finite,
            "deterministic": same,
            "deterministic_past_len": same_past,
            "mask": mask,
            "rows": int(case.seq_lens.numel()),
        },
    )


def scorer_fn(found, fmt: str) -> ScoreFn:
    """A loaded paged-logits kernel (``verify.core.upstream.Found``) called as the indexer calls it."""
    from .gpu_backend import call_paged_scorer

    def fn(pool, q8, w, seq, pt):
        return call_paged_scorer(found, fmt, pool, q8, w, seq, pt)

    return fn


def backend_score_fn(backend: Backend, fmt: str) -> ScoreFn:
    def fn(pool, q8, w, seq, pt):
        idx = torch.arange(q8.shape[0], device=q8.device)
        return backend.score(fmt, pool, q8, w, idx, seq, pt)

    return fn


# ---------------------------------------------------------------------------------------------
# top-k and CUDA graphs
# ---------------------------------------------------------------------------------------------


def check_topk(backend: Backend, label: str) -> Check:
    dev = backend.device
    g = torch.Generator().manual_seed(31)
    topk = 512
    lens = [100, topk, topk + 1, 3000, 9000]
    width = 9024
    logits = torch.randint(0, 64, (len(lens), width), generator=g).float().to(dev)  # massive ties
    logits[3, :1000] = torch.randn(1000, generator=g).to(dev)  # and one row without
    pages = width // F.PAGE_SLOTS
    pt = torch.stack([torch.randperm(4 * pages, generator=g)[:pages] for _ in lens]).to(torch.int32).to(dev)
    seq = torch.tensor(lens, dtype=torch.int32, device=dev)
    sel = backend.select(logits, seq, pt, topk)
    m = row_metrics(logits, seq, topk, sel)
    recall = m["recall_tie"].tolist()
    seq_ok = all(
        sel[i, :n].tolist() == list(range(n)) and bool((sel[i, n:] == -1).all())
        for i, n in enumerate(lens)
        if n <= topk
    )
    mism = int(getattr(backend, "stats", {}).get("topk_translation_mismatch", 0))
    ok = min(recall) == 1.0 and seq_ok and mism == 0
    detail = f"tie-aware recall on its own logits {min(recall):.4f} (min over rows, ties planted); short rows sequential: {seq_ok}; slot translation mismatches: {mism}"
    return Check(
        "top-k selection",
        label,
        "pass" if ok else "fail",
        detail,
        True,
        {"recall_tie": recall, "sequential_ok": seq_ok, "translation_mismatch": mism},
    )


def check_graph_replay(backend: Backend, fmt: str, label: str, case: ScoreCase) -> Check:
    """Capture scorer + top-k with every row at 200 keys, replay with the real lengths, compare with
    eager: catches shortcuts decided at capture time (vllm #52492)."""
    dev = backend.device
    topk = 512
    seq_static = case.seq_lens.clone()
    pool, q8, w, pt = case.pool[fmt], case.q8, case.w, case.page_table
    idx = torch.arange(q8.shape[0], device=dev)

    def step():
        lg = backend.score(fmt, pool, q8, w, idx, seq_static, pt)
        return lg, backend.select(lg, seq_static, pt, topk)

    seq_static.fill_(200)
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream(dev).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lg_g, sel_g = step()
    seq_static.copy_(case.seq_lens)
    graph.replay()
    torch.cuda.synchronize(dev)
    lg_e, _ = step()
    valid = mask_past_len(torch.zeros_like(lg_e), case.seq_lens) == 0
    diff = calc_diff(lg_g[valid], lg_e[valid])
    recall = float(row_metrics(lg_e, case.seq_lens, topk, sel_g)["recall_tie"].min())
    ok = diff < 1e-12 and recall == 1.0
    detail = f"graph captured at 200 keys/row, replayed at {case.seq_lens.tolist()}: logits calc_diff {diff:.1e} vs eager, selection tie-aware recall {recall:.4f}"
    return Check(
        f"{fmt} scorer + top-k under CUDA-graph replay",
        label,
        "pass" if ok else "fail",
        detail,
        fmt == "fp8",
        {"calc_diff": diff, "recall_tie_min": recall},
    )


# ---------------------------------------------------------------------------------------------
# DeepGEMM (crash-prone on the project's machine: always in a subprocess)
# ---------------------------------------------------------------------------------------------


def _deepgemm_probe_main() -> None:
    dev = torch.device("cuda")
    import deep_gemm

    case = score_case(dev, 4096)

    found = Found(deep_gemm.fp8_paged_mqa_logits, "deep_gemm.fp8_paged_mqa_logits")
    chk = check_scorer("fp8", found.name, scorer_fn(found, "fp8"), case, True)
    print("PROBE " + json.dumps(asdict(chk)))


def check_deepgemm(timeout_s: int = 600) -> Check:
    label = "deep_gemm.fp8_paged_mqa_logits"
    try:
        import importlib.util

        if importlib.util.find_spec("deep_gemm") is None:
            return Check("fp8 scorer", label, "skipped", "deep_gemm not installed")
    except BaseException as exc:  # noqa: BLE001
        return Check("fp8 scorer", label, "skipped", f"deep_gemm not importable: {exc}")
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "verify.recall.diagnose", "--deepgemm-probe"],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=str(repo),
        )
    except subprocess.TimeoutExpired:
        return Check("fp8 scorer", label, "skipped", f"probe timed out after {timeout_s} s")
    for line in proc.stdout.splitlines():
        if line.startswith("PROBE "):
            return Check(**json.loads(line[6:]))
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    # A crash is not a wrong answer: it is reported, and the verdict rests on the paths that ran.
    return Check("fp8 scorer", label, "skipped", f"probe crashed ({how}): {' | '.join(tail)}"[:400])


# ---------------------------------------------------------------------------------------------
# end to end and verdict
# ---------------------------------------------------------------------------------------------


def _mean(vals: Sequence[float]) -> float:
    v = [x for x in vals if x is not None and not math.isnan(x)]
    return sum(v) / len(v) if v else float("nan")


def choosing(records: Sequence[Mapping[str, Any]], arm: str) -> list[Mapping[str, Any]]:
    """Rows of ``arm`` where the indexer has to choose (more visible keys than k)."""
    return [r for r in records if r["arm"] == arm and int(r["seq_len"]) > int(r["k"])]


def check_end_to_end(records: Sequence[Mapping[str, Any]]) -> Check:
    prod, emu = choosing(records, "fp8"), choosing(records, "fp8_emul")
    if not prod or not emu:
        return Check(
            "fp8 end to end (tier 2)",
            "fp8 store + scorer + top-k",
            "skipped",
            "no fp8_emul control arm in this run",
        )
    rp, re_ = _mean([float(r["recall_tie"]) for r in prod]), _mean([float(r["recall_tie"]) for r in emu])

    def key(r: Mapping[str, Any]) -> tuple:
        return (str(r.get("source")), r["length_tokens"], r["row"])

    emu_hit = {key(r): r.get("needle_hit") for r in records if r["arm"] == "fp8_emul"}
    lost = sum(
        1
        for r in records
        if r["arm"] == "fp8"
        and r.get("gated") == 1.0
        and r.get("needle_hit") != 1.0
        and emu_hit.get(key(r)) == 1.0
    )
    # The torch scorer rounds per-head dots to bf16 and the kernels sum in another order, so the
    # production arm may differ from the emulation by near-tie flips; a layout or graph bug costs
    # far more than 0.5% of the top-k.
    ok = rp >= re_ - 0.005 and lost == 0
    detail = f"production fp8 tie-aware recall {rp:.4f} vs emulated fp8 {re_:.4f} on identical inputs; gated needles the emulation keeps but production loses: {lost}"
    return Check(
        "fp8 end to end (tier 2)",
        "fp8 store + scorer + top-k",
        "pass" if ok else "fail",
        detail,
        True,
        {"recall_prod": rp, "recall_emul": re_, "needles_lost_vs_emul": lost},
    )


def verdict(
    checks: Sequence[Check], records: Sequence[Mapping[str, Any]], emulated: bool, faults: Sequence[str] = ()
) -> str:
    fails = [c for c in checks if c.fp8_path and c.status == "fail"]
    injected = f" [faults injected on purpose: {', '.join(faults)}]" if faults else ""
    if fails:
        kernels = ", ".join(dict.fromkeys(f"{c.kernel} ({c.name})" for c in fails))
        return f"fp8 path disagrees with its own oracle: bug in {kernels}{injected}"
    ran = [c for c in checks if c.fp8_path and c.status == "pass"]
    errored = [c for c in checks if c.fp8_path and c.status == "error"]
    if errored:
        injected += f" [{len(errored)} fp8 check(s) could not run: {', '.join(c.name for c in errored)}]"
    prefix = (
        "CPU emulation only (no production kernel ran; it agrees with itself by construction -- run --backend gpu on the affected machine): "
        if emulated
        else ""
    )
    if not ran:
        return prefix + "fp8 path not tested: no fp8 check could run (see diagnosis.checks)"
    fp8, bf16 = choosing(records, "fp8"), choosing(records, "bf16")
    if not fp8:
        return (
            prefix
            + f"fp8 path correct ({len(ran)} checks passed); no tier-2 rows where the indexer must choose"
        )
    loss = 1 - _mean([float(r["recall_tie"]) for r in fp8])
    loss_b = 1 - _mean([float(r["recall_tie"]) for r in bf16]) if bf16 else float("nan")
    g = [r for r in records if r["arm"] == "fp8" and r.get("gated") == 1.0]
    kept = sum(1 for r in g if r.get("needle_hit") == 1.0)
    return (
        prefix + f"fp8 path correct, loses {100 * loss:.2f}% of top-k to precision "
        f"(mean over {len(fp8)} rows where the indexer must choose; bf16 loses {100 * loss_b:.2f}%; "
        f"needles kept at >=1% margin: fp8 {kept}/{len(g)}; {len(ran)} fp8 path checks passed)" + injected
    )


def run(backend: Backend, records: Sequence[Mapping[str, Any]] = (), quick: bool = False) -> Diagnosis:
    emulated = isinstance(backend, EmulationBackend)
    dev = backend.device
    gpu = dev.type == "cuda"
    long_len = 2048 if (quick or not gpu) else 8192
    checks: list[Check] = []
    store_label = backend.paths.get("store_fp8", "fp8 store")
    checks.append(
        _guard(
            "fp8 index-K store",
            store_label,
            lambda: check_fp8_store(backend, 4096 if gpu else 1024, store_label),
        )
    )
    if gpu and not emulated:
        checks.append(
            _guard(
                "fp8 fused norm+rope+hadamard store",
                "compress_norm_rope_store",
                lambda: check_fused_norm_rope_store(dev),
            )
        )
    checks.append(
        _guard(
            "bf16 index-K store",
            backend.paths.get("store_bf16", "bf16 store"),
            lambda: check_bf16_store(backend, 1024, backend.paths.get("store_bf16", "bf16 store")),
            fp8_path=False,
        )
    )
    checks.append(
        _guard(
            "fp8 q quantization",
            backend.paths.get("q", "q"),
            lambda: check_q(backend, backend.paths.get("q", "q")),
        )
    )
    case = score_case(dev, long_len)
    checks.append(
        _guard(
            "fp8 scorer",
            backend.paths.get("score_fp8", "fp8 scorer"),
            lambda: check_scorer(
                "fp8",
                backend.paths.get("score_fp8", "fp8 scorer"),
                backend_score_fn(backend, "fp8"),
                case,
                True,
            ),
        )
    )
    checks.append(
        _guard(
            "bf16 scorer",
            backend.paths.get("score_bf16", "bf16 scorer"),
            lambda: check_scorer(
                "bf16",
                backend.paths.get("score_bf16", "bf16 scorer"),
                backend_score_fn(backend, "bf16"),
                case,
                False,
            ),
            fp8_path=False,
        )
    )
    if gpu and not emulated:
        in_use = backend.paths.get("score_fp8", "")
        if not in_use.startswith("deep_gemm"):
            checks.append(check_deepgemm())
    checks.append(
        _guard(
            "top-k selection",
            backend.paths.get("select", "top-k"),
            lambda: check_topk(backend, backend.paths.get("select", "top-k")),
        )
    )
    checks += hazard_checks(backend)
    if gpu and not emulated:
        checks += other_scorer_checks(backend, case)
    if gpu:
        for fmt in ("fp8", "bf16"):
            label = backend.paths.get(f"score_{fmt}", fmt) + " + " + backend.paths.get("select", "top-k")
            checks.append(
                _guard(
                    f"{fmt} scorer + top-k under CUDA-graph replay",
                    label,
                    partial(check_graph_replay, backend, fmt, label, case),
                    fp8_path=fmt == "fp8",
                )
            )
    if records:
        checks.append(check_end_to_end(records))
    agree = [float(r["agree_bf16"]) for r in choosing(records, "fp8") if r.get("agree_bf16") is not None]
    return Diagnosis(
        verdict(checks, records, emulated, backend.faults),
        checks,
        emulated,
        _mean(agree) if agree else None,
        oracle_recall(records),
    )


ORACLE_FIELDS = {"same-q": "recall_tie", "exact-q": "recall_tie_unq", "reference": "recall_tie_ref"}
#: the reference selection's own recall against the same-q and exact-q oracles
REFERENCE_FIELDS = {"same-q": "ref_recall_tie", "exact-q": "ref_recall_tie_unq"}


def oracle_recall(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]] | None:
    """Each arm's mean tie-aware recall against each oracle over the rows where the indexer must
    choose, and the reference's own selection against the same-q / exact-q oracles; None when
    the records carry no reference oracle (a capture without the unquantized q)."""
    if not any(r.get("recall_tie_ref") is not None for r in records):
        return None
    arms = list(dict.fromkeys(str(r["arm"]) for r in records))
    out: dict[str, dict[str, float]] = {}
    for oracle, field_name in ORACLE_FIELDS.items():
        out[oracle] = {
            a: _mean([float(r[field_name]) for r in choosing(records, a) if r.get(field_name) is not None])
            for a in arms
        }
    first = choosing(records, arms[0])
    for oracle, field_name in REFERENCE_FIELDS.items():
        out[oracle]["reference"] = _mean(
            [float(r[field_name]) for r in first if r.get(field_name) is not None]
        )
    out["reference"]["reference"] = 1.0
    return out


def oracle_lines(table: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The diagnosis's oracle figures for summary.md, one line per oracle."""
    return [
        f"- mean tie-aware recall vs the {oracle} oracle (rows where the indexer must choose): "
        + ", ".join(f"{arm} {v:.4f}" for arm, v in by_arm.items())
        for oracle, by_arm in table.items()
    ]


OTHER_FP8_SCORERS = ("score_tilelang", "score_torch_sm120", "score_torch", "score_deepgemm")


def other_scorer_checks(backend: Backend, case: ScoreCase) -> list[Check]:
    """Every fp8 scorer upstream has for CUDA (not only the profile's), each against its oracle and
    then through the profile's top-k over the hazard case: reported, not part of the verdict."""
    from . import hazards as H
    from .gpu_backend import call_paged_scorer, load_scorer

    out: list[Check] = []
    in_use = backend.paths.get("score_fp8", "")
    for role in OTHER_FP8_SCORERS:
        got = load_scorer(role)
        if isinstance(got, Missing):
            out.append(Check("other fp8 scorer", role, "skipped", got.reason, False))
            continue
        if got.name == in_use:
            continue
        if got.name.startswith("deep_gemm"):  # a real DeepGEMM runs only in the isolated probe below
            continue

        def other(got: Found = got) -> Check:
            return check_scorer("fp8", got.name, scorer_fn(got, "fp8"), case, False, name="other fp8 scorer")

        out.append(_guard("other fp8 scorer", got.name, other, False))

        def hazards(got: Found = got) -> Check:
            res = H.check_scorer_then_topk(
                "fp8",
                store=lambda pool, slots, keys: backend.store("fp8", pool, slots, keys),
                new_pool=lambda n: backend.new_pool("fp8", n),
                score=lambda pool, q8, w, seq, pt: call_paged_scorer(got, "fp8", pool, q8, w, seq, pt),
                select=backend.select,
                quantize_q=lambda q, w: F.quantize_q(q, w, 1.0),
                device=backend.device,
            )
            return Check(
                "other fp8 scorer then top-k (hazards)",
                got.name,
                "pass" if res["ok"] else "fail",
                str(res["detail"]),
                False,
                res,
            )

        out.append(_guard("other fp8 scorer then top-k (hazards)", got.name, hazards, False))
    return out


def hazard_checks(backend: Backend) -> list[Check]:
    """The read-side hazards (:mod:`verify.recall.hazards`) with the backend's scorer and top-k."""
    from . import hazards as H

    dev = backend.device
    select_label = backend.paths.get("select", "top-k")
    out: list[Check] = []

    def topk_tails() -> Check:
        res = H.check_topk_poisoned_tails(backend.select, dev)
        return Check(
            "top-k over poisoned tails",
            select_label,
            "pass" if res["ok"] else "fail",
            str(res["detail"]),
            True,
            res,
        )

    out.append(_guard("top-k over poisoned tails", select_label, topk_tails))
    for fmt in ("fp8", "bf16"):
        label = backend.paths.get(f"score_{fmt}", fmt) + " + " + select_label

        def scorer_topk(fmt: str = fmt, label: str = label) -> Check:
            res = H.check_scorer_then_topk(
                fmt,
                store=lambda pool, slots, keys: backend.store(fmt, pool, slots, keys),
                new_pool=lambda n: backend.new_pool(fmt, n),
                score=lambda pool, q8, w, seq, pt: backend.score(
                    fmt, pool, q8, w, torch.arange(q8.shape[0], device=dev), seq, pt
                ),
                select=backend.select,
                quantize_q=lambda q, w: F.quantize_q(q, w, 1.0),
                device=dev,
            )
            return Check(
                f"{fmt} scorer then top-k (hazards)",
                label,
                "pass" if res["ok"] else "fail",
                str(res["detail"]),
                fmt == "fp8",
                res,
            )

        out.append(_guard(f"{fmt} scorer then top-k (hazards)", label, scorer_topk, fp8_path=fmt == "fp8"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m verify.recall.diagnose", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--backend", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument("--fp8-scorer", default="auto")
    ap.add_argument(
        "--platform",
        default="auto",
        help="profile whose fp8 path is diagnosed: auto (the local GPU's), sm90, sm100, sm120, hip",
    )
    ap.add_argument(
        "--forward",
        type=Path,
        nargs="+",
        default=None,
        help="forward-tier results folders (python -m verify.forward) to fold into the verdicts; "
        "in order, a later run of the same arm replaces an earlier one",
    )
    ap.add_argument(
        "--refold",
        type=Path,
        default=None,
        help="a diagnosis.json a GPU run wrote: fold --forward into its measured checks again "
        "(no kernel runs; the checks, paths and profiles are the file's)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write diagnosis.json and diagnosis.md here")
    ap.add_argument("--deepgemm-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.deepgemm_probe:
        _deepgemm_probe_main()
        return 0
    from verify.core import platform as P
    from verify.core.provenance import SERIES_HASH, series_hash

    from .backend_choice import make_backend
    from .verdicts import component_verdicts, render

    forward = None
    if args.forward:
        from verify.core.forward_runs import merge_runs

        found = [d for d in args.forward if (d / "results.json").exists()]
        forward = merge_runs(found) if found else None
    refolded: dict[str, Any] | None = None
    if args.refold is not None:
        measured = json.loads(args.refold.read_text())
        profile, paths = measured["platform"], measured["paths"]
        d = measured["diagnosis"]
        diag = Diagnosis(
            d["verdict"], [Check(**c) for c in d["checks"]], d["emulated"], d.get("topk_agreement_fp8_bf16")
        )
        # older files did not record the machine; their component list names the hardware a
        # profile was not measured on
        local = measured.get(
            "local_profile",
            profile
            if not any(c["component"].endswith("hardware itself") for c in measured["components"])
            else None,
        )
        refolded = {"checks_from": str(args.refold), "forward_from": [str(f) for f in args.forward or []]}
        applied = measured.get(SERIES_HASH)  # the checks are that run's: its series, not this checkout's
    else:
        if args.backend == "cpu" and args.platform == "auto":
            args.platform = P.local_profile() or "sm90"
        profile = P.resolve(args.platform)
        backend = make_backend(args.backend, (), args.fp8_scorer, platform=profile)
        diag = run(backend)
        paths, local, applied = backend.paths, P.local_profile(), series_hash()
    for c in diag.checks:
        print(f"[{c.status:7}] {c.name} -- {c.kernel}: {c.detail}")
    print(diag.verdict)
    lines = component_verdicts(profile, diag, paths, forward, local=local)
    text = render(profile, lines, diag)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "diagnosis.json").write_text(
            json.dumps(
                {
                    "platform": profile,
                    "local_profile": local,
                    "diagnosis": diag.to_dict(),
                    "paths": paths,
                    "components": [line.__dict__ for line in lines],
                    SERIES_HASH: applied,
                    **({"refolded": refolded} if refolded else {}),
                },
                indent=1,
                default=str,
            )
        )
        (args.out / "diagnosis.md").write_text(text)
    return 1 if any(line.status == "fail" for line in lines) else 0


if __name__ == "__main__":
    raise SystemExit(main())
