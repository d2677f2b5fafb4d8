"""From request records to cells, per-length results, A/B deltas and the gate.

Pass groups: `sequential` (the base pass and its repeats: what the gate reads), `shared_prefix`
and `concurrency` (robustness passes, reported beside it). A cell passes only if every one of its
requests in the group passed: a flaky answer at temperature 0 is a failure, not a near-pass.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify.live.config import BASELINE, SERVER
from verify.live.scoring import normalize_answer

GATE_SCENARIOS = ("sweep", "ruler_single")  # "max length passing at all depths" reads these
RULER_SCORED = ("ruler_multikey", "ruler_multivalue")  # RULER-style mean score per length
RULER_THRESHOLD = 0.95


def gate_scenarios_of(cells: Sequence[CellSummary]) -> tuple[str, ...]:
    """The needle scenarios when they ran; otherwise every scenario that ran (a --scenarios subset)."""
    present = {c.scenario for c in cells}
    chosen = tuple(s for s in GATE_SCENARIOS if s in present)
    return chosen or tuple(sorted(present - {"shared_prefix"}))


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
        return [r for r in self.records if r.get("status") != "skipped"]

    @property
    def skipped(self) -> bool:
        return bool(self.records) and not self.measured()

    @property
    def skip_reason(self) -> str:
        return next((str(r.get("reason")) for r in self.records if r.get("status") == "skipped"), "")

    @property
    def n(self) -> int:
        return len(self.measured())

    @property
    def n_passed(self) -> int:
        return sum(1 for r in self.measured() if r.get("passed"))

    @property
    def passed(self) -> bool:
        return self.n > 0 and self.n_passed == self.n

    @property
    def pass_rate(self) -> float | None:
        return self.n_passed / self.n if self.n else None

    @property
    def mean_score(self) -> float | None:
        scores = [float(r.get("score") or 0.0) for r in self.measured()]
        return statistics.fmean(scores) if scores else None

    @property
    def n_errors(self) -> int:
        return sum(1 for r in self.measured() if r.get("status") == "error")

    @property
    def n_truncated(self) -> int:
        return sum(1 for r in self.measured() if r.get("truncated"))

    @property
    def answers_agree(self) -> bool | None:
        answers = {
            normalize_answer(str(r.get("answer", ""))) for r in self.measured() if r.get("status") == "ok"
        }
        return None if len(self.measured()) < 2 else len(answers) <= 1

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


@dataclass(frozen=True)
class LengthResult:
    base_length: int
    n_cells: int
    n_passed: int
    n_skipped: int
    mean_score: float | None

    @property
    def passed(self) -> bool:
        return self.n_cells > 0 and self.n_passed == self.n_cells


def by_length(
    cells: Sequence[CellSummary], arm: str, scenarios: Sequence[str], group: str = "sequential"
) -> list[LengthResult]:
    buckets: dict[int, list[CellSummary]] = defaultdict(list)
    for c in cells:
        if c.arm == arm and c.group == group and c.scenario in scenarios:
            buckets[c.base_length].append(c)
    out: list[LengthResult] = []
    for length in sorted(buckets):
        cs = buckets[length]
        measured = [c for c in cs if not c.skipped]
        scores = [c.mean_score for c in measured if c.mean_score is not None]
        out.append(
            LengthResult(
                base_length=length,
                n_cells=len(measured),
                n_passed=sum(1 for c in measured if c.passed),
                n_skipped=len(cs) - len(measured),
                mean_score=statistics.fmean(scores) if scores else None,
            )
        )
    return out


def max_passing_length(results: Sequence[LengthResult]) -> int:
    """Largest length L such that every measured length up to L passes at every depth (0: none)."""
    best = 0
    for r in results:
        if r.n_cells == 0:
            continue  # skipped entirely (beyond the server's context): says nothing either way
        if not r.passed:
            break
        best = r.base_length
    return best


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    gate: bool  # True: decides the exit code


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
                server_rate=s.pass_rate,
                baseline_rate=b.pass_rate,
                server_answer=_first_answer(s),
                baseline_answer=_first_answer(b),
                prompt_tokens_equal=(not s_pt or not b_pt or s_pt == b_pt),
            )
        )
    return out


def _first_answer(c: CellSummary) -> str:
    for r in c.measured():
        if r.get("status") == "ok":
            return normalize_answer(str(r.get("answer", "")))[:80]
        return f"[{r.get('error_kind')}]"
    return ""


@dataclass
class Evaluation:
    cells: list[CellSummary]
    checks: list[Check]
    max_len: dict[str, int]  # arm -> max length passing at all depths (gate scenarios)
    target_length: int
    ab: list[ABCell]
    aborted: str | None

    @property
    def gate_ok(self) -> bool:
        return self.aborted is None and all(c.ok for c in self.checks if c.gate)


def evaluate(records: Sequence[dict[str, Any]], target_length: int, aborted: str | None) -> Evaluation:
    cells = summarize_cells(records)
    arms = sorted({c.arm for c in cells}, key=lambda a: (a != SERVER, a))
    gate_scenarios = gate_scenarios_of(cells)
    max_len = {arm: max_passing_length(by_length(cells, arm, gate_scenarios)) for arm in arms}
    checks: list[Check] = []
    seq_server = [c for c in cells if c.arm == SERVER and c.group == "sequential"]

    controls = [c for c in seq_server if c.records and c.records[0].get("control") and not c.skipped]
    bad = [c for c in controls if not c.passed]
    checks.append(
        Check(
            "controls pass (<= 2K tokens: the indexer selects every key)",
            bool(controls) and not bad,
            f"{len(controls) - len(bad)}/{len(controls)} control cells pass"
            + (f"; failing: {', '.join(f'{c.scenario} {c.cell_id}' for c in bad[:6])}" if bad else "")
            + ("" if controls else "; no control cell was measured"),
            True,
        )
    )
    trunc = [c for c in cells if c.arm == SERVER and c.n_truncated]
    checks.append(
        Check(
            "no prompt truncated (server prompt_tokens match the fitted length)",
            not trunc,
            "none"
            if not trunc
            else f"{len(trunc)} cells truncated, e.g. {trunc[0].scenario} {trunc[0].cell_id}",
            True,
        )
    )
    got = max_len.get(SERVER, 0)
    checks.append(
        Check(
            f"max length passing at all depths >= target ({target_length})",
            got >= target_length > 0,
            f"server passes every depth up to {got} tokens (scenarios {', '.join(gate_scenarios)})",
            True,
        )
    )
    errors = [c for c in cells if c.arm == SERVER and c.n_errors]
    if errors:
        checks.append(
            Check(
                "every request answered",
                False,
                f"{len(errors)} cells have failed requests (e.g. {errors[0].scenario} {errors[0].cell_id}: "
                f"{errors[0].measured()[-1].get('error_kind')}); rerun to retry them",
                False,
            )
        )
    # Informational robustness checks.
    disagree = [c for c in seq_server if c.answers_agree is False]
    if any(c.n > 1 for c in seq_server):
        checks.append(
            Check(
                "repeats agree at temperature 0",
                not disagree,
                "all identical"
                if not disagree
                else f"{len(disagree)} cells differ, e.g. {disagree[0].scenario} {disagree[0].cell_id}",
                False,
            )
        )
    for scenario in RULER_SCORED:
        rows = [
            r
            for r in by_length(cells, SERVER, (scenario,))
            if r.n_cells and r.base_length <= max(target_length, 1)
        ]
        if rows:
            low = [r for r in rows if (r.mean_score or 0) < RULER_THRESHOLD]
            checks.append(
                Check(
                    f"{scenario} score >= {RULER_THRESHOLD:.0%} per length up to the target",
                    not low,
                    ", ".join(f"{r.base_length}: {100 * (r.mean_score or 0):.0f}%" for r in rows),
                    False,
                )
            )
    conc = [c for c in cells if c.arm == SERVER and c.group == "concurrency" and not c.skipped]
    if conc:
        seq_by_id = {(c.scenario, c.cell_id): c for c in seq_server}
        worse = [c for c in conc if not c.passed and seq_by_id.get((c.scenario, c.cell_id), c).passed]
        checks.append(
            Check(
                "concurrency pass no worse than sequential",
                not worse,
                f"{sum(c.passed for c in conc)}/{len(conc)} pass"
                + (f"; worse than sequential: {', '.join(c.cell_id for c in worse[:6])}" if worse else ""),
                False,
            )
        )
    shared = [c for c in cells if c.arm == SERVER and c.group == "shared_prefix" and not c.skipped]
    if shared:
        failing = [c for c in shared if not c.passed]
        checks.append(
            Check(
                "shared-prefix (radix cache) questions all answered",
                not failing,
                f"{len(shared) - len(failing)}/{len(shared)} pass",
                False,
            )
        )
    ab = ab_cells(cells)
    if ab:
        ab_worse = [x for x in ab if x.delta is not None and x.delta < 0]
        mismatch = [x for x in ab if not x.prompt_tokens_equal]
        checks.append(
            Check(
                "A/B: server never worse than baseline on any cell",
                not ab_worse,
                "never worse"
                if not ab_worse
                else f"worse on {len(ab_worse)} cells, e.g. {ab_worse[0].scenario} {ab_worse[0].cell_id} "
                f"({ab_worse[0].group})",
                False,
            )
        )
        if mismatch:
            checks.append(
                Check(
                    "A/B: both servers count the same prompt tokens",
                    False,
                    f"{len(mismatch)} cells differ (different tokenizer or chat template?)",
                    False,
                )
            )
    return Evaluation(
        cells=cells, checks=checks, max_len=max_len, target_length=target_length, ab=ab, aborted=aborted
    )


CSV_FIELDS = (
    "arm",
    "pass",
    "scenario",
    "variant",
    "base_length",
    "target_tokens",
    "depth_pct",
    "extra",
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
