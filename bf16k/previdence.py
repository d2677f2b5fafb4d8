"""What a PR draft shows as evidence: the committed results, rendered for an upstream reader.

Every number comes from an artifact under ``verify/results/`` through the code that already
renders it for this repository (``verify.figures``, ``verify.bench.report``, ``verify.cost``):
nothing is typed in. What changes is the wording around it: an upstream PR cannot point at this
repository's files, so sources are named by what measured them ("measured on an NVIDIA H200"),
and :func:`local_refs` finds any path or harness name that slipped through (the drafter refuses
to write a draft that has one).

The renderers for the forward tier and the cost import torch; where the running interpreter has
none (nox's own), the blocks are rendered by a Python that has it (:func:`render`), found as the
series' tests find theirs.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bf16k import seriestests
from bf16k.errors import ToolError

RESULTS = "verify/results"
H200 = f"{RESULTS}/h200"
RECALL_ARTIFACT = f"{H200}/recall/results.json"
# Where the verify package lives (beside bf16k in this repository).
PRODUCT_ROOT = Path(__file__).resolve().parents[1]
NOT_MEASURED = "_not yet measured_"

# Anything that names this repository's files or harness instead of what it measured.
LOCAL_REF = re.compile(
    r"(/work/|/home/[A-Za-z]|/Users/|/tmp/|\bbuild/|verify/|\bverify\.[a-z_]+|\bbf16k\b|sglang-upstream|"
    r"\bseries/|DESIGN\.md|\.nox\b|\bnox -s\b|Issue #\d+)"
)
# The live tier may be named in the evidence section: it is what the reader runs (its commands).
ALLOWED_REFS = ("verify.live",)


# The cover is the series maintainers' page: it may name this repository's commands, never a machine's paths.
ABSOLUTE_PATH = re.compile(r"(/work/|/home/[A-Za-z]|/Users/|/tmp/|/root/|[A-Za-z]:\\)")


def local_refs(text: str, strict: bool = True) -> list[str]:
    """The lines of ``text`` that name a local path (``strict``: or this repository's files or harness)."""
    pattern = LOCAL_REF if strict else ABSOLUTE_PATH
    out = []
    for line in text.splitlines():
        probe = line
        for ok in ALLOWED_REFS:
            probe = probe.replace(ok, "")
        m = pattern.search(probe)
        if m:
            out.append(f"{m.group(0)!r} in: {line.strip()[:160]}")
    return out


def _verify(module: str) -> Any:
    """A module of the verify package (imported by name, so mypy does not type-check verify)."""
    if str(PRODUCT_ROOT) not in sys.path and importlib.util.find_spec("verify") is None:
        sys.path.insert(0, str(PRODUCT_ROOT))
    return importlib.import_module(module)


def _load(root: Path, rel: str) -> Any:
    path = root / rel
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _tables(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("|")]


def _gpu(meta: dict[str, Any]) -> str:
    return str(meta.get("gpu") or meta.get("cuda_device") or meta.get("device") or "a GPU")


# --------------------------------------------------------------------------- parity


def _group(name: str) -> str:
    return re.split(r"[/\[]", name, maxsplit=1)[0]


def parity_block(root: Path, which: str) -> str:
    """One kernel-parity suite (store or read), grouped: checks passed, and the largest case."""
    rel = f"{H200}/parity/{which}.json"
    res = _load(root, rel)
    what = (
        "the bf16 index-K store (fused kernel, unfused path, pool read-back)"
        if which == "store"
        else ("the bf16 index-logits scorer (Triton) against an fp64 oracle on the stored keys")
    )
    if res is None:
        return f"**Kernel parity, {which}** ({what}): {NOT_MEASURED}.\n"
    meta = res.get("meta", {})
    results = res["results"]
    passed = sum(1 for r in results if r.get("status") == "pass")
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(_group(str(r["name"])), []).append(r)
    rows = ["| checks | passed | largest case |", "|---|---|---|"]
    for group, members in groups.items():
        ok = sum(1 for r in members if r.get("status") == "pass")
        last = str(members[-1].get("summary", "")).replace("|", "\\|")
        rows.append(f"| `{group}` ({len(members)}) | {ok}/{len(members)} | {last[:160]} |")
    versions = ", ".join(f"{k} {meta[k]}" for k in ("torch", "triton") if meta.get(k))
    head = (
        f"**Kernel parity, {which}** ({what}), measured on an {_gpu(meta)}"
        + (f" ({versions})" if versions else "")
        + f": **{passed}/{len(results)} checks pass**."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- benches


def store_bench_block(root: Path) -> str:
    rel = f"{H200}/bench/bench_store.json"
    res = _load(root, rel)
    if res is None:
        return f"**Fused store, bf16 vs fp8**: {NOT_MEASURED}.\n"
    meta = res.get("meta", {})
    rows = ["| case | keys written | fp8 store us | bf16 store us | bf16 / fp8 |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        rows.append(
            f"| {r['case']} | {r['keys']:,} | {r['fp8_us']:.2f} | {r['bf16_us']:.2f} | {r['bf16_over_fp8']:.2f} |"
        )
    how = f"{meta.get('statistic', 'median')} of {meta.get('timing', '')} replays".replace("  ", " ")
    return (
        f"**Fused norm-rope store, bf16 vs fp8 keys** (measured on an {_gpu(meta)}, {how}):\n\n"
        + "\n".join(rows)
        + "\n"
    )


def read_bench_block(root: Path) -> str:
    report = _verify("verify.bench.report")
    try:
        art = report.load(root / H200 / "bench")
    except FileNotFoundError:
        return f"**bf16 index-logits scorer vs fp8**: {NOT_MEASURED}.\n"
    meta = art.read.get("meta", {})
    legend = (
        "fp8 twin: a Triton fp8 kernel over upstream's 132-B pages with DeepGEMM's signature and math "
        "(checked against DeepGEMM where both ran); DeepGEMM: its own fp8 scorers; fp8 floor: fp8's key "
        "bytes at 4.8 TB/s; TileLang: upstream's fp8 paged kernel (the scorer sm_120 runs), built for this GPU"
    )
    parts = [
        (
            f"**bf16 index-logits scorer vs fp8** (measured on an {meta.get('gpu', 'GPU')}, Triton "
            f"{meta.get('triton', '?')}; CUDA-graph replays over cold-L2 copies of the keys; the kernel's "
            f"default launch config). {legend}."
        ),
        "",
        *report.decode_table(art),
        "",
        *report.wide_table(art),
        "",
        *report.mtp_table(art),
        "",
        *report.long_prefill_table(art),
    ]
    return (
        "\n".join(parts).replace(
            "DeepGEMM's non-paged `fp8_mqa_logits`", "DeepGEMM's non-paged fp8_mqa_logits"
        )
        + "\n"
    )


# --------------------------------------------------------------------------- forward, recall


def forward_block(root: Path) -> str:
    figures = _verify("verify.figures")
    summary = figures.forward_arms(root)
    if summary is None:
        return f"**Indexer forward** (upstream's C4Indexer forward, every platform's dispatch): {NOT_MEASURED}.\n"
    text = figures.forward(root)
    flag_off = next(
        (line for line in text.splitlines() if line.startswith("Flag off vs the unpatched tree:")), ""
    )
    stand_ins = [
        (
            "the real DeepGEMM did not run in every arm: where the scorer column says so, a Triton fp8 twin with "
            "DeepGEMM's signature and math (and a torch non-paged scorer) stood in for it"
        ),
        (
            "sm_120's fp8 scorer is upstream's TileLang kernel built with TL_DISABLE_WGMMA on the H200: the mma.sync "
            "lowering whose CUDA source is byte-identical to TileLang's sm_120 source; the bf16 kernel is asked for "
            "sm_120's shared memory, so it picks that GPU's launch configs"
        ),
    ]
    head = (
        f"**Indexer forward** (measured on an {summary['gpu']}): upstream's `C4Indexer.forward` as the "
        "attention layer calls it (compressor and store, q, scorer, top-k), eager and under CUDA-graph "
        "capture/replay, per platform profile (each profile's kernel choice) and arm (index-K format x "
        "fused/unfused store); each step's stored keys are compared with a one-shot fp32 reference and its "
        f"top-k with fp64 oracles. Scenarios: {', '.join(summary['scenarios'])}."
    )
    return (
        head
        + "\n\n"
        + "\n".join(_tables(text))
        + "\n\n"
        + "".join(f"- {s}\n" for s in stand_ins)
        + ("\n" + flag_off + "\n" if flag_off else "")
    )


def recall_block(root: Path) -> str:
    figures = _verify("verify.figures")
    res = _load(root, RECALL_ARTIFACT)
    if res is None:
        return f"**Indexer recall** (synthetic V4-shaped inputs, each format's kernels): {NOT_MEASURED}.\n"
    text = figures.tier2(root)
    # The generator names its source file in a parenthesis (the device is named beside it) and
    # labels the arms for this repository's readers.
    text = re.sub(r"; source `[^`]*`\)", ")", text)
    text = text.replace("bf16 keys (series)", "bf16 keys (this PR)")
    head = (
        "**Indexer recall** on synthetic DeepSeek-V4-shaped queries and keys (seeded; needles planted at every "
        "depth), each format stored and scored by its production kernels, against unquantized oracles: "
        "*same-q* keeps the production fp8 q, *exact-q* the fp32 q. Lengths are prompt tokens (a C4 layer "
        "holds a quarter as many keys)."
    )
    return head + "\n\n" + text


# --------------------------------------------------------------------------- cost


def cost_block(root: Path) -> str:
    """The cost tables of the committed cost artifact, as verify.figures' ``cost`` block renders them."""
    if _load(root, f"{RESULTS}/cost/cost.json") is None:
        return f"The cost per format (KV-pool tokens, decode bytes, TTFT): {NOT_MEASURED}.\n"
    text = _verify("verify.figures").cost(root)
    lines = text.splitlines()
    if lines and lines[0].startswith("Source "):
        lines = lines[1:]
    body = "\n".join(lines).strip("\n")
    # Its last paragraph names the bench file and this repository's command; say what they are instead.
    body = re.sub(
        r"Kernel ratios: `[^`]*` \(([^)]*)\);",
        r"Kernel ratios: bf16 and fp8 scorer times measured on an \1;",
        body,
    )
    body = re.sub(r" How each figure is counted: .*$", "", body, flags=re.DOTALL)
    # The first model's tables inline (V4-Flash: the deployment's model), the others folded.
    models = [m.start() for m in re.finditer(r"^\*\*DeepSeek-[^*]+\*\* \(", body, re.MULTILINE)]
    closing = body.rfind("\n\nKernel ratios:")
    if len(models) > 1 and closing > models[-1]:
        folded = body[models[1] : closing].strip("\n")
        names = ", ".join(re.findall(r"^\*\*(DeepSeek-[^*]+)\*\*", folded, re.MULTILINE))
        body = (
            body[: models[1]]
            + f"<details><summary>{names}</summary>\n\n"
            + folded
            + "\n\n</details>"
            + body[closing:]
        )
    data = _load(root, f"{RESULTS}/cost/cost.json")
    notes = [a for a in data.get("assumptions", []) if not re.search(r"Issue #\d+", a)]
    details = (
        (
            "\n\n<details><summary>How each figure is counted</summary>\n\n"
            + "".join(f"- {a}\n" for a in notes)
            + "\n</details>"
        )
        if notes
        else ""
    )
    head = (
        "KV-pool tokens are upstream's `DSV4PoolConfigurator` run on CPU for each format (an H200's memory, "
        "the checkpoint's weights); decode bytes are counted per generated token; the TTFT and decode factors "
        "apply the measured bf16/fp8 scorer ratios to the indexer's share of the work."
    )
    return head + "\n\n" + body + details + "\n"


def fp8_precision(root: Path) -> str:
    """fp8's own top-512 loss from the committed recall run (a sentence fragment), or why not."""
    res = _load(root, RECALL_ARTIFACT)
    try:
        losses = [
            float(e["loss"])
            for e in (res or {})["per_length"]
            if e["arm"] == "fp8" and int(e["topk"]) == 512 and int(e["n_keys_max"]) > 512
        ]
    except (KeyError, TypeError, ValueError):
        losses = []
    if not losses:
        return "fp8's own precision loss is not yet measured"
    device = (res.get("versions") or {}).get("device", "a GPU")
    return (
        f"fp8 keys lose {100 * min(losses):.2f}-{100 * max(losses):.2f}% of the top-512 to precision "
        f"where the indexer must choose (synthetic V4-shaped inputs, measured on an {device})"
    )


BLOCKS: dict[str, Callable[[Path], str]] = {
    "store-parity": lambda root: parity_block(root, "store"),
    "read-parity": lambda root: parity_block(root, "read"),
    "store-bench": store_bench_block,
    "read-bench": read_bench_block,
    "forward": forward_block,
    "recall": recall_block,
    "cost": cost_block,
    "fp8-precision": fp8_precision,
}
NEEDS_TORCH = ("forward", "cost")


def _render_here(root: Path, kinds: Sequence[str]) -> dict[str, str]:
    return {k: BLOCKS[k](root) for k in kinds}


def render(root: Path, kinds: Sequence[str]) -> dict[str, str]:
    """Each wanted block as markdown; in a Python with torch when this one has none."""
    kinds = list(dict.fromkeys(kinds))
    unknown = [k for k in kinds if k not in BLOCKS]
    if unknown:
        raise ToolError(f"unknown evidence block(s): {', '.join(unknown)}")
    heavy = [k for k in kinds if k in NEEDS_TORCH]
    if not heavy or importlib.util.find_spec("torch") is not None:
        return _render_here(root, kinds)
    out = _render_here(root, [k for k in kinds if k not in NEEDS_TORCH])
    python = seriestests.find_python(PRODUCT_ROOT)
    proc = subprocess.run(
        [python.path, "-m", "bf16k.previdence", str(root), *heavy],
        cwd=PRODUCT_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise ToolError(
            f"rendering {', '.join(heavy)} with {python.path} failed:\n{proc.stderr.strip()[-2000:]}"
        )
    out.update(json.loads(proc.stdout))
    return {k: out[k] for k in kinds}


if __name__ == "__main__":  # python -m bf16k.previdence ROOT KIND...: the blocks as JSON (see render)
    print(json.dumps(_render_here(Path(sys.argv[1]), sys.argv[2:])))
