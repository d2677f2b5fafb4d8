"""The upstream PR set: which patches of the series become which upstream pull request.

``series/prs.toml`` maps the series onto pull requests: each ``[[pr]]`` names an id, a title
and its patches in series order; each ``[[local]]`` names a patch that stays in the series only
(``Forwarded: not-needed``) and why. :func:`load` refuses a map that does not describe the series
it is used with: every patch is in exactly one PR or local, the PRs' patches are contiguous and in
series order, and the local patches come after every upstream-bound one. So the base of a PR is
always upstream plus the patches of the PRs before it, and each PR can be applied and tested on
that base alone (:func:`check`).

The same map serves a carried series (``series/next/<version>/``) when that series has the same
patches; one that does not (not re-carried since the map changed) is reported as not fitting.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bf16k import gitutil, patches, series, seriestests, upstream
from bf16k.errors import ToolError
from bf16k.project import Target

PRS_FILE = "prs.toml"
NOT_NEEDED = "not-needed"
_ID = re.compile(r"^[a-z][a-z0-9-]*$")
# What a draft may say about a PR (validated here, rendered by prdrafts).
MOTIVATIONS = ("patch", "bf16-index-k")
EVIDENCE_KINDS = ("store-parity", "store-bench", "read-parity", "read-bench", "forward", "recall", "cost")
NEEDED_RUNS = (
    "hicache-gsm8k",
    "gsm8k",
    "gpqa",
    "long-context-recall",
    "bench-serving",
    "pool-tokens",
    "mtp",
    "sm120",
)


@dataclass(frozen=True)
class PR:
    id: str
    title: str
    patches: tuple[str, ...]
    motivation: str  # one of MOTIVATIONS
    context: str  # where the PR stands in the set (a sentence or two)
    notes: tuple[str, ...] = ()  # decisions a reviewer should read first (e.g. what is kept and why)
    evidence: tuple[str, ...] = ()  # EVIDENCE_KINDS, in the order the draft shows them
    needs: tuple[str, ...] = ()  # NEEDED_RUNS: what only real hardware and the real model can give
    docs: tuple[str, ...] = ()  # server arguments whose docs row the draft carries


@dataclass(frozen=True)
class Local:
    patch: str
    why: str


@dataclass(frozen=True)
class PRMap:
    prs: tuple[PR, ...]
    local: tuple[Local, ...]
    path: Path

    def by_id(self, pr_id: str) -> PR:
        for pr in self.prs:
            if pr.id == pr_id:
                return pr
        raise ToolError(f"no PR {pr_id!r} in {self.path.name} (PRs: {', '.join(p.id for p in self.prs)})")

    def base_patches(self, pr: PR) -> list[str]:
        """The patches under ``pr``: every earlier PR's, in order (upstream itself is below them)."""
        out: list[str] = []
        for p in self.prs:
            if p.id == pr.id:
                return out
            out += p.patches
        raise ToolError(f"PR {pr.id!r} is not in the map")

    def pr_of(self, patch: str) -> PR | None:
        return next((p for p in self.prs if patch in p.patches), None)

    @property
    def upstream_bound(self) -> list[str]:
        return [name for pr in self.prs for name in pr.patches]


def map_path(t: Target) -> Path:
    """The target's own ``prs.toml`` if it has one, else the pinned series' (same patch names)."""
    own = t.series_dir / PRS_FILE
    return own if own.is_file() else t.root / "series" / PRS_FILE


def _strings(raw: Any, where: str, key: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolError(f"{where}: '{key}' must be a list of strings")
    return tuple(value)


def _text(raw: Any, where: str, key: str, required: bool = True) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise ToolError(f"{where}: '{key}' must be a non-empty string")
    return " ".join(value.split())


def parse(path: Path) -> PRMap:
    """The map as written (no check against a series yet)."""
    if not path.is_file():
        raise ToolError(
            f"{path} is missing: it maps the series onto upstream PRs ([[pr]] id/title/patches, [[local]] patch/why)"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(f"{path.name}: not valid TOML ({exc})") from exc
    unknown = set(data) - {"pr", "local"}
    if unknown:
        raise ToolError(
            f"{path.name}: unknown table(s) {', '.join(sorted(unknown))} (only [[pr]] and [[local]])"
        )
    prs: list[PR] = []
    for i, raw in enumerate(data.get("pr", []), start=1):
        where = f"{path.name} [[pr]] #{i}"
        pr_id = _text(raw, where, "id")
        if not _ID.match(pr_id):
            raise ToolError(f"{where}: id {pr_id!r} must be lower-case letters, digits and dashes")
        where = f"{path.name} PR {pr_id!r}"
        motivation = _text(raw, where, "motivation")
        if motivation not in MOTIVATIONS:
            raise ToolError(f"{where}: motivation {motivation!r} is not one of {', '.join(MOTIVATIONS)}")
        pr = PR(
            id=pr_id,
            title=_text(raw, where, "title"),
            patches=_strings(raw, where, "patches"),
            motivation=motivation,
            context=_text(raw, where, "context"),
            notes=tuple(" ".join(n.split()) for n in _strings(raw, where, "notes")),
            evidence=_strings(raw, where, "evidence"),
            needs=_strings(raw, where, "needs"),
            docs=_strings(raw, where, "docs"),
        )
        if not pr.patches:
            raise ToolError(f"{where}: a PR needs at least one patch")
        for key, allowed, values in (
            ("evidence", EVIDENCE_KINDS, pr.evidence),
            ("needs", NEEDED_RUNS, pr.needs),
        ):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ToolError(f"{where}: unknown {key} {', '.join(bad)} (known: {', '.join(allowed)})")
        prs.append(pr)
    local = []
    for i, raw in enumerate(data.get("local", []), start=1):
        where = f"{path.name} [[local]] #{i}"
        local.append(Local(_text(raw, where, "patch"), _text(raw, where, "why")))
    if not prs:
        raise ToolError(f"{path.name}: no [[pr]] entries")
    ids = [p.id for p in prs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ToolError(f"{path.name}: PR id(s) used twice: {', '.join(dup)}")
    return PRMap(tuple(prs), tuple(local), path)


def problems(prmap: PRMap, order: list[str], forwarded: dict[str, str]) -> list[str]:
    """Why the map does not describe the series ``order`` (with each patch's ``Forwarded:``)."""
    out: list[str] = []
    placed: dict[str, list[str]] = {}
    for pr in prmap.prs:
        for name in pr.patches:
            placed.setdefault(name, []).append(f"PR {pr.id!r}")
    for loc in prmap.local:
        placed.setdefault(loc.patch, []).append("local")
    for name, where in placed.items():
        if name not in order:
            out.append(f"{name}: in the map ({', '.join(where)}) but not in the series")
        elif len(where) > 1:
            out.append(f"{name}: in the map more than once ({', '.join(where)})")
    for name in order:
        if name not in placed:
            out.append(f"{name}: in no PR and not local (a gap in the map)")
    if out:
        return out
    # Every patch placed once: the PRs, then the local ones, must be the series in order.
    bound = prmap.upstream_bound
    if order[: len(bound)] != bound:
        for pr in prmap.prs:
            idx = [order.index(n) for n in pr.patches]
            if idx != list(range(idx[0], idx[0] + len(idx))):
                out.append(
                    f"PR {pr.id!r}: its patches are not contiguous in series order ({', '.join(pr.patches)})"
                )
        if not out:
            local_first = [n for n in order[: len(bound)] if n not in bound]
            if local_first:
                out.append(
                    f"local patch(es) {', '.join(local_first)} come before upstream-bound ones: a PR's base "
                    "would hold a patch no PR proposes"
                )
            else:
                out.append("the PRs are not in series order: " + " ".join(p.id for p in prmap.prs))
    for loc in prmap.local:
        fwd = forwarded.get(loc.patch)
        if fwd != NOT_NEEDED:
            out.append(
                f"{loc.patch}: local in the map but its header says 'Forwarded: {fwd}' (want {NOT_NEEDED})"
            )
    for pr in prmap.prs:
        for name in pr.patches:
            if forwarded.get(name) == NOT_NEEDED:
                out.append(f"{name}: in PR {pr.id!r} but its header says 'Forwarded: {NOT_NEEDED}'")
    return out


def forwarded_of(series_dir: Path, order: list[str]) -> dict[str, str]:
    return {n: series.parse_patch(series_dir / n).trailers.get("Forwarded", "") for n in order}


def load(t: Target) -> PRMap:
    """The map for ``t``'s series, refused (ToolError naming every problem) unless it fits."""
    prmap = parse(map_path(t))
    order = series.read_order(t.series_dir)
    found = problems(prmap, order, forwarded_of(t.series_dir, order))
    if found:
        rel = (
            t.series_dir.relative_to(t.root).as_posix()
            if t.series_dir.is_relative_to(t.root)
            else t.series_dir
        )
        raise ToolError(f"{prmap.path.name} does not fit {rel}/:\n  " + "\n  ".join(found))
    return prmap


def fits(t: Target) -> tuple[PRMap | None, list[str]]:
    """(the map, []) when it fits ``t``'s series, else (None, the problems)."""
    try:
        return load(t), []
    except ToolError as exc:
        return None, [line.strip() for line in str(exc).splitlines()[1:]] or [str(exc)]


# --------------------------------------------------------------------------- the per-PR check


@dataclass
class PRCheck:
    pr: str
    applies: bool = False
    base: str = ""  # the base it applied on (upstream commit + earlier PRs)
    below: list[str] = field(default_factory=list)  # the ids of the PRs under it
    detail: str = ""  # why it does not apply
    tests: list[str] = field(default_factory=list)  # the PR's own test files (added or changed)
    run: seriestests.TestRun | None = None

    @property
    def ok(self) -> bool:
        return self.applies and (self.run is None or self.run.ok or self.run.absent)

    def summary(self) -> str:
        if not self.applies:
            return f"does not apply: {self.detail}"
        tests = "tests not run" if self.run is None else f"tests: {self.run.summary()}"
        return f"applies on {self.base}; {tests}"


@dataclass
class ReleaseCheck:
    label: str  # "0.5.21 (pin)" or "0.5.23 (carried)"
    checked: bool
    why_not: list[str] = field(default_factory=list)
    prs: list[PRCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.prs)


def pr_test_files(series_dir: Path, pr: PR) -> list[str]:
    """Test files under upstream's test folders that the PR's patches add or change, in order."""
    out: list[str] = []
    for name in pr.patches:
        info = series.parse_patch(series_dir / name)
        out += [f for f in info.files if seriestests.is_series_test(f) and f not in out]
    return out


@contextmanager
def base_clone(t: Target, up: upstream.Upstream | None = None) -> Iterator[tuple[Path, upstream.Upstream]]:
    """A scratch clone of ``t``'s upstream tree at its base (the release without the series):
    ``up`` (what :func:`upstream.obtain` gave), else the base `apply` recorded."""
    if up is None:
        repo = t.upstream_dir
        apply_cmd = "nox -s apply" + (f" -- --upstream {t.version}" if t.carried else "")
        if not gitutil.is_repo(repo):
            raise ToolError(f"{repo} is not set up: run `{apply_cmd}` first")
        base = gitutil.git(["rev-parse", "--verify", "-q", upstream.BASE_REF], repo, check=False)
        if base.returncode != 0:
            raise ToolError(f"{repo} has no recorded base: run `{apply_cmd}` first")
        state = upstream.read_state(repo)
        up = upstream.Upstream(repo, base.stdout.decode().strip(), state.get("source", "?"), "")
    with patches.scratch_clone(up) as scratch:
        yield scratch, up


def am_prs(
    scratch: Path,
    patch_dirs: dict[str, Path],
    prmap: PRMap,
    on_applied: Any = None,
) -> list[PRCheck]:
    """`git am` each PR's patch files (``patch_dirs[pr.id]``, sorted) in turn on ``scratch``.

    ``on_applied(pr, check)`` runs after each PR applied (its base is then the clone's state
    before it). Stops at the first PR that does not apply: later ones have no base.
    """
    results: list[PRCheck] = []
    for pr in prmap.prs:
        check = PRCheck(pr.id)
        results.append(check)
        files = sorted(p.name for p in patch_dirs[pr.id].glob("*.patch"))
        data = patches.mbox(patch_dirs[pr.id], files)
        proc = gitutil.git(["am", "-3", "--keep-non-patch"], scratch, check=False, input_bytes=data)
        if proc.returncode != 0:
            text = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()
            # Which commit stopped and where: git's conflict lines, not its how-to-continue advice.
            where = [
                line.strip()
                for line in text
                if re.search(r"^(Patch failed at|error: |CONFLICT)", line.strip())
            ]
            conflicted = gitutil.out(["diff", "--name-only", "--diff-filter=U"], scratch).split()
            check.detail = "; ".join(dict.fromkeys(where + [f"conflicts in {f}" for f in conflicted])) or (
                "; ".join(text[:2]) or f"git am exit {proc.returncode}"
            )
            patches.abort_am(scratch)
            break
        check.applies = True
        if on_applied is not None:
            on_applied(pr, check)
    return results
