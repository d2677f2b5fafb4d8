"""The drafts as markdown: each PR in the section order of SGLang's pull-request template, and the
cover. Its fixed sentences are in ``bf16k/templates/`` (:mod:`bf16k.prdrafts.prose`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bf16k import pin as pinmod
from bf16k import previdence, prs, series
from bf16k.prdrafts.commits import FileStat, Patch
from bf16k.prdrafts.prose import (
    BF16_PORT,
    CHECK_BENCH,
    CHECK_DOCS,
    CHECK_FORMAT,
    CHECK_STYLE,
    CHECK_TESTS,
    FP8_PORT,
    OPTION,
    REVIEW,
    STILL_NEEDS,
    bf16_motivation,
    needed_runs,
    text,
    unwrap,
)
from bf16k.prdrafts.tree import PRState
from bf16k.project import Target


def _say(key: str, **values: object) -> str:
    """One of the drafts' own sentences (templates/pr-sections.md)."""
    return text("pr-sections", key, **values)


def _header_table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def _is_testing(paragraph: str) -> bool:
    return bool(
        re.match(r"^(tested|testing|tests?\b|how (it|this) was tested)", paragraph.strip(), re.IGNORECASE)
    )


def paragraphs(info: series.PatchInfo) -> list[str]:
    return [unwrap(p.strip()) for p in re.split(r"\n\s*\n", info.body) if p.strip()]


@dataclass
class Context:
    t: Target
    chosen: str
    pin: pinmod.Pin
    shash: str
    prmap: prs.PRMap
    patches: dict[str, Patch]
    states: dict[str, PRState]
    releases: list[prs.ReleaseCheck]
    evidence: dict[str, str]
    tests_run: bool  # --check ran the PRs' tests

    def index(self, pr: prs.PR) -> int:
        return self.prmap.prs.index(pr) + 1

    def draft_file(self, pr: prs.PR) -> str:
        return f"pr-{pr.id}.md"

    def option_index(self) -> int:
        """The 1-based PR that adds the index-K option (A/B runs are possible from there)."""
        return next((self.index(p) for p in self.prmap.prs if OPTION in p.docs), len(self.prmap.prs) + 1)


def _lines_added(stats: list[FileStat]) -> tuple[int, int]:
    return (
        sum(int(s.added) for s in stats if s.added.isdigit()),
        sum(int(s.deleted) for s in stats if s.deleted.isdigit()),
    )


def motivation(ctx: Context, pr: prs.PR) -> list[str]:
    if pr.motivation == "patch":
        first = paragraphs(ctx.patches[pr.patches[0]].info)
        return [first[0] if first else _say("motivation-missing"), "", pr.context, ""]
    out = [bf16_motivation(ctx.evidence["fp8-precision"]), "", pr.context, ""]
    if "cost" in pr.evidence:
        out += ["### What bf16 index keys cost", "", ctx.evidence["cost"].rstrip(), ""]
    return out


# A commit paragraph telling the field report is the set's motivation, which the draft states once.
_FIELD_REPORT = re.compile(r"~?4\.5K tokens")


def _is_motivation(pr: prs.PR, commit: int, index: int, paragraph: str) -> bool:
    """Whether a commit paragraph is the draft's Motivation (so not repeated under Modifications)."""
    if pr.motivation == "patch":
        return commit == 0 and index == 0
    return bool(_FIELD_REPORT.search(paragraph))


def modifications(ctx: Context, pr: prs.PR) -> list[str]:
    out: list[str] = []
    for note in pr.notes:
        out += [f"> {note}", ""]
    for i, name in enumerate(pr.patches):
        p = ctx.patches[name]
        paras = paragraphs(p.info)
        kept = [x for j, x in enumerate(paras) if not _is_testing(x) and not _is_motivation(pr, i, j, x)]
        out += [f"**{p.info.subject}**", ""]
        for x in kept:
            out += [x, ""]
    stats = [s for name in pr.patches for s in ctx.patches[name].stats]
    added, deleted = _lines_added(stats)
    out += [f"Diffstat ({len(pr.patches)} commit(s), {len(stats)} file change(s), +{added} -{deleted}):", ""]
    out += ["| file | + | - | |", "|---|---|---|---|"]
    out += [f"| `{s.path}` | {s.added} | {s.deleted} | {s.status} |" for s in stats]
    out.append("")
    state = ctx.states.get(pr.id)
    if pr.docs:
        out += ["### Documentation", ""]
        if state and state.docs:
            out += [
                _say("docs-rows"),
                "",
                "```markdown",
                "| Argument | Description | Defaults | Options |",
                "| --- | --- | --- | --- |",
                *[d.row for d in state.docs],
                "```",
                "",
                _say("docs-deprecation", option=OPTION),
                "",
            ]
        else:
            out += [_say("docs-not-read"), ""]
    return out


def _tests_table(state: PRState | None) -> list[str]:
    if state is None or not state.tests:
        return [_say("tests-not-read"), ""]
    out = ["| test file | CI registration (upstream's parser) | |", "|---|---|---|"]
    for tf in state.tests:
        note = tf.how + ("; " + "; ".join(tf.problems) if tf.problems else "")
        out.append(f"| `{tf.path}` | {tf.registrations} | {note} |")
    return out + [""]


def accuracy(ctx: Context, pr: prs.PR) -> list[str]:
    state = ctx.states.get(pr.id)
    out = [_say("tests-intro"), "", *_tests_table(state)]
    if state and state.tests:
        out += ["```bash", "python3 -m pytest -q " + " ".join(tf.path for tf in state.tests), "```", ""]
    for name in pr.patches:
        for x in paragraphs(ctx.patches[name].info):
            if _is_testing(x):
                out += [x, ""]
    for rc in ctx.releases:
        check = next((c for c in rc.prs if c.pr == pr.id), None)
        if rc.checked and check is not None and check.run is not None:
            version = rc.label.split(" ", 1)[0]
            on = f"SGLang {version}" + ("".join(f" + PR ({i})" for i in check.below))
            verdict = "pass" if check.run.ok else "do NOT all pass"
            out += [_say("tests-applied", on=on, verdict=verdict, summary=check.run.summary()), ""]
    kinds = [k for k in pr.evidence if k in ("store-parity", "read-parity", "forward", "recall")]
    for k in kinds:
        out += [ctx.evidence[k].rstrip(), ""]
    if not kinds:
        out += [_say("accuracy-no-model-change"), ""] if pr.motivation == "patch" else []
    return out


def speed(ctx: Context, pr: prs.PR) -> list[str]:
    kinds = [k for k in pr.evidence if k in ("store-bench", "read-bench")]
    if not kinds:
        return [_say("speed-not-applicable"), ""]
    out: list[str] = []
    for k in kinds:
        out += [ctx.evidence[k].rstrip(), ""]
    return out


def still_needs(ctx: Context, pr: prs.PR) -> list[str]:
    ab = ctx.index(pr) >= ctx.option_index()
    measured = any(k != "cost" for k in pr.evidence)
    servers = " " + _say("still-needs-servers", fp8_port=FP8_PORT, bf16_port=BF16_PORT) if ab else ":"
    out = [_say("still-needs-measured" if measured else "still-needs-tests") + servers, ""]
    for need in pr.needs:
        what, commands = needed_runs(need, ab)
        out += [f"- [ ] {what}", "", "  ```bash", *[f"  {c}" for c in commands], "  ```", ""]
    if not pr.needs:
        out += [_say("still-needs-nothing"), ""]
    return out


def checklist(ctx: Context, pr: prs.PR) -> list[str]:
    state = ctx.states.get(pr.id)
    tests = state.tests if state else []
    registered = [t for t in tests if t.how.startswith("added") and not t.problems]
    measured = [
        k for k in pr.evidence if k != "cost" and previdence.NOT_MEASURED not in ctx.evidence.get(k, "")
    ]
    problems = [t for t in tests if t.problems]
    test_note = _say("checklist-tests", count=len(registered)) if registered else _say("checklist-tests-none")
    if problems:
        test_note += _say("checklist-tests-problems", count=len(problems))
    native = any(
        s.path.endswith((".cu", ".cuh", ".h", ".cpp", ".cc"))
        for name in pr.patches
        for s in ctx.patches[name].stats
    )
    fmt = state.format if state and state.format else _say("checklist-format-not-checked")
    return [
        f"- [ ] {CHECK_FORMAT} "
        + _say("checklist-format-native" if native else "checklist-format", format=fmt),
        f"- [{'x' if registered else ' '}] {CHECK_TESTS} {test_note}.",
        f"- [ ] {CHECK_DOCS} " + _say("checklist-docs" if pr.docs else "checklist-docs-none"),
        f"- [{'x' if measured else ' '}] {CHECK_BENCH} "
        + _say("checklist-bench" if measured else "checklist-bench-none", still_needs=STILL_NEEDS),
        f"- [ ] {CHECK_STYLE} " + _say("checklist-style"),
    ]


def render_draft(ctx: Context, pr: prs.PR) -> str:
    n = len(ctx.prmap.prs)
    i = ctx.index(pr)
    below = ctx.prmap.prs[: i - 1]
    base = f"SGLang {ctx.pin.version}" + (
        " + " + ", ".join(f"PR ({p.id}) {p.title}" for p in below) if below else ""
    )
    meta = [
        ("part", f"{i} of {n} of the bf16 index-K set for DeepSeek-V4"),
        ("base", base),
        ("commits", ", ".join(f"`{ctx.patches[name].info.subject}`" for name in pr.patches)),
    ]
    fwd = sorted({ctx.patches[name].info.trailers.get("Forwarded", "no") for name in pr.patches})
    if any(f.startswith("https://") for f in fwd):
        meta.append(("opened as", ", ".join(f for f in fwd if f.startswith("https://"))))
    out = [f"# {pr.title}", "", *_header_table(meta), ""]
    out += ["## Motivation", "", *motivation(ctx, pr)]
    out += ["## Modifications", "", *modifications(ctx, pr)]
    out += ["## Accuracy Tests", "", *accuracy(ctx, pr)]
    out += ["## Speed Tests and Profiling", "", *speed(ctx, pr)]
    out += [f"## {STILL_NEEDS}", "", *still_needs(ctx, pr)]
    out += ["## Checklist", "", *checklist(ctx, pr), ""]
    out += ["## Review and Merge Process", "", *REVIEW, ""]
    return "\n".join(out)


def render_cover(ctx: Context) -> str:
    n = len(ctx.prmap.prs)
    meta = [
        ("drafted against", ctx.chosen),
        (
            "series",
            f"{len(ctx.patches)} patches, hash `{ctx.shash[:12]}`: {n} PRs, {len(ctx.prmap.local)} local only",
        ),
        (
            "upstream commit",
            f"`{ctx.pin.commit}`" if ctx.pin.commit else "not recorded for this release (wheel-built base)",
        ),
    ]
    out = [
        f"# bf16 index keys for DeepSeek-V4's C4 indexer: the upstream PR set ({n} PRs)",
        "",
        *_header_table(meta),
        "",
    ]
    out += ["## The PRs", "", _say("cover-order"), ""]
    out += [
        "| PR | title | patches, in order | base | files | lines | Forwarded |",
        "|---|---|---|---|---|---|---|",
    ]
    for pr in ctx.prmap.prs:
        stats = [s for name in pr.patches for s in ctx.patches[name].stats]
        added, deleted = _lines_added(stats)
        below = ctx.prmap.prs[: ctx.index(pr) - 1]
        base = "upstream" + "".join(f" + {p.id}" for p in below)
        fwd = ", ".join(
            sorted({ctx.patches[name].info.trailers.get("Forwarded", "?") for name in pr.patches})
        )
        out.append(
            f"| ({pr.id}) | [{pr.title}]({ctx.draft_file(pr)}) | {'<br>'.join(f'`{p}`' for p in pr.patches)} | "
            f"{base} | {len(stats)} | +{added} -{deleted} | {fwd} |"
        )
    out.append("")
    for pr in ctx.prmap.prs:
        out += [f"- ({pr.id}) {pr.context}"] + [f"  - {note}" for note in pr.notes]
    out += [
        "",
        "## Local only (Forwarded: not-needed)",
        "",
        "| patch | why it stays in the series |",
        "|---|---|",
    ]
    out += [f"| `{loc.patch}` | {loc.why} |" for loc in ctx.prmap.local]
    out += ["", "## The git am check, per PR on its own base", ""]
    out += ["| release | PR | git am | its tests |", "|---|---|---|---|"]
    for rc in ctx.releases:
        if not rc.checked:
            out.append(f"| {rc.label} | all | not checked: {'; '.join(rc.why_not)} | |")
            continue
        for c in rc.prs:
            tests = (
                "not run: it does not apply"
                if not c.applies
                else "not run (`--check` runs them)"
                if c.run is None
                else "no test files of its own"
                if c.run.absent
                else c.run.summary()
            )
            out.append(
                f"| {rc.label} | ({c.pr}) | {'applies on ' + c.base if c.applies else 'FAILS: ' + c.detail} | {tests} |"
            )
        for pr in ctx.prmap.prs[len(rc.prs) :]:
            out.append(f"| {rc.label} | ({pr.id}) | not tried (an earlier PR did not apply) | |")
    out += ["", "## Applying", "", _say("cover-applying"), "", "```bash"] + [
        f"git am -3 --keep-non-patch patches/{pr.id}/*.patch   # ({pr.id})" for pr in ctx.prmap.prs
    ]
    out += ["```", ""]
    return "\n".join(out)
