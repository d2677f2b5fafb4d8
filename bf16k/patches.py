"""Apply, export, check and inspect the series against upstream.

The patch commits in the upstream repository are the source of truth; ``series/*.patch`` is their
byte-deterministic export. ``refs/patches/upstream-head`` records the base, so the patches are
always ``upstream-head..HEAD`` and recovery is always "reset to base, re-apply".
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import gitutil, series, upstream
from bf16k.errors import ToolError
from bf16k.pin import Pin
from bf16k.pin import save as save_pin
from bf16k.project import SUBMODULE_PATH, Target

FORMAT_PATCH_FLAGS = (
    "format-patch",
    "--stdout",
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--no-stat",
    "--keep-subject",
    "--no-numbered",
    "--no-notes",
    "--encoding=UTF-8",
    "-U3",
)
SAVED_PREFIX = "refs/bf16k/saved"
BRANCH = "bf16k/series"


# --------------------------------------------------------------------------- git am


@dataclass
class AmFailure:
    index: int  # 0-based position in the series
    name: str
    files: list[str]
    detail: str


def mbox(series_dir: Path, names: list[str]) -> bytes:
    parts = []
    for name in names:
        data = (series_dir / name).read_bytes()
        parts.append(data if data.endswith(b"\n") else data + b"\n")
    return b"".join(parts)


def am_in_progress(repo: Path) -> bool:
    return (upstream.git_dir(repo) / "rebase-apply").exists()


def run_am(repo: Path, data: bytes, names: list[str], offset: int = 0) -> AmFailure | None:
    """`git am -3` the mbox; on failure describe the stopping patch and leave the am in progress."""
    if not names:
        return None
    proc = gitutil.git(
        ["am", "-3", "--keep", "--keep-cr", "--committer-date-is-author-date", "--quiet"],
        repo,
        check=False,
        input_bytes=data,
    )
    if proc.returncode == 0:
        return None
    return describe_am_stop(repo, names, proc.stdout + proc.stderr, offset)


def describe_am_stop(repo: Path, names: list[str], output: bytes, offset: int = 0) -> AmFailure:
    nxt = upstream.git_dir(repo) / "rebase-apply" / "next"
    index = int(nxt.read_text().strip()) - 1 if nxt.exists() else 0
    name = names[index] if 0 <= index < len(names) else "?"
    text = output.decode(errors="replace")
    files = gitutil.out(["diff", "--name-only", "--diff-filter=U"], repo).splitlines()
    for line in text.splitlines():
        for marker in (
            "error: patch failed: ",
            "Merge conflict in ",
            "error: ",
            "CONFLICT (modify/delete): ",
        ):
            if marker in line:
                rest = line.split(marker, 1)[1]
                cand = rest.split(":", 1)[0].split(" ", 1)[0]
                if cand.startswith("python/") and cand not in files:
                    files.append(cand)
    return AmFailure(offset + index, name, files, text.strip())


def abort_am(repo: Path) -> None:
    if am_in_progress(repo):
        gitutil.git(["am", "--abort"], repo, check=False)


# --------------------------------------------------------------------------- protecting work


def save_work(repo: Path, state: dict[str, str], base: str) -> list[str]:
    """Save uncommitted edits and commits nobody exported to refs; return messages."""
    notes = []
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    head_ok = gitutil.git(["rev-parse", "--verify", "-q", "HEAD"], repo, check=False).returncode == 0
    head = gitutil.rev_parse(repo, "HEAD") if head_ok else ""
    if head and head not in (base, state.get("head", "")):
        ref = f"{SAVED_PREFIX}/{stamp}/head"
        gitutil.git(["update-ref", ref, head], repo)
        notes.append(
            f"saved commits that were not from the last apply: {ref} ({head[:12]}); "
            f"inspect with `git -C {repo} log {ref}`"
        )
    if gitutil.dirty_paths(repo):
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if head:
                gitutil.git(["read-tree", head], repo, env=env)
            gitutil.git(["add", "-A"], repo, env=env)
            tree = gitutil.out(["write-tree"], repo, env=env)
        args = ["commit-tree", tree, "-m", "bf16k: uncommitted work saved before apply"]
        if head:
            args[2:2] = ["-p", head]
        commit = gitutil.out(args, repo)
        ref = f"{SAVED_PREFIX}/{stamp}/worktree"
        gitutil.git(["update-ref", ref, commit], repo)
        notes.append(
            f"saved uncommitted changes in {repo.name} to {ref}; see `git -C {repo} show --stat {ref}`, "
            f"restore with `git -C {repo} checkout {ref} -- .`"
        )
    return notes


def reset_to(repo: Path, base: str) -> None:
    gitutil.git(["checkout", "-q", "-f", "-B", BRANCH, base], repo)
    gitutil.git(["clean", "-q", "-fd"], repo)
    gitutil.git(["update-ref", upstream.BASE_REF, base], repo)


# --------------------------------------------------------------------------- apply


def protect_superproject_gitlink(t: Target) -> None:
    """Keep `git add -A` / `commit -a` in the product repo from recording a patched gitlink.

    After apply the submodule sits on patch commits that exist nowhere upstream; skip-worktree on
    the gitlink's index entry (a local flag) makes git treat it as unchanged.
    """
    if t.carried:
        return
    listed = gitutil.git(["ls-files", "--stage", "--", SUBMODULE_PATH], t.root, check=False)
    if listed.returncode == 0 and listed.stdout.startswith(b"160000"):
        gitutil.git(["update-index", "--skip-worktree", "--", SUBMODULE_PATH], t.root, check=False)


def apply(
    t: Target,
    *,
    source: str = "auto",
    wheel_file: Path | None = None,
    stop_if_dirty: bool = False,
) -> upstream.Upstream:
    problems = series.hygiene(t.series_dir)
    if problems:
        raise ToolError("series hygiene:\n  " + "\n  ".join(problems))
    up = upstream.obtain(t, source=source, wheel_file=wheel_file)
    repo = up.repo
    names = series.read_order(t.series_dir)
    shash = series.series_hash(t.series_dir)
    state = upstream.read_state(repo)
    if am_in_progress(repo):
        raise ToolError(
            f"a `git am` is in progress in {repo} (a rebase or an interrupted apply): finish it "
            f"(`nox -s rebase -- --continue` / `--abort`) or run `git -C {repo} am --abort`"
        )
    head = (
        gitutil.out(["rev-parse", "--verify", "-q", "HEAD"], repo)
        if gitutil.git(["rev-parse", "--verify", "-q", "HEAD"], repo, check=False).returncode == 0
        else ""
    )
    dirty = gitutil.dirty_paths(repo)
    if (
        state.get("series_hash") == shash
        and state.get("head") == head
        and state.get("base") == up.base
        and not dirty
    ):
        print(f"series already applied ({len(names)} patches, series {shash[:12]}): nothing to do")
        protect_superproject_gitlink(t)
        return up
    if dirty and stop_if_dirty:
        raise ToolError(
            f"{repo} has uncommitted changes ({len(dirty)} path{'' if len(dirty) == 1 else 's'}, e.g. {dirty[0][3:]}); "
            "commit and export them, or run apply without --stop-if-dirty to save them to a ref"
        )
    saved = save_work(repo, state, up.base)
    for note in saved:
        print(note)
    reset_to(repo, up.base)
    failure = run_am(repo, mbox(t.series_dir, names), names)
    if failure:
        abort_am(repo)
        reset_to(repo, up.base)
        state.update({"series_hash": "", "head": up.base})
        upstream.write_state(repo, state)
        raise ToolError(apply_failure_message(failure, up, t, saved))
    head = gitutil.rev_parse(repo, "HEAD")
    state.update({"series_hash": shash, "head": head, "base": up.base})
    upstream.write_state(repo, state)
    protect_superproject_gitlink(t)
    print(f"applied {len(names)} patches on {up.base[:12]} -> {head[:12]} (series {shash[:12]})")
    return up


# git's advice after a stop ("run git am --continue / --skip / --abort", "hint: ...") is wrong
# once the tool has aborted the am (apply resets the tree; the other callers drop a scratch
# clone), so messages leave it out and say what to do instead.
_GIT_AM_ADVICE = ("git am --", "hint: ")


def conflict_message(f: AmFailure, up: upstream.Upstream, action: str) -> str:
    files = ", ".join(f.files) or "(see git's output below)"
    said = [line for line in f.detail.splitlines() if not any(a in line for a in _GIT_AM_ADVICE)]
    return (
        f"{action}: patch {f.index + 1} '{f.name}' does not apply on {up.source} base {up.base[:12]}\n"
        f"  files: {files}\n  git said:\n    " + "\n    ".join(said[-12:])
    )


def apply_failure_message(f: AmFailure, up: upstream.Upstream, t: Target, saved: list[str]) -> str:
    """A stopped apply: where the tree is now (apply has reset it) and the command to run next."""
    repo = os.path.relpath(up.repo, t.root)
    patch = os.path.relpath(t.series_dir / f.name, t.root)
    series_from_repo = os.path.relpath(t.series_dir, up.repo)
    option = f" -- --upstream {t.version}" if t.carried else ""
    held = ("its earlier work is saved: " + "; ".join(saved)) if saved else "it held no unsaved work"
    return conflict_message(f, up, "apply") + (
        f"\n  now: {repo}/ is back at the bare base {up.base[:12]} (branch {BRANCH}, no patch applied, "
        f"no `git am` in progress); {held}"
        f"\n  next: repair {patch} and run `nox -s apply{option}` again; or have git mark the conflict "
        f"in the files: `cd {repo} && git am -3 --keep $(sed 's|^|{series_from_repo}/|' "
        f"{series_from_repo}/series)`, resolve, `git am --continue` until all are in, then "
        f"`cd {os.path.relpath(t.root, up.repo)} && nox -s export{option}`"
    )


# --------------------------------------------------------------------------- export


def _with_filename_trailer(raw: bytes, name: str) -> bytes:
    head, rest = series.split_message(raw)
    last = head.rstrip(b"\n").rsplit(b"\n", 1)[-1].decode(errors="replace")
    joiner = b"\n" if series.TRAILER.match(last) else b"\n\n"
    return head.rstrip(b"\n") + joiner + f"Patch-Filename: {name}".encode() + b"\n\n" + rest


def export_commits(repo: Path, base: str, head: str = "HEAD") -> list[tuple[str, bytes]]:
    """(file name, bytes) of every commit in base..head, deterministic."""
    if gitutil.out(["rev-list", "--merges", f"{base}..{head}"], repo):
        raise ToolError("the patch commits contain a merge; the series must be linear")
    commits = gitutil.out(["rev-list", "--reverse", f"{base}..{head}"], repo).split()
    result: list[tuple[str, bytes]] = []
    used: set[str] = set()
    for commit in commits:
        raw = gitutil.git([*FORMAT_PATCH_FLAGS, "-1", commit], repo).stdout
        message = gitutil.out(["log", "-1", "--format=%B", commit], repo)
        name = ""
        for line in message.splitlines():
            if line.startswith("Patch-Filename:"):
                name = line.split(":", 1)[1].strip()
        if not name:
            subject = gitutil.out(["log", "-1", "--format=%s", commit], repo)
            name = series.slug(subject)
            stem, n = name[: -len(".patch")], 2
            while name in used:
                name, n = f"{stem}-{n}.patch", n + 1
            raw = _with_filename_trailer(raw, name)
        if name in used:
            raise ToolError(f"two patch commits claim the file name {name}")
        used.add(name)
        result.append((name, raw))
    return result


def write_series(series_dir: Path, patches: list[tuple[str, bytes]]) -> list[str]:
    """Rewrite series_dir from patches; return the names of deleted patch files."""
    series_dir.mkdir(parents=True, exist_ok=True)
    keep = {name for name, _ in patches}
    removed = []
    for path in series_dir.glob("*.patch"):
        if path.name not in keep:
            path.unlink()
            removed.append(path.name)
    for name, data in patches:
        path = series_dir / name
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
    series.write_order(series_dir, [name for name, _ in patches])
    return sorted(removed)


def fingerprint_for(series_dir: Path, repo: Path, base: str) -> dict[str, str]:
    touched, _ = series.touched_files(series_dir)
    return upstream.blob_ids(repo, base, touched)


def export(t: Target, *, force: bool = False) -> None:
    pin = t.load_pin()
    repo = t.upstream_dir
    if not gitutil.is_repo(repo):
        raise ToolError(f"{repo} is not set up: run `nox -s apply` first")
    state = upstream.read_state(repo)
    base = (
        gitutil.out(["rev-parse", "--verify", "-q", upstream.BASE_REF], repo)
        if gitutil.git(["rev-parse", "--verify", "-q", upstream.BASE_REF], repo, check=False).returncode == 0
        else ""
    )
    if not base:
        raise ToolError(f"{repo} has no {upstream.BASE_REF}: run `nox -s apply` first")
    if am_in_progress(repo):
        raise ToolError(f"a `git am` is in progress in {repo}: finish or abort it before exporting")
    current = series.series_hash(t.series_dir) if (t.series_dir / series.SERIES_FILE).exists() else ""
    if not force and state.get("series_hash") and current and current != state["series_hash"]:
        raise ToolError(
            f"{t.series_dir} changed since it was applied (series {current[:12]} vs applied "
            f"{state['series_hash'][:12]}): exporting would overwrite those changes. Run "
            "`nox -s apply` first, or `nox -s export -- --force` to keep the commits' version."
        )
    dirty = [line for line in gitutil.dirty_paths(repo)]
    if dirty:
        n = len(dirty)
        print(
            f"note: {n} uncommitted {'path' if n == 1 else 'paths'} in {repo.name} {'is' if n == 1 else 'are'} "
            "not exported (commit them first)"
        )
    patches = export_commits(repo, base)
    removed = write_series(t.series_dir, patches)
    pin.fingerprint = fingerprint_for(t.series_dir, repo, base)
    assert pin.path is not None
    save_pin(pin, pin.path)
    state["series_hash"] = series.series_hash(t.series_dir)
    state["head"] = gitutil.rev_parse(repo, "HEAD")
    upstream.write_state(repo, state)
    print(
        f"exported {len(patches)} patches to {t.series_dir}"
        + (f"; removed {', '.join(removed)}" if removed else "")
    )


# --------------------------------------------------------------------------- scratch clones, check


@contextmanager
def scratch_clone(up: upstream.Upstream) -> Iterator[Path]:
    """A throw-away clone of the upstream repo checked out at its base (objects shared)."""
    tmp = Path(tempfile.mkdtemp(prefix="bf16k-scratch-"))
    try:
        repo = tmp / "upstream"
        gitutil.git(["clone", "-q", "--shared", "--no-checkout", str(up.repo), str(repo)], tmp)
        gitutil.git(["checkout", "-q", "-f", "-B", BRANCH, up.base], repo)
        gitutil.git(["update-ref", upstream.BASE_REF, up.base], repo)
        yield repo
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class CheckReport:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_gitlink(t: Target, pin: Pin) -> list[str]:
    if t.carried:
        return []
    problems = []
    listed = gitutil.git(["ls-tree", "HEAD", "--", SUBMODULE_PATH], t.root, check=False)
    if listed.returncode != 0:
        return ["the product repository has no commit yet: cannot check the gitlink"]
    entry = listed.stdout.decode().strip()
    want = f"160000 commit {pin.commit}\t{SUBMODULE_PATH}"
    if entry != want:
        problems.append(f"committed gitlink is {entry or 'missing'!r}, expected {want!r} (the pin)")
    modules = t.root / ".gitmodules"
    if not modules.is_file():
        problems.append(".gitmodules is missing")
    else:
        url = (
            gitutil.git(
                ["config", "-f", ".gitmodules", f"submodule.{SUBMODULE_PATH}.url"], t.root, check=False
            )
            .stdout.decode()
            .strip()
        )
        if url != pin.repository:
            problems.append(f".gitmodules url for {SUBMODULE_PATH} is {url!r}, pin says {pin.repository!r}")
    return problems


def check(t: Target, *, source: str = "auto", wheel_file: Path | None = None) -> CheckReport:
    report = CheckReport()
    pin = t.load_pin()
    report.problems += series.hygiene(t.series_dir)
    names = series.read_order(t.series_dir)
    created: set[str] = set()  # out-of-wheel files earlier patches added
    for name in names:
        path = t.series_dir / name
        if path.is_file():
            try:
                info = series.parse_patch(path)
                report.problems += series.lint(info, created)
                created |= {f for f in info.new_files if series.outside_wheel(f)}
            except ToolError as exc:
                report.problems.append(str(exc))
    report.problems += check_gitlink(t, pin)
    if report.problems:
        return report  # applying a malformed series would only add noise
    up = upstream.obtain(t, source=source, wheel_file=wheel_file, quiet=True)
    report.notes.append(f"upstream {pin.version} from the {up.source} ({up.detail}), base {up.base[:12]}")
    with scratch_clone(up) as repo:
        failure = run_am(repo, mbox(t.series_dir, names), names)
        if failure:
            report.problems.append(conflict_message(failure, up, "check"))
            return report
        exported = dict(export_commits(repo, up.base))
        for name in names:
            if name not in exported:
                report.problems.append(f"{name}: not reproduced by export (commit lost or renamed)")
            elif exported[name] != (t.series_dir / name).read_bytes():
                report.problems.append(
                    f"{name}: export differs from the file (run `nox -s export` and commit)"
                )
        for name in exported:
            if name not in names:
                report.problems.append(f"{name}: export produced a patch the series does not list")
        fingerprint = fingerprint_for(t.series_dir, repo, up.base)
        if fingerprint != pin.fingerprint:
            stale = sorted(set(fingerprint.items()) ^ set(pin.fingerprint.items()))
            report.problems.append(
                "pin fingerprint does not match the files the series touches (run `nox -s export`): "
                + ", ".join(sorted({p for p, _ in stale}))
            )
    where = "the pin" if not t.carried else f"sglang {pin.version} (the carried release)"
    report.notes.append(f"{len(names)} patches apply on {where} and export byte-identically")
    return report


# --------------------------------------------------------------------------- status


def status(t: Target) -> list[str]:
    pin = t.load_pin()
    repo = t.upstream_dir
    lines = [
        f"{t.label} {pin.version} ({pin.tag or 'no tag'}), series in {t.series_dir.relative_to(t.root)}/"
    ]
    names = series.read_order(t.series_dir)
    current = series.series_hash(t.series_dir)
    lines.append(f"series: {len(names)} patches, hash {current[:12]}")
    if not gitutil.is_repo(repo):
        lines.append(f"upstream: not set up at {repo} (run `nox -s apply`)")
        return lines + _carry_lines(t)
    state = upstream.read_state(repo)
    base_proc = gitutil.git(["rev-parse", "--verify", "-q", upstream.BASE_REF], repo, check=False)
    base = base_proc.stdout.decode().strip() if base_proc.returncode == 0 else ""
    lines.append(f"upstream: {repo} from the {state.get('source', '?')}, base {base[:12] or '?'}")
    if am_in_progress(repo):
        lines.append("state: a `git am` is in progress (rebase or interrupted apply)")
    if not base:
        return lines + _carry_lines(t)
    commits = gitutil.out(["log", "--reverse", "--format=%h %s", f"{base}..HEAD"], repo).splitlines()
    lines.append(f"applied: {len(commits)} patch commits on the base")
    lines += [f"  {c}" for c in commits]
    if state.get("series_hash") == current:
        lines.append("series/ is what was last applied")
    else:
        lines.append(
            f"series/ changed since the last apply (applied {state.get('series_hash', '')[:12] or 'none'})"
        )
    exported = dict(export_commits(repo, base))
    drift = [n for n in names if exported.get(n) != (t.series_dir / n).read_bytes()]
    drift += [n for n in exported if n not in names]
    lines.append(
        "drift: none (commits export to series/ byte for byte)"
        if not drift
        else "drift: commits differ from series/ for " + ", ".join(drift) + " (export or apply)"
    )
    dirty = gitutil.dirty_paths(repo)
    n = len(dirty)
    lines.append(
        f"uncommitted: {n} {'path' if n == 1 else 'paths'}" + (f", e.g. {dirty[0][3:]}" if dirty else "")
    )
    saved = gitutil.out(["for-each-ref", "--format=%(refname)", SAVED_PREFIX], repo).splitlines()
    if saved:
        lines.append(f"saved work refs: {len(saved)} (latest {saved[-1]})")
    return lines + _carry_lines(t)


def _carry_lines(t: Target) -> list[str]:
    """A stopped carry and the carried series, whichever release `status` was asked about."""
    from bf16k.carry import status  # late: status is the only user here

    return status.in_progress_lines(t.root) + status.carried_lines(t.root)
