"""`rebase` and `rebase-check`: carry the series to a newer upstream release.

How a carry works (Electron's roll procedure, with `git am -3` instead of quilt):

- The carry happens in the target's own tree, ``build/upstream/<version>`` (``Target(root,
  version).upstream_dir``); ``sglang-upstream/``, ``series/`` and ``pin.toml`` are not touched
  until the carry has succeeded, so ``--abort`` only has that tree to restore.
- The old base is the pinned wheel import (the same deterministic commit everywhere). A release
  from PyPI is imported as a *child* of it (``upstream.cached_import`` with a parent), so the
  target's base descends from the old one: 3-way merges and range-diff see exactly the release's
  change, and ``apply --upstream <version>`` later rebuilds the same commit id (recorded in the
  carried pin, the parent in ``carried.toml``). A git-ref target is the real upstream commit.
- The series is applied once on the old base (the "before" for range-diff), rerere is cleared
  (a stale recorded resolution would be replayed silently), then ``git am -3`` carries it.
- A stop leaves git's own ``rebase-apply`` state plus ``bf16k-rebase.json`` (in the tree's git
  dir); ``--continue``, ``--skip`` and ``--abort`` read it from there.
- After success the carried commits are exported byte-deterministically. With a known upstream
  commit the pin moves and they become ``series/``; otherwise they go to ``series/next/<version>/``
  with a pin whose ``commit`` is empty. A commit id is never guessed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bf16k import gitutil, patches, project, rangediff, series, upstream
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.pin import Pin, WheelPin
from bf16k.project import SUBMODULE_PATH, Target, cache_dir

STATE_FILE = "bf16k-rebase.json"  # in the carried tree's git dir while a rebase is stopped
OLD_BASE_REF = "refs/bf16k/rebase/old-base"
OLD_TIP_REF = "refs/bf16k/rebase/old-tip"
NEW_BASE_REF = "refs/bf16k/rebase/new-base"
WHEEL_BASE_REF = "refs/bf16k/rebase/wheel-base"
DSV4_MODEL = "sglang/srt/models/deepseek_v4.py"  # a release without it cannot carry the series
AM_RESUME_FLAGS = ("--committer-date-is-author-date", "--quiet")
_RELEASE = re.compile(r"^\d+(\.\d+)+(\.post\d+)?$")  # final releases only (no a/b/rc/dev/local)
_TAG = re.compile(r"^(?:refs/tags/)?v?(\d+(?:\.\d+)+(?:\.post\d+)?)$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_CONFLICT_START = "<<<<<<< "
_CONFLICT_END = ">>>>>>> "


# --------------------------------------------------------------------------- releases and wheels


@dataclass
class Release:
    """The upstream a carry goes to."""

    version: str
    tag: str
    kind: str  # "wheel" (PyPI release) or "ref" (git ref, needs the network)
    ref: str  # the git ref asked for; "" for a wheel
    commit: str  # upstream commit when known (given or fetched); "" otherwise


def release_key(version: str) -> tuple[int, ...]:
    return rangediff.version_key(version)


def resolve_target(pin: Pin, target: str, version: str | None, commit: str | None) -> Release:
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
    if release_key(rel.version) < release_key(pin.version):
        raise ToolError(
            f"{rel.version} is older than the pinned {pin.version}: carrying backwards is not supported"
        )
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
    keep = {v for v in versions if _RELEASE.match(v) and release_key(v) > release_key(pin.version)}
    return sorted(keep, key=release_key)


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


def describe_stop(repo: Path, names: list[str], output: bytes) -> Stop:
    fail = patches.describe_am_stop(repo, names, output)
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
    lines.append(f"  files (in {where}):")
    lines += [f"    {f}" for f in stop.files] or ["    (none named; see git's output below)"]
    if stop.hunks:
        lines.append("  conflict hunks:")
        lines += [f"    {where}/{p}:{n}" for p, n in stop.hunks]
    no_markers = [f for f in stop.files if f not in {p for p, _ in stop.hunks}]
    if no_markers and stop.hunks:
        lines.append(
            "  without markers (delete/rename or a file that could not be merged): " + ", ".join(no_markers)
        )
    if not stop.hunks:
        lines.append("  git said:")
        lines += [f"    {line}" for line in stop.detail.splitlines()[-8:]]
    lines += [
        "next:",
        f"  1. resolve by intent: see what {version} changed there with",
        f"     git -C {where} diff {OLD_BASE_REF} {NEW_BASE_REF} -- {' '.join(stop.files)}",
        "     and edit the files until no conflict markers remain",
        "  2. nox -s rebase -- --continue    (stages your edits to tracked files, carries the rest)",
        "  or give up and restore everything as it was: nox -s rebase -- --abort",
        f"  (--skip is refused unless sglang {version} already contains this patch's change)",
    ]
    return "\n".join(line for line in lines if line)


# --------------------------------------------------------------------------- "upstream contains it"


@dataclass
class _FileDiff:
    path: str
    deleted: bool = False
    plus_runs: list[list[str]] = field(default_factory=list)
    minus_runs: list[list[str]] = field(default_factory=list)


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def parse_diff(diff: str) -> list[_FileDiff]:
    """Per file of a unified git diff: runs of consecutive added and removed lines."""
    files: list[_FileDiff] = []
    old_left = new_left = 0
    run: list[str] | None = None
    run_kind = ""
    for line in diff.split("\n"):
        if old_left > 0 or new_left > 0:
            kind = line[:1]
            if kind == "\\":
                continue
            if kind != run_kind or run is None:
                run_kind = kind
                run = []
                if kind == "+":
                    files[-1].plus_runs.append(run)
                elif kind == "-":
                    files[-1].minus_runs.append(run)
            if kind in ("+", "-"):
                run.append(line[1:])
            old_left -= 1 if kind in (" ", "-", "") else 0
            new_left -= 1 if kind in (" ", "+", "") else 0
            continue
        run, run_kind = None, ""
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(\S+) b/(\S+)", line)
            files.append(_FileDiff(m.group(2) if m else line))
        elif line.startswith("deleted file mode") and files:
            files[-1].deleted = True
        elif line.startswith("@@ ") and files:
            m = _HUNK.match(line)
            if m:
                old_left = int(m.group(1)) if m.group(1) is not None else 1
                new_left = int(m.group(2)) if m.group(2) is not None else 1
    return files


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
    for fd in parse_diff(diff):
        proc = gitutil.git(["cat-file", "-p", f"{base}:{fd.path}"], repo, check=False)
        exists = proc.returncode == 0
        if fd.deleted:
            if exists:
                return False, f"{fd.path} still exists upstream (the patch deletes it)"
            continue
        if not exists:
            return False, f"{fd.path} does not exist upstream"
        lines = proc.stdout.decode("utf-8", errors="replace").split("\n")
        for run in fd.plus_runs:
            if not _has_run(lines, run):
                return False, f"{fd.path}: the added line {run[0].strip()!r} is not upstream"
        for run in fd.minus_runs:
            if any(line.strip() for line in run) and _has_run(lines, run):
                return False, f"{fd.path}: the removed line {run[0].strip()!r} is still upstream"
    return True, ""


# --------------------------------------------------------------------------- state


def state_path(repo: Path) -> Path:
    return upstream.git_dir(repo) / STATE_FILE


def find_in_progress(root: Path) -> Path | None:
    """The carried tree holding a stopped rebase, if any (one at a time)."""
    trees = root / "build" / "upstream"
    if not trees.is_dir():
        return None
    for repo in sorted(trees.iterdir()):
        if (repo / ".git" / STATE_FILE).is_file():
            return repo
    return None


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


# --------------------------------------------------------------------------- starting


@dataclass
class Outcome:
    stop: Stop | None
    message: str


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


def start(
    root: Path,
    target: str,
    *,
    commit: str | None = None,
    version: str | None = None,
    wheel_file: Path | None = None,
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
    rel = resolve_target(pin, target, version, commit)
    if rel.kind == "wheel" and rel.commit and carried_is_current(root, pin, rel.version):
        return promote(root, pin, rel)
    repo = Target(root, rel.version).upstream_dir
    state: dict[str, Any] = _prepare_tree(repo)
    try:
        state.update(_build_bases(root, repo, pin, rel, wheel_file))
        upstream.verify_fingerprint(upstream.Upstream(repo, state["old_base"], "wheel", "pinned import"), pin)
        old_tip = _apply_old_series(repo, state["old_base"], series_dir, names)
    except BaseException:
        _restore_tree(repo, state)  # nothing of a failed start is left behind
        raise
    gitutil.git(["update-ref", OLD_TIP_REF, old_tip], repo)
    gitutil.git(["update-ref", NEW_BASE_REF, state["new_base"]], repo)
    cleared = clear_rerere(repo)
    state.update({
        "version": rel.version, "tag": rel.tag, "kind": rel.kind, "ref": rel.ref, "commit": rel.commit,
        "names": names, "old_version": pin.version, "old_series_hash": series.series_hash(series_dir),
        "old_tip": old_tip, "dropped": {},
    })  # fmt: skip
    patches.reset_to(repo, state["new_base"])
    save_state(repo, state)
    upstream.write_state(repo, {"source": "wheel" if rel.kind == "wheel" else "submodule",
                                "base": state["new_base"], "version": rel.version})  # fmt: skip
    intro = list(state["notes"]) + ([f"cleared {cleared} recorded rerere resolution(s)"] if cleared else [])
    print(
        "\n".join(intro + [f"carrying {len(names)} patch(es) from {pin.version} to {state['source_detail']}"])
    )
    failure = patches.run_am(repo, patches.mbox(series_dir, names), names)
    if failure:
        stop = describe_stop(repo, names, failure.detail.encode())
        return Outcome(stop, stop_message(root, repo, state, stop))
    return finish(root, repo, state)


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


# --------------------------------------------------------------------------- continue / skip / abort


def resume(root: Path, *, skip: bool = False) -> Outcome:
    repo, state = load_state(root)
    names = state["names"]
    if patches.am_in_progress(repo):
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
                    "conflict markers remain, resolve them first:\n"
                    + "\n".join(f"  {where}/{p}:{n}" for p, n in left)
                )
            # Edits to tracked files belong to the stopped patch (a resolution may need a fix
            # elsewhere); new files must be `git add`ed by hand, so editor litter stays out.
            resolved = unmerged(repo)
            gitutil.git(["add", "-u"], repo)
            if resolved:
                gitutil.git(["add", "-A", "--", *resolved], repo)
            proc = gitutil.git(["am", "--continue", *AM_RESUME_FLAGS], repo, check=False)
        if patches.am_in_progress(repo):
            stop = describe_stop(repo, names, proc.stdout + proc.stderr)
            return Outcome(stop, stop_message(root, repo, state, stop))
        if proc.returncode != 0:
            raise ToolError("git am failed:\n" + (proc.stdout + proc.stderr).decode(errors="replace").strip())
    return finish(root, repo, state)


def _skip_checked(repo: Path, state: dict[str, Any]) -> str:
    """The current patch's name if it may be skipped; else refuse (never skip-and-recreate)."""
    nxt = upstream.git_dir(repo) / "rebase-apply" / "next"
    index = int(nxt.read_text().strip()) - 1
    name = str(state["names"][index])
    version = state["version"]
    diff = (upstream.git_dir(repo) / "rebase-apply" / "patch").read_text(errors="replace")
    touched = [fd.path for fd in parse_diff(diff)]
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


def finish(root: Path, repo: Path, state: dict[str, Any]) -> Outcome:
    """Export the carried commits; write series/next/<v> or move the pin; record the range-diff."""
    if patches.am_in_progress(repo):
        raise ToolError(f"a `git am` is still in progress in {repo}")
    version, new_base = state["version"], state["new_base"]
    exported = patches.export_commits(repo, new_base)
    carried = {name for name, _ in exported}
    dropped: dict[str, str] = dict(state["dropped"])
    for name in state["names"]:
        if name in carried or name in dropped:
            continue
        # git am drops a patch by itself when its 3-way merge changes nothing.
        ok, why = upstream_contains(repo, new_base, _diff_of(root / "series" / name))
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
    pin = pinmod.load(root / "pin.toml")
    if state["commit"]:
        message = _move_pin(root, repo, state, pin, exported, rd, dropped)
    else:
        message = _write_carried(root, repo, state, pin, exported, rd, dropped)
    state_path(repo).unlink(missing_ok=True)
    if left:
        where = _rel(root, repo)
        message += f"\nnote: {len(left)} uncommitted path(s) in {where} were not carried (e.g. {left[0][3:]})"
    return Outcome(None, message)


def _title(state: dict[str, Any]) -> str:
    return f"Range-diff: series on sglang {state['old_version']} → {state['version']}"


def _markdown(state: dict[str, Any], rd: rangediff.RangeDiff, new_label: str) -> str:
    old = f"`series/` on sglang {state['old_version']} (base `{state['old_base'][:12]}`)"
    return rangediff.to_markdown(rd, _title(state), old, new_label)


def carried_toml(pin: Pin, from_series: str, dropped: dict[str, str]) -> str:
    q = pinmod._q
    lines = [
        "# How this carried series was made (written by `bf16k rebase`, read by `apply --upstream`).",
        "# The base commit in pin.toml is the release's wheel imported as a child of [parent]'s import,",
        "# so rebuilding it needs that parent even after the pin has moved on.",
        "[parent]",
        f"version = {q(pin.version)}",
        f"tag = {q(pin.tag)}",
        f"filename = {q(pin.wheel.filename)}",
        f"sha256 = {q(pin.wheel.sha256)}",
        f"base_commit = {q(pin.wheel.base_commit)}",
        "",
        "[carried]",
        "# series hash of the series/ it was carried from: `rebase --commit` promotes it only if unchanged",
        f"from_series = {q(from_series)}",
        "",
        "# patches left out because the release already contains them (name = release)",
        "[dropped]",
    ]
    lines += [f"{q(name)} = {q(v)}" for name, v in sorted(dropped.items())]
    return "\n".join(lines) + "\n"


def _write_carried(
    root: Path,
    repo: Path,
    state: dict[str, Any],
    pin: Pin,
    exported: list[tuple[str, bytes]],
    rd: rangediff.RangeDiff,
    dropped: dict[str, str],
) -> str:
    version, new_base = state["version"], state["new_base"]
    dest = Target(root, version).series_dir
    wheel = Path(state["wheel"])
    patches.write_series(dest, exported)
    cpin = release_pin(pin, Release(version, state["tag"], "wheel", "", ""), wheel, new_base)
    cpin.fingerprint = patches.fingerprint_for(dest, repo, new_base)
    pinmod.save(cpin, dest / "pin.toml")
    (dest / upstream.CARRIED_FILE).write_text(carried_toml(pin, state["old_series_hash"], dropped))
    label = (
        f"`series/next/{version}/` on sglang {version} (PyPI wheel `{wheel.name}`, base `{new_base[:12]}`)"
    )
    (dest / "range-diff.md").write_text(_markdown(state, rd, label))
    shash = series.series_hash(dest)
    upstream.write_state(repo, {"source": "wheel", "base": new_base, "version": version,
                                "series_hash": shash, "head": gitutil.rev_parse(repo, "HEAD")})  # fmt: skip
    entry = (
        f"Carried the series ({len(exported)} patch(es), from series `{state['old_series_hash'][:12]}`) from "
        f"sglang {pin.version} to {version} (PyPI wheel `{wheel.name}`, "
        f"sha256 `{cpin.wheel.sha256[:12]}…`) "
        f"as `series/next/{version}/`; its upstream commit is not known yet, so the pin stays at "
        f"{pin.version}. Range-diff: {rd.summary()}." + _dropped_text(dropped)
    )
    add_changelog(root, entry)
    return "\n".join([
        (f"carried {len(exported)} patch(es) to sglang {version}: {_rel(root, dest)}/ "
         f"(pin.toml with commit = \"\", carried.toml, range-diff.md); the pin stays at {pin.version}"),
        f"range-diff: {rd.summary()}",
        f"work on it: nox -s apply -- --upstream {version}   (tree: {_rel(root, repo)})",
        f"once {version}'s upstream commit is known: nox -s rebase -- {version} --commit <sha>",
    ])  # fmt: skip


def _move_pin(
    root: Path,
    repo: Path,
    state: dict[str, Any],
    pin: Pin,
    exported: list[tuple[str, bytes]],
    rd: rangediff.RangeDiff,
    dropped: dict[str, str],
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
    return _after_move(root, state, pin, new_pin, len(exported), rd, _markdown(state, rd, label), dropped)


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
        f"({count} patch(es)) onto it. Range-diff: {rd.summary()}." + _dropped_text(dropped)
    )
    add_changelog(root, entry)
    return "\n".join([
        f"pin moved to sglang {new.version} ({new.commit}); series/ holds the {count} carried patch(es)",
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


def add_changelog(root: Path, entry: str) -> None:
    """Add a bullet under [Unreleased] / ### Changed (Keep a Changelog), creating what is missing."""
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
    changed = next((i for i in range(start + 1, end) if lines[i].strip() == "### Changed"), None)
    bullet = f"- {entry}"
    if changed is None:
        insert = end
        while insert > start + 1 and not lines[insert - 1].strip():
            insert -= 1
        lines[insert:insert] = ["", "### Changed", bullet]
    else:
        insert = next((i for i in range(changed + 1, end) if lines[i].startswith("### ")), end)
        while insert > changed + 1 and not lines[insert - 1].strip():
            insert -= 1
        lines[insert:insert] = [bullet]
    out = "\n".join(lines)
    path.write_text(out if out.endswith("\n") else out + "\n")


# --------------------------------------------------------------------------- fast-forward


def carried_is_current(root: Path, pin: Pin, version: str) -> bool:
    """series/next/<version> exists and was carried from today's series/ on today's pin."""
    t = Target(root, version)
    if not t.pin_path.is_file():
        return False
    info = upstream.read_carried(t.series_dir)
    parent, carried = info.get("parent", {}), info.get("carried", {})
    return (
        isinstance(parent, dict) and isinstance(carried, dict)
        and parent.get("sha256") == pin.wheel.sha256
        and carried.get("from_series") == series.series_hash(root / "series")
    )  # fmt: skip


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
    cpin = t.load_pin()
    exported = [(n, (t.series_dir / n).read_bytes()) for n in series.read_order(t.series_dir)]
    dropped = {
        str(k): str(v) for k, v in dict(upstream.read_carried(t.series_dir).get("dropped", {})).items()
    }
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
    message = _after_move(root, state, pin, new_pin, len(exported), rd, _markdown(state, rd, label), dropped)
    return Outcome(
        None, f"fast-forward: series/next/{rel.version}/ was carried from today's series/\n" + message
    )


# --------------------------------------------------------------------------- rebase-check


@dataclass
class PatchResult:
    name: str
    status: str  # "clean", "conflict" or "already-upstream"
    where: list[str] = field(default_factory=list)  # file:line of conflicts, or files
    after_skip: bool = False  # an earlier patch of this carry conflicted and was left out


@dataclass
class ReleaseReport:
    version: str
    detail: str
    results: list[PatchResult] = field(default_factory=list)
    rd: rangediff.RangeDiff | None = None

    @property
    def clean(self) -> bool:
        return all(r.status != "conflict" for r in self.results)


def carry_report(repo: Path, names: list[str], data: bytes) -> list[PatchResult]:
    """`git am -3` every patch; on a conflict record it, leave the patch out and go on."""
    conflicts: dict[int, list[str]] = {}
    failure = patches.run_am(repo, data, names)
    while failure is not None:
        found = unmerged(repo)
        conflicts[failure.index] = [
            f"{p}:{n}" for p in found for n in marker_lines(repo / p)
        ] or failure.files
        proc = gitutil.git(["am", "--skip", *AM_RESUME_FLAGS], repo, check=False)
        failure = (
            patches.describe_am_stop(repo, names, proc.stdout + proc.stderr)
            if patches.am_in_progress(repo)
            else None
        )
    made = {rangediff.patch_name(repo, c) for c in rangediff.commits(repo, upstream.BASE_REF, "HEAD")}
    first = min(conflicts) if conflicts else len(names)
    results = []
    for i, name in enumerate(names):
        if i in conflicts:
            results.append(PatchResult(name, "conflict", conflicts[i], i > first))
        else:
            results.append(PatchResult(name, "clean" if name in made else "already-upstream", [], i > first))
    return results


def check_release(
    repo: Path, pin: Pin, version: str, old_base: str, old_tip: str, names: list[str], data: bytes
) -> ReleaseReport:
    wheel = release_wheel(version, pin)
    rel = Release(version, f"v{version}", "wheel", "", "")
    rpin = release_pin(pin, rel, wheel)
    cache, ref, base = upstream.cached_import(rpin, parent=pin, parent_commit=old_base, wheel_file=wheel)
    upstream.fetch_import(repo, cache, ref, f"refs/bf16k/check/{version}")
    patches.reset_to(repo, base)
    report = ReleaseReport(version, f"PyPI wheel {wheel.name}, base {base[:12]}")
    report.results = carry_report(repo, names, data)
    head = gitutil.rev_parse(repo, "HEAD")
    report.rd = rangediff.classify(repo, old_base, old_tip, base, head)
    return report


def rebase_check(root: Path, releases: list[str] | None = None) -> tuple[bool, str]:
    """(ok, markdown report). Never writes inside ``root``: all work happens in a temp folder."""
    pin = pinmod.load(root / "pin.toml")
    series_dir = root / "series"
    names = series.read_order(series_dir)
    versions = newer_releases(pin, releases if releases is not None else index_versions("sglang"))
    lines = [f"# rebase-check: series/ ({len(names)} patches) on sglang {pin.version}", ""]
    ok = True
    with tempfile.TemporaryDirectory(prefix="bf16k-rebase-check-") as tmp:
        repo = Path(tmp) / "carry"
        cache, ref, old_base = upstream.cached_import(pin)
        upstream.fetch_import(repo, cache, ref, OLD_BASE_REF)
        data = patches.mbox(series_dir, names)
        try:
            old_tip = _apply_old_series(repo, old_base, series_dir, names)
        except ToolError as exc:  # `check` fails for this; here it only means nothing can be carried
            lines += [f"Not carried: {exc}", ""]
            versions = []
        else:
            lines += [f"Newer releases checked: {', '.join(versions) or 'none'}.", ""]
        for version in versions:
            try:
                lines += _release_section(repo, pin, version, old_base, old_tip, names, data)
            except ToolError as exc:  # an unreachable or odd new release is a report, not a failure
                lines += [f"## sglang {version}: not checked", "", str(exc), ""]
        lines += ["## Carried series under series/next/", ""]
        carried = rangediff.carried_versions(root)
        for version in carried:
            t = Target(root, version, work=Path(tmp) / "next" / version)
            report = patches.check(t)
            if report.problems:
                ok = False
                lines.append(f"- `series/next/{version}/`: **FAILS**")
                lines += [f"  - {p}" for p in report.problems]
            else:
                lines.append(
                    f"- `series/next/{version}/`: applies on its release and exports byte-identically"
                )
        if not carried:
            lines.append("- none")
    lines += ["", "Result: " + ("OK" if ok else "FAILED (a committed carried series no longer applies)"), ""]
    return ok, "\n".join(lines)


def _release_section(
    repo: Path, pin: Pin, version: str, old_base: str, old_tip: str, names: list[str], data: bytes
) -> list[str]:
    wheel = release_wheel(version, pin)
    if not wheel_has_dsv4(wheel):
        return [f"## sglang {version}", "", f"Skipped: {wheel.name} has no `{DSV4_MODEL}`.", ""]
    report = check_release(repo, pin, version, old_base, old_tip, names, data)
    conflicts = sum(1 for r in report.results if r.status == "conflict")
    verdict = "clean" if report.clean else f"conflict in {conflicts} of {len(names)} patch(es)"
    lines = [f"## sglang {version}: {verdict}", "", f"Upstream: {report.detail}.", ""]
    lines += ["| # | patch | result | where |", "| --- | --- | --- | --- |"]
    for i, r in enumerate(report.results, start=1):
        status = r.status + (" (after leaving out a conflicting patch)" if r.after_skip else "")
        lines.append(f"| {i} | `{r.name}` | {status} | {', '.join(r.where)} |")
    lines.append("")
    if report.rd is not None:
        partial = "" if report.clean else " (conflicting patches left out, so they show as dropped)"
        lines += [f"Range-diff{partial}: {report.rd.summary()}.", ""]
    return lines


# --------------------------------------------------------------------------- CLI


def _root(ns: argparse.Namespace) -> Path:
    return project.find_root(Path(ns.root) if getattr(ns, "root", None) else None)


def cmd_rebase(ns: argparse.Namespace) -> int:
    root = _root(ns)
    if ns.abort:
        print(abort(root))
        return 0
    if ns.cont or ns.skip:
        if ns.target:
            raise ToolError("--continue/--skip take no target: they resume the rebase in progress")
        outcome = resume(root, skip=ns.skip)
    else:
        if not ns.target:
            raise ToolError(
                "give a target: a release (0.5.23) or a git ref (v0.5.23); or --continue/--skip/--abort"
            )
        outcome = start(root, ns.target, commit=ns.commit, version=ns.version, wheel_file=ns.wheel_file)
    print(outcome.message)
    return 1 if outcome.stop else 0


def cmd_rebase_check(ns: argparse.Namespace) -> int:
    ok, text = rebase_check(_root(ns), ns.releases)
    print(text)
    if ns.output:
        Path(ns.output).write_text(text)
    return 0 if ok else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rebase", help="carry the series to another upstream release (or git ref)")
    p.add_argument(
        "target", nargs="?", help="a release on PyPI (0.5.23) or a git ref (v0.5.23; needs the network)"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--continue", dest="cont", action="store_true", help="go on after resolving a conflict")
    mode.add_argument("--abort", action="store_true", help="stop and restore everything as it was")
    mode.add_argument(
        "--skip",
        action="store_true",
        help="drop the stopped patch; only when the release already contains its change",
    )
    p.add_argument(
        "--commit",
        metavar="SHA",
        help="the release's upstream commit: the pin moves and the carried series becomes series/",
    )
    p.add_argument("--version", help="release version of a git-ref target that is not a vX.Y.Z tag")
    p.add_argument("--wheel-file", type=Path, help="use this copy of the target release's wheel")
    p.set_defaults(func=cmd_rebase)

    p = sub.add_parser("rebase-check", help="try carrying the series to each newer release (changes nothing)")
    p.add_argument("--releases", nargs="+", metavar="VERSION", help="releases to try (default: the index's)")
    p.add_argument("--output", metavar="PATH", help="also write the markdown report here")
    p.set_defaults(func=cmd_rebase_check)
