"""CPU tests of the read-parity suite's and read bench's pure-torch pieces: the oracles (the paged
kernel's and the prefill kernel's), calc_diff, the fp8 page packing of the twin against upstream's
own fp8 reader and layout, the naive gather, the fp8 twin under the interpreter, the bf16 kernels'
launch logic (the refusal of grouped static-split launches) and, with torch stand-ins for the bf16
kernels (tests/parity/kernel_stand_ins.py), tier 1's and the bench's own code: the bf16 kernels
cannot run on a CPU (the interpreter misreads bf16; they carry no interpreter branch), so their
numerics are GPU checks.

Needs the patched upstream on the path:
    PYTHONPATH=/work/main:<patched tree>/python python -m pytest tests/parity/test_read_reference.py
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():
    # Before any Triton kernel module is imported: triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verify.bench.targets import evaluate
from verify.core import fp8_twin
from verify.core.read_reference import (
    FP8_PAGE_BYTES,
    PAGE,
    ReadCase,
    causal_lengths,
    gather_peak_bytes,
    make_read_case,
    naive_gather_logits,
    oracle_logits,
    pack_fp8_pages,
    unpack_fp8_pages,
)
from verify.core.scoring import calc_diff
from verify.core.upstream import (
    UpstreamMissing,
    load_bf16_kernel_module,
    load_upstream_fp8_torch_reader,
)

LENGTHS = [1, 63, 64, 65, 200]


def _brute_force(case: ReadCase, keys: torch.Tensor | None = None) -> torch.Tensor:
    """Element by element, no page-table vectorisation: an independent check of the oracle."""
    keys = case.pool if keys is None else keys
    out = torch.full((case.rows, case.max_seq_len), float("-inf"))
    for r in range(case.rows):
        q = case.q[r, 0].double()
        for j in range(int(case.seq_lens[r])):
            page = int(case.page_table[r, j // PAGE])
            k = keys[page, j % PAGE].double()
            out[r, j] = float(((q @ k).clamp_min(0) * case.weights[r].double()).sum())
    return out


def _upstream(fn_name: str):  # type: ignore[no-untyped-def]
    try:
        return {"kernel": load_bf16_kernel_module, "fp8": load_upstream_fp8_torch_reader}[fn_name]()[0]
    except UpstreamMissing as error:
        pytest.skip(str(error))


# ------------------------------------------------------------------ pure torch


def test_calc_diff() -> None:
    x = torch.tensor([1.0, -2.0, 3.0])
    assert calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)
    assert calc_diff(x, -x) == pytest.approx(2.0)
    assert calc_diff(x, torch.zeros(3)) == pytest.approx(1.0)
    assert calc_diff(torch.zeros(0), torch.zeros(0)) == 0.0
    y = x * (1 + 1e-3)
    # 1 - 2a/(1 + a^2) = (1 - a)^2 / (1 + a^2) ~ 5e-7 for a = 1.001
    assert calc_diff(x, y) == pytest.approx(1e-6 / 2.002, rel=1e-3)


def test_make_read_case_layout() -> None:
    case = make_read_case(LENGTHS + [0], seed=3)
    assert case.q.shape == (6, 1, 64, 128) and case.q.dtype == torch.float8_e4m3fn
    assert case.pool.dtype == torch.bfloat16 and case.pool.shape[1:] == (64, 128)
    assert case.max_seq_len == case.page_table.shape[1] * PAGE
    used = []
    for r, n in enumerate(LENGTHS + [0]):
        pages = -(-n // PAGE)
        row = case.page_table[r]
        used += row[:pages].tolist()
        assert torch.all(row[pages:] == case.poison_page)
    assert len(used) == len(set(used)), "decode rows must own distinct pages"
    assert case.poison_page not in used
    assert torch.isnan(case.pool[case.poison_page].float()).all()
    assert not torch.isnan(case.pool[used].float()).any()
    assert case.pool_bytes().shape == (case.pool.shape[0], 64 * 256)
    assert case.key_bytes() == sum(LENGTHS) * 256


def test_shared_table_and_causal_lengths() -> None:
    lens = causal_lengths(16, 10)
    assert lens == [max(1, (p + 1) // 4) for p in range(24, 40)] and lens[-1] == 10
    assert causal_lengths(8, 1) == [1, 1, 1, 1]
    case = make_read_case(lens, shared_table=True, seed=1)
    assert torch.all(case.page_table == case.page_table[0])


@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.bfloat16])
def test_oracle_matches_brute_force(q_dtype: torch.dtype) -> None:
    case = make_read_case([1, 65, 130], heads=32, q_dtype=q_dtype, seed=2)
    ref = oracle_logits(case.q, case.pool, case.weights, case.seq_lens, case.page_table, case.max_seq_len)
    brute = _brute_force(case)
    assert torch.equal(torch.isfinite(ref), torch.isfinite(brute))
    finite = torch.isfinite(brute)
    assert torch.allclose(ref[finite], brute[finite], rtol=1e-6, atol=1e-5)
    assert not torch.isnan(ref).any()


def test_oracle_key_chunks_and_narrow_width() -> None:
    case = make_read_case([200, 7], seed=4)
    a = oracle_logits(case.q, case.pool, case.weights, case.seq_lens, case.page_table, case.max_seq_len)
    b = oracle_logits(case.q, case.pool, case.weights, case.seq_lens, case.page_table, case.max_seq_len, 37)
    assert torch.equal(a, b)
    c = oracle_logits(case.q, case.pool, case.weights, case.seq_lens, case.page_table, 100)
    assert torch.equal(c, a[:, :100])


def test_fp8_packing_layout() -> None:
    g = torch.Generator().manual_seed(0)
    keys = (torch.randn((3, PAGE, 128), generator=g) * 4).to(torch.bfloat16)
    keys[1, 5] = 0  # the scale floor keeps an all-zero key finite
    buf, deq = pack_fp8_pages(keys)
    assert buf.shape == (3, FP8_PAGE_BYTES) and buf.dtype == torch.uint8
    values, scales = unpack_fp8_pages(buf)
    amax = keys.float().abs().amax(-1)
    assert torch.allclose(scales, amax.clamp_min(1e-4) / 448.0)
    # Key (page 2, slot 9) sits at byte 9 * 128 of page 2; its scale at 64 * 128 + 9 * 4.
    raw_key = buf[2, 9 * 128 : 10 * 128].view(torch.float8_e4m3fn).float()
    raw_scale = buf[2, 64 * 128 + 36 : 64 * 128 + 40].view(torch.float32)
    assert torch.equal(raw_key, values[2, 9].float()) and torch.equal(raw_scale, scales[2, 9:10])
    assert torch.equal(deq, values.float() * scales[..., None])
    assert values.float().abs().max() <= 448
    err = (deq - keys.float()).abs() / amax.clamp_min(1e-4)[..., None]
    assert err.max() < 2**-3  # e4m3 keeps 3 mantissa bits


def test_fp8_packing_against_upstream_reader() -> None:
    """Upstream's own torch fp8 reader, run on pages packed here, equals the oracle on the
    dequantized keys: the twin's input layout is upstream's layout."""
    reader = _upstream("fp8")
    case = make_read_case(LENGTHS, seed=5)
    keys = case.pool.clone()
    keys[case.poison_page] = 0  # upstream's reader gathers padding pages too
    buf, deq = pack_fp8_pages(keys)
    got = reader(
        case.q,
        buf.view(-1, PAGE, 1, 132),
        case.weights,
        case.seq_lens,
        case.page_table,
        None,
        case.max_seq_len,
        False,
    )
    ref = oracle_logits(case.q, deq, case.weights, case.seq_lens, case.page_table, case.max_seq_len)
    finite = torch.isfinite(ref)
    assert torch.all(got[~finite] == 0)  # upstream masks with 0, not -inf
    # Upstream multiplies in bf16 (output rounded to 8 bits): DeepGEMM's bf16-oracle bound.
    assert calc_diff(got[finite], ref[finite]) < 1e-3
    assert calc_diff(got[finite], ref[finite]) < 1e-4


def test_naive_gather_matches_oracle() -> None:
    case = make_read_case(LENGTHS, q_dtype=torch.bfloat16, seed=6)
    keys = case.pool.clone()
    keys[case.poison_page] = 0  # the gather reads padding pages (then masks them)
    got = naive_gather_logits(case.q, keys, case.weights, case.seq_lens, case.page_table, case.max_seq_len)
    ref = oracle_logits(case.q, keys, case.weights, case.seq_lens, case.page_table, case.max_seq_len)
    assert torch.equal(torch.isfinite(got), torch.isfinite(ref))
    finite = torch.isfinite(ref)
    assert calc_diff(got[finite], ref[finite]) < 1e-4
    narrow = naive_gather_logits(case.q, keys, case.weights, case.seq_lens, case.page_table, 70)
    assert torch.equal(narrow, got[:, :70])
    assert gather_peak_bytes(2, 3, 64) == 2 * 3 * 64 * (256 + 128 + 256 + 4)


# ------------------------------------------------------- Triton, interpreted

requires_interpreter = pytest.mark.skipif(
    not fp8_twin.INTERPRETED, reason="interpreted kernel tests need TRITON_INTERPRET=1 (CPU)"
)


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not torch.isnan(out).any()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite)
    assert calc_diff(out[finite], ref[finite]) <= 5e-6


@requires_interpreter
@pytest.mark.parametrize("swap_ab", [True, False])
def test_fp8_twin_matches_dequantized_oracle(swap_ab: bool) -> None:
    case = make_read_case(LENGTHS + [0], seed=7)
    buf, deq = pack_fp8_pages(case.pool)  # the poison page stays NaN: must never be read
    cfg = fp8_twin.TwinConfig(block_n=64, split_n=128, swap_ab=swap_ab)
    out = fp8_twin.fp8_paged_mqa_logits_twin(
        case.q, buf, case.weights, case.seq_lens, case.page_table, None, case.max_seq_len, config=cfg
    )
    ref = oracle_logits(case.q, deq, case.weights, case.seq_lens, case.page_table, case.max_seq_len)
    _check(out, ref)


# ------------------------------------------------------------- suite drivers


def test_bench_shapes_and_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from verify.bench import read as bench

    shapes = bench.shapes_for("quick", ["decode", "prefill"])
    assert bench.Shape("decode", 8, 8192) in shapes and any(s.mode == "prefill" for s in shapes)
    prefill = bench.Shape("prefill", 8192, 2048)
    assert prefill.lengths()[0] == 1 and prefill.lengths()[-1] == 2048 and len(prefill.lengths()) == 8192
    assert prefill.pool_pages() == 33 and bench.Shape("decode", 4, 128).pool_pages() == 9

    cfg = {"block_n": 128, "split_n": 0, "swap_ab": True, "num_warps": 4, "num_stages": 3}
    ok = bench.ShapeResult(
        shape={"mode": "decode", "rows": 64, "keys": 131072},
        key_bytes_bf16=64 * 131072 * 256,
        key_bytes_fp8=64 * 131072 * 132,
        unique_key_bytes_bf16=64 * 131072 * 256,
        bf16_best=bench.Timing("bf16", ms=0.55, config=cfg),
        fp8_best=bench.Timing("fp8 twin", ms=0.33),
        gather=bench.Timing("gather", ms=9.0),
        peak_extra_bytes={"bf16": 1000, "fp8": 1000, "gather": 5000, "logits": 1000},
    )
    skipped = bench.ShapeResult(
        shape={"mode": "prefill", "rows": 4096, "keys": 131072},
        key_bytes_bf16=0,
        key_bytes_fp8=0,
        unique_key_bytes_bf16=0,
        skipped="needs more memory",
    )
    d = ok.derived()
    assert d["bf16_hbm_pct"] == pytest.approx(100 * 64 * 131072 * 256 / 0.55e-3 / 4.8e12)
    assert d["ratio_bf16_over_fp8"] == pytest.approx(0.55 / 0.33)
    assert d["ratio_gather_over_bf16"] == pytest.approx(9.0 / 0.55)
    text = bench.table([ok, skipped], {"copy_tb_s": 4.3})
    assert "n128/w4/s3/swap/kauto" in text and "skipped: needs more memory" in text
    path = bench.write_outputs(tmp_path, {"gpu": "test"}, [ok, skipped])
    assert path.exists() and (tmp_path / "bench_read.csv").read_text().count("\n") == 3
    # The run's targets are the one evaluator's, over what the run wrote (bf16 at its default config).
    ok.bf16_default = ok.bf16_best
    lines = evaluate(json.loads(bench.write_outputs(tmp_path, {"gpu": "test"}, [ok, skipped]).read_text()))
    assert "bf16 / fp8 twin <= 1.94 (decode, >= 8,192 keys): 1/1 (max 1.67)" in lines
    assert ">= 10x over the naive gather: 1/1 (min 16.4x)" in lines
    assert bench.main(["--dry-run", "--profile", "quick"]) == 0


@requires_interpreter
def test_parity_suite_smoke_on_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The GPU suite on a CPU: the launch-logic check and the fp8 twin (interpreted) run and pass;
    every check that runs a bf16 kernel skips, saying why (none of them may pass on a CPU)."""
    import json

    from verify.parity import read as parity

    _upstream("kernel")
    code = parity.main(["--device", "cpu", "--small", "--out", str(tmp_path), "--heads", "32"])
    payload = json.loads((tmp_path / "read.json").read_text())
    statuses = {r["name"]: r["status"] for r in payload["results"]}
    assert code == 0, statuses
    ran = {n for n, st in statuses.items() if st != "skip"}
    assert ran == set(parity.CPU_CHECKS) and all(statuses[n] == "pass" for n in ran), statuses
    assert {
        "group_rows[G=2]",
        "clean_logits",
        "mqa_oracle[q=fp8,H=32]",
        "mqa_chunk_boundaries",
        "mqa_empty_rows",
        "mqa_vs_paged",
    } <= set(statuses)
    skipped = [r for r in payload["results"] if r["status"] == "skip"]
    assert all("misreads bf16" in r["summary"] or "GPU" in r["summary"] for r in skipped)
    refused = next(r for r in payload["results"] if r["name"] == "group_rows_static_refused")["details"]
    assert set(refused["refused"].values()) == {"refused before launch"} and len(refused["refused"]) == 4
    assert refused["control_default_config_grouped"] == "launched"
    assert "group_rows_static_split" not in statuses  # the mode is gone from the kernel


def test_grouped_static_launches_are_refused_before_launch() -> None:
    """The kernel module's launch logic (no kernel runs): groups need the length-aware split, so a
    static config, a config without it and the prefill config are refused with an AssertionError
    before the launch, as are more rows than the length-aware split reads; one row per program
    under a static config and groups under the default config get through to the launch."""
    from dataclasses import replace

    from verify.core.read_reference import make_group_case, verify_lengths
    from verify.parity.read import _claims_cuda, _LaunchRecorder

    module = _upstream("kernel")
    case, _ = make_group_case(verify_lengths([65, 129], 2), 2, poison_others=False, seed=1)
    args = [_claims_cuda(t) for t in (case.q, case.pool_view(), case.weights, case.seq_lens, case.page_table)]
    launched: list = []
    real = module._bf16_paged_mqa_logits_kernel
    module._bf16_paged_mqa_logits_kernel = _LaunchRecorder(launched)
    try:
        static = module.Bf16IndexLogitsConfig(block_n=64, split_n=128)
        for config in (
            static,
            replace(module.CONFIGS["decode"], length_aware=False),
            module.CONFIGS["prefill"],
        ):
            with pytest.raises(AssertionError, match="length-aware only"):
                module.bf16_paged_mqa_logits_with_config(*args, case.max_seq_len, config, group_rows=2)
        assert launched == []
        module.bf16_paged_mqa_logits_with_config(*args, case.max_seq_len, static)  # one row per program
        module.bf16_paged_mqa_logits_with_config(*args, case.max_seq_len, None, group_rows=2)
        assert len(launched) == 2
    finally:
        module._bf16_paged_mqa_logits_kernel = real


# ------------------------------------------------- the prefill kernel's oracle and the checks


def test_prefill_case_layout_and_poison() -> None:
    from verify.core.read_reference import make_prefill_case, pages_for

    case = make_prefill_case(causal_lengths(64, 100), seed=3)
    assert case.q.shape == (64, 64, 128) and case.page_table.dim() == 1 and case.n_keys == 100
    assert case.max_seqlen_k == pages_for(100) * PAGE  # the request's keys rounded up to a page, as upstream
    last = int(case.page_table[pages_for(100) - 1])
    assert torch.isnan(case.pool[last, 100 % PAGE :].float()).all()  # the last page's tail
    assert not torch.isnan(case.pool[last, : 100 % PAGE].float()).any()
    assert (
        torch.isnan(case.pool[case.poison_page].float()).all()
        and int(case.page_table[-1]) == case.poison_page
    )
    assert torch.equal(case.keys(), case.pool[case.page_table[:2].long()].reshape(-1, 128)[:100])
    paged = case.paged_rows()
    assert paged.page_table.shape == (64, case.page_table.shape[0]) and torch.equal(paged.seq_lens, case.ke)


def test_prefill_oracle_matches_the_paged_oracle_and_honours_ks() -> None:
    from verify.core.read_reference import make_prefill_case, mqa_oracle_logits, mqa_owned

    ke = causal_lengths(40, 130)
    case = make_prefill_case(ke, heads=32, q_dtype=torch.bfloat16, seed=4)
    got = mqa_oracle_logits(case, row_block=7, key_chunk=50)
    paged = case.paged_rows()
    want = oracle_logits(paged.q, case.pool, case.weights, case.ke, paged.page_table, case.max_seqlen_k)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], rtol=1e-6, atol=1e-5)
    ks = [max(0, e - 20) for e in ke]
    windowed = mqa_oracle_logits(case.with_ranges(torch.tensor(ks), case.ke))
    cols = torch.arange(case.max_seqlen_k)
    inside = (cols[None, :] >= torch.tensor(ks)[:, None]) & (cols[None, :] < case.ke[:, None])
    assert torch.equal(torch.isfinite(windowed), inside)
    assert torch.equal(windowed[inside], got[inside])
    # the positions clean_logits=False writes: whole 4-key tiles meeting [ks, ke), nothing for empty rows
    owned = mqa_owned(torch.tensor([0, 5, 3, 9]), torch.tensor([3, 6, 3, 12]), 16, 4)
    assert owned.int().tolist() == [
        [1, 1, 1, 1] + [0] * 12,
        [0, 0, 0, 0, 1, 1, 1, 1] + [0] * 8,
        [0] * 16,
        [0] * 8 + [1] * 4 + [0] * 4,
    ]


def _harness_suite(faults: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """Tier 1's suite on a CPU with torch stand-ins for both bf16 kernels (kernel_stand_ins.py),
    at small sizes: its checks' own logic, not the kernels."""
    from tests.parity.kernel_stand_ins import paged_stand_in, prefill_stand_in
    from verify.parity import read as parity

    settings = parity.Settings(
        device=torch.device("cpu"),
        lengths=LENGTHS,
        heads=[32],
        reruns=3,
        seed=0,
        prefill=[(64, 16)],
        small=True,
        groups=[2],
        mqa_prefill=[(300, 90), (16, 200)],
        mqa_chunked=(400, 100),
    )
    suite = parity.Suite(settings)
    suite.module = paged_stand_in(suite.module)
    suite.kernel = suite.module.bf16_paged_mqa_logits
    suite.prefill_module = prefill_stand_in(suite.prefill_module, faults, block_k=64)
    return suite


MQA_CHECKS = (
    "check_mqa_chunk_boundaries",
    "check_mqa_ks_window",
    "check_mqa_empty_rows",
    "check_mqa_input_forms",
    "check_mqa_configs",
    "check_mqa_reruns",
    "check_mqa_vs_paged",
)


def test_prefill_kernel_checks_pass_a_kernel_that_keeps_its_contract() -> None:
    _upstream("kernel")
    suite = _harness_suite()
    results = {name: getattr(suite, name)() for name in MQA_CHECKS}
    results["oracle"] = suite.check_mqa_oracle(torch.float8_e4m3fn, 32)
    results["prefill"] = suite.check_mqa_prefill(16, 200)
    bad = {k: r.summary for k, r in results.items() if r.status.value != "pass"}
    assert not bad, bad
    assert results["oracle"].details["positions_left_unwritten"] > 0  # the tiles a row does not read
    chunks = results["check_mqa_chunk_boundaries"].details["chunks"]
    assert len(chunks) >= 3 and chunks[0][0] == 0 and chunks[-1][1] == 400
    assert results["check_mqa_chunk_boundaries"].details["tile_crossing_row"] in {c[0] for c in chunks}
    assert results["check_mqa_empty_rows"].details["empty_rows"] > 0


@pytest.mark.parametrize(
    "fault, caught_by",
    [
        ("one_key_past_ke", "check_mqa_chunk_boundaries"),
        ("writes_everywhere", "check_mqa_empty_rows"),
        ("ignores_ks", "check_mqa_ks_window"),
    ],
)
def test_prefill_kernel_checks_catch_a_kernel_that_breaks_it(fault: str, caught_by: str) -> None:
    _upstream("kernel")
    suite = _harness_suite((fault,))
    assert getattr(suite, caught_by)().status.value == "fail"
    assert suite.check_mqa_oracle(torch.bfloat16, 32).status.value == (
        "pass" if fault == "ignores_ks" else "fail"
    )


def test_prefill_floors_by_hand() -> None:
    from verify.bench.read_scenarios import BF16_PEAK_FLOPS, FP8_PEAK_FLOPS, prefill_floors

    lengths = [1, 2, 3, 4]
    f = prefill_floors(lengths, keys=4, heads=64)
    flops = 2 * 64 * 128 * 10
    assert f["flops"] == flops
    q = 4 * 64 * (128 + 4)
    assert f["fp8_nonpaged_bytes"] == q + 3 * 4 * 132 + 4 * 10
    assert f["bf16_bytes"] == q + 4 * 256 + 4 * 10
    assert f["fp8_nonpaged_compute_ms"] == pytest.approx(flops / FP8_PEAK_FLOPS * 1e3)
    assert f["bf16_compute_ms"] == pytest.approx(
        2 * f["fp8_nonpaged_compute_ms"] * FP8_PEAK_FLOPS / BF16_PEAK_FLOPS / 2
    )
    assert f["fp8_nonpaged_ms"] == max(f["fp8_nonpaged_memory_ms"], f["fp8_nonpaged_compute_ms"])
    # A 128K-token prefill is compute bound: the floor is the MMA work, not the bytes.
    big = prefill_floors([max(1, (p + 1) // 4) for p in range(131072)], keys=32768, heads=64)
    assert big["fp8_nonpaged_compute_ms"] > big["fp8_nonpaged_memory_ms"]
    assert big["bf16_ms"] == pytest.approx(2 * big["fp8_nonpaged_ms"], rel=0.01)


def test_verify_rows_share_the_request_table() -> None:
    from verify.bench.read_scenarios import expand_to_verify_rows

    base = make_read_case([200, 64, 1], heads=32, seed=3)
    rows = expand_to_verify_rows(base, 2, seed=4)
    assert rows.rows == 6 and rows.pool is base.pool
    assert torch.equal(rows.page_table[0::2], base.page_table) and torch.equal(
        rows.page_table[1::2], base.page_table
    )
    assert rows.seq_lens.tolist() == [199, 200, 63, 64, 1, 1]  # causal, a key per 4 tokens


@requires_interpreter
def test_bench_scenarios_run_on_cpu(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The MTP and long-prefill benches' own code, each arm run once instead of timed -- the fp8
    twin interpreted, the bf16 kernels as torch stand-ins (they cannot run on a CPU); their results,
    tables and files."""
    from types import SimpleNamespace

    from tests.parity.kernel_stand_ins import paged_stand_in, prefill_stand_in
    from verify.bench import read as bench
    from verify.bench import read_scenarios as sc
    from verify.core.upstream import load_bf16_prefill_module

    module = paged_stand_in(_upstream("kernel"))
    prefill = prefill_stand_in(load_bf16_prefill_module()[0], block_k=64)
    ran: list[tuple[str, int]] = []

    def run_once(label: str, calls, args, config=None):  # type: ignore[no-untyped-def]
        calls[0]()
        calls[-1]()  # the last replica's tables address the last copy of the keys
        ran.append((label, len(calls)))
        return bench.Timing(label, ms=0.001 * (len(ran) + 1), config=config or {})

    # Upstream's TileLang scorer only compiles for a GPU; here it is absent.
    monkeypatch.setattr(sc, "_tilelang_reader", lambda: (None, "not run: no GPU (test)"))
    args = SimpleNamespace(heads=32, seed=0, sweep="none")
    anchored: list[int] = []

    def anchor(case, view, tables):  # type: ignore[no-untyped-def]
        anchored.append(case.rows)
        return bench.Timing("DeepGEMM fp8_paged_mqa_logits", error="not run: no DeepGEMM (test)")

    mtp = sc.run_mtp(2, 130, 2, module, args, run_once, device="cpu", deepgemm=anchor)
    assert mtp.skipped is None and mtp.grouped and mtp.one_row and mtp.fp8
    assert mtp.replicas > 1  # a few KB of keys: copies rotate past L2
    assert set(mtp.derived()) >= {"ratio_grouped_over_one_row", "ratio_ungrouped_over_one_row"}
    # the anchor is asked about the verify rows (2 per request); its reason is kept
    assert anchored == [4] and mtp.deepgemm and "not run" in mtp.deepgemm["error"]
    assert mtp.grouped_sweep == [] and mtp.grouped_best == mtp.grouped
    # Without the prefill kernel (an older series): the paged kernel one row at a time is dispatched.
    # 128 tokens, 32 keys (a 128-key-wide output); chunks of 48 rows.
    old = sc.run_long_prefill(128, module, args, run_once, device="cpu", chunk_bytes=48 * 128 * 4)
    assert old.rows_per_chunk == 48 and old.dispatch_arm == "bf16" and "bf16_prefill" not in old.arms
    # With it: the prefill kernel as the dispatch runs it, and its sweep (each config checked first).
    args.prefill_configs = ["block_r=32", "num_warps=4"]
    args.dense_bf16_tflops = 700.0
    monkeypatch.setattr(sc, "INDEX_TOPK", 16)  # rows of at most 16 keys get empty ranges (512 on a server)
    long = sc.run_long_prefill(
        192, module, args, run_once, device="cpu", chunk_bytes=60 * 128 * 4, prefill_module=prefill
    )
    assert long.dispatch_arm == "bf16_prefill" and {"bf16", "bf16_prefill", "fp8_twin"} <= set(long.arms)
    assert not any("grouped" in a for a in long.arms)
    assert long.arms["tilelang"]["ms"] is None and "not run" in long.arms["tilelang"]["error"]
    assert [t["config"]["block_r"] for t in long.prefill_sweep] == [32, 64], long.prefill_sweep
    assert all(t["ms"] for t in long.prefill_sweep), long.prefill_sweep
    d = long.derived()
    assert d["bf16_prefill_tflops"] == pytest.approx(
        long.floors["flops"] / (long.arms["bf16_prefill"]["ms"] * 1e-3) / 1e12
    )
    assert d["bf16_prefill_pct_of_dense_bf16"] == pytest.approx(100 * d["bf16_prefill_tflops"] / 700.0)
    assert "ratio_dispatch_over_fp8_twin" in d and long.floors["fp8_nonpaged_ms"] > 0
    # rows of at most 512 keys get empty ranges, as upstream's plan gives them: fewer FLOPs dispatched
    assert 0 < long.floors["flops_dispatch"] < long.floors["flops"]
    table = sc.long_prefill_table([long])
    assert "sweep block_r=32" in table and "req x" in sc.mtp_table([mtp])
    # The targets, from the one evaluator over what the run writes: the MTP one and, before the
    # prefill kernel, the old long-prefill one; 192 tokens is no target length of the prefill kernel.
    before = evaluate(
        json.loads(bench.write_outputs(tmp_path, {"gpu": "test"}, [], [mtp], [old]).read_text())
    )
    assert any(line.startswith("MTP verify (grouped) <= 1.15x one row per request: ") for line in before)
    assert any(
        line.startswith("long prefill within 1.2x of upstream's fp8 prefill path: ") for line in before
    )
    after = evaluate(
        json.loads(bench.write_outputs(tmp_path, {"gpu": "test"}, [], [mtp], [long]).read_text())
    )
    assert not any("TFLOP/s effective" in line or "vs DeepGEMM" in line for line in after)
    bench.write_outputs(tmp_path, {"gpu": "test"}, [], [mtp], [long])
    assert (tmp_path / "bench_mtp.csv").read_text().count("\n") == 2
    assert "ratio_grouped_over_one_row" in (tmp_path / "bench_mtp.csv").read_text()
    assert (tmp_path / "bench_long_prefill.csv").read_text().count("\n") == 2


def test_disagreement_catches_one_wrong_key_and_ignores_the_tail() -> None:
    from verify.bench.read_scenarios import _disagreement

    want = torch.randn(2, 8, dtype=torch.float64).float()
    lengths = torch.tensor([8, 5])
    got = want.clone()
    got[1, 5:] = float("nan")  # past row 1's length: never read
    assert _disagreement(got, want, lengths) is None
    got[0, 3] += 0.1 * float(want.abs().max())  # one key of one row off by a tenth of a logit
    assert "max error" in (_disagreement(got, want, lengths) or "")
    got = want.clone()
    got[1, 4] = float("-inf")
    assert "non-finite" in (_disagreement(got, want, lengths) or "")


def test_grouped_sweep_configs_are_length_aware_and_fit() -> None:
    from verify.bench.read_scenarios import SMEM_LIMIT, grouped_sweep_configs

    module = _upstream("kernel")
    assert grouped_sweep_configs(module, 2, 64, "none") == []
    for next_n in (2, 3, 4):
        default = module.select_config(1, 0, 64, next_n)
        for level in ("small", "full"):
            configs = grouped_sweep_configs(module, next_n, 64, level)
            assert configs and default not in configs and len(set(configs)) == len(configs)
            columns = 1 << (next_n - 1).bit_length()
            for c in configs:
                assert c.length_aware and c.split_n == 0 and c.max_split_n == default.max_split_n
                assert c.num_stages * c.block_n * 256 + columns * 64 * 128 * 2 <= SMEM_LIMIT
    # four rows of 64 heads: a 64 KB query tile leaves no room for 128-key tiles 5 deep
    assert not any(
        c.block_n == 128 and c.num_stages >= 5 for c in grouped_sweep_configs(module, 4, 64, "full")
    )
    assert any(c.block_n == 128 and c.num_stages == 5 for c in grouped_sweep_configs(module, 2, 64, "full"))

    # a kernel module whose grouped default differs (another series): the sweep is built on it
    from types import SimpleNamespace

    shallow = replace(module.CONFIGS["decode"], num_stages=3, max_split_n=1024)
    other = SimpleNamespace(select_config=lambda rows, n_out, heads, group_rows=1: shallow)
    configs = grouped_sweep_configs(other, 4, 64, "small")
    assert shallow not in configs and module.CONFIGS["decode"] not in configs
    assert configs and all(c.max_split_n == 1024 for c in configs)


@requires_interpreter
def test_mtp_grouped_sweep_checks_then_times_each_config(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The grouped sweep's code (the paged kernel as a torch stand-in, the fp8 twin interpreted):
    every config's logits are compared with the default's before it is timed, the split caps of
    the fastest follow, and a config whose logits are wrong is reported, not timed."""
    from types import SimpleNamespace

    from tests.parity.kernel_stand_ins import paged_stand_in
    from verify.bench import read as bench
    from verify.bench import read_scenarios as sc

    module = paged_stand_in(_upstream("kernel"))
    monkeypatch.setattr(sc, "GROUPED_SWEEP_SMALL", [(32, 4, 3, True), (64, 4, 3, False)])
    monkeypatch.setattr(sc, "GROUPED_SPLIT_CAPS", [1024])
    speed = {32: 0.002, 64: 0.003}

    def run_once(label: str, calls, args, config=None):  # type: ignore[no-untyped-def]
        calls[0]()
        ms = speed.get((config or {}).get("block_n"), 0.004) if "group_rows" in label else 0.001
        return bench.Timing(label, ms=ms, config=config or {})

    args = SimpleNamespace(heads=32, seed=0, sweep="small")
    mtp = sc.run_mtp(2, 130, 2, module, args, run_once, device="cpu")
    assert [t["config"]["block_n"] for t in mtp.grouped_sweep] == [32, 64, 32]
    assert all(t["ms"] and t["config"]["length_aware"] for t in mtp.grouped_sweep)
    assert mtp.grouped_sweep[-1]["config"]["max_split_n"] == 1024  # the fastest's cap variant
    assert mtp.grouped_best is not None and mtp.grouped_best["config"]["block_n"] == 32
    assert mtp.derived()["ratio_best_grouped_over_one_row"] == pytest.approx(2.0)

    real = module.bf16_paged_mqa_logits_with_config

    def wrong_for_small_tiles(*a, **kw):  # type: ignore[no-untyped-def]
        out = real(*a, **kw)
        if a[6] is not None and a[6].block_n == 32:
            out[0, 0] += 1.0 + out[0, :10].abs().max()
        return out

    monkeypatch.setattr(module, "bf16_paged_mqa_logits_with_config", wrong_for_small_tiles)
    mtp = sc.run_mtp(2, 130, 2, module, args, run_once, device="cpu")
    small = [t for t in mtp.grouped_sweep if t["config"]["block_n"] == 32]
    assert small and all(t["ms"] is None and "disagrees with the default" in t["error"] for t in small)
    assert mtp.grouped_best is not None and mtp.grouped_best["config"]["block_n"] == 64
