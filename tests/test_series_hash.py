"""Every result the verify tiers write names the applied series the same way: under one key, with
the value of one function (verify.core.provenance.series_hash, bf16k.series.series_hash's value),
so a result can be matched to the series, the wheel and the carry that made it. The writers that
run on a CPU are run; the GPU-only ones are held to calling that function."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from bf16k.series import series_hash as bf16k_series_hash
from verify.core import provenance

ROOT = Path(__file__).resolve().parents[1]

# Every verify module that writes a result JSON, and the file it writes. The live tier is not here:
# it measures a remote server, whose series this checkout cannot know.
WRITERS = {
    "verify/recall/cli.py": "results.json (tier 2)",
    "verify/recall/diagnose.py": "diagnosis.json",
    "verify/recall/sm120.py": "sm120.json",
    "verify/forward/cli.py": "results.json and dispatch.json (forward tier)",
    "verify/parity/store_report.py": "store.json and read.json (tier 1)",
    "verify/bench/read.py": "bench_read.json",
    "verify/bench/store.py": "bench_store.json",
    "verify/bench/compile_cost.py": "bench_compile.json",
    "verify/bench/read_compile.py": "bf16-read-compile.json",
    "verify/cost/report.py": "cost.json",
}


@pytest.fixture(scope="module")
def applied() -> str:
    """The series hash of this checkout's series/, which the tests' upstream tree carries."""
    state = provenance.applied_state()
    current = bf16k_series_hash(ROOT / "series")
    if state.get(provenance.SERIES_HASH) != current:
        pytest.skip("sglang-upstream/ is not applied at the current series (nox -s apply)")
    return current


def test_the_one_function_gives_bf16ks_hash_of_the_applied_series(applied: str) -> None:
    assert provenance.series_hash() == applied


def test_the_cpu_writers_record_the_same_series_hash(applied: str, tmp_path: Path) -> None:
    """Tier 2 on the CPU, the diagnosis on the CPU and tier 1's store suite (which reports its
    errors on a CPU): each result names the applied series under the same key."""
    from verify.parity import store
    from verify.recall import cli, diagnose

    key = provenance.SERIES_HASH
    recall = tmp_path / "recall"
    assert (
        cli.main(
            [
                "--out",
                str(recall),
                "--backend",
                "cpu",
                "--lengths",
                "338",
                "--topk",
                "64",
                "--depths",
                "50",
                "--margins",
                "0.2",
                "--modes",
                "top",
                "--quiet",
                "--no-plots",
                "--no-diagnose",
            ]
        )
        == 0
    )
    recorded = {"tier 2": json.loads((recall / "results.json").read_text())["versions"][key]}

    diagnose.main(["--backend", "cpu", "--platform", "sm90", "--out", str(tmp_path / "diagnose")])
    recorded["diagnosis"] = json.loads((tmp_path / "diagnose" / "diagnosis.json").read_text())[key]

    if not torch.cuda.is_available():  # on a GPU this would run the suite
        store.main(["--out", str(tmp_path / "parity"), "--lengths", "1", "--only", "fused_bf16/*"])
        recorded["tier 1"] = json.loads((tmp_path / "parity" / "store.json").read_text())["meta"][key]
    assert recorded == dict.fromkeys(recorded, applied)


def _calls_the_one_function(path: Path) -> bool:
    """Whether the module imports series_hash and SERIES_HASH from verify.core.provenance."""
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "verify.core.provenance"
        and {"SERIES_HASH", "series_hash"} <= {a.name for a in node.names}
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_every_result_writer_takes_the_hash_from_the_one_function() -> None:
    assert [w for w in WRITERS if not _calls_the_one_function(ROOT / w)] == []
    # and nothing else in verify/ hashes a series of its own (the defect this replaces)
    own = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "verify").rglob("*.py")
        if "hashlib" in p.read_text() and '"series"' in p.read_text()
    ]
    assert own == []
