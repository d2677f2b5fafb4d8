"""Command line: ``python -m bf16k <command> [options]``; nox sessions call exactly this."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bf16k import patches, project
from bf16k.errors import ToolError

Handler = Callable[[argparse.Namespace], int]


def _target(ns: argparse.Namespace) -> project.Target:
    root = project.find_root(Path(ns.root) if ns.root else None)
    return project.target(root, getattr(ns, "upstream", None))


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", metavar="VERSION", help="work on a carried release (series/next/VERSION)")
    p.add_argument(
        "--source", choices=("auto", "submodule", "wheel"), default="auto",
        help="where upstream comes from (auto: the submodule if it can be had, else the PyPI wheel)",
    )  # fmt: skip
    p.add_argument("--wheel-file", type=Path, help="use this copy of the pinned wheel (sha256-checked)")


def cmd_apply(ns: argparse.Namespace) -> int:
    patches.apply(_target(ns), source=ns.source, wheel_file=ns.wheel_file, stop_if_dirty=ns.stop_if_dirty)
    return 0


def cmd_export(ns: argparse.Namespace) -> int:
    patches.export(_target(ns), force=ns.force)
    return 0


def cmd_check(ns: argparse.Namespace) -> int:
    report = patches.check(_target(ns), source=ns.source, wheel_file=ns.wheel_file)
    for note in report.notes:
        print(note)
    if report.problems:
        print(f"check failed: {len(report.problems)} problem(s)", file=sys.stderr)
        for problem in report.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print("check passed")
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    for line in patches.status(_target(ns)):
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bf16k", description="bf16 index-K patch series for SGLang")
    parser.add_argument("--root", help="product repository root (default: found from the cwd)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("apply", help="apply the series on upstream at the pin")
    _add_source(p)
    p.add_argument("--stop-if-dirty", action="store_true", help="stop instead of saving uncommitted work to a ref")
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("export", help="regenerate series/ from the patch commits")
    p.add_argument("--upstream", metavar="VERSION")
    p.add_argument("--force", action="store_true", help="export even if series/ changed since apply")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("check", help="hygiene, header lint, gitlink, apply + export round trip")
    _add_source(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("status", help="what is applied, against which base, drift from series/")
    p.add_argument("--upstream", metavar="VERSION")
    p.set_defaults(func=cmd_status)

    from bf16k import extra_commands  # late: keeps the core commands importable on their own

    extra_commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    if rest and not getattr(ns, "wants_rest", False):  # only `tests` passes arguments on (to pytest)
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(ns.func(ns, rest) if getattr(ns, "wants_rest", False) else ns.func(ns))
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
