"""`rebase-check` on small series over the real 0.5.21 and 0.5.23 wheels: what carrying to a newer
release meets, counted as a carry meets it, and the committed carried series checked on theirs."""

from __future__ import annotations

import pytest

from bf16k import gitutil, patches, series

from .conftest import INDEXER, TRAILERS, WHY, Product, RecordingGate, break_first_patch
from .rebase_support import CONFLICT_NAME, Q_CONFLICT, Q_SIGNATURE, REL, _add, _carried_tree, _cli, _tree_hash


@pytest.mark.slow
def test_rebase_check_reports_per_patch_and_changes_nothing(
    two_patch_product: Product, no_gate: RecordingGate
) -> None:
    p = two_patch_product
    assert _cli(p.root, "rebase", REL, gate=no_gate)[0] == 0  # a committed carried series of the two patches
    _add(p, INDEXER, Q_SIGNATURE, Q_CONFLICT, "[DSV4] indexer: make q_lora contiguous")
    patches.export(p.target)
    gitutil.git(["add", "-A", "series", "pin.toml"], p.root)
    gitutil.git(["commit", "-q", "-m", "series"], p.root)
    before = _tree_hash(p.root)

    code, out, err = _cli(p.root, "rebase-check", "--releases", REL)
    assert code == 0, err
    assert _tree_hash(p.root) == before
    assert f"## sglang {REL}: 1 of 3 patches conflict" in out
    assert "| 1 | `indexer-add-a-marker-line.patch` | clean |" in out
    assert f"| 3 | `{CONFLICT_NAME}` | conflict | `srt/layers/attention/dsv4/indexer.py:" in out
    assert "(C4Indexer.compute_q) | – |" in out  # not carried yet: nothing resolves it
    assert (
        f"`series/next/{REL}/`: applies on its release, exports byte-identically, its series tests pass"
        in out
    )

    # A committed carried series that no longer applies fails the check.
    nxt = p.root / "series" / "next" / REL
    break_first_patch(nxt)
    before = _tree_hash(p.root)
    code, out, err = _cli(p.root, "rebase-check", "--releases", REL)
    assert code == 1
    assert f"`series/next/{REL}/`: **FAILS**" in out and "does not apply" in out
    assert _tree_hash(p.root) == before


HELPER = "python/sglang/srt/layers/attention/dsv4/bf16k_helper.py"


def test_rebase_check_counts_conflicts_the_way_a_carry_meets_them(
    two_patch_product: Product, no_gate: RecordingGate
) -> None:
    """Patch 3 conflicts and creates a module patch 4 edits. Left out, patch 3 would make patch 4
    fail too (what the check used to count); a carry resolves 3 first and 4 applies cleanly."""
    p = two_patch_product
    f = p.upstream / INDEXER
    f.write_text(f.read_text().replace(Q_SIGNATURE, Q_CONFLICT, 1))
    (p.upstream / HELPER).write_text('"""bf16k test helper"""\nVALUE = 1\n')
    gitutil.git(["add", "--", INDEXER, HELPER], p.upstream)
    gitutil.git(
        ["commit", "-q", "-m", f"[DSV4] indexer: contiguous q_lora and a helper\n\n{WHY}\n\n{TRAILERS}\n"],
        p.upstream,
    )
    _add(p, HELPER, "VALUE = 1\n", "VALUE = 2\n", "[DSV4] helper: two")
    patches.export(p.target)
    gitutil.git(["add", "-A", "series", "pin.toml"], p.root)
    gitutil.git(["commit", "-q", "-m", "series"], p.root)
    names = series.read_order(p.root / "series")

    code, out, err = _cli(p.root, "rebase-check", "--releases", REL, "--no-tests")
    assert code == 0, err
    assert f"## sglang {REL}: 1 of 4 patches conflict\n" in out
    assert f"| 3 | `{names[2]}` | conflict |" in out and f"| 4 | `{names[3]}` | clean |" in out

    # Carry it, resolving patch 3 by hand: now the check names the carried series that resolves it.
    assert _cli(p.root, "rebase", REL, gate=no_gate)[0] == 1
    tree = _carried_tree(p.root)
    lines = (tree / INDEXER).read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("<<<<<<< "))
    end = next(i for i, line in enumerate(lines) if line.startswith(">>>>>>> "))
    fix = "        q, _ = self.wq_b((q_lora if q_lora_quant is None else q_lora_quant).contiguous())"
    (tree / INDEXER).write_text("\n".join(lines[:start] + [fix] + lines[end + 1 :]))
    code, out, err = _cli(
        p.root, "rebase", "--continue", "-m", "indexer.py: keep 0.5.23's quant, contiguous", gate=no_gate
    )
    assert code == 0, out + err
    gitutil.git(["add", "-A", "series", "CHANGELOG.md"], p.root)
    gitutil.git(["commit", "-q", "-m", "carried"], p.root)
    code, out, err = _cli(p.root, "rebase-check", "--releases", REL, "--no-tests")
    assert code == 0, err
    assert f"## sglang {REL}: 1 of 4 patches conflict, all resolved by a carried series" in out
    assert f"`series/next/{REL}/` (replays cleanly) |" in out and f"| 4 | `{names[3]}` | clean |" in out
    assert f"replays `series/next/{REL}/` cleanly for 4 patches" in out
