"""The carry itself: :func:`start` it, :func:`advance` until it stops, then :func:`resume`,
:func:`skip` or :func:`abort` the stopped carry.

A carry replays a carried series' resolutions first (a re-carry), carries the rest with
``git am -3``, then hands the carried tree to the gate it was given (the series' tests and the
bisect of every prefix) and finishes. Any step a person is needed for stops it, with the state
saved in the carried tree (:mod:`bf16k.carry.state`) and git's own ``rebase-apply`` there.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from bf16k import absorb, carried, diffs, gitutil, patches, replay, series, upstream
from bf16k import pin as pinmod
from bf16k import reasons as reasonsmod
from bf16k.carry import chains, finish, messages, releases
from bf16k.carry import state as statemod
from bf16k.carry.gate import Gate
from bf16k.carry.messages import Outcome, Stop, plural
from bf16k.carry.state import (
    NEW_BASE_REF,
    OLD_BASE_REF,
    OLD_TIP_REF,
    REPLAY_REF,
    WHEEL_BASE_REF,
    Bases,
    Carry,
    CarryState,
    PendingReplay,
    Phase,
    PriorTree,
    Release,
    StopRecord,
    rel,
)
from bf16k.errors import ToolError
from bf16k.pin import Pin
from bf16k.project import SUBMODULE_PATH, Target
from bf16k.reasons import Hunk, Reason

AM_RESUME_FLAGS = ("--committer-date-is-author-date", "--quiet")
_CONFLICT_START = "<<<<<<< "

# --------------------------------------------------------------------------- the carried tree


def marker_lines(path: Path) -> list[int]:
    """1-based line numbers of each conflict start marker in a worktree file."""
    if not path.is_file():
        return []
    text = path.read_bytes().decode("utf-8", errors="replace")
    return [i for i, line in enumerate(text.split("\n"), start=1) if line.startswith(_CONFLICT_START)]


def unmerged(repo: Path) -> list[str]:
    return sorted(set(gitutil.out(["diff", "--name-only", "--diff-filter=U"], repo).splitlines()))


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


def _prepare_tree(repo: Path) -> PriorTree:
    """Remember how the carried tree looked (for --abort) and save any work in it to refs."""
    if not repo.exists():
        return PriorTree(created=True)
    if not gitutil.is_repo(repo):
        if any(repo.iterdir()):
            raise ToolError(f"{repo} holds files but is not a git repository: move them away first")
        return PriorTree(created=True)
    if patches.am_in_progress(repo):
        raise ToolError(f"a `git am` is in progress in {repo}: finish it or run `git -C {repo} am --abort`")
    pre_state = upstream.read_state(repo)
    head = _rev(repo, "HEAD")
    notes = patches.save_work(repo, pre_state, pre_state.get("base", "")) if head else []
    return PriorTree(False, head, _rev(repo, upstream.BASE_REF), pre_state, notes)


def _restore_tree(repo: Path, prior: PriorTree) -> None:
    """Put the carried tree back as the rebase found it (or remove it if the rebase made it)."""
    if prior.created:
        shutil.rmtree(repo, ignore_errors=True)
        return
    patches.abort_am(repo)
    _delete_rebase_refs(repo)
    if prior.pre_head:
        gitutil.git(["checkout", "-q", "-f", "-B", patches.BRANCH, prior.pre_head], repo)
        gitutil.git(["clean", "-q", "-fd"], repo)
    if prior.pre_base_ref:
        gitutil.git(["update-ref", upstream.BASE_REF, prior.pre_base_ref], repo)
    upstream.write_state(repo, prior.pre_state)
    shutil.rmtree(chains.stashed(repo), ignore_errors=True)
    statemod.state_path(repo).unlink(missing_ok=True)


def _fetch_pinned_commit(root: Path, repo: Path, pin: Pin) -> str:
    """The pinned upstream commit in ``repo``: from the local submodule if it has it, else the remote."""
    sub = root / SUBMODULE_PATH
    source = str(sub) if gitutil.is_repo(sub) and gitutil.has_commit(sub, pin.commit) else pin.repository
    gitutil.git(["fetch", "-q", "--no-tags", source, f"+{pin.commit}:{OLD_BASE_REF}"], repo, timeout=600)
    return gitutil.rev_parse(repo, OLD_BASE_REF)


def _fetch_ref(repo: Path, repository: str, ref: str) -> str:
    proc = gitutil.git(
        ["fetch", "-q", "--no-tags", repository, f"+{ref}:{NEW_BASE_REF}"], repo, check=False, timeout=600
    )
    if proc.returncode != 0:
        raise ToolError(
            f"could not fetch {ref} from {repository} (a git-ref target needs the network):\n"
            + proc.stderr.decode(errors="replace").strip()[-800:]
            + "\nTo carry a PyPI release without GitHub, give its version instead (e.g. 0.5.23)."
        )
    return gitutil.rev_parse(repo, NEW_BASE_REF)


def _build_bases(
    root: Path, repo: Path, pin: Pin, rel_: Release, wheel_file: Path | None
) -> tuple[Bases, Path, str]:
    """Old and new base commits in the carried tree, the release's wheel, and where the new base came from."""
    if rel_.kind == "wheel":
        wheel = releases.release_wheel(rel_.version, pin, wheel_file)
        if not releases.wheel_has_dsv4(wheel):
            raise ToolError(
                f"{wheel.name} has no {releases.DSV4_MODEL}: sglang {rel_.version} cannot carry the series"
            )
        new_pin = releases.release_pin(pin, rel_, wheel)
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
        new_base = _fetch_ref(repo, pin.repository, rel_.ref)
        if rel_.commit and rel_.commit != new_base:
            raise ToolError(f"{rel_.ref} is {new_base} in {pin.repository}, not the --commit {rel_.commit}")
        rel_.commit = new_base
        wheel = releases.release_wheel(rel_.version, pin, wheel_file)
        detail = f"{rel_.ref} = {new_base[:12]} from {pin.repository}"
    return Bases(old_base, new_base), wheel, detail


# --------------------------------------------------------------------------- starting


def start(
    root: Path,
    target: str,
    *,
    gate: Gate,
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
    busy = statemod.find_in_progress(root)
    if busy is not None:
        raise ToolError(
            f"a rebase is already in progress in {rel(root, busy)}: --continue, --skip or --abort it"
        )
    series_dir = root / "series"
    problems = series.hygiene(series_dir)
    if problems:
        raise ToolError("series hygiene:\n  " + "\n  ".join(problems))
    names = series.read_order(series_dir)
    release = releases.resolve_target(pin, target, version, commit, allow_older)
    if release.kind == "wheel" and release.commit and finish.carried_is_current(root, pin, release.version):
        return finish.promote(root, pin, release)
    dest = Target(root, release.version).series_dir
    prev_dir: Path | None = None
    if (dest / "pin.toml").is_file() and not release.commit:
        what = chains.what_would_change(root, release.version)
        if not force:
            raise ToolError(
                f"{what}\nTo re-carry over it: nox -s rebase -- {release.version} --force"
                "   (`nox -s rebase -- --recarry` re-carries every carried release)"
            )
        print(what)
        prev_dir = dest
    if release.kind == "wheel" and wheel_file is None:
        releases.check_release_exists(release.version, pin)
    if release.older:
        print(
            f"warning: sglang {release.version} is older than the pinned {pin.version}: this is a port, not a "
            "carry forward; the series is fitted onto older upstream code, and the pin cannot move there"
        )
    repo = Target(root, release.version).upstream_dir
    prior = _prepare_tree(repo)
    try:
        bases, wheel, detail = _build_bases(root, repo, pin, release, wheel_file)
        upstream.verify_fingerprint(upstream.Upstream(repo, bases.old_base, "wheel", "pinned import"), pin)
        bases.old_tip = chains.apply_old_series(repo, bases.old_base, series_dir, names)
        plan = chains.replay_plan(root, repo, bases, prev_dir, names) if prev_dir is not None else None
    except BaseException:
        _restore_tree(repo, prior)  # nothing of a failed start is left behind
        raise
    gitutil.git(["update-ref", OLD_TIP_REF, bases.old_tip], repo)
    gitutil.git(["update-ref", NEW_BASE_REF, bases.new_base], repo)
    cleared = clear_rerere(repo)
    prev_info = carried.load(prev_dir) if prev_dir is not None else carried.Carried()
    if gitutil.is_repo(root):  # keep the inputs findable for a later re-carry, committed or not
        gitutil.git(["hash-object", "-w", "--", *[f"series/{n}" for n in names]], root, check=False)
    state = CarryState(
        release,
        prior,
        bases,
        str(wheel),
        detail,
        pin.version,
        names,
        series.series_hash(series_dir),
        chains.blobs_now(root, names),
        prev_reasons=list(prev_info.resolutions),
        prev_patches={n: (prev_dir / n).read_text(errors="replace") for n in series.read_order(prev_dir)}
        if prev_dir is not None
        else {},
        phase=Phase.APPLY,
        replay=plan,
        am_offset=plan.count if plan else 0,
        python=python,
        queue=list(queue or []),
        started=time.time(),
    )
    carry = Carry(root, repo, state)
    patches.reset_to(repo, bases.new_base)
    chains.stash_series(repo, series_dir, names)
    carry.save()
    upstream.write_state(
        repo,
        {
            "source": "wheel" if release.kind == "wheel" else "submodule",
            "base": bases.new_base,
            "version": release.version,
        },
    )
    intro = list(prior.notes) + ([f"cleared {cleared} recorded rerere resolution(s)"] if cleared else [])
    intro.append(f"carrying {plural(len(names), 'patch', 'patches')} from {pin.version} to {detail}")
    if plan:
        intro.append(
            f"replaying {plan.source}/ for the first {plural(plan.count, 'patch', 'patches')} "
            "(its resolutions, with series/'s edits since merged in)"
        )
    print("\n".join(intro), flush=True)
    return advance(carry, gate)


# --------------------------------------------------------------------------- carrying


def advance(carry: Carry, gate: Gate) -> Outcome:
    """Carry on from where the state says: replay, `git am` the rest, then the gate, then finish."""
    state = carry.state
    if state.phase == Phase.APPLY:
        out = _replay(carry)
        if out is not None:
            return out
        offset = state.am_offset
        state.phase = Phase.AM
        carry.save()
        rest = state.names[offset:]
        if rest:
            failure = patches.run_am(carry.repo, patches.mbox(chains.stashed(carry.repo), rest), rest, offset)
            if failure:
                return _am_stop(carry, failure.detail.encode())
    state.phase = Phase.TESTS
    carry.save()
    out = gate(carry)
    if out is not None:
        return out
    return finish.finish(carry)


def _save_stop(carry: Carry, kind: str, summary: str, hunks: list[Hunk]) -> None:
    carry.state.stop = StopRecord(kind, summary, gitutil.rev_parse(carry.repo, "HEAD"), hunks)
    carry.save()


def _describe_am_stop(carry: Carry, output: bytes) -> Stop:
    """Where the `git am` in progress stopped (it started after the ``am_offset`` replayed patches)."""
    repo, names, offset = carry.repo, carry.state.names, carry.state.am_offset
    fail = patches.describe_am_stop(repo, names[offset:], output, offset)
    conflicted = unmerged(repo)
    hunks = [(p, n) for p in conflicted for n in marker_lines(repo / p)]
    staged = gitutil.git(["diff", "--cached", "--quiet", "HEAD"], repo, check=False).returncode != 0
    empty = not conflicted and not staged and "No changes" in output.decode(errors="replace")
    final = upstream.git_dir(repo) / "rebase-apply" / "final-commit"
    subject = final.read_text(errors="replace").splitlines()[0] if final.is_file() else ""
    files = sorted(set(fail.files) | set(conflicted))
    return Stop("conflict", len(names), fail.index, fail.name, subject, files, hunks, empty, fail.detail)


def _am_stop(carry: Carry, output: bytes) -> Outcome:
    stop = _describe_am_stop(carry, output)
    hunks = reasonsmod.marker_hunks(carry.repo, sorted({p for p, _ in stop.hunks}))
    what = "patch now empty" if stop.empty else f"conflict in {plural(len(stop.files), 'file')}"
    _save_stop(carry, "conflict", f"patch {stop.index + 1} '{stop.name}': {what}", hunks)
    return Outcome(stop, messages.conflict(carry, stop))


def _tree_has_markers(repo: Path, tree: str, path: str) -> bool:
    proc = gitutil.git(["cat-file", "-p", f"{tree}:{path}"], repo, check=False)
    if proc.returncode != 0:
        return False
    return any(line.startswith(b"<<<<<<< ") for line in proc.stdout.split(b"\n"))


def _replay(carry: Carry) -> Outcome | None:
    """Commit replayed prefixes until one needs a hand (then stop with it in the worktree)."""
    plan, repo, names = carry.state.replay, carry.repo, carry.state.names
    if not plan:
        return None
    while plan.index < plan.count:
        k = plan.index
        name = names[k]
        o, c, n = (replay.tree_of(repo, chain[k]) for chain in (plan.then, plan.carried, plan.now))
        auto = replay.merge_trees(repo, o, c, n)
        tree, candidates = auto.tree, list(auto.conflicts)
        if plan.committed_tree != plan.merged_tree:  # a hand resolution earlier: keep it where it still fits
            chained = replay.merge_trees(
                repo, plan.merged_tree, plan.committed_tree, auto.tree, labels=("yours", "before", "replayed")
            )
            tree, candidates = chained.tree, sorted(set(candidates) | set(chained.conflicts))
        conflicts = [p for p in candidates if _tree_has_markers(repo, tree, p) or p in auto.structural]
        then, was, now = (replay.message_of(repo, chain[k]) for chain in (plan.then, plan.carried, plan.now))
        message, clean = replay.merge_messages(repo, then, was, now)
        if not clean:
            plan.notes.append(
                f"{name}: its message was edited in the carry and in series/ since; series/'s is used"
            )
        author = replay.author_of(repo, plan.now[k])
        plan.merged_tree = auto.tree
        if conflicts:
            replay.checkout_tree(repo, gitutil.rev_parse(repo, "HEAD"), tree)
            plan.pending = PendingReplay(tree, message, author, conflicts)
            hunks = reasonsmod.marker_hunks(repo, conflicts)
            stop = Stop(
                "replay",
                len(names),
                k,
                name,
                message.split("\n", 1)[0],
                conflicts,
                [(h.path, h.line) for h in hunks],
            )
            _save_stop(
                carry,
                "replay",
                f"patch {k + 1} '{name}': replaying conflicts in {plural(len(conflicts), 'file')}",
                hunks,
            )
            return Outcome(stop, messages.replay(carry, stop, hunks))
        _commit_replayed(carry, tree, message, author)
        carry.save()
    if plan.notes:
        print("\n".join("note: " + n for n in plan.notes))
    print(f"replayed {plural(plan.count, 'patch', 'patches')} from {plan.source}/", flush=True)
    return None


def _commit_replayed(carry: Carry, tree: str, message: str, author: tuple[str, str, str]) -> None:
    plan, repo = carry.state.replay, carry.repo
    assert plan is not None  # only a replay commits replayed patches
    commit = replay.commit_tree(repo, tree, gitutil.rev_parse(repo, "HEAD"), message, author)
    gitutil.git(["checkout", "-q", "-f", "-B", patches.BRANCH, commit], repo)
    gitutil.git(["clean", "-q", "-fd"], repo)
    plan.committed_tree = tree
    plan.index += 1
    plan.pending = None


# --------------------------------------------------------------------------- continue / skip / abort


def resume(
    root: Path, *, gate: Gate, messages: list[str] | None = None, python: str | None = None
) -> Outcome:
    """Go on after a stop (``--continue``): the maintainer's ``messages`` give one reason per hunk."""
    return _go_on(root, gate, skip=False, text="\n".join(messages or []), python=python)


def skip(root: Path, *, gate: Gate, python: str | None = None) -> Outcome:
    """Leave out the stopped patch (``--skip``): only when the release already contains its change."""
    return _go_on(root, gate, skip=True, text="", python=python)


def _go_on(root: Path, gate: Gate, *, skip: bool, text: str, python: str | None) -> Outcome:
    carry = statemod.load(root)
    state = carry.state
    if python:
        state.python = python
    if state.phase == Phase.APPLY:
        return _resume_replay(carry, gate, skip, text)
    if state.phase == Phase.AM:
        out = _resume_am(carry, skip, text)
        if out is not None:
            return out
    elif state.phase == Phase.TESTS:
        if skip:
            raise ToolError(
                "--skip leaves out a patch upstream already contains; it cannot skip the tests: fix the "
                "patch or its test and --continue, or --abort"
            )
        notes, found = absorb.absorb(
            carry.repo, state.bases.new_base, state.stop.tip if state.stop else "", text
        )
        for note in notes:
            print(note, flush=True)
        state.reasons = state.reasons + found
    state.phase = Phase.TESTS
    state.stop = None
    carry.save()
    return advance(carry, gate)


def _require_reasons(text: str, hunks: list[Hunk], patch: str, kind: str) -> list[Reason]:
    """The maintainer's reasons for ``hunks``; refuse (changing nothing) while one is missing."""
    if not hunks:
        return []
    patch_of = {(h.path, h.scope): patch for h in hunks}
    return reasonsmod.require(text, hunks, patch_of, kind, "hand-made hunk")


def _refuse_markers(carry: Carry, paths: list[str]) -> None:
    left = [(p, n) for p in paths for n in marker_lines(carry.repo / p)]
    if left:
        raise ToolError(
            "conflict markers remain, resolve them first:\n"
            + "\n".join(f"  {carry.where}/{p}:{n}" for p, n in left)
        )


def _stop_hunks(state: CarryState) -> list[Hunk]:
    return list(state.stop.hunks) if state.stop else []


def _resume_replay(carry: Carry, gate: Gate, skip: bool, text: str) -> Outcome:
    state = carry.state
    plan = state.replay
    pending = plan.pending if plan else None
    if plan is None or pending is None:
        state.phase = Phase.APPLY
        return advance(carry, gate)
    if skip:
        raise ToolError(
            "--skip leaves out a patch upstream already contains; this stop is series/'s own edit meeting "
            "a resolution of the carry: resolve it and --continue, or --abort"
        )
    _refuse_markers(carry, pending.conflicts)
    name = state.names[plan.index]
    tree = replay.worktree_tree(carry.repo)
    extra = [
        h for h in reasonsmod.tree_hunks(carry.repo, pending.tree, tree) if h.path not in pending.conflicts
    ]
    found = _require_reasons(text, reasonsmod.unique(_stop_hunks(state) + extra), name, "replay")
    _commit_replayed(carry, tree, pending.message, pending.author)
    state.reasons = state.reasons + found
    state.stop = None
    carry.save()
    return advance(carry, gate)


def _am_index(carry: Carry) -> int:
    """The position in the series of the patch `git am` stopped at."""
    nxt = upstream.git_dir(carry.repo) / "rebase-apply" / "next"
    return carry.state.am_offset + int(nxt.read_text().strip()) - 1


def _resume_am(carry: Carry, skip: bool, text: str) -> Outcome | None:
    """Go on with the `git am` in progress; an Outcome if it stops again, else None."""
    repo, state = carry.repo, carry.state
    if not patches.am_in_progress(repo):
        return None
    if skip:
        name = _skip_checked(carry)
        state.dropped[name] = state.version
        carry.save()
        proc = gitutil.git(["am", "--skip", *AM_RESUME_FLAGS], repo, check=False)
    else:
        _refuse_markers(carry, unmerged(repo))
        found = _require_reasons(text, _stop_hunks(state), state.names[_am_index(carry)], "conflict")
        # Edits to tracked files belong to the stopped patch (a resolution may need a fix
        # elsewhere); new files must be `git add`ed by hand, so editor litter stays out.
        resolved = unmerged(repo)
        gitutil.git(["add", "-u"], repo)
        if resolved:
            gitutil.git(["add", "-A", "--", *resolved], repo)
        proc = gitutil.git(["am", "--continue", *AM_RESUME_FLAGS], repo, check=False)
        state.reasons = state.reasons + found
        carry.save()
    if patches.am_in_progress(repo):
        return _am_stop(carry, proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ToolError("git am failed:\n" + (proc.stdout + proc.stderr).decode(errors="replace").strip())
    return None


def _skip_checked(carry: Carry) -> str:
    """The current patch's name if it may be skipped; else refuse (never skip-and-recreate)."""
    repo, state = carry.repo, carry.state
    name = state.names[_am_index(carry)]
    diff = (upstream.git_dir(repo) / "rebase-apply" / "patch").read_text(errors="replace")
    touched = [fd.path for fd in diffs.parse(diff)]
    still_conflicted = bool(unmerged(repo))
    left = gitutil.git(["diff", "--quiet", "HEAD", "--", *touched], repo, check=False).returncode != 0
    if left and not still_conflicted:
        raise ToolError(
            f"--skip refused: your resolution of '{name}' keeps changes (the patch is not empty); "
            "run `nox -s rebase -- --continue` to carry it"
        )
    ok, why = releases.upstream_contains(repo, state.bases.new_base, diff)
    if not ok:
        raise ToolError(
            f"--skip refused: sglang {state.version} does not contain the change of '{name}' ({why}). "
            "Skipping would drop the patch; resolve the conflict and `--continue`, or `--abort`."
        )
    return name


def abort(root: Path) -> str:
    """Stop the carry and put the carried tree back as it was (series/ and pin.toml were never touched)."""
    carry = statemod.load(root)
    prior = carry.state.prior
    patches.abort_am(carry.repo)
    _restore_tree(carry.repo, prior)
    if prior.created:
        return (
            f"rebase to {carry.state.version} aborted: removed {carry.where}; series/ and pin.toml untouched"
        )
    notes = "; ".join(prior.notes)
    return (
        f"rebase to {carry.state.version} aborted: {carry.where} is back where it was; "
        "series/ and pin.toml untouched" + (f" ({notes})" if notes else "")
    )
