"""Retrying transient request faults: bounded in count and in wait, honouring `Retry-After`.

Policy (the same for chat completions, tokenize calls and calibration probes):
  - only transient kinds are retried: rate_limited (429), timeout (and 408), unavailable
    (502/503/504), server_error (500, error events) and connection (refused or reset);
  - at most `retries` retries per request; a timeout at most `timeout_retries` of them, because a
    hung server would otherwise cost retries x timeout for every cell;
  - the wait before retry k (0-based) is `Retry-After` when the server sends one, else
    first_wait_s * 2**k, capped at max_wait_s; a `Retry-After` longer than max_wait_s ends the
    retries at once (the request is recorded as an error and stays retryable on resume);
  - before retrying a connection failure the caller may check the server is alive at all: a dead
    server stops the run instead of being waited on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from verify.live.client import RequestFailure, parse_retry_after
from verify.live.states import TRANSIENT_KINDS

T = TypeVar("T")
__all__ = ["RetryPolicy", "parse_retry_after", "with_retries"]


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 4
    first_wait_s: float = 2.0
    max_wait_s: float = 60.0
    timeout_retries: int = 1

    def wait_s(self, failure: RequestFailure, done: int) -> float | None:
        """Seconds to wait before retrying after `done` retries already; None: give up."""
        if failure.kind not in TRANSIENT_KINDS:
            return None
        allowed = min(self.retries, self.timeout_retries) if failure.kind == "timeout" else self.retries
        if done >= allowed:
            return None
        if failure.retry_after is not None:
            if failure.retry_after > self.max_wait_s:
                failure.message += (
                    f" (the server asked to wait {failure.retry_after:g} s, more than --retry-max-wait "
                    f"{self.max_wait_s:g} s)"
                )
                return None
            return max(0.0, failure.retry_after)
        return min(self.max_wait_s, self.first_wait_s * 2**done)


async def with_retries(
    policy: RetryPolicy,
    call: Callable[[], Awaitable[T]],
    keep_trying: Callable[[RequestFailure], Awaitable[bool]] | None = None,
    retried: list[str] | None = None,
) -> T:
    """`call()` until it succeeds or the policy gives up; the last failure carries `attempts`.
    The kind of every failure that was retried is appended to `retried` (the report lists them:
    a fault retried away is still a fault of the deployment)."""
    done = 0
    while True:
        try:
            return await call()
        except RequestFailure as e:
            e.attempts = done + 1
            wait = policy.wait_s(e, done)
            if wait is None or (keep_trying is not None and not await keep_trying(e)):
                raise
            done += 1
            if retried is not None:
                retried.append(e.kind)
            await asyncio.sleep(wait)
