"""Run the plan against one or two servers, writing each result the moment it arrives.

Passes, in order:
  base           every cell once (sequential by default, so timings are clean)
  repeat         every cell again, repeats-1 times: answers at temperature 0 must agree
  shared_prefix  one haystack, five questions in a row: the radix cache serves the prefix
  concurrency    sweep cells with unique prefixes, N in flight (corruption under load)

With a baseline, each prompt is built once and sent to both servers at the same time, so the two
arms always see byte-identical prompts.

Each request appends what was observed (store.py), never a verdict: whether a stored request is
done, and what the report says of it, is judged under the current settings (states.judge_record).
Before anything is sent, the out directory must belong to these servers and settings (identity,
store.check_resume), and each server must report the index-K format it is expected to have.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from verify.live import HARNESS_VERSION
from verify.live.client import ArmClient, ChatResult, RequestFailure, Sampling
from verify.live.config import BASELINE, SERVER, RunConfig
from verify.live.corpus import CORPUS_VERSION, stable_seed
from verify.live.fit import Fit, FitCache, FitError, Knobs, fit_layout
from verify.live.gate import TargetPlan, resolve_target
from verify.live.grid import CONTROL_MAX, GridOptions, base_cells, concurrency_cells, is_control
from verify.live.layouts import Rendered
from verify.live.probe import (
    ServerProfile,
    SetupError,
    check_format,
    make_counter,
    profile_server,
    same_format_warning,
)
from verify.live.retry import RetryPolicy, with_retries
from verify.live.scenarios import SHARED_PREFIX_DEPTHS, Cell, PromptSpec, build, max_tokens_for
from verify.live.scoring import score_answer
from verify.live.states import (
    ANSWER,
    ERROR,
    FAULT,
    SKIP,
    TRANSIENT_KINDS,
    TRUNCATED,
    UNCHECKED,
    Judging,
    is_done,
    judge_record,
    remedy,
)
from verify.live.store import ResultStore, check_resume, record_key, set_aside, write_run_file
from verify.live.tokens import PromptSize, TokenCounter, rendered_chars, size_of

# The default per-request timeout grows with the work asked for (a flat 600 s made every hang cost
# ten minutes): 30 s, plus 2 ms per prompt token (500 tokens/s of prefill, queueing included),
# plus 0.1 s per completion token. 1K tokens: ~38 s; 64K: ~167 s; thinking (4096 tokens) adds ~7 min.
TIMEOUT_BASE_S = 30.0
TIMEOUT_PER_PROMPT_TOKEN_S = 0.002
TIMEOUT_PER_OUTPUT_TOKEN_S = 0.1
CALIBRATED_CONTROL_AIM = 0.03  # calibrated sizing aims controls this far below their target
SIDE_TIMEOUT_S = 60.0  # tokenize, server info and 1-token probes, unless --timeout is given


def request_timeout(cfg: RunConfig, prompt_tokens: int, max_tokens: int) -> float:
    if cfg.timeout_s is not None:
        return cfg.timeout_s
    return (
        TIMEOUT_BASE_S + TIMEOUT_PER_PROMPT_TOKEN_S * prompt_tokens + TIMEOUT_PER_OUTPUT_TOKEN_S * max_tokens
    )


PASSES = ("base", "repeat", "shared_prefix", "concurrency")


class RunAborted(Exception):
    """The run stopped early; everything measured so far is on disk."""


@dataclass(frozen=True)
class WorkItem:
    pass_name: str
    cell: Cell
    repeat: int
    nonce: str


@dataclass
class Arm:
    name: str
    client: ArmClient
    profile: ServerProfile
    too_long_from: int | None = None  # smallest length this server refused as too long
    consecutive_errors: int = 0


@dataclass
class RunState:
    """Everything the run needs, passed to each step (nothing global)."""

    cfg: RunConfig
    arms: list[Arm]
    counter: TokenCounter
    sampling: Sampling
    store: ResultStore
    fits: FitCache
    bar: Any  # tqdm
    policy: RetryPolicy
    judging: Judging
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    abort_reason: str = ""
    warned: set[str] = field(default_factory=set)
    prior_knobs: dict[str, Knobs] = field(default_factory=dict)  # fit key -> knobs of measured cells


@dataclass
class RunResult:
    """Filled in as the run gets that far, so an interrupted run still reports what it planned."""

    judging: Judging
    profiles: dict[str, ServerProfile] = field(default_factory=dict)
    counter_description: str = ""
    planned: list[dict[str, Any]] = field(default_factory=list)  # one cell record per planned request
    aborted: str | None = None
    target: TargetPlan | None = None  # None until the plan is made
    fingerprint: dict[str, Any] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _warn(state: RunState, tag: str, message: str) -> None:
    """Print a problem once per tag, above the progress bar."""
    if tag in state.warned:
        return
    state.warned.add(tag)
    tqdm.write(message, file=sys.stderr)


def plan_items(cfg: RunConfig, grid: GridOptions) -> list[WorkItem]:
    cells = base_cells(grid)
    base_nonce = f"s{cfg.seed}"
    items: list[WorkItem] = []
    regular = [c for c in cells if c.scenario != "shared_prefix"]
    items += [WorkItem("base", c, 0, base_nonce) for c in regular]
    for r in range(1, max(1, cfg.repeats)):
        items += [WorkItem("repeat", c, r, base_nonce) for c in regular]
    if cfg.shared_prefix:
        items += [WorkItem("shared_prefix", c, 0, base_nonce) for c in cells if c.scenario == "shared_prefix"]
    if cfg.concurrency > 0:
        for c in concurrency_cells(regular, grid):
            # A distinct session line per request: no prefix is shared, so every request is a full prefill.
            nonce = f"c{stable_seed(cfg.seed, 'concurrency', c.cell_id) % 10**8:08d}"
            items.append(WorkItem("concurrency", c, 0, nonce))
    return items


def item_key(arm: str, item: WorkItem) -> str:
    return record_key(arm, item.pass_name, item.cell.scenario, item.cell.cell_id, item.repeat)


def fit_key(item: WorkItem) -> str:
    """Requests with one fit key get the byte-identical prompt (repeats, a shared-prefix group)."""
    return f"{item.nonce}|{item.cell.fit_group}"


def layout_family(cell: Cell) -> str:
    """What a calibrated token count is specific to: the scenario's layout and its variant's text."""
    return f"{cell.scenario}/{cell.variant}"


def planned_record(arm: str, item: WorkItem, seed: int) -> dict[str, Any]:
    """The cell fields of one planned request: every record starts from these, and a request
    that never ran is reported from them as 'unmeasured'."""
    c = item.cell
    return {
        "key": item_key(arm, item),
        "arm": arm,
        "pass": item.pass_name,
        "scenario": c.scenario,
        "variant": c.variant,
        "cell_id": c.cell_id,
        "base_length": c.base_length,
        "target_tokens": c.target_tokens,
        "depth_pct": c.depth_pct,
        "extra": c.extra,
        "repeat": item.repeat,
        "nonce": item.nonce,
        "seed": seed,
        "control": is_control(c.base_length, None),
    }


async def setup_arms(cfg: RunConfig, policy: RetryPolicy) -> list[Arm]:
    arms: list[Arm] = []
    side_timeout = cfg.timeout_s if cfg.timeout_s is not None else SIDE_TIMEOUT_S
    expected = {
        SERVER: (cfg.expect_format, "--expect-format"),
        BASELINE: (cfg.baseline_expect_format, "--baseline-expect-format"),
    }
    for name, url, model in cfg.arms():
        client = ArmClient(name, url, cfg.api_key, side_timeout)
        try:
            if name == BASELINE and model is None and arms:
                # Same served name as the server arm when the baseline serves it too.
                probe = await profile_server(client, None, policy)
                wanted = arms[0].profile.model
                if wanted in [str(m.get("id")) for m in probe.models]:
                    probe = await profile_server(client, wanted, policy)
                else:
                    probe.notes.append(f"baseline does not serve {wanted!r}; using its {probe.model!r}")
                profile = probe
            else:
                profile = await profile_server(client, model, policy)
            check_format(profile, *expected[name])
        except BaseException:
            await client.aclose()
            for a in arms:
                await a.client.aclose()
            raise
        arms.append(Arm(name, client, profile))
    return arms


def fingerprint(cfg: RunConfig, arms: Sequence[Arm], counter: TokenCounter) -> dict[str, Any]:
    return {
        "harness_version": HARNESS_VERSION,
        "corpus_version": CORPUS_VERSION,
        "seed": cfg.seed,
        "thinking": cfg.thinking,
        "max_tokens": cfg.max_tokens,
        "stream": cfg.stream,
        "arms": {
            # The args themselves too, so a refused resume can name the ones that differ.
            a.name: a.profile.identity()
            | {
                "tokenizer": counter.mode if a.name == SERVER else None,
                "server_args": a.profile.server_args(),
            }
            for a in arms
        },
    }


def limit_for(arm: Arm, cell: Cell, cfg: RunConfig) -> tuple[int | None, str]:
    mt = max_tokens_for(cell.scenario, cfg.thinking, cfg.max_tokens)
    limit = arm.profile.max_prompt_tokens(mt)
    why = (
        f"the {arm.client.label} accepts at most {limit} prompt tokens with max_tokens={mt} "
        f"(max_model_len {arm.profile.max_model_len}, max_req_input_len {arm.profile.max_req_input_len})"
    )
    return limit, why


def _keep_trying(arm: Arm) -> Callable[[RequestFailure], Awaitable[bool]]:
    """Before retrying a connection failure: is the server there at all? A dead one is not waited on."""

    async def check(e: RequestFailure) -> bool:
        return e.kind != "connection" or await _is_alive(arm)

    return check


async def make_prompt(state: RunState, item: WorkItem, retried: list[str]) -> tuple[PromptSpec, Fit]:
    """The cell's prompt, sized to its target with the server's tokenizer (or calibrated estimate).

    Cells of a shared-prefix group are sized once, on the group's first question, and every other
    question renders the same knobs, so the haystack before the question is byte-identical. A cell
    measured in an earlier run (resume) renders the knobs recorded then, so its repeats stay
    byte-identical even where calibrated sizes have been re-fitted since.
    """
    cell = item.cell
    spec = build(cell, state.cfg.seed, item.nonce)
    key = fit_key(item)
    family = layout_family(cell)
    server = state.arms[0]

    async def count(r: Rendered) -> int:
        return await with_retries(
            state.policy, lambda: state.counter.count(r, family), _keep_trying(server), retried
        )

    grouped = cell.fit_group != f"{cell.scenario}|{cell.cell_id}"
    fit = state.fits.get(key)
    if fit is None:
        canonical = spec
        if grouped:
            first = replace(cell, extra="k0", depth_pct=SHARED_PREFIX_DEPTHS[0])
            canonical = build(first, state.cfg.seed, item.nonce)
        await state.counter.prepare(family, canonical.layout)
        knobs = state.prior_knobs.get(key)
        if knobs is not None:
            rendered = canonical.layout.render(knobs.n_units, knobs.pad_words, knobs.pad_suffix)
            fit = Fit(
                knobs=knobs,
                target=_fit_target(state, cell),
                tokens=await count(rendered),
                rendered=rendered,
                calls=1,
            )
        else:
            fit = await fit_layout(
                canonical.layout,
                count,
                _fit_target(state, cell),
                start_units=state.fits.units_hint(cell.scenario, cell.target_tokens),
            )
        state.fits.put(key, fit, cell.scenario)
    if not grouped:
        return spec, fit
    k = fit.knobs
    rendered = spec.layout.render(k.n_units, k.pad_words, k.pad_suffix)
    return spec, Fit(knobs=k, target=fit.target, tokens=await count(rendered), rendered=rendered, calls=1)


def _fit_target(state: RunState, cell: Cell) -> int:
    """Exact sizing aims at the target itself. Calibrated sizing lands within a few percent either
    side, so a control is aimed 3% low: a "2K" prompt read as 2,090 tokens is past the point where
    the indexer selects every key and would not count as a control (grid.is_control)."""
    if state.counter.exact or cell.base_length > CONTROL_MAX:
        return cell.target_tokens
    return math.floor(cell.target_tokens * (1 - CALIBRATED_CONTROL_AIM))


def _base_record(state: RunState, arm: Arm, item: WorkItem) -> dict[str, Any]:
    return planned_record(arm.name, item, state.cfg.seed) | {
        "time": _now(),
        "url": arm.profile.url,
        "model": arm.profile.model,
        "index_k_format": arm.profile.index_k_format,
        "launch": arm.profile.identity()["launch"],
    }


def _prompt_fields(state: RunState, item: WorkItem, spec: PromptSpec, fit: Fit) -> dict[str, Any]:
    blob = json.dumps({"messages": fit.rendered.messages, "tools": fit.rendered.tools}, sort_keys=True)
    frac = fit.rendered.needle_frac
    return {
        "measured_tokens": fit.tokens,  # what was sent, as the counter counts it
        "aim_tokens": fit.target,  # the cell's target, or a calibrated control's lower aim
        "sizing": "exact" if state.counter.exact else "calibrated",  # can a shortfall be seen at all
        "fit_exact": fit.exact,
        "fit_calls": fit.calls,
        "fit_key": fit_key(item),
        "knobs": [fit.knobs.n_units, fit.knobs.pad_words, fit.knobs.pad_suffix],
        "family": layout_family(item.cell),
        "prompt_chars": rendered_chars(fit.rendered),
        "pad_chars": fit.rendered.pad_chars,
        "needle_frac": round(frac, 5) if frac is not None else None,
        "needle_token_pos": round(frac * fit.tokens) if frac is not None else None,
        "prompt_sha256": hashlib.sha256(blob.encode()).hexdigest(),
        "n_messages": len(fit.rendered.messages),
        "expected": spec.expected,
        "distractors": spec.distractors,
        "meta": spec.meta,
    }


def _error_fields(e: RequestFailure, stage: str, retried: Sequence[str]) -> dict[str, Any]:
    return {
        "observed": FAULT,
        "error_kind": e.kind,
        "error": e.message,
        "stage": stage,  # "sizing" (tokenize / calibration) or "request" (the chat completion)
        "attempts": e.attempts,
        "retried": list(retried),
        "ok": False,
    }


def _result_fields(spec: PromptSpec, fit: Fit, res: ChatResult, pt: int | None) -> dict[str, Any]:
    """What came back, as it came: the state is judged from these later (states.judge_record)."""
    answer = res.answer_text()
    sc = score_answer(answer, spec.expected, spec.distractors)
    decode_s = (res.latency_s - res.ttft_s) if res.ttft_s is not None else None
    tok_s = (
        (res.completion_tokens - 1) / decode_s
        if res.completion_tokens and res.completion_tokens > 1 and decode_s and decode_s > 0
        else None
    )
    return {
        "observed": ANSWER,
        "answer": answer,
        "content": res.content,
        "reasoning": res.reasoning[:4000],
        "tool_calls": res.tool_calls,
        "finish_reason": res.finish_reason,
        "prompt_tokens": pt,
        "completion_tokens": res.completion_tokens,
        "token_delta": (pt - fit.tokens) if pt is not None else None,
        "ttft_s": round(res.ttft_s, 4) if res.ttft_s is not None else None,
        "latency_s": round(res.latency_s, 4),
        "decode_tok_s": round(tok_s, 2) if tok_s else None,
        "score": sc.score,
        "ok": sc.ok,  # the answer holds every expected value (scored or not)
        "first_wrong_char": sc.first_wrong_char,
        "distractor_hit": sc.distractor_hit,
        "response_model": res.response_model,
    }


async def _is_alive(arm: Arm) -> bool:
    try:
        status, _ = await arm.client.get_json("/v1/models")
        return status == 200
    except RequestFailure:
        return False


async def run_arm(
    state: RunState, arm: Arm, item: WorkItem, spec: PromptSpec, fit: Fit, sizing_retried: Sequence[str]
) -> None:
    cfg = state.cfg
    mt = max_tokens_for(item.cell.scenario, cfg.thinking, cfg.max_tokens)
    timeout = request_timeout(cfg, fit.tokens, mt)
    rec = (
        _base_record(state, arm, item)
        | _prompt_fields(state, item, spec, fit)
        | {"timeout_s": round(timeout, 1), "sizing_retried": list(sizing_retried)}
    )

    sent = 0  # requests sent for this cell, retries included
    retried: list[str] = []  # the kind of every fault retried away

    async def ask(sampling: Sampling) -> ChatResult:
        def once() -> Awaitable[ChatResult]:
            nonlocal sent
            sent += 1
            return arm.client.chat(arm.profile.model, fit.rendered, sampling, mt, spec.tool_choice, timeout)

        return await with_retries(state.policy, once, _keep_trying(arm), retried)

    try:
        res = await ask(state.sampling)
    except RequestFailure as e:
        state.store.append(rec | _error_fields(e, "request", retried))
        await _on_failure(state, arm, item, e)
        return
    pt = res.prompt_tokens
    rec["usage_source"] = ("stream" if state.sampling.stream else "response") if pt is not None else None
    if pt is None and state.sampling.stream:
        # No usage in the stream (a proxy may drop it): ask once more without streaming, for the
        # count alone. Without it a truncated prompt would pass as a genuine answer.
        try:
            again = await ask(replace(state.sampling, stream=False))
        except RequestFailure as e:
            # Recorded by kind: a timed-out count request is a timeout, not a server without usage.
            rec |= {"usage_followup_error": e.message, "usage_followup_kind": e.kind}
        else:
            pt = again.prompt_tokens
            rec["usage_source"] = "non_stream_followup" if pt is not None else None
        _warn(
            state,
            f"usage-{arm.name}",
            f"NOTE: the {arm.client.label} streams no usage.prompt_tokens (stream_options.include_usage "
            "dropped by a proxy?); each such request is asked once more without streaming for the count "
            "(--no-stream avoids the second request).",
        )
    rec |= _result_fields(spec, fit, res, pt) | {"attempts": sent, "retried": retried}
    state.store.append(rec)
    arm.consecutive_errors = 0
    judged = judge_record(rec, state.judging)
    if arm.name == SERVER and pt is not None and judged["state"] != TRUNCATED:
        state.counter.observe(rec["family"], size_of(fit.rendered), pt)
    _warn_about(state, arm, item, judged)


def _warn_about(state: RunState, arm: Arm, item: WorkItem, rec: dict[str, Any]) -> None:
    where = f"({item.cell.scenario} {item.cell.cell_id})"
    if rec["state"] == TRUNCATED:
        _warn(
            state,
            f"trunc-{arm.name}",
            f"WARNING: the {arm.client.label} read {rec['prompt_tokens']} prompt tokens of a "
            f"{rec['measured_tokens']}-token prompt {where}: the prompt was truncated (is --allow-auto-truncate "
            "on, or a proxy cutting requests?). Truncated cells are not scored; the gate cannot pass on them.",
        )
    elif rec["state"] in (UNCHECKED, ERROR):
        _warn(
            state,
            f"{rec['state']}-{arm.name}-{rec['kind']}",
            f"WARNING: {rec['reason']} {where}: reported as {rec['state']} '{rec['kind']}', not as a recall result.",
        )
    if "reasoning_with_thinking_off" in rec["faults"] or rec["kind"] == "reasoning_with_thinking_off":
        _warn(
            state,
            f"reasoning-{arm.name}",
            f"WARNING: the {arm.client.label} returned reasoning content with thinking off {where}; it spends "
            "the answer's max_tokens (check chat_template_kwargs / --reasoning-parser). A complete answer is "
            "still scored.",
        )


async def _on_failure(state: RunState, arm: Arm, item: WorkItem, e: RequestFailure) -> None:
    cfg = state.cfg
    if e.kind == "context_too_long":
        n = item.cell.target_tokens
        arm.too_long_from = n if arm.too_long_from is None else min(arm.too_long_from, n)
        _warn(
            state,
            f"ctx-{arm.name}-{n}",
            f"NOTE: the {arm.client.label} refused a {n}-token prompt as longer than its context "
            f"({e.message}); cells of {n} tokens and more are skipped for it, and the default gate target "
            "is lowered below it.",
        )
        return
    if e.kind == "model_not_found":
        _set_abort(state, f"the {arm.client.label} does not serve model {arm.profile.model!r}: {e.message}")
        return
    if e.kind == "connection" and not await _is_alive(arm):
        _set_abort(
            state,
            f"the {arm.client.label} at {arm.profile.url} stopped answering ({e.message}). "
            f"Results measured so far are in {state.store.path}; rerun the same command to resume once it "
            "answers (a relaunched server also needs --accept-relaunch).",
        )
        return
    arm.consecutive_errors += 1
    retry = (
        f"after {e.attempts} attempt(s); retried on resume"
        if e.kind in TRANSIENT_KINDS
        else "not retried in this run"
    )
    _warn(
        state,
        f"err-{arm.name}-{e.kind}",
        f"WARNING: {e.message} ({retry}; recorded as error '{e.kind}', never as a recall failure; "
        "later cells continue)",
    )
    if arm.consecutive_errors >= cfg.max_consecutive_errors:
        _set_abort(
            state,
            f"{arm.consecutive_errors} requests in a row failed on the {arm.client.label} (last: {e.message}). "
            f"Results so far are in {state.store.path}; {remedy(ERROR, e.kind)[1]}.",
        )


def _set_abort(state: RunState, reason: str) -> None:
    if not state.abort.is_set():
        state.abort_reason = reason
        state.abort.set()


def _arm_skip_reason(state: RunState, arm: Arm, cell: Cell) -> str | None:
    limit, why = limit_for(arm, cell, state.cfg)
    if limit is not None and cell.target_tokens > limit:
        _warn(
            state,
            f"limit-{arm.name}-{limit}",
            f"NOTE: {why}; longer cells are skipped (listed in the report).",
        )
        return why
    if arm.too_long_from is not None and cell.target_tokens >= arm.too_long_from:
        return f"the {arm.client.label} refused {arm.too_long_from} tokens as too long earlier in this run"
    return None


def _record_skip(state: RunState, arm: Arm, item: WorkItem, reason: str, kind: str) -> None:
    key = item_key(arm.name, item)
    old = state.store.latest.get(key)
    if old is not None and old.get("observed") == SKIP and old.get("reason") == reason:
        return  # already on disk from an earlier run
    state.store.append(
        _base_record(state, arm, item) | {"observed": SKIP, "skip_kind": kind, "reason": reason, "ok": False}
    )


def _judged(state: RunState, arm: str, item: WorkItem) -> dict[str, Any] | None:
    """The stored record of this request judged under this run's settings (not when it was written)."""
    rec = state.store.latest.get(item_key(arm, item))
    return None if rec is None else judge_record(rec, state.judging)


def _done(state: RunState, arm: str, item: WorkItem) -> bool:
    return is_done(_judged(state, arm, item))


async def process(state: RunState, item: WorkItem) -> None:
    """One planned item on every arm that still needs it; each arm ends with exactly one record."""
    if state.abort.is_set():
        return
    todo: list[Arm] = []
    for arm in state.arms:
        if _done(state, arm.name, item):
            continue
        reason = _arm_skip_reason(state, arm, item.cell)
        if reason is not None:
            _record_skip(state, arm, item, reason, "beyond_context")
            state.bar.update(1)
            continue
        todo.append(arm)
    if not todo:
        return
    sizing_retried: list[str] = []
    try:
        spec, fit = await make_prompt(state, item, sizing_retried)
    except FitError as e:
        for arm in todo:
            _record_skip(state, arm, item, f"cannot build the prompt: {e}", "unbuildable")
            state.bar.update(1)
        return
    except RequestFailure as e:
        # Sizing failed (tokenize or a calibration probe, after the retries): the cell is recorded
        # as an error on every arm that needed it, never dropped, and a rerun retries it.
        for i, arm in enumerate(todo):
            # Sizing ran once for every arm: its retries are counted on the first record only.
            state.store.append(
                _base_record(state, arm, item) | _error_fields(e, "sizing", sizing_retried if i == 0 else [])
            )
            state.bar.update(1)
        await _on_failure(state, state.arms[0], item, e)
        return
    if state.cfg.save_prompts:
        _save_prompt(state.cfg.out_dir, spec, fit)
    await asyncio.gather(
        *(
            run_arm(state, arm, item, spec, fit, sizing_retried if i == 0 else [])
            for i, arm in enumerate(todo)
        )
    )
    state.bar.update(len(todo))
    ok = sum(1 for a in todo if (_judged(state, a.name, item) or {}).get("passed"))
    state.bar.set_postfix_str(
        f"{item.pass_name} {item.cell.scenario} L{item.cell.target_tokens} ok {ok}/{len(todo)}"
    )


def _save_prompt(out_dir: Path, spec: PromptSpec, fit: Fit) -> None:
    blob = json.dumps({"messages": fit.rendered.messages, "tools": fit.rendered.tools}, sort_keys=True)
    sha = hashlib.sha256(blob.encode()).hexdigest()
    path = out_dir / "prompts" / f"{sha}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"expected": spec.expected, **json.loads(blob)}, indent=1))


async def run_pass(state: RunState, items: Sequence[WorkItem], workers: int) -> None:
    queue: asyncio.Queue[WorkItem] = asyncio.Queue()
    for it in items:
        queue.put_nowait(it)

    async def worker() -> None:
        while not state.abort.is_set():
            try:
                it = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await process(state, it)

    await asyncio.gather(*(worker() for _ in range(max(1, workers))))


def _todo_count(state: RunState, items: Sequence[WorkItem]) -> int:
    return sum(1 for it in items for a in state.arms if not _done(state, a.name, it))


def _learn_from_earlier_runs(store: ResultStore, counter: TokenCounter, judging: Judging) -> dict[str, Knobs]:
    """Knobs of every prompt that is done (resume renders them again), and the server's counts of
    them (a calibrated counter re-fits from those too)."""
    knobs: dict[str, Knobs] = {}
    for raw in store.latest.values():
        rec = judge_record(raw, judging)
        if not is_done(rec) or not rec.get("knobs") or not rec.get("fit_key"):
            continue
        n_units, pad_words, pad_suffix = rec["knobs"]
        knobs.setdefault(rec["fit_key"], Knobs(int(n_units), int(pad_words), str(pad_suffix)))
        if rec.get("arm") == SERVER and isinstance(rec.get("prompt_tokens"), int) and rec.get("prompt_chars"):
            size = PromptSize(
                int(rec["prompt_chars"]), int(rec.get("pad_chars") or 0), int(rec["n_messages"])
            )
            counter.observe(str(rec.get("family")), size, int(rec["prompt_tokens"]))
    return knobs


def _check_resume(cfg: RunConfig, fp: dict[str, Any]) -> None:
    """Refuse an out directory of other settings or other servers; --restart sets it aside first,
    --accept-relaunch resumes records of the same server settings measured before a relaunch (the
    report then says so beside the verdict: gate.evaluate reads the launches off the records)."""
    if cfg.restart:
        moved = set_aside(cfg.out_dir)
        if moved is not None:
            print(f"verify.live: --restart: earlier records and outputs moved to {moved}", file=sys.stderr)
        return
    found = check_resume(cfg.out_dir, fp)
    fresh = "use a new --out, or --restart to set these records aside and start afresh"
    if found.settings:
        raise SetupError(
            f"{cfg.out_dir} holds results measured under other settings; {fresh}, or the same settings "
            "to resume:\n  " + "\n  ".join(found.settings)
        )
    if found.identity:
        raise SetupError(
            f"{cfg.out_dir} holds results of another server, and they are never reported as this one's; "
            f"{fresh}:\n  " + "\n  ".join(found.identity)
        )
    if found.relaunched and not cfg.accept_relaunch:
        raise SetupError(
            f"{cfg.out_dir} holds results of an earlier launch of a server with these same settings (it was "
            "relaunched, or another server of identical settings answers at this URL). If it is the same "
            "deployment relaunched, pass --accept-relaunch to resume (the report says so beside the verdict); "
            f"otherwise {fresh}:\n  " + "\n  ".join(found.relaunched)
        )


async def run(cfg: RunConfig, result: RunResult) -> RunResult:
    """Measure what the plan still needs; fills `result` as it goes (also read after an interrupt)."""
    policy = RetryPolicy(retries=cfg.retries, first_wait_s=cfg.retry_wait_s, max_wait_s=cfg.retry_max_wait_s)
    arms = await setup_arms(cfg, policy)
    try:
        sampling = Sampling(seed=cfg.seed, thinking=cfg.thinking, stream=cfg.stream)
        counter = await make_counter(arms[0].client, arms[0].profile, sampling, policy)
        fp = fingerprint(cfg, arms, counter)
        limit = arms[0].profile.max_prompt_tokens(max_tokens_for("sweep", cfg.thinking, cfg.max_tokens))
        grid = replace(cfg.grid, server_limit=limit, target_length=cfg.target_length)
        items = plan_items(cfg, grid)
        planned = [planned_record(a.name, it, cfg.seed) for it in items for a in arms]
        target = resolve_target(cfg.target_length, planned, limit, arms[0].profile.max_model_len)
        _check_resume(cfg, fp)
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        write_run_file(cfg.out_dir, fp)
        _write_environment(cfg, arms, counter)
        result.profiles = {a.name: a.profile for a in arms}
        result.counter_description = counter.describe()
        result.planned, result.target, result.fingerprint = planned, target, fp

        store = ResultStore(cfg.out_dir)
        disable = {"on": False, "off": True}.get(cfg.progress)  # None: only on a terminal
        bar = tqdm(total=0, file=sys.stderr, unit="req", dynamic_ncols=True, disable=disable)
        state = RunState(cfg, arms, counter, sampling, store, FitCache(), bar, policy, result.judging)
        state.prior_knobs = _learn_from_earlier_runs(store, counter, result.judging)
        warning = same_format_warning([a.profile.index_k_format for a in arms])
        if warning:
            _warn(state, "same-format", f"WARNING: {warning}.")
        try:
            for pass_name in PASSES:
                these = [it for it in items if it.pass_name == pass_name]
                if not these or state.abort.is_set():
                    continue
                bar.total = (bar.total or 0) + _todo_count(state, these)
                bar.set_description(pass_name)
                bar.refresh()
                workers = {"concurrency": cfg.concurrency, "shared_prefix": 1}.get(pass_name, cfg.parallel)
                await run_pass(state, these, workers)
        finally:
            bar.close()
            store.close()
            result.counter_description = counter.describe()
        result.aborted = state.abort_reason if state.abort.is_set() else None
        return result
    finally:
        for a in arms:
            await a.client.aclose()


def _write_environment(cfg: RunConfig, arms: Sequence[Arm], counter: TokenCounter) -> None:
    import platform

    import openai

    env = {
        "time": _now(),
        "harness_version": HARNESS_VERSION,
        "corpus_version": CORPUS_VERSION,
        "python": platform.python_version(),
        "openai": openai.__version__,
        "platform": platform.platform(),
        "tokenizer": counter.describe(),
        "seed": cfg.seed,
        "thinking": cfg.thinking,
        "stream": cfg.stream,
        "arms": {a.name: a.profile.environment() | {"server_info_full": a.profile.server_info} for a in arms},
    }
    (cfg.out_dir / "environment.json").write_text(json.dumps(env, indent=2, sort_keys=True, default=str))
