"""`pr-drafts`: one upstream pull-request draft per patch, a cover for the set, and `git am`-ready patches.

Drafts are written for the newest upstream release the series is carried to (the newest
`series/next/<version>/` newer than the pin, else the pinned `series/`), because that is what an
upstream reviewer can apply. Each draft follows the section headings and checklist of SGLang's
pull-request template; its content comes only from the patch (header paragraph, trailers,
diffstat, its own test files), the field report this project exists for, and the verification and
bench results committed under `verify/results/`. A number that is not in one of those is never
written: a missing result is reported as "not yet measured".

`--pr-url PATCH=URL` records an opened PR: the patch commit's `Forwarded:` trailer (and
`Last-Update:`, which DEP-3 ties to the header) is rewritten in the target's upstream tree and
`series/` is re-exported, so `check`'s round trip keeps passing.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.header import Header
from pathlib import Path
from typing import Any

from bf16k import gitutil, patches, project, series, upstream
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.project import Target
from bf16k.wheel import applied_tree

OUT_SUBDIR = "pr-drafts"
RESULTS_DIR = "verify/results"

# SGLang's .github/pull_request_template.md (2026 revision): its section headings and the titles
# of its checklist items, in order. Only these are mirrored; the words under them are ours.
HEADINGS = (
    "Motivation",
    "Modifications",
    "Accuracy Tests",
    "Speed Tests and Profiling",
    "Checklist",
    "Review and Merge Process",
)
CHECK_FORMAT = "Format code with pre-commit"
CHECK_TESTS = "Add unit tests"
CHECK_DOCS = "Update documentation"
CHECK_BENCH = "Provide accuracy and speed benchmark results"
CHECK_STYLE = "Follow the SGLang code style guidance"

# Upstream's PR titles read "[DeepSeek-V4] Enable ...": the series' short tags map onto that.
TAG_MAP = {"DSV4": "DeepSeek-V4", "DEEPSEEK-V4": "DeepSeek-V4", "DSV4.1": "DeepSeek-V4.1"}
DEFAULT_TAG = "DeepSeek-V4"
# Trailers that only mean something inside this series; the upstream commit does not carry them.
SERIES_ONLY_TRAILERS = ("Forwarded", "Last-Update", "Applied-Upstream", "Patch-Filename", "Origin")
MAX_ROWS = 25
MAX_COLS = 10
MAX_CELL = 120
MAX_RESULT_BYTES = 5 << 20  # larger files are raw data (per-request logs), not summaries

# The field report the series answers (DESIGN.md, "The problem it solves"), and what this
# repository's own measurements say about it. The deployment's numbers are that deployment's;
# every number of ours a draft shows comes from verify/results/ (the evidence blocks).
FIELD_REPORT = (
    "DeepSeek-V4's sparse attention relies on a small *indexer* in every ratio-4 (C4) layer: it "
    "keeps one 128-dim key per 4 tokens, scores every cached key against the current query and "
    "hands the top-k (512 on V4-Flash, 1024 on V4-Pro) to the attention kernel. A token whose key "
    "is not selected cannot be attended to at all. SGLang stores these index keys as fp8 e4m3 with "
    "one fp32 scale per key (132 B per key); DeepSeek's reference implementation stores them in "
    "bf16 (256 B per key).\n\n"
    "On a production DeepSeek-V4-Flash deployment on SGLang (Blackwell sm_120, RTX PRO 6000 class, "
    "prefill-decode disaggregated), needle recall failed beyond ~4.5K tokens of context: a needle at "
    "position 4,500 of a 5,200-token prompt was lost while the same needle at position 5 was found, "
    "and short prompts and GSM8K-style checks passed. Raising `index_topk` from 512 to 1024 only moved "
    "the edge to ~5K tokens. Storing the index keys in bf16 restored recall at every tested length "
    "from 338 to 22,597 tokens (needle at the start, middle and end), as well as multi-turn tool-call "
    "continuation, multi-turn secret recall and structured config recall at ~8K and ~12K tokens, "
    "with no OOM at 22K tokens.\n\n"
    "What that does and does not show: {precision}, which cannot by itself lose every needle past "
    "4.5K tokens. The collapse more likely came from a fault on the fp8 path sm_120 runs (upstream sends it to a "
    "TileLang scorer and top-k v1, without row chunking), which bf16 keys bypass; that path was checked "
    "component by component on Hopper, sm_120's code included where it can run there, and what only "
    "sm_120 hardware can settle is stated with the evidence. Independently of that fault, bf16 keys "
    "are what the model's reference reads and keep more of the top-k. SGLang has no bf16 index-key "
    "option today."
)
SERIES_CONTEXT = (
    "Part of the bf16 index-key series for DeepSeek-V4 (see the cover): on a PD-disaggregated sm_120 "
    "deployment with fp8 index keys (132 B per key) needle recall collapsed beyond ~4.5K tokens, and "
    "bf16 index keys (256 B per key, as in DeepSeek's reference) restored it at every tested length up "
    "to 22,597 tokens; fp8's precision alone does not explain that collapse (see the cover)."
)
RECALL_ARTIFACT = f"{RESULTS_DIR}/h200/recall/results.json"


def precision_sentence(root: Path) -> str:
    """fp8's own recall loss, from the committed tier-2 run (never typed in by hand)."""
    path = root / RECALL_ARTIFACT
    try:
        res = json.loads(path.read_text())
        losses = [float(e["loss"]) for e in res["per_length"]
                  if e["arm"] == "fp8" and int(e["topk"]) == 512 and int(e["n_keys_max"]) > 512]
    except (OSError, ValueError, KeyError):
        return "fp8's own precision loss is not yet measured (no tier-2 result committed)"
    if not losses:
        return "fp8's own precision loss is not yet measured (no tier-2 length where the indexer must choose)"
    return (f"on this repository's tier-2 recall run fp8's own precision costs {100 * min(losses):.2f}-"
            f"{100 * max(losses):.2f}% of the top-512 (`{RECALL_ARTIFACT}`)")


def field_report(root: Path) -> str:
    return FIELD_REPORT.format(precision=precision_sentence(root))


# --------------------------------------------------------------------------- which release


def _version_key(version: str) -> tuple[int, ...]:
    """Numeric parts of a release version: enough to order 0.5.21 < 0.5.23 < 0.5.23.post1."""
    return tuple(int(x) for x in re.findall(r"\d+", version))


def newest_target(root: Path) -> tuple[Target, str]:
    """(target, why it was chosen): the newest carried series newer than the pin, else the pin."""
    pinned = pinmod.load(root / "pin.toml")
    carried = [
        d.name
        for d in (root / "series" / "next").glob("*")
        if (d / "pin.toml").is_file() and (d / series.SERIES_FILE).is_file()
        and _version_key(d.name) > _version_key(pinned.version)
    ]  # fmt: skip
    if carried:
        version = max(carried, key=_version_key)
        return project.target(root, version), (
            f"the newest carried series (`series/next/{version}/`; the pin is {pinned.version})"
        )
    return Target(root, None), "the pinned series (`series/`): no newer carried series under `series/next/`"


# --------------------------------------------------------------------------- patches


@dataclass
class FileStat:
    path: str
    added: str  # numbers as git prints them ("-" for binary)
    deleted: str
    status: str  # "new", "deleted" or ""


@dataclass
class Draft:
    index: int  # 1-based position in the series
    name: str  # series file name
    info: series.PatchInfo
    title: str
    stats: list[FileStat] = field(default_factory=list)

    @property
    def stem(self) -> str:
        return self.name[: -len(".patch")]

    @property
    def draft_file(self) -> str:
        return f"{self.index:02d}-{self.stem}.md"

    @property
    def patch_file(self) -> str:
        return f"{self.index:04d}-{self.stem}.patch"

    @property
    def tests(self) -> list[str]:
        """The patch's own upstream-style test files (they go into the PR with it)."""
        return [s.path for s in self.stats if s.status != "deleted" and _is_test(s.path)]


def _is_test(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return "/test/" in f"/{path}" and name.startswith("test_") and name.endswith(".py")


def upstream_title(subject: str) -> str:
    """`[DSV4] add a bf16 pool` -> `[DeepSeek-V4] Add a bf16 pool` (upstream's PR title style)."""
    m = re.match(r"^\[([^\]]*)\]\s*(.*)$", subject.strip())
    tag, rest = (m.group(1).strip(), m.group(2)) if m else ("", subject.strip())
    tag = TAG_MAP.get(tag.upper(), tag) or DEFAULT_TAG
    rest = rest.strip().rstrip(".")
    return f"[{tag}] {rest[:1].upper()}{rest[1:]}"


def diffstat(patch: bytes, cwd: Path) -> list[FileStat]:
    """Per-file added/deleted lines (git's own count) and whether the patch creates or deletes it."""
    _, diff = series.split_message(patch)
    text = gitutil.git(["apply", "--numstat", "-"], cwd, input_bytes=diff).stdout.decode()
    created = set(re.findall(r"^diff --git a/(\S+) b/\S+\nnew file mode", diff.decode(errors="replace"), re.MULTILINE))
    removed = set(re.findall(r"^diff --git a/(\S+) b/\S+\ndeleted file mode", diff.decode(errors="replace"), re.MULTILINE))
    stats = []
    for line in text.splitlines():
        added, deleted, path = line.split("\t", 2)
        status = "new" if path in created else "deleted" if path in removed else ""
        stats.append(FileStat(path, added, deleted, status))
    return stats


def load_drafts(t: Target) -> list[Draft]:
    problems = series.hygiene(t.series_dir)
    if problems:
        raise ToolError("series hygiene:\n  " + "\n  ".join(problems))
    drafts = []
    for i, name in enumerate(series.read_order(t.series_dir), start=1):
        path = t.series_dir / name
        info = series.parse_patch(path)
        drafts.append(Draft(i, name, info, upstream_title(info.subject), diffstat(path.read_bytes(), t.root)))
    return drafts


def upstream_patch(data: bytes, title: str) -> bytes:
    """The series patch as an upstream commit: upstream-style subject, no series-only trailers."""
    head, diff = series.split_message(data)
    header, sep, message = head.partition(b"\n\n")
    lines, skipping = [], False
    for line in header.split(b"\n"):
        if line.startswith(b"Subject:"):
            skipping = True
            subject = title if title.isascii() else Header(title, "utf-8").encode()
            lines.append(f"Subject: {subject}".encode())
        elif skipping and line[:1] in (b" ", b"\t"):
            continue  # folded continuation of the old subject
        else:
            skipping = False
            lines.append(line)
    # Only the trailer block (the last paragraph, all `Key: value` lines) loses series-only lines.
    text = message.rstrip(b"\n")
    cut = text.rfind(b"\n\n")
    prose, block = (text[: cut + 2], text[cut + 2 :]) if cut >= 0 else (b"", text)
    block_lines = block.split(b"\n")
    if all(series.TRAILER.match(line.decode("utf-8", errors="replace")) for line in block_lines):
        block_lines = [
            line for line in block_lines
            if not any(line.startswith(f"{t}:".encode()) for t in SERIES_ONLY_TRAILERS)
        ]  # fmt: skip
    body = (prose + b"\n".join(block_lines)).rstrip(b"\n") + b"\n"
    return b"\n".join(lines) + sep + body + diff


# --------------------------------------------------------------------------- evidence


KIND_TITLES = {
    "parity-store": "Tier 1, kernel parity: bf16 store",
    "parity-read": "Tier 1, kernel parity: bf16 read (Triton paged logits)",
    "parity": "Tier 1, kernel parity",
    "recall": "Tier 2, indexer recall",
    "live": "Tier 3, live-server recall",
    "bench-read": "Benchmark: bf16 read vs fp8",
    "bench-store": "Benchmark: bf16 store vs fp8",
    "bench": "Benchmarks",
}
KIND_COMMAND = {
    "parity": "nox -s verify_recall (GPU)",
    "recall": "nox -s verify_recall",
    "live": "nox -s verify_recall -- --server URL --baseline URL",
    "bench": "nox -s bench (GPU)",
}
ACCURACY_KINDS = ("parity-store", "parity-read", "parity", "recall", "live")
SPEED_KINDS = ("bench-read", "bench-store", "bench")
# Which evidence speaks for a patch, by the files it touches (the series' five areas).
RELEVANCE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mem_cache/deepseek_v4_memory_pool", ("parity-store", "recall")),
    ("dsv4/compressor", ("parity-store",)),
    ("fused_norm_rope", ("parity-store", "bench-store")),
    ("bf16_index_logits", ("parity-read", "bench-read")),
    ("srt/server_args", ("recall", "live")),
    ("srt/arg_groups/", ("recall", "live")),  # 0.5.21 declares server arguments here
    ("dsv4/indexer.py", ("recall", "live")),
)
SKIP_FILES = {"run.json", "environment.json"}  # run settings, not results


@dataclass
class Evidence:
    kind: str
    rel: str  # path relative to the repository root
    committed: bool
    lines: list[str]  # markdown: a source line, then a table or a note


def classify(rel: str) -> str | None:
    """The evidence kind of a results file from its path, or None for files this reader skips."""
    low = rel.lower()
    inner = low[len(RESULTS_DIR) + 1 :] if low.startswith(RESULTS_DIR + "/") else low
    if inner.rsplit("/", 1)[-1] in SKIP_FILES or "prompts/" in inner:
        return None
    for family in ("bench", "parity", "recall", "live"):
        if family not in inner:
            continue
        if family in ("bench", "parity"):  # verify.parity.read -> parity_read/, bench_read/, ...
            for sub in ("read", "store"):
                if sub in inner:
                    return f"{family}-{sub}"
        return family
    return None


def _cell(value: Any, limit: int | None = MAX_CELL) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = format(value, ".6g")
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, sort_keys=True, default=str)
    else:
        text = str(value)
    text = text.replace("\n", " ").replace("|", "\\|")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def md_table(header: list[str], rows: Iterable[list[Any]], *, results: bool = True) -> list[str]:
    """A markdown table; ``results`` tables (copied from files) are capped in rows and cell width."""
    rows = list(rows)
    limit = MAX_CELL if results else None
    shown = rows[:MAX_ROWS] if results else rows
    out = ["| " + " | ".join(_cell(h, limit) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(v, limit) for v in row) + " |" for row in shown]
    if len(rows) > len(shown):
        out.append(f"\n_{len(rows) - MAX_ROWS} more row(s) in the file._")
    return out


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """One level of nesting as dotted keys (`shape.keys`), scalars only: what fits a table cell."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict) and not prefix:
            flat.update(_flatten(value, f"{key}."))
        elif isinstance(value, (str, int, float, bool)) or value is None:
            flat[prefix + str(key)] = value
    return flat


def _rows_of(data: Any) -> list[dict[str, Any]] | None:
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return data
    if isinstance(data, dict):
        for key in ("results", "rows", "cells", "summary", "records"):
            rows = _rows_of(data.get(key))
            if rows:
                return rows
    return None


def render_json(data: Any) -> list[str]:
    rows = _rows_of(data)
    if rows and all("status" in r and "name" in r for r in rows):
        # A check suite (verify.parity): one row per check with its status and summary.
        counts: dict[str, int] = {}
        for r in rows:
            counts[str(r["status"])] = counts.get(str(r["status"]), 0) + 1
        ok = data.get("ok") if isinstance(data, dict) else None
        verdict = "" if ok is None else ("all checks pass; " if ok else "**not all checks pass**; ")
        suite = f"suite `{data['suite']}`: " if isinstance(data, dict) and data.get("suite") else ""
        tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return [f"{suite}{verdict}{tally}", ""] + md_table(
            ["check", "status", "summary"], [[r["name"], r["status"], r.get("summary", "")] for r in rows]
        )
    if rows:
        flat = [_flatten(r) for r in rows]
        columns: list[str] = []
        for r in flat:
            columns += [k for k in r if k not in columns]
        used = [c for c in columns if any(r.get(c) not in (None, "") for r in flat)]
        note = [] if len(used) <= MAX_COLS else [f"_{MAX_COLS} of {len(used)} columns shown; all are in the file._", ""]
        used = used[:MAX_COLS]
        return note + md_table(used, [[r.get(c) for c in used] for r in flat])
    if isinstance(data, dict):
        fields = _flatten(data)
        if fields:
            return md_table(["field", "value"], [[k, v] for k, v in fields.items()])
    return ["_no table could be read from this file (unknown layout); see the file._"]


def render_csv(text: str) -> list[str]:
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    if not rows:
        return ["_the file is empty._"]
    header, body = rows[0], rows[1:]
    note = [] if len(header) <= MAX_COLS else [f"_{MAX_COLS} of {len(header)} columns shown; all are in the file._", ""]
    return note + md_table(header[:MAX_COLS], [r[:MAX_COLS] for r in body])


def render_markdown(text: str) -> list[str]:
    """The tables of a markdown report (the report's own words stay in the file)."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines() + [""]:
        if line.lstrip().startswith("|"):
            current.append(line.strip())
        elif current:
            blocks.append(current)
            current = []
    if not blocks:
        return ["_the report has no table; see the file._"]
    out: list[str] = []
    for block in blocks[:2]:
        out += block[: MAX_ROWS + 2]  # header + separator + rows
        if len(block) > MAX_ROWS + 2:
            out.append(f"\n_{len(block) - MAX_ROWS - 2} more row(s) in the file._")
        out.append("")
    if len(blocks) > 2:
        out.append(f"_{len(blocks) - 2} more table(s) in the file._")
    return out


def _pick(files: list[Path]) -> list[Path]:
    """The files of one results folder worth rendering: a markdown report wins; else one per stem
    (json, or the flat csv twin of a json that is not a check suite)."""
    reports = [f for f in files if f.suffix == ".md" and f.stem.lower() in ("report", "summary", "readme")]
    if reports:
        return reports[:1]
    chosen = []
    stems = sorted({f.stem for f in files})
    for stem in stems:
        of = {f.suffix: f for f in files if f.stem == stem}
        if ".json" in of and ".csv" in of:
            chosen.append(of[".json"] if _is_check_suite(of[".json"]) else of[".csv"])
        else:
            chosen += [of[s] for s in (".md", ".json", ".csv") if s in of]
    return chosen


def _is_check_suite(path: Path) -> bool:
    try:
        rows = _rows_of(json.loads(path.read_text()))
    except (ValueError, OSError):
        return False
    return rows is not None and all("status" in r and "name" in r for r in rows)


def _committed(root: Path) -> set[str]:
    proc = gitutil.git(["ls-files", "-z", "--", RESULTS_DIR], root, check=False)
    return set(proc.stdout.decode().split("\0")) if proc.returncode == 0 else set()


def collect_evidence(root: Path) -> list[Evidence]:
    """Every known results file under verify/results/, rendered; unknown files are skipped."""
    results = root / RESULTS_DIR
    if not results.is_dir():
        return []
    committed = _committed(root)
    by_dir: dict[Path, list[Path]] = {}
    for path in sorted(results.rglob("*")):
        if path.is_file() and path.suffix in (".json", ".csv", ".md") and path.stat().st_size <= MAX_RESULT_BYTES:
            rel = path.relative_to(root).as_posix()
            if classify(rel):
                by_dir.setdefault(path.parent, []).append(path)
    evidence = []
    for folder in sorted(by_dir):
        for path in _pick(by_dir[folder]):
            rel = path.relative_to(root).as_posix()
            kind = classify(rel)
            assert kind is not None
            evidence.append(Evidence(kind, rel, rel in committed, _render(path)))
    return evidence


def _render(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            return render_json(json.loads(text))
        if path.suffix == ".csv":
            return render_csv(text)
        return render_markdown(text)
    except (ValueError, OSError) as exc:  # a broken file is reported, never guessed around
        return [f"_could not be read ({type(exc).__name__}: {str(exc)[:160]})._"]


def _family(kind: str) -> str:
    return kind.split("-", 1)[0]


def evidence_block(evidence: list[Evidence], wanted: Iterable[str]) -> list[str]:
    """Markdown for each wanted kind: its files' tables, or "not yet measured" when it has none.

    A results file whose path names only the family (`parity`, `bench`) gets its own block after
    the family's specific kinds, so it is shown but never counted as the store or the read result.
    """
    kinds = list(wanted)
    for family in dict.fromkeys(_family(k) for k in wanted):
        if family not in kinds and any(e.kind == family for e in evidence):
            kinds.append(family)
    out: list[str] = []
    for kind in kinds:
        found = [e for e in evidence if e.kind == kind]
        out += [f"**{KIND_TITLES[kind]}**", ""]
        if not found:
            command = KIND_COMMAND[_family(kind)]
            out += [f"_not yet measured_ (no results under `{RESULTS_DIR}/`; run `{command}` and commit the results).", ""]
        for e in found:
            out += [f"Source: `{e.rel}`" + ("" if e.committed else " (not committed yet)"), "", *e.lines, ""]
    return out


def relevant_kinds(draft: Draft) -> list[str]:
    """Evidence kinds for a patch, in the tiers' order (so drafts read alike)."""
    wanted = {k for s in draft.stats for needle, kinds in RELEVANCE if needle in s.path for k in kinds}
    return [k for k in (*ACCURACY_KINDS, *SPEED_KINDS) if k in wanted]


def _adds_server_argument(stats: Iterable[FileStat]) -> bool:
    return any("srt/server_args" in s.path or "srt/arg_groups/" in s.path for s in stats)


# --------------------------------------------------------------------------- markdown


@dataclass
class Context:
    t: Target
    chosen: str  # why this release
    pin: pinmod.Pin
    shash: str
    drafts: list[Draft]
    evidence: list[Evidence]
    am_note: str  # result of the git am check


def _header_table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def _series_rel(ctx: Context, name: str) -> str:
    return (ctx.t.series_dir / name).relative_to(ctx.t.root).as_posix()


def _checklist(tests: list[str], has_evidence: bool, touches_server_args: bool) -> list[str]:
    docs = ("a server argument changes: upstream's server-argument docs need a row (outside "
            "`python/sglang/`, so not in the series)" if touches_server_args
            else "no user-facing documentation change in this patch")  # fmt: skip
    return [
        f"- [ ] {CHECK_FORMAT}: run upstream's pre-commit on the changed files before opening.",
        f"- [{'x' if tests else ' '}] {CHECK_TESTS}: "
        + (", ".join(f"`{t}`" for t in tests) if tests else "none in this patch"),
        f"- [ ] {CHECK_DOCS}: {docs}.",
        f"- [{'x' if has_evidence else ' '}] {CHECK_BENCH}: "
        + ("see the tables above." if has_evidence else "not yet measured."),
        f"- [ ] {CHECK_STYLE}: to be confirmed in review.",
    ]


def _review_process() -> list[str]:
    return [
        (
            "Follow upstream's merge process: ask the merge on-call to start it, get approval from the "
            "code owners of the touched files, have CI triggered, then ask for the merge once CI is green."
        )
    ]


_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s")


def unwrap(paragraph: str) -> str:
    """Join a commit message's hard-wrapped lines: GitHub renders each newline as a line break.

    List items stay one per line (continuation lines join their item); fenced code is kept.
    """
    if paragraph.lstrip().startswith("```"):
        return paragraph
    lines: list[str] = []
    for line in paragraph.splitlines():
        if lines and not _LIST_ITEM.match(line):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line.rstrip())
    return "\n".join(lines)


def _is_testing(paragraph: str) -> bool:
    """A message paragraph that says how the patch was tested (goes under Accuracy Tests)."""
    return bool(re.match(r"^(tested|testing|tests?\b|how (it|this) was tested)", paragraph.strip(), re.IGNORECASE))


def render_draft(ctx: Context, d: Draft) -> str:
    n = len(ctx.drafts)
    info = d.info
    paragraphs = [unwrap(p.strip()) for p in re.split(r"\n\s*\n", info.body) if p.strip()]
    testing = [p for p in paragraphs[1:] if _is_testing(p)]
    changes = [p for p in paragraphs[1:] if not _is_testing(p)]
    wanted = relevant_kinds(d)
    accuracy = [k for k in wanted if k in ACCURACY_KINDS]
    speed = [k for k in wanted if k in SPEED_KINDS]
    depends = "none (first in the series)" if d.index == 1 else (
        f"drafts 1-{d.index - 1} (apply the patches in order)" if d.index > 2 else "draft 1")
    meta = [
        ("draft", f"{d.index} of {n} in the bf16 index-key series ([cover](00-cover.md))"),
        ("patch", f"`patches/{d.patch_file}` (from `{_series_rel(ctx, d.name)}`)"),
        ("upstream", f"sglang {ctx.pin.version}: {ctx.chosen}"),
        ("depends on", depends),
    ]
    for key in ("Forwarded", "Bug", "Ref", "Applied-Upstream", "Last-Update"):
        if key in info.trailers:
            meta.append((key, info.trailers[key]))
    out = [f"# {d.title}", "", *_header_table(meta), ""]
    out += ["## Motivation", "", paragraphs[0] if paragraphs else "_the patch header has no message_", "",
            SERIES_CONTEXT, ""]  # fmt: skip
    out += ["## Modifications", ""]
    for p in changes:
        out += [p, ""]
    out += md_table(["file", "+", "-", "status"], [[f"`{s.path}`", s.added, s.deleted, s.status] for s in d.stats],
                    results=False)
    out.append("")
    out += ["## Accuracy Tests", ""]
    for p in testing:
        out += [p, ""]
    if d.tests:
        out += ["Unit tests added by this patch:", "",
                "```bash", "python -m pytest " + " ".join(d.tests), "```", ""]  # fmt: skip
    else:
        out += ["This patch adds no test file of its own.", ""]
    out += evidence_block(ctx.evidence, accuracy) if accuracy else [
        "Series-level accuracy evidence is in the [cover](00-cover.md).", ""]
    out += ["## Speed Tests and Profiling", ""]
    no_bench = "No kernel benchmark applies to this patch on its own; the series' benchmarks are in the cover."
    out += evidence_block(ctx.evidence, speed) if speed else [no_bench, ""]
    has_evidence = any(e.kind in wanted or e.kind in {_family(k) for k in wanted} for e in ctx.evidence)
    out += ["## Checklist", "", *_checklist(d.tests, has_evidence, _adds_server_argument(d.stats)), ""]
    out += ["## Review and Merge Process", "", *_review_process(), ""]
    return "\n".join(out)


def render_cover(ctx: Context) -> str:
    n = len(ctx.drafts)
    rel = ctx.t.series_dir.relative_to(ctx.t.root).as_posix()
    meta = [
        ("rebased onto", f"sglang {ctx.pin.version}: {ctx.chosen}"),
        ("series", f"`{rel}/`, {n} patch(es), hash `{ctx.shash[:12]}`"),
        ("upstream commit", f"`{ctx.pin.commit}`" if ctx.pin.commit else "not recorded for this release (wheel-built base)"),
        ("git am check", ctx.am_note),
    ]
    out = [f"# [{DEFAULT_TAG}] bf16 index keys for the sparse-attention indexer ({n} PRs)", "",
           *_header_table(meta), ""]  # fmt: skip
    out += ["## Motivation", "", field_report(ctx.t.root), ""]
    out += ["## Modifications", "", "One PR per patch, to be merged in this order:", ""]
    rows = []
    for d in ctx.drafts:
        added = sum(int(s.added) for s in d.stats if s.added.isdigit())
        deleted = sum(int(s.deleted) for s in d.stats if s.deleted.isdigit())
        rows.append([d.index, f"[{d.title}]({d.draft_file})", len(d.stats), f"+{added} -{deleted}",
                     len(d.tests), d.info.trailers.get("Forwarded", "?")])  # fmt: skip
    out += (md_table(["#", "PR", "files", "lines", "test files", "Forwarded"], rows, results=False)
            if rows else ["_the series is empty._"])
    out.append("")
    out += ["## Accuracy Tests", ""]
    out += evidence_block(ctx.evidence, ("parity-store", "parity-read", "recall", "live"))
    out += ["## Speed Tests and Profiling", ""]
    out += evidence_block(ctx.evidence, ("bench-read", "bench-store"))
    tests = [t for d in ctx.drafts for t in d.tests]
    touched = [s for d in ctx.drafts for s in d.stats]
    out += ["## Checklist", "", *_checklist(tests, bool(ctx.evidence), _adds_server_argument(touched)), ""]
    out += ["## Review and Merge Process", "", *_review_process(), ""]
    # --keep-non-patch: plain `git am` would strip the "[DeepSeek-V4]" tag from each subject.
    out += ["## Applying the patches", "", "On a checkout of upstream SGLang (the patches are in order):", "",
            "```bash", f"git am -3 --keep-non-patch build/{OUT_SUBDIR}/{ctx.pin.version}/patches/*.patch", "```",
            ""]  # fmt: skip
    return "\n".join(out)


# --------------------------------------------------------------------------- git am check


def check_am(t: Target, patch_dir: Path, names: list[str]) -> str:
    """Apply the written patches with `git am` on the target's base in a scratch clone."""
    repo = t.upstream_dir
    apply_cmd = "nox -s apply" + (f" -- --upstream {t.version}" if t.carried else "")
    if not names:
        return "nothing to apply"
    if not gitutil.is_repo(repo):
        return f"not checked here (the upstream tree is not set up; run `{apply_cmd}` and draft again)"
    base = gitutil.git(["rev-parse", "--verify", "-q", upstream.BASE_REF], repo, check=False)
    if base.returncode != 0:
        return f"not checked here (no base recorded; run `{apply_cmd}` and draft again)"
    state = upstream.read_state(repo)
    up = upstream.Upstream(repo, base.stdout.decode().strip(), state.get("source", "?"), "")
    with patches.scratch_clone(up) as scratch:
        failure = patches.run_am(scratch, patches.mbox(patch_dir, names), names)
        if failure:
            raise ToolError(patches.conflict_message(failure, up, "pr-drafts: git am of the written patches"))
        tree = gitutil.out(["rev-parse", "HEAD^{tree}"], scratch)
    same = ""
    if state.get("series_hash") == series.series_hash(t.series_dir):
        same = ", same tree as the applied series" if tree == gitutil.out(["rev-parse", "HEAD^{tree}"], repo) else (
            ", **tree differs from the applied series**")
    return f"the {len(names)} patches apply with `git am` on base `{up.base[:12]}` ({up.source}){same}"


# --------------------------------------------------------------------------- --pr-url


def parse_pr_urls(items: list[str], names: list[str]) -> dict[str, str]:
    """`PATCH=URL` pairs -> {series file name: URL}; PATCH is the file name or its stem."""
    urls: dict[str, str] = {}
    for item in items:
        key, sep, url = item.partition("=")
        if not sep or not key or not url:
            raise ToolError(f"--pr-url expects PATCH=URL, got {item!r}")
        name = key if key.endswith(".patch") else key + ".patch"
        if name not in names:
            raise ToolError(f"--pr-url: no patch {key!r} in the series (patches: {', '.join(names) or 'none'})")
        if not url.startswith("https://") or any(c.isspace() for c in url):
            raise ToolError(f"--pr-url: {url!r} is not an https URL (Forwarded: takes no, not-needed or a URL)")
        urls[name] = url
    return urls


def set_trailers(message: bytes, updates: dict[str, str]) -> bytes:
    """The commit message with trailers in its last paragraph set (replaced, or added before
    `Patch-Filename:` so the export keeps that line last)."""
    text = message.decode("utf-8")
    body = text.rstrip("\n")
    cut = body.rfind("\n\n")
    head, block = (body[: cut + 2], body[cut + 2 :]) if cut >= 0 else ("", body)
    lines = block.split("\n")
    if not all(series.TRAILER.match(line) for line in lines):
        head, lines = body + "\n\n", []  # no trailer block yet
    for key, value in updates.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(f"{key}:")]
        if hits:
            lines[hits[0]] = f"{key}: {value}"
        else:
            at = next((i for i, line in enumerate(lines) if line.startswith("Patch-Filename:")), len(lines))
            lines.insert(at, f"{key}: {value}")
    return (head + "\n".join(lines) + "\n").encode("utf-8")


_IDENT = re.compile(r"^(author|committer) (.*) <(.*)> (\d+ [+-]\d{4})$")


def _commit_env(raw: str) -> dict[str, str]:
    """Author and committer of a commit, as the env that makes commit-tree reproduce them."""
    env: dict[str, str] = {}
    for line in raw.split("\n\n", 1)[0].splitlines():
        m = _IDENT.match(line)
        if m:
            role = "AUTHOR" if m.group(1) == "author" else "COMMITTER"
            env[f"GIT_{role}_NAME"], env[f"GIT_{role}_EMAIL"], env[f"GIT_{role}_DATE"] = m.group(2, 3, 4)
    return env


def record_pr_urls(t: Target, urls: dict[str, str], today: str | None = None) -> list[str]:
    """Rewrite `Forwarded:` (and `Last-Update:`) of the named patch commits and re-export."""
    tree = applied_tree(t, "pr-drafts --pr-url")
    repo = tree.repo
    commits = gitutil.out(["rev-list", "--reverse", f"{tree.base}..{tree.head}"], repo).split()
    today = today or time.strftime("%Y-%m-%d", time.gmtime())
    changed = []
    for name, url in urls.items():
        info = series.parse_patch(t.series_dir / name)
        if info.trailers.get("Forwarded") != url:
            changed.append(name)
    if not changed:
        return []
    first = min(tree.names.index(n) for n in changed)
    parent = commits[first - 1] if first else tree.base
    for name, commit in zip(tree.names[first:], commits[first:]):
        raw = gitutil.git(["cat-file", "commit", commit], repo).stdout
        message = raw.split(b"\n\n", 1)[1]
        if name in changed:
            message = set_trailers(message, {"Forwarded": urls[name], "Last-Update": today})
        # Same tree, same author and committer: only the message (and so the ids) change.
        tree_id = gitutil.out(["rev-parse", f"{commit}^{{tree}}"], repo)
        parent = gitutil.out(
            ["commit-tree", tree_id, "-p", parent, "-F", "-"], repo,
            input_bytes=message, env=_commit_env(raw.decode("utf-8", errors="replace")),
        )  # fmt: skip
    gitutil.git(["update-ref", "-m", "bf16k pr-drafts: record PR URLs", "HEAD", parent, tree.head], repo)
    patches.export(t)
    return changed


# --------------------------------------------------------------------------- the command


def generate(t: Target, chosen: str, out_dir: Path | None = None) -> Path:
    """Write the cover, one draft per patch and the `git am`-ready patches; return the folder."""
    pin = t.load_pin()
    drafts = load_drafts(t)
    out = (out_dir or t.build_dir / OUT_SUBDIR / pin.version).resolve()
    if out.exists():
        shutil.rmtree(out)  # generated output: a dropped patch must not leave its old draft
    (out / "patches").mkdir(parents=True)
    for d in drafts:
        data = upstream_patch((t.series_dir / d.name).read_bytes(), d.title)
        (out / "patches" / d.patch_file).write_bytes(data)
    am_note = check_am(t, out / "patches", [d.patch_file for d in drafts])
    ctx = Context(t, chosen, pin, series.series_hash(t.series_dir), drafts, collect_evidence(t.root), am_note)
    (out / "00-cover.md").write_text(render_cover(ctx))
    for d in drafts:
        (out / d.draft_file).write_text(render_draft(ctx, d))
    return out


def cmd_pr_drafts(ns: argparse.Namespace) -> int:
    root = project.find_root(Path(ns.root) if getattr(ns, "root", None) else None)
    if ns.upstream:
        t = project.target(root, ns.upstream)
        chosen = f"{t.label}, chosen with --upstream"
    else:
        t, chosen = newest_target(root)
    if ns.pr_url:
        urls = parse_pr_urls(ns.pr_url, series.read_order(t.series_dir))
        changed = record_pr_urls(t, urls)
        for name in changed:
            print(f"{name}: Forwarded: {urls[name]}")
        if not changed:
            print("Forwarded: already up to date")
    out = generate(t, chosen, ns.out)
    count = len(series.read_order(t.series_dir))
    shown = out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out
    print(f"pr-drafts: {count} draft(s) + cover for sglang {t.load_pin().version} ({chosen}) in {shown}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pr-drafts", help="upstream PR drafts (one per patch + cover) and git am-ready patches")
    p.add_argument("--upstream", metavar="VERSION", help="draft against this release (default: the newest carried one)")
    p.add_argument(
        "--pr-url", action="append", default=[], metavar="PATCH=URL",
        help="record an opened PR: rewrite that patch's Forwarded: trailer and re-export (repeatable)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, help="output folder (default build/pr-drafts/<version>)")
    p.set_defaults(func=cmd_pr_drafts)
