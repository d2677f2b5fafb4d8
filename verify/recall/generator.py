"""Seeded generator of structured index keys and queries with a planted needle.

Structure, and why each piece is there:

* keys = RMSNorm-like rows of (topic component + noise) with a few outlier channels, scaled by
  heavy-tailed (log-normal) norms with rare "sink" keys, then RoPE on the last 64 dims at the
  key's position and a 128-point Hadamard rotation -- the pipeline real index keys go through, so
  fp8's per-key scale sees realistic value distributions;
* topics follow a Zipf law and queries focus on one, so many keys compete for the top-k and the
  scores near the selection boundary are dense (the regime where rounding flips members);
* near-duplicate keys (repeated boilerplate) create near-ties everywhere;
* per row, a needle key is planted in a row-private copy of its page, with near-duplicate
  distractors in neighbouring slots, at a controlled oracle score margin ``m``, measured in units
  of the row's score scale ``S`` = the best non-needle oracle score:
  ``mode="top"``: ``s_needle = S * (1 + m)`` (m is the relative margin over the best other key);
  ``mode="boundary"``: ``s_needle = s_ref + m * S`` with ``s_ref`` the best key the oracle does not
  select (the k-th best other key), i.e. just inside the top-k. (Relative to ``|s_ref|`` itself the
  margin would be degenerate: selection boundaries sit in the bulk of the scores, typically at
  1-4% of ``S`` and often below zero);
* needles sit at depths 0..100% of the row's visible keys and at every key position mod 4;
* "prefill" rows see only a prefix of the keys (later keys exist but are masked);
* slots past a sequence's end in its last page, and an extra page-table column, hold huge
  "poison" keys: only a scorer or selection that ignores ``seq_lens`` picks them.

Everything random is drawn on the CPU from seeds derived from (seed, length, ...), so the same
seed gives the same tensors on any backend. Scores for planting are computed on the problem's
device with the oracle math.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from verify.core.formats import HEAD_DIM, PAGE_SLOTS
from verify.core.scoring import SlotKeys, score_slots

from .backend import QueryInputs

N_HEADS = 64
ROPE_DIM = 64
#: upstream's indexer weight scale: 128**-0.5 * n_heads**-0.5
WEIGHT_SCALE = HEAD_DIM**-0.5 * N_HEADS**-0.5


@dataclass(frozen=True)
class GenConfig:
    seed: int = 0
    n_topics: int = 24
    topic_zipf: float = 1.1
    topic_strength: float = 1.5
    outlier_channels: int = 6
    outlier_gain: float = 6.0
    norm_log_sigma: float = 0.45
    sink_fraction: float = 0.002
    sink_gain: float = 3.0
    dup_fraction: float = 0.06
    dup_noise: float = 0.02
    dup_window: int = 256
    distractors: int = 4
    distractor_noise: float = 0.08
    query_noise: float = 1.0
    weight_mean: float = 0.3
    rope_theta: float = 160000.0
    poison_gain: float = 8.0


@dataclass(frozen=True)
class PlanConfig:
    """Which rows to build per length."""

    topks: tuple[int, ...] = (512, 1024)
    depths: tuple[float, ...] = (0.0, 0.10, 0.25, 0.50, 0.75, 0.90, 1.0)
    #: "all": every residue mod 4 at every depth; "staggered": two per depth, all four overall
    residues: str = "all"
    margins: tuple[float, ...] = (0.002, 0.01, 0.05, 0.20)
    modes: tuple[str, ...] = ("top", "boundary")
    sequences: int = 2
    #: prefill groups per length: visible prefix fractions (depths 10/50/90% of that prefix)
    prefill_fractions: tuple[float, ...] = (0.6, 0.8, 0.95)


@dataclass
class Problem:
    """One length's keys, pages, queries and rows. Tensors live on ``device``."""

    length_tokens: int
    n_keys: int
    keys_ref: torch.Tensor  # [num_slots, 128] fp32 unrounded keys by physical slot
    written_slots: torch.Tensor  # [W] int64: slots every arm stores (others stay zero)
    canary_pages: torch.Tensor  # [C] int64: pages nothing may write
    page_table: torch.Tensor  # [R, P] int32
    seq_lens: torch.Tensor  # [R] int32 visible keys per row
    topk: torch.Tensor  # [R] int64
    q_index: torch.Tensor  # [R] int64 row -> query
    needle_pos: torch.Tensor  # [R] int64, -1 = no needle
    queries: QueryInputs
    rows: list[dict[str, Any]]  # per-row metadata (length, depth, residue, margin, mode, kind...)
    # synthetic-only bookkeeping for planting
    private_page: torch.Tensor | None = None  # [R] int64 physical page private to the row
    seq_slots: list[torch.Tensor] = field(default_factory=list)  # per sequence: [n] slot of key j
    q_fp8: torch.Tensor | None = None  # [Q,H,128] e4m3, set by the backend (or a capture)
    w: torch.Tensor | None = None  # [Q,H] fp32 folded weights
    source: str = "synthetic"

    @property
    def num_pages(self) -> int:
        return self.keys_ref.shape[0] // PAGE_SLOTS

    @property
    def num_rows(self) -> int:
        return int(self.seq_lens.shape[0])


def derive_seed(*parts: object) -> int:
    """Stable 63-bit seed from any printable parts (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _gen(*parts: object) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(*parts))
    return g


def hadamard(n: int = HEAD_DIM) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix (the order the kernels' butterflies produce)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).float()


def rope_cos_sin(positions: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N]`` positions -> (cos, sin) ``[N, 32]`` fp32 for the 32 (real, imag) pairs of the tail."""
    inv_freq = theta ** (-torch.arange(0, ROPE_DIM, 2, dtype=torch.float64) / ROPE_DIM)
    ang = positions.double().unsqueeze(-1) * inv_freq
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope_hadamard(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the last 64 dims ((real, imag) interleaved pairs) then Hadamard, in fp32.

    ``x [..., N?, 128]`` with cos/sin broadcastable to ``[..., 32]``.
    """
    x = x.float().clone()
    re = x[..., HEAD_DIM - ROPE_DIM :: 2].clone()
    im = x[..., HEAD_DIM - ROPE_DIM + 1 :: 2].clone()
    x[..., HEAD_DIM - ROPE_DIM :: 2] = re * cos - im * sin
    x[..., HEAD_DIM - ROPE_DIM + 1 :: 2] = re * sin + im * cos
    return x @ hadamard().to(x.device)


def needle_position(depth: float, residue: int, seq_len: int) -> int:
    """Key index at ``depth`` of ``seq_len`` visible keys with ``index % 4 == residue``:
    the nearest such index at or below round(depth * (seq_len - 1)), else the first above."""
    p0 = round(depth * (seq_len - 1))
    p = p0 - ((p0 - residue) % 4)
    if p < 0:
        p += 4
    if p >= seq_len:
        raise ValueError(f"no key with residue {residue} among {seq_len}")
    return p


def _zipf_probs(n: int, s: float) -> torch.Tensor:
    p = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** s
    return p / p.sum()


def _topics(cfg: GenConfig, length: int, seq: int) -> torch.Tensor:
    t = torch.randn(cfg.n_topics, HEAD_DIM, generator=_gen(cfg.seed, "topics", length, seq))
    return t / t.pow(2).mean(-1, keepdim=True).sqrt()


def make_haystack(cfg: GenConfig, length: int, seq: int, n: int) -> torch.Tensor:
    """``[n, 128]`` fp32 rotated keys of one sequence (see module docstring)."""
    g = _gen(cfg.seed, "haystack", length, seq)
    topics = _topics(cfg, length, seq)
    t_idx = torch.multinomial(_zipf_probs(cfg.n_topics, cfg.topic_zipf), n, replacement=True, generator=g)
    coef = 1.0 + 0.3 * torch.randn(n, 1, generator=g)
    x = cfg.topic_strength * coef * topics[t_idx] + torch.randn(n, HEAD_DIM, generator=g)
    gains = torch.ones(HEAD_DIM)
    gains[torch.randperm(HEAD_DIM, generator=g)[: cfg.outlier_channels]] = cfg.outlier_gain
    x = x * gains
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()  # RMSNorm: unit RMS before the norm spread
    norms = torch.exp(cfg.norm_log_sigma * torch.randn(n, 1, generator=g))
    sinks = torch.rand(n, 1, generator=g) < cfg.sink_fraction
    x = x * norms * torch.where(sinks, cfg.sink_gain, 1.0)
    cos, sin = rope_cos_sin(torch.arange(n) * 4, cfg.rope_theta)
    k = rope_hadamard(x, cos, sin)
    # near-duplicates of a recent key, after rotation: near-ties in score
    dup = (torch.rand(n, generator=g) < cfg.dup_fraction).nonzero(as_tuple=True)[0]
    dup = dup[dup > 0]
    src = (dup - torch.randint(1, cfg.dup_window + 1, dup.shape, generator=g)).clamp(min=0)
    rms = k[src].pow(2).mean(-1, keepdim=True).sqrt()
    k[dup] = k[src] + cfg.dup_noise * rms * torch.randn(dup.numel(), HEAD_DIM, generator=g)
    return k


def make_query(
    cfg: GenConfig, length: int, seq: int, group: int, position: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_pre ``[H,128]`` bf16 before RoPE/Hadamard, w_raw ``[H]`` bf16) for one query group."""
    g = _gen(cfg.seed, "query", length, seq, group)
    topics = _topics(cfg, length, seq)
    focus = int(torch.multinomial(_zipf_probs(cfg.n_topics, cfg.topic_zipf), 1, generator=g))
    other = int(torch.randint(cfg.n_topics, (1,), generator=g))
    a = 1.0 + 0.5 * torch.randn(N_HEADS, 1, generator=g)
    b = 0.5 * torch.randn(N_HEADS, 1, generator=g)
    q = a * topics[focus] + b * topics[other] + cfg.query_noise * torch.randn(N_HEADS, HEAD_DIM, generator=g)
    w = cfg.weight_mean + torch.randn(N_HEADS, generator=g)
    return q.to(torch.bfloat16), w.to(torch.bfloat16)


def _groups(plan: PlanConfig, n: int) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for di, depth in enumerate(plan.depths):
        residues = range(4) if plan.residues == "all" else sorted({di % 4, (di + 2) % 4})
        for r in residues:
            groups.append({"kind": "decode", "depth": depth, "residue": r, "seq_len": n})
    prefill_depths = (0.10, 0.50, 0.90)
    for i, frac in enumerate(plan.prefill_fractions):
        seq_len = max(8, round(n * frac))
        groups.append(
            {"kind": "prefill", "depth": prefill_depths[i % 3], "residue": i % 4, "seq_len": seq_len}
        )
    for gi, grp in enumerate(groups):
        grp["group"] = gi
        grp["seq_id"] = gi % plan.sequences
    return groups


def build_problem(
    length_tokens: int, plan: PlanConfig, cfg: GenConfig, device: torch.device | str = "cpu"
) -> Problem:
    """Keys, pages, queries and row plan for one length; needles are planted later by
    :func:`plant_needles`, once the backend has produced the fp8 q the oracle uses."""
    n = length_tokens // 4
    if n < 8:
        raise ValueError(f"length {length_tokens} gives only {n} keys")
    groups = _groups(plan, n)
    rows: list[dict[str, Any]] = []
    for grp in groups:
        seq_len = int(grp["seq_len"])
        pos = needle_position(float(grp["depth"]), int(grp["residue"]), seq_len)
        for topk in plan.topks:
            for mode in plan.modes:
                for margin in plan.margins:
                    rows.append(
                        {
                            **grp,
                            "length_tokens": length_tokens,
                            "n_keys": n,
                            "topk": topk,
                            "k": min(topk, seq_len),
                            "mode": mode,
                            "margin": margin,
                            "needle_pos": pos,
                        }
                    )
    num_rows = len(rows)
    pages_per_seq = -(-n // PAGE_SLOTS)
    n_canary = 2
    # logical page ids: [canary..., poison, seq0 pages, seq1 pages, ..., row-private pages]
    total_pages = n_canary + 1 + plan.sequences * pages_per_seq + num_rows
    perm = torch.randperm(total_pages, generator=_gen(cfg.seed, "pages", length_tokens))
    canary = perm[:n_canary]
    poison_page = int(perm[n_canary])
    seq_pages = [
        perm[n_canary + 1 + s * pages_per_seq : n_canary + 1 + (s + 1) * pages_per_seq]
        for s in range(plan.sequences)
    ]
    private = perm[n_canary + 1 + plan.sequences * pages_per_seq :]

    keys = torch.zeros(total_pages * PAGE_SLOTS, HEAD_DIM)
    written: list[torch.Tensor] = []
    ar = torch.arange(PAGE_SLOTS)
    seq_slots: list[torch.Tensor] = []
    poison_dir: torch.Tensor | None = None
    for s in range(plan.sequences):
        hay = make_haystack(cfg, length_tokens, s, n)
        slots = (seq_pages[s].unsqueeze(1) * PAGE_SLOTS + ar).flatten()
        keys[slots[:n]] = hay
        if poison_dir is None:
            poison_dir = hay[hay.norm(dim=1).argmax()] * cfg.poison_gain
        keys[slots[n:]] = poison_dir  # stale huge keys past the end of the last page
        written.append(slots)
        seq_slots.append(slots[:n])
    assert poison_dir is not None
    poison_slots = poison_page * PAGE_SLOTS + ar
    keys[poison_slots] = poison_dir
    written.append(poison_slots)

    page_table = torch.empty(num_rows, pages_per_seq + 1, dtype=torch.int32)
    for i, row in enumerate(rows):
        s = int(row["seq_id"])
        lp = int(row["needle_pos"]) // PAGE_SLOTS
        table = seq_pages[s].clone()
        priv = int(private[i])
        keys[priv * PAGE_SLOTS + ar] = keys[int(table[lp]) * PAGE_SLOTS + ar]  # copy, plant later
        table[lp] = priv
        page_table[i, :pages_per_seq] = table
        page_table[i, pages_per_seq] = poison_page  # an extra column a scorer must mask
        row["private_page"] = priv
        written.append(priv * PAGE_SLOTS + ar)

    q_pre_l, w_l, pos_l = [], [], []
    for grp in groups:
        position = 4 * int(grp["seq_len"])
        q, w = make_query(cfg, length_tokens, int(grp["seq_id"]), int(grp["group"]), position)
        q_pre_l.append(q)
        w_l.append(w)
        pos_l.append(position)
    q_pre = torch.stack(q_pre_l)
    cos, sin = rope_cos_sin(torch.tensor(pos_l), cfg.rope_theta)
    q_rot = rope_hadamard(q_pre, cos.unsqueeze(1), sin.unsqueeze(1))
    dev = torch.device(device)
    queries = QueryInputs(
        q_pre=q_pre.to(dev),
        cos=cos.to(dev),
        sin=sin.to(dev),
        q_rot=q_rot.to(dev),
        w_raw=torch.stack(w_l).to(dev),
        weight_scale=WEIGHT_SCALE,
    )
    return Problem(
        length_tokens=length_tokens,
        n_keys=n,
        keys_ref=keys.to(dev),
        written_slots=torch.cat(written).long().to(dev),
        canary_pages=canary.long().to(dev),
        page_table=page_table.to(dev),
        seq_lens=torch.tensor([int(r["seq_len"]) for r in rows], dtype=torch.int32, device=dev),
        topk=torch.tensor([int(r["topk"]) for r in rows], dtype=torch.int64, device=dev),
        q_index=torch.tensor([int(r["group"]) for r in rows], dtype=torch.int64, device=dev),
        needle_pos=torch.tensor([int(r["needle_pos"]) for r in rows], dtype=torch.int64, device=dev),
        queries=queries,
        rows=rows,
        private_page=private.long().to(dev),
        seq_slots=[s.to(dev) for s in seq_slots],
    )


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm().clamp(min=1e-30)


def _kth_largest(x: torch.Tensor, k: int) -> float:
    return float(torch.topk(x, k).values[-1])


def plant_needles(problem: Problem, cfg: GenConfig) -> None:
    """Write each row's needle and distractors into its private page at the asked margin.

    Needs ``problem.q_fp8`` / ``problem.w`` (the production q): the margin is defined on the
    oracle, which scores unrounded keys with that same q. Scores are positively homogeneous in
    the key (``s(a*k) = a*s(k)`` for a > 0), so a key direction with a positive score is scaled to
    hit any positive target score exactly.
    """
    assert problem.q_fp8 is not None and problem.w is not None and problem.private_page is not None
    dev = problem.keys_ref.device
    ref_keys = SlotKeys(problem.keys_ref, None, "fp32")
    q_deq = problem.q_fp8.float()
    w = problem.w.float()
    ar = torch.arange(PAGE_SLOTS, device=dev)
    hay_cache: dict[int, torch.Tensor] = {}
    dir_cache: dict[int, torch.Tensor] = {}
    hay_norm = [float(problem.keys_ref[sl].norm(dim=1).median()) for sl in problem.seq_slots]

    def s_of(key: torch.Tensor, u: int) -> float:
        return float(torch.relu(q_deq[u].double() @ key.double()) @ w[u].double())

    for i, row in enumerate(problem.rows):
        u = int(row["group"])
        s = int(row["seq_id"])
        seq_len = int(row["seq_len"])
        k = int(row["k"])
        margin = float(row["margin"])
        mode = str(row["mode"])
        pos = int(row["needle_pos"])
        if u not in hay_cache:
            hay_cache[u] = score_slots(ref_keys, problem.seq_slots[s], q_deq[u], w[u])
            g = _gen(cfg.seed, "needle-dir", problem.length_tokens, u)
            head_dirs = q_deq[u] / q_deq[u].norm(dim=1, keepdim=True).clamp(min=1e-30)
            g_dir = _unit((w[u].clamp(min=0).unsqueeze(1) * head_dirs).sum(0))
            rnd = problem.keys_ref[problem.seq_slots[s][int(torch.randint(seq_len, (1,), generator=g))]]
            for a, b in ((0.6, 0.8), (0.8, 0.6), (1.0, 0.0)):
                cand = _unit(a * g_dir + b * _unit(rnd))
                if s_of(cand, u) > 0:
                    break
            dir_cache[u] = cand
        u_dir = dir_cache[u]
        s_u = s_of(u_dir, u)
        priv = int(problem.private_page[i])
        page_lo = (pos // PAGE_SLOTS) * PAGE_SLOTS
        visible = hay_cache[u][:seq_len].clone()
        # distractor positions: the needle's neighbours inside its page and the visible range
        cands = [p for p in range(page_lo, min(page_lo + PAGE_SLOTS, seq_len)) if p != pos]
        dpos = sorted(cands, key=lambda p: (abs(p - pos), p))[: cfg.distractors]
        others = visible.clone()
        others[pos] = float("-inf")
        if dpos:
            others[torch.tensor(dpos, device=dev)] = float("-inf")
        boundary = mode == "boundary" and seq_len > k
        n_others = seq_len - 1 - len(dpos)
        scale0 = float(others.max())
        ref0 = _kth_largest(others, min(k, n_others)) if boundary else scale0
        g = _gen(cfg.seed, "distractors", problem.length_tokens, i)
        if scale0 > 0 and s_u > 0:
            for p in dpos:
                noise = (
                    torch.randn(HEAD_DIM, generator=g).to(dev) * cfg.distractor_noise / math.sqrt(HEAD_DIM)
                )
                d_dir = _unit(u_dir + noise)
                s_d = s_of(d_dir, u)
                delta = float(torch.rand(1, generator=g)) * (2.0 if boundary else 1.0) - 1.0
                target = ref0 + margin * delta * scale0
                if s_d > 0 and target > 0:
                    slot = priv * PAGE_SLOTS + (p - page_lo)
                    problem.keys_ref[slot] = d_dir * (target / s_d)
        # exact scores of the row's private page, then the reference the margin is taken over
        page_slots = priv * PAGE_SLOTS + ar
        page_scores = score_slots(ref_keys, page_slots, q_deq[u], w[u])
        hi = min(page_lo + PAGE_SLOTS, seq_len)
        visible[page_lo:hi] = page_scores[: hi - page_lo]
        others = visible.clone()
        others[pos] = float("-inf")
        scale = float(others.max())
        ref = _kth_largest(others, k) if boundary else scale
        target = ref + margin * abs(scale)
        row["needle_ref_score"] = ref
        row["needle_scale_score"] = scale
        row["boundary_mode_effective"] = boundary
        if target <= 0 or s_u <= 0:
            # A non-positive target cannot be reached by scaling a key with a positive score; the
            # row keeps its haystack key and is reported without a needle.
            row["needle_pos"] = -1
            row["needle_unplaceable"] = True
            problem.needle_pos[i] = -1
            continue
        alpha = target / s_u
        needle = u_dir * alpha
        problem.keys_ref[priv * PAGE_SLOTS + (pos - page_lo)] = needle
        row["needle_norm_ratio"] = float(needle.norm()) / max(hay_norm[s], 1e-30)


def build_planted(
    length_tokens: int,
    plan: PlanConfig,
    cfg: GenConfig,
    quantize_q,
    device: torch.device | str = "cpu",
) -> Problem:
    """:func:`build_problem`, q through ``quantize_q(QueryInputs) -> (q_fp8, w)``, then needles."""
    problem = build_problem(length_tokens, plan, cfg, device)
    problem.q_fp8, problem.w = quantize_q(problem.queries)
    plant_needles(problem, cfg)
    return problem
