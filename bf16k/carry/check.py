"""`rebase-check`: what carrying today's series would meet on each newer release, and whether
every carried series still holds (applies, round-trips, passes its own tests on its release).

Conflicts are counted the way a carry meets them: patch ``k`` is tried on the patches before it
*as carried* (the release's ``series/next/<v>/`` when there is one; else the earlier patches
with their conflicts settled in their own favour), never on a tree that lacks a conflicting
predecessor, which would invent conflicts a real carry does not see. For each conflict the
report names the carried series that already resolves it: the release's own, when replaying
it onto today's series is clean (that is what ``rebase --recarry`` would do), or another
carried release whose version of the patch applies there as it is.

Only a carried series that no longer applies, round-trips or passes its tests fails the check;
what a not-yet-carried release would meet is a report. Nothing inside the repository changes.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import gitutil, patches, project, rangediff, replay, series, seriestests, upstream
from bf16k import pin as pinmod
from bf16k import reasons as reasonsmod
from bf16k.carry import chains, releases
from bf16k.carry.engine import AM_RESUME_FLAGS, unmerged
from bf16k.carry.state import OLD_BASE_REF, REPLAY_REF, Bases, Release
from bf16k.errors import ToolError
from bf16k.pin import Pin
from bf16k.project import Target


@dataclass
class ReleaseTree:
    """A newer release imported in the scratch tree, with series/ applied on the pinned base."""

    version: str
    detail: str  # where it came from, as the report says it
    bases: Bases


@dataclass
class PatchResult:
    name: str
    status: str  # "clean", "conflict", "already-upstream" or "not checked"
    where: list[str] = field(default_factory=list)  # "file:line (scope)" of each conflict hunk
    resolved_by: list[str] = field(default_factory=list)  # carried series that resolve it


@dataclass
class ReleaseReport:
    version: str
    detail: str
    results: list[PatchResult] = field(default_factory=list)
    basis: str = ""  # how the predecessors were made
    replay: str = ""  # what a re-carry would do, when the release has a carried series

    @property
    def conflicts(self) -> list[PatchResult]:
        return [r for r in self.results if r.status == "conflict"]

    @property
    def clean(self) -> bool:
        return not self.conflicts


def _where(repo: Path) -> list[str]:
    paths = unmerged(repo)
    hunks = reasonsmod.marker_hunks(repo, paths)
    found = [f"`{rangediff.short(h.path)}:{h.line}`" + (f" ({h.scope})" if h.scope else "") for h in hunks]
    return found or [f"`{rangediff.short(p)}`" for p in paths]


def _try(repo: Path, data: bytes, name: str, index: int) -> tuple[str, list[str]]:
    """Apply one patch on HEAD: ("clean"|"already-upstream"|"conflict", where); HEAD restored."""
    head = gitutil.rev_parse(repo, "HEAD")
    failure = patches.run_am(repo, data, [name], offset=index)
    if failure is not None:
        where = _where(repo) or [f"`{rangediff.short(f)}`" for f in failure.files]
        patches.abort_am(repo)
        gitutil.git(["reset", "-q", "--hard", head], repo)
        return "conflict", where
    made = gitutil.rev_parse(repo, "HEAD") != head
    gitutil.git(["reset", "-q", "--hard", head], repo)
    return ("clean" if made else "already-upstream"), []


def _settle_in_patch_favour(repo: Path) -> None:
    """Finish a conflicted `git am` taking the patch's side of each conflicting hunk only."""
    for path in unmerged(repo):
        stages = {}
        for n in (1, 2, 3):
            proc = gitutil.git(["show", f":{n}:{path}"], repo, check=False)
            stages[n] = proc.stdout if proc.returncode == 0 else None
        if stages[2] is not None and stages[3] is not None:
            with tempfile.TemporaryDirectory() as tmp:
                d = Path(tmp)
                for label, data in (("o", stages[2]), ("b", stages[1] or b""), ("t", stages[3])):
                    (d / label).write_bytes(data)
                proc = gitutil.git(
                    ["merge-file", "-p", "--theirs", str(d / "o"), str(d / "b"), str(d / "t")], d, check=False
                )
                merged = proc.stdout
            (repo / path).write_bytes(merged)
            gitutil.git(["add", "--", path], repo)
        elif stages[3] is not None:
            (repo / path).write_bytes(stages[3])
            gitutil.git(["add", "--", path], repo)
        else:
            gitutil.git(["rm", "-q", "--", path], repo, check=False)
    proc = gitutil.git(["am", "--continue", *AM_RESUME_FLAGS], repo, check=False)
    if patches.am_in_progress(repo):
        gitutil.git(["am", "--skip", *AM_RESUME_FLAGS], repo, check=False)
    if patches.am_in_progress(repo) or proc.returncode not in (0, 1):
        patches.abort_am(repo)


def _other_carried(root: Path, version: str, name: str) -> list[tuple[str, bytes]]:
    out = []
    for v in reversed(project.carried_versions(root)):
        d = Target(root, v).series_dir
        if v != version and name in series.read_order(d):
            out.append((v, (d / name).read_bytes()))
    return out


def _also_resolved(root: Path, repo: Path, version: str, name: str, index: int) -> list[str]:
    """Carried releases whose version of the patch applies cleanly where today's conflicts."""
    found = []
    for v, data in _other_carried(root, version, name):
        status, _ = _try(repo, data, name, index)
        if status == "clean":
            found.append(f"`series/next/{v}/`'s version applies here")
    return found


def _check_with_carried(
    root: Path, repo: Path, release: ReleaseTree, names: list[str], series_dir: Path, carried_dir: Path
) -> ReleaseReport:
    """Each patch on the carried predecessors, and what a replay of the carried series does."""
    version, bases = release.version, release.bases
    report = ReleaseReport(version, release.detail)
    report.basis = f"each patch on the patches before it as carried in `series/next/{version}/`"
    carried_names = series.read_order(carried_dir)
    chain = (
        chains.apply_chain(
            repo,
            bases.new_base,
            [(carried_dir / n).read_bytes() for n in carried_names],
            carried_names,
            f"{REPLAY_REF}/check",
        )
        or []
    )
    position = {n: i for i, n in enumerate(carried_names)}
    plan = chains.replay_plan(root, repo, bases, carried_dir, names)
    clean_replay: set[str] = set()
    replay_stop = ""
    if plan:
        for k in range(plan.count):
            o, c, n = (replay.tree_of(repo, chain_[k]) for chain_ in (plan.then, plan.carried, plan.now))
            merged = replay.merge_trees(repo, o, c, n)
            if merged.conflicts:
                replay_stop = f"stops at patch {k + 1} '{names[k]}' ({', '.join(merged.conflicts)})"
                break
            clean_replay.add(names[k])
        rest = len(names) - plan.count
        report.replay = (
            f"A re-carry from today's series/ (`nox -s rebase -- --recarry {version}`) replays "
            f"`series/next/{version}/` "
            + (replay_stop if replay_stop else f"cleanly for {len(clean_replay)} patches")
            + (f"; {rest} more would be carried with `git am`" if rest else "")
            + "."
        )
    else:
        report.replay = (
            f"A re-carry could not replay `series/next/{version}/` (what it was carried from is not in git "
            "history, or it no longer applies): it would carry every patch afresh."
        )
    for k, name in enumerate(names):
        preds = names[:k]
        if (
            chain
            and all(n in position for n in preds)
            and [position[n] for n in preds] == list(range(len(preds)))
        ):
            patches.reset_to(repo, chain[k - 1] if k else bases.new_base)
        else:
            report.results.append(
                PatchResult(name, "not checked", ["its predecessors are not carried in order"])
            )
            continue
        status, where = _try(repo, (series_dir / name).read_bytes(), name, k)
        result = PatchResult(name, status, where)
        if status == "conflict":
            if name in clean_replay:
                result.resolved_by.append(f"`series/next/{version}/` (replays cleanly)")
            result.resolved_by += _also_resolved(root, repo, version, name, k)
        report.results.append(result)
    return report


def _check_fresh(
    root: Path, repo: Path, release: ReleaseTree, names: list[str], series_dir: Path
) -> ReleaseReport:
    """A release nobody carried yet: `git am -3`, each conflict settled in the patch's favour."""
    version = release.version
    report = ReleaseReport(version, release.detail)
    report.basis = (
        "each patch on the patches before it, conflicting hunks of those taken as the patches have them "
        "(no carried series for this release)"
    )
    patches.reset_to(repo, release.bases.new_base)
    for k, name in enumerate(names):
        data = (series_dir / name).read_bytes()
        status, where = _try(repo, data, name, k)
        result = PatchResult(name, status, where)
        if status == "conflict":
            result.resolved_by = _also_resolved(root, repo, version, name, k)
            if patches.run_am(repo, data, [name], offset=k) is not None:
                _settle_in_patch_favour(repo)
        elif status == "clean":
            patches.run_am(repo, data, [name], offset=k)
        report.results.append(result)
    return report


def check_release(root: Path, repo: Path, pin: Pin, version: str, names: list[str]) -> ReleaseReport | str:
    wheel = releases.release_wheel(version, pin)
    if not releases.wheel_has_dsv4(wheel):
        return f"Skipped: {wheel.name} has no `{releases.DSV4_MODEL}`."
    rpin = releases.release_pin(pin, Release(version, f"v{version}", "wheel", "", ""), wheel)
    cache, pref, old_base = upstream.cached_import(pin)
    _, ref, base = upstream.cached_import(rpin, parent=pin, parent_commit=old_base, wheel_file=wheel)
    upstream.fetch_import(repo, cache, pref, OLD_BASE_REF)
    upstream.fetch_import(repo, cache, ref, f"refs/bf16k/check/{version}")
    series_dir = root / "series"
    old_tip = chains.apply_old_series(repo, old_base, series_dir, names)
    release = ReleaseTree(
        version, f"PyPI wheel {wheel.name}, base {base[:12]}", Bases(old_base, base, old_tip)
    )
    carried_dir = Target(root, version).series_dir
    if (carried_dir / "pin.toml").is_file():
        return _check_with_carried(root, repo, release, names, series_dir, carried_dir)
    return _check_fresh(root, repo, release, names, series_dir)


def _release_section(report: ReleaseReport | str, version: str, total: int) -> list[str]:
    if isinstance(report, str):
        return [f"## sglang {version}", "", report, ""]
    conflicts = report.conflicts
    if not conflicts:
        verdict = "clean"
    else:
        resolved = [r for r in conflicts if r.resolved_by]
        verdict = f"{len(conflicts)} of {total} patches conflict"
        if resolved:
            verdict += (
                ", all resolved by a carried series"
                if len(resolved) == len(conflicts)
                else f", {len(resolved)} resolved by a carried series"
            )
    lines = [
        f"## sglang {version}: {verdict}",
        "",
        f"Upstream: {report.detail}.",
        f"Counted the way a carry meets them: {report.basis}.",
        "",
    ]
    lines += ["| # | patch | a carry meets | where | resolved by |", "| --- | --- | --- | --- | --- |"]
    for i, r in enumerate(report.results, start=1):
        lines.append(
            f"| {i} | `{r.name}` | {r.status} | {', '.join(r.where)} | {'; '.join(r.resolved_by) or '–'} |"
        )
    lines.append("")
    if report.replay:
        lines += [report.replay, ""]
    return lines


def _carried_section(root: Path, tmp: Path, python: seriestests.TestPython | None) -> tuple[bool, list[str]]:
    ok = True
    lines = ["## Carried series under series/next/", ""]
    carried = project.carried_versions(root)
    if not carried:
        return True, lines + ["- none"]
    applied: dict[str, Path] = {}
    problems: dict[str, list[str]] = {}
    for version in carried:
        t = Target(root, version, work=tmp / "next" / version)
        report = patches.check(t)
        problems[version] = list(report.problems)
        if not report.problems:
            patches.apply(t)
            applied[version] = t.upstream_dir
    runs: dict[str, seriestests.TestRun] = {}
    if python is not None and applied:
        print(f"series tests on {len(applied)} carried tree(s) ...", flush=True)
        results = seriestests.run_many(python, list(applied.values()))
        runs = dict(zip(applied, results, strict=True))
    for version in carried:
        where = f"`series/next/{version}/`"
        if problems[version]:
            ok = False
            lines.append(f"- {where}: **FAILS**")
            lines += [f"  - {p}" for p in problems[version]]
            continue
        run = runs.get(version)
        if python is None:
            lines.append(
                f"- {where}: applies on its release and exports byte-identically; series tests not run (--no-tests)"
            )
        elif run is None or not run.ok:
            ok = False
            lines.append(
                f"- {where}: applies and exports byte-identically, but its series tests **FAIL** "
                f"({run.summary() if run else 'not run'})"
            )
            for f in (run.failures if run else [])[:10]:
                lines.append(f"  - `{f.nodeid}`: {f.message}")
            if run is not None and not run.failures:
                lines += ["  ```", *run.output.splitlines()[-15:], "  ```"]
        else:
            lines.append(
                f"- {where}: applies on its release, exports byte-identically, its series tests pass "
                f"({run.summary()})"
            )
    return ok, lines


def rebase_check(
    root: Path, versions_to_try: list[str] | None = None, *, run_tests: bool = True, python: str | None = None
) -> tuple[bool, str]:
    """(ok, markdown report). Never writes inside ``root``: all work happens in a temp folder."""
    pin = pinmod.load(root / "pin.toml")
    series_dir = root / "series"
    names = series.read_order(series_dir)
    # Fail fast on a missing test Python: it is what decides the result.
    tester = seriestests.find_python(root, python) if run_tests else None
    offered = versions_to_try if versions_to_try is not None else releases.index_versions("sglang")
    versions = releases.newer_releases(pin, offered)
    n = len(names)
    lines = [f"# rebase-check: series/ ({n} {'patch' if n == 1 else 'patches'}) on sglang {pin.version}", ""]
    with tempfile.TemporaryDirectory(prefix="bf16k-rebase-check-") as tmp:
        repo = Path(tmp) / "carry"
        cache, ref, old_base = upstream.cached_import(pin)
        upstream.fetch_import(repo, cache, ref, OLD_BASE_REF)
        try:
            chains.apply_old_series(repo, old_base, series_dir, names)
        except ToolError as exc:  # `check` fails for this; here it only means nothing can be carried
            lines += [f"Not carried: {exc}", ""]
            versions = []
        else:
            lines += [f"Newer releases checked: {', '.join(versions) or 'none'}.", ""]
        for version in versions:
            try:
                lines += _release_section(check_release(root, repo, pin, version, names), version, n)
            except ToolError as exc:  # an unreachable or odd new release is a report, not a failure
                lines += [f"## sglang {version}: not checked", "", str(exc), ""]
        ok, carried_lines = _carried_section(root, Path(tmp), tester)
        lines += carried_lines
    failed = "FAILED (a committed carried series no longer applies or its tests fail)"
    lines += ["", "Result: " + ("OK" if ok else failed), ""]
    return ok, "\n".join(lines)
