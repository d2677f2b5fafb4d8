"""`rebase`: carry the series to another upstream release, until its own tests pass there.

How a carry works (Electron's roll procedure, with `git am -3` instead of quilt):

- The carry happens in the target's own tree, ``build/upstream/<version>`` (``Target(root,
  version).upstream_dir``); ``sglang-upstream/``, ``series/`` and ``pin.toml`` are not touched
  until the carry has succeeded, so ``--abort`` only has that tree to restore.
- The old base is the pinned wheel import (the same deterministic commit everywhere). A release
  from PyPI is imported as a *child* of it (``upstream.cached_import`` with a parent), so the
  target's base descends from the old one: 3-way merges and range-diff see exactly the release's
  change, and ``apply --upstream <version>`` later rebuilds the same commit id (recorded in the
  carried pin, the parent in ``carried.toml``). A git-ref target is the real upstream commit.
- The series is applied once on the old base (the "before" for range-diff). When the release
  already has a carried series (a re-carry, ``--force`` / ``--recarry``), its resolutions are
  replayed first (:mod:`bf16k.replay`); the rest is carried with ``git am -3``. rerere is
  cleared and stays off: a silently replayed rerere resolution carries no reason.
- Stops: a conflict (the patch, files, each hunk with its scope, upstream's change to those
  scopes only, the next command); then the series' own tests on the carried tree and the bisect
  of every prefix. A failing test stops the carry the same way, naming the test, its patch and
  upstream's change to the functions it ran. ``--continue`` takes the maintainer's one-line
  reason per hand-made hunk (``-m``); the reasons go to ``carried.toml``, the range-diff and
  the CHANGELOG entry.
- A stop leaves git's own ``rebase-apply`` state (while patches are still being applied) plus
  ``bf16k-rebase.json`` (in the tree's git dir); ``--continue``, ``--skip`` and ``--abort`` read
  it from there.
- After success the carried commits are exported byte-deterministically (``Last-Update:``
  bumped on patches whose own lines changed). With a known upstream commit the pin moves and
  they become ``series/``; otherwise they go to ``series/next/<version>/`` with a pin whose
  ``commit`` is empty. A commit id is never guessed.
"""

from __future__ import annotations

import bisect as bisect_pos
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bf16k import (
    absorb,
    bisect,
    carried,
    context,
    diffs,
    gitutil,
    patches,
    rangediff,
    replay,
    series,
    seriestests,
    upstream,
)
from bf16k import pin as pinmod
from bf16k import reasons as reasonsmod
from bf16k.carrystatus import STATE_FILE, find_in_progress
from bf16k.errors import ToolError
from bf16k.pin import Pin, WheelPin
from bf16k.project import SUBMODULE_PATH, Target, cache_dir, version_key
from bf16k.reasons import Hunk, Reason

__all__ = ["STATE_FILE", "find_in_progress"]

OLD_BASE_REF = "refs/bf16k/rebase/old-base"
OLD_TIP_REF = "refs/bf16k/rebase/old-tip"
NEW_BASE_REF = "refs/bf16k/rebase/new-base"
WHEEL_BASE_REF = "refs/bf16k/rebase/wheel-base"
REPLAY_REF = "refs/bf16k/rebase/replay"  # prefix: the chains a re-carry replays (kept reachable)
DSV4_MODEL = "sglang/srt/models/deepseek_v4.py"  # a release without it cannot carry the series
AM_RESUME_FLAGS = ("--committer-date-is-author-date", "--quiet")
_RELEASE = re.compile(r"^\d+(\.\d+)+(\.post\d+)?$")  # final releases only (no a/b/rc/dev/local)
_TAG = re.compile(r"^(?:refs/tags/)?v?(\d+(?:\.\d+)+(?:\.post\d+)?)$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_CONFLICT_START = "<<<<<<< "
_CONFLICT_END = ">>>>>>> "


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def today() -> str:
    """The date a changed patch's ``Last-Update:`` gets (SOURCE_DATE_EPOCH pins it, as for builds)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    moment = datetime.fromtimestamp(int(epoch), UTC) if epoch else datetime.now(UTC)
    return moment.strftime("%Y-%m-%d")


# --------------------------------------------------------------------------- releases and wheels


@dataclass
class Release:
    """The upstream a carry goes to."""

    version: str
    tag: str
    kind: str  # "wheel" (PyPI release) or "ref" (git ref, needs the network)
    ref: str  # the git ref asked for; "" for a wheel
    commit: str  # upstream commit when known (given or fetched); "" otherwise
    older: bool = False  # older than the pin: a port, not a carry forward


def resolve_target(
    pin: Pin, target: str, version: str | None, commit: str | None, allow_older: bool = False
) -> Release:
    if commit is not None and not _HEX40.match(commit):
        raise ToolError(f"--commit expects a full 40-hex commit id, got {commit!r}")
    if _RELEASE.match(target):
        rel = Release(target, f"v{target}", "wheel", "", commit or "")
    else:
        m = _TAG.match(target)
        found = version or (m.group(1) if m else None)
        if not found or not _RELEASE.match(found):
            raise ToolError(
                f"cannot tell which release {target!r} is: the pin records releases, so give "
                "--version X.Y.Z with a git ref that is not a vX.Y.Z tag"
            )
        tag = target.removeprefix("refs/tags/") if m else f"v{found}"
        rel = Release(found, tag, "ref", target, commit or "")
    if rel.version == pin.version:
        raise ToolError(f"{rel.version} is already the pinned release")
    if version_key(rel.version) < version_key(pin.version):
        if commit:
            raise ToolError(
                f"{rel.version} is older than the pinned {pin.version}: the pin only moves forward "
                f"(port the series with `nox -s rebase -- {rel.version} --allow-older`, without --commit)"
            )
        if not allow_older:
            raise ToolError(
                f"{rel.version} is older than the pinned {pin.version}: carrying backwards is a port "
                "(upstream's newer code is taken out under the patches). To port anyway, into "
                f"series/next/{rel.version}/: nox -s rebase -- {rel.version} --allow-older"
            )
        rel.older = True
    return rel


def _wheel_name(like: Pin, version: str) -> str:
    name, _, py, abi, plat = upstream._wheel_tags(like.wheel.filename)
    return f"{name}-{version}-{py}-{abi}-{plat}.whl"


def release_wheel(version: str, like: Pin, wheel_file: Path | None = None) -> Path:
    """The wheel of ``version`` with the pinned wheel's tags: a given file, the cache, or pip."""
    if wheel_file is not None:
        path = wheel_file.expanduser().resolve()
        if not path.is_file():
            raise ToolError(f"wheel file {path} does not exist")
        return path
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wanted = _wheel_name(like, version)
    if (wheels / wanted).is_file():
        return wheels / wanted
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=wheels))
    try:
        probe = Pin(version, "", "", like.repository, WheelPin(wanted, "0" * 64))
        upstream._pip_download(probe, staging)  # same tags as the pinned wheel
        found = sorted(staging.glob("*.whl"))
        if not found:
            raise ToolError(f"pip downloaded no wheel for sglang {version}")
        target = wheels / found[0].name
        found[0].replace(target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def release_pin(like: Pin, rel: Release, wheel: Path, base_commit: str = "") -> Pin:
    """A pin record for the target release (commit only when known)."""
    return Pin(
        rel.version, rel.tag, rel.commit, like.repository,
        WheelPin(wheel.name, upstream.sha256_file(wheel), base_commit),
    )  # fmt: skip


def wheel_has_dsv4(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return DSV4_MODEL in zf.namelist()


def index_versions(name: str) -> list[str]:
    """Versions the package index offers (pip's view, so the user's index configuration counts)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", name, "--disable-pip-version-check"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise ToolError(
        f"could not list the releases of {name} (pip exit {proc.returncode}): "
        f"{proc.stderr.strip()[-500:]}\nName them with --releases X.Y.Z ..."
    )


def newer_releases(pin: Pin, versions: list[str]) -> list[str]:
    """Final releases newer than the pin, oldest first (pre-releases are skipped)."""
    keep = {v for v in versions if _RELEASE.match(v) and version_key(v) > version_key(pin.version)}
    return sorted(keep, key=version_key)


def nearest_releases(version: str, versions: list[str], count: int = 3) -> list[str]:
    """The final releases around ``version`` (below and above it), oldest first."""
    finals = sorted({v for v in versions if _RELEASE.match(v)}, key=version_key)
    at = bisect_pos.bisect_left([version_key(v) for v in finals], version_key(version))
    lo = max(0, min(at - count + 1, len(finals) - count))
    return finals[lo : lo + count]


def check_release_exists(version: str, like: Pin) -> None:
    """Refuse, in one line, a release the index does not have (instead of pip's version dump).

    Only when the index can be listed: offline, the download itself says what is wrong.
    """
    if (cache_dir() / "wheels" / _wheel_name(like, version)).is_file():
        return
    try:
        versions = index_versions("sglang")
    except ToolError:
        return
    if version in versions:
        return
    near = nearest_releases(version, versions)
    newest = max((v for v in versions if _RELEASE.match(v)), key=version_key, default="?")
    raise ToolError(
        f"sglang {version} does not exist on the package index; the nearest releases are "
        f"{', '.join(near)} (newest {newest})"
    )


# --------------------------------------------------------------------------- conflicts


@dataclass
class Stop:
    """Where a carry stopped and why."""

    index: int  # 0-based position in the series
    total: int
    name: str
    subject: str
    files: list[str]  # paths in the upstream tree
    hunks: list[tuple[str, int]]  # (path, line of each `<<<<<<<`)
    empty: bool  # nothing of the patch is left (after a resolution, or upstream has it)
    detail: str  # git's last words
    kind: str = "conflict"  # "conflict", "replay", "tests" or "bisect"


@dataclass
class Outcome:
    stop: Stop | None
    message: str


def marker_lines(path: Path) -> list[int]:
    """1-based line numbers of each conflict start marker in a worktree file."""
    if not path.is_file():
        return []
    text = path.read_bytes().decode("utf-8", errors="replace")
    return [i for i, line in enumerate(text.split("\n"), start=1) if line.startswith(_CONFLICT_START)]


def unmerged(repo: Path) -> list[str]:
    return sorted(set(gitutil.out(["diff", "--name-only", "--diff-filter=U"], repo).splitlines()))


def _current_subject(repo: Path) -> str:
    msg = upstream.git_dir(repo) / "rebase-apply" / "final-commit"
    return msg.read_text(errors="replace").splitlines()[0] if msg.is_file() else ""


def describe_stop(repo: Path, names: list[str], output: bytes, offset: int = 0) -> Stop:
    """``names``: the whole series; ``offset``: how many of them the `git am` in progress skipped."""
    fail = patches.describe_am_stop(repo, names[offset:], output, offset)
    conflicted = unmerged(repo)
    hunks = [(p, n) for p in conflicted for n in marker_lines(repo / p)]
    staged = gitutil.git(["diff", "--cached", "--quiet", "HEAD"], repo, check=False).returncode != 0
    empty = not conflicted and not staged and "No changes" in output.decode(errors="replace")
    files = sorted(set(fail.files) | set(conflicted))
    return Stop(fail.index, len(names), fail.name, _current_subject(repo), files, hunks, empty, fail.detail)


def _rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _continue_lines(hunks: list[Hunk], what: str) -> list[str]:
    """The `--continue` command with one `-m` per hunk to fill in."""
    template = reasonsmod.template(hunks)
    if not template:
        return [f"  2. nox -s rebase -- --continue -m \"<why>\"    ({what})"]
    lines = ["  2. say why, one line per hunk, and go on:", "     nox -s rebase -- --continue \\"]
    lines += [f"       {m} \\" for m in template[:-1]] + [f"       {template[-1]}"]
    lines.append(f"     ({what}; a path may be shortened to its file name)")
    return lines


def stop_message(root: Path, repo: Path, state: dict[str, Any], stop: Stop) -> str:
    version = state["version"]
    where = _rel(root, repo)
    lines = [
        f"rebase to sglang {version} stopped at patch {stop.index + 1} of {stop.total}: '{stop.name}'",
        f"  subject: {stop.subject}" if stop.subject else "",
        f"  upstream: {state['source_detail']}",
    ]
    if stop.empty:
        lines += [
            f"  the patch is now empty: nothing of it is left on sglang {version}.",
            "next:",
            f"  if sglang {version} already contains its change: nox -s rebase -- --skip",
            "    (checked; the patch is recorded as dropped, Applied-Upstream)",
            "  otherwise an earlier resolution absorbed it: redo that one",
            "    (nox -s rebase -- --abort, then start again)",
        ]
        return "\n".join(line for line in lines if line)
    hunks = reasonsmod.marker_hunks(repo, [p for p in stop.files if p in {h[0] for h in stop.hunks}])
    lines.append(f"  files (in {where}):")
    lines += [f"    {f}" for f in stop.files] or ["    (none named; see git's output below)"]
    if hunks:
        lines.append("  conflict hunks:")
        lines += [f"    {where}/{h.path}:{h.line}" + (f"  ({h.scope})" if h.scope else "") for h in hunks]
    no_markers = [f for f in stop.files if f not in {p for p, _ in stop.hunks}]
    if no_markers and stop.hunks:
        lines.append(
            "  without markers (delete/rename or a file that could not be merged): " + ", ".join(no_markers)
        )
    if not stop.hunks:
        lines.append("  git said:")
        lines += [f"    {line}" for line in stop.detail.splitlines()[-8:]]
    if hunks:
        lines += _conflict_context_lines(repo, state, hunks, version, where)
        lines += _earlier_reasons_lines(state, stop.name, hunks)
    lines += [
        "next:",
        f"  1. resolve by intent in {where}: edit the files until no conflict markers remain",
        *_continue_lines(hunks, "stages your edits to tracked files, carries the rest"),
        "  or give up and restore everything as it was: nox -s rebase -- --abort",
    ]
    if stop.kind == "conflict":
        lines.append(f"  (--skip is refused unless sglang {version} already contains this patch's change)")
    return "\n".join(line for line in lines if line)


def _conflict_context_lines(repo: Path, state: dict[str, Any], hunks: list[Hunk], version: str, where: str) -> list[str]:
    """What a stop prints of upstream's change to the functions its conflict hunks sit in."""
    return [
        "  " + line
        for line in context.for_conflicts(
            repo, state["old_base"], state["new_base"], hunks, version=f"{state['old_version']} -> {version}", repo_label=where,
            old_ref=OLD_BASE_REF, new_ref=NEW_BASE_REF,
        )
    ]  # fmt: skip


def _earlier_reasons_lines(state: dict[str, Any], patch: str, hunks: list[Hunk]) -> list[str]:
    """What a stop prints of the carried series' own reasons for these hunks (nothing if none)."""
    earlier = _earlier_reasons(state, patch, hunks)
    if not earlier:
        return []
    return ["  the carried series resolved these before, saying:"] + [
        f"    {r.path} ({r.scope}): {r.why}" if r.scope else f"    {r.path}: {r.why}" for r in earlier
    ]


def _earlier_reasons(state: dict[str, Any], patch: str, hunks: list[Hunk]) -> list[Reason]:
    found: list[Reason] = []
    known = [Reason(**r) for r in state.get("prev_reasons", [])]
    for h in reasonsmod.unique(hunks):
        for r in reasonsmod.lookup(known, patch, h.path, h.scope):
            if r not in found:
                found.append(r)
    return found



# --------------------------------------------------------------------------- "upstream contains it"


def _has_run(lines: list[str], run: list[str]) -> bool:
    n = len(run)
    return any(lines[i : i + n] == run for i in range(len(lines) - n + 1))


def upstream_contains(repo: Path, base: str, diff: str) -> tuple[bool, str]:
    """Whether ``base`` already holds the patch's change; (answer, why not).

    Upstream's version of a change rarely matches the patch's context line for line (that is
    why it conflicts), so this does not re-apply the patch: it asks whether every run of lines
    the patch adds is in the file at ``base`` and no run it removes is still there (runs of
    blank lines prove nothing and are ignored).
    """
    for fd in diffs.parse(diff):
        proc = gitutil.git(["cat-file", "-p", f"{base}:{fd.path}"], repo, check=False)
        exists = proc.returncode == 0
        if fd.deleted:
            if exists:
                return False, f"{fd.path} still exists upstream (the patch deletes it)"
            continue
        if not exists:
            return False, f"{fd.path} does not exist upstream"
        lines = proc.stdout.decode("utf-8", errors="replace").split("\n")
        for run in fd.runs("+"):
            if not _has_run(lines, run):
                return False, f"{fd.path}: the added line {run[0].strip()!r} is not upstream"
        for run in fd.runs("-"):
            if any(line.strip() for line in run) and _has_run(lines, run):
                return False, f"{fd.path}: the removed line {run[0].strip()!r} is still upstream"
    return True, ""


# --------------------------------------------------------------------------- state


def state_path(repo: Path) -> Path:
    return upstream.git_dir(repo) / STATE_FILE


def load_state(root: Path) -> tuple[Path, dict[str, Any]]:
    repo = find_in_progress(root)
    if repo is None:
        raise ToolError("no rebase in progress (start one with `nox -s rebase -- VERSION`)")
    return repo, json.loads(state_path(repo).read_text())


def save_state(repo: Path, state: dict[str, Any]) -> None:
    state_path(repo).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def clear_rerere(repo: Path) -> int:
    """Forget recorded conflict resolutions: a stale one would be replayed without a word."""
    rr = upstream.git_dir(repo) / "rr-cache"
    count = sum(1 for _ in rr.iterdir()) if rr.is_dir() else 0
    gitutil.git(["rerere", "clear"], repo, check=False)
    shutil.rmtree(rr, ignore_errors=True)
    return count


def _rev(repo: Path, ref: str) -> str:
    proc = gitutil.git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], repo, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else ""


def _delete_rebase_refs(repo: Path) -> None:
    for ref in (OLD_BASE_REF, OLD_TIP_REF, NEW_BASE_REF, WHEEL_BASE_REF):
        gitutil.git(["update-ref", "-d", ref], repo, check=False)
    listed = gitutil.out(["for-each-ref", "--format=%(refname)", REPLAY_REF], repo).splitlines()
    for ref in listed:
        gitutil.git(["update-ref", "-d", ref], repo, check=False)


# --------------------------------------------------------------------------- starting


def _prepare_tree(repo: Path) -> dict[str, Any]:
    """Remember how the carried tree looked (for --abort) and save any work in it to refs."""
    if not repo.exists():
        return {"created": True, "pre_head": "", "pre_base_ref": "", "pre_state": {}, "notes": []}
    if not gitutil.is_repo(repo):
        if any(repo.iterdir()):
            raise ToolError(f"{repo} holds files but is not a git repository: move them away first")
        return {"created": True, "pre_head": "", "pre_base_ref": "", "pre_state": {}, "notes": []}
    if patches.am_in_progress(repo):
        raise ToolError(f"a `git am` is in progress in {repo}: finish it or run `git -C {repo} am --abort`")
    pre_state = upstream.read_state(repo)
    head = _rev(repo, "HEAD")
    notes = patches.save_work(repo, pre_state, pre_state.get("base", "")) if head else []
    return {"created": False, "pre_head": head, "pre_base_ref": _rev(repo, upstream.BASE_REF),
            "pre_state": pre_state, "notes": notes}  # fmt: skip


def _fetch_pinned_commit(root: Path, repo: Path, pin: Pin) -> str:
    """The pinned upstream commit in ``repo``: from the local submodule if it has it, else the remote."""
    sub = root / SUBMODULE_PATH
    source = str(sub) if gitutil.is_repo(sub) and gitutil.has_commit(sub, pin.commit) else pin.repository
    gitutil.git(["fetch", "-q", "--no-tags", source, f"+{pin.commit}:{OLD_BASE_REF}"], repo, timeout=600)
    return gitutil.rev_parse(repo, OLD_BASE_REF)


def _fetch_ref(repo: Path, repository: str, ref: str) -> str:
    proc = gitutil.git(["fetch", "-q", "--no-tags", repository, f"+{ref}:{NEW_BASE_REF}"], repo,
                       check=False, timeout=600)  # fmt: skip
    if proc.returncode != 0:
        raise ToolError(
            f"could not fetch {ref} from {repository} (a git-ref target needs the network):\n"
            + proc.stderr.decode(errors="replace").strip()[-800:]
            + "\nTo carry a PyPI release without GitHub, give its version instead (e.g. 0.5.23)."
        )
    return gitutil.rev_parse(repo, NEW_BASE_REF)


def _apply_old_series(repo: Path, base: str, series_dir: Path, names: list[str]) -> str:
    patches.reset_to(repo, base)
    failure = patches.run_am(repo, patches.mbox(series_dir, names), names)
    if failure:
        patches.abort_am(repo)
        raise ToolError(
            f"series/ does not apply on its own pin (patch {failure.index + 1} '{failure.name}'): "
            "fix that first (`nox -s check`)"
        )
    return gitutil.rev_parse(repo, "HEAD")


def _blobs_now(root: Path, names: list[str]) -> dict[str, str]:
    return {n: carried.blob_id((root / "series" / n).read_bytes()) for n in names}


def what_would_change(root: Path, version: str) -> str:
    """What a re-carry over ``series/next/<version>/`` would do, from its carried.toml."""
    d = Target(root, version).series_dir
    info = carried.load(d)
    names = series.read_order(root / "series")
    now = _blobs_now(root, names)
    prev = series.read_order(d)
    head = (
        f"series/next/{version}/ exists: {_plural(len(prev), 'patch', 'patches')} carried from series "
        f"{info.from_series[:12] or '?'}, {_plural(len(info.resolutions), 'recorded resolution')}."
    )
    if info.from_blobs:
        changed = [n for n in names if n in info.from_blobs and info.from_blobs[n] != now[n]]
        added = [n for n in names if n not in info.from_blobs]
        removed = [n for n in info.from_blobs if n not in now]
    elif info.from_series == series.series_hash(root / "series"):
        changed, added, removed = [], [], []
    else:
        return head + (
            " series/ changed since (its carried.toml predates per-patch records, so which patches is "
            "not known); a re-carry replays what it can find in git history."
        )
    if not (changed or added or removed):
        return head + (
            " series/ is unchanged since: a re-carry reproduces the same patches and rewrites "
            "range-diff.md, carried.toml and the CHANGELOG entry."
        )
    parts = []
    if changed:
        parts.append("changed: " + ", ".join(changed))
    if added:
        parts.append("new: " + ", ".join(added))
    if removed:
        parts.append("gone: " + ", ".join(removed))
    kept = len([n for n in names if n not in changed and n not in added])
    return head + (
        f" Since then series/ changed ({'; '.join(parts)}). A re-carry keeps the carried version of "
        f"{_plural(kept, 'unchanged patch', 'unchanged patches')}, replays the recorded resolutions "
        "onto the changed ones (stopping only where a change meets a resolved region), reruns the "
        f"tests and bisect, and rewrites series/next/{version}/ and its CHANGELOG entry."
    )


def _series_hash_at(root: Path, commit: str) -> tuple[str, dict[str, bytes]]:
    """series/ as ``commit`` has it: its series hash and its patch files ("" and none without one)."""

    def show(name: str) -> bytes | None:
        proc = gitutil.git(["show", f"{commit}:series/{name}"], root, check=False)
        return proc.stdout if proc.returncode == 0 else None

    order = show(series.SERIES_FILE)
    if order is None:
        return "", {}
    files: dict[str, bytes] = {}
    for name in series.parse_order(order.decode()):
        data = show(name)
        files[name] = series.MISSING if data is None else data
    return series.series_hash(lambda name: order if name == series.SERIES_FILE else files.get(name)), files


def _previous_inputs(root: Path, info: carried.Carried, names: list[str]) -> dict[str, bytes] | None:
    """The series/ patch files a carried series was made from (what a replay merges against)."""
    if info.from_blobs:
        found: dict[str, bytes] = {}
        for name in names:
            blob = info.from_blobs.get(name)
            proc = gitutil.git(["cat-file", "blob", blob], root, check=False) if blob else None
            if proc is None or proc.returncode != 0:
                print(f"note: {name} as it was carried ({(blob or '?')[:12]}) is not in this repository's "
                      "objects: its resolutions cannot be replayed")  # fmt: skip
                return None
            found[name] = proc.stdout
        return found
    if info.from_series == series.series_hash(root / "series"):
        return {n: (root / "series" / n).read_bytes() for n in names}
    log = gitutil.git(["log", "--format=%H", "-n", "400", "--", "series"], root, check=False)
    for commit in log.stdout.decode().split():
        shash, files = _series_hash_at(root, commit)
        if shash == info.from_series:
            return files
    print(f"note: the series/ that was carried (series {info.from_series[:12]}) is not in git history: "
          "its resolutions cannot be replayed")  # fmt: skip
    return None


def _apply_chain(repo: Path, base: str, datas: list[bytes], names: list[str], ref: str) -> list[str] | None:
    """Apply patches on ``base`` one by one; the commit after each (kept under ``ref``)."""
    patches.reset_to(repo, base)
    failure = patches.run_am(repo, b"".join(d if d.endswith(b"\n") else d + b"\n" for d in datas), names)
    if failure:
        patches.abort_am(repo)
        return None
    tip = gitutil.rev_parse(repo, "HEAD")
    gitutil.git(["update-ref", ref, tip], repo)
    made = gitutil.out(["rev-list", "--reverse", f"{base}..{tip}"], repo).split()
    return made if len(made) == len(names) else None


def _replay_plan(root: Path, repo: Path, state: dict[str, Any], prev_dir: Path, names: list[str]) -> dict[str, Any] | None:
    """The three chains a re-carry merges (see :mod:`bf16k.replay`), or None (then plain `git am`)."""
    info = carried.load(prev_dir)
    prev_names = series.read_order(prev_dir)
    olds = _previous_inputs(root, info, [n for n in names if n in info.from_blobs or not info.from_blobs])
    if olds is None:
        return None
    count = 0
    for a, b in zip(names, prev_names, strict=False):
        if a != b or a not in olds or a in info.dropped:
            break
        count += 1
    if count == 0:
        return None
    o = _apply_chain(repo, state["old_base"], [olds[n] for n in names[:count]], names[:count], f"{REPLAY_REF}/then")
    c = _apply_chain(
        repo, state["new_base"], [(prev_dir / n).read_bytes() for n in names[:count]], names[:count],
        f"{REPLAY_REF}/carried",
    )  # fmt: skip
    n_chain = gitutil.out(["rev-list", "--reverse", f"{state['old_base']}..{state['old_tip']}"], repo).split()
    if o is None or c is None:
        print("note: the carried series or what it was carried from no longer applies: no replay")
        return None
    base_tree = replay.tree_of(repo, state["new_base"])
    return {"count": count, "O": o, "C": c, "N": n_chain[:count], "index": 0, "I_prev": base_tree,
            "T_prev": base_tree, "from": _rel(root, prev_dir), "pending": None, "notes": []}  # fmt: skip


def start(
    root: Path,
    target: str,
    *,
    commit: str | None = None,
    version: str | None = None,
    wheel_file: Path | None = None,
    force: bool = False,
    allow_older: bool = False,
    python: str | None = None,
    queue: list[str] | None = None,
) -> Outcome:
    """Carry series/ to ``target`` (a release version or a git ref); stop on the first conflict."""
    pin = pinmod.load(root / "pin.toml")
    busy = find_in_progress(root)
    if busy is not None:
        raise ToolError(
            f"a rebase is already in progress in {_rel(root, busy)}: --continue, --skip or --abort it"
        )
    series_dir = root / "series"
    problems = series.hygiene(series_dir)
    if problems:
        raise ToolError("series hygiene:\n  " + "\n  ".join(problems))
    names = series.read_order(series_dir)
    rel = resolve_target(pin, target, version, commit, allow_older)
    if rel.kind == "wheel" and rel.commit and carried_is_current(root, pin, rel.version):
        return promote(root, pin, rel)
    dest = Target(root, rel.version).series_dir
    prev_dir: Path | None = None
    if (dest / "pin.toml").is_file() and not rel.commit:
        what = what_would_change(root, rel.version)
        if not force:
            raise ToolError(
                f"{what}\nTo re-carry over it: nox -s rebase -- {rel.version} --force"
                "   (`nox -s rebase -- --recarry` re-carries every carried release)"
            )
        print(what)
        prev_dir = dest
    if rel.kind == "wheel" and wheel_file is None:
        check_release_exists(rel.version, pin)
    if rel.older:
        print(f"warning: sglang {rel.version} is older than the pinned {pin.version}: this is a port, not a "
              "carry forward; the series is fitted onto older upstream code, and the pin cannot move there")  # fmt: skip
    repo = Target(root, rel.version).upstream_dir
    state: dict[str, Any] = _prepare_tree(repo)
    try:
        state.update(_build_bases(root, repo, pin, rel, wheel_file))
        upstream.verify_fingerprint(upstream.Upstream(repo, state["old_base"], "wheel", "pinned import"), pin)
        old_tip = _apply_old_series(repo, state["old_base"], series_dir, names)
        state["old_tip"] = old_tip
        plan = _replay_plan(root, repo, state, prev_dir, names) if prev_dir is not None else None
    except BaseException:
        _restore_tree(repo, state)  # nothing of a failed start is left behind
        raise
    gitutil.git(["update-ref", OLD_TIP_REF, old_tip], repo)
    gitutil.git(["update-ref", NEW_BASE_REF, state["new_base"]], repo)
    cleared = clear_rerere(repo)
    prev_info = carried.load(prev_dir) if prev_dir is not None else carried.Carried()
    if gitutil.is_repo(root):  # keep the inputs findable for a later re-carry, committed or not
        gitutil.git(["hash-object", "-w", "--", *[f"series/{n}" for n in names]], root, check=False)
    state.update({
        "version": rel.version, "tag": rel.tag, "kind": rel.kind, "ref": rel.ref, "commit": rel.commit,
        "names": names, "old_version": pin.version, "old_series_hash": series.series_hash(series_dir),
        "from_blobs": _blobs_now(root, names), "dropped": {}, "older": rel.older,
        "phase": "apply", "replay": plan, "am_offset": plan["count"] if plan else 0,
        "reasons": [], "prev_reasons": [r.as_dict() for r in prev_info.resolutions],
        "prev_patches": {n: (prev_dir / n).read_text(errors="replace") for n in series.read_order(prev_dir)}
        if prev_dir is not None else {},
        "python": python, "queue": list(queue or []), "stop": None, "failing": [], "started": time.time(),
    })  # fmt: skip
    patches.reset_to(repo, state["new_base"])
    _stash_series(repo, series_dir, names)
    save_state(repo, state)
    upstream.write_state(repo, {"source": "wheel" if rel.kind == "wheel" else "submodule",
                                "base": state["new_base"], "version": rel.version})  # fmt: skip
    intro = list(state["notes"]) + ([f"cleared {cleared} recorded rerere resolution(s)"] if cleared else [])
    intro.append(f"carrying {_plural(len(names), 'patch', 'patches')} from {pin.version} to {state['source_detail']}")
    if plan:
        intro.append(
            f"replaying {plan['from']}/ for the first {_plural(plan['count'], 'patch', 'patches')} "
            "(its resolutions, with series/'s edits since merged in)"
        )
    print("\n".join(intro), flush=True)
    return _advance(root, repo, state)


def _build_bases(root: Path, repo: Path, pin: Pin, rel: Release, wheel_file: Path | None) -> dict[str, Any]:
    """Old and new base commits in the carried tree, and where the new one came from."""
    if rel.kind == "wheel":
        wheel = release_wheel(rel.version, pin, wheel_file)
        if not wheel_has_dsv4(wheel):
            raise ToolError(f"{wheel.name} has no {DSV4_MODEL}: sglang {rel.version} cannot carry the series")
        new_pin = release_pin(pin, rel, wheel)
        old_base, new_base = upstream.materialize_carried(repo, new_pin, pin, wheel)
        gitutil.git(["update-ref", OLD_BASE_REF, old_base], repo)
        detail = (
            f"PyPI wheel {wheel.name}, base {new_base[:12]} "
            f"(a child of the {pin.version} import {old_base[:12]})"
        )
    else:
        if not pin.commit:
            raise ToolError("the pin has no upstream commit, so a git-ref carry has no old base")
        repo.mkdir(parents=True, exist_ok=True)
        if not gitutil.is_repo(repo):
            gitutil.git(["init", "-q"], repo)
        old_base = _fetch_pinned_commit(root, repo, pin)
        new_base = _fetch_ref(repo, pin.repository, rel.ref)
        if rel.commit and rel.commit != new_base:
            raise ToolError(f"{rel.ref} is {new_base} in {pin.repository}, not the --commit {rel.commit}")
        rel.commit = new_base
        wheel = release_wheel(rel.version, pin, wheel_file)
        detail = f"{rel.ref} = {new_base[:12]} from {pin.repository}"
    return {"old_base": old_base, "new_base": new_base, "wheel": str(wheel), "source_detail": detail}


# --------------------------------------------------------------------------- carrying


def _stash_series(repo: Path, series_dir: Path, names: list[str]) -> None:
    """Keep the series as it was at start: a stopped carry goes on with those bytes."""
    keep = upstream.git_dir(repo) / "bf16k-series"
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    for name in names:
        shutil.copyfile(series_dir / name, keep / name)


def _stashed(repo: Path) -> Path:
    return upstream.git_dir(repo) / "bf16k-series"


def _save_stop(repo: Path, state: dict[str, Any], kind: str, summary: str, hunks: list[Hunk] | None = None) -> None:
    state["stop"] = {
        "kind": kind, "summary": summary, "tip": gitutil.rev_parse(repo, "HEAD"),
        "hunks": [{"path": h.path, "scope": h.scope, "line": h.line} for h in (hunks or [])],
    }  # fmt: skip
    save_state(repo, state)


def _stop_hunks(state: dict[str, Any]) -> list[Hunk]:
    stop = state.get("stop") or {}
    return [Hunk(h["path"], h["scope"], int(h["line"])) for h in stop.get("hunks", [])]


def _am_stop(root: Path, repo: Path, state: dict[str, Any], output: bytes) -> Outcome:
    stop = describe_stop(repo, state["names"], output, state["am_offset"])
    hunks = reasonsmod.marker_hunks(repo, sorted({p for p, _ in stop.hunks}))
    what = "patch now empty" if stop.empty else f"conflict in {_plural(len(stop.files), 'file')}"
    _save_stop(repo, state, "conflict", f"patch {stop.index + 1} '{stop.name}': {what}", hunks)
    return Outcome(stop, stop_message(root, repo, state, stop))


def _advance(root: Path, repo: Path, state: dict[str, Any]) -> Outcome:
    """Carry on from where the state says: replay, `git am` the rest, then tests and bisect."""
    names = state["names"]
    if state["phase"] == "apply":
        out = _replay(root, repo, state)
        if out is not None:
            return out
        offset = state["am_offset"]
        state["phase"] = "am"
        save_state(repo, state)
        rest = names[offset:]
        if rest:
            failure = patches.run_am(repo, patches.mbox(_stashed(repo), rest), rest, offset)
            if failure:
                return _am_stop(root, repo, state, failure.detail.encode())
    state["phase"] = "tests"
    save_state(repo, state)
    out = _verify(root, repo, state)
    if out is not None:
        return out
    return finish(root, repo, state)


def _tree_has_markers(repo: Path, tree: str, path: str) -> bool:
    proc = gitutil.git(["cat-file", "-p", f"{tree}:{path}"], repo, check=False)
    if proc.returncode != 0:
        return False
    return any(line.startswith(b"<<<<<<< ") for line in proc.stdout.split(b"\n"))


def _replay(root: Path, repo: Path, state: dict[str, Any]) -> Outcome | None:
    """Commit replayed prefixes until one needs a hand (then stop with it in the worktree)."""
    plan = state.get("replay")
    if not plan:
        return None
    names = state["names"]
    while plan["index"] < plan["count"]:
        k = plan["index"]
        name = names[k]
        o, c, n = (replay.tree_of(repo, plan[x][k]) for x in ("O", "C", "N"))
        auto = replay.merge_trees(repo, o, c, n)
        tree, candidates = auto.tree, list(auto.conflicts)
        if plan["T_prev"] != plan["I_prev"]:  # a hand resolution earlier: keep it where it still fits
            chained = replay.merge_trees(repo, plan["I_prev"], plan["T_prev"], auto.tree, labels=("yours", "before", "replayed"))
            tree, candidates = chained.tree, sorted(set(candidates) | set(chained.conflicts))
        conflicts = [p for p in candidates if _tree_has_markers(repo, tree, p) or p in auto.structural]
        then, was, now = (replay.message_of(repo, plan[x][k]) for x in ("O", "C", "N"))
        message, clean = replay.merge_messages(repo, then, was, now)
        if not clean:
            plan["notes"].append(f"{name}: its message was edited in the carry and in series/ since; series/'s is used")
        author = replay.author_of(repo, plan["N"][k])
        plan["I_prev"] = auto.tree
        if conflicts:
            head = gitutil.rev_parse(repo, "HEAD")
            replay.checkout_tree(repo, head, tree)
            plan["pending"] = {"tree": tree, "message": message, "author": list(author), "conflicts": conflicts}
            hunks = reasonsmod.marker_hunks(repo, conflicts)
            subject = message.split("\n", 1)[0]
            stop = Stop(k, len(names), name, subject, conflicts,
                        [(h.path, h.line) for h in hunks], False, "", kind="replay")  # fmt: skip
            _save_stop(repo, state, "replay", f"patch {k + 1} '{name}': replaying conflicts in "
                       f"{_plural(len(conflicts), 'file')}", hunks)  # fmt: skip
            return Outcome(stop, _replay_stop_message(root, repo, state, stop, hunks))
        _commit_replayed(repo, tree, message, author, plan)
        save_state(repo, state)
    if plan["notes"]:
        print("\n".join("note: " + n for n in plan["notes"]))
    print(f"replayed {_plural(plan['count'], 'patch', 'patches')} from {plan['from']}/", flush=True)
    return None


def _commit_replayed(repo: Path, tree: str, message: str, author: tuple[str, str, str], plan: dict[str, Any]) -> None:
    commit = replay.commit_tree(repo, tree, gitutil.rev_parse(repo, "HEAD"), message, author)
    gitutil.git(["checkout", "-q", "-f", "-B", patches.BRANCH, commit], repo)
    gitutil.git(["clean", "-q", "-fd"], repo)
    plan["T_prev"] = tree
    plan["index"] += 1
    plan["pending"] = None


def _replay_stop_message(root: Path, repo: Path, state: dict[str, Any], stop: Stop, hunks: list[Hunk]) -> str:
    version, where = state["version"], _rel(root, repo)
    plan = state["replay"]
    lines = [
        f"re-carry to sglang {version} stopped at patch {stop.index + 1} of {stop.total}: '{stop.name}'",
        f"  replaying {plan['from']}/: series/ changed this patch since it was carried, where the carry",
        "  had changed it too. The markers hold the carried version (carried), the patch as it was then",
        "  (series-then) and as it is now (series-now); keep the carried resolution and series/'s edit.",
        f"  files (in {where}):",
        *[f"    {f}" for f in stop.files],
    ]
    if hunks:
        lines.append("  conflict hunks:")
        lines += [f"    {where}/{h.path}:{h.line}" + (f"  ({h.scope})" if h.scope else "") for h in hunks]
        lines += _earlier_reasons_lines(state, stop.name, hunks)
        lines += _conflict_context_lines(repo, state, hunks, version, where)
    lines += [
        "next:",
        f"  1. resolve by intent in {where}: edit the files until no conflict markers remain",
        *_continue_lines(hunks, "commits the patch, replays the rest"),
        "  or give up and restore everything as it was: nox -s rebase -- --abort",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- tests and bisect


def _owners(repo: Path, commits: list[str], names: list[str]) -> dict[str, tuple[int, str]]:
    """file -> (index, patch) of the first carried patch that touches it."""
    owner: dict[str, tuple[int, str]] = {}
    for i, c in enumerate(commits):
        for f in gitutil.out(["diff-tree", "--no-commit-id", "--name-only", "-r", c], repo).splitlines():
            owner.setdefault(f, (i, names[i]))
    return owner


def _carried_commits(repo: Path, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    commits = gitutil.out(["rev-list", "--reverse", f"{state['new_base']}..HEAD"], repo).split()
    return commits, [rangediff.patch_name(repo, c) for c in commits]


def _verify(root: Path, repo: Path, state: dict[str, Any]) -> Outcome | None:
    """The carry's gate: the series' tests on the carried tree, then every prefix bisected."""
    version, where = state["version"], _rel(root, repo)
    try:
        python = seriestests.find_python(root, state.get("python"))
    except ToolError as exc:
        _save_stop(repo, state, "tests", "no Python to run the series' tests")
        text = (
            f"carry to sglang {version}: every patch is carried; the carry is done once the series' tests "
            f"pass on {where} and every prefix bisects.\n  {exc}\n"
            "next: nox -s rebase -- --continue   (runs the tests and the bisect)\n"
            "  or nox -s rebase -- --abort"
        )
        return Outcome(Stop(-1, len(state["names"]), "", "", [], [], False, "", kind="tests"), text)
    commits, names = _carried_commits(repo, state)
    verified: dict[str, Any] = {"tests": "no series tests", "tests_seconds": 0, "bisect": "", "bisect_seconds": 0}
    if seriestests.series_test_files(repo, state["new_base"]):
        mode = "CUDA" if python.cuda else "CPU, TRITON_INTERPRET=1"
        print(f"series tests on {where} ({mode}, {python.path}) ...", flush=True)
        failing = list(state.get("failing") or [])
        if failing:  # what failed last time first: a quick answer after a fix
            quick = seriestests.run(python, repo, select=failing)
            if quick.collected and quick.failures:
                return _tests_stop(root, repo, state, python, quick, commits, names)
        result = seriestests.run(python, repo, base=state["new_base"])
        if not result.ok:
            return _tests_stop(root, repo, state, python, result, commits, names)
        print(f"series tests: {result.summary()}", flush=True)
        verified.update(tests=f"{result.passed} passed, {result.skipped} skipped", tests_seconds=round(result.seconds))
    state["failing"] = []
    began = time.monotonic()
    print(f"bisect: each of the {len(commits)} carried prefixes on its own ...", flush=True)
    steps = bisect.check_commits(repo, state["new_base"], commits, names, python, skip_last_tests=True)
    bad = [s for s in steps if s.problems]
    if bad:
        return _bisect_stop(root, repo, state, python, bad[0], commits, names)
    verified.update(bisect=f"{len(steps)} of {len(commits)} prefixes", bisect_seconds=round(time.monotonic() - began))
    state["verified"] = verified
    save_state(repo, state)
    return None


def _rerun_command(where: str, python: seriestests.TestPython, nodeids: list[str]) -> str:
    env = "PYTHONPATH=python" + ("" if python.cuda else " TRITON_INTERPRET=1")
    picked = nodeids[:4] if len(nodeids) <= 4 else sorted({n.split("::", 1)[0] for n in nodeids})
    return (f"cd {where} && {env} {python.path} -m pytest -q -p no:cacheprovider -c /dev/null "
            + " ".join(shlex.quote(n) for n in picked))  # fmt: skip


def _failure_lines(
    root: Path,
    repo: Path,
    state: dict[str, Any],
    python: seriestests.TestPython,
    failures: list[seriestests.Failure],
    owner: dict[str, tuple[int, str]],
) -> list[str]:
    where = _rel(root, repo)
    lines = ["  failing (test / the patch it belongs to: the first line of the failure):"]
    for f in failures[:12]:
        i, name = owner.get(f.file, (-1, ""))
        lines.append(f"    {f.nodeid}")
        lines.append(f"      patch {i + 1} '{name}': {f.message}" if i >= 0 else f"      {f.message}")
    if len(failures) > 12:
        lines.append(f"    ... and {len(failures) - 12} more")
    calls = seriestests.executed(python, repo, [f.nodeid for f in failures[:6]])
    lines += [
        "  " + line
        for line in context.for_tests(
            repo, state["old_base"], state["new_base"], calls, version=f"{state['old_version']} -> {state['version']}", repo_label=where,
            old_ref=OLD_BASE_REF, new_ref=NEW_BASE_REF, hint="\n".join(f.text for f in failures),
        )
    ]  # fmt: skip
    return lines


def _fix_lines(root: Path, repo: Path, python: seriestests.TestPython, nodeids: list[str]) -> list[str]:
    where = _rel(root, repo)
    return [
        "next:",
        f"  1. fix the patch or its test by intent in {where} (never by weakening the test): edit the",
        "     files; each edited hunk goes into the patch that last changed those lines (or make",
        "     `git commit --fixup <patch commit>` yourself). Rerun just these while you work:",
        f"     {_rerun_command(where, python, nodeids)}",
        '  2. nox -s rebase -- --continue -m "<file> (<scope>): <why>" ...',
        "     (one line per hunk you changed; reruns these tests, then all, then bisects every prefix)",
        "  or give up and restore everything as it was: nox -s rebase -- --abort",
    ]


def _tests_stop(
    root: Path,
    repo: Path,
    state: dict[str, Any],
    python: seriestests.TestPython,
    result: seriestests.TestRun,
    commits: list[str],
    names: list[str],
) -> Outcome:
    version = state["version"]
    owner = _owners(repo, commits, names)
    state["failing"] = [f.nodeid for f in result.failures]
    n = len(result.failures)
    _save_stop(repo, state, "tests", f"{_plural(n, 'series test')} failing" if n else "series tests crashed")
    lines = [
        f"carry to sglang {version} stopped: the series' tests fail on the carried tree ({result.summary()})",
        f"  upstream: {state['source_detail']}",
    ]
    if result.failures:
        lines += _failure_lines(root, repo, state, python, result.failures, owner)
    else:
        lines += ["  pytest said:", *["    " + ln for ln in result.output.splitlines()[-25:]]]
    lines += _fix_lines(root, repo, python, state["failing"])
    return Outcome(Stop(-1, len(names), "", "", [], [], False, "", kind="tests"), "\n".join(lines))


def _bisect_stop(
    root: Path,
    repo: Path,
    state: dict[str, Any],
    python: seriestests.TestPython,
    step: bisect.Step,
    commits: list[str],
    names: list[str],
) -> Outcome:
    version = state["version"]
    state["failing"] = [f.nodeid for f in step.failures]
    _save_stop(repo, state, "bisect", f"patch {step.index + 1} '{step.name}' does not leave a working tree")
    lines = [
        (f"carry to sglang {version} stopped: with patches 1..{step.index + 1} only, the tree does not work "
        f"(patch {step.index + 1} '{step.name}'); the whole series passes its tests, so a later patch hides it."),
    ]
    if step.failures:
        lines += _failure_lines(root, repo, state, python, step.failures, _owners(repo, commits, names))
    else:
        lines += ["  " + ln for p in step.problems for ln in p.splitlines()[:20]]
    lines += _fix_lines(root, repo, python, state["failing"] or seriestests.series_test_files(repo, state["new_base"]))
    lines.insert(-4, f"     (the fix belongs in patch {step.index + 1} or an earlier one)")
    return Outcome(Stop(step.index, len(names), step.name, "", [], [], False, "", kind="bisect"), "\n".join(lines))


# --------------------------------------------------------------------------- continue / skip / abort


def _require_reasons(text: str, hunks: list[Hunk], patch: str, kind: str) -> list[Reason]:
    """The maintainer's reasons for ``hunks``; refuse (changing nothing) while one is missing."""
    if not hunks:
        return []
    patch_of = {(h.path, h.scope): patch for h in hunks}
    return reasonsmod.require(text, hunks, patch_of, kind, "hand-made hunk")


def resume(
    root: Path, *, skip: bool = False, messages: list[str] | None = None, python: str | None = None
) -> Outcome:
    repo, state = load_state(root)
    text = "\n".join(messages or [])
    if python:
        state["python"] = python
    phase = state.get("phase", "am")
    if phase == "apply":
        return _resume_replay(root, repo, state, skip, text)
    if phase == "am":
        out = _resume_am(root, repo, state, skip, text)
        if out is not None:
            return out
    elif phase == "tests":
        if skip:
            raise ToolError(
                "--skip leaves out a patch upstream already contains; it cannot skip the tests: fix the "
                "patch or its test and --continue, or --abort"
            )
        notes, found = absorb.absorb(repo, state, text, state.get("stop") or {})
        for note in notes:
            print(note, flush=True)
        state["reasons"] = state["reasons"] + [r.as_dict() for r in found]
    state["phase"] = "tests"
    state["stop"] = None
    save_state(repo, state)
    return _advance(root, repo, state)


def _resume_replay(root: Path, repo: Path, state: dict[str, Any], skip: bool, text: str) -> Outcome:
    plan = state["replay"]
    pending = plan.get("pending") if plan else None
    if not pending:
        state["phase"] = "apply"
        return _advance(root, repo, state)
    if skip:
        raise ToolError(
            "--skip leaves out a patch upstream already contains; this stop is series/'s own edit meeting "
            "a resolution of the carry: resolve it and --continue, or --abort"
        )
    where = _rel(root, repo)
    left = [(p, n) for p in pending["conflicts"] for n in marker_lines(repo / p)]
    if left:
        raise ToolError("conflict markers remain, resolve them first:\n" + "\n".join(f"  {where}/{p}:{n}" for p, n in left))
    name = state["names"][plan["index"]]
    tree = replay.worktree_tree(repo)
    hunks = _stop_hunks(state)
    extra = [h for h in reasonsmod.tree_hunks(repo, pending["tree"], tree) if h.path not in pending["conflicts"]]
    found = _require_reasons(text, reasonsmod.unique(hunks + extra), name, "replay")
    _commit_replayed(repo, tree, pending["message"], tuple(pending["author"]), plan)
    state["reasons"] = state["reasons"] + [r.as_dict() for r in found]
    state["stop"] = None
    save_state(repo, state)
    return _advance(root, repo, state)


def _resume_am(root: Path, repo: Path, state: dict[str, Any], skip: bool, text: str) -> Outcome | None:
    """Go on with the `git am` in progress; an Outcome if it stops again, else None."""
    names, offset = state["names"], state.get("am_offset", 0)
    if not patches.am_in_progress(repo):
        return None
    if skip:
        name = _skip_checked(repo, state)
        state["dropped"][name] = state["version"]
        save_state(repo, state)
        proc = gitutil.git(["am", "--skip", *AM_RESUME_FLAGS], repo, check=False)
    else:
        left = [(p, n) for p in unmerged(repo) for n in marker_lines(repo / p)]
        if left:
            where = _rel(root, repo)
            raise ToolError(
                "conflict markers remain, resolve them first:\n" + "\n".join(f"  {where}/{p}:{n}" for p, n in left)
            )
        nxt = upstream.git_dir(repo) / "rebase-apply" / "next"
        index = offset + int(nxt.read_text().strip()) - 1
        found = _require_reasons(text, _stop_hunks(state), names[index], "conflict")
        # Edits to tracked files belong to the stopped patch (a resolution may need a fix
        # elsewhere); new files must be `git add`ed by hand, so editor litter stays out.
        resolved = unmerged(repo)
        gitutil.git(["add", "-u"], repo)
        if resolved:
            gitutil.git(["add", "-A", "--", *resolved], repo)
        proc = gitutil.git(["am", "--continue", *AM_RESUME_FLAGS], repo, check=False)
        state["reasons"] = state["reasons"] + [r.as_dict() for r in found]
        save_state(repo, state)
    if patches.am_in_progress(repo):
        return _am_stop(root, repo, state, proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ToolError("git am failed:\n" + (proc.stdout + proc.stderr).decode(errors="replace").strip())
    return None


def _skip_checked(repo: Path, state: dict[str, Any]) -> str:
    """The current patch's name if it may be skipped; else refuse (never skip-and-recreate)."""
    nxt = upstream.git_dir(repo) / "rebase-apply" / "next"
    index = state.get("am_offset", 0) + int(nxt.read_text().strip()) - 1
    name = str(state["names"][index])
    version = state["version"]
    diff = (upstream.git_dir(repo) / "rebase-apply" / "patch").read_text(errors="replace")
    touched = [fd.path for fd in diffs.parse(diff)]
    still_conflicted = bool(unmerged(repo))
    left = gitutil.git(["diff", "--quiet", "HEAD", "--", *touched], repo, check=False).returncode != 0
    if left and not still_conflicted:
        raise ToolError(
            f"--skip refused: your resolution of '{name}' keeps changes (the patch is not empty); "
            "run `nox -s rebase -- --continue` to carry it"
        )
    ok, why = upstream_contains(repo, state["new_base"], diff)
    if not ok:
        raise ToolError(
            f"--skip refused: sglang {version} does not contain the change of '{name}' ({why}). "
            "Skipping would drop the patch; resolve the conflict and `--continue`, or `--abort`."
        )
    return name


def _restore_tree(repo: Path, state: dict[str, Any]) -> None:
    """Put the carried tree back as the rebase found it (or remove it if the rebase made it)."""
    if state.get("created"):
        shutil.rmtree(repo, ignore_errors=True)
        return
    patches.abort_am(repo)
    _delete_rebase_refs(repo)
    if state.get("pre_head"):
        gitutil.git(["checkout", "-q", "-f", "-B", patches.BRANCH, state["pre_head"]], repo)
        gitutil.git(["clean", "-q", "-fd"], repo)
    if state.get("pre_base_ref"):
        gitutil.git(["update-ref", upstream.BASE_REF, state["pre_base_ref"]], repo)
    upstream.write_state(repo, state.get("pre_state") or {})
    shutil.rmtree(_stashed(repo), ignore_errors=True)
    state_path(repo).unlink(missing_ok=True)


def abort(root: Path) -> str:
    repo, state = load_state(root)
    patches.abort_am(repo)
    _restore_tree(repo, state)
    if state.get("created"):
        where = _rel(root, repo)
        return f"rebase to {state['version']} aborted: removed {where}; series/ and pin.toml untouched"
    notes = "; ".join(state.get("notes", []))
    return (f"rebase to {state['version']} aborted: {_rel(root, repo)} is back where it was; "
            "series/ and pin.toml untouched" + (f" ({notes})" if notes else ""))  # fmt: skip


# --------------------------------------------------------------------------- finishing


def _diff_of(patch_file: Path) -> str:
    return series.split_message(patch_file.read_bytes())[1].decode("utf-8", errors="replace")


def _patch_diff(repo: Path, commit: str) -> bytes:
    raw = gitutil.git([*patches.FORMAT_PATCH_FLAGS, "-1", commit], repo).stdout
    return series.split_message(raw)[1]


def _bump_last_update(repo: Path, state: dict[str, Any]) -> list[str]:
    """Set ``Last-Update:`` to today on carried patches whose own lines changed (DEP-3).

    Not when a re-carry reproduces the diff the carried series already had: that patch did not
    change again, and its date says when it last did.
    """
    base = state["new_base"]
    commits = gitutil.out(["rev-list", "--reverse", f"{base}..HEAD"], repo).split()
    inputs = {
        rangediff.patch_name(repo, c): c
        for c in gitutil.out(["rev-list", "--reverse", f"{state['old_base']}..{state['old_tip']}"], repo).split()
    }
    prev = {n: series.split_message(t.encode())[1] for n, t in (state.get("prev_patches") or {}).items()}
    date = today()
    bumped: list[str] = []
    parent = base
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


def _final_reasons(state: dict[str, Any], exported: list[tuple[str, bytes]], rd: rangediff.RangeDiff) -> list[Reason]:
    """This carry's reasons, plus the replaced carry's for patches a human still changed, in files
    the carried patch touches or its range-diff shows (a reason for a file neither has any more
    explains nothing)."""
    new = [Reason(**r) for r in state.get("reasons", [])]
    unchanged = {e.name for e in rd.entries if e.cls == rangediff.UNCHANGED}
    touched = {name: {fd.old_path for fd in diffs.parse(data.decode("utf-8", "replace"))} for name, data in exported}
    shown = {(e.name, h.path) for e in rd.entries for h in e.hunks}
    old = [Reason(**r) for r in state.get("prev_reasons", [])]
    old = [r for r in old if r.patch in touched and r.patch not in unchanged
           and ((r.patch, r.path) in shown or r.path in touched[r.patch])]  # fmt: skip
    # A reason said again in this carry for the same file (another scope) replaces the old one.
    said = {(r.patch, r.path, r.why) for r in new}
    old = [r for r in old if (r.patch, r.path, r.why) not in said]
    return reasonsmod.dedupe(old + new)


def finish(root: Path, repo: Path, state: dict[str, Any]) -> Outcome:
    """Export the carried commits; write series/next/<v> or move the pin; record the range-diff."""
    if patches.am_in_progress(repo):
        raise ToolError(f"a `git am` is still in progress in {repo}")
    version, new_base = state["version"], state["new_base"]
    bumped = _bump_last_update(repo, state)
    exported = patches.export_commits(repo, new_base)
    carried_names = [name for name, _ in exported]
    dropped: dict[str, str] = dict(state["dropped"])
    for name in state["names"]:
        if name in carried_names or name in dropped:
            continue
        # git am drops a patch by itself when its 3-way merge changes nothing.
        ok, why = upstream_contains(repo, new_base, _diff_of(_stashed(repo) / name))
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
    rd = rangediff.classify(repo, state["old_base"], state["old_tip"], new_base, head, notes=notes)
    reasons = _final_reasons(state, exported, rd)
    pin = pinmod.load(root / "pin.toml")
    if state["commit"]:
        message = _move_pin(root, repo, state, pin, exported, rd, dropped, reasons)
    else:
        message = _write_carried(root, repo, state, pin, exported, rd, dropped, reasons)
    if bumped:
        message += f"\nLast-Update: set to {today()} on {', '.join(bumped)} (its own lines changed)"
    missing = rangediff.unexplained(rd, reasons)
    if missing:
        message += (
            f"\nnote: {_plural(len(missing), 'changed hunk')} without a recorded reason (the range-diff says "
            "so): " + "; ".join(missing[:6])
        )
    shutil.rmtree(_stashed(repo), ignore_errors=True)
    state_path(repo).unlink(missing_ok=True)
    if left:
        where = _rel(root, repo)
        message += f"\nnote: {_plural(len(left), 'uncommitted path')} in {where} were not carried (e.g. {left[0][3:]})"
    queue = list(state.get("queue") or [])
    if queue:
        print(message, flush=True)
        nxt = queue.pop(0)
        print(f"\nnext re-carry: sglang {nxt}", flush=True)
        return start(root, nxt, force=True, allow_older=True, python=state.get("python"), queue=queue)
    return Outcome(None, message)


def _title(state: dict[str, Any]) -> str:
    return f"Range-diff: series on sglang {state['old_version']} → {state['version']}"


def _markdown(state: dict[str, Any], rd: rangediff.RangeDiff, new_label: str, reasons: list[Reason]) -> str:
    old = f"`series/` on sglang {state['old_version']} (base `{state['old_base'][:12]}`)"
    return rangediff.to_markdown(rd, _title(state), old, new_label, reasons)


def _hand_merged_text(rd: rangediff.RangeDiff, reasons: list[Reason]) -> str:
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


def _write_carried(
    root: Path,
    repo: Path,
    state: dict[str, Any],
    pin: Pin,
    exported: list[tuple[str, bytes]],
    rd: rangediff.RangeDiff,
    dropped: dict[str, str],
    reasons: list[Reason],
) -> str:
    version, new_base = state["version"], state["new_base"]
    dest = Target(root, version).series_dir
    wheel = Path(state["wheel"])
    replaced = (dest / "pin.toml").is_file()
    patches.write_series(dest, exported)
    cpin = release_pin(pin, Release(version, state["tag"], "wheel", "", ""), wheel, new_base)
    cpin.fingerprint = patches.fingerprint_for(dest, repo, new_base)
    pinmod.save(cpin, dest / "pin.toml")
    v = state.get("verified") or {}
    record = carried.Carried(
        from_series=state["old_series_hash"], from_blobs=dict(state["from_blobs"]), dropped=dropped,
        verified=carried.Verified(str(v.get("tests", "")), int(v.get("tests_seconds", 0)),
                                  str(v.get("bisect", "")), int(v.get("bisect_seconds", 0))),
        resolutions=reasons,
    )  # fmt: skip
    (dest / carried.FILE).write_text(carried.render(pin, record))
    label = (
        f"`series/next/{version}/` on sglang {version} (PyPI wheel `{wheel.name}`, base `{new_base[:12]}`)"
    )
    (dest / "range-diff.md").write_text(_markdown(state, rd, label, reasons))
    shash = series.series_hash(dest)
    upstream.write_state(repo, {"source": "wheel", "base": new_base, "version": version,
                                "series_hash": shash, "head": gitutil.rev_parse(repo, "HEAD")})  # fmt: skip
    count = len(exported)
    port = f" This is a port back to an older release than the pin ({pin.version})." if state.get("older") else ""
    entry = (
        f"Carried the series ({_plural(count, 'patch', 'patches')}, from series `{state['old_series_hash'][:12]}`) "
        f"from sglang {pin.version} to {version} (PyPI wheel `{wheel.name}`, "
        f"sha256 `{cpin.wheel.sha256[:12]}…`) as `series/next/{version}/`; its upstream commit is not known "
        f"yet, so the pin stays at {pin.version}. Range-diff: {rd.summary()}." + _dropped_text(dropped)
        + _hand_merged_text(rd, reasons)
        + (f" Its tests pass there ({v['tests']}, CPU) and every prefix bisects." if v.get("tests") else "")
        + port
    )
    how = add_changelog(root, entry, key=f"`series/next/{version}/`")
    return "\n".join([
        (f"carried {_plural(count, 'patch', 'patches')} to sglang {version}: {_rel(root, dest)}/ "
         f"(pin.toml with commit = \"\", carried.toml, range-diff.md){' (replaced)' if replaced else ''}; "
         f"the pin stays at {pin.version}"),
        (f"tests: {v.get('tests', '?')} in {v.get('tests_seconds', '?')} s; bisect: {v.get('bisect', '?')} "
        f"in {v.get('bisect_seconds', '?')} s"),
        f"range-diff: {rd.summary()} ({_rel(root, dest)}/range-diff.md, a PR description)",
        f"CHANGELOG.md: {how} the [Unreleased] entry for {version}, with the reasons",
        f"work on it: nox -s apply -- --upstream {version}   (tree: {_rel(root, repo)})",
        *([] if state.get("older") else
          [f"once {version}'s upstream commit is known: nox -s rebase -- {version} --commit <sha>"]),
    ])  # fmt: skip


def _move_pin(
    root: Path,
    repo: Path,
    state: dict[str, Any],
    pin: Pin,
    exported: list[tuple[str, bytes]],
    rd: rangediff.RangeDiff,
    dropped: dict[str, str],
    reasons: list[Reason],
) -> str:
    version, new_base = state["version"], state["new_base"]
    rel = Release(version, state["tag"], state["kind"], state["ref"], state["commit"])
    new_pin = new_pin_for(pin, rel, Path(state["wheel"]))
    fingerprint = _fingerprint_of(exported, repo, new_base)
    if state["kind"] == "ref":
        _check_wheel_matches(repo, new_pin, fingerprint)
    else:
        _check_given_commit(root, new_pin, fingerprint)
    new_pin.fingerprint = fingerprint
    patches.write_series(root / "series", exported)
    pinmod.save(new_pin, root / "pin.toml")
    label = f"`series/` on sglang {version} (commit `{rel.commit[:12]}`, base `{new_base[:12]}`)"
    md = _markdown(state, rd, label, reasons)
    return _after_move(root, state, pin, new_pin, len(exported), rd, md, dropped, _hand_merged_text(rd, reasons))


def new_pin_for(pin: Pin, rel: Release, wheel: Path) -> Pin:
    """The moved pin: its base commit is the standalone wheel import `apply` builds for a pin."""
    new_pin = release_pin(pin, rel, wheel)
    _, _, base = upstream.cached_import(new_pin, wheel_file=wheel)
    new_pin.wheel.base_commit = base
    return new_pin


def _fingerprint_of(exported: list[tuple[str, bytes]], repo: Path, base: str) -> dict[str, str]:
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
    state: dict[str, Any],
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
        f"({_plural(count, 'patch', 'patches')}) onto it. Range-diff: {rd.summary()}." + _dropped_text(dropped)
        + hand
    )
    add_changelog(root, entry)
    return "\n".join([
        f"pin moved to sglang {new.version} ({new.commit}); series/ holds the {_plural(count, 'carried patch', 'carried patches')}",
        f"range-diff: {rd.summary()} ({_rel(root, out)})",
        gitlink,
        *([f"removed {_rel(root, nxt)}/ (superseded: series/ is on {new.version})"] if superseded else []),
        ("next: commit pin.toml, series/, CHANGELOG.md and the gitlink together; then `nox -s apply` "
         f"puts {SUBMODULE_PATH}/ on {new.version}"),
    ])  # fmt: skip


def _dropped_text(dropped: dict[str, str]) -> str:
    if not dropped:
        return ""
    return (
        " Dropped: " + ", ".join(f"`{n}` (Applied-Upstream: {v})" for n, v in sorted(dropped.items())) + "."
    )


def move_gitlink(root: Path, commit: str) -> str:
    """Point the superproject's index entry for the submodule at the new pin (not committed)."""
    listed = gitutil.git(["ls-files", "--stage", "--", SUBMODULE_PATH], root, check=False)
    if listed.returncode != 0 or not listed.stdout.startswith(b"160000"):
        return f"note: no gitlink for {SUBMODULE_PATH} in the index; none updated"
    gitutil.git(["update-index", "--cacheinfo", f"160000,{commit},{SUBMODULE_PATH}"], root)
    patches.protect_superproject_gitlink(Target(root, None))
    return f"gitlink {SUBMODULE_PATH} -> {commit} staged in the index"


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
            if key in " ".join(part.strip() for part in lines[i:j]) and lines[i].startswith("- Carried the series"):
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


# --------------------------------------------------------------------------- fast-forward


def carried_is_current(root: Path, pin: Pin, version: str) -> bool:
    """series/next/<version> exists and was carried from today's series/ on today's pin."""
    t = Target(root, version)
    if not t.pin_path.is_file():
        return False
    info = carried.load(t.series_dir)
    return (
        info.parent.get("sha256") == pin.wheel.sha256
        and info.from_series == series.series_hash(root / "series")
    )


def promote(root: Path, pin: Pin, rel: Release) -> Outcome:
    """The upstream commit of a carried release became known: its series becomes series/."""
    t = Target(root, rel.version)
    report = patches.check(t)
    if report.problems:
        raise ToolError(
            f"{_rel(root, t.series_dir)} no longer applies or exports cleanly:\n  "
            + "\n  ".join(report.problems)
        )
    rd, _ = rangediff.series_range_diff(root, rel.version)
    reasons = carried.load(t.series_dir).resolutions
    cpin = t.load_pin()
    exported = [(n, (t.series_dir / n).read_bytes()) for n in series.read_order(t.series_dir)]
    dropped = dict(carried.load(t.series_dir).dropped)
    new_pin = new_pin_for(pin, rel, upstream.fetch_wheel(cpin))
    new_pin.fingerprint = dict(cpin.fingerprint)
    up = upstream.obtain(t, quiet=True)
    _check_given_commit(root, new_pin, new_pin.fingerprint)
    patches.write_series(root / "series", exported)
    pinmod.save(new_pin, root / "pin.toml")
    state = {"old_version": pin.version, "version": rel.version,
             "old_base": gitutil.rev_parse(up.repo, upstream.PARENT_REF)}  # fmt: skip
    label = (
        f"`series/` on sglang {rel.version} (commit `{rel.commit[:12]}`, from `series/next/{rel.version}/`)"
    )
    md = _markdown(state, rd, label, reasons)
    message = _after_move(root, state, pin, new_pin, len(exported), rd, md, dropped, _hand_merged_text(rd, reasons))
    return Outcome(
        None, f"fast-forward: series/next/{rel.version}/ was carried from today's series/\n" + message
    )
