"""The bench's DeepGEMM arms: what they hand DeepGEMM, their check against the Triton twin (run
interpreted), and the report's DeepGEMM columns.

DeepGEMM does not run on a CPU, so its place is taken by ``ReferenceDeepGemm``: DeepGEMM's
documented math in fp64 torch behind its call signatures (shapes and dtypes asserted as DeepGEMM
asserts them). What the arm hands it decides the result; the result is checked by the arm against
the twin, an independent kernel over the same 132-B pages.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from verify.bench import deepgemm_arm
from verify.core import fp8_twin
from verify.core.read_reference import (
    FP8_SLOT_BYTES,
    PAGE,
    causal_lengths,
    make_read_case,
    oracle_logits,
    pack_fp8_pages,
    unpack_fp8_pages,
)

requires_interpreter = pytest.mark.skipif(
    not fp8_twin.INTERPRETED, reason="interpreted kernel tests need TRITON_INTERPRET=1 (CPU)"
)


class ReferenceDeepGemm:
    """DeepGEMM 54e2261's fp8 logits API, computed in fp64 torch (see the module docstring)."""

    def __init__(self, drop_scales: bool = False) -> None:
        self.drop_scales = drop_scales  # a wrong scorer: the twin check must refuse it
        self.metadata_calls: list[tuple[int, ...]] = []

    def get_paged_mqa_logits_metadata(
        self, context_lens: torch.Tensor, block_kv: int, num_sms: int
    ) -> torch.Tensor:
        assert context_lens.dim() == 2 and context_lens.dtype == torch.int32 and block_kv == PAGE
        self.metadata_calls.append(tuple(context_lens.shape))
        return torch.zeros((num_sms + 1, 2), dtype=torch.int32)

    def _deq(self, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return values.float() * (1.0 if self.drop_scales else scales[..., None])

    def fp8_paged_mqa_logits(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        w: torch.Tensor,
        context_lens: torch.Tensor,
        table: torch.Tensor,
        meta: torch.Tensor,
        max_len: int,
        clean: bool,
    ) -> torch.Tensor:
        assert q.dim() == 4 and q.dtype == torch.float8_e4m3fn and kv.dtype == torch.uint8
        assert kv.shape[1:] == (PAGE, 1, FP8_SLOT_BYTES) and context_lens.shape == (q.shape[0], 1)
        assert w.dtype == torch.float32 and table.dtype == torch.int32 and meta.dtype == torch.int32
        values, scales = unpack_fp8_pages(kv.reshape(kv.shape[0], -1))
        return oracle_logits(q, self._deq(values, scales), w, context_lens[:, 0], table, max_len)

    def fp8_mqa_logits(
        self,
        q: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        w: torch.Tensor,
        ks: torch.Tensor,
        ke: torch.Tensor,
        clean_logits: bool,
        max_seqlen_k: int,
    ) -> torch.Tensor:
        k, sf = kv
        assert q.dim() == 3 and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
        assert (
            k.dtype == torch.float8_e4m3fn
            and k.dim() == 2
            and sf.dtype == torch.float32
            and sf.shape == k.shape[:1]
        )
        assert (
            ks.dtype == torch.int32
            and ke.dtype == torch.int32
            and not clean_logits
            and max_seqlen_k % PAGE == 0
        )
        deq = self._deq(k, sf).double()
        out = torch.full((q.shape[0], max_seqlen_k), float("-inf"), dtype=torch.float32)
        for r in range(q.shape[0]):
            j = slice(int(ks[r]), int(ke[r]))
            out[r, j] = ((deq[j] @ q[r].double().T).clamp_min(0) @ w[r].double()).float()
        return out


@requires_interpreter
def test_the_paged_arm_hands_deepgemm_the_decode_batch_as_the_indexer_does() -> None:
    case = make_read_case([1, 63, 64, 65, 200], seed=3)
    buf, _ = pack_fp8_pages(case.pool)
    view = buf.view(-1, PAGE, 1, FP8_SLOT_BYTES)
    dg = ReferenceDeepGemm()
    calls, diff = deepgemm_arm.paged_decode_calls(
        dg, case, view, [case.page_table], fp8_twin.fp8_paged_mqa_logits_twin
    )
    assert len(calls) == 1 and diff < deepgemm_arm.AGREEMENT
    assert dg.metadata_calls == [(case.rows, 1)]  # once per batch, [rows, 1] lengths
    with pytest.raises(deepgemm_arm.Disagrees, match="fp8_paged_mqa_logits: calc_diff"):
        deepgemm_arm.paged_decode_calls(
            ReferenceDeepGemm(drop_scales=True),
            case,
            view,
            [case.page_table],
            fp8_twin.fp8_paged_mqa_logits_twin,
        )


@requires_interpreter
def test_the_nonpaged_arm_gathers_the_request_keys_in_page_table_order() -> None:
    tokens, keys = 96, 150  # a prefill chunk's rows over a request whose keys span three pages
    case = make_read_case(causal_lengths(tokens, keys), seed=5, shared_table=True)
    buf, _ = pack_fp8_pages(case.pool)
    run, diff, gathered = deepgemm_arm.nonpaged_prefill_call(
        ReferenceDeepGemm(), case, buf, keys, 32, fp8_twin.fp8_paged_mqa_logits_twin
    )
    assert diff < deepgemm_arm.AGREEMENT and gathered == keys * (128 + 4)
    run()
    # The same pages in another order: a gather that ignored the page table would still "work".
    shuffled = case.page_table.clone()
    shuffled[:, :2] = case.page_table[:, [1, 0]]
    with pytest.raises(deepgemm_arm.Disagrees, match="fp8_mqa_logits: calc_diff"):
        deepgemm_arm.nonpaged_prefill_call(
            ReferenceDeepGemm(),
            dataclasses.replace(case, page_table=shuffled),
            buf,
            keys,
            32,
            _twin_on(case.page_table),
        )


def _twin_on(table: torch.Tensor) -> Any:
    """The twin reading the original page table whatever table the arm passes it."""

    def twin(
        q: torch.Tensor,
        kv: torch.Tensor,
        w: torch.Tensor,
        lens: torch.Tensor,
        _table: torch.Tensor,
        meta: Any,
        max_len: int,
    ) -> torch.Tensor:
        return fp8_twin.fp8_paged_mqa_logits_twin(q, kv, w, lens, table[: q.shape[0]], meta, max_len)

    return twin


def test_the_arms_say_why_they_did_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm raises ImportError
    dg, why = deepgemm_arm.load()
    assert dg is None and why.startswith("not run: deep_gemm does not import here (ModuleNotFoundError")
    stand_in = types.ModuleType("deep_gemm")
    stand_in.IS_BF16K_STAND_IN = True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deep_gemm", stand_in)
    assert deepgemm_arm.load() == (
        None,
        "not run: only a stand-in of deep_gemm is on the path (GPU runner: USE_DEEPGEMM=1)",
    )
    old = types.ModuleType("deep_gemm")
    old.fp8_paged_mqa_logits = print  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deep_gemm", old)
    assert deepgemm_arm.load() == (
        None,
        "not run: this deep_gemm lacks fp8_mqa_logits, get_paged_mqa_logits_metadata",
    )


def test_the_report_adds_deepgemm_columns_only_when_it_was_timed(tmp_path: Path) -> None:
    from verify.bench import read as bench
    from verify.bench import report
    from verify.bench.read_scenarios import LongPrefillResult, prefill_floors

    def decode(deepgemm: float | None) -> bench.ShapeResult:
        r = bench.ShapeResult(
            shape={"mode": "decode", "rows": 8, "keys": 32768, "width": 0},
            key_bytes_bf16=8 * 32768 * 256,
            key_bytes_fp8=8 * 32768 * 132,
            unique_key_bytes_bf16=8 * 32768 * 256,
        )
        r.bf16_default, r.fp8_best = bench.Timing("bf16", ms=0.0159), bench.Timing("twin", ms=0.0150)
        r.fp8_deepgemm = bench.Timing("dg", ms=deepgemm, error=None if deepgemm else "not run: x")
        return r

    lengths = causal_lengths(8192, 2048)

    def long(deepgemm: float | None) -> LongPrefillResult:
        arms: dict[str, dict[str, Any]] = {
            "bf16": {"ms": 3.0},
            "fp8_twin": {"ms": 1.8},
            "tilelang": {"ms": 1.5},
            "deepgemm_nonpaged": {"ms": deepgemm},
        }
        return LongPrefillResult(
            8192, 2048, 8192, arms=arms, floors=prefill_floors(lengths, 2048, 64), dispatch_arm="bf16"
        )

    bench.write_outputs(
        tmp_path, {"gpu": "NVIDIA H200", "triton": "3.6.0"}, [decode(0.0100)], [], [long(2.0)]
    )
    text = report.render(report.load(tmp_path))
    prose = " ".join(text.split())  # the report wraps its prose
    assert "| 8 x 32,768 | 15.9 | 88 | 1.06 | 2.21 | n/a | 1.59 | 72 |" in text
    assert "| 8,192 | 3.00 | 3.00 | 1.80 |" in text and "| 1.50 | 2.00 | 2.00 | 1.50 |" in text
    assert "checked against the twin before timing" in prose
    # The long-prefill target says, from the run's own floors, why it is out of reach.
    floors = prefill_floors(lengths, 2048, 64)
    assert floors["fp8_nonpaged_compute_ms"] > floors["fp8_nonpaged_memory_ms"]
    share = 100 * floors["fp8_nonpaged_ms"] / 1.5
    assert (
        f"bf16's MMA floor is {floors['bf16_ms'] / floors['fp8_nonpaged_ms']:.2f}x fp8's, so within 1.2x bf16 "
        f"must reach {floors['bf16_ms'] / floors['fp8_nonpaged_ms'] / 1.2:.2f}x"
    ) in prose
    assert f"TileLang {share:.0f}-{share:.0f}%" in prose
    bench.write_outputs(tmp_path, {"gpu": "NVIDIA H200", "triton": "3.6.0"}, [decode(None)], [], [long(None)])
    text = report.render(report.load(tmp_path))
    prose = " ".join(text.split())
    assert "DeepGEMM %" not in text and "DeepGEMM non-paged ms" not in text
    assert "which did not run in this bench" in prose and "DeepGEMM itself did not run in this bench" in prose
