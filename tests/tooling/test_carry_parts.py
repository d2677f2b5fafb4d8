"""The parts a carry is built from: Python scopes, upstream's change cut to scopes, the per-hunk
reasons, the replay merge, the range-diff's changed hunks and the CHANGELOG entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bf16k import gitutil, pyscope, rangediff, reasons, replay, series, upstream
from bf16k import pin as pinmod
from bf16k.carry import chains, finish, releases
from bf16k.carry.state import CarryState, Phase, Release
from bf16k.reasons import Hunk

from .conftest import commit_files, scratch_repo

POOL = "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"

CONFLICTED = """import os


class Pool:
    size: int = 0
<<<<<<< HEAD
    pages: int = 1
=======
    fmt: str = "bf16"
>>>>>>> patch

    def create(self):
        if self.size:
<<<<<<< HEAD
            return 1
=======
            return 2
>>>>>>> patch


def top():
    return Pool()
"""


def test_scope_at_reads_indentation_even_with_conflict_markers() -> None:
    lines = CONFLICTED.split("\n")
    assert pyscope.scope_at(lines, 7) == "Pool"  # a class-body line between markers
    assert pyscope.scope_at(lines, 15) == "Pool.create"
    assert pyscope.scope_at(lines, 22) == "top"
    assert pyscope.scope_at(lines, 21) == "top" and pyscope.scope_at(lines, 12) == "Pool.create"  # def lines
    assert pyscope.scope_at(lines, 1) == ""
    assert pyscope.normalize("Pool.create.<locals>.inner.<listcomp>") == "Pool.create.inner"


@pytest.fixture(scope="session")
def release_repo(tmp_path_factory: pytest.TempPathFactory, real_pin: pinmod.Pin) -> tuple[Path, str, str]:
    """A repository with the real 0.5.21 import and the real 0.5.23 import on top of it."""
    repo = tmp_path_factory.mktemp("releases") / "r"
    wheel = releases.release_wheel("0.5.23", real_pin)
    rpin = releases.release_pin(real_pin, Release("0.5.23", "v0.5.23", "wheel", "", ""), wheel)
    old, new = upstream.materialize_carried(repo, rpin, real_pin, wheel)
    return repo, old, new


def test_release_changes_are_cut_to_functions(release_repo: tuple[Path, str, str]) -> None:
    repo, old, new = release_repo
    changes = {c.scope: c for c in pyscope.release_changes(repo, old, new, POOL)}
    create = changes["DeepSeekV4IndexerPool._create_buffer"]
    assert create.function
    text = "\n".join(create.diff)
    assert "-        num_pages = (self.size + self.page_size + 1) // self.page_size" in text
    assert "_num_dsv4_physical_kv_pages(" in text
    # The function's own diff, not the file's: far shorter than the whole file diff.
    whole = gitutil.out(["diff", old, new, "--", POOL], repo).count("\n")
    assert len(create.diff) < 40 < whole
    # A change outside any function is its own small entry, never a whole class.
    assert all(len(c.diff) < 80 for c in changes.values() if not c.function)


def test_reasons_cover_hunks_by_file_tail_and_scope() -> None:
    hunks = [
        Hunk("python/a/conn.py", "KVArgs", 10),
        Hunk("python/a/conn.py", "f", 20),
        Hunk("python/b/pool.py", "", 3),
    ]
    patch_of = {(h.path, h.scope): "p.patch" for h in hunks}
    found, missing = reasons.parse(
        "conn.py (KVArgs): kept both fields\nrandom words", hunks, patch_of, "conflict"
    )
    assert [(r.path, r.scope, r.why) for r in found] == [("python/a/conn.py", "KVArgs", "kept both fields")]
    assert [h.label for h in missing] == ["python/a/conn.py (f)", "python/b/pool.py"]
    found, missing = reasons.parse(
        "a/conn.py: one reason for the file\nb/pool.py: x", hunks, patch_of, "tests"
    )
    assert not missing and {r.scope for r in found} == {"KVArgs", "f", ""}
    # One hunk, one line of free text: it can only be about that hunk.
    found, missing = reasons.parse("because 0.5.22 renamed it", hunks[:1], patch_of, "conflict")
    assert not missing and found[0].why == "because 0.5.22 renamed it"
    assert reasons.template(hunks[:1]) == ['-m "python/a/conn.py (KVArgs): <why>"']


def test_changelog_entry_is_wrapped_and_replaced_by_key(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [Unreleased]\n\n### Changed\n- other\n\n## [0.1.0]\n"
    )
    long = "Carried the series (6 patches) to 0.5.22 as `series/next/0.5.22/`; " + "because " * 40 + "end."
    assert finish.add_changelog(tmp_path, long, key="`series/next/0.5.22/`") == "added"
    text = (tmp_path / "CHANGELOG.md").read_text()
    assert all(len(line) <= 100 for line in text.splitlines())
    assert (
        finish.add_changelog(
            tmp_path, "Carried the series again as `series/next/0.5.22/`.", key="`series/next/0.5.22/`"
        )
        == "replaced"
    )
    text = (tmp_path / "CHANGELOG.md").read_text()
    assert text.count("series/next/0.5.22") == 1 and "because" not in text and "- other" in text
    assert text.index("- Carried the series again") < text.index("## [0.1.0]")


def test_replay_merges_series_edits_into_the_carried_result(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    lines = [f"line {i}" for i in range(30)]
    text = "\n".join(lines) + "\n"
    then = commit_files(repo, {"a.py": text, "b.py": text}, "series then (O)")
    carried = commit_files(
        repo, {"a.py": text.replace("line 5\n", "line 5 resolved\n"), "c.py": "release\n"}, "carried (C)"
    )
    gitutil.git(["checkout", "-q", then], repo)
    now = commit_files(
        repo, {"a.py": text.replace("line 25\n", "line 25 edited\n"), "b.py": text + "more\n"}, "now (N)"
    )
    merged = replay.merge_trees(repo, then, carried, now)
    assert merged.conflicts == []
    show = gitutil.out(["show", f"{merged.tree}:a.py"], repo)
    assert "line 5 resolved" in show and "line 25 edited" in show  # the resolution and the edit
    assert gitutil.out(["show", f"{merged.tree}:c.py"], repo) == "release"  # the release's own files
    # The edit meets the resolved line: a conflict, marked with the three sides' names.
    gitutil.git(["checkout", "-q", then], repo)
    clash = commit_files(repo, {"a.py": text.replace("line 5\n", "line 5 edited\n")}, "clash")
    merged = replay.merge_trees(repo, then, carried, clash)
    assert merged.conflicts == ["a.py"]
    body = gitutil.out(["show", f"{merged.tree}:a.py"], repo)
    assert (
        "<<<<<<< carried\nline 5 resolved\n||||||| series-then\nline 5\n=======\nline 5 edited\n>>>>>>> series-now"
        in body
    )


def test_hunk_changes_ignore_context_and_scope_each_change(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    body = "".join(f"    x{i} = {i}\n" for i in range(20))
    src = f"def f():\n{body}    return 0\n\n\ndef g():\n    return 1\n"
    base = commit_files(repo, {"m.py": src}, "base")
    old = commit_files(
        repo, {"m.py": src.replace("    x3 = 3\n", "    x3 = 33\n").replace("return 1", "return 11")}, "p"
    )
    gitutil.git(["checkout", "-q", base], repo)
    moved = src.replace("    x0 = 0\n", "    x0 = 0  # upstream\n")  # context only changes for the first hunk
    nbase = commit_files(repo, {"m.py": moved}, "release")
    new = commit_files(
        repo, {"m.py": moved.replace("    x3 = 3\n", "    x3 = 33\n").replace("return 1", "return 12")}, "p"
    )
    changes = rangediff.hunk_changes(repo, old, new)
    assert [(c.path, c.scope) for c in changes] == [("m.py", "g")]
    assert changes[0].lines == [" -    return 1", "-+    return 11", "++    return 12"]
    del nbase


def test_a_recarry_keeps_only_the_old_reasons_that_still_explain_something() -> None:
    """Old reasons survive a re-carry for files the carried patch touches or its range-diff shows;
    one for a file neither has any more, or one the maintainer said again, is dropped."""
    patch = "mempool.patch"
    exported = [(patch, f"diff --git a/{POOL} b/{POOL}\n".encode())]
    shown = rangediff.HunkChange("python/sglang/srt/disaggregation/decode.py", "", ["-+    x"])
    rd = rangediff.RangeDiff(
        [rangediff.Entry(rangediff.CONTENT_CHANGED, 1, 1, patch, patch, "s", hunks=[shown])], ""
    )
    gone = reasons.Reason(patch, "python/sglang/test/old_layout/test_x.py", "f", "moved since", "tests")
    in_patch = reasons.Reason(patch, POOL, "Pool", "keep both", "conflict")
    in_rd = reasons.Reason(patch, shown.path, "", "upstream has it", "conflict")
    said_again = reasons.Reason(patch, POOL, "Pool.create", "kept as before", "conflict")
    old_said = reasons.Reason(patch, POOL, "Pool", "kept as before", "conflict")
    old = [gone, in_patch, in_rd, old_said]
    assert finish.final_reasons([said_again], old, exported, rd) == [in_patch, in_rd, said_again]


def test_a_commits_series_hashes_as_the_folder_does(tmp_path: Path) -> None:
    """A re-carry finds the series/ it was carried from by hash in git history: the hash of a
    committed series/ must be the one `apply` records for that folder, a missing patch included."""
    repo = scratch_repo(tmp_path)
    (repo / "series").mkdir()
    (repo / "series" / "series").write_text("# order\none.patch\n\nmissing.patch\nempty.patch\n")
    (repo / "series" / "one.patch").write_bytes(b"From x\n")
    (repo / "series" / "empty.patch").write_bytes(b"")
    commit = commit_files(repo, {}, "series")
    shash, files = chains.series_hash_at(repo, commit)
    assert shash == series.series_hash(repo / "series")
    assert files == {"one.patch": b"From x\n", "missing.patch": series.MISSING, "empty.patch": b""}
    assert chains.series_hash_at(repo, gitutil.rev_parse(repo, "HEAD")) == (shash, files)
    (repo / "series" / "series").unlink()
    assert chains.series_hash_at(repo, commit_files(repo, {}, "no order")) == ("", {})


def test_the_carry_state_file_keeps_its_keys(tmp_path: Path) -> None:
    """bf16k-rebase.json as the carry has always written it (one flat object) loads into the typed
    state and is written back key for key: a carry stopped by an earlier bf16k goes on."""
    reason = {"patch": "p.patch", "path": "python/a.py", "scope": "f", "kind": "conflict", "why": "kept both"}
    written = {
        "created": False,
        "pre_head": "a" * 40,
        "pre_base_ref": "b" * 40,
        "pre_state": {"source": "wheel"},
        "notes": ["saved work to refs/x"],
        "old_base": "c" * 40,
        "new_base": "d" * 40,
        "old_tip": "e" * 40,
        "wheel": "/cache/sglang-0.5.23.whl",
        "source_detail": "PyPI wheel",
        "version": "0.5.23",
        "tag": "v0.5.23",
        "kind": "wheel",
        "ref": "",
        "commit": "",
        "older": False,
        "names": ["p.patch", "q.patch"],
        "old_version": "0.5.21",
        "old_series_hash": "f" * 64,
        "from_blobs": {"p.patch": "1" * 40},
        "dropped": {"q.patch": "0.5.23"},
        "phase": "apply",
        "am_offset": 1,
        "reasons": [reason],
        "prev_reasons": [reason],
        "prev_patches": {"p.patch": "From x\n"},
        "python": None,
        "queue": ["0.5.24"],
        "failing": ["test/t.py::test_x"],
        "started": 1700000000.5,
        "replay": {
            "count": 1,
            "O": ["1" * 40],
            "C": ["2" * 40],
            "N": ["3" * 40],
            "index": 0,
            "I_prev": "4" * 40,
            "T_prev": "5" * 40,
            "from": "series/next/0.5.23",
            "notes": ["a note"],
            "pending": {
                "tree": "6" * 40,
                "message": "subject\n\nbody",
                "author": ["A", "a@x", "1 +0000"],
                "conflicts": ["python/a.py"],
            },
        },
        "stop": {
            "kind": "replay",
            "summary": "patch 1 'p.patch': replaying conflicts in 1 file",
            "tip": "7" * 40,
            "hunks": [{"path": "python/a.py", "scope": "f", "line": 3}],
        },
        "verified": {
            "tests": "1 passed, 0 skipped",
            "tests_seconds": 3,
            "bisect": "2 of 2 prefixes",
            "bisect_seconds": 9,
        },
    }
    state = CarryState.from_json(json.loads(json.dumps(written)))
    assert (state.version, state.phase, state.bases.old_tip, state.prior.pre_state) == (
        "0.5.23",
        Phase.APPLY,
        "e" * 40,
        {"source": "wheel"},
    )
    assert state.replay is not None and state.replay.pending is not None
    assert state.replay.pending.author == ("A", "a@x", "1 +0000") and state.stop is not None
    assert state.stop.hunks == [Hunk("python/a.py", "f", 3)] and state.reasons == [reasons.Reason(**reason)]
    assert json.loads(json.dumps(state.to_json())) == written
    repo = scratch_repo(tmp_path)
    state.save(repo)
    assert CarryState.load(repo) == state
