"""Counting prompt tokens the way the server will.

Preferred: SGLang's own `/v1/tokenize` (also served at `/tokenize`) with `messages`, which renders
the model's chat template exactly as `/v1/chat/completions` does, so the fitted count equals
`usage.prompt_tokens`. A constant offset between the two (seen with templates that add a BOS in one
path only) is measured once at start-up and folded in.

Fallback for servers without that endpoint: per layout family (a scenario and variant: prose,
noise, INI file, JSON tool transcript, UUID registry, multi-turn chat) a linear model
tokens = a + b * chars, first from two probes built from that family's own layout (its bare prompt
and a few thousand characters of its haystack), then re-fitted by least squares from the
`usage.prompt_tokens` of every answered request. Why per family: tokens per character differ about
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

    def observe(self, family: str, chars: int, prompt_tokens: int) -> None:
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
                raise RequestFailure(kind, f"tokenize: {text}", resp.status_code, retry_after_of(resp.headers))
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

    def observe(self, family: str, chars: int, prompt_tokens: int) -> None:
        return None

    def describe(self) -> str:
        off = f", offset {self.offset:+d} vs usage" if self.offset else ""
        return f"server tokenizer ({self.path} with messages + chat template{off})"


PROBE_CHARS = 6000  # haystack of the larger calibration probe: ~1.5-4K tokens, far below any context
REFIT_WITHIN = 0.10  # observations further off the model are not used (a truncated prompt would be)


def linear_fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least squares (a, b) of tokens = a + b * chars."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0, (my / mx if mx else 0.25)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


@dataclass
class CalibratedCounter:
    """Per-family token estimates from the server's usage counts (no tokenizer endpoint)."""

    probe: Callable[[Rendered], Awaitable[int]]  # usage.prompt_tokens of a 1-token request
    points: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # family -> (chars, tokens)
    probes_sent: int = 0
    mode: str = "calibrated"
    exact: bool = False
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def prepare(self, family: str, layout: Layout) -> None:
        lock = self._locks.setdefault(family, asyncio.Lock())
        async with lock:  # concurrent workers probe a family once
            if len({chars for chars, _ in self.points.get(family, [])}) >= 2:
                return  # probed already, or measured in an earlier run (resume)
            bare = layout.render(0, 0)
            per_unit = max(1, rendered_chars(layout.render(1, 0)) - rendered_chars(bare))
            big = layout.render(max(2, math.ceil(PROBE_CHARS / per_unit)), 0)
            for r in (bare, big):
                tokens = await self.probe(r)
                self.probes_sent += 1
                self.points.setdefault(family, []).append((rendered_chars(r), tokens))

    def model(self, family: str) -> tuple[float, float]:
        return linear_fit(self.points[family])

    async def count(self, rendered: Rendered, family: str) -> int:
        a, b = self.model(family)
        return round(a + b * rendered_chars(rendered))

    def observe(self, family: str, chars: int, prompt_tokens: int) -> None:
        points = self.points.setdefault(family, [])
        if len(points) >= 2:
            a, b = self.model(family)
            predicted = a + b * chars
            if abs(prompt_tokens - predicted) > REFIT_WITHIN * max(1.0, predicted):
                return
        if (chars, prompt_tokens) not in points:
            points.append((chars, prompt_tokens))

    def describe(self) -> str:
        fams = "; ".join(
            f"{fam} ~ {a:.1f} + {b:.4f}*chars ({len(pts)} points)"
            for fam, pts in sorted(self.points.items())
            if len(pts) >= 2
            for a, b in [linear_fit(pts)]
        )
        return (
            "calibrated from usage.prompt_tokens per scenario layout (no tokenizer endpoint; "
            f"{self.probes_sent} probes, re-fitted from every answer): {fams or 'no layout probed'}"
        )
