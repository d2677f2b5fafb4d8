"""DeepGEMM's own fp8 scorers as bench arms, where a working DeepGEMM imports.

On the GPU machine that is the GPU runner's ``USE_DEEPGEMM=1`` (DeepGEMM built from source by its
``deepgemm`` stage, the compiler's libstdc++ preloaded); elsewhere the arms say why they did not
run, and the report keeps the Triton twin and the physical floor as the fp8 references.

Each arm is called as upstream's indexer calls it:

- decode: ``fp8_paged_mqa_logits`` over the 132-B pages with ``[rows, 1]`` lengths and DeepGEMM's
  schedule metadata, made once per batch outside the timing (the server builds it once per
  forward, not per layer);
- long prefill: the non-paged ``fp8_mqa_logits`` over the request's keys gathered once, row chunk
  by row chunk with ``max_seqlen_k`` (upstream's default for one request of >= 8,192 prefill
  tokens). The gather is not timed: upstream does it once per request and layer, in O(keys).

Before an arm is timed its logits are compared with the Triton twin's on the same fp8 pages (the
columns each row reads); an arm that disagrees is reported with its error, never timed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verify.core.read_reference import (
    DIM,
    FP8_SLOT_BYTES,
    PAGE,
    ReadCase,
    pages_for,
    unpack_fp8_pages,
)
from verify.core.scoring import calc_diff

# DeepGEMM's own tests accept calc_diff < 1e-3 against their reference for fp8 logits.
AGREEMENT = 1e-3


class Disagrees(RuntimeError):
    """DeepGEMM's logits differ from the twin's on the same pages: not timed."""


def load() -> tuple[Any | None, str]:
    """(the ``deep_gemm`` module, a label) or (None, why the arms cannot run here)."""
    try:
        import deep_gemm
    except Exception as error:  # noqa: BLE001 - any import failure means the arms cannot run
        return None, f"not run: deep_gemm does not import here ({type(error).__name__}: {error})"[:300]
    if getattr(deep_gemm, "IS_STUB", False) or getattr(deep_gemm, "IS_BF16K_STAND_IN", False):
        return None, "not run: only a stand-in of deep_gemm is on the path (GPU runner: USE_DEEPGEMM=1)"
    missing = [
        n
        for n in ("fp8_paged_mqa_logits", "fp8_mqa_logits", "get_paged_mqa_logits_metadata")
        if not hasattr(deep_gemm, n)
    ]
    if missing:
        return None, f"not run: this deep_gemm lacks {', '.join(missing)}"
    return deep_gemm, f"deep_gemm {getattr(deep_gemm, '__version__', '?')} from {deep_gemm.__file__}"


def _valid(logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    keep = torch.arange(logits.shape[1], device=logits.device)[None, :] < lengths.reshape(-1, 1).to(
        logits.device
    )
    return logits.float()[keep]


def _check(name: str, got: torch.Tensor, want: torch.Tensor, lengths: torch.Tensor) -> float:
    x, y = _valid(got, lengths), _valid(want[:, : got.shape[1]], lengths)
    # NaN or inf where a row reads its keys is never agreement (DeepGEMM's metric would give NaN)
    diff = calc_diff(x, y) if bool(torch.isfinite(x).all() and torch.isfinite(y).all()) else float("inf")
    if not diff < AGREEMENT:
        raise Disagrees(f"{name}: calc_diff {diff:.2e} against the Triton twin on the same fp8 pages")
    return diff


def paged_decode_calls(
    dg: Any,
    case: ReadCase,
    fp8_view: torch.Tensor,
    tables: list[torch.Tensor],
    twin: Callable[..., torch.Tensor],
) -> tuple[list[Callable[[], torch.Tensor]], float]:
    """One call per page-table replica, and the agreement with the twin on the first."""
    lengths = case.seq_lens.to(torch.int32).reshape(-1, 1).contiguous()
    sms = torch.cuda.get_device_properties(lengths.device).multi_processor_count if lengths.is_cuda else 1
    meta = dg.get_paged_mqa_logits_metadata(lengths, PAGE, sms)

    def call(table: torch.Tensor) -> Callable[[], torch.Tensor]:
        return lambda: dg.fp8_paged_mqa_logits(
            case.q, fp8_view, case.weights, lengths, table, meta, case.max_seq_len, False
        )

    calls = [call(t) for t in tables]
    want = twin(case.q, fp8_view, case.weights, case.seq_lens, tables[0], None, case.max_seq_len)
    diff = _check("fp8_paged_mqa_logits", calls[0](), want, case.seq_lens)
    return calls, diff


def nonpaged_prefill_call(
    dg: Any,
    case: ReadCase,
    fp8_pool: torch.Tensor,
    keys: int,
    rows_per_chunk: int,
    twin: Callable[..., torch.Tensor],
    empty_at_most: int = 0,
) -> tuple[Callable[[], None], float, int]:
    """A prefill's logits by the non-paged path (one request: its rows share its pages, which the
    longest row's page table lists in full), the agreement with the twin on the first and the
    last chunk (the rows reading the fewest and the most keys), and the gathered copy's bytes.
    ``empty_at_most``: rows of at most that many keys get an empty range (``ke = ks``), as
    upstream's plan gives them with the sgl-kernel top-k (0: every row its keys)."""
    values, scales = unpack_fp8_pages(fp8_pool)
    longest = int(case.seq_lens.argmax())
    ids = case.page_table[longest, : pages_for(keys)].long()
    k = values[ids].reshape(-1, DIM)[:keys].contiguous()
    sf = scales[ids].reshape(-1)[:keys].contiguous()
    q = case.q[:, 0].contiguous()  # [rows, H, 128] fp8
    starts = torch.zeros(case.rows, dtype=torch.int32, device=q.device)
    ends = case.seq_lens.to(torch.int32)
    ends = torch.where(ends > empty_at_most, ends, torch.zeros_like(ends)).contiguous()
    max_seqlen_k = pages_for(keys) * PAGE  # as upstream: the request's keys rounded up to a page

    def chunk(lo: int) -> torch.Tensor:
        rows = slice(lo, min(case.rows, lo + rows_per_chunk))
        return dg.fp8_mqa_logits(
            q[rows],
            (k, sf),
            case.weights[rows],
            starts[rows],
            ends[rows],
            clean_logits=False,
            max_seqlen_k=max_seqlen_k,
        )

    def run() -> None:
        for lo in range(0, case.rows, rows_per_chunk):
            out = chunk(lo)
            del out  # dropped before the next chunk, as the indexer reduces each to top-k

    diff = 0.0
    last = (case.rows - 1) // rows_per_chunk * rows_per_chunk
    for lo in sorted({0, last}):
        rows = slice(lo, min(case.rows, lo + rows_per_chunk))
        want = twin(
            case.q[rows],
            fp8_pool.view(-1, PAGE, 1, FP8_SLOT_BYTES),
            case.weights[rows],
            case.seq_lens[rows],
            case.page_table[rows],
            None,
            case.max_seq_len,
        )
        diff = max(diff, _check("fp8_mqa_logits", chunk(lo), want, ends[rows]))
    return run, diff, k.numel() * k.element_size() + sf.numel() * sf.element_size()
