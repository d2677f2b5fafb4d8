"""Exact-match scoring (RULER's string_match_all) plus where a near miss goes wrong.

The first wrong character matters for diagnosis: the first answer token comes from the prefill-path
indexer and later tokens from the decode path, so "right code, last digit wrong" points at decode.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Score:
    score: float  # fraction of expected strings found
    ok: bool  # every expected string found
    first_wrong_char: int | None  # for the first missing string: length of its best-matching prefix
    distractor_hit: bool  # the answer contains a distractor's value


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def _best_prefix(expected: str, answer: str) -> int:
    """Longest common prefix of `expected` with any word of the answer (case-insensitive).

    Words keep hyphens, so "ZEBRA-4492-OMEGB" against ZEBRA-4492-OMEGA gives 15 (the last
    character is the first wrong one), while an unrelated answer gives 0.
    """
    e = expected.lower()
    best = 0
    for word in _WORD.findall(answer.lower()):
        k = 0
        while k < min(len(e), len(word)) and e[k] == word[k]:
            k += 1
        best = max(best, k)
    return best


def score_answer(answer: str, expected: Sequence[str], distractors: Sequence[str] = ()) -> Score:
    low = answer.lower()
    found = [e.lower() in low for e in expected]
    missing = [e for e, f in zip(expected, found) if not f]
    first_wrong = _best_prefix(missing[0], answer) if missing else None
    hit = any(d.lower() in low for d in distractors)
    frac = sum(found) / len(expected) if expected else 0.0
    return Score(
        score=frac, ok=all(found) and bool(expected), first_wrong_char=first_wrong, distractor_hit=hit
    )


def normalize_answer(answer: str) -> str:
    """For the repeat-agreement check: identical up to surrounding whitespace."""
    return " ".join(answer.split())
