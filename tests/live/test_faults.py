"""Deployment faults against the live tier: each is reported as a fault, never as recall.

Every test runs the real harness against the loopback fake with one behaviour switched on (a
rate-limiting router, a proxy dropping streamed usage, a truncating server, a server without a
tokenize endpoint, ...) and asserts the requests per state, the verdict and the exit code. The
"former false PASS" tests reproduce what the harness used to get wrong (issue 12). Faults are
injected by request count, so nothing depends on timing; the only waits are the fake's 30 ms
Retry-After and, for stalls, one request timeout.
"""

from __future__ import annotations

import csv
import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live.fake_server import FakeConfig, FakeServer
from tests.live.harness import (
    StartFake,
    chats,
    judged,
    latest,
    outcome,
    relaunch,
    run_cli,
    server_states,
    sweep_args,
)
from verify.live.cli import main
from verify.live.config import RunConfig
from verify.live.gate import OK, TargetPlan, evaluate
from verify.live.grid import GridOptions
from verify.live.plots import STATE_STYLE, square_look
from verify.live.runner import plan_items, planned_record
from verify.live.states import MEASURED, Judging

LENGTHS = [1024, 2048, 4509, 8000]
DEPTHS = (0, 50, 100)
WINDOW = 3500  # the lossy fake's recall window: needles further than this from the end are lost


def gate_verdict(out: Path) -> tuple[str, int]:
    o = outcome(out)
    return o["verdict"], o["exit_code"]


def assert_nothing_dropped(out: Path, planned: int) -> None:
    """Every planned request has exactly one state, and run.json's counts add up to the plan."""
    o = outcome(out)
    assert o["planned"]["server"] == planned == sum(o["states"]["server"].values())


def retry_gaps(srv: FakeServer, endpoint: str) -> list[float]:
    """Seconds between each injected fault and the next request to the same endpoint."""
    times = [t for e, t in srv.state.arrivals if e == endpoint]
    gaps = []
    for f in (f for f in srv.state.faults if f["endpoint"] == endpoint):
        later = [t for t in times if t > f["time"]]
        if later:
            gaps.append(min(later) - f["time"])
    return gaps


# --- former false PASS 1: tokenize rate-limited, cells dropped, exit 0 from 4 of 125 requests ------


def test_rate_limited_tokenize_is_retried_and_the_lossy_server_fails(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(recall_last=WINDOW, tokenize_error_every=5, retry_after="0.03")
    rc = run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS))
    assert rc == 1 and gate_verdict(tmp_path) == ("FAIL", 1)
    assert_nothing_dropped(tmp_path, 12)
    states = server_states(tmp_path)
    assert states["pass"] + states["fail"] == 12 and states["fail"] >= 2  # every cell measured
    assert len(srv.state.faults) >= 5  # the router really rate-limited tokenize...
    assert min(retry_gaps(srv, "tokenize")) >= 0.03  # ...and every retry waited its Retry-After


def test_tokenize_faults_without_retries_are_recorded_never_dropped(
    tmp_path: Path, fake_server: StartFake
) -> None:
    # A perfect model behind a rate-limiting router; a fit takes ~10 tokenize calls, so every 40th
    # call failing hits a few cells, not all of them (which would stop the run: 5 errors in a row).
    srv = fake_server(tokenize_error_every=40)
    rc = run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS), "--retries", "0")
    assert rc == 3 and gate_verdict(tmp_path) == ("INCOMPLETE", 3)
    assert_nothing_dropped(tmp_path, 12)
    errors = [r for r in judged(tmp_path) if r["state"] == "error"]
    assert errors and {(r["kind"], r["stage"]) for r in errors} == {("rate_limited", "sizing")}
    assert server_states(tmp_path) == {"pass": 12 - len(errors), "error": len(errors)}
    report = (tmp_path / "report.md").read_text()
    assert f"> **INCOMPLETE**: {len(errors)} of 12 gate requests have no measurement" in report
    assert (
        f"> - {len(errors)} error (rate_limited)" in report
        and "> Rerun to complete: `python -m verify.live" in report
    )
    # The same command completes it: only the errored cells are sized and sent again.
    sent = len(chats(srv))
    srv.cfg.tokenize_error_every = None
    assert run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS), "--retries", "0") == 0
    assert len(chats(srv)) - sent == len(errors)
    assert server_states(tmp_path) == {"pass": 12} and gate_verdict(tmp_path) == ("PASS", 0)


# --- former false PASS 2: 429 permanent, "passes every depth up to 0", never retried on resume ------


def test_rate_limited_chat_is_retried_honouring_retry_after(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(chat_error_every=4, retry_after="0.03")
    rc = run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS))
    assert rc == 0 and gate_verdict(tmp_path) == ("PASS", 0)
    assert server_states(tmp_path) == {"pass": 12}
    assert len(srv.state.faults) >= 3 and min(retry_gaps(srv, "chat")) >= 0.03
    assert sum(r["attempts"] - 1 for r in judged(tmp_path)) == len(srv.state.faults)


def test_rate_limited_chat_stays_retryable_on_resume(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(chat_error_every=4)
    rc = run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS), "--retries", "0")
    assert rc == 3 and gate_verdict(tmp_path) == ("INCOMPLETE", 3)
    errors = [r for r in judged(tmp_path) if r["state"] == "error"]
    assert len(errors) == 3 and {r["kind"] for r in errors} == {"rate_limited"}
    assert server_states(tmp_path) == {"pass": 9, "error": 3}  # not failures: recall was never asked
    assert "passes every depth up to **0**" not in (tmp_path / "report.md").read_text()
    sent = len(chats(srv))
    srv.cfg.chat_error_every = None
    assert run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS), "--retries", "0") == 0
    assert len(chats(srv)) - sent == 3  # exactly the rate-limited requests, asked again
    assert server_states(tmp_path) == {"pass": 12}


def test_retry_after_longer_than_the_cap_ends_the_retries(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(chat_error_every=1, retry_after="120")  # every request: "come back in 2 minutes"
    rc = run_cli(tmp_path, srv, *sweep_args([3000], (50,)))
    assert rc == 3 and server_states(tmp_path) == {"error": 1}
    (r,) = judged(tmp_path)
    assert r["attempts"] == 1 and "asked to wait 120 s, more than --retry-max-wait" in r["error"]


def test_unavailable_and_connection_resets_are_retried(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(chat_error_every=3, chat_error_status=503, reset_every=5)
    rc = run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS))
    assert rc == 0 and server_states(tmp_path) == {"pass": 12}
    kinds = {f["status"] for f in srv.state.faults}
    assert kinds == {503, "reset"}  # both faults really happened, and were retried away


# --- former false PASS 3: infrastructure errors scored as recall; 12 hangs gave "up to 0" --------


def test_stalled_requests_time_out_and_are_retried(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(stall_every=3)
    rc = run_cli(tmp_path, srv, *sweep_args([1024, 3000], (0, 100)), "--timeout", "1")
    assert rc == 0 and server_states(tmp_path) == {"pass": 4}
    assert [f["status"] for f in srv.state.faults] == ["stall"]
    assert sorted(r["attempts"] for r in judged(tmp_path)) == [1, 1, 1, 2]  # the stalled one, retried


def test_stalled_requests_without_retries_are_errors_not_failures(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(stall_every=2)
    rc = run_cli(tmp_path, srv, *sweep_args([1024, 3000], (0, 100)), "--timeout", "1", "--retries", "0")
    assert rc == 3 and gate_verdict(tmp_path) == ("INCOMPLETE", 3)
    assert server_states(tmp_path) == {"pass": 2, "error": 2}
    assert {r["kind"] for r in judged(tmp_path) if r["state"] == "error"} == {"timeout"}
    # Where the passing run stops, and that it stops on missing data, not on a wrong answer.
    assert (
        "passes every depth up to **0** (then 1,024 not all measured: 1 of 2 requests)"
        in (tmp_path / "report.md").read_text()
    )


def test_bad_request_is_reported_once_and_not_retried(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(chat_error_every=3, chat_error_status=400)
    rc = run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS))
    err = capsys.readouterr().err
    assert rc == 3 and server_states(tmp_path) == {"pass": 8, "error": 4}
    bad = [r for r in judged(tmp_path) if r["state"] == "error"]
    assert {r["kind"] for r in bad} == {"bad_request"} and all(r["attempts"] == 1 for r in bad)
    assert len(srv.state.faults) == 4  # one request each: a 400 is not retried
    assert err.count("unsupported parameter 'seed'") == 1  # reported once, not once per request
    assert "fix what the server rejected" in (tmp_path / "report.md").read_text()


def test_model_gone_mid_run_stops_the_run_as_incomplete(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(chat_error_every=3, chat_error_status=404)
    rc = run_cli(tmp_path, srv, *sweep_args(LENGTHS, DEPTHS))
    assert rc == 3 and "does not serve model 'fake-dsv4'" in capsys.readouterr().err
    assert server_states(tmp_path) == {"pass": 2, "error": 1, "unmeasured": 9}
    assert outcome(tmp_path)["aborted"]


def test_default_timeout_scales_with_the_prompt(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server()
    assert run_cli(tmp_path, srv, *sweep_args([1024, 8000], (50,))) == 0
    by = {r["base_length"]: r["timeout_s"] for r in judged(tmp_path)}
    assert by == {1024: round(30 + 0.002 * 1024 + 0.1 * 64, 1), 8000: round(30 + 0.002 * 8000 + 0.1 * 64, 1)}
    assert by[8000] > by[1024] and max(by.values()) < 600  # a hang no longer costs ten minutes


# --- former false PASS 4: no usage in the stream, truncation unchecked, cut prompts scored as passes


def test_usage_missing_from_the_stream_is_asked_without_streaming(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(truncate_to=6000, usage_in_stream=False)
    rc = run_cli(tmp_path, srv, *sweep_args([2048, 4000, 8000], DEPTHS))
    assert rc == 3 and gate_verdict(tmp_path) == ("INCOMPLETE", 3)
    # The 8,000-token prompts were cut to 6,000: caught, not scored (the depth-0 ones "passed" before).
    assert server_states(tmp_path) == {"pass": 6, "truncated": 3}
    by = {(r["base_length"], r["depth_pct"]): r for r in judged(tmp_path)}
    assert by[(8000, 0)]["state"] == "truncated" and by[(8000, 0)]["ok"]  # right answer, still not a pass
    assert {r["usage_source"] for r in judged(tmp_path)} == {"non_stream_followup"}
    assert sum(not e["stream"] for e in chats(srv)) == 9  # one count request each
    report = (tmp_path / "report.md").read_text()
    assert "9 streamed answers on server had no usage.prompt_tokens" in report


def test_no_usage_at_all_leaves_every_cell_unchecked(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(truncate_to=6000, usage_in_stream=False, usage_in_response=False)
    rc = run_cli(tmp_path, srv, *sweep_args([2048, 8000], (50,)))
    assert rc == 3 and server_states(tmp_path) == {"unchecked": 2}
    assert {r["kind"] for r in judged(tmp_path)} == {"no_usage"}
    report = (tmp_path / "report.md").read_text()
    assert "make the server (or proxy) return usage.prompt_tokens" in report


def test_no_usage_and_no_tokenize_is_a_setup_error(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(tokenize=False, usage_in_stream=False, usage_in_response=False)
    assert run_cli(tmp_path, srv, *sweep_args([2048], (50,))) == 2
    assert "can be neither fitted nor checked" in capsys.readouterr().err


# --- former false PASS 5: calibrated sizing was prose-only (INI 1.99x, tools 1.65x, "2K" = 3,300+) --


CALIBRATED = ["ruler_single", "multiturn_tools", "config_recall", "multiturn_secret", "sweep"]


def test_calibrated_sizing_fits_each_scenario_layout(tmp_path: Path, fake_server: StartFake) -> None:
    # A tokenizer where INI files and UUIDs cost about twice the tokens per character of prose.
    srv = fake_server(tokenize=False, tokenizer="mixed")
    args = [
        "--scenarios",
        ",".join(CALIBRATED),
        "--lengths",
        "2048,6000",
        "--depths",
        "10,90",
        "--repeats",
        "1",
    ]
    rc = run_cli(
        tmp_path,
        srv,
        *args,
        "--concurrency",
        "0",
        "--no-shared-prefix",
        "--nudge",
        "none",
        "--accept-calibrated",
    )
    assert rc == 0 and gate_verdict(tmp_path) == ("PASS", 0)
    recs = judged(tmp_path)
    assert {r["scenario"] for r in recs} == set(CALIBRATED)
    for r in recs:
        assert r["state"] == "pass"
        # Controls are aimed 3% low (calibrated sizes land a few % either side); the rest at the target.
        aim = r["target_tokens"] * 97 // 100 if r["base_length"] <= 2048 else r["target_tokens"]
        assert r["aim_tokens"] == aim
        assert abs(r["prompt_tokens"] - aim) <= 0.03 * aim, r["cell_id"]
        # Controls by the length the server read, not by the length asked for.
        assert r["control"] == (r["base_length"] <= 2048 and r["prompt_tokens"] <= 2051)
    assert srv.state.tokenize_calls == 0
    report = (tmp_path / "report.md").read_text()
    assert "calibrated from usage.prompt_tokens per scenario layout" in report
    assert "> **PASS, qualified:** calibrated sizing accepted (--accept-calibrated)" in report


def test_calibrated_cells_off_target_are_marked_not_scored(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(tokenize=False, truncate_to=5000)  # the 8,000-token prompts are read as 5,000
    rc = run_cli(tmp_path, srv, *sweep_args([2048, 8000], (0, 100)), "--accept-calibrated")
    assert rc == 3 and server_states(tmp_path) == {"pass": 2, "unchecked": 2}
    off = [r for r in judged(tmp_path) if r["state"] == "unchecked"]
    assert {r["kind"] for r in off} == {"off_target"}
    assert all("calibrated sizing missed, or the prompt was truncated" in r["reason"] for r in off)


def test_calibration_resumes_with_the_same_prompts(tmp_path: Path, fake_server: StartFake) -> None:
    """A resumed calibrated run renders the prompts measured before: repeats stay byte-identical."""
    srv = fake_server(tokenize=False, tokenizer="mixed", die_after=6)
    args = [*sweep_args([2048, 4000], (0, 100)), "--accept-calibrated", "--accept-relaunch"]
    args[args.index("--repeats") + 1] = "2"
    assert run_cli(tmp_path, srv, *args) == 3
    fresh = relaunch(fake_server, srv, tokenize=False, tokenizer="mixed")
    assert run_cli(tmp_path, fresh, *args) == 0
    by_cell: dict[str, set[str]] = {}
    for r in latest(tmp_path).values():
        by_cell.setdefault(r["cell_id"], set()).add(r["prompt_sha256"])
    assert all(len(shas) == 1 for shas in by_cell.values())
    assert server_states(tmp_path) == {"pass": 8}


# --- former false PASS 6: truncated cells painted as recall failures, counted differently --------


def test_truncated_cells_have_their_own_state_everywhere(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(truncate_to=3000)
    out = tmp_path / "t"
    rc = main(
        ["--server", srv.url, "--out", str(out), "--progress", "off", *sweep_args([2048, 4000], (0, 100))]
    )
    assert rc == 3 and server_states(out) == {"pass": 2, "truncated": 2}
    rows = list(csv.DictReader((out / "summary.csv").read_text().splitlines()))
    assert {r["state"] for r in rows if r["base_length"] == "4000"} == {"truncated"}
    assert all(r["n"] == "0" for r in rows if r["base_length"] == "4000")  # nothing measured there
    report = (out / "report.md").read_text()
    assert "| 4,000 | T1 | T1 |" in report  # the table: truncated, not 0/1
    assert report.count("| truncated | code\\|L4000") == 2  # the did-not-pass table says truncated
    assert "| truncated | code\\|L4000|d100" not in report or "| fail |" not in report
    # One count throughout: states table, info row, problems, run.json.
    assert "| server (bf16) | 4 | 2 | 0 | 0 | 2 | 0 | 0 | 0 |" in report
    assert "2 truncated requests (not scored)" in report and "- 2 truncated prompts on server" in report
    assert (out / "heatmaps" / "sweep__server.png").read_bytes()[:4] == b"\x89PNG"


def test_heatmap_squares_take_the_state_colour() -> None:
    assert square_look(Counter({"truncated": 2})) == (None, "T", STATE_STYLE["truncated"][0])
    assert square_look(Counter({"error": 1, "unmeasured": 1})) == (None, "E", STATE_STYLE["error"][0])
    rate, text, paint = square_look(Counter({"pass": 1, "fail": 1, "truncated": 1}))
    assert rate == 0.5 and text == "0.50\n+T" and paint is None
    assert len({colour for colour, _ in STATE_STYLE.values()}) == len(STATE_STYLE)


# --- former false PASS 8: reasoning with thinking off cut answers, looked like a decode bug -------


def test_reasoning_with_thinking_off_is_its_own_problem(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(reasoning_when_off=62)  # leaves 2 tokens of the 64 for the answer
    rc = run_cli(tmp_path, srv, *sweep_args([1024, 3000], (50,)))
    assert rc == 3 and gate_verdict(tmp_path) == ("INCOMPLETE", 3)
    assert server_states(tmp_path) == {"error": 2}
    assert {r["kind"] for r in judged(tmp_path)} == {"reasoning_with_thinking_off"}
    report = (tmp_path / "report.md").read_text()
    assert "2 answers on server came with reasoning content although thinking was off" in report
    assert "--reasoning-parser" in report


def test_reasoning_that_leaves_room_passes_but_is_reported(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(reasoning_when_off=8)
    assert run_cli(tmp_path, srv, *sweep_args([1024, 3000], (50,))) == 0
    report = (tmp_path / "report.md").read_text()
    assert "2 answers on server came with reasoning content although thinking was off" in report
    assert "2 complete and scored as answers (0 wrong), 0 cut at max_tokens" in report


def test_answers_cut_at_max_tokens_are_not_recall_failures(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server()
    rc = run_cli(tmp_path, srv, *sweep_args([1024, 3000], (50,)), "--max-tokens", "2")
    assert rc == 3 and server_states(tmp_path) == {"error": 2}
    assert {r["kind"] for r in judged(tmp_path)} == {"answer_cut"}
    assert "rerun with a larger --max-tokens" in (tmp_path / "report.md").read_text()


# --- former false PASS 9 & 10: aborted rows "ok", concurrency twin ------------------------------


def test_a_run_stopped_after_the_gate_cells_is_still_incomplete(
    tmp_path: Path, fake_server: StartFake
) -> None:
    # Base pass (6 answers + the start-up probe) complete, then the server dies in the concurrency pass.
    srv = fake_server(die_after=7)
    rc = run_cli(
        tmp_path, srv, *sweep_args([1024, 4509], DEPTHS)[:-5], "--concurrency", "2", "--no-shared-prefix"
    )
    assert rc == 3 and gate_verdict(tmp_path) == ("INCOMPLETE", 3)
    o = outcome(tmp_path)
    assert o["gate_states"]["pass"] == 6 and o["aborted"]
    assert o["states"]["server"]["pass"] == 6


def _planned_and_latest(
    seq_state: str, conc_state: str
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    grid = GridOptions(scenarios=("sweep",), lengths=(1024, 4509), depths=(50,), nudge=("none",))
    cfg = RunConfig(
        out_dir=Path("unused"), server_url="x", grid=grid, repeats=1, concurrency=2, shared_prefix=False
    )
    planned = [planned_record("server", it, cfg.seed) for it in plan_items(cfg, grid)]
    latest: dict[str, dict[str, Any]] = {}
    for p in planned:
        state = "pass"
        if p["base_length"] == 4509:
            state = conc_state if p["pass"] == "concurrency" else seq_state
        n = p["target_tokens"]
        answered = {"observed": "answer", "ok": state == "pass", "answer": state, "finish_reason": "stop"}
        sizes = {"prompt_tokens": n, "measured_tokens": n, "aim_tokens": n, "sizing": "exact"}
        timeout = {"observed": "error", "error_kind": "timeout", "error": "no answer"}
        latest[p["key"]] = dict(p) | (timeout if state == "error" else answered | sizes)
    return planned, latest


@pytest.mark.parametrize(
    ("seq_state", "conc_state", "status"),
    [("error", "fail", "incomplete"), ("pass", "fail", "fail"), ("fail", "fail", OK), ("pass", "pass", OK)],
)
def test_concurrency_failure_needs_a_measured_sequential_twin(
    seq_state: str, conc_state: str, status: str
) -> None:
    planned, latest_ = _planned_and_latest(seq_state, conc_state)
    ev = evaluate(planned, latest_, TargetPlan(None, None, 4509, ("sweep",)), None, Judging())
    (check,) = [c for c in ev.checks if c.name.startswith("concurrency")]
    assert check.status == status  # before: a failing cell with no measured twin passed this check


# --- no combination of faults exits 0 unless every gate request was measured and passed ----------

FAULTS: dict[str, dict[str, Any]] = {
    "tokenize_429": {"tokenize_error_every": 4},
    "chat_429": {"chat_error_every": 5},
    "chat_503": {"chat_error_every": 6, "chat_error_status": 503},
    "no_stream_usage": {"usage_in_stream": False},
    "no_usage": {"usage_in_stream": False, "usage_in_response": False},
    "truncate": {"truncate_to": 3000},
    "refuse": {"max_model_len": 3500, "advertised_max_model_len": 40000},
    "no_tokenize": {"tokenize": False},
    "reasoning": {"reasoning_when_off": 62},
    "lossy": {"recall_last": 2500},
}


@pytest.fixture(scope="module")
def shared_fake() -> Iterator[FakeServer]:
    """One fake for the many short combination cases, reset before each (see FakeServer.reset)."""
    srv = FakeServer(FakeConfig()).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    "combo", [c for n in (1, 2) for c in itertools.combinations(sorted(FAULTS), n)], ids="+".join
)
def test_no_fault_combination_passes_without_measuring(
    tmp_path: Path, shared_fake: FakeServer, combo: tuple[str, ...]
) -> None:
    kwargs: dict[str, Any] = {}
    for name in combo:
        kwargs |= FAULTS[name]
    srv = shared_fake.reset(**kwargs)
    rc = run_cli(
        tmp_path, srv, *sweep_args([1024, 4000], (0, 100)), "--retries", "0", "--target-length", "4000"
    )
    if rc == 2:  # refused at start-up: nothing measured, nothing claimed
        assert set(combo) & {"refuse", "no_usage"} and outcome(tmp_path)["verdict"] == "SETUP ERROR"
        assert "# verify_recall, live tier: SETUP ERROR" in (tmp_path / "report.md").read_text()
        return
    o = outcome(tmp_path)
    gate = {k: v for k, v in o["gate_states"].items() if v}
    assert rc == o["exit_code"]
    assert (rc == 0) == (set(gate) == {"pass"}), (combo, gate)
    assert (rc == 1) == (gate.get("fail", 0) > 0), (combo, gate)
    assert rc in (0, 1, 3)
    measured_everything = all(r["state"] in MEASURED for r in judged(tmp_path))
    if rc == 0:
        assert measured_everything


def test_a_server_holding_no_planned_length_is_a_setup_error(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(max_model_len=900)
    assert run_cli(tmp_path, srv, *sweep_args([1024, 2048], (50,))) == 2
    err = capsys.readouterr().err
    assert (
        "no planned length of sweep (1024, 2048) fits the server's context (at most 835 prompt tokens" in err
    )
    assert chats(srv) == []
