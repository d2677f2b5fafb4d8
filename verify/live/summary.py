"""From request records to cells (a cell: one arm, pass group and prompt, over its repeats),
A/B deltas and the CSV files. The verdict is `gate.py`'s.

Pass groups: `sequential` (the base pass and its repeats: what the gate reads), `shared_prefix`
and `concurrency` (robustness passes, reported beside it). A cell passes only if every one of its
requests passed: a flaky answer at temperature 0 is a failure, not a near-pass. A cell with a
request that is not measured (states.py) has that state, never a pass rate of its measured part.
"""

from __future__ import annotations

import csv
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify.live.config import BASELINE, SERVER
from verify.live.scoring import normalize_answer
from verify.live.states import (
    ERROR,
    FAIL,
    MEASURED,
    PASS,
    SKIPPED,
    STATES,
    TRUNCATED,
    UNCHECKED,
    UNMEASURED,
    state_of,
)

# A cell that is neither all-pass, failing, nor all-skipped shows its most telling open state.
_OPEN_ORDER = (ERROR, TRUNCATED, UNCHECKED, UNMEASURED, SKIPPED)


def pass_group(pass_name: str) -> str:
    return "sequential" if pass_name in ("base", "repeat") else pass_name


@dataclass
class CellSummary:
    arm: str
    group: str
    scenario: str
    variant: str
    base_length: int
    target_tokens: int
    depth_pct: float
    extra: str
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cell_id(self) -> str:
        return self.records[0]["cell_id"] if self.records else ""

    def measured(self) -> list[dict[str, Any]]:
        """Requests that are measurements (pass / fail): the only ones a rate or a score reads."""
        return [r for r in self.records if state_of(r) in MEASURED]

    @property
    def state_counts(self) -> dict[str, int]:
        got = Counter(state_of(r) for r in self.records)
        return {s: got[s] for s in STATES if got[s]}

    @property
    def state(self) -> str:
        counts = self.state_counts
        if not counts:
            return UNMEASURED
        if FAIL in counts:
            return FAIL
        if set(counts) == {PASS}:
            return PASS
        return next(s for s in _OPEN_ORDER if s in counts)

    @property
    def skipped(self) -> bool:
        return self.state == SKIPPED

    @property
    def skip_reason(self) -> str:
        return next((str(r.get("reason")) for r in self.records if state_of(r) == SKIPPED), "")

    @property
    def planned(self) -> int:
        return len(self.records)

    @property
    def n(self) -> int:
        return len(self.measured())

    @property
    def n_passed(self) -> int:
        return sum(1 for r in self.measured() if state_of(r) == PASS)

    @property
    def passed(self) -> bool:
        return self.state == PASS

    @property
    def pass_rate(self) -> float | None:
        return self.n_passed / self.n if self.n else None

    @property
    def mean_score(self) -> float | None:
        scores = [float(r.get("score") or 0.0) for r in self.measured()]
        return statistics.fmean(scores) if scores else None

    @property
    def n_errors(self) -> int:
        return self.state_counts.get(ERROR, 0)

    @property
    def n_truncated(self) -> int:
        return self.state_counts.get(TRUNCATED, 0)

    @property
    def answers_agree(self) -> bool | None:
        answers = {normalize_answer(str(r.get("answer", ""))) for r in self.measured()}
        return None if self.n < 2 else len(answers) <= 1

    def mean_of(self, field_name: str) -> float | None:
        vals = [float(r[field_name]) for r in self.measured() if isinstance(r.get(field_name), (int, float))]
        return statistics.fmean(vals) if vals else None

    def values(self, field_name: str) -> list[Any]:
        seen: list[Any] = []
        for r in self.measured():
            v = r.get(field_name)
            if v is not None and v not in seen:
                seen.append(v)
        return seen


def summarize_cells(records: Iterable[dict[str, Any]]) -> list[CellSummary]:
    cells: dict[tuple[Any, ...], CellSummary] = {}
    for r in records:
        key = (
            r["arm"],
            pass_group(r["pass"]),
            r["scenario"],
            r["variant"],
            r["base_length"],
            r["target_tokens"],
            r["depth_pct"],
            r.get("extra", ""),
        )
        if key not in cells:
            cells[key] = CellSummary(*key)
        cells[key].records.append(r)
    return sorted(
        cells.values(),
        key=lambda c: (
            c.arm,
            c.group,
            c.scenario,
            c.variant,
            c.base_length,
            c.target_tokens,
            c.depth_pct,
            c.extra,
        ),
    )


@dataclass
class ABCell:
    scenario: str
    group: str
    cell_id: str
    base_length: int
    depth_pct: float
    server_rate: float | None
    baseline_rate: float | None
    server_answer: str
    baseline_answer: str
    prompt_tokens_equal: bool

    @property
    def delta(self) -> float | None:
        if self.server_rate is None or self.baseline_rate is None:
            return None
        return self.server_rate - self.baseline_rate


def ab_cells(cells: Sequence[CellSummary]) -> list[ABCell]:
    index: dict[tuple[str, str, str], dict[str, CellSummary]] = defaultdict(dict)
    for c in cells:
        if c.records:
            index[(c.scenario, c.group, c.cell_id)][c.arm] = c
    out: list[ABCell] = []
    for (scenario, group, cell_id), arms in sorted(index.items()):
        s, b = arms.get(SERVER), arms.get(BASELINE)
        if s is None or b is None:
            continue
        s_pt, b_pt = set(s.values("prompt_tokens")), set(b.values("prompt_tokens"))
        out.append(
            ABCell(
                scenario=scenario,
                group=group,
                cell_id=cell_id,
                base_length=s.base_length,
                depth_pct=s.depth_pct,
                server_rate=s.pass_rate if s.state in (PASS, FAIL) else None,
                baseline_rate=b.pass_rate if b.state in (PASS, FAIL) else None,
                server_answer=_first_answer(s),
                baseline_answer=_first_answer(b),
                prompt_tokens_equal=(not s_pt or not b_pt or s_pt == b_pt),
            )
        )
    return out


def _first_answer(c: CellSummary) -> str:
    for r in c.measured():
        return normalize_answer(str(r.get("answer", "")))[:80]
    return f"[{c.state}]"


CSV_FIELDS = (
    "arm",
    "pass",
    "scenario",
    "variant",
    "base_length",
    "target_tokens",
    "depth_pct",
    "extra",
    "state",
    "states",
    "n",
    "n_passed",
    "pass_rate",
    "mean_score",
    "n_errors",
    "n_truncated",
    "skipped",
    "skip_reason",
    "answers_agree",
    "prompt_tokens",
    "measured_tokens",
    "needle_token_pos",
    "finish_reasons",
    "first_wrong_char",
    "distractor_hit",
    "ttft_mean_s",
    "latency_mean_s",
    "decode_tok_s_mean",
    "index_k_format",
)


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return " ".join(str(x) for x in v)
    return "" if v is None else v


def write_summary_csv(path: Path, cells: Sequence[CellSummary]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for c in cells:
            row = {
                "arm": c.arm,
                "pass": c.group,
                "scenario": c.scenario,
                "variant": c.variant,
                "base_length": c.base_length,
                "target_tokens": c.target_tokens,
                "depth_pct": c.depth_pct,
                "extra": c.extra,
                "state": c.state,
                "states": " ".join(f"{k}:{v}" for k, v in c.state_counts.items()),
                "n": c.n,
                "n_passed": c.n_passed,
                "pass_rate": c.pass_rate,
                "mean_score": c.mean_score,
                "n_errors": c.n_errors,
                "n_truncated": c.n_truncated,
                "skipped": c.skipped,
                "skip_reason": c.skip_reason,
                "answers_agree": c.answers_agree,
                "prompt_tokens": c.values("prompt_tokens"),
                "measured_tokens": c.values("measured_tokens"),
                "needle_token_pos": c.values("needle_token_pos"),
                "finish_reasons": c.values("finish_reason"),
                "first_wrong_char": c.values("first_wrong_char"),
                "distractor_hit": any(r.get("distractor_hit") for r in c.measured()),
                "ttft_mean_s": c.mean_of("ttft_s"),
                "latency_mean_s": c.mean_of("latency_s"),
                "decode_tok_s_mean": c.mean_of("decode_tok_s"),
                "index_k_format": c.records[0].get("index_k_format") if c.records else "",
            }
            w.writerow([_fmt(row[f]) for f in CSV_FIELDS])


STATE_FIELDS = (
    "key",
    "arm",
    "pass",
    "scenario",
    "cell_id",
    "repeat",
    "state",
    "kind",
    "reason",
    "faults",
    "retried",
    "prompt_tokens",
    "measured_tokens",
)


def write_states_csv(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """One row per planned request: its state as this report judged it (requests.jsonl holds only
    what was observed), with why, the faults beside it and the faults retried away."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(STATE_FIELDS)
        for r in records:
            retried = list(r.get("retried") or []) + list(r.get("sizing_retried") or [])
            row = r | {"faults": r.get("faults") or [], "retried": retried}
            w.writerow([_fmt(row.get(f)) for f in STATE_FIELDS])


def write_ab_csv(path: Path, ab: Sequence[ABCell]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            (
                "scenario",
                "pass",
                "cell_id",
                "base_length",
                "depth_pct",
                "server_pass_rate",
                "baseline_pass_rate",
                "delta",
                "prompt_tokens_equal",
                "server_answer",
                "baseline_answer",
            )
        )
        for x in ab:
            w.writerow(
                (
                    x.scenario,
                    x.group,
                    x.cell_id,
                    x.base_length,
                    x.depth_pct,
                    _fmt(x.server_rate),
                    _fmt(x.baseline_rate),
                    _fmt(x.delta),
                    x.prompt_tokens_equal,
                    x.server_answer,
                    x.baseline_answer,
                )
            )
