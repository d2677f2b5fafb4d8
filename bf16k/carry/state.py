"""What a carry keeps between commands: its typed state, in the carried tree's git dir.

A stopped carry leaves ``bf16k-rebase.json`` there; ``--continue``, ``--skip`` and ``--abort``
load it and ``status`` reads it. The file keeps the keys it always had (one flat object), so a
carry stopped by an earlier bf16k goes on with this one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from bf16k import upstream
from bf16k.carried import Verified
from bf16k.errors import ToolError
from bf16k.reasons import Hunk, Reason

STATE_FILE = "bf16k-rebase.json"  # in the carried tree's git dir while a carry is stopped
OLD_BASE_REF = "refs/bf16k/rebase/old-base"
OLD_TIP_REF = "refs/bf16k/rebase/old-tip"
NEW_BASE_REF = "refs/bf16k/rebase/new-base"
WHEEL_BASE_REF = "refs/bf16k/rebase/wheel-base"
REPLAY_REF = "refs/bf16k/rebase/replay"  # prefix: the chains a re-carry replays (kept reachable)


class Phase(StrEnum):
    APPLY = "apply"  # replaying a carried series' resolutions (a re-carry), then `git am` of the rest
    AM = "am"  # `git am` of the patches not replayed
    TESTS = "tests"  # every patch carried: the gate (the series' tests, then every prefix bisected)


@dataclass
class Release:
    """The upstream a carry goes to."""

    version: str
    tag: str
    kind: str  # "wheel" (PyPI release) or "ref" (git ref, needs the network)
    ref: str  # the git ref asked for; "" for a wheel
    commit: str  # upstream commit when known (given or fetched); "" otherwise
    older: bool = False  # older than the pin: a port, not a carry forward


@dataclass
class Bases:
    """The commits a carry goes between, in the carried tree."""

    old_base: str  # the pinned release's import
    new_base: str  # the release carried to (for a wheel, imported as a child of old_base)
    old_tip: str = ""  # series/ applied on old_base: the range-diff's "before"


@dataclass
class PriorTree:
    """The carried tree as the carry found it: what ``--abort`` puts back."""

    created: bool  # the carry made the tree, so --abort removes it
    pre_head: str = ""
    pre_base_ref: str = ""
    pre_state: dict[str, str] = field(default_factory=dict)  # upstream.read_state's record
    notes: list[str] = field(default_factory=list)  # where uncommitted work was saved


@dataclass
class PendingReplay:
    """A replayed patch stopped in the worktree: what ``--continue`` commits."""

    tree: str  # the merge with its conflict markers
    message: str
    author: tuple[str, str, str]
    conflicts: list[str]


@dataclass
class ReplayPlan:
    """The three chains a re-carry merges patch by patch (see :mod:`bf16k.replay`)."""

    count: int  # how many leading patches are replayed
    then: list[str]  # the series/ patches the carried series was made from, on the old base
    carried: list[str]  # the carried series, on the new base
    now: list[str]  # today's series/, on the old base
    source: str  # the carried series' folder, relative to the root
    merged_tree: str  # the last automatic merge (where a hand resolution is measured from)
    committed_tree: str  # the last tree committed
    index: int = 0  # the next patch to replay
    pending: PendingReplay | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        pending = (
            None if self.pending is None else {**asdict(self.pending), "author": list(self.pending.author)}
        )
        return {
            "count": self.count,
            "O": self.then,
            "C": self.carried,
            "N": self.now,
            "from": self.source,
            "I_prev": self.merged_tree,
            "T_prev": self.committed_tree,
            "index": self.index,
            "pending": pending,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayPlan:
        p = data.get("pending")
        pending = None
        if p:
            name, email, date = (str(x) for x in p["author"])
            pending = PendingReplay(
                str(p["tree"]), str(p["message"]), (name, email, date), list(p["conflicts"])
            )
        return cls(
            int(data["count"]),
            list(data["O"]),
            list(data["C"]),
            list(data["N"]),
            str(data["from"]),
            str(data["I_prev"]),
            str(data["T_prev"]),
            int(data["index"]),
            pending,
            list(data["notes"]),
        )


@dataclass
class StopRecord:
    """Where the carry stopped, kept for the next command (``status`` shows the summary)."""

    kind: str  # "conflict", "replay", "tests" or "bisect"
    summary: str
    tip: str  # HEAD when it stopped: the maintainer's commits since are fixups
    hunks: list[Hunk] = field(default_factory=list)  # the hunks a reason is asked for

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "tip": self.tip,
            "hunks": [{"path": h.path, "scope": h.scope, "line": h.line} for h in self.hunks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StopRecord:
        hunks = [Hunk(h["path"], h["scope"], int(h["line"])) for h in data.get("hunks", [])]
        return cls(str(data["kind"]), str(data["summary"]), str(data["tip"]), hunks)


@dataclass
class CarryState:
    release: Release
    prior: PriorTree
    bases: Bases
    wheel: str  # the release's wheel file
    source_detail: str  # where the release came from, as the stops say it
    old_version: str  # the pinned release carried from
    names: list[str]  # series/ at the start, in order
    old_series_hash: str
    from_blobs: dict[str, str]  # patch name -> blob id of its series/ file (carried.toml's [from])
    prev_reasons: list[Reason] = field(default_factory=list)  # the replaced carried series' reasons
    prev_patches: dict[str, str] = field(default_factory=dict)  # ... and its patch files
    phase: Phase = Phase.APPLY
    replay: ReplayPlan | None = None
    am_offset: int = 0  # how many leading patches the replay carried (`git am` starts after them)
    dropped: dict[str, str] = field(default_factory=dict)  # patch -> the release that has it
    reasons: list[Reason] = field(default_factory=list)  # the maintainer's, at each --continue
    python: str | None = None  # the Python that runs the series' tests (--python)
    queue: list[str] = field(default_factory=list)  # releases still to re-carry after this one
    stop: StopRecord | None = None
    failing: list[str] = field(default_factory=list)  # the tests that failed last (rerun first)
    verified: Verified | None = None  # the gate's measurements, once it passed
    started: float = 0.0

    @property
    def version(self) -> str:
        return self.release.version

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **asdict(self.prior),
            **asdict(self.bases),
            **asdict(self.release),
            "wheel": self.wheel,
            "source_detail": self.source_detail,
            "old_version": self.old_version,
            "names": self.names,
            "old_series_hash": self.old_series_hash,
            "from_blobs": self.from_blobs,
            "prev_reasons": [r.as_dict() for r in self.prev_reasons],
            "prev_patches": self.prev_patches,
            "phase": self.phase.value,
            "replay": self.replay.to_json() if self.replay else None,
            "am_offset": self.am_offset,
            "dropped": self.dropped,
            "reasons": [r.as_dict() for r in self.reasons],
            "python": self.python,
            "queue": self.queue,
            "stop": self.stop.to_json() if self.stop else None,
            "failing": self.failing,
            "started": self.started,
        }
        if self.verified is not None:
            data["verified"] = asdict(self.verified)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CarryState:
        release = Release(
            str(data["version"]),
            str(data["tag"]),
            str(data["kind"]),
            str(data["ref"]),
            str(data["commit"]),
            bool(data.get("older", False)),
        )
        prior = PriorTree(
            bool(data.get("created", False)),
            str(data.get("pre_head", "")),
            str(data.get("pre_base_ref", "")),
            dict(data.get("pre_state") or {}),
            list(data.get("notes", [])),
        )
        bases = Bases(str(data["old_base"]), str(data["new_base"]), str(data.get("old_tip", "")))
        v = data.get("verified")
        return cls(
            release,
            prior,
            bases,
            str(data["wheel"]),
            str(data["source_detail"]),
            str(data["old_version"]),
            list(data["names"]),
            str(data["old_series_hash"]),
            dict(data["from_blobs"]),
            prev_reasons=[Reason(**r) for r in data.get("prev_reasons", [])],
            prev_patches=dict(data.get("prev_patches") or {}),
            phase=Phase(data.get("phase", Phase.AM.value)),
            replay=ReplayPlan.from_json(data["replay"]) if data.get("replay") else None,
            am_offset=int(data.get("am_offset", 0)),
            dropped=dict(data.get("dropped", {})),
            reasons=[Reason(**r) for r in data.get("reasons", [])],
            python=data.get("python"),
            queue=list(data.get("queue") or []),
            stop=StopRecord.from_json(data["stop"]) if data.get("stop") else None,
            failing=list(data.get("failing") or []),
            verified=Verified(**v) if v else None,
            started=float(data.get("started", 0.0)),
        )

    @classmethod
    def load(cls, repo: Path) -> CarryState:
        return cls.from_json(json.loads(state_path(repo).read_text()))

    def save(self, repo: Path) -> None:
        state_path(repo).write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")


@dataclass
class Carry:
    """A carry in progress: the product, the tree it works in and its state."""

    root: Path
    repo: Path
    state: CarryState

    @property
    def where(self) -> str:
        """The carried tree as the messages name it (relative to the root)."""
        return rel(self.root, self.repo)

    def save(self) -> None:
        self.state.save(self.repo)


def rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def state_path(repo: Path) -> Path:
    return upstream.git_dir(repo) / STATE_FILE


def find_in_progress(root: Path) -> Path | None:
    """The carried tree holding a stopped carry, if any (one at a time)."""
    trees = root / "build" / "upstream"
    if not trees.is_dir():
        return None
    for repo in sorted(trees.iterdir()):
        if (repo / ".git" / STATE_FILE).is_file():
            return repo
    return None


def load(root: Path) -> Carry:
    """The stopped carry, to go on with or abort."""
    repo = find_in_progress(root)
    if repo is None:
        raise ToolError("no rebase in progress (start one with `nox -s rebase -- VERSION`)")
    return Carry(root, repo, CarryState.load(repo))
