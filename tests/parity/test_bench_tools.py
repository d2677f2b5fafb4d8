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
    verify.bench.report: after a bench run, `python -m verify.bench.report --write`."""
    from verify.bench import report

    readme = report.README.read_text()
    block = report.render(report.load())
    assert report.BEGIN in readme and report.END in readme
    assert report.splice(readme, block) == readme, (
        "README.md's speed section differs from the committed bench artifacts; "
        "run `python -m verify.bench.report --write`"
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
        MtpResult(64, 32768, 2, 64 * 32768 * 256, one_row={"ms": 0.14}, grouped={"ms": 0.15},
                  ungrouped={"ms": 0.28}, fp8={"ms": 0.19})
    ]
    lengths = [max(1, (p + 1) // 4) for p in range(8192)]
    long = [
        LongPrefillResult(
            8192, 2048, 8192,
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
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nstale\n{report.END}\noutro\n")
    assert report.main(["--results", str(tmp_path), "--readme", str(readme)]) == 1
    assert report.main(["--results", str(tmp_path), "--readme", str(readme), "--write"]) == 0
    assert report.main(["--results", str(tmp_path), "--readme", str(readme)]) == 0
    assert readme.read_text().startswith("intro\n") and readme.read_text().endswith("outro\n")


def test_speed_report_shows_the_grouped_sweep_and_the_anchor(tmp_path: Path) -> None:
    """An MTP run with the grouped-config sweep and DeepGEMM's arm, and a decode sweep: the
    table gains the best swept config and the anchor, the targets say what the sweep found."""
    from verify.bench import read as bench
    from verify.bench import report
    from verify.bench.read_scenarios import MtpResult

    default = {"block_n": 64, "num_warps": 4, "num_stages": 4, "swap_ab": True, "max_split_n": 2048}
    better = {**default, "num_warps": 8, "block_n": 128}
    grouped = {"ms": 0.17, "config": default}
    swept = [{"ms": 0.16, "config": better}, {"ms": None, "error": "disagrees with the default", "config": default}]
    mtp = [
        MtpResult(64, 32768, 2, 64 * 32768 * 256, one_row={"ms": 0.14}, grouped=grouped, ungrouped={"ms": 0.28},
                  fp8={"ms": 0.19}, deepgemm={"ms": 0.1}, grouped_sweep=swept, grouped_best=swept[0]),
        MtpResult(8, 8192, 2, 8 * 8192 * 256, one_row={"ms": 0.01}, grouped={"ms": 0.011, "config": default},
                  ungrouped={"ms": 0.012}, fp8={"ms": 0.012}, deepgemm={"ms": None, "error": "Disagrees"},
                  grouped_sweep=[{"ms": 0.02, "config": better}], grouped_best={"ms": 0.011, "config": default}),
    ]
    decode = bench.ShapeResult(
        shape={"mode": "decode", "rows": 8, "keys": 32768, "width": 0},
        key_bytes_bf16=8 * 32768 * 256, key_bytes_fp8=8 * 32768 * 132, unique_key_bytes_bf16=8 * 32768 * 256,
        bf16_default=bench.Timing("d", ms=0.0233), bf16_best=bench.Timing("b", ms=0.0155),
        sweep=[bench.Timing("b", ms=0.0155)], fp8_best=bench.Timing("f", ms=0.015),
        fp8_deepgemm=bench.Timing("dg", ms=0.014), peak_extra_bytes={"bf16": 0, "logits": 0},
    )
    bench.write_outputs(tmp_path, {"gpu": "NVIDIA H200", "triton": "3.6.0"}, [decode], mtp)
    text = report.render(report.load(tmp_path))
    assert "| 64 x 32,768, 2 | 140.0 | 170.0 | 1.21 | 160.0 | 1.14 | 128/w8/s4/swap/cap 2048 | 280.0 | 190.0 | 100.0 | 1.70 |" in text
    assert "| 8 x 8,192, 2 | 10.0 | 11.0 | 1.10 | 11.0 | 1.10 | 64/w4/s4/swap/cap 2048 (default) | 12.0 | 12.0 | n/a | n/a |" in text
    flat = " ".join(text.split())  # the target lines wrap
    assert "one row per request: 1/2 (max 1.21x); with the best swept grouped config per shape 2/2 (max 1.14x)" in flat
    assert "0/1 shapes (default config, 60-60%; the best swept config per shape: 1/1, 90-90%" in flat
    assert "DeepGEMM's fp8 scorer on the same shapes: 51-51% of 4.8 TB/s for its own key bytes" in flat
    assert "bf16 / DeepGEMM <= 1.94, the key-byte ratio (decode, >= 8,192 keys, default config): 1/1 (max 1.66)" in flat


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
        MtpResult(8, 32768, 2, 0, one_row={"ms": 0.02}, grouped={"ms": 0.024, "config": default},
                  grouped_sweep=[{"ms": 0.023, "config": shallow},
                                 {"ms": None, "error": "disagrees with the default: max error 1", "config": {**default, "block_n": 32}}],
                  grouped_best={"ms": 0.023, "config": shallow}),
        MtpResult(8, 32768, 4, 0, one_row={"ms": 0.02}, grouped={"ms": 0.04, "config": default},
                  grouped_sweep=[{"ms": 0.032, "config": shallow}], grouped_best={"ms": 0.032, "config": shallow}),
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
    bench.write_outputs(tmp_path, {"gpu": "x"}, [], [MtpResult(8, 32768, 2, 0, one_row={"ms": 0.02}, grouped={"ms": 0.024})])
    assert "not measured" in report.mtp_sweep_table(report.load(tmp_path))[0]
    assert figures.mtp_sweep(tmp_path / "nowhere").startswith("_Not measured yet")
