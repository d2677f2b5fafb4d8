"""Capture format round trip, validation, and replay == direct run on the same tensors."""

import csv
import json

import pytest
import torch

from verify.recall.backend import EmulationBackend
from verify.recall.cli import main
from verify.recall.generator import GenConfig, PlanConfig, build_planted
from verify.recall.replay import capture_from_problem, load_problem
from verify.recall.replay_format import read_capture, validate, write_capture
from verify.recall.runner import run_problem

BE = EmulationBackend(device=torch.device("cpu"))
PLAN = PlanConfig(topks=(512,), residues="staggered", sequences=1, margins=(0.01, 0.2))


@pytest.fixture(scope="module")
def problem():
    return build_planted(4509, PLAN, GenConfig(seed=9), BE.quantize_q)


def test_round_trip(problem, tmp_path):
    path = capture_from_problem(problem, tmp_path / "cap.pt", "fp8")
    cap = read_capture(path)
    assert cap.index_k_format == "fp8" and cap.q.dtype == torch.float8_e4m3fn and cap.rows == problem.num_rows
    assert torch.equal(cap.q.view(torch.uint8), problem.q_fp8[problem.q_index].view(torch.uint8))
    assert torch.equal(cap.seq_lens, problem.seq_lens) and torch.equal(cap.needle_pos, problem.needle_pos)
    assert cap.index_k_pages.shape[1] == 64 * 132
    # compaction keeps only referenced pages, and what a row reads is unchanged
    assert cap.num_pages < problem.num_pages
    r = 5
    n = int(cap.seq_lens[r])
    pos = torch.arange(n)
    new_slots = cap.page_table[r, pos // 64].long() * 64 + pos % 64
    old_slots = problem.page_table[r, pos // 64].long() * 64 + pos % 64
    assert torch.equal(cap.k_ref[new_slots], problem.keys_ref[old_slots])


def test_validation_names_the_field(problem, tmp_path):
    path = capture_from_problem(problem, tmp_path / "cap.pt", "bf16")
    cap = read_capture(path)
    cap.index_k_pages = cap.index_k_pages[:, :-1]
    with pytest.raises(ValueError, match="index_k_pages rows must be 16384 B"):
        validate(cap)
    with pytest.raises(ValueError, match="index_k_format"):
        write_capture(
            tmp_path / "bad.pt",
            q=cap.q,
            weights=cap.weights,
            index_k_pages=cap.index_k_pages,
            page_table=cap.page_table,
            seq_lens=cap.seq_lens,
            index_k_format="fp16",
            index_topk=512,
        )
    payload = torch.load(path, weights_only=True)
    payload["version"] = 2
    torch.save(payload, tmp_path / "v2.pt")
    with pytest.raises(ValueError, match="version 2"):
        read_capture(tmp_path / "v2.pt")


def _by_row(records):
    return {(r["arm"], r["row"]): r for r in records}


def test_replay_equals_direct_run(problem, tmp_path):
    direct = _by_row(run_problem(problem, BE)["records"])
    cap = read_capture(capture_from_problem(problem, tmp_path / "cap.pt", "bf16"))
    rp, preset, _ = load_problem(cap, (512,), (4509,), PLAN.depths, torch.device("cpu"), "cap.pt")
    replay = _by_row(run_problem(rp, BE, ("bf16", "fp8", "fp4sim", "captured"), preset=preset)["records"])
    for row in range(problem.num_rows):
        for arm in ("bf16", "fp8", "fp4sim"):
            a, b = direct[(arm, row)], replay[(arm, row)]
            for f in ("recall_tie", "recall_strict", "needle_hit", "gated"):
                assert a[f] == b[f] or (a[f] != a[f] and b[f] != b[f]), (arm, row, f)
            assert a["depth"] == b["depth"] and a["length_tokens"] == b["length_tokens"]
        assert replay[("captured", row)]["recall_tie"] == replay[("bf16", row)]["recall_tie"]


def test_cli_replays_an_fp8_capture(problem, tmp_path):
    path = capture_from_problem(problem, tmp_path / "cap8.pt", "fp8", with_ref=False)
    rc = main(
        [
            "--out",
            str(tmp_path / "out"),
            "--backend",
            "cpu",
            "--replay",
            str(path),
            "--quiet",
            "--no-plots",
            "--no-diagnose",
        ]
    )
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert rc in (0, 1) and res["config"]["arms"][-1] == "captured"
    with (tmp_path / "out" / "results.csv").open() as fh:
        cap_arm = [r for r in csv.DictReader(fh) if r["arm"] == "captured"]
    # the captured fp8 bytes read back through the fp8 scorer agree with the exact oracle on them
    assert len(cap_arm) == problem.num_rows
    assert min(float(r["recall_tie"]) for r in cap_arm) >= 0.998
    assert res["backend"]["paths"]["replay_reference_keys"].startswith("dequantized captured fp8")
