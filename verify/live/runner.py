"""Run the plan against one or two servers, writing each result the moment it arrives.

Passes, in order:
  base           every cell once (sequential by default, so timings are clean)
  repeat         every cell again, repeats-1 times: answers at temperature 0 must agree
  shared_prefix  one haystack, five questions in a row: the radix cache serves the prefix
  concurrency    sweep cells with unique prefixes, N in flight (corruption under load)

With a baseline, each prompt is built once and sent to both servers at the same time, so the two
arms always see byte-identical prompts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

from verify.live import HARNESS_VERSION
from verify.live.client import ArmClient, ChatResult, RequestFailure, Sampling
from verify.live.config import BASELINE, SERVER, RunConfig
from verify.live.corpus import CORPUS_VERSION, stable_seed
from verify.live.fit import Fit, FitCache, FitError, fit_layout
from verify.live.grid import CONTROL_MAX, GridOptions, base_cells, concurrency_cells
from verify.live.layouts import Rendered
from verify.live.probe import ServerProfile, SetupError, make_counter, profile_server
from verify.live.scenarios import SHARED_PREFIX_DEPTHS, Cell, PromptSpec, build, max_tokens_for
from verify.live.scoring import score_answer
from verify.live.store import ResultStore, check_resume, record_key, write_run_file
from verify.live.tokens import TokenCounter, TokenizeUnavailable

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
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    abort_reason: str = ""
    warned: set[str] = field(default_factory=set)
    planned_keys: list[str] = field(default_factory=list)


@dataclass
class RunResult:
    profiles: dict[str, ServerProfile]
    counter_description: str
    planned_keys: list[str]
    aborted: str | None
    target_length: int
    fingerprint: dict[str, Any]


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


async def setup_arms(cfg: RunConfig) -> list[Arm]:
    arms: list[Arm] = []
    for name, url, model in cfg.arms():
        client = ArmClient(name, url, cfg.api_key, cfg.timeout_s)
        try:
            if name == BASELINE and model is None and arms:
                # Same served name as the server arm when the baseline serves it too.
                probe = await profile_server(client, None)
                wanted = arms[0].profile.model
                if wanted in [str(m.get("id")) for m in probe.models]:
                    probe = await profile_server(client, wanted)
                else:
                    probe.notes.append(f"baseline does not serve {wanted!r}; using its {probe.model!r}")
                profile = probe
            else:
                profile = await profile_server(client, model)
        except SetupError:
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
            a.name: {
                "url": a.profile.url,
                "model": a.profile.model,
                "index_k_format": a.profile.index_k_format,
                "tokenizer": counter.mode if a.name == SERVER else None,
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


def resolve_target(cfg: RunConfig, items: Sequence[WorkItem], server: Arm) -> int:
    """The gate's length: --target-length, else the longest sweep length this server can hold."""
    sweep = sorted({it.cell.base_length for it in items if it.cell.scenario == "sweep"})
    lengths = sweep or sorted({it.cell.base_length for it in items})
    limit = server.profile.max_prompt_tokens(max_tokens_for("sweep", cfg.thinking, cfg.max_tokens))
    if cfg.target_length is not None:
        if limit is not None and cfg.target_length > limit:
            raise SetupError(
                f"--target-length {cfg.target_length} is longer than the server allows: at most {limit} "
                f"prompt tokens (max_model_len {server.profile.max_model_len}). Lower --target-length, or "
                f"relaunch SGLang with a larger --context-length."
            )
        return cfg.target_length
    runnable = [n for n in lengths if limit is None or n <= limit]
    return max(runnable) if runnable else 0


async def _count(state: RunState, rendered: Rendered) -> int:
    """Count with the server tokenizer; a dead server here is the same fatal error as in a chat."""
    try:
        return await state.counter.count(rendered)
    except httpx.TimeoutException as e:
        raise RequestFailure("timeout", f"tokenize timed out: {e!r}") from e
    except httpx.HTTPError as e:
        raise RequestFailure("connection", f"tokenize failed, cannot reach the server: {e!r}") from e
    except TokenizeUnavailable as e:
        raise RequestFailure("server_error", f"tokenize failed: {e}") from e


async def make_prompt(state: RunState, item: WorkItem) -> tuple[PromptSpec, Fit]:
    """The cell's prompt, sized to its target with the server's tokenizer.

    Cells of a shared-prefix group are sized once, on the group's first question, and every other
    question renders the same knobs, so the haystack before the question is byte-identical.
    """
    cell = item.cell
    spec = build(cell, state.cfg.seed, item.nonce)
    cache_key = f"{item.nonce}|{cell.fit_group}"

    async def count(r: Rendered) -> int:
        return await _count(state, r)

    grouped = cell.fit_group != f"{cell.scenario}|{cell.cell_id}"
    fit = state.fits.get(cache_key)
    if fit is None:
        canonical = spec
        if grouped:
            first = replace(cell, extra="k0", depth_pct=SHARED_PREFIX_DEPTHS[0])
            canonical = build(first, state.cfg.seed, item.nonce)
        fit = await fit_layout(
            canonical.layout,
            count,
            cell.target_tokens,
            start_units=state.fits.units_hint(cell.scenario, cell.target_tokens),
        )
        state.fits.put(cache_key, fit, cell.scenario)
    if not grouped:
        return spec, fit
    k = fit.knobs
    rendered = spec.layout.render(k.n_units, k.pad_words, k.pad_suffix)
    return spec, Fit(
        knobs=k, target=cell.target_tokens, tokens=await count(rendered), rendered=rendered, calls=1
    )


def _base_record(state: RunState, arm: Arm, item: WorkItem) -> dict[str, Any]:
    c = item.cell
    return {
        "key": item_key(arm.name, item),
        "time": _now(),
        "arm": arm.name,
        "url": arm.profile.url,
        "model": arm.profile.model,
        "index_k_format": arm.profile.index_k_format,
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
        "seed": state.cfg.seed,
        "control": c.base_length <= CONTROL_MAX,
    }


def _prompt_fields(spec: PromptSpec, fit: Fit) -> dict[str, Any]:
    blob = json.dumps({"messages": fit.rendered.messages, "tools": fit.rendered.tools}, sort_keys=True)
    frac = fit.rendered.needle_frac
    return {
        "measured_tokens": fit.tokens,
        "fit_exact": fit.exact,
        "fit_calls": fit.calls,
        "needle_frac": round(frac, 5) if frac is not None else None,
        "needle_token_pos": round(frac * fit.tokens) if frac is not None else None,
        "prompt_sha256": hashlib.sha256(blob.encode()).hexdigest(),
        "n_messages": len(fit.rendered.messages),
        "expected": spec.expected,
        "distractors": spec.distractors,
        "meta": spec.meta,
    }


def _result_fields(state: RunState, spec: PromptSpec, fit: Fit, res: ChatResult) -> dict[str, Any]:
    answer = res.answer_text()
    sc = score_answer(answer, spec.expected, spec.distractors)
    tol = state.cfg.token_tolerance if state.counter.exact else max(state.cfg.token_tolerance, 0.05)
    pt = res.prompt_tokens
    truncated = pt is not None and pt < fit.tokens * (1 - tol) - 1
    decode_s = (res.latency_s - res.ttft_s) if res.ttft_s is not None else None
    tok_s = (
        (res.completion_tokens - 1) / decode_s
        if res.completion_tokens and res.completion_tokens > 1 and decode_s and decode_s > 0
        else None
    )
    return {
        "status": "ok",
        "answer": answer,
        "content": res.content,
        "reasoning": res.reasoning[:4000],
        "tool_calls": res.tool_calls,
        "finish_reason": res.finish_reason,
        "prompt_tokens": pt,
        "completion_tokens": res.completion_tokens,
        "token_delta": (pt - fit.tokens) if pt is not None else None,
        "truncated": truncated,
        "usage_missing": pt is None,
        "ttft_s": round(res.ttft_s, 4) if res.ttft_s is not None else None,
        "latency_s": round(res.latency_s, 4),
        "decode_tok_s": round(tok_s, 2) if tok_s else None,
        "score": sc.score,
        "ok": sc.ok,
        "passed": sc.ok and not truncated,
        "first_wrong_char": sc.first_wrong_char,
        "distractor_hit": sc.distractor_hit,
        "response_model": res.response_model,
    }


async def _chat_with_retry(
    state: RunState, arm: Arm, spec: PromptSpec, fit: Fit, item: WorkItem
) -> ChatResult:
    cfg = state.cfg
    mt = max_tokens_for(item.cell.scenario, cfg.thinking, cfg.max_tokens)
    attempt = 0
    while True:
        try:
            return await arm.client.chat(
                arm.profile.model, fit.rendered, state.sampling, mt, spec.tool_choice
            )
        except RequestFailure as e:
            if e.kind not in ("connection", "server_error") or attempt >= cfg.retries:
                raise
            attempt += 1
            await asyncio.sleep(cfg.retry_wait_s * attempt)


async def _is_alive(arm: Arm) -> bool:
    try:
        status, _ = await arm.client.get_json("/v1/models")
        return status == 200
    except RequestFailure:
        return False


async def run_arm(state: RunState, arm: Arm, item: WorkItem, spec: PromptSpec, fit: Fit) -> None:
    rec = _base_record(state, arm, item) | _prompt_fields(spec, fit)
    try:
        res = await _chat_with_retry(state, arm, spec, fit, item)
    except RequestFailure as e:
        rec |= {"status": "error", "error_kind": e.kind, "error": e.message, "passed": False, "ok": False}
        state.store.append(rec)
        await _on_failure(state, arm, item, e)
        return
    rec |= _result_fields(state, spec, fit, res)
    state.store.append(rec)
    arm.consecutive_errors = 0
    if rec["truncated"]:
        _warn(
            state,
            f"trunc-{arm.name}",
            f"WARNING: the {arm.client.label} counted {rec['prompt_tokens']} prompt tokens for a "
            f"{fit.tokens}-token prompt ({item.cell.scenario} {item.cell.cell_id}): the prompt was truncated "
            f"(is --allow-auto-truncate on, or a proxy cutting requests?). Truncated cells are invalid and fail "
            f"the gate.",
        )
    elif rec["usage_missing"]:
        _warn(
            state,
            f"usage-{arm.name}",
            f"WARNING: the {arm.client.label} returned no usage.prompt_tokens; truncation cannot be checked "
            f"(try --no-stream if it ignores stream_options.include_usage).",
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
            f"({e.message}); cells of {n} tokens and more are skipped for it.",
        )
        return
    if e.kind == "model_not_found":
        _set_abort(state, f"the {arm.client.label} does not serve model {arm.profile.model!r}: {e.message}")
        return
    if e.kind == "connection" and not await _is_alive(arm):
        _set_abort(
            state,
            f"the {arm.client.label} at {arm.profile.url} stopped answering ({e.message}). "
            f"Results measured so far are in {state.store.path}; rerun the same command to resume.",
        )
        return
    arm.consecutive_errors += 1
    _warn(state, f"err-{arm.name}-{e.kind}", f"WARNING: {e.message} (recorded; later cells continue)")
    if arm.consecutive_errors >= cfg.max_consecutive_errors:
        _set_abort(
            state,
            f"{arm.consecutive_errors} requests in a row failed on the {arm.client.label} (last: {e.message}). "
            f"Results so far are in {state.store.path}; fix the server (or raise --timeout) and rerun to resume.",
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


def _record_skip(state: RunState, arm: Arm, item: WorkItem, reason: str) -> None:
    key = item_key(arm.name, item)
    old = state.store.latest.get(key)
    if old is not None and old.get("status") == "skipped" and old.get("reason") == reason:
        return  # already on disk from an earlier run
    state.store.append(
        _base_record(state, arm, item) | {"status": "skipped", "reason": reason, "passed": False}
    )


async def process(state: RunState, item: WorkItem) -> None:
    if state.abort.is_set():
        return
    todo: list[Arm] = []
    for arm in state.arms:
        key = item_key(arm.name, item)
        if state.store.done(key):
            continue
        reason = _arm_skip_reason(state, arm, item.cell)
        if reason is not None:
            _record_skip(state, arm, item, reason)
            state.bar.update(1)
            continue
        todo.append(arm)
    if not todo:
        return
    try:
        spec, fit = await make_prompt(state, item)
    except FitError as e:
        for arm in todo:
            _record_skip(state, arm, item, f"cannot build the prompt: {e}")
            state.bar.update(1)
        return
    except RequestFailure as e:
        server = state.arms[0]
        if e.kind == "connection" and not await _is_alive(server):
            _set_abort(
                state,
                f"the server at {server.profile.url} stopped answering while sizing a prompt ({e.message}). "
                f"Results measured so far are in {state.store.path}; rerun the same command to resume.",
            )
        else:
            _warn(state, f"tok-{e.kind}", f"WARNING: sizing a prompt failed: {e.message}")
        return
    if state.cfg.save_prompts:
        _save_prompt(state.cfg.out_dir, spec, fit)
    await asyncio.gather(*(run_arm(state, arm, item, spec, fit) for arm in todo))
    state.bar.update(len(todo))
    ok = sum(1 for a in todo if state.store.latest.get(item_key(a.name, item), {}).get("passed"))
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
    return sum(1 for it in items for a in state.arms if not state.store.done(item_key(a.name, it)))


async def run(cfg: RunConfig) -> RunResult:
    arms = await setup_arms(cfg)
    try:
        sampling = Sampling(seed=cfg.seed, thinking=cfg.thinking, stream=cfg.stream)
        try:
            counter = await make_counter(arms[0].client, arms[0].profile, sampling)
        except RequestFailure as e:
            raise SetupError(f"probing the server's tokenizer failed: {e.message}") from e
        fp = fingerprint(cfg, arms, counter)
        problems = check_resume(cfg.out_dir, fp)
        if problems:
            raise SetupError(
                f"{cfg.out_dir} holds results measured under other settings; use a new --out, or the "
                "same settings to resume:\n  " + "\n  ".join(problems)
            )
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        write_run_file(cfg.out_dir, fp)
        _write_environment(cfg, arms, counter)

        limit = arms[0].profile.max_prompt_tokens(max_tokens_for("sweep", cfg.thinking, cfg.max_tokens))
        items = plan_items(cfg, replace(cfg.grid, server_limit=limit))
        target = resolve_target(cfg, items, arms[0])
        store = ResultStore(cfg.out_dir)
        planned = [item_key(a.name, it) for it in items for a in arms]
        disable = {"on": False, "off": True}.get(cfg.progress)  # None: only on a terminal
        bar = tqdm(total=0, file=sys.stderr, unit="req", dynamic_ncols=True, disable=disable)
        state = RunState(cfg, arms, counter, sampling, store, FitCache(), bar, planned_keys=planned)
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
        return RunResult(
            profiles={a.name: a.profile for a in arms},
            counter_description=counter.describe(),
            planned_keys=planned,
            aborted=state.abort_reason if state.abort.is_set() else None,
            target_length=target,
            fingerprint=fp,
        )
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
