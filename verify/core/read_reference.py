"""Pure-torch pieces of the read-parity suite and the read bench (CPU and CUDA alike).

- ``ReadCase`` / ``make_read_case``: a bf16 index-K pool with shuffled pages, queries, head
  weights, lengths and page tables, as the C4 indexer's paged call site hands them over.
  Table entries past a row's pages point at a page full of NaN, so a kernel that reads a key
  it must not read poisons its row.
- ``oracle_logits``: ``sum_h relu(q_h . k) * w_h`` on the stored keys, computed in fp64 (so
  TF32 or reduced-precision matmul settings cannot leak into the reference), returned as fp32.
- ``pack_fp8_pages`` / ``unpack_fp8_pages``: upstream's fp8 index-K page layout (per page
  64 x 128 fp8 e4m3 bytes, then 64 fp32 scales; scale = max(amax, 1e-4) / 448), the input
  of the fp8 twin baseline.
- ``naive_gather_logits``: the gather-then-bmm baseline (what upstream's torch fallbacks do),
  and ``gather_peak_bytes``, its memory, to skip sizes that cannot fit.
- ``make_group_case`` / ``verify_lengths``: MTP verify rows, groups of rows sharing one page
  table with rising lengths (the kernel's ``group_rows`` mode); ``tiles_end``: where a row's
  last key tile ends (what ``clean_logits=False`` writes up to).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

PAGE = 64
DIM = 128
BF16_SLOT_BYTES = DIM * 2
BF16_PAGE_BYTES = PAGE * BF16_SLOT_BYTES
FP8_SLOT_BYTES = DIM + 4
FP8_PAGE_BYTES = PAGE * FP8_SLOT_BYTES
FP8_MAX = 448.0
FP8_SCALE_FLOOR = 1e-4  # fused_norm_rope_v2.cuh: scale = fmaxf(1e-4f, abs_max) / 448


@dataclass
class ReadCase:
    """Inputs of one paged-logits call (DeepGEMM's argument order, bf16 pool)."""

    q: torch.Tensor  # [rows, 1, H, 128] fp8 e4m3 or bf16
    pool: torch.Tensor  # [pages, 64, 128] bf16
    weights: torch.Tensor  # [rows, H] fp32
    seq_lens: torch.Tensor  # [rows] int32
    page_table: torch.Tensor  # [rows, max_pages] int32
    max_seq_len: int
    poison_page: int

    @property
    def rows(self) -> int:
        return int(self.q.shape[0])

    @property
    def heads(self) -> int:
        return int(self.q.shape[2])

    def pool_bytes(self) -> torch.Tensor:
        """The pool as the indexer pool stores it: uint8 ``[pages, 64 * 256]`` (a view)."""
        return self.pool.view(torch.uint8).view(self.pool.shape[0], BF16_PAGE_BYTES)

    def pool_view(self) -> torch.Tensor:
        """The view the indexer call site passes: bf16 ``[pages, 64, 1, 128]``."""
        return self.pool.view(self.pool.shape[0], PAGE, 1, DIM)

    def with_lengths(self, seq_lens: torch.Tensor) -> ReadCase:
        return replace(self, seq_lens=seq_lens.to(self.seq_lens.device, torch.int32))

    def key_bytes(self, bytes_per_key: int = BF16_SLOT_BYTES) -> int:
        """Bytes of keys a row-by-row read moves: visible keys over all rows."""
        lens = self.seq_lens.clamp(min=0, max=min(self.max_seq_len, self.page_table.shape[1] * PAGE))
        return int(lens.sum()) * bytes_per_key


def pages_for(length: int) -> int:
    return -(-max(length, 0) // PAGE)


def make_read_case(
    lengths: list[int],
    *,
    heads: int = 64,
    q_dtype: torch.dtype = torch.float8_e4m3fn,
    seed: int = 0,
    shared_table: bool = False,
    extra_pages: int = 1,
    device: str | torch.device = "cpu",
) -> ReadCase:
    """A pool holding every row's keys on shuffled pages.

    ``shared_table``: all rows are query tokens of one request and share its pages (prefill);
    otherwise each row owns distinct pages (a decode batch). Keys and queries are standard
    normal (q rounded to ``q_dtype``), weights ~ N(0, 1/H) so both signs occur.
    """
    device = torch.device(device)
    gen_cpu = torch.Generator(device="cpu").manual_seed(seed)
    rows = len(lengths)
    need = [pages_for(n) for n in lengths]
    max_pages = max(need + [1]) + extra_pages
    owned = [max(need + [1])] if shared_table else [max(n, 1) for n in need]
    num_pages = sum(owned) + 1
    perm = torch.randperm(num_pages, generator=gen_cpu)
    poison = int(perm[-1])
    table = torch.full((rows, max_pages), poison, dtype=torch.int32)
    start = 0
    for r in range(rows):
        if shared_table:
            ids = perm[: owned[0]]
        else:
            ids = perm[start : start + owned[r]]
            start += owned[r]
        table[r, : need[r]] = ids[: need[r]].to(torch.int32)
    # Large pools are drawn on the device: a 128K-key x 64-row pool is 2 GB.
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    pool = torch.randn((num_pages, PAGE, DIM), generator=gen, device=device).to(torch.bfloat16)
    pool[poison] = float("nan")
    q = torch.randn((rows, 1, heads, DIM), generator=gen, device=device).to(q_dtype)
    weights = torch.randn((rows, heads), generator=gen, device=device) * heads**-0.5
    return ReadCase(
        q=q,
        pool=pool,
        weights=weights,
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        page_table=table.to(device),
        max_seq_len=max_pages * PAGE,
        poison_page=poison,
    )


def verify_lengths(finals: list[int], next_n: int) -> list[int]:
    """Compressed lengths of MTP verify rows, ``next_n`` per request whose last row sees
    ``final`` keys: the draft tokens are causal, a key per 4 tokens (neighbours may tie)."""
    return [max(1, (4 * f - next_n + 1 + i) // 4) for f in finals for i in range(next_n)]


def make_group_case(
    lengths: list[int], group_rows: int, *, poison_others: bool = True, **kw: Any
) -> tuple[ReadCase, ReadCase]:
    """Rows in consecutive groups of ``group_rows`` (the last may be partial) that share the
    page table of the group's longest row. Returns (the kernel's inputs, where with
    ``poison_others`` every row but a group's first has a table of the NaN page only, so a
    kernel reading any table but the first poisons that row; the oracle's inputs)."""
    case = make_read_case(lengths, **kw)
    table = case.page_table.clone()
    for start in range(0, case.rows, group_rows):
        group = lengths[start : start + group_rows]
        longest = start + max(range(len(group)), key=group.__getitem__)
        table[start : start + len(group)] = table[longest]
    shared = replace(case, page_table=table)
    if not poison_others:
        return shared, shared
    kernel_table = table.clone()
    for r in range(case.rows):
        if r % group_rows:
            kernel_table[r] = case.poison_page
    return replace(case, page_table=kernel_table), shared


def tiles_end(seq_lens: torch.Tensor, width: int, block_n: int = PAGE) -> torch.Tensor:
    """Where each row's last key tile ends: what ``clean_logits=False`` writes up to."""
    lens = seq_lens.reshape(-1).long().clamp(min=0)
    return (-(-lens // block_n) * block_n).clamp(max=width)


def causal_lengths(query_tokens: int, final_keys: int) -> list[int]:
    """Compressed lengths of the last ``query_tokens`` tokens of a request whose final
    compressed length is ``final_keys`` (token p sees (p + 1) // 4 keys, at least 1, as
    upstream bounds compressed_seq_lens for flash_mla)."""
    last = 4 * final_keys - 1
    first = max(0, last - query_tokens + 1)
    return [max(1, (p + 1) // 4) for p in range(first, last + 1)]


def oracle_logits(
    q: torch.Tensor,
    keys: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
    key_chunk: int = 16384,
) -> torch.Tensor:
    """fp32 ``[rows, max_seq_len]``: ``sum_h relu(q[r, h] . k[slot]) * w[r, h]`` for visible
    positions, ``-inf`` elsewhere; ``keys`` is ``[pages, 64, 128]`` in any float dtype (the
    stored bf16 keys, or dequantized fp8 keys). Computed in fp64 on ``q``'s device."""
    rows = q.shape[0]
    device = q.device
    flat = keys.reshape(-1, DIM)
    qd = q.reshape(rows, -1, DIM).double()
    wd = weights.double()
    lens = seq_lens.reshape(-1).tolist()
    width_cap = min(max_seq_len, page_table.shape[1] * PAGE)
    out = torch.full((rows, max_seq_len), float("-inf"), dtype=torch.float32, device=device)
    for r in range(rows):
        n = min(max(int(lens[r]), 0), width_cap)
        for lo in range(0, n, key_chunk):
            j = torch.arange(lo, min(n, lo + key_chunk), device=device)
            slots = page_table[r, j // PAGE].long() * PAGE + j % PAGE
            s = flat[slots].double() @ qd[r].T  # [n, H]
            out[r, j] = (s.clamp_min(0) @ wd[r]).float()
    return out


def pack_fp8_pages(
    keys: torch.Tensor, dequantized: bool = True, pages_per_chunk: int = 4096
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Quantize ``[pages, 64, 128]`` keys as upstream's fused store does and lay them out as
    its pool does. Returns (uint8 ``[pages, 64 * 132]``, dequantized fp32 ``[pages, 64, 128]``
    or None when ``dequantized`` is False). Works in page chunks so a multi-GB bench pool
    needs no full-size fp32 temporaries."""
    pages = keys.shape[0]
    buf = torch.empty((pages, FP8_PAGE_BYTES), dtype=torch.uint8, device=keys.device)
    deq = torch.empty((pages, PAGE, DIM), dtype=torch.float32, device=keys.device) if dequantized else None
    for lo in range(0, pages, pages_per_chunk):
        hi = min(pages, lo + pages_per_chunk)
        x = keys[lo:hi].float()
        scale = x.abs().amax(dim=-1).clamp_min(FP8_SCALE_FLOOR) / FP8_MAX  # [n, 64]
        values = (x * (1.0 / scale)[..., None]).to(torch.float8_e4m3fn)
        buf[lo:hi, : PAGE * DIM] = values.view(torch.uint8).reshape(hi - lo, PAGE * DIM)
        buf[lo:hi, PAGE * DIM :] = scale.contiguous().view(torch.uint8).reshape(hi - lo, PAGE * 4)
        if deq is not None:
            deq[lo:hi] = values.float() * scale[..., None]
    return buf, deq


def unpack_fp8_pages(buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 ``[pages, 64, 128]``, fp32 scales ``[pages, 64]``) of an fp8 index-K buffer."""
    pages = buf.shape[0]
    flat = buf.reshape(pages, FP8_PAGE_BYTES)
    values = flat[:, : PAGE * DIM].contiguous().view(torch.float8_e4m3fn).view(pages, PAGE, DIM)
    scales = flat[:, PAGE * DIM :].contiguous().view(torch.float32).view(pages, PAGE)
    return values, scales


def naive_gather_logits(
    q: torch.Tensor,
    pool: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
) -> torch.Tensor:
    """Gather every row's pages into a bf16 ``[rows, pages * 64, 128]`` copy, then bmm: the
    naive read the in-place kernel replaces (its copy costs rows * len * 256 B)."""
    rows, heads = q.shape[0], q.shape[-2]
    pages = pool.reshape(pool.shape[0], PAGE, DIM)
    k = pages[page_table.clamp(min=0).long()].reshape(rows, -1, DIM)  # [rows, L, 128] bf16
    s = torch.bmm(k, q.reshape(rows, heads, DIM).to(torch.bfloat16).transpose(1, 2))  # [rows, L, H]
    s.relu_()
    logits = (s * weights[:, None, :].float()).sum(-1)  # fp32 [rows, L]
    width = logits.shape[1]
    pos = torch.arange(width, device=q.device)
    logits.masked_fill_(pos[None, :] >= seq_lens.reshape(-1, 1), float("-inf"))
    if width >= max_seq_len:
        return logits[:, :max_seq_len]
    pad = torch.full((rows, max_seq_len - width), float("-inf"), device=q.device)
    return torch.cat([logits, pad], dim=1)


def gather_peak_bytes(rows: int, max_pages: int, heads: int) -> int:
    """Transient bytes of ``naive_gather_logits``: the bf16 copy (256 B per key), bf16
    scores (2H B) and their fp32 weighted product (4H B), per row and padded key."""
    keys = rows * max_pages * PAGE
    return keys * (BF16_SLOT_BYTES + 2 * heads + 4 * heads + 4)


# ---------------------------------------------------------------------------------------------
# The prefill kernel (bf16_mqa_logits): one request's query rows over its keys, in DeepGEMM's
# fp8_mqa_logits roles (each row reads keys ks[r] <= j < ke[r]; column j is key j).
# ---------------------------------------------------------------------------------------------


@dataclass
class PrefillCase:
    """Inputs of one ``bf16_mqa_logits`` call over a paged bf16 pool, as the indexer's non-paged
    plan hands them over: q ``[rows, H, 128]``, head weights, ``ks`` / ``ke`` per row, the
    request's page table ``[max_pages]`` and the output width ``max_seqlen_k``. Table entries
    past the request's pages point at a page of NaN, and the slots of its last page past its
    last key hold NaN: a kernel that loads a key no row may read poisons a row."""

    q: torch.Tensor  # [rows, H, 128] fp8 e4m3 or bf16
    pool: torch.Tensor  # [pages, 64, 128] bf16
    weights: torch.Tensor  # [rows, H] fp32
    ks: torch.Tensor  # [rows] int32
    ke: torch.Tensor  # [rows] int32
    page_table: torch.Tensor  # [max_pages] int32
    max_seqlen_k: int
    n_keys: int  # the request's keys (those the table's pages hold)
    poison_page: int

    @property
    def rows(self) -> int:
        return int(self.q.shape[0])

    @property
    def heads(self) -> int:
        return int(self.q.shape[1])

    def pool_view(self) -> torch.Tensor:
        """The view the indexer passes: bf16 ``[pages, 64, 1, 128]``."""
        return self.pool.view(self.pool.shape[0], PAGE, 1, DIM)

    def pool_bytes(self) -> torch.Tensor:
        return self.pool.view(torch.uint8).view(self.pool.shape[0], BF16_PAGE_BYTES)

    def keys(self) -> torch.Tensor:
        """The request's keys in order, ``[n_keys, 128]`` bf16 (a contiguous copy)."""
        pages = self.page_table[: pages_for(self.n_keys)].long()
        return self.pool[pages].reshape(-1, DIM)[: self.n_keys].contiguous()

    def rows_slice(self, rows: slice) -> PrefillCase:
        """A row chunk, as the dispatch slices one (same table and width)."""
        return replace(self, q=self.q[rows], weights=self.weights[rows], ks=self.ks[rows], ke=self.ke[rows])

    def with_ranges(self, ks: torch.Tensor, ke: torch.Tensor) -> PrefillCase:
        dev = self.ks.device
        return replace(self, ks=ks.to(dev, torch.int32).contiguous(), ke=ke.to(dev, torch.int32).contiguous())

    def paged_rows(self) -> ReadCase:
        """The same rows as a paged decode-style call (``bf16_paged_mqa_logits``): each row's
        table is the request's, its length ``ke`` (valid where ``ks == 0``)."""
        table = self.page_table[None, :].expand(self.rows, -1).contiguous()
        return ReadCase(
            self.q[:, None],
            self.pool,
            self.weights,
            self.ke.clone(),
            table,
            self.max_seqlen_k,
            self.poison_page,
        )


def make_prefill_case(
    ke: list[int],
    ks: list[int] | None = None,
    *,
    heads: int = 64,
    q_dtype: torch.dtype = torch.float8_e4m3fn,
    seed: int = 0,
    n_keys: int | None = None,
    width: int | None = None,
    extra_pages: int = 1,
    device: str | torch.device = "cpu",
) -> PrefillCase:
    """One request of ``n_keys`` keys (default: the largest ``ke``) on shuffled pages, a row per
    entry of ``ke`` (``ks`` default 0). ``width``: the output width (default the request's keys
    rounded up to a page, as upstream's non-paged plan sets ``max_seqlen_k``)."""
    device = torch.device(device)
    rows = len(ke)
    ks = [0] * rows if ks is None else list(ks)
    assert len(ks) == rows
    n_keys = max(ke + [1]) if n_keys is None else n_keys
    need = pages_for(n_keys)
    gen_cpu = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(need + 1, generator=gen_cpu)
    poison = int(perm[-1])
    table = torch.full((need + extra_pages,), poison, dtype=torch.int32)
    table[:need] = perm[:need].to(torch.int32)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    pool = torch.randn((need + 1, PAGE, DIM), generator=gen, device=device).to(torch.bfloat16)
    pool[poison] = float("nan")
    if n_keys % PAGE:  # the last page's slots past the request's last key
        pool[int(table[need - 1]), n_keys % PAGE :] = float("nan")
    q = torch.randn((rows, heads, DIM), generator=gen, device=device).to(q_dtype)
    weights = torch.randn((rows, heads), generator=gen, device=device) * heads**-0.5
    return PrefillCase(
        q=q,
        pool=pool,
        weights=weights,
        ks=torch.tensor(ks, dtype=torch.int32, device=device),
        ke=torch.tensor(ke, dtype=torch.int32, device=device),
        page_table=table.to(device),
        max_seqlen_k=need * PAGE if width is None else width,
        n_keys=n_keys,
        poison_page=poison,
    )


def mqa_oracle_logits(case: PrefillCase, row_block: int = 64, key_chunk: int = 16384) -> torch.Tensor:
    """fp32 ``[rows, max_seqlen_k]``: ``sum_h relu(q[r, h] . k[j]) * w[r, h]`` in fp64 for
    ``ks[r] <= j < min(ke[r], n_keys, width)``, ``-inf`` elsewhere (column ``j`` is key ``j``)."""
    width, rows = case.max_seqlen_k, case.rows
    device = case.q.device
    keys = case.keys()
    n = min(case.n_keys, width)
    out = torch.full((rows, width), float("-inf"), dtype=torch.float32, device=device)
    ks = case.ks.long().clamp(min=0)
    ke = case.ke.long().clamp(max=n)
    qd, wd = case.q.double(), case.weights.double()
    for lo in range(0, rows, row_block):
        hi = min(rows, lo + row_block)
        top = int(ke[lo:hi].max()) if hi > lo else 0
        for k0 in range(0, top, key_chunk):
            k1 = min(top, k0 + key_chunk)
            kd = keys[k0:k1].double()
            s = torch.einsum("rhd,kd->rhk", qd[lo:hi], kd).relu_()
            s = torch.einsum("rhk,rh->rk", s, wd[lo:hi]).float()
            j = torch.arange(k0, k1, device=device)
            seen = (j[None, :] >= ks[lo:hi, None]) & (j[None, :] < ke[lo:hi, None])
            out[lo:hi, k0:k1] = torch.where(seen, s, out[lo:hi, k0:k1])
    return out


def mqa_owned(ks: torch.Tensor, ke: torch.Tensor, width: int, block_k: int) -> torch.Tensor:
    """Positions ``bf16_mqa_logits`` writes with ``clean_logits=False``: every column of each
    ``block_k``-key tile that meets the row's ``[ks, ke)`` (empty rows own nothing)."""
    ks = ks.reshape(-1).long().clamp(min=0)
    ke = ke.reshape(-1).long().clamp(max=width)
    cols = torch.arange(width, device=ks.device)
    tile_lo = cols // block_k * block_k
    meets = (tile_lo[None, :] < ke[:, None]) & (tile_lo[None, :] + block_k > ks[:, None])
    return meets & (ks < ke)[:, None]
