"""Results on disk: one JSON line per request, appended and fsynced as soon as it completes.

Why append + fsync per line: a run that dies (server down, Ctrl-C, OOM) keeps every cell already
measured, and rerunning the same command skips them (resume). The latest line for a key wins, so
a retried cell simply appends a newer line. Only measurements (pass / fail) are skipped on resume:
an error of any kind, a truncated or unchecked answer is asked again (states.py).

`run.json` pins what makes results comparable (seed, thinking, max_tokens, corpus, model and
index-K format per arm); resuming into a directory measured under other settings is refused. After
each run it also holds the outcome: the verdict, its exit code and the requests per state.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from verify.live.states import is_done

REQUESTS_FILE = "requests.jsonl"
RUN_FILE = "run.json"


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
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a crash: that request is simply redone
                if isinstance(rec, dict) and "key" in rec:
                    self.latest[rec["key"]] = rec

    def done(self, key: str) -> bool:
        return is_done(self.latest.get(key))

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


# Settings that change what a cell measures; a resumed run must match them exactly.
FINGERPRINT_FIELDS = ("harness_version", "corpus_version", "seed", "thinking", "max_tokens", "stream")


def check_resume(out_dir: Path, fingerprint: dict[str, Any]) -> list[str]:
    """Differences between this run's settings and those already in `out_dir` (empty: compatible)."""
    path = out_dir / RUN_FILE
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    problems: list[str] = []
    for field in FINGERPRINT_FIELDS:
        if old.get(field) != fingerprint.get(field):
            problems.append(f"{field}: {old.get(field)!r} in {path}, {fingerprint.get(field)!r} now")
    for arm, now in fingerprint.get("arms", {}).items():
        before = old.get("arms", {}).get(arm)
        if not before:
            continue  # an arm added later (e.g. --baseline on a second run) is fine
        for field in ("model", "index_k_format", "tokenizer"):
            if before.get(field) != now.get(field):
                problems.append(f"{arm}.{field}: {before.get(field)!r} before, {now.get(field)!r} now")
    return problems


def write_run_file(out_dir: Path, fingerprint: dict[str, Any]) -> None:
    path = out_dir / RUN_FILE
    merged = fingerprint
    if path.exists():
        try:
            old = json.loads(path.read_text())
            arms = dict(old.get("arms", {}))
            arms.update(fingerprint.get("arms", {}))
            merged = {**fingerprint, "arms": arms}
        except (OSError, json.JSONDecodeError):
            pass
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
