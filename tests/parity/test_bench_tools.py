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
