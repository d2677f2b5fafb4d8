"""Carrying moves the pin: `--commit` for a release whose upstream commit is known, a fast-forward
over a current carried series, and a git ref from a networked upstream (a file:// stand-in)."""

from __future__ import annotations

from pathlib import Path

from bf16k import gitutil, patches, series, upstream
from bf16k import pin as pinmod
from bf16k.carry import releases
from bf16k.carry.state import Release
from bf16k.project import Target

from .conftest import Product, RecordingGate
from .rebase_support import REL, _cli


def test_commit_moves_pin_series_and_gitlink(
    two_patch_product: Product, wheel_523: Path, no_gate: RecordingGate
) -> None:
    p = two_patch_product
    old_pin = p.target.load_pin()
    names = series.read_order(p.root / "series")
    given = "1234567890abcdef1234567890abcdef12345678"  # the maintainer's word for 0.5.23's commit
    code, _, err = _cli(p.root, "rebase", REL, "--commit", given, gate=no_gate)
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


def test_commit_fast_forwards_a_current_carried_series(
    two_patch_product: Product, wheel_523: Path, no_gate: RecordingGate
) -> None:
    p = two_patch_product
    assert _cli(p.root, "rebase", REL, gate=no_gate)[0] == 0
    nxt = p.root / "series" / "next" / REL
    carried = {q.name: q.read_bytes() for q in nxt.glob("*.patch")}
    given = "abcdefabcdefabcdefabcdefabcdefabcdefabcd"
    code, out, err = _cli(p.root, "rebase", REL, "--commit", given, gate=no_gate)
    assert code == 0, err
    assert "fast-forward" in out
    assert {q.name: q.read_bytes() for q in (p.root / "series").glob("*.patch")} == carried
    assert pinmod.load(p.root / "pin.toml").commit == given
    assert not nxt.exists()


def test_git_ref_target_from_a_local_file_upstream_moves_the_pin(
    two_patch_product: Product, tmp_path: Path, real_pin: pinmod.Pin, wheel_523: Path, no_gate: RecordingGate
) -> None:
    """A networked upstream stood in for by a file:// repository: v0.5.21 and v0.5.23 tags."""
    p = two_patch_product
    cache, ref_old, old = upstream.cached_import(real_pin)
    rpin = releases.release_pin(real_pin, Release(REL, f"v{REL}", "wheel", "", ""), wheel_523)
    _, ref_new, new = upstream.cached_import(rpin, parent=real_pin, parent_commit=old, wheel_file=wheel_523)
    remote = tmp_path / "sglang.git"
    gitutil.git(["init", "-q", "--bare", str(remote)], tmp_path)
    gitutil.git(
        ["fetch", "-q", str(cache), f"{ref_old}:refs/tags/v0.5.21", f"{ref_new}:refs/tags/v{REL}"], remote
    )
    pin = p.target.load_pin()
    pin.commit, pin.repository = old, remote.as_uri()  # the pinned commit is the v0.5.21 tag
    pinmod.save(pin, p.target.pin_path)

    code, out, err = _cli(p.root, "rebase", f"v{REL}", gate=no_gate)
    assert code == 0, err + out
    moved = pinmod.load(p.root / "pin.toml")
    assert (moved.version, moved.tag, moved.commit) == (REL, f"v{REL}", new)  # read from the clone
    assert moved.wheel.filename == wheel_523.name
    assert gitutil.out(["ls-files", "--stage", "--", "sglang-upstream"], p.root).startswith(f"160000 {new} ")
    code, _, err = _cli(p.root, "rebase", "v9.9.9", gate=no_gate)
    assert code == 2 and "could not fetch v9.9.9" in err
