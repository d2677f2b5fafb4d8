"""The front door stays in step with the sessions: README, Makefile and CI name every nox session.

Read from the real noxfile (its decorators, parsed, not imported), so adding a session without
documenting it, or tagging one `ci` without running it in `.ci/run`, fails here. Also: CI's
own disk check stops before it changes anything.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Session:
    name: str
    doc: str
    tags: tuple[str, ...]


def nox_sessions() -> list[Session]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    found: list[Session] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "nox.session":
                tags: tuple[str, ...] = ()
                for kw in deco.keywords:
                    if kw.arg == "tags":
                        tags = tuple(ast.literal_eval(kw.value))
                found.append(Session(node.name, ast.get_docstring(node) or "", tags))
    return found


def test_the_noxfile_has_the_sessions_the_design_names() -> None:
    names = {s.name for s in nox_sessions()}
    # README's sessions; a rename here is a user-visible break and must be deliberate.
    assert {
        "apply",
        "build",
        "verify_recall",
        "bench",
        "check",
        "export",
        "status",
        "rebase",
        "range_diff",
        "rebase_check",
        "pr_drafts",
        "wheel",
        "tests",
        "bisect",
        "lint",
    } <= names


def test_every_session_has_a_one_line_docstring() -> None:
    for s in nox_sessions():
        assert s.doc and "\n" not in s.doc.strip(), f"session {s.name}: `nox -l` needs a one-line docstring"


def test_readme_documents_every_session_with_an_example() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)` \|(.*)$", readme, re.MULTILINE)}
    for s in nox_sessions():
        assert s.name in rows, f"README's Sessions table has no row for `{s.name}`"
        assert f"nox -s {s.name}" in rows[s.name] or f"nox -s apply {s.name}" in rows[s.name], (
            f"README's row for `{s.name}` has no example command"
        )


def test_makefile_wraps_every_session() -> None:
    makefile = (ROOT / "Makefile").read_text()
    wrapped = set(re.findall(r"\$\(NOX\) -s ([a-z_]+) --", makefile))
    missing = {s.name for s in nox_sessions()} - wrapped
    assert not missing, f"no Makefile target runs: {sorted(missing)}"


def test_ci_runs_every_ci_session_and_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    # `stage NAME nox -s SESSION... [-- OPTIONS]`: each stage's time goes to the log.
    ran = set(re.findall(r"^stage \S+ nox -s ([a-z_ ]+?)\s*(?:-- [^#]*)?(?:#|$)", ci, re.MULTILINE))
    ran_sessions = {name for line in ran for name in line.split()}
    ci_tagged = {s.name for s in nox_sessions() if "ci" in s.tags}
    assert ci_tagged <= ran_sessions, f"tagged ci but not in .ci/run: {sorted(ci_tagged - ran_sessions)}"
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set up") : readme.index("## Sessions")]
    for command in ("nox -s apply build", "nox -s tests"):
        assert command in setup, f"README's set-up section lost `{command}`"
        assert re.search(rf"^stage \S+ {re.escape(command)}\b", ci, re.MULTILINE), (
            f".ci/run does not run `{command}`"
        )


def test_ci_refuses_a_disk_without_room_before_changing_anything() -> None:
    # The real script on the real disk, asked for more room than any disk has: it must stop at
    # once with the figures, before creating its venv (a full disk once failed CI mid-install).
    before = sorted(p.name for p in ROOT.iterdir())
    proc = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")],
        env={**os.environ, "CI_MIN_FREE_GIB": str(10**9)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    match = re.search(r"needs about (\d+) GiB free on the disk holding (.+); (\d+) GiB free", proc.stderr)
    assert match, proc.stderr
    assert int(match.group(1)) == 10**9
    assert Path(match.group(2)) == ROOT
    # Its reading of df agrees with the kernel's count of free blocks (to the GiB it rounds to).
    assert abs(int(match.group(3)) - shutil.disk_usage(ROOT).free // 2**30) <= 1
    assert sorted(p.name for p in ROOT.iterdir()) == before
