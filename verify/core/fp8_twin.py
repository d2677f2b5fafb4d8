"""Triton fp8 twin of the bf16 paged-logits kernel: the fp8 baseline of the read bench.

The bench times it beside DeepGEMM's own ``fp8_paged_mqa_logits`` where a working DeepGEMM
imports (checked against this twin first), and alone where none does (DeepGEMM's PyPI wheel
crashes against the GPU machine's torch; the GPU runner's ``deepgemm`` stage builds one from
source); the forward tier's DeepGEMM stand-in scores with it there. It has the bf16 kernel's
structure (1-D split-major grid from shapes, ``split_n`` keys per program, ``BLOCK_N`` key
tiles through the page table, one tensor-core dot per tile, ReLU, fp32 head-weighted sum,
``-inf`` past the row's length) but reads upstream's fp8 index-K pages: per page 64 x 128
fp8 e4m3 bytes, then 64 fp32 scales (132 B per key), and multiplies each key's logit by its
scale (``relu(s * x) = s * relu(x)`` for the positive scale), as DeepGEMM does. q must be fp8
(as DeepGEMM's); the dot runs fp8 x fp8 -> fp32 on the tensor cores.

Not part of the patch series. Under ``TRITON_INTERPRET=1`` it reads raw bytes and decodes
fp8 by integer arithmetic (interpreted fp8 loads are unreliable), so CPU tests can check it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

PAGE = 64
DIM = 128
FP8_PAGE_BYTES = PAGE * (DIM + 4)


class LaunchConfig(Protocol):
    """What the twin reads from a config (the bf16 kernel's config class fits)."""

    block_n: int
    split_n: int
    swap_ab: bool
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class TwinConfig:
    block_n: int = 128
    split_n: int = 0
    swap_ab: bool = True
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_CONFIG = TwinConfig()


@triton.jit
def _e4m3_bits_to_f32(x):
    b = x.to(tl.int32) & 0xFF
    exp = (b >> 3) & 0xF
    man = b & 0x7
    normal = (((exp + 120) << 23) | (man << 20)).to(tl.float32, bitcast=True)
    subnormal = man.to(tl.float32) * 0.001953125
    mag = tl.where(exp == 0, subnormal, normal)
    return tl.where((b & 0x80) != 0, -mag, mag)


@triton.jit
def _fp8_paged_mqa_logits_twin_kernel(
    q_ptr,  # [rows, H, 128] fp8 (raw bytes under the interpreter)
    k_ptr,  # pool bytes as fp8: page p, slot s at p * stride_kp + s * 128
    sc_ptr,  # the same pool as fp32: scale of slot s at p * stride_sp + 64 * 32 + s
    w_ptr,
    lens_ptr,
    pt_ptr,
    out_ptr,
    rows,
    n_out,
    max_pages,
    split_n,
    stride_qr,
    stride_qh,
    stride_kp,
    stride_sp,
    stride_wr,
    stride_lr,
    stride_ptr,
    stride_or,
    H: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SWAP_AB: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    split = pid // rows
    row = pid - split * rows
    row64 = row.to(tl.int64)

    seq_len = tl.load(lens_ptr + row64 * stride_lr).to(tl.int32)
    visible = tl.minimum(tl.maximum(seq_len, 0), tl.minimum(n_out, max_pages * PAGE))
    lo = split * split_n
    hi = tl.minimum(lo + split_n, n_out)
    valid_hi = tl.minimum(hi, visible)

    offs_n = tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D)
    out_row = out_ptr + row64 * stride_or
    pt_row = pt_ptr + row64 * stride_ptr

    if lo < valid_hi:
        q_row = q_ptr + row64 * stride_qr
        w = tl.load(w_ptr + row64 * stride_wr + offs_h).to(tl.float32)
        if SWAP_AB:
            q_offs = offs_d[:, None] + offs_h[None, :] * stride_qh
        else:
            q_offs = offs_h[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_row + q_offs)
        if INTERPRET:
            q = _e4m3_bits_to_f32(q)
        j = lo + offs_n
        page_next = tl.load(pt_row + j // PAGE, mask=j < valid_hi, other=0)
        for n0 in range(lo, valid_hi, BLOCK_N):
            j = n0 + offs_n
            mask = j < valid_hi
            # Page ids one tile ahead, as in the bf16 kernel (keeps key tiles in flight).
            page = page_next.to(tl.int64)
            j_next = j + BLOCK_N
            page_next = tl.load(pt_row + j_next // PAGE, mask=j_next < valid_hi, other=0)
            slot = (j % PAGE).to(tl.int64)
            k_ptrs = k_ptr + (page * stride_kp + slot * D)[:, None] + offs_d[None, :]
            if INTERPRET:
                k = tl.load(k_ptrs, mask=mask[:, None], other=0)
            else:
                # No `other`: Triton cannot cast a constant to fp8; masked keys' logits
                # are replaced by -inf below, and a key only feeds its own logit.
                k = tl.load(k_ptrs, mask=mask[:, None])
            scale = tl.load(sc_ptr + page * stride_sp + PAGE * (D // 4) + slot, mask=mask, other=0.0)
            if INTERPRET:
                k = _e4m3_bits_to_f32(k)
            if SWAP_AB:
                if INTERPRET:
                    s = tl.dot(k, q, input_precision="ieee")
                else:
                    s = tl.dot(k, q)
                logit = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
            else:
                if INTERPRET:
                    s = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                logit = tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0)
            logit = tl.where(mask, logit * scale, float("-inf"))
            tl.store(out_row + j, logit, mask=j < hi)

    first_masked = lo + tl.cdiv(tl.maximum(valid_hi - lo, 0), BLOCK_N) * BLOCK_N
    for n0 in range(first_masked, hi, BLOCK_N):
        j = n0 + offs_n
        tl.store(out_row + j, tl.full([BLOCK_N], float("-inf"), tl.float32), mask=j < hi)


INTERPRETED = not isinstance(_fp8_paged_mqa_logits_twin_kernel, JITFunction)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def auto_split_n(rows: int, n_out: int, block_n: int, num_sms: int) -> int:
    """Same rule as the bf16 kernel: about 4 programs per SM, 2 blocks .. 4096 keys each."""
    per_program = triton.cdiv(rows * n_out, 4 * num_sms)
    split = triton.next_power_of_2(max(per_program, 1))
    return min(max(split, 2 * block_n), max(4096, block_n))


def _as_fp8_pool(kv_cache: torch.Tensor) -> torch.Tensor:
    if kv_cache.dtype != torch.uint8:
        kv_cache = kv_cache.view(torch.uint8)
    flat = kv_cache.reshape(kv_cache.shape[0], -1)
    if flat.shape[1] != FP8_PAGE_BYTES or flat.stride(1) != 1 or flat.stride(0) % 4:
        raise ValueError(
            f"fp8 index-K pool must be uint8 [pages, {FP8_PAGE_BYTES}], got {tuple(kv_cache.shape)}"
        )
    return flat


def fp8_paged_mqa_logits_twin(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    schedule_metadata: Any,
    max_seq_len: int,
    clean_logits: bool = True,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """fp32 ``[rows, max_seq_len]`` fp8 index logits; DeepGEMM's argument order and
    ``-inf`` past each row's length (whatever ``clean_logits`` says)."""
    del schedule_metadata, clean_logits
    if q.dim() == 4:
        if q.shape[1] != 1:
            raise ValueError(f"next_n > 1 is not supported, got {tuple(q.shape)}")
        q = q[:, 0]
    if q.dtype != torch.float8_e4m3fn or q.shape[-1] != DIM:
        raise ValueError(f"q must be fp8 e4m3 [rows, H, 128], got {q.dtype} {tuple(q.shape)}")
    rows, heads, _ = q.shape
    seq_lens = seq_lens.reshape(-1)
    pool = _as_fp8_pool(kv_cache)
    out = torch.empty((rows, int(max_seq_len)), dtype=torch.float32, device=q.device)
    if rows == 0 or max_seq_len == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    page_table = page_table if page_table.stride(-1) == 1 else page_table.contiguous()
    weights = weights if weights.stride(-1) == 1 else weights.contiguous()
    cfg = config or DEFAULT_CONFIG
    split_n = cfg.split_n or auto_split_n(rows, int(max_seq_len), cfg.block_n, _num_sms(q.device))
    grid = (rows * triton.cdiv(int(max_seq_len), split_n),)
    if INTERPRETED:
        q_arg, k_arg = q.view(torch.uint8), pool
    else:
        q_arg, k_arg = q, pool.view(torch.float8_e4m3fn)
    scales = pool.view(torch.float32)
    _fp8_paged_mqa_logits_twin_kernel[grid](
        q_arg,
        k_arg,
        scales,
        weights,
        seq_lens,
        page_table,
        out,
        rows,
        int(max_seq_len),
        page_table.shape[1],
        split_n,
        q.stride(0),
        q.stride(1),
        pool.stride(0),
        scales.stride(0),
        weights.stride(0),
        seq_lens.stride(0),
        page_table.stride(0),
        out.stride(0),
        H=heads,
        D=DIM,
        PAGE=PAGE,
        BLOCK_N=cfg.block_n,
        SWAP_AB=cfg.swap_ab,
        INTERPRET=INTERPRETED,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
