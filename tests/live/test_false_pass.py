"""Issue 27: no PASS without a measurement of this server, at this target, on whole prompts.

Each test reproduces one way the live tier used to exit 0 for a server that was never shown to
recall: a results folder resumed against another server, a target beyond the plan, and prompts
cut by a few tokens scored as recall. Every run is the real CLI against the loopback fake, and
the harness's record of each request is checked against the fake's own log of what it read.
"""

from __future__ import annotations

from pathlib import Path

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

ARGS = sweep_args([1024, 3000, 6000], (0, 50, 100))

# --- 1. a folder reused against another server ---------------------------------------------------


def test_a_folder_of_another_server_is_refused_never_resumed(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    good = fake_server()
    assert run_cli(tmp_path, good, *ARGS) == 0
    # Another host, same model and format, that loses every needle past 4,500 tokens.
    lossy = fake_server(recall_last=4500)
    assert run_cli(tmp_path, lossy, *ARGS) == 2
    err = capsys.readouterr().err
    assert "holds results of another server, and they are never reported as this one's" in err
    assert f"server.url: '{good.url}' before, '{lossy.url}' now" in err
    assert chats(lossy) == []  # only the start-up probe reached it
    # No report of the first server's PASS is left standing for the second one.
    assert outcome(tmp_path)["verdict"] == "SETUP ERROR" and outcome(tmp_path)["exit_code"] == 2
    report = (tmp_path / "report.md").read_text()
    assert (
        report.startswith("# verify_recall, live tier: SETUP ERROR") and "holds results of another" in report
    )

    # --restart sets the records aside and measures this server afresh: it fails at 6,000.
    assert run_cli(tmp_path, lossy, *ARGS, "--restart") == 1
    assert len(chats(lossy)) == 9 and {r["url"] for r in records(tmp_path)} == {lossy.url}
    assert {r["base_length"] for r in judged(tmp_path) if r["state"] == "fail"} == {6000}
    (moved,) = tmp_path.glob("replaced-*/requests.jsonl")
    assert {r["url"] for r in records(moved.parent)} == {good.url}  # set aside, not deleted


def test_the_same_url_with_other_server_args_is_another_server(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server()
    assert run_cli(tmp_path, srv, *ARGS) == 0
    # Relaunched at the same URL with another setting (or a tunnel now points at another host).
    other = relaunch(fake_server, srv, server_args={"chunked_prefill_size": 2048})
    assert run_cli(tmp_path, other, *ARGS, "--accept-relaunch") == 2
    err = capsys.readouterr().err
    assert "server.server_args_digest:" in err and chats(other) == []
    assert "server server arg chunked_prefill_size: None before, 2048 now" in err  # which one differs
    moved = relaunch(fake_server, other, model_path="/models/another-checkpoint")
    assert run_cli(tmp_path, moved, *ARGS) == 2
    err = capsys.readouterr().err
    assert "server.model_path: '/models/fake-dsv4' before, '/models/another-checkpoint' now" in err


def test_a_relaunch_of_the_same_settings_resumes_only_when_accepted(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server()
    assert run_cli(tmp_path, srv, *sweep_args([1024, 3000], (50,))) == 0
    again = relaunch(fake_server, srv)  # identical settings: only its launch record differs
    args = sweep_args([1024, 3000, 4000], (50,))
    assert run_cli(tmp_path, again, *args) == 2
    assert "pass --accept-relaunch to resume" in capsys.readouterr().err
    assert run_cli(tmp_path, again, *args, "--accept-relaunch") == 0
    assert [e["prompt_tokens"] for e in chats(again)] == [4000]  # only the new length
    # Once accepted, the folder holds both launches: a plain rerun resumes, still qualified.
    assert run_cli(tmp_path, again, *args) == 0
    report = (tmp_path / "report.md").read_text()
    assert "# verify_recall, live tier: PASS (qualified)" in report
    assert "the server's records span 2 launches of the server" in report


# --- 2. a target beyond the plan -----------------------------------------------------------------


def test_a_target_beyond_the_quick_plan_is_planned_and_measured(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(recall_last=10000)  # fails past 10,000 tokens
    quick = ["--quick", "--scenarios", "sweep", "--depths", "0,100", "--repeats", "1", "--concurrency", "0"]
    rc = main(["--server", srv.url, "--out", str(tmp_path), *FAST, *quick, "--target-length", "20000"])
    assert rc == 1 and outcome(tmp_path)["target_length"] == 20000
    assert max(e["prompt_tokens"] for e in chats(srv)) >= 20000  # the target itself was sent
    failed = {r["base_length"] for r in judged(tmp_path) if r["state"] == "fail"}
    assert failed == {20000}
    report = (tmp_path / "report.md").read_text()
    assert "- Lengths, sweep: 1,024, 2,048, 4,509, 8,000, 20,000" in report


def test_a_target_the_plan_cannot_reach_is_a_setup_error(
    tmp_path: Path, fake_server: StartFake, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = fake_server()
    assert run_cli(tmp_path, srv, *sweep_args([1024, 4000]), "--target-length", "8000") == 2
    assert "--target-length 8000 is not a planned length of sweep (1024, 4000)" in capsys.readouterr().err
    quick = ["--quick", "--scenarios", "sweep", "--max-length", "12000"]
    assert main(["--server", srv.url, "--out", str(tmp_path), *FAST, *quick, "--target-length", "20000"]) == 2
    assert "not a planned length" in capsys.readouterr().err
    # A target of controls alone tests no index key: refused before anything is sent.
    assert run_cli(tmp_path, srv, *sweep_args([1024, 2048, 4000]), "--target-length", "2048") == 2
    assert "only controls, where DeepSeek-V4's indexer selects every key" in capsys.readouterr().err
    assert run_cli(tmp_path, srv, *sweep_args([1024, 2048])) == 2
    assert chats(srv) == []


# --- 3. small truncation scored as recall --------------------------------------------------------


def test_a_few_tokens_cut_from_the_front_are_truncation(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(truncate_front=30, truncate_over=2100)
    assert run_cli(tmp_path, srv, *ARGS) == 3
    assert server_states(tmp_path) == {"pass": 3, "truncated": 6}
    by_sent = {e["sent_tokens"]: e["prompt_tokens"] for e in chats(srv)}
    for r in judged(tmp_path):
        # The harness's count of what it sent is the server's; what it read is the server's too.
        assert by_sent[r["measured_tokens"]] == r["prompt_tokens"]
        assert (r["state"] == "truncated") == (r["measured_tokens"] - r["prompt_tokens"] == 30)
    report = (tmp_path / "report.md").read_text()
    assert (
        "> **INCOMPLETE**" in report
        and "the server read 2970 prompt tokens of the 3000 sent (30 missing)" in report
    )


def test_tokens_cut_from_the_middle_are_not_scored_as_recall(tmp_path: Path, fake_server: StartFake) -> None:
    srv = fake_server(truncate_middle=40, truncate_over=2100)  # a perfect model, prompts cut mid-way
    assert run_cli(tmp_path, srv, *ARGS) == 3  # not FAIL: the needle was cut, not missed
    long = [r for r in judged(tmp_path) if r["base_length"] > 2048]
    assert {r["state"] for r in long} == {"truncated"}
    # The cut took a needle with it: that answer is wrong, and still not counted as a recall failure.
    assert any(not r["ok"] and r["depth_pct"] == 50 for r in long)
    assert server_states(tmp_path) == {"pass": 3, "truncated": 6}


def test_calibrated_sizing_cannot_check_truncation_and_says_so(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(tokenize=False, truncate_front=30, truncate_over=2100)
    assert run_cli(tmp_path, srv, *ARGS) == 3
    assert server_states(tmp_path) == {"unchecked": 9}
    report = (tmp_path / "report.md").read_text()
    assert "| **INCOMPLETE** | not checkable here: sizes are calibrated" in report
    assert "9 unchecked (calibrated)" in report
    # Accepting calibrated sizing is the user's explicit choice: the 30 missing tokens are then
    # invisible (this PASS is on cut prompts), which is exactly what the verdict line says beside it.
    sent = len(chats(srv))
    assert run_cli(tmp_path, srv, *ARGS, "--accept-calibrated") == 0
    assert len(chats(srv)) == sent  # judged again from what is stored, nothing re-sent
    assert any("calibrated sizing accepted" in q for q in outcome(tmp_path)["qualifiers"])
    first = (tmp_path / "report.md").read_text().splitlines()
    assert first[0] == "# verify_recall, live tier: PASS (qualified)"
    assert first[2].startswith("> **PASS, qualified:** calibrated sizing accepted (--accept-calibrated)")


def test_a_rerun_with_another_tolerance_rejudges_what_is_stored(
    tmp_path: Path, fake_server: StartFake
) -> None:
    srv = fake_server(truncate_front=30, truncate_over=2100)
    assert run_cli(tmp_path, srv, *ARGS, "--token-tolerance", "40") == 0
    assert outcome(tmp_path)["judging"]["token_tolerance"] == 40
    sent = len(chats(srv))
    assert run_cli(tmp_path, srv, *ARGS, "--token-tolerance", "0") == 3
    assert server_states(tmp_path) == {"pass": 3, "truncated": 6}
    assert len(chats(srv)) == sent + 6  # the requests now judged truncated are asked again
    assert outcome(tmp_path)["judging"]["token_tolerance"] == 0
    assert (
        "Judged with: truncation: a shortfall of more than 0 prompt tokens"
        in (tmp_path / "report.md").read_text()
    )
