"""Unit checks of the live tier's pieces that need no server: corpus, layouts, fitter, grid, scoring,
states, the retry policy and the calibration model."""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from verify.live.client import RequestFailure, classify_status
from verify.live.config import RunConfig
from verify.live.corpus import SentenceStream, ValueFactory, pad_text, stable_seed
from verify.live.fit import FitError, fit_layout
from verify.live.gate import default_target
from verify.live.grid import CONTROL_MAX, GridOptions, base_cells, concurrency_cells, nudged
from verify.live.layouts import Needle, Rendered, TextLayout
from verify.live.retry import RetryPolicy, parse_retry_after, with_retries
from verify.live.runner import request_timeout
from verify.live.scenarios import SCENARIOS, Cell, build
from verify.live.scoring import score_answer
from verify.live.states import TRANSIENT_KINDS, count_states, is_done, judge
from verify.live.tokens import PromptSize, fit_model, rendered_chars

NEEDLE_SHAPES = re.compile(
    r"\b\d{7}\b|[0-9a-f]{8}-[0-9a-f]{4}-|\b[A-Z]{2,}-\d{4}-[A-Z]{2,}\b|\b[a-z]+-[a-z]+\b|\""
)


def word_count(rendered: Rendered) -> int:
    """A BPE-like stand-in tokenizer: words and punctuation marks, plus 4 per message."""
    text = " ".join(str(m.get("content") or "") for m in rendered.messages)
    return len(re.findall(r"\w+|[^\w\s]", text)) + 4 * len(rendered.messages)


async def count_words(rendered: Rendered) -> int:
    return word_count(rendered)


def test_corpus_is_deterministic_and_never_needle_shaped() -> None:
    a, b, c = SentenceStream(7), SentenceStream(7), SentenceStream(8)
    first = [a.get(i) for i in range(3000)]
    assert first == [b.get(i) for i in range(3000)]
    assert first[:50] != [c.get(i) for i in range(50)]
    assert len(set(first)) > 2500  # varied, not a handful of repeated lines
    for s in first:
        assert not NEEDLE_SHAPES.search(s), s
    assert not NEEDLE_SHAPES.search(pad_text(200))


def test_values_have_their_shapes_and_are_unique() -> None:
    vf = ValueFactory(random.Random(1))
    nums = [vf.number() for _ in range(300)]
    uuids = [vf.uuid() for _ in range(50)]
    codes = [vf.code() for _ in range(300)]
    keys = [vf.key() for _ in range(100)]
    assert all(re.fullmatch(r"[1-9]\d{6}", n) for n in nums)
    assert all(
        re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids
    )
    assert all(re.fullmatch(r"[A-Z]+-\d{4}-[A-Z]+", c) for c in codes)
    everything = nums + uuids + codes + keys
    assert len(set(everything)) == len(everything)
    assert stable_seed("a", 1) == stable_seed("a", 1) != stable_seed("a", 2)


def _layout(depth: float) -> TextLayout:
    stream = SentenceStream(3)
    return TextLayout(
        system="sys",
        head="head",
        question="Q?",
        unit=stream.get,
        needles=(Needle(depth, "NEEDLE SENTENCE."),),
    )


def test_needle_depth_places_the_needle() -> None:
    first = _layout(0.0).render(100, 0).messages[1]["content"]
    last = _layout(1.0).render(100, 0).messages[1]["content"]
    assert first.index("NEEDLE") < first.index(SentenceStream(3).get(0))
    assert last.index("NEEDLE") > last.index(SentenceStream(3).get(99))
    fracs = [_layout(d).render(200, 0).needle_frac for d in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert fracs == sorted(fracs) and fracs[0] < 0.05 and fracs[-1] > 0.95  # type: ignore[operator]


@pytest.mark.parametrize("target", [1024, 1025, 1026, 1027, 4509, 4607, 4608, 4612, 12000])
def test_fit_hits_exact_targets(target: int) -> None:
    fit = asyncio.run(fit_layout(_layout(0.5), count_words, target))
    assert fit.tokens == target and fit.exact
    assert fit.calls <= 16


def test_fit_does_not_depend_on_the_start_guess() -> None:
    a = asyncio.run(fit_layout(_layout(0.3), count_words, 5200, start_units=1))
    b = asyncio.run(fit_layout(_layout(0.3), count_words, 5200, start_units=5000))
    assert a.knobs == b.knobs and a.rendered == b.rendered


def test_fit_refuses_targets_below_the_bare_prompt() -> None:
    with pytest.raises(FitError, match="below"):
        asyncio.run(fit_layout(_layout(0.5), count_words, 3))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_fits_and_states_its_answer(scenario: str) -> None:
    cell = Cell(scenario, "number", 3000, 3000, 50.0, "k2" if scenario == "shared_prefix" else "")
    spec = build(cell, 1234, "s1")
    fit = asyncio.run(fit_layout(spec.layout, count_words, 3000))
    assert abs(fit.tokens - 3000) <= 2
    text = " ".join(str(m.get("content") or "") for m in fit.rendered.messages)
    for value in spec.expected:
        assert value in text  # the answer is in the prompt...
        assert (
            value not in str(fit.rendered.messages[-1]["content"]).split("Question:")[-1]
        )  # ...not in the question
    assert build(cell, 1234, "s1").expected == spec.expected  # deterministic
    assert rendered_chars(fit.rendered) > 0


def test_nudges_cover_residues_and_page_boundaries() -> None:
    lengths = nudged(4509, ("residues", "pages"))
    assert {n % 4 for n in lengths} == {0, 1, 2, 3}
    assert {4607, 4608, 4612} <= set(lengths)  # 64-slot pages of 4-token keys: 256-token boundary
    assert 4511 in nudged(4509, ("quick",))  # the residue-3 case
    assert nudged(4509, ("none",)) == [4509]


def test_grid_defaults_and_overrides() -> None:
    full = base_cells(GridOptions())
    sweep = [c for c in full if c.scenario == "sweep"]
    assert {c.base_length for c in sweep} == {1024, 2048, 4509, 5200, 8000, 12000, 22597, 32768, 65536}
    assert {c.depth_pct for c in sweep} == {0, 5, 10, 25, 50, 75, 90, 95, 100}
    assert all(c.target_tokens <= CONTROL_MAX + 3 for c in sweep if c.base_length <= CONTROL_MAX)
    assert {c.base_length for c in full if c.scenario == "config_recall"} == {2048, 8000, 12000}
    quick = base_cells(GridOptions(quick=True))
    assert len(quick) < len(full) / 5 and max(c.base_length for c in quick) <= 12000
    user = base_cells(GridOptions(scenarios=("sweep",), max_length=100000, nudge=("none",)))
    assert max(c.base_length for c in user) == 100000  # the user-set maximum joins the sweep
    small = base_cells(
        GridOptions(scenarios=("sweep",), lengths=(1000, 3000), depths=(0, 100), nudge=("none",))
    )
    assert [(c.base_length, c.depth_pct) for c in small] == [(1000, 0), (1000, 100), (3000, 0), (3000, 100)]
    conc = concurrency_cells(full, GridOptions())
    assert conc and all(c.base_length >= 4509 and c.target_tokens == c.base_length for c in conc)


def test_scoring_exact_match_and_diagnostics() -> None:
    s = score_answer("The code is zebra-4492-omega.", ["ZEBRA-4492-OMEGA"])
    assert s.ok and s.score == 1.0 and s.first_wrong_char is None
    s = score_answer("ZEBRA-4492-OMEGB", ["ZEBRA-4492-OMEGA"])
    assert not s.ok and s.first_wrong_char == 15  # only the last character is wrong
    s = score_answer("I cannot find it.", ["OTTER-3085-DELTA"])
    assert s.first_wrong_char == 0
    s = score_answer("1234567, 7654321", ["1234567", "7654321", "1111111", "2222222"])
    assert s.score == 0.5 and not s.ok
    s = score_answer("9999999", ["1234567"], distractors=["9999999"])
    assert s.distractor_hit and not s.ok


# --- states, retries, calibration: the pieces the verdict stands on --------------------------------


def _judge(**kw: object) -> tuple[str, str, str]:
    args: dict[str, object] = {
        "answer_ok": True,
        "finish_reason": "stop",
        "reasoning": "",
        "thinking": False,
        "prompt_tokens": 4000,
        "sent_tokens": 4000,
        "target_tokens": 4000,
        "exact_sizes": True,
        "token_tolerance": 0,
    }
    args.update(kw)
    return judge(**args)  # type: ignore[arg-type]


def test_judge_never_scores_what_it_cannot_trust() -> None:
    assert _judge()[0] == "pass"
    assert _judge(answer_ok=False)[0] == "fail"
    # A right answer on an unchecked or truncated prompt is not a pass; a wrong one not a fail.
    assert _judge(prompt_tokens=None)[:2] == ("unchecked", "no_usage")
    assert _judge(prompt_tokens=3000, answer_ok=False)[0] == "truncated"
    assert _judge(prompt_tokens=3000)[0] == "truncated"
    # An exact counter holds the template's difference: one missing token is truncation...
    assert _judge(prompt_tokens=3999)[0] == "truncated"
    assert _judge(prompt_tokens=3970, token_tolerance=30)[0] == "pass"  # ...unless the user allows it
    assert _judge(prompt_tokens=4001)[0] == "pass"  # more than sent is not a cut prompt
    assert _judge(prompt_tokens=4300, sent_tokens=4300)[:2] == ("unchecked", "off_target")
    calibrated = _judge(prompt_tokens=3000, exact_sizes=False)
    assert calibrated[:2] == ("unchecked", "off_target") and "or the prompt was truncated" in calibrated[2]
    # Calibrated sizes cannot show a few missing tokens: unchecked unless accepted explicitly.
    assert _judge(prompt_tokens=3970, exact_sizes=False)[:2] == ("unchecked", "calibrated")
    assert _judge(prompt_tokens=3970, exact_sizes=False, accept_calibrated=True)[0] == "pass"
    # Answers that could not be finished are their own problem, not recall failures...
    assert _judge(answer_ok=False, reasoning="hmm", finish_reason="length")[:2] == (
        "error",
        "reasoning_with_thinking_off",
    )
    assert _judge(answer_ok=False, finish_reason="length")[:2] == ("error", "answer_cut")
    assert _judge(finish_reason="length")[0] == "pass"
    # ...but a complete answer is scored, whatever came with it.
    assert _judge(answer_ok=False, reasoning="hmm")[0] == "fail"
    assert _judge(answer_ok=False, reasoning="hmm", thinking=True)[0] == "fail"


def test_only_measurements_are_done_on_resume() -> None:
    assert is_done({"state": "pass"}) and is_done({"state": "fail"})
    for state in ("error", "truncated", "unchecked", "skipped"):
        assert not is_done({"state": state})
    assert not is_done(None)
    # Resending cannot make a calibrated size checkable; --accept-calibrated re-judges it instead.
    assert is_done({"state": "unchecked", "kind": "calibrated"})
    assert count_states([{"state": "pass"}, None, {"state": "error"}]) == {
        "pass": 1,
        "fail": 0,
        "skipped": 0,
        "truncated": 0,
        "error": 1,
        "unchecked": 0,
        "unmeasured": 1,
    }


@pytest.mark.parametrize(
    ("status", "text", "kind"),
    [
        (429, "slow down", "rate_limited"),
        (408, "", "timeout"),
        (502, "", "unavailable"),
        (503, "", "unavailable"),
        (504, "", "unavailable"),
        (500, "boom", "server_error"),
        (
            400,
            "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
            "context_too_long",
        ),
        (400, "unsupported parameter", "bad_request"),
        (404, "The model 'x' does not exist", "model_not_found"),
        (404, "Not Found", "bad_request"),
    ],
)
def test_status_classification(status: int, text: str, kind: str) -> None:
    assert classify_status(status, text) == kind
    assert (kind in TRANSIENT_KINDS) == (status in (408, 429, 500, 502, 503, 504))


def test_retry_policy_backs_off_honours_retry_after_and_is_bounded() -> None:
    policy = RetryPolicy(retries=3, first_wait_s=1.0, max_wait_s=5.0, timeout_retries=1)
    limited = RequestFailure("rate_limited", "429")
    assert [policy.wait_s(limited, done) for done in range(4)] == [1.0, 2.0, 4.0, None]
    assert RetryPolicy(retries=9, first_wait_s=1.0, max_wait_s=5.0).wait_s(limited, 5) == 5.0  # capped
    assert policy.wait_s(RequestFailure("rate_limited", "429", 429, 0.25), 0) == 0.25
    too_long = RequestFailure("unavailable", "503", 503, 30.0)
    assert policy.wait_s(too_long, 0) is None and "asked to wait 30 s" in too_long.message
    timeout = RequestFailure("timeout", "slow")
    assert policy.wait_s(timeout, 0) == 1.0 and policy.wait_s(timeout, 1) is None
    for kind in ("bad_request", "context_too_long", "model_not_found"):
        assert policy.wait_s(RequestFailure(kind, ""), 0) is None


def test_with_retries_counts_attempts_and_stops_when_told() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RequestFailure("connection", "reset")
        return "ok"

    policy = RetryPolicy(retries=4, first_wait_s=0.0)
    assert asyncio.run(with_retries(policy, flaky)) == "ok" and len(calls) == 3

    async def dead(e: RequestFailure) -> bool:
        return False

    calls.clear()
    with pytest.raises(RequestFailure) as info:
        asyncio.run(with_retries(policy, flaky, dead))
    assert len(calls) == 1 and info.value.attempts == 1


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3") == 3.0 and parse_retry_after("0.25") == 0.25
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    later = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=90), usegmt=True)
    assert 80 < (parse_retry_after(later) or 0) <= 90
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past: at once


def test_calibration_model_recovers_each_cost() -> None:
    def tokens(size: PromptSize) -> int:
        return round(7 + 0.3 * (size.chars - size.pad_chars) + 5 * size.messages + 0.2 * size.pad_chars)

    sizes = [
        PromptSize(400, 0, 2),
        PromptSize(900, 500, 2),
        PromptSize(6000, 0, 40),
        PromptSize(12000, 300, 80),
    ]
    model = fit_model([(s, tokens(s)) for s in sizes], pad_price=0.2)
    assert model.a == pytest.approx(7, abs=0.5) and model.b == pytest.approx(0.3, abs=1e-3)
    assert model.c == pytest.approx(5, abs=0.05)
    single_turn = fit_model([(PromptSize(c, 0, 2), 10 + c // 4) for c in (100, 4000, 9000)], pad_price=0.3)
    assert single_turn.c == 0 and single_turn.b == pytest.approx(0.25, abs=1e-3)


def test_default_target_is_the_longest_length_whose_cells_all_fit() -> None:
    def rec(base: int, target: int, scenario: str = "sweep") -> dict[str, object]:
        return {
            "arm": "server",
            "pass": "base",
            "scenario": scenario,
            "base_length": base,
            "target_tokens": target,
        }

    planned = [
        rec(2048, 2048),
        rec(4509, 4509),
        rec(4509, 4512),
        rec(8000, 8000),
        rec(8000, 8000, "ruler_single"),
    ]
    assert default_target(planned, ("sweep", "ruler_single"), None) == 8000
    assert default_target(planned, ("sweep", "ruler_single"), 8000) == 8000
    assert default_target(planned, ("sweep", "ruler_single"), 4511) == 2048  # a nudge of 4,509 does not fit
    assert default_target(planned, ("sweep", "ruler_single"), 1000) == 0


def test_request_timeout_scales_unless_given() -> None:
    cfg = RunConfig(out_dir=Path("x"), server_url="x")
    assert request_timeout(cfg, 1024, 64) == pytest.approx(30 + 2.048 + 6.4)
    assert request_timeout(cfg, 65536, 64) == pytest.approx(30 + 131.072 + 6.4)
    assert request_timeout(cfg, 65536, 4096) > 500  # thinking budgets get time to decode
    assert request_timeout(RunConfig(out_dir=Path("x"), server_url="x", timeout_s=9.0), 65536, 64) == 9.0
