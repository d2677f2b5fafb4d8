"""CPU run of the store-parity suite's checks against a torch stand-in for upstream's kernels.

The real suite drives upstream's CUDA kernels; here the planner, compress kernel and fused store
are replaced by small torch fakes with the same calling conventions (plans as 16-byte rows,
out_loc indexed by ragged id or row, 2-D uint8 pool pages), so the plumbing -- page tables,
out_loc, canaries, reference comparison, verdicts, report -- runs for real, and deliberately
broken fakes must be caught. The compressor-level arms additionally run upstream's real
``forward_unified`` (patched tree on PYTHONPATH) with its Triton kernel under the interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from verify.core.store_cases import DecodeCase, make_prefill_case
from verify.core.store_layout import FP8_LAYOUT
from verify.core.store_reference import index_k_reference
from verify.core.upstream import worker_env
from verify.parity import store as suite_mod
from verify.parity import store_baseline
from verify.parity.store_report import CheckResult, Status, run_check, summary_table, write_json

CPU = torch.device("cpu")


class FakePrefillPlan(NamedTuple):
    compress_ratio: int
    plan_c: torch.Tensor
    plan_w: torch.Tensor

    @property
    def is_decode(self) -> bool:
        return False


class FakeDecodePlan(NamedTuple):
    compress_ratio: int
    plan_d: torch.Tensor

    @property
    def is_decode(self) -> bool:
        return True


def _rows(fields: list[tuple[int, int]]) -> torch.Tensor:
    rows = torch.zeros(len(fields), 4, dtype=torch.int32)
    for i, (seq_len, ragged) in enumerate(fields):
        rows[i, 0], rows[i, 1] = seq_len, ragged
    return rows.view(torch.uint8)


class FakeCtx:
    """make_paged_context stand-in: the planner's CPU path, one request."""

    num_pages = 4

    def make_prefill_plan(
        self, seq_lens: torch.Tensor, extend_lens: torch.Tensor, num_q: int
    ) -> FakePrefillPlan:
        seq_len, extend = int(seq_lens[0]), int(extend_lens[0])
        prefix = seq_len - extend
        fields = [(p + 1, p - prefix) for p in range(prefix, seq_len) if (p + 1) % 4 == 0]
        return FakePrefillPlan(4, _rows(fields), torch.zeros(len(fields), 8, dtype=torch.uint8))

    def make_decode_plan(self, seq_lens: torch.Tensor) -> FakeDecodePlan:
        return FakeDecodePlan(4, _rows([(int(s), 0) for s in seq_lens]))


def _plan_fields(plan: Any) -> tuple[torch.Tensor, torch.Tensor]:
    raw = plan[1].view(torch.int32)
    return raw[:, 0].long(), raw[:, 1].long() & 0xFFFF


def fake_compress_forward(*, kv_score_buffer, kv_score_input, ape, plan, head_dim, compress_ratio, **_):
    _, ragged = _plan_fields(plan)
    rows = kv_score_input[:, :head_dim] if plan.is_decode else kv_score_input[ragged, :head_dim]
    return rows * 2 + ape[0]


def make_fake_store(slot_shift: int = 0, via_fp8: bool = False) -> Callable[..., None]:
    """A torch stand-in of compress_norm_rope_store; the knobs break it on purpose."""

    def store(
        kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, bf16_store=False, **_
    ):
        seq, ragged = _plan_fields(plan)
        if plan.is_decode:
            keep = seq % 4 == 0
            loc = out_loc[keep]
        else:
            keep = seq != -1
            loc = out_loc[ragged[keep]]
        values = index_k_reference(kv[keep], norm_weight, norm_eps, freq_cis, seq[keep] - 4)
        loc = loc + slot_shift
        if bf16_store:
            if via_fp8:
                values = values.to(torch.float8_e4m3fn).float()
            kvcache.view(torch.bfloat16).view(-1, 128)[loc] = values.to(torch.bfloat16)
            return
        scale = values.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448
        q = (values / scale).to(torch.float8_e4m3fn).view(torch.uint8)
        page, off = loc // page_size, loc % page_size
        for i in range(loc.numel()):
            p, o = int(page[i]), int(off[i])
            kvcache[p, o * 128 : o * 128 + 128] = q[i]
            kvcache[p, 8192 + o * 4 : 8192 + o * 4 + 4] = scale[i].view(torch.uint8)

    return store


def fake_ops(store: Callable[..., None]) -> dict[str, Any]:
    return {
        "make_paged_context": lambda **_: FakeCtx(),
        "make_state_pool": lambda n, r, d: torch.zeros(n, r, 4 * d),
        "compress_forward": fake_compress_forward,
        "compress_norm_rope_store": store,
    }


LENGTHS = (0, 1, 63, 64, 65, 130)


def make_suite(tmp_path: Path, store: Callable[..., None]) -> suite_mod.Suite:
    cases: list[Any] = [make_prefill_case(n, seed=10 + n, max_chunk_tokens=90) for n in LENGTHS]
    cases.append(DecodeCase((4, 5, 8, 255, 256, 257), seed=7))
    return suite_mod.Suite(tmp_path, CPU, cases, None, tmp_path / "jit", False, _ops=fake_ops(store))


def test_fused_and_fp8_checks_pass_on_a_correct_store(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, make_fake_store())
    for case in suite.cases:
        fused = suite_mod.check_fused_bf16(suite, case)
        assert fused.status is Status.PASS, (case.name, fused.summary, fused.details["parts"])
        assert fused.details["vs_reference"]["max_ulp"] == 0
        fp8 = suite_mod.check_fp8_sanity(suite, case)
        assert fp8.status is Status.PASS, (case.name, fp8.summary)
    assert suite.prepared(suite.cases[-1]).slots.numel() == 3  # decode rows 4, 8 and 256 write


def test_chunked_prefill_keeps_keys_and_slots_consistent(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, make_fake_store())
    p = suite.prepared(suite.cases[LENGTHS.index(130)])
    assert p.info["chunks"] > 1 and p.slots.numel() == 130
    assert len(set(p.slots.tolist())) == 130 and 0 not in (p.slots // 64).tolist()  # page 0 reserved
    assert p.positions.tolist() == [4 * k for k in range(130)]


def test_a_store_one_slot_off_fails_the_canary_and_reference(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, make_fake_store(slot_shift=1))
    result = suite_mod.check_fused_bf16(suite, suite.cases[LENGTHS.index(65)])
    assert result.status is Status.FAIL
    assert not result.details["parts"]["canary"] and not result.details["parts"]["reference"]


def test_a_store_that_rounds_twice_fails_the_reference(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, make_fake_store(via_fp8=True))
    result = suite_mod.check_fused_bf16(suite, suite.cases[LENGTHS.index(64)])
    assert result.status is Status.FAIL and result.details["parts"] == {
        "reference": False,
        "readback": True,
        "canary": True,
    }


def test_run_check_records_errors_and_skips() -> None:
    def boom() -> CheckResult:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def skip() -> CheckResult:
        raise suite_mod.CheckSkipped("no baseline")

    error = run_check("x", boom)
    assert error.status is Status.ERROR and "illegal memory access" in error.summary
    assert "Traceback" in error.details["traceback"]
    assert run_check("y", skip).status is Status.SKIP


def test_report_table_and_json(tmp_path: Path) -> None:
    results = [
        CheckResult("a/prefill/L=1", Status.PASS, "ok"),
        CheckResult("b", Status.FAIL, "bad", {"n": 1}),
    ]
    table = summary_table(results)
    assert "a/prefill/L=1" in table and "FAIL" in table and "pass=1  fail=1" in table
    write_json(tmp_path / "store.json", "parity.store", results, {"k": "v"})
    payload = json.loads((tmp_path / "store.json").read_text())
    assert payload["ok"] is False and payload["results"][1]["details"] == {"n": 1}


def test_default_path_check_skips_without_a_baseline(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, make_fake_store())
    assert (
        run_check("fp8_default_vs_upstream", lambda: suite_mod.check_fp8_default_vs_upstream(suite)).status
        is Status.SKIP
    )


def test_baseline_inputs_round_trip_and_byte_compare(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, make_fake_store())
    prepared = [suite.prepared(c) for c in suite.cases]
    store_baseline.save_inputs(tmp_path / "in.pt", prepared)
    data = torch.load(tmp_path / "in.pt", weights_only=False)
    assert [c["name"] for c in data["cases"]] == [p.name for p in prepared]
    assert data["cases"][-1]["plans"][0]["decode"] and len(data["cases"][1]["plans"][0]["tensors"]) == 2
    a = {"buffers": {"x": torch.zeros(2, FP8_LAYOUT.page_bytes, dtype=torch.uint8)}}
    b = {"buffers": {"x": a["buffers"]["x"].clone()}}
    assert store_baseline.compare_outputs(a, b)["x"]["identical"]
    b["buffers"]["x"][1, 8200] = 1
    diff = store_baseline.compare_outputs(a, b)["x"]
    assert not diff["identical"] and diff["first"] == [{"page": 1, "byte": 8200}]
    assert not store_baseline.compare_outputs(a, {"buffers": {}})["x"]["identical"]


def test_worker_env_puts_the_chosen_tree_first_and_drops_other_sglang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    (other / "sglang").mkdir(parents=True)
    (other / "sglang" / "__init__.py").write_text("")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(other), str(wheels)]))
    monkeypatch.setenv("SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR", "1")
    env = worker_env(tmp_path / "base", tmp_path / "cache")
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(tmp_path / "base") and str(other) not in parts and str(wheels) in parts
    assert env["SGLANG_JIT_CACHE_DIR"] == str(tmp_path / "cache")
    assert "SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR" not in env
    with pytest.raises(FileNotFoundError):
        store_baseline.run_worker(tmp_path / "nope", tmp_path / "i", tmp_path / "o", None, tmp_path / "log")


def test_main_without_cuda_reports_errors_not_crashes(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only behaviour")
    code = suite_mod.main(["--out", str(tmp_path), "--lengths", "1", "--only", "fused_bf16/*"])
    payload = json.loads((tmp_path / "store.json").read_text())
    assert code == 1 and {r["status"] for r in payload["results"]} == {"error"}
    assert [r["name"] for r in payload["results"]] == ["fused_bf16/prefill/L=1", "fused_bf16/decode"]


# ---------------------------------------------------------------- compressor-level arms


def _compressor_arms_available() -> str | None:
    try:
        import sglang.srt.layers.attention.dsv4.compressor_v2 as cv2
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means: not here
        detail = (str(error).strip().splitlines() or [""])[0]
        return f"patched upstream pool/compressor not importable: {type(error).__name__}: {detail}"[:200]
    if not hasattr(cv2.CompressorBackendMixin, "_forward_unified_unfused"):
        return "upstream on PYTHONPATH lacks the series' unfused path"
    return None


def test_compressor_arms_run_upstream_forward_unified(tmp_path: Path) -> None:
    """Unfused and fused-via-compressor arms through the real forward_unified and bf16 pool
    (Triton under the interpreter, a torch Hadamard for the CUDA-only JIT one, the fake store
    and compress), in a child process because Triton reads TRITON_INTERPRET at import."""
    reason = _compressor_arms_available()
    if reason is not None:
        pytest.skip(reason)
    if os.environ.get("TRITON_INTERPRET") != "1":
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"{__file__}::test_compressor_arms_run_upstream_forward_unified",
            ],
            env={**os.environ, "TRITON_INTERPRET": "1"},
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-3000:]
        return

    import sglang.srt.layers.attention.dsv4.compressor_v2 as cv2
    from sglang.srt.layers.attention.dsa import dsa_indexer

    def torch_hadamard(x: torch.Tensor) -> torch.Tensor:
        from verify.core.store_reference import fwht

        return fwht(x) * 128**-0.5

    store = make_fake_store()
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(cv2, "compress_forward", fake_compress_forward)
        mp.setattr(cv2, "compress_norm_rope_store", store)
        mp.setattr(dsa_indexer, "rotate_activation", torch_hadamard)
        suite = make_suite(tmp_path, store)
        for case in (suite.cases[LENGTHS.index(65)], suite.cases[-1]):
            unfused = suite_mod.check_unfused_bf16(suite, case)
            assert unfused.status is Status.PASS, (case.name, unfused.summary, unfused.details["parts"])
            fused = suite_mod.check_fused_via_compressor(suite, case)
            assert fused.status is Status.PASS, (case.name, fused.summary, fused.details["parts"])
        decode = suite_mod.check_unfused_bf16(suite, suite.cases[-1])
        assert decode.details["dump_slot_written"]  # skipped decode rows land in slot 0, as zeros
        readback = suite_mod.check_pool_readback(suite)
        assert readback.status is Status.PASS, readback.details
    finally:
        mp.undo()


# ---------------------------------------------------------------- baseline worker subprocess

_STAND_IN_COMPRESS = """
from typing import NamedTuple
import torch

class CompressorPrefillPlan(NamedTuple):
    compress_ratio: int
    plan_c: torch.Tensor
    plan_w: torch.Tensor
    is_decode = False

class CompressorDecodePlan(NamedTuple):
    compress_ratio: int
    plan_d: torch.Tensor
    is_decode = True

def compress_norm_rope_store(kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, **kw):
    assert not kw.get("bf16_store"), "the default path passes no bf16 argument"
    raw = plan[1].view(torch.int32)
    seq, ragged = raw[:, 0].long(), raw[:, 1].long() & 0xFFFF
    keep = seq % 4 == 0 if plan.is_decode else seq != -1
    loc = out_loc[keep] if plan.is_decode else out_loc[ragged[keep]]
    data = ((kv[keep] * 16).round().clamp(-100, 100).to(torch.int8) + OFFSET).view(torch.uint8)
    for i, slot in enumerate(loc.tolist()):
        page, off = divmod(slot, page_size)
        kvcache[page, off * 128 : off * 128 + 128] = data[i]
"""


def _stand_in_tree(root: Path, offset: int) -> Path:
    """A python/ dir whose ``sglang`` has just the compress entry points the worker imports."""
    pkg = root / "sglang"
    mod = pkg / "kernels" / "ops" / "attention" / "dsv4"
    mod.mkdir(parents=True)
    for folder in (pkg, pkg / "kernels", pkg / "kernels" / "ops", pkg / "kernels" / "ops" / "attention", mod):
        (folder / "__init__.py").write_text("")
    (mod / "compress.py").write_text(_STAND_IN_COMPRESS.replace("OFFSET", str(offset)))
    return root


def test_baseline_workers_run_each_tree_in_its_own_process(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, make_fake_store())
    inputs = tmp_path / "in.pt"
    store_baseline.save_inputs(inputs, [suite.prepared(c) for c in suite.cases])
    same_a = _stand_in_tree(tmp_path / "a", 0)
    same_b = _stand_in_tree(tmp_path / "b", 0)
    changed = _stand_in_tree(tmp_path / "c", 1)
    out = {
        name: store_baseline.run_worker(
            tree, inputs, tmp_path / f"{name}.pt", tmp_path / f"jit-{name}", tmp_path / f"{name}.log"
        )
        for name, tree in (("a", same_a), ("b", same_b), ("c", changed))
    }
    assert out["a"]["sglang"].startswith(str(same_a)) and out["c"]["sglang"].startswith(str(changed))
    same = store_baseline.compare_outputs(out["a"], out["b"])
    assert all(r["identical"] for r in same.values()) and len(same) == len(suite.cases)
    differ = store_baseline.compare_outputs(out["a"], out["c"])
    written = [c.name for c in suite.cases if suite.prepared(c).slots.numel()]
    assert [n for n, r in differ.items() if not r["identical"]] == written  # L=0 writes nothing
