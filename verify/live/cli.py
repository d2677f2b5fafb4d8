"""Command line: `python -m verify.live --server URL [--baseline URL] --out DIR ...`.

Exit codes (gate.py):
  0  PASS        every gate request measured (or skipped for a stated reason) and passed
  1  FAIL        a gate request was measured and answered wrong (a control, or a length up to the target)
  2  setup error the run could not start: server down, wrong model, another index-K format than
                 --expect-format, a target beyond the server's context or the plan, a results
                 directory of other settings or another server. Nothing was measured.
  3  INCOMPLETE  neither: gate requests unmeasured, errored, truncated or unchecked, a gate of
                 controls alone, a start-up request still rate-limited after its retries, or the run
                 stopped early. The report names what is missing and the command that completes it.
  130 / 143      interrupted (Ctrl-C / SIGTERM); the report says what was measured until then.
Every exit writes the outcome to run.json and replaces report.md, so no earlier report survives a
run that did not start. Results measured before any failure are on disk, and rerunning the same
command resumes (against the same server only).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import shlex
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import openai

from verify.live import HARNESS_VERSION
from verify.live.config import RunConfig
from verify.live.corpus import CORPUS_VERSION
from verify.live.gate import SETUP_ERROR_EXIT, VERDICT_EXIT, Evaluation, evaluate, outcome
from verify.live.grid import NUDGE_MODES, GridOptions
from verify.live.probe import INDEX_K_FORMATS, SetupError, StartupIncomplete
from verify.live.report import STATUS_TEXT, arm_labels, render_report, render_setup_report
from verify.live.runner import RunResult, run
from verify.live.scenarios import SCENARIOS
from verify.live.store import REQUESTS_FILE, ResultStore, write_run_outcome
from verify.live.summary import write_ab_csv, write_states_csv, write_summary_csv

INTERRUPT_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}

EXAMPLES = """examples:
  # the patched server alone, default grid up to 64K, gate at the longest length it holds
  python -m verify.live --server http://127.0.0.1:30000 --out verify/results/live/bf16
  # A/B against an fp8 (unpatched) server on identical prompts, gate at 32K
  python -m verify.live --server http://gpu1:30000 --baseline http://gpu2:30000 \\
      --target-length 32768 --out verify/results/live/ab
  # five-minute smoke run, refused unless the server reports bf16 index keys
  python -m verify.live --server http://127.0.0.1:30000 --quick --expect-format bf16 --out /tmp/quick
"""


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e
    if any(not 0 <= v <= 100 for v in vals):
        raise argparse.ArgumentTypeError("depths are percentages between 0 and 100")
    return vals


def _names(allowed: Sequence[str]):
    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [v for v in vals if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return vals

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m verify.live",
        description="Live-server long-context recall check for DeepSeek-V4 on SGLang (bf16 index keys).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("servers")
    g.add_argument("--server", required=True, help="URL of the server under test (http://host:port)")
    g.add_argument("--baseline", help="URL of a reference server; every prompt goes to both")
    g.add_argument("--model", help="served model name (default: the server's first model)")
    g.add_argument("--baseline-model", help="served model name on the baseline (default: same as --model)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "EMPTY"),
        help="bearer token, if the server wants one",
    )
    g.add_argument(
        "--expect-format",
        choices=INDEX_K_FORMATS,
        help="the server's index-K format must be this (setup error otherwise, or if it reports none)",
    )
    g.add_argument("--baseline-expect-format", choices=INDEX_K_FORMATS, help="the same for the baseline")
    g = p.add_argument_group("plan")
    g.add_argument(
        "--out",
        type=Path,
        default=Path("build/verify/live"),
        help="results directory (resumable against the same servers and settings; default build/verify/live)",
    )
    g.add_argument(
        "--restart",
        action="store_true",
        help="move the records in --out aside (replaced-<time>/) and start afresh",
    )
    g.add_argument(
        "--accept-relaunch",
        action="store_true",
        help="resume records of a server with the same URL, model path, version and args from an earlier "
        "launch (the report says so beside the verdict)",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help="small grid (minutes), sweep up to 8,000 tokens, config recall to 12,000",
    )
    g.add_argument(
        "--max-length",
        type=int,
        help="longest prompt to try; added to the sweep (default 65,536; quick 12,000)",
    )
    g.add_argument(
        "--target-length",
        type=int,
        help="gate: every depth must pass up to this length, which is added to the plan (default: the "
        "longest planned length the server holds)",
    )
    g.add_argument(
        "--scenarios",
        type=_names(SCENARIOS),
        default=SCENARIOS,
        help=f"comma list from {','.join(SCENARIOS)}",
    )
    g.add_argument("--lengths", type=_ints, help="nominal lengths for every scenario (overrides the grid)")
    g.add_argument("--depths", type=_floats, help="needle depths in percent (overrides the grid)")
    g.add_argument(
        "--nudge",
        type=_names(NUDGE_MODES),
        help="length nudges: residues (mod 4), pages (256-token boundaries), quick, none",
    )
    g.add_argument("--repeats", type=int, default=None, help="requests per cell (default 3; quick 2)")
    g.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="in-flight requests of the concurrency pass (0: skip the pass)",
    )
    g.add_argument(
        "--no-shared-prefix", action="store_true", help="skip the shared-prefix (radix cache) pass"
    )
    g.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="cells in flight in the other passes (default 1: clean timings)",
    )
    g = p.add_argument_group("requests")
    g.add_argument("--seed", type=int, default=1234, help="haystack and sampling seed")
    g.add_argument(
        "--thinking", action="store_true", help="turn thinking on (chat_template_kwargs); default off"
    )
    g.add_argument(
        "--max-tokens", type=int, help="completion budget for every request (default per scenario)"
    )
    g.add_argument("--no-stream", action="store_true", help="non-streaming requests (no time to first token)")
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per request (default: 30 s + 2 ms per prompt token + 0.1 s per completion token)",
    )
    g.add_argument(
        "--retries",
        type=int,
        default=4,
        help="retries of a transient fault (429, 408, 5xx, timeout, connection reset) per request; "
        "a timeout is retried once at most (default 4)",
    )
    g.add_argument(
        "--retry-wait", type=float, default=2.0, help="seconds before the first retry; doubles per retry"
    )
    g.add_argument(
        "--retry-max-wait",
        type=float,
        default=60.0,
        help="longest wait before a retry; a longer Retry-After ends the retries (default 60)",
    )
    g.add_argument(
        "--max-consecutive-errors", type=int, default=5, help="stop after this many failures in a row"
    )
    g.add_argument(
        "--token-tolerance",
        type=int,
        default=0,
        help="prompt tokens the server may read fewer than were sent before a prompt is truncated "
        "(default 0: any shortfall; re-judges stored results on a rerun)",
    )
    g.add_argument(
        "--accept-calibrated",
        action="store_true",
        help="without a tokenize endpoint, score the calibrated sizes although truncation cannot be "
        "checked (default: such answers are unchecked); the report says so beside the verdict",
    )
    g = p.add_argument_group("output")
    g.add_argument(
        "--save-prompts", action="store_true", help="write every prompt to DIR/prompts/<sha256>.json"
    )
    g.add_argument("--no-plots", action="store_true", help="skip the heatmap PNGs")
    g.add_argument("--progress", choices=("auto", "on", "off"), default="auto", help="progress bar on stderr")
    return p


def config_from_args(args: argparse.Namespace) -> RunConfig:
    grid = GridOptions(
        quick=args.quick,
        scenarios=tuple(args.scenarios),
        lengths=args.lengths,
        depths=args.depths,
        max_length=args.max_length,
        nudge=args.nudge,
    )
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    return RunConfig(
        out_dir=args.out,
        server_url=args.server,
        baseline_url=args.baseline,
        model=args.model,
        baseline_model=args.baseline_model,
        api_key=args.api_key,
        grid=grid,
        target_length=args.target_length,
        seed=args.seed,
        thinking=args.thinking,
        max_tokens=args.max_tokens,
        stream=not args.no_stream,
        repeats=max(1, repeats),
        concurrency=max(0, args.concurrency),
        shared_prefix=not args.no_shared_prefix,
        parallel=max(1, args.parallel),
        timeout_s=args.timeout,
        retry_wait_s=max(0.0, args.retry_wait),
        retry_max_wait_s=max(0.0, args.retry_max_wait),
        retries=max(0, args.retries),
        max_consecutive_errors=max(1, args.max_consecutive_errors),
        token_tolerance=max(0, args.token_tolerance),
        accept_calibrated=args.accept_calibrated,
        expect_format=args.expect_format,
        baseline_expect_format=args.baseline_expect_format,
        restart=args.restart,
        accept_relaunch=args.accept_relaunch,
        save_prompts=args.save_prompts,
        plots=not args.no_plots,
        progress=args.progress,
    )


def write_outputs(
    cfg: RunConfig, result: RunResult, command: str, exit_code: int | None = None
) -> Evaluation:
    """CSV, heatmaps, report and the outcome in run.json, from what is on disk (also after an early stop)."""
    assert result.target is not None, "outputs are written once the plan is made"
    store = ResultStore(cfg.out_dir)
    store.close()
    ev = evaluate(result.planned, store.latest, result.target, result.aborted, result.judging)
    write_summary_csv(cfg.out_dir / "summary.csv", ev.cells)
    write_states_csv(cfg.out_dir / "states.csv", ev.records)
    if ev.ab:
        write_ab_csv(cfg.out_dir / "ab_deltas.csv", ev.ab)
    images = []
    if cfg.plots and ev.cells:
        from verify.live.plots import heatmaps

        images = heatmaps(ev.cells, cfg.out_dir / "heatmaps", arm_labels(result.profiles))
    env_extra = {
        "openai": openai.__version__,
        "python": platform.python_version(),
        "harness_version": HARNESS_VERSION,
        "corpus_version": CORPUS_VERSION,
    }
    text = render_report(cfg, ev, result.profiles, result.counter_description, images, env_extra, command)
    (cfg.out_dir / "report.md").write_text(text, encoding="utf-8")
    write_run_outcome(cfg.out_dir, outcome(ev, command, exit_code))
    return ev


def write_failed_start(cfg: RunConfig, verdict: str, exit_code: int, message: str, command: str) -> None:
    """A run that never got to measure still leaves its outcome: run.json and a report.md that
    replaces any earlier one (which would read as this run's result)."""
    try:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        path = cfg.out_dir / REQUESTS_FILE
        n_records = sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0
        report = render_setup_report(verdict, message, command, n_records)
        (cfg.out_dir / "report.md").write_text(report, encoding="utf-8")
        write_run_outcome(
            cfg.out_dir,
            {
                "verdict": verdict,
                "exit_code": exit_code,
                "error": message,
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "complete_with": command if verdict == "INCOMPLETE" else None,
            },
        )
    except OSError as e:
        print(f"verify.live: could not write the outcome to {cfg.out_dir}: {e}", file=sys.stderr)


async def run_until_sigterm(cfg: RunConfig, result: RunResult) -> bool:
    """run(), cancelled on SIGTERM the way asyncio cancels it on Ctrl-C (a handler raising inside
    the loop would leave requests that never finish). True: it ran to the end."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = False

    def stop() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        await run(cfg, result)
    except asyncio.CancelledError:
        if not terminated:
            raise  # Ctrl-C: asyncio turns it into KeyboardInterrupt
        return False
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    return True


def interrupted(cfg: RunConfig, result: RunResult, command: str, sig: signal.Signals) -> int:
    """Report what was measured until the signal (an INCOMPLETE run), with the signal's exit code."""
    code = INTERRUPT_EXIT[sig]
    why = f"interrupted by {sig.name}; rerun the same command to resume"
    if result.target is None:
        write_failed_start(cfg, "INCOMPLETE", code, f"{why} (before the plan was made)", command)
    else:
        result.aborted = why
        write_outputs(cfg, result, command, exit_code=code)
    print(
        f"verify.live: {why}; results so far are in {cfg.out_dir / REQUESTS_FILE}, the report in "
        f"{cfg.out_dir / 'report.md'}",
        file=sys.stderr,
    )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    cfg = config_from_args(args)
    # What completes an incomplete run: the same command (it resumes).
    command = "python -m verify.live " + shlex.join(args_list)
    result = RunResult(judging=cfg.judging())
    try:
        if cfg.plots and importlib.util.find_spec("matplotlib") is None:
            raise SetupError(
                "matplotlib is not installed, and the heatmaps need it: pip install '.[live]' (the live "
                "tier's extra), or pass --no-plots"
            )
        finished = asyncio.run(run_until_sigterm(cfg, result))
    except SetupError as e:
        print(f"verify.live: error: {e}", file=sys.stderr)
        write_failed_start(cfg, "SETUP ERROR", SETUP_ERROR_EXIT, str(e), command)
        return SETUP_ERROR_EXIT
    except StartupIncomplete as e:
        print(f"verify.live: could not start: {e}; rerun the same command: {command}", file=sys.stderr)
        write_failed_start(cfg, "INCOMPLETE", VERDICT_EXIT["INCOMPLETE"], str(e), command)
        return VERDICT_EXIT["INCOMPLETE"]
    except KeyboardInterrupt:
        return interrupted(cfg, result, command, signal.SIGINT)
    if not finished:
        return interrupted(cfg, result, command, signal.SIGTERM)
    ev = write_outputs(cfg, result, command)
    for c in ev.checks:
        print(
            f"[{STATUS_TEXT[c.status].strip('*'):<10}] {'gate' if c.gate else 'info'}: {c.name}: {c.detail}",
            file=sys.stderr,
        )
    counts = ", ".join(f"{n} {s}" for s, n in ev.states.get("server", {}).items() if n)
    print(f"verify.live: server requests: {counts}", file=sys.stderr)
    print(f"verify.live: report written to {cfg.out_dir / 'report.md'}", file=sys.stderr)
    if result.aborted:
        print(f"verify.live: run stopped early: {result.aborted}", file=sys.stderr)
    for m in ev.missing:
        print(f"verify.live: missing: {m.count} {m.label}: {m.remedy}", file=sys.stderr)
    for b in ev.blockers:
        print(f"verify.live: not a pass: {b}", file=sys.stderr)
    for q in ev.qualifiers:
        print(f"verify.live: qualified: {q}", file=sys.stderr)
    print(f"verify.live: gate {ev.verdict} (exit {ev.exit_code})", file=sys.stderr)
    if ev.verdict == "INCOMPLETE":
        print(f"verify.live: to complete it, rerun: {command}", file=sys.stderr)
    return ev.exit_code
