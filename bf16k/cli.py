"""Command line: ``python -m bf16k <command> [options]``; nox sessions call exactly this.

Every command is one row of :data:`COMMANDS`: its name and help, the options it takes and the
handler that runs it. The modules behind the handlers expose plain functions; argparse lives
here only. A handler imports the modules it drives when it runs, so `python -m bf16k apply`
does not load the carry, the drafts or the wheel builder.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bf16k import patches, project
from bf16k.errors import ToolError

if TYPE_CHECKING:
    from bf16k.carry.gate import Gate


@dataclass(frozen=True)
class Call:
    """One command as given on the command line."""

    ns: argparse.Namespace  # its options (and --root)
    rest: list[str] = field(default_factory=list)  # what `tests` passes on to pytest
    gate: Gate | None = None  # the carry's test gate; None: the series' own tests and bisect

    @property
    def root(self) -> Path:
        return project.find_root(Path(self.ns.root) if self.ns.root else None)

    def target(self) -> project.Target:
        return project.target(self.root, getattr(self.ns, "upstream", None))


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Call], int]
    passes_rest: bool = False  # arguments it does not know go on (to pytest)


# --------------------------------------------------------------------------- the series


def _source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="VERSION", help="work on a carried release (series/next/VERSION)")
    p.add_argument(
        "--source",
        choices=("auto", "submodule", "wheel"),
        default="auto",
        help="where upstream comes from (auto: the submodule if it can be had, else the PyPI wheel)",
    )
    p.add_argument("--wheel-file", type=Path, help="use this copy of the pinned wheel (sha256-checked)")


def _upstream_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="VERSION")


def _apply_options(p: argparse.ArgumentParser) -> None:
    _source_options(p)
    p.add_argument(
        "--stop-if-dirty", action="store_true", help="stop instead of saving uncommitted work to a ref"
    )


def _apply(call: Call) -> int:
    ns = call.ns
    patches.apply(call.target(), source=ns.source, wheel_file=ns.wheel_file, stop_if_dirty=ns.stop_if_dirty)
    return 0


def _export_options(p: argparse.ArgumentParser) -> None:
    _upstream_option(p)
    p.add_argument("--force", action="store_true", help="export even if series/ changed since apply")


def _export(call: Call) -> int:
    patches.export(call.target(), force=call.ns.force)
    return 0


def _check(call: Call) -> int:
    report = patches.check(call.target(), source=call.ns.source, wheel_file=call.ns.wheel_file)
    for note in report.notes:
        print(note)
    if report.problems:
        print(f"check failed: {len(report.problems)} problem(s)", file=sys.stderr)
        for problem in report.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print("check passed")
    return 0


def _status(call: Call) -> int:
    for line in patches.status(call.target()):
        print(line)
    return 0


# --------------------------------------------------------------------------- tests, build, bisect


def _test_env_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--label", default="test-env", help="names its temporary folder build/tmp/LABEL-PID")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments for its python")


def _test_env(call: Call) -> int:
    from bf16k import testenv

    args = list(call.ns.args)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise ToolError("test-env needs the arguments for its python, e.g. `test-env -- -m pytest tests`")
    return testenv.run(call.root, args, label=call.ns.label)


def _tests_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream", metavar="VERSION", help="only the series' tests, on this carried release's tree"
    )


def _tests(call: Call) -> int:
    """The project's tests; with --upstream, the series' own tests on that release's tree alone."""
    import subprocess

    from bf16k import seriestests

    t = call.target()
    rest = call.rest
    patches.apply(t)
    if call.ns.upstream is not None:  # one release's tree, its series tests only (never mixed with another)
        python = seriestests.find_python(t.root, sys.executable)
        version = t.version or t.load_pin().version
        found = seriestests.series_test_files(t.upstream_dir)
        print(f"series tests on sglang {version} ({t.upstream_dir}): {len(found)} file(s)", flush=True)
        # Paths (in that tree) select tests; everything else is a pytest option (-k expr, -x, ...).
        paths = [a for a in rest if not a.startswith("-") and (t.upstream_dir / a).exists()]
        options = [a for a in rest if a not in paths]
        result = seriestests.run(python, t.upstream_dir, select=paths or None, extra=options, stream=True)
        print(f"sglang {version}: {result.summary()}")
        return 0 if result.ok else 1
    # Paths choose what runs (default: the project's tests and the series' own); options pass on.
    paths = [a for a in rest if not a.startswith("-") and (t.root / a.split("::")[0]).exists()]
    options = [a for a in rest if a not in paths]
    series_tests = [f"{t.upstream_dir.name}/{p}" for p in seriestests.series_test_files(t.upstream_dir)]
    targets = paths or ["tests", *series_tests]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *targets, *options], cwd=t.root, check=False
    ).returncode


def _build_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="VERSION", help="build a carried release's tree")
    p.add_argument("--arch", action="append", help="architecture from kernels/manifest.toml (repeatable)")
    p.add_argument("--cache", type=Path, help="JIT cache folder (default build/jit-cache)")


def _build(call: Call) -> int:
    from bf16k import build

    build.build(call.target(), archs=call.ns.arch or None, cache=call.ns.cache)
    return 0


def _bisect_options(p: argparse.ArgumentParser) -> None:
    _upstream_option(p)
    p.add_argument("--no-tests", action="store_true", help="skip the series' own tests (import/compile only)")


def _bisect(call: Call) -> int:
    from bf16k import bisect

    bisect.report(bisect.run(call.target(), run_tests=not call.ns.no_tests))
    return 0


def _measure_setup_options(p: argparse.ArgumentParser) -> None:
    from bf16k.freshclone import RESULT

    p.add_argument("--workdir", help="where the scratch folder goes (default: the system's temporary folder)")
    p.add_argument("--out", help=f"result file, relative to the repository (default {RESULT})")
    p.add_argument("--keep", action="store_true", help="keep the scratch clone, venvs and caches")


def _measure_setup(call: Call) -> int:
    from bf16k import freshclone

    root = call.root
    return freshclone.measure_setup(
        root,
        root / (Path(call.ns.out) if call.ns.out else freshclone.RESULT),
        workdir=Path(call.ns.workdir) if call.ns.workdir else None,
        keep=call.ns.keep,
    )


# --------------------------------------------------------------------------- carrying


def _rebase_options(p: argparse.ArgumentParser) -> None:
    from bf16k.seriestests import PYTHON_ENV

    p.add_argument(
        "target", nargs="?", help="a release on PyPI (0.5.23) or a git ref (v0.5.23; needs the network)"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--continue", dest="cont", action="store_true", help="go on after resolving a stop")
    mode.add_argument("--abort", action="store_true", help="stop and restore everything as it was")
    mode.add_argument(
        "--skip",
        action="store_true",
        help="drop the stopped patch; only when the release already contains its change",
    )
    mode.add_argument(
        "--recarry",
        action="store_true",
        help="re-carry every series/next/<version>/ (or the one given) from today's series/, replaying "
        "its recorded resolutions; --continue goes on to the next release",
    )
    p.add_argument(
        "-m",
        "--message",
        action="append",
        metavar="TEXT",
        help="with --continue: why, one line per hand-made hunk: '<file> (<scope>): <why>' (repeatable)",
    )
    p.add_argument("--message-file", metavar="PATH", help="with --continue: the reasons, from a file")
    p.add_argument(
        "--commit",
        metavar="SHA",
        help="the release's upstream commit: the pin moves and the carried series becomes series/",
    )
    p.add_argument("--version", help="release version of a git-ref target that is not a vX.Y.Z tag")
    p.add_argument("--wheel-file", type=Path, help="use this copy of the target release's wheel")
    p.add_argument("--force", action="store_true", help="re-carry over an existing series/next/<version>/")
    p.add_argument(
        "--allow-older",
        action="store_true",
        help="port the series to a release older than the pin (into series/next/<version>/)",
    )
    p.add_argument(
        "--python",
        metavar="PATH",
        help=f"the Python that runs the series' tests (default: ${PYTHON_ENV}, else a venv under .nox/)",
    )


def _rebase(call: Call) -> int:
    from bf16k.carry import engine
    from bf16k.carry.gate import series_gate

    ns, root, gate = call.ns, call.root, call.gate or series_gate
    if (ns.message or ns.message_file) and not ns.cont:
        raise ToolError("-m/--message-file go with --continue (the reasons for the hunks you resolved)")
    if ns.abort:
        print(engine.abort(root))
        return 0
    if ns.cont or ns.skip:
        if ns.target or ns.recarry:
            raise ToolError("--continue/--skip take no target: they resume the rebase in progress")
        if ns.skip:
            outcome = engine.skip(root, gate=gate, python=ns.python)
        else:
            messages = list(ns.message or []) + (
                [Path(ns.message_file).read_text()] if ns.message_file else []
            )
            outcome = engine.resume(root, gate=gate, messages=messages, python=ns.python)
    elif ns.recarry:
        versions = [ns.target] if ns.target else project.carried_versions(root)
        if not versions:
            raise ToolError("nothing to re-carry: no carried series under series/next/")
        if ns.commit:
            raise ToolError(
                "--recarry re-carries series/next/<version>/; --commit moves the pin: one at a time"
            )
        print(
            f"re-carrying {', '.join(versions)} from today's series/ (recorded resolutions replayed)",
            flush=True,
        )
        outcome = engine.start(
            root,
            versions[0],
            gate=gate,
            wheel_file=ns.wheel_file,
            force=True,
            allow_older=True,
            python=ns.python,
            queue=versions[1:],
        )
    else:
        if not ns.target:
            raise ToolError(
                "give a target: a release (0.5.23) or a git ref (v0.5.23); or --continue/--skip/--abort"
            )
        outcome = engine.start(
            root,
            ns.target,
            gate=gate,
            commit=ns.commit,
            version=ns.version,
            wheel_file=ns.wheel_file,
            force=ns.force,
            allow_older=ns.allow_older,
            python=ns.python,
        )
    while outcome.stop is None and outcome.queue:  # --recarry: each release a carry of its own
        print(outcome.message, flush=True)
        nxt, rest = outcome.queue[0], outcome.queue[1:]
        print(f"\nnext re-carry: sglang {nxt}", flush=True)
        outcome = engine.start(
            root, nxt, gate=gate, force=True, allow_older=True, python=outcome.python, queue=rest
        )
    print(outcome.message)
    return 1 if outcome.stop else 0


def _rebase_check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--releases", nargs="+", metavar="VERSION", help="releases to try (default: the index's)")
    p.add_argument("--output", metavar="PATH", help="also write the markdown report here")
    p.add_argument(
        "--no-tests", action="store_true", help="skip the carried series' tests (apply + round trip only)"
    )
    p.add_argument("--python", metavar="PATH", help="the Python that runs the series' tests")


def _rebase_check(call: Call) -> int:
    from bf16k.carry import check

    ns = call.ns
    ok, text = check.rebase_check(call.root, ns.releases, run_tests=not ns.no_tests, python=ns.python)
    print(text)
    if ns.output:
        Path(ns.output).write_text(text)
    return 0 if ok else 1


def _range_diff_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream", metavar="VERSION", help="carried release (default: the newest under series/next/)"
    )
    p.add_argument("--output", metavar="PATH", help="markdown file (default build/range-diff-VERSION.md)")


def _range_diff(call: Call) -> int:
    from bf16k import rangediff

    root = call.root
    version = call.ns.upstream
    if version is None:
        versions = project.carried_versions(root)
        if not versions:
            raise ToolError("no carried series under series/next/: carry one with `nox -s rebase -- VERSION`")
        version = versions[-1]
    _, md = rangediff.series_range_diff(root, version)
    out = Path(call.ns.output) if call.ns.output else root / "build" / f"range-diff-{version}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(md)
    print(f"(written to {out})")
    return 0


# --------------------------------------------------------------------------- what the series becomes


def _wheel_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="VERSION", help="build from a carried release (series/next/VERSION)")
    p.add_argument(
        "--wheel-file", type=Path, help="use this copy of the pinned upstream wheel (sha256-checked)"
    )
    p.add_argument("--out", type=Path, help="output folder (default build/wheel)")


def _wheel(call: Call) -> int:
    import os

    from bf16k import series, wheel

    t = call.target()
    built = wheel.build_wheel(t, wheel_file=call.ns.wheel_file, out_dir=call.ns.out)
    n = built.counts()
    shown = (
        os.path.relpath(built.path, Path.cwd()) if built.path.is_relative_to(Path.cwd()) else str(built.path)
    )
    print(f"wheel: {shown}")
    print(f"sha256: {built.sha256}")
    print(
        f"version: {built.version} ({t.label}, {len(series.read_order(t.series_dir))} patches; "
        f"{n['M']} changed, {n['A']} new, {n['D']} deleted file(s))"
    )
    print(f"install: pip install --no-deps {shown}")
    return 0


def _pr_drafts_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream",
        metavar="VERSION",
        help="draft against this release (default: the newest carried one the map fits)",
    )
    p.add_argument(
        "--pr-url",
        action="append",
        default=[],
        metavar="ID=URL|PATCH=URL",
        help="record an opened PR: rewrite the Forwarded: trailer of that PR's patches (or one patch) and re-export",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="also run each PR's own tests on its base, on the pin and the newest carried release (slow)",
    )
    p.add_argument("--out", type=Path, help="output folder (default build/pr-drafts/<version>)")


def _pr_drafts(call: Call) -> int:
    from bf16k import prs, series
    from bf16k.prdrafts import drafts
    from bf16k.prdrafts import urls as prurls

    ns, root = call.ns, call.root
    if ns.upstream:
        t = project.target(root, ns.upstream)
        chosen = f"sglang {t.load_pin().version}, chosen with --upstream"
    else:
        t, chosen = drafts.newest_target(root)
    if ns.pr_url:
        urls = prurls.parse_pr_urls(ns.pr_url, series.read_order(t.series_dir), prs.load(t))
        changed = prurls.record_pr_urls(t, urls)
        for name in changed:
            print(f"{name}: Forwarded: {urls[name]}")
        if not changed:
            print("Forwarded: already up to date")
    out, releases = drafts.generate_checked(t, chosen, ns.out, check=ns.check)
    shown = out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out
    n = len(prs.load(t).prs)
    print(f"pr-drafts: {n} PR draft(s) + cover for {chosen} in {shown}")
    if ns.check:
        code, lines = drafts.check_verdict(releases)
        for line in lines:
            print(f"pr-drafts --check: {line}")
        return code
    return 0


def _upstream_lint_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="VERSION", help="lint that carried series' applied tree")
    p.add_argument("--ruff", help="the ruff executable (default: ruff on PATH)")


def _upstream_lint(call: Call) -> int:
    from bf16k import upstreamlint

    report = upstreamlint.run(call.target(), call.ns.ruff)
    for note in report.notes:
        print(f"upstream-lint: {note}")
    for f in report.findings:
        print(f"upstream-lint: {f}")
    if report.findings:
        print(
            f"upstream-lint: {len(report.findings)} finding(s); fix them in the patch commits and `nox -s export`"
        )
        return 1
    print("upstream-lint: the series meets upstream's format, production-code and test-registration rules")
    return 0


# --------------------------------------------------------------------------- the table


_SOURCE_COMMANDS = (
    Command("apply", "apply the series on upstream at the pin", _apply_options, _apply),
    Command("export", "regenerate series/ from the patch commits", _export_options, _export),
    Command("check", "hygiene, header lint, gitlink, apply + export round trip", _source_options, _check),
    Command("status", "what is applied, against which base, drift from series/", _upstream_option, _status),
)
COMMANDS: tuple[Command, ...] = (
    *_SOURCE_COMMANDS,
    Command(
        "test-env",
        "run python in the one environment the test sessions share (.nox/test-env)",
        _test_env_options,
        _test_env,
    ),
    Command(
        "tests",
        "the project's tests (tooling, verification, series); --upstream V: that tree's series tests",
        _tests_options,
        _tests,
        passes_rest=True,
    ),
    Command("build", "compile every CUDA kernel instantiation the bf16 path uses", _build_options, _build),
    Command(
        "bisect",
        "apply each prefix of the series and check it imports, compiles, passes",
        _bisect_options,
        _bisect,
    ),
    Command(
        "measure-setup",
        "time and weigh README's set-up on a fresh clone (for README's figures)",
        _measure_setup_options,
        _measure_setup,
    ),
    Command("rebase", "carry the series to another upstream release (or git ref)", _rebase_options, _rebase),
    Command(
        "rebase-check",
        "what carrying the series to each newer release meets; every carried series still holds",
        _rebase_check_options,
        _rebase_check,
    ),
    Command(
        "range-diff",
        "classify each patch of series/ against a carried series (PR description markdown)",
        _range_diff_options,
        _range_diff,
    ),
    Command("wheel", "a patched sglang wheel (local version +bf16k.<series hash>)", _wheel_options, _wheel),
    Command(
        "pr-drafts",
        "the upstream PR set: a draft per PR, a cover with the map, git am-ready patches",
        _pr_drafts_options,
        _pr_drafts,
    ),
)
# Not a subcommand: `python -m bf16k.upstreamlint` (what `nox -s lint` runs, in the venv that holds ruff).
UPSTREAM_LINT = Command("upstream-lint", "upstream-format lint", _upstream_lint_options, _upstream_lint)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bf16k", description="bf16 index-K patch series for SGLang")
    parser.add_argument("--root", help="product repository root (default: found from the cwd)")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help)
        command.options(p)
        p.set_defaults(spec=command)
    return parser


def main(argv: Sequence[str] | None = None, *, gate: Gate | None = None) -> int:
    """``gate``: the carry's test gate for `rebase` (default: the series' own tests and bisect)."""
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    command: Command = ns.spec
    if rest and not command.passes_rest:  # only `tests` passes arguments on (to pytest)
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return command.run(Call(ns, rest if command.passes_rest else [], gate))
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def upstream_lint_main(argv: Sequence[str] | None = None) -> int:
    """`python -m bf16k.upstreamlint`: the upstream-format lint as a program of its own."""
    parser = argparse.ArgumentParser(prog="python -m bf16k.upstreamlint", description=UPSTREAM_LINT.help)
    parser.add_argument("--root", help="product repository root (default: found from the cwd)")
    UPSTREAM_LINT.options(parser)
    ns = parser.parse_args(argv)
    try:
        return UPSTREAM_LINT.run(Call(ns))
    except ToolError as exc:
        print(f"upstream-lint: error: {exc}", file=sys.stderr)
        return 2
