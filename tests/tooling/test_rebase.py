"""Carrying the series to a newer upstream: rebase, range-diff and rebase-check on real repositories.

The old base is the real pinned wheel (0.5.21), the new one the real `sglang==0.5.23` wheel from
PyPI (downloaded once into the bf16k cache by `releases.release_wheel`). Imports are cached under
~/.cache/bf16k/imports.git, so only the first test pays for them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bf16k import gitutil, patches, project, rangediff, series, upstream
from bf16k import pin as pinmod
from bf16k.carry import engine, finish, releases, state
from bf16k.carry.messages import Outcome, Stop
from bf16k.errors import ToolError

from .conftest import INDEXER, Product, RecordingGate, commit_files, scratch_repo
from .rebase_support import (
    COMPRESSOR_IMPORT,
    CONFLICT_NAME,
    Q_BACKPORT,
    Q_CONFLICT,
    Q_SIGNATURE,
    REL,
    _add,
    _carried_tree,
    _cli,
    _context_only_patch,
    _snapshot,
)

# --------------------------------------------------------------------------- clean carry


@pytest.mark.slow
def test_clean_carry_writes_series_next_and_leaves_pin_alone(
    two_patch_product: Product, wheel_523: Path, no_gate: RecordingGate
) -> None:
    p = two_patch_product
    _context_only_patch(p)
    patches.export(p.target)
    before = _snapshot(p.root)
    old_names = series.read_order(p.root / "series")
    # A stale recorded resolution in the carried tree must be gone before anything is merged.
    tree = _carried_tree(p.root)
    tree.mkdir(parents=True)
    gitutil.git(["init", "-q"], tree)
    (tree / ".git" / "rr-cache" / ("ab" * 20)).mkdir(parents=True)
    ((tree / ".git" / "rr-cache" / ("ab" * 20)) / "postimage").write_text("stale\n")

    code, out, err = _cli(p.root, "rebase", REL, gate=no_gate)
    assert code == 0, err
    assert no_gate.versions == [REL]  # the carry went through its test gate before writing anything
    assert "cleared 1 recorded rerere resolution" in out
    assert not (tree / ".git" / "rr-cache").exists()

    # series/ and pin.toml untouched; CHANGELOG gained the entry.
    after = _snapshot(p.root)
    assert {k: v for k, v in after.items() if k.startswith("series/series") or k == "pin.toml"} == {
        k: v for k, v in before.items() if k.startswith("series/series") or k == "pin.toml"
    }
    for name in old_names:
        assert after[f"series/{name}"] == before[f"series/{name}"]
    nxt = p.root / "series" / "next" / REL
    assert series.read_order(nxt) == old_names
    assert sorted(q.name for q in nxt.iterdir()) == sorted(
        old_names + ["series", "pin.toml", "carried.toml", "range-diff.md"]
    )
    cpin = pinmod.load(nxt / "pin.toml")
    assert (cpin.version, cpin.tag, cpin.commit) == (REL, f"v{REL}", "")
    assert cpin.wheel.filename == wheel_523.name and cpin.wheel.sha256 == upstream.sha256_file(wheel_523)
    base = gitutil.rev_parse(tree, "refs/heads/upstream-base")
    assert cpin.wheel.base_commit == base
    # The carried base is a child of the pinned import: 3-way merges and range-diff see 0.5.21 -> 0.5.23.
    assert gitutil.out(["rev-parse", f"{base}^"], tree) == p.target.load_pin().wheel.base_commit
    assert cpin.fingerprint[INDEXER] == gitutil.out(["rev-parse", f"{base}:{INDEXER}"], tree)

    md = (nxt / "range-diff.md").read_text()
    assert "| 1 → 1 | `indexer-add-a-marker-line.patch` | unchanged |" in md
    assert "| 2 → 2 | `add-a-probe-module.patch` | unchanged |" in md
    assert "| 3 → 3 | `indexer-add-a-context-marker.patch` | context-only |" in md
    assert "2 unchanged, 1 context-only (`indexer-add-a-context-marker.patch`), 0 content-changed" in md
    changelog = (p.root / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and "### Changed" in changelog
    flat = " ".join(changelog.split())
    assert f"as `series/next/{REL}/`" in flat and "the pin stays at 0.5.21" in flat
    assert "1 context-only" in flat

    # The carried series is a target of its own: applied already, it checks and exports clean.
    t = project.target(p.root, REL)
    head = gitutil.rev_parse(tree, "HEAD")
    patches.apply(t)
    assert gitutil.rev_parse(tree, "HEAD") == head
    assert patches.check(t).problems == []
    # A fresh clone rebuilds the same carried base (pinned import first, the release on top).
    shutil.rmtree(tree)
    patches.apply(t)
    assert gitutil.rev_parse(tree, "refs/heads/upstream-base") == base
    assert gitutil.out(["rev-parse", "HEAD^{tree}"], tree) == gitutil.out(
        ["rev-parse", f"{head}^{{tree}}"], tree
    )

    # range-diff on its own (the session): same classification, markdown written under build/.
    code, out, err = _cli(p.root, "range-diff", "--upstream", REL)
    assert code == 0, err
    written = (p.root / "build" / f"range-diff-{REL}.md").read_text()
    assert "| 3 → 3 | `indexer-add-a-context-marker.patch` | context-only |" in written
    assert "context-only" in out


# --------------------------------------------------------------------------- conflicts


@pytest.mark.slow
def test_conflict_stops_with_locations_refuses_skip_aborts_and_continues(
    two_patch_product: Product, no_gate: RecordingGate
) -> None:
    p = two_patch_product
    _add(p, INDEXER, Q_SIGNATURE, Q_CONFLICT, "[DSV4] indexer: make q_lora contiguous")
    patches.export(p.target)
    assert series.read_order(p.root / "series")[-1] == CONFLICT_NAME
    before = _snapshot(p.root)
    tree = _carried_tree(p.root)

    code, out, err = _cli(p.root, "rebase", REL, gate=no_gate)
    assert code == 1, err
    assert f"stopped at patch 3 of 3: '{CONFLICT_NAME}'" in out
    assert f"    {INDEXER}" in out
    hunk_lines = [
        int(line.split(f"{INDEXER}:", 1)[1].split()[0])
        for line in out.splitlines()
        if f"{REL}/{INDEXER}:" in line
    ]
    assert hunk_lines, out
    text = (tree / INDEXER).read_text().split("\n")
    assert all(text[n - 1].startswith("<<<<<<< ") for n in hunk_lines)
    assert f"build/upstream/{REL}/{INDEXER}:{hunk_lines[0]}" in out
    assert "nox -s rebase -- --continue" in out and "nox -s rebase -- --abort" in out

    code, _, err = _cli(p.root, "rebase", "--skip", gate=no_gate)
    assert code == 2 and "--skip refused" in err and "is not upstream" in err
    code, _, err = _cli(p.root, "rebase", "--continue", "-m", "indexer.py: not yet", gate=no_gate)
    assert code == 2 and "conflict markers remain" in err
    assert _cli(p.root, "rebase", "0.5.22", gate=no_gate)[0] == 2  # one rebase at a time

    code, out, err = _cli(p.root, "rebase", "--abort", gate=no_gate)
    assert code == 0, err
    assert not tree.exists() and state.find_in_progress(p.root) is None
    assert _snapshot(p.root) == before
    assert not (p.root / "series" / "next").exists()

    # Again, and this time resolve by intent: keep 0.5.23's call and make it contiguous.
    assert _cli(p.root, "rebase", REL, gate=no_gate)[0] == 1
    lines = (tree / INDEXER).read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("<<<<<<< "))
    end = next(i for i, line in enumerate(lines) if line.startswith(">>>>>>> "))
    resolved = [
        "        # q_lora_quant: fp8 group quant of this q_lora already made for the attention wq_b.",
        "        q, _ = self.wq_b((q_lora if q_lora_quant is None else q_lora_quant).contiguous())",
    ]
    assert "".join(lines[start:end]).count("q, _ = self.wq_b(") == 2  # 0.5.23's call and the patch's
    (tree / INDEXER).write_text("\n".join(lines[:start] + resolved + lines[end + 1 :]))
    # The reason is required, per hunk, and named by its scope.
    code, _, err = _cli(p.root, "rebase", "--continue", gate=no_gate)
    assert code == 2 and "no reason for:\n  " + INDEXER + " (C4Indexer.compute_q)" in err
    why = "0.5.23 feeds wq_b the fp8 group quant when there is one; keep that and make it contiguous"
    code, out, err = _cli(
        p.root, "rebase", "--continue", "-m", f"indexer.py (C4Indexer.compute_q): {why}", gate=no_gate
    )
    assert code == 0, err + out
    md = (p.root / "series" / "next" / REL / "range-diff.md").read_text()
    assert (
        f"| 3 → 3 | `{CONFLICT_NAME}` | content-changed | `srt/layers/attention/dsv4/indexer.py` | 1 changed hunk, below |"
        in md
    )
    assert f"- `srt/layers/attention/dsv4/indexer.py` (`C4Indexer.compute_q`): {why}" in md
    carried = (p.root / "series" / "next" / REL / CONFLICT_NAME).read_text()
    assert (
        "+        q, _ = self.wq_b((q_lora if q_lora_quant is None else q_lora_quant).contiguous())"
        in carried
    )
    assert _snapshot(p.root)["pin.toml"] == before["pin.toml"]
    assert patches.check(project.target(p.root, REL)).problems == []


def test_patches_upstream_already_has_are_dropped_and_recorded(
    two_patch_product: Product, no_gate: RecordingGate
) -> None:
    p = two_patch_product
    # 0.5.23 made this exact change: git am's 3-way merge leaves nothing, it drops the patch itself.
    _add(
        p,
        INDEXER,
        COMPRESSOR_IMPORT,
        COMPRESSOR_IMPORT.replace("compressor import", "compressor_v2 import"),
        "[DSV4] indexer: import the mixin from compressor_v2",
    )
    # 0.5.23 made this change with a comment line above: a conflict whose patch is now empty.
    _add(p, INDEXER, Q_SIGNATURE, Q_BACKPORT, "[DSV4] indexer: reuse the q_lora quant")
    patches.export(p.target)
    names = series.read_order(p.root / "series")
    auto, stopped = names[2], names[3]

    code, out, err = _cli(p.root, "rebase", REL, gate=no_gate)
    assert code == 1 and f"'{stopped}'" in out, err
    code, out, err = _cli(p.root, "rebase", "--skip", gate=no_gate)
    assert code == 0, err + out

    nxt = p.root / "series" / "next" / REL
    assert series.read_order(nxt) == names[:2]
    carried = upstream.read_carried(nxt)
    assert carried["dropped"] == {auto: REL, stopped: REL}
    md = (nxt / "range-diff.md").read_text()
    assert f"| 3 → – | `{auto}` | dropped | – | Applied-Upstream: {REL} |" in md
    assert f"| 4 → – | `{stopped}` | dropped | – | Applied-Upstream: {REL} |" in md
    changelog = (p.root / "CHANGELOG.md").read_text()
    assert f"`{stopped}` (Applied-Upstream: {REL})" in changelog
    assert patches.check(project.target(p.root, REL)).problems == []


# --------------------------------------------------------------------------- git-ref target


# --------------------------------------------------------------------------- range-diff classes


def _tiny_commit(repo: Path, files: dict[str, str], subject: str, name: str = "") -> str:
    return commit_files(repo, files, subject + "\n\nbody\n" + (f"\nPatch-Filename: {name}\n" if name else ""))


def test_range_diff_classifies_each_class_on_hand_made_series(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    lines = [f"line {i}" for i in range(40)]
    a = "\n".join(lines) + "\n"
    base = _tiny_commit(repo, {"a.txt": a, "b.txt": a, "c.txt": a, "d.txt": a}, "base")
    gitutil.git(["branch", "old-base"], repo)
    # Old series on base.
    _tiny_commit(repo, {"a.txt": a.replace("line 5\n", "line 5\nA\n")}, "same", "same.patch")
    _tiny_commit(repo, {"b.txt": a.replace("line 20\n", "line 20\nB\n")}, "moved context", "ctx.patch")
    _tiny_commit(repo, {"c.txt": a.replace("line 30\n", "C\n")}, "content", "content.patch")
    _tiny_commit(repo, {"d.txt": a.replace("line 10\n", "D\n")}, "upstreamed", "gone.patch")
    old_tip = gitutil.rev_parse(repo, "HEAD")
    # New upstream: changes the context next to ctx.patch and takes gone.patch's change.
    gitutil.git(["checkout", "-q", "-b", "new", base], repo)
    b2 = a.replace("line 22\n", "line 22 (upstream)\n")
    new_base = _tiny_commit(repo, {"b.txt": b2, "d.txt": a.replace("line 10\n", "D\n")}, "upstream")
    _tiny_commit(repo, {"a.txt": a.replace("line 5\n", "line 5\nA\n")}, "same", "same.patch")
    _tiny_commit(repo, {"b.txt": b2.replace("line 20\n", "line 20\nB\n")}, "moved context", "ctx.patch")
    _tiny_commit(repo, {"c.txt": a.replace("line 30\n", "C2\n")}, "content", "content.patch")
    _tiny_commit(
        repo,
        {"a.txt": a.replace("line 5\n", "line 5\nA\n").replace("line 35\n", "E\n")},
        "a brand new patch",
        "new.patch",
    )
    new_tip = gitutil.rev_parse(repo, "HEAD")

    rd = rangediff.classify(
        repo, base, old_tip, new_base, new_tip, notes={"gone.patch": "Applied-Upstream: 2"}
    )
    got = {e.name: e.cls for e in rd.entries}
    assert got == {
        "same.patch": "unchanged",
        "ctx.patch": "context-only",
        "content.patch": "content-changed",
        "gone.patch": "dropped",
        "new.patch": "new",
    }
    by_name = {e.name: e for e in rd.entries}
    assert by_name["content.patch"].note == "c.txt: -1/+1 lines became -1/+1"
    assert by_name["gone.patch"].note == "Applied-Upstream: 2"
    assert (by_name["gone.patch"].old_pos, by_name["gone.patch"].new_pos) == (4, None)
    assert rd.summary().startswith(
        "1 unchanged, 1 context-only (`ctx.patch`), 1 content-changed (`content.patch`)"
    )
    md = rangediff.to_markdown(rd, "t", "before", "after")
    assert "| 3 → 3 | `content.patch` | content-changed |" in md and "```diff" in md


def test_changed_lines_reads_removed_lines_that_look_like_headers(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    _tiny_commit(repo, {"x.txt": "-- a\nkeep\n"}, "one")
    c = _tiny_commit(repo, {"x.txt": "++ b\nkeep\n"}, "two")
    assert rangediff.changed_lines(repo, c) == {"x.txt": (("-- a",), ("++ b",))}


def test_newer_releases_skips_pre_releases_and_older(real_pin: pinmod.Pin) -> None:
    got = releases.newer_releases(
        real_pin, ["0.5.23", "0.5.22", "0.5.24rc1", "0.5.21", "0.5.9", "0.5.22.post1", "0.6.0.dev0", "0.5.30"]
    )
    assert got == ["0.5.22", "0.5.22.post1", "0.5.23", "0.5.30"]


def test_target_parsing(real_pin: pinmod.Pin) -> None:
    assert releases.resolve_target(real_pin, "0.5.23", None, None).kind == "wheel"
    rel = releases.resolve_target(real_pin, "v0.5.23", None, None)
    assert (rel.kind, rel.version, rel.tag) == ("ref", "0.5.23", "v0.5.23")
    with pytest.raises(ToolError, match="already the pinned"):
        releases.resolve_target(real_pin, "0.5.21", None, None)
    with pytest.raises(ToolError, match="--version"):
        releases.resolve_target(real_pin, "main", None, None)
    with pytest.raises(ToolError, match="40-hex"):
        releases.resolve_target(real_pin, "0.5.23", None, "abc")


def test_upstream_contains_checks_added_and_removed_runs(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    base = _tiny_commit(repo, {"f.py": "a\nb2\nnew\nc\n"}, "upstream")
    diff = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -1,3 +1,3 @@\n a\n-b\n+b2\n c\n"
    assert releases.upstream_contains(repo, base, diff) == (True, "")
    ok, why = releases.upstream_contains(repo, base, diff.replace("+b2", "+b3"))
    assert not ok and "'b3' is not upstream" in why
    ok, why = releases.upstream_contains(repo, base, diff.replace("-b\n", "-new\n"))
    assert not ok and "'new' is still upstream" in why


def test_add_changelog_places_the_entry_under_unreleased_changed(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [Unreleased]\n\n### Added\n- x\n\n## [0.1.0]\n\n### Changed\n- old\n"
    )
    finish.add_changelog(tmp_path, "one")
    finish.add_changelog(tmp_path, "two")
    text = (tmp_path / "CHANGELOG.md").read_text()
    assert text == (
        "# Changelog\n\n## [Unreleased]\n\n### Added\n- x\n\n### Changed\n- one\n- two\n\n## [0.1.0]\n\n"
        "### Changed\n- old\n"
    )


def test_cli_without_a_rebase_in_progress(two_patch_product: Product, no_gate: RecordingGate) -> None:
    for args in (["rebase", "--continue"], ["rebase", "--abort"], ["rebase"]):
        code, _, err = _cli(two_patch_product.root, *args, gate=no_gate)
        assert code == 2 and err.startswith("error: ")


def test_recarry_carries_each_release_a_finished_carry_hands_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_gate: RecordingGate
) -> None:
    """`finish` hands back the releases still to re-carry; the command starts each in turn, with the
    Python the finished carry ran its tests with, until one stops."""
    (tmp_path / "pin.toml").write_text("")
    for v in ("0.5.22", "0.5.23", "0.5.24"):
        (tmp_path / "series" / "next" / v).mkdir(parents=True)
        (tmp_path / "series" / "next" / v / "pin.toml").write_text("")
    calls: list[tuple[str, list[str], str | None, bool, bool]] = []

    def carried(
        root: Path,
        target: str,
        *,
        gate: object,
        python: str | None = None,
        queue: list[str] | None = None,
        force: bool = False,
        allow_older: bool = False,
        **_: object,
    ) -> Outcome:
        assert gate is no_gate
        calls.append((target, list(queue or []), python, force, allow_older))
        stop = Stop("tests", total=2) if target == "0.5.24" else None
        return Outcome(stop, f"carried {target}", queue=list(queue or []), python="python-of-the-carry")

    monkeypatch.setattr(engine, "start", carried)
    code, out, _ = _cli(tmp_path, "rebase", "--recarry", "--python", "given", gate=no_gate)
    assert code == 1  # the last one stopped
    assert calls == [
        ("0.5.22", ["0.5.23", "0.5.24"], "given", True, True),
        ("0.5.23", ["0.5.24"], "python-of-the-carry", True, True),
        ("0.5.24", [], "python-of-the-carry", True, True),
    ]
    assert out.endswith(
        "carried 0.5.22\n\nnext re-carry: sglang 0.5.23\ncarried 0.5.23\n\nnext re-carry: sglang 0.5.24\ncarried 0.5.24\n"
    )
