"""Helpers shared by the live-tier tests: run the CLI against a fake, read what it wrote."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.live.fake_server import FakeServer
from verify.live.cli import main

StartFake = Callable[..., FakeServer]

# Fast, deterministic settings: no progress bar, no PNGs, millisecond backoffs.
FAST = ["--progress", "off", "--retry-wait", "0.001", "--retry-max-wait", "2", "--no-plots"]


def run_cli(out: Path, server: FakeServer | str, *args: str) -> int:
    url = server if isinstance(server, str) else server.url
    return main(["--server", url, "--out", str(out), *FAST, *args])


def sweep_args(lengths: Sequence[int], depths: Sequence[float] = (0, 50, 100), *extra: str) -> list[str]:
    return [
        "--scenarios",
        "sweep",
        "--lengths",
        ",".join(map(str, lengths)),
        "--depths",
        ",".join(f"{d:g}" for d in depths),
        "--nudge",
        "none",
        "--repeats",
        "1",
        "--concurrency",
        "0",
        "--no-shared-prefix",
        *extra,
    ]


def records(out: Path) -> list[dict[str, Any]]:
    """Every line of requests.jsonl as written: what was observed, no states."""
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines() if line.strip()]


def latest(out: Path) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in records(out)}


def judged(out: Path) -> list[dict[str, Any]]:
    """Each recorded request's latest observation with its state as the CLI judged it for its
    report (states.csv): `state`, `kind`, `reason`, `faults`, and `passed`."""
    obs = latest(out)
    rows = list(csv.DictReader((out / "states.csv").read_text().splitlines()))
    return [
        obs[row["key"]]
        | {
            "state": row["state"],
            "kind": row["kind"],
            "reason": row["reason"],
            "faults": row["faults"].split(),
            "passed": row["state"] == "pass",
        }
        for row in rows
        if row["key"] in obs
    ]


def relaunch(start: StartFake, old: FakeServer, **cfg: Any) -> FakeServer:
    """Stop `old` and launch a new fake at its URL (same port): another launch of 'the same' server."""
    old.stop()
    return start(port=old.port, **cfg)


def chats(server: FakeServer) -> list[dict[str, Any]]:
    """Completions the fake served, without the harness's 1-token start-up probe."""
    return [e for e in server.state.log if e["max_tokens"] != 1]


def outcome(out: Path) -> dict[str, Any]:
    """The verdict, exit code and requests per state that run.json records."""
    doc: dict[str, Any] = json.loads((out / "run.json").read_text())["outcome"]
    return doc


def server_states(out: Path) -> dict[str, int]:
    """Requests per state on the server arm, only the states that occur."""
    return {k: v for k, v in outcome(out)["states"]["server"].items() if v}
