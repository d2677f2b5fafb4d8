"""Check results: run each check on its own, record pass / fail / error / skip, print a table."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from verify.core.provenance import SERIES_HASH, series_hash


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"  # the check ran and the property does not hold
    ERROR = "error"  # the check could not run (import, CUDA error, bad setup)
    SKIP = "skip"  # not applicable here (no baseline tree given, no pool class, ...)


@dataclass
class CheckResult:
    name: str
    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "seconds": round(self.seconds, 3),
            "details": self.details,
        }


class CheckSkipped(Exception):
    """Raised by a check that does not apply in this environment."""


def run_check(
    name: str, fn: Callable[[], CheckResult], after: Callable[[], None] | None = None
) -> CheckResult:
    """Run one check; an exception becomes an ERROR (or SKIP) result instead of ending the suite.

    ``after`` runs inside the timing and error handling (e.g. a CUDA synchronize), so an
    asynchronous kernel fault is charged to the check that launched the kernel.
    """
    start = time.perf_counter()
    try:
        result = fn()
        if after is not None:
            after()
    except CheckSkipped as skip:
        result = CheckResult(name, Status.SKIP, str(skip))
    except Exception as error:  # noqa: BLE001 - every failure must be recorded, not raised
        result = CheckResult(
            name,
            Status.ERROR,
            f"{type(error).__name__}: {error}".splitlines()[0][:200],
            {"traceback": traceback.format_exc()},
        )
    result.name = name
    result.seconds = time.perf_counter() - start
    return result


def summary_table(results: Iterable[CheckResult]) -> str:
    """A fixed-width table: one row per check, then the counts per status."""
    rows = list(results)
    width = max([len("check")] + [len(r.name) for r in rows])
    lines = [f"{'check':<{width}}  {'status':<6}  {'time':>7}  summary", "-" * (width + 30)]
    for r in rows:
        lines.append(f"{r.name:<{width}}  {r.status.value.upper():<6}  {r.seconds:>6.1f}s  {r.summary}")
    counts = {s: sum(r.status is s for r in rows) for s in Status}
    lines.append("-" * (width + 30))
    lines.append("  ".join(f"{s.value}={n}" for s, n in counts.items()))
    return "\n".join(lines)


def write_json(path: Path, suite: str, results: list[CheckResult], meta: dict[str, Any]) -> None:
    """Write the suite's results; ``ok`` is true only when nothing failed or errored. The meta
    gains the applied series' hash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "suite": suite,
        "ok": all(r.status in (Status.PASS, Status.SKIP) for r in results),
        "meta": {**meta, SERIES_HASH: series_hash()},
        "results": [r.to_json() for r in results],
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
