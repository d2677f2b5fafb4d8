"""README's speed section, generated from the committed bench artifacts.

    python -m verify.bench.report            # check README.md against verify/results/h200/bench/
    python -m verify.bench.report --write    # rewrite README.md's speed section from them
    python -m verify.bench.report --results build/gpu/bench --print   # a fresh run's section

Reads ``bench_read.json`` (decode, wide outputs, prefill chunks, and when present the ``mtp`` and
``long_prefill`` sections of ``verify.bench.read_scenarios``), ``prefill/bench_read.json`` for the
prefill row when the main file has none (an earlier run kept separately), and
``bench_store.json``. The section sits between ``BEGIN`` and ``END`` in README.md; every figure in
it comes from those files through this code, and ``tests/parity/test_bench_tools.py`` fails when
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

from verify.core import platform as P

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "verify" / "results" / "h200" / "bench"
README = ROOT / "README.md"
# The block's markers are verify.figures' (python -m verify.figures --write refreshes every block)
BEGIN = "<!-- figures:speed -->"
END = "<!-- /figures:speed -->"
RUN_COMMAND = "`verify/gpu/run.sh setup tier1_read bench`"

HBM_BYTES_PER_S = 4.8e12
DECODE_ROWS = [(1, 8192), (8, 32768), (64, 32768), (64, 131072)]
PREFILL_ROW = (4096, 131072)
TARGET_HBM_PCT, TARGET_HBM_MIN_ROWS, TARGET_HBM_MIN_KEYS = 88.0, 8, 32768
TARGET_RATIO_VS_FP8 = 256 / 132
TARGET_GATHER = 10.0
TARGET_MIN_KEYS = 8192
TARGET_WIDE = 1.2
TARGET_MTP = 1.15
TARGET_PREFILL = 1.2
EXTRA_MEMORY_SLACK = 2 * 2**20  # the caching allocator rounds blocks up
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
            f"{read_path} not found: run the bench ({RUN_COMMAND}) and commit its results"
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


def _ms(timing: dict[str, Any] | None) -> float | None:
    return timing.get("ms") if timing else None


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


def _hbm_pct(r: dict[str, Any], ms: float) -> float:
    return 100 * r["key_bytes_bf16"] / (ms * 1e-3) / HBM_BYTES_PER_S


def _fp8_floor_ms(r: dict[str, Any]) -> float:
    return r["key_bytes_fp8"] / HBM_BYTES_PER_S * 1e3


def deepgemm_measured(art: Artifacts) -> bool:
    """Whether the run timed DeepGEMM's own scorer anywhere (its columns appear only then)."""
    return any(_ms(r.get("fp8_deepgemm")) for r in art.results) or any(
        _ms(p.get("arms", {}).get("deepgemm_nonpaged")) for p in art.read.get("long_prefill", [])
    )


def decode_table(art: Artifacts) -> list[str]:
    dg = deepgemm_measured(art)
    extra_head, extra_rule = (" bf16 / DeepGEMM | DeepGEMM % of 4.8 TB/s |", " --- | --- |") if dg else ("", "")
    lines = [
        "| decode, rows x keys | bf16 us | % of 4.8 TB/s | bf16 / fp8 twin | bf16 / fp8 floor | naive gather / bf16 |"
        + extra_head,
        "| --- | --- | --- | --- | --- | --- |" + extra_rule,
    ]
    for rows, keys in DECODE_ROWS:
        r = _find(art.results, "decode", rows, keys)
        if r is None or not _ms(r.get("bf16_default")):
            lines.append(f"| {rows} x {keys:,} | not measured | | | | |" + (" | |" if dg else ""))
            continue
        bf16 = _ms(r["bf16_default"])
        assert bf16 is not None
        fp8, gather = _ms(r.get("fp8_best")), _ms(r.get("gather"))
        cells = ""
        if dg:
            real = _ms(r.get("fp8_deepgemm"))
            pct = f"{100 * _fp8_floor_ms(r) / real:.0f}" if real else "n/a"  # fp8 key bytes at 4.8 TB/s
            cells = f" {_num(bf16 / real, 2) if real else 'n/a'} | {pct} |"
        lines.append(
            f"| {rows} x {keys:,} | {_num(bf16 * 1e3)} | {_hbm_pct(r, bf16):.0f} | "
            f"{_num(bf16 / fp8, 2) if fp8 else 'n/a'} | {_num(bf16 / _fp8_floor_ms(r), 2)} | "
            f"{_num(gather / bf16) if gather else 'n/a'} |" + cells
        )
    source = (
        art.results
        if _prefill(art.results)
        else [r for r in (art.prefill or {}).get("results", []) if not r.get("skipped")]
    )
    p = _prefill(source)
    if p is not None and _ms(p.get("bf16_default")):
        bf16 = _ms(p["bf16_default"])
        assert bf16 is not None
        fp8 = _ms(p.get("fp8_best"))
        gather = _ms(p.get("gather"))
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
        return [f"Short rows in a wide (graph-captured) output: not measured ({RUN_COMMAND})."]
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
                _ms(r["bf16_default_lean"]),
                _ms(r.get("bf16_best_split_lean")),
                _ms(r.get("bf16_default")),
            )
        else:
            default, best, other = (
                _ms(r.get("bf16_default")),
                _ms(r.get("bf16_best")),
                _ms(r.get("bf16_no_tail_fill")),
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
        return [f"MTP verify rows (several rows per request): not measured ({RUN_COMMAND})."]
    swept = any(m.get("grouped_sweep") for m in mtp)
    dg = any(_ms(m.get("deepgemm")) for m in mtp)
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
        one, grouped, ungrouped, fp8 = (_ms(m.get(k)) for k in ("one_row", "grouped", "ungrouped", "fp8"))
        cells = [
            _num(one * 1e3) if one else "n/a",
            _num(grouped * 1e3) if grouped else "n/a",
            _num(grouped / one, 2) if grouped and one else "n/a",
        ]
        if swept:
            top = m.get("grouped_best") or {}
            best_ms = _ms(top)
            cells += [
                _num(best_ms * 1e3) if best_ms else "n/a",
                _num(best_ms / one, 2) if best_ms and one else "n/a",
                (_config_tag(top["config"]) + (" (default)" if top == m.get("grouped") else ""))
                if best_ms and top.get("config")
                else "n/a",
            ]
        cells += [_num(ungrouped * 1e3) if ungrouped else "n/a", _num(fp8 * 1e3) if fp8 else "n/a"]
        if dg:
            anchor = _ms(m.get("deepgemm"))
            cells += [
                _num(anchor * 1e3) if anchor else "n/a",
                _num(grouped / anchor, 2) if grouped and anchor else "n/a",
            ]
        lines.append(f"| {m['requests']} x {m['keys']:,}, {m['next_n']} | " + " | ".join(cells) + " |")
    return lines


# An H100/H200 SM's shared memory and what the runtime reserves per resident block.
SM_SHARED_BYTES = P.SHARED_MEMORY["sm90"][1]
BLOCK_RESERVED_BYTES = 1024


def grouped_smem_bytes(block_n: int, num_stages: int, next_n: int, heads: int) -> int:
    """Shared memory a grouped program needs, estimated (the bench's sweep filters on it too):
    ``num_stages`` bf16 key tiles of ``block_n`` x 256 B plus the group's query tile (rows rounded
    up to a power of two, x heads x 128 bf16 values)."""
    columns = 1 << max(next_n - 1, 0).bit_length()
    return num_stages * block_n * 256 + columns * heads * 128 * 2


def mtp_sweep_table(art: Artifacts) -> list[str]:
    """Every grouped config the MTP sweep timed, against one row per request, shape by shape,
    with its shared memory estimate and the programs per SM that leaves room for."""
    mtp = [m for m in art.read.get("mtp", []) if not m.get("skipped") and m.get("grouped_sweep")]
    if not mtp:
        return [f"The grouped-mode config sweep: not measured (`{RUN_COMMAND}` with `BENCH_ARGS=\"--sweep small\"`)."]
    heads = int(art.read["meta"].get("heads", 64))
    shapes = [f"{m['requests']} x {m['keys']:,}, {m['next_n']}" for m in mtp]
    cells: dict[tuple[str, int], dict[str, str]] = {}
    smem: dict[tuple[str, int], int] = {}
    for m, shape in zip(mtp, shapes):
        one = _ms(m.get("one_row"))
        default = m.get("grouped") or {}
        for t in [default, *m["grouped_sweep"]]:
            if not t.get("config"):
                continue
            key = (_config_tag(t["config"]) + (" (default)" if t is default else ""), m["next_n"])
            smem[key] = grouped_smem_bytes(t["config"]["block_n"], t["config"]["num_stages"], m["next_n"], heads)
            ms = _ms(t)
            mark = "**" if t == m.get("grouped_best") else ""
            cells.setdefault(key, {})[shape] = (
                f"{mark}{_num(ms / one, 2)}{mark}" if ms and one else ("wrong" if "disagrees" in (t.get("error") or "") else "n/a")
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
        + " | ".join(shapes) + " |",
        "|" + " --- |" * (3 + len(shapes)),
    ]
    for (tag, next_n), row in sorted(cells.items(), key=lambda kv: (kv[0][1], "(default)" not in kv[0][0], kv[0][0])):
        need = smem[(tag, next_n)]
        fits = SM_SHARED_BYTES // (need + BLOCK_RESERVED_BYTES)
        lines.append(
            f"| {tag}, {next_n} | {need // 1024} | {fits} | " + " | ".join(row.get(s, "") for s in shapes) + " |"
        )
    return lines


def prefill_kernel_measured(art: Artifacts) -> bool:
    """Whether the run timed the series' prefill kernel (bf16_mqa_logits) on the long prefill."""
    return any(_ms(p.get("arms", {}).get("bf16_prefill")) for p in art.read.get("long_prefill", [])
               if not p.get("skipped"))


def _swept_best(p: dict[str, Any]) -> dict[str, Any] | None:
    done = [t for t in p.get("prefill_sweep", []) if _ms(t)]
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
    dg = any(_ms(p["arms"].get("deepgemm_nonpaged")) for p in long)
    tl = any(_ms(p["arms"].get("tilelang")) for p in long)
    swept = any(_swept_best(p) for p in long)
    lines = [
        (
            "Long prefill, one request, every row (causal), row chunks of <= 4 GiB of logits; bf16: the prefill "
            "kernel (`bf16_mqa_logits`) as the dispatch runs it (the request's page table, rows of at most 512 keys "
            "given empty ranges, as upstream's non-paged plan gives them -- DeepGEMM's non-paged call gets the same "
            "ranges); TFLOP/s: the causal FLOPs (2 x 64 heads x 128 x the keys every row sees) over the time"
            + (f"; the same run's dense bf16 matmul (`torch.matmul` {matmul.get('n', 8192)}^3): "
               f"{_num(dense, 0)} TFLOP/s" if dense else "")
            + (f", fp8 (`torch._scaled_mm`): {_num(matmul['fp8_tflops'], 0)} TFLOP/s" if matmul.get("fp8_tflops") else "")
            + "; MMA floors: the causal FLOPs at the H200's dense peaks (989 bf16, 1,979 fp8 TFLOP/s), the fp8 one "
            "also bounded by the bytes DeepGEMM's non-paged path moves (not measurements)"
            + ("; DeepGEMM non-paged: `fp8_mqa_logits` timed, the one gather of the request's keys not" if dg else
               " (DeepGEMM itself did not run in this bench)")
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
        bf16 = _ms(arms.get("bf16_prefill"))

        def rate(t: float | None, flops: float = flops) -> str:
            return _num(flops / (t * 1e-3) / 1e12, 0) if t else "n/a"

        cells = [_num(bf16, 2) if bf16 else "n/a", rate(bf16)]
        if dense:
            cells.append(f"{100 * flops / (bf16 * 1e-3) / 1e12 / dense:.0f}" if bf16 else "n/a")
        if swept:
            top = _swept_best(p)
            cells += [_num(top["ms"], 2) if top else "n/a", _prefill_config_tag(top["config"]) if top else "n/a"]
        if dg:
            real = _ms(arms.get("deepgemm_nonpaged"))
            cells += [_num(real, 2) if real else "n/a", rate(real), _num(bf16 / real, 2) if bf16 and real else "n/a"]
        one, twin = _ms(arms.get("bf16")), _ms(arms.get("fp8_twin"))
        cells += [_num(floors["bf16_compute_ms"], 2), _num(floors["fp8_nonpaged_ms"], 2),
                  _num(one, 2) if one else "n/a", _num(twin, 2) if twin else "n/a"]
        if tl:
            tile = _ms(arms.get("tilelang"))
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
    what = {"capture": f"graph capture, {len(cold.get('capture_sizes', []))} decode batch sizes",
            "mtp": f"graph capture, MTP verify (2 rows a request), {len(cold.get('mtp_capture_sizes', []))} sizes",
            "prefill": "eager prefill, 1 to 16,384 rows"}
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
        ("| what | format | calls | variants compiled (cold) | s in the calls that compiled | s in all calls, cold | "
         "s in all calls, warm |"),
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in cold["phases"]:
        w = by_warm.get((p["name"], p["format"]), {})
        variants = ", ".join(f"{k} {v}" for k, v in p["variants"].items()) or "0"
        lines.append(
            f"| {what.get(p['name'], p['name'])} | {p['format']} | {p['calls']} | {variants} | "
            f"{_num(p['seconds_in_compiling_calls'], 1)} | {_num(p['seconds_total'], 1)} | "
            + (_num(w["seconds_total"], 1) if "seconds_total" in w else "n/a")
            + " |" + (f" error: {p['error'][:100]}" if p.get("error") else "")
        )
    if not any(p["format"] == "fp8" for p in cold["phases"]):
        lines += ["", f"fp8: {cold.get('fp8', 'not measured')}."]
    return lines


def long_prefill_table(art: Artifacts) -> list[str]:
    long = [p for p in art.read.get("long_prefill", []) if not p.get("skipped")]
    if not long:
        return [f"Long prefill (one request of 8K-128K tokens): not measured ({RUN_COMMAND})."]
    if prefill_kernel_measured(art):
        return prefill_kernel_table(art)
    dg = any(_ms(p["arms"].get("deepgemm_nonpaged")) for p in long)
    tl = any(_ms(p["arms"].get("tilelang")) for p in long)
    lines = [
        (
            "Long prefill, one request, every row (causal), row chunks of <= 4 GiB of logits; bf16 as "
            "dispatched (the `dispatch_arm` of the run: one row at a time since grouped rows need the "
            "kernel's length-aware split); TileLang: upstream's own fp8 paged kernel (the scorer sm_120 "
            "runs), built for this GPU; fp8 floor: the physical floor of DeepGEMM's non-paged "
            "`fp8_mqa_logits`, max(bytes / 4.8 TB/s, MMA work / 1,979 TFLOPS dense fp8), not a measurement"
            + ("; DeepGEMM non-paged: that call timed, upstream's default here (the one gather of the "
               "request's keys not timed):" if dg else " (DeepGEMM itself did not run in this bench):")
        ),
        "",
        (
            "| tokens | bf16 ms | bf16 one row at a time ms | fp8 twin (paged) ms | fp8 non-paged floor ms | "
            "bf16 / fp8 twin | bf16 / fp8 floor | bf16 floor ms |"
            + (" TileLang fp8 (paged) ms | bf16 / TileLang |" if tl else "")
            + (" DeepGEMM non-paged ms | bf16 / DeepGEMM non-paged |" if dg else "")
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if tl else "") + (" --- | --- |" if dg else ""),
    ]
    for p in long:
        arms = p["arms"]
        real = _ms(arms.get("deepgemm_nonpaged"))
        bf16 = _ms(arms.get(p["dispatch_arm"]))
        one, twin = _ms(arms.get("bf16")), _ms(arms.get("fp8_twin"))
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
            tile = _ms(arms.get("tilelang"))
            cells += [_num(tile, 2) if tile else "n/a", _num(bf16 / tile, 2) if bf16 and tile else "n/a"]
        if dg:
            cells += [_num(real, 2) if real else "n/a", _num(bf16 / real, 2) if bf16 and real else "n/a"]
        lines.append(f"| {p['tokens']:,} | " + " | ".join(cells) + " |")
    return lines


def _prefill_reach(art: Artifacts) -> str:
    """Why the long-prefill target is out of reach, from the run's own floors and timings: the
    logits are compute-bound, and bf16's MMA floor over fp8's is what it is; within the target
    bf16 would have to reach that many times the fp8 path's share of its own floor."""
    rows = [p for p in art.read.get("long_prefill", []) if not p.get("skipped")]
    ratios = [p["floors"]["bf16_ms"] / p["floors"]["fp8_nonpaged_ms"] for p in rows
              if p["floors"].get("bf16_ms") and p["floors"].get("fp8_nonpaged_ms")]
    bound = [p for p in rows if p["floors"].get("fp8_nonpaged_compute_ms", 0) >= p["floors"].get("fp8_nonpaged_memory_ms", 1)]
    if not ratios or len(bound) != len(rows):
        return ""

    def share(arm: str | None, floor: str) -> list[float]:  # arm None: the one the dispatch runs
        return [100 * p["floors"][floor] / ms for p in rows
                if (ms := _ms(p["arms"].get(arm or p["dispatch_arm"]))) and p["floors"].get(floor)]

    shares = [(label, v) for label, v in (
        ("bf16 as dispatched", share(None, "bf16_ms")),
        ("fp8 twin", share("fp8_twin", "fp8_nonpaged_ms")),
        ("TileLang", share("tilelang", "fp8_nonpaged_ms")),
        ("DeepGEMM non-paged", share("deepgemm_nonpaged", "fp8_nonpaged_ms")),
    ) if v]
    need = min(ratios) / TARGET_PREFILL
    spread = f"{min(ratios):.2f}" if f"{min(ratios):.2f}" == f"{max(ratios):.2f}" else f"{min(ratios):.2f}-{max(ratios):.2f}"
    return (
        f"; every length is compute-bound, and bf16's MMA floor is {spread}x fp8's, "
        f"so within {TARGET_PREFILL}x bf16 must reach {need:.2f}x the fp8 path's share of its own floor; "
        "measured shares of their floors: "
        + ", ".join(f"{label} {min(v):.0f}-{max(v):.0f}%" for label, v in shares)
    )


def _count(values: list[float], ok: Any) -> str:
    return f"{sum(bool(ok(v)) for v in values)}/{len(values)}"


def targets(art: Artifacts) -> list[str]:
    out = []
    decode = [r for r in art.results if r["shape"]["mode"] == "decode" and not r["shape"].get("width")]
    hbm_shapes = [
        r for r in decode if r["shape"]["rows"] >= TARGET_HBM_MIN_ROWS and r["shape"]["keys"] >= TARGET_HBM_MIN_KEYS
    ]
    big = [_hbm_pct(r, ms) for r in hbm_shapes if (ms := _ms(r.get("bf16_default")))]
    swept = [_hbm_pct(r, ms) for r in hbm_shapes if r.get("sweep") and (ms := _ms(r.get("bf16_best")))]
    # DeepGEMM's share for its own (fp8) key bytes, as the decode table's column
    anchor_pct = [100 * _fp8_floor_ms(r) / ms for r in hbm_shapes if (ms := _ms(r.get("fp8_deepgemm")))]
    if big:
        out.append(
            f"decode from {TARGET_HBM_MIN_ROWS} x {TARGET_HBM_MIN_KEYS:,} keys up at >= {TARGET_HBM_PCT:.0f}% of "
            f"4.8 TB/s: {_count(big, lambda v: v >= TARGET_HBM_PCT)} shapes (default config, "
            f"{min(big):.0f}-{max(big):.0f}%"
            + (
                f"; the best swept config per shape: {_count(swept, lambda v: v >= TARGET_HBM_PCT)}, "
                f"{min(swept):.0f}-{max(swept):.0f}%"
                if swept
                else ""
            )
            + (
                f"; DeepGEMM's fp8 scorer on the same shapes: {min(anchor_pct):.0f}-{max(anchor_pct):.0f}% of "
                "4.8 TB/s for its own key bytes"
                if anchor_pct
                else ""
            )
            + "; the device copy ceiling measured in the same run: "
            f"{100 * art.read['meta'].get('copy_ceiling', {}).get('copy_tb_s', float('nan')) * 1e12 / HBM_BYTES_PER_S:.0f}%)"
        )
    long_keys = [r for r in decode if r["shape"]["keys"] >= TARGET_MIN_KEYS and _ms(r.get("bf16_default"))]
    ratio = [_ms(r["bf16_default"]) / _ms(r["fp8_best"]) for r in long_keys if _ms(r.get("fp8_best"))]  # type: ignore[operator]
    gather = [_ms(r["gather"]) / _ms(r["bf16_default"]) for r in long_keys if _ms(r.get("gather"))]  # type: ignore[operator]
    if ratio:
        out.append(
            f"bf16 / fp8 twin <= {TARGET_RATIO_VS_FP8:.2f} (decode, >= {TARGET_MIN_KEYS:,} keys): "
            f"{_count(ratio, lambda v: v <= TARGET_RATIO_VS_FP8)} (max {max(ratio):.2f})"
        )
    anchor = [_ms(r["bf16_default"]) / _ms(r["fp8_deepgemm"]) for r in long_keys if _ms(r.get("fp8_deepgemm"))]  # type: ignore[operator]
    if anchor:
        out.append(
            f"bf16 / DeepGEMM <= {TARGET_RATIO_VS_FP8:.2f}, the key-byte ratio (decode, >= {TARGET_MIN_KEYS:,} keys, "
            f"default config): {_count(anchor, lambda v: v <= TARGET_RATIO_VS_FP8)} (max {max(anchor):.2f})"
        )
    if gather:
        out.append(
            f">= {TARGET_GATHER:.0f}x over the naive gather: {_count(gather, lambda v: v >= TARGET_GATHER)} "
            f"(min {min(gather):.1f}x)"
        )
    beyond = [
        r["peak_extra_bytes"]["bf16"] - r["peak_extra_bytes"]["logits"]
        for r in art.results
        if "bf16" in r.get("peak_extra_bytes", {}) and "logits" in r.get("peak_extra_bytes", {})
    ]
    if beyond:
        out.append(
            f"no memory beyond the logits: {_count(beyond, lambda v: v <= EXTRA_MEMORY_SLACK)} shapes "
            f"(at most {max(beyond):,} B beyond)"
        )
    wide = [r for r in art.results if r["shape"].get("width")]
    lean = [
        _ms(r["bf16_default_lean"]) / _ms(r["bf16_best_split_lean"])  # type: ignore[operator]
        for r in wide
        if _ms(r.get("bf16_default_lean")) and _ms(r.get("bf16_best_split_lean"))
    ]
    if lean:
        out.append(
            f"short rows in a wide output within {TARGET_WIDE}x of the best fixed split: "
            f"{_count(lean, lambda v: v <= TARGET_WIDE)} (max {max(lean):.2f}x)"
        )
    elif wide:
        old = [
            _ms(r["bf16_default"]) / _ms(r["bf16_best"])  # type: ignore[operator]
            for r in wide
            if _ms(r.get("bf16_default")) and _ms(r.get("bf16_best"))
        ]
        out.append(
            f"short rows in a wide output within {TARGET_WIDE}x of the best split: not measured with the "
            f"length-aware split yet ({RUN_COMMAND}); the committed run before it was up to "
            f"{max(old):.2f}x off"
        )
    mtp = [
        _ms(m["grouped"]) / _ms(m["one_row"])  # type: ignore[operator]
        for m in art.read.get("mtp", [])
        if _ms(m.get("grouped")) and _ms(m.get("one_row"))
    ]
    swept = [
        _ms(m["grouped_best"]) / _ms(m["one_row"])  # type: ignore[operator]
        for m in art.read.get("mtp", [])
        if m.get("grouped_sweep") and _ms(m.get("grouped_best")) and _ms(m.get("one_row"))
    ]
    # What the fp8 anchor pays for a request's second row: DeepGEMM scores the flattened verify rows
    # one at a time; its decode timing at the same requests x keys is its one-row time.
    one_row_dg = {
        (r["shape"]["rows"], r["shape"]["keys"]): ms
        for r in art.read.get("results", [])
        if r["shape"]["mode"] == "decode" and not r["shape"].get("width") and (ms := _ms(r.get("fp8_deepgemm")))
    }
    anchor = [
        ms / one_row_dg[(m["requests"], m["keys"])]
        for m in art.read.get("mtp", [])
        if m["next_n"] == 2 and (ms := _ms(m.get("deepgemm"))) and (m["requests"], m["keys"]) in one_row_dg
    ]
    out.append(
        f"MTP verify (grouped) <= {TARGET_MTP}x one row per request: "
        + (
            f"{_count(mtp, lambda v: v <= TARGET_MTP)} (max {max(mtp):.2f}x)"
            if mtp
            else f"not measured ({RUN_COMMAND})"
        )
        + (
            f"; with the best swept grouped config per shape {_count(swept, lambda v: v <= TARGET_MTP)} "
            f"(max {max(swept):.2f}x)"
            if swept
            else ""
        )
        + (
            f"; DeepGEMM's fp8 scorer takes {min(anchor):.2f}-{max(anchor):.2f}x its one-row time for two "
            "rows per request (its decode timing at the same requests and keys)"
            if anchor
            else ""
        )
    )
    if prefill_kernel_measured(art):
        from verify.bench.read_scenarios import prefill_target_lines

        out += [line.replace("target long prefill", "long prefill", 1)
                for line in prefill_target_lines(art.read.get("long_prefill", []))]
    prefill = [] if prefill_kernel_measured(art) else [
        (
            p["tokens"],
            _ms(p["arms"].get(p["dispatch_arm"])),
            _ms(p["arms"].get("fp8_twin")),
            p["floors"].get("fp8_nonpaged_ms"),
        )
        for p in art.read.get("long_prefill", [])
        if not p.get("skipped")
    ]
    twin = [b / t for _, b, t, _ in prefill if b and t]
    floor = [b / f for _, b, _, f in prefill if b and f]
    real = [
        _ms(p["arms"][p["dispatch_arm"]]) / _ms(p["arms"]["deepgemm_nonpaged"])  # type: ignore[operator]
        for p in art.read.get("long_prefill", [])
        if not p.get("skipped") and _ms(p["arms"].get(p["dispatch_arm"])) and _ms(p["arms"].get("deepgemm_nonpaged"))
    ]
    if not prefill_kernel_measured(art):
        out.append(
            f"long prefill within {TARGET_PREFILL}x of upstream's fp8 prefill path: "
            + (
                (
                    f"{_count(real, lambda v: v <= TARGET_PREFILL)} against DeepGEMM's non-paged "
                    f"`fp8_mqa_logits` (upstream's default there; max {max(real):.2f}x), "
                    if real
                    else ""
                )
                + f"{_count(twin, lambda v: v <= TARGET_PREFILL)} against the fp8 twin (max {max(twin):.2f}x), "
                f"{_count(floor, lambda v: v <= TARGET_PREFILL)} against the non-paged fp8 floor (max {max(floor):.2f}x)"
                if twin and floor
                else f"not measured ({RUN_COMMAND})"
            )
            + _prefill_reach(art)
        )
    store = [row["bf16_over_fp8"] for row in (art.store or {}).get("rows", []) if "bf16_over_fp8" in row]
    if store:
        out.append(
            f"fused bf16 store no slower than the fp8 store: {_count(store, lambda v: v <= 1.0)} sizes "
            f"({min(store):.2f}-{max(store):.2f}x its time)"
        )
    return [f"- {line}" for line in out]


def render_body(art: Artifacts) -> str:
    """The speed section's text (verify.figures puts it between README's speed markers)."""
    meta = art.read.get("meta", {})
    body = [
        f"- **Speed** ({meta.get('gpu', 'GPU')}, Triton {meta.get('triton', '?')}; CUDA-graph replays over "
        "cold-L2 copies of the keys; the kernel's default launch config; fp8 twin: a Triton fp8 kernel over "
        "upstream's 132-B pages standing in for DeepGEMM"
        + ("; DeepGEMM: its own fp8 scorers, checked against the twin before timing" if deepgemm_measured(art)
           else ", which did not run in this bench")
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
        "Targets (DESIGN.md):",
        "",
        *targets(art),
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


def splice(readme: str, block: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README.md has no speed section markers ({BEGIN} ... {END})")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verify.bench.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--write", action="store_true", help="rewrite the README section (default: check it)")
    parser.add_argument(
        "--print", action="store_true", help="print the generated section and exit (README untouched)"
    )
    args = parser.parse_args(argv)
    block = render(load(args.results))
    if args.print:
        print(block)
        return 0
    text = args.readme.read_text()
    updated = splice(text, block)
    if args.write:
        if updated != text:
            args.readme.write_text(updated)
            print(f"{args.readme}: speed section rewritten from {args.results}")
        else:
            print(f"{args.readme}: speed section already matches {args.results}")
        return 0
    if updated != text:
        print(
            f"{args.readme}'s speed section differs from {args.results}; run python -m verify.bench.report --write",
            file=sys.stderr,
        )
        return 1
    print(f"{args.readme}: speed section matches {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
