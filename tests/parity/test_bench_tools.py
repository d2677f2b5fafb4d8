"""CPU tests of the bench's timing helpers and of the Nsight Compute report, the latter on the
real ncu export committed from the H200 (verify/results/h200/ncu/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from verify.bench import ncu_probe
from verify.bench.timing import L2_ROTATION_BYTES, MAX_REPLICAS, graph_ms, replicas_for, replicate_pages

NCU_RUN = Path(__file__).resolve().parents[2] / "verify" / "results" / "h200" / "ncu"


def test_replicas_rotate_past_l2() -> None:
    # 512 KB of keys: as many copies as fill the rotation, capped.
    assert replicas_for(512 * 1024, 512 * 1024) == min(MAX_REPLICAS, L2_ROTATION_BYTES // (512 * 1024))
    assert replicas_for(64 * 2**20, 64 * 2**20) == 4
    # A call that streams more than the rotation by itself needs no copies (prefill re-reads).
    assert replicas_for(2**20, L2_ROTATION_BYTES) == 1
    assert replicas_for(2**31, 2**31) == 1
    assert replicas_for(0, 0) == 1
    assert replicas_for(1, 1) == MAX_REPLICAS


def test_replicated_pages_address_the_same_keys_in_distinct_memory() -> None:
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn((7, 64, 128), generator=gen).to(torch.bfloat16)
    table = torch.tensor([[3, 1, 6], [0, 2, 5]], dtype=torch.int32)
    big, tables = replicate_pages(pool, table, 3)
    assert big.shape == (21, 64, 128) and len(tables) == 3
    seen = set()
    for copy in tables:
        assert copy.dtype == table.dtype and copy.shape == table.shape
        assert torch.equal(big[copy.long()], pool[table.long()])
        seen.update(copy.flatten().tolist())
    assert len(seen) == 3 * table.numel()  # no page shared between copies
    same, one = replicate_pages(pool, table, 1)
    assert same.data_ptr() == pool.data_ptr() and torch.equal(one[0], table)


def test_graph_timing_needs_calls() -> None:
    with pytest.raises(ValueError, match="at least one call"):
        graph_ms([], rep_ms=1.0)


def test_ncu_report_joins_the_h200_export(tmp_path: Path) -> None:
    for name in ("ncu.csv", "launches.json"):
        shutil.copy(NCU_RUN / name, tmp_path / name)
    md = ncu_probe.report(tmp_path).read_text().splitlines()
    launches = json.loads((tmp_path / "launches.json").read_text())
    joined = json.loads((tmp_path / "ncu.json").read_text())
    assert len(md) == 2 + len(launches) == 2 + len(joined)
    assert md == (NCU_RUN / "ncu.md").read_text().splitlines()  # the committed report is this one
    for launch, row in zip(launches, joined):
        assert (row["rows"], row["keys"], row["arm"]) == (launch["rows"], launch["keys"], launch["arm"])
        assert row["kernel"] == ncu_probe.KERNEL_NAMES[launch["arm"]]
        # Every launch moved at least its keys from DRAM (ncu flushed the caches before it).
        assert row["dram__bytes_read.sum"] >= 0.95 * launch["key_bytes"]
        assert 0 < row["us"] < 10_000 and row["effective_tb_s"] < 4.8
    big = [r for r in joined if (r["rows"], r["keys"], r["arm"]) == (64, 131072, "bf16")]
    assert big and big[0]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] > 80


def test_ncu_report_refuses_a_misaligned_export(tmp_path: Path) -> None:
    shutil.copy(NCU_RUN / "ncu.csv", tmp_path / "ncu.csv")
    launches = json.loads((NCU_RUN / "launches.json").read_text())
    (tmp_path / "launches.json").write_text(json.dumps(launches[:-1]))
    with pytest.raises(SystemExit, match="ncu profiled 18 kernels, launches.json lists 17"):
        ncu_probe.report(tmp_path)
    swapped = [launches[1], launches[0], *launches[2:]]
    (tmp_path / "launches.json").write_text(json.dumps(swapped))
    with pytest.raises(SystemExit, match="launches.json expects '_fp8_paged_mqa_logits_twin_kernel'"):
        ncu_probe.report(tmp_path)


def test_readme_speed_section_is_the_committed_artifacts() -> None:
    """Every figure in README's speed section comes from verify/results/h200/bench/ through
    verify.bench.report: after a bench run, `python -m verify.figures --write`."""
    from verify.bench import report

    assert report.render(report.load()) in report.README.read_text(), (
        "README.md's speed section differs from the committed bench artifacts; run `python -m verify.figures --write`"
    )
    assert report.main(["--results", str(report.RESULTS)]) == 0


def test_speed_report_renders_a_new_run(tmp_path: Path) -> None:
    """The bench's own output format (write_outputs) through the report: MTP, wide outputs as
    the indexer calls them, long prefill and the targets; a missing section says so."""
    from verify.bench import read as bench
    from verify.bench import report
    from verify.bench.read_scenarios import LongPrefillResult, MtpResult, prefill_floors

    def shape(rows: int, keys: int, width: int = 0, **timings: float) -> bench.ShapeResult:
        r = bench.ShapeResult(
            shape={"mode": "decode", "rows": rows, "keys": keys, "width": width},
            key_bytes_bf16=rows * keys * 256,
            key_bytes_fp8=rows * keys * 132,
            unique_key_bytes_bf16=rows * keys * 256,
            peak_extra_bytes={"bf16": 1000, "logits": 1000},
        )
        for name, ms in timings.items():
            setattr(r, name, bench.Timing(name, ms=ms))
        return r

    results = [
        shape(8, 32768, bf16_default=0.0159, fp8_best=0.0150, gather=0.2),  # 88% of 4.8 TB/s
        shape(64, 131072, bf16_default=0.5, fp8_best=0.3),
        shape(8, 2048, 131072, bf16_default=0.009, bf16_default_lean=0.006, bf16_best_split_lean=0.0055),
    ]
    mtp = [
        MtpResult(
            64,
            32768,
            2,
            64 * 32768 * 256,
            one_row={"ms": 0.14},
            grouped={"ms": 0.15},
            ungrouped={"ms": 0.28},
            fp8={"ms": 0.19},
        )
    ]
    lengths = [max(1, (p + 1) // 4) for p in range(8192)]
    long = [
        LongPrefillResult(
            8192,
            2048,
            8192,
            arms={"bf16": {"ms": 3.0}, "fp8_twin": {"ms": 1.8}},
            floors=prefill_floors(lengths, 2048, 64),
            dispatch_arm="bf16",
        )
    ]
    bench.write_outputs(tmp_path, {"gpu": "NVIDIA H200", "triton": "3.6.0"}, results, mtp, long)
    text = report.render(report.load(tmp_path))
    assert "best swept grouped us" not in text and "DeepGEMM fp8, one at a time" not in text
    assert "the best swept config per shape" not in text  # no decode sweep in this run
    assert "bf16 / DeepGEMM" not in text and "against DeepGEMM's non-paged" not in text  # not timed
    assert "| 8 x 32,768 | 15.9 | 88 | 1.06 |" in text
    assert "| 8 x 2,048 in 131,072 | 6.0 | 5.5 | 1.09 | 9.0 |" in text
    assert "| 64 x 32,768, 2 | 140.0 | 150.0 | 1.07 | 280.0 | 190.0 |" in text
    assert "| 8,192 | 3.00 | 3.00 | 1.80 |" in text
    assert "MTP verify (grouped) <= 1.15x one row per request: 1/1 (max 1.07x)" in text
    assert "within 1.2x of the best fixed split: 1/1 (max 1.09x)" in text
    assert "at >= 88% of 4.8 TB/s: 1/2 shapes" in text
    assert "0/1 against the fp8 twin (max 1.67x)" in text
    assert "| 1 x 8,192 | not measured |" in text  # a shape the run lacks
    # Without the new sections the report says what is missing and how to measure it.
    bench.write_outputs(tmp_path, {"gpu": "x"}, results[:2])
    bare = report.render(report.load(tmp_path))
    assert "MTP verify rows (several rows per request): not measured" in bare
    assert "long prefill within 1.2x of upstream's fp8 prefill path: not measured" in bare
    # The report only checks a README; verify.figures is the one writer of its blocks.
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nstale\n{report.END}\noutro\n")
    assert report.main(["--results", str(tmp_path), "--readme", str(readme)]) == 1
    readme.write_text(f"intro\n{report.render(report.load(tmp_path))}\noutro\n")
    assert report.main(["--results", str(tmp_path), "--readme", str(readme)]) == 0
    with pytest.raises(SystemExit):
        report.main(["--results", str(tmp_path), "--readme", str(readme), "--write"])


def test_speed_report_shows_the_grouped_sweep_and_the_anchor(tmp_path: Path) -> None:
    """An MTP run with the grouped-config sweep and DeepGEMM's arm, and a decode sweep: the
    table gains the best swept config and the anchor, the targets say what the sweep found."""
    from verify.bench import read as bench
    from verify.bench import report
    from verify.bench.read_scenarios import MtpResult

    default = {"block_n": 64, "num_warps": 4, "num_stages": 4, "swap_ab": True, "max_split_n": 2048}
    better = {**default, "num_warps": 8, "block_n": 128}
    grouped = {"ms": 0.17, "config": default}
    swept = [
        {"ms": 0.16, "config": better},
        {"ms": None, "error": "disagrees with the default", "config": default},
    ]
    mtp = [
        MtpResult(
            64,
            32768,
            2,
            64 * 32768 * 256,
            one_row={"ms": 0.14},
            grouped=grouped,
            ungrouped={"ms": 0.28},
            fp8={"ms": 0.19},
            deepgemm={"ms": 0.1},
            grouped_sweep=swept,
            grouped_best=swept[0],
        ),
        MtpResult(
            8,
            8192,
            2,
            8 * 8192 * 256,
            one_row={"ms": 0.01},
            grouped={"ms": 0.011, "config": default},
            ungrouped={"ms": 0.012},
            fp8={"ms": 0.012},
            deepgemm={"ms": None, "error": "Disagrees"},
            grouped_sweep=[{"ms": 0.02, "config": better}],
            grouped_best={"ms": 0.011, "config": default},
        ),
    ]
    decode = bench.ShapeResult(
        shape={"mode": "decode", "rows": 8, "keys": 32768, "width": 0},
        key_bytes_bf16=8 * 32768 * 256,
        key_bytes_fp8=8 * 32768 * 132,
        unique_key_bytes_bf16=8 * 32768 * 256,
        bf16_default=bench.Timing("d", ms=0.0233),
        bf16_best=bench.Timing("b", ms=0.0155),
        sweep=[bench.Timing("b", ms=0.0155)],
        fp8_best=bench.Timing("f", ms=0.015),
        fp8_deepgemm=bench.Timing("dg", ms=0.014),
        peak_extra_bytes={"bf16": 0, "logits": 0},
    )
    bench.write_outputs(tmp_path, {"gpu": "NVIDIA H200", "triton": "3.6.0"}, [decode], mtp)
    text = report.render(report.load(tmp_path))
    assert (
        "| 64 x 32,768, 2 | 140.0 | 170.0 | 1.21 | 160.0 | 1.14 | 128/w8/s4/swap/cap 2048 | 280.0 | 190.0 | 100.0 | 1.70 |"
        in text
    )
    assert (
        "| 8 x 8,192, 2 | 10.0 | 11.0 | 1.10 | 11.0 | 1.10 | 64/w4/s4/swap/cap 2048 (default) | 12.0 | 12.0 | n/a | n/a |"
        in text
    )
    flat = " ".join(text.split())  # the target lines wrap
    assert (
        "one row per request: 1/2 (max 1.21x); with the best swept grouped config per shape 2/2 (max 1.14x)"
        in flat
    )
    assert "0/1 shapes (default config, 60-60%; the best swept config per shape: 1/1, 90-90%" in flat
    assert "DeepGEMM's fp8 scorer on the same shapes: 51-51% of 4.8 TB/s for its own key bytes" in flat
    assert (
        "bf16 / DeepGEMM <= 1.94, the key-byte ratio (decode, >= 8,192 keys, default config): 1/1 (max 1.66)"
        in flat
    )


def test_the_mtp_sweep_table_lists_every_config_per_shape(tmp_path: Path) -> None:
    """The results README's grouped-sweep block: a row per config and group size, the shapes as
    columns, the fastest in bold, a config whose logits disagreed as `wrong`, and the shared
    memory each needs with the programs per SM that leaves room for."""
    from verify import figures
    from verify.bench import read as bench
    from verify.bench import report
    from verify.bench.read_scenarios import MtpResult

    default = {"block_n": 64, "num_warps": 4, "num_stages": 4, "swap_ab": True, "max_split_n": 2048}
    shallow = {**default, "num_stages": 3}
    mtp = [
        MtpResult(
            8,
            32768,
            2,
            0,
            one_row={"ms": 0.02},
            grouped={"ms": 0.024, "config": default},
            grouped_sweep=[
                {"ms": 0.023, "config": shallow},
                {
                    "ms": None,
                    "error": "disagrees with the default: max error 1",
                    "config": {**default, "block_n": 32},
                },
            ],
            grouped_best={"ms": 0.023, "config": shallow},
        ),
        MtpResult(
            8,
            32768,
            4,
            0,
            one_row={"ms": 0.02},
            grouped={"ms": 0.04, "config": default},
            grouped_sweep=[{"ms": 0.032, "config": shallow}],
            grouped_best={"ms": 0.032, "config": shallow},
        ),
    ]
    bench.write_outputs(tmp_path, {"gpu": "NVIDIA H200", "heads": 64}, [], mtp)
    lines = report.mtp_sweep_table(report.load(tmp_path))
    body = "\n".join(lines)
    assert "| 64/w4/s4/swap/cap 2048 (default), 2 | 96 | 2 | 1.20 |  |" in body
    assert "| 64/w4/s3/swap/cap 2048, 2 | 80 | 2 | **1.15** |  |" in body
    assert "| 32/w4/s4/swap/cap 2048, 2 | 64 | 3 | wrong |  |" in body
    # four rows of 64 heads: the query tile alone is 64 KB; four key stages leave room for one program
    assert "| 64/w4/s4/swap/cap 2048 (default), 4 | 128 | 1 |  | 2.00 |" in body
    assert "| 64/w4/s3/swap/cap 2048, 4 | 112 | 2 |  | **1.60** |" in body
    bench.write_outputs(
        tmp_path, {"gpu": "x"}, [], [MtpResult(8, 32768, 2, 0, one_row={"ms": 0.02}, grouped={"ms": 0.024})]
    )
    assert "not measured" in report.mtp_sweep_table(report.load(tmp_path))[0]
    assert figures.mtp_sweep(tmp_path / "nowhere").startswith("_Not measured yet")


def test_speed_report_renders_the_prefill_kernel_its_targets_and_the_compile_cost(tmp_path: Path) -> None:
    """A run with the series' prefill kernel on the long prefill (and its sweep, DeepGEMM, the same
    run's dense matmul rate) and the compile section: the long-prefill table gains effective
    TFLOP/s, % of the dense rate and the ratio to DeepGEMM; the targets say met or missed per
    length; the compile table puts fp8 beside bf16, cold beside warm."""
    import json

    from verify.bench import read as bench
    from verify.bench import report
    from verify.bench.read_scenarios import LongPrefillResult, prefill_floors

    def long(tokens: int, bf16_ms: float, dg_ms: float | None) -> LongPrefillResult:
        keys = tokens // 4
        lengths = [max(1, (p + 1) // 4) for p in range(tokens)]
        cfg = {"block_k": 256, "block_r": 64, "num_warps": 8, "maxnreg": 128}
        return LongPrefillResult(
            tokens,
            keys,
            tokens,
            arms={
                "bf16": {"ms": 3 * bf16_ms},
                "bf16_prefill": {"ms": bf16_ms, "config": cfg},
                "fp8_twin": {"ms": 2 * bf16_ms},
                "deepgemm_nonpaged": {"ms": dg_ms},
            },
            floors=prefill_floors(lengths, keys, 64),
            dispatch_arm="bf16_prefill",
            prefill_sweep=[
                {"ms": 0.9 * bf16_ms, "config": {**cfg, "block_r": 32}},
                {"ms": None, "error": "disagrees with the default", "config": cfg},
            ],
            dense_bf16_tflops=770.0,
        )

    flops32 = prefill_floors([max(1, (p + 1) // 4) for p in range(32768)], 8192, 64)["flops"]
    runs = [long(8192, 0.30, 0.16), long(32768, flops32 / 650e12 * 1e3, 2.12), long(131072, 70.0, 37.45)]
    meta = {
        "gpu": "NVIDIA H200",
        "triton": "3.6.0",
        "dense_matmul": {"n": 8192, "bf16_tflops": 770.0, "fp8_tflops": 1400.0},
    }
    bench.write_outputs(tmp_path, meta, [], None, runs)
    phases = [
        {
            "name": "capture",
            "format": "bf16",
            "calls": 52,
            "variants": {"bf16_paged_mqa_logits": 3},
            "variants_total": 3,
            "seconds_total": 9.5,
            "seconds_in_compiling_calls": 9.0,
            "error": None,
        },
        {
            "name": "capture",
            "format": "fp8",
            "calls": 52,
            "variants": {"DG_JIT_CACHE_DIR": 1, "SGLANG_JIT_CACHE_DIR": 1},
            "variants_total": 2,
            "seconds_total": 31.0,
            "seconds_in_compiling_calls": 30.0,
            "error": None,
        },
    ]
    warm = [{**p, "seconds_total": p["seconds_total"] / 10} for p in phases]
    (tmp_path / "bench_compile.json").write_text(
        json.dumps(
            {
                "cold": {"phases": phases, "capture_sizes": list(range(52)), "mtp_capture_sizes": []},
                "warm": {"phases": warm},
            }
        )
    )
    text = report.render(report.load(tmp_path))
    flat = " ".join(text.split())
    assert (
        "dense bf16 matmul (`torch.matmul` 8192^3): 770 TFLOP/s" in flat
        and "fp8 (`torch._scaled_mm`): 1,400" in flat
    )
    # 32K: 650 TFLOP/s = 84% of the dense rate; DeepGEMM 2.12 ms
    assert f"| 32,768 | {flops32 / 650e12 * 1e3:,.2f} | 650 | 84 |" in text
    assert "| 256/r32/w8/128 registers |" in text  # the best swept config
    assert (
        "long prefill >= 600 TFLOP/s effective (causal FLOPs; the same run's dense bf16 matmul: 770 TFLOP/s): "
        "32,768: 650 met; 131,072: 503 MISSED" in flat
    )
    assert "8,192: 1.88x (<= 2.0) met; 32,768: 1.60x (<= 1.7) met; 131,072: 1.87x (<= 1.7) MISSED" in flat
    assert "long prefill within 1.2x" not in flat  # the old target is not this run's
    assert (
        "| graph capture, 52 decode batch sizes | bf16 | 52 | bf16_paged_mqa_logits 3 | 9.0 | 9.5 | 0.9 |"
        in text
    )
    assert (
        "| graph capture, 52 decode batch sizes | fp8 | 52 | DG_JIT_CACHE_DIR 1, SGLANG_JIT_CACHE_DIR 1 | 30.0 | 31.0 | 3.1 |"
        in text
    )


def test_compile_cost_pieces_on_cpu(tmp_path: Path) -> None:
    """verify.bench.compile_cost without a GPU: upstream's own default capture sizes (an H200 server
    at tp 8; with MTP its speculative list), a phase's summary, the JIT cache artifact count and
    the table."""
    from verify.bench import compile_cost as cc

    sizes, spec = cc.capture_sizes(), cc.capture_sizes(speculative=True)
    assert sizes[:6] == [1, 2, 4, 8, 12, 16] and sizes[-1] == 512 and len(sizes) == 52
    assert spec[:9] == [1, 2, 3, 4, 5, 6, 7, 8, 10] and spec[-1] == 512
    phase = cc.Phase(
        "capture",
        "bf16",
        [cc.Call("bs=1", 2.0, {"k": 1}), cc.Call("bs=2", 0.01, {}), cc.Call("bs=256", 1.5, {"k": 1})],
    )
    s = phase.summary()
    assert s["variants"] == {"k": 2} and s["compiling_calls"] == ["bs=1", "bs=256"]
    assert s["seconds_in_compiling_calls"] == 3.5 and s["seconds_total"] == 3.51
    (tmp_path / "a" / "kernel.x").mkdir(parents=True)
    (tmp_path / "a" / "kernel.x" / "kernel.cubin").write_bytes(b"")
    (tmp_path / "a" / "m.so").write_bytes(b"")
    (tmp_path / "a" / "m.cu").write_text("")
    assert cc.count_artifacts(tmp_path / "a") == 2 and cc.count_artifacts(tmp_path / "none") == 0
    env = cc.child_env(tmp_path)
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "triton_cache_dir")
    text = cc.table(
        {
            "cold": {"phases": [{"name": "capture", "format": "bf16", **s}], "fp8": "not run: no DeepGEMM"},
            "warm": {"error": "exit 1"},
        }
    )
    assert "capture" in text and "not run: no DeepGEMM" in text and "warm pass: exit 1" in text
