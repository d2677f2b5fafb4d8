"""What a stopped carry says: where it stopped, what upstream changed there, and the next command.

Every stop names the patch (or test), each hunk with its scope, upstream's change to just those
scopes, the reasons the carried series gave before, and the command that goes on.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from bf16k import bisect, context, seriestests
from bf16k import reasons as reasonsmod
from bf16k.carry.state import NEW_BASE_REF, OLD_BASE_REF, Carry
from bf16k.reasons import Hunk, Reason


@dataclass
class Stop:
    """Where a carry stopped and why."""

    kind: str  # "conflict", "replay", "tests" or "bisect"
    total: int  # patches in the series
    index: int = -1  # 0-based position of the patch in the series; -1: no one patch (the tests)
    name: str = ""
    subject: str = ""
    files: list[str] = field(default_factory=list)  # paths in the upstream tree
    hunks: list[tuple[str, int]] = field(default_factory=list)  # (path, line of each `<<<<<<<`)
    empty: bool = False  # nothing of the patch is left (after a resolution, or upstream has it)
    detail: str = ""  # git's last words


@dataclass
class Outcome:
    stop: Stop | None  # None: the carry finished
    message: str
    queue: list[str] = field(default_factory=list)  # a finished re-carry's releases still to re-carry
    python: str | None = None  # ... and the Python their tests run with


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _hunk_lines(where: str, hunks: list[Hunk]) -> list[str]:
    return [f"    {where}/{h.path}:{h.line}" + (f"  ({h.scope})" if h.scope else "") for h in hunks]


def continue_lines(hunks: list[Hunk], what: str) -> list[str]:
    """The `--continue` command with one `-m` per hunk to fill in."""
    template = reasonsmod.template(hunks)
    if not template:
        return [f'  2. nox -s rebase -- --continue -m "<why>"    ({what})']
    lines = ["  2. say why, one line per hunk, and go on:", "     nox -s rebase -- --continue \\"]
    lines += [f"       {m} \\" for m in template[:-1]] + [f"       {template[-1]}"]
    lines.append(f"     ({what}; a path may be shortened to its file name)")
    return lines


def conflict(carry: Carry, stop: Stop) -> str:
    """A `git am` stop: the patch, its files and hunks, upstream's change there, the next steps."""
    version, repo, where = carry.state.version, carry.repo, carry.where
    lines = [
        f"rebase to sglang {version} stopped at patch {stop.index + 1} of {stop.total}: '{stop.name}'",
        f"  subject: {stop.subject}" if stop.subject else "",
        f"  upstream: {carry.state.source_detail}",
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
        lines += _hunk_lines(where, hunks)
    no_markers = [f for f in stop.files if f not in {p for p, _ in stop.hunks}]
    if no_markers and stop.hunks:
        lines.append(
            "  without markers (delete/rename or a file that could not be merged): " + ", ".join(no_markers)
        )
    if not stop.hunks:
        lines.append("  git said:")
        lines += [f"    {line}" for line in stop.detail.splitlines()[-8:]]
    if hunks:
        lines += _conflict_context_lines(carry, hunks)
        lines += _earlier_reasons_lines(carry, stop.name, hunks)
    lines += [
        "next:",
        f"  1. resolve by intent in {where}: edit the files until no conflict markers remain",
        *continue_lines(hunks, "stages your edits to tracked files, carries the rest"),
        "  or give up and restore everything as it was: nox -s rebase -- --abort",
    ]
    if stop.kind == "conflict":
        lines.append(f"  (--skip is refused unless sglang {version} already contains this patch's change)")
    return "\n".join(line for line in lines if line)


def replay(carry: Carry, stop: Stop, hunks: list[Hunk]) -> str:
    """A re-carry's stop: series/'s edit since the carry meets what the carry had changed."""
    version, where = carry.state.version, carry.where
    source = carry.state.replay.source if carry.state.replay else ""
    lines = [
        f"re-carry to sglang {version} stopped at patch {stop.index + 1} of {stop.total}: '{stop.name}'",
        f"  replaying {source}/: series/ changed this patch since it was carried, where the carry",
        "  had changed it too. The markers hold the carried version (carried), the patch as it was then",
        "  (series-then) and as it is now (series-now); keep the carried resolution and series/'s edit.",
        f"  files (in {where}):",
        *[f"    {f}" for f in stop.files],
    ]
    if hunks:
        lines.append("  conflict hunks:")
        lines += _hunk_lines(where, hunks)
        lines += _earlier_reasons_lines(carry, stop.name, hunks)
        lines += _conflict_context_lines(carry, hunks)
    lines += [
        "next:",
        f"  1. resolve by intent in {where}: edit the files until no conflict markers remain",
        *continue_lines(hunks, "commits the patch, replays the rest"),
        "  or give up and restore everything as it was: nox -s rebase -- --abort",
    ]
    return "\n".join(lines)


def _versions(carry: Carry) -> str:
    return f"{carry.state.old_version} -> {carry.state.version}"


def _conflict_context_lines(carry: Carry, hunks: list[Hunk]) -> list[str]:
    """What a stop prints of upstream's change to the functions its conflict hunks sit in."""
    bases = carry.state.bases
    return [
        "  " + line
        for line in context.for_conflicts(
            carry.repo,
            bases.old_base,
            bases.new_base,
            hunks,
            version=_versions(carry),
            repo_label=carry.where,
            old_ref=OLD_BASE_REF,
            new_ref=NEW_BASE_REF,
        )
    ]


def _earlier_reasons_lines(carry: Carry, patch: str, hunks: list[Hunk]) -> list[str]:
    """What a stop prints of the carried series' own reasons for these hunks (nothing if none)."""
    earlier = _earlier_reasons(carry.state.prev_reasons, patch, hunks)
    if not earlier:
        return []
    return ["  the carried series resolved these before, saying:"] + [
        f"    {r.path} ({r.scope}): {r.why}" if r.scope else f"    {r.path}: {r.why}" for r in earlier
    ]


def _earlier_reasons(known: list[Reason], patch: str, hunks: list[Hunk]) -> list[Reason]:
    found: list[Reason] = []
    for h in reasonsmod.unique(hunks):
        for r in reasonsmod.lookup(known, patch, h.path, h.scope):
            if r not in found:
                found.append(r)
    return found


# --------------------------------------------------------------------------- the gate's stops


def no_python(carry: Carry, why: str) -> str:
    return (
        f"carry to sglang {carry.state.version}: every patch is carried; the carry is done once the series' "
        f"tests pass on {carry.where} and every prefix bisects.\n  {why}\n"
        "next: nox -s rebase -- --continue   (runs the tests and the bisect)\n"
        "  or nox -s rebase -- --abort"
    )


def _rerun_command(where: str, python: seriestests.TestPython, nodeids: list[str]) -> str:
    env = "PYTHONPATH=python" + ("" if python.cuda else " TRITON_INTERPRET=1")
    picked = nodeids[:4] if len(nodeids) <= 4 else sorted({n.split("::", 1)[0] for n in nodeids})
    return f"cd {where} && {env} {python.path} -m pytest -q -p no:cacheprovider -c /dev/null " + " ".join(
        shlex.quote(n) for n in picked
    )


Owners = dict[str, tuple[int, str]]  # file -> (index, patch) of the first carried patch touching it


def _failure_lines(
    carry: Carry, python: seriestests.TestPython, failures: list[seriestests.Failure], owner: Owners
) -> list[str]:
    lines = ["  failing (test / the patch it belongs to: the first line of the failure):"]
    for f in failures[:12]:
        i, name = owner.get(f.file, (-1, ""))
        lines.append(f"    {f.nodeid}")
        lines.append(f"      patch {i + 1} '{name}': {f.message}" if i >= 0 else f"      {f.message}")
    if len(failures) > 12:
        lines.append(f"    ... and {len(failures) - 12} more")
    calls = seriestests.executed(python, carry.repo, [f.nodeid for f in failures[:6]])
    bases = carry.state.bases
    lines += [
        "  " + line
        for line in context.for_tests(
            carry.repo,
            bases.old_base,
            bases.new_base,
            calls,
            version=_versions(carry),
            repo_label=carry.where,
            old_ref=OLD_BASE_REF,
            new_ref=NEW_BASE_REF,
            hint="\n".join(f.text for f in failures),
        )
    ]
    return lines


def _fix_lines(where: str, python: seriestests.TestPython, nodeids: list[str]) -> list[str]:
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


def tests_failed(
    carry: Carry, python: seriestests.TestPython, result: seriestests.TestRun, owner: Owners
) -> str:
    lines = [
        (
            f"carry to sglang {carry.state.version} stopped: the series' tests fail on the carried tree "
            f"({result.summary()})"
        ),
        f"  upstream: {carry.state.source_detail}",
    ]
    if result.failures:
        lines += _failure_lines(carry, python, result.failures, owner)
    else:
        lines += ["  pytest said:", *["    " + ln for ln in result.output.splitlines()[-25:]]]
    lines += _fix_lines(carry.where, python, carry.state.failing)
    return "\n".join(lines)


def prefix_failed(
    carry: Carry, python: seriestests.TestPython, step: bisect.Step, owner: Owners, rerun: list[str]
) -> str:
    """A prefix of the carried series does not work on its own (``rerun``: the tests to run again)."""
    lines = [
        (
            f"carry to sglang {carry.state.version} stopped: with patches 1..{step.index + 1} only, the tree does not "
            f"work (patch {step.index + 1} '{step.name}'); the whole series passes its tests, so a later patch hides "
            "it."
        ),
    ]
    if step.failures:
        lines += _failure_lines(carry, python, step.failures, owner)
    else:
        lines += ["  " + ln for p in step.problems for ln in p.splitlines()[:20]]
    lines += _fix_lines(carry.where, python, rerun)
    lines.insert(-4, f"     (the fix belongs in patch {step.index + 1} or an earlier one)")
    return "\n".join(lines)
