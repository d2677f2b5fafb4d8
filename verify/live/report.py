"""The markdown report: verdict, what is missing and the gate first, then the requests per state,
environment, results, A/B, robustness and problems. Every count comes from the one Evaluation."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verify.live.config import BASELINE, SERVER, RunConfig
from verify.live.gate import FAILED, INCOMPLETE, Evaluation, max_passing_length
from verify.live.grid import CONTROL_MAX
from verify.live.probe import ServerProfile, same_format_warning
from verify.live.scenarios import SCENARIOS, max_tokens_for
from verify.live.states import (
    ANSWER_FAULTS,
    ERROR,
    FAIL,
    LETTERS,
    PASS,
    SKIPPED,
    STATES,
    TRUNCATED,
    UNCHECKED,
    UNMEASURED,
    remedy,
    state_of,
)
from verify.live.summary import CellSummary

# Requests that are not measurements are counted beside a table cell's rate by these letters (the
# heatmaps use the same letters and a colour per state): they never read as recall failures.
STATE_MARKS = {s: LETTERS[s] for s in (TRUNCATED, UNCHECKED, ERROR, UNMEASURED, SKIPPED)}
STATUS_TEXT = {"ok": "ok", FAILED: "**FAIL**", INCOMPLETE: "**INCOMPLETE**"}

ENV_ROWS = (
    ("URL", lambda p: p.url),
    ("model", lambda p: p.model),
    ("identity (a resume must match)", lambda p: _identity(p)),
    ("served models", lambda p: ", ".join(str(m.get("id")) for m in p.models)),
    ("index-K format", lambda p: f"**{p.index_k_format}** ({p.index_k_source})"),
    ("SGLang version", lambda p: _info(p, "version")),
    ("model path", lambda p: _info(p, "model_path")),
    ("max_model_len", lambda p: p.max_model_len),
    ("max_req_input_len", lambda p: p.max_req_input_len),
    ("max_total_num_tokens (KV pool)", lambda p: _info(p, "max_total_num_tokens")),
    ("kv_cache_dtype", lambda p: _info(p, "kv_cache_dtype")),
    ("attention_backend", lambda p: _info(p, "attention_backend")),
    ("page_size", lambda p: _info(p, "page_size")),
    ("tp / dp", lambda p: f"{_info(p, 'tp_size')} / {_info(p, 'dp_size')}"),
    ("chunked_prefill_size", lambda p: _info(p, "chunked_prefill_size")),
    ("radix cache disabled", lambda p: _info(p, "disable_radix_cache")),
    ("CUDA graph disabled", lambda p: _info(p, "disable_cuda_graph")),
    ("allow_auto_truncate", lambda p: _info(p, "allow_auto_truncate")),
    ("server info endpoint", lambda p: p.server_info_path),
    ("launch command", lambda p: _code(_info(p, "launch_command"))),
)


def _info(p: ServerProfile, key: str) -> Any:
    v = p.info(key)  # where the server puts it: max_total_num_tokens may sit in internal_states
    return "-" if v is None else v


def _identity(p: ServerProfile) -> str:
    ident = p.identity()
    return (
        f"server args digest {ident['server_args_digest'] or '-'}, version {ident['version'] or '-'}, "
        f"launch {ident['launch'] or 'not exposed'}"
    )


def _code(v: Any) -> str:
    return f"`{v}`" if v not in (None, "-", "") else "-"


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def arm_labels(profiles: dict[str, ServerProfile]) -> dict[str, str]:
    return {arm: f"{arm} ({p.index_k_format})" for arm, p in profiles.items()}


def render_report(
    cfg: RunConfig,
    ev: Evaluation,
    profiles: dict[str, ServerProfile],
    counter_description: str,
    images: Sequence[Path],
    env_extra: dict[str, Any],
    command: str,
) -> str:
    labels = arm_labels(profiles)
    arms = [a for a in (SERVER, BASELINE) if a in profiles]
    out: list[str] = []
    out.append(f"# verify_recall, live tier: {ev.verdict}" + (" (qualified)" if ev.qualifiers else "") + "\n")
    for q in ev.qualifiers:
        out.append(f"> **{ev.verdict}, qualified:** {q}.\n")
    if ev.aborted:
        out.append(f"> **Run stopped early:** {ev.aborted}\n")
    out += _verdict_block(ev, command)
    out.append(
        f"Gate target: every depth passes up to **{ev.target_length:,}** tokens ({ev.target_note}). "
        + "; ".join(
            f"{labels[a]} passes every depth up to **{ev.max_len.get(a, 0):,}**"
            + (f" (then {ev.max_len_stop[a]})" if ev.max_len_stop.get(a) else "")
            for a in arms
        )
        + ".\n"
    )
    out.append(
        f"Judged with: {ev.judging.describe()}. States are judged from the stored observations at each report.\n"
    )
    out += _states_table(ev, arms, labels)
    out.append("| | check | result | detail |\n|---|---|---|---|")
    for c in sorted(ev.checks, key=lambda c: not c.gate):
        out.append(
            f"| {'gate' if c.gate else 'info'} | {_cell(c.name)} | {STATUS_TEXT[c.status]} | {_cell(c.detail)} |"
        )
    out.append("")

    out.append("## Environment\n")
    out.append("| | " + " | ".join(labels[a] for a in arms) + " |\n|---|" + "---|" * len(arms))
    for name, get in ENV_ROWS:
        out.append(f"| {name} | " + " | ".join(_cell(get(profiles[a])) for a in arms) + " |")
    out.append("| notes | " + " | ".join(_cell("; ".join(profiles[a].notes) or "-") for a in arms) + " |")
    out.append("")
    out.append(f"- Token counts: {counter_description}")
    timeout = (
        f"{cfg.timeout_s:g} s per request"
        if cfg.timeout_s is not None
        else "scaled per request (30 s + 2 ms per prompt token + 0.1 s per completion token)"
    )
    out.append(
        f"- Client: openai {env_extra.get('openai')}, python {env_extra.get('python')}, harness "
        f"{env_extra.get('harness_version')}, corpus {env_extra.get('corpus_version')}; chat completions, "
        f"temperature 0, top_p 1, seed {cfg.seed}, thinking {'on' if cfg.thinking else 'off'} "
        f"(chat_template_kwargs), {'streaming' if cfg.stream else 'non-streaming'}, max_tokens "
        + (
            str(cfg.max_tokens)
            if cfg.max_tokens
            else ", ".join(f"{s} {max_tokens_for(s, cfg.thinking, None)}" for s in SCENARIOS)
        )
        + f"; timeout {timeout}; up to {cfg.retries} retries of transient faults (backoff from "
        f"{cfg.retry_wait_s:g} s, at most {cfg.retry_max_wait_s:g} s, Retry-After honoured)"
    )
    out.append(
        f"- Plan: {'quick' if cfg.grid.quick else 'full'} grid, repeats {cfg.repeats}, concurrency "
        f"{cfg.concurrency or 'off'}, shared prefix {'on' if cfg.shared_prefix else 'off'}, controls: "
        f"prompts the server read as <= {CONTROL_MAX} (+3) tokens, nudges {'+'.join(cfg.grid.nudge_modes())}, "
        f"max length {cfg.grid.effective_max():,}"
    )
    for sc in SCENARIOS:
        lens = sorted({c.base_length for c in ev.cells if c.scenario == sc})
        exact = sorted({c.target_tokens for c in ev.cells if c.scenario == sc})
        if lens:
            extra = f" ({len(exact)} exact lengths with nudges)" if len(exact) > len(lens) else ""
            out.append(f"- Lengths, {sc}: {', '.join(f'{n:,}' for n in lens)}{extra}")
    out.append("")

    out.append("## Max length passing at all depths\n")
    out.append(
        "Every planned request of every length up to it measured and passed; a length with a request "
        "not measured ends it like a failure.\n"
    )
    scen_present = [s for s in SCENARIOS if any(c.scenario == s for c in ev.cells)]
    out.append("| scenario | " + " | ".join(labels[a] for a in arms) + " |\n|---|" + "---|" * len(arms))
    for s in scen_present:
        if s == "shared_prefix":
            continue
        vals = [max_passing_length(ev.records, a, (s,)) for a in arms]
        out.append(f"| {s} | " + " | ".join(f"{v:,}" for v in vals) + " |")
    out.append(
        f"| **gate ({' + '.join(ev.gate_scenarios)})** | "
        + " | ".join(f"**{ev.max_len.get(a, 0):,}**" for a in arms)
        + " |"
    )
    out.append("")

    out.append("## Results per scenario\n")
    out.append(
        "Cells show passed/measured over nudged lengths and repeats (server / baseline with a baseline); "
        "requests that are not measurements are counted beside it: "
        + ", ".join(f"`{m}` {s}" for s, m in STATE_MARKS.items())
        + ". They are never counted as failures.\n"
    )
    image_names = {p.name for p in images}
    for s in scen_present:
        out += _scenario_section(ev.cells, s, arms, labels, image_names)

    if BASELINE in profiles:
        warning = same_format_warning([profiles[a].index_k_format for a in arms])
        out += _ab_section(ev, labels, warning)
    out += _robustness_section(ev)
    out += _problems_section(ev, profiles)
    out.append("## Files\n")
    out.append(
        "- `requests.jsonl`: one line per request, what was observed (prompt hash, expected, answer, "
        "reasoning, usage, finish_reason, TTFT, fault kind, retried faults); no states"
    )
    out.append("- `states.csv`: one row per planned request, its state as judged for this report")
    out.append(
        "- `summary.csv`: one row per cell and pass group, with its state"
        + (", `ab_deltas.csv`: paired cells" if ev.ab else "")
    )
    out.append(
        "- `environment.json`: full server info of each arm; `run.json`: settings a resume must match, "
        "and the outcome (verdict, exit code, requests per state)"
    )
    if images:
        out.append("- `heatmaps/`: " + ", ".join(sorted(image_names)))
    out.append("")
    return "\n".join(out)


def _verdict_block(ev: Evaluation, command: str) -> list[str]:
    if ev.verdict == "PASS":
        return []
    if ev.verdict == "FAIL":
        out = ["> **FAIL**: a gate request was measured and answered wrong (see the gate rows below)."]
    else:
        n_gate = sum(ev.gate_states.values())
        n_missing = sum(m.count for m in ev.missing)
        out = [
            f"> **INCOMPLETE**: {n_missing} of {n_gate} gate requests have no measurement"
            + ("; the run stopped early" if ev.aborted else "")
            + ". Nothing here is a recall failure. What completes it:"
        ]
    if ev.missing or ev.blockers:
        out.append(">")
        for m in ev.missing:
            example = m.example.replace("\n", " ")[:200]
            out.append(f"> - {m.count} {m.label}, e.g. {example}: {m.remedy}")
        for b in ev.blockers:
            out.append(f"> - {b}")
    if ev.verdict == "INCOMPLETE" or ev.missing:
        first = (
            "Rerun to complete"
            if all(m.rerun_completes for m in ev.missing) and not ev.blockers
            else "After the fixes above, rerun"
        )
        out.append(">")
        out.append(f"> {first}: `{command}` (it resumes: measured requests are not sent again).")
    out.append("")
    return out


def _states_table(ev: Evaluation, arms: Sequence[str], labels: dict[str, str]) -> list[str]:
    out = [
        "Requests per state (every planned request ends in exactly one; only pass and fail are measurements):\n",
        "| requests | planned | " + " | ".join(STATES) + " |",
        "|---|---|" + "---|" * len(STATES),
    ]
    rows = [(labels[a], ev.states.get(a, {})) for a in arms] + [("gate (server)", ev.gate_states)]
    for name, counts in rows:
        out.append(
            f"| {name} | {sum(counts.values())} | " + " | ".join(str(counts.get(s, 0)) for s in STATES) + " |"
        )
    out.append("")
    return out


def state_text(counts: Counter[str] | dict[str, int]) -> str:
    """'2/3', '2/3 T1', 'T3', 'S2': passed/measured, then the other states by letter."""
    measured = counts.get(PASS, 0) + counts.get(FAIL, 0)
    parts = [f"{counts.get(PASS, 0)}/{measured}"] if measured else []
    parts += [f"{m}{counts[s]}" for s, m in STATE_MARKS.items() if counts.get(s)]
    return " ".join(parts) or "-"


def _scenario_section(
    cells: Sequence[CellSummary], scenario: str, arms: Sequence[str], labels: dict[str, str], images: set[str]
) -> list[str]:
    out = [f"### {scenario}\n"]
    group = "shared_prefix" if scenario == "shared_prefix" else "sequential"
    table: dict[tuple[int, float], dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for c in cells:
        if c.scenario != scenario or c.group != group:
            continue
        for r in c.records:
            table[(c.base_length, c.depth_pct)][c.arm][state_of(r)] += 1
    lengths = sorted({k[0] for k in table})
    depths = sorted({k[1] for k in table})
    if not lengths:
        out.append("No planned cells.\n")
        return out
    out.append("| length \\ depth | " + " | ".join(f"{d:g}%" for d in depths) + " |")
    out.append("|---|" + "---|" * len(depths))
    for n in lengths:
        row = []
        for d in depths:
            parts = [state_text(table[(n, d)][a]) for a in arms if table[(n, d)][a]]
            row.append(" / ".join(parts) or "-")
        out.append(f"| {n:,} | " + " | ".join(row) + " |")
    out.append("")
    for a in arms:
        name = f"{scenario}__{a}.png"
        if name in images:
            out.append(f"![{scenario} {labels[a]}](heatmaps/{name})")
    if f"{scenario}__delta.png" in images:
        out.append(f"![{scenario} delta](heatmaps/{scenario}__delta.png)")
    order = {s: i for i, s in enumerate((FAIL, TRUNCATED, ERROR, UNCHECKED))}
    open_cells = sorted(
        (
            c
            for c in cells
            if c.scenario == scenario and c.group == group and c.arm == SERVER and c.state in order
        ),
        key=lambda c: (order[c.state], c.base_length, c.depth_pct, c.cell_id),
    )
    if open_cells:
        out.append(f"\nServer cells that did not pass ({len(open_cells)}; the first 12, failures first):\n")
        out.append(
            "| state | cell | prompt_tokens read / sent | needle at token | expected | answer | first wrong char "
            "| finish | faults beside it |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|")
        for c in open_cells[:12]:
            r = next(r for r in c.records if state_of(r) == c.state)
            state = c.state + (f" ({r.get('kind')})" if c.state in (ERROR, UNCHECKED) else "")
            answer = r.get("answer") if "answer" in r else f"[{r.get('error_kind')}] {r.get('error', '')}"
            faults = ", ".join(ANSWER_FAULTS[f] for f in r.get("faults") or []) or "-"
            out.append(
                f"| {state} | {_cell(c.cell_id)} | {r.get('prompt_tokens', '-')} / {r.get('measured_tokens', '-')} | "
                f"{r.get('needle_token_pos')} | {_cell(', '.join(r.get('expected') or []))} | "
                f"{_cell(str(answer)[:90])} | {r.get('first_wrong_char')} | {r.get('finish_reason')} | {faults} |"
            )
    out.append("")
    return out


def _ab_section(ev: Evaluation, labels: dict[str, str], warning: str | None) -> list[str]:
    s, b = labels.get(SERVER, SERVER), labels.get(BASELINE, BASELINE)
    out = ["## A/B: identical prompts on both servers\n"]
    if warning:
        out.append(f"> **Warning:** {warning}.\n")
    paired = [x for x in ev.ab if x.delta is not None]
    worse = [x for x in paired if (x.delta or 0) < 0]
    better = [x for x in paired if (x.delta or 0) > 0]
    unpaired = len(ev.ab) - len(paired)
    if not paired:
        out.append("No cell was measured on both servers.\n")
        return out
    tail = f" {unpaired} cells were not measured on both servers and are not compared." if unpaired else ""
    if worse:
        out.append(
            f"**{s} is worse than {b} on {len(worse)} of {len(paired)} paired cells.** "
            f"It is better on {len(better)}.{tail}\n"
        )
    else:
        out.append(
            f"**{s} is never worse than {b}**: {len(paired)} paired cells, better on {len(better)}, "
            f"equal on {len(paired) - len(better)}.{tail}\n"
        )
    seq = by_length_pairs(ev)
    if seq:
        out.append(f"| length | {s} pass | {b} pass | delta |\n|---|---|---|---|")
        for n, (sp, st, bp, bt) in sorted(seq.items()):
            out.append(f"| {n:,} | {sp}/{st} | {bp}/{bt} | {sp / st - bp / bt if st and bt else 0:+.2f} |")
        out.append("")
    diff = [x for x in paired if x.delta != 0]
    if diff:
        out.append("Cells that differ (first 40; all in `ab_deltas.csv`):\n")
        out.append(f"| scenario | pass | cell | {s} | {b} | delta | {s} answer | {b} answer |")
        out.append("|---|---|---|---|---|---|---|---|")
        for x in sorted(diff, key=lambda x: (x.delta or 0, x.scenario, x.base_length))[:40]:
            out.append(
                f"| {x.scenario} | {x.group} | {_cell(x.cell_id)} | {x.server_rate:.2f} | {x.baseline_rate:.2f} | "
                f"{x.delta:+.2f} | {_cell(x.server_answer)} | {_cell(x.baseline_answer)} |"
            )
        out.append("")
    return out


def by_length_pairs(ev: Evaluation) -> dict[int, tuple[int, int, int, int]]:
    """Per nominal length: (server passed, server measured, baseline passed, baseline measured) cells."""
    acc: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for c in ev.cells:
        if c.group != "sequential" or c.state not in (PASS, FAIL) or c.arm not in (SERVER, BASELINE):
            continue
        i = 0 if c.arm == SERVER else 2
        acc[c.base_length][i] += int(c.passed)
        acc[c.base_length][i + 1] += 1
    return {n: (v[0], v[1], v[2], v[3]) for n, v in acc.items()}


def _robustness_section(ev: Evaluation) -> list[str]:
    out = ["## Robustness passes\n"]
    seq = [c for c in ev.cells if c.group == "sequential" and c.planned > 1]
    if seq:
        for arm in sorted({c.arm for c in seq}):
            mine = [c for c in seq if c.arm == arm and c.answers_agree is not None]
            bad = [c for c in mine if c.answers_agree is False]
            out.append(
                f"- Repeats ({arm}): {len(mine) - len(bad)}/{len(mine)} cells with 2+ measured answers gave "
                "identical answers"
                + (f"; differing: {', '.join(f'{c.scenario} {c.cell_id}' for c in bad[:8])}" if bad else "")
            )
    for group, what in (("concurrency", "Concurrency pass"), ("shared_prefix", "Shared-prefix pass")):
        for arm in sorted({c.arm for c in ev.cells if c.group == group}):
            mine = [c for c in ev.cells if c.group == group and c.arm == arm]
            if mine:
                counts = Counter(c.state for c in mine)
                out.append(f"- {what} ({arm}): {state_text(counts)} cells")
    if len(out) == 1:
        out.append("- none run")
    out.append("")
    return out


def _problems_section(ev: Evaluation, profiles: dict[str, ServerProfile]) -> list[str]:
    out = ["## Problems\n"]
    skipped: Counter[str] = Counter()
    errors: dict[tuple[str, str], list[str]] = defaultdict(list)
    unchecked: dict[tuple[str, str], list[str]] = defaultdict(list)
    trunc: dict[str, list[str]] = defaultdict(list)
    reasoning: dict[str, Counter[str]] = defaultdict(Counter)  # arm -> state of the answers it came with
    followups: Counter[str] = Counter()
    retried: dict[str, Counter[str]] = defaultdict(Counter)  # arm -> "kind (stage)" -> faults retried away
    off_by: list[int] = []
    for r in ev.records:
        st, arm, where = state_of(r), r["arm"], f"{r['scenario']} {r['cell_id']}"
        if st == SKIPPED:
            skipped[f"{arm}: {r.get('reason')}"] += 1
        elif st == ERROR:
            errors[(arm, str(r.get("kind")))].append(f"{where}: {r.get('reason')}")
        elif st == UNCHECKED:
            unchecked[(arm, str(r.get("kind")))].append(f"{where}: {r.get('reason')}")
        elif st == TRUNCATED:
            trunc[arm].append(f"{where}: {r.get('reason')}")
        if (
            "reasoning_with_thinking_off" in (r.get("faults") or [])
            or r.get("kind") == "reasoning_with_thinking_off"
        ):
            reasoning[arm][st] += 1
        if r.get("usage_source") == "non_stream_followup" or r.get("usage_followup_error"):
            followups[arm] += 1
        for kind in r.get("retried") or []:
            retried[arm][f"{kind} (request)"] += 1
        for kind in r.get("sizing_retried") or []:
            retried[arm][f"{kind} (sizing)"] += 1
        if st in (PASS, FAIL) and r.get("token_delta"):
            off_by.append(int(r["token_delta"]))
    for arm, p in profiles.items():
        for kind in p.startup_retried:
            retried[arm][f"{kind} (start-up)"] += 1
    if ev.aborted:
        out.append(f"- Run stopped early: {ev.aborted}")
    for arm, states in sorted(ev.states.items()):
        if states.get(UNMEASURED):
            out.append(
                f"- {states[UNMEASURED]} planned requests on {arm} were not measured (rerun to resume)"
            )
    for reason, n in sorted(skipped.items()):
        out.append(f"- Skipped {n} requests: {reason}")
    for (arm, kind), items in sorted(errors.items()):
        out.append(
            f"- {len(items)} `{kind}` errors on {arm} (not recall failures), e.g. {items[0]}. "
            f"{remedy(ERROR, kind)[1]}"
        )
    for arm, items in sorted(trunc.items()):
        out.append(
            f"- {len(items)} truncated prompts on {arm} (not scored), e.g. {items[0]}. {remedy(TRUNCATED, '')[1]}"
        )
    for (arm, kind), items in sorted(unchecked.items()):
        out.append(
            f"- {len(items)} unchecked requests on {arm} ({kind}; not scored), e.g. {items[0]}. "
            f"{remedy(UNCHECKED, kind)[1]}"
        )
    for arm, by_state in sorted(reasoning.items()):
        cut = by_state.get(ERROR, 0)
        scored = by_state.get(PASS, 0) + by_state.get(FAIL, 0)
        other = sum(by_state.values()) - cut - scored
        out.append(
            f"- {sum(by_state.values())} answers on {arm} came with reasoning content although thinking was off "
            f"(check chat_template_kwargs and --reasoning-parser): {scored} complete and scored as answers "
            f"({by_state.get(FAIL, 0)} wrong), {cut} cut at max_tokens (the `reasoning_with_thinking_off` errors)"
            + (f", {other} not scored for another reason (above)" if other else "")
        )
    for arm, n in sorted(followups.items()):
        out.append(
            f"- {n} streamed answers on {arm} had no usage.prompt_tokens; each was asked again without "
            "streaming for the count (a proxy dropping stream_options.include_usage?)"
        )
    for arm, kinds in sorted(retried.items()):
        out.append(
            f"- Retried faults on {arm} (retried away; the requests were then answered or recorded above): "
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        )
    if off_by:
        out.append(
            f"- {len(off_by)} measured requests where usage.prompt_tokens differs from the fitted count (largest "
            f"{max(off_by, key=abs):+d} tokens): lengths are then approximate, residues mod 4 not guaranteed"
        )
    if len(out) == 1:
        out.append("- none")
    out.append("")
    return out


def render_setup_report(verdict: str, message: str, command: str, n_records: int) -> str:
    """The report of a run that could not start: it replaces an earlier report, which would
    otherwise stand in the folder as if it were this run's."""
    rerun = (
        f"Rerun to complete: `{command}`."
        if verdict == "INCOMPLETE"
        else f"After fixing it, rerun: `{command}`."
    )
    earlier = (
        f"The {n_records} records in `requests.jsonl` are from earlier runs; a run that starts reports them again."
        if n_records
        else "Nothing was measured."
    )
    return (
        f"# verify_recall, live tier: {verdict}\n\n"
        f"> **The run could not start:** {message}\n>\n> {rerun}\n\n{earlier}\n"
    )
