"""Counting prompt tokens the way the server will.

Preferred: SGLang's own `/v1/tokenize` (also served at `/tokenize`) with `messages`, which renders
the model's chat template exactly as `/v1/chat/completions` does, so the fitted count equals
`usage.prompt_tokens`. A constant offset between the two (seen with templates that add a BOS in one
path only) is measured once at start-up and folded in.

Fallback for servers without that endpoint: a linear model tokens = a + b * chars + c * messages,
calibrated from `usage.prompt_tokens` of three fixed probe prompts. It is an estimate, so exact
residues are not promised in that mode and the truncation check uses a looser tolerance.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from verify.live.corpus import SentenceStream, stable_seed
from verify.live.layouts import ConversationLayout, Needle, Rendered, TextLayout, _message_text


class TokenCounter(Protocol):
    mode: str  # "server" (tokenizer endpoint) or "calibrated"
    exact: bool

    async def count(self, rendered: Rendered) -> int: ...

    def describe(self) -> str: ...


def rendered_chars(rendered: Rendered) -> int:
    chars = sum(len(_message_text(m)) for m in rendered.messages)
    if rendered.tools:
        chars += len(json.dumps(rendered.tools))
    return chars


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
        resp = await self.http.post(self.path, json=self.body(rendered))
        if resp.status_code != 200:
            raise TokenizeUnavailable(f"{self.path} answered HTTP {resp.status_code}: {resp.text[:300]}")
        data = resp.json()
        count = data.get("count")
        if not isinstance(count, int):
            raise TokenizeUnavailable(f"{self.path} returned no integer 'count': {str(data)[:300]}")
        return count

    async def count(self, rendered: Rendered) -> int:
        return await self.raw_count(rendered) + self.offset

    def describe(self) -> str:
        off = f", offset {self.offset:+d} vs usage" if self.offset else ""
        return f"server tokenizer ({self.path} with messages + chat template{off})"


class TokenizeUnavailable(Exception):
    pass


@dataclass
class CalibratedCounter:
    a: float
    b: float
    c: float
    observations: list[tuple[int, int, int]]  # (chars, messages, prompt_tokens) of the probes
    mode: str = "calibrated"
    exact: bool = False

    async def count(self, rendered: Rendered) -> int:
        return round(self.a + self.b * rendered_chars(rendered) + self.c * len(rendered.messages))

    def describe(self) -> str:
        return (
            f"calibrated from usage.prompt_tokens of {len(self.observations)} probes "
            f"(tokens ~ {self.a:.1f} + {self.b:.4f}*chars + {self.c:.2f}*messages); no tokenizer endpoint"
        )


def probe_prompts() -> list[Rendered]:
    """Three fixed prompts that separate the constant, per-char and per-message terms."""
    stream = SentenceStream(stable_seed("calibration"))

    def text(n: int) -> Rendered:
        return TextLayout(
            system="You are a careful assistant.",
            head="Read this text.",
            question="Reply with OK.",
            unit=stream.get,
            needles=(),
        ).render(n, 0)

    convo = ConversationLayout(
        system="You are a careful assistant.",
        opening="Here are some notes.",
        opening_reply="Noted.",
        question="Reply with OK.",
        turn=lambda i: (stream.get(i), "Noted."),
        needles=(Needle(0.5, ("Short note.", "Noted.")),),
    ).render(24, 0)
    return [text(20), text(160), convo]


async def calibrate(send: Callable[[Rendered], Awaitable[int]]) -> CalibratedCounter:
    """Fit a, b, c from the probes' server-reported prompt token counts."""
    obs: list[tuple[int, int, int]] = []
    for rendered in probe_prompts():
        tokens = await send(rendered)
        obs.append((rendered_chars(rendered), len(rendered.messages), tokens))
    (x1, m1, t1), (x2, _m2, t2), (x3, m3, t3) = obs
    # Two single-turn probes (same message count) give the per-char slope and intercept; the
    # conversation probe then gives the per-message cost.
    b = (t2 - t1) / max(1, x2 - x1)
    a0 = t1 - b * x1
    c = (t3 - a0 - b * x3) / max(1, m3 - m1) if m3 != m1 else 0.0
    a = a0 - c * m1
    return CalibratedCounter(a=a, b=b, c=c, observations=obs)
