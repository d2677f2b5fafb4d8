"""CPU tests of the store-parity suite's pure-torch parts: reference math, ulp compare, layout."""

from __future__ import annotations

import math

import pytest
import torch

from verify.core.store_cases import (
    DEFAULT_LENGTHS,
    Chunk,
    DecodeCase,
    make_prefill_case,
    split_chunks,
)
from verify.core.store_layout import (
    BF16_LAYOUT,
    FP8_LAYOUT,
    bf16_slot_view,
    canary_report,
    decode_bf16_slots,
    decode_fp8_slots,
    fill_canary,
    make_page_table,
    slots_for_keys,
    written_byte_mask,
)
from verify.core.store_reference import (
    bf16_ulp_distance,
    compare_bf16,
    fwht,
    hadamard_matrix,
    index_k_reference,
    rms_norm,
    rope_tail,
)


def _freqs(max_pos: int) -> torch.Tensor:
    inv = 40000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    ang = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return torch.polar(torch.ones_like(ang), ang).to(torch.complex64)


# ---------------------------------------------------------------- reference math


def test_fwht_matches_sylvester_matrix() -> None:
    x = torch.randn(7, 128, dtype=torch.float64)
    h = hadamard_matrix(128).double()
    torch.testing.assert_close(fwht(x.float()).double(), x @ h, rtol=1e-5, atol=1e-5)
    # Orthogonal once scaled: the Hadamard keeps the norm (what makes it free for q . k).
    assert torch.allclose(h @ h.T, 128 * torch.eye(128, dtype=torch.float64))


def test_fwht_butterfly_order_is_bit_exact_for_the_kernel_pairing() -> None:
    # Stage for bit b pairs i and i + 2**b: (a + c, a - c). A manual loop in that order gives
    # the same fp32 bits, which is what lets the reference match the kernel's sums exactly.
    x = torch.randn(3, 128)
    y = x.clone()
    for bit in range(7):
        step = 1 << bit
        nxt = y.clone()
        for i in range(128):
            if i & step == 0:
                nxt[:, i] = y[:, i] + y[:, i + step]
                nxt[:, i + step] = y[:, i] - y[:, i + step]
        y = nxt
    assert torch.equal(fwht(x), y)


def test_rms_norm_definition() -> None:
    x = torch.randn(5, 128)
    w = torch.rand(128) + 0.5
    expect = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(rms_norm(x, w, 1e-6).double(), expect, rtol=1e-6, atol=1e-6)


def test_rope_tail_rotates_interleaved_pairs_of_the_last_64_dims() -> None:
    x = torch.randn(4, 128)
    freqs = _freqs(16)[torch.tensor([0, 3, 7, 15])]
    out = rope_tail(x, freqs)
    assert torch.equal(out[:, :64], x[:, :64])  # nope part untouched
    pairs = torch.view_as_complex(x[:, 64:].reshape(4, 32, 2).contiguous())
    expect = torch.view_as_real(pairs * freqs).reshape(4, 64)
    torch.testing.assert_close(out[:, 64:], expect, rtol=1e-6, atol=1e-6)
    # Position 0 is the identity rotation.
    assert torch.equal(out[0], x[0])
    # A rotation keeps the norm of every pair.
    torch.testing.assert_close(out[:, 64:].norm(dim=-1), x[:, 64:].norm(dim=-1))


def test_rope_tail_rejects_wrong_freqs() -> None:
    with pytest.raises(ValueError):
        rope_tail(torch.randn(2, 128), torch.randn(2, 32))  # not complex


def test_index_k_reference_matches_a_float64_composition() -> None:
    torch.manual_seed(0)
    kv = torch.randn(9, 128) * 3
    w = torch.rand(128) + 0.5
    freqs = _freqs(64)
    pos = torch.tensor([0, 4, 8, 12, 16, 20, 24, 28, 60])
    got = index_k_reference(kv, w, 1e-6, freqs, pos)
    k = kv.double()
    k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    tail = torch.view_as_complex(k[:, 64:].reshape(9, 32, 2).contiguous()) * freqs[pos].to(torch.complex128)
    k = torch.cat([k[:, :64], torch.view_as_real(tail).reshape(9, 64)], -1)
    expect = k @ hadamard_matrix(128).double() / math.sqrt(128)
    torch.testing.assert_close(got.double(), expect, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- ulp compare


def test_bf16_ulp_distance_counts_representable_steps() -> None:
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    nxt = torch.nextafter(one.float(), torch.tensor([2.0])).to(torch.bfloat16)  # rounds to 1.0
    assert bf16_ulp_distance(one, nxt).item() == 0
    step = torch.tensor([1.0 + 2**-7], dtype=torch.bfloat16)  # one bf16 ulp above 1.0
    assert bf16_ulp_distance(one, step).item() == 1
    # Across zero: +0 and -0 are the same, the smallest subnormals are one step from zero each.
    zeros = torch.tensor([0.0, -0.0], dtype=torch.bfloat16)
    assert bf16_ulp_distance(zeros[:1], zeros[1:]).item() == 0
    tiny = torch.tensor([0x0001], dtype=torch.int16).view(torch.bfloat16)
    assert bf16_ulp_distance(tiny, -tiny).item() == 2
    nan = torch.tensor([float("nan")], dtype=torch.bfloat16)
    assert bf16_ulp_distance(nan, one).item() == 2**30


def test_compare_bf16_accepts_a_single_rounding_and_one_ulp() -> None:
    ref = torch.randn(64, 128)
    actual = ref.to(torch.bfloat16)
    result = compare_bf16(actual, ref)
    assert result.ok and result.exact == result.elements and result.max_ulp == 0
    bits = actual.view(torch.int16).clone()
    bits[3, 5] += 1  # one ulp away
    result = compare_bf16(bits.view(torch.bfloat16), ref)
    assert result.ok and result.max_ulp == 1 and result.exact == result.elements - 1


def test_compare_bf16_rejects_double_rounding_and_wrong_values() -> None:
    ref = torch.randn(256, 128)
    # Rounding through fp8 first is the kind of precision loss the check exists to catch.
    coarse = ref.to(torch.float8_e4m3fn).float().to(torch.bfloat16)
    assert not compare_bf16(coarse, ref).ok
    swapped = ref.flip(-1).to(torch.bfloat16)
    result = compare_bf16(swapped, ref)
    assert not result.ok and result.worst and not result.worst[0]["passed"]


def test_compare_bf16_noise_floor_only_for_values_tiny_against_their_row() -> None:
    ref = torch.ones(1, 128)
    ref[0, 0] = 1e-9  # far below fp32 noise of a 128-term sum of O(1) values
    actual = ref.to(torch.bfloat16).clone()
    actual[0, 0] = 3e-9  # many ulps away, but inside the floor (2**-20 * 1.0)
    result = compare_bf16(actual, ref)
    assert result.ok and result.noise_floor_only == 1 and result.max_ulp > 1
    actual[0, 0] = 1e-5  # above the floor: a real error
    assert not compare_bf16(actual, ref).ok


# ---------------------------------------------------------------- layout, page tables, canaries


def test_layout_geometry_matches_the_agreed_pool_format() -> None:
    assert BF16_LAYOUT.slot_bytes == 256 and BF16_LAYOUT.page_bytes == 16384
    assert FP8_LAYOUT.slot_bytes == 132 and FP8_LAYOUT.page_bytes == 8448
    slots = torch.tensor([0, 1, 63, 64, 130])
    ((starts, length),) = BF16_LAYOUT.byte_ranges(slots)
    assert length == 256 and starts.tolist() == [s * 256 for s in slots.tolist()]  # dense rows
    (v, vl), (s, sl) = FP8_LAYOUT.byte_ranges(slots)
    assert (vl, sl) == (128, 4)
    assert v.tolist() == [0, 128, 63 * 128, 8448, 2 * 8448 + 2 * 128]
    assert s.tolist() == [8192, 8196, 8192 + 63 * 4, 8448 + 8192, 2 * 8448 + 8192 + 8]


def test_page_table_is_a_shuffled_injection_avoiding_excluded_pages() -> None:
    gen = torch.Generator().manual_seed(3)
    table = make_page_table(20, 30, gen, exclude=(29,))
    assert len(set(table.tolist())) == 20 and 29 not in table.tolist()
    assert table.tolist() != list(range(20))
    with pytest.raises(ValueError):
        make_page_table(30, 30, gen, exclude=(0,))


def test_slots_follow_the_page_table() -> None:
    table = torch.tensor([5, 2, 9])
    keys = torch.tensor([0, 63, 64, 127, 128, 191])
    assert slots_for_keys(table, keys).tolist() == [320, 383, 128, 191, 576, 639]


def test_written_mask_and_canary_report_find_stray_bytes() -> None:
    num_pages = 4
    buf = torch.empty(num_pages, FP8_LAYOUT.page_bytes, dtype=torch.uint8)
    before = fill_canary(buf, seed=1)
    assert torch.equal(before, buf) and before.float().std() > 50  # random, not constant
    slots = torch.tensor([65, 200])
    mask = written_byte_mask(FP8_LAYOUT, slots, num_pages)
    assert int(mask.sum()) == 2 * 132
    flat = buf.view(-1)
    flat[65 % 64 * 128 + FP8_LAYOUT.page_bytes] ^= 0xFF  # inside slot 65's values: allowed
    assert canary_report(before, buf, mask, FP8_LAYOUT.page_bytes)["ok"]
    flat[3 * FP8_LAYOUT.page_bytes + 7] ^= 0xFF  # page 3 holds slot 200's row 8 only
    report = canary_report(before, buf, mask, FP8_LAYOUT.page_bytes)
    assert not report["ok"] and report["first"] == [{"page": 3, "byte": 7}]


def test_decode_bf16_slots_reads_the_bytes_the_dense_view_addresses() -> None:
    buf = torch.zeros(3, BF16_LAYOUT.page_bytes, dtype=torch.uint8)
    keys = torch.randn(5, 128).to(torch.bfloat16)
    slots = torch.tensor([0, 63, 64, 100, 191])
    bf16_slot_view(buf)[slots] = keys
    got = decode_bf16_slots(buf, slots)
    assert torch.equal(got.view(torch.int16), keys.view(torch.int16))
    # Byte order: the low byte of each bf16 comes first (little endian).
    raw = buf.view(-1)[100 * 256 : 100 * 256 + 2]
    assert int(raw[0]) | int(raw[1]) << 8 == int(keys[3, 0].view(torch.int16)) & 0xFFFF


def test_bf16_slot_view_rejects_wrong_buffers() -> None:
    with pytest.raises(ValueError):
        bf16_slot_view(torch.zeros(2, FP8_LAYOUT.page_bytes, dtype=torch.uint8))


def test_decode_fp8_slots_dequantizes_values_times_scale() -> None:
    buf = torch.zeros(2, FP8_LAYOUT.page_bytes, dtype=torch.uint8)
    values = torch.tensor([[1.0, -2.0] * 64]).to(torch.float8_e4m3fn)
    slot = 70
    page, off = divmod(slot, 64)
    buf[page, off * 128 : off * 128 + 128] = values.view(torch.uint8)[0]
    buf[page, 8192 + off * 4 : 8192 + off * 4 + 4] = torch.tensor([0.5]).view(torch.uint8)
    got = decode_fp8_slots(buf, torch.tensor([slot]))
    assert got[0, :4].tolist() == [0.5, -1.0, 0.5, -1.0]


# ---------------------------------------------------------------- cases


def test_prefill_case_key_positions_and_chunks() -> None:
    for n in DEFAULT_LENGTHS:
        case = make_prefill_case(n, seed=0)
        positions = [p for c in case.chunks for p in c.key_positions()]
        assert len(positions) == n
        assert positions == [4 * k + 3 for k in range(n)]
        assert all(c.extend_len <= 65536 for c in case.chunks)
        assert sum(c.extend_len for c in case.chunks) == case.seq_len
    big = make_prefill_case(65536, seed=0)
    assert len(big.chunks) > 1 and big.chunks[1].prefix_len % 4 != 0  # borders inside windows


def test_split_chunks_and_validation() -> None:
    assert split_chunks(10, 4) == (Chunk(0, 4), Chunk(4, 4), Chunk(8, 2))
    with pytest.raises(ValueError):
        make_prefill_case(-1, seed=0)
    with pytest.raises(ValueError):
        make_prefill_case(1, seed=0, max_chunk_tokens=65537)


def test_decode_case_writes_only_at_window_ends() -> None:
    case = DecodeCase(seq_lens=(4, 5, 8, 7), seed=0)
    assert [case.writes_key(r) for r in range(4)] == [True, False, True, False]
