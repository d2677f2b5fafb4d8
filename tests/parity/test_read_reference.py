"""CPU tests of the read-parity suite's and read bench's pure-torch pieces, plus the two Triton
kernels under the interpreter: the oracle, calc_diff, the fp8 page packing of the twin against
upstream's own fp8 reader and layout, the naive gather, and (interpreted) the patched bf16
kernel and the fp8 twin at small sizes.

Needs the patched upstream on the path:
    PYTHONPATH=/work/main:<patched tree>/python python -m pytest tests/parity/test_read_reference.py
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Before any Triton kernel module is imported: triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verify.bench import fp8_twin
from verify.parity.read_reference import (
    FP8_PAGE_BYTES,
    PAGE,
    ReadCase,
    calc_diff,
    causal_lengths,
    gather_peak_bytes,
    make_read_case,
    naive_gather_logits,
    oracle_logits,
    pack_fp8_pages,
    unpack_fp8_pages,
)
from verify.parity.upstream_read import (
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


@requires_interpreter
def test_bf16_kernel_matches_oracle() -> None:
    module = _upstream("kernel")
    if not getattr(module, "_INTERPRETED", False):
        pytest.skip("kernel module was imported before TRITON_INTERPRET=1 was set")
    case = make_read_case(LENGTHS, seed=8)
    out = module.bf16_paged_mqa_logits(
        case.q, case.pool_view(), case.weights, case.seq_lens, case.page_table, None, case.max_seq_len
    )
    ref = oracle_logits(case.q, case.pool, case.weights, case.seq_lens, case.page_table, case.max_seq_len)
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
    assert "bf16/fp8 <= 1.94: 1/1" in text
    path = bench.write_outputs(tmp_path, {"gpu": "test"}, [ok, skipped])
    assert path.exists() and (tmp_path / "bench_read.csv").read_text().count("\n") == 3
    assert bench.main(["--dry-run", "--profile", "quick"]) == 0


@requires_interpreter
def test_parity_suite_smoke_on_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The GPU suite's own code paths, interpreted at small sizes (graph and memory checks skip)."""
    import json

    from verify.parity import read as parity

    module = _upstream("kernel")
    if not getattr(module, "_INTERPRETED", False):
        pytest.skip("kernel module was imported before TRITON_INTERPRET=1 was set")
    code = parity.main(["--device", "cpu", "--small", "--out", str(tmp_path), "--heads", "32"])
    payload = json.loads((tmp_path / "read.json").read_text())
    statuses = {r["name"]: r["status"] for r in payload["results"]}
    assert code == 0, statuses
    assert statuses["cuda_graph"] == "skip" and statuses["extra_memory"] == "skip"
    assert statuses["oracle[q=fp8,H=32]"] == "pass" and statuses["fp8_twin_vs_upstream_torch"] == "pass"
    # The kernel's group mode (MTP verify rows) and clean_logits, interpreted.
    for name in ("group_rows[G=2]", "group_rows[G=4]", "group_rows_batch", "group_rows_static_split", "clean_logits",
                 "group_rows[G=4,sm120 config]"):
        assert statuses[name] == "pass", name
    # Groups of 4 under the config each GPU's shared memory selects: Hopper's here (the interpreter
    # stands in for an H100 / H200), sm_120's run on this device as its own check.
    configs = {r["name"]: r["details"]["config"]["num_stages"] for r in payload["results"]
               if r["name"].startswith("group_rows[G=4")}
    assert configs == {"group_rows[G=4]": 3, "group_rows[G=4,sm120 config]": 2}
    assert "group_rows[G=2,sm120 config]" not in statuses  # the same config as Hopper's
    batch = next(r for r in payload["results"] if r["name"] == "group_rows_batch")["details"]
    assert batch["rows"] == 2 * 8 - 1  # eight requests' verify rows, the last group partial
    static = next(r for r in payload["results"] if r["name"] == "group_rows_static_split")["details"]
    assert static["refused"] and set(static["refused"].values()) == {"refused"}
    clean = next(r for r in payload["results"] if r["name"] == "clean_logits")["details"]
    assert clean["plain_positions_left_unwritten"] > 0 and clean["groups_of_2_positions_left_unwritten"] > 0


def test_read_kernels_compile_for_each_gpu() -> None:
    """The Triton kernels compile for sm_90, sm_100 and sm_120 under the installed Triton (no GPU
    needed), each with the configs the kernel module selects for that GPU's shared memory: every
    production variant fits what one program may use there and runs on its tensor cores; on sm_90
    the key loop keeps tiles in flight and nothing spills. Groups of 4 at the decode config's
    stages, what the module selected before it chose by shared memory, do not fit sm_120's 99 KB.
    A subprocess, because this module runs the kernels interpreted."""
    import json
    import subprocess
    import sys
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compile.json"
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", "-m", "verify.bench.read_compile", "--out", str(out)],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0 and "UpstreamMissing" in proc.stderr:
            pytest.skip("patched upstream not on PYTHONPATH")
        assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
        reports = json.loads(out.read_text())["reports"]
    production = [r for r in reports if r["production"]]
    # Per GPU: decode length-aware with and without the tail fill, MTP groups of 2 and 4, prefill,
    # bf16 q with 32 heads; and the fp8 twin on sm_90.
    assert sorted(r["target"] for r in production) == ["sm100"] * 6 + ["sm120"] * 6 + ["sm90"] * 7
    assert all(r["ok"] and r["shared_bytes"] <= r["shared_limit"] for r in production), proc.stdout
    sm90 = [r for r in production if r["target"] == "sm90"]
    assert all(r["tensor_core"] and r["spill_bytes"] == 0 and r["loop_waits"][0] in (1, 2) for r in sm90)
    stages = {(r["target"], r["variant"]): r["config"]["num_stages"] for r in production}
    assert stages[("sm90", "MTP verify, groups of 4")] == 3 and stages[("sm120", "MTP verify, groups of 4")] == 2
    before = {r["target"]: r for r in reports if not r["production"]}
    assert set(before) == {"sm90", "sm100", "sm120"}
    assert before["sm120"]["shared_bytes"] > before["sm120"]["shared_limit"]
    assert before["sm90"]["shared_bytes"] <= before["sm90"]["shared_limit"]


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
    assert f["bf16_compute_ms"] == pytest.approx(2 * f["fp8_nonpaged_compute_ms"] * FP8_PEAK_FLOPS / BF16_PEAK_FLOPS / 2)
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
    assert torch.equal(rows.page_table[0::2], base.page_table) and torch.equal(rows.page_table[1::2], base.page_table)
    assert rows.seq_lens.tolist() == [199, 200, 63, 64, 1, 1]  # causal, a key per 4 tokens


@requires_interpreter
def test_bench_scenarios_run_on_cpu(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The MTP and long-prefill benches' own code, each arm run once through the real kernels
    (interpreted) instead of timed; their results, tables and files."""
    from types import SimpleNamespace

    from verify.bench import read as bench
    from verify.bench import read_scenarios as sc

    module = _upstream("kernel")
    if not getattr(module, "_INTERPRETED", False):
        pytest.skip("kernel module was imported before TRITON_INTERPRET=1 was set")
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
    # 128 tokens, 32 keys (a 128-key-wide output); chunks of 48 rows.
    long = sc.run_long_prefill(128, module, args, run_once, device="cpu", chunk_bytes=48 * 128 * 4)
    # the dispatch scores a prefill's rows one at a time (grouped rows need the length-aware split)
    assert long.rows_per_chunk == 48 and long.dispatch_arm == "bf16"
    assert {"bf16", "fp8_twin"} <= set(long.arms) and not any("grouped" in a for a in long.arms)
    assert long.arms["tilelang"]["ms"] is None and "not run" in long.arms["tilelang"]["error"]
    assert "ratio_dispatch_over_fp8_twin" in long.derived() and long.floors["fp8_nonpaged_ms"] > 0
    assert "target MTP verify" in sc.mtp_table([mtp]) and "target long prefill" in sc.long_prefill_table([long])
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
    assert not any(c.block_n == 128 and c.num_stages >= 5 for c in grouped_sweep_configs(module, 4, 64, "full"))
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
    """The grouped sweep through the real kernel (interpreted): every config's logits are
    compared with the default's before it is timed, the split caps of the fastest follow, and
    a config whose logits are wrong is reported, not timed."""
    from types import SimpleNamespace

    from verify.bench import read as bench
    from verify.bench import read_scenarios as sc

    module = _upstream("kernel")
    if not getattr(module, "_INTERPRETED", False):
        pytest.skip("kernel module was imported before TRITON_INTERPRET=1 was set")
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
