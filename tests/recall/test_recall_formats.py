"""Storage-format emulation against hand-computed values and the upstream byte layouts."""

import struct

import pytest
import torch

from verify.core import formats as F


def test_fp8_hand_computed_codes():
    # amax 448 -> scale exactly 1.0, so codes are the plain e4m3 encodings (bias 7, RNE)
    x = torch.zeros(1, 128)
    vals = [448.0, 1.0, 1.0625, 1.1875, -2.5, 2.0**-9, 2.0**-10, 0.0, 3 * 2.0**-10]
    x[0, : len(vals)] = torch.tensor(vals)
    codes, scale = F.fp8_quantize_rows(x)
    assert scale.item() == 1.0
    # 448=0_1111_110, 1.0=0_0111_000, 1.0625 ties to even -> 1.0, 1.1875 ties to even -> 1.25=0_0111_010,
    # -2.5=1_1000_010, 2^-9 = min subnormal 0_0000_001, 2^-10 ties to even -> 0, 3*2^-10 -> 2*2^-9 = 0x02
    assert codes[0, : len(vals)].tolist() == [0x7E, 0x38, 0x38, 0x3A, 0xC2, 0x01, 0x00, 0x00, 0x02]


def test_fp8_scale_rule_and_saturation():
    x = torch.zeros(2, 128)
    x[0, 0], x[0, 1] = 3.0, -1.5
    codes, scale = F.fp8_quantize_rows(x)
    assert scale[0].item() == (torch.tensor(3.0) / 448.0).item()  # plain fp32, not a power of two
    assert codes[0, 0].item() == 0x7E and codes[0, 1].item() == 0xF6  # 448 = 0_1111_110; -224 = 1_1110_110
    assert F.fp8_codes_to_float(codes[0, 1:2]).item() == -224.0
    # all-zero key: scale floors at 1e-4 / 448, codes zero (no 0/0)
    assert scale[1].item() == (torch.tensor(1e-4) / 448.0).item()
    assert int(codes[1].abs().sum()) == 0


def test_fp8_rounding_bound():
    torch.manual_seed(0)
    x = torch.randn(64, 128) * torch.exp(torch.randn(64, 1))
    codes, scale = F.fp8_quantize_rows(x)
    err = (F.fp8_dequantize(codes, scale) - x).abs()
    bound = F.fp8_half_ulp(x / scale[:, None]) * scale[:, None]
    assert bool((err <= bound * (1 + 1e-6)).all())


def test_fp8_page_layout_is_block_planar_132b():
    pool = F.new_pool("fp8", 3)
    assert pool.shape == (3, 8448) and pool.dtype == torch.uint8
    k = torch.zeros(1, 128)
    k[0, 0], k[0, 127] = 448.0, -1.0
    F.fp8_store(pool, torch.tensor([65]), k)  # page 1, offset 1
    assert pool[1, 128].item() == 0x7E and pool[1, 255].item() == 0xB8
    assert bytes(pool[1, 8196:8200].tolist()) == struct.pack("<f", 1.0)
    touched = torch.zeros_like(pool, dtype=torch.bool)
    touched[1, 128:256] = True
    touched[1, 8196:8200] = True
    assert int(pool[~touched].abs().sum()) == 0
    codes, scale = F.fp8_read(pool, torch.tensor([65]))
    assert scale.item() == 1.0 and F.fp8_dequantize(codes, scale)[0, 127].item() == -1.0
    inter = F.fp8_to_interleaved(pool)
    c2, s2 = F.fp8_read_interleaved(inter, torch.tensor([65]))
    assert torch.equal(c2, codes) and torch.equal(s2, scale)


def test_bf16_page_layout_is_dense_256b():
    pool = F.new_pool("bf16", 3)
    assert pool.shape == (3, 16384)
    k = torch.arange(128, dtype=torch.float32).unsqueeze(0) + 0.3
    F.bf16_store(pool, torch.tensor([130]), k)  # page 2, offset 2
    raw = pool[2, 512:768].contiguous().view(torch.bfloat16)
    assert torch.equal(raw, k[0].to(torch.bfloat16))
    assert int(pool[:, :512].abs().sum()) == 0 and int(pool[2, 768:].abs().sum()) == 0
    assert torch.equal(F.bf16_read(pool, torch.tensor([130])), k.to(torch.bfloat16).float())


E2M1 = torch.tensor(F.E2M1_GRID)


def test_fp4_sim_grid_and_power_of_two_scales():
    torch.manual_seed(1)
    x = torch.randn(32, 128) * torch.exp(2 * torch.randn(32, 1))
    y = F.fp4_sim(x)
    scale = F.fp4_block_scale(x)
    assert bool((torch.frexp(scale).mantissa == 0.5).all())  # powers of two
    # the smallest power of two that keeps |x| / scale <= 6
    amax = x.unflatten(-1, (-1, 32)).abs().amax(-1)
    assert bool((amax / scale <= 6).all()) and bool((amax / (scale / 2) > 6).all())
    q = (y.unflatten(-1, (-1, 32)) / scale.unsqueeze(-1)).abs()
    assert bool(torch.isin(q, E2M1).all())
    assert torch.equal(y, y.to(torch.bfloat16).float())  # bf16 holds fp4-sim values exactly
    # nearest grid point
    err = (y - x).abs().unflatten(-1, (-1, 32))
    assert bool((err <= scale.unsqueeze(-1) * 1.0 + 1e-12).all())


@pytest.mark.parametrize(
    "v,want",
    [
        (0.25, 0.0),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
        (-0.75, -1.0),
        (5.9, 6.0),
        (0.26, 0.5),
    ],
)
def test_e2m1_ties_to_even(v, want):
    assert F.round_e2m1(torch.tensor([v])).item() == want


def test_q_quantization_folds_scale_into_weights():
    torch.manual_seed(2)
    q = torch.randn(3, 64, 128)
    w_raw = torch.randn(3, 64).to(torch.bfloat16)
    q8, w = F.quantize_q(q, w_raw, 0.01)
    assert q8.dtype == torch.float8_e4m3fn
    scale = F.fp8_row_scale(q)
    assert torch.allclose(w, w_raw.float() * 0.01 * scale, rtol=1e-6)
    assert float(q8.float().abs().amax()) == 448.0
