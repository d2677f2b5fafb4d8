"""Which release the drafts are written for, and writing them: the cover, one draft per PR and each
PR's patches in ``build/pr-drafts/<version>/``, after the ``git am`` (and, with ``--check``, test)
check of each PR on its base."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bf16k import pin as pinmod
from bf16k import previdence, project, prs, series, seriestests, upstream
from bf16k.errors import ToolError
from bf16k.prdrafts.commits import Patch, diffstat, write_pr_patches
from bf16k.prdrafts.markdown import Context, render_cover, render_draft
from bf16k.prdrafts.tree import PRState, check_release
from bf16k.project import Target

OUT_SUBDIR = "pr-drafts"
COVER = "00-cover.md"


def carried_versions(root: Path) -> list[str]:
    """Carried series newer than the pin, newest first."""
    pinned = project.version_key(pinmod.load(root / "pin.toml").version)
    found = [
        v
        for v in project.carried_versions(root)
        if (root / "series" / "next" / v / series.SERIES_FILE).is_file() and project.version_key(v) > pinned
    ]
    return sorted(found, key=project.version_key, reverse=True)


def newest_target(root: Path) -> tuple[Target, str]:
    """(target, why): the newest carried series the PR map fits, else the pin (and why not the newer)."""
    pinned = pinmod.load(root / "pin.toml")
    skipped: list[str] = []
    for version in carried_versions(root):
        t = project.target(root, version)
        prmap, problems = prs.fits(t)
        if prmap is not None:
            why = (
                f"sglang {version}, the newest release the series is carried to (the pin is {pinned.version})"
            )
            return t, why + (
                "; not the newer " + ", ".join(skipped) + ": it needs re-carrying first" if skipped else ""
            )
        skipped.append(
            f"{version} (its carried series does not fit the PR map, {len(problems)} problem(s), "
            f"first: {problems[0]})"
        )
    why = f"sglang {pinned.version}, the pin"
    if skipped:
        why += "; not the newer carried release " + ", ".join(skipped) + ": it needs re-carrying first"
    return Target(root, None), why


def _evidence_kinds(prmap: prs.PRMap) -> list[str]:
    kinds = ["fp8-precision"] + [k for pr in prmap.prs for k in pr.evidence]
    return list(dict.fromkeys(kinds))


def _release_label(t: Target) -> str:
    return f"{t.load_pin().version} ({'carried' if t.carried else 'pin'})"


def generate(t: Target, chosen: str, out_dir: Path | None = None, *, check: bool = False) -> Path:
    """Write the cover, one draft per PR and each PR's patches; return the folder.

    ``check``: also run each PR's tests on its base, on the pin and on the newest carried release.
    """
    return generate_checked(t, chosen, out_dir, check=check)[0]


def generate_checked(
    t: Target, chosen: str, out_dir: Path | None = None, *, check: bool = False
) -> tuple[Path, list[prs.ReleaseCheck]]:
    """:func:`generate`, also returning what the git am (and test) check found per release."""
    pin = t.load_pin()
    prmap = prs.load(t)
    problems = series.hygiene(t.series_dir)
    if problems:
        raise ToolError("series hygiene:\n  " + "\n  ".join(problems))
    order = series.read_order(t.series_dir)
    patch_info = {
        n: Patch(n, series.parse_patch(t.series_dir / n), diffstat((t.series_dir / n).read_bytes(), t.root))
        for n in order
    }
    out = (out_dir or t.build_dir / OUT_SUBDIR / pin.version).resolve()
    if out.exists():
        shutil.rmtree(out)  # generated output: a dropped PR must not leave its old draft
    out.mkdir(parents=True)
    patch_dirs = write_pr_patches(t.series_dir, prmap, out / "patches")
    python = seriestests.find_python(t.root) if check else None
    states: dict[str, PRState] = {}
    # Without --check the drafted release's tree is used as it is (the cover says when it is not set
    # up); with it, every checked release's tree is built first and a PR's tests run on its base.
    up, why = _obtain(t) if check else (None, "")
    releases = [
        check_release(t, prmap, patch_dirs, _release_label(t), python, states, up)
        if not why
        else prs.ReleaseCheck(_release_label(t), False, [why])
    ]
    if check:
        releases += other_releases(t, python)
    evidence = previdence.render(t.root, _evidence_kinds(prmap))
    ctx = Context(
        t,
        chosen,
        pin,
        series.series_hash(t.series_dir),
        prmap,
        patch_info,
        states,
        releases,
        evidence,
        tests_run=check,
    )
    texts = {COVER: render_cover(ctx)} | {ctx.draft_file(pr): render_draft(ctx, pr) for pr in prmap.prs}
    for name, text in texts.items():
        refs = previdence.local_refs(text, strict=name != COVER)
        if refs:
            raise ToolError(
                f"pr-drafts: {name} would name local paths or this repository's harness:\n  "
                + "\n  ".join(refs[:10])
            )
    for name, text in texts.items():
        (out / name).write_text(text)
    return out, releases


def _obtain(t: Target) -> tuple[upstream.Upstream | None, str]:
    """Build (or find) ``t``'s upstream tree at its base: (it, "") or (None, why not)."""
    try:
        return upstream.obtain(t, quiet=True), ""
    except ToolError as exc:
        return None, "its upstream tree could not be built: " + str(exc).splitlines()[0].replace(
            f"{t.root}/", ""
        )


def other_releases(drafted: Target, python: seriestests.TestPython | None) -> list[prs.ReleaseCheck]:
    """The check on the pin and on the newest carried release, whichever of them was not drafted."""
    root = drafted.root
    wanted = [Target(root, None)] + [project.target(root, v) for v in carried_versions(root)[:1]]
    out = []
    for t in dict.fromkeys(wanted):
        if t == drafted:
            continue
        label = _release_label(t)
        prmap, problems = prs.fits(t)
        if prmap is None:
            out.append(
                prs.ReleaseCheck(
                    label,
                    False,
                    [
                        f"its series does not fit the PR map ({problems[0]}"
                        + (f"; {len(problems) - 1} more" if len(problems) > 1 else "")
                        + "): re-carry it first"
                    ],
                )
            )
            continue
        up, why = _obtain(t)
        if why:
            out.append(prs.ReleaseCheck(label, False, [why]))
            continue
        with tempfile.TemporaryDirectory(prefix="bf16k-prs-") as tmp:
            dirs = write_pr_patches(t.series_dir, prmap, Path(tmp))
            out.append(check_release(t, prmap, dirs, label, python, up=up))
    return out


def check_verdict(releases: list[prs.ReleaseCheck]) -> tuple[int, list[str]]:
    """(exit status, lines) of `--check`: 1 unless every PR applied and passed on every release."""
    lines = [f"{rc.label}: not checked: {'; '.join(rc.why_not)}" for rc in releases if not rc.checked]
    bad = [f"{rc.label} PR ({c.pr})" for rc in releases for c in rc.prs if not c.ok]
    untried = [
        f"{rc.label} PR ({c.pr})"
        for rc in releases
        if rc.checked
        for c in rc.prs
        if c.run is None and c.applies
    ]
    if bad:
        lines.append(f"does not apply or its tests fail: {', '.join(bad)} (see the cover)")
    if untried:
        lines.append(f"applied but not tested: {', '.join(untried)}")
    if bad or untried or any(not rc.checked for rc in releases):
        return 1, lines
    return 0, [
        f"every PR applies on its base and its tests pass, on {', '.join(rc.label for rc in releases)}"
    ]
