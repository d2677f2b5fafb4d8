"""Run settings, built once by the CLI and passed down explicitly (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from verify.live.grid import GridOptions
from verify.live.states import Judging

SERVER = "server"  # the arm under test (the bf16 index-K deployment)
BASELINE = "baseline"  # the reference arm (e.g. the same model with fp8 index keys)


@dataclass(frozen=True)
class RunConfig:
    out_dir: Path
    server_url: str
    baseline_url: str | None = None
    model: str | None = None
    baseline_model: str | None = None
    api_key: str = "EMPTY"
    grid: GridOptions = field(default_factory=GridOptions)
    target_length: int | None = None
    seed: int = 1234
    thinking: bool = False
    max_tokens: int | None = None  # None: per-scenario defaults
    stream: bool = True
    repeats: int = 3  # requests per cell in all (1 = no repeat pass)
    concurrency: int = 8  # in-flight requests of the concurrency pass; 0 skips the pass
    shared_prefix: bool = True
    parallel: int = 1  # cells in flight in the other passes (1 = clean sequential timing)
    timeout_s: float | None = None  # None: scaled with the prompt length (runner.request_timeout)
    retry_wait_s: float = 2.0  # first backoff; doubles per retry (retry.py)
    retry_max_wait_s: float = 60.0  # longest wait, Retry-After included
    retries: int = 4  # per request, transient faults only; a timeout is retried once at most
    max_consecutive_errors: int = 5
    token_tolerance: int = 0  # prompt tokens the server may read fewer than were sent (exact sizing)
    accept_calibrated: bool = False  # score calibrated sizes, truncation unchecked (said beside the verdict)
    expect_format: str | None = None  # the server's index-K format must be this (bf16, fp8, fp4)
    baseline_expect_format: str | None = None
    restart: bool = False  # set the out directory's records aside and start afresh
    accept_relaunch: bool = False  # resume records of the same server settings from an earlier launch
    save_prompts: bool = False
    plots: bool = True
    progress: str = "auto"  # auto (on a terminal), on, off

    def judging(self) -> Judging:
        return Judging(
            thinking=self.thinking,
            token_tolerance=self.token_tolerance,
            accept_calibrated=self.accept_calibrated,
        )

    def arms(self) -> list[tuple[str, str, str | None]]:
        out: list[tuple[str, str, str | None]] = [(SERVER, self.server_url, self.model)]
        if self.baseline_url:
            out.append((BASELINE, self.baseline_url, self.baseline_model or self.model))
        return out
