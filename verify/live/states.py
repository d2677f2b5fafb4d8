"""Every planned request ends in exactly one state; the gate, the tables and the heatmaps read only these.

  pass        measured: the server read the whole prompt (usage.prompt_tokens checked) and answered right
  fail        measured: the server read the whole prompt and answered wrong (a recall failure)
  skipped     not sent, for a stated reason: longer than the server's context, or no such prompt exists
  truncated   the server read fewer prompt tokens than were sent, so the answer says nothing about recall
  error       no usable answer; `error_kind` says why (a request fault, or an answer cut short)
  unchecked   answered, but the length the server read cannot be checked: no usage, off target by
              > 5%, or sizes calibrated without a tokenizer (not accepted with --accept-calibrated)
  unmeasured  planned, but nothing recorded: the run stopped (or was stopped) before it

Only `pass` and `fail` are measurements. Why so strict: a live gate that scores an infrastructure
fault as recall, or lets a dropped cell vanish, tells an operator to roll out on data it never had.

States are never stored. `requests.jsonl` holds what was observed (what was sent, what the server
counted and answered, which fault came back), and `judge_record` derives the state under the
current `Judging` settings each time a run reports or resumes: a rerun with another tolerance
re-judges what is stored instead of trusting a verdict frozen when it was written. A rerun
re-sends every planned request that is not done (`is_done`), so a rate-limited or timed-out
request stays retryable, and one that was truncated is re-measured once the server is fixed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verify.live.grid import is_control

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

# What a stored record observed (`observed`): an answer, a fault instead of one, or a skip.
ANSWER, FAULT, SKIP = "answer", "error", "skipped"

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
    "reasoning_with_thinking_off": (
        "reasoning returned with thinking off spent max_tokens: the answer was cut (finish_reason=length)"
    ),
}

SKIP_KINDS = {
    "beyond_context": "longer than the server's context",
    "unbuildable": "no such prompt exists (the target is below the scenario's bare prompt)",
}
UNCHECKED_KINDS = {
    "no_usage": "the server returned no usage.prompt_tokens, even without streaming",
    "off_target": "the server read a prompt more than 5% off the target length",
    "calibrated": (
        "sizes calibrated without a tokenize endpoint: a truncation of a few tokens cannot be told from "
        "a calibration miss (not checkable here)"
    ),
}
# Problems reported beside an answer that is still scored (they do not replace its state).
ANSWER_FAULTS = {
    "reasoning_with_thinking_off": "reasoning content returned although thinking was off",
}
OFF_TARGET = 0.05  # relative; a prompt further from its target is not scored


@dataclass(frozen=True)
class Judging:
    """The settings a state depends on. Applied to the stored observations at every report and
    resume, and written beside the verdict, so a rerun with other settings re-judges what is stored."""

    thinking: bool = False
    token_tolerance: int = 0  # tokens the server may read fewer than were sent (exact sizing)
    accept_calibrated: bool = False  # score calibrated sizes although truncation is not checkable

    def describe(self) -> str:
        return (
            f"truncation: a shortfall of more than {self.token_tolerance} prompt tokens "
            f"(--token-tolerance {self.token_tolerance}); off target: more than {OFF_TARGET:.0%}; "
            "calibrated sizing "
            + (
                "accepted (--accept-calibrated: truncation below 5% cannot be seen)"
                if self.accept_calibrated
                else "not scored (unchecked)"
            )
            + f"; thinking {'on' if self.thinking else 'off'}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "thinking": self.thinking,
            "token_tolerance": self.token_tolerance,
            "accept_calibrated": self.accept_calibrated,
            "off_target": OFF_TARGET,
        }


def state_of(record: Mapping[str, Any] | None) -> str:
    """The state of a judged record (`judge_record`); a stub or nothing is 'unmeasured'."""
    return UNMEASURED if record is None else str(record.get("state", UNMEASURED))


def kind_of(record: Mapping[str, Any]) -> str:
    """The sub-kind that says why a non-measured state happened ('' for pass/fail)."""
    return str(record.get("kind") or "")


def is_done(record: Mapping[str, Any] | None) -> bool:
    """What a rerun does not send again: measurements, and calibrated answers (the same server
    would answer the same unverifiable length; --accept-calibrated judges them as they are)."""
    return state_of(record) in MEASURED or (
        state_of(record) == UNCHECKED and kind_of(record or {}) == "calibrated"
    )


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
    token_tolerance: int = 0,
    accept_calibrated: bool = False,
) -> tuple[str, str, str]:
    """(state, kind, reason) of one answered request. Order matters: a length that cannot be
    trusted is reported before the answer is looked at, and an answer that could not be finished is
    never called a recall failure. A complete answer is scored, reasoning or not."""
    if prompt_tokens is None:
        return UNCHECKED, "no_usage", UNCHECKED_KINDS["no_usage"]
    if exact_sizes and prompt_tokens < sent_tokens - token_tolerance:
        # The exact counter already holds the chat template's difference (the start-up probe), so
        # any shortfall beyond the tolerance is prompt the server never read.
        missing = sent_tokens - prompt_tokens
        return (
            TRUNCATED,
            "",
            f"the server read {prompt_tokens} prompt tokens of the {sent_tokens} sent ({missing} missing)",
        )
    if abs(prompt_tokens - target_tokens) > OFF_TARGET * target_tokens:
        why = (
            f"the server read {prompt_tokens} prompt tokens for a {target_tokens}-token target "
            f"({(prompt_tokens - target_tokens) / target_tokens:+.1%})"
        )
        if not exact_sizes and prompt_tokens < sent_tokens:
            why += ": calibrated sizing missed, or the prompt was truncated"
        return UNCHECKED, "off_target", why
    if not exact_sizes and not accept_calibrated:
        return UNCHECKED, "calibrated", UNCHECKED_KINDS["calibrated"]
    if answer_ok:
        return PASS, "", ""
    if finish_reason == "length":
        kind = "reasoning_with_thinking_off" if reasoning and not thinking else "answer_cut"
        return ERROR, kind, ERROR_KINDS[kind]
    return FAIL, "", ""


def judge_record(record: Mapping[str, Any], judging: Judging) -> dict[str, Any]:
    """A stored observation plus its state under `judging`: `state`, `kind`, `reason`, `passed`,
    `control` (by the length the server read) and `faults` (problems beside a scored answer)."""
    observed = record.get("observed")
    faults: list[str] = []
    if observed == SKIP:
        state, kind, reason = SKIPPED, str(record.get("skip_kind") or ""), str(record.get("reason") or "")
    elif observed == FAULT:
        state, kind, reason = ERROR, str(record.get("error_kind") or ""), str(record.get("error") or "")
    elif observed == ANSWER:
        pt = record.get("prompt_tokens")
        followup = record.get("usage_followup_kind")
        if pt is None and followup:
            # The count was asked for and that request failed: its fault, not "no usage".
            state, kind = ERROR, str(followup)
            reason = f"the usage follow-up failed: {record.get('usage_followup_error')}"
        else:
            state, kind, reason = judge(
                answer_ok=bool(record.get("ok")),
                finish_reason=record.get("finish_reason"),
                reasoning=str(record.get("reasoning") or ""),
                thinking=judging.thinking,
                prompt_tokens=pt if isinstance(pt, int) else None,
                sent_tokens=int(record["measured_tokens"]),
                target_tokens=int(record["aim_tokens"]),
                exact_sizes=record.get("sizing") == "exact",
                token_tolerance=judging.token_tolerance,
                accept_calibrated=judging.accept_calibrated,
            )
        if record.get("reasoning") and not judging.thinking and kind != "reasoning_with_thinking_off":
            faults.append("reasoning_with_thinking_off")
    else:
        state, kind, reason = UNMEASURED, "", ""
    read = record.get("prompt_tokens") if isinstance(record.get("prompt_tokens"), int) else None
    return dict(record) | {
        "state": state,
        "kind": kind,
        "reason": reason,
        "passed": state == PASS,
        "faults": faults,
        "control": is_control(
            int(record["base_length"]), read if read is not None else record.get("measured_tokens")
        ),
        "error_kind": kind if state == ERROR else None,
        "unchecked_kind": kind if state == UNCHECKED else None,
    }


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
    if state == UNCHECKED and kind == "calibrated":
        return False, (
            "serve /v1/tokenize (SGLang does) so sizes are exact, or rerun with --accept-calibrated to score "
            "calibrated sizes (nothing is sent again; the report then says truncation was not checkable)"
        )
    if state == UNCHECKED and kind == "off_target":
        return True, (
            "rerun: sizes are re-fitted from the prompt_tokens measured so far (a /v1/tokenize endpoint "
            "sizes exactly)"
        )
    return True, "rerun the same command"
