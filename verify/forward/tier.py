"""The forward tier: upstream's ``C4Indexer`` forward, as the attention layer calls it, checked.

For one platform profile (:mod:`verify.core.platform`), each *arm* -- index-K format (bf16: the
series' flag on; fp8: off) x compressor (fused store kernel; the unfused path,
``SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR=1``) -- builds a :class:`~verify.core.rig.Rig` and runs
the scenarios below through ``init_forward_metadata`` and ``C4Indexer.forward`` (which calls
``forward_c4_indexer``: compressor and fused store, q, scorer, top-k), eager and under CUDA-graph
capture / replay the way upstream's graph runner drives the backend. After each step
:mod:`verify.forward.checks` compares the pool's keys with a one-shot fp32 reference compression
and the selected top-k with fp64 oracles; spies record which function computed the logits and the
top-k, and with the flag on that no fp8 kernel or gather ran. The flag-off arm is also run under
the unpatched tree (a worker process) and must select the same slots and leave the same pool bytes.

Scenarios (lengths in tokens; GPU sizes, CPU runs only the dispatch probe):
- ``stale``: a 3,000-token request prefilled and finished; its pages are reused, keys left in them;
- ``chunked``: 20,002 tokens prefilled in chunks of 8,192 (chunk boundaries mid-page, residue 2);
- ``oneshot``: 5,202 and 4,500 tokens prefilled in one extend each (the field's lengths);
- ``boundaries``: 2,048 / 4,096 (page and top-k x 4 boundaries), 5,200..5,203 (every residue mod 4)
  chunked at 2,048, 4,096 and 8,192;
- ``mixed``: a MIXED batch, one request's 1,000-token chunk with others decoding;
- ``decode``: all live requests decode 5 steps (one compression window completes);
- ``graph``: decode captured at bucket 4 with 1-token rows, replayed at the live lengths (3 rows,
  one padding row), 3 steps, against eager on the same inputs;
- ``long``: 131,072 tokens chunked at 16,384, then decode;
- ``mtp``: with 2 draft tokens per request, target-verify rows (eager and graph);
- ``pd``: a prefill arm's pages moved into a second pool by upstream's PD buffer descriptors
  (:mod:`verify.forward.pd`), then decode on the receiving side;
- ``bounded``: prefills whose logits in one piece exceed upstream's logits budget, brought down
  through its own knob (``SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION``) to a sixth of the first
  one's: 16,384 tokens in one extend (the non-paged path), two 12,288-token prefixes, then both
  requests extending 4,096 tokens in one batch (the paged path). bf16 must score them in chunks
  no larger than the budget, build no DeepGEMM schedule and keep the logits phase's peak memory
  within the budget (the sm120 profile too, whose fp8 torch path plans no chunks);
- ``bounded_large`` (bf16 arms): one request of 1,048,576 tokens prefilled in 16,384-token
  chunks under upstream's own budget; the last chunk, 16K rows x 256K keys (16 GiB of logits in
  one piece), is checked as above.

Every step records the scorer and top-k it ran, what the indexer metadata planned (format, row
chunks, budget, DeepGEMM schedules), the logits chunks scored and the peak memory; with the flag
on no DeepGEMM schedule may be built and one request's long prefill must run the bf16 prefill
kernel (``bf16_mqa_logits``, ``score_bf16_prefill``) with nothing gathered.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from verify.core import platform as P
from verify.core import upstream as U
from verify.core.rig import INDEX_TOPK, LAYER_ID, Request, Rig, RigConfig, batched_token_inputs
from verify.core.stand_ins import (
    BF16_SCORERS,
    FP8_SCORERS,
    SCHEDULE_ROLES,
    SCORERS,
    TOPKS,
    Spies,
    roles_called,
)

from .checks import check_keys, check_selection, decode_pool_keys, logits_row_digests
from .reference import reference_keys, reference_q

UNFUSED_ENV = "SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR"


@dataclass
class StepResult:
    profile: str
    arm: str  # e.g. "bf16/fused"
    scenario: str
    run: str  # eager | graph | multi-stream
    mode: str
    label: str
    status: str  # pass | fail | error
    lens: list[int]
    keys: list[dict[str, Any]] = field(default_factory=list)
    selection: list[dict[str, Any]] = field(default_factory=list)
    scorer: list[str] = field(default_factory=list)
    topk: list[str] = field(default_factory=list)
    other_calls: list[str] = field(default_factory=list)
    bf16_launches: list[str] = field(default_factory=list)  # Call.launch of each bf16 scorer call
    peak_mb: float | None = None
    logits_mb: float | None = None
    detail: str = ""
    # what the indexer metadata planned for this forward (format, row chunks, budget, schedules)
    indexer_plan: dict[str, Any] = field(default_factory=dict)
    scorer_calls: int = 0  # logits chunks scored
    logits_chunk_max_mb: float | None = None  # the largest one
    # bounded-memory steps: the logits phase's peak beyond what was live when it began
    logits_phase_peak_mb: float | None = None


@dataclass
class ArmSpec:
    fmt: str  # bf16 | fp8
    compressor: str  # fused | unfused
    draft_tokens: int = 0

    @property
    def name(self) -> str:
        return f"{self.fmt}/{self.compressor}" + (f"/mtp{self.draft_tokens}" if self.draft_tokens else "")


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


class Arm:
    """One rig of one arm under an applied profile, with its spies and its q log."""

    def __init__(self, applied: P.Applied, spec: ArmSpec, cfg: RigConfig) -> None:
        self.applied = applied
        self.spec = spec
        self.rig = Rig(cfg, tuple(applied.facts["device_capability"]))
        self.spies = Spies(keep_logits=True).install(self.rig.backend)
        self.q_log: list[tuple[torch.Tensor, torch.Tensor]] = []
        indexer = self.rig.indexer
        original = indexer.compute_q
        log = self.q_log

        def compute_q(q_lora: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor) -> Any:
            q, w = original(q_lora, positions, weight)
            log.append((q, w))
            return q, w

        indexer.compute_q = compute_q
        self.results: list[StepResult] = []
        self.selections: dict[str, torch.Tensor] = {}  # step key -> selected slots (flag-off identity)
        self.pool_digest: dict[str, str] = {}
        self.step_status: dict[str, str] = {}  # step key -> pass | fail | error (the oracle checks' verdict)
        # step key -> per-row digest of the scores the top-k read (eager steps whose logits were kept)
        self.logits_digest: dict[str, torch.Tensor] = {}

    def close(self) -> None:
        self.spies.uninstall()
        self.rig.close()

    @property
    def pool_buf(self) -> torch.Tensor:
        return self.rig.pool.c4_indexer_kv_pool.index_k_with_scale_buffer[LAYER_ID]

    # -- running ----------------------------------------------------------------------------------
    def _forward(self, fb: Any, x: torch.Tensor, q_lora: torch.Tensor, multi_stream: bool = False) -> None:
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        backend, indexer = self.rig.backend, self.rig.indexer
        with forward_context(ForwardContext(attn_backend=backend)):
            if multi_stream:
                # As the model does: the indexer on its own stream, q_lora's readiness by event,
                # the indexer module's two alternate streams for compressor/q/weights.
                indexer.alt_streams = [torch.cuda.Stream(), torch.cuda.Stream()]
                ready = torch.cuda.current_stream().record_event()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    indexer.forward(
                        x=x,
                        q_lora=q_lora,
                        forward_batch=fb,
                        attn_backend=backend,
                        enable_multi_stream=True,
                        q_lora_ready=ready,
                    )
                torch.cuda.current_stream().wait_stream(side)
            else:
                indexer.forward(x=x, q_lora=q_lora, forward_batch=fb, attn_backend=backend)

    def step(
        self,
        scenario: str,
        label: str,
        reqs: list[Request],
        extend_lens: list[int],
        mode: str,
        multi_stream: bool = False,
        bounded: bool = False,
        checked: bool = True,
        lean: bool = False,
    ) -> StepResult:
        """One forward and its checks. ``lean``: only the rows the checks read are kept from its
        logits (copied to the host row by row as the top-k reads each chunk) and the logits phase's
        memory is measured; ``bounded`` (lean too): a step under a logits memory budget, whose
        promises are checked (:func:`bounded_problems`). ``checked=False``: a prefix step of a very
        long request whose keys and selection are not checked (the request's last step checks them
        all); its path and plan are."""
        lean = lean or bounded
        rig = self.rig
        self.q_log.clear()
        self.spies.take()
        fb = rig.batch(reqs, extend_lens, mode)
        x, q_lora = rig.inputs(reqs, extend_lens)
        rows = int(x.shape[0])
        picks = _picks(reqs, extend_lens, fb.positions)
        if lean:
            offsets = torch.tensor([0, *extend_lens]).cumsum(0)[:-1].tolist()
            keep = torch.tensor(
                sorted(o + r for o, pick in zip(offsets, picks) for r in pick) if checked else [],
                dtype=torch.long,
            )
            self.spies.arm_lean(keep, track_phase=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            rig.backend.init_forward_metadata(fb)
            self._forward(fb, x, q_lora, multi_stream)
        torch.cuda.synchronize()
        phase = self.spies.take_phase() if lean else {}
        peak = (phase.get("step_peak", torch.cuda.max_memory_allocated()) - base) / 2**20
        kept = self.spies.take_kept_rows() if lean else None
        selected = rig.backend.forward_metadata.core_metadata.c4_sparse_page_indices[
            :rows, :INDEX_TOPK
        ].clone()
        im = rig.backend.forward_metadata.indexer_metadata
        width = im.max_compressed_seq_len
        plan = indexer_plan(im, rows)
        positions = fb.positions.clone()
        rig.commit(reqs, extend_lens)
        run = "multi-stream" if multi_stream else "eager"
        key = f"{scenario}:{label}:{run}"
        res = self._check(
            scenario,
            label,
            run,
            mode,
            reqs,
            extend_lens,
            selected,
            positions,
            x,
            q_lora,
            digest_key=None if lean else key,
            picks=picks,
            kept_rows=kept,
            checked=checked,
        )
        res.peak_mb = round(peak, 2)
        res.logits_mb = round(rows * width * 4 / 2**20, 2)
        res.indexer_plan = plan
        if lean and phase:
            res.logits_phase_peak_mb = round(phase["peak_extra"] / 2**20, 2)
        if bounded:
            problems = bounded_problems(self.spec.fmt, res, phase)
            if problems:
                prior = [res.detail] if res.status == "fail" else []
                res.status = "fail"
                res.detail = " | ".join(prior + problems)
            res.detail += "; " + bounded_summary(res)
        if checked:  # (an unchecked prefix step's slots: megabytes a step, compared by nothing)
            self.selections[key] = selected.sort(
                dim=1
            ).values.cpu()  # the top-k's order is not part of its contract
            self.pool_digest[key] = hashlib.sha256(self.pool_buf.cpu().numpy().tobytes()).hexdigest()[:16]
        self.step_status[key] = res.status
        self.results.append(res)
        return res

    def graph_decode(
        self, scenario: str, label: str, reqs: list[Request], steps: int, bucket: int = 4
    ) -> list[StepResult]:
        """Capture one decode step at ``bucket`` rows with every row one token long (the capture
        batch the graph runner uses), then for ``steps`` steps replay it at the live lengths of
        ``reqs`` (padded to the bucket) and compare with eager on the same inputs and state."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        rig, backend, indexer = self.rig, self.rig.backend, self.rig.indexer
        cfg = rig.cfg
        out: list[StepResult] = []
        # capture-time rows: padding requests of one page each (req_pool_index 0 is upstream's pad row)
        pads = [rig.new_request(900 + i) for i in range(bucket)]
        for p in pads:
            p.length = 0
        cap_fb = rig.batch(pads, [1] * bucket, "decode")
        x_static = torch.zeros(bucket, cfg.hidden_size, dtype=torch.bfloat16, device=rig.device)
        q_static = torch.zeros(bucket, cfg.q_lora_rank, dtype=torch.bfloat16, device=rig.device)
        with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
            backend.init_cuda_graph_state(max_bs=bucket, max_num_tokens=bucket)
            backend.init_forward_metadata_out_graph(cap_fb, in_capture=True)
            backend.init_forward_metadata_in_graph(cap_fb)
            indexer.forward(
                x=x_static, q_lora=q_static, forward_batch=cap_fb, attn_backend=backend
            )  # warm-up
            backend.init_forward_metadata_out_graph(cap_fb, in_capture=True)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            self.q_log.clear()
            self.spies.take()
            with torch.cuda.graph(graph):
                backend.init_forward_metadata_in_graph(cap_fb)
                indexer.forward(x=x_static, q_lora=q_static, forward_batch=cap_fb, attn_backend=backend)
            captured = backend.forward_metadata
            graph_calls = self.spies.take()
            # The warm-up's and the capture's logits are the padding rows', not a step's: without
            # this the first replay's check got them mixed with eager's and lost its logits.
            self.spies.take_logits()
            q_static_out = self.q_log[-1]
        for p in pads:
            rig.finish(p)
        for s in range(steps):
            n = len(reqs)
            fb = rig.batch(reqs, [1] * n, "decode")
            x, q_lora = rig.inputs(reqs, [1] * n)
            positions = fb.positions.clone()
            # eager first (its compressor writes the same bytes the replay writes again)
            with torch.no_grad():
                backend.init_forward_metadata(fb)
                self.q_log.clear()
                self._forward(fb, x, q_lora)
            eager_sel = backend.forward_metadata.core_metadata.c4_sparse_page_indices[:n, :INDEX_TOPK].clone()
            # replay: live rows padded to the bucket as the graph runner pads them
            view = _padded_decode_view(fb, bucket)
            x_static.zero_()
            q_static.zero_()
            x_static[:n].copy_(x)
            q_static[:n].copy_(q_lora)
            with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
                backend.init_forward_metadata_out_graph(view)
                graph.replay()
            torch.cuda.synchronize()
            sel = captured.core_metadata.c4_sparse_page_indices[:n, :INDEX_TOPK].clone()
            rig.commit(reqs, [1] * n)
            self.q_log.clear()
            self.q_log.append((q_static_out[0][:n], q_static_out[1][:n]))
            # The eager run's logits stay for the checks: same inputs, same kernel as the replay
            # (whose own logits live inside the graph); the replay's selection is compared with
            # eager's below.
            res = self._check(
                scenario, f"{label} step {s}", "graph", "decode", reqs, [1] * n, sel, positions, x, q_lora
            )
            # the top-k writes its k slots in no particular order: compare the sets
            same = torch.equal(sel.sort(dim=1).values, eager_sel.sort(dim=1).values)
            res.scorer = roles_called([c for c in graph_calls if c.role in SCORERS])
            res.topk = roles_called([c for c in graph_calls if c.role in TOPKS])
            if not same:
                diff = int((sel.sort(dim=1).values != eager_sel.sort(dim=1).values).any(1).sum())
                res.status = "fail"
                res.detail += f"; graph replay selected differently from eager on {diff}/{n} rows"
            else:
                res.detail += "; graph replay = eager (identical slots)"
            key = f"{scenario}:{label} step {s}:graph"
            self.selections[key] = sel.sort(dim=1).values.cpu()
            self.step_status[key] = res.status
            self.results.append(res)
            out.append(res)
        return out

    # -- checks -----------------------------------------------------------------------------------
    def _check(
        self,
        scenario: str,
        label: str,
        run: str,
        mode: str,
        reqs: list[Request],
        extend_lens: list[int],
        selected: torch.Tensor,
        positions: torch.Tensor,
        x: torch.Tensor,
        q_lora: torch.Tensor,
        digest_key: str | None = None,
        picks: list[list[int]] | None = None,
        kept_rows: dict[int, torch.Tensor] | None = None,
        checked: bool = True,
    ) -> StepResult:
        """The step's checks; with ``digest_key``, also the per-row digest of the logits the
        top-k read, kept under that key for the flag-off comparison. ``picks``: the rows of each
        request to check (default :func:`_sample_rows`); ``kept_rows``: a lean step's logits of
        those rows (step row -> logits), instead of every row's."""
        rig = self.rig
        calls = self.spies.take()
        kept = self.spies.take_logits()
        logits = torch.cat(kept) if kept and len({t.shape[1] for t in kept}) == 1 else None
        if logits is not None and logits.shape[0] != selected.shape[0]:
            logits = None
        if digest_key is not None and logits is not None:
            try:  # what the flag-off comparison reports beside the selections; never fails a step
                self.logits_digest[digest_key] = logits_row_digests(
                    logits, (positions[: logits.shape[0]] + 1) // 4, INDEX_TOPK
                )
            except (RuntimeError, ValueError) as exc:
                print(f"  note: no logits digest for this step ({U.short_error(exc)})", flush=True)
        scorer = roles_called([c for c in calls if c.role in SCORERS])
        topk = roles_called([c for c in calls if c.role in TOPKS])
        other = roles_called([c for c in calls if c.role not in SCORERS and c.role not in TOPKS])
        launches = list(dict.fromkeys(c.launch for c in calls if c.role in BF16_SCORERS and c.launch))
        scorer_calls = [c for c in calls if c.role in SCORERS]
        res = StepResult(
            self.applied.name,
            self.spec.name,
            scenario,
            run,
            mode,
            label,
            "pass",
            [r.length for r in reqs],
            scorer=scorer,
            topk=topk,
            other_calls=other,
            bf16_launches=launches,
            scorer_calls=len(scorer_calls),
        )
        chunk_bytes = [c.out_bytes for c in scorer_calls if c.out_bytes]
        if chunk_bytes:
            res.logits_chunk_max_mb = round(max(chunk_bytes) / 2**20, 2)
        problems: list[str] = []
        if self.spec.fmt == "bf16":
            fp8 = [s for s in scorer if s in FP8_SCORERS]
            if fp8 or "gather_nonpaged" in other:
                problems.append(
                    f"flag on but fp8 path ran: {fp8 + [o for o in other if o == 'gather_nonpaged']}"
                )
            if run != "graph" and not any(s in BF16_SCORERS for s in scorer):
                problems.append("flag on but the bf16 scorer did not run")
            schedules = [o for o in other if o in SCHEDULE_ROLES]
            if schedules:
                # the bf16 scorers take no DeepGEMM schedule on any platform (patch 6)
                problems.append(f"flag on but a DeepGEMM schedule was built: {schedules}")
            grouped = f"group_rows={self.spec.draft_tokens}"
            if mode == "target_verify" and not any(x.split()[0] == grouped for x in launches):
                # the dispatch groups a uniform target verify's rows per request (patch 5)
                problems.append(
                    f"target verify with {self.spec.draft_tokens} draft tokens not scored in groups: {launches}"
                )
        q_prod, w_prod = self.q_log[-1] if self.q_log else (None, None)
        offset = 0
        for i, (req, n) in enumerate(zip(reqs, extend_lens)):
            rows = slice(offset, offset + n)
            base_row = offset
            offset += n
            if not checked:
                continue
            n_keys = req.length // 4
            x_all, _ = batched_token_inputs(req, 0, req.length, rig.cfg)
            ref = reference_keys(x_all.to(rig.device), rig.weights, rig.freqs_cis)
            slots = rig.slot_of(req, torch.arange(n_keys))
            kc = check_keys(self.pool_buf, slots, ref, self.spec.fmt)
            res.keys.append({"request": req.rid, "length": req.length, **asdict(kc)})
            if not kc.ok:
                problems.append(f"request {req.rid} keys: {kc.detail}")
            if q_prod is None or w_prod is None:  # logged together: both or neither
                problems.append("no q was computed (compute_q did not run)")
                continue
            pick = picks[i] if picks is not None else _sample_rows(n, ((positions[rows] + 1) // 4).cpu())
            sel_rows = selected[rows][pick]
            pos = positions[rows][pick]
            row_lens = ((pos + 1) // 4).cpu()
            chosen = _slots_to_keys(rig, req, sel_rows)
            stored, _ = decode_pool_keys(self.pool_buf, slots, self.spec.fmt)
            qp = q_prod[rows][pick].float()
            wp = w_prod[rows][pick].float().reshape(len(pick), -1)
            q_ex, w_ex = reference_q(x[rows][pick], q_lora[rows][pick], pos, rig.weights, rig.freqs_cis)
            if kept_rows is not None:
                have = [base_row + r in kept_rows for r in pick]
                lg = (
                    torch.stack([kept_rows[base_row + r] for r in pick]).to(rig.device)
                    if pick and all(have)
                    else None
                )
            else:
                lg = logits[rows][torch.tensor(pick, device=logits.device)] if logits is not None else None
            sc = check_selection(chosen, row_lens, qp, wp, stored.float(), q_ex, w_ex, ref, INDEX_TOPK, lg)
            res.selection.append({"request": req.rid, "rows_checked": len(pick), "rows": n, **asdict(sc)})
            if not sc.ok:
                problems.append(f"request {req.rid} selection: {sc.detail}")
        if problems:
            res.status = "fail"
        res.detail = (
            " | ".join(problems)
            if problems
            else (
                f"keys and selection match the oracles for {len(reqs)} request(s); scorer {scorer}, top-k {topk}"
                if checked
                else f"prefix step, keys and selection not checked (the request's last step checks them); "
                f"scorer {scorer}, top-k {topk}"
            )
        )
        return res


def _sample_rows(n: int, row_lens: torch.Tensor | None = None) -> list[int]:
    """Every row of a short step; of a long one the first 32, the last 64, an even spread, and
    the two rows on each side of every 64-key tile boundary (the last row seeing 64m keys and
    the first seeing 64m + 1): there a kernel scoring rows in groups got one key wrong on the
    H200, which an even spread of 128 rows out of thousands missed."""
    if n <= 256:
        return list(range(n))
    step = max(1, n // 128)
    rows = set(range(32)) | set(range(n - 64, n)) | set(range(0, n, step))
    if row_lens is not None:
        lens = row_lens.reshape(-1)[:n].long()
        crossing = torch.nonzero((lens[1:] % 64 == 1) & (lens[:-1] % 64 == 0)).flatten().tolist()
        rows |= {i for c in crossing for i in (c, c + 1)}
    return sorted(rows)


def _picks(reqs: list[Request], extend_lens: list[int], positions: torch.Tensor) -> list[list[int]]:
    """Per request of a step, the rows its selection check reads (:func:`_sample_rows`)."""
    out, offset = [], 0
    pos = positions.cpu()
    for _, n in zip(reqs, extend_lens):
        out.append(_sample_rows(n, (pos[offset : offset + n] + 1) // 4))
        offset += n
    return out


def indexer_plan(im: Any, rows: int) -> dict[str, Any]:
    """What the indexer metadata planned for a forward of ``rows`` query rows: the index-K format,
    DeepGEMM's schedules (none for bf16), the logits budget and its row chunks -- the paged path's
    (``rows_per_chunk``) and, where one request's long prefill took the non-paged path, its own --
    and the bytes the logits would take in one piece (what the budget is held against)."""
    from sglang.srt.layers.attention.mqa_logits_utils import mqa_logits_row_bytes

    dg = getattr(im, "deep_gemm_metadata", None)
    plan = getattr(im, "nonpaged_plan", None)
    out: dict[str, Any] = {
        "index_k_format": getattr(im, "index_k_format", None),  # None: a tree before the option
        "deep_gemm_metadata": "none"
        if dg is None
        else f"{len(dg)} schedules"
        if isinstance(dg, list)
        else "one schedule",
        "budget_bytes": getattr(im, "mqa_logits_budget_bytes", None),
        "rows_per_chunk": getattr(im, "rows_per_chunk", None),
        "rows_per_request": getattr(im, "rows_per_request", None),
        "unchunked_logits_bytes": rows * mqa_logits_row_bytes(int(im.max_compressed_seq_len)),
        "nonpaged": None,
    }
    if plan is not None:
        out["nonpaged"] = {
            "query_rows": int(plan.query_rows),
            "max_seqlen_k": int(plan.max_seqlen_k),
            "rows_per_chunk": plan.rows_per_chunk,
        }
        out["unchunked_logits_bytes"] = int(plan.query_rows) * mqa_logits_row_bytes(int(plan.max_seqlen_k))
    return out


# The logits phase of a bounded step may use, beyond its largest logits chunk, the top-k's
# workspace and the rows the checks keep (copied out row by row): this much, or a quarter of the
# budget, whichever is larger.
PHASE_SLACK_BYTES = 16 * 2**20


def bounded_problems(fmt: str, res: StepResult, phase: dict[str, int]) -> list[str]:
    """What a step under a logits budget must show: its logits would not fit the budget in one
    piece (else the scenario did not bound them), and -- for bf16, the series' promise on every
    platform -- they were scored in more than one chunk, none larger than the budget, with no
    DeepGEMM schedule built, and the logits phase's peak memory within the budget plus slack.
    For fp8 the plan is recorded as upstream makes it (on sm_120 its torch path plans no chunks)."""
    if fmt != "bf16":
        return []
    plan = res.indexer_plan
    budget, whole = plan.get("budget_bytes"), plan.get("unchunked_logits_bytes", 0)
    if budget is None:
        return ["bounded step without a logits budget (the metadata computed none)"]
    if whole <= budget:
        return [f"bounded step whose logits fit the budget in one piece ({whole} <= {budget} B): not bounded"]
    out = []
    if res.scorer_calls < 2:
        out.append(
            f"logits not chunked: {res.scorer_calls} scorer call(s) for {whole} B of logits, budget {budget} B"
        )
    if res.logits_chunk_max_mb is not None and res.logits_chunk_max_mb * 2**20 > budget:
        out.append(
            f"a logits chunk of {res.logits_chunk_max_mb} MiB exceeds the budget of {budget / 2**20:.2f} MiB"
        )
    if plan.get("deep_gemm_metadata") != "none":
        out.append(f"DeepGEMM metadata built for bf16: {plan.get('deep_gemm_metadata')}")
    if plan.get("nonpaged") is None and plan.get("rows_per_chunk") is None:
        out.append("the paged path's metadata planned no row chunks")
    if phase:
        limit = budget + max(PHASE_SLACK_BYTES, budget // 4)
        if phase["peak_extra"] > limit:
            out.append(
                f"the logits phase peaked at {phase['peak_extra'] / 2**20:.1f} MiB beyond what was live, "
                f"over the budget {budget / 2**20:.1f} MiB + slack"
            )
    return out


def bounded_summary(res: StepResult) -> str:
    plan = res.indexer_plan
    budget = plan.get("budget_bytes") or 0
    path = "non-paged (one request's prefill)" if plan.get("nonpaged") else "paged"
    per = plan["nonpaged"]["rows_per_chunk"] if plan.get("nonpaged") else plan.get("rows_per_chunk")
    return (
        f"logits budget {budget / 2**20:.1f} MiB, {plan.get('unchunked_logits_bytes', 0) / 2**20:.1f} MiB "
        f"in one piece; {path} path, {res.scorer_calls} chunk(s) of <= {per} rows, the largest "
        f"{res.logits_chunk_max_mb} MiB; logits phase peak {res.logits_phase_peak_mb} MiB; DeepGEMM "
        f"schedules: {plan.get('deep_gemm_metadata')}"
    )


def _slots_to_keys(rig: Rig, req: Request, sel: torch.Tensor) -> torch.Tensor:
    """Selected pool slots -> the request's key indices; -1 stays -1 (nothing selected) and a
    slot outside the request's pages becomes a huge index the check rejects."""
    n_slots = len(req.pages) * 64
    slots = rig.slot_of(req, torch.arange(n_slots))
    inv = torch.full(
        (int(rig.pool.c4_indexer_kv_pool.index_k_with_scale_buffer[0].shape[0]) * 64,),
        1 << 30,
        dtype=torch.int64,
    )
    inv[slots] = torch.arange(n_slots)
    s = sel.long().cpu()
    return torch.where(s >= 0, inv[s.clamp(min=0)], torch.full_like(s, -1))


def _padded_decode_view(fb: Any, bucket: int) -> Any:
    """What upstream's CUDA-graph runner hands the backend at replay: the live rows padded to
    the captured batch size (pad rows: request 0, length 1, location 0)."""
    from types import SimpleNamespace

    n = fb.batch_size
    pad = bucket - n
    dev = fb.seq_lens.device
    seq = torch.cat([fb.seq_lens, torch.ones(pad, dtype=fb.seq_lens.dtype, device=dev)])
    return SimpleNamespace(
        batch_size=bucket,
        forward_mode=fb.forward_mode,
        actual_forward_mode=fb.forward_mode,
        input_ids=torch.cat([fb.input_ids, torch.zeros(pad, dtype=fb.input_ids.dtype, device=dev)]),
        positions=torch.cat([fb.positions, torch.zeros(pad, dtype=fb.positions.dtype, device=dev)]),
        req_pool_indices=torch.cat(
            [fb.req_pool_indices, torch.zeros(pad, dtype=fb.req_pool_indices.dtype, device=dev)]
        ),
        seq_lens=seq,
        seq_lens_sum=int(seq.sum()),
        seq_lens_cpu=seq.cpu(),
        encoder_lens=None,
        extend_seq_lens=None,
        out_cache_loc=torch.cat(
            [fb.out_cache_loc, torch.zeros(pad, dtype=fb.out_cache_loc.dtype, device=dev)]
        ),
        spec_info=None,
    )


# ---------------------------------------------------------------------------------------------
# scenarios
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    stale: int = 3000
    chunked: tuple[int, int] = (20002, 8192)
    oneshot: tuple[int, ...] = (5202, 4500)
    boundaries: tuple[int, ...] = (2048, 4096)
    residues: tuple[int, ...] = (5200, 5201, 5202, 5203)
    chunk_sizes: tuple[int, ...] = (2048, 4096, 8192)
    mixed_chunk: int = 1000
    decode_steps: int = 5
    graph_steps: int = 3
    long: tuple[int, int] | None = (131072, 16384)
    mtp_prefill: int = 6000
    mtp_steps: int = 3
    pd: int = 5200  # a multiple of 4: the decode steps after the transfer complete no window
    # bounded: (one request's prefill in one extend, two requests' prefix, their joint extend each)
    # under a logits budget set to a sixth of the first's logits in one piece
    bounded: tuple[int, int, int] | None = (16384, 12288, 4096)
    bounded_chunks: int = 6
    # bounded_large (bf16 arms): one request of this many tokens prefilled in chunks of the second,
    # the last chunk 16K rows x 256K keys (16 GiB of logits in one piece) under upstream's own budget
    bounded_large: tuple[int, int] | None = (1 << 20, 16384)
    only: tuple[str, ...] | None = None  # run only these scenarios (None: all of SCENARIOS)


SCENARIOS = (
    "stale",
    "chunked",
    "oneshot",
    "pd",
    "boundaries",
    "mixed",
    "decode",
    "graph",
    "long",
    "bounded",
    "bounded_large",
    "mtp",
)
QUICK = Sizes(
    stale=600,
    chunked=(3002, 1024),
    oneshot=(2100,),
    boundaries=(2048,),
    residues=(1201, 1202),
    chunk_sizes=(1024,),
    mixed_chunk=300,
    decode_steps=5,
    graph_steps=2,
    long=None,
    mtp_prefill=1500,
    mtp_steps=2,
    pd=1200,
    bounded=(8192, 8192, 4096),
    bounded_large=None,
)


def prefill(arm: Arm, scenario: str, req: Request, total: int, chunk: int | None) -> None:
    chunk = chunk or total
    done = 0
    while done < total:
        n = min(chunk, total - done)
        arm.step(scenario, f"{total} tokens, chunk {done}-{done + n}", [req], [n], "extend")
        done += n


def run_scenarios(arm: Arm, sizes: Sizes) -> None:
    """The scenarios of the module docstring, in order, on one arm (flag, compressor);
    ``sizes.only`` picks some (decode and graph then run on whichever requests are live)."""
    rig = arm.rig

    def want(name: str) -> bool:
        return sizes.only is None or name in sizes.only

    if arm.spec.draft_tokens:
        if not want("mtp"):
            return
        a = rig.new_request(101)
        b = rig.new_request(102)
        prefill(arm, "mtp", a, sizes.mtp_prefill, None)
        prefill(arm, "mtp", b, sizes.mtp_prefill // 2 + 3, None)
        for s in range(sizes.mtp_steps):
            arm.step("mtp", f"verify step {s}", [a, b], [arm.spec.draft_tokens] * 2, "target_verify")
        return
    live: list[Request] = []
    if want("stale"):
        r0 = rig.new_request(1)
        prefill(arm, "stale", r0, sizes.stale, None)
        rig.finish(r0)  # pages back to the free list with their keys in place
    if want("chunked"):
        a = rig.new_request(2)
        prefill(arm, "chunked", a, sizes.chunked[0], sizes.chunked[1])
        live.append(a)
    if want("oneshot"):
        for i, total in enumerate(sizes.oneshot):
            r = rig.new_request(10 + i)
            prefill(arm, "oneshot", r, total, None)
            live.append(r)
    if want("pd"):
        pd_scenario(arm, sizes.pd)
    if want("boundaries"):
        for total in sizes.boundaries:
            r = rig.new_request(30 + total)
            prefill(arm, "boundaries", r, total, None)
            arm.step("boundaries", f"{total} + decode", [r], [1], "decode")
            rig.finish(r)
        for chunk in sizes.chunk_sizes:
            for total in sizes.residues:
                r = rig.new_request(40 + total + chunk)
                prefill(arm, "boundaries", r, total, chunk)
                rig.finish(r)
    if want("mixed"):
        # MIXED: a new request's first chunk with the live ones decoding
        m = rig.new_request(60)
        arm.step(
            "mixed",
            f"{sizes.mixed_chunk}-token chunk + {len(live)} decoding",
            [m, *live],
            [sizes.mixed_chunk] + [1] * len(live),
            "mixed",
        )
        live.append(m)
    if want("decode") and live:
        for s in range(sizes.decode_steps):
            arm.step("decode", f"step {s}", live, [1] * len(live), "decode")
        arm.step("decode", "multi-stream step", live, [1] * len(live), "decode", multi_stream=True)
    if want("graph") and live:
        arm.graph_decode("graph", "bucket 4", live[:3], sizes.graph_steps, bucket=4)
    for r in live:
        rig.finish(r)
    if want("long") and sizes.long is not None and arm.spec.compressor == "fused":
        # the unfused path differs in the store only
        big = rig.new_request(77)
        prefill(arm, "long", big, sizes.long[0], sizes.long[1])
        arm.step("long", "decode", [big], [1], "decode")
        rig.finish(big)
    if want("bounded") and sizes.bounded is not None:
        bounded_scenario(arm, sizes)
    if want("bounded_large") and sizes.bounded_large is not None and arm.spec.fmt == "bf16":
        bounded_large_scenario(arm, sizes)


BUDGET_ENV = "SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION"


@contextlib.contextmanager
def logits_budget(target_bytes: int) -> Iterator[dict[str, Any]]:
    """Upstream's logits budget brought down to about ``target_bytes`` through its own knob
    (``SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION``: the budget is that fraction of the memory the
    static pools leave free, capped by that fraction of the free memory), found by asking
    upstream's ``mqa_logits_budget_bytes`` itself; yields what was set and what it computes."""
    from sglang.srt.layers.attention.mqa_logits_utils import mqa_logits_budget_bytes

    device = torch.cuda.current_device()
    probe = 1e-3
    with _env(BUDGET_ENV, str(probe)):
        at_probe = mqa_logits_budget_bytes(device_index=device, allow_sync=True)
    fraction = probe * target_bytes / max(at_probe, 1)
    with _env(BUDGET_ENV, f"{fraction:.9g}"):
        yield {
            "env": BUDGET_ENV,
            "fraction": fraction,
            "target_bytes": int(target_bytes),
            "budget_bytes": int(mqa_logits_budget_bytes(device_index=device, allow_sync=True)),
        }


def bounded_scenario(arm: Arm, sizes: Sizes) -> None:
    """Prefills whose logits in one piece exceed the logits budget, the budget brought down
    through upstream's own knob to a ``bounded_chunks``-th of the first one's: one request's
    prefill in one extend (the non-paged path: bf16_mqa_logits, upstream's fp8 gathers for
    fp8_mqa_logits; sm_120's fp8 path takes the paged TileLang scorer), then two requests'
    prefixes and their joint extend (the paged path: row chunks from the indexer metadata). Every
    step keeps only the rows its checks read, measures its logits phase and, for bf16, must chunk
    within the budget with no DeepGEMM schedule (:func:`bounded_problems`)."""
    from sglang.srt.layers.attention.mqa_logits_utils import mqa_logits_row_bytes

    rig = arm.rig
    assert sizes.bounded is not None, "run only with its sizes"
    one_shot, prefix, extend = sizes.bounded
    keys = -(-one_shot // 4 // 64) * 64
    target = one_shot * mqa_logits_row_bytes(keys) // sizes.bounded_chunks
    with logits_budget(target) as budget:
        print(f"  bounded: {budget}", flush=True)
        r = rig.new_request(80)
        arm.step("bounded", f"{one_shot} tokens in one extend", [r], [one_shot], "extend", bounded=True)
        rig.finish(r)
        a, b = rig.new_request(81), rig.new_request(82)
        for req in (a, b):
            arm.step(
                "bounded",
                f"{prefix}-token prefix of request {req.rid}",
                [req],
                [prefix],
                "extend",
                bounded=True,
            )
        arm.step(
            "bounded",
            f"2 requests x {extend} tokens after {prefix}",
            [a, b],
            [extend, extend],
            "extend",
            bounded=True,
        )
        rig.finish(a)
        rig.finish(b)


def bounded_large_scenario(arm: Arm, sizes: Sizes) -> None:
    """One request of ``bounded_large[0]`` tokens (1M: 256K keys) prefilled in chunks of
    ``bounded_large[1]`` under upstream's own budget (the rig's server args: mem_fraction_static
    as the scaffold sets it): every prefix chunk keeps no logits and is not checked (its path and
    plan are recorded), the last -- 16K rows x 256K keys, 16 GiB of logits in one piece -- is a
    bounded step, checked as every step is."""
    rig = arm.rig
    assert sizes.bounded_large is not None, "run only with its sizes"
    total, chunk = sizes.bounded_large
    r = rig.new_request(90)
    done = 0
    while done < total:
        n = min(chunk, total - done)
        last = done + n >= total
        arm.step(
            "bounded_large",
            f"{total} tokens, chunk {done}-{done + n}",
            [r],
            [n],
            "extend",
            bounded=last,
            lean=True,
            checked=last,
        )
        done += n
    rig.finish(r)


def pd_scenario(arm: Arm, total: int) -> None:
    """Prefill on this arm, move the request's pages into a second server's pool (its own page
    assignment) by upstream's PD buffer descriptors, check every page, then decode there."""
    from dataclasses import replace

    from . import pd

    rig = arm.rig
    src = rig.new_request(50)
    prefill(arm, "pd", src, total, None)
    # the same model on another server: other pages, same weights
    recv = Arm(arm.applied, arm.spec, replace(rig.cfg, page_seed=rig.cfg.seed + 1))
    try:
        dst = recv.rig.new_request(50)
        recv.rig.reserve(dst, total)
        canary = [p for p in recv.rig.free_pages[:8]]
        before = recv.pool_buf[canary].clone()
        moved = pd.transfer(rig.pool, recv.rig.pool, src.pages, dst.pages)
        cmp = pd.compare_indexer_pages(rig.pool, recv.rig.pool, src.pages, dst.pages, canary, before)
        detail = (
            f"{moved.buffers} buffers x {moved.pages} pages by the PD descriptors (item sizes {moved.item_lens}): "
            f"{cmp.identical_pages}/{cmp.pages} indexer pages identical on the receiver"
            + ("" if cmp.first_bad_page is None else f", first wrong page {cmp.first_bad_page}")
            + f", canary pages {'untouched' if cmp.canaries_untouched else 'WRITTEN'}"
        )
        arm.results.append(
            StepResult(
                arm.applied.name,
                arm.spec.name,
                "pd",
                "eager",
                "transfer",
                f"{total} tokens",
                "pass" if cmp.ok else "fail",
                [total],
                detail=detail,
            )
        )
        dst.length = total
        for s in range(2):
            recv.step("pd", f"decode on the receiver {s}", [dst], [1], "decode")
        arm.results += recv.results
    finally:
        recv.close()
    rig.finish(src)


def arm_specs(
    formats: tuple[str, ...] = ("bf16", "fp8"),
    compressors: tuple[str, ...] = ("fused", "unfused"),
    mtp: bool = True,
    drafts: tuple[int, ...] = (2,),
) -> list[ArmSpec]:
    """The arms: each format x compressor, and (``mtp``) target verify with each number of draft
    tokens in ``drafts`` (fused compressor; 4 drafts: groups of 4 rows, whose key stages follow
    the GPU's shared memory)."""
    specs = [ArmSpec(f, c) for f in formats for c in compressors]
    if mtp:
        specs += [ArmSpec(f, "fused", draft_tokens=n) for n in drafts for f in formats]
    return specs


def run_arm(applied: P.Applied, spec: ArmSpec, sizes: Sizes, device: str = "cuda") -> Arm:
    cfg = RigConfig(device=device, flag=spec.fmt == "bf16", draft_tokens=spec.draft_tokens)
    if sizes.long is None:
        cfg.full_tokens = 1 << 16
        cfg.max_context_len = 1 << 14
    else:  # room for the long request's decode steps past its prompt
        cfg.max_context_len = max(cfg.max_context_len, sizes.long[0] + 4 * 256)
    if sizes.bounded is not None and (sizes.only is None or "bounded" in sizes.only):
        cfg.max_context_len = max(cfg.max_context_len, sizes.bounded[0], sizes.bounded[1] + sizes.bounded[2])
        cfg.full_tokens = max(cfg.full_tokens, 2 * (sizes.bounded[1] + sizes.bounded[2]) + sizes.bounded[0])
    if (
        sizes.bounded_large is not None
        and spec.fmt == "bf16"
        and not spec.draft_tokens
        and (sizes.only is None or "bounded_large" in sizes.only)
    ):
        cfg.max_context_len = max(cfg.max_context_len, sizes.bounded_large[0] + 4 * 256)
        cfg.full_tokens = max(cfg.full_tokens, sizes.bounded_large[0] + (1 << 16))
    with _env(UNFUSED_ENV, "1" if spec.compressor == "unfused" else None):
        arm = Arm(applied, spec, cfg)
        try:
            run_scenarios(arm, sizes)
        except Exception as exc:  # noqa: BLE001 -- recorded as an error row, the tier goes on
            import traceback

            arm.results.append(
                StepResult(
                    applied.name,
                    spec.name,
                    "error",
                    "eager",
                    "-",
                    "-",
                    "error",
                    [],
                    detail="".join(traceback.format_exception(exc))[-3000:],
                )
            )
        finally:
            arm.close()
    return arm
