"""The bf16 indexer's measured kernel-time ratios to DeepGEMM's fp8 ones (the committed H200 bench),
and the end-to-end factors they imply.

* decode: ``bf16_default.ms / fp8_deepgemm.ms`` of the bench's decode shapes (``rows`` queries
  against ``keys`` index keys, no padded logits width): the patched scorer against DeepGEMM's
  ``fp8_paged_mqa_logits``;
* prefill: ``derived.ratio_dispatch_over_deepgemm_nonpaged`` of its long-prefill cases: what
  the series dispatches for a prompt's C4 indexer against DeepGEMM's non-paged
  ``fp8_mqa_logits``, the call upstream makes there.

A length the bench did not measure takes the nearest measured one at or below it (the smallest
measured one below that); each figure names the point it used. Factors, bf16 over fp8:
``1 + share x (ratio - 1)``, with ``share`` the indexer's share of the fp8 work -- of the prefill
FLOPs for TTFT (prefill time taken to split like its FLOPs), of the decode KV bytes for a decode
step (a step taken to cost its KV reads: the long-context, large-batch end, where weight reads
are shared by the batch; an upper bound elsewhere). No fp4 kernel was measured: upstream's fp4
indexer calls DeepGEMM's ``fp8_fp4_paged_mqa_logits``, which has no Hopper build, and upstream
refuses the flag below SM100 (``arg_groups/serving_hook.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = "verify/results/h200/bench/bench_read.json"


@dataclass(frozen=True)
class Measured:
    ratio: float
    at: str  # the bench point it came from


@dataclass(frozen=True)
class Bench:
    source: str
    sha256: str
    gpu: str
    decode: dict[tuple[int, int], float]  # (rows, keys) -> bf16 / DeepGEMM fp8
    prefill: dict[int, float]  # prompt tokens -> bf16 dispatch / DeepGEMM non-paged fp8

    @classmethod
    def load(cls, path: Path, source: str) -> Bench:
        raw = path.read_bytes()
        data: dict[str, Any] = json.loads(raw)
        decode = {
            (r["shape"]["rows"], r["shape"]["keys"]): r["bf16_default"]["ms"] / r["fp8_deepgemm"]["ms"]
            for r in data["results"]
            if r["shape"]["mode"] == "decode"
            and not r["shape"].get("width")
            and r.get("fp8_deepgemm")
            and r["fp8_deepgemm"].get("ms")
            and r["bf16_default"].get("ms")
        }
        prefill = {
            p["tokens"]: p["derived"]["ratio_dispatch_over_deepgemm_nonpaged"]
            for p in data["long_prefill"]
            if not p.get("skipped") and "ratio_dispatch_over_deepgemm_nonpaged" in p.get("derived", {})
        }
        return cls(
            source, hashlib.sha256(raw).hexdigest()[:16], data["meta"].get("gpu", "?"), decode, prefill
        )

    def decode_ratio(self, rows: int, keys: int) -> Measured:
        measured = sorted(k for r, k in self.decode if r == rows)
        if not measured:
            raise ValueError(
                f"the bench has no decode shape with {rows} rows; it has {sorted({r for r, _ in self.decode})}"
            )
        use = _at_or_below(measured, keys)
        return Measured(self.decode[(rows, use)], f"decode {rows} rows x {use:,} keys")

    def prefill_ratio(self, tokens: int) -> Measured:
        use = _at_or_below(sorted(self.prefill), tokens)
        return Measured(self.prefill[use], f"prefill {use:,} tokens")


def _at_or_below(measured: list[int], want: int) -> int:
    below = [m for m in measured if m <= want]
    return below[-1] if below else measured[0]


def factor(share: float, ratio: float) -> float:
    """End-to-end time factor when work of ``share`` runs ``ratio`` times as long."""
    return 1.0 + share * (ratio - 1.0)
