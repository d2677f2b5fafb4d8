"""The seeded generator: determinism, needle margins, depth and mod-4 placement, page plumbing."""

import pytest
import torch

from verify.core.formats import PAGE_SLOTS
from verify.core.metrics import row_metrics
from verify.core.scoring import SlotKeys, grouped_row_logits
from verify.recall.backend import EmulationBackend
from verify.recall.generator import GenConfig, PlanConfig, build_planted, build_problem, needle_position

PLAN = PlanConfig(topks=(512,), residues="staggered", sequences=2, margins=(0.01, 0.05, 0.2))
BE = EmulationBackend(device=torch.device("cpu"))


@pytest.fixture(scope="module")
def planted():
    return build_planted(4509, PLAN, GenConfig(seed=3), BE.quantize_q)


def test_same_seed_same_tensors():
    a = build_planted(2048, PLAN, GenConfig(seed=5), BE.quantize_q)
    b = build_planted(2048, PLAN, GenConfig(seed=5), BE.quantize_q)
    for name in ("keys_ref", "page_table", "seq_lens", "needle_pos", "written_slots", "q_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.queries.q_pre, b.queries.q_pre) and torch.equal(
        a.q_fp8.view(torch.uint8), b.q_fp8.view(torch.uint8)
    )
    assert a.rows == b.rows
    c = build_problem(2048, PLAN, GenConfig(seed=6))
    assert not torch.equal(a.queries.q_pre, c.queries.q_pre)


@pytest.mark.parametrize(
    "depth,residue,n,want",
    [
        (0.0, 0, 100, 0),
        (0.0, 3, 100, 3),
        (1.0, 3, 100, 99),
        (1.0, 0, 100, 96),
        (0.5, 1, 101, 49),
        (0.5, 2, 101, 50),
    ],
)
def test_needle_position(depth, residue, n, want):
    assert needle_position(depth, residue, n) == want


def test_depths_and_residues(planted):
    rows = planted.rows
    for r in rows:
        if r["needle_pos"] < 0:
            continue
        assert r["needle_pos"] % 4 == r["residue"]
        assert abs(r["needle_pos"] - r["depth"] * (r["seq_len"] - 1)) <= 3
    decode = [r for r in rows if r["kind"] == "decode"]
    assert {r["depth"] for r in decode} == set(PLAN.depths)
    assert {r["residue"] for r in decode} == {0, 1, 2, 3}
    assert any(r["kind"] == "prefill" and r["seq_len"] < r["n_keys"] for r in rows)


def test_pages_private_and_poisoned(planted):
    p = planted
    pt = p.page_table.long()
    needle_page = pt.gather(1, (p.needle_pos.clamp(min=0) // PAGE_SLOTS).unsqueeze(1)).squeeze(1)
    assert torch.equal(needle_page[p.needle_pos >= 0], p.private_page[p.needle_pos >= 0])
    assert p.private_page.unique().numel() == p.num_rows
    assert pt[:, -1].unique().numel() == 1  # the poison column
    written_pages = (p.written_slots // PAGE_SLOTS).unique()
    assert not bool(torch.isin(p.canary_pages, written_pages).any())


def _oracle_metrics(p):
    oracle = grouped_row_logits(
        SlotKeys(p.keys_ref), p.q_fp8.float(), p.w, p.q_index, p.page_table, p.seq_lens
    )
    sel = torch.full((p.num_rows, 512), -1)
    return row_metrics(oracle, p.seq_lens, 512, sel, p.needle_pos)


def test_needle_margin_is_what_was_asked(planted):
    m = _oracle_metrics(planted)
    checked = 0
    for i, r in enumerate(planted.rows):
        if r["needle_pos"] < 0 or r["seq_len"] <= r["k"]:
            continue
        if r["mode"] == "top":
            got = float(m["oracle_margin_best_other"][i])
        else:
            got = float(m["oracle_margin_nonselected"][i])
            assert m["oracle_needle_selected"][i] == 1.0
        assert got == pytest.approx(r["margin"], abs=2e-5), r
        checked += 1
    assert checked >= 0.8 * len(planted.rows)
