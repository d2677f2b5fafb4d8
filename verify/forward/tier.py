"""The forward tier: upstream's ``C4Indexer`` forward, as the attention layer calls it, checked.

For one platform profile (:mod:`verify.platform`), each *arm* -- index-K format (bf16: the
series' flag on; fp8: off) x compressor (fused store kernel; the unfused path,
``SGLANG_OPT_DSV4_UNFUSED_INDEX_K_STORE=1``) -- builds a :class:`~verify.forward.rig.Rig` and runs
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
  (:mod:`verify.forward.pd`), then decode on the receiving side.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from verify import platform as P

from .checks import check_keys, check_selection, decode_pool_keys, logits_row_digests
from .reference import reference_keys, reference_q
from .rig import INDEX_TOPK, LAYER_ID, Request, Rig, RigConfig, batched_token_inputs
from .stand_ins import FP8_SCORERS, SCORERS, TOPKS, Spies, roles_called

UNFUSED_ENV = "SGLANG_OPT_DSV4_UNFUSED_INDEX_K_STORE"


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
                    indexer.forward(x=x, q_lora=q_lora, forward_batch=fb, attn_backend=backend,
                                    enable_multi_stream=True, q_lora_ready=ready)
                torch.cuda.current_stream().wait_stream(side)
            else:
                indexer.forward(x=x, q_lora=q_lora, forward_batch=fb, attn_backend=backend)

    def step(self, scenario: str, label: str, reqs: list[Request], extend_lens: list[int], mode: str,
             multi_stream: bool = False) -> StepResult:
        rig = self.rig
        self.q_log.clear()
        self.spies.take()
        fb = rig.batch(reqs, extend_lens, mode)
        x, q_lora = rig.inputs(reqs, extend_lens)
        rows = int(x.shape[0])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            rig.backend.init_forward_metadata(fb)
            self._forward(fb, x, q_lora, multi_stream)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        selected = rig.backend.forward_metadata.core_metadata.c4_sparse_page_indices[:rows, :INDEX_TOPK].clone()
        width = rig.backend.forward_metadata.indexer_metadata.max_compressed_seq_len
        positions = fb.positions.clone()
        rig.commit(reqs, extend_lens)
        run = "multi-stream" if multi_stream else "eager"
        key = f"{scenario}:{label}:{run}"
        res = self._check(scenario, label, run, mode, reqs, extend_lens, selected, positions, x, q_lora, digest_key=key)
        res.peak_mb = round(peak, 2)
        res.logits_mb = round(rows * width * 4 / 2**20, 2)
        self.selections[key] = selected.sort(dim=1).values.cpu()  # the top-k's order is not part of its contract
        self.step_status[key] = res.status
        self.pool_digest[key] = hashlib.sha256(self.pool_buf.cpu().numpy().tobytes()).hexdigest()[:16]
        self.results.append(res)
        return res

    def graph_decode(self, scenario: str, label: str, reqs: list[Request], steps: int, bucket: int = 4) -> list[StepResult]:
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
            indexer.forward(x=x_static, q_lora=q_static, forward_batch=cap_fb, attn_backend=backend)  # warm-up
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
            res = self._check(scenario, f"{label} step {s}", "graph", "decode", reqs, [1] * n, sel, positions, x, q_lora)
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
    def _check(self, scenario: str, label: str, run: str, mode: str, reqs: list[Request], extend_lens: list[int],
               selected: torch.Tensor, positions: torch.Tensor, x: torch.Tensor, q_lora: torch.Tensor,
               digest_key: str | None = None) -> StepResult:
        """The step's checks; with ``digest_key``, also the per-row digest of the logits the
        top-k read, kept under that key for the flag-off comparison."""
        rig = self.rig
        calls = self.spies.take()
        kept = self.spies.take_logits()
        logits = torch.cat(kept) if kept and len({t.shape[1] for t in kept}) == 1 else None
        if logits is not None and logits.shape[0] != selected.shape[0]:
            logits = None
        if digest_key is not None and logits is not None:
            try:  # what the flag-off comparison reports beside the selections; never fails a step
                self.logits_digest[digest_key] = logits_row_digests(logits, (positions[: logits.shape[0]] + 1) // 4,
                                                                    INDEX_TOPK)
            except (RuntimeError, ValueError) as exc:
                print(f"  note: no logits digest for this step ({P.short_error(exc)})", flush=True)
        scorer = roles_called([c for c in calls if c.role in SCORERS])
        topk = roles_called([c for c in calls if c.role in TOPKS])
        other = roles_called([c for c in calls if c.role not in SCORERS and c.role not in TOPKS])
        launches = list(dict.fromkeys(c.launch for c in calls if c.role == "score_bf16" and c.launch))
        res = StepResult(self.applied.name, self.spec.name, scenario, run, mode, label, "pass",
                         [r.length for r in reqs], scorer=scorer, topk=topk, other_calls=other,
                         bf16_launches=launches)
        problems: list[str] = []
        if self.spec.fmt == "bf16":
            fp8 = [s for s in scorer if s in FP8_SCORERS]
            if fp8 or "gather_nonpaged" in other:
                problems.append(f"flag on but fp8 path ran: {fp8 + [o for o in other if o == 'gather_nonpaged']}")
            if run != "graph" and "score_bf16" not in scorer:
                problems.append("flag on but the bf16 scorer did not run")
            grouped = f"group_rows={self.spec.draft_tokens}"
            if mode == "target_verify" and not any(x.split()[0] == grouped for x in launches):
                # the dispatch groups a uniform target verify's rows per request (patch 5)
                problems.append(f"target verify with {self.spec.draft_tokens} draft tokens not scored in groups: {launches}")
        q_prod, w_prod = self.q_log[-1] if self.q_log else (None, None)
        offset = 0
        for req, n in zip(reqs, extend_lens):
            rows = slice(offset, offset + n)
            offset += n
            n_keys = req.length // 4
            x_all, _ = batched_token_inputs(req, 0, req.length, rig.cfg)
            ref = reference_keys(x_all.to(rig.device), rig.weights, rig.freqs_cis)
            slots = rig.slot_of(req, torch.arange(n_keys))
            kc = check_keys(self.pool_buf, slots, ref, self.spec.fmt)
            res.keys.append({"request": req.rid, "length": req.length, **asdict(kc)})
            if not kc.ok:
                problems.append(f"request {req.rid} keys: {kc.detail}")
            if q_prod is None:
                problems.append("no q was computed (compute_q did not run)")
                continue
            pick = _sample_rows(n, ((positions[rows] + 1) // 4).cpu())
            sel_rows = selected[rows][pick]
            pos = positions[rows][pick]
            row_lens = ((pos + 1) // 4).cpu()
            chosen = _slots_to_keys(rig, req, sel_rows)
            stored, _ = decode_pool_keys(self.pool_buf, slots, self.spec.fmt)
            qp = q_prod[rows][pick].float()
            wp = w_prod[rows][pick].float().reshape(len(pick), -1)
            q_ex, w_ex = reference_q(x[rows][pick], q_lora[rows][pick], pos, rig.weights, rig.freqs_cis)
            lg = logits[rows][torch.tensor(pick, device=logits.device)] if logits is not None else None
            sc = check_selection(chosen, row_lens, qp, wp, stored.float(), q_ex, w_ex, ref, INDEX_TOPK, lg)
            res.selection.append({"request": req.rid, "rows_checked": len(pick), "rows": n, **asdict(sc)})
            if not sc.ok:
                problems.append(f"request {req.rid} selection: {sc.detail}")
        if problems:
            res.status = "fail"
        res.detail = " | ".join(problems) if problems else (
            f"keys and selection match the oracles for {len(reqs)} request(s); scorer {scorer}, top-k {topk}")
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


def _slots_to_keys(rig: Rig, req: Request, sel: torch.Tensor) -> torch.Tensor:
    """Selected pool slots -> the request's key indices; -1 stays -1 (nothing selected) and a
    slot outside the request's pages becomes a huge index the check rejects."""
    n_slots = len(req.pages) * 64
    slots = rig.slot_of(req, torch.arange(n_slots))
    inv = torch.full((int(rig.pool.c4_indexer_kv_pool.index_k_with_scale_buffer[0].shape[0]) * 64,), 1 << 30,
                     dtype=torch.int64)
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
        req_pool_indices=torch.cat([fb.req_pool_indices, torch.zeros(pad, dtype=fb.req_pool_indices.dtype, device=dev)]),
        seq_lens=seq,
        seq_lens_sum=int(seq.sum()),
        seq_lens_cpu=seq.cpu(),
        encoder_lens=None,
        extend_seq_lens=None,
        out_cache_loc=torch.cat([fb.out_cache_loc, torch.zeros(pad, dtype=fb.out_cache_loc.dtype, device=dev)]),
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


QUICK = Sizes(stale=600, chunked=(3002, 1024), oneshot=(2100,), boundaries=(2048,), residues=(1201, 1202),
              chunk_sizes=(1024,), mixed_chunk=300, decode_steps=5, graph_steps=2, long=None, mtp_prefill=1500, mtp_steps=2,
              pd=1200)


def prefill(arm: Arm, scenario: str, req: Request, total: int, chunk: int | None) -> None:
    chunk = chunk or total
    done = 0
    while done < total:
        n = min(chunk, total - done)
        arm.step(scenario, f"{total} tokens, chunk {done}-{done + n}", [req], [n], "extend")
        done += n


def run_scenarios(arm: Arm, sizes: Sizes) -> None:
    """The scenarios of the module docstring, in order, on one arm (flag, compressor)."""
    rig = arm.rig
    if arm.spec.draft_tokens:
        a = rig.new_request(101)
        b = rig.new_request(102)
        prefill(arm, "mtp", a, sizes.mtp_prefill, None)
        prefill(arm, "mtp", b, sizes.mtp_prefill // 2 + 3, None)
        for s in range(sizes.mtp_steps):
            arm.step("mtp", f"verify step {s}", [a, b], [arm.spec.draft_tokens] * 2, "target_verify")
        return
    r0 = rig.new_request(1)
    prefill(arm, "stale", r0, sizes.stale, None)
    rig.finish(r0)  # pages back to the free list with their keys in place
    a = rig.new_request(2)
    prefill(arm, "chunked", a, sizes.chunked[0], sizes.chunked[1])
    live = [a]
    for i, total in enumerate(sizes.oneshot):
        r = rig.new_request(10 + i)
        prefill(arm, "oneshot", r, total, None)
        live.append(r)
    pd_scenario(arm, sizes.pd)
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
    # MIXED: a new request's first chunk with the live ones decoding
    m = rig.new_request(60)
    arm.step("mixed", f"{sizes.mixed_chunk}-token chunk + {len(live)} decoding", [m, *live],
             [sizes.mixed_chunk] + [1] * len(live), "mixed")
    live.append(m)
    for s in range(sizes.decode_steps):
        arm.step("decode", f"step {s}", live, [1] * len(live), "decode")
    arm.step("decode", "multi-stream step", live, [1] * len(live), "decode", multi_stream=True)
    arm.graph_decode("graph", "bucket 4", live[:3], sizes.graph_steps, bucket=4)
    if sizes.long is not None and arm.spec.compressor == "fused":  # the unfused path differs in the store only
        for r in live:
            rig.finish(r)
        big = rig.new_request(77)
        prefill(arm, "long", big, sizes.long[0], sizes.long[1])
        arm.step("long", "decode", [big], [1], "decode")


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
        detail = (f"{moved.buffers} buffers x {moved.pages} pages by the PD descriptors (item sizes {moved.item_lens}): "
                  f"{cmp.identical_pages}/{cmp.pages} indexer pages identical on the receiver"
                  + ("" if cmp.first_bad_page is None else f", first wrong page {cmp.first_bad_page}")
                  + f", canary pages {'untouched' if cmp.canaries_untouched else 'WRITTEN'}")
        arm.results.append(StepResult(arm.applied.name, arm.spec.name, "pd", "eager", "transfer", f"{total} tokens",
                                      "pass" if cmp.ok else "fail", [total], detail=detail))
        dst.length = total
        for s in range(2):
            recv.step("pd", f"decode on the receiver {s}", [dst], [1], "decode")
        arm.results += recv.results
    finally:
        recv.close()
    rig.finish(src)


def arm_specs(formats: tuple[str, ...] = ("bf16", "fp8"), compressors: tuple[str, ...] = ("fused", "unfused"),
              mtp: bool = True, drafts: tuple[int, ...] = (2,)) -> list[ArmSpec]:
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
    with _env(UNFUSED_ENV, "1" if spec.compressor == "unfused" else None):
        arm = Arm(applied, spec, cfg)
        try:
            run_scenarios(arm, sizes)
        except Exception as exc:  # noqa: BLE001 -- recorded as an error row, the tier goes on
            import traceback

            arm.results.append(StepResult(applied.name, spec.name, "error", "eager", "-", "-", "error", [],
                                          detail="".join(traceback.format_exception(exc))[-3000:]))
        finally:
            arm.close()
    return arm
