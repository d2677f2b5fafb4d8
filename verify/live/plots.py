"""Heatmaps: pass rate over length x depth, one PNG per scenario and arm (plus an A/B delta map).

A column is a nominal length; its value aggregates that length's nudged variants (residues mod 4,
page boundaries) and repeats, so a single bad residue shows as a partial cell instead of
disappearing in a wide grid. The CSV has every variant separately.

Only measurements (pass / fail) are coloured on the red-green scale. A square with no measurement
gets its state's own colour and letter (truncated, unchecked, error, not measured, skipped), and a
square with some requests not measured carries their letters under its rate ("+E"): a truncated or
rate-limited cell never reads as a recall failure. The legend explains every letter a map draws,
and sits below the figure, outside the axes, so it never covers a square or a tick label.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verify.live.states import (
    ERROR,
    FAIL,
    LETTERS,
    PASS,
    SKIPPED,
    TRUNCATED,
    UNCHECKED,
    UNMEASURED,
    state_of,
)
from verify.live.summary import CellSummary

# Colours of the states that are not measurements (letters as in the report's tables).
_COLOURS = {
    TRUNCATED: "#8e44ad",
    UNCHECKED: "#f39c12",
    ERROR: "#5d6d7e",
    UNMEASURED: "#d5d8dc",
    SKIPPED: "#ffffff",
}
STATE_STYLE = {state: (colour, LETTERS[state]) for state, colour in _COLOURS.items()}
_STYLE_ORDER = (TRUNCATED, ERROR, UNCHECKED, UNMEASURED, SKIPPED)  # which colour a square gets


def square_counts(
    cells: Sequence[CellSummary], arm: str, scenario: str
) -> dict[tuple[int, float], Counter[str]]:
    """Requests per state for each (nominal length, depth) square of one arm's map."""
    group = "shared_prefix" if scenario == "shared_prefix" else "sequential"
    acc: dict[tuple[int, float], Counter[str]] = defaultdict(Counter)
    for c in cells:
        if c.arm == arm and c.scenario == scenario and c.group == group:
            for r in c.records:
                acc[(c.base_length, c.depth_pct)][state_of(r)] += 1
    return acc


def square_look(counts: Counter[str]) -> tuple[float | None, str, str | None]:
    """(pass rate over measurements or None, text, state colour when there is no measurement)."""
    measured = counts[PASS] + counts[FAIL]
    letters = "".join(STATE_STYLE[s][1] for s in _STYLE_ORDER if counts[s])
    if measured:
        rate = counts[PASS] / measured
        return rate, f"{rate:.2f}" + (f"\n+{letters}" if letters else ""), None
    state = next(s for s in _STYLE_ORDER if counts[s])
    return None, STATE_STYLE[state][1], STATE_STYLE[state][0]


def legend_entries(texts: dict[tuple[int, int], str], delta: bool) -> list[tuple[str, str]]:
    """(colour, label) for every letter the map draws: alone in a square, or as '+X' under a rate."""
    letters = {letter for _, letter in STATE_STYLE.values()}
    alone = {t for t in texts.values() if t in letters}
    under = {ch for t in texts.values() if "\n+" in t for ch in t.split("\n+", 1)[1]}
    out = []
    for state, (colour, letter) in STATE_STYLE.items():
        if letter not in alone | under:
            continue
        name = "not measured on both servers" if delta and state == UNMEASURED else state
        out.append((colour, f"{letter}: {name}"))
    if under:
        out.append(("#ffffff", "+X under a rate: some requests of that square are X, not measured"))
    return out


def draw_heatmap(
    values: Any,
    texts: dict[tuple[int, int], str],
    paints: dict[tuple[int, int], str],
    lengths: Sequence[int],
    depths: Sequence[float],
    title: str,
    delta: bool,
) -> Any:
    """One map as a matplotlib Figure (the caller saves and closes it)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch, Rectangle

    fig, ax = plt.subplots(
        figsize=(1.6 + 0.75 * max(4, len(lengths)), 2.0 + 0.42 * max(3, len(depths))), layout="constrained"
    )
    cmap = plt.get_cmap("RdBu" if delta else "RdYlGn").with_extremes(bad="#ffffff")
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-1 if delta else 0, vmax=1, aspect="auto")
    for (i, j), colour in paints.items():
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=colour, edgecolor="#999999", lw=0.5))
    for (i, j), text in texts.items():
        ax.text(j, i, text, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths], rotation=45, ha="right")
    ax.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths])
    ax.set_xlabel("prompt length (tokens, nominal)")
    ax.set_ylabel("needle depth")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04, label="server minus baseline" if delta else "pass rate")
    entries = legend_entries(texts, delta)
    if entries:
        # "outside": constrained layout gives the legend its own row below everything else.
        fig.legend(
            handles=[Patch(facecolor=c, edgecolor="#999999", label=label) for c, label in entries],
            loc="outside lower center",
            ncol=min(3, len(entries)),
            fontsize=7,
            frameon=False,
        )
    return fig


def heatmaps(cells: Sequence[CellSummary], out_dir: Path, labels: dict[str, str]) -> list[Path]:
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    arms = sorted({c.arm for c in cells})
    scenarios = sorted({c.scenario for c in cells})
    grids = {(a, s): square_counts(cells, a, s) for a in arms for s in scenarios}

    def axes_of(squares: dict[tuple[int, float], Counter[str]]) -> tuple[list[int], list[float]]:
        return sorted({k[0] for k in squares}), sorted({k[1] for k in squares})

    def save(fig: Any, path: Path) -> None:
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    for (arm, scenario), squares in grids.items():
        if not squares:
            continue
        lengths, depths = axes_of(squares)
        arr = np.full((len(depths), len(lengths)), np.nan)
        texts: dict[tuple[int, int], str] = {}
        paints: dict[tuple[int, int], str] = {}
        for (n, d), counts in squares.items():
            i, j = depths.index(d), lengths.index(n)
            rate, text, paint = square_look(counts)
            texts[(i, j)] = text
            if rate is not None:
                arr[i, j] = rate
            if paint is not None:
                paints[(i, j)] = paint
        title = f"{scenario} - {labels.get(arm, arm)}: pass rate (measured requests)"
        save(
            draw_heatmap(arr, texts, paints, lengths, depths, title, False),
            out_dir / f"{scenario}__{arm}.png",
        )

    if "server" in arms and "baseline" in arms:
        for scenario in scenarios:
            sv, bv = grids[("server", scenario)], grids[("baseline", scenario)]
            if not sv or not bv:
                continue
            lengths, depths = axes_of({**sv, **bv})
            arr = np.full((len(depths), len(lengths)), np.nan)
            texts, paints = {}, {}
            for i, d in enumerate(depths):
                for j, n in enumerate(lengths):
                    s_rate = square_look(sv[(n, d)])[0] if (n, d) in sv else None
                    b_rate = square_look(bv[(n, d)])[0] if (n, d) in bv else None
                    if s_rate is None or b_rate is None:
                        paints[(i, j)] = STATE_STYLE[UNMEASURED][0]
                        texts[(i, j)] = STATE_STYLE[UNMEASURED][1]
                        continue
                    arr[i, j] = s_rate - b_rate
                    texts[(i, j)] = f"{s_rate - b_rate:+.2f}"
            title = f"{scenario}: {labels.get('server', 'server')} minus {labels.get('baseline', 'baseline')}"
            save(
                draw_heatmap(arr, texts, paints, lengths, depths, title, True),
                out_dir / f"{scenario}__delta.png",
            )
    return written
