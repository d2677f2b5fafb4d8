"""Fit a layout to an exact token count, as the server's tokenizer counts it.

Why exact: the reported failures depend on the prompt length itself (residue mod 4, 64-entry
page boundaries of the compressed index), so "about 4.5K" is not good enough; and the count the
server reports back (`usage.prompt_tokens`) must match what was fitted, or the prompt was altered.

Search: (1) the largest unit count n* whose prompt is <= target (count is monotone in n), found by
secant steps with a bracket; (2) pad words in the opening text to close the remaining gap; (3) a
one-character suffix when word steps skip over the target. The result depends only on the layout
and the counter, never on the starting guess, so the same cell always gets the same prompt.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from verify.live.layouts import Layout, Rendered

CountFn = Callable[[Rendered], Awaitable[int]]

# Suffixes tried last: each usually adds a single token to the pad.
_SUFFIXES = (".", ",", ";", "!", " ok")


class FitError(Exception):
    """The target cannot be reached with this layout (e.g. below the bare prompt size)."""


@dataclass(frozen=True)
class Knobs:
    n_units: int
    pad_words: int
    pad_suffix: str


@dataclass(frozen=True)
class Fit:
    knobs: Knobs
    target: int
    tokens: int  # the counter's count for the rendered prompt
    rendered: Rendered
    calls: int  # tokenizer calls spent

    @property
    def exact(self) -> bool:
        return self.tokens == self.target


def _better(a: tuple[int, Knobs], b: tuple[int, Knobs] | None, target: int) -> bool:
    """Closer to target wins; on a tie prefer not exceeding it (a prompt never longer than asked)."""
    if b is None:
        return True
    da, db = abs(a[0] - target), abs(b[0] - target)
    if da != db:
        return da < db
    return a[0] <= target < b[0]


async def fit_layout(
    layout: Layout,
    count: CountFn,
    target: int,
    start_units: int | None = None,
    max_calls: int = 32,
) -> Fit:
    memo: dict[Knobs, int] = {}
    rendered_of: dict[Knobs, Rendered] = {}

    async def c(knobs: Knobs) -> int:
        if knobs not in memo:
            if len(memo) >= max_calls:
                raise _OutOfCalls
            r = layout.render(knobs.n_units, knobs.pad_words, knobs.pad_suffix)
            rendered_of[knobs] = r
            memo[knobs] = await count(r)
        return memo[knobs]

    best: tuple[int, Knobs] | None = None

    def consider(tokens: int, knobs: Knobs) -> None:
        nonlocal best
        if _better((tokens, knobs), best, target):
            best = (tokens, knobs)

    def finish(knobs: Knobs) -> Fit:
        return Fit(
            knobs=knobs, target=target, tokens=memo[knobs], rendered=rendered_of[knobs], calls=len(memo)
        )

    try:
        base0 = Knobs(0, 0, "")
        c0 = await c(base0)
        consider(c0, base0)
        if c0 > target:
            raise FitError(
                f"target {target} tokens is below this scenario's bare prompt ({c0} tokens with no haystack)"
            )
        n_star = await _largest_fitting_n(c, layout, target, c0, start_units, consider)
        base = Knobs(n_star, 0, "")
        if memo[base] == target:
            return finish(base)
        for n in (n_star, n_star - 1):
            if n < 0:
                continue
            hit = await _pad_to(c, n, target, consider)
            if hit is not None:
                return finish(hit)
    except _OutOfCalls:
        pass
    assert best is not None
    return finish(best[1])


class _OutOfCalls(Exception):
    pass


async def _largest_fitting_n(
    c: Callable[[Knobs], Awaitable[int]],
    layout: Layout,
    target: int,
    c0: int,
    start_units: int | None,
    consider: Callable[[int, Knobs], None],
) -> int:
    lo, c_lo = 0, c0
    hi: int | None = None
    c_hi = 0
    slope = max(1.0, layout.unit_tokens_guess)
    n = start_units if start_units is not None and start_units > 0 else max(1, int((target - c0) / slope))
    while True:
        tokens = await c(Knobs(n, 0, ""))
        consider(tokens, Knobs(n, 0, ""))
        if tokens <= target:
            if n > lo:
                lo, c_lo = n, tokens
        elif hi is None or n < hi:
            hi, c_hi = n, tokens
        if hi is not None and hi == lo + 1:
            return lo
        # Slope from the bracket when we have both ends, else from the origin.
        if hi is not None and hi > lo:
            slope = max(1e-6, (c_hi - c_lo) / (hi - lo))
        elif lo > 0:
            slope = max(1e-6, (c_lo - c0) / lo)
        gap = target - c_lo
        guess = lo + max(1, math.floor(gap / slope)) if gap >= slope else lo + 1
        if hi is not None:
            guess = min(max(guess, lo + 1), hi - 1)
        if guess == n:  # cannot happen with a consistent bracket; step to make progress anyway
            guess = lo + 1
        n = guess


async def _pad_to(
    c: Callable[[Knobs], Awaitable[int]],
    n: int,
    target: int,
    consider: Callable[[int, Knobs], None],
) -> Knobs | None:
    """Pad words on top of n units until the count is exactly `target`; None if not reachable."""
    c_base = await c(Knobs(n, 0, ""))
    w = max(1, target - c_base - 3)  # ~1 token per pad word; the pad's lead-in costs a few more
    tried: dict[int, int] = {}
    for _ in range(8):
        tokens = await c(Knobs(n, w, ""))
        consider(tokens, Knobs(n, w, ""))
        tried[w] = tokens
        if tokens == target:
            return Knobs(n, w, "")
        # Secant on the pad points seen so far (tokenizers differ in tokens per word).
        pts = sorted(tried.items())
        if len(pts) >= 2:
            (w1, t1), (w2, t2) = min(
                ((a, b) for a in pts for b in pts if a[0] < b[0]),
                key=lambda ab: abs(ab[0][1] - target) + abs(ab[1][1] - target),
            )
            slope = max(0.25, (t2 - t1) / (w2 - w1))
        else:
            slope = max(0.25, (tokens - c_base) / w) if w >= 8 else 1.0
        step = round((target - tokens) / slope)
        nxt = w + (step if step else (1 if tokens < target else -1))
        if nxt < 1 or nxt in tried:
            # Word steps skip over the target: try the closest-below word count + one character.
            break
        w = nxt
    below = [(t, ww) for ww, t in tried.items() if t < target]
    if below:
        _, w_best = max(below)
        for suffix in _SUFFIXES:
            knobs = Knobs(n, w_best, suffix)
            tokens = await c(knobs)
            consider(tokens, knobs)
            if tokens == target:
                return knobs
    return None


class FitCache:
    """Fits done in this run, keyed by a layout identity, so repeats reuse the identical prompt.

    It also remembers unit counts per scenario: a fit at another length or depth of the same
    scenario, scaled to the new target, starts the search within a unit or two of the answer.
    """

    def __init__(self) -> None:
        self._fits: dict[str, Fit] = {}
        self._units: dict[str, dict[int, int]] = {}

    def get(self, key: str) -> Fit | None:
        return self._fits.get(key)

    def put(self, key: str, fit: Fit, scenario: str) -> None:
        self._fits[key] = fit
        self._units.setdefault(scenario, {})[fit.target] = fit.knobs.n_units

    def units_hint(self, scenario: str, target: int) -> int | None:
        seen = self._units.get(scenario)
        if not seen:
            return None
        nearest = min(seen, key=lambda t: abs(t - target))
        return max(1, round(seen[nearest] * target / max(1, nearest)))
