"""`pr-drafts`: the upstream PR set the series becomes, one draft per PR, a cover, `git am`-ready patches.

The PR map (``series/prs.toml``, :mod:`bf16k.prs`) says which patches make which PR and which stay
local. ``build/pr-drafts/<version>/`` gets:

- ``00-cover.md``: the map (PR -> patches, in order, on which base), the local-only patches and
  why, and the ``git am`` check of each PR on its own base;
- ``pr-<id>.md``: one draft per PR in the section order of SGLang's pull-request template, with
  one motivation, the PR's own evidence only (rendered from the committed results by
  :mod:`bf16k.previdence`), its diffstat, the tests its patches add with their CI registration
  (read by upstream's own parser), the server-argument docs row it needs, the checklist ticked
  only for what exists, and what only real hardware and the real model can still show, with the
  commands that produce it;
- ``patches/<id>/NNNN-*.patch``: each PR's commits for ``git am --keep-non-patch``.

Drafts are written for the newest release the series is carried to when that series fits the map,
else for the pin (the cover says which and why). No draft names a local path or this
repository's harness: :func:`write` refuses one that does.

``--check`` also applies each PR on its base in a scratch clone and runs the PR's own tests
there, on the pin and on the newest carried release. ``--pr-url ID=URL`` (a PR) or
``--pr-url PATCH=URL`` (one patch) records an opened PR in the patches' ``Forwarded:`` lines.
"""

from __future__ import annotations

import ast
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from bf16k import (
    diffs,
    gitutil,
    patches,
    previdence,
    project,
    prs,
    series,
    seriestests,
    upstream,
    upstreamlint,
)
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.project import Target
from bf16k.wheel import applied_tree

OUT_SUBDIR = "pr-drafts"
COVER = "00-cover.md"
# Trailers that only mean something inside this series; the upstream commit does not carry them.
SERIES_ONLY_TRAILERS = ("Forwarded", "Last-Update", "Applied-Upstream", "Patch-Filename", "Origin")

# SGLang's .github/pull_request_template.md (2026): its sections and checklist, in order. The
# drafts add one section of their own ("Evidence this PR still needs") before the checklist.
HEADINGS = ("Motivation", "Modifications", "Accuracy Tests", "Speed Tests and Profiling", "Checklist",
            "Review and Merge Process")  # fmt: skip
STILL_NEEDS = "Evidence this PR still needs"
_GUIDE = "https://docs.sglang.io/developer_guide/contribution_guide.html"
CHECK_FORMAT = f"Format your code according to the [Format code with pre-commit]({_GUIDE}#format-code-with-pre-commit)."
CHECK_TESTS = f"Add unit tests according to the [Run and add unit tests]({_GUIDE}#run-and-add-unit-tests)."
CHECK_DOCS = f"Update documentation according to [Write documentations]({_GUIDE}#write-documentations)."
CHECK_BENCH = (f"Provide accuracy and speed benchmark results according to [Test the accuracy]({_GUIDE}#test-the-accuracy) "
               f"and [Benchmark the speed]({_GUIDE}#benchmark-the-speed).")  # fmt: skip
CHECK_STYLE = f"Follow the SGLang code style [guidance]({_GUIDE}#code-style-guidance)."
REVIEW = (
    ("1. Ping Merge Oncalls to start the process. See the [PR Merge Process]"
    "(https://github.com/sgl-project/sglang/blob/main/.github/MAINTAINER.md#pull-request-merge-process)."),
    ("2. Get approvals from [CODEOWNERS](https://github.com/sgl-project/sglang/blob/main/.github/CODEOWNERS) "
    "and other reviewers."),
    f"3. Trigger CI tests with [comments]({_GUIDE}#how-to-trigger-ci-tests) or contact authorized users to do so.",
    "4. After green CI and required approvals, ask Merge Oncalls to merge.",
)

# --------------------------------------------------------------------------- the set's motivation

PUBLIC_COLLAPSES = (
    ("vLLM #50455", "https://github.com/vllm-project/vllm/issues/50455"),
    ("vLLM #52109", "https://github.com/vllm-project/vllm/issues/52109"),
    ("vLLM #50576", "https://github.com/vllm-project/vllm/issues/50576"),
    ("ATOM #1507", "https://github.com/ROCm/ATOM/issues/1507"),
    ("mlx-lm #1189", "https://github.com/ml-explore/mlx-lm/issues/1189"),
)
OPEN_ON_SM120 = ("vLLM #55927", "https://github.com/vllm-project/vllm/issues/55927")


def _link(item: tuple[str, str]) -> str:
    return f"[{item[0]}]({item[1]})"


def bf16_motivation(precision: str) -> str:
    """The set's one motivation (``precision``: fp8's own measured loss, from the recall artifact)."""
    collapses = ", ".join(_link(c) for c in PUBLIC_COLLAPSES)
    return (
        "DeepSeek-V4's ratio-4 (C4) attention layers use a lightning indexer: it keeps one 128-dim key per 4 "
        "tokens, scores every cached key against the query and hands the top-k (512 on V4-Flash, 1024 on "
        "V4-Pro) to sparse attention. A token whose key misses the top-k cannot be attended to at all. SGLang "
        "stores these keys as fp8 e4m3 with one fp32 scale (132 B a key) or, opt-in, fp4 (68 B).\n\n"
        "DeepSeek's reference inference code rounds the indexer's q and keys to fp4 (quantize-dequantize, as "
        "the model was trained: QAT) and keeps them in a bf16 buffer. So bf16 is the reference's container, "
        "not its precision, and fp8 keys are already finer than what the reference computes with; this PR "
        "set does not claim bf16 matches the reference better. What bf16 index keys are is an index-K path "
        "with no quantization at all: no encoder, no scales, and a scorer of their own.\n\n"
        "That path sidestepped a recall collapse on a prefill/decode-disaggregated DeepSeek-V4-Flash deployment "
        "on sm_120 (RTX PRO 6000 class) GPUs: with fp8 index keys, needles beyond ~4.5K tokens of context were "
        "lost (a needle at position 4,500 of a 5,200-token prompt missed while the same needle at position 5 "
        "was found; short prompts and GSM8K-style checks passed; `index_topk` 1024 only moved the edge to "
        "~5K). With bf16 index keys, recall held at every tested length up to 22,597 tokens. fp8's precision "
        f"alone does not explain that: {precision}. Every public V4 recall collapse traced so far was a fault "
        f"in one platform's quantized indexer path ({collapses}); {_link(OPEN_ON_SM120)} is open on sm_120. "
        "A bf16 index-K option gives operators a path around such a fault while it is found, and a "
        "quantization-free baseline to compare a quantized path with on the same server."
    )


# --------------------------------------------------------------------------- commands for what is still needed

MODEL = "deepseek-ai/DeepSeek-V4-Flash"
SERVE = f"python3 -m sglang.launch_server --model-path {MODEL} --trust-remote-code --tp 4"
FP8_PORT, BF16_PORT = 30000, 30001
OPTION = "--deepseek-v4-indexer-k-dtype"


def _servers(ab: bool, extra: str = "") -> list[str]:
    """Launch lines: fp8 (default) and bf16 for an A/B, or the fp8 default before/after the PR."""
    if ab:
        return [f"{SERVE}{extra} --port {FP8_PORT}                                 # fp8 (default)",
                f"{SERVE}{extra} {OPTION} bf16 --port {BF16_PORT}   # bf16"]  # fmt: skip
    return [f"{SERVE}{extra} --port {FP8_PORT}   # upstream main, then again with this PR applied"]


def needed_runs(need: str, ab: bool) -> tuple[str, list[str]]:
    """(what the run shows, the exact commands) for one entry of a PR's ``needs``."""
    ports = (FP8_PORT, BF16_PORT) if ab else (FP8_PORT,)
    vs = "fp8 vs bf16 index keys" if ab else "upstream main vs this PR (fp8, the default)"
    if need == "hicache-gsm8k":
        return (
            ("HiCache on a real server: GSM8K with `--enable-hierarchical-cache`, run twice so the second pass "
            "loads prefixes back from host memory, upstream main vs this PR. The fix may not change a score "
            "(page-aligned transfers never took the fallback); the host pool must log no page-alignment error."),
            [*_servers(False, " --enable-hierarchical-cache"),
             f"python3 -m sglang.test.few_shot_gsm8k --num-questions 1319 --parallel 256 --port {FP8_PORT}   # twice"],
        )  # fmt: skip
    if need == "gsm8k":
        return (f"GSM8K, {vs} on V4-Flash (upstream's few-shot harness, all 1,319 questions).",
                [*_servers(ab)] + [f"python3 -m sglang.test.few_shot_gsm8k --num-questions 1319 --parallel 256 "
                                   f"--port {p}" for p in ports])  # fmt: skip
    if need == "gpqa":
        return (
            (f"GPQA Diamond, {vs}, with thinking (as #26209 measured the fp4 indexer), with sgl-eval as #29619 "
            "runs it."),
            ["pip install sgl-eval", "export SGLANG_DEFAULT_THINKING=1 SGLANG_REASONING_EFFORT=max   # server side",
             *_servers(ab)]
            + [f"sgl-eval run gpqa --model {MODEL} --api-key EMPTY --n-repeats 8 --temperature 1.0 --top-p 1.0 "
               f"--thinking --base-url http://127.0.0.1:{p}/v1 --out-dir gpqa-{p}" for p in ports],
        )  # fmt: skip
    if need == "long-context-recall":
        return (
            (f"Long-context recall, {vs} on V4-Flash: needle sweeps over length x depth (1K to 64K, through "
            "4,509, 5,200 and 22,597 tokens, every residue mod 4 and page boundary), RULER-style single, "
            "multi-key and multi-value needles, multi-turn secret and tool-call recall, ~8K/12K config recall. "
            "The harness is `verify.live` in the bf16 index-K series' repository (pip extra `[live]`, no "
            "torch); it A/Bs two servers and checks each one's reported index-K format."),
            [*_servers(ab), "pip install '.[live]'   # in the series' repository",
             (f"python -m verify.live --server http://127.0.0.1:{BF16_PORT} --baseline http://127.0.0.1:{FP8_PORT} "
             "--expect-format bf16 --baseline-expect-format fp8 --out live-v4-flash")],
        )  # fmt: skip
    if need == "bench-serving":
        bench = ("python3 -m sglang.bench_serving --backend sglang --port {p} --dataset-name random "
                 "--random-input-len $len --random-output-len 512 --random-range-ratio 1 --num-prompts 64 "
                 "--max-concurrency 8 --output-file bench-{p}-$len.jsonl")  # fmt: skip
        return (
            (f"Serving speed, {vs}: TTFT, TPOT and output throughput at 8K, 32K and 128K-token prompts "
            "(the cost table above predicts the TTFT and decode factors; this measures them end to end)."),
            [*_servers(ab)] + [f"for len in 8192 32768 131072; do {bench.format(p=p)}; done" for p in ports],
        )
    if need == "pool-tokens":
        info = ("curl -s http://127.0.0.1:{p}/server_info | python3 -c \"import json, sys; "
                "print([s['max_total_num_tokens'] for s in json.load(sys.stdin)['internal_states']])\"")
        what = ("`max_total_num_tokens`, fp8 vs bf16, against the configurator's prediction in the cost table "
                "above (same memory, same flags)" if ab else
                "`max_total_num_tokens` of the fp8 default, upstream main vs this PR: it must not change "
                "(bf16's pool can only be measured once the option exists, in the next PR)")
        return (what + "; the server log prints it at start-up (`max_total_num_tokens=`).",
                [*_servers(ab)] + [info.format(p=p) for p in ports])
    if need == "mtp":
        mtp = " --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
        return (
            (f"MTP: accept length and throughput with speculative decoding, {vs} (verify rows are scored in "
            "groups by the bf16 kernel)."),
            [*_servers(ab, mtp)]
            + [f"python3 -m sglang.bench_serving --backend sglang --port {p} --dataset-name random --random-input-len "
               "32768 --random-output-len 512 --num-prompts 64 --max-concurrency 8   # prints 'Accept length'"
               for p in ports]
            + [f"curl -s http://127.0.0.1:{p}/server_info | grep -o '\"avg_spec_accept_length\": [0-9.]*'" for p in ports],
        )  # fmt: skip
    if need == "sm120":
        pd = (f"{SERVE} --disaggregation-mode prefill --disaggregation-ib-device $IB --port 30010 {OPTION} bf16",
              f"{SERVE} --disaggregation-mode decode --disaggregation-ib-device $IB --port 30011 {OPTION} bf16",
              ("python3 -m sglang_router.launch_router --pd-disaggregation --prefill http://127.0.0.1:30010 "
              "--decode http://127.0.0.1:30011 --port 30001"))
        return (
            ("All of the above again on RTX PRO 6000 (sm_120) GPUs, where the field collapse happened and where "
            "fp8 runs its own scorer (TileLang) and top-k: GSM8K, GPQA, the long-context recall A/B, "
            "bench_serving, `max_total_num_tokens` and MTP, with the bf16 server also run prefill/decode "
            "disaggregated (the failing deployment's shape; fp8 likewise for the baseline)."),
            ["# the commands above, on sm_120 GPUs; the PD pair for the bf16 side:", *pd],
        )
    raise ToolError(f"no commands for needed run {need!r}")


# --------------------------------------------------------------------------- patches


@dataclass
class FileStat:
    path: str
    added: str  # numbers as git prints them ("-" for binary)
    deleted: str
    status: str  # "new", "deleted" or ""


@dataclass
class Patch:
    name: str
    info: series.PatchInfo
    stats: list[FileStat]

    @property
    def stem(self) -> str:
        return self.name[: -len(".patch")]


def diffstat(patch: bytes, cwd: Path) -> list[FileStat]:
    """Per-file added/deleted lines (git's own count) and whether the patch creates or deletes it."""
    _, diff = series.split_message(patch)
    text = gitutil.git(["apply", "--numstat", "-"], cwd, input_bytes=diff).stdout.decode()
    files = diffs.parse(diff.decode(errors="replace"))
    created = {fd.old_path for fd in files if fd.new_file}
    removed = {fd.old_path for fd in files if fd.deleted}
    stats = []
    for line in text.splitlines():
        added, deleted, path = line.split("\t", 2)
        status = "new" if path in created else "deleted" if path in removed else ""
        stats.append(FileStat(path, added, deleted, status))
    return stats


def upstream_patch(data: bytes) -> bytes:
    """The series patch as an upstream commit: no series-only trailers (the subject is kept)."""
    head, diff = series.split_message(data)
    header, sep, message = head.partition(b"\n\n")
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
    return header + sep + body + diff


def write_pr_patches(series_dir: Path, prmap: prs.PRMap, dest: Path) -> dict[str, Path]:
    """Each PR's patches, numbered from 0001 within the PR, in ``dest/<id>/``."""
    dirs: dict[str, Path] = {}
    for pr in prmap.prs:
        d = dest / pr.id
        d.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(pr.patches, start=1):
            (d / f"{i:04d}-{name}").write_bytes(upstream_patch((series_dir / name).read_bytes()))
        dirs[pr.id] = d
    return dirs


# --------------------------------------------------------------------------- what the PR's tree says


@dataclass
class TestFile:
    path: str
    how: str  # "added by <patch>" / "changed by <patch>"
    registrations: str  # upstream's parser's reading, or why it could not be read
    problems: list[str] = field(default_factory=list)


@dataclass
class DocsRow:
    flag: str
    row: str  # the markdown table row
    source: str  # where the text came from (the option's declaration)


def _arg_fields(text: str) -> dict[str, dict[str, object]]:
    """Server-argument fields declared as ``name: A[type, "help" | Arg(...)] = default``."""
    out: dict[str, dict[str, object]] = {}
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        ann = node.annotation
        if not (isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) >= 2):
            continue
        typ, meta = ann.slice.elts[0], ann.slice.elts[1]
        info: dict[str, object] = {"type": ast.unparse(typ)}
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            info["help"] = meta.value
        elif isinstance(meta, ast.Call):
            for kw in meta.keywords:
                if kw.arg in ("help", "choices", "fallback"):
                    try:
                        info[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        info[kw.arg] = ast.unparse(kw.value)
        try:
            info["default"] = ast.literal_eval(node.value) if node.value is not None else None
        except ValueError:
            info["default"] = ast.unparse(node.value) if node.value is not None else None
        out[node.target.id] = info
    return out


def docs_row(flag: str, info: dict[str, object]) -> str:
    """A row of docs/advanced_features/server_arguments.md: | Argument | Description | Defaults | Options |."""
    help_text = re.sub(r"(--[a-z0-9-]+(?: [a-z0-9]+)?)", lambda m: f"`{m.group(1)}`", str(info.get("help", "")))
    help_text = help_text.replace("|", "\\|")
    default = info.get("fallback") if info.get("default") is None and info.get("fallback") else info.get("default")
    choices = info.get("choices")
    if isinstance(choices, list):
        options = ", ".join(f"`{c}`" for c in choices)
    elif info.get("type") == "bool":
        options = "bool flag (set to enable)"
    else:
        options = f"Type: {info.get('type')}"
    return f"| `{flag}` | {help_text} | `{default}` | {options} |"


def read_docs_rows(tree: Path, flags: tuple[str, ...]) -> list[DocsRow]:
    """The docs row of each flag, from its declaration in the tree's server-argument fields."""
    rows = []
    decls = sorted((tree / "python/sglang/srt/arg_groups/fields").glob("*.py"))
    fields_by_file = [(p, _arg_fields(p.read_text())) for p in decls]
    for flag in flags:
        name = flag.lstrip("-").replace("-", "_")
        found = next(((p, f[name]) for p, f in fields_by_file if name in f), None)
        if found is None:
            raise ToolError(f"{flag}: no server-argument field {name} in {tree.name}'s arg_groups/fields")
        rows.append(DocsRow(flag, docs_row(flag, found[1]), found[0].relative_to(tree).as_posix()))
    return rows


def read_tests(tree: Path, series_dir: Path, pr: prs.PR, ci: ModuleType | None) -> list[TestFile]:
    """The PR's test files (added or changed by its patches) with upstream's reading of their registration."""
    out: list[TestFile] = []
    for path in prs.pr_test_files(series_dir, pr):
        by = next(n for n in pr.patches if path in series.parse_patch(series_dir / n).files)
        new = path in series.parse_patch(series_dir / by).new_files
        entry = TestFile(path, f"{'added' if new else 'changed'} by {by}", "not read (no tree)")
        file = tree / path
        if ci is not None and file.is_file():
            parsed = upstreamlint.parse_test(ci, file.read_text(), path)
            entry.registrations = "; ".join(r.label for r in parsed.registrations) or "none"
            entry.problems = upstreamlint.test_problems(parsed)
        out.append(entry)
    return out


def format_result(tree: Path, t: Target, pr: prs.PR) -> str:
    """What ruff (upstream's format and isort settings) says about the PR's Python files in ``tree``."""
    files = sorted({f for name in pr.patches for f in series.parse_patch(t.series_dir / name).files
                    if f.endswith(".py") and (tree / f).is_file()})  # fmt: skip
    ruff = upstreamlint.ruff_if_any(t.root)
    if not files:
        return "no Python files"
    if ruff is None:
        return "not checked when this draft was written (no ruff at hand)"
    found = upstreamlint.ruff_findings(tree, files, ruff)
    if found:
        return f"{len(found)} finding(s) from `ruff format --check` / ruff's isort over its {len(files)} Python files"
    return f"its {len(files)} Python files are `ruff format` and ruff-isort clean"


# --------------------------------------------------------------------------- the git am (and test) check


@dataclass
class PRState:
    """What the PR's own tree (its base + its patches) says, read during the git am check."""

    tests: list[TestFile] = field(default_factory=list)
    docs: list[DocsRow] = field(default_factory=list)
    format: str = ""  # ruff format / isort (upstream's settings) over the PR's Python files, or why not checked


def check_release(
    t: Target, prmap: prs.PRMap, patch_dirs: dict[str, Path], label: str, python: seriestests.TestPython | None,
    states: dict[str, PRState] | None = None, up: upstream.Upstream | None = None,
) -> prs.ReleaseCheck:
    """`git am` each PR on its base in a scratch clone of ``t``'s upstream (``up``, else the base
    `apply` recorded); run its tests with ``python``."""
    rc = prs.ReleaseCheck(label, checked=True)
    try:
        with prs.base_clone(t, up) as (scratch, base):
            ci = upstreamlint.load_ci_register(scratch) if (scratch / upstreamlint.CI_REGISTER).is_file() else None
            base_note = f"`{base.base[:12]}` ({base.source})"

            def on_applied(pr: prs.PR, check: prs.PRCheck) -> None:
                below = prmap.prs[: prmap.prs.index(pr)]
                check.base = base_note + "".join(f" + ({p.id})" for p in below)
                check.below = [p.id for p in below]
                check.tests = prs.pr_test_files(t.series_dir, pr)
                if states is not None:
                    states[pr.id] = PRState(read_tests(scratch, t.series_dir, pr, ci),
                                            read_docs_rows(scratch, pr.docs) if pr.docs else [],
                                            format_result(scratch, t, pr))
                if python is not None:
                    present = [f for f in check.tests if (scratch / f).is_file()]
                    check.run = seriestests.run(python, scratch, select=present) if present else seriestests.TestRun(
                        scratch, absent=True)
                    print(f"pr-drafts --check: {label}: PR {pr.id}: {check.summary()}", flush=True)

            rc.prs = prs.am_prs(scratch, patch_dirs, prmap, on_applied)
    except ToolError as exc:
        rc.checked, rc.why_not = False, [str(exc).splitlines()[0].replace(f"{t.root}/", "")]
    return rc


# --------------------------------------------------------------------------- which release


def carried_versions(root: Path) -> list[str]:
    """Carried series newer than the pin, newest first."""
    pinned = project.version_key(pinmod.load(root / "pin.toml").version)
    found = [
        v for v in project.carried_versions(root)
        if (root / "series" / "next" / v / series.SERIES_FILE).is_file() and project.version_key(v) > pinned
    ]  # fmt: skip
    return sorted(found, key=project.version_key, reverse=True)


def newest_target(root: Path) -> tuple[Target, str]:
    """(target, why): the newest carried series the PR map fits, else the pin (and why not the newer)."""
    pinned = pinmod.load(root / "pin.toml")
    skipped: list[str] = []
    for version in carried_versions(root):
        t = project.target(root, version)
        prmap, problems = prs.fits(t)
        if prmap is not None:
            why = f"sglang {version}, the newest release the series is carried to (the pin is {pinned.version})"
            return t, why + ("; not the newer " + ", ".join(skipped) + ": it needs re-carrying first" if skipped else "")
        skipped.append(f"{version} (its carried series does not fit the PR map, {len(problems)} problem(s), "
                       f"first: {problems[0]})")
    why = f"sglang {pinned.version}, the pin"
    if skipped:
        why += "; not the newer carried release " + ", ".join(skipped) + ": it needs re-carrying first"
    return Target(root, None), why


# --------------------------------------------------------------------------- markdown


def _header_table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s")


def unwrap(paragraph: str) -> str:
    """Join a commit message's hard-wrapped lines (GitHub renders each newline); list items stay one per line."""
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
    return bool(re.match(r"^(tested|testing|tests?\b|how (it|this) was tested)", paragraph.strip(), re.IGNORECASE))


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
    return (sum(int(s.added) for s in stats if s.added.isdigit()),
            sum(int(s.deleted) for s in stats if s.deleted.isdigit()))  # fmt: skip


def motivation(ctx: Context, pr: prs.PR) -> list[str]:
    if pr.motivation == "patch":
        first = paragraphs(ctx.patches[pr.patches[0]].info)
        return [first[0] if first else "_the patch header has no message_", "", pr.context, ""]
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
                ("`docs/advanced_features/server_arguments.md` needs these rows in its *Kernel Backends (Attention, "
                "Sampling, Grammar, GEMM)* table, replacing the `--enable-deepseek-v4-fp4-indexer` row #27035 "
                "added there (docs are not in the wheel this PR was built against, so the text is here; the "
                "description is the option's own help text):"),
                "",
                "```markdown",
                "| Argument | Description | Defaults | Options |",
                "| --- | --- | --- | --- |",
                *[d.row for d in state.docs],
                "```",
                "",
                ("Deprecation: `--enable-deepseek-v4-fp4-indexer` keeps working as an alias of "
                f"`{OPTION} fp4` with a deprecation warning; together with another `{OPTION}` value it is an "
                "error. After resolution both fields agree (`/server_info` reports both), so code and scripts "
                "that read the old field see the same format. The DeepSeek-V4 usage tips #27035 added should "
                f"name `{OPTION} fp4`."),
                "",
            ]
        else:
            out += [("_The docs rows are read from the option's declaration in the PR's tree, which was not "
                    "available when this draft was written._"), ""]  # fmt: skip
    return out


def _tests_table(state: PRState | None) -> list[str]:
    if state is None or not state.tests:
        return ["_No test files read (the PR's tree was not available)._", ""]
    out = ["| test file | CI registration (upstream's parser) | |", "|---|---|---|"]
    for tf in state.tests:
        note = tf.how + ("; " + "; ".join(tf.problems) if tf.problems else "")
        out.append(f"| `{tf.path}` | {tf.registrations} | {note} |")
    return out + [""]


def accuracy(ctx: Context, pr: prs.PR) -> list[str]:
    state = ctx.states.get(pr.id)
    out = ["Unit tests this PR adds or changes:", "", *_tests_table(state)]
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
            out += [(f"Applied with `git am` on {on}, the tests above {verdict} on a CPU machine (Triton kernels under "
                     f"Triton's interpreter, CUDA-only tests skipped): {check.run.summary()}."), ""]  # fmt: skip
    kinds = [k for k in pr.evidence if k in ("store-parity", "read-parity", "forward", "recall")]
    for k in kinds:
        out += [ctx.evidence[k].rstrip(), ""]
    if not kinds:
        out += [("No model output changes: the fix only refuses a transfer the fallback copy could not do "
                "correctly, and the tests above cover it."), ""] if pr.motivation == "patch" else []
    return out


def speed(ctx: Context, pr: prs.PR) -> list[str]:
    kinds = [k for k in pr.evidence if k in ("store-bench", "read-bench")]
    if not kinds:
        return ["Not applicable: no kernel or hot path changes speed in this PR.", ""]
    out: list[str] = []
    for k in kinds:
        out += [ctx.evidence[k].rstrip(), ""]
    return out


def still_needs(ctx: Context, pr: prs.PR) -> list[str]:
    ab = ctx.index(pr) >= ctx.option_index()
    measured = any(k != "cost" for k in pr.evidence)
    above = ("Everything above is unit tests and kernel- or indexer-level measurements on synthetic "
             "DeepSeek-V4-shaped inputs." if measured else "Everything above is unit tests.")
    out = [
        above + " What only real hardware serving the real model can show is still open; these runs give it"
        + (f" (an fp8 server on port {FP8_PORT} and a bf16 one on {BF16_PORT}, each on its own 4 GPUs):" if ab else ":"),
        "",
    ]
    for need in pr.needs:
        what, commands = needed_runs(need, ab)
        out += [f"- [ ] {what}", "", "  ```bash", *[f"  {c}" for c in commands], "  ```", ""]
    if not pr.needs:
        out += ["- nothing beyond the unit tests above.", ""]
    return out


def checklist(ctx: Context, pr: prs.PR) -> list[str]:
    state = ctx.states.get(pr.id)
    tests = state.tests if state else []
    registered = [t for t in tests if t.how.startswith("added") and not t.problems]
    measured = [k for k in pr.evidence if k != "cost" and previdence.NOT_MEASURED not in ctx.evidence.get(k, "")]
    problems = [t for t in tests if t.problems]
    test_note = (f"{len(registered)} test file(s) added, registered for upstream's CI (table above)" if registered
                 else "no registered test file added")
    if problems:
        test_note += f"; {len(problems)} file(s) need the fixes noted in the table"
    docs_note = ("the rows are in this description; `docs/` is not part of this change yet" if pr.docs
                 else "no user-facing option or doc changes in this PR")
    bench_note = ("kernel-level results above (measured on an H200); the end-to-end runs are listed under "
                  f"\"{STILL_NEEDS}\"" if measured else f"none yet: see \"{STILL_NEEDS}\"")
    native = any(s.path.endswith((".cu", ".cuh", ".h", ".cpp", ".cc")) for name in pr.patches
                 for s in ctx.patches[name].stats)  # fmt: skip
    fmt = state.format if state and state.format else "not checked (the PR's tree was not available)"
    return [
        (f"- [ ] {CHECK_FORMAT} With the settings upstream's files follow (ruff format, line length 88; ruff's "
         f"isort, `known-first-party = [\"sglang\"]`): {fmt}. Upstream's pre-commit itself (codespell"
         + (", clang-format for the CUDA source" if native else "") + ") has not been run."),
        f"- [{'x' if registered else ' '}] {CHECK_TESTS} {test_note}.",
        f"- [ ] {CHECK_DOCS} {docs_note[:1].upper()}{docs_note[1:]}.",
        f"- [{'x' if measured else ' '}] {CHECK_BENCH} {bench_note[:1].upper()}{bench_note[1:]}.",
        f"- [ ] {CHECK_STYLE} To be confirmed in review.",
    ]


def render_draft(ctx: Context, pr: prs.PR) -> str:
    n = len(ctx.prmap.prs)
    i = ctx.index(pr)
    below = ctx.prmap.prs[: i - 1]
    base = f"SGLang {ctx.pin.version}" + (" + " + ", ".join(f"PR ({p.id}) {p.title}" for p in below) if below else "")
    meta = [("part", f"{i} of {n} of the bf16 index-K set for DeepSeek-V4"), ("base", base),
            ("commits", ", ".join(f"`{ctx.patches[name].info.subject}`" for name in pr.patches))]  # fmt: skip
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
    meta = [("drafted against", ctx.chosen),
            ("series", f"{len(ctx.patches)} patches, hash `{ctx.shash[:12]}`: {n} PRs, {len(ctx.prmap.local)} local only"),
            ("upstream commit", f"`{ctx.pin.commit}`" if ctx.pin.commit else "not recorded for this release (wheel-built base)")]  # fmt: skip
    out = [f"# bf16 index keys for DeepSeek-V4's C4 indexer: the upstream PR set ({n} PRs)", "",
           *_header_table(meta), ""]  # fmt: skip
    out += ["## The PRs", "", "Merge in this order; each applies on upstream plus the PRs above it.", ""]
    out += ["| PR | title | patches, in order | base | files | lines | Forwarded |", "|---|---|---|---|---|---|---|"]
    for pr in ctx.prmap.prs:
        stats = [s for name in pr.patches for s in ctx.patches[name].stats]
        added, deleted = _lines_added(stats)
        below = ctx.prmap.prs[: ctx.index(pr) - 1]
        base = "upstream" + "".join(f" + {p.id}" for p in below)
        fwd = ", ".join(sorted({ctx.patches[name].info.trailers.get("Forwarded", "?") for name in pr.patches}))
        out.append(f"| ({pr.id}) | [{pr.title}]({ctx.draft_file(pr)}) | {'<br>'.join(f'`{p}`' for p in pr.patches)} | "
                   f"{base} | {len(stats)} | +{added} -{deleted} | {fwd} |")
    out.append("")
    for pr in ctx.prmap.prs:
        out += [f"- ({pr.id}) {pr.context}"] + [f"  - {note}" for note in pr.notes]
    out += ["", "## Local only (Forwarded: not-needed)", "", "| patch | why it stays in the series |", "|---|---|"]
    out += [f"| `{loc.patch}` | {loc.why} |" for loc in ctx.prmap.local]
    out += ["", "## The git am check, per PR on its own base", ""]
    out += ["| release | PR | git am | its tests |", "|---|---|---|---|"]
    for rc in ctx.releases:
        if not rc.checked:
            out.append(f"| {rc.label} | all | not checked: {'; '.join(rc.why_not)} | |")
            continue
        for c in rc.prs:
            tests = ("not run: it does not apply" if not c.applies else "not run (`--check` runs them)"
                     if c.run is None else "no test files of its own" if c.run.absent else c.run.summary())
            out.append(f"| {rc.label} | ({c.pr}) | {'applies on ' + c.base if c.applies else 'FAILS: ' + c.detail} | {tests} |")
        for pr in ctx.prmap.prs[len(rc.prs):]:
            out.append(f"| {rc.label} | ({pr.id}) | not tried (an earlier PR did not apply) | |")
    out += ["", "## Applying", "", "From this folder, on a checkout of upstream SGLang at the base release:", "",
            "```bash"] + [f"git am -3 --keep-non-patch patches/{pr.id}/*.patch   # ({pr.id})" for pr in ctx.prmap.prs]
    out += ["```", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- the command


def _evidence_kinds(prmap: prs.PRMap) -> list[str]:
    kinds = ["fp8-precision"] + [k for pr in prmap.prs for k in pr.evidence]
    return list(dict.fromkeys(kinds))


def _release_label(t: Target) -> str:
    return f"{t.load_pin().version} ({'carried' if t.carried else 'pin'})"


def generate(t: Target, chosen: str, out_dir: Path | None = None, *, check: bool = False) -> Path:
    """Write the cover, one draft per PR and each PR's patches; return the folder.

    ``check``: also run each PR's tests on its base, on the pin and on the newest carried release.
    """
    return generate_checked(t, chosen, out_dir, check=check)[0]


def generate_checked(
    t: Target, chosen: str, out_dir: Path | None = None, *, check: bool = False
) -> tuple[Path, list[prs.ReleaseCheck]]:
    """:func:`generate`, also returning what the git am (and test) check found per release."""
    pin = t.load_pin()
    prmap = prs.load(t)
    problems = series.hygiene(t.series_dir)
    if problems:
        raise ToolError("series hygiene:\n  " + "\n  ".join(problems))
    order = series.read_order(t.series_dir)
    patch_info = {n: Patch(n, series.parse_patch(t.series_dir / n), diffstat((t.series_dir / n).read_bytes(), t.root))
                  for n in order}  # fmt: skip
    out = (out_dir or t.build_dir / OUT_SUBDIR / pin.version).resolve()
    if out.exists():
        shutil.rmtree(out)  # generated output: a dropped PR must not leave its old draft
    out.mkdir(parents=True)
    patch_dirs = write_pr_patches(t.series_dir, prmap, out / "patches")
    python = seriestests.find_python(t.root) if check else None
    states: dict[str, PRState] = {}
    # Without --check the drafted release's tree is used as it is (the cover says when it is not set
    # up); with it, every checked release's tree is built first and a PR's tests run on its base.
    up, why = _obtain(t) if check else (None, "")
    releases = [check_release(t, prmap, patch_dirs, _release_label(t), python, states, up) if not why
                else prs.ReleaseCheck(_release_label(t), False, [why])]  # fmt: skip
    if check:
        releases += other_releases(t, python)
    evidence = previdence.render(t.root, _evidence_kinds(prmap))
    ctx = Context(t, chosen, pin, series.series_hash(t.series_dir), prmap, patch_info, states, releases, evidence,
                  tests_run=check)  # fmt: skip
    texts = {COVER: render_cover(ctx)} | {ctx.draft_file(pr): render_draft(ctx, pr) for pr in prmap.prs}
    for name, text in texts.items():
        refs = previdence.local_refs(text, strict=name != COVER)
        if refs:
            raise ToolError(f"pr-drafts: {name} would name local paths or this repository's harness:\n  "
                            + "\n  ".join(refs[:10]))  # fmt: skip
    for name, text in texts.items():
        (out / name).write_text(text)
    return out, releases


def _obtain(t: Target) -> tuple[upstream.Upstream | None, str]:
    """Build (or find) ``t``'s upstream tree at its base: (it, "") or (None, why not)."""
    try:
        return upstream.obtain(t, quiet=True), ""
    except ToolError as exc:
        return None, "its upstream tree could not be built: " + str(exc).splitlines()[0].replace(f"{t.root}/", "")


def other_releases(drafted: Target, python: seriestests.TestPython | None) -> list[prs.ReleaseCheck]:
    """The check on the pin and on the newest carried release, whichever of them was not drafted."""
    root = drafted.root
    wanted = [Target(root, None)] + [project.target(root, v) for v in carried_versions(root)[:1]]
    out = []
    for t in dict.fromkeys(wanted):
        if t == drafted:
            continue
        label = _release_label(t)
        prmap, problems = prs.fits(t)
        if prmap is None:
            out.append(prs.ReleaseCheck(label, False, [f"its series does not fit the PR map ({problems[0]}"
                                                       + (f"; {len(problems) - 1} more" if len(problems) > 1 else "")
                                                       + "): re-carry it first"]))  # fmt: skip
            continue
        up, why = _obtain(t)
        if why:
            out.append(prs.ReleaseCheck(label, False, [why]))
            continue
        with tempfile.TemporaryDirectory(prefix="bf16k-prs-") as tmp:
            dirs = write_pr_patches(t.series_dir, prmap, Path(tmp))
            out.append(check_release(t, prmap, dirs, label, python, up=up))
    return out


# --------------------------------------------------------------------------- --pr-url


def parse_pr_urls(items: list[str], names: list[str], prmap: prs.PRMap | None = None) -> dict[str, str]:
    """`ID=URL` (every patch of that PR) or `PATCH=URL` (one patch) -> {series file name: URL}."""
    urls: dict[str, str] = {}
    ids = {pr.id: pr for pr in prmap.prs} if prmap else {}
    local = {loc.patch for loc in prmap.local} if prmap else set()
    for item in items:
        key, sep, url = item.partition("=")
        if not sep or not key or not url:
            raise ToolError(f"--pr-url expects ID=URL or PATCH=URL, got {item!r}")
        if not url.startswith("https://") or any(c.isspace() for c in url):
            raise ToolError(f"--pr-url: {url!r} is not an https URL (Forwarded: takes no, not-needed or a URL)")
        if key in ids:
            for name in ids[key].patches:
                urls[name] = url
            continue
        name = key if key.endswith(".patch") else key + ".patch"
        if name not in names:
            known = ", ".join(sorted(ids)) + ("; " if ids else "") + ", ".join(names)
            raise ToolError(f"--pr-url: no PR or patch {key!r} (known: {known or 'none'})")
        if name in local:
            raise ToolError(f"--pr-url: {name} is local only (Forwarded: not-needed in the PR map); no PR carries it")
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
    changed = [name for name, url in urls.items() if series.parse_patch(t.series_dir / name).trailers.get("Forwarded") != url]
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


def check_verdict(releases: list[prs.ReleaseCheck]) -> tuple[int, list[str]]:
    """(exit status, lines) of `--check`: 1 unless every PR applied and passed on every release."""
    lines = [f"{rc.label}: not checked: {'; '.join(rc.why_not)}" for rc in releases if not rc.checked]
    bad = [f"{rc.label} PR ({c.pr})" for rc in releases for c in rc.prs if not c.ok]
    untried = [f"{rc.label} PR ({c.pr})" for rc in releases if rc.checked for c in rc.prs if c.run is None and c.applies]
    if bad:
        lines.append(f"does not apply or its tests fail: {', '.join(bad)} (see the cover)")
    if untried:
        lines.append(f"applied but not tested: {', '.join(untried)}")
    if bad or untried or any(not rc.checked for rc in releases):
        return 1, lines
    return 0, [f"every PR applies on its base and its tests pass, on {', '.join(rc.label for rc in releases)}"]
