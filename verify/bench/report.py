"""README's speed section, generated from the committed bench artifacts.

    python -m verify.bench.report            # check README.md against verify/results/h200/bench/
    python -m verify.bench.report --results build/gpu/bench --print   # a fresh run's section

Reads ``bench_read.json`` (decode, wide outputs, prefill chunks, and when present the ``mtp`` and
``long_prefill`` sections of ``verify.bench.read_scenarios``), ``prefill/bench_read.json`` for the
prefill row when the main file has none (an earlier run kept separately), and
``bench_store.json``. The section sits between ``BEGIN`` and ``END`` in README.md, and
``python -m verify.figures --write`` writes it with every other block (its one writer); every
figure in it comes from those files through this code (the targets through
:func:`verify.bench.targets.evaluate`), and ``python -m verify.figures --check`` fails when
README.md and the artifacts disagree. A section the artifacts do not hold is reported as not
measured, with the command that measures it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify.bench.shared_memory import BLOCK_RESERVED_BYTES, SM_SHARED_BYTES, grouped_smem_bytes
from verify.bench.targets import (
    BENCH_COMMAND,
    evaluate,
    fp8_floor_ms,
    hbm_pct,
    prefill_kernel_measured,
    timing_ms,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "verify" / "results" / "h200" / "bench"
README = ROOT / "README.md"
# The block's markers are verify.figures' (python -m verify.figures --write refreshes every block)
BEGIN = "<!-- figures:speed -->"
END = "<!-- /figures:speed -->"

DECODE_ROWS = [(1, 8192), (8, 32768), (64, 32768), (64, 131072)]
PREFILL_ROW = (4096, 131072)
WIDTH = 100  # README's prose width


@dataclass
class Artifacts:
    read: dict[str, Any]
    prefill: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    sources: list[str] = field(default_factory=list)
    compile: dict[str, Any] | None = None  # bench_compile.json (verify.bench.compile_cost), when run

    @property
    def results(self) -> list[dict[str, Any]]:
        return [r for r in self.read.get("results", []) if not r.get("skipped")]


def load(results: Path = RESULTS) -> Artifacts:
    read_path = results / "bench_read.json"
    if not read_path.is_file():
        raise FileNotFoundError(
            f"{read_path} not found: run the bench ({BENCH_COMMAND}) and commit its results"
        )
    art = Artifacts(json.loads(read_path.read_text()), sources=["bench_read.json"])
    prefill_path = results / "prefill" / "bench_read.json"
    if prefill_path.is_file() and not _prefill(art.results):
        art.prefill = json.loads(prefill_path.read_text())
        art.sources.append("prefill/bench_read.json")
    store_path = results / "bench_store.json"
    if store_path.is_file():
        art.store = json.loads(store_path.read_text())
        art.sources.append("bench_store.json")
    compile_path = results / "bench_compile.json"
    if compile_path.is_file():
        art.compile = json.loads(compile_path.read_text())
        art.sources.append("bench_compile.json")
    return art


def _num(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def _find(
    results: list[dict[str, Any]], mode: str, rows: int, keys: int, width: int = 0
) -> dict[str, Any] | None:
    for r in results:
        s = r["shape"]
        if (s["mode"], s["rows"], s["keys"], s.get("width", 0)) == (mode, rows, keys, width):
            return r
    return None


def _prefill(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    return _find(results, "prefill", *PREFILL_ROW)


def deepgemm_measured(art: Artifacts) -> bool:
    """Whether the run timed DeepGEMM's own scorer anywhere (its columns appear only then)."""
    return any(timing_ms(r.get("fp8_deepgemm")) for r in art.results) or any(
        timing_ms(p.get("arms", {}).get("deepgemm_nonpaged")) for p in art.read.get("long_prefill", [])
    )


def decode_table(art: Artifacts) -> list[str]:
    dg = deepgemm_measured(art)
    extra_head, extra_rule = (
        (" bf16 / DeepGEMM | DeepGEMM % of 4.8 TB/s |", " --- | --- |") if dg else ("", "")
    )
    lines = [
        "| decode, rows x keys | bf16 us | % of 4.8 TB/s | bf16 / fp8 twin | bf16 / fp8 floor | naive gather / bf16 |"
        + extra_head,
        "| --- | --- | --- | --- | --- | --- |" + extra_rule,
    ]
    for rows, keys in DECODE_ROWS:
        r = _find(art.results, "decode", rows, keys)
        if r is None or not timing_ms(r.get("bf16_default")):
            lines.append(f"| {rows} x {keys:,} | not measured | | | | |" + (" | |" if dg else ""))
            continue
        bf16 = timing_ms(r["bf16_default"])
        assert bf16 is not None
        fp8, gather = timing_ms(r.get("fp8_best")), timing_ms(r.get("gather"))
        cells = ""
        if dg:
            real = timing_ms(r.get("fp8_deepgemm"))
            pct = f"{100 * fp8_floor_ms(r) / real:.0f}" if real else "n/a"  # fp8 key bytes at 4.8 TB/s
            cells = f" {_num(bf16 / real, 2) if real else 'n/a'} | {pct} |"
        lines.append(
            f"| {rows} x {keys:,} | {_num(bf16 * 1e3)} | {hbm_pct(r, bf16):.0f} | "
            f"{_num(bf16 / fp8, 2) if fp8 else 'n/a'} | {_num(bf16 / fp8_floor_ms(r), 2)} | "
            f"{_num(gather / bf16) if gather else 'n/a'} |" + cells
        )
    source = (
        art.results
        if _prefill(art.results)
        else [r for r in (art.prefill or {}).get("results", []) if not r.get("skipped")]
    )
    p = _prefill(source)
    if p is not None and timing_ms(p.get("bf16_default")):
        bf16 = timing_ms(p["bf16_default"])
        assert bf16 is not None
        fp8 = timing_ms(p.get("fp8_best"))
        gather = timing_ms(p.get("gather"))
        need = re.search(r"needs ~([\d.]+) GB", (p.get("gather") or {}).get("error") or "")
        gather_cell = _num(gather / bf16) if gather else (f"not run (needs ~{need[1]} GB)" if need else "n/a")
        lines.append(
            f"| prefill chunk {PREFILL_ROW[0]:,} x {PREFILL_ROW[1]:,} (causal) | {_num(bf16 * 1e3, 0)} | L2 reuse | "
            f"{_num(bf16 / fp8, 2) if fp8 else 'n/a'} | | {gather_cell} |" + (" | |" if dg else "")
        )
    return lines


def wide_table(art: Artifacts) -> list[str]:
    wide = [r for r in art.results if r["shape"].get("width")]
    if not wide:
        return [f"Short rows in a wide (graph-captured) output: not measured ({BENCH_COMMAND})."]
    lean = all(r.get("bf16_default_lean") is not None for r in wide)
    if lean:
        head = [
            (
                "Graph-captured decode, short rows in a wide output, as the indexer calls the kernel "
                "(`clean_logits=False`; the length-aware split against the best of the fixed splits):"
            ),
            "",
            (
                "| rows x keys in an output of | default us | best fixed split us | default / best | "
                "default with the -inf fill us |"
            ),
            "| --- | --- | --- | --- | --- |",
        ]
    else:
        head = [
            (
                "Graph-captured decode, short rows in a wide output (committed run before the length-aware "
                "split, with the -inf fill; the best swept config beside the default):"
            ),
            "",
            (
                "| rows x keys in an output of | default us | best swept config us | default / best | "
                "best config without the fill us |"
            ),
            "| --- | --- | --- | --- | --- |",
        ]
    lines = head
    for r in wide:
        s = r["shape"]
        name = f"{s['rows']} x {s['keys']:,} in {s['width']:,}"
        if lean:
            default, best, other = (
                timing_ms(r["bf16_default_lean"]),
                timing_ms(r.get("bf16_best_split_lean")),
                timing_ms(r.get("bf16_default")),
            )
        else:
            default, best, other = (
                timing_ms(r.get("bf16_default")),
                timing_ms(r.get("bf16_best")),
                timing_ms(r.get("bf16_no_tail_fill")),
            )
        cells = [
            _num(default * 1e3) if default else "n/a",
            _num(best * 1e3) if best else "n/a",
            _num(default / best, 2) if default and best else "n/a",
            _num(other * 1e3) if other else "n/a",
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _config_tag(config: dict[str, Any]) -> str:
    """A launch config in a few characters: key tile, warps, stages, operand order, split cap."""
    order = "swap" if config.get("swap_ab") else "qk"
    return (
        f"{config['block_n']}/w{config['num_warps']}/s{config['num_stages']}/{order}"
        f"/cap {config['max_split_n']}"
    )


def mtp_table(art: Artifacts) -> list[str]:
    mtp = [m for m in art.read.get("mtp", []) if not m.get("skipped")]
    if not mtp:
        return [f"MTP verify rows (several rows per request): not measured ({BENCH_COMMAND})."]
    swept = any(m.get("grouped_sweep") for m in mtp)
    dg = any(timing_ms(m.get("deepgemm")) for m in mtp)
    head = ["requests x keys, rows per request", "1 row us", "grouped us", "grouped / 1 row"]
    if swept:
        head += ["best swept grouped us", "best / 1 row", "its config (tile/warps/stages/order/cap)"]
    head += ["one row at a time us", "fp8 twin, one at a time us"]
    if dg:
        head += ["DeepGEMM fp8, one at a time us", "grouped / DeepGEMM"]
    lines = [
        (
            "MTP verify, `next_n` rows per request scored in groups (each key tile read once per request) "
            "against one row per request"
            + (
                "; the grouped mode also under other launch configs (each checked against the "
                "default's logits first; the best is what a config change could buy, not what runs)"
                if swept
                else ""
            )
            + ":"
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for m in mtp:
        one, grouped, ungrouped, fp8 = (
            timing_ms(m.get(k)) for k in ("one_row", "grouped", "ungrouped", "fp8")
        )
        cells = [
            _num(one * 1e3) if one else "n/a",
            _num(grouped * 1e3) if grouped else "n/a",
            _num(grouped / one, 2) if grouped and one else "n/a",
        ]
        if swept:
            top = m.get("grouped_best") or {}
            best_ms = timing_ms(top)
            cells += [
                _num(best_ms * 1e3) if best_ms else "n/a",
                _num(best_ms / one, 2) if best_ms and one else "n/a",
                (_config_tag(top["config"]) + (" (default)" if top == m.get("grouped") else ""))
                if best_ms and top.get("config")
                else "n/a",
            ]
        cells += [_num(ungrouped * 1e3) if ungrouped else "n/a", _num(fp8 * 1e3) if fp8 else "n/a"]
        if dg:
            anchor = timing_ms(m.get("deepgemm"))
            cells += [
                _num(anchor * 1e3) if anchor else "n/a",
                _num(grouped / anchor, 2) if grouped and anchor else "n/a",
            ]
        lines.append(f"| {m['requests']} x {m['keys']:,}, {m['next_n']} | " + " | ".join(cells) + " |")
    return lines


def mtp_sweep_table(art: Artifacts) -> list[str]:
    """Every grouped config the MTP sweep timed, against one row per request, shape by shape,
    with its shared memory estimate and the programs per SM that leaves room for."""
    mtp = [m for m in art.read.get("mtp", []) if not m.get("skipped") and m.get("grouped_sweep")]
    if not mtp:
        return [
            f'The grouped-mode config sweep: not measured (`{BENCH_COMMAND}` with `BENCH_ARGS="--sweep small"`).'
        ]
    heads = int(art.read["meta"].get("heads", 64))
    shapes = [f"{m['requests']} x {m['keys']:,}, {m['next_n']}" for m in mtp]
    cells: dict[tuple[str, int], dict[str, str]] = {}
    smem: dict[tuple[str, int], int] = {}
    for m, shape in zip(mtp, shapes):
        one = timing_ms(m.get("one_row"))
        default = m.get("grouped") or {}
        for t in [default, *m["grouped_sweep"]]:
            if not t.get("config"):
                continue
            key = (_config_tag(t["config"]) + (" (default)" if t is default else ""), m["next_n"])
            smem[key] = grouped_smem_bytes(
                t["config"]["block_n"], t["config"]["num_stages"], m["next_n"], heads
            )
            ms = timing_ms(t)
            mark = "**" if t == m.get("grouped_best") else ""
            cells.setdefault(key, {})[shape] = (
                f"{mark}{_num(ms / one, 2)}{mark}"
                if ms and one
                else ("wrong" if "disagrees" in (t.get("error") or "") else "n/a")
            )
    lines = [
        (
            "Grouped MTP verify under each swept launch config: time / one row per request (bold: the "
            "shape's fastest; `wrong`: logits disagreed with the default's, not timed); shared memory is "
            "an estimate (key stages + the group's query tile), programs per SM what it leaves room for "
            f"in {SM_SHARED_BYTES // 1024} KB:"
        ),
        "",
        "| config (tile/warps/stages/order/cap), rows per request | shared memory KB | programs per SM | "
        + " | ".join(shapes)
        + " |",
        "|" + " --- |" * (3 + len(shapes)),
    ]
    for (tag, next_n), row in sorted(
        cells.items(), key=lambda kv: (kv[0][1], "(default)" not in kv[0][0], kv[0][0])
    ):
        need = smem[(tag, next_n)]
        fits = SM_SHARED_BYTES // (need + BLOCK_RESERVED_BYTES)
        lines.append(
            f"| {tag}, {next_n} | {need // 1024} | {fits} | "
            + " | ".join(row.get(s, "") for s in shapes)
            + " |"
        )
    return lines


def _swept_best(p: dict[str, Any]) -> dict[str, Any] | None:
    done = [t for t in p.get("prefill_sweep", []) if timing_ms(t)]
    return min(done, key=lambda t: t["ms"]) if done else None


def _prefill_config_tag(config: dict[str, Any]) -> str:
    tag = f"{config['block_k']}/r{config['block_r']}/w{config['num_warps']}"
    return tag + (f"/{config['maxnreg']} registers" if config.get("maxnreg") else "")


def prefill_kernel_table(art: Artifacts) -> list[str]:
    """The long prefill with the prefill kernel as the dispatch's scorer: its time and effective
    TFLOP/s on the causal FLOPs beside the same run's dense bf16 matmul rate, the MMA floors and
    DeepGEMM's non-paged fp8 path, then the other arms."""
    long = [p for p in art.read.get("long_prefill", []) if not p.get("skipped")]
    matmul = art.read.get("meta", {}).get("dense_matmul", {})
    dense = matmul.get("bf16_tflops")
    dg = any(timing_ms(p["arms"].get("deepgemm_nonpaged")) for p in long)
    tl = any(timing_ms(p["arms"].get("tilelang")) for p in long)
    swept = any(_swept_best(p) for p in long)
    lines = [
        (
            "Long prefill, one request, every row (causal), row chunks of <= 4 GiB of logits; bf16: the prefill "
            "kernel (`bf16_mqa_logits`) as the dispatch runs it (the request's page table, rows of at most 512 keys "
            "given empty ranges, as upstream's non-paged plan gives them -- DeepGEMM's non-paged call gets the same "
            "ranges); TFLOP/s: the causal FLOPs (2 x 64 heads x 128 x the keys every row sees) over the time"
            + (
                f"; the same run's dense bf16 matmul (`torch.matmul` {matmul.get('n', 8192)}^3): "
                f"{_num(dense, 0)} TFLOP/s"
                if dense
                else ""
            )
            + (
                f", fp8 (`torch._scaled_mm`): {_num(matmul['fp8_tflops'], 0)} TFLOP/s"
                if matmul.get("fp8_tflops")
                else ""
            )
            + "; MMA floors: the causal FLOPs at the H200's dense peaks (989 bf16, 1,979 fp8 TFLOP/s), the fp8 one "
            "also bounded by the bytes DeepGEMM's non-paged path moves (not measurements)"
            + (
                "; DeepGEMM non-paged: `fp8_mqa_logits` timed, the one gather of the request's keys not"
                if dg
                else " (DeepGEMM itself did not run in this bench)"
            )
            + ":"
        ),
        "",
    ]
    head = ["tokens", "bf16 prefill kernel ms", "TFLOP/s"]
    if dense:
        head.append("% of dense bf16")
    if swept:
        head += ["best swept ms", "its config (tile/rows/warps/stages)"]
    if dg:
        head += ["DeepGEMM non-paged ms", "its TFLOP/s", "bf16 / DeepGEMM"]
    head += ["bf16 MMA floor ms", "fp8 floor ms", "bf16 paged, one row at a time ms", "fp8 twin (paged) ms"]
    if tl:
        head.append("TileLang fp8 (paged) ms")
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for p in long:
        arms, floors = p["arms"], p["floors"]
        flops = floors["flops"]
        bf16 = timing_ms(arms.get("bf16_prefill"))

        def rate(t: float | None, flops: float = flops) -> str:
            return _num(flops / (t * 1e-3) / 1e12, 0) if t else "n/a"

        cells = [_num(bf16, 2) if bf16 else "n/a", rate(bf16)]
        if dense:
            cells.append(f"{100 * flops / (bf16 * 1e-3) / 1e12 / dense:.0f}" if bf16 else "n/a")
        if swept:
            top = _swept_best(p)
            cells += [
                _num(top["ms"], 2) if top else "n/a",
                _prefill_config_tag(top["config"]) if top else "n/a",
            ]
        if dg:
            real = timing_ms(arms.get("deepgemm_nonpaged"))
            cells += [
                _num(real, 2) if real else "n/a",
                rate(real),
                _num(bf16 / real, 2) if bf16 and real else "n/a",
            ]
        one, twin = timing_ms(arms.get("bf16")), timing_ms(arms.get("fp8_twin"))
        cells += [
            _num(floors["bf16_compute_ms"], 2),
            _num(floors["fp8_nonpaged_ms"], 2),
            _num(one, 2) if one else "n/a",
            _num(twin, 2) if twin else "n/a",
        ]
        if tl:
            tile = timing_ms(arms.get("tilelang"))
            cells.append(_num(tile, 2) if tile else "n/a")
        lines.append(f"| {p['tokens']:,} | " + " | ".join(cells) + " |")
    return lines


def compile_table(art: Artifacts) -> list[str]:
    """The scorers' kernel variants compiled at CUDA-graph capture (upstream's default decode
    capture sizes, and MTP verify's) and in eager prefill, and their time, bf16 beside fp8."""
    if art.compile is None:
        return []
    cold, warm = art.compile.get("cold", {}), art.compile.get("warm", {})
    if "phases" not in cold:
        return [f"Compile cost: the cold pass did not complete ({str(cold.get('error'))[:200]})."]
    by_warm = {(p["name"], p["format"]): p for p in warm.get("phases", [])}
    what = {
        "capture": f"graph capture, {len(cold.get('capture_sizes', []))} decode batch sizes",
        "mtp": f"graph capture, MTP verify (2 rows a request), {len(cold.get('mtp_capture_sizes', []))} sizes",
        "prefill": "eager prefill, 1 to 16,384 rows",
    }
    lines = [
        (
            "Kernel variants the scorers compile (`verify.bench.compile_cost`): each decode batch size upstream "
            "captures by default (an H200 server at tp 8, max batch 512) called once and captured in a CUDA graph, "
            "then eager prefill chunks; bf16: new entries in the Triton kernels' per-device caches; fp8: new "
            "compiled kernels in DeepGEMM's and sglang's JIT caches (upstream's JIT metadata kernel and DeepGEMM); "
            "cold: empty JIT caches, warm: a fresh process on the caches the cold pass filled (what a server pays "
            "after a build session compiled them); seconds are wall time of all the calls, captures included:"
        ),
        "",
        (
            "| what | format | calls | variants compiled (cold) | s in the calls that compiled | s in all calls, cold | "
            "s in all calls, warm |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in cold["phases"]:
        w = by_warm.get((p["name"], p["format"]), {})
        variants = ", ".join(f"{k} {v}" for k, v in p["variants"].items()) or "0"
        lines.append(
            f"| {what.get(p['name'], p['name'])} | {p['format']} | {p['calls']} | {variants} | "
            f"{_num(p['seconds_in_compiling_calls'], 1)} | {_num(p['seconds_total'], 1)} | "
            + (_num(w["seconds_total"], 1) if "seconds_total" in w else "n/a")
            + " |"
            + (f" error: {p['error'][:100]}" if p.get("error") else "")
        )
    if not any(p["format"] == "fp8" for p in cold["phases"]):
        lines += ["", f"fp8: {cold.get('fp8', 'not measured')}."]
    return lines


def long_prefill_table(art: Artifacts) -> list[str]:
    long = [p for p in art.read.get("long_prefill", []) if not p.get("skipped")]
    if not long:
        return [f"Long prefill (one request of 8K-128K tokens): not measured ({BENCH_COMMAND})."]
    if prefill_kernel_measured(art.read):
        return prefill_kernel_table(art)
    dg = any(timing_ms(p["arms"].get("deepgemm_nonpaged")) for p in long)
    tl = any(timing_ms(p["arms"].get("tilelang")) for p in long)
    lines = [
        (
            "Long prefill, one request, every row (causal), row chunks of <= 4 GiB of logits; bf16 as "
            "dispatched (the `dispatch_arm` of the run: one row at a time since grouped rows need the "
            "kernel's length-aware split); TileLang: upstream's own fp8 paged kernel (the scorer sm_120 "
            "runs), built for this GPU; fp8 floor: the physical floor of DeepGEMM's non-paged "
            "`fp8_mqa_logits`, max(bytes / 4.8 TB/s, MMA work / 1,979 TFLOPS dense fp8), not a measurement"
            + (
                "; DeepGEMM non-paged: that call timed, upstream's default here (the one gather of the "
                "request's keys not timed):"
                if dg
                else " (DeepGEMM itself did not run in this bench):"
            )
        ),
        "",
        (
            "| tokens | bf16 ms | bf16 one row at a time ms | fp8 twin (paged) ms | fp8 non-paged floor ms | "
            "bf16 / fp8 twin | bf16 / fp8 floor | bf16 floor ms |"
            + (" TileLang fp8 (paged) ms | bf16 / TileLang |" if tl else "")
            + (" DeepGEMM non-paged ms | bf16 / DeepGEMM non-paged |" if dg else "")
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- |"
        + (" --- | --- |" if tl else "")
        + (" --- | --- |" if dg else ""),
    ]
    for p in long:
        arms = p["arms"]
        real = timing_ms(arms.get("deepgemm_nonpaged"))
        bf16 = timing_ms(arms.get(p["dispatch_arm"]))
        one, twin = timing_ms(arms.get("bf16")), timing_ms(arms.get("fp8_twin"))
        floor, bf16_floor = p["floors"].get("fp8_nonpaged_ms"), p["floors"].get("bf16_ms")
        cells = [
            _num(bf16, 2) if bf16 else "n/a",
            _num(one, 2) if one else "n/a",
            _num(twin, 2) if twin else "n/a",
            _num(floor, 2) if floor else "n/a",
            _num(bf16 / twin, 2) if bf16 and twin else "n/a",
            _num(bf16 / floor, 2) if bf16 and floor else "n/a",
            _num(bf16_floor, 2) if bf16_floor else "n/a",
        ]
        if tl:
            tile = timing_ms(arms.get("tilelang"))
            cells += [_num(tile, 2) if tile else "n/a", _num(bf16 / tile, 2) if bf16 and tile else "n/a"]
        if dg:
            cells += [_num(real, 2) if real else "n/a", _num(bf16 / real, 2) if bf16 and real else "n/a"]
        lines.append(f"| {p['tokens']:,} | " + " | ".join(cells) + " |")
    return lines


def render_body(art: Artifacts) -> str:
    """The speed section's text (verify.figures puts it between README's speed markers)."""
    meta = art.read.get("meta", {})
    body = [
        f"- **Speed** ({meta.get('gpu', 'GPU')}, Triton {meta.get('triton', '?')}; CUDA-graph replays over "
        "cold-L2 copies of the keys; the kernel's default launch config; fp8 twin: a Triton fp8 kernel over "
        "upstream's 132-B pages standing in for DeepGEMM"
        + (
            "; DeepGEMM: its own fp8 scorers, checked against the twin before timing"
            if deepgemm_measured(art)
            else ", which did not run in this bench"
        )
        + "; fp8 floor: fp8's key bytes at 4.8 TB/s; from "
        + ", ".join(f"`{s}`" for s in art.sources)
        + " in [`verify/results/h200/bench/`](verify/results/h200/README.md)):",
        "",
        *decode_table(art),
        "",
        *wide_table(art),
        "",
        *mtp_table(art),
        "",
        *long_prefill_table(art),
        "",
        *([*compile_table(art), ""] if art.compile is not None else []),
        "Targets (each: the target, then how many shapes meet it):",
        "",
        *(f"- {line}" for line in evaluate(art.read, art.store)),
    ]
    lines: list[str] = []
    for i, line in enumerate(_keep_code_whole(body)):
        # A bullet: its first line, then everything indented two spaces; prose wrapped at
        # WIDTH, table rows whole.
        if not line or line.startswith("|"):
            lines.append("  " + line if line else line)
        elif i == 0:
            lines += textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        elif line.startswith("- "):
            lines += textwrap.wrap(
                line[2:], WIDTH, initial_indent="  - ", subsequent_indent="    ", break_on_hyphens=False
            )
        else:
            lines += textwrap.wrap(
                line, WIDTH, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
            )
    return "\n".join(lines).replace(_NBSP, " ") + "\n"


def render(art: Artifacts) -> str:
    """The README block with its markers (what run.sh previews as README-speed.md)."""
    return BEGIN + "\n" + render_body(art) + END


_NBSP = "\x00"


def _keep_code_whole(lines: list[str]) -> list[str]:
    """Spaces inside `code` spans made unbreakable for textwrap (restored after wrapping)."""
    return [re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", _NBSP), line) for line in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verify.bench.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument(
        "--print", action="store_true", help="print the generated section and exit (README untouched)"
    )
    args = parser.parse_args(argv)
    block = render(load(args.results))
    if args.print:
        print(block)
        return 0
    if block not in args.readme.read_text():
        print(
            f"{args.readme}'s speed section differs from {args.results}; after committing the run's results "
            "there, python -m verify.figures --write rewrites it",
            file=sys.stderr,
        )
        return 1
    print(f"{args.readme}: speed section matches {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
