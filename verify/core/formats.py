"""Exact torch emulation of the index-K storage formats and of the q quantization.

Everything here is pure torch (CPU or CUDA) and imports nothing from SGLang, so the CPU backend,
the replay reader and the tests run without it. The fp8 rules are read off upstream 0.5.21:

* index-K fp8 store (``store.cuh::fused_store_indexer_cache`` and the quant tail of
  ``fused_norm_rope_v2.cuh::fused_norm_rope_indexer``)::

      scale     = fmaxf(1e-4f, absmax(row)) / 448.0f      # plain fp32, NOT rounded to ue8m0
      inv_scale = 1.0f / scale
      code[i]   = cvt_rn_satfinite_e4m3(clamp(x[i] * inv_scale, -448, 448))

  Both kernels are compiled without ``--use_fast_math``, so ``/`` is IEEE division and torch's
  fp32 ops reproduce them bit for bit.
* q fp8 (``main_norm_rope.cuh::fused_q_indexer_rope_hadamard_quant``): the same rule per
  (row, head), and ``weights_out = weight * weight_scale * scale`` (the q scale is folded into the
  head weights, so scorers see raw e4m3 codes).
* fp4-sim: DeepSeek's QAT format (reference ``fp4_act_quant``): one power-of-two (ue8m0) scale per
  32 values, the smallest power of two >= amax / 6, values rounded to the e2m1 grid with ties to
  even. The result is stored as bf16, which holds every such value exactly.
* fp4 (upstream's C4 fp4 indexer, 68 B per key; :func:`fp4_upstream_codes`): the same grid and
  block scales, but rounded by thresholds that send every tie toward zero, not to even.

Page layouts (64 slots per page, slot ``s`` lives in page ``s // 64`` at offset ``s % 64``):

* fp8: 132 B per slot, *block-planar*: bytes ``[o*128, o*128+128)`` of the page hold the 128 e4m3
  codes of offset ``o``; bytes ``[64*128 + o*4, +4)`` hold its fp32 scale (little endian).
* bf16: 256 B per slot, dense: bytes ``[o*256, o*256+256)`` hold 128 bf16 values.
"""

from __future__ import annotations

import torch

HEAD_DIM = 128
PAGE_SLOTS = 64
FP8_MAX = 448.0
FP8_SCALE_FLOOR = 1e-4
FP8_SLOT_BYTES = HEAD_DIM + 4
BF16_SLOT_BYTES = HEAD_DIM * 2
FP4_PAYLOAD_BYTES = HEAD_DIM // 2  # two e2m1 codes per byte
FP4_SLOT_BYTES = FP4_PAYLOAD_BYTES + HEAD_DIM // 32  # + one ue8m0 exponent byte per 32 values: 68
FP8_PAGE_BYTES = PAGE_SLOTS * FP8_SLOT_BYTES  # 8448
BF16_PAGE_BYTES = PAGE_SLOTS * BF16_SLOT_BYTES  # 16384
FP8_SCALE_OFFSET = PAGE_SLOTS * HEAD_DIM  # 8192: scales follow all 64 payloads of the page
FP4_BLOCK = 32
FP4_MAX = 6.0
# Keeps an all-zero block at scale 2^-126 instead of 0 (no 0/0); irrelevant for real data.
FP4_AMAX_FLOOR = FP4_MAX * 2.0**-126

#: bytes per slot of each pool format; "fp4" is upstream's packed layout, the "fp4sim" arm is
#: stored in a bf16 pool; "f32" pools hold emulated formats whose values bf16 cannot hold exactly
#: (int8 x fp32 scale).
SLOT_BYTES = {"fp8": FP8_SLOT_BYTES, "bf16": BF16_SLOT_BYTES, "fp4": FP4_SLOT_BYTES, "f32": HEAD_DIM * 4}


def page_bytes(fmt: str) -> int:
    return PAGE_SLOTS * SLOT_BYTES[fmt]


def new_pool(fmt: str, num_pages: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A zeroed 2-D uint8 pool ``[num_pages, 64 * slot_bytes]``, the layout upstream allocates."""
    return torch.zeros(num_pages, page_bytes(fmt), dtype=torch.uint8, device=device)


# ---------------------------------------------------------------------------------------------
# fp8 e4m3 with one fp32 scale per key
# ---------------------------------------------------------------------------------------------


def fp8_row_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-row fp32 scale ``max(1e-4, absmax) / 448`` over the last dim, as the kernels compute it."""
    amax = x.float().abs().amax(dim=-1)
    return torch.clamp(amax, min=FP8_SCALE_FLOOR) / FP8_MAX


def fp8_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., 128]`` -> (e4m3 codes as uint8 ``[..., 128]``, fp32 scale ``[...]``).

    The clamp before the cast matters: the CUDA cast saturates (satfinite) while torch's cast of an
    out-of-range value does not, and x * (1/scale) can exceed 448 by an ulp.
    """
    xf = x.float()
    scale = fp8_row_scale(xf)
    inv_scale = 1.0 / scale
    y = (xf * inv_scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    return y.to(torch.float8_e4m3fn).view(torch.uint8), scale


def fp8_codes_to_float(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e4m3 codes -> their exact fp32 values (no scale)."""
    return codes.view(torch.float8_e4m3fn).float()


def fp8_dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return fp8_codes_to_float(codes) * scale.unsqueeze(-1)


def fp8_half_ulp(v: torch.Tensor) -> torch.Tensor:
    """Half the e4m3 spacing at |v| (v in code units): the largest error round-to-nearest can make.

    Normal range: spacing 2^(e-3) for |v| in [2^e, 2^(e+1)); subnormals (|v| < 2^-6) step 2^-9.
    """
    a = v.abs().clamp(min=2.0**-6)
    e = torch.floor(torch.log2(a))
    return torch.exp2(e - 4.0)


def _slot_page_offset(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    slots = slots.long()
    return slots // PAGE_SLOTS, slots % PAGE_SLOTS


def fp8_write(pool: torch.Tensor, slots: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
    """Scatter codes/scales into the block-planar 132-B layout."""
    page, off = _slot_page_offset(slots)
    ar_v = torch.arange(HEAD_DIM, device=pool.device)
    ar_s = torch.arange(4, device=pool.device)
    pool[page.unsqueeze(1), (off * HEAD_DIM).unsqueeze(1) + ar_v] = codes.to(torch.uint8)
    scale_bytes = scale.float().contiguous().view(torch.uint8).view(-1, 4)
    pool[page.unsqueeze(1), (FP8_SCALE_OFFSET + off * 4).unsqueeze(1) + ar_s] = scale_bytes


def fp8_read(pool: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather (codes uint8 ``[n,128]``, scale fp32 ``[n]``) of ``slots`` from a block-planar pool."""
    page, off = _slot_page_offset(slots)
    ar_v = torch.arange(HEAD_DIM, device=pool.device)
    ar_s = torch.arange(4, device=pool.device)
    codes = pool[page.unsqueeze(1), (off * HEAD_DIM).unsqueeze(1) + ar_v]
    sbytes = pool[page.unsqueeze(1), (FP8_SCALE_OFFSET + off * 4).unsqueeze(1) + ar_s].contiguous()
    return codes, sbytes.view(torch.float32).view(-1)


def fp8_read_interleaved(pool: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather assuming the *token-interleaved* layout (128 codes then 4 scale bytes per slot).

    Not a layout upstream uses for DSV4: it is what a reader with the vllm #50576 mismatch assumes,
    and the diagnosis decodes a pool both ways to name which layout a store really wrote.
    """
    page, off = _slot_page_offset(slots)
    base = (off * FP8_SLOT_BYTES).unsqueeze(1)
    codes = pool[page.unsqueeze(1), base + torch.arange(HEAD_DIM, device=pool.device)]
    sbytes = pool[page.unsqueeze(1), base + HEAD_DIM + torch.arange(4, device=pool.device)].contiguous()
    return codes, sbytes.view(torch.float32).view(-1)


def fp8_store(pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """Emulation of ``fused_store_cache(type="indexer")``: quantize ``keys [n,128]`` into ``pool``."""
    codes, scale = fp8_quantize_rows(keys)
    fp8_write(pool, slots, codes, scale)


def fp8_to_interleaved(pool: torch.Tensor) -> torch.Tensor:
    """Rewrite a block-planar fp8 pool into the token-interleaved layout (for fault injection)."""
    num_pages = pool.shape[0]
    payload = pool[:, :FP8_SCALE_OFFSET].reshape(num_pages, PAGE_SLOTS, HEAD_DIM)
    scales = pool[:, FP8_SCALE_OFFSET:].reshape(num_pages, PAGE_SLOTS, 4)
    return torch.cat([payload, scales], dim=2).reshape(num_pages, FP8_PAGE_BYTES).contiguous()


# ---------------------------------------------------------------------------------------------
# bf16: 256 B per key, no scale
# ---------------------------------------------------------------------------------------------


def bf16_view(pool: torch.Tensor) -> torch.Tensor:
    """The bf16 pool as a dense ``[num_pages * 64, 128]`` bf16 array (a view, no copy)."""
    return pool.view(torch.bfloat16).view(-1, HEAD_DIM)


def bf16_store(pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """Emulation of ``set_index_k_bf16``: one round-to-nearest-even cast, then a scatter."""
    bf16_view(pool)[slots.long()] = keys.to(torch.bfloat16)


def bf16_read(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return bf16_view(pool)[slots.long()].float()


# ---------------------------------------------------------------------------------------------
# fp4-sim: e2m1 with a power-of-two scale per 32 values (DeepSeek V4 QAT)
# ---------------------------------------------------------------------------------------------

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def ceil_pow2(x: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= x for positive finite fp32 x, exact at powers of two (bit math)."""
    bits = x.float().contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exponent << 23).view(torch.float32)


def round_e2m1(s: torch.Tensor) -> torch.Tensor:
    """Round values in [-6, 6] to the e2m1 grid, ties to even (even = last mantissa bit 0).

    On each binade the grid is uniform (0.5 below 2, 1 in [2, 4), 2 in [4, 6]), so rounding
    magnitude / step half-to-even lands on the even grid point exactly as a hardware cast does.
    """
    mag = s.abs()
    step = torch.where(mag < 2.0, 0.5, torch.where(mag < 4.0, 1.0, 2.0))
    return torch.round(mag / step) * step * torch.sign(s)


def fp4_block_scale(x: torch.Tensor) -> torch.Tensor:
    """ue8m0 scale per 32 values of ``x [..., 128]``: ``[..., 4]`` fp32 powers of two."""
    amax = x.float().unflatten(-1, (-1, FP4_BLOCK)).abs().amax(dim=-1)
    return ceil_pow2(torch.clamp(amax, min=FP4_AMAX_FLOOR) * (1.0 / FP4_MAX))


def fp4_sim(x: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize ``x [..., 128]`` through DeepSeek's fp4 QAT format; returns fp32."""
    scale = fp4_block_scale(x).unsqueeze(-1)
    blocks = x.float().unflatten(-1, (-1, FP4_BLOCK))
    q = round_e2m1((blocks / scale).clamp(-FP4_MAX, FP4_MAX))
    return (q * scale).flatten(-2)


def fp4_reference(x: torch.Tensor) -> torch.Tensor:
    """DeepSeek's reference indexer numerics for one activation (q or key) ``[..., 128]``: its
    tensors are bf16, and ``fp4_act_quant(x, 32, inplace=True)`` writes the quantize-dequantize
    back into that bf16 tensor. So: one RNE rounding to bf16, then :func:`fp4_sim` (whose values
    bf16 holds exactly); returns fp32."""
    return fp4_sim(x.to(torch.bfloat16).float())


# ---------------------------------------------------------------------------------------------
# fp4 as upstream 0.5.21 stores C4 index keys and quantizes q for them
# ---------------------------------------------------------------------------------------------

#: ``_fp4_e2m1_code`` (kernels/ops/attention/dsv4/fp4_indexer.py) and ``quant_fp4_e2m1``
#: (kernels/jit/csrc/deepseek_v4/main_norm_rope.cuh): code index = how many of these |x| exceeds
#: (strictly), so a value exactly between two grid points takes the one nearer zero.
E2M1_UPSTREAM_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
#: upstream's floor on a block's scale (keys) or amax (q), where the reference floors amax at 6*2^-126
FP4_UPSTREAM_FLOOR = 1e-4


def fp4_upstream_codes(scaled: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, bit 3 = sign, no negative zero) of values already divided by their
    block scale, rounded as upstream's C4 path rounds them (``rne=False``): thresholds, ties
    toward zero -- at |x| = 0.75, 1.75 and 3.5 upstream takes 0.5, 1.5 and 3 where the reference
    takes 1, 2 and 4; the other midpoints (0.25, 1.25, 2.5, 5) agree."""
    mag = scaled.float().abs().clamp(max=FP4_MAX)
    idx = torch.zeros_like(mag, dtype=torch.uint8)
    for t in E2M1_UPSTREAM_THRESHOLDS:
        idx += (mag > t).to(torch.uint8)
    sign = ((scaled < 0) & (idx != 0)).to(torch.uint8) << 3
    return idx | sign


def fp4_code_values(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes -> their fp32 values on the grid (unscaled)."""
    grid = torch.tensor(E2M1_GRID, device=codes.device)
    mag = grid[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag)


def fp4_upstream_key_exponents(x: torch.Tensor) -> torch.Tensor:
    """ue8m0 exponent bytes ``[..., 4]`` of keys ``[..., 128]`` as
    ``fp4_indexer.py::quantize_fp4_indexer_row`` computes them: ``sf = max(amax / 6, 1e-4)``
    (IEEE division), exponent = ceil of its binade (``_ceil_ue8m0_exp``), clamped to [1, 254]."""
    amax = x.float().unflatten(-1, (-1, FP4_BLOCK)).abs().amax(dim=-1)
    sf = torch.clamp(amax / FP4_MAX, min=FP4_UPSTREAM_FLOOR)
    bits = sf.contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return exponent.clamp(1, 254).to(torch.uint8)


def _exp_scale(exponents: torch.Tensor) -> torch.Tensor:
    """ue8m0 bytes ``[..., 4]`` -> fp32 powers of two ``[..., 4, 1]`` (one per block of 32)."""
    return (exponents.to(torch.int32) << 23).view(torch.float32).unsqueeze(-1)


def fp4_upstream_quantize_keys(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys ``[n, 128]`` (the compressor's fp32 output) -> (codes uint8 ``[n, 128]``, exponent
    bytes ``[n, 4]``), as ``store_fp4_index_k_cache(..., rne=False)`` -- the C4 pool's
    ``set_index_fp4`` (``DeepSeekV4IndexerPool.index_k_rne = False``) -- quantizes them."""
    exps = fp4_upstream_key_exponents(x)
    scaled = x.float().unflatten(-1, (-1, FP4_BLOCK)) / _exp_scale(exps)
    return fp4_upstream_codes(scaled).flatten(-2), exps


def fp4_upstream_q(q_rot: torch.Tensor) -> torch.Tensor:
    """The fp4 q of upstream's C4 fp4 indexer (``main_norm_rope.cuh::
    fused_q_indexer_rope_hadamard_fp4_quant``), dequantized, fp32 ``[..., 128]``: the kernel rounds
    its Hadamard output to bf16 (``cast<DType>``), then per 32 values ``scale_raw = max(1e-4,
    amax) / 6``, ``cast_to_ue8m0`` (the power of two at or above), codes by ``quant_fp4_e2m1``'s
    thresholds. Its head weights carry no q scale (``weights_out = weight * weight_scale``).
    The kernel also rounds the RoPE tail to bf16 before the Hadamard; ``q_rot`` here was rotated
    in fp32 in one go, so only the last rounding is reproduced."""
    xb = q_rot.to(torch.bfloat16).float().unflatten(-1, (-1, FP4_BLOCK))
    amax = xb.abs().amax(dim=-1, keepdim=True)
    scale = ceil_pow2(torch.clamp(amax, min=FP4_UPSTREAM_FLOOR) / FP4_MAX)
    return (fp4_code_values(fp4_upstream_codes(xb / scale)) * scale).flatten(-2)


# e2m1 code -> value; bit 3 is the sign, low nibble of a byte = the even dim
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def fp4_decode(codes: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 ``[..., D/2]`` (low nibble = even dim) and ue8m0 exponents ``[..., D/32]``
    (value ``2^(e - 127)``) -> fp32 ``[..., D]``, exactly."""
    u = codes.view(torch.uint8)
    nibbles = torch.stack([u & 0x0F, u >> 4], dim=-1).flatten(-2).long()
    values = torch.tensor(E2M1_VALUES, device=u.device)[nibbles]
    scale = torch.exp2(exponents.to(torch.float32) - 127.0).repeat_interleave(FP4_BLOCK, dim=-1)
    return values * scale


def fp4_pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``[n, 128]`` -> bytes ``[n, 64]``: element 2i in the low nibble of byte i, 2i+1 high."""
    return (codes[:, 0::2] & 0x0F) | ((codes[:, 1::2] & 0x0F) << 4)


def fp4_write(pool: torch.Tensor, slots: torch.Tensor, codes: torch.Tensor, exps: torch.Tensor) -> None:
    """Scatter into upstream's 68-B page layout (``_store_fp4_index_k_cache_kernel``): bytes
    ``[o*64, o*64+64)`` of a page hold offset ``o``'s packed codes, bytes ``[64*64 + o*4, +4)``
    its four exponents."""
    page, off = _slot_page_offset(slots)
    ar_v = torch.arange(FP4_PAYLOAD_BYTES, device=pool.device)
    ar_s = torch.arange(4, device=pool.device)
    pool[page.unsqueeze(1), (off * FP4_PAYLOAD_BYTES).unsqueeze(1) + ar_v] = fp4_pack(codes)
    pool[page.unsqueeze(1), (PAGE_SLOTS * FP4_PAYLOAD_BYTES + off * 4).unsqueeze(1) + ar_s] = exps


def fp4_store(pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """Emulation of ``DeepSeekV4IndexerPool.set_index_fp4`` on the C4 pool."""
    codes, exps = fp4_upstream_quantize_keys(keys)
    fp4_write(pool, slots, codes, exps)


def fp4_read(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Key values fp32 ``[n, 128]`` of ``slots`` from a 68-B fp4 pool (the scorer's view)."""
    page, off = _slot_page_offset(slots)
    ar_v = torch.arange(FP4_PAYLOAD_BYTES, device=pool.device)
    ar_s = torch.arange(4, device=pool.device)
    payload = pool[page.unsqueeze(1), (off * FP4_PAYLOAD_BYTES).unsqueeze(1) + ar_v]
    exps = pool[page.unsqueeze(1), (PAGE_SLOTS * FP4_PAYLOAD_BYTES + off * 4).unsqueeze(1) + ar_s]
    return fp4_decode(payload, exps)


def f32_view(pool: torch.Tensor) -> torch.Tensor:
    return pool.view(torch.float32).view(-1, HEAD_DIM)


def f32_store(pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    f32_view(pool)[slots.long()] = keys.float()


def f32_read(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return f32_view(pool)[slots.long()]


# ---------------------------------------------------------------------------------------------
# Candidate 132-byte formats (what fp8's bytes could hold instead), emulated for tier 2 only
# ---------------------------------------------------------------------------------------------

INT8_MAX = 127.0
FP8_BLOCK = 32


def int8_sim(x: torch.Tensor) -> torch.Tensor:
    """int8 codes with one fp32 scale per key (128 + 4 = 132 B): ``scale = absmax / 127``,
    ``code = round_half_even(x / scale)``; returns the dequantized fp32 values."""
    xf = x.float()
    scale = torch.clamp(xf.abs().amax(dim=-1, keepdim=True), min=FP8_SCALE_FLOOR) / INT8_MAX
    return torch.round(xf / scale).clamp(-INT8_MAX, INT8_MAX) * scale


def fp8_block32_sim(x: torch.Tensor) -> torch.Tensor:
    """e4m3 codes with a power-of-two (ue8m0) scale per 32 values (128 + 4 x 1 = 132 B): each
    block's scale is the smallest power of two >= amax / 448; returns the dequantized values
    (exactly representable in bf16: 4 significant bits times a power of two)."""
    blocks = x.float().unflatten(-1, (-1, FP8_BLOCK))
    scale = ceil_pow2(torch.clamp(blocks.abs().amax(dim=-1, keepdim=True), min=FP4_AMAX_FLOOR) / FP8_MAX)
    codes = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (codes * scale).flatten(-2)


# ---------------------------------------------------------------------------------------------
# q: fp8 per (row, head) with the scale folded into the weights
# ---------------------------------------------------------------------------------------------


def quantize_q(
    q_rot: torch.Tensor, w_raw: torch.Tensor, weight_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q_rot [Q,H,128]`` fp32 (roped + Hadamard-rotated), ``w_raw [Q,H]`` -> (q e4m3 ``[Q,H,128]``,
    weights ``[Q,H]`` fp32 = w_raw * weight_scale * q_scale), as the fused q kernel writes them."""
    codes, scale = fp8_quantize_rows(q_rot)
    w = (w_raw.float() * torch.tensor(weight_scale, dtype=torch.float32, device=w_raw.device)) * scale
    return codes.view(torch.float8_e4m3fn), w
