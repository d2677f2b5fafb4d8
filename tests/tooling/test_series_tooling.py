"""The series tooling on real git repositories and the real pinned upstream (from the PyPI wheel)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bf16k import gitutil, patches, series, upstream
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.project import Target

from .conftest import INDEXER, POOL, REPO_ROOT, TRAILERS, WHY, Product, break_first_patch


def _files(product: Product) -> dict[str, bytes]:
    d = product.target.series_dir
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _cli(product: Product, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(product.root), *args],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )


def test_wheel_base_commit_is_deterministic(tmp_path: Path, wheel_path: Path, real_pin: pinmod.Pin) -> None:
    a = upstream.materialize_wheel(wheel_path, tmp_path / "a", real_pin)
    b = upstream.materialize_wheel(wheel_path, tmp_path / "b", real_pin)
    assert a == b == real_pin.wheel.base_commit
    # The layout is upstream's: the DSV4 indexer sits under python/sglang/.
    assert gitutil.git(["cat-file", "-e", f"{a}:{INDEXER}"], tmp_path / "a").returncode == 0


def test_export_after_apply_reproduces_series_byte_for_byte(two_patch_product: Product) -> None:
    p = two_patch_product
    before = _files(p)
    assert series.read_order(p.target.series_dir) == [
        "indexer-add-a-marker-line.patch",
        "add-a-probe-module.patch",
    ]
    patches.apply(p.target)  # series/ is what was applied: a no-op
    shutil.rmtree(p.upstream / ".git" / "rr-cache", ignore_errors=True)
    # Re-apply from scratch by forgetting the applied state, then export again.
    _forget_applied(p)
    patches.apply(p.target)
    patches.export(p.target)
    assert _files(p) == before
    text = (p.target.series_dir / "indexer-add-a-marker-line.patch").read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    assert "Patch-Filename: indexer-add-a-marker-line.patch" in text
    assert "\nindex " in text and len(text.split("\nindex ")[1].split("..")[0]) == 40  # --full-index


def test_export_is_independent_of_user_git_config(
    two_patch_product: Product, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = two_patch_product
    before = _files(p)
    cfg = tmp_path / "gitconfig"
    cfg.write_text(
        "[diff]\n\tnoprefix = true\n\tcontext = 7\n\trenames = copies\n[format]\n\tsignature = x\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    patches.export(p.target)
    assert _files(p) == before


def _forget_applied(p: Product) -> None:
    state = upstream.read_state(p.upstream)
    state["series_hash"] = ""
    upstream.write_state(p.upstream, state)


def test_apply_twice_changes_nothing(two_patch_product: Product, capsys: pytest.CaptureFixture[str]) -> None:
    p = two_patch_product
    _forget_applied(p)
    patches.apply(p.target)
    head = gitutil.rev_parse(p.upstream, "HEAD")
    capsys.readouterr()
    patches.apply(p.target)
    assert "nothing to do" in capsys.readouterr().out
    assert gitutil.rev_parse(p.upstream, "HEAD") == head
    assert gitutil.dirty_paths(p.upstream) == []
    # Same series, fresh apply: the same commit ids (pinned committer, dates from the patches).
    _forget_applied(p)
    patches.apply(p.target)
    assert gitutil.rev_parse(p.upstream, "HEAD") == head


def test_uncommitted_edits_survive_apply_in_a_named_ref(
    two_patch_product: Product, capsys: pytest.CaptureFixture[str]
) -> None:
    p = two_patch_product
    pool = p.upstream / POOL
    pool.write_text(pool.read_text() + "\n# my precious edit\n")
    (p.upstream / "python" / "notes.txt").write_text("untracked work\n")
    _forget_applied(p)  # force a real re-apply
    patches.apply(p.target)
    out = capsys.readouterr().out
    assert "saved uncommitted changes" in out
    ref = out.split("saved uncommitted changes in sglang-upstream to ")[1].split(";")[0]
    assert "my precious edit" not in pool.read_text()  # the tree is clean again
    saved = gitutil.out(["show", f"{ref}:{POOL}"], p.upstream)
    assert "# my precious edit" in saved
    assert gitutil.out(["show", f"{ref}:python/notes.txt"], p.upstream) == "untracked work"


def test_unexported_commits_survive_apply(
    two_patch_product: Product, capsys: pytest.CaptureFixture[str]
) -> None:
    p = two_patch_product
    p.commit_patch(POOL, "import ", "# new local patch\nimport ", "[DSV4] local work", WHY, TRAILERS)
    local = gitutil.rev_parse(p.upstream, "HEAD")
    _forget_applied(p)
    patches.apply(p.target)
    out = capsys.readouterr().out
    ref = out.split("saved commits that were not from the last apply: ")[1].split(" ")[0]
    assert gitutil.rev_parse(p.upstream, ref) == local


def test_dirty_tree_can_stop_apply_instead(two_patch_product: Product) -> None:
    p = two_patch_product
    pool = p.upstream / POOL
    pool.write_text(pool.read_text() + "\n# edit\n")
    with pytest.raises(ToolError, match="uncommitted changes"):
        patches.apply(p.target, stop_if_dirty=True)
    assert pool.read_text().endswith("# edit\n")


def test_wrong_wheel_checksum_stops_naming_the_file(
    tmp_path: Path, real_pin: pinmod.Pin, wheel_path: Path
) -> None:
    bad = tmp_path / real_pin.wheel.filename
    data = bytearray(wheel_path.read_bytes())
    data[1000] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(ToolError, match=f"checksum mismatch for {bad}"):
        upstream.fetch_wheel(real_pin, bad)


def test_wheel_file_is_checked_even_when_the_tree_is_already_built(
    product: Product, tmp_path: Path, wheel_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = gitutil.rev_parse(product.upstream, "HEAD")
    garbage = tmp_path / "garbage.whl"
    garbage.write_bytes(b"not a wheel")
    proc = _cli(product, "apply", "--source", "wheel", "--wheel-file", str(garbage))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"checksum mismatch for {garbage}" in proc.stderr and "Nothing was changed" in proc.stderr
    proc = _cli(product, "apply", "--wheel-file", str(tmp_path / "missing.whl"))
    assert proc.returncode == 2 and f"wheel file {tmp_path / 'missing.whl'} does not exist" in proc.stderr
    monkeypatch.setenv("BF16K_WHEEL_FILE", str(garbage))
    proc = _cli(product, "check")
    assert proc.returncode == 2 and f"checksum mismatch for {garbage}" in proc.stderr
    monkeypatch.delenv("BF16K_WHEEL_FILE")
    assert gitutil.rev_parse(product.upstream, "HEAD") == head
    # The right file: checked, and the run says why it was not needed.
    proc = _cli(product, "apply", "--source", "wheel", "--wheel-file", str(wheel_path))
    assert proc.returncode == 0, proc.stderr
    assert (
        f"--wheel-file {wheel_path} matches the pin (sha256) and is not needed: "
        "sglang-upstream/ is already built from that wheel"
    ) in proc.stdout


def test_failed_apply_says_where_the_tree_is_and_what_to_run(two_patch_product: Product) -> None:
    p = two_patch_product
    name = break_first_patch(p.target.series_dir)
    (p.upstream / POOL).write_text((p.upstream / POOL).read_text() + "# my edit\n")
    with pytest.raises(ToolError) as err:
        patches.apply(p.target)
    msg = str(err.value)
    base = p.target.load_pin().wheel.base_commit
    # Not git's advice: the am was aborted and the tree reset, so --continue/--skip are wrong.
    assert "git am --continue" not in msg.split("  next:")[0]
    assert "git am --skip" not in msg and "git am --abort" not in msg and "hint:" not in msg
    assert f"now: sglang-upstream/ is back at the bare base {base[:12]}" in msg
    saved = gitutil.out(["for-each-ref", "--format=%(refname)", patches.SAVED_PREFIX], p.upstream).split()
    assert len(saved) == 1 and saved[0] in msg  # the edit is kept, and the message says where
    assert f"next: repair series/{name} and run `nox -s apply` again" in msg
    assert gitutil.rev_parse(p.upstream, "HEAD") == base and not patches.am_in_progress(p.upstream)
    # The git route it offers runs from the product root and stops at the same patch.
    command = msg.split("`cd sglang-upstream && ")[1].split("`")[0]
    env = {**gitutil.git_env(), "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    proc = subprocess.run(
        ["bash", "-c", f"cd sglang-upstream && {command}"],
        cwd=p.root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and patches.am_in_progress(p.upstream), proc.stdout + proc.stderr
    assert "Patch failed at 0001" in proc.stdout + proc.stderr
    patches.abort_am(p.upstream)


def test_fingerprint_mismatch_stops_before_patching(two_patch_product: Product) -> None:
    p = two_patch_product
    pin = p.target.load_pin()
    assert pin.fingerprint[INDEXER] != pinmod.ABSENT
    pin.fingerprint[INDEXER] = "0" * 40
    pinmod.save(pin, p.target.pin_path)
    head = gitutil.rev_parse(p.upstream, "HEAD")
    with pytest.raises(ToolError, match=f"(?s)fingerprint mismatch.*{INDEXER}"):
        patches.apply(p.target)
    assert gitutil.rev_parse(p.upstream, "HEAD") == head


def test_export_records_fingerprint_of_touched_files(two_patch_product: Product) -> None:
    pin = two_patch_product.target.load_pin()
    assert set(pin.fingerprint) == {INDEXER, "python/sglang/srt/layers/attention/dsv4/bf16k_probe.py"}
    assert pin.fingerprint["python/sglang/srt/layers/attention/dsv4/bf16k_probe.py"] == pinmod.ABSENT
    blob = gitutil.out(["rev-parse", f"{pin.wheel.base_commit}:{INDEXER}"], two_patch_product.upstream)
    assert pin.fingerprint[INDEXER] == blob


def test_check_passes_on_a_good_series(two_patch_product: Product) -> None:
    report = patches.check(two_patch_product.target)
    assert report.problems == []
    proc = _cli(two_patch_product, "check")
    assert proc.returncode == 0, proc.stderr
    assert "check passed" in proc.stdout


@pytest.mark.parametrize("damage", ["missing", "unlisted", "duplicate"])
def test_hygiene_problems_name_the_patch(two_patch_product: Product, damage: str) -> None:
    d = two_patch_product.target.series_dir
    order = series.read_order(d)
    if damage == "missing":
        (d / order[0]).unlink()
        expect = f"{order[0]}: listed in series but the file is missing"
    elif damage == "unlisted":
        (d / "stray.patch").write_bytes((d / order[0]).read_bytes())
        expect = "stray.patch: patch file not listed in series"
    else:
        series.write_order(d, order + [order[0]])
        expect = f"{order[0]}: listed twice"
    report = patches.check(two_patch_product.target)
    assert any(expect in problem for problem in report.problems), report.problems
    with pytest.raises(ToolError, match="series hygiene"):
        patches.apply(two_patch_product.target)
    proc = _cli(two_patch_product, "check")
    assert proc.returncode == 1 and expect.split(":")[0] in proc.stderr


def test_header_without_forwarded_fails_lint(two_patch_product: Product) -> None:
    d = two_patch_product.target.series_dir
    name = series.read_order(d)[0]
    path = d / name
    path.write_bytes(path.read_bytes().replace(b"Forwarded: no\n", b""))
    report = patches.check(two_patch_product.target)
    assert f"{name}: missing 'Forwarded:' (no, not-needed, or the upstream PR URL)" in report.problems


def test_header_without_why_fails_lint(two_patch_product: Product) -> None:
    d = two_patch_product.target.series_dir
    name = series.read_order(d)[1]
    path = d / name
    path.write_bytes(path.read_bytes().replace(WHY.encode(), b"Probe."))
    assert any(
        p.startswith(f"{name}: the message must say why")
        for p in patches.check(two_patch_product.target).problems
    )


def test_conflicting_patch_stops_naming_patch_and_file(two_patch_product: Product) -> None:
    p = two_patch_product
    name = break_first_patch(p.target.series_dir)
    with pytest.raises(ToolError) as err:
        patches.apply(p.target)
    msg = str(err.value)
    assert f"patch 1 '{name}' does not apply" in msg
    assert INDEXER in msg
    # Nothing half-applied is left behind: the tree is the clean base.
    assert not patches.am_in_progress(p.upstream)
    assert gitutil.rev_parse(p.upstream, "HEAD") == p.target.load_pin().wheel.base_commit
    assert gitutil.dirty_paths(p.upstream) == []
    report = patches.check(p.target)
    assert any(name in problem and INDEXER in problem for problem in report.problems)


def test_export_refuses_to_overwrite_series_edited_since_apply(two_patch_product: Product) -> None:
    d = two_patch_product.target.series_dir
    name = series.read_order(d)[1]
    (d / name).write_bytes((d / name).read_bytes().replace(b"VALUE = 1", b"VALUE = 2"))
    with pytest.raises(ToolError, match="changed since it was applied"):
        patches.export(two_patch_product.target)
    assert b"VALUE = 2" in (d / name).read_bytes()


def test_export_deletes_patches_dropped_from_the_commits(two_patch_product: Product) -> None:
    p = two_patch_product
    base = p.target.load_pin().wheel.base_commit
    first = gitutil.out(["rev-list", "--reverse", f"{base}..HEAD"], p.upstream).split()[0]
    gitutil.git(["reset", "-q", "--hard", first], p.upstream)
    patches.export(p.target)
    assert sorted(_files(p)) == ["indexer-add-a-marker-line.patch", "series"]
    assert set(p.target.load_pin().fingerprint) == {INDEXER}


def test_patch_outside_python_sglang_is_refused(product: Product) -> None:
    product.commit_patch(
        "python/README-bf16k.md", None, "x\n", "[DSV4] a file outside the package", WHY, TRAILERS
    )
    patches.export(product.target)
    name = series.read_order(product.target.series_dir)[0]
    assert any(f"{name}: touches python/README-bf16k.md" in p for p in patches.check(product.target).problems)


def test_moved_gitlink_fails_check(two_patch_product: Product) -> None:
    p = two_patch_product
    head = gitutil.rev_parse(p.upstream, "HEAD")
    gitutil.git(["update-index", "--no-skip-worktree", "sglang-upstream"], p.root)
    gitutil.git(["update-index", "--cacheinfo", f"160000,{head},sglang-upstream"], p.root)
    gitutil.git(["commit", "-q", "-m", "oops"], p.root)
    report = patches.check(p.target)
    assert any("committed gitlink" in problem for problem in report.problems)


def test_apply_keeps_git_add_all_from_moving_the_gitlink(two_patch_product: Product) -> None:
    p = two_patch_product
    (p.root / "notes.md").write_text("x\n")
    gitutil.git(["add", "-A"], p.root)
    gitutil.git(["commit", "-q", "-am", "notes"], p.root)
    entry = gitutil.out(["ls-tree", "HEAD", "sglang-upstream"], p.root)
    assert entry.split()[2] == p.target.load_pin().commit


def test_submodule_fetch_failure_falls_back_to_the_wheel(
    tmp_path: Path, real_pin: pinmod.Pin, wheel_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh clone without network: the submodule clone fails, the wheel is used, the run says so."""
    root = tmp_path / "fresh"
    (root / "series").mkdir(parents=True)
    (root / "series" / "series").write_text("")
    shutil.copy(REPO_ROOT / "pin.toml", root / "pin.toml")
    pin = pinmod.load(root / "pin.toml")
    pin.fingerprint = {}
    pinmod.save(pin, root / "pin.toml")
    # An unreachable URL stands in for GitHub (no network here, and none needed for the test).
    (root / ".gitmodules").write_text(
        '[submodule "sglang-upstream"]\n\tpath = sglang-upstream\n\turl = file:///nonexistent/sglang.git\n'
    )
    gitutil.git(["init", "-q"], root)
    gitutil.git(["update-index", "--add", "--cacheinfo", f"160000,{pin.commit},sglang-upstream"], root)
    gitutil.git(["add", "-A"], root)
    gitutil.git(["commit", "-q", "-m", "fresh"], root)
    monkeypatch.setenv("BF16K_WHEEL_FILE", str(wheel_path))
    up = upstream.obtain(Target(root, None))
    assert up.source == "wheel" and "submodule unavailable" in up.detail
    assert up.base == pin.wheel.base_commit
    assert (root / "sglang-upstream" / INDEXER).is_file() or gitutil.has_commit(up.repo, up.base)
