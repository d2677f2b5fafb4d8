"""Unit checks of the live tier's pieces that need no server: corpus, layouts, fitter, grid, scoring."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from verify.live.corpus import SentenceStream, ValueFactory, pad_text, stable_seed
from verify.live.fit import FitError, fit_layout
from verify.live.grid import CONTROL_MAX, GridOptions, base_cells, concurrency_cells, nudged
from verify.live.layouts import Needle, Rendered, TextLayout
from verify.live.scenarios import SCENARIOS, Cell, build
from verify.live.scoring import score_answer
from verify.live.tokens import rendered_chars

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
