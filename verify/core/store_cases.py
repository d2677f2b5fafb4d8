"""The store-parity scenarios: how many compressed keys, in which prefill chunks or decode rows.

Pure Python: which token positions complete a compressed key, which key index and RoPE position
each gets, and how a long prompt is split into prefill chunks (upstream's prefill planner takes
at most 65536 query tokens per call, so 65536 keys = 262144 tokens need several chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPRESS_RATIO = 4
# Lengths in compressed keys: empty, one, around one 64-slot page, around 8 pages, a long
# prompt, and one long enough to need many prefill chunks.
DEFAULT_LENGTHS: tuple[int, ...] = (0, 1, 63, 64, 65, 511, 512, 513, 4095, 65536)
# Not a multiple of the ratio on purpose: chunk borders then fall inside a compression window,
# as they do when the scheduler chunks a prompt.
DEFAULT_CHUNK_TOKENS = 16384 - 6
# Tokens past the last complete window: the tail the compressor holds back.
TAIL_TOKENS = 2
# Decode rows: some end a window (write a key), some do not (must write nothing).
DEFAULT_DECODE_SEQ_LENS: tuple[int, ...] = (4, 5, 8, 255, 256, 257, 1024, 4095, 4096, 4099)


def completes_key(position: int) -> bool:
    """True when the token at ``position`` closes a compression window (writes a key)."""
    return (position + 1) % COMPRESS_RATIO == 0


def key_index(position: int) -> int:
    """Index of the compressed key that the token at ``position`` completes."""
    return (position + 1) // COMPRESS_RATIO - 1


def rope_position(position: int) -> int:
    """RoPE position of that key: the kernel uses ``seq_len - ratio`` with seq_len = position + 1."""
    return position + 1 - COMPRESS_RATIO


@dataclass(frozen=True)
class Chunk:
    """One prefill call: ``extend_len`` new tokens after ``prefix_len`` cached ones."""

    prefix_len: int
    extend_len: int

    @property
    def seq_len(self) -> int:
        return self.prefix_len + self.extend_len

    def key_positions(self) -> list[int]:
        """Token positions in this chunk that complete a key, in the order the planner lists them."""
        return [p for p in range(self.prefix_len, self.seq_len) if completes_key(p)]


@dataclass(frozen=True)
class PrefillCase:
    """A single request prefilled from empty to ``seq_len`` tokens, in chunks."""

    num_keys: int
    seq_len: int
    chunks: tuple[Chunk, ...]
    seed: int

    @property
    def name(self) -> str:
        return f"prefill/L={self.num_keys}"

    @property
    def num_logical_pages(self) -> int:
        return -(-self.num_keys // 64)


@dataclass(frozen=True)
class DecodeCase:
    """A batch of decode rows, one request each, at the given sequence lengths (after the token)."""

    seq_lens: tuple[int, ...]
    seed: int

    @property
    def name(self) -> str:
        return "decode"

    def writes_key(self, row: int) -> bool:
        return self.seq_lens[row] % COMPRESS_RATIO == 0


def split_chunks(seq_len: int, max_chunk_tokens: int) -> tuple[Chunk, ...]:
    """Split ``seq_len`` tokens into consecutive chunks of at most ``max_chunk_tokens``."""
    if seq_len <= 0 or max_chunk_tokens <= 0:
        raise ValueError(f"seq_len and max_chunk_tokens must be positive, got {seq_len}, {max_chunk_tokens}")
    chunks = []
    start = 0
    while start < seq_len:
        extend = min(max_chunk_tokens, seq_len - start)
        chunks.append(Chunk(prefix_len=start, extend_len=extend))
        start += extend
    return tuple(chunks)


def make_prefill_case(num_keys: int, seed: int, max_chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> PrefillCase:
    """The request that yields exactly ``num_keys`` compressed keys (plus a short held-back tail)."""
    if num_keys < 0:
        raise ValueError(f"num_keys must be >= 0, got {num_keys}")
    if max_chunk_tokens > 65536:
        raise ValueError("upstream's prefill planner takes at most 65536 query tokens per call")
    seq_len = num_keys * COMPRESS_RATIO + TAIL_TOKENS
    return PrefillCase(num_keys, seq_len, split_chunks(seq_len, max_chunk_tokens), seed)
