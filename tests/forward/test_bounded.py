"""The forward tier's bounded-logits pieces on CPU: what a step under a logits budget must show
(bounded_problems), the indexer plan it records, the budget found through upstream's own knob, the
lean keeping of the rows the checks read, the scenarios' steps, and the per-arm scenario choice.
The scenarios themselves run upstream's JIT kernels: on the H200 (verify/gpu/run.sh forward)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verify.core.stand_ins import Spies
from verify.forward import tier

MIB = 2**20


def _step(fmt: str = "bf16", **kw):  # type: ignore[no-untyped-def]
    plan = {
        "index_k_format": fmt,
        "deep_gemm_metadata": "none",
        "budget_bytes": 40 * MIB,
        "rows_per_chunk": 2048,
        "rows_per_request": 1,
        "unchunked_logits_bytes": 256 * MIB,
        "nonpaged": None,
    }
    plan.update(kw.pop("plan", {}))
    res = tier.StepResult(
        "sm120",
        f"{fmt}/fused",
        "bounded",
        "eager",
        "extend",
        "x",
        "pass",
        [16384],
        indexer_plan=plan,
        scorer_calls=kw.pop("calls", 8),
        logits_chunk_max_mb=kw.pop("chunk", 32.0),
    )
    return res


def test_a_chunked_step_within_the_budget_passes() -> None:
    assert tier.bounded_problems("bf16", _step(), {"peak_extra": 36 * MIB}) == []
    line = tier.bounded_summary(_step())
    assert "budget 40.0 MiB" in line and "256.0 MiB in one piece" in line and "8 chunk(s)" in line


@pytest.mark.parametrize(
    "change, words",
    [
        ({"calls": 1}, "not chunked"),
        ({"chunk": 48.0}, "exceeds the budget"),
        ({"plan": {"deep_gemm_metadata": "4 schedules"}}, "DeepGEMM metadata built"),
        ({"plan": {"rows_per_chunk": None}}, "planned no row chunks"),
        ({"plan": {"unchunked_logits_bytes": 30 * MIB}}, "not bounded"),
        ({"plan": {"budget_bytes": None}}, "without a logits budget"),
    ],
)
def test_what_a_bounded_bf16_step_is_held_to(change, words) -> None:  # type: ignore[no-untyped-def]
    problems = tier.bounded_problems("bf16", _step(**change), {"peak_extra": 36 * MIB})
    assert any(words in p for p in problems), problems


def test_the_logits_phase_peak_is_held_to_the_budget_plus_slack() -> None:
    assert tier.bounded_problems("bf16", _step(), {"peak_extra": 40 * MIB + tier.PHASE_SLACK_BYTES}) == []
    over = tier.bounded_problems("bf16", _step(), {"peak_extra": 41 * MIB + tier.PHASE_SLACK_BYTES})
    assert over and "peaked" in over[0]


def test_the_non_paged_path_needs_no_metadata_chunks_and_fp8_is_recorded_only() -> None:
    nonpaged = _step(
        plan={
            "rows_per_chunk": None,
            "nonpaged": {"query_rows": 16384, "max_seqlen_k": 4096, "rows_per_chunk": 2560},
        }
    )
    assert tier.bounded_problems("bf16", nonpaged, {"peak_extra": 36 * MIB}) == []
    assert "non-paged" in tier.bounded_summary(nonpaged)
    # upstream's fp8 path is what it is (sm_120's torch path plans no chunks): recorded, never failed
    assert tier.bounded_problems("fp8", _step("fp8", calls=1, plan={"budget_bytes": None}), {}) == []


def test_the_indexer_plan_of_a_forward() -> None:
    im = SimpleNamespace(
        deep_gemm_metadata=None,
        mqa_logits_budget_bytes=123,
        rows_per_chunk=100,
        index_k_format="bf16",
        rows_per_request=1,
        max_compressed_seq_len=4000,
        nonpaged_plan=None,
    )
    plan = tier.indexer_plan(im, 1000)
    assert plan["deep_gemm_metadata"] == "none" and plan["rows_per_chunk"] == 100
    assert (
        plan["unchunked_logits_bytes"] == 1000 * 4096 * 4
    )  # rows aligned to 256 columns, as upstream budgets
    im.deep_gemm_metadata = [object(), object()]
    im.nonpaged_plan = SimpleNamespace(query_rows=1000, max_seqlen_k=1024, rows_per_chunk=None)
    plan = tier.indexer_plan(im, 1000)
    assert plan["deep_gemm_metadata"] == "2 schedules" and plan["nonpaged"]["max_seqlen_k"] == 1024
    assert plan["unchunked_logits_bytes"] == 1000 * 1024 * 4
    unpatched = SimpleNamespace(
        deep_gemm_metadata=torch.zeros(1),
        mqa_logits_budget_bytes=None,
        rows_per_chunk=None,
        max_compressed_seq_len=64,
    )
    assert tier.indexer_plan(unpatched, 1)["index_k_format"] is None


def test_the_budget_is_found_through_upstreams_own_knob(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """upstream's budget is linear in its fraction below its caps: one probe finds the fraction
    for a target, and upstream computes the budget with it."""
    import os

    import sglang.srt.layers.attention.mqa_logits_utils as mlu

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        mlu,
        "mqa_logits_budget_bytes",
        lambda device_index, allow_sync: int(float(os.environ[tier.BUDGET_ENV]) * 28e9),
    )
    with tier.logits_budget(64 * MIB) as got:
        assert os.environ[tier.BUDGET_ENV] == f"{got['fraction']:.9g}"
        assert got["budget_bytes"] == pytest.approx(64 * MIB, rel=1e-6)
    assert tier.BUDGET_ENV not in os.environ


def test_lean_keeping_follows_the_chunks_row_offsets() -> None:
    spies = Spies(keep_logits=True)
    spies.arm_lean(torch.tensor([1, 5, 6, 9]), track_phase=False)
    full = torch.arange(10 * 3, dtype=torch.float32).view(10, 3)
    for lo, hi in ((0, 4), (4, 7), (7, 10)):  # the top-k's calls, one per row chunk
        spies._keep(full[lo:hi])
    kept = spies.take_kept_rows()
    assert sorted(kept) == [1, 5, 6, 9] and all(torch.equal(kept[r], full[r]) for r in kept)
    assert all(t.device.type == "cpu" for t in kept.values()) and spies.keep_rows is None
    spies._keep(full)  # back to keeping every row, as before
    assert spies.take_logits()[0] is full


def test_the_bounded_scenarios_steps(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Which steps the scenarios take, with a recording arm: a one-shot prefill, two prefixes and a
    joint extend, all bounded under one budget; the large request's prefix chunks lean and
    unchecked, its last chunk bounded and checked."""
    import contextlib

    steps = []

    class Rig:
        def __init__(self) -> None:
            self.n = 0

        def new_request(self, seed: int) -> SimpleNamespace:
            self.n += 1
            return SimpleNamespace(rid=self.n)

        def finish(self, req: object) -> None:
            pass

    arm = SimpleNamespace(
        rig=Rig(),
        spec=tier.ArmSpec("bf16", "fused"),
        step=lambda *a, **kw: steps.append((a[1], a[3], a[4], kw)),
    )
    budgets = []

    @contextlib.contextmanager
    def budget(target: int):  # type: ignore[no-untyped-def]
        budgets.append(target)
        yield {"target_bytes": target}

    monkeypatch.setattr(tier, "logits_budget", budget)
    sizes = tier.Sizes(bounded=(16384, 12288, 4096), bounded_large=(65536, 16384))
    tier.bounded_scenario(arm, sizes)
    assert budgets == [16384 * 4096 * 4 // 6]
    assert [(s[1], s[2]) for s in steps] == [
        ([16384], "extend"),
        ([12288], "extend"),
        ([12288], "extend"),
        ([4096, 4096], "extend"),
    ]
    assert all(s[3] == {"bounded": True} for s in steps)
    steps.clear()
    tier.bounded_large_scenario(arm, sizes)
    assert len(steps) == 4 and all(s[1] == [16384] for s in steps)
    assert [s[3] for s in steps] == [{"bounded": False, "lean": True, "checked": False}] * 3 + [
        {"bounded": True, "lean": True, "checked": True}
    ]


def test_scenarios_and_per_arm_scenarios_are_checked_names() -> None:
    from verify.forward import cli

    sizes = cli._sizes(False, ["bounded", "long"])
    assert sizes.only == ("bounded", "long") and cli._sizes(True, None).only is None
    with pytest.raises(SystemExit, match="unknown scenario"):
        cli._sizes(False, ["bonded"])
    args = cli.parse_args(
        ["--out", "x", "--arm-scenarios", "sm90:fp8/fused=bounded", "bf16/fused=long,bounded"]
    )
    assert args.arm_scenarios == ["sm90:fp8/fused=bounded", "bf16/fused=long,bounded"]


def test_the_summary_lists_the_bounded_steps() -> None:
    from dataclasses import asdict

    from verify.forward.cli import summary_markdown

    step = asdict(_step())
    step["logits_phase_peak_mb"] = 36.0
    step["selection"] = []
    md = summary_markdown([step], [], {})
    assert (
        "## Logits under a memory budget" in md
        and "| sm120 | bf16/fused | x | paged | 40.0 | 256.0 | 8 |" in md
    )


@pytest.mark.parametrize("profile", ["sm120", "sm90"])
def test_under_a_profile_bf16_is_chunked_by_the_budget_without_a_schedule(profile, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What the bounded scenario asserts on the GPU, on upstream's metadata builder itself under
    the profile's hook env (sm120: SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1, whose fp8 path plans no
    chunks): with a budget (a CPU has none, so it is handed one here) bf16 rows are chunked and no
    DeepGEMM schedule is built."""
    from verify.core import platform as P

    with P.applied(profile) as applied:
        from sglang.srt.layers.attention.dsv4.metadata import PagedIndexerMetadata

        monkeypatch.setattr(PagedIndexerMetadata, "_mqa_logits_budget", lambda self, num_rows: 16 * MIB)
        rows, pages = 8192, 32  # 8192 rows x 2048 keys: 64 MiB of logits in one piece
        table = torch.zeros(rows, pages, dtype=torch.int32)
        lens = torch.full((rows,), 2048, dtype=torch.int32)
        bf16 = PagedIndexerMetadata(
            page_size=256,
            compressed_page_size=64,
            page_table=table,
            compressed_seq_lens=lens,
            use_topk_v2=False,
            index_k_format="bf16",
        )
        assert bf16.deep_gemm_metadata is None and bf16.rows_per_chunk == 16 * MIB // (2048 * 4)
        assert bf16.mqa_logits_budget_bytes == 16 * MIB
        if profile == "sm120":
            assert applied.hook_env["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "True"
            fp8 = PagedIndexerMetadata(
                page_size=256,
                compressed_page_size=64,
                page_table=table,
                compressed_seq_lens=lens,
                use_topk_v2=False,
                index_k_format="fp8",
            )
            assert fp8.deep_gemm_metadata is None and fp8.rows_per_chunk is None  # upstream's fp8 torch path
