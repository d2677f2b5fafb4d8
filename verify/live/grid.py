"""The plan: which cells each scenario runs, in the default grid and in `--quick`.

Lengths come from the measured failure (4,509 and 5,200 around the edge, 22,597 the longest good
run) and the usual powers; 1K and 2K are controls, where DeepSeek-V4-Flash's indexer (top-512 of
one key per 4 tokens) selects every key, so a failure there means the harness or the deployment
is broken, not the index keys.

Each sweep length is nudged so all residues mod 4 appear (a reported V4 failure depends on the
prompt length mod 4) and so the compressed-key count crosses a 64-entry page boundary
(256 tokens): B-1, B and B+4 tokens around the next multiple B of 256.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verify.live.scenarios import SCENARIOS, SHARED_PREFIX_DEPTHS, Cell

CONTROL_MAX = 2048  # top-512 compressed keys x 4 tokens: the indexer selects everything up to here
PAGE_TOKENS = 256  # 64 index-K slots per page x 4 tokens per compressed key

FULL_DEPTHS = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 100.0)
QUICK_DEPTHS = (0.0, 25.0, 50.0, 75.0, 100.0)
SWEEP_LENGTHS = (1024, 2048, 4509, 5200, 8000, 12000, 22597, 32768, 65536)
QUICK_SWEEP_LENGTHS = (1024, 2048, 4509, 8000)
DEFAULT_MAX_LENGTH = 65536
QUICK_MAX_LENGTH = 12000  # the quick sweep stops at 8,000; the config file still goes to ~12K


CONTROL_SLACK = 3  # a control's nudges reach CONTROL_MAX + 3 (all residues mod 4)


def is_control(base_length: int, read_tokens: int | None) -> bool:
    """A control by the length the server read, not the length asked for: a "2K" prompt that came
    out at 3,300 tokens is past the point where the indexer selects every key, so it cannot serve
    as a control. Unknown length (not measured yet): by the plan."""
    if base_length > CONTROL_MAX:
        return False
    return read_tokens is None or read_tokens <= CONTROL_MAX + CONTROL_SLACK


@dataclass(frozen=True)
class ScenarioGrid:
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    variants: tuple[str, ...]


# Other scenarios cost more per cell (several needles, long chats): fewer cells, same lengths.
FULL_GRID: dict[str, ScenarioGrid] = {
    "sweep": ScenarioGrid(SWEEP_LENGTHS, FULL_DEPTHS, ("code",)),
    "ruler_single": ScenarioGrid(
        (2048, 4509, 8000, 22597, 65536), (10.0, 50.0, 90.0), ("number", "uuid", "noise")
    ),
    "ruler_multikey": ScenarioGrid((2048, 8000, 22597, 65536), (10.0, 50.0, 90.0), ("number",)),
    "ruler_multivalue": ScenarioGrid((2048, 8000, 22597, 65536), (10.0, 50.0), ("number",)),
    "multiturn_secret": ScenarioGrid((2048, 8000, 22597), (5.0, 50.0, 90.0), ("chat",)),
    "multiturn_tools": ScenarioGrid((2048, 8000, 22597), (10.0, 50.0, 90.0), ("tools",)),
    "config_recall": ScenarioGrid((2048, 8000, 12000), (10.0, 50.0, 90.0), ("ini",)),
    "shared_prefix": ScenarioGrid((8000, 22597), SHARED_PREFIX_DEPTHS, ("number",)),
}
QUICK_GRID: dict[str, ScenarioGrid] = {
    "sweep": ScenarioGrid(QUICK_SWEEP_LENGTHS, QUICK_DEPTHS, ("code",)),
    "ruler_single": ScenarioGrid((2048, 8000), (10.0, 50.0, 90.0), ("number",)),
    "ruler_multikey": ScenarioGrid((2048, 8000), (50.0,), ("number",)),
    "ruler_multivalue": ScenarioGrid((2048, 8000), (10.0,), ("number",)),
    "multiturn_secret": ScenarioGrid((2048, 8000), (50.0,), ("chat",)),
    "multiturn_tools": ScenarioGrid((2048, 8000), (50.0,), ("tools",)),
    "config_recall": ScenarioGrid((2048, 8000, 12000), (50.0,), ("ini",)),
    "shared_prefix": ScenarioGrid((8000,), SHARED_PREFIX_DEPTHS, ("number",)),
}
# Scenarios that also try --max-length itself (the needle scenarios the gate reads).
LENGTH_SWEPT = ("sweep", "ruler_single")
NUDGE_MODES = ("none", "residues", "pages", "quick")


def nudged(length: int, modes: Sequence[str]) -> list[int]:
    """Exact prompt lengths tried for one nominal length."""
    out = {length}
    if "residues" in modes:
        out.update(length + k for k in range(4))
    if "quick" in modes:
        out.add(length + (3 - length) % 4)  # the residue-3 case of the report, next to the base
    if "pages" in modes and length > CONTROL_MAX:
        boundary = -(-length // PAGE_TOKENS) * PAGE_TOKENS
        out.update((boundary - 1, boundary, boundary + 4))
    return sorted(out)


@dataclass(frozen=True)
class GridOptions:
    quick: bool = False
    scenarios: tuple[str, ...] = SCENARIOS
    lengths: tuple[int, ...] | None = None  # overrides the swept scenarios' lengths
    depths: tuple[float, ...] | None = None  # overrides every scenario's depths
    max_length: int | None = None
    nudge: tuple[str, ...] | None = None  # default: residues+pages (full), quick (quick)
    concurrency_lengths_min: int = 4509
    # The server's longest prompt: when --max-length is beyond it, that limit is tried instead.
    server_limit: int | None = None
    # --target-length: the gate scenarios are planned at it, so the gate measures what it claims.
    target_length: int | None = None

    def effective_max(self) -> int:
        if self.max_length is not None:
            return self.max_length
        return max(QUICK_MAX_LENGTH if self.quick else DEFAULT_MAX_LENGTH, self.target_length or 0)

    def nudge_modes(self) -> tuple[str, ...]:
        if self.nudge is not None:
            return self.nudge
        return ("quick",) if self.quick else ("residues", "pages")


def base_cells(opts: GridOptions) -> list[Cell]:
    """Every cell of the base pass, in run order (scenario by scenario, short lengths first)."""
    grid = QUICK_GRID if opts.quick else FULL_GRID
    max_len = opts.effective_max()
    modes = opts.nudge_modes()
    cells: list[Cell] = []
    for scenario in SCENARIOS:
        if scenario not in opts.scenarios:
            continue
        g = grid[scenario]
        lengths = list(g.lengths) if opts.lengths is None else list(opts.lengths)
        if scenario in LENGTH_SWEPT and opts.lengths is None and opts.max_length is not None:
            lengths.append(opts.max_length)  # the user-set maximum is always tried
            if opts.server_limit is not None and opts.server_limit < opts.max_length:
                lengths.append(opts.server_limit - 3)  # ...or the longest the server holds (room for nudges)
        if scenario in LENGTH_SWEPT and opts.lengths is None and opts.target_length is not None:
            lengths.append(opts.target_length)  # --lengths, when given, must hold it (gate.resolve_target)
        lengths = sorted({n for n in lengths if n <= max_len})
        depths = g.depths if (opts.depths is None or scenario == "shared_prefix") else opts.depths
        for length in lengths:
            # Only the needle sweep is nudged; the other scenarios use the nominal length.
            targets = nudged(length, modes) if scenario == "sweep" else [length]
            if length <= CONTROL_MAX:
                targets = [t for t in targets if t <= CONTROL_MAX + CONTROL_SLACK]
            if opts.server_limit is not None and length <= opts.server_limit:
                # A length the server holds keeps only the nudges it holds too: the default gate
                # target is the longest length whose every planned cell can be measured.
                targets = [t for t in targets if t <= opts.server_limit]
            for variant in g.variants:
                for target in targets:
                    if scenario == "shared_prefix":
                        for j, d in enumerate(depths):
                            cells.append(Cell(scenario, variant, length, target, d, f"k{j}"))
                        continue
                    for d in depths:
                        cells.append(Cell(scenario, variant, length, target, d))
    return cells


def concurrency_cells(cells: Sequence[Cell], opts: GridOptions) -> list[Cell]:
    """Sweep cells for the concurrency pass: nominal lengths past the control region, and the
    shallowest, middle and deepest needle of the sweep (three depths keep the pass short)."""
    sweep = [c for c in cells if c.scenario == "sweep" and c.target_tokens == c.base_length]
    if not sweep:
        return []
    depths = sorted({c.depth_pct for c in sweep})
    picked_depths = {depths[0], depths[len(depths) // 2], depths[-1]}
    floor = min(opts.concurrency_lengths_min, max(c.base_length for c in sweep))
    return [c for c in sweep if c.base_length >= floor and c.depth_pct in picked_depths]
