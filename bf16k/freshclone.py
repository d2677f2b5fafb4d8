"""`measure-setup`: README's set-up on a fresh clone, timed and weighed, for README's figures.

The commands are read from README's set-up section (its bash block), followed by the next step
README names (`nox -s verify_recall`), so what is measured is what a newcomer types. They run in a
fresh `git clone` of the repository under a scratch folder, with nox from its own venv there and
empty pip and bf16k caches (also there), as on a machine that has never run them. Each step's wall
time is recorded, and the size of the clone and of those caches is sampled while it runs (`du`,
every few seconds) for the peak. The scratch folder is deleted afterwards unless --keep.

The result is JSON (`verify/results/fresh-clone/fresh-clone.json`, the commands' output beside it
in `fresh-clone.log`); `readme_table` renders the table README shows from it, and a test keeps the
two in step.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bf16k import gitutil
from bf16k.errors import ToolError

SETUP_HEADING = "## Set up"
NEXT_STEPS = ("nox -s verify_recall",)
NOX_REQUIREMENT = "nox==2026.10.20"
RESULT = Path("verify/results/fresh-clone/fresh-clone.json")
SAMPLE_SECONDS = 5.0
GIB = 1024**3


def readme_setup_commands(readme: str) -> list[str]:
    """The commands of the bash block in README's set-up section, comments dropped."""
    start = readme.find(SETUP_HEADING)
    if start < 0:
        raise ToolError(f"README has no '{SETUP_HEADING}' section")
    block = re.search(r"```bash\n(.*?)```", readme[start:], re.DOTALL)
    if block is None:
        raise ToolError(f"README's '{SETUP_HEADING}' section has no ```bash block")
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [c for c in commands if c]


def _du_bytes(path: Path) -> int:
    if not path.exists():
        return 0
    proc = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=False)
    try:
        return int(proc.stdout.split()[0]) * 1024
    except (IndexError, ValueError):
        return 0


def _gib(n: int) -> float:
    return round(n / GIB, 2)


def _run_step(command: str, clone: Path, caches: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    print(f"measure-setup: $ {command}", flush=True)
    peak_clone = peak_caches = 0
    start = time.monotonic()
    with log.open("ab") as out:
        out.write(f"$ {command}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        while True:
            try:
                proc.wait(timeout=SAMPLE_SECONDS)
                break
            except subprocess.TimeoutExpired:
                peak_clone = max(peak_clone, _du_bytes(clone))
                peak_caches = max(peak_caches, _du_bytes(caches))
    seconds = time.monotonic() - start
    clone_after, caches_after = _du_bytes(clone), _du_bytes(caches)
    step = {
        "command": command,
        "exit_status": proc.returncode,
        "seconds": round(seconds, 1),
        "clone_gib_after": _gib(clone_after),
        "clone_gib_peak": _gib(max(peak_clone, clone_after)),
        "caches_gib_after": _gib(caches_after),
        "total_gib_peak": _gib(max(peak_clone + peak_caches, clone_after + caches_after)),
    }
    print(
        f"measure-setup:   exit {proc.returncode}, {seconds / 60:.1f} min, clone {step['clone_gib_after']} GiB "
        f"(peak {step['clone_gib_peak']}), caches {step['caches_gib_after']} GiB",
        flush=True,
    )
    return step


def measure(root: Path, scratch: Path) -> dict[str, Any]:
    commands = [*readme_setup_commands((root / "README.md").read_text()), *NEXT_STEPS]
    head = gitutil.out(["rev-parse", "HEAD"], root)
    clone, caches, nox_venv = scratch / "clone", scratch / "caches", scratch / "nox-venv"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(nox_venv)], check=True)
    subprocess.run(
        [str(nox_venv / "bin" / "python"), "-m", "pip", "install", "-q", NOX_REQUIREMENT], check=True
    )
    env = dict(os.environ)
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "TRITON_INTERPRET", "BF16K_WHEEL_FILE"):
        env.pop(var, None)
    env["PATH"] = f"{nox_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_CACHE_DIR"] = str(caches / "pip")
    env["BF16K_CACHE_DIR"] = str(caches / "bf16k")
    env["XDG_CACHE_HOME"] = str(caches / "xdg")
    log = scratch / "measure-setup.log"
    steps = []
    for command in commands:
        steps.append(_run_step(command, clone, caches, env, log))
        if steps[-1]["exit_status"] != 0:
            break
    complete = len(steps) == len(commands) and all(s["exit_status"] == 0 for s in steps)
    return {
        "what": "README's set-up commands and the next step, run one after another on a fresh clone",
        "complete": complete,
        "commit": head,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "gpu": shutil.which("nvidia-smi") is not None,
        },
        "caches": "empty pip and bf16k caches (PIP_CACHE_DIR, BF16K_CACHE_DIR) in the scratch folder",
        "steps": steps,
        "minutes_total": round(sum(s["seconds"] for s in steps) / 60, 1),
        "clone_gib_peak": max((s["clone_gib_peak"] for s in steps), default=0.0),
        "total_gib_peak": max((s["total_gib_peak"] for s in steps), default=0.0),
    }


def readme_table(data: dict[str, Any]) -> str:
    """The markdown table README shows, rendered from a measurement."""
    rows = [
        "| step | time | clone after it | peak, clone + download caches |",
        "| --- | --- | --- | --- |",
    ]
    for s in data["steps"]:
        took = f"{s['seconds']:.0f} s" if s["seconds"] < 90 else f"{s['seconds'] / 60:.0f} min"
        rows.append(
            f"| `{s['command']}` | {took} | {s['clone_gib_after']:.1f} GiB | {s['total_gib_peak']:.1f} GiB |"
        )
    return "\n".join(rows)


def measure_setup(root: Path, out: Path, *, workdir: Path | None = None, keep: bool = False) -> int:
    """Measure README's set-up on a fresh clone in a scratch folder under ``workdir``; write ``out``
    (and its log beside it) and print the README table. 1 when a step failed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bf16k-fresh-clone-", dir=workdir))
    try:
        data = measure(root, scratch)
        shutil.copyfile(scratch / "measure-setup.log", out.with_suffix(".log"))
        if keep:
            print(f"measure-setup: kept {scratch}")
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"measure-setup: wrote {out}\n{readme_table(data)}")
    if not data["complete"]:
        print("measure-setup: a step failed, so the measurement is incomplete (see the exit statuses)")
        return 1
    return 0
