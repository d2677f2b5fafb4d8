"""Which series made a result: every result JSON the verify tiers write records it under
:data:`SERIES_HASH`, and :func:`series_hash` is the one place that says what it is.

The value is :func:`bf16k.series.series_hash`'s, the hash ``apply`` records in the upstream tree
it patches and the wheel carries in its version, so a result can be matched to the applied series,
its wheel and its carry. The tree under test is the one the importable ``sglang`` comes from
(without one, this checkout's ``sglang-upstream/``): its own record says which series it carries,
even when ``series/`` changed after it was applied. A run without such a record (tier 2's CPU
emulation where no tree was applied) records this checkout's ``series/``, hashed by the same
function.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bf16k import gitutil
from bf16k.errors import ToolError
from bf16k.series import SERIES_FILE
from bf16k.series import series_hash as hash_series
from bf16k.upstream import read_state

SERIES_HASH = "series_hash"  # the key every result JSON records the applied series under
CHECKOUT = Path(__file__).resolve().parents[2]


def upstream_tree() -> Path | None:
    """The git work tree of the upstream SGLang the tiers run: the one the importable ``sglang``
    comes from (``<tree>/python/sglang``; None for an installed one), else, with no ``sglang`` to
    import, this checkout's ``sglang-upstream/``."""
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations))).resolve()
        tree = package.parents[1] if len(package.parents) > 1 else package
        return tree if gitutil.is_repo(tree) else None
    local = CHECKOUT / "sglang-upstream"
    return local if gitutil.is_repo(local) else None


def applied_state() -> dict[str, str]:
    """What ``apply`` recorded in the tree under test (``series_hash``, ``head``, ``base``);
    empty where no tree records it (an installed sglang, a tree built another way)."""
    tree = upstream_tree()
    if tree is None:
        return {}
    try:
        return read_state(tree)
    except ToolError:  # git could not read the tree: nothing recorded
        return {}


def series_hash() -> str | None:
    """The hash of the series the tree under test carries, as ``apply`` recorded it there; without
    such a record, this checkout's ``series/``; None outside a checkout with a series."""
    recorded = applied_state().get(SERIES_HASH)
    if recorded:
        return recorded
    series_dir = CHECKOUT / "series"
    return hash_series(series_dir) if (series_dir / SERIES_FILE).is_file() else None
