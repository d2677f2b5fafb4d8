"""What a PR's own tree (its base and its patches) says: the tests it adds and how upstream's CI
parser reads their registration, the server-argument docs rows it needs, whether upstream's
formatter is content; read while each PR is applied with ``git am`` on its base (:func:`check_release`),
whose tests run there with ``--check``."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from bf16k import prs, series, seriestests, upstream, upstreamlint
from bf16k.errors import ToolError
from bf16k.project import Target


@dataclass
class TestFile:
    path: str
    how: str  # "added by <patch>" / "changed by <patch>"
    registrations: str  # upstream's parser's reading, or why it could not be read
    problems: list[str] = field(default_factory=list)


@dataclass
class DocsRow:
    flag: str
    row: str  # the markdown table row
    source: str  # where the text came from (the option's declaration)


def _arg_fields(text: str) -> dict[str, dict[str, object]]:
    """Server-argument fields declared as ``name: A[type, "help" | Arg(...)] = default``."""
    out: dict[str, dict[str, object]] = {}
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        ann = node.annotation
        if not (
            isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) >= 2
        ):
            continue
        typ, meta = ann.slice.elts[0], ann.slice.elts[1]
        info: dict[str, object] = {"type": ast.unparse(typ)}
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            info["help"] = meta.value
        elif isinstance(meta, ast.Call):
            for kw in meta.keywords:
                if kw.arg in ("help", "choices", "fallback"):
                    try:
                        info[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        info[kw.arg] = ast.unparse(kw.value)
        try:
            info["default"] = ast.literal_eval(node.value) if node.value is not None else None
        except ValueError:
            info["default"] = ast.unparse(node.value) if node.value is not None else None
        out[node.target.id] = info
    return out


def docs_row(flag: str, info: dict[str, object]) -> str:
    """A row of docs/advanced_features/server_arguments.md: | Argument | Description | Defaults | Options |."""
    help_text = re.sub(
        r"(--[a-z0-9-]+(?: [a-z0-9]+)?)", lambda m: f"`{m.group(1)}`", str(info.get("help", ""))
    )
    help_text = help_text.replace("|", "\\|")
    default = (
        info.get("fallback") if info.get("default") is None and info.get("fallback") else info.get("default")
    )
    choices = info.get("choices")
    if isinstance(choices, list):
        options = ", ".join(f"`{c}`" for c in choices)
    elif info.get("type") == "bool":
        options = "bool flag (set to enable)"
    else:
        options = f"Type: {info.get('type')}"
    return f"| `{flag}` | {help_text} | `{default}` | {options} |"


def read_docs_rows(tree: Path, flags: tuple[str, ...]) -> list[DocsRow]:
    """The docs row of each flag, from its declaration in the tree's server-argument fields."""
    rows = []
    decls = sorted((tree / "python/sglang/srt/arg_groups/fields").glob("*.py"))
    fields_by_file = [(p, _arg_fields(p.read_text())) for p in decls]
    for flag in flags:
        name = flag.lstrip("-").replace("-", "_")
        found = next(((p, f[name]) for p, f in fields_by_file if name in f), None)
        if found is None:
            raise ToolError(f"{flag}: no server-argument field {name} in {tree.name}'s arg_groups/fields")
        rows.append(DocsRow(flag, docs_row(flag, found[1]), found[0].relative_to(tree).as_posix()))
    return rows


def read_tests(tree: Path, series_dir: Path, pr: prs.PR, ci: ModuleType | None) -> list[TestFile]:
    """The PR's test files (added or changed by its patches) with upstream's reading of their registration."""
    out: list[TestFile] = []
    for path in prs.pr_test_files(series_dir, pr):
        by = next(n for n in pr.patches if path in series.parse_patch(series_dir / n).files)
        new = path in series.parse_patch(series_dir / by).new_files
        entry = TestFile(path, f"{'added' if new else 'changed'} by {by}", "not read (no tree)")
        file = tree / path
        if ci is not None and file.is_file():
            parsed = upstreamlint.parse_test(ci, file.read_text(), path)
            entry.registrations = "; ".join(r.label for r in parsed.registrations) or "none"
            entry.problems = upstreamlint.test_problems(parsed)
        out.append(entry)
    return out


def format_result(tree: Path, t: Target, pr: prs.PR) -> str:
    """What ruff (upstream's format and isort settings) says about the PR's Python files in ``tree``."""
    files = sorted(
        {
            f
            for name in pr.patches
            for f in series.parse_patch(t.series_dir / name).files
            if f.endswith(".py") and (tree / f).is_file()
        }
    )
    ruff = upstreamlint.ruff_if_any(t.root)
    if not files:
        return "no Python files"
    if ruff is None:
        return "not checked when this draft was written (no ruff at hand)"
    found = upstreamlint.ruff_findings(tree, files, ruff)
    if found:
        return f"{len(found)} finding(s) from `ruff format --check` / ruff's isort over its {len(files)} Python files"
    return f"its {len(files)} Python files are `ruff format` and ruff-isort clean"


# --------------------------------------------------------------------------- the git am (and test) check


@dataclass
class PRState:
    """What the PR's own tree (its base + its patches) says, read during the git am check."""

    tests: list[TestFile] = field(default_factory=list)
    docs: list[DocsRow] = field(default_factory=list)
    format: str = (
        ""  # ruff format / isort (upstream's settings) over the PR's Python files, or why not checked
    )


def check_release(
    t: Target,
    prmap: prs.PRMap,
    patch_dirs: dict[str, Path],
    label: str,
    python: seriestests.TestPython | None,
    states: dict[str, PRState] | None = None,
    up: upstream.Upstream | None = None,
) -> prs.ReleaseCheck:
    """`git am` each PR on its base in a scratch clone of ``t``'s upstream (``up``, else the base
    `apply` recorded); run its tests with ``python``."""
    rc = prs.ReleaseCheck(label, checked=True)
    try:
        with prs.base_clone(t, up) as (scratch, base):
            ci = (
                upstreamlint.load_ci_register(scratch)
                if (scratch / upstreamlint.CI_REGISTER).is_file()
                else None
            )
            base_note = f"`{base.base[:12]}` ({base.source})"

            def on_applied(pr: prs.PR, check: prs.PRCheck) -> None:
                below = prmap.prs[: prmap.prs.index(pr)]
                check.base = base_note + "".join(f" + ({p.id})" for p in below)
                check.below = [p.id for p in below]
                check.tests = prs.pr_test_files(t.series_dir, pr)
                if states is not None:
                    states[pr.id] = PRState(
                        read_tests(scratch, t.series_dir, pr, ci),
                        read_docs_rows(scratch, pr.docs) if pr.docs else [],
                        format_result(scratch, t, pr),
                    )
                if python is not None:
                    present = [f for f in check.tests if (scratch / f).is_file()]
                    check.run = (
                        seriestests.run(python, scratch, select=present)
                        if present
                        else seriestests.TestRun(scratch, absent=True)
                    )
                    print(f"pr-drafts --check: {label}: PR {pr.id}: {check.summary()}", flush=True)

            rc.prs = prs.am_prs(scratch, patch_dirs, prmap, on_applied)
    except ToolError as exc:
        rc.checked, rc.why_not = False, [str(exc).splitlines()[0].replace(f"{t.root}/", "")]
    return rc
