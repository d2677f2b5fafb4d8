"""A carry that passed its gate becomes a carried series (``series/next/<version>/``) or, with the
release's commit known, moves the pin; either way with its range-diff and CHANGELOG entry.

The carried commits are exported byte-deterministically (``Last-Update:`` bumped on patches whose
own lines changed). A commit id is never guessed: without one the pin stays where it is.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bf16k import carried, diffs, gitutil, patches, rangediff, replay, series, upstream
from bf16k import pin as pinmod
from bf16k import reasons as reasonsmod
from bf16k.carry import releases
from bf16k.carry.chains import stashed
from bf16k.carry.messages import Outcome, plural
from bf16k.carry.state import WHEEL_BASE_REF, Carry, Release, rel, state_path
from bf16k.errors import ToolError
from bf16k.pin import Pin
from bf16k.project import SUBMODULE_PATH, Target
from bf16k.reasons import Reason

Exported = list[tuple[str, bytes]]  # (patch file name, its bytes), in order


def today() -> str:
    """The date a changed patch's ``Last-Update:`` gets (SOURCE_DATE_EPOCH pins it, as for builds)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    moment = datetime.fromtimestamp(int(epoch), UTC) if epoch else datetime.now(UTC)
    return moment.strftime("%Y-%m-%d")


def _diff_of(patch_file: Path) -> str:
    return series.split_message(patch_file.read_bytes())[1].decode("utf-8", errors="replace")


def _patch_diff(repo: Path, commit: str) -> bytes:
    raw = gitutil.git([*patches.FORMAT_PATCH_FLAGS, "-1", commit], repo).stdout
    return series.split_message(raw)[1]


def _bump_last_update(carry: Carry) -> list[str]:
    """Set ``Last-Update:`` to today on carried patches whose own lines changed (DEP-3).

    Not when a re-carry reproduces the diff the carried series already had: that patch did not
    change again, and its date says when it last did.
    """
    repo, bases = carry.repo, carry.state.bases
    commits = gitutil.out(["rev-list", "--reverse", f"{bases.new_base}..HEAD"], repo).split()
    inputs = {
        rangediff.patch_name(repo, c): c
        for c in gitutil.out(["rev-list", "--reverse", f"{bases.old_base}..{bases.old_tip}"], repo).split()
    }
    prev = {n: series.split_message(t.encode())[1] for n, t in carry.state.prev_patches.items()}
    date = today()
    bumped: list[str] = []
    parent = bases.new_base
    rewritten = False
    for c in commits:
        name = rangediff.patch_name(repo, c)
        message = replay.message_of(repo, c)
        src = inputs.get(name)
        changed = src is not None and rangediff.changed_lines(repo, src) != rangediff.changed_lines(repo, c)
        if changed and prev.get(name) != _patch_diff(repo, c):
            new_message = re.sub(r"(?m)^Last-Update: .*$", f"Last-Update: {date}", message)
            if new_message != message:
                bumped.append(name)
                message = new_message
        if message == replay.message_of(repo, c) and not rewritten:
            parent = c
            continue
        rewritten = True
        parent = replay.commit_tree(repo, replay.tree_of(repo, c), parent, message, replay.author_of(repo, c))
    if rewritten:
        gitutil.git(["checkout", "-q", "-f", "-B", patches.BRANCH, parent], repo)
    return bumped


def final_reasons(
    new: list[Reason], old: list[Reason], exported: Exported, rd: rangediff.RangeDiff
) -> list[Reason]:
    """This carry's reasons (``new``), plus the replaced carry's (``old``) for patches a human still
    changed, in files the carried patch touches or its range-diff shows (a reason for a file
    neither has any more explains nothing)."""
    unchanged = {e.name for e in rd.entries if e.cls == rangediff.UNCHANGED}
    touched = {
        name: {fd.old_path for fd in diffs.parse(data.decode("utf-8", "replace"))} for name, data in exported
    }
    shown = {(e.name, h.path) for e in rd.entries for h in e.hunks}
    old = [
        r
        for r in old
        if r.patch in touched
        and r.patch not in unchanged
        and ((r.patch, r.path) in shown or r.path in touched[r.patch])
    ]
    # A reason said again in this carry for the same file (another scope) replaces the old one.
    said = {(r.patch, r.path, r.why) for r in new}
    old = [r for r in old if (r.patch, r.path, r.why) not in said]
    return reasonsmod.dedupe(old + new)


def finish(carry: Carry) -> Outcome:
    """Export the carried commits; write series/next/<v> or move the pin; record the range-diff.

    The outcome hands back the releases still to re-carry (``--recarry``): the command goes on with
    them, each a carry of its own.
    """
    root, repo, state = carry.root, carry.repo, carry.state
    if patches.am_in_progress(repo):
        raise ToolError(f"a `git am` is still in progress in {repo}")
    version, new_base = state.version, state.bases.new_base
    bumped = _bump_last_update(carry)
    exported = patches.export_commits(repo, new_base)
    carried_names = [name for name, _ in exported]
    dropped: dict[str, str] = dict(state.dropped)
    for name in state.names:
        if name in carried_names or name in dropped:
            continue
        # git am drops a patch by itself when its 3-way merge changes nothing.
        ok, why = releases.upstream_contains(repo, new_base, _diff_of(stashed(repo) / name))
        if not ok:
            raise ToolError(
                f"'{name}' vanished from the carried series but sglang {version} does not contain its "
                f"change ({why}): an earlier resolution absorbed it, or it was skipped by hand. "
                "Run `nox -s rebase -- --abort` and carry again."
            )
        dropped[name] = version
    head = gitutil.rev_parse(repo, "HEAD")
    left = gitutil.dirty_paths(repo)
    notes = {name: f"Applied-Upstream: {v}" for name, v in dropped.items()}
    rd = rangediff.classify(repo, state.bases.old_base, state.bases.old_tip, new_base, head, notes=notes)
    reasons = final_reasons(state.reasons, state.prev_reasons, exported, rd)
    pin = pinmod.load(root / "pin.toml")
    if state.release.commit:
        message = _move_pin(carry, pin, exported, rd, dropped, reasons)
    else:
        message = _write_carried(carry, pin, exported, rd, dropped, reasons)
    if bumped:
        message += f"\nLast-Update: set to {today()} on {', '.join(bumped)} (its own lines changed)"
    missing = rangediff.unexplained(rd, reasons)
    if missing:
        message += (
            f"\nnote: {plural(len(missing), 'changed hunk')} without a recorded reason (the range-diff says "
            "so): " + "; ".join(missing[:6])
        )
    shutil.rmtree(stashed(repo), ignore_errors=True)
    state_path(repo).unlink(missing_ok=True)
    if left:
        message += f"\nnote: {plural(len(left), 'uncommitted path')} in {carry.where} were not carried (e.g. {left[0][3:]})"
    return Outcome(None, message, queue=list(state.queue), python=state.python)


def _markdown(
    old_version: str,
    version: str,
    old_base: str,
    rd: rangediff.RangeDiff,
    new_label: str,
    reasons: list[Reason],
) -> str:
    title = f"Range-diff: series on sglang {old_version} → {version}"
    old = f"`series/` on sglang {old_version} (base `{old_base[:12]}`)"
    return rangediff.to_markdown(rd, title, old, new_label, reasons)


def _write_carried(
    carry: Carry,
    pin: Pin,
    exported: Exported,
    rd: rangediff.RangeDiff,
    dropped: dict[str, str],
    reasons: list[Reason],
) -> str:
    root, repo, state = carry.root, carry.repo, carry.state
    version, new_base = state.version, state.bases.new_base
    dest = Target(root, version).series_dir
    wheel = Path(state.wheel)
    replaced = (dest / "pin.toml").is_file()
    patches.write_series(dest, exported)
    cpin = releases.release_pin(pin, Release(version, state.release.tag, "wheel", "", ""), wheel, new_base)
    cpin.fingerprint = patches.fingerprint_for(dest, repo, new_base)
    pinmod.save(cpin, dest / "pin.toml")
    v = state.verified
    record = carried.Carried(
        from_series=state.old_series_hash,
        from_blobs=dict(state.from_blobs),
        dropped=dropped,
        verified=v or carried.Verified(),
        resolutions=reasons,
    )
    (dest / carried.FILE).write_text(carried.render(pin, record))
    label = (
        f"`series/next/{version}/` on sglang {version} (PyPI wheel `{wheel.name}`, base `{new_base[:12]}`)"
    )
    (dest / "range-diff.md").write_text(
        _markdown(state.old_version, version, state.bases.old_base, rd, label, reasons)
    )
    shash = series.series_hash(dest)
    upstream.write_state(
        repo,
        {
            "source": "wheel",
            "base": new_base,
            "version": version,
            "series_hash": shash,
            "head": gitutil.rev_parse(repo, "HEAD"),
        },
    )
    count = len(exported)
    port = (
        f" This is a port back to an older release than the pin ({pin.version})."
        if state.release.older
        else ""
    )
    entry = (
        f"Carried the series ({plural(count, 'patch', 'patches')}, from series `{state.old_series_hash[:12]}`) "
        f"from sglang {pin.version} to {version} (PyPI wheel `{wheel.name}`, "
        f"sha256 `{cpin.wheel.sha256[:12]}…`) as `series/next/{version}/`; its upstream commit is not known "
        f"yet, so the pin stays at {pin.version}. Range-diff: {rd.summary()}."
        + dropped_text(dropped)
        + hand_merged_text(rd, reasons)
        + (f" Its tests pass there ({v.tests}, CPU) and every prefix bisects." if v and v.tests else "")
        + port
    )
    how = add_changelog(root, entry, key=f"`series/next/{version}/`")
    tests, tests_s = (v.tests, v.tests_seconds) if v else ("?", "?")
    bisected, bisect_s = (v.bisect, v.bisect_seconds) if v else ("?", "?")
    return "\n".join(
        [
            (
                f"carried {plural(count, 'patch', 'patches')} to sglang {version}: {rel(root, dest)}/ "
                f'(pin.toml with commit = "", carried.toml, range-diff.md){" (replaced)" if replaced else ""}; '
                f"the pin stays at {pin.version}"
            ),
            f"tests: {tests} in {tests_s} s; bisect: {bisected} in {bisect_s} s",
            f"range-diff: {rd.summary()} ({rel(root, dest)}/range-diff.md, a PR description)",
            f"CHANGELOG.md: {how} the [Unreleased] entry for {version}, with the reasons",
            f"work on it: nox -s apply -- --upstream {version}   (tree: {carry.where})",
            *(
                []
                if state.release.older
                else [f"once {version}'s upstream commit is known: nox -s rebase -- {version} --commit <sha>"]
            ),
        ]
    )


def _move_pin(
    carry: Carry,
    pin: Pin,
    exported: Exported,
    rd: rangediff.RangeDiff,
    dropped: dict[str, str],
    reasons: list[Reason],
) -> str:
    root, repo, state = carry.root, carry.repo, carry.state
    release, new_base = state.release, state.bases.new_base
    new_pin = releases.new_pin_for(pin, release, Path(state.wheel))
    fingerprint = _fingerprint_of(exported, repo, new_base)
    if release.kind == "ref":
        _check_wheel_matches(repo, new_pin, fingerprint)
    else:
        _check_given_commit(root, new_pin, fingerprint)
    new_pin.fingerprint = fingerprint
    patches.write_series(root / "series", exported)
    pinmod.save(new_pin, root / "pin.toml")
    label = f"`series/` on sglang {release.version} (commit `{release.commit[:12]}`, base `{new_base[:12]}`)"
    md = _markdown(state.old_version, release.version, state.bases.old_base, rd, label, reasons)
    return _after_move(root, pin, new_pin, len(exported), rd, md, dropped, hand_merged_text(rd, reasons))


def _fingerprint_of(exported: Exported, repo: Path, base: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        patches.write_series(d, exported)
        return patches.fingerprint_for(d, repo, base)


def _check_wheel_matches(repo: Path, new_pin: Pin, fingerprint: dict[str, str]) -> None:
    """A pin on a git commit must also serve offline users from the wheel: same touched files."""
    cache, ref, _ = upstream.cached_import(new_pin)
    upstream.fetch_import(repo, cache, ref, WHEEL_BASE_REF)
    from_wheel = upstream.blob_ids(repo, WHEEL_BASE_REF, sorted(fingerprint))
    wrong = sorted(p for p in fingerprint if from_wheel[p] != fingerprint[p])
    if wrong:
        raise ToolError(
            f"{new_pin.wheel.filename} differs from commit {new_pin.commit[:12]} in files the series "
            f"touches ({', '.join(wrong)}): the pin cannot move there. "
            "`--abort` to leave everything as it was."
        )


def _check_given_commit(root: Path, new_pin: Pin, fingerprint: dict[str, str]) -> None:
    """When the given commit happens to be in the local submodule, it must hold the wheel's files."""
    sub = root / SUBMODULE_PATH
    if not (gitutil.is_repo(sub) and gitutil.has_commit(sub, new_pin.commit)):
        print(
            f"note: commit {new_pin.commit[:12]} is not in {SUBMODULE_PATH}/: recorded as given, not verified"
        )
        return
    at_commit = upstream.blob_ids(sub, new_pin.commit, sorted(fingerprint))
    wrong = sorted(p for p in fingerprint if at_commit[p] != fingerprint[p])
    if wrong:
        raise ToolError(
            f"commit {new_pin.commit[:12]} does not hold sglang {new_pin.version}'s files "
            f"({', '.join(wrong)}): "
            "check the --commit value. `--abort` to leave everything as it was."
        )


def _after_move(
    root: Path,
    old: Pin,
    new: Pin,
    count: int,
    rd: rangediff.RangeDiff,
    markdown: str,
    dropped: dict[str, str],
    hand: str = "",
) -> str:
    """Everything a moved pin drags along: carried dir, gitlink, range-diff file, changelog."""
    nxt = Target(root, new.version).series_dir
    superseded = nxt.is_dir()
    if superseded:  # the pin is there now: a carried series for it means nothing any more
        shutil.rmtree(nxt)
    gitlink = move_gitlink(root, new.commit)
    out = root / "build" / f"range-diff-{new.version}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    entry = (
        f"Moved the pin from sglang {old.version} to {new.version} (commit `{new.commit}`, tag {new.tag}, "
        f"PyPI wheel `{new.wheel.filename}`, sha256 `{new.wheel.sha256[:12]}…`) and carried the series "
        f"({plural(count, 'patch', 'patches')}) onto it. Range-diff: {rd.summary()}."
        + dropped_text(dropped)
        + hand
    )
    add_changelog(root, entry)
    return "\n".join(
        [
            f"pin moved to sglang {new.version} ({new.commit}); series/ holds the {plural(count, 'carried patch', 'carried patches')}",
            f"range-diff: {rd.summary()} ({rel(root, out)})",
            gitlink,
            *([f"removed {rel(root, nxt)}/ (superseded: series/ is on {new.version})"] if superseded else []),
            (
                "next: commit pin.toml, series/, CHANGELOG.md and the gitlink together; then `nox -s apply` "
                f"puts {SUBMODULE_PATH}/ on {new.version}"
            ),
        ]
    )


def move_gitlink(root: Path, commit: str) -> str:
    """Point the superproject's index entry for the submodule at the new pin (not committed)."""
    listed = gitutil.git(["ls-files", "--stage", "--", SUBMODULE_PATH], root, check=False)
    if listed.returncode != 0 or not listed.stdout.startswith(b"160000"):
        return f"note: no gitlink for {SUBMODULE_PATH} in the index; none updated"
    gitutil.git(["update-index", "--cacheinfo", f"160000,{commit},{SUBMODULE_PATH}"], root)
    patches.protect_superproject_gitlink(Target(root, None))
    return f"gitlink {SUBMODULE_PATH} -> {commit} staged in the index"


# --------------------------------------------------------------------------- fast-forward


def carried_is_current(root: Path, pin: Pin, version: str) -> bool:
    """series/next/<version> exists and was carried from today's series/ on today's pin."""
    t = Target(root, version)
    if not t.pin_path.is_file():
        return False
    info = carried.load(t.series_dir)
    return info.parent.get("sha256") == pin.wheel.sha256 and info.from_series == series.series_hash(
        root / "series"
    )


def promote(root: Path, pin: Pin, release: Release) -> Outcome:
    """The upstream commit of a carried release became known: its series becomes series/."""
    t = Target(root, release.version)
    report = patches.check(t)
    if report.problems:
        raise ToolError(
            f"{rel(root, t.series_dir)} no longer applies or exports cleanly:\n  "
            + "\n  ".join(report.problems)
        )
    rd, _ = rangediff.series_range_diff(root, release.version)
    reasons = carried.load(t.series_dir).resolutions
    cpin = t.load_pin()
    exported = [(n, (t.series_dir / n).read_bytes()) for n in series.read_order(t.series_dir)]
    dropped = dict(carried.load(t.series_dir).dropped)
    new_pin = releases.new_pin_for(pin, release, upstream.fetch_wheel(cpin))
    new_pin.fingerprint = dict(cpin.fingerprint)
    up = upstream.obtain(t, quiet=True)
    _check_given_commit(root, new_pin, new_pin.fingerprint)
    patches.write_series(root / "series", exported)
    pinmod.save(new_pin, root / "pin.toml")
    old_base = gitutil.rev_parse(up.repo, upstream.PARENT_REF)
    label = (
        f"`series/` on sglang {release.version} (commit `{release.commit[:12]}`, "
        f"from `series/next/{release.version}/`)"
    )
    md = _markdown(pin.version, release.version, old_base, rd, label, reasons)
    message = _after_move(root, pin, new_pin, len(exported), rd, md, dropped, hand_merged_text(rd, reasons))
    return Outcome(
        None, f"fast-forward: series/next/{release.version}/ was carried from today's series/\n" + message
    )


# --------------------------------------------------------------------------- CHANGELOG


def dropped_text(dropped: dict[str, str]) -> str:
    if not dropped:
        return ""
    return (
        " Dropped: " + ", ".join(f"`{n}` (Applied-Upstream: {v})" for n, v in sorted(dropped.items())) + "."
    )


def hand_merged_text(rd: rangediff.RangeDiff, reasons: list[Reason]) -> str:
    """The CHANGELOG's account of the hand-made changes: per patch, where and why."""
    parts = []
    for e in rd.entries:
        mine = [r for r in reasons if r.patch == e.name]
        if not mine:
            continue
        said = "; ".join(
            f"`{rangediff.short(r.path)}`" + (f" `{r.scope}`" if r.scope else "") + f": {r.why.rstrip('.')}"
            for r in mine
        )
        parts.append(f"`{e.name.removesuffix('.patch')}` ({said})")
    return (" Hand-merged: " + "; ".join(parts) + ".") if parts else ""


def add_changelog(root: Path, entry: str, key: str | None = None) -> str:
    """Add a bullet under [Unreleased] / ### Changed (Keep a Changelog), creating what is missing.

    The bullet is wrapped like the file's others. With ``key``, an [Unreleased] bullet holding
    ``key`` is replaced instead (a re-carry updates its release's entry). Says "added" or "replaced".
    """
    path = root / "CHANGELOG.md"
    text = path.read_text() if path.is_file() else "# Changelog\n\n## [Unreleased]\n"
    lines = text.split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.strip().lower().startswith("## [unreleased]"))
    except StopIteration:
        first = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
        lines[first:first] = ["## [Unreleased]", ""]
        start = first
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    bullet = reasonsmod.wrap_bullet(entry)
    if key is not None:
        for i in range(start + 1, end):
            if not lines[i].startswith("- "):
                continue
            j = i + 1
            while j < end and lines[j].startswith("  "):
                j += 1
            if key in " ".join(part.strip() for part in lines[i:j]) and lines[i].startswith(
                "- Carried the series"
            ):
                lines[i:j] = bullet
                path.write_text("\n".join(lines))
                return "replaced"
    changed = next((i for i in range(start + 1, end) if lines[i].strip() == "### Changed"), None)
    if changed is None:
        insert = end
        while insert > start + 1 and not lines[insert - 1].strip():
            insert -= 1
        lines[insert:insert] = ["", "### Changed", *bullet]
    else:
        insert = next((i for i in range(changed + 1, end) if lines[i].startswith("### ")), end)
        while insert > changed + 1 and not lines[insert - 1].strip():
            insert -= 1
        lines[insert:insert] = bullet
    out = "\n".join(lines)
    path.write_text(out if out.endswith("\n") else out + "\n")
    return "added"
