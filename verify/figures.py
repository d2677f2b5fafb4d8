"""Every figure a user reads, generated from the committed results.

README.md and the results READMEs hold blocks between ``<!-- figures:NAME -->`` and
``<!-- /figures:NAME -->``; this module renders each block from the artifacts under
``verify/results/`` (the tier-2 recall, the forward tier, the per-platform diagnosis, tier-1
parity, the sm_120 comparison). ``python -m verify.figures --write`` refreshes them after a new
run, and is the only code that writes them; ``--check`` (the default; a test runs it) fails when a
block differs from what its artifact says. A block whose artifact is missing says so: it is never
filled by hand.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from verify.core.oracles import ORACLES_NOTE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "verify/results"
H200 = f"{RESULTS}/h200"
CPU = f"{RESULTS}/cpu"
COST = f"{RESULTS}/cost"
DOCS = ("README.md", f"{H200}/README.md", f"{CPU}/README.md", f"{COST}/README.md")
# What produced verify/results/cost/ (no GPU; upstream's configurator on PYTHONPATH).
COST_COMMAND = f"python -m verify.cost --out {COST}/cost.json"
# The CPU emulation at the H200 run's lengths and sampling (the exact quantization semantics of
# every format, no kernel): what produced verify/results/cpu/recall/.
CPU_TIER2_COMMAND = (
    "python -m verify.recall --backend cpu --out verify/results/cpu/recall --lengths 338 2048 4509 "
    "5200 8000 12000 22597 32768 65536 131072 --sequences 2 --residues all"
)
BLOCK = re.compile(r"(<!-- figures:([\w-]+) -->\n)(.*?)(<!-- /figures:\2 -->)", re.DOTALL)

TIER2_LENGTHS = (4509, 22597, 131072)
TIER2_ARMS = (
    ("bf16", "bf16 keys (series)"),
    ("fp8", "fp8 keys (upstream)"),
    ("fp4", "fp4 q and keys (upstream's fp4 indexer, emulated)"),
    ("fp4sim", "fp4-sim keys, fp8 q (QAT format)"),
    ("bf16q", "bf16 keys, bf16 q"),
    ("int8sim", "int8 + fp32 scale (132 B)"),
    ("fp8b32sim", "e4m3 + per-32 ue8m0 (132 B)"),
)


def _load(root: Path, rel: str) -> Any:
    path = root / rel
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _missing(rel: str, command: str) -> str:
    return f"_Not measured yet: `{rel}` is missing (produce it with `{command}`)._\n"


# Tier 2 on the H200 per platform profile: the folder each profile's run is committed in.
TIER2_H200_RUNS = (("sm90", f"{H200}/recall"), ("sm120", f"{H200}/recall-sm120"))


def tier2(root: Path) -> str:
    """One table per platform profile (the fp8 path each GPU's dispatch runs)."""
    return "\n".join(
        _tier2(root, f"{folder}/results.json", f"TIER2_PLATFORMS={profile} verify/gpu/run.sh setup tier2")
        for profile, folder in TIER2_H200_RUNS
    )


def tier2_cpu(root: Path) -> str:
    return _tier2(root, f"{CPU}/recall/results.json", CPU_TIER2_COMMAND)


def _tier2(root: Path, rel: str, command: str) -> str:
    res = _load(root, rel)
    if res is None:
        return _missing(rel, command)
    by = {(e["arm"], e["topk"], e["length_tokens"]): e for e in res["per_length"]}
    arms = [(a, label) for a, label in TIER2_ARMS if any(k[0] == a for k in by)]
    lengths = [n for n in TIER2_LENGTHS if ("bf16", 512, n) in by]
    exact = any("recall_tie_unq" in e for e in res["per_length"])
    ref = any("recall_tie_ref" in e for e in res["per_length"])
    metrics = ["recall_tie"] + (["recall_tie_unq"] if exact else []) + (["recall_tie_ref"] if ref else [])
    labels = [label for _, label in arms] + (
        ["DeepSeek's reference selection (fp4 q x fp4 k)"] if ref else []
    )
    lines = ["| tokens | " + " | ".join(labels) + " |", "|---" * (1 + len(labels)) + "|"]
    for n in lengths:
        cells = []
        for a, _ in arms:
            e = by.get((a, 512, n))
            cells.append("-" if e is None else " / ".join(f"{e[m]['mean']:.4f}" for m in metrics if m in e))
        if ref:
            e = by[("bf16", 512, n)]
            cells.append(f"{e['ref_recall_tie']['mean']:.4f} / {e['ref_recall_tie_unq']['mean']:.4f} / 1")
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    oracles = (
        "same-q / exact-q / reference oracle"
        if ref
        else "same-q / exact-q oracle"
        if exact
        else "same-q oracle"
    )
    gate = res["gate"]
    needle = next(c for c in gate["conditions"] if c["name"] == "needle")
    hits = re.search(r"(\d+)/(\d+)", needle["detail"])
    fp8_g = [e for k, e in by.items() if k[0] == "fp8"]
    fp8_hits = sum(e["gated_hits"] for e in fp8_g), sum(e["gated_needles"] for e in fp8_g)
    platform = res["config"].get("platform", "auto (before platform profiles: upstream's torch fp8 fallback)")
    score_fp8 = res["backend"]["paths"].get("score_fp8", "?")
    # the stand-in's or the build's note, shortened to the function and what stood in
    score_fp8 = score_fp8.split(" (")[0].split(" [")[0].split(" standing in for")[0] + (
        " (Triton twin standing in for DeepGEMM)"
        if "standing in for deep_gemm" in score_fp8
        else " (built with TL_DISABLE_WGMMA: sm_120's mma.sync source)"
        if "TL_DISABLE_WGMMA" in score_fp8
        else ""
    )
    out = [
        (
            f"Tie-aware top-512 recall, {oracles} "
            + (
                f"(CPU emulation of every format's quantization, no kernel ran; source `{rel}`):"
                if res["backend"].get("name", "").startswith("cpu") or res["config"].get("backend") == "cpu"
                else f"({res['versions'].get('device', '?')}, fp8 path of platform `{platform}`: "
                f"`{score_fp8}`; source `{rel}`):"
            )
        ),
        "",
        *lines,
        "",
        (
            f"Gate ({gate.get('oracle', 'same-q oracle')}): **{'PASS' if gate['passed'] else 'FAIL'}**; bf16 keeps "
            f"{hits.group(1) if hits else '?'}/{hits.group(2) if hits else '?'} needles the oracle keeps with >= 1% margin, "
            f"fp8 {fp8_hits[0]}/{fp8_hits[1]}."
        ),
    ]
    ge = res.get("gate_exact_q")
    if ge:
        failed = [c["name"] for c in ge["conditions"] if not c["passed"]]
        out.append(
            f"Against the exact-q oracle the same conditions {'hold' if ge['passed'] else 'fail (' + ', '.join(failed) + ')'}"
            " (reported, not gating)."
        )
    if ref:
        out += ["", ORACLES_NOTE]
    return "\n".join(out) + "\n"


def _forward_results(root: Path) -> tuple[list[str], dict[str, Any] | None]:
    """Every forward-tier run under h200/forward/*/ merged (one folder per device call)."""
    runs = sorted((root / H200 / "forward").glob("*/results.json"))
    if not runs:
        return [f"{H200}/forward/<run>/results.json"], None
    from verify.core.forward_runs import merge_runs

    # folders sort by name (the run's time stamp): a later run of the same arm replaces an earlier
    merged = merge_runs(runs)
    return [p.relative_to(root).as_posix() for p in runs], merged


FORWARD_ARMS = f"{H200}/forward/arms.json"
# What a scorer role ran in a forward arm when the arm's ``replaced`` list says it was replaced.
_STAND_IN_LABELS = (
    ("score_deepgemm_nonpaged", "deep_gemm stand-in", "torch stand-in"),
    ("score_deepgemm", "deep_gemm stand-in", "Triton fp8 twin stand-in"),
    ("score_tilelang", "TL_DISABLE_WGMMA", "mma.sync build, sm_120's source"),
)


def _scorer_label(role: str, replaced: Sequence[str]) -> str:
    for name, marker, label in _STAND_IN_LABELS:
        if role == name and any(marker in r for r in replaced):
            return f"{role} ({label})"
    return role


def _mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the values recorded (runs before a field existed have none), to 4 places."""
    got = [v for v in values if v is not None]
    return round(sum(got) / len(got), 4) if got else None


def forward_arms(root: Path) -> dict[str, Any] | None:
    """Per profile and arm, over the merged forward runs: what README's forward table quotes.
    Written to ``FORWARD_ARMS`` by ``--write`` (the figures stand in a committed artifact) and
    compared with the runs by ``check``."""
    rel, res = _forward_results(root)
    if res is None:
        return None
    arms = []
    for meta in res["arms"]:
        steps = [s for s in res["steps"] if s["profile"] == meta["profile"] and s["arm"] == meta["arm"]]
        sel = [x for s in steps for x in s["selection"]]
        arms.append(
            {
                "profile": meta["profile"],
                "arm": meta["arm"],
                "steps": len(steps),
                "steps_passed": sum(s["status"] == "pass" for s in steps),
                "scorers": [_scorer_label(r, meta.get("replaced", [])) for r in meta["scorers"]],
                "topks": meta["topks"],
                "min_same_input_agreement": round(
                    min((x["numbers"]["min_recall_same_input"] for x in sel), default=float("nan")), 4
                ),
                "mean_exact_oracle_recall": round(sum(x["recall_exact"] for x in sel) / len(sel), 4)
                if sel
                else None,
                "mean_reference_recall": _mean_or_none([x.get("recall_reference") for x in sel]),
                "peak_mib": round(max((s["peak_mb"] or 0 for s in steps), default=0)),
                "replaced": meta.get("replaced", []),
            }
        )
    return {
        "sources": rel,
        "gpu": res["versions"].get("gpu", "?"),
        "scenarios": sorted({s["scenario"] for s in res["steps"]}),
        "arms": arms,
        "baseline": res.get("baseline", {}),
    }


def forward(root: Path) -> str:
    summary = forward_arms(root)
    if summary is None:
        return _missing(_forward_results(root)[0][0], "verify/gpu/run.sh setup forward")
    rows = [
        (
            "| profile | arm | steps passed | scorer | top-k | min same-input agreement | mean exact-oracle recall "
            "| mean overlap with DeepSeek's reference selection | peak MiB |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a in summary["arms"]:
        exact = "n/a" if a["mean_exact_oracle_recall"] is None else f"{a['mean_exact_oracle_recall']:.4f}"
        ref = a.get("mean_reference_recall")
        ref_text = "not recorded" if ref is None else f"{ref:.4f}"
        rows.append(
            f"| {a['profile']} | {a['arm']} | {a['steps_passed']}/{a['steps']} | {', '.join(a['scorers'])} | "
            f"{', '.join(a['topks'])} | {a['min_same_input_agreement']:.4f} | {exact} | {ref_text} | "
            f"{a['peak_mib']} |"
        )
    from verify.core.forward_runs import flag_off_status

    replaced = sorted({r for a in summary["arms"] for r in a["replaced"]})
    base = (
        "; ".join("{}: {} ({})".format(p, *flag_off_status(b)) for p, b in summary["baseline"].items())
        or "not run"
    )
    sources = ", ".join(f"`{r}`" for r in summary["sources"])
    return (
        f"Source {sources} ({summary['gpu']}), per arm in `{FORWARD_ARMS}`; scenarios: "
        f"{', '.join(summary['scenarios'])}. The reference column (reported, not gated) is the mean "
        "tie-aware overlap of each step's selection with what DeepSeek's reference numerics (fp4 q x "
        "fp4 keys) select on the same inputs; runs made before it was recorded say so.\n\n"
        + "\n".join(rows)
        + "\n\nReplaced in these runs (each arm's `replaced` list says which):\n\n"
        + "".join(f"- {r}\n" for r in replaced)
        + f"\nFlag off vs the unpatched tree: {base}.\n"
    )


def flag_off(root: Path) -> str:
    """Per profile, the latest flag-off comparison with the unpatched tree, step by step where
    the selections differ (what the forward block's one line sums up)."""
    from verify.core.forward_runs import flag_off_status

    rels, res = _forward_results(root)
    if res is None or not res["baseline"]:
        return _missing(
            rels[0] if res is None else f"{H200}/forward/<run>/results.json",
            "verify/gpu/run.sh setup forward",
        )
    latest = {
        profile: (res["baseline_from"][profile].relative_to(root).as_posix(), record)
        for profile, record in res["baseline"].items()
    }

    def yes_no(value: Any) -> str:
        return "not run" if value is None else "yes" if value else "no"

    out = []
    for profile, (rel, record) in sorted(latest.items()):
        status, detail = flag_off_status(record)
        differing = record.get("differing_steps")
        if differing is None:  # recorded before differences were classified
            out.append(f"- **{profile}** (`{rel}`): {status}: {detail}")
            continue
        steps = record.get("steps", 0)
        out.append(
            f"- **{profile}** (`{rel}`; control: {record.get('control') or 'none'}): {status}; "
            f"{steps - len(differing)} of {steps} steps select the same slots as the unpatched tree; "
            f"pool bytes differ on {len(record.get('pool_differs', []))} steps"
        )
        for step, e in differing.items():
            out.append(
                f"  - `{step}`: {e['rows']} of {e['of_rows']} rows differ, at most {e['max_slots_per_row']} "
                f"slots a row; same-input oracle: patched {e['patched_oracle_check']}, unpatched "
                f"{e['unpatched_oracle_check']}; unpatched rerun differs: {yes_no(e.get('unpatched_rerun_differs'))}; "
                f"patched rerun differs: {yes_no(e.get('patched_rerun_differs'))}; the scores the top-k read "
                f"differ on those rows: {yes_no(e.get('scores_differ_on_those_rows'))}"
            )
    return "\n".join(out) + "\n"


def diagnosis(root: Path) -> str:
    parts = []
    for profile in ("sm90", "sm100", "sm120"):
        rel = f"{H200}/diagnose/{profile}/diagnosis.json"
        res = _load(root, rel)
        if res is None:
            continue
        how = res.get("refolded")
        source = (
            f"checks measured in `{how['checks_from']}`, folded with the forward runs above"
            if how
            else "checks and forward runs as measured"
        )
        parts.append(f"**{profile}** (`{rel}`; {source}):\n")
        for c in res["components"]:
            parts.append(f"- {c['status']}: {c['component']}")
        parts.append("")
    if not parts:
        return _missing(f"{H200}/diagnose/<profile>/diagnosis.json", "verify/gpu/run.sh setup diagnose")
    return "\n".join(parts)


def parity(root: Path) -> str:
    out = []
    for name in ("store", "read"):
        rel = f"{H200}/parity/{name}.json"
        res = _load(root, rel)
        if res is None:
            out.append(f"- {name}: " + _missing(rel, "verify/gpu/run.sh setup tier1").strip())
            continue
        results = res["results"]
        passed = sum(1 for r in results if r.get("status") == "pass")
        failed = [r["name"] for r in results if r.get("status") != "pass"]
        out.append(
            f"- {name} parity: {passed}/{len(results)} checks pass (`{rel}`)"
            + (f"; not passed: {', '.join(failed)}" if failed else "")
        )
    return "\n".join(out) + "\n"


def sm120(root: Path) -> str:
    rel = f"{RESULTS}/sm120/sm120.json"
    res = _load(root, rel)
    if res is None:
        return _missing(rel, "python -m verify.recall.sm120 --out verify/results/sm120")
    out = []
    tl = res.get("tilelang")
    if tl:
        out.append(
            f"- TileLang scorer: sm_120's CUDA source {'is byte-identical to' if tl['sm_120_equals_sm_90a_no_wgmma'] else 'DIFFERS from'}"
            " the sm_90 mma.sync variant the H200 runs for the sm120 profile"
        )
    for k in res["jit"]:
        if "error" in k:
            out.append(f"- {k['kernel']}: not compared ({k['error'][:120]})")
            continue
        regs = {t: "/".join(str(r.get("registers", "?")) for r in v) for t, v in k["resources"].items()}
        emitted = [m for m, a in k.get("code_path_asm", {}).items() if a["emitted"]]
        paths = (
            "same code paths"
            if not k["code_path_diff"]
            else f"{len(k['code_path_diff'])} header lines chosen differently by #if, "
            + (f"emitting {emitted}" if emitted else "none of them in the kernel's PTX")
        )
        variant = (
            "sm_120's macro choices built for sm_90: the same PTX"
            if k.get("sm120_macros_on_sm90_same_ptx")
            else "sm_120's macro choices built for sm_90: DIFFERENT PTX"
        )
        out.append(
            f"- {k['kernel']}: {paths}; {variant}; registers sm_90a {regs['sm_90a']}, sm_120f {regs['sm_120f']}"
        )
    return f"Source `{rel}` (nvcc and TileLang, no GPU):\n\n" + "\n".join(out) + "\n"


def bf16_compile(root: Path) -> str:
    """What patch 4's kernel compiles to for each GPU (verify.bench.read_compile's JSON)."""
    rel = f"{RESULTS}/sm120/bf16-read-compile.json"
    res = _load(root, rel)
    if res is None:
        return _missing(rel, f"python -m verify.bench.read_compile --out {rel}")
    from verify.bench.read_compile import TARGETS

    lines = [
        (
            f"Source `{rel}` (Triton {res['triton']}, compiled for each GPU without one; each with "
            "the configs the kernel module selects for that GPU's shared memory):"
        ),
        "",
        "| GPU | variant | tile/warps/stages | shared memory B (limit) | tensor-core op | registers | notes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["reports"]:
        if r["kernel"] != "_bf16_paged_mqa_logits_kernel":
            continue
        c = r["config"]
        fits = "" if r["shared_bytes"] <= r["shared_limit"] else " **does not fit**"
        variant = r["variant"] if r["production"] else f"*{r['variant']}*"
        lines.append(
            f"| {r['target']} | {variant} | {c['block_n']}/w{c['num_warps']}/s{c['num_stages']} | "
            f"{r['shared_bytes']:,} ({r['shared_limit']:,}){fits} | "
            f"{TARGETS[r['target']][1] if r['tensor_core'] else 'none'} | {r['registers']} | {'; '.join(r['notes'])} |"
        )
    return "\n".join(lines) + "\n"


def carry_timings(root: Path) -> str:
    """How long each carried series' tests and bisect took, from its carried.toml (a re-carry
    rewrites them)."""
    from bf16k import carried, series
    from bf16k.project import version_key

    folder = root / "series" / "next"
    versions = sorted(
        (p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else [], key=version_key
    )
    if not versions:
        return "No carried series yet (`nox -s rebase -- <release>`).\n"
    parts = []
    for i, v in enumerate(versions):
        got = carried.load(folder / v).verified
        n = len(series.read_order(folder / v))
        parts.append(
            f"the {v} carry ran the series' tests in {got.tests_seconds} s and bisected its {n} prefixes "
            f"in {got.bisect_seconds} s"
            if i == 0
            else f"{v}'s took {got.tests_seconds} s and {got.bisect_seconds} s"
        )
    return (
        "Measured on this project's 2-core CPU machine (from each `carried.toml`): "
        + "; ".join(parts)
        + ".\n"
    )


def gpu_tests(root: Path) -> str:
    """The series' tests on the GPU, one line per committed junit file of the tests stage."""
    import xml.etree.ElementTree as ET

    files = sorted((root / H200 / "logs").glob("tests-gpu-*-junit.xml"))
    if not files:
        return _missing(f"{H200}/logs/tests-gpu-*-junit.xml", "verify/gpu/run.sh setup tests")
    out = []
    for path in files:
        suites = list(ET.parse(path).getroot().iter("testsuite"))
        count = {
            k: sum(int(su.attrib.get(k, 0)) for su in suites)
            for k in ("tests", "skipped", "failures", "errors")
        }
        seconds = sum(float(su.attrib.get("time", 0)) for su in suites)
        passed = count["tests"] - count["skipped"] - count["failures"] - count["errors"]
        out.append(
            f"- `{path.relative_to(root)}`: {passed} passed, {count['skipped']} skipped, "
            f"{count['failures']} failed, {count['errors']} errors ({seconds:.0f} s)"
        )
    return "\n".join(out) + "\n"


DEEPGEMM = f"{H200}/deepgemm"


def deepgemm(root: Path) -> str:
    """What the deepgemm stage's logs say: the pins, each check's outcome, DeepGEMM's own tests."""
    folder = root / DEEPGEMM
    stage = sorted(folder.glob("stage-*.log"))
    if not stage:
        return _missing(f"{DEEPGEMM}/stage-*.log", "verify/gpu/run.sh deepgemm (carry .whl/dg)")
    pin_line = re.compile(r"^(deepgemm|cutlass|fmt) [0-9a-f]{40}$", re.MULTILINE)
    # The checks mean most on a fresh machine: the latest log of a call that built DeepGEMM (it
    # prints the pins; a later call on the same machine finds the JIT cache its runs filled).
    built = [p for p in stage if pin_line.search(t := p.read_text()) and "build reused" not in t]
    source = (built or stage)[-1]
    text = source.read_text()
    pins = dict(line.split(" ", 1) for line in text.splitlines() if pin_line.match(line))
    out = [
        f"Source `{source.relative_to(root)}` and the logs beside it; built from "
        + ", ".join(f"{k} `{v[:7]}`" for k, v in pins.items())
        + ":\n"
    ]

    def section(n: int, body: str) -> str:
        m = re.search(rf"^--- {n}\..*?$(.*?)(?=^--- \d\.|^=== |\Z)", body, re.DOTALL | re.MULTILINE)
        return m.group(1) if m else ""

    def exit_of(chunk: str) -> str:
        codes = re.findall(r"^exit (\d+)$", chunk, re.MULTILINE)
        if not codes:
            return "no exit status logged"
        code = int(codes[-1])
        return (
            "returned" if code == 0 else ("segmentation fault (exit 139)" if code == 139 else f"exit {code}")
        )

    first = section(1, text)
    out.append(f"- the metadata call: {exit_of(first)}")
    cache = section(2, text)
    out.append(
        "- JIT cache afterwards: " + ("none" if "No such file" in cache or not cache.strip() else "present")
    )
    raised = re.search(r"RuntimeError: (.*)", section(3, text))
    out.append(
        "- 1-D context_lens: " + (f"raises `{raised.group(1).strip()}`" if raised else "did not raise")
    )
    frame = re.search(
        r"^#\d+\s+(?:0x[0-9a-f]+ in )?(deep_gemm::[\w:<>]+) \(.*? at (\S+:\d+)",
        section(4, text),
        re.MULTILINE,
    )
    out.append(
        "- backtrace: "
        + (f"`{frame.group(1)}` at `{frame.group(2).split('/')[-1]}`" if frame else "no DeepGEMM frame")
    )
    pre = sorted(folder.glob("libstdcxx-preload-*.log"))
    chunk = section(5, text) or (pre[-1].read_text() if pre else "")

    def linked(chunk: str, name_linker: bool = True) -> str:
        by = re.search(r"^extension built by: (\S+)", chunk, re.MULTILINE) if name_linker else None
        count = re.search(r"^std::locale symbols defined in the extension: (\d+)", chunk, re.MULTILINE)
        parts = ([f"linked by `{by.group(1)}`"] if by else []) + (
            [f"{count.group(1)} `std::locale` symbols defined inside it"] if count else []
        )
        return f" ({'; '.join(parts)})" if parts else ""

    if chunk:
        maps = re.findall(r"/\S*libstdc\+\+\S*?(?=')", chunk)
        out.append(
            f"- the same call with the system g++'s libstdc++ preloaded: {exit_of(chunk)}"
            + (f" (the process maps {', '.join(f'`{m}`' for m in sorted(set(maps)))})" if maps else "")
        )
        if linked(chunk):
            out.append(f"- the extension above{linked(chunk)}")
    rebuilt = section(6, text)
    if rebuilt:
        compiler = re.search(r"^--- 6\. DeepGEMM built and linked by (\S+)", text, re.MULTILINE)
        out.append(
            f"- rebuilt and linked by `{compiler.group(1) if compiler else '?'}`{linked(rebuilt, name_linker=False)}, "
            f"the metadata call without a preload: {exit_of(rebuilt)}"
        )
    for log in sorted(folder.glob("test-attention-*.log")):
        body = log.read_text()
        cases = len(re.findall(r"^ > ", body, re.MULTILINE))
        failed = re.search(r"(AssertionError|Error:|Traceback)", body)
        out.append(
            f"- DeepGEMM's `tests/test_attention.py` (`{log.name}`): {cases} cases timed, "
            + (f"failed ({failed.group(1)})" if failed else "no assertion failed")
            + "; sections reached: "
            + ", ".join(re.findall(r"^Testing (.*?):?$", body, re.MULTILINE))
        )
    return "\n".join(out) + "\n"


def speed(root: Path) -> str:
    from verify.bench import report

    try:
        art = report.load(root / H200 / "bench")
    except FileNotFoundError as exc:
        return f"_Not measured yet: {exc}._\n"
    return report.render_body(art)


# The grouped MTP sweep session 8 ran (later sessions' benches sweep the prefill scorer instead).
MTP_SWEEP_BENCH = "bench/session-8"


def mtp_sweep(root: Path) -> str:
    from verify.bench import report

    try:
        art = report.load(root / H200 / MTP_SWEEP_BENCH)
    except FileNotFoundError as exc:
        return f"_Not measured yet: {exc}._\n"
    return "\n".join(report.mtp_sweep_table(art)) + "\n"


def cost(root: Path) -> str:
    """KV capacity, decode bytes, prefill share and speed factors per index-K format (verify.cost)."""
    rel = f"{COST}/cost.json"
    data = _load(root, rel)
    if data is None:
        return _missing(rel, COST_COMMAND)
    from verify.cost.report import markdown

    return (
        f"Source `{rel}` (upstream's pool configurator on CPU; kernel ratios from the H200 bench):\n\n"
        + markdown(data)
    )


# The format guide's rows: what the series' option calls each format and what it stores per key.
GUIDE_FORMATS = (
    ("fp8", "`fp8` (upstream's default)", "e4m3 + fp32 scale"),
    ("bf16", "`bf16` (this series)", "bf16, no scale"),
    ("fp4", "`fp4` (upstream's fp4 indexer)", "e2m1 + ue8m0 a 32; q in fp4 too"),
)
GUIDE_MODEL = "DeepSeek-V4-Flash"
GUIDE_COST_LENGTHS = (32768, 1048576)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def format_guide(root: Path) -> str:
    """One row per index-K format: tier 2's overlap with exact math, with upstream's fp8 q and
    with DeepSeek's reference selection (CPU emulation), beside what ``verify.cost`` says the
    format costs (V4-Flash)."""
    rel_recall, rel_cost = f"{CPU}/recall/results.json", f"{COST}/cost.json"
    res, cost_data = _load(root, rel_recall), _load(root, rel_cost)
    if res is None:
        return _missing(rel_recall, CPU_TIER2_COMMAND)
    if cost_data is None:
        return _missing(rel_cost, COST_COMMAND)
    recall = {(r["arm"], r["length_tokens"]): r for r in res["per_length"] if r["topk"] == 512}
    model = next(m for m in cost_data["models"] if m["shape"]["name"] == GUIDE_MODEL)
    caps = {(c["mode"], c["fmt"]): c for c in model["capacity"]}
    per_len = {row["tokens"]: row for row in model["per_length"]}

    def overlap(arm: str, key: str) -> str:
        return " / ".join(f"{recall[(arm, n)][key]['mean']:.3f}" for n in TIER2_LENGTHS)

    def pool(fmt: str) -> str:
        parts = []
        for mode in ("ratio", "cap"):
            ratio = caps[(mode, fmt)]["full_tokens"] / caps[(mode, "fp8")]["full_tokens"] - 1
            parts.append(f"{ratio:+.1%}")
        return " / ".join(parts)

    def decode_bytes(fmt: str) -> str:
        return " / ".join(
            _ratio(per_len[n]["decode_bytes"][fmt]["total"] / per_len[n]["decode_bytes"]["fp8"]["total"])
            for n in GUIDE_COST_LENGTHS
        )

    def ttft(fmt: str) -> str:
        if fmt == "fp8":
            return "1 (baseline)"
        values = [per_len[n]["ttft_factor"].get(fmt) for n in GUIDE_COST_LENGTHS]
        if all(v is None for v in values):
            return "not measured (no Hopper kernel)"
        return " / ".join(_ratio(v) for v in values)

    lengths = " / ".join(f"{n / 1000:.1f}K" if n < 100000 else f"{n / 1000:.0f}K" for n in TIER2_LENGTHS)
    cost_lengths = " / ".join(f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M" for n in GUIDE_COST_LENGTHS)
    out = [
        (
            f"Sources: `{rel_recall}` (tier 2, CPU emulation of each format's rounding; top-512 overlap at "
            f"{lengths} tokens) and `{rel_cost}` ({GUIDE_MODEL}; KV-pool tokens from upstream's configurator "
            f"with the SWA pool by ratio / by cap; decode KV bytes and TTFT at {cost_lengths} tokens, TTFT "
            "estimated from the H200 bench's kernel ratios)."
        ),
        "",
        (
            "| format | stored per key | vs exact math | vs exact keys, upstream's fp8 q | vs DeepSeek's reference "
            "selection | KV-pool tokens vs fp8 | decode KV bytes vs fp8 | TTFT vs fp8 (est.) |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fmt, label, stored in GUIDE_FORMATS:
        size = caps[("ratio", fmt)]["index_bytes_allocated"]
        budgeted = caps[("ratio", fmt)]["index_bytes_budgeted"]
        size_text = f"{size} B ({stored})" + (f"; budgeted at {budgeted} B" if budgeted != size else "")
        out.append(
            f"| {label} | {size_text} | {overlap(fmt, 'recall_tie_unq')} | {overlap(fmt, 'recall_tie')} | "
            f"{overlap(fmt, 'recall_tie_ref')} | {pool(fmt)} | {decode_bytes(fmt)} | {ttft(fmt)} |"
        )
    out += [
        "",
        (
            f"DeepSeek's reference selection itself (fp4 q and keys in a bf16 container) against exact math: "
            f"{overlap('bf16', 'ref_recall_tie_unq')}. bf16 keys with a bf16 q (the `bf16q` arm) against exact math: "
            f"{overlap('bf16q', 'recall_tie_unq')}, so what bf16 keys leave is upstream's fp8 q."
        ),
    ]
    return "\n".join(out) + "\n"


GENERATORS: dict[str, Callable[[Path], str]] = {
    "format-guide": format_guide,
    "cost": cost,
    "speed": speed,
    "mtp-sweep": mtp_sweep,
    "tier2": tier2,
    "tier2-cpu": tier2_cpu,
    "forward": forward,
    "diagnosis": diagnosis,
    "flag-off": flag_off,
    "parity": parity,
    "sm120": sm120,
    "bf16-compile": bf16_compile,
    "carry-timings": carry_timings,
    "gpu-tests": gpu_tests,
    "deepgemm": deepgemm,
}


def render(
    text: str, root: Path = ROOT, generators: Mapping[str, Callable[[Path], str]] = GENERATORS
) -> tuple[str, list[str]]:
    """``text`` with every known block regenerated; also the names of unknown blocks."""
    unknown: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in generators:
            unknown.append(name)
            return m.group(0)
        return m.group(1) + generators[name](root) + m.group(4)

    return BLOCK.sub(sub, text), unknown


def check(root: Path = ROOT, docs: Sequence[str] = DOCS) -> list[str]:
    """Problems: blocks that differ from their artifacts, unknown blocks, docs without blocks."""
    problems = []
    arms = forward_arms(root)
    path = root / FORWARD_ARMS
    if arms is not None and (
        not path.exists() or json.loads(path.read_text()) != json.loads(json.dumps(arms))
    ):
        problems.append(f"{FORWARD_ARMS}: differs from the forward runs it summarizes")
    for doc in docs:
        path = root / doc
        text = path.read_text()
        new, unknown = render(text, root)
        problems += [f"{doc}: unknown figures block {u!r}" for u in unknown]
        if not BLOCK.search(text):
            problems.append(f"{doc}: no figures block")
        for m_old, m_new in zip(BLOCK.finditer(text), BLOCK.finditer(new)):
            if m_old.group(3) != m_new.group(3):
                problems.append(f"{doc}: block {m_old.group(2)!r} differs from its artifact")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify.figures", description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the blocks in place (their one writer)")
    mode.add_argument("--check", action="store_true", help="only say which blocks differ (the default)")
    args = ap.parse_args(argv)
    if args.write:
        arms = forward_arms(ROOT)
        if arms is not None:
            (ROOT / FORWARD_ARMS).write_text(json.dumps(arms, indent=1) + "\n")
        for doc in DOCS:
            path = ROOT / doc
            new, unknown = render(path.read_text())
            path.write_text(new)
            for u in unknown:
                print(f"{doc}: unknown block {u!r} left as it is")
        return 0
    problems = check()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
