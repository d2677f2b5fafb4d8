"""Carrying the series to a newer upstream: rebase, range-diff and rebase-check on real repositories.

The old base is the real pinned wheel (0.5.21), the new one the real `sglang==0.5.23` wheel from
PyPI (downloaded once into the bf16k cache by `rebase.release_wheel`). Imports are cached under
~/.cache/bf16k/imports.git, so only the first test pays for them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from bf16k import gitutil, patches, project, rangediff, rebase, series, upstream
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.project import Target

from .conftest import INDEXER, TRAILERS, WHY, Product, break_first_patch, commit_files, scratch_repo

REL = "0.5.23"
COMPRESSOR_IMPORT = "    from sglang.srt.layers.attention.dsv4.compressor import ("
Q_SIGNATURE = """        weight: torch.Tensor,
    ) -> Tuple[IndexerQuery, torch.Tensor]:
        q, _ = self.wq_b(q_lora)
"""
# 0.5.23 made exactly this change (plus a comment line above the call): a backport.
Q_BACKPORT = """        weight: torch.Tensor,
        q_lora_quant=None,
    ) -> Tuple[IndexerQuery, torch.Tensor]:
        q, _ = self.wq_b(q_lora if q_lora_quant is None else q_lora_quant)
"""
# A change of the same line 0.5.23 changed differently: a real conflict.
Q_CONFLICT = """        weight: torch.Tensor,
    ) -> Tuple[IndexerQuery, torch.Tensor]:
        q, _ = self.wq_b(q_lora.contiguous())
"""
CONFLICT_NAME = "indexer-make-q-lora-contiguous.patch"


@pytest.fixture(scope="session")
def wheel_523(real_pin: pinmod.Pin) -> Path:
    wheel = rebase.release_wheel(REL, real_pin)
    assert rebase.wheel_has_dsv4(wheel)
    return wheel


def _add(p: Product, path: str, old: str | None, new: str, subject: str) -> None:
    p.commit_patch(path, old, new, subject, WHY, TRAILERS)


def _context_only_patch(p: Product) -> None:
    # Inserted two lines above the import 0.5.23 renamed: its context changes, its +/- lines don't.
    _add(
        p,
        INDEXER,
        "if TYPE_CHECKING:\n",
        "if TYPE_CHECKING:\n    # bf16k test: context marker\n",
        "[DSV4] indexer: add a context marker",
    )


def _snapshot(root: Path) -> dict[str, bytes]:
    """series/, pin.toml and CHANGELOG.md as bytes (what a carry must not touch)."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in (root / "series").rglob("*") if p.is_file()}
    for name in ("pin.toml", "CHANGELOG.md"):
        if (root / name).is_file():
            files[name] = (root / name).read_bytes()
    return files


def _tree_hash(root: Path) -> str:
    """Every path and byte under root, git internals included."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _cli(root: Path, *args: str) -> tuple[int, str, str]:
    """The commands as `python -m bf16k` runs them once cli.py registers them."""
    parser = argparse.ArgumentParser(prog="bf16k")
    parser.add_argument("--root")
    sub = parser.add_subparsers(dest="command", required=True)
    rebase.register(sub)
    rangediff.register(sub)
    ns = parser.parse_args(["--root", str(root), *args])
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = int(ns.func(ns))
        except ToolError as exc:
            print(f"error: {exc}", file=err)
            code = 2
    return code, out.getvalue(), err.getvalue()


def _carried_tree(root: Path) -> Path:
    return root / "build" / "upstream" / REL


@pytest.fixture(autouse=True)
def no_gate(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The carry's test gate, recorded instead of run.

    These tests are about carrying itself (conflicts, replay, the pin, range-diff); their series
    has no tests and touches the indexer module, which the gate's bisect would import at every
    prefix (~20 s each) for nothing they look at. The gate runs for real in test_carry.py.
    """
    calls: list[str] = []

    def record(root: Path, repo: Path, state: dict[str, object]) -> None:
        calls.append(str(state["version"]))
        state["verified"] = {"tests": "not run here", "tests_seconds": 0, "bisect": "", "bisect_seconds": 0}

    monkeypatch.setattr(rebase, "_verify", record)
    return calls


# --------------------------------------------------------------------------- clean carry


@pytest.mark.slow
def test_clean_carry_writes_series_next_and_leaves_pin_alone(
    two_patch_product: Product, wheel_523: Path, no_gate: list[str]
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

    code, out, err = _cli(p.root, "rebase", REL)
    assert code == 0, err
    assert no_gate == [REL]  # the carry went through its test gate before writing anything
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


# --------------------------------------------------------------------------- the pin moves


def test_commit_moves_pin_series_and_gitlink(two_patch_product: Product, wheel_523: Path) -> None:
    p = two_patch_product
    old_pin = p.target.load_pin()
    names = series.read_order(p.root / "series")
    given = "1234567890abcdef1234567890abcdef12345678"  # the maintainer's word for 0.5.23's commit
    code, _, err = _cli(p.root, "rebase", REL, "--commit", given)
    assert code == 0, err
    pin = pinmod.load(p.root / "pin.toml")
    assert (pin.version, pin.tag, pin.commit) == (REL, f"v{REL}", given)
    assert pin.wheel.filename == wheel_523.name and pin.wheel.sha256 == upstream.sha256_file(wheel_523)
    assert pin.wheel.base_commit and pin.wheel.base_commit != old_pin.wheel.base_commit
    assert set(pin.fingerprint) == set(old_pin.fingerprint)
    assert series.read_order(p.root / "series") == names
    assert not (p.root / "series" / "next" / REL).exists()
    entry = gitutil.out(["ls-files", "--stage", "--", "sglang-upstream"], p.root)
    assert entry.startswith(f"160000 {given} ")
    assert f"Moved the pin from sglang 0.5.21 to {REL}" in (p.root / "CHANGELOG.md").read_text()
    assert (p.root / "build" / f"range-diff-{REL}.md").is_file()
    # Once committed, the moved pin passes `check`: the wheel path rebuilds the recorded base
    # (a standalone import, like the pinned one) and the series exports byte-identically.
    gitutil.git(["add", "pin.toml", "series", "CHANGELOG.md"], p.root)
    gitutil.git(["commit", "-q", "-m", "move the pin"], p.root)
    report = patches.check(Target(p.root, None))
    assert report.problems == [], report.problems


def test_commit_fast_forwards_a_current_carried_series(two_patch_product: Product, wheel_523: Path) -> None:
    p = two_patch_product
    assert _cli(p.root, "rebase", REL)[0] == 0
    nxt = p.root / "series" / "next" / REL
    carried = {q.name: q.read_bytes() for q in nxt.glob("*.patch")}
    given = "abcdefabcdefabcdefabcdefabcdefabcdefabcd"
    code, out, err = _cli(p.root, "rebase", REL, "--commit", given)
    assert code == 0, err
    assert "fast-forward" in out
    assert {q.name: q.read_bytes() for q in (p.root / "series").glob("*.patch")} == carried
    assert pinmod.load(p.root / "pin.toml").commit == given
    assert not nxt.exists()


# --------------------------------------------------------------------------- conflicts


@pytest.mark.slow
def test_conflict_stops_with_locations_refuses_skip_aborts_and_continues(two_patch_product: Product) -> None:
    p = two_patch_product
    _add(p, INDEXER, Q_SIGNATURE, Q_CONFLICT, "[DSV4] indexer: make q_lora contiguous")
    patches.export(p.target)
    assert series.read_order(p.root / "series")[-1] == CONFLICT_NAME
    before = _snapshot(p.root)
    tree = _carried_tree(p.root)

    code, out, err = _cli(p.root, "rebase", REL)
    assert code == 1, err
    assert f"stopped at patch 3 of 3: '{CONFLICT_NAME}'" in out
    assert f"    {INDEXER}" in out
    hunk_lines = [
        int(line.split(f"{INDEXER}:", 1)[1].split()[0]) for line in out.splitlines() if f"{REL}/{INDEXER}:" in line
    ]
    assert hunk_lines, out
    text = (tree / INDEXER).read_text().split("\n")
    assert all(text[n - 1].startswith("<<<<<<< ") for n in hunk_lines)
    assert f"build/upstream/{REL}/{INDEXER}:{hunk_lines[0]}" in out
    assert "nox -s rebase -- --continue" in out and "nox -s rebase -- --abort" in out

    code, _, err = _cli(p.root, "rebase", "--skip")
    assert code == 2 and "--skip refused" in err and "is not upstream" in err
    code, _, err = _cli(p.root, "rebase", "--continue", "-m", "indexer.py: not yet")
    assert code == 2 and "conflict markers remain" in err
    assert _cli(p.root, "rebase", "0.5.22")[0] == 2  # one rebase at a time

    code, out, err = _cli(p.root, "rebase", "--abort")
    assert code == 0, err
    assert not tree.exists() and rebase.find_in_progress(p.root) is None
    assert _snapshot(p.root) == before
    assert not (p.root / "series" / "next").exists()

    # Again, and this time resolve by intent: keep 0.5.23's call and make it contiguous.
    assert _cli(p.root, "rebase", REL)[0] == 1
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
    code, _, err = _cli(p.root, "rebase", "--continue")
    assert code == 2 and "no reason for:\n  " + INDEXER + " (C4Indexer.compute_q)" in err
    why = "0.5.23 feeds wq_b the fp8 group quant when there is one; keep that and make it contiguous"
    code, out, err = _cli(p.root, "rebase", "--continue", "-m", f"indexer.py (C4Indexer.compute_q): {why}")
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


def test_patches_upstream_already_has_are_dropped_and_recorded(two_patch_product: Product) -> None:
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

    code, out, err = _cli(p.root, "rebase", REL)
    assert code == 1 and f"'{stopped}'" in out, err
    code, out, err = _cli(p.root, "rebase", "--skip")
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


def test_git_ref_target_from_a_local_file_upstream_moves_the_pin(
    two_patch_product: Product, tmp_path: Path, real_pin: pinmod.Pin, wheel_523: Path
) -> None:
    """A networked upstream stood in for by a file:// repository: v0.5.21 and v0.5.23 tags."""
    p = two_patch_product
    cache, ref_old, old = upstream.cached_import(real_pin)
    rpin = rebase.release_pin(real_pin, rebase.Release(REL, f"v{REL}", "wheel", "", ""), wheel_523)
    _, ref_new, new = upstream.cached_import(rpin, parent=real_pin, parent_commit=old, wheel_file=wheel_523)
    remote = tmp_path / "sglang.git"
    gitutil.git(["init", "-q", "--bare", str(remote)], tmp_path)
    gitutil.git(
        ["fetch", "-q", str(cache), f"{ref_old}:refs/tags/v0.5.21", f"{ref_new}:refs/tags/v{REL}"], remote
    )
    pin = p.target.load_pin()
    pin.commit, pin.repository = old, remote.as_uri()  # the pinned commit is the v0.5.21 tag
    pinmod.save(pin, p.target.pin_path)

    code, out, err = _cli(p.root, "rebase", f"v{REL}")
    assert code == 0, err + out
    moved = pinmod.load(p.root / "pin.toml")
    assert (moved.version, moved.tag, moved.commit) == (REL, f"v{REL}", new)  # read from the clone
    assert moved.wheel.filename == wheel_523.name
    assert gitutil.out(["ls-files", "--stage", "--", "sglang-upstream"], p.root).startswith(f"160000 {new} ")
    code, _, err = _cli(p.root, "rebase", "v9.9.9")
    assert code == 2 and "could not fetch v9.9.9" in err


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


# --------------------------------------------------------------------------- rebase-check


@pytest.mark.slow
def test_rebase_check_reports_per_patch_and_changes_nothing(two_patch_product: Product) -> None:
    p = two_patch_product
    assert _cli(p.root, "rebase", REL)[0] == 0  # a committed carried series of the two patches
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
    assert f"`series/next/{REL}/`: applies on its release, exports byte-identically, its series tests pass" in out

    # A committed carried series that no longer applies fails the check.
    nxt = p.root / "series" / "next" / REL
    break_first_patch(nxt)
    before = _tree_hash(p.root)
    code, out, err = _cli(p.root, "rebase-check", "--releases", REL)
    assert code == 1
    assert f"`series/next/{REL}/`: **FAILS**" in out and "does not apply" in out
    assert _tree_hash(p.root) == before


HELPER = "python/sglang/srt/layers/attention/dsv4/bf16k_helper.py"


def test_rebase_check_counts_conflicts_the_way_a_carry_meets_them(two_patch_product: Product) -> None:
    """Patch 3 conflicts and creates a module patch 4 edits. Left out, patch 3 would make patch 4
    fail too (what the check used to count); a carry resolves 3 first and 4 applies cleanly."""
    p = two_patch_product
    f = p.upstream / INDEXER
    f.write_text(f.read_text().replace(Q_SIGNATURE, Q_CONFLICT, 1))
    (p.upstream / HELPER).write_text('"""bf16k test helper"""\nVALUE = 1\n')
    gitutil.git(["add", "--", INDEXER, HELPER], p.upstream)
    gitutil.git(["commit", "-q", "-m", f"[DSV4] indexer: contiguous q_lora and a helper\n\n{WHY}\n\n{TRAILERS}\n"],
                p.upstream)  # fmt: skip
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
    assert _cli(p.root, "rebase", REL)[0] == 1
    tree = _carried_tree(p.root)
    lines = (tree / INDEXER).read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("<<<<<<< "))
    end = next(i for i, line in enumerate(lines) if line.startswith(">>>>>>> "))
    fix = "        q, _ = self.wq_b((q_lora if q_lora_quant is None else q_lora_quant).contiguous())"
    (tree / INDEXER).write_text("\n".join(lines[:start] + [fix] + lines[end + 1 :]))
    code, out, err = _cli(p.root, "rebase", "--continue", "-m", "indexer.py: keep 0.5.23's quant, contiguous")
    assert code == 0, out + err
    gitutil.git(["add", "-A", "series", "CHANGELOG.md"], p.root)
    gitutil.git(["commit", "-q", "-m", "carried"], p.root)
    code, out, err = _cli(p.root, "rebase-check", "--releases", REL, "--no-tests")
    assert code == 0, err
    assert f"## sglang {REL}: 1 of 4 patches conflict, all resolved by a carried series" in out
    assert f"`series/next/{REL}/` (replays cleanly) |" in out and f"| 4 | `{names[3]}` | clean |" in out
    assert f"replays `series/next/{REL}/` cleanly for 4 patches" in out


def test_newer_releases_skips_pre_releases_and_older(real_pin: pinmod.Pin) -> None:
    got = rebase.newer_releases(
        real_pin, ["0.5.23", "0.5.22", "0.5.24rc1", "0.5.21", "0.5.9", "0.5.22.post1", "0.6.0.dev0", "0.5.30"]
    )
    assert got == ["0.5.22", "0.5.22.post1", "0.5.23", "0.5.30"]


def test_target_parsing(real_pin: pinmod.Pin) -> None:
    assert rebase.resolve_target(real_pin, "0.5.23", None, None).kind == "wheel"
    rel = rebase.resolve_target(real_pin, "v0.5.23", None, None)
    assert (rel.kind, rel.version, rel.tag) == ("ref", "0.5.23", "v0.5.23")
    with pytest.raises(ToolError, match="already the pinned"):
        rebase.resolve_target(real_pin, "0.5.21", None, None)
    with pytest.raises(ToolError, match="--version"):
        rebase.resolve_target(real_pin, "main", None, None)
    with pytest.raises(ToolError, match="40-hex"):
        rebase.resolve_target(real_pin, "0.5.23", None, "abc")


def test_upstream_contains_checks_added_and_removed_runs(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    base = _tiny_commit(repo, {"f.py": "a\nb2\nnew\nc\n"}, "upstream")
    diff = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -1,3 +1,3 @@\n a\n-b\n+b2\n c\n"
    assert rebase.upstream_contains(repo, base, diff) == (True, "")
    ok, why = rebase.upstream_contains(repo, base, diff.replace("+b2", "+b3"))
    assert not ok and "'b3' is not upstream" in why
    ok, why = rebase.upstream_contains(repo, base, diff.replace("-b\n", "-new\n"))
    assert not ok and "'new' is still upstream" in why


def test_add_changelog_places_the_entry_under_unreleased_changed(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [Unreleased]\n\n### Added\n- x\n\n## [0.1.0]\n\n### Changed\n- old\n"
    )
    rebase.add_changelog(tmp_path, "one")
    rebase.add_changelog(tmp_path, "two")
    text = (tmp_path / "CHANGELOG.md").read_text()
    assert text == (
        "# Changelog\n\n## [Unreleased]\n\n### Added\n- x\n\n### Changed\n- one\n- two\n\n## [0.1.0]\n\n"
        "### Changed\n- old\n"
    )


def test_cli_without_a_rebase_in_progress(two_patch_product: Product) -> None:
    for args in (["rebase", "--continue"], ["rebase", "--abort"], ["rebase"]):
        code, _, err = _cli(two_patch_product.root, *args)
        assert code == 2 and err.startswith("error: ")
