"""Byte geometry of the C4 index-K pool, shuffled page tables and canary bytes.

The pool keeps one 2-D uint8 buffer per layer, ``[num_pages, 64 * slot_bytes]``; slot ``s``
lives in page ``s // 64`` at position ``s % 64``. fp8 pages hold the 64 128-byte value rows
first and the 64 fp32 scales after them (132 B per slot); bf16 pages hold 64 rows of 256 bytes
(128 bf16, no scale), so the whole bf16 buffer is a dense ``[num_pages * 64, 128]`` array.

Everything here is plain torch and works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SLOTS_PER_PAGE = 64
INDEX_HEAD_DIM = 128


@dataclass(frozen=True)
class IndexKLayout:
    """Where the bytes of one slot sit inside its page."""

    name: str
    value_bytes: int  # bytes of the key values of one slot
    scale_bytes: int  # bytes of its scale (0: no scale)

    @property
    def slot_bytes(self) -> int:
        return self.value_bytes + self.scale_bytes

    @property
    def page_bytes(self) -> int:
        return SLOTS_PER_PAGE * self.slot_bytes

    def byte_ranges(self, slots: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        """(flat start offsets, length) of every byte run a store to ``slots`` writes."""
        slots = slots.long()
        page, offset = slots // SLOTS_PER_PAGE, slots % SLOTS_PER_PAGE
        base = page * self.page_bytes
        ranges = [(base + offset * self.value_bytes, self.value_bytes)]
        if self.scale_bytes:
            scale_base = base + SLOTS_PER_PAGE * self.value_bytes
            ranges.append((scale_base + offset * self.scale_bytes, self.scale_bytes))
        return ranges


FP8_LAYOUT = IndexKLayout("fp8", value_bytes=INDEX_HEAD_DIM, scale_bytes=4)
BF16_LAYOUT = IndexKLayout("bf16", value_bytes=INDEX_HEAD_DIM * 2, scale_bytes=0)


def gather_bytes(buffer: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """``[n, length]`` uint8: the byte runs of a 2-D uint8 pool buffer starting at ``starts``."""
    flat = buffer.reshape(-1)
    index = starts.long().to(flat.device)[:, None] + torch.arange(length, device=flat.device)
    return flat[index]


def written_byte_mask(layout: IndexKLayout, slots: torch.Tensor, num_pages: int) -> torch.Tensor:
    """Flat bool mask over the whole buffer: True where a store to ``slots`` may write."""
    mask = torch.zeros(num_pages * layout.page_bytes, dtype=torch.bool, device=slots.device)
    for starts, length in layout.byte_ranges(slots):
        index = starts[:, None] + torch.arange(length, device=slots.device)
        mask[index.reshape(-1)] = True
    return mask


def make_page_table(
    num_logical_pages: int,
    num_pool_pages: int,
    generator: torch.Generator,
    exclude: tuple[int, ...] = (),
) -> torch.Tensor:
    """A shuffled int64 page table: logical page j -> a distinct pool page not in ``exclude``.

    Shuffled so that a kernel that ignores the page table (writes by logical index) or mixes
    up page and slot strides lands in the wrong page and trips the canary check.
    """
    excluded = set(exclude)
    candidates = torch.tensor([p for p in range(num_pool_pages) if p not in excluded], dtype=torch.int64)
    if num_logical_pages > candidates.numel():
        raise ValueError(f"need {num_logical_pages} pages, pool has {candidates.numel()} usable")
    order = torch.randperm(candidates.numel(), generator=generator)
    return candidates[order[:num_logical_pages]]


def slots_for_keys(page_table: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:
    """Pool slot of each compressed key: ``page_table[k // 64] * 64 + k % 64``."""
    key_index = key_index.long()
    page_table = page_table.to(key_index.device)
    return page_table[key_index // SLOTS_PER_PAGE] * SLOTS_PER_PAGE + key_index % SLOTS_PER_PAGE


def fill_canary(buffer: torch.Tensor, seed: int) -> torch.Tensor:
    """Fill ``buffer`` (uint8) with seeded random bytes in place; returns a copy to compare with.

    Random rather than constant bytes, so a write that copies a neighbouring slot or page is
    as visible as a write of zeros.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    pattern = torch.randint(0, 256, tuple(buffer.shape), generator=generator, dtype=torch.uint8)
    buffer.copy_(pattern.to(buffer.device))
    return buffer.clone()


def canary_report(
    before: torch.Tensor,
    after: torch.Tensor,
    allowed: torch.Tensor,
    page_bytes: int,
    keep: int = 5,
) -> dict[str, object]:
    """Bytes that changed outside ``allowed`` (flat mask), with the first few (page, byte)."""
    changed = (before.reshape(-1) != after.reshape(-1)) & ~allowed
    offsets = torch.nonzero(changed).flatten()
    first = [{"page": int(o) // page_bytes, "byte": int(o) % page_bytes} for o in offsets[:keep].tolist()]
    return {
        "ok": offsets.numel() == 0,
        "bytes_changed_outside_slots": int(offsets.numel()),
        "pages_touched_outside_slots": int(torch.unique(offsets // page_bytes).numel()),
        "first": first,
    }


def decode_bf16_slots(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """bf16 ``[n, 128]`` read from raw bytes by explicit little-endian arithmetic.

    Independent of dtype views, so comparing it with ``bf16_slot_view`` checks that the view
    the read path uses addresses the bytes the store wrote.
    """
    ((starts, length),) = BF16_LAYOUT.byte_ranges(slots)
    raw = gather_bytes(buffer, starts, length).to(torch.int32)
    bits = raw[:, 0::2] | (raw[:, 1::2] << 8)
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits)  # to signed int16 range
    return bits.to(torch.int16).view(torch.bfloat16)


def bf16_slot_view(buffer: torch.Tensor) -> torch.Tensor:
    """The agreed dense view of a bf16 pool buffer: ``[num_pages * 64, 128]`` bf16, no copy."""
    if buffer.dtype != torch.uint8 or buffer.dim() != 2 or buffer.shape[1] != BF16_LAYOUT.page_bytes:
        raise ValueError(
            f"expected uint8 [pages, {BF16_LAYOUT.page_bytes}], got {buffer.dtype} {tuple(buffer.shape)}"
        )
    return buffer.view(torch.bfloat16).view(-1, INDEX_HEAD_DIM)


def decode_fp8_slots(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """fp32 ``[n, 128]``: fp8 e4m3 values of each slot times its fp32 scale (dequantized)."""
    (value_starts, value_len), (scale_starts, scale_len) = FP8_LAYOUT.byte_ranges(slots)
    values = gather_bytes(buffer, value_starts, value_len).view(torch.float8_e4m3fn).float()
    scales = gather_bytes(buffer, scale_starts, scale_len).contiguous().view(torch.float32)
    return values * scales
