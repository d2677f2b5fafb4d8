"""Every planned request ends in exactly one state; the gate, the tables and the heatmaps read only these.

  pass        measured: the server read the whole prompt (usage.prompt_tokens checked) and answered right
  fail        measured: the server read the whole prompt and answered wrong (a recall failure)
  skipped     not sent, for a stated reason: longer than the server's context, or no such prompt exists
  truncated   the server read fewer prompt tokens than were sent, so the answer says nothing about recall
  error       no usable answer; `error_kind` says why (a request fault, or an answer cut short)
  unchecked   answered, but the length the server read is unknown (no usage) or off target by > 5%
  unmeasured  planned, but nothing recorded: the run stopped (or was stopped) before it

Only `pass` and `fail` are measurements. Why so strict: a live gate that scores an infrastructure
fault as recall, or lets a dropped cell vanish, tells an operator to roll out on data it never had.
A rerun re-sends every planned request that is not measured (resume), so a rate-limited or timed-out
request stays retryable, and one that was truncated is re-measured once the server is fixed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

PASS = "pass"
FAIL = "fail"
SKIPPED = "skipped"
TRUNCATED = "truncated"
ERROR = "error"
UNCHECKED = "unchecked"
UNMEASURED = "unmeasured"
STATES = (PASS, FAIL, SKIPPED, TRUNCATED, ERROR, UNCHECKED, UNMEASURED)
MEASURED = frozenset({PASS, FAIL})
# One letter per state that is not a measurement: the report's tables and the heatmaps use them.
LETTERS = {TRUNCATED: "T", UNCHECKED: "U", ERROR: "E", UNMEASURED: "M", SKIPPED: "S"}

# Request faults retried within a run (bounded backoff that honours Retry-After; see retry.py).
TRANSIENT_KINDS = frozenset({"rate_limited", "timeout", "unavailable", "server_error", "connection"})

# Why a request has no usable answer. The first group are request faults, the second answers that
# cannot be scored: neither is ever counted as a recall failure.
ERROR_KINDS: dict[str, str] = {
    "rate_limited": "HTTP 429: rate-limited (by the server or a router in front of it)",
    "timeout": "no complete answer within the request timeout (or HTTP 408)",
    "unavailable": "HTTP 502/503/504: the server or a proxy was unavailable",
    "server_error": "HTTP 500 or an error event inside the stream",
    "connection": "the connection failed or was reset",
    "bad_request": "the server rejected the request (HTTP 4xx)",
    "context_too_long": "the server refused the prompt as longer than its context",
    "model_not_found": "the server does not serve the model",
    "answer_cut": "the answer stopped at max_tokens before it was complete (finish_reason=length)",
    "reasoning_with_thinking_off": "the server returned reasoning with thinking off; the answer was cut",
}

SKIP_KINDS = {
    "beyond_context": "longer than the server's context",
    "unbuildable": "no such prompt exists (the target is below the scenario's bare prompt)",
}
UNCHECKED_KINDS = {
    "no_usage": "the server returned no usage.prompt_tokens, even without streaming",
    "off_target": "the server read a prompt more than 5% off the target length",
}
OFF_TARGET = 0.05  # relative; a prompt further from its target is not scored


def state_of(record: Mapping[str, Any] | None) -> str:
    return UNMEASURED if record is None else str(record.get("state", UNMEASURED))


def kind_of(record: Mapping[str, Any]) -> str:
    """The sub-kind that says why a non-measured state happened ('' for pass/fail)."""
    state = state_of(record)
    if state == ERROR:
        return str(record.get("error_kind") or "")
    if state == SKIPPED:
        return str(record.get("skip_kind") or "")
    if state == UNCHECKED:
        return str(record.get("unchecked_kind") or "")
    return ""


def is_done(record: Mapping[str, Any] | None) -> bool:
    """A rerun re-sends everything that is not a measurement."""
    return state_of(record) in MEASURED


def count_states(records: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """Requests per state, every state present (0 when none): the one count the report uses."""
    got = Counter(state_of(r) for r in records)
    return {s: got.get(s, 0) for s in STATES}


def judge(
    *,
    answer_ok: bool,
    finish_reason: str | None,
    reasoning: str,
    thinking: bool,
    prompt_tokens: int | None,
    sent_tokens: int,
    target_tokens: int,
    exact_sizes: bool,
    truncation_tolerance: float,
) -> tuple[str, str, str]:
    """(state, kind, reason) of one answered request. Order matters: a length that cannot be
    trusted is reported before the answer is looked at, and an answer that could not be finished is
    never called a recall failure."""
    if prompt_tokens is None:
        return UNCHECKED, "no_usage", UNCHECKED_KINDS["no_usage"]
    if exact_sizes and prompt_tokens < sent_tokens * (1 - truncation_tolerance) - 1:
        return (
            TRUNCATED,
            "",
            f"the server read {prompt_tokens} prompt tokens of the {sent_tokens} sent",
        )
    if abs(prompt_tokens - target_tokens) > OFF_TARGET * target_tokens:
        why = (
            f"the server read {prompt_tokens} prompt tokens for a {target_tokens}-token target "
            f"({(prompt_tokens - target_tokens) / target_tokens:+.1%})"
        )
        if not exact_sizes and prompt_tokens < sent_tokens:
            why += ": calibrated sizing missed, or the prompt was truncated"
        return UNCHECKED, "off_target", why
    if answer_ok:
        return PASS, "", ""
    if reasoning and not thinking:
        return ERROR, "reasoning_with_thinking_off", ERROR_KINDS["reasoning_with_thinking_off"]
    if finish_reason == "length":
        return ERROR, "answer_cut", ERROR_KINDS["answer_cut"]
    return FAIL, "", ""


def remedy(state: str, kind: str) -> tuple[bool, str]:
    """(a plain rerun completes it, what to do). Shown next to every missing gate request."""
    if state == UNMEASURED:
        return True, "not measured yet: rerun the same command to resume"
    if state == ERROR and kind in TRANSIENT_KINDS:
        extra = {
            "rate_limited": " (or lower --parallel/--concurrency, raise --retries/--retry-max-wait)",
            "timeout": " (or raise --timeout)",
        }.get(kind, "")
        return True, f"still failing after the retries: rerun the same command to retry{extra}"
    if state == ERROR and kind == "context_too_long":
        return (
            False,
            "lower --target-length below the refused length, or relaunch with a larger --context-length",
        )
    if state == SKIPPED and kind == "beyond_context":
        return False, "lower --target-length, or relaunch SGLang with a larger --context-length"
    if state == ERROR and kind == "bad_request":
        return False, "fix what the server rejected (message in the report), then rerun"
    if state == ERROR and kind == "model_not_found":
        return False, "pass the served name with --model, then rerun"
    if state == ERROR and kind == "answer_cut":
        return False, "rerun with a larger --max-tokens (a new --out)"
    if state == ERROR and kind == "reasoning_with_thinking_off":
        return False, (
            "the chat template ignores thinking=false (check chat_template_kwargs and --reasoning-parser), "
            "or rerun with --thinking (a new --out)"
        )
    if state == TRUNCATED:
        return False, (
            "the server (or a proxy) cut the prompt: turn off --allow-auto-truncate or the cutting proxy "
            "and rerun, or lower --target-length"
        )
    if state == UNCHECKED and kind == "no_usage":
        return False, "make the server (or proxy) return usage.prompt_tokens, then rerun"
    if state == UNCHECKED and kind == "off_target":
        return True, (
            "rerun: sizes are re-fitted from the prompt_tokens measured so far (a /v1/tokenize endpoint "
            "sizes exactly)"
        )
    return True, "rerun the same command"
