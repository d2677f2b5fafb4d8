"""Shared memory a grouped program of the bf16 paged kernel needs, estimated: the MTP sweep drops
configs that would not fit, and README's sweep table says how many programs an SM holds."""

from __future__ import annotations

from verify.core import platform as P

# An H100/H200 SM's shared memory and what the runtime reserves per resident block.
SM_SHARED_BYTES = P.SHARED_MEMORY["sm90"][1]
BLOCK_RESERVED_BYTES = 1024


def grouped_smem_bytes(block_n: int, num_stages: int, next_n: int, heads: int) -> int:
    """Shared memory a grouped program needs, estimated (the bench's sweep filters on it too):
    ``num_stages`` bf16 key tiles of ``block_n`` x 256 B plus the group's query tile (rows rounded
    up to a power of two, x heads x 128 bf16 values)."""
    columns = 1 << max(next_n - 1, 0).bit_length()
    return num_stages * block_n * 256 + columns * heads * 128 * 2
