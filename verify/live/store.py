"""Results on disk: one JSON line per request, appended and fsynced as soon as it completes.

Why append + fsync per line: a run that dies (server down, Ctrl-C, OOM) keeps every cell already
measured, and rerunning the same command skips them (resume). The latest line for a key wins, so
a retried cell simply appends a newer line. A line holds what was observed, never a state: states
are judged from it at every report and resume (states.judge_record). A crash can leave a partial
last line; it is repaired before anything is appended, or the next record would be glued onto it
and lost as well.

`run.json` pins what makes results comparable: the settings (seed, thinking, max_tokens, corpus)
and each arm's identity, the server itself (URL, served model, model path, SGLang version, a
digest of its resolved server args, index-K format, tokenizer) and the launch it was measured on.
Resuming against anything else is refused: records of one server are never reported as another's.
After each run it also holds the outcome: the verdict, its exit code and the requests per state.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REQUESTS_FILE = "requests.jsonl"
RUN_FILE = "run.json"
# What --restart moves aside (into replaced-<time>/): the records and everything reported from them.
RUN_OUTPUTS = (
    REQUESTS_FILE,
    RUN_FILE,
    "environment.json",
    "report.md",
    "summary.csv",
    "states.csv",
    "ab_deltas.csv",
    "heatmaps",
)


def record_key(arm: str, pass_name: str, scenario: str, cell_id: str, repeat: int) -> str:
    return f"{arm}|{pass_name}|{scenario}|{cell_id}|r{repeat}"


class ResultStore:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.path = out_dir / REQUESTS_FILE
        self.latest: dict[str, dict[str, Any]] = {}
        out_dir.mkdir(parents=True, exist_ok=True)
        self._load()
        # Line-buffered append; each write is followed by fsync in `append`.
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the whole run

    def _load(self) -> None:
        if not self.path.exists():
            return
        repair_partial_line(self.path)
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a corrupt line inside the file: that request is simply redone
                if isinstance(rec, dict) and "key" in rec:
                    self.latest[rec["key"]] = rec

    def append(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.latest[record["key"]] = record

    def close(self) -> None:
        self._fh.close()

    def records(self, keys: Iterable[str] | None = None) -> list[dict[str, Any]]:
        if keys is None:
            return list(self.latest.values())
        return [self.latest[k] for k in keys if k in self.latest]


def repair_partial_line(path: Path) -> None:
    """End the file on a complete line. A crash mid-write leaves a fragment with no newline: a
    complete record gets its newline back, anything else is cut off (that request is redone)."""
    with open(path, "rb+") as fh:
        data = fh.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        fragment = data[start:]
        try:
            json.loads(fragment)
        except ValueError:
            fh.truncate(start)
            print(
                f"verify.live: {path}: dropped a partial last line ({len(fragment)} bytes) left by an "
                "interrupted run; that request is sent again",
                file=sys.stderr,
            )
        else:
            fh.write(b"\n")
        fh.flush()
        os.fsync(fh.fileno())


# Settings that change what a cell measures; a resumed run must match them exactly.
FINGERPRINT_FIELDS = ("harness_version", "corpus_version", "seed", "thinking", "max_tokens", "stream")
# Who an arm's records were measured on: any difference is another server, never resumed.
IDENTITY_FIELDS = (
    "url",
    "model",
    "model_path",
    "version",
    "server_args_digest",
    "index_k_format",
    "tokenizer",
)
LAUNCH_FIELD = "launch"  # the server process (its start-up record); differs after a relaunch


@dataclass
class ResumeCheck:
    """Why `out_dir`'s records cannot be resumed by this run; all empty: they can."""

    settings: list[str] = field(default_factory=list)
    identity: list[str] = field(default_factory=list)
    relaunched: list[str] = field(default_factory=list)  # same server settings, another process


def check_resume(out_dir: Path, fingerprint: dict[str, Any]) -> ResumeCheck:
    """Differences between this run's settings and servers and those already in `out_dir`."""
    found = ResumeCheck()
    path = out_dir / RUN_FILE
    if not path.exists():
        return found
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return found
    if "harness_version" not in old:
        return found  # only the outcome of a run that never started: nothing was measured here
    for name in FINGERPRINT_FIELDS:
        if old.get(name) != fingerprint.get(name):
            found.settings.append(f"{name}: {old.get(name)!r} in {path}, {fingerprint.get(name)!r} now")
    for arm, now in fingerprint.get("arms", {}).items():
        before = old.get("arms", {}).get(arm)
        if not before:
            continue  # an arm added later (e.g. --baseline on a second run) is fine
        for name in IDENTITY_FIELDS:
            if before.get(name) != now.get(name):
                found.identity.append(f"{arm}.{name}: {before.get(name)!r} before, {now.get(name)!r} now")
        if before.get("server_args_digest") != now.get("server_args_digest"):
            found.identity += _args_differ(arm, before.get("server_args") or {}, now.get("server_args") or {})
        launches = before.get("launches") or []
        if now.get(LAUNCH_FIELD) is not None and launches and now[LAUNCH_FIELD] not in launches:
            found.relaunched.append(f"{arm}: launch {now[LAUNCH_FIELD]} now, {', '.join(launches)} before")
    return found


def _args_differ(arm: str, before: dict[str, Any], now: dict[str, Any], most: int = 8) -> list[str]:
    """The server args behind a digest that changed, the first `most` of them."""
    keys = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    lines = [f"  {arm} server arg {k}: {before.get(k)!r} before, {now.get(k)!r} now" for k in keys[:most]]
    if len(keys) > most:
        lines.append(f"  ... and {len(keys) - most} more server args")
    return lines


def set_aside(out_dir: Path) -> Path | None:
    """--restart: move the records and the outputs made from them into `replaced-<UTC time>/`
    (nothing is deleted; nothing is reused). None when there was nothing to move."""
    present = [out_dir / name for name in RUN_OUTPUTS if (out_dir / name).exists()]
    if not present:
        return None
    dest = out_dir / f"replaced-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}"
    dest.mkdir(parents=True)
    for p in present:
        os.replace(p, dest / p.name)
    return dest


def write_run_file(out_dir: Path, fingerprint: dict[str, Any]) -> None:
    """The fingerprint, keeping arms measured before and every launch each arm's records span."""
    path = out_dir / RUN_FILE
    old: dict[str, Any] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = {}
    arms = dict(old.get("arms", {}))
    for arm, now in fingerprint.get("arms", {}).items():
        launches = list((arms.get(arm) or {}).get("launches") or [])
        if now.get(LAUNCH_FIELD) is not None and now[LAUNCH_FIELD] not in launches:
            launches.append(now[LAUNCH_FIELD])
        arms[arm] = now | {"launches": launches}
    merged = {**fingerprint, "arms": arms}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True))
    os.replace(tmp, path)


def write_run_outcome(out_dir: Path, outcome: dict[str, Any]) -> None:
    """Add the result of the latest run (verdict, exit code, counts per state) to run.json."""
    path = out_dir / RUN_FILE
    try:
        doc = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        doc = {}
    doc["outcome"] = outcome
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    os.replace(tmp, path)
