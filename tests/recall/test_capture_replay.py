"""A capture written by the patched upstream's hook (series patch 6, ``indexer-capture.patch``)
from a real CPU index-K pool replays through ``python -m verify.recall --replay``.

The capture runs in a subprocess with the patched tree on ``PYTHONPATH``: ``sglang-upstream``
once the series carries the patch, or any tree given by ``BF16K_CAPTURE_UPSTREAM`` (its
``python/`` directory or the tree root), e.g. a helper's clone before the lead adds the patch.
Without a tree that has the hook the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = Path("sglang/srt/layers/attention/dsv4/indexer_capture.py")
OUTPUTS = ("results.json", "results.csv", "cells.csv", "summary.md")
LENGTH, SEED = 5200, 11
PLAN = {"topks": (512,), "residues": "staggered", "sequences": 1, "margins": (0.01, 0.2)}

# Runs inside the patched upstream: keys and queries from tier 2's generator, stored into a real
# DeepSeekV4IndexerPool through its own accessors, dumped by the env-gated capture hook.
CAPTURE_SCRIPT = rf"""
import sys

import torch

from sglang.srt.layers.attention.dsv4 import indexer_capture
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool
from verify.core import formats as F
from verify.recall.backend import EmulationBackend
from verify.recall.generator import GenConfig, PlanConfig, build_planted

PLAN = {PLAN!r}
fmt, length, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
plan = PlanConfig(**PLAN)
problem = build_planted(length, plan, GenConfig(seed=seed), EmulationBackend(device=torch.device("cpu")).quantize_q)
pool = DeepSeekV4IndexerPool(
    problem.num_pages * 64, 64, torch.float8_e4m3fn, 128, 1, "cpu", False, index_k_format=fmt
)
slots = problem.written_slots
if fmt == "bf16":
    pool.set_index_k_bf16(0, slots, problem.keys_ref[slots])
else:  # upstream's fp8 store layout, emulated bit-exactly by tier 2 (no CPU kernel upstream)
    F.fp8_store(pool.get_index_k_with_scale_buffer(0), slots, problem.keys_ref[slots])
capture = indexer_capture.indexer_capture_for_layer(layer_id=0)
assert capture is not None, "SGLANG_DSV4_INDEXER_CAPTURE_DIR did not turn capture on"
q_rows = problem.q_index
path = capture.capture(
    layer_id=0,
    q=problem.q_fp8[q_rows],
    weights=problem.w[q_rows],
    seq_lens=problem.seq_lens,
    page_table=problem.page_table,
    index_topk=512,
    index_k_format=pool.index_k_format,
    index_k_pages=pool.get_index_k_with_scale_buffer(0),
    positions=problem.seq_lens.long() * 4 - 1,
)
assert path is not None, dict(capture.skipped)
print(path)
"""


# Imports the hook's modules; an ImportError from outside the tree (a dependency this environment
# lacks, e.g. torchvision in a CPU-only venv) is reported as ENV-SKIP instead of a failure.
IMPORT_PROBE = r"""
import sys, traceback
tree = sys.argv[1]
try:
    import sglang.srt.layers.attention.dsv4.indexer_capture
    import sglang.srt.mem_cache.deepseek_v4_memory_pool
except ImportError as e:
    where = traceback.extract_tb(e.__traceback__)[-1].filename
    missing = isinstance(e, ModuleNotFoundError) and not (e.name or "").startswith("sglang")
    if missing or not where.startswith(tree):
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"ENV-SKIP {type(e).__name__}: {first} ({where})")
        sys.exit(0)
    raise
print("ok")
"""


def patched_upstream() -> Path | None:
    """The ``python/`` directory of a tree whose sglang has the capture hook, else None."""
    given = os.environ.get("BF16K_CAPTURE_UPSTREAM")
    candidates = [Path(given)] if given else [ROOT / "sglang-upstream"]
    for base in candidates:
        for py in (base, base / "python"):
            if (py / HOOK).is_file():
                return py
    return None


@pytest.fixture(scope="module")
def upstream_python() -> Path:
    py = patched_upstream()
    if py is None:
        where = os.environ.get("BF16K_CAPTURE_UPSTREAM") or str(ROOT / "sglang-upstream")
        pytest.skip(
            f"{where} has no {HOOK} (series patch 6, indexer-capture.patch, not applied); "
            "apply the series or set BF16K_CAPTURE_UPSTREAM to a patched tree"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(py), str(ROOT)])}
    probe = run([sys.executable, "-c", IMPORT_PROBE, str(py)], env)
    assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-4000:]
    if probe.stdout.startswith("ENV-SKIP"):
        pytest.skip(f"patched upstream not importable in this environment: {probe.stdout[9:].strip()}"[:300])
    return py


def run(cmd: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def replay_on_cpu(path: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Scores a capture file with tier 2's replay mode on the CPU backend, results in ``out``.
    Exit 0 or 1 is the recall gate's verdict (the caller checks it); anything else fails here."""
    rp = run(
        [
            sys.executable,
            "-m",
            "verify.recall",
            "--replay",
            str(path),
            "--backend",
            "cpu",
            "--out",
            str(out),
            "--no-plots",
            "--quiet",
        ],
        env,
    )
    assert rp.returncode in (0, 1), rp.stdout[-2000:] + rp.stderr[-4000:]
    return rp


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_capture_from_a_real_pool_replays(upstream_python: Path, tmp_path: Path, fmt: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(upstream_python), str(ROOT)]),
        "SGLANG_DSV4_INDEXER_CAPTURE_DIR": str(tmp_path / "cap"),
        "SGLANG_DSV4_INDEXER_CAPTURE_MAX_ROWS": "16",
    }
    for knob in ("LAYERS", "REQUESTS", "MIN_KEYS", "MAX_FILES", "MAX_BYTES"):
        env.pop(f"SGLANG_DSV4_INDEXER_CAPTURE_{knob}", None)
    cap = run([sys.executable, "-c", CAPTURE_SCRIPT, fmt, str(LENGTH), str(SEED)], env)
    assert cap.returncode == 0, cap.stdout[-2000:] + cap.stderr[-4000:]
    path = Path(cap.stdout.strip().splitlines()[-1])
    assert path.parent == tmp_path / "cap" and path.name.startswith("dsv4-indexer-")

    from verify.recall.replay_format import read_capture

    capture = read_capture(path)
    assert capture.index_k_format == fmt and capture.index_topk == 512
    assert 0 < capture.rows <= 16 and bool((capture.seq_lens > 512).all())  # default min_keys
    assert capture.metadata["layer_id"] == 0 and capture.metadata["cuda_graph"] is False

    # The keys each captured row reads are the pool's: the generator's keys as the format
    # stores them, at the renumbered slots (same seed as the capture subprocess).
    import torch

    from verify.core import formats as F
    from verify.recall.backend import EmulationBackend
    from verify.recall.generator import GenConfig, PlanConfig, build_planted
    from verify.recall.replay import reference_keys

    problem = build_planted(
        LENGTH,
        PlanConfig(**PLAN),
        GenConfig(seed=SEED),
        EmulationBackend(device=torch.device("cpu")).quantize_q,
    )
    stored = torch.zeros_like(problem.keys_ref)
    slots = problem.written_slots
    if fmt == "bf16":
        stored[slots] = problem.keys_ref[slots].to(torch.bfloat16).float()
    else:
        stored[slots] = F.fp8_dequantize(*F.fp8_quantize_rows(problem.keys_ref[slots]))
    keys, _ = reference_keys(capture, torch.device("cpu"))
    rows = [int(r) for r in str(capture.metadata["row_indices"]).split(",")]
    assert len(rows) == capture.rows
    for i, r in enumerate(rows):
        j = torch.arange(int(problem.seq_lens[r]))
        assert int(capture.seq_lens[i]) == j.numel()
        new = capture.page_table[i, j // 64].long() * 64 + j % 64
        old = problem.page_table[r, j // 64].long() * 64 + j % 64
        assert torch.equal(keys[new], stored[old]), r
        assert torch.equal(
            capture.q[i].view(torch.uint8), problem.q_fp8[problem.q_index[r]].view(torch.uint8)
        )

    out = tmp_path / "replay"
    rp = replay_on_cpu(path, out, env)
    for name in OUTPUTS:
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["replay"] == str(path) and res["config"]["arms"][-1] == "captured"
    assert res["per_problem"][0]["metadata"]["layer_id"] == 0
    assert res["backend"]["paths"]["replay_captured_format"] == fmt
    assert res["gate"]["passed"] is (rp.returncode == 0)
    captured = [g for g in res["per_length"] if g["arm"] == "captured"]
    assert captured and all(g["recall_tie"]["mean"] == 1.0 for g in captured)
    conditions = {c["name"]: c["passed"] for c in res["gate"]["conditions"]}
    if fmt == "bf16":
        # The pool's bf16 keys are the reference and the bf16 arm stores them exactly.
        assert rp.returncode == 0 and all(conditions.values())
    else:
        # REPLAY.md: an fp8 capture's reference is already fp8-rounded, so the fp8 arm re-stores
        # it exactly and bf16 cannot lose less: the loss-ratio gate fails by construction. Such a
        # capture tests the fp8 read path (arm `captured`); sign-off needs a bf16 capture.
        assert rp.returncode == 1 and conditions["loss_ratio"] is False
        fp8 = [g for g in res["per_length"] if g["arm"] == "fp8"]
        assert all(g["loss"] == 0.0 for g in fp8)


# An upstream fp4-indexer server: 68-B pages and fp4 q. No CPU fp4 store kernel exists upstream,
# so valid fp4 bytes are written into the real pool; the pool's own dequantizer is the reference.
FP4_SCRIPT = r"""
import sys

import torch

from sglang.srt.layers.attention.dsv4 import indexer_capture
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool

ref_path = sys.argv[1]
g = torch.Generator().manual_seed(5)
pool = DeepSeekV4IndexerPool(96 * 64, 64, torch.float8_e4m3fn, 128, 1, "cpu", False, index_k_format="fp4")
buf = pool.get_index_k_with_scale_buffer(0)
buf[:, : 64 * 64] = torch.randint(0, 256, (buf.shape[0], 64 * 64), generator=g).to(torch.uint8)
buf[:, 64 * 64 :] = torch.randint(118, 128, (buf.shape[0], 64 * 4), generator=g).to(torch.uint8)
seq_lens = torch.tensor([700, 900, 1200, 1500], dtype=torch.int32)
width = 24
table = (torch.randperm(buf.shape[0] - 1, generator=g)[: 4 * width] + 1).view(4, width).to(torch.int32)
codes = torch.randint(0, 256, (4, 64, 64), generator=g).to(torch.uint8).view(torch.int8)
scales = torch.randint(124, 130, (4, 64, 4), generator=g).to(torch.uint8).view(torch.int32)[..., 0]
weights = torch.rand(4, 64, generator=g)
capture = indexer_capture.indexer_capture_for_layer(layer_id=0)
path = capture.capture(
    layer_id=0, q=(codes, scales), weights=weights, seq_lens=seq_lens, page_table=table, index_topk=512,
    index_k_format=pool.index_k_format, index_k_pages=buf, positions=seq_lens.long() * 4 - 1,
)
assert path is not None, dict(capture.skipped)
torch.save({"keys": pool.get_index_k_dequant(0).float(), "page_table": table, "seq_lens": seq_lens,
            "codes": codes, "scales": scales}, ref_path)
print(path)
"""


def test_fp4_capture_decodes_like_the_pool_and_replays(upstream_python: Path, tmp_path: Path) -> None:
    import torch

    from verify.recall.replay import reference_keys
    from verify.recall.replay_format import FP4_Q_DTYPE, fp4_decode, read_capture

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(upstream_python), str(ROOT)]),
        "SGLANG_DSV4_INDEXER_CAPTURE_DIR": str(tmp_path / "cap"),
    }
    cap = run([sys.executable, "-c", FP4_SCRIPT, str(tmp_path / "ref.pt")], env)
    assert cap.returncode == 0, cap.stdout[-2000:] + cap.stderr[-4000:]
    path = Path(cap.stdout.strip().splitlines()[-1])
    ref = torch.load(tmp_path / "ref.pt", weights_only=True)

    raw = read_capture(path, decode_fp4=False)
    assert raw.index_k_format == "fp4" and raw.index_k_pages.shape[1] == 64 * 68
    assert torch.load(path, weights_only=True)["q_dtype"] == FP4_Q_DTYPE
    decoded = read_capture(path)  # what replay sees: the exact bf16 equivalent
    assert decoded.index_k_format == "bf16" and decoded.q.dtype == torch.bfloat16
    assert decoded.metadata["captured_index_k_format"] == "fp4"
    # q: the kernel's packed codes and int32 ue8m0 words, decoded exactly
    q_ref = fp4_decode(
        ref["codes"].view(torch.uint8), ref["scales"].contiguous().view(torch.uint8).view(4, 64, 4)
    )
    assert torch.equal(decoded.q.float(), q_ref)
    # keys: the decoder agrees with upstream's own fp4 dequantizer at every slot a row reads
    keys, _ = reference_keys(decoded, torch.device("cpu"))
    for r in range(4):
        j = torch.arange(int(ref["seq_lens"][r]))
        new = decoded.page_table[r, j // 64].long() * 64 + j % 64
        old = ref["page_table"][r, j // 64].long() * 64 + j % 64
        assert torch.equal(keys[new], ref["keys"][old]), r

    out = tmp_path / "replay"
    replay_on_cpu(path, out, env)
    res = json.loads((out / "results.json").read_text())
    assert all((out / name).is_file() for name in OUTPUTS)
    assert res["per_problem"][0]["metadata"]["captured_index_k_format"] == "fp4"
    captured = [g for g in res["per_length"] if g["arm"] == "captured"]
    assert captured and all(g["recall_tie"]["mean"] == 1.0 for g in captured)


def test_fp4_format_round_trip_without_sglang(tmp_path: Path) -> None:
    """verify's own writer and reader for the fp4 addition (no patched upstream needed)."""
    import torch

    from verify.recall.replay_format import fp4_decode, read_capture, write_capture

    g = torch.Generator().manual_seed(1)
    pages = torch.randint(0, 256, (3, 64 * 68), generator=g).to(torch.uint8)
    pages[:, 64 * 64 :] = torch.randint(120, 130, (3, 64 * 4), generator=g).to(torch.uint8)
    codes = torch.randint(0, 256, (2, 8, 64), generator=g).to(torch.uint8)
    exps = torch.randint(124, 130, (2, 8, 4), generator=g).to(torch.uint8)
    common = {
        "q": codes,
        "weights": torch.rand(2, 8),
        "index_k_pages": pages,
        "page_table": torch.tensor([[2, 0], [1, 2]], dtype=torch.int32),
        "seq_lens": torch.tensor([40, 100], dtype=torch.int32),
        "index_k_format": "fp4",
        "index_topk": 512,
    }
    # the kernel's int32 scale words are accepted as they are
    path = write_capture(tmp_path / "fp4.pt", q_scale_ue8m0=exps.view(torch.int32)[..., 0], **common)
    raw = read_capture(path, decode_fp4=False)
    assert raw.index_k_format == "fp4" and torch.equal(raw.q_scale_ue8m0, exps) and raw.num_pages == 2
    cap = read_capture(path)
    assert cap.index_k_format == "bf16" and torch.equal(cap.q.float(), fp4_decode(codes, exps))
    # slot 1 * 64 + 5 of the original pool (page 1 kept, renumbered) decodes from its bytes
    slot = int(raw.page_table[1, 0]) * 64 + 5
    key = cap.index_k_pages.view(torch.bfloat16).view(-1, 128)[slot].float()
    assert torch.equal(key, fp4_decode(pages[1, 5 * 64 : 6 * 64], pages[1, 4096 + 20 : 4096 + 24]))
    payload = torch.load(path, weights_only=True)
    del payload["q_scale_ue8m0"]
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="needs q_scale_ue8m0"):
        read_capture(tmp_path / "bad.pt")
