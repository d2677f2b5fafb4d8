"""The verdict: PASS, FAIL or INCOMPLETE, from the state of every planned request.

Gate requests: the server under test, base pass and repeats, of the gate scenarios (`sweep` +
`ruler_single` when planned) up to the target length, plus every control (prompts the server read
as at most 2K tokens: there DeepSeek-V4's indexer selects every key, so a wrong answer means the
deployment or the harness is broken, not the index keys).

  PASS        every gate request is measured (or skipped because no such prompt exists) and passed,
              and the gate holds a length past the controls
  FAIL        a gate request was measured and answered wrong: more data cannot undo that
  INCOMPLETE  anything else: unmeasured, errors, truncated, unchecked, a stopped run, a gate of
              controls alone. The report names what is missing and what completes it (most often:
              rerun the same command).

States are judged here, from the stored observations under the run's `Judging` settings, so the
verdict always reflects the settings it is reported with (states.py).

Why three outcomes: a rate-limited, hung or truncating deployment produced a PASS from 4 of 125
planned requests and a FAIL ("passes every depth up to 0") from 2% rate-limited requests on a
perfect server. Neither said anything about recall.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verify.live.config import SERVER
from verify.live.grid import CONTROL_MAX
from verify.live.probe import SetupError, same_format_warning
from verify.live.states import (
    ANSWER,
    ERROR,
    FAIL,
    MEASURED,
    PASS,
    SKIPPED,
    STATES,
    TRUNCATED,
    UNMEASURED,
    Judging,
    count_states,
    judge_record,
    kind_of,
    remedy,
    state_of,
)
from verify.live.summary import ABCell, CellSummary, ab_cells, summarize_cells

GATE_SCENARIOS = ("sweep", "ruler_single")  # "max length passing at all depths" reads these
RULER_SCORED = ("ruler_multikey", "ruler_multivalue")  # RULER-style mean score per length
RULER_THRESHOLD = 0.95
SEQUENTIAL_PASSES = ("base", "repeat")

VERDICT_EXIT = {"PASS": 0, "FAIL": 1, "INCOMPLETE": 3}
SETUP_ERROR_EXIT = 2  # the run could not start (nothing measured); also a bad resume directory
OK, FAILED, INCOMPLETE = "ok", "fail", "incomplete"  # the status of one check


def gate_scenarios_for(scenarios: Iterable[str]) -> tuple[str, ...]:
    """The needle scenarios when planned; otherwise every planned scenario (a --scenarios subset)."""
    present = set(scenarios)
    chosen = tuple(s for s in GATE_SCENARIOS if s in present)
    return chosen or tuple(sorted(present - {"shared_prefix"}))


def _sequential_server(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if r["arm"] == SERVER and r["pass"] in SEQUENTIAL_PASSES]


def default_target(
    planned: Sequence[Mapping[str, Any]], gate_scenarios: Sequence[str], limit: int | None
) -> int:
    """The longest sweep length (else gate-scenario length) whose every planned gate cell the server
    can hold: each of them can then be measured, nudges included."""
    seq = [r for r in _sequential_server(planned) if r["scenario"] in gate_scenarios]
    sweep = [r for r in seq if r["scenario"] == "sweep"] or seq
    fits = [
        n
        for n in sorted({r["base_length"] for r in sweep})
        if limit is None or all(r["target_tokens"] <= limit for r in seq if r["base_length"] <= n)
    ]
    return max(fits, default=0)


@dataclass(frozen=True)
class TargetPlan:
    explicit: int | None  # --target-length
    limit: int | None  # the longest prompt the server advertises (with the sweep's max_tokens)
    resolved: int  # before the run: explicit, else the default from the plan and the limit
    gate_scenarios: tuple[str, ...]


def resolve_target(
    explicit: int | None, planned: Sequence[Mapping[str, Any]], limit: int | None, max_model_len: int | None
) -> TargetPlan:
    """The gate target before the run. A target must be planned (the gate measures what it claims)
    and lie past the controls (at 2K or fewer the indexer selects every key: nothing to gate on)."""
    gate_scenarios = gate_scenarios_for(r["scenario"] for r in planned)
    lengths = sorted({r["base_length"] for r in planned if r["scenario"] in gate_scenarios})
    listed = f"{', '.join(gate_scenarios)} ({', '.join(map(str, lengths))})"
    if explicit is not None:
        if limit is not None and explicit > limit:
            raise SetupError(
                f"--target-length {explicit} is longer than the server allows: at most {limit} prompt tokens "
                f"(max_model_len {max_model_len}). Lower --target-length, or relaunch SGLang with a larger "
                "--context-length."
            )
        if explicit not in lengths:
            raise SetupError(
                f"--target-length {explicit} is not a planned length of {listed}: nothing would measure it. "
                "Add it to --lengths, raise --max-length to it, or pick a planned length."
            )
        target = explicit
    else:
        target = default_target(planned, gate_scenarios, limit)
        if target == 0:
            raise SetupError(
                f"no planned length of {listed} fits the server's context (at most {limit} prompt tokens, "
                f"max_model_len {max_model_len}); pass --lengths within it, or relaunch SGLang with a larger "
                "--context-length."
            )
    if target <= CONTROL_MAX:
        why = "--target-length" if explicit is not None else "the longest planned length the server holds"
        raise SetupError(
            f"the gate target would be {target:,} tokens ({why}): only controls, where DeepSeek-V4's indexer "
            f"selects every key, so nothing would test the index keys. Plan a length past {CONTROL_MAX:,} "
            f"({listed}) within the server's context."
        )
    return TargetPlan(explicit, limit, target, gate_scenarios)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, FAILED or INCOMPLETE
    detail: str
    gate: bool  # True: decides the verdict

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class Missing:
    """Gate requests without a measurement, grouped by why, with what completes them."""

    state: str
    kind: str
    count: int
    example: str
    rerun_completes: bool
    remedy: str

    @property
    def label(self) -> str:
        return f"{self.state} ({self.kind})" if self.kind else self.state


@dataclass
class Evaluation:
    records: list[dict[str, Any]]  # one per planned request: its latest record or an 'unmeasured' stub
    cells: list[CellSummary]
    states: dict[str, dict[str, int]]  # arm -> requests per state
    gate_states: dict[str, int]  # the gate requests per state
    checks: list[Check]
    max_len: dict[str, int]  # arm -> longest length passing at every depth (gate scenarios)
    max_len_stop: dict[str, str]  # arm -> the length that ends that run, and why ('' for none)
    target_length: int
    target_note: str
    gate_scenarios: tuple[str, ...]
    ab: list[ABCell]
    aborted: str | None
    missing: list[Missing]
    blockers: list[str]  # why not PASS beyond the missing requests (e.g. a gate of controls alone)
    qualifiers: list[str]  # conditions a verdict holds under, said beside it (e.g. calibrated sizing)
    judging: Judging
    verdict: str  # PASS, FAIL or INCOMPLETE

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    @property
    def gate_ok(self) -> bool:
        return self.verdict == "PASS"


def judged(
    planned: Sequence[Mapping[str, Any]], latest: Mapping[str, Mapping[str, Any]], judging: Judging
) -> list[dict[str, Any]]:
    """Every planned request once: its stored observation judged under `judging`, or a stub in
    state 'unmeasured'."""
    return [
        judge_record(latest[p["key"]], judging)
        if p["key"] in latest
        else dict(p) | {"state": UNMEASURED, "kind": "", "passed": False, "ok": False, "faults": []}
        for p in planned
    ]


def passing_run(records: Iterable[Mapping[str, Any]], arm: str, scenarios: Sequence[str]) -> tuple[int, str]:
    """(L, what stops it): L is the largest length such that every length up to L has every planned
    request measured and passed (0: none). Lengths skipped entirely (beyond the context) say nothing
    either way; a length with a request not measured ends the run just like one that failed, so the
    figure is never an extrapolation, and the second value says which it was ('' when nothing)."""
    by_len: dict[int, list[str]] = defaultdict(list)
    for r in records:
        if r["arm"] == arm and r["pass"] in SEQUENTIAL_PASSES and r["scenario"] in scenarios:
            by_len[r["base_length"]].append(state_of(r))
    best = 0
    for n in sorted(by_len):
        states = [s for s in by_len[n] if s != SKIPPED]
        if not states:
            continue
        if any(s != PASS for s in states):
            if FAIL in states:
                return best, f"{n:,} fails"
            return best, f"{n:,} not all measured: {sum(s != PASS for s in states)} of {len(states)} requests"
        best = n
    return best, ""


def max_passing_length(records: Iterable[Mapping[str, Any]], arm: str, scenarios: Sequence[str]) -> int:
    return passing_run(records, arm, scenarios)[0]


def _refused_from(records: Iterable[Mapping[str, Any]]) -> int | None:
    refused = [
        int(r["target_tokens"])
        for r in records
        if r["arm"] == SERVER and state_of(r) == ERROR and r.get("error_kind") == "context_too_long"
    ]
    return min(refused) if refused else None


def _final_target(
    target: TargetPlan, planned: Sequence[Mapping[str, Any]], refused: int | None
) -> tuple[int, str]:
    if target.explicit is not None:
        note = "--target-length"
        if refused is not None and refused <= target.explicit:
            note += f"; the server refused a {refused:,}-token prompt as longer than its context"
        return target.explicit, note
    limits = [x for x in (target.limit, (refused - 1) if refused is not None else None) if x is not None]
    value = default_target(planned, target.gate_scenarios, min(limits) if limits else None)
    note = "default: the longest sweep length the server holds"
    if refused is not None and value < target.resolved:
        note += (
            f"; lowered from {target.resolved:,} because the server refused a {refused:,}-token prompt as "
            "longer than its context"
        )
    return value, note


def _describe(r: Mapping[str, Any]) -> str:
    return f"{r['scenario']} {r['cell_id']} r{r['repeat']}"


def _why(r: Mapping[str, Any]) -> str:
    return str(r.get("error") or r.get("reason") or "")


def _acceptable(r: Mapping[str, Any]) -> bool:
    """Counts toward PASS: a measured pass, or a prompt that cannot exist (a stated reason)."""
    s = state_of(r)
    return s == PASS or (s == SKIPPED and r.get("skip_kind") == "unbuildable")


def _missing(records: Sequence[Mapping[str, Any]]) -> list[Missing]:
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if not _acceptable(r) and state_of(r) != FAIL:
            groups[(state_of(r), kind_of(r))].append(r)
    out = []
    for (state, kind), rs in sorted(groups.items(), key=lambda kv: (STATES.index(kv[0][0]), kv[0][1])):
        rerun, what = remedy(state, kind)
        why = _why(rs[0])
        out.append(Missing(state, kind, len(rs), _describe(rs[0]) + (f": {why}" if why else ""), rerun, what))
    return out


def _summary(missing: Sequence[Missing]) -> str:
    return ", ".join(f"{m.count} {m.label}" for m in missing)


def _status(fails: Sequence[Any], missing: Sequence[Any], empty: bool = False) -> str:
    if fails:
        return FAILED
    return INCOMPLETE if missing or empty else OK


def evaluate(
    planned: Sequence[Mapping[str, Any]],
    latest: Mapping[str, Mapping[str, Any]],
    target: TargetPlan,
    aborted: str | None,
    judging: Judging,
) -> Evaluation:
    """The verdict from the stored observations (`latest`: key -> record), judged under `judging`."""
    records = judged(planned, latest, judging)
    cells = summarize_cells(records)
    arms = sorted({r["arm"] for r in records}, key=lambda a: (a != SERVER, a))
    states = {arm: count_states(r for r in records if r["arm"] == arm) for arm in arms}
    gs = target.gate_scenarios
    target_length, target_note = _final_target(target, planned, _refused_from(records))

    seq = _sequential_server(records)
    controls = [r for r in seq if r["base_length"] <= CONTROL_MAX and r.get("control", True)]
    lengths = [r for r in seq if r["scenario"] in gs and r["base_length"] <= target_length]
    gate = {r["key"]: r for r in controls + lengths}
    gate_records = list(gate.values())
    runs = {arm: passing_run(records, arm, gs) for arm in arms}
    max_len = {arm: run[0] for arm, run in runs.items()}
    checks: list[Check] = []

    ctrl_fail = [r for r in controls if state_of(r) == FAIL]
    ctrl_missing = [r for r in controls if not _acceptable(r) and state_of(r) != FAIL]
    n_ctrl_pass = sum(state_of(r) == PASS for r in controls)
    detail = f"{n_ctrl_pass}/{len(controls)} control requests pass"
    if ctrl_fail:
        detail += "; wrong: " + ", ".join(_describe(r) for r in ctrl_fail[:6])
    if ctrl_missing:
        detail += "; not measured: " + _summary(_missing(ctrl_missing))
    if not n_ctrl_pass and not ctrl_fail:
        detail += "; no control was measured (plan a length of 2,048 or less)"
    checks.append(
        Check(
            "controls pass (<= 2K tokens read: the indexer selects every key)",
            _status(ctrl_fail, ctrl_missing, empty=not n_ctrl_pass),
            detail,
            True,
        )
    )

    len_fail = [r for r in lengths if state_of(r) == FAIL]
    len_missing = [r for r in lengths if not _acceptable(r) and state_of(r) != FAIL]
    detail = (
        f"server passes every depth up to {max_len.get(SERVER, 0):,} tokens ({' + '.join(gs)}"
        + (f"; then {runs[SERVER][1]}" if runs.get(SERVER, (0, ""))[1] else "")
        + "); "
        f"target {target_length:,} ({target_note})"
    )
    if len_fail:
        detail += f"; {len(len_fail)} wrong answers at or below the target, e.g. {_describe(len_fail[0])}"
    if len_missing:
        detail += "; not measured: " + _summary(_missing(len_missing))
    blockers: list[str] = []
    if not any(r["base_length"] > CONTROL_MAX for r in lengths):
        # Controls say the deployment works; only longer prompts can show an index-key defect.
        why = (
            f"the gate holds no length past the controls (target {target_length:,}: {target_note}), and at "
            f"{CONTROL_MAX:,} tokens or fewer DeepSeek-V4's indexer selects every key, so nothing here tested "
            "the index keys; relaunch with a larger --context-length, or plan lengths the server holds"
        )
        detail += "; " + why
        blockers.append(why)
    checks.append(
        Check(
            f"every depth passes up to the target ({target_length:,} tokens)",
            _status(len_fail, len_missing, empty=bool(blockers)),
            detail,
            True,
        )
    )

    missing = _missing(gate_records)
    gate_states = count_states(gate_records)
    n_measured = gate_states[PASS] + gate_states[FAIL]
    detail = f"{n_measured}/{len(gate_records)} gate requests measured"
    if gate_states[SKIPPED]:
        detail += f", {gate_states[SKIPPED]} skipped"
    if missing:
        detail += "; missing: " + _summary(missing)
    checks.append(Check("every gate request measured", INCOMPLETE if missing else OK, detail, True))

    # Informational checks: reported, never deciding the verdict.
    seq_cells = [c for c in cells if c.arm == SERVER and c.group == "sequential"]
    checks.append(_truncation_check(records, states.get(SERVER, {}).get(TRUNCATED, 0), judging))
    if any(c.planned > 1 for c in seq_cells):
        disagree = [c for c in seq_cells if c.answers_agree is False]
        short = [c for c in seq_cells if c.planned > 1 and c.answers_agree is None]
        checks.append(
            Check(
                "repeats agree at temperature 0",
                _status(disagree, short),
                (
                    "all identical"
                    if not disagree
                    else f"{len(disagree)} cells differ, e.g. {disagree[0].scenario} {disagree[0].cell_id}"
                )
                + (f"; {len(short)} cells have fewer than 2 measured answers" if short else ""),
                False,
            )
        )
    for scenario in RULER_SCORED:
        rows = _ruler_rows(records, scenario, target_length)
        if rows:
            low = [n for n, (score, _) in rows.items() if score is not None and score < RULER_THRESHOLD]
            partial = [n for n, (_, complete) in rows.items() if not complete]
            checks.append(
                Check(
                    f"{scenario} score >= {RULER_THRESHOLD:.0%} per length up to the target",
                    _status(low, partial),
                    ", ".join(
                        f"{n}: {'-' if score is None else f'{100 * score:.0f}%'}{'' if complete else ' (partial)'}"
                        for n, (score, complete) in sorted(rows.items())
                    ),
                    False,
                )
            )
    checks += _concurrency_check(cells, seq_cells)
    shared = [c for c in cells if c.arm == SERVER and c.group == "shared_prefix" and c.state != SKIPPED]
    if shared:
        failing = [c for c in shared if c.state == FAIL]
        unmeasured = [c for c in shared if c.state not in (PASS, FAIL)]
        checks.append(
            Check(
                "shared-prefix (radix cache) questions all answered",
                _status(failing, unmeasured),
                f"{sum(c.passed for c in shared)}/{len(shared)} pass"
                + (f"; {len(unmeasured)} not measured" if unmeasured else ""),
                False,
            )
        )
    ab = ab_cells(cells)
    checks += _ab_checks(ab)
    formats = {r["arm"]: str(r["index_k_format"]) for r in records if r.get("index_k_format")}
    warning = same_format_warning(list(formats.values())) if ab else None
    if warning:
        checks.append(Check("A/B: the two servers differ in index-K format", INCOMPLETE, warning, False))

    gate_checks = [c for c in checks if c.gate]
    if any(c.status == FAILED for c in gate_checks):
        verdict = "FAIL"
    elif aborted or any(c.status != OK for c in gate_checks):
        verdict = "INCOMPLETE"
    else:
        verdict = "PASS"
    found = [
        f"the {arm}'s records span {n} launches of the server (resumed across a relaunch with "
        "--accept-relaunch: same URL, model path, version and server args)"
        for arm in arms
        if (n := len({r["launch"] for r in records if r["arm"] == arm and r.get("launch")})) > 1
    ]
    if judging.accept_calibrated and _calibrated(records):
        found.append(
            "calibrated sizing accepted (--accept-calibrated): the server has no tokenize endpoint, so a "
            "prompt truncated by less than 5% could not be told from a calibration miss"
        )
    return Evaluation(
        records=records,
        cells=cells,
        states=states,
        gate_states=gate_states,
        checks=checks,
        max_len=max_len,
        max_len_stop={arm: run[1] for arm, run in runs.items()},
        target_length=target_length,
        target_note=target_note,
        gate_scenarios=gs,
        ab=ab,
        aborted=aborted,
        missing=missing,
        blockers=blockers,
        qualifiers=found,
        judging=judging,
        verdict=verdict,
    )


def _calibrated(records: Iterable[Mapping[str, Any]]) -> bool:
    return any(r.get("arm") == SERVER and r.get("sizing") == "calibrated" for r in records)


def _truncation_check(records: Sequence[Mapping[str, Any]], n_trunc: int, judging: Judging) -> Check:
    """Truncation is checkable only where sizes are exact; elsewhere the row says so, never 'ok'."""
    name = "no prompt truncated (server prompt_tokens match what was sent)"
    if n_trunc:
        return Check(name, FAILED, f"{n_trunc} truncated requests (not scored)", False)
    if _calibrated(records):
        detail = (
            "not checkable here: sizes are calibrated (no tokenize endpoint), so a few missing tokens look "
            "like a calibration miss"
        )
        if judging.accept_calibrated:
            detail += "; scored anyway (--accept-calibrated)"
        return Check(name, INCOMPLETE, detail, False)
    answered = sum(1 for r in records if r.get("arm") == SERVER and r.get("observed") == ANSWER)
    return Check(name, OK, f"none (of {answered} answers, tolerance {judging.token_tolerance} tokens)", False)


def _ruler_rows(
    records: Sequence[Mapping[str, Any]], scenario: str, target_length: int
) -> dict[int, tuple[float | None, bool]]:
    """Per length up to the target: (mean score of the measured requests, all of them measured)."""
    acc: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in _sequential_server(records):
        if r["scenario"] == scenario and r["base_length"] <= max(target_length, 1) and state_of(r) != SKIPPED:
            acc[r["base_length"]].append(r)
    out: dict[int, tuple[float | None, bool]] = {}
    for n, rs in acc.items():
        scores = [float(r.get("score") or 0.0) for r in rs if state_of(r) in MEASURED]
        out[n] = (sum(scores) / len(scores) if scores else None, len(scores) == len(rs))
    return out


def _concurrency_check(cells: Sequence[CellSummary], seq_cells: Sequence[CellSummary]) -> list[Check]:
    """A concurrent cell that fails is 'worse' unless its sequential twin was measured failing too;
    with no measured twin it is not comparable (before, a failing cell with no twin passed)."""
    conc = [c for c in cells if c.arm == SERVER and c.group == "concurrency" and c.state != SKIPPED]
    if not conc:
        return []
    twins = {(c.scenario, c.cell_id): c for c in seq_cells}
    worse, open_ = [], []
    for c in conc:
        twin = twins.get((c.scenario, c.cell_id))
        if c.state not in (PASS, FAIL):
            open_.append(c)
        elif c.state == FAIL:
            if twin is None or twin.state not in (PASS, FAIL):
                open_.append(c)
            elif twin.state == PASS:
                worse.append(c)
    detail = f"{sum(c.passed for c in conc)}/{len(conc)} pass"
    if worse:
        detail += f"; worse than sequential: {', '.join(c.cell_id for c in worse[:6])}"
    if open_:
        detail += f"; {len(open_)} not comparable (not measured, or no measured sequential twin)"
    return [Check("concurrency pass no worse than sequential", _status(worse, open_), detail, False)]


def _ab_checks(ab: Sequence[ABCell]) -> list[Check]:
    if not ab:
        return []
    paired = [x for x in ab if x.delta is not None]
    worse = [x for x in paired if (x.delta or 0) < 0]
    unpaired = [x for x in ab if x.delta is None]
    detail = (
        "never worse"
        if not worse
        else (f"worse on {len(worse)} cells, e.g. {worse[0].scenario} {worse[0].cell_id} ({worse[0].group})")
    )
    if unpaired:
        detail += f"; {len(unpaired)} cells not measured on both servers"
    checks = [
        Check("A/B: server never worse than baseline on any cell", _status(worse, unpaired), detail, False)
    ]
    mismatch = [x for x in ab if not x.prompt_tokens_equal]
    if mismatch:
        checks.append(
            Check(
                "A/B: both servers count the same prompt tokens",
                FAILED,
                f"{len(mismatch)} cells differ (different tokenizer or chat template?)",
                False,
            )
        )
    return checks


def outcome(ev: Evaluation, command: str, exit_code: int | None = None) -> dict[str, Any]:
    """What run.json records about the result: the verdict, the exit code (the verdict's, or an
    interruption's), the settings it was judged with and every count."""
    return {
        "verdict": ev.verdict,
        "exit_code": ev.exit_code if exit_code is None else exit_code,
        "judging": ev.judging.as_dict(),
        "qualifiers": ev.qualifiers,
        "blockers": ev.blockers,
        "target_length": ev.target_length,
        "target_note": ev.target_note,
        "planned": {arm: sum(n.values()) for arm, n in ev.states.items()},
        "states": ev.states,
        "gate_states": ev.gate_states,
        "missing": [
            {
                "state": m.state,
                "kind": m.kind,
                "count": m.count,
                "rerun_completes": m.rerun_completes,
                "remedy": m.remedy,
            }
            for m in ev.missing
        ],
        "aborted": ev.aborted,
        "complete_with": command if ev.verdict == "INCOMPLETE" else None,
    }
