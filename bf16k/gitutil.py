"""Git with a pinned configuration.

Every git call the tooling makes goes through :func:`git`, which hides the user's global and
system configuration and pins the options that change ``format-patch``/``am`` output. That is
what makes an export byte-identical on any machine (Electron learned this the hard way with
``diff.renames`` and attribute-dependent hunk headers).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from bf16k.errors import ToolError

# Identity used for commits the tooling creates itself (base import, saved work, `git am`
# committer). Patch authors are kept from the patches.
TOOL_NAME = "bf16k series tooling"
TOOL_EMAIL = "bf16k@localhost"

# Options that influence the bytes of exported patches or the behaviour of `am`/`apply`.
PINNED_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.attributesFile", os.devnull),
    ("core.excludesFile", os.devnull),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.quotePath", "true"),
    ("core.abbrev", "12"),
    ("diff.renames", "true"),
    ("diff.algorithm", "myers"),
    ("diff.context", "3"),
    ("diff.interHunkContext", "0"),
    ("diff.indentHeuristic", "true"),
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
    ("diff.suppressBlankEmpty", "false"),
    ("format.signature", ""),
    ("format.headers", ""),
    ("format.coverLetter", "false"),
    ("format.numbered", "false"),
    ("am.threeWay", "false"),
    ("am.keepcr", "true"),
    ("apply.whitespace", "nowarn"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("rerere.enabled", "false"),
    ("gc.auto", "0"),
    ("init.defaultBranch", "main"),
    ("advice.detachedHead", "false"),
    ("user.name", TOOL_NAME),
    ("user.email", TOOL_EMAIL),
    ("protocol.file.allow", "always"),
)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    env["TZ"] = "UTC"
    # A caller's GIT_DIR/GIT_WORK_TREE (e.g. from a hook) would redirect every call.
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_EDITOR"):
        env.pop(var, None)
    env["GIT_EDITOR"] = "true"
    if extra:
        env.update(extra)
    return env


def git(
    args: Sequence[str],
    cwd: Path,
    *,
    check: bool = True,
    input_bytes: bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git <args>`` in ``cwd`` with the pinned configuration; raise ToolError on failure."""
    cmd = ["git"]
    for key, value in PINNED_CONFIG:
        cmd += ["-c", f"{key}={value}"]
    cmd += list(args)
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            input=input_bytes,
            capture_output=True,
            env=git_env(env),
            timeout=timeout,
            check=False,  # the caller reads the exit status and turns it into a ToolError
        )
    except subprocess.TimeoutExpired as exc:
        raise ToolError(f"git {' '.join(args)} timed out after {timeout:.0f} s in {cwd}") from exc
    except FileNotFoundError as exc:
        raise ToolError("git is not installed or not on PATH") from exc
    if check and proc.returncode != 0:
        raise ToolError(
            f"git {' '.join(args)} failed in {cwd} (exit {proc.returncode}):\n"
            + proc.stderr.decode(errors="replace").strip()
        )
    return proc


def out(
    args: Sequence[str],
    cwd: Path,
    *,
    check: bool = True,
    input_bytes: bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> str:
    """stdout of a git call, stripped."""
    proc = git(args, cwd, check=check, input_bytes=input_bytes, env=env, timeout=timeout)
    return proc.stdout.decode().strip()


def is_repo(path: Path) -> bool:
    if not (path / ".git").exists():
        return False
    proc = git(["rev-parse", "--show-toplevel"], path, check=False)
    return proc.returncode == 0 and Path(proc.stdout.decode().strip()).resolve() == path.resolve()


def has_commit(repo: Path, rev: str) -> bool:
    return git(["cat-file", "-e", f"{rev}^{{commit}}"], repo, check=False).returncode == 0


def rev_parse(repo: Path, rev: str) -> str:
    return out(["rev-parse", "--verify", f"{rev}^{{commit}}"], repo)


def dirty_paths(repo: Path) -> list[str]:
    """Tracked changes and untracked (not ignored) files, porcelain lines."""
    text = git(["status", "--porcelain=v1", "--untracked-files=all"], repo).stdout.decode()
    return [line for line in text.splitlines() if line]
