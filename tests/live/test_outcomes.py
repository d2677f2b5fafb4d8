"""Issue 27: what the live tier reports when the run is not a clean one, and what it needs installed.

A complete answer that came with reasoning is scored, a crash's partial line is repaired, a
timed-out usage follow-up is a timeout, a start-up that cannot finish leaves its own outcome
(never an earlier report), SIGTERM reports and resumes exactly, the index-K format is read where
each kind of server reports it and checked with --expect-format, and the report says every fault
it saw, retried or not. Each is a real run of the CLI against the loopback fake.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.live.harness import (
    FAST,
    StartFake,
    chats,
    judged,
    outcome,
    records,
    run_cli,
    server_states,
    sweep_args,
)
from verify.live.cli import main
from verify.live.plots import draw_heatmap, legend_entries

ROOT = Path(__file__).resolve().parents[2]
ARGS = sweep_args([1024, 3000], (0, 100))

# --- item 5: a complete answer is an answer; partial lines; timeouts; the start-up --------------


def test_a_complete_wrong_answer_with_reasoning_is_a_recall_failure(
    tmp_path: Path, fake_server: StartFake
) -> None:
    # Thinking off, yet the server reasons (a template ignoring thinking=false), and answers in full.
    srv = fake_server(recall_last=2500, reasoning_when_off=8)
    assert run_cli(tmp_path, srv, *ARGS) == 1
    assert server_states(tmp_path) == {"pass": 3, "fail": 1}
    (wrong,) = [r for r in judged(tmp_path) if r["state"] == "fail"]
    assert wrong["finish_reason"] == "stop" and wrong["faults"] == ["reasoning_with_thinking_off"]
    report = (tmp_path / "report.md").read_text()
    assert "> **FAIL**" in report and "Nothing here is a recall failure" not in report
    assert (
        "| fail | code\\|L3000\\|d0 |" in report
        and "reasoning content returned although thinking was off |" in report
    )
    assert "4 answers on server came with reasoning content although thinking was off" in report
    assert "4 complete and scored as answers (1 wrong), 0 cut at max_tokens" in report


def test_a_partial_last_line_is_repaired_before_appending(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server()
    assert run_cli(tmp_path, srv, *ARGS) == 0
    path = tmp_path / "requests.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # a crash in the middle of writing the last record
    assert run_cli(tmp_path, srv, *ARGS) == 0
    assert "dropped a partial last line" in capsys.readouterr().err
    assert len(chats(srv)) == 5  # the lost request, sent again...
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines) and len(lines) == 4  # ...and its record kept whole
    assert run_cli(tmp_path, srv, *ARGS) == 0 and len(chats(srv)) == 5  # nothing left to redo
    # A whole record that lost only its newline is kept, not re-sent.
    path.write_bytes(path.read_bytes()[:-1])
    assert run_cli(tmp_path, srv, *ARGS) == 0 and len(chats(srv)) == 5
    assert len(path.read_text().splitlines()) == 4


def test_a_timed_out_usage_follow_up_is_a_timeout(tmp_path: Path, fake_server: StartFake) -> None:
    # No usage in the stream, and the non-streamed request for the count hangs.
    srv = fake_server(usage_in_stream=False, stall_non_stream=True)
    args = [*sweep_args([1024, 3000], (50,)), "--timeout", "0.5"]
    assert run_cli(tmp_path, srv, *args) == 3
    assert server_states(tmp_path) == {"error": 2}
    assert {r["kind"] for r in judged(tmp_path)} == {"timeout"}
    assert all("the usage follow-up failed" in r["reason"] for r in judged(tmp_path))
    report = (tmp_path / "report.md").read_text()
    assert "rerun the same command to retry (or raise --timeout)" in report
    assert "return usage.prompt_tokens" not in report  # not "the server returns no usage"
    srv.cfg.stall_non_stream = False
    assert run_cli(tmp_path, srv, *args) == 0 and server_states(tmp_path) == {"pass": 2}


def test_the_start_up_probe_is_retried_and_its_retries_reported(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(probe_errors=2)  # a router rate-limits the first two 1-token probes
    assert run_cli(tmp_path, srv, *ARGS) == 0
    assert [f["endpoint"] for f in srv.state.faults] == ["probe", "probe"]
    report = (tmp_path / "report.md").read_text()
    assert "- Retried faults on server" in report and "2 rate_limited (start-up)" in report


def test_a_start_up_that_cannot_finish_replaces_the_earlier_report(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server()
    assert run_cli(tmp_path, srv, *ARGS) == 0
    assert outcome(tmp_path)["verdict"] == "PASS"
    srv.state.probes, srv.cfg.probe_errors = 0, 1
    assert run_cli(tmp_path, srv, *ARGS, "--retries", "0") == 3  # transient: rerun completes it
    assert "could not start" in capsys.readouterr().err
    o = outcome(tmp_path)
    assert (o["verdict"], o["exit_code"]) == ("INCOMPLETE", 3) and "1-token probe request" in o["error"]
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# verify_recall, live tier: INCOMPLETE") and "PASS" not in report
    assert "The 4 records in `requests.jsonl` are from earlier runs" in report
    assert run_cli(tmp_path, srv, *ARGS, "--retries", "0") == 0  # the same command completes it


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_reports_what_was_measured_and_the_rerun_resumes_exactly(
    tmp_path: Path, fake_server: StartFake, sig: signal.Signals, code: int
) -> None:
    srv = fake_server(delay_s=0.3, delay_from=1)
    args = sweep_args([1024, 3000, 4000], (0, 50, 100))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "verify.live", "--server", srv.url, "--out", str(tmp_path), *FAST, *args]
    # A shell starts background jobs with SIGINT ignored, an ignored signal stays ignored across
    # exec, and Python then installs no Ctrl-C handler. A caught one is reset to its default, so
    # the run starts as a terminal's foreground command does.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        path = tmp_path / "requests.jsonl"
        deadline = time.monotonic() + 60
        while not (path.exists() and len(path.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()  # a run that does not stop on the signal must not outlive the test
        proc.wait()
    assert proc.returncode == code, err
    o = outcome(tmp_path)
    assert o["exit_code"] == code and o["verdict"] == "INCOMPLETE" and sig.name in o["aborted"]
    assert f"interrupted by {sig.name}" in (tmp_path / "report.md").read_text()
    done, received = len(records(tmp_path)), len(chats(srv))
    assert 2 <= done < 9 and received - done in (0, 1)  # only the request in flight went unrecorded
    srv.cfg.delay_s = 0.0
    assert run_cli(tmp_path, srv, *args) == 0
    assert len(chats(srv)) - received == 9 - done  # exactly the missing requests were sent
    assert len(records(tmp_path)) == 9


# --- item 6: the index-K format -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fake", "label", "source"),
    [
        ({"index_k_format": "bf16"}, "bf16", "server_info.deepseek_v4_indexer_k_dtype"),
        ({"index_k_format": "bf16", "format_field": "legacy"}, "bf16", "server_info.dsv4_index_k_format"),
        (
            {"index_k_format": "fp8", "format_field": "upstream"},
            "fp8",
            "inferred: enable_deepseek_v4_fp4_indexer is off",
        ),
        (
            {"index_k_format": "fp4", "format_field": "upstream"},
            "fp4",
            "inferred: enable_deepseek_v4_fp4_indexer is set",
        ),
    ],
)
def test_the_format_is_read_where_each_server_reports_it(
    tmp_path: Path, fake_server: StartFake, fake: dict[str, str], label: str, source: str
) -> None:
    srv = fake_server(**fake)
    assert run_cli(tmp_path, srv, *ARGS, "--expect-format", label) == 0
    report = (tmp_path / "report.md").read_text()
    assert f"| index-K format | **{label}** ({source}" in report and f"server ({label})" in report
    others = [f for f in ("bf16", "fp8", "fp4") if f != label]
    assert run_cli(tmp_path / "other", srv, *ARGS, "--expect-format", others[0]) == 2
    assert outcome(tmp_path / "other")["verdict"] == "SETUP ERROR"
    assert f"--expect-format {others[0]}" in outcome(tmp_path / "other")["error"]


def test_a_server_that_reports_no_format_is_unknown_never_fp8(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(index_k_format=None)
    assert run_cli(tmp_path, srv, *ARGS) == 0
    report = (tmp_path / "report.md").read_text()
    assert "| index-K format | **unknown (not patched?)** (no index-K format field" in report
    assert "server (unknown (not patched?))" in report and "fp8" not in report
    assert all(r["index_k_format"] == "unknown (not patched?)" for r in records(tmp_path))
    assert run_cli(tmp_path, srv, *ARGS, "--expect-format", "fp8") == 2
    assert "reports index-K format 'unknown (not patched?)'" in capsys.readouterr().err


def test_an_ab_of_one_format_warns_and_the_baseline_format_is_checked(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv, twin = fake_server(), fake_server()
    assert run_cli(tmp_path, srv, *ARGS, "--baseline", twin.url) == 0
    assert "both servers report index-K format bf16" in capsys.readouterr().err
    report = (tmp_path / "report.md").read_text()
    assert "> **Warning:** both servers report index-K format bf16: the A/B compares two bf16" in report
    assert "| info | A/B: the two servers differ in index-K format | **INCOMPLETE** |" in report
    args = [*ARGS, "--baseline", twin.url, "--baseline-expect-format", "fp8"]
    assert run_cli(tmp_path / "b", srv, *args) == 2
    assert "--baseline-expect-format fp8: the baseline server" in capsys.readouterr().err


# --- item 8 and the environment table: nested values, retried faults, heatmap letters ----------


def test_nested_values_and_retried_faults_are_reported(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(nest_max_total_num_tokens=True, chat_error_every=3)
    assert run_cli(tmp_path, srv, *ARGS) == 0  # every 429 was retried away
    report = (tmp_path / "report.md").read_text()
    assert "| max_total_num_tokens (KV pool) | 200000 |" in report
    assert "## Problems\n\n- none" not in report
    retried = sum(len(r["retried"]) for r in records(tmp_path))
    assert retried == len(srv.state.faults) > 0
    assert (
        f"- Retried faults on server (retried away; the requests were then answered or recorded above): {retried} rate_limited (request)"
        in report
    )


def _overlaps(a: object, b: object) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)  # type: ignore[attr-defined]


def test_the_heatmap_legend_explains_every_letter_and_stays_off_the_axes() -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    texts = {(0, 0): "0.50\n+EU", (0, 1): "T", (1, 0): "1.00", (1, 1): "M"}
    paints = {(0, 1): "#8e44ad", (1, 1): "#d5d8dc"}
    labels = [label for _, label in legend_entries(texts, delta=False)]
    assert labels == [
        "T: truncated",
        "U: unchecked",
        "E: error",
        "M: unmeasured",
        "+X under a rate: some requests of that square are X, not measured",
    ]
    values = np.array([[0.5, np.nan], [1.0, np.nan]])
    fig = draw_heatmap(values, texts, paints, [1024, 4000], [0.0, 100.0], "sweep - server", delta=False)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:  # the map (with its tick labels and axis titles) and the colour bar
        assert not _overlaps(box, ax.get_tightbbox(renderer)), ax
    plt.close(fig)
    assert [label for _, label in legend_entries({(0, 0): "+0.50", (0, 1): "M"}, delta=True)] == [
        "M: not measured on both servers"
    ]


# --- item 7: what the live tier needs installed ----------------------------------------------------


def test_the_live_extra_declares_what_the_tier_imports_and_nothing_heavy() -> None:
    imported: set[str] = set()
    for path in (ROOT / "verify" / "live").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"verify", "__future__"}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    declared = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in extras["live"]}
    assert third_party == declared
    # Importing the CLI (what --help does) loads no torch, no sglang and no other verify tier.
    code = (
        "import sys, verify.live.cli; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang', 'triton', 'matplotlib') "
        "or (m.startswith('verify.') and not m.startswith('verify.live'))]; print(heavy)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_help_names_what_a_resume_and_a_verdict_depend_on(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--expect-format {bf16,fp8,fp4}", "--restart", "--accept-relaunch", "--accept-calibrated"):
        assert option in text
