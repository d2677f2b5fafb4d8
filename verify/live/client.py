"""One server ("arm"): chat completions through the official `openai` async client, plus the
SGLang side endpoints (`/get_server_info`, `/v1/models`, tokenize) through httpx.

Every failure becomes a `RequestFailure` with a `kind` (the vocabulary of `states.ERROR_KINDS`):
  rate_limited     HTTP 429                       transient: retried (retry.py), honouring Retry-After
  timeout          no complete answer in time, 408 transient
  unavailable      HTTP 502/503/504               transient
  server_error     HTTP 500, an error in a stream transient
  connection       refused or reset               transient (a dead server stops the run)
  context_too_long the server refused the length  recorded; longer cells are skipped, the target lowered
  model_not_found  wrong model name               the run stops
  bad_request      any other 4xx                  recorded once, not retried
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from verify.live.layouts import Rendered


class RequestFailure(Exception):
    def __init__(
        self, kind: str, message: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after  # seconds, from the Retry-After header
        self.attempts = 1  # requests sent for it, retries included (set by retry.with_retries)


@dataclass(frozen=True)
class Sampling:
    """Request settings shared by every prompt of a run (the fixed part of the protocol)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 1234
    thinking: bool = False
    stream: bool = True

    def template_kwargs(self) -> dict[str, Any]:
        # SGLang's DeepSeek encoders read "thinking"; Qwen-style templates read "enable_thinking".
        return {"thinking": self.thinking, "enable_thinking": self.thinking}


@dataclass
class ChatResult:
    content: str
    reasoning: str
    tool_calls: list[dict[str, str]]
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft_s: float | None
    latency_s: float
    response_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def answer_text(self) -> str:
        """What is scored: visible content plus tool-call arguments (never the reasoning)."""
        parts = [self.content] + [f"{c.get('name', '')} {c.get('arguments', '')}" for c in self.tool_calls]
        return "\n".join(p for p in parts if p)


def normalize_url(url: str) -> str:
    """Accept `http://h:p`, `http://h:p/` or `http://h:p/v1`; return the server root."""
    url = url.strip().rstrip("/")
    url = url.removesuffix("/v1")
    if "://" not in url:
        url = "http://" + url
    return url


def classify_status(status: int, text: str) -> str:
    low = text.lower()
    if status == 429:
        return "rate_limited"
    if status == 408:
        return "timeout"
    if status in (502, 503, 504):
        return "unavailable"
    if status == 404 and "model" in low:
        return "model_not_found"
    if status in (400, 413, 422) and (
        "context length" in low or "context_length" in low or "too long" in low
    ):
        return "context_too_long"
    if status >= 500:
        return "server_error"
    return "bad_request"


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number (fractions accepted) or an HTTP date; None if absent or bad."""
    if value is None or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def retry_after_of(headers: Any) -> float | None:
    try:
        return parse_retry_after(headers.get("retry-after"))
    except AttributeError:
        return None


class ArmClient:
    def __init__(self, name: str, url: str, api_key: str, timeout_s: float) -> None:
        """`timeout_s`: for side endpoints and probes; chat requests pass their own (scaled) one."""
        self.name = name
        # For messages: "server under test" / "baseline server" read better than the arm keys.
        self.label = "server under test" if name == "server" else f"{name} server"
        self.root = normalize_url(url)
        self.timeout_s = timeout_s
        # Retries are the runner's business (it must tell a dead server from a slow one).
        self.openai = openai.AsyncOpenAI(
            base_url=self.root + "/v1",
            api_key=api_key,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            max_retries=0,
        )
        self.http = httpx.AsyncClient(
            base_url=self.root,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            headers={"Authorization": f"Bearer {api_key}"},
        )

    async def aclose(self) -> None:
        await self.openai.close()
        await self.http.aclose()

    async def get_json(self, path: str) -> tuple[int, Any]:
        """(status, parsed JSON or text); connection problems raise RequestFailure('connection')."""
        try:
            resp = await self.http.get(path)
        except httpx.TimeoutException as e:
            raise RequestFailure("timeout", f"GET {self.root}{path} timed out: {e!r}") from e
        except httpx.HTTPError as e:
            raise RequestFailure("connection", f"cannot reach {self.root}{path}: {_reason(e)}") from e
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, resp.text

    async def chat(
        self,
        model: str,
        rendered: Rendered,
        sampling: Sampling,
        max_tokens: int,
        tool_choice: str | None = None,
        timeout_s: float | None = None,
    ) -> ChatResult:
        timeout = timeout_s or self.timeout_s
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": rendered.messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "max_tokens": max_tokens,
            "extra_body": {"chat_template_kwargs": sampling.template_kwargs()},
            "timeout": httpx.Timeout(timeout, connect=min(10.0, timeout)),
        }
        if rendered.tools:
            kwargs["tools"] = rendered.tools
            kwargs["tool_choice"] = tool_choice or "auto"
        try:
            return await asyncio.wait_for(self._chat(kwargs, sampling.stream), timeout=timeout)
        except (TimeoutError, openai.APITimeoutError, httpx.TimeoutException) as e:
            raise RequestFailure("timeout", f"{self.label}: no complete answer within {timeout:g} s") from e
        except openai.APIConnectionError as e:
            raise RequestFailure("connection", f"{self.label}: cannot reach {self.root}: {_reason(e)}") from e
        except httpx.TransportError as e:  # the connection dropped in the middle of a stream
            raise RequestFailure("connection", f"{self.label}: connection lost: {_reason(e)}") from e
        except openai.APIStatusError as e:
            text = _error_text(e)
            kind = classify_status(e.status_code, text)
            raise RequestFailure(
                kind,
                f"{self.label}: HTTP {e.status_code}: {text}",
                e.status_code,
                retry_after_of(e.response.headers),
            ) from e
        except openai.APIError as e:  # an error event inside the stream
            text = str(e)
            kind = "context_too_long" if "context length" in text.lower() else "server_error"
            raise RequestFailure(kind, f"{self.label}: {text}") from e

    async def _chat(self, kwargs: dict[str, Any], stream: bool) -> ChatResult:
        t0 = time.perf_counter()
        if not stream:
            resp = await self.openai.chat.completions.create(**kwargs)
            latency = time.perf_counter() - t0
            choice = resp.choices[0] if resp.choices else None
            msg = choice.message if choice else None
            calls = [
                {"name": c.function.name, "arguments": c.function.arguments}
                for c in ((msg.tool_calls or []) if msg else [])
                if getattr(c, "function", None) is not None
            ]
            extra = (msg.model_extra or {}) if msg else {}
            return ChatResult(
                content=(msg.content or "") if msg else "",
                reasoning=str(extra.get("reasoning_content") or ""),
                tool_calls=calls,
                finish_reason=choice.finish_reason if choice else None,
                prompt_tokens=resp.usage.prompt_tokens if resp.usage else None,
                completion_tokens=resp.usage.completion_tokens if resp.usage else None,
                ttft_s=None,
                latency_s=latency,
                response_model=resp.model,
            )

        content: list[str] = []
        reasoning: list[str] = []
        slots: dict[int, dict[str, str]] = {}
        finish: str | None = None
        usage = None
        ttft: float | None = None
        model_seen: str | None = None
        stream_resp = await self.openai.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in stream_resp:
            model_seen = model_seen or chunk.model
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                delta = choice.delta
                extra = delta.model_extra or {}
                got = False
                if delta.content:
                    content.append(delta.content)
                    got = True
                if extra.get("reasoning_content"):
                    reasoning.append(str(extra["reasoning_content"]))
                    got = True
                for tc in delta.tool_calls or []:
                    slot = slots.setdefault(tc.index, {"name": "", "arguments": ""})
                    if tc.function is not None:
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
                    got = True
                # Time to first token: the first chunk that carries any generated text.
                if got and ttft is None:
                    ttft = time.perf_counter() - t0
                if choice.finish_reason:
                    finish = choice.finish_reason
        return ChatResult(
            content="".join(content),
            reasoning="".join(reasoning),
            tool_calls=[slots[i] for i in sorted(slots)],
            finish_reason=finish,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            ttft_s=ttft,
            latency_s=time.perf_counter() - t0,
            response_model=model_seen,
        )


def _error_text(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    try:
        return e.response.text[:500]
    except Exception:  # noqa: BLE001 - best effort for an error message
        return str(e)


def _reason(e: BaseException) -> str:
    """The innermost cause (e.g. 'Connection refused'), which is what a user can act on."""
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
