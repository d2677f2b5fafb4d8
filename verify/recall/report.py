"""Outputs of a tier-2 run: results.json, results.csv, cells.csv, heatmap_<arm>.png, summary.md."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verify.core.metrics import aggregate
from verify.core.oracles import ORACLES_NOTE

from .gate import GateResult

CSV_FIELDS = (
    "source",
    "arm",
    "length_tokens",
    "n_keys",
    "seq_len",
    "topk",
    "k",
    "kind",
    "mode",
    "margin",
    "depth",
    "residue",
    "needle_pos",
    "group",
    "seq_id",
    "row",
    "recall_tie",
    "recall_strict",
    "mass",
    "changed",
    "needle_hit",
    "oracle_needle_selected",
    "oracle_margin_nonselected",
    "oracle_margin_best_other",
    "gated",
    "agree_bf16",
    "recall_tie_unq",
    "q_quant_recall",
    "recall_tie_ref",
    "ref_recall_tie",
    "ref_recall_tie_unq",
)


def _clean(obj: object) -> object:
    """JSON has no NaN/inf: NaN -> null, +-inf -> "inf"/"-inf"."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def depth_label(d: Any) -> str:
    return "n/a" if d is None else f"{float(d) * 100:g}%"


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(_clean(dict(payload)), indent=1, sort_keys=False) + "\n")


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in fields})


def flat_cells(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for c in cells:
        row: dict[str, Any] = {k: v for k, v in c.items() if not isinstance(v, dict)}
        for m in ("recall_tie", "recall_strict", "mass"):
            for stat in ("mean", "p1", "min"):
                row[f"{m}_{stat}"] = c[m][stat]
        out.append(row)
    return out


def heatmaps(out: Path, cells: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[str]:
    """One PNG per arm: mean tie-aware recall per (length x depth), a panel per index_topk; cells
    where a gated needle was missed are marked with a red x and the miss count. Without matplotlib
    (the GPU machine may lack it) nothing is drawn: ``python -m verify.recall.report DIR`` draws
    them later from results.json."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []

    lengths = sorted({int(c["length_tokens"]) for c in cells})
    depths = sorted({c["depth"] for c in cells}, key=lambda d: -1.0 if d is None else float(d))
    topks = sorted({int(c["topk"]) for c in cells})
    means = [float(c["recall_tie"]["mean"]) for c in cells]
    vmin = min([0.9] + [m for m in means if not math.isnan(m)])
    vmin = math.floor(vmin * 100) / 100
    files: list[str] = []
    for arm in arms:
        fig, axes = plt.subplots(
            1,
            len(topks),
            figsize=(1.1 * len(depths) * len(topks) + 2.5, 0.45 * len(lengths) + 1.8),
            squeeze=False,
        )
        im = None
        for ax, topk in zip(axes[0], topks):
            grid = [[math.nan] * len(depths) for _ in lengths]
            miss = [[0] * len(depths) for _ in lengths]
            for c in cells:
                if c["arm"] != arm or int(c["topk"]) != topk:
                    continue
                i = lengths.index(int(c["length_tokens"]))
                j = depths.index(c["depth"])
                grid[i][j] = float(c["recall_tie"]["mean"])
                miss[i][j] = int(c["gated_needles"]) - int(c["gated_hits"])
            im = ax.imshow(grid, vmin=vmin, vmax=1.0, cmap="viridis", aspect="auto")
            for i in range(len(lengths)):
                for j in range(len(depths)):
                    v = grid[i][j]
                    if not math.isnan(v):
                        ax.text(
                            j,
                            i,
                            f"{v:.4f}",
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="w" if v < (vmin + 1) / 2 else "k",
                        )
                    if miss[i][j]:
                        ax.text(
                            j, i + 0.3, f"x{miss[i][j]}", ha="center", va="center", fontsize=7, color="red"
                        )
            ax.set_xticks(range(len(depths)), [depth_label(d) for d in depths], fontsize=7)
            ax.set_yticks(range(len(lengths)), [f"{n:,}" for n in lengths], fontsize=7)
            ax.set_xlabel("needle depth")
            ax.set_ylabel("prompt tokens")
            ax.set_title(f"{arm}: tie-aware recall, top-{topk}", fontsize=9)
        if im is not None:
            fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
        name = f"heatmap_{arm}.png"
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        plt.close(fig)
        files.append(name)
    return files


def _fmt(x: Any, nd: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{float(x):.{nd}f}"


def summary_markdown(
    meta: Mapping[str, Any],
    per_length: Sequence[Mapping[str, Any]],
    per_depth: Sequence[Mapping[str, Any]],
    arms: Sequence[str],
    gate: GateResult,
    diagnosis_line: str | None,
    files: Sequence[str],
    diagnosis_details: Sequence[str] = (),
    gate_exact: GateResult | None = None,
) -> str:
    lines: list[str] = []
    lines.append("# Indexer recall (tier 2)\n")
    lines.append(
        f"Backend `{meta['backend']}`, source `{meta['source']}`, seed {meta['seed']}, "
        f"{meta['rows']} rows x {len(arms)} arms, {meta['elapsed_s']:.1f} s.\n"
    )
    lines.append(f"## Gate (bf16 vs fp8): **{'PASS' if gate.passed else 'FAIL'}**\n")
    lines.append(f"Against the {gate.oracle}.\n")
    for c in gate.conditions:
        lines.append(f"- {'ok' if c.passed else 'FAIL'} `{c.name}`: {c.detail}")
        for f in c.failures[:10]:
            lines.append(f"  - {json.dumps(_clean(f))}")
        if len(c.failures) > 10:
            lines.append(f"  - ... {len(c.failures) - 10} more (results.json)")
    lines.append("")
    if gate_exact is not None:
        lines.append(
            f"Beside it, the same conditions against the {gate_exact.oracle} (reported, not gating): "
            f"**{'pass' if gate_exact.passed else 'fail'}**\n"
        )
        for c in gate_exact.conditions:
            lines.append(f"- {'ok' if c.passed else 'fail'} `{c.name}`: {c.detail}")
        lines.append("")
    if diagnosis_line:
        lines.append("## Diagnosis\n")
        lines.append(f"**{diagnosis_line}**\n")
        lines.extend(diagnosis_details)
        lines.append("\nNumbers per check are under `diagnosis` in results.json.\n")
    topks = sorted({int(e["topk"]) for e in per_length})
    by = {(e["arm"], e["topk"], e["length_tokens"]): e for e in per_length}
    for topk in topks:
        lines.append(f"## Per length, index_topk={topk}\n")
        lines.append(
            "Tie-aware recall mean / p1 / min over rows; needles: hits/planted (gated hits/gated).\n"
        )
        head = (
            "| tokens | keys | "
            + " | ".join(f"{a} recall" for a in arms)
            + " | loss bf16/fp8 | "
            + " | ".join(f"{a} needles" for a in arms)
            + " |"
        )
        lines.append(head)
        lines.append("|" + "---|" * (3 + 2 * len(arms)))
        lengths = sorted({int(e["length_tokens"]) for e in per_length if int(e["topk"]) == topk})
        for n in lengths:
            ents = [by.get((a, topk, n)) for a in arms]
            first = next(e for e in ents if e is not None)
            rec = " | ".join(
                "-"
                if e is None
                else f"{_fmt(e['recall_tie']['mean'])} / {_fmt(e['recall_tie']['p1'])} / {_fmt(e['recall_tie']['min'])}"
                for e in ents
            )
            lb, lf = by.get(("bf16", topk, n)), by.get(("fp8", topk, n))
            ratio = "-"
            if lb is not None and lf is not None:
                ratio = f"{_fmt(lb['loss'], 5)} / {_fmt(lf['loss'], 5)}"
            nd = " | ".join(
                "-"
                if e is None
                else f"{e['needle_hits']}/{e['needles']} ({e['gated_hits']}/{e['gated_needles']})"
                for e in ents
            )
            keys = first.get("n_keys_max", "")
            lines.append(f"| {n:,} | {keys} | {rec} | {ratio} | {nd} |")
        lines.append("")
        if any("recall_tie_unq" in e for e in per_length):
            lines.extend(oracle_table(by, arms, topk, lengths))
    lines.append("## Per depth (all lengths), mean tie-aware recall\n")
    depths = sorted({e["depth"] for e in per_depth}, key=lambda d: -1.0 if d is None else float(d))
    byd = {(e["arm"], e["topk"], e["depth"]): e for e in per_depth}
    lines.append("| depth | " + " | ".join(f"{a} top-{t}" for t in topks for a in arms) + " |")
    lines.append("|" + "---|" * (1 + len(arms) * len(topks)))
    for d in depths:
        vals = [byd.get((a, t, d)) for t in topks for a in arms]
        lines.append(
            f"| {depth_label(d)} | "
            + " | ".join("-" if e is None else _fmt(e["recall_tie"]["mean"]) for e in vals)
            + " |"
        )
    lines.append("")
    lines.append("## Paths used\n")
    for k, v in dict(meta.get("paths", {})).items():
        lines.append(f"- `{k}`: {v}")
    lines.append("")
    lines.append("Files: " + ", ".join(f"`{f}`" for f in files) + "\n")
    return "\n".join(lines)


def _mean(e: Mapping[str, Any] | None, metric: str) -> object:
    m = None if e is None else e.get(metric)
    return m["mean"] if isinstance(m, dict) else None


def oracle_table(
    by: Mapping[tuple, Mapping[str, Any]], arms: Sequence[str], topk: int, lengths: Sequence[int]
) -> list[str]:
    """Per length, each arm's mean tie-aware recall against each oracle, and (where the records
    carry the reference oracle) the reference's own selection against the other two."""
    has_ref = any(_mean(by.get((a, topk, n)), "recall_tie_ref") is not None for a in arms for n in lengths)
    names = ["same-q", "exact-q"] + (["reference"] if has_ref else [])
    metrics = ["recall_tie", "recall_tie_unq"] + (["recall_tie_ref"] if has_ref else [])
    head = " oracle / ".join(names) + " oracle"
    lines = [f"Mean tie-aware recall, {head}, index_topk={topk}:\n"]
    extra = ["reference's own selection (fp4 q x fp4 k)"] if has_ref else []
    lines.append("| tokens | " + " | ".join([*arms, *extra]) + " |")
    lines.append("|" + "---|" * (1 + len(arms) + len(extra)))
    for n in lengths:
        cells = [" / ".join(_fmt(_mean(by.get((a, topk, n)), m)) for m in metrics) for a in arms]
        if has_ref:
            first = next((by[(a, topk, n)] for a in arms if (a, topk, n) in by), None)
            cells.append(
                f"{_fmt(_mean(first, 'ref_recall_tie'))} / {_fmt(_mean(first, 'ref_recall_tie_unq'))} / 1"
            )
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return [*lines, "", ORACLES_NOTE, ""]


def per_length_with_sizes(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    per_length = aggregate(records, ["topk", "length_tokens"])
    sizes: dict[int, int] = {}
    for r in records:
        n = int(r["length_tokens"])
        sizes[n] = max(sizes.get(n, 0), int(r["n_keys"]))
    for e in per_length:
        e["n_keys_max"] = sizes.get(int(e["length_tokens"]), 0)
    return per_length


def replot(out: Path) -> list[str]:
    """Draw the heatmaps of a finished run from its results.json (cells and arms)."""
    res = json.loads((out / "results.json").read_text())
    return heatmaps(out, res["cells"], res["config"]["arms"])


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m verify.recall.report", description="redraw heatmap_<arm>.png from results.json"
    )
    ap.add_argument("out", type=Path)
    files = replot(ap.parse_args(argv).out)
    print("\n".join(files) if files else "matplotlib is not installed: no heatmaps drawn")
    return 0 if files else 1


if __name__ == "__main__":
    raise SystemExit(main())
