"""Commands beyond apply/export/check/status, registered on the CLI."""

from __future__ import annotations

import argparse
from pathlib import Path

from bf16k import project
from bf16k.errors import ToolError


def _target(ns: argparse.Namespace) -> project.Target:
    root = project.find_root(Path(ns.root) if ns.root else None)
    return project.target(root, getattr(ns, "upstream", None))


def cmd_build(ns: argparse.Namespace) -> int:
    from bf16k import build

    build.build(_target(ns), archs=ns.arch or None, cache=ns.cache)
    return 0


def cmd_bisect(ns: argparse.Namespace) -> int:
    from bf16k import bisect

    bisect.report(bisect.run(_target(ns), run_tests=not ns.no_tests))
    return 0


def cmd_test_env(ns: argparse.Namespace) -> int:
    from bf16k import testenv

    args = list(ns.args)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise ToolError("test-env needs the arguments for its python, e.g. `test-env -- -m pytest tests`")
    root = project.find_root(Path(ns.root) if ns.root else None)
    return testenv.run(root, args, label=ns.label)


def cmd_tests(ns: argparse.Namespace, rest: list[str]) -> int:
    """The project's tests; with --upstream, the series' own tests on that release's tree alone."""
    import subprocess
    import sys

    from bf16k import patches, seriestests

    t = _target(ns)
    patches.apply(t)
    if ns.upstream is not None:  # one release's tree, its series tests only (never mixed with another)
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
    return subprocess.run([sys.executable, "-m", "pytest", *targets, *options], cwd=t.root, check=False).returncode


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "test-env", help="run python in the one environment the test sessions share (.nox/test-env)"
    )
    p.add_argument("--label", default="test-env", help="names its temporary folder build/tmp/LABEL-PID")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments for its python")
    p.set_defaults(func=cmd_test_env)

    p = sub.add_parser(
        "tests", help="the project's tests (tooling, verification, series); --upstream V: that tree's series tests"
    )
    p.add_argument("--upstream", metavar="VERSION", help="only the series' tests, on this carried release's tree")
    p.set_defaults(func=cmd_tests, wants_rest=True)

    p = sub.add_parser("build", help="compile every CUDA kernel instantiation the bf16 path uses")
    p.add_argument("--upstream", metavar="VERSION", help="build a carried release's tree")
    p.add_argument("--arch", action="append", help="architecture from kernels/manifest.toml (repeatable)")
    p.add_argument("--cache", type=Path, help="JIT cache folder (default build/jit-cache)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("bisect", help="apply each prefix of the series and check it imports, compiles, passes")
    p.add_argument("--upstream", metavar="VERSION")
    p.add_argument("--no-tests", action="store_true", help="skip the series' own tests (import/compile only)")
    p.set_defaults(func=cmd_bisect)

    from bf16k import freshclone, prdrafts, rangediff, rebase, wheel

    freshclone.register(sub)
    rebase.register(sub)
    rangediff.register(sub)
    wheel.register(sub)
    prdrafts.register(sub)
