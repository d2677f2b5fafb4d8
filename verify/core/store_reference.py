"""fp32 torch reference of the indexer-key store math, and bf16 ulp comparison.

The fused kernel (``fused_norm_rope_indexer``) turns each compressed key ``kv[i]`` (fp32, 128
values) into the stored index key: RMSNorm with a weight, RoPE on the last 64 dims at
position ``positions[i]``, a 128-point Hadamard transform scaled by ``128 ** -0.5``. The fp8
path quantizes that fp32 vector; the bf16 path must round it once to bf16 (round to nearest
even). This module computes the same vector in plain fp32 torch so the stored keys can be
checked against it, on any device (CPU for the tests of this module, CUDA on the GPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

INDEX_HEAD_DIM = 128
ROPE_DIM = 64
# Elements where the fp32 reference is below this fraction of its row's largest magnitude sit
# under the fp32 rounding noise of a 128-term transform: there, "1 bf16 ulp" would demand more
# precision than fp32 itself carries, so an absolute bound of this size applies instead.
DEFAULT_NOISE_REL = 2.0**-20


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, in fp32, in the kernel's order ``(x * rsqrt(ms + eps)) * w``."""
    x = x.float()
    norm_factor = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    return x * norm_factor * weight.float()


def rope_tail(x: torch.Tensor, freqs: torch.Tensor, rope_dim: int = ROPE_DIM) -> torch.Tensor:
    """Rotate the last ``rope_dim`` values of each row by complex ``freqs`` (one row per key).

    Upstream's convention: the rope tail is read as interleaved (real, imag) pairs, pair ``j``
    is multiplied by ``freqs[:, j]`` (``freqs_cis`` rows, complex64 ``[n, rope_dim // 2]``).
    """
    n, dim = x.shape
    if freqs.shape != (n, rope_dim // 2) or not freqs.is_complex():
        raise ValueError(
            f"freqs must be complex [{n}, {rope_dim // 2}], got {tuple(freqs.shape)} {freqs.dtype}"
        )
    nope, tail = x[:, : dim - rope_dim], x[:, dim - rope_dim :]
    pairs = tail.float().reshape(n, rope_dim // 2, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    f_re, f_im = freqs.real.float(), freqs.imag.float()
    rotated = torch.stack((re * f_re - im * f_im, re * f_im + im * f_re), dim=-1)
    return torch.cat((nope.float(), rotated.reshape(n, rope_dim)), dim=-1)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform (Sylvester order) over the last dim.

    Butterflies run over index bit 0, then 1, ... -- the order the kernel uses (two in-register
    stages, then cross-lane stages), so identical inputs give bit-identical fp32 sums.
    """
    n, dim = x.shape
    if dim & (dim - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {dim}")
    y = x.float()
    half = 1
    while half < dim:
        blocks = y.reshape(n, dim // (2 * half), 2, half)
        low, high = blocks[:, :, 0, :], blocks[:, :, 1, :]
        y = torch.stack((low + high, low - high), dim=2).reshape(n, dim)
        half *= 2
    return y


def hadamard_matrix(dim: int) -> torch.Tensor:
    """Sylvester Hadamard matrix ``H[i, j] = (-1) ** popcount(i & j)`` (for tests of fwht)."""
    idx = torch.arange(dim)
    bits = idx[:, None] & idx[None, :]
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return 1.0 - 2.0 * parity.float()


def index_k_reference(
    kv: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The fp32 vector the store kernels quantize: Hadamard(RoPE(RMSNorm(kv))) * 128 ** -0.5."""
    if kv.dim() != 2 or kv.shape[1] != INDEX_HEAD_DIM:
        raise ValueError(f"kv must be [n, {INDEX_HEAD_DIM}], got {tuple(kv.shape)}")
    if positions.shape != (kv.shape[0],):
        raise ValueError(f"positions must be [{kv.shape[0]}], got {tuple(positions.shape)}")
    normed = rms_norm(kv, weight, eps)
    roped = rope_tail(normed, freqs_cis[positions.long()])
    result: torch.Tensor = fwht(roped) * (INDEX_HEAD_DIM**-0.5)
    return result


def bf16_ordered(x: torch.Tensor) -> torch.Tensor:
    """Map bf16 bit patterns to integers whose difference counts ulps (+0 and -0 both map to 0)."""
    if x.dtype != torch.bfloat16:
        raise TypeError(f"expected bfloat16, got {x.dtype}")
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    magnitude = bits & 0x7FFF
    return torch.where(bits & 0x8000 != 0, -magnitude, magnitude)


def bf16_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ulps| between two bf16 tensors; any NaN counts as an infinite (2**30) distance."""
    dist = (bf16_ordered(a) - bf16_ordered(b)).abs()
    nan = torch.isnan(a) | torch.isnan(b)
    return torch.where(nan, torch.full_like(dist, 2**30), dist)


@dataclass
class Bf16Comparison:
    """Outcome of comparing stored bf16 keys with an expected tensor, element by element."""

    elements: int
    exact: int
    within_ulp: int  # includes exact
    noise_floor_only: int  # beyond max_ulp, but within the fp32 noise floor of tiny values
    failures: int
    max_ulp: int
    max_abs_err: float
    max_ulp_allowed: int
    noise_rel: float
    worst: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failures == 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def compare_bf16(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    row_scale: torch.Tensor | None = None,
    max_ulp: int = 1,
    noise_rel: float = DEFAULT_NOISE_REL,
    keep_worst: int = 5,
) -> Bf16Comparison:
    """Compare bf16 ``actual`` with ``expected`` (fp32: rounded once to bf16 first; or bf16).

    An element passes when it is within ``max_ulp`` bf16 ulps of the rounded expectation, or,
    for values tiny against their row, when ``|actual - expected| <= noise_rel * row_scale``
    (``row_scale`` defaults to the row's largest |expected|).
    """
    if actual.dtype != torch.bfloat16:
        raise TypeError(f"actual must be bfloat16, got {actual.dtype}")
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    expected_f = expected.float()
    expected_bf16 = expected if expected.dtype == torch.bfloat16 else expected_f.to(torch.bfloat16)
    if row_scale is None:
        row_scale = (
            expected_f.abs().amax(dim=-1, keepdim=True) if expected_f.dim() > 1 else expected_f.abs().max()
        )
    ulp = bf16_ulp_distance(actual, expected_bf16)
    abs_err = (actual.float() - expected_f).abs()
    within = ulp <= max_ulp
    near_floor = abs_err <= noise_rel * row_scale.float()
    passed = within | near_floor
    failed = ~passed
    finite_err = torch.where(torch.isfinite(abs_err), abs_err, torch.full_like(abs_err, float("inf")))

    worst: list[dict[str, Any]] = []
    if ulp.numel() and keep_worst > 0:
        # Report failures first, else the largest ulp distances.
        score = ulp.to(torch.int64) + failed.to(torch.int64) * (2**40)
        top = torch.topk(score.flatten(), k=min(keep_worst, score.numel()))
        for flat in top.indices.tolist():
            index = list(torch.unravel_index(torch.tensor(flat), ulp.shape))
            worst.append(
                {
                    "index": [int(i) for i in index],
                    "actual": float(actual.flatten()[flat]),
                    "expected": float(expected_f.flatten()[flat]),
                    "ulp": int(ulp.flatten()[flat]),
                    "passed": bool(passed.flatten()[flat]),
                }
            )
    return Bf16Comparison(
        elements=int(ulp.numel()),
        exact=int((ulp == 0).sum()),
        within_ulp=int(within.sum()),
        noise_floor_only=int((near_floor & ~within).sum()),
        failures=int(failed.sum()),
        max_ulp=int(ulp.max()) if ulp.numel() else 0,
        max_abs_err=float(finite_err.max()) if finite_err.numel() else 0.0,
        max_ulp_allowed=max_ulp,
        noise_rel=noise_rel,
        worst=worst,
    )
