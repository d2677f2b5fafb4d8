"""Heatmaps: pass rate over length x depth, one PNG per scenario and arm (plus an A/B delta map).

A column is a nominal length; its value aggregates that length's nudged variants (residues mod 4,
page boundaries) and repeats, so a single bad residue shows as a partial cell instead of
disappearing in a wide grid. The CSV has every variant separately.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from verify.live.summary import CellSummary


def _grid(
    cells: Sequence[CellSummary], arm: str, scenario: str
) -> tuple[list[int], list[float], dict[tuple[int, float], float]]:
    acc: dict[tuple[int, float], list[int]] = defaultdict(lambda: [0, 0])
    for c in cells:
        group = "shared_prefix" if scenario == "shared_prefix" else "sequential"
        if c.arm != arm or c.scenario != scenario or c.group != group or c.skipped:
            continue
        slot = acc[(c.base_length, c.depth_pct)]
        slot[0] += int(c.passed)
        slot[1] += 1
    lengths = sorted({k[0] for k in acc})
    depths = sorted({k[1] for k in acc})
    return lengths, depths, {k: v[0] / v[1] for k, v in acc.items() if v[1]}


def heatmaps(cells: Sequence[CellSummary], out_dir: Path, labels: dict[str, str]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    arms = sorted({c.arm for c in cells})
    scenarios = sorted({c.scenario for c in cells})
    grids = {(a, s): _grid(cells, a, s) for a in arms for s in scenarios}

    def draw(
        values: np.ndarray, lengths: list[int], depths: list[float], title: str, path: Path, delta: bool
    ) -> None:
        fig, ax = plt.subplots(figsize=(1.0 + 0.75 * max(4, len(lengths)), 1.2 + 0.42 * max(3, len(depths))))
        cmap = plt.get_cmap("RdBu" if delta else "RdYlGn").with_extremes(bad="#d0d0d0")
        im = ax.imshow(
            np.ma.masked_invalid(values), cmap=cmap, vmin=-1 if delta else 0, vmax=1, aspect="auto"
        )
        ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths], rotation=45, ha="right")
        ax.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths])
        ax.set_xlabel("prompt length (tokens, nominal)")
        ax.set_ylabel("needle depth")
        ax.set_title(title, fontsize=10)
        for i in range(len(depths)):
            for j in range(len(lengths)):
                v = values[i, j]
                if not np.isnan(v):
                    ax.text(j, i, f"{v:+.2f}" if delta else f"{v:.2f}", ha="center", va="center", fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.04)
        fig.subplots_adjust(left=0.12, right=0.95, bottom=0.25, top=0.88)
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)

    for (arm, scenario), (lengths, depths, vals) in grids.items():
        if not vals:
            continue
        arr = np.full((len(depths), len(lengths)), np.nan)
        for (n, d), v in vals.items():
            arr[depths.index(d), lengths.index(n)] = v
        title = f"{scenario} - {labels.get(arm, arm)}: pass rate"
        draw(arr, lengths, depths, title, out_dir / f"{scenario}__{arm}.png", delta=False)

    if "server" in arms and "baseline" in arms:
        for scenario in scenarios:
            ls, ds, sv = grids[("server", scenario)]
            lb, db, bv = grids[("baseline", scenario)]
            lengths, depths = sorted(set(ls) | set(lb)), sorted(set(ds) | set(db))
            if not sv or not bv:
                continue
            arr = np.full((len(depths), len(lengths)), np.nan)
            for i, d in enumerate(depths):
                for j, n in enumerate(lengths):
                    if (n, d) in sv and (n, d) in bv:
                        arr[i, j] = sv[(n, d)] - bv[(n, d)]
            title = f"{scenario}: {labels.get('server', 'server')} minus {labels.get('baseline', 'baseline')}"
            draw(arr, lengths, depths, title, out_dir / f"{scenario}__delta.png", delta=True)
    return written
