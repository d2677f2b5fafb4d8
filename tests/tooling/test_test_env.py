"""One test environment: the sessions that need `.[test]` share `.nox/test-env`, made once.

The noxfile is read as written (parsed, not imported); the environment itself is made for real
(a venv and pip) around a one-file project, so a rerun that reinstalls, a temporary folder left
behind, or a failure that is swallowed fails here.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from bf16k import freshclone, testenv

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("tests", "verify_recall", "bisect", "bench")


def _sessions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _decorator_python(node: ast.FunctionDef) -> object:
    for deco in node.decorator_list:
        if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "nox.session":
            for kw in deco.keywords:
                if kw.arg == "python":
                    return (
                        ast.literal_eval(kw.value)
                        if isinstance(kw.value, ast.Constant)
                        else ast.unparse(kw.value)
                    )
    return None


def test_the_test_sessions_run_in_the_one_shared_environment() -> None:
    functions = _sessions()
    for name in SHARED:
        node = functions[name]
        # python=False: nox makes no venv of its own for the session ...
        assert _decorator_python(node) is False, f"session {name} has its own nox venv"
        # ... and the session's Python work runs in the shared one.
        calls = {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
        assert "_in_test_env" in calls, f"session {name} does not run in the shared test environment"
    # build keeps its own venv for a deployment's torch (system site-packages); without one it
    # builds in the shared environment rather than install a second torch.
    assert "_in_test_env" in {
        ast.unparse(c.func) for c in ast.walk(functions["build"]) if isinstance(c, ast.Call)
    }
    assert "torch==" not in ast.unparse(functions["build"])
    helper = ast.unparse(functions["_in_test_env"])
    assert "'test-env'" in helper and "session.name" in helper


def _project(tmp_path: Path) -> Path:
    """A product-shaped folder (pin.toml, series/) whose test extra is empty: pip has little to do."""
    root = tmp_path / "proj"
    (root / "series").mkdir(parents=True)
    (root / "pin.toml").write_text("")
    (root / "probe_pkg.py").write_text("VALUE = 1\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "probe-pkg"\nversion = "0"\n\n[project.optional-dependencies]\ntest = []\n\n'
        '[tool.setuptools]\npy-modules = ["probe_pkg"]\n'
    )
    return root


def _test_env(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bf16k", "--root", str(root), "test-env", "--label", "probe", "--", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


SHOW = "import sys, tempfile, probe_pkg; print('prefix', sys.prefix); print('tmp', tempfile.gettempdir())"


def _shown(out: str, key: str) -> str:
    match = re.search(rf"^{key} (.+)$", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def test_the_environment_is_made_once_reused_and_remade_when_the_project_changes(tmp_path: Path) -> None:
    root = _project(tmp_path)
    env = root / ".nox" / "test-env"
    first = _test_env(root, "-c", SHOW)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "installing .[test] into .nox/test-env" in first.stdout
    assert Path(_shown(first.stdout, "prefix")) == env  # the project is installed there
    tmp = Path(_shown(first.stdout, "tmp"))
    assert tmp.parent == root / "build" / "tmp" and tmp.name.startswith("probe-")
    assert not tmp.exists()  # a run that passed leaves no temporary files

    again = _test_env(root, "-c", SHOW)
    assert again.returncode == 0 and "installing" not in again.stdout
    assert Path(_shown(again.stdout, "prefix")) == env

    # pyproject.toml changed: the stamp no longer matches and pip runs again, in the same venv.
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + "# changed\n")
    changed = _test_env(root, "-c", SHOW)
    assert changed.returncode == 0 and "installing .[test]" in changed.stdout
    assert "creating" not in changed.stdout


def test_a_failed_run_keeps_its_temporary_files_once_and_says_where(tmp_path: Path) -> None:
    root = _project(tmp_path)
    fail = "import sys, tempfile, pathlib; pathlib.Path(tempfile.gettempdir(), 'left').write_text('x'); sys.exit(3)"
    proc = _test_env(root, "-c", fail)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the command's own exit status
    kept = re.search(r"kept in (build/tmp/probe-\d+)", proc.stdout)
    assert kept and (root / kept.group(1) / "left").is_file(), proc.stdout
    # The next run of the label removes it (its process is gone) and cleans up after itself.
    ok = _test_env(root, "-c", "pass")
    assert ok.returncode == 0 and not (root / kept.group(1)).exists()
    assert list((root / "build" / "tmp").iterdir()) == []


def test_venvs_of_earlier_versions_are_named_with_the_room_they_take(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / ".nox" / "tests").mkdir(parents=True)
    (root / ".nox" / "tests" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert testenv.old_session_venvs(root) == [root / ".nox" / "tests"]
    proc = _test_env(root, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    assert "note: .nox/tests is the venv an earlier version made" in proc.stdout
    assert "`rm -rf .nox/tests`" in proc.stdout


def test_readme_sets_up_in_two_commands() -> None:
    commands = freshclone.readme_setup_commands((ROOT / "README.md").read_text())
    assert commands == ["nox -s apply build", "nox -s tests"]


def test_readme_figures_are_the_committed_fresh_clone_measurement() -> None:
    data = json.loads((ROOT / freshclone.RESULT).read_text())
    assert data["complete"] is True, "the committed measurement is incomplete: a step failed"
    commands = freshclone.readme_setup_commands((ROOT / "README.md").read_text())
    assert [s["command"] for s in data["steps"]] == [*commands, *freshclone.NEXT_STEPS]
    assert all(s["exit_status"] == 0 for s in data["steps"])
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set up") : readme.index("## Sessions")]
    assert freshclone.readme_table(data) in setup, "README's set-up figures differ from the measurement"
    # What the shared environment is for: a fresh clone following README stays under 8 GiB.
    assert data["clone_gib_peak"] < 8
