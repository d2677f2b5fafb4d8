"""The drafts' prose, read from ``bf16k/templates/*.md`` (package data, so an installed bf16k has it).

A template file is markdown: ``## key`` starts a section; a section's hard-wrapped lines are
joined with spaces (a list item stays a line of its own, as :func:`unwrap` does for commit
messages) and blank lines separate its paragraphs; ``${name}`` is filled in (``string.Template``).
Text before the first section (an HTML comment saying what the file is) is not read.

Here too: the set's one motivation and the commands of each run a PR still needs.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from string import Template

from bf16k.errors import ToolError

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


@cache
def sections(name: str) -> dict[str, str]:
    """The sections of ``templates/<name>.md``, by key, each unwrapped."""
    text = (resources.files("bf16k") / "templates" / f"{name}.md").read_text(encoding="utf-8")
    found: dict[str, list[str]] = {}
    key = ""
    for line in text.split("\n"):
        if line.startswith("## "):
            key = line[3:].strip()
            found[key] = []
        elif key:
            found[key].append(line)
    return {
        k: "\n\n".join(unwrap(p.strip("\n")) for p in "\n".join(body).split("\n\n") if p.strip())
        for k, body in found.items()
    }


def text(name: str, key: str, **values: object) -> str:
    """One section of ``templates/<name>.md`` with its ``${...}`` filled in from ``values``."""
    return Template(sections(name)[key]).substitute({k: str(v) for k, v in values.items()})


# --------------------------------------------------------------------------- SGLang's PR template

# SGLang's .github/pull_request_template.md (2026): its sections and checklist, in order. The
# drafts add one section of their own ("Evidence this PR still needs") before the checklist.
HEADINGS = (
    "Motivation",
    "Modifications",
    "Accuracy Tests",
    "Speed Tests and Profiling",
    "Checklist",
    "Review and Merge Process",
)
STILL_NEEDS = "Evidence this PR still needs"
CHECK_FORMAT = text("pr-template", "check-format")
CHECK_TESTS = text("pr-template", "check-tests")
CHECK_DOCS = text("pr-template", "check-docs")
CHECK_BENCH = text("pr-template", "check-bench")
CHECK_STYLE = text("pr-template", "check-style")
REVIEW = tuple(text("pr-template", "review").split("\n"))


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
    return text(
        "motivation",
        "motivation",
        precision=precision,
        collapses=collapses,
        open_on_sm120=_link(OPEN_ON_SM120),
    )


# --------------------------------------------------------------------------- commands for what is still needed

MODEL = "deepseek-ai/DeepSeek-V4-Flash"
SERVE = f"python3 -m sglang.launch_server --model-path {MODEL} --trust-remote-code --tp 4"
FP8_PORT, BF16_PORT = 30000, 30001
OPTION = "--deepseek-v4-indexer-k-dtype"


def _servers(ab: bool, extra: str = "") -> list[str]:
    """Launch lines: fp8 (default) and bf16 for an A/B, or the fp8 default before/after the PR."""
    if ab:
        return [
            f"{SERVE}{extra} --port {FP8_PORT}                                 # fp8 (default)",
            f"{SERVE}{extra} {OPTION} bf16 --port {BF16_PORT}   # bf16",
        ]
    return [f"{SERVE}{extra} --port {FP8_PORT}   # upstream main, then again with this PR applied"]


def _what(need: str, ab: bool) -> str:
    """What the run shows (templates/needed-runs.md)."""
    key = f"{need} ab" if ab and f"{need} ab" in sections("needed-runs") else need
    vs = "fp8 vs bf16 index keys" if ab else "upstream main vs this PR (fp8, the default)"
    return text("needed-runs", key, vs=vs)


def needed_runs(need: str, ab: bool) -> tuple[str, list[str]]:
    """(what the run shows, the exact commands) for one entry of a PR's ``needs``."""
    ports = (FP8_PORT, BF16_PORT) if ab else (FP8_PORT,)
    if need == "hicache-gsm8k":
        return _what(need, ab), [
            *_servers(False, " --enable-hierarchical-cache"),
            f"python3 -m sglang.test.few_shot_gsm8k --num-questions 1319 --parallel 256 --port {FP8_PORT}   # twice",
        ]
    if need == "gsm8k":
        return _what(need, ab), [*_servers(ab)] + [
            f"python3 -m sglang.test.few_shot_gsm8k --num-questions 1319 --parallel 256 --port {p}"
            for p in ports
        ]
    if need == "gpqa":
        return _what(need, ab), [
            "pip install sgl-eval",
            "export SGLANG_DEFAULT_THINKING=1 SGLANG_REASONING_EFFORT=max   # server side",
            *_servers(ab),
        ] + [
            f"sgl-eval run gpqa --model {MODEL} --api-key EMPTY --n-repeats 8 --temperature 1.0 --top-p 1.0 "
            f"--thinking --base-url http://127.0.0.1:{p}/v1 --out-dir gpqa-{p}"
            for p in ports
        ]
    if need == "long-context-recall":
        return _what(need, ab), [
            *_servers(ab),
            "pip install '.[live]'   # in the series' repository",
            (
                f"python -m verify.live --server http://127.0.0.1:{BF16_PORT} --baseline http://127.0.0.1:{FP8_PORT} "
                "--expect-format bf16 --baseline-expect-format fp8 --out live-v4-flash"
            ),
        ]
    if need == "bench-serving":
        bench = (
            "python3 -m sglang.bench_serving --backend sglang --port {p} --dataset-name random "
            "--random-input-len $len --random-output-len 512 --random-range-ratio 1 --num-prompts 64 "
            "--max-concurrency 8 --output-file bench-{p}-$len.jsonl"
        )
        return _what(need, ab), [*_servers(ab)] + [
            f"for len in 8192 32768 131072; do {bench.format(p=p)}; done" for p in ports
        ]
    if need == "pool-tokens":
        info = (
            'curl -s http://127.0.0.1:{p}/server_info | python3 -c "import json, sys; '
            "print([s['max_total_num_tokens'] for s in json.load(sys.stdin)['internal_states']])\""
        )
        return _what(need, ab), [*_servers(ab)] + [info.format(p=p) for p in ports]
    if need == "mtp":
        mtp = " --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
        return _what(need, ab), [*_servers(ab, mtp)] + [
            f"python3 -m sglang.bench_serving --backend sglang --port {p} --dataset-name random --random-input-len "
            "32768 --random-output-len 512 --num-prompts 64 --max-concurrency 8   # prints 'Accept length'"
            for p in ports
        ] + [
            f"curl -s http://127.0.0.1:{p}/server_info | grep -o '\"avg_spec_accept_length\": [0-9.]*'"
            for p in ports
        ]
    if need == "sm120":
        return _what(need, ab), [
            "# the commands above, on sm_120 GPUs; the PD pair for the bf16 side:",
            f"{SERVE} --disaggregation-mode prefill --disaggregation-ib-device $IB --port 30010 {OPTION} bf16",
            f"{SERVE} --disaggregation-mode decode --disaggregation-ib-device $IB --port 30011 {OPTION} bf16",
            (
                "python3 -m sglang_router.launch_router --pd-disaggregation --prefill http://127.0.0.1:30010 "
                "--decode http://127.0.0.1:30011 --port 30001"
            ),
        ]
    raise ToolError(f"no commands for needed run {need!r}")
