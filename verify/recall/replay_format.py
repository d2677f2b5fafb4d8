"""Writer and reader of indexer captures (``dsv4-indexer-capture`` v1); see REPLAY.md.

Importable with torch and ``verify.core`` only (its fp4 decoding is the format emulation's). The
capture patch (``indexer-capture.patch``) writes the same format from inside SGLang with its own
small writer (a deployment has no ``verify`` package); this module is the reference reader.

fp4 captures (an upstream fp4 indexer server, 68-B pages and fp4 q) are a compatible v1
addition: readers before it reject them by ``index_k_format``. :func:`read_capture` decodes
them exactly into their bf16 equivalent by default, so every tier-2 consumer scores them
unchanged (``decode_fp4=False`` keeps the raw bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from verify.core.formats import fp4_decode

FORMAT = "dsv4-indexer-capture"
VERSION = 1
PAGE_SIZE = 64
HEAD_DIM = 128
SLOT_BYTES = {"fp8": HEAD_DIM + 4, "bf16": HEAD_DIM * 2, "fp4": HEAD_DIM // 2 + 4}
FP4_Q_DTYPE = "float4_e2m1fn_x2"  # q as packed e2m1 codes (uint8 [R, H, 64]) + q_scale_ue8m0
FP4_BLOCK = 32  # values per ue8m0 scale byte (keys and q)
MetaValue = str | int | float | bool | None


@dataclass
class Capture:
    """A validated capture; tensors on CPU unless ``read_capture(map_location=...)`` says otherwise."""

    index_k_format: str  # "fp8" | "bf16" | "fp4" (raw fp4 only with read_capture(decode_fp4=False))
    q: torch.Tensor  # [rows, H, 128] float8_e4m3fn (or bf16); raw fp4: uint8 [rows, H, 64]
    weights: torch.Tensor  # [rows, H] fp32, q scale folded in
    index_k_pages: torch.Tensor  # [num_pages, 64 * slot_bytes] uint8
    page_table: torch.Tensor  # [rows, max_pages] int32
    seq_lens: torch.Tensor  # [rows] int32
    index_topk: int
    page_size: int = PAGE_SIZE
    metadata: dict[str, MetaValue] = field(default_factory=dict)
    needle_pos: torch.Tensor | None = None  # [rows] int64, -1 = unknown
    k_ref: torch.Tensor | None = None  # [num_pages * 64, 128] fp32/bf16 unrounded keys by slot
    q_ref: torch.Tensor | None = None  # [rows, H, 128] unquantized rotated q
    weights_ref: torch.Tensor | None = None  # [rows, H] fp32 weights without the q scale
    row_tokens: torch.Tensor | None = None  # [rows] int64 prompt position of each query row
    q_scale_ue8m0: torch.Tensor | None = None  # raw fp4 q only: [rows, H, 4] uint8 exponents

    @property
    def rows(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_pages(self) -> int:
        return int(self.index_k_pages.shape[0])


def compact_pages(
    pages: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor, k_ref: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Keep only the pages rows can see (within ``seq_lens``) and renumber the page table.

    A live pool is many GiB; a capture needs only the referenced pages. Entries past a row's
    length become 0 (they are masked by ``seq_lens`` anyway).
    """
    pages_needed = (seq_lens.long() + PAGE_SIZE - 1) // PAGE_SIZE
    col = torch.arange(page_table.shape[1], device=page_table.device).unsqueeze(0)
    used = col < pages_needed.unsqueeze(1)
    ids = torch.unique(page_table[used].long())
    remap = torch.full((int(pages.shape[0]),), -1, dtype=torch.int64, device=page_table.device)
    remap[ids] = torch.arange(ids.numel(), device=page_table.device)
    table = torch.where(
        used, remap[page_table.long().clamp(min=0)], torch.zeros_like(page_table, dtype=torch.int64)
    )
    new_ref = None
    if k_ref is not None:
        slots = (ids.unsqueeze(1) * PAGE_SIZE + torch.arange(PAGE_SIZE, device=ids.device)).flatten()
        new_ref = k_ref[slots.to(k_ref.device)].clone()
    return pages[ids.to(pages.device)].clone(), table.to(torch.int32), new_ref


def _as_rows_q(q: torch.Tensor) -> torch.Tensor:
    if q.dim() == 4:
        if q.shape[1] != 1:
            raise ValueError(
                f"q [rows, next_n, H, D] needs next_n == 1 (flatten MTP rows first), got {tuple(q.shape)}"
            )
        q = q[:, 0]
    return q


def write_capture(
    path: str | Path,
    *,
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    index_k_format: str,
    index_topk: int,
    page_size: int = PAGE_SIZE,
    metadata: dict[str, MetaValue] | None = None,
    needle_pos: torch.Tensor | None = None,
    k_ref: torch.Tensor | None = None,
    q_ref: torch.Tensor | None = None,
    weights_ref: torch.Tensor | None = None,
    row_tokens: torch.Tensor | None = None,
    q_scale_ue8m0: torch.Tensor | None = None,
    compact: bool = True,
) -> Path:
    """Save one indexer call's inputs. Tensors may be on any device (copied to CPU).

    ``q`` is ``[rows, H, 128]`` or ``[rows, 1, H, 128]`` (the paged-logits call shape);
    ``index_k_pages`` is the layer's pool buffer (2-D uint8, as allocated) or just the pages the
    page table references. With ``compact`` only referenced pages are written. An fp4 q is
    given as its packed codes (``[rows, H, 64]`` uint8/int8) plus ``q_scale_ue8m0``
    (``[rows, H, 4]`` uint8, or the kernel's int32 ``[rows, H]``).
    """
    q = _as_rows_q(q)
    if q_scale_ue8m0 is not None:
        q = q.view(torch.uint8)
        q_scale_ue8m0 = q_scale_ue8m0.contiguous().view(torch.uint8).reshape(*q.shape[:2], -1)
    seq_lens = seq_lens.reshape(-1)
    pages, table, ref = index_k_pages, page_table, k_ref
    if compact:
        pages, table, ref = compact_pages(index_k_pages, page_table, seq_lens, k_ref)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "index_k_format": index_k_format,
        "page_size": int(page_size),
        "index_topk": int(index_topk),
        "q_dtype": FP4_Q_DTYPE if q_scale_ue8m0 is not None else str(q.dtype).replace("torch.", ""),
        # float8 tensors are stored as their bytes: readers on older torch can still load them
        "q": q.detach().contiguous().cpu().view(torch.uint8)
        if q.dtype == torch.float8_e4m3fn
        else q.detach().cpu(),
        "weights": weights.detach().reshape(q.shape[0], -1).float().cpu(),
        "index_k_pages": pages.detach().contiguous().view(torch.uint8).reshape(pages.shape[0], -1).cpu(),
        "page_table": table.detach().to(torch.int32).cpu(),
        "seq_lens": seq_lens.detach().to(torch.int32).cpu(),
        "metadata": dict(metadata or {}),
    }
    for name, t, dtype in (
        ("needle_pos", needle_pos, torch.int64),
        ("k_ref", ref, None),
        ("q_ref", q_ref, None),
        ("weights_ref", weights_ref, torch.float32),
        ("row_tokens", row_tokens, torch.int64),
        ("q_scale_ue8m0", q_scale_ue8m0, torch.uint8),
    ):
        if t is not None:
            t = t.detach().cpu()
            payload[name] = t.to(dtype) if dtype is not None else t
    cap = _from_payload(payload)
    validate(cap)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def _from_payload(p: dict[str, Any]) -> Capture:
    q = p["q"]
    assert isinstance(q, torch.Tensor)
    if p.get("q_dtype") == "float8_e4m3fn":
        q = q.view(torch.float8_e4m3fn)
    return Capture(
        index_k_format=str(p["index_k_format"]),
        q=q,
        weights=p["weights"],
        index_k_pages=p["index_k_pages"],
        page_table=p["page_table"],
        seq_lens=p["seq_lens"],
        index_topk=int(p["index_topk"]),
        page_size=int(p.get("page_size", PAGE_SIZE)),
        metadata=dict(p.get("metadata") or {}),
        needle_pos=p.get("needle_pos"),
        k_ref=p.get("k_ref"),
        q_ref=p.get("q_ref"),
        weights_ref=p.get("weights_ref"),
        row_tokens=p.get("row_tokens"),
        q_scale_ue8m0=p.get("q_scale_ue8m0"),
    )


def validate(c: Capture) -> None:
    """Raise ``ValueError`` naming the first field that breaks the v1 contract."""

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ValueError(f"{FORMAT} v{VERSION}: {msg}")

    need(
        c.index_k_format in SLOT_BYTES,
        f"index_k_format must be one of {sorted(SLOT_BYTES)}, got {c.index_k_format!r}",
    )
    need(c.page_size == PAGE_SIZE, f"page_size must be {PAGE_SIZE}")
    rows = c.rows
    if c.q_scale_ue8m0 is not None:  # raw fp4 q: packed codes + one exponent per 32 dims
        need(
            c.q.dtype == torch.uint8 and c.q.dim() == 3 and tuple(c.q.shape[::2]) == (rows, HEAD_DIM // 2),
            f"fp4 q must be uint8 [rows={rows}, H, {HEAD_DIM // 2}], got {c.q.dtype} {tuple(c.q.shape)}",
        )
        need(
            c.q_scale_ue8m0.dtype == torch.uint8
            and tuple(c.q_scale_ue8m0.shape) == (rows, c.q.shape[1], HEAD_DIM // FP4_BLOCK),
            f"q_scale_ue8m0 must be uint8 [rows, H, {HEAD_DIM // FP4_BLOCK}]",
        )
    else:
        need(
            c.q.dim() == 3 and c.q.shape[0] == rows and c.q.shape[2] == HEAD_DIM,
            f"q must be [rows={rows}, H, 128], got {tuple(c.q.shape)}",
        )
        need(
            c.q.dtype in (torch.float8_e4m3fn, torch.bfloat16),
            f"q dtype must be float8_e4m3fn or bfloat16, got {c.q.dtype}",
        )
    heads = int(c.q.shape[1])
    need(
        tuple(c.weights.shape) == (rows, heads) and c.weights.dtype == torch.float32,
        f"weights must be fp32 [{rows}, {heads}]",
    )
    need(
        c.index_k_pages.dtype == torch.uint8 and c.index_k_pages.dim() == 2, "index_k_pages must be 2-D uint8"
    )
    need(
        c.index_k_pages.shape[1] == PAGE_SIZE * SLOT_BYTES[c.index_k_format],
        f"index_k_pages rows must be {PAGE_SIZE * SLOT_BYTES[c.index_k_format]} B for {c.index_k_format}",
    )
    need(
        c.page_table.dim() == 2 and c.page_table.shape[0] == rows and c.page_table.dtype == torch.int32,
        "page_table must be int32 [rows, max_pages]",
    )
    need(
        c.seq_lens.dtype == torch.int32 and tuple(c.seq_lens.shape) == (rows,),
        "seq_lens must be int32 [rows]",
    )
    need(
        bool((c.seq_lens >= 0).all())
        and (rows == 0 or int(c.seq_lens.max()) <= c.page_table.shape[1] * PAGE_SIZE),
        "seq_lens must fit the page table",
    )
    pages_needed = (c.seq_lens.long() + PAGE_SIZE - 1) // PAGE_SIZE
    used = torch.arange(c.page_table.shape[1]).unsqueeze(0) < pages_needed.unsqueeze(1)
    ids = c.page_table[used]
    need(
        ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < c.num_pages),
        "page_table entries within seq_lens must index index_k_pages",
    )
    need(c.index_topk > 0, "index_topk must be positive")
    if c.needle_pos is not None:
        need(tuple(c.needle_pos.shape) == (rows,), "needle_pos must be [rows]")
        ok = (c.needle_pos < 0) | (c.needle_pos < c.seq_lens.long())
        need(bool(ok.all()), "needle_pos must be -1 or < seq_len")
    if c.k_ref is not None:
        need(
            tuple(c.k_ref.shape) == (c.num_pages * PAGE_SIZE, HEAD_DIM), "k_ref must be [num_pages * 64, 128]"
        )
    if c.q_ref is not None:
        need(tuple(c.q_ref.shape) == (rows, heads, HEAD_DIM), "q_ref must be [rows, H, 128]")
    if c.weights_ref is not None:
        need(tuple(c.weights_ref.shape) == (rows, heads), "weights_ref must be [rows, H]")
    if c.row_tokens is not None:
        need(tuple(c.row_tokens.shape) == (rows,), "row_tokens must be [rows]")
    for k, v in c.metadata.items():
        need(
            isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool))),
            f"metadata[{k!r}] must be a str/int/float/bool/None",
        )


def read_capture(
    path: str | Path, map_location: str | torch.device = "cpu", decode_fp4: bool = True
) -> Capture:
    """Load and validate a capture. fp4 keys / q come back as their exact bf16 equivalent
    (see :func:`decode_fp4_capture`) unless ``decode_fp4`` is False."""
    payload = torch.load(Path(path), map_location=map_location, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    if int(payload.get("version", -1)) != VERSION:
        raise ValueError(f"{path}: {FORMAT} version {payload.get('version')} (this reader: {VERSION})")
    if payload.get("q_dtype") == FP4_Q_DTYPE and "q_scale_ue8m0" not in payload:
        raise ValueError(f"{path}: q_dtype {FP4_Q_DTYPE} needs q_scale_ue8m0")
    cap = _from_payload(payload)
    validate(cap)
    return decode_fp4_capture(cap) if decode_fp4 else cap


# ---------------------------------------------------------------------------------------------
# fp4 (e2m1 + one ue8m0 exponent per 32 values): upstream's fp4 indexer, 68 B per key
# ---------------------------------------------------------------------------------------------


def fp4_pages_to_bf16(pages: torch.Tensor) -> torch.Tensor:
    """68-B fp4 pages ``[P, 64 * 68]`` -> 256-B bf16 pages ``[P, 64 * 256]`` holding the same
    key values. Page layout (upstream ``DeepSeekV4IndexerPool.get_index_k_fp4``): all 64
    payloads (64 B each) first, then all 64 scale words (4 exponent bytes each)."""
    num_pages = pages.shape[0]
    payload = pages[:, : PAGE_SIZE * HEAD_DIM // 2].reshape(num_pages, PAGE_SIZE, HEAD_DIM // 2)
    exps = pages[:, PAGE_SIZE * HEAD_DIM // 2 :].reshape(num_pages, PAGE_SIZE, HEAD_DIM // FP4_BLOCK)
    keys = fp4_decode(payload, exps).to(torch.bfloat16)
    return keys.reshape(num_pages, -1).view(torch.uint8)


def decode_fp4_capture(cap: Capture) -> Capture:
    """The bf16 equivalent of an fp4 capture: every e2m1 value times a power of two is a bf16
    (exponents up to 252), so the keys and q replay exactly through the bf16 paths. fp4 q
    weights carry no q scale (it is decoded into q), which is what the bf16 scorers expect.
    Captures without fp4 pass through unchanged."""
    if cap.index_k_format != "fp4" and cap.q_scale_ue8m0 is None:
        return cap
    meta = dict(cap.metadata)
    q = cap.q
    if cap.q_scale_ue8m0 is not None:
        q = fp4_decode(cap.q, cap.q_scale_ue8m0).to(torch.bfloat16)
        meta["decoded_q_from"] = FP4_Q_DTYPE
    pages, fmt = cap.index_k_pages, cap.index_k_format
    if fmt == "fp4":
        pages, fmt = fp4_pages_to_bf16(pages), "bf16"
        meta["captured_index_k_format"] = "fp4"
    out = replace(cap, index_k_format=fmt, q=q, index_k_pages=pages, metadata=meta, q_scale_ue8m0=None)
    validate(out)
    return out
