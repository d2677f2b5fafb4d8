"""The live tier end to end against fake OpenAI-compatible servers on loopback.

The fake model sees a needle only inside its recall window (first F / last W tokens), so these
tests know where recall must break and check that the harness reports exactly that, plus the
protocol (streaming, usage, sampling), A/B deltas, resume, and every failure the issue names.
"""

from __future__ import annotations

import csv
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.live.harness import (
    FAST,
    StartFake,
    chats,
    judged,
    outcome,
    records,
    relaunch,
    run_cli,
    server_states,
    sweep_args,
)
from verify.live.cli import main
from verify.live.states import MEASURED


def test_protocol_streaming_usage_and_sampling(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server()
    rc = run_cli(tmp_path, srv, *sweep_args([1024, 2051]))
    assert rc == 0
    recs = [r for r in judged(tmp_path) if r["state"] in MEASURED]
    assert len(recs) == 6
    for r in recs:
        # Exact sizing with the server's tokenizer, confirmed by the server's own usage count.
        assert r["prompt_tokens"] == r["measured_tokens"] == r["target_tokens"]
        assert r["finish_reason"] == "stop" and r["passed"] and r["ttft_s"] is not None
        assert r["latency_s"] >= r["ttft_s"] and r["completion_tokens"] >= 1
        assert r["index_k_format"] == "bf16"
    for e in chats(srv):
        assert e["stream"] and e["stream_options"] == {"include_usage": True}
        assert e["temperature"] == 0 and e["top_p"] == 1 and e["seed"] == 1234 and e["max_tokens"] == 64
        assert e["chat_template_kwargs"]["thinking"] is False


def test_non_streaming_and_thinking_option(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server()
    rc = run_cli(tmp_path, srv, *sweep_args([1024, 3000], (50,)), "--no-stream", "--thinking", "--seed", "7")
    assert rc == 0
    recs = judged(tmp_path)
    assert len(recs) == 2 and all(r["ttft_s"] is None and r["passed"] for r in recs)
    assert sorted(r["prompt_tokens"] for r in recs) == [1024, 3000]
    for e in chats(srv):
        assert not e["stream"] and e["chat_template_kwargs"]["thinking"] is True and e["seed"] == 7
        assert e["max_tokens"] == 4096  # thinking gets a reasoning budget


def _expected_pass(r: dict[str, Any], window: int, first: int = 0) -> bool | None:
    """Where the fake must find the needle; None inside a small uncertainty band at the edge."""
    pos, n = r["needle_token_pos"], r["prompt_tokens"]
    if pos + 20 < first:
        return True
    if n - pos <= window - 30:
        return True
    if n - pos >= window + 30 and pos > first + 30:
        return False
    return None


def test_recall_edge_is_reported_where_the_model_has_it(tmp_path: Path, fake_server: StartFake) -> None:
    window = 3500
    srv = fake_server(recall_last=window)
    lengths = [1024, 2048, 3000, 4509, 6000]
    rc = run_cli(tmp_path, srv, *sweep_args(lengths, (0, 25, 50, 75, 100)))
    assert rc == 1  # default target: the longest length the server holds (6000), which fails
    recs = [r for r in judged(tmp_path) if r["state"] in MEASURED]
    assert len(recs) == 25
    for r in recs:
        want = _expected_pass(r, window)
        if want is not None:
            assert r["passed"] == want, r["cell_id"]
    # Every depth passes up to 3000 (needle at most ~3000 tokens from the end); 4509 loses depth 0.
    report = (tmp_path / "report.md").read_text()
    assert "passes every depth up to **3,000**" in report
    rows = list(csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()))
    failing = {(int(r["base_length"]), float(r["depth_pct"])) for r in rows if r["n_passed"] == "0"}
    assert (4509, 0.0) in failing and (4509, 100.0) not in failing and (6000, 50.0) not in failing
    # The same measurements gate green when the user's target is the length that holds.
    assert run_cli(tmp_path, srv, *sweep_args(lengths, (0, 25, 50, 75, 100)), "--target-length", "3000") == 0


def test_recall_from_the_start_of_the_prompt(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(recall_last=1500, recall_first=300)
    run_cli(tmp_path, srv, *sweep_args([1024, 4509], (0, 50, 100)))
    got = {
        (r["base_length"], r["depth_pct"]): r["passed"] for r in judged(tmp_path) if r["state"] in MEASURED
    }
    assert got == {
        (1024, 0): True,
        (1024, 50): True,
        (1024, 100): True,
        (4509, 0): True,
        (4509, 50): False,
        (4509, 100): True,
    }


def test_ab_deltas_follow_the_two_windows(tmp_path: Path, fake_server: StartFake) -> None:
    bf16 = fake_server(index_k_format="bf16")  # sees everything
    fp8 = fake_server(index_k_format="fp8", recall_last=2500)
    lengths, depths = [1024, 2048, 4000], (0, 50, 100)
    rc = main(
        [
            "--server",
            bf16.url,
            "--baseline",
            fp8.url,
            "--out",
            str(tmp_path),
            *FAST,
            *sweep_args(lengths, depths),
        ]
    )
    assert rc == 0
    # Identical prompts on both arms, request for request.
    assert [e["prompt_tokens"] for e in chats(bf16)] == [e["prompt_tokens"] for e in chats(fp8)]
    by = {r["key"]: r for r in judged(tmp_path)}
    rows = list(csv.DictReader((tmp_path / "ab_deltas.csv").read_text().splitlines()))
    assert len(rows) == 9
    for row in rows:
        s = by[f"server|base|sweep|{row['cell_id']}|r0"]["passed"]
        b = by[f"baseline|base|sweep|{row['cell_id']}|r0"]["passed"]
        assert float(row["delta"]) == int(s) - int(b)
        assert row["prompt_tokens_equal"] == "True"
    assert any(float(r["delta"]) == 1.0 for r in rows)  # fp8 loses the early needle at 4000
    report = (tmp_path / "report.md").read_text()
    assert "server (bf16) is never worse than baseline (fp8)" in report
    assert "**bf16** (server_info.deepseek_v4_indexer_k_dtype)" in report and "**fp8**" in report

    # Swap the windows: now the server arm is the worse one, and the report says so.
    out2 = tmp_path / "swapped"
    main(
        ["--server", fp8.url, "--baseline", bf16.url, "--out", str(out2), *FAST, *sweep_args(lengths, depths)]
    )
    report2 = (out2 / "report.md").read_text()
    assert "server (fp8) is worse than baseline (bf16) on" in report2
    assert "A/B: server never worse than baseline on any cell | **FAIL**" in report2


def test_resume_skips_cells_already_measured(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server()
    assert run_cli(tmp_path, srv, *sweep_args([1024, 3000])) == 0
    assert len(chats(srv)) == 6
    assert run_cli(tmp_path, srv, *sweep_args([1024, 3000])) == 0
    assert len(chats(srv)) == 6  # nothing re-sent
    assert run_cli(tmp_path, srv, *sweep_args([1024, 3000, 4000])) == 0
    assert len(chats(srv)) == 9  # only the new length
    keys = [r["key"] for r in records(tmp_path)]
    assert len(keys) == len(set(keys)) == 9
    # Adding a baseline later measures only the baseline arm.
    base = fake_server(index_k_format="fp8")
    assert run_cli(tmp_path, srv, *sweep_args([1024, 3000, 4000]), "--baseline", base.url) == 0
    assert len(chats(srv)) == 9 and len(chats(base)) == 9
    # Other settings in the same directory are refused rather than mixed in.
    assert run_cli(tmp_path, srv, *sweep_args([1024, 3000]), "--seed", "99") == 2
    assert "seed: 1234" in outcome(tmp_path)["error"] and len(chats(srv)) == 9


def test_server_dying_mid_run_keeps_results_and_resume_finishes(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    dying = fake_server(die_after=5)  # the start-up probe is the first completion
    rc = run_cli(tmp_path, dying, *sweep_args([1024, 2048, 3000]))
    err = capsys.readouterr().err
    assert rc == 3  # INCOMPLETE: the run stopped; what it measured passed, the rest is missing
    assert "stopped answering" in err and "rerun the same command to resume" in err
    ok = [r for r in judged(tmp_path) if r["state"] in MEASURED]
    # Every answer the server gave is on disk; it gave exactly 4 (5 with the start-up probe).
    assert len(ok) == len(chats(dying)) == 4
    assert server_states(tmp_path) == {"pass": 4, "error": 1, "unmeasured": 4}  # error: the one cut off
    assert outcome(tmp_path)["verdict"] == "INCOMPLETE"
    report = (tmp_path / "report.md").read_text()
    assert "# verify_recall, live tier: INCOMPLETE" in report and "Run stopped early" in report
    # The gate rows of a stopped run say what is missing, never "ok" on partial data.
    assert "| gate | every depth passes up to the target (3,000 tokens) | **INCOMPLETE** |" in report
    assert "| gate | every gate request measured | **INCOMPLETE** | 4/9 gate requests measured" in report

    # The server is relaunched at the same URL with the same settings: another launch, so resuming
    # needs the user's word that it is the same deployment, and the report says it was given.
    fresh = relaunch(fake_server, dying)
    assert run_cli(tmp_path, fresh, *sweep_args([1024, 2048, 3000])) == 2
    assert "pass --accept-relaunch to resume" in capsys.readouterr().err and chats(fresh) == []
    assert run_cli(tmp_path, fresh, *sweep_args([1024, 2048, 3000]), "--accept-relaunch") == 0
    assert len(chats(fresh)) == 9 - len(ok)  # only what was missing
    assert sum(r["state"] in MEASURED for r in judged(tmp_path)) == 9
    report = (tmp_path / "report.md").read_text()
    assert "> **PASS, qualified:** the server's records span 2 launches of the server" in report


def test_unreachable_server_is_a_clear_error(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    rc = run_cli(tmp_path, f"http://127.0.0.1:{port}", *sweep_args([1024, 3000]))
    err = capsys.readouterr().err
    assert rc == 2 and "cannot reach the server under test at" in err and "Is SGLang running" in err
    assert outcome(tmp_path)["verdict"] == "SETUP ERROR" and "cannot reach" in outcome(tmp_path)["error"]
    # The failed start left only its outcome: the folder is not "measured under other settings".
    assert run_cli(tmp_path, fake_server(), *sweep_args([1024, 3000])) == 0


def test_wrong_model_name_is_a_clear_error(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server()
    rc = run_cli(tmp_path, srv, *sweep_args([1024]), "--model", "deepseek-v4-typo")
    err = capsys.readouterr().err
    assert rc == 2 and "'deepseek-v4-typo' is not served" in err and "fake-dsv4" in err
    assert chats(srv) == []


def test_truncated_prompts_are_flagged(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(truncate_to=3000)  # accepts anything, silently keeps the first 3000 tokens
    rc = run_cli(tmp_path, srv, *sweep_args([2048, 4000], (50,)))
    err = capsys.readouterr().err
    # Truncated answers are not scored: not a FAIL (nothing wrong was measured), not a PASS.
    assert rc == 3 and "truncated" in err
    by = {r["base_length"]: r for r in judged(tmp_path)}
    assert (
        by[2048]["state"] == "pass" and by[4000]["state"] == "truncated" and by[4000]["prompt_tokens"] == 3000
    )
    assert server_states(tmp_path) == {"pass": 1, "truncated": 1}
    report = (tmp_path / "report.md").read_text()
    assert (
        "| info | no prompt truncated (server prompt_tokens match what was sent) | **FAIL** | 1 truncated"
        in report
    )
    assert (
        "> - 1 truncated, e.g. sweep code|L4000|d50 r0: the server read 3000 prompt tokens of the 4000 sent"
        in report
    )
    assert "> After the fixes above, rerun: `python -m verify.live --server" in report


def test_lengths_beyond_the_server_context_are_skipped_with_a_reason(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(max_model_len=5000)
    rc = run_cli(tmp_path, srv, *sweep_args([2048, 4509, 6000], (50,)))
    assert rc == 0  # the gate's default target is the longest length the server holds
    skipped = [r for r in judged(tmp_path) if r["state"] == "skipped"]
    assert [r["target_tokens"] for r in skipped] == [6000]
    assert "accepts at most 4935 prompt tokens" in skipped[0]["reason"]
    assert (
        "Skipped 1 requests: server: the server under test accepts at most 4935"
        in (tmp_path / "report.md").read_text()
    )
    assert server_states(tmp_path) == {"pass": 2, "skipped": 1}
    assert max(e["prompt_tokens"] for e in chats(srv)) == 4509


def test_target_beyond_the_server_context_is_refused(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(max_model_len=5000)
    rc = run_cli(tmp_path, srv, *sweep_args([2048]), "--target-length", "8000")
    assert rc == 2 and "longer than the server allows" in capsys.readouterr().err


def test_server_refusing_a_length_at_run_time(tmp_path: Path, fake_server: StartFake) -> None:
    # The server advertises more context than it really serves: its 400 is recorded, longer cells skipped.
    srv = fake_server(max_model_len=5000, advertised_max_model_len=40000)
    rc = run_cli(tmp_path, srv, *sweep_args([2048, 6000, 8000], (50,)))
    # The refusal lowers the default target like an advertised limit does (not a recall failure),
    # here to a control length: a gate of controls alone tested no index key, so it is no PASS.
    assert rc == 3 and outcome(tmp_path)["verdict"] == "INCOMPLETE"
    by = {r["base_length"]: r for r in judged(tmp_path)}
    assert by[6000]["state"] == "error" and by[6000]["error_kind"] == "context_too_long"
    assert by[8000]["state"] == "skipped" and "refused 6000 tokens" in by[8000]["reason"]
    assert by[2048]["passed"]
    assert server_states(tmp_path) == {"pass": 1, "skipped": 1, "error": 1}
    assert outcome(tmp_path)["target_length"] == 2048
    report = (tmp_path / "report.md").read_text()
    assert (
        "target 2,048 (default: the longest sweep length the server holds; lowered from 8,000 because the server refused a 6,000-token prompt"
        in report
    )
    assert "> - the gate holds no length past the controls (target 2,048" in report
    assert outcome(tmp_path)["blockers"] and outcome(tmp_path)["missing"] == []
    # With the target asked for explicitly, the refused lengths are missing, not failing.
    assert run_cli(tmp_path, srv, *sweep_args([2048, 6000, 8000], (50,)), "--target-length", "8000") == 3


def test_timeouts_are_recorded_and_stop_a_hung_server(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server(delay_s=1.0, delay_from=1)
    rc = run_cli(
        tmp_path, srv, *sweep_args([1024, 3000], (50,)), "--timeout", "0.3", "--max-consecutive-errors", "2"
    )
    err = capsys.readouterr().err
    assert rc == 3 and "2 requests in a row failed" in err
    kinds = [r["kind"] for r in judged(tmp_path)]
    assert kinds == ["timeout", "timeout"]
    assert [r["attempts"] for r in judged(tmp_path)] == [2, 2]  # a timeout is retried once
    assert server_states(tmp_path) == {"error": 2}


def test_without_tokenize_endpoint_sizes_are_calibrated(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(tokenize=False)
    rc = run_cli(tmp_path, srv, *sweep_args([2048, 4000], (50,)))
    # Calibrated sizes cannot show a few missing tokens: answered, but not scored unless accepted.
    assert rc == 3 and server_states(tmp_path) == {"unchecked": 2}
    assert {r["kind"] for r in judged(tmp_path)} == {"calibrated"}
    report = (tmp_path / "report.md").read_text()
    assert "calibrated from usage.prompt_tokens" in report and "rerun with --accept-calibrated" in report
    assert (
        "| info | no prompt truncated (server prompt_tokens match what was sent) | **INCOMPLETE** | not checkable here"
        in report
    )
    sent = len(chats(srv))
    # Accepting calibrated sizing re-judges what is stored: nothing is sent again.
    assert run_cli(tmp_path, srv, *sweep_args([2048, 4000], (50,)), "--accept-calibrated") == 0
    assert len(chats(srv)) == sent and server_states(tmp_path) == {"pass": 2}
    for r in judged(tmp_path):
        assert abs(r["prompt_tokens"] - r["target_tokens"]) <= 0.05 * r["target_tokens"]
    report = (tmp_path / "report.md").read_text()
    assert "# verify_recall, live tier: PASS (qualified)" in report
    assert "> **PASS, qualified:** calibrated sizing accepted (--accept-calibrated)" in report
    assert (
        "not checkable here: sizes are calibrated" in report
        and "scored anyway (--accept-calibrated)" in report
    )
    assert srv.state.tokenize_calls == 0


def test_repeats_must_agree(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(corrupt_every=4)  # every 4th answer has its last character wrong
    out = tmp_path / "r"
    args = sweep_args([3000], (0, 50, 100))
    args[args.index("--repeats") + 1] = "3"
    assert main(["--server", srv.url, "--out", str(out), *FAST, *args]) == 1
    recs = [r for r in judged(out) if r["state"] in MEASURED]
    assert len(recs) == 9
    wrong = [r for r in recs if not r["passed"]]
    assert wrong and all(r["first_wrong_char"] == len(r["expected"][0]) - 1 for r in wrong)
    report = (out / "report.md").read_text()
    assert "repeats agree at temperature 0 | **FAIL**" in report


def test_concurrency_and_shared_prefix_passes(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(delay_s=0.25)  # long enough that the 3 concurrent requests overlap on a loaded CI box
    args = [
        "--scenarios",
        "sweep,shared_prefix",
        "--lengths",
        "1024,3000",
        "--depths",
        "0,50,100",
        "--nudge",
        "none",
        "--repeats",
        "1",
        "--concurrency",
        "4",
        "--max-length",
        "3000",
        "--save-prompts",
    ]
    rc = run_cli(tmp_path, srv, *args)
    recs = judged(tmp_path)
    conc = [r for r in recs if r["pass"] == "concurrency"]
    assert len(conc) == 3 and all(r["passed"] for r in conc)
    assert srv.state.max_inflight >= 3  # really in flight together
    assert len({r["nonce"] for r in conc}) == 3 and all(r["nonce"] != "s1234" for r in conc)
    shared = sorted(
        (r for r in recs if r["pass"] == "shared_prefix" and r["base_length"] == 3000),
        key=lambda r: r["extra"],
    )
    assert [r["extra"] for r in shared] == ["k0", "k1", "k2", "k3", "k4"] and all(r["passed"] for r in shared)
    prefixes = set()
    for r in shared:
        doc = json.loads((tmp_path / "prompts" / f"{r['prompt_sha256']}.json").read_text())
        prefixes.add(doc["messages"][1]["content"].split("Question:")[0])
    assert len(prefixes) == 1  # byte-identical haystack: the radix cache can reuse it
    assert rc == 0


def test_quick_run_covers_every_scenario_and_writes_the_report(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(index_k_format="fp8", format_field="upstream")  # unpatched: only the fp4 flag, off
    rc = main(
        [
            "--server",
            srv.url,
            "--out",
            str(tmp_path),
            "--quick",
            "--depths",
            "50",
            "--progress",
            "off",
            "--repeats",
            "1",
            "--concurrency",
            "0",
            "--no-plots",
        ]
    )
    assert rc == 0
    recs = [r for r in judged(tmp_path) if r["arm"] == "server" and r["state"] in MEASURED]
    assert {r["scenario"] for r in recs} == {
        "sweep",
        "ruler_single",
        "ruler_multikey",
        "ruler_multivalue",
        "multiturn_secret",
        "multiturn_tools",
        "config_recall",
        "shared_prefix",
    }
    assert all(r["passed"] for r in recs)  # a model that sees everything answers every scenario
    assert any(e["tools"] for e in chats(srv))  # the tool scenario sends its tool definitions
    env = json.loads((tmp_path / "environment.json").read_text())
    assert env["arms"]["server"]["index_k_format"] == "fp8"
    assert "dsv4_index_k_format" not in env["arms"]["server"]["server_info"]
    report = (tmp_path / "report.md").read_text()
    assert "inferred: enable_deepseek_v4_fp4_indexer is off on a server without the series" in report
    assert "## Environment" in report
    assert "| config_recall | 12,000 |" in report  # the ~12K config file was recalled
    header = next(csv.reader((tmp_path / "summary.csv").read_text().splitlines()))
    assert {"pass_rate", "prompt_tokens", "ttft_mean_s", "answers_agree"} <= set(header)


def test_heatmaps_per_scenario_and_server(tmp_path: Path, fake_server: StartFake) -> None:
    srv, base = fake_server(), fake_server(index_k_format="fp8", recall_last=2500)
    args = sweep_args([1024, 4000], (0, 100))
    rc = main(
        ["--server", srv.url, "--baseline", base.url, "--out", str(tmp_path), "--progress", "off", *args]
    )
    assert rc == 0
    heat = sorted(p.name for p in (tmp_path / "heatmaps").iterdir())
    assert heat == ["sweep__baseline.png", "sweep__delta.png", "sweep__server.png"]
    assert all((tmp_path / "heatmaps" / h).read_bytes()[:4] == b"\x89PNG" for h in heat)
    report = (tmp_path / "report.md").read_text()
    assert "![sweep server (bf16)](heatmaps/sweep__server.png)" in report and "## A/B" in report
    env = json.loads((tmp_path / "environment.json").read_text())
    assert env["arms"]["server"]["server_info"]["deepseek_v4_indexer_k_dtype"] == "bf16"
    assert env["arms"]["baseline"]["index_k_format"] == "fp8"
