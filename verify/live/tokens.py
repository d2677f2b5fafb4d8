"""Counting prompt tokens the way the server will.

Preferred: SGLang's own `/v1/tokenize` (also served at `/tokenize`) with `messages`, which renders
the model's chat template exactly as `/v1/chat/completions` does, so the fitted count equals
`usage.prompt_tokens`. A constant offset between the two (seen with templates that add a BOS in one
path only) is measured once at start-up and folded in.

Fallback for servers without that endpoint: per layout family (a scenario and variant: prose,
noise, INI file, JSON tool transcript, UUID registry, multi-turn chat) a linear model
tokens = a + b * chars + c * messages + p * pad_chars, first from three probes built from that
family's own layout (its bare prompt, the bare prompt with pad words, a few thousand characters of
its haystack), then re-fitted by least squares from the `usage.prompt_tokens` of every answered
request. The message term is the chat template's per-message cost, and pad characters (the
fitter's catalogue words) get their own price from the bare/padded probe pair: folded into one
per-character cost, either made INI and tool-transcript prompts miss their target by ~4%. Why per family: tokens per character differ about
twofold between English prose and an INI file of UUIDs, so one prose calibration made config
prompts ~2x their nominal length. It is an estimate, so exact residues are not promised in that
mode, and a prompt the server reads more than 5% off its target is not scored (states.py).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from verify.live.client import RequestFailure, classify_status, retry_after_of
from verify.live.layouts import Layout, Rendered, _message_text


class TokenCounter(Protocol):
    mode: str  # "server" (tokenizer endpoint) or "calibrated"
    exact: bool

    async def prepare(self, family: str, layout: Layout) -> None:
        """Ready to count prompts of this layout family (calibration probes, once per family)."""
        ...

    async def count(self, rendered: Rendered, family: str) -> int: ...

    def observe(self, family: str, size: PromptSize, prompt_tokens: int) -> None:
        """The server's own count of a prompt that was sent (calibration re-fits from it)."""
        ...

    def describe(self) -> str: ...


def rendered_chars(rendered: Rendered) -> int:
    chars = sum(len(_message_text(m)) for m in rendered.messages)
    if rendered.tools:
        chars += len(json.dumps(rendered.tools))
    return chars


class TokenizeUnavailable(Exception):
    """The endpoint does not work at all here (missing route, no `messages` support, bad answer)."""


@dataclass
class ServerTokenCounter:
    http: httpx.AsyncClient
    path: str  # "/v1/tokenize" or "/tokenize"
    model: str
    template_kwargs: dict[str, Any]
    offset: int = 0  # usage.prompt_tokens - tokenize count, measured once
    mode: str = "server"
    exact: bool = True

    def body(self, rendered: Rendered) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": rendered.messages,
            "chat_template_kwargs": self.template_kwargs,
        }
        if rendered.tools:
            body["tools"] = rendered.tools
        return body

    async def raw_count(self, rendered: Rendered) -> int:
        """The endpoint's count. Transient faults (429, 408, 5xx, timeouts, connection) raise
        RequestFailure, to be retried like a chat request; an endpoint that does not work raises
        TokenizeUnavailable."""
        try:
            resp = await self.http.post(self.path, json=self.body(rendered))
        except httpx.TimeoutException as e:
            raise RequestFailure("timeout", f"tokenize ({self.path}) timed out: {e!r}") from e
        except httpx.HTTPError as e:
            raise RequestFailure("connection", f"tokenize ({self.path}) failed: {e!r}") from e
        if resp.status_code != 200:
            text = f"{self.path} answered HTTP {resp.status_code}: {resp.text[:300]}"
            if resp.status_code in (408, 429) or resp.status_code >= 500:
                kind = classify_status(resp.status_code, resp.text)
                raise RequestFailure(
                    kind, f"tokenize: {text}", resp.status_code, retry_after_of(resp.headers)
                )
            raise TokenizeUnavailable(text)
        try:
            data = resp.json()
        except ValueError as e:
            raise TokenizeUnavailable(f"{self.path} returned no JSON: {resp.text[:300]}") from e
        count = data.get("count") if isinstance(data, dict) else None
        if not isinstance(count, int):
            raise TokenizeUnavailable(f"{self.path} returned no integer 'count': {str(data)[:300]}")
        return count

    async def prepare(self, family: str, layout: Layout) -> None:
        return None

    async def count(self, rendered: Rendered, family: str = "") -> int:
        return await self.raw_count(rendered) + self.offset

    def observe(self, family: str, size: PromptSize, prompt_tokens: int) -> None:
        return None

    def describe(self) -> str:
        off = f", offset {self.offset:+d} vs usage" if self.offset else ""
        return f"server tokenizer ({self.path} with messages + chat template{off})"


PROBE_CHARS = 6000  # haystack of the largest calibration probe: ~1.5-4K tokens, far below any context
PROBE_PAD_WORDS = 200  # pad words of the second probe: its price per pad character
REFIT_WITHIN = 0.10  # observations further off the model are not used (a truncated prompt would be)


@dataclass(frozen=True)
class PromptSize:
    """What a calibrated count is a function of."""

    chars: int
    pad_chars: int
    messages: int


def size_of(rendered: Rendered) -> PromptSize:
    return PromptSize(rendered_chars(rendered), rendered.pad_chars, len(rendered.messages))


Point = tuple[PromptSize, int]  # a prompt and the server's usage.prompt_tokens for it


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-9:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def least_squares(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    k = len(rows[0])
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(k)]
    return _solve(ata, aty)


@dataclass(frozen=True)
class TokenModel:
    a: float  # constant (system prompt, template)
    b: float  # per haystack character
    c: float  # per message (the template's turn markers)
    p: float  # per pad character

    def __call__(self, size: PromptSize) -> float:
        return (
            self.a + self.b * (size.chars - size.pad_chars) + self.c * size.messages + self.p * size.pad_chars
        )


def fit_model(points: list[Point], pad_price: float) -> TokenModel:
    """Least squares over the points with the pad price fixed; the message term only when the
    message count varies (single-turn layouts always send two)."""
    ys = [t - pad_price * s.pad_chars for s, t in points]
    with_messages = len({s.messages for s, _ in points}) > 1
    rows = [
        [1.0, float(s.chars - s.pad_chars)] + ([float(s.messages)] if with_messages else [])
        for s, _ in points
    ]
    sol = least_squares(rows, ys) if len({r[1] for r in rows}) > 1 else None
    if sol is None:
        x = sum(r[1] for r in rows) or 1.0
        return TokenModel(0.0, sum(ys) / x, 0.0, pad_price)
    return TokenModel(sol[0], sol[1], sol[2] if with_messages else 0.0, pad_price)


@dataclass
class CalibratedCounter:
    """Per-family token estimates from the server's usage counts (no tokenizer endpoint)."""

    probe: Callable[[Rendered], Awaitable[int]]  # usage.prompt_tokens of a 1-token request
    points: dict[str, list[Point]] = field(default_factory=dict)  # family -> what the server counted
    pad_price: dict[str, float] = field(default_factory=dict)  # family -> tokens per pad character
    probes_sent: int = 0
    mode: str = "calibrated"
    exact: bool = False
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def prepare(self, family: str, layout: Layout) -> None:
        lock = self._locks.setdefault(family, asyncio.Lock())
        async with lock:  # concurrent workers probe a family once
            if family in self.pad_price:
                return
            bare = layout.render(0, 0)
            per_unit = max(1, rendered_chars(layout.render(1, 0)) - rendered_chars(bare))
            padded = layout.render(0, PROBE_PAD_WORDS)
            big = layout.render(max(2, math.ceil(PROBE_CHARS / per_unit)), 0)
            counted = []
            for r in (bare, padded, big):
                counted.append((size_of(r), await self.probe(r)))
                self.probes_sent += 1
            (s0, t0), (s1, t1) = counted[0], counted[1]
            self.pad_price[family] = (t1 - t0) / max(1, s1.pad_chars - s0.pad_chars)
            self.points.setdefault(family, []).extend(counted)

    def model(self, family: str) -> TokenModel:
        return fit_model(self.points[family], self.pad_price[family])

    async def count(self, rendered: Rendered, family: str) -> int:
        return round(self.model(family)(size_of(rendered)))

    def observe(self, family: str, size: PromptSize, prompt_tokens: int) -> None:
        points = self.points.setdefault(family, [])
        if family in self.pad_price:
            predicted = self.model(family)(size)
            if abs(prompt_tokens - predicted) > REFIT_WITHIN * max(1.0, predicted):
                return
        if (size, prompt_tokens) not in points:
            points.append((size, prompt_tokens))

    def describe(self) -> str:
        fams = "; ".join(
            f"{fam} ~ {m.a:.1f} + {m.b:.4f}*chars + {m.c:.2f}*messages + {m.p:.4f}*pad chars "
            f"({len(self.points[fam])} points)"
            for fam in sorted(self.pad_price)
            for m in [self.model(fam)]
        )
        return (
            "calibrated from usage.prompt_tokens per scenario layout (no tokenizer endpoint; "
            f"{self.probes_sent} probes, re-fitted from every answer): {fams or 'no layout probed'}"
        )
