"""Tier-1 read parity (GPU): the series' bf16 logits kernels against an fp64 oracle.

Two kernels: ``bf16_paged_mqa_logits`` (decode, MTP verify groups, paged prefill chunks: one row
per program, DeepGEMM's paged call signature) and ``bf16_mqa_logits`` (one request's long prefill,
where upstream runs its non-paged fp8 path: a key tile reused across a block of rows). Runs
against the patched upstream on ``PYTHONPATH``::

    PYTHONPATH=<repo>:<patched tree>/python python -m verify.parity.read --out DIR

Every check builds its own inputs and runs on its own (an error, or an out-of-memory skip, in
one does not stop the others). Inputs: a bf16 pool on shuffled pages whose unused table entries
point at a NaN page, lengths 1, 63, 64, 65, 511, 512, 513, 4095, 65536 compressed keys.

The paged kernel:

- ``oracle[q=..,H=..]``: kernel vs the oracle on the same stored keys (fp8 and bf16 q, 64 and
  32 heads): ``calc_diff <= 5e-6`` on finite entries, identical ``-inf`` mask, max abs error
  ``<= 1e-3 * max|logit|``, no NaN (no foreign page read, every element written: the output
  is allocated over a NaN-filled block of the caching allocator).
- ``prefill[..]``: rows are query tokens of one request with causal lengths, sharing a table.
- ``input_forms``: the raw uint8 pool, ``[rows, 1]`` lengths, int64 tables give the same bits
  (with ``clean_logits=False``, up to each row's last key tile).
- ``group_rows[G=..]``: MTP verify rows in groups of G sharing the first row's table (the other
  rows' tables point at the NaN page, so reading one poisons the row), lengths rising within a
  group, a partial last group: against the oracle on the shared tables, 20 bitwise reruns, and
  within the bound of the same rows scored one at a time; ``group_rows_batch``: the same for a
  server-sized batch (``MAX_GROUPED_ROWS / 2`` requests of up to 3,000 keys, two rows each, the
  most the dispatch groups); ``group_rows_static_refused``: the kernel has no grouped mode off
  the length-aware split (an H200 scored grouped rows under the static split wrong): every such
  grouped launch is refused with an AssertionError before anything launches (launch logic only,
  also on a CPU).
- ``clean_logits``: short rows in a 131,072-wide output (a graph-captured decode's width), the
  length-aware split: ``clean_logits=True`` is the oracle with ``-inf`` to the end;
  ``clean_logits=False`` equals it up to each row's last key tile and writes nothing after it
  (outputs allocated NaN-filled), plain and grouped.
- ``cuda_graph_wide``: captured in the wide output, replayed at other lengths (plain and
  grouped): equal to eager up to each row's last key tile.
- ``row_independence``: row chunks (as the call site slices them) and one-row runs equal the
  batch bit for bit under a fixed config; under default configs, bitwise or within the bound.
- ``reruns``: 20 runs bitwise identical.
- ``cuda_graph``: capture at one set of lengths, replay at others: equal to eager, bit for bit.
- ``extra_memory``: the call allocates nothing beyond its fp32 logits.
- ``fp8_twin_oracle`` / ``fp8_twin_vs_upstream_torch``: the bench's fp8 baseline (a Triton twin
  of this kernel over upstream's 132-B pages) against its dequantized-input oracle (DeepGEMM's
  own bound, 5e-6) and against upstream's ``fp8_paged_mqa_logits_torch`` at small size (1e-3,
  the bound against a bf16-input reference).

The prefill kernel (rows of one request, ``ks[r] <= j < ke[r]``, column ``j`` = key ``j``; the
pages past the request's and the slots of its last page past its last key hold NaN, outputs are
allocated NaN-filled; each check runs ``clean_logits`` False -- the indexer's: exact on the key
tiles a row reads, nothing written elsewhere -- and True -- the oracle everywhere):

- ``mqa_oracle[q=..,H=..]`` / ``mqa_prefill[..]``: causal prefills (2,048 rows over 1,023 keys;
  8,192 x 2,048; 1,024 x 4,095; 64 x 65,536) against the oracle;
- ``mqa_chunk_boundaries``: the row chunks of a 16,384-row prefill, sliced as the dispatch slices
  them (edges off the kernel's row blocks, one where the last key crosses a key tile): each equal
  to the whole call's rows bit for bit, and to the oracle;
- ``mqa_ks_window``: ``ks > 0`` (windows, ``ks`` at key-tile edges);
- ``mqa_empty_rows``: rows reading nothing (``ke <= ks``, the empty ranges the dispatch gives
  rows of at most top-k keys) stay unwritten (``-inf`` with ``clean_logits=True``);
- ``mqa_input_forms``: the uint8 pool, a ``[1, max_pages]`` table, a contiguous key copy: same bits;
- ``mqa_configs``: every config of ``CONFIGS`` (sm_120's too, run here) and the bench's variants;
- ``mqa_reruns``: 20 bitwise reruns; ``mqa_vs_paged``: within the bound of the paged kernel on the
  same rows; ``mqa_cuda_graph``: replay at other ``ke`` = eager; ``mqa_extra_memory``: nothing
  beyond the logits.

Results go to ``DIR/read.json``; a summary table is printed last. Exit status 1 when a
check failed or errored. ``--device cpu --small`` is a smoke run of the launch logic and the
fp8 twin (with ``TRITON_INTERPRET=1``); every check that runs a bf16 kernel skips there (the
interpreter misreads bf16; those kernels carry no interpreter branch).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from verify.core import platform as P
from verify.core.read_reference import (
    PAGE,
    PrefillCase,
    ReadCase,
    causal_lengths,
    make_group_case,
    make_prefill_case,
    make_read_case,
    mqa_oracle_logits,
    mqa_owned,
    oracle_logits,
    pack_fp8_pages,
    tiles_end,
    verify_lengths,
)
from verify.core.scoring import calc_diff
from verify.core.upstream import (
    load_bf16_kernel_module,
    load_bf16_prefill_module,
    load_upstream_fp8_torch_reader,
)
from verify.parity.store_report import CheckResult, CheckSkipped, Status, run_check, summary_table, write_json

SUITE = "parity.read"
FULL_LENGTHS = [1, 63, 64, 65, 511, 512, 513, 4095, 65536]
SMALL_LENGTHS = [1, 63, 64, 65, 200]
CALC_DIFF_MAX = 5e-6
ABS_ERR_REL_MAX = 1e-3
UPSTREAM_TORCH_CALC_DIFF_MAX = 1e-3
WIDE_OUTPUT = 131072  # keys: a CUDA graph captured for 512K-token contexts
WIDE_LENGTHS = [1, 64, 65, 2047, 2048, 0, 513, 4095]


@dataclass
class Settings:
    device: torch.device
    lengths: list[int]
    heads: list[int]
    reruns: int
    seed: int
    prefill: list[tuple[int, int]]  # (query rows, final compressed length)
    small: bool
    groups: list[int]  # MTP verify rows per request (group_rows) to check
    # the prefill kernel: (query rows, final keys) of causal prefills; the first is the base case
    mqa_prefill: list[tuple[int, int]] = field(default_factory=lambda: [(2048, 1023)])
    mqa_chunked: tuple[int, int] = (8192, 2047)  # the longer prefill whose row chunks are checked


class Suite:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.module, self.module_route = load_bf16_kernel_module()
        self.kernel: Callable[..., torch.Tensor] = self.module.bf16_paged_mqa_logits
        self.prefill_module, self.prefill_module_route = load_bf16_prefill_module()

    # ------------------------------------------------------------- helpers

    @property
    def cuda(self) -> bool:
        return self.s.device.type == "cuda"

    def case(self, lengths: list[int], **kw: Any) -> ReadCase:
        return make_read_case(lengths, device=self.s.device, **kw)

    @contextlib.contextmanager
    def nan_outputs(self) -> Iterator[None]:
        """Every fp32 tensor allocated meanwhile starts as NaN (the kernel module's output
        among them), so an element the kernel does not write is NaN, on any device."""
        empty = torch.empty

        def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = empty(*args, **kwargs)
            if out.dtype == torch.float32:
                out.fill_(float("nan"))
            return out

        torch.empty = nan_empty
        try:
            yield
        finally:
            torch.empty = empty

    def run(self, case: ReadCase, *, poison: bool = True, config: Any = None, **kw: Any) -> torch.Tensor:
        """The kernel as the indexer calls it; with ``config``, that launch config instead of the
        one the module selects for this device (another GPU's selection)."""
        if poison and self.cuda:
            # Freed into the caching allocator, so the output most likely lands on NaNs:
            # any element the kernel does not write then shows up as NaN.
            torch.full((case.rows, case.max_seq_len), float("nan"), device=self.s.device)
        if config is not None:
            return self.module.bf16_paged_mqa_logits_with_config(
                case.q,
                case.pool_view(),
                case.weights,
                case.seq_lens,
                case.page_table,
                case.max_seq_len,
                config=config,
                fill_tail=kw.pop("clean_logits", True),
                **kw,
            )
        return self.kernel(
            case.q,
            case.pool_view(),
            case.weights,
            case.seq_lens,
            case.page_table,
            None,
            case.max_seq_len,
            **kw,
        )

    def oracle(self, case: ReadCase, keys: torch.Tensor | None = None) -> torch.Tensor:
        keys = case.pool if keys is None else keys
        return oracle_logits(case.q, keys, case.weights, case.seq_lens, case.page_table, case.max_seq_len)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    # ------------------------------------------------------------- checks

    def check_oracle(self, q_dtype: torch.dtype, heads: int) -> CheckResult:
        case = self.case(self.s.lengths, heads=heads, q_dtype=q_dtype, seed=self.s.seed + heads)
        out = self.run(case)
        ref = self.oracle(case)
        metrics = compare(out, ref)
        metrics["per_length"] = {
            str(n): compare(out[r : r + 1], ref[r : r + 1])["calc_diff"] for r, n in enumerate(self.s.lengths)
        }
        return verdict(metrics, f"{len(self.s.lengths)} rows, lengths {self.s.lengths}")

    def check_prefill(self, rows: int, final: int) -> CheckResult:
        lengths = causal_lengths(rows, final)
        case = self.case(lengths, shared_table=True, seed=self.s.seed + 11)
        out = self.run(case)
        metrics = compare(out, self.oracle(case))
        metrics["rows"], metrics["lengths"] = rows, f"{lengths[0]}..{lengths[-1]}"
        return verdict(metrics, f"{rows} causal rows, lengths {lengths[0]}..{lengths[-1]}")

    def check_input_forms(self) -> CheckResult:
        case = self.case(self.s.lengths, seed=self.s.seed + 21)
        base = self.run(case, poison=False)
        variants = {
            "uint8 pool, [rows,1] lengths, clean_logits=False": self.kernel(
                case.q,
                case.pool_bytes(),
                case.weights,
                case.seq_lens[:, None],
                case.page_table,
                None,
                case.max_seq_len,
                False,
            ),
            "[rows,H,128] q, [pages,64,128] pool, int64 lengths and table": self.kernel(
                case.q[:, 0],
                case.pool,
                case.weights,
                case.seq_lens.long(),
                case.page_table.long(),
                object(),
                case.max_seq_len,
            ),
        }
        owned = (
            torch.arange(case.max_seq_len, device=base.device)[None, :]
            < tiles_end(case.seq_lens, case.max_seq_len).to(base.device)[:, None]
        )
        bad = [
            name
            for name, out in variants.items()
            if not torch.equal(out[owned], base[owned])
            or ("clean_logits=False" not in name and not torch.equal(out, base))
        ]
        status = Status.PASS if not bad else Status.FAIL
        return CheckResult(
            "", status, "all forms bitwise equal" if not bad else f"differ: {bad}", {"forms": list(variants)}
        )

    def check_row_independence(self) -> CheckResult:
        case = self.case(self.s.lengths, seed=self.s.seed + 31)
        cfg_cls = self.module.Bf16IndexLogitsConfig
        fixed = cfg_cls(block_n=64, split_n=1024)
        with_cfg = self.module.bf16_paged_mqa_logits_with_config

        def call(rows: slice, config: Any) -> torch.Tensor:
            return with_cfg(
                case.q[rows],
                case.pool_view(),
                case.weights[rows],
                case.seq_lens[rows],
                case.page_table[rows],
                case.max_seq_len,
                config,
            )

        whole_fixed = call(slice(None), fixed)
        chunk_slices = [slice(0, 2), slice(2, 5), slice(5, None)]
        chunked = torch.cat([call(sl, fixed) for sl in chunk_slices])
        singles = torch.cat([call(slice(r, r + 1), fixed) for r in range(case.rows)])
        whole_default = call(slice(None), None)
        chunked_default = torch.cat([call(sl, None) for sl in chunk_slices])
        details = {
            "fixed_config_chunks_bitwise": torch.equal(chunked, whole_fixed),
            "fixed_config_single_rows_bitwise": torch.equal(singles, whole_fixed),
            "default_config_chunks_bitwise": torch.equal(chunked_default, whole_default),
            "default_config_chunks_calc_diff": compare(chunked_default, whole_default)["calc_diff"],
        }
        default_ok = details["default_config_chunks_bitwise"] or compare(chunked_default, whole_default)["ok"]
        ok = (
            details["fixed_config_chunks_bitwise"]
            and details["fixed_config_single_rows_bitwise"]
            and default_ok
        )
        return CheckResult("", Status.PASS if ok else Status.FAIL, _fmt(details), details)

    def check_reruns(self) -> CheckResult:
        case = self.case(self.s.lengths, seed=self.s.seed + 41)
        first = self.run(case, poison=False)
        differing = [
            i for i in range(1, self.s.reruns) if not torch.equal(self.run(case, poison=False), first)
        ]
        status = Status.PASS if not differing else Status.FAIL
        summary = (
            f"{self.s.reruns} runs bitwise identical"
            if not differing
            else f"runs {differing} differ from run 0"
        )
        return CheckResult("", status, summary, {"reruns": self.s.reruns, "differing": differing})

    def check_cuda_graph(self) -> CheckResult:
        if not self.cuda:
            raise CheckSkipped("CUDA graphs need a GPU")
        lengths = self.s.lengths
        rows = len(lengths)
        case = self.case(lengths, seed=self.s.seed + 51)
        longest = max(lengths)
        # Every row gets the longest row's table, so any length up to it is backed by keys.
        table = case.page_table[lengths.index(longest)].repeat(rows, 1).contiguous()
        capture_lens = torch.tensor([max(1, n // 3) for n in lengths], dtype=torch.int32)
        replays = {
            "reversed": torch.tensor(lengths[::-1], dtype=torch.int32),
            "all_longest": torch.full((rows,), longest, dtype=torch.int32),
            "with_zero_and_1": torch.tensor([0] + [1] * (rows - 1), dtype=torch.int32),
            "capture_lengths": capture_lens,
        }
        static_lens = capture_lens.to(self.s.device)
        static = ReadCase(
            case.q, case.pool, case.weights, static_lens, table, case.max_seq_len, case.poison_page
        )
        self.run(static, poison=False)  # compile and warm up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = self.run(static, poison=False)
        details: dict[str, Any] = {}
        for name, lens in replays.items():
            static_lens.copy_(lens.to(self.s.device))
            graph.replay()
            torch.cuda.synchronize()
            eager = self.run(static.with_lengths(lens), poison=False)
            details[f"{name}_equals_eager"] = torch.equal(captured, eager)
            if name == "reversed":
                details["reversed_vs_oracle"] = compare(captured, self.oracle(static.with_lengths(lens)))
        ok = (
            all(v for k, v in details.items() if k.endswith("_equals_eager"))
            and details["reversed_vs_oracle"]["ok"]
        )
        return CheckResult("", Status.PASS if ok else Status.FAIL, _fmt(details), details)

    def check_extra_memory(self) -> CheckResult:
        if not self.cuda:
            raise CheckSkipped("memory statistics need a GPU")
        case = self.case(self.s.lengths, seed=self.s.seed + 61)
        self.run(case, poison=False)  # warm up (compilation may allocate)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = self.run(case, poison=False)
        torch.cuda.synchronize()
        peak_extra = torch.cuda.max_memory_allocated() - before
        out_bytes = out.numel() * out.element_size()
        beyond = peak_extra - out_bytes
        details = {"peak_extra_bytes": peak_extra, "logits_bytes": out_bytes, "beyond_logits_bytes": beyond}
        # The caching allocator rounds blocks up (to 2 MiB for large ones).
        ok = beyond <= 2 * 1024 * 1024
        return CheckResult("", Status.PASS if ok else Status.FAIL, _fmt(details), details)

    def check_fp8_twin_oracle(self) -> CheckResult:
        from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

        case = self.case(self.s.lengths, seed=self.s.seed + 71)
        buf, deq = pack_fp8_pages(case.pool)  # the NaN page stays NaN: must never be read
        assert deq is not None
        out = fp8_paged_mqa_logits_twin(
            case.q,
            buf.view(-1, PAGE, 1, 132),
            case.weights,
            case.seq_lens,
            case.page_table,
            None,
            case.max_seq_len,
        )
        metrics = compare(out, self.oracle(case, deq))
        # For the record: how far the fp8 arm is from the bf16 keys it quantized.
        bf16_ref = self.oracle(case)
        finite = torch.isfinite(bf16_ref)
        metrics["calc_diff_vs_bf16_key_oracle"] = calc_diff(out[finite], bf16_ref[finite])
        return verdict(metrics, "fp8 twin vs dequantized-input oracle")

    def check_fp8_twin_vs_upstream_torch(self) -> CheckResult:
        from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

        reader, route = load_upstream_fp8_torch_reader()
        case = self.case(SMALL_LENGTHS + [511, 513], seed=self.s.seed + 81)
        keys = case.pool.clone()
        keys[case.poison_page] = 0  # upstream's reader gathers padding pages (then zeroes them)
        buf, _ = pack_fp8_pages(keys)
        kv = buf.view(-1, PAGE, 1, 132)
        twin = fp8_paged_mqa_logits_twin(
            case.q, kv, case.weights, case.seq_lens, case.page_table, None, case.max_seq_len
        )
        upstream = reader(
            case.q, kv, case.weights, case.seq_lens, case.page_table, None, case.max_seq_len, False
        )
        finite = torch.isfinite(twin)
        positions = torch.arange(case.max_seq_len, device=twin.device)
        expected_finite = positions[None, :] < case.seq_lens[:, None]
        diff = calc_diff(twin[finite], upstream[finite])
        details = {
            "upstream_route": route,
            "calc_diff": diff,
            "twin_mask_matches_lengths": torch.equal(finite, expected_finite),
            "upstream_masked_with_zero": bool(torch.all(upstream[~finite] == 0)),
        }
        ok = diff <= UPSTREAM_TORCH_CALC_DIFF_MAX and details["twin_mask_matches_lengths"]
        return CheckResult(
            "", Status.PASS if ok else Status.FAIL, _fmt(details, skip=("upstream_route",)), details
        )

    def grouped_config(self, group_rows: int, profile: str | None = None) -> Any:
        """The launch config the kernel module selects for groups of 64-head rows on ``profile``'s
        GPU (its shared memory, verify.core.platform.SHARED_MEMORY), or on this device."""
        shared = (
            P.kernel_shared_memory(self.module, profile)
            if profile
            else self.module._device_shared_memory(self.s.device)
        )
        return self.module.select_config(1, 0, 64, group_rows, shared)

    def other_gpu_group_configs(self) -> list[tuple[int, str]]:
        """(group_rows, profile) for each GPU whose grouped config differs from this device's."""
        out = []
        for group_rows in self.s.groups:
            seen = {self.grouped_config(group_rows)}
            for profile in P.SHARED_MEMORY:
                config = self.grouped_config(group_rows, profile)
                if config not in seen:
                    seen.add(config)
                    out.append((group_rows, profile))
        return out

    def check_group_rows(
        self, group_rows: int, finals: list[int] | None = None, profile: str | None = None
    ) -> CheckResult:
        """Groups against the oracle, the rows one at a time and reruns; with ``profile``, under
        the config that GPU's shared memory selects (run here)."""
        if finals is None:
            finals = [n for n in self.s.lengths if n >= 1]
        lengths = verify_lengths(finals, group_rows)[:-1]  # a partial last group
        case, shared = make_group_case(
            lengths, group_rows, seed=self.s.seed + 91 + group_rows, device=self.s.device
        )
        config = self.grouped_config(group_rows, profile) if profile else None
        out = self.run(case, group_rows=group_rows, config=config)
        metrics = compare(out, self.oracle(shared))
        singles = self.run(shared, poison=False)
        finite = torch.isfinite(singles)
        metrics["calc_diff_vs_one_row_at_a_time"] = calc_diff(out[finite], singles[finite])
        differing = [
            i
            for i in range(1, self.s.reruns)
            if not torch.equal(self.run(case, poison=False, group_rows=group_rows, config=config), out)
        ]
        metrics["rerun_differing"] = differing
        metrics["rows"] = case.rows
        used = config or self.grouped_config(group_rows)
        metrics["config"] = {k: getattr(used, k) for k in ("block_n", "num_warps", "num_stages")}
        ok = metrics["ok"] and not differing and metrics["calc_diff_vs_one_row_at_a_time"] <= CALC_DIFF_MAX
        result = verdict(
            metrics, f"{case.rows} verify rows in groups of {group_rows}, {self.s.reruns} reruns"
        )
        return replace(result, status=Status.PASS if ok else Status.FAIL)

    def check_group_rows_batch(self) -> CheckResult:
        """MTP verify rows of a server-sized batch, two per request: as many requests as the
        dispatch still groups (``MAX_GROUPED_ROWS / 2``, 2,048 on a GPU), seeded lengths up to
        3,000 keys, launched with the default config as the dispatch launches them -- the
        length-aware split's programs spread over hundreds of groups, not the handful above."""
        requests = 8 if self.s.small else self.module.MAX_GROUPED_ROWS // 2
        gen = torch.Generator().manual_seed(self.s.seed + 93)
        finals = torch.randint(1, 300 if self.s.small else 3000, (requests,), generator=gen).tolist()
        # check_group_rows drops the last row (a partial last group): 2 * requests - 1 rows,
        # within the MAX_GROUPED_ROWS the length-aware split reads.
        return self.check_group_rows(2, finals)

    def check_group_rows_static_refused(self) -> CheckResult:
        """Grouped rows run only under the length-aware split (the kernel has no grouped
        static-split mode since an H200 scored it wrong, verify/results/h200/parity/
        read-group-static-split.json): the module refuses every other grouped launch with an
        AssertionError before it launches anything -- verify rows under an explicit static split,
        under a config without the length-aware split, under the prefill config, and more rows
        than the length-aware split reads. The kernel's launch is replaced by a recorder, so a
        launch that got through would show; the default config's grouped launch is the control
        (it must reach the recorder). Python launch logic only: on a CPU the inputs claim CUDA
        (the module asserts that first), nothing runs."""
        module: Any = self.module  # its kernel is replaced by a recorder below
        cfg = module.Bf16IndexLogitsConfig
        static = cfg(block_n=64, split_n=128)
        no_len_aware = replace(module.CONFIGS["decode"], length_aware=False)
        verify, _ = make_group_case(
            verify_lengths([65, 129], 2), 2, poison_others=False, seed=self.s.seed + 98, device=self.s.device
        )
        too_many = module.MAX_GROUPED_ROWS + 2
        big, _ = make_group_case(
            [1] * too_many, 2, poison_others=False, heads=16, seed=self.s.seed + 99, device=self.s.device
        )

        def launch(case: ReadCase, config: Any) -> Callable[[], Any]:
            args = [
                _claims_cuda(t) if not self.cuda else t
                for t in (case.q, case.pool_view(), case.weights, case.seq_lens, case.page_table)
            ]
            return lambda: module.bf16_paged_mqa_logits_with_config(
                *args, case.max_seq_len, config, fill_tail=False, group_rows=2
            )

        launches = {
            "verify rows, explicit static split (split_n=128)": launch(verify, static),
            "verify rows, decode config without the length-aware split": launch(verify, no_len_aware),
            "verify rows, the prefill config": launch(verify, module.CONFIGS["prefill"]),
            f"{too_many} rows in groups of 2 (> MAX_GROUPED_ROWS={module.MAX_GROUPED_ROWS}), default config": launch(
                big, None
            ),
        }
        outcome: dict[str, str] = {}
        launched: list[Any] = []
        real = module._bf16_paged_mqa_logits_kernel
        module._bf16_paged_mqa_logits_kernel = _LaunchRecorder(launched)
        try:
            for name, fn in launches.items():
                before = len(launched)
                try:
                    fn()
                    outcome[name] = "launched" if len(launched) > before else "returned without a launch"
                except AssertionError as error:
                    refused = "length-aware only" in str(error) and len(launched) == before
                    outcome[name] = (
                        "refused before launch" if refused else f"other assertion: {str(error)[:120]}"
                    )
                except Exception as error:  # noqa: BLE001 - any other failure is this check's result
                    outcome[name] = f"other error: {type(error).__name__}: {str(error)[:120]}"
            before = len(launched)
            try:
                launch(verify, None)()
                control = "launched" if len(launched) > before else "no launch"
            except Exception as error:  # noqa: BLE001
                control = f"error: {type(error).__name__}: {str(error)[:120]}"
        finally:
            module._bf16_paged_mqa_logits_kernel = real
        details = {
            "refused": outcome,
            "control_default_config_grouped": control,
            "inputs": "CPU tensors claiming CUDA (launch logic only)" if not self.cuda else "CUDA tensors",
        }
        ok = all(v == "refused before launch" for v in outcome.values()) and control == "launched"
        summary = (
            f"{sum(v == 'refused before launch' for v in outcome.values())}/{len(outcome)} grouped launches "
            f"off the length-aware split refused before launch (AssertionError 'length-aware only'); "
            f"the default grouped launch: {control}"
        )
        return CheckResult("", Status.PASS if ok else Status.FAIL, summary, details)

    def wide_case(self, lengths: list[int], seed: int) -> ReadCase:
        case = self.case(lengths, seed=seed)
        width_pages = WIDE_OUTPUT // PAGE if self.cuda else case.page_table.shape[1] + 32
        table = torch.full(
            (case.rows, width_pages), case.poison_page, dtype=torch.int32, device=self.s.device
        )
        table[:, : case.page_table.shape[1]] = case.page_table
        return replace(case, page_table=table, max_seq_len=width_pages * PAGE)

    def check_clean_logits(self) -> CheckResult:
        lengths = WIDE_LENGTHS if self.cuda else SMALL_LENGTHS
        case = self.wide_case(lengths, self.s.seed + 101)
        finals = [n for n in lengths if n >= 1][:4]
        group, shared = make_group_case(
            verify_lengths(finals, 2), 2, seed=self.s.seed + 103, device=self.s.device
        )
        wide = replace(
            group,
            page_table=_widen(group.page_table, case.page_table.shape[1], group.poison_page),
            max_seq_len=case.max_seq_len,
        )
        wide_shared = replace(
            shared,
            page_table=_widen(shared.page_table, case.page_table.shape[1], shared.poison_page),
            max_seq_len=case.max_seq_len,
        )
        details: dict[str, Any] = {}
        for name, kernel_case, ref_case, kw in (
            ("plain", case, case, {}),
            ("groups_of_2", wide, wide_shared, {"group_rows": 2}),
        ):
            with self.nan_outputs():
                lean = self.run(kernel_case, poison=False, clean_logits=False, **kw)
                clean = self.run(kernel_case, poison=False, clean_logits=True, **kw)
            ref = self.oracle(ref_case)
            owned = _owned(ref_case, lean.device)
            lean_metrics = compare(torch.where(owned, lean, ref.to(lean.device)), ref)
            details[f"{name}_clean_true"] = compare(clean, ref)
            details[f"{name}_clean_false_owned"] = lean_metrics
            details[f"{name}_clean_false_unwritten_past_last_tile"] = bool(torch.isnan(lean[~owned]).all())
            details[f"{name}_positions_left_unwritten"] = int((~owned).sum())
        ok = all(
            (v["ok"] if isinstance(v, dict) else v)
            for k, v in details.items()
            if not k.endswith("_positions_left_unwritten")
        )
        return CheckResult("", Status.PASS if ok else Status.FAIL, _fmt(details), details)

    def check_cuda_graph_wide(self) -> CheckResult:
        if not self.cuda:
            raise CheckSkipped("CUDA graphs need a GPU")
        rows = 8
        details: dict[str, Any] = {}
        for group_rows in (1, 2):
            case = self.wide_case([4096] * rows, self.s.seed + 107)
            table = case.page_table[0].repeat(rows, 1).contiguous()
            static = replace(case, page_table=table, seq_lens=case.seq_lens.clone())
            self.run(static, poison=False, clean_logits=False, group_rows=group_rows)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = self.run(static, poison=False, clean_logits=False, group_rows=group_rows)
            for label, lengths in (
                ("all_1", [1] * rows),
                ("mtp_pairs", [4096, 4095] * (rows // 2)),
                ("mixed", [64, 65, 2048, 2047, 0, 1, 700, 699]),
            ):
                lens = torch.tensor(lengths, dtype=torch.int32, device=self.s.device)
                static.seq_lens.copy_(lens)
                graph.replay()
                torch.cuda.synchronize()
                step = static.with_lengths(lens)
                eager = self.run(step, poison=False, clean_logits=False, group_rows=group_rows)
                owned = _owned(step, captured.device)
                details[f"g{group_rows}_{label}_equals_eager"] = bool(
                    torch.equal(captured[owned], eager[owned])
                )
                ref = self.oracle(step)
                details[f"g{group_rows}_{label}_vs_oracle"] = compare(
                    torch.where(owned, captured, ref.to(captured.device)), ref
                )
            del graph
        ok = all((v["ok"] if isinstance(v, dict) else v) for v in details.values())
        return CheckResult("", Status.PASS if ok else Status.FAIL, _fmt(details), details)

    # ------------------------------------------------- the prefill kernel (bf16_mqa_logits)

    def prefill_case(self, ke: list[int], ks: list[int] | None = None, **kw: Any) -> PrefillCase:
        return make_prefill_case(ke, ks, device=self.s.device, **kw)

    def mqa(
        self,
        case: PrefillCase,
        *,
        clean_logits: bool = False,
        config: Any = None,
        kv: torch.Tensor | None = None,
        page_table: Any = "case",
    ) -> torch.Tensor:
        """``bf16_mqa_logits`` as the dispatch calls it (the pool view, the request's table); with
        ``config`` through ``bf16_mqa_logits_with_config``."""
        table = case.page_table if isinstance(page_table, str) else page_table
        kv = case.pool_view() if kv is None else kv
        if config is not None:
            return self.prefill_module.bf16_mqa_logits_with_config(
                case.q,
                kv,
                case.weights,
                case.ks,
                case.ke,
                case.max_seqlen_k,
                page_table=table,
                clean_logits=clean_logits,
                config=config,
            )
        return self.prefill_module.bf16_mqa_logits(
            case.q,
            kv,
            case.weights,
            case.ks,
            case.ke,
            case.max_seqlen_k,
            page_table=table,
            clean_logits=clean_logits,
        )

    def mqa_block_k(self, config: Any = None, heads: int = 64) -> int:
        """The key tile of ``config``, or of the config the module selects on this device."""
        module = self.prefill_module
        used = config or module.select_prefill_config(module._device_shared_memory(self.s.device), heads)
        return int(used.block_k)

    def mqa_both(self, case: PrefillCase, config: Any = None, what: str = "") -> CheckResult:
        """``clean_logits`` False and True on NaN-filled outputs against the oracle: False equals it
        on the key tiles each row reads and leaves every other position unwritten; True is the
        oracle everywhere."""
        with self.nan_outputs():
            lean = self.mqa(case, config=config)
            clean = self.mqa(case, clean_logits=True, config=config)
        ref = mqa_oracle_logits(case)
        owned = mqa_owned(case.ks, case.ke, case.max_seqlen_k, self.mqa_block_k(config, case.heads)).to(
            lean.device
        )
        metrics = compare(torch.where(owned, lean, ref.to(lean.device)), ref)
        metrics["clean_logits_true"] = compare(clean, ref)
        metrics["unwritten_stay_nan"] = bool(torch.isnan(lean[~owned]).all())
        metrics["positions_left_unwritten"] = int((~owned).sum())
        metrics["rows"] = case.rows
        metrics["ok"] = metrics["ok"] and metrics["clean_logits_true"]["ok"] and metrics["unwritten_stay_nan"]
        result = verdict(metrics, what)
        return replace(
            result,
            summary=result.summary
            + (
                f"; clean_logits=True {'= oracle' if metrics['clean_logits_true']['ok'] else 'DIFFERS'}; "
                f"{metrics['positions_left_unwritten']} positions outside the rows' tiles "
                f"{'left unwritten' if metrics['unwritten_stay_nan'] else 'WRITTEN'}"
            ),
        )

    def check_mqa_oracle(self, q_dtype: torch.dtype, heads: int) -> CheckResult:
        rows, final = self.s.mqa_prefill[0]
        case = self.prefill_case(
            causal_lengths(rows, final), heads=heads, q_dtype=q_dtype, seed=self.s.seed + 201 + heads
        )
        return self.mqa_both(
            case,
            what=f"{rows} causal rows over {final} keys (the last page's tail and the pages past it NaN)",
        )

    def check_mqa_prefill(self, rows: int, final: int) -> CheckResult:
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 211)
        return self.mqa_both(case, what=f"{rows} causal rows over {final} keys")

    def check_mqa_chunk_boundaries(self) -> CheckResult:
        """Row chunks of a longer prefill, sliced as the dispatch slices them (the same table and
        width): each chunk equals the whole call's rows bit for bit and the oracle; the chunk
        edges fall off the kernel's row blocks and one falls where the rows' last key crosses a
        key tile."""
        rows, final = self.s.mqa_chunked
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 221)
        rows = case.rows  # causal_lengths gives at most 4 rows a key
        block_k = self.mqa_block_k()
        ke = case.ke.tolist()
        crossing = next(
            (
                r
                for r in range(1, rows)
                if ke[r - 1] % block_k == 0 and ke[r] % block_k == 1 and ke[r - 1] > 0
            ),
            rows // 2,
        )
        step = max(1, rows // 3 - 37)  # off the 128-row blocks
        edges = sorted({0, rows, crossing, *range(step, rows, step)})
        whole = self.mqa(case)
        owned = mqa_owned(case.ks, case.ke, case.max_seqlen_k, block_k).to(whole.device)
        ref = mqa_oracle_logits(case)
        bitwise, metrics = [], []
        for lo, hi in itertools.pairwise(edges):
            part = self.mqa(case.rows_slice(slice(lo, hi)))
            own = owned[lo:hi]
            bitwise.append(bool(torch.equal(part[own], whole[lo:hi][own])))
            metrics.append(compare(torch.where(own, part, ref[lo:hi].to(part.device)), ref[lo:hi]))
        details = {
            "chunks": [[lo, hi] for lo, hi in itertools.pairwise(edges)],
            "tile_crossing_row": crossing,
            "chunks_bitwise_equal_to_whole": all(bitwise),
            "chunks_vs_oracle_ok": all(m["ok"] for m in metrics),
            "calc_diff_max": max(m["calc_diff"] for m in metrics),
        }
        ok = details["chunks_bitwise_equal_to_whole"] and details["chunks_vs_oracle_ok"]
        return CheckResult(
            "",
            Status.PASS if ok else Status.FAIL,
            f"{len(bitwise)} row chunks of {rows} causal rows x {final} keys (one starting at row "
            f"{crossing}, where the last key crosses a {block_k}-key tile): "
            + _fmt(details, skip=("chunks",)),
            details,
        )

    def check_mqa_ks_window(self) -> CheckResult:
        """Rows whose first visible key is past 0 (``ks > 0``, around key-tile edges too): column j
        stays key j, positions before ``ks`` are ``-inf`` inside the row's tiles."""
        rows, final = self.s.mqa_prefill[0]
        ke = causal_lengths(rows, final)
        block_k = self.mqa_block_k()
        gen = torch.Generator().manual_seed(self.s.seed + 231)
        window = torch.randint(1, max(2, final // 2), (rows,), generator=gen).tolist()
        ks = [max(0, e - w) for e, w in zip(ke, window)]
        for r, edge in zip(range(rows - 6, rows), (block_k - 1, block_k, block_k + 1, 1, 2 * block_k, 63)):
            ks[r] = min(edge, ke[r] - 1)
        case = self.prefill_case(ke, ks, seed=self.s.seed + 232)
        return self.mqa_both(case, what=f"{rows} rows with ks > 0 (windows, and ks at key-tile edges)")

    def check_mqa_empty_rows(self) -> CheckResult:
        """Rows that read nothing (``ke <= ks``: 0/0, x/x, ``ke < ks``, and the ranges the dispatch
        empties for rows of at most top-k keys, ``ke = ks``) among rows that do: they stay
        unwritten with ``clean_logits=False`` and are ``-inf`` with True; the others are right."""
        rows, final = self.s.mqa_prefill[0]
        ke = causal_lengths(rows, final)
        ks = [0] * rows
        for r in range(0, rows, 7):
            ks[r], ke[r] = (
                (0, 0) if r % 3 == 0 else (ke[r], ke[r]) if r % 3 == 1 else (ke[r], max(0, ke[r] - 5))
            )
        topk = 512
        for r in range(rows):
            if 0 < ke[r] - ks[r] <= topk and r % 2:
                ks[r] = ke[r]  # the dispatch's empty range for a row the top-k takes whole
        case = self.prefill_case(ke, ks, n_keys=final, seed=self.s.seed + 241)
        result = self.mqa_both(case, what=f"{rows} rows, {sum(e <= s for s, e in zip(ks, ke))} of them empty")
        empty = (case.ke <= case.ks).cpu()
        with self.nan_outputs():
            lean = self.mqa(case)
        result.details["empty_rows"] = int(empty.sum())
        result.details["empty_rows_unwritten"] = bool(torch.isnan(lean[empty.to(lean.device)]).all())
        if not result.details["empty_rows_unwritten"]:
            result = replace(
                result, status=Status.FAIL, summary=result.summary + "; an EMPTY ROW was written"
            )
        return result

    def check_mqa_input_forms(self) -> CheckResult:
        """The pool's raw uint8 buffer, a ``[1, max_pages]`` table and a contiguous ``[keys, 128]``
        copy of the request's keys give the bits of the bf16 view with a 1-D table."""
        rows, final = self.s.mqa_prefill[0]
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 251)
        base = self.mqa(case)
        owned = mqa_owned(case.ks, case.ke, case.max_seqlen_k, self.mqa_block_k()).to(base.device)
        forms = {
            "uint8 pool": self.mqa(case, kv=case.pool_bytes()),
            "[1, max_pages] table": self.mqa(case, page_table=case.page_table[None, :]),
            "contiguous [keys, 128] copy, no table": self.mqa(case, kv=case.keys(), page_table=None),
        }
        bad = [name for name, out in forms.items() if not torch.equal(out[owned], base[owned])]
        return CheckResult(
            "",
            Status.PASS if not bad else Status.FAIL,
            "all forms bitwise equal" if not bad else f"differ: {bad}",
            {"forms": list(forms)},
        )

    def check_mqa_configs(self) -> CheckResult:
        """Every launch config the module selects for some GPU (``CONFIGS``: sm_90/sm_100's and
        sm_120's, run here) and the variants the bench sweeps, against the oracle."""
        rows, final = self.s.mqa_prefill[0]
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 261)
        module = self.prefill_module
        configs = dict(module.CONFIGS)
        cls = module.Bf16MqaLogitsConfig
        configs.update(
            {
                "block_r=128": cls(block_r=128),
                "block_r=16, 4 warps": cls(block_r=16, num_warps=4),
                "no register cap": cls(maxnreg=None),
                "block_k=64, 4 warps": cls(block_k=64, num_warps=4, block_r=64),
            }
        )
        details: dict[str, Any] = {}
        for name, config in configs.items():
            try:
                details[name] = self.mqa_both(case, config=config, what=name).details
            except Exception as error:  # noqa: BLE001 - a config this GPU cannot launch is recorded
                details[name] = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:160]}"}
        production = list(module.CONFIGS)
        ok = all(details[n]["ok"] for n in production)
        others = [n for n in details if n not in production]
        summary = (
            f"production configs {production}: {'all = oracle' if ok else 'FAIL'}; other configs: "
            + ", ".join(
                f"{n} {'ok' if details[n]['ok'] else details[n].get('error', 'FAIL')}" for n in others
            )
        )
        return CheckResult("", Status.PASS if ok else Status.FAIL, summary[:300], details)

    def check_mqa_reruns(self) -> CheckResult:
        rows, final = self.s.mqa_prefill[0]
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 271)
        first = self.mqa(case, clean_logits=True)
        differing = [
            i for i in range(1, self.s.reruns) if not torch.equal(self.mqa(case, clean_logits=True), first)
        ]
        return CheckResult(
            "",
            Status.PASS if not differing else Status.FAIL,
            f"{self.s.reruns} runs bitwise identical"
            if not differing
            else f"runs {differing} differ from run 0",
            {"reruns": self.s.reruns, "differing": differing},
        )

    def check_mqa_vs_paged(self) -> CheckResult:
        """The same rows through the paged kernel (``bf16_paged_mqa_logits``, one row at a time, the
        request's table per row): within the oracle's bound of each other, the same ``-inf``."""
        rows, final = self.s.mqa_prefill[0]
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 281)
        prefill = self.mqa(case, clean_logits=True)
        paged = self.run(case.paged_rows(), poison=False)
        metrics = compare(prefill, paged)
        metrics["bitwise"] = bool(torch.equal(prefill, paged))
        return verdict(metrics, f"{rows} causal rows, prefill kernel vs the paged kernel")

    def check_mqa_cuda_graph(self) -> CheckResult:
        if not self.cuda:
            raise CheckSkipped("CUDA graphs need a GPU")
        rows, final = self.s.mqa_prefill[0]
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 291)
        static = case.with_ranges(case.ks, (case.ke // 3).clamp(min=1))
        self.mqa(static, clean_logits=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = self.mqa(static, clean_logits=True)
        details: dict[str, Any] = {}
        for name, ke in (
            ("causal", case.ke),
            ("reversed", case.ke.flip(0)),
            ("all_1", torch.ones_like(case.ke)),
        ):
            static.ke.copy_(ke)
            graph.replay()
            torch.cuda.synchronize()
            details[f"{name}_equals_eager"] = bool(
                torch.equal(captured, self.mqa(case.with_ranges(case.ks, ke), clean_logits=True))
            )
        details["causal_vs_oracle"] = compare(self.mqa(case, clean_logits=True), mqa_oracle_logits(case))
        del graph
        ok = (
            all(v for k, v in details.items() if k.endswith("_equals_eager"))
            and details["causal_vs_oracle"]["ok"]
        )
        return CheckResult("", Status.PASS if ok else Status.FAIL, _fmt(details), details)

    def check_mqa_extra_memory(self) -> CheckResult:
        if not self.cuda:
            raise CheckSkipped("memory statistics need a GPU")
        rows, final = self.s.mqa_prefill[0]
        case = self.prefill_case(causal_lengths(rows, final), seed=self.s.seed + 301)
        self.mqa(case)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = self.mqa(case)
        torch.cuda.synchronize()
        peak_extra = torch.cuda.max_memory_allocated() - before
        out_bytes = out.numel() * out.element_size()
        details = {
            "peak_extra_bytes": peak_extra,
            "logits_bytes": out_bytes,
            "beyond_logits_bytes": peak_extra - out_bytes,
        }
        ok = details["beyond_logits_bytes"] <= 2 * 1024 * 1024
        return CheckResult("", Status.PASS if ok else Status.FAIL, _fmt(details), details)

    # ------------------------------------------------------------- driver

    def checks(self) -> list[tuple[str, Callable[[], CheckResult]]]:
        out: list[tuple[str, Callable[[], CheckResult]]] = []
        for heads in self.s.heads:
            for q_dtype, tag in ((torch.float8_e4m3fn, "fp8"), (torch.bfloat16, "bf16")):
                out.append((f"oracle[q={tag},H={heads}]", _bind(self.check_oracle, q_dtype, heads)))
        for rows, final in self.s.prefill:
            out.append((f"prefill[rows={rows},keys={final}]", _bind(self.check_prefill, rows, final)))
        for group_rows in self.s.groups:
            out.append((f"group_rows[G={group_rows}]", _bind(self.check_group_rows, group_rows)))
        for group_rows, profile in self.other_gpu_group_configs():
            out.append(
                (
                    f"group_rows[G={group_rows},{profile} config]",
                    _bind(self.check_group_rows, group_rows, None, profile),
                )
            )
        out += [
            ("group_rows_batch", self.check_group_rows_batch),
            ("group_rows_static_refused", self.check_group_rows_static_refused),
            ("clean_logits", self.check_clean_logits),
            ("cuda_graph_wide", self.check_cuda_graph_wide),
            ("input_forms", self.check_input_forms),
            ("row_independence", self.check_row_independence),
            ("reruns", self.check_reruns),
            ("cuda_graph", self.check_cuda_graph),
            ("extra_memory", self.check_extra_memory),
            ("fp8_twin_oracle", self.check_fp8_twin_oracle),
            ("fp8_twin_vs_upstream_torch", self.check_fp8_twin_vs_upstream_torch),
        ]
        for heads in self.s.heads:
            for q_dtype, tag in ((torch.float8_e4m3fn, "fp8"), (torch.bfloat16, "bf16")):
                out.append((f"mqa_oracle[q={tag},H={heads}]", _bind(self.check_mqa_oracle, q_dtype, heads)))
        for rows, final in self.s.mqa_prefill[1:]:
            out.append((f"mqa_prefill[rows={rows},keys={final}]", _bind(self.check_mqa_prefill, rows, final)))
        out += [
            ("mqa_chunk_boundaries", self.check_mqa_chunk_boundaries),
            ("mqa_ks_window", self.check_mqa_ks_window),
            ("mqa_empty_rows", self.check_mqa_empty_rows),
            ("mqa_input_forms", self.check_mqa_input_forms),
            ("mqa_configs", self.check_mqa_configs),
            ("mqa_reruns", self.check_mqa_reruns),
            ("mqa_vs_paged", self.check_mqa_vs_paged),
            ("mqa_cuda_graph", self.check_mqa_cuda_graph),
            ("mqa_extra_memory", self.check_mqa_extra_memory),
        ]
        return out

    def run_all(self, only: list[str] | None) -> list[CheckResult]:
        results = []
        for name, fn in self.checks():
            if only and not any(name.startswith(prefix) for prefix in only):
                continue
            if not self.cuda and name not in CPU_CHECKS:
                fn = _cpu_skip
            result = run_check(name, _oom_safe(fn, self.cuda), after=self.sync if self.cuda else None)
            print(f"[{result.status.value.upper():5}] {name}: {result.summary}", flush=True)
            results.append(result)
        return results


# What a CPU runs: the launch logic, and the fp8 twin (which reads raw bytes when interpreted).
CPU_CHECKS = ("group_rows_static_refused", "fp8_twin_oracle", "fp8_twin_vs_upstream_torch")


def _cpu_skip() -> CheckResult:
    raise CheckSkipped(
        "runs the bf16 kernels, which need a GPU: the Triton interpreter misreads bf16, and the "
        "kernels carry no interpreter branch (../shared/GPU.md)"
    )


class _ClaimsCuda(torch.Tensor):
    """A CPU tensor that answers ``is_cuda``: the kernel module asserts CUDA inputs before its
    launch logic, which the refusal check exercises on a CPU (nothing is launched)."""

    @property
    def is_cuda(self) -> bool:
        return True


def _claims_cuda(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(_ClaimsCuda)


class _LaunchRecorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` records the grid, runs nothing."""

    def __init__(self, launched: list[Any]) -> None:
        self.launched = launched

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: self.launched.append(grid)


def _widen(table: torch.Tensor, pages: int, fill: int) -> torch.Tensor:
    wide = torch.full((table.shape[0], pages), fill, dtype=table.dtype, device=table.device)
    wide[:, : table.shape[1]] = table
    return wide


def _owned(case: ReadCase, device: torch.device) -> torch.Tensor:
    """Positions each row's key tiles own (what clean_logits=False writes)."""
    ends = tiles_end(case.seq_lens, case.max_seq_len).to(device)
    return torch.arange(case.max_seq_len, device=device)[None, :] < ends[:, None]


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """Kernel output vs oracle: the tier-1 bounds, and the numbers behind them."""
    out, ref = out.float(), ref.float().to(out.device)
    nan = int(torch.isnan(out).sum())
    finite = torch.isfinite(ref)
    mask_same = bool(torch.equal(torch.isfinite(out), finite)) and bool(
        torch.all(out[~finite] == float("-inf"))
    )
    both = finite & torch.isfinite(out)
    diff = calc_diff(out[both], ref[both]) if both.any() else 0.0
    scale = float(ref[finite].abs().max()) if finite.any() else 0.0
    max_abs = float((out[both] - ref[both]).abs().max()) if both.any() else 0.0
    ok = nan == 0 and mask_same and diff <= CALC_DIFF_MAX and max_abs <= ABS_ERR_REL_MAX * max(scale, 1e-6)
    return {
        "ok": ok,
        "calc_diff": diff,
        "mask_identical": mask_same,
        "nan": nan,
        "max_abs_err": max_abs,
        "max_abs_ref": scale,
        "finite": int(finite.sum()),
    }


def verdict(metrics: dict[str, Any], what: str) -> CheckResult:
    summary = (
        f"{what}: calc_diff={metrics['calc_diff']:.2e} mask={'same' if metrics['mask_identical'] else 'DIFFERS'} "
        f"nan={metrics['nan']} max_abs={metrics['max_abs_err']:.2e}/{metrics['max_abs_ref']:.2e}"
    )
    return CheckResult("", Status.PASS if metrics["ok"] else Status.FAIL, summary, metrics)


def _fmt(details: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    parts = []
    for key, value in details.items():
        if key in skip:
            continue
        if isinstance(value, dict):
            value = value.get("ok", value)
        if isinstance(value, float):
            value = f"{value:.2e}"
        parts.append(f"{key}={value}")
    return " ".join(parts)[:300]


def _bind(fn: Callable[..., CheckResult], *args: Any) -> Callable[[], CheckResult]:
    return lambda: fn(*args)


def _oom_safe(fn: Callable[[], CheckResult], cuda: bool) -> Callable[[], CheckResult]:
    def wrapped() -> CheckResult:
        try:
            return fn()
        except torch.cuda.OutOfMemoryError as error:
            if cuda:
                torch.cuda.empty_cache()
            raise CheckSkipped(f"out of device memory: {str(error).splitlines()[0][:160]}") from error
        finally:
            if cuda:
                torch.cuda.empty_cache()

    return wrapped


def environment(suite: Suite, settings: Settings) -> dict[str, Any]:
    import triton

    meta: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": str(settings.device),
        "kernel_module": getattr(suite.module, "__file__", "?"),
        "kernel_route": suite.module_route,
        "prefill_kernel_module": getattr(suite.prefill_module, "__file__", "?"),
        "prefill_kernel_route": suite.prefill_module_route,
        "lengths": settings.lengths,
        "heads": settings.heads,
        "seed": settings.seed,
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", ""),
    }
    if settings.device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(settings.device)
        meta["capability"] = ".".join(map(str, torch.cuda.get_device_capability(settings.device)))
    return meta


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("verify/results/parity"), help="results folder (read.json goes here)"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--heads", type=int, nargs="+", default=[64, 32])
    parser.add_argument("--reruns", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--small",
        action="store_true",
        help="CPU smoke sizes (with TRITON_INTERPRET=1: the launch logic and the fp8 twin run)",
    )
    parser.add_argument("--only", nargs="+", default=None, help="run checks whose names start with these")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "CUDA is not available; use --device cpu --small with TRITON_INTERPRET=1 for a smoke run",
            file=sys.stderr,
        )
        return 2
    small = args.small
    settings = Settings(
        device=device,
        lengths=args.lengths or (SMALL_LENGTHS if small else FULL_LENGTHS),
        heads=args.heads,
        reruns=3 if small and args.reruns == 20 else args.reruns,
        seed=args.seed,
        prefill=[(64, 16), (16, 200)] if small else [(4096, 1024), (1024, 4095), (64, 65536)],
        small=small,
        groups=[2, 4],
        mqa_prefill=[(512, 300), (64, 700)]
        if small
        else [(2048, 1023), (8192, 2048), (1024, 4095), (64, 65536)],
        mqa_chunked=(1024, 255) if small else (16384, 4095),
    )
    suite = Suite(settings)
    meta = environment(suite, settings)
    print(json.dumps(meta, default=str), flush=True)
    results = suite.run_all(args.only)
    out_file = args.out / "read.json"
    write_json(out_file, SUITE, results, meta)
    print(f"\nresults: {out_file}")
    print(summary_table(results))
    return 0 if all(r.status in (Status.PASS, Status.SKIP) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
