"""The markdown report: verdict and gate first, then environment, results, A/B, robustness, problems."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verify.live.config import BASELINE, SERVER, RunConfig
from verify.live.grid import CONTROL_MAX
from verify.live.probe import ServerProfile
from verify.live.scenarios import SCENARIOS, max_tokens_for
from verify.live.summary import CellSummary, Evaluation, by_length, gate_scenarios_of, max_passing_length

ENV_ROWS = (
    ("URL", lambda p: p.url),
    ("model", lambda p: p.model),
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
    if not p.server_info:
        return "-"
    v = p.server_info.get(key)
    return "-" if v is None else v


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
) -> str:
    labels = arm_labels(profiles)
    arms = [a for a in (SERVER, BASELINE) if a in profiles]
    out: list[str] = []
    verdict = "PASS" if ev.gate_ok else "FAIL"
    out.append(f"# verify_recall, live tier: {verdict}\n")
    if ev.aborted:
        out.append(f"> **Run stopped early:** {ev.aborted}\n")
    out.append(
        f"Gate target: every depth passes up to **{ev.target_length:,}** tokens. "
        + "; ".join(f"{labels[a]} passes every depth up to **{ev.max_len.get(a, 0):,}**" for a in arms)
        + ".\n"
    )
    out.append("| | check | result | detail |\n|---|---|---|---|")
    for c in sorted(ev.checks, key=lambda c: not c.gate):
        out.append(
            f"| {'gate' if c.gate else 'info'} | {_cell(c.name)} | {'ok' if c.ok else '**FAIL**'} | {_cell(c.detail)} |"
        )
    out.append("")

    out.append("## Environment\n")
    out.append("| | " + " | ".join(labels[a] for a in arms) + " |\n|---|" + "---|" * len(arms))
    for name, get in ENV_ROWS:
        out.append(f"| {name} | " + " | ".join(_cell(get(profiles[a])) for a in arms) + " |")
    out.append("| notes | " + " | ".join(_cell("; ".join(profiles[a].notes) or "-") for a in arms) + " |")
    out.append("")
    out.append(f"- Token counts: {counter_description}")
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
    )
    out.append(
        f"- Plan: {'quick' if cfg.grid.quick else 'full'} grid, repeats {cfg.repeats}, concurrency "
        f"{cfg.concurrency or 'off'}, shared prefix {'on' if cfg.shared_prefix else 'off'}, controls <= "
        f"{CONTROL_MAX} tokens, nudges {'+'.join(cfg.grid.nudge_modes())}, max length {cfg.grid.effective_max():,}"
    )
    for sc in SCENARIOS:
        lens = sorted({c.base_length for c in ev.cells if c.scenario == sc})
        exact = sorted({c.target_tokens for c in ev.cells if c.scenario == sc})
        if lens:
            extra = f" ({len(exact)} exact lengths with nudges)" if len(exact) > len(lens) else ""
            out.append(f"- Lengths, {sc}: {', '.join(f'{n:,}' for n in lens)}{extra}")
    out.append("")

    out.append("## Max length passing at all depths\n")
    scen_present = [s for s in SCENARIOS if any(c.scenario == s for c in ev.cells)]
    out.append("| scenario | " + " | ".join(labels[a] for a in arms) + " |\n|---|" + "---|" * len(arms))
    for s in scen_present:
        if s == "shared_prefix":
            continue
        vals = [max_passing_length(by_length(ev.cells, a, (s,))) for a in arms]
        out.append(f"| {s} | " + " | ".join(f"{v:,}" for v in vals) + " |")
    out.append(
        f"| **gate ({' + '.join(gate_scenarios_of(ev.cells))})** | "
        + " | ".join(f"**{ev.max_len.get(a, 0):,}**" for a in arms)
        + " |"
    )
    out.append("")

    out.append("## Results per scenario\n")
    out.append(
        "Cells show passed/measured over nudged lengths and repeats (server / baseline with a baseline).\n"
    )
    image_names = {p.name for p in images}
    for s in scen_present:
        out += _scenario_section(ev.cells, s, arms, labels, image_names)

    if BASELINE in profiles:
        out += _ab_section(ev, labels)
    out += _robustness_section(ev)
    out += _problems_section(ev)
    out.append("## Files\n")
    out.append(
        "- `requests.jsonl`: one line per request (prompt hash, expected, answer, usage, finish_reason, TTFT)"
    )
    out.append(
        "- `summary.csv`: one row per cell and pass group"
        + (", `ab_deltas.csv`: paired cells" if ev.ab else "")
    )
    out.append("- `environment.json`: full server info of each arm; `run.json`: settings a resume must match")
    if images:
        out.append("- `heatmaps/`: " + ", ".join(sorted(image_names)))
    out.append("")
    return "\n".join(out)


def _scenario_section(
    cells: Sequence[CellSummary], scenario: str, arms: Sequence[str], labels: dict[str, str], images: set[str]
) -> list[str]:
    out = [f"### {scenario}\n"]
    group = "shared_prefix" if scenario == "shared_prefix" else "sequential"
    table: dict[tuple[int, float], dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for c in cells:
        if c.scenario != scenario or c.group != group or c.skipped:
            continue
        slot = table[(c.base_length, c.depth_pct)][c.arm]
        slot[0] += int(c.passed)
        slot[1] += 1
    lengths = sorted({k[0] for k in table})
    depths = sorted({k[1] for k in table})
    if not lengths:
        out.append("No measured cells.\n")
        return out
    out.append("| length \\ depth | " + " | ".join(f"{d:g}%" for d in depths) + " |")
    out.append("|---|" + "---|" * len(depths))
    for n in lengths:
        row = []
        for d in depths:
            parts = [table[(n, d)][a] for a in arms if table[(n, d)][a][1]]
            row.append(" / ".join(f"{p}/{t}" for p, t in parts) or "-")
        out.append(f"| {n:,} | " + " | ".join(row) + " |")
    out.append("")
    for a in arms:
        name = f"{scenario}__{a}.png"
        if name in images:
            out.append(f"![{scenario} {labels[a]}](heatmaps/{name})")
    if f"{scenario}__delta.png" in images:
        out.append(f"![{scenario} delta](heatmaps/{scenario}__delta.png)")
    fails = [
        c
        for c in cells
        if c.scenario == scenario and c.group == group and c.arm == SERVER and c.n and not c.passed
    ]
    if fails:
        out.append("\nFailing server cells (first 12):\n")
        out.append(
            "| cell | prompt_tokens | needle at token | expected | answer | first wrong char | finish |"
        )
        out.append("|---|---|---|---|---|---|---|")
        for c in fails[:12]:
            r = next((r for r in c.measured() if not r.get("passed")), c.measured()[0])
            answer = (
                r.get("answer")
                if r.get("status") == "ok"
                else f"[{r.get('error_kind')}] {r.get('error', '')}"
            )
            out.append(
                f"| {_cell(c.cell_id)} | {r.get('prompt_tokens')} | {r.get('needle_token_pos')} | "
                f"{_cell(', '.join(r.get('expected') or []))} | {_cell(str(answer)[:90])} | "
                f"{r.get('first_wrong_char')} | {r.get('finish_reason')} |"
            )
    out.append("")
    return out


def _ab_section(ev: Evaluation, labels: dict[str, str]) -> list[str]:
    s, b = labels.get(SERVER, SERVER), labels.get(BASELINE, BASELINE)
    out = ["## A/B: identical prompts on both servers\n"]
    paired = [x for x in ev.ab if x.delta is not None]
    worse = [x for x in paired if (x.delta or 0) < 0]
    better = [x for x in paired if (x.delta or 0) > 0]
    if not paired:
        out.append("No paired cells were measured.\n")
        return out
    if worse:
        out.append(
            f"**{s} is worse than {b} on {len(worse)} of {len(paired)} paired cells.** "
            f"It is better on {len(better)}.\n"
        )
    else:
        out.append(
            f"**{s} is never worse than {b}**: {len(paired)} paired cells, better on {len(better)}, "
            f"equal on {len(paired) - len(better)}.\n"
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
    """Per nominal length: (server passed, server cells, baseline passed, baseline cells), sequential."""
    acc: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for c in ev.cells:
        if c.group != "sequential" or c.skipped or c.arm not in (SERVER, BASELINE):
            continue
        i = 0 if c.arm == SERVER else 2
        acc[c.base_length][i] += int(c.passed)
        acc[c.base_length][i + 1] += 1
    return {n: (v[0], v[1], v[2], v[3]) for n, v in acc.items()}


def _robustness_section(ev: Evaluation) -> list[str]:
    out = ["## Robustness passes\n"]
    seq = [c for c in ev.cells if c.group == "sequential" and c.n > 1]
    if seq:
        for arm in sorted({c.arm for c in seq}):
            mine = [c for c in seq if c.arm == arm]
            bad = [c for c in mine if c.answers_agree is False]
            out.append(
                f"- Repeats ({arm}): {len(mine) - len(bad)}/{len(mine)} cells gave identical answers"
                + (f"; differing: {', '.join(f'{c.scenario} {c.cell_id}' for c in bad[:8])}" if bad else "")
            )
    for group, what in (("concurrency", "Concurrency pass"), ("shared_prefix", "Shared-prefix pass")):
        for arm in sorted({c.arm for c in ev.cells if c.group == group}):
            mine = [c for c in ev.cells if c.group == group and c.arm == arm and not c.skipped]
            if mine:
                out.append(f"- {what} ({arm}): {sum(c.passed for c in mine)}/{len(mine)} cells pass")
    if len(out) == 1:
        out.append("- none run")
    out.append("")
    return out


def _problems_section(ev: Evaluation) -> list[str]:
    out = ["## Problems\n"]
    skipped: Counter[str] = Counter()
    errors: dict[tuple[str, str], list[str]] = defaultdict(list)
    budget: list[str] = []
    trunc: list[str] = []
    off_by: list[int] = []
    for c in ev.cells:
        if c.skipped:
            skipped[f"{c.arm}: {c.skip_reason}"] += 1
        for r in c.measured():
            if r.get("status") == "error":
                errors[(c.arm, str(r.get("error_kind")))].append(
                    f"{c.scenario} {c.cell_id}: {r.get('error')}"
                )
            elif r.get("truncated"):
                trunc.append(
                    f"{c.arm} {c.scenario} {c.cell_id}: prompt_tokens {r.get('prompt_tokens')} "
                    f"for {r.get('measured_tokens')} sent"
                )
            elif not r.get("ok") and r.get("finish_reason") == "length":
                budget.append(f"{c.arm} {c.scenario} {c.cell_id}")
            if r.get("status") == "ok" and r.get("token_delta") and not r.get("truncated"):
                off_by.append(int(r["token_delta"]))
    if ev.aborted:
        out.append(f"- Run stopped early: {ev.aborted}")
    for reason, n in sorted(skipped.items()):
        out.append(f"- Skipped {n} cells: {reason}")
    for (arm, kind), items in sorted(errors.items()):
        out.append(f"- {len(items)} {kind} errors on {arm}, e.g. {items[0]}")
    if trunc:
        out.append(f"- {len(trunc)} truncated prompts, e.g. {trunc[0]}")
    if off_by:
        out.append(
            f"- {len(off_by)} requests where usage.prompt_tokens differs from the fitted count (largest "
            f"{max(off_by, key=abs):+d} tokens): lengths are then approximate, residues mod 4 not guaranteed"
        )
    if budget:
        out.append(
            f"- {len(budget)} wrong answers stopped at max_tokens (finish_reason=length), e.g. {budget[0]}"
        )
    if len(out) == 1:
        out.append("- none")
    out.append("")
    return out
