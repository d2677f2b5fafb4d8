"""A reduced CPU run of ``python -m verify.recall``: every output, a passing gate, and the harness
noticing deliberately broken paths (bf16 slot mapping -> gate fails; fp8 layout -> diagnosis)."""

import csv
import json

import pytest

from verify.recall.cli import main

SMALL = [
    "--backend",
    "cpu",
    "--lengths",
    "338",
    "4509",
    "--topk",
    "512",
    "--margins",
    "0.01",
    "0.2",
    "--quiet",
]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    out = tmp_path_factory.mktemp("recall")
    rc = main(["--out", str(out), *SMALL])
    return rc, out


def test_outputs_and_gate_pass(good):
    rc, out = good
    assert rc == 0
    for name in (
        "results.json",
        "results.csv",
        "cells.csv",
        "summary.md",
        "heatmap_bf16.png",
        "heatmap_fp8.png",
        "heatmap_fp4sim.png",
    ):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "results.json").read_text())
    assert res["gate"]["passed"] is True
    assert res["config"]["arms"] == ["bf16", "fp8", "fp4", "fp4sim", "bf16q", "int8sim", "fp8b32sim"]
    assert res["backend"]["paths"]["score_fp8"].startswith("emulation")
    assert res["versions"]["torch"]
    assert (
        res["diagnosis"]["verdict"].startswith("CPU emulation only")
        and "fp8 path correct, loses" in res["diagnosis"]["verdict"]
    )
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["arm"] for r in rows} == {"bf16", "fp8", "fp4", "fp4sim", "bf16q", "int8sim", "fp8b32sim"}
    assert {r["length_tokens"] for r in rows} == {"338", "4509"}
    summary = (out / "summary.md").read_text()
    assert "**PASS**" in summary and "## Diagnosis" in summary and "| 4,509 |" in summary
    # the gate names its oracle; the exact-q one is reported beside it, with its own table
    assert "Against the same-q oracle" in summary and "against the exact-q oracle" in summary
    assert (
        "same-q oracle / exact-q oracle / reference oracle" in summary
        and "None of these is model quality" in summary
    )
    assert res["gate"]["oracle"].startswith("same-q") and res["gate_exact_q"]["oracle"].startswith("exact-q")
    (out / "heatmap_fp8.png").unlink()
    from verify.recall.report import main as replot

    assert (
        replot([str(out)]) == 0 and (out / "heatmap_fp8.png").stat().st_size > 0
    )  # redrawn from results.json
    by = {(e["arm"], e["length_tokens"]): e for e in res["per_length"]}
    assert by[("bf16", 338)]["recall_tie"]["mean"] == 1.0  # 84 keys < top-512: everything selected
    assert by[("bf16", 4509)]["loss"] < 0.25 * by[("fp8", 4509)]["loss"]
    assert by[("fp4sim", 4509)]["recall_tie"]["mean"] < by[("fp8", 4509)]["recall_tie"]["mean"]
    # q before its fp8 rounding: the closest arm to the exact-q oracle; the same keys with fp8 q lose more
    exact = {arm: by[(arm, 4509)]["recall_tie_unq"]["mean"] for arm in ("bf16", "bf16q", "fp8")}
    assert exact["bf16q"] > exact["bf16"] > exact["fp8"]
    # 132-byte candidates: int8 with a per-key scale keeps more than e4m3 with one
    assert by[("int8sim", 4509)]["recall_tie"]["mean"] > by[("fp8", 4509)]["recall_tie"]["mean"]
    # DeepSeek's reference numerics (fp4 q x fp4 k): upstream's fp4 is the arm nearest it, and
    # every finer arm stays closer to exact math than to it
    ref = {arm: by[(arm, 4509)]["recall_tie_ref"]["mean"] for arm in res["config"]["arms"]}
    assert max(ref, key=ref.get) == "fp4" and ref["fp4"] < 1.0
    for arm in ("bf16", "fp8", "bf16q", "int8sim"):
        assert ref[arm] < by[(arm, 4509)]["recall_tie_unq"]["mean"], arm
    own = by[("bf16", 4509)]
    assert own["ref_recall_tie_unq"]["mean"] < exact["fp8"]  # the reference itself is far from exact math
    assert {row["recall_tie_ref"] for row in rows if row["arm"] == "fp4"} - {""}
    diag = res["diagnosis"]["oracle_recall"]
    assert diag["reference"]["reference"] == 1.0 and set(diag) == {"same-q", "exact-q", "reference"}
    rounding = res["per_problem"][1]["fp4_upstream_vs_reference_rounding"]
    assert (
        0 < rounding["q_values_rounded_differently"] < 0.02
        and 0 < rounding["key_values_rounded_differently"] < 0.02
    )


def test_broken_bf16_slot_mapping_fails_the_gate(tmp_path):
    rc = main(
        ["--out", str(tmp_path), *SMALL, "--no-plots", "--no-diagnose", "--inject-fault", "bf16-slot-shift"]
    )
    assert rc == 1
    res = json.loads((tmp_path / "results.json").read_text())
    failed = {c["name"] for c in res["gate"]["conditions"] if not c["passed"]}
    assert {"needle", "loss_ratio", "cells"} <= failed


def test_fp8_layout_bug_is_diagnosed(tmp_path):
    rc = main(
        [
            "--out",
            str(tmp_path),
            "--backend",
            "cpu",
            "--lengths",
            "4509",
            "--topk",
            "512",
            "--margins",
            "0.2",
            "--quiet",
            "--no-plots",
            "--inject-fault",
            "fp8-interleaved",
        ]
    )
    assert rc == 0  # bf16 is still fine; the fp8 arm is reported, not gated
    res = json.loads((tmp_path / "results.json").read_text())
    verdict = res["diagnosis"]["verdict"]
    assert (
        verdict.startswith("fp8 path disagrees with its own oracle: bug in")
        and "fused_store_cache" in verdict
    )
    store = next(c for c in res["diagnosis"]["checks"] if c["name"] == "fp8 index-K store")
    assert store["status"] == "fail" and "TOKEN-INTERLEAVED" in store["detail"]
