"""Spies on the C4 indexer's production functions, and the DeepGEMM stand-in.

:class:`Spies` wraps, in upstream's own modules, every function ``forward_c4_indexer`` can pick
for the logits, the top-k, the non-paged gather and the metadata (the spied roles of
:data:`verify.core.upstream.FUNCTIONS`), records each call (role, shapes, ``clean_logits``) and
calls through -- or, in ``probe`` mode (no GPU), returns a well-formed empty answer so the
dispatch decision can be observed without running kernels.

Where upstream's sm_90 / sm_100 path calls DeepGEMM and no working DeepGEMM imports (its PyPI
wheel crashes against the GPU machine's torch; the GPU runner's ``deepgemm`` stage builds one from
source, which ``USE_DEEPGEMM=1`` then puts in use), :func:`deep_gemm_stand_in` provides a module of
that name whose ``fp8_paged_mqa_logits`` is the Triton fp8 twin (DeepGEMM's signature and math:
fp8 x fp8 -> fp32, times each key's scale), whose ``fp8_mqa_logits`` (the non-paged prefill path)
is a torch implementation of the same math, and whose ``get_num_sms`` asks torch. Each use is
recorded and named in the results.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from verify.core.upstream import spied_roles

FP8_SCORERS = (
    "score_tilelang",
    "score_torch",
    "score_torch_sm120",
    "score_aiter",
    "score_deepgemm",
    "score_deepgemm_nonpaged",
)
BF16_SCORERS = ("score_bf16", "score_bf16_prefill")
SCORERS = (*BF16_SCORERS, *FP8_SCORERS)
# The schedules a scorer may be handed: DeepGEMM's metadata kernel and upstream's JIT twin of it
# (the top-k v2 plan is the top-k's, not a scorer schedule).
SCHEDULE_ROLES = ("metadata_jit", "metadata_deepgemm")
TOPKS = ("topk_v1", "topk_v2", "topk_torch", "topk_flashinfer")


@dataclass
class Call:
    role: str
    rows: int
    width: int | None = None
    seq_lens_dim: int | None = None
    clean_logits: bool | None = None
    kv_dtype: str | None = None
    launch: str | None = None  # the bf16 kernel's: rows per group and the key stages it runs
    out_bytes: int | None = None  # a scorer's logits (one row chunk's)


@dataclass
class Spies:
    probe: bool = False  # True: answer without running kernels (dispatch probe on CPU)
    keep_logits: bool = False  # keep each scorer's output (the checks split scorer from top-k faults)
    calls: list[Call] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    _saved: list[tuple[Any, str, Any]] = field(default_factory=list)
    gathers: int = 0
    # Lean keeping (bounded-memory steps): only these rows of the step's logits, copied to the
    # host row by row as each top-k call reads them (None: every row, on the device, as before).
    keep_rows: torch.Tensor | None = None
    kept_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    _rows_seen: int = 0
    # The logits phase's memory (bounded steps): armed by the step, started by the first scorer.
    track_phase: bool = False
    phase: dict[str, int] = field(default_factory=dict)

    def _phase_start(self) -> None:
        if not self.track_phase or self.phase or not torch.cuda.is_available():
            return
        torch.cuda.synchronize()
        self.phase = {
            "pre_peak": int(torch.cuda.max_memory_allocated()),
            "base": int(torch.cuda.memory_allocated()),
        }
        torch.cuda.reset_peak_memory_stats()

    def _keep(self, logits: torch.Tensor) -> None:
        if self.keep_rows is None:
            self.logits.append(logits)  # the logits the top-k reads, as it reads them
            return
        lo, hi = self._rows_seen, self._rows_seen + int(logits.shape[0])
        self._rows_seen = hi
        for r in self.keep_rows[(self.keep_rows >= lo) & (self.keep_rows < hi)].tolist():
            self.kept_rows[r] = logits[r - lo].to("cpu", copy=True)

    def arm_lean(self, rows: torch.Tensor | None, track_phase: bool) -> None:
        """For the next step: keep only ``rows`` of its logits (None: all) and measure its logits
        phase's memory."""
        self.keep_rows = None if rows is None else rows.reshape(-1).long().cpu()
        self.kept_rows, self._rows_seen, self.track_phase, self.phase = {}, 0, track_phase, {}

    def _record_scorer(self, role: str, args: tuple[Any, ...]) -> None:
        q, kv, _w, seq = args[0], args[1], args[2], args[3]
        rows = (q[0] if isinstance(q, tuple) else q).shape[0]
        clean = args[7] if len(args) > 7 else None
        self.calls.append(
            Call(
                role,
                int(rows),
                int(args[6]) if len(args) > 6 else None,
                int(seq.dim()) if hasattr(seq, "dim") else None,
                None if clean is None else bool(clean),
                str(kv.dtype if isinstance(kv, torch.Tensor) else type(kv).__name__),
            )
        )

    def _wrap(self, role: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        spies = self

        def spy(*args: Any, **kwargs: Any) -> Any:
            if role in SCORERS:
                spies._phase_start()
            if role in SCORERS and role not in ("score_deepgemm_nonpaged", "score_bf16_prefill"):
                spies._record_scorer(role, args)
                if role == "score_bf16":
                    spies.calls[-1].launch = bf16_launch(fn, args, kwargs)
                if spies.probe:
                    q = args[0][0] if isinstance(args[0], tuple) else args[0]
                    return torch.zeros(q.shape[0], int(args[6]), dtype=torch.float32, device=q.device)
            elif role == "score_deepgemm_nonpaged":
                q = args[0]
                spies.calls.append(
                    Call(
                        role,
                        int(q.shape[0]),
                        int(kwargs.get("max_seqlen_k", 0)),
                        None,
                        bool(kwargs.get("clean_logits", False)),
                    )
                )
                if spies.probe:
                    return torch.zeros(
                        q.shape[0], int(kwargs["max_seqlen_k"]), dtype=torch.float32, device=q.device
                    )
            elif role == "score_bf16_prefill":
                # bf16_mqa_logits(q, kv, weights, ks, ke, max_seqlen_k, page_table=, clean_logits=)
                q, kv, width = args[0], args[1], int(args[5] if len(args) > 5 else kwargs["max_seqlen_k"])
                table = kwargs.get("page_table", args[6] if len(args) > 6 else None)
                spies.calls.append(
                    Call(
                        role,
                        int(q.shape[0]),
                        width,
                        1,
                        bool(kwargs.get("clean_logits", args[7] if len(args) > 7 else False)),
                        str(kv.dtype),
                        launch=bf16_prefill_launch(fn, q, table),
                    )
                )
                if spies.probe:
                    return torch.zeros(q.shape[0], width, dtype=torch.float32, device=q.device)
            else:
                rows = args[0].shape[0] if args and isinstance(args[0], torch.Tensor) else 0
                spies.calls.append(Call(role, int(rows)))
                if role in TOPKS and spies.keep_logits and args and isinstance(args[0], torch.Tensor):
                    spies._keep(args[0])
                if spies.probe and role in TOPKS:
                    return None  # the output buffers keep their fill (-1): nothing selected
                if spies.probe and role == "metadata_topk_v2_plan":
                    return torch.zeros(1, dtype=torch.int32, device=args[0].device)
                if spies.probe and role.startswith("metadata"):
                    seq, sms = args[0], int(args[2])  # (lengths, page size, SM count): a zero schedule
                    return torch.zeros(sms + 1, 2, dtype=torch.int32, device=seq.device)
            out = fn(*args, **kwargs)
            if role in SCORERS and isinstance(out, torch.Tensor):
                spies.calls[-1].out_bytes = int(out.numel() * out.element_size())
            return out

        cast(Any, spy).__wrapped__ = fn  # what inspect.unwrap follows back to the function
        return spy

    def install(self, backend: Any = None) -> Spies:
        import importlib

        for role, (module_name, attr) in spied_roles().items():
            try:
                module = importlib.import_module(module_name)
            except Exception:  # noqa: BLE001, S112 -- a module this machine cannot import is not picked here
                continue
            if not hasattr(module, attr):
                continue
            original = getattr(module, attr)
            self._saved.append((module, attr, original))
            setattr(module, attr, self._wrap(role, original))
        if backend is not None:
            original_fi = backend.flashinfer_topk_transform
            self._saved.append((backend, "flashinfer_topk_transform", original_fi))
            backend.flashinfer_topk_transform = self._wrap("topk_flashinfer", original_fi)
            original_gather = backend._gather_nonpaged_index_k
            spies = self

            def gather(*args: Any, **kwargs: Any) -> Any:
                spies.gathers += 1
                spies.calls.append(Call("gather_nonpaged", 0))
                if spies.probe:  # the keys upstream would gather: their shapes, no kernel
                    n, dev = int(kwargs["plan"].seq_len_sum), kwargs["plan"].page_table.device
                    return (
                        torch.zeros(n, 128, device=dev).to(torch.float8_e4m3fn),
                        torch.zeros(n, device=dev),
                    )
                return original_gather(*args, **kwargs)

            self._saved.append((backend, "_gather_nonpaged_index_k", original_gather))
            backend._gather_nonpaged_index_k = gather
        return self

    def uninstall(self) -> None:
        for obj, attr, original in reversed(self._saved):
            setattr(obj, attr, original)
        self._saved.clear()

    def take(self) -> list[Call]:
        out, self.calls = self.calls, []
        return out

    def take_logits(self) -> list[torch.Tensor]:
        out, self.logits = self.logits, []
        return out

    def take_kept_rows(self) -> dict[int, torch.Tensor]:
        """A lean step's kept rows (step row -> its logits on the host); lean keeping ends."""
        out, self.kept_rows, self.keep_rows = self.kept_rows, {}, None
        return out

    def take_phase(self) -> dict[str, int]:
        """A tracked step's logits phase: ``peak_extra`` (bytes allocated at its peak beyond what
        was live when the first scorer started) and ``step_peak`` (the step's own peak, absolute)."""
        out, self.phase, self.track_phase = self.phase, {}, False
        if out and torch.cuda.is_available():
            torch.cuda.synchronize()
            peak = int(torch.cuda.max_memory_allocated())
            out = {
                "peak_extra": peak - out["base"],
                "step_peak": max(peak, out["pre_peak"]),
                "base": out["base"],
            }
        return out


def bf16_launch(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``group_rows=G stages=S``: the rows the dispatch grouped and the key stages the kernel
    module selects for them on this device (its shared memory, or the profile's stand-in for it)."""
    import sys

    module = sys.modules[fn.__module__]
    group_rows = int(kwargs.get("group_rows", 1))
    q = args[0][0] if isinstance(args[0], tuple) else args[0]
    rows, heads = int(q.shape[0]), int(q.shape[-2])
    groups = -(-rows // group_rows)
    shared = getattr(module, "_device_shared_memory", None)
    if shared is None:  # a kernel module from before the stages followed shared memory
        return f"group_rows={group_rows}"
    config = module.select_config(groups, int(args[6]), heads, group_rows, shared(q.device))
    return f"group_rows={group_rows} stages={config.num_stages}"


def bf16_prefill_launch(fn: Callable[..., Any], q: torch.Tensor, page_table: Any) -> str:
    """``block_k=K block_r=R paged|contiguous``: the prefill kernel's tile (the module's default for
    this device, or the profile's stand-in for its shared memory) and how the keys were read."""
    import sys

    module = sys.modules[fn.__module__]
    how = "paged" if page_table is not None else "contiguous"
    try:
        config = module.select_prefill_config(module._device_shared_memory(q.device), int(q.shape[1]))
    except Exception:  # noqa: BLE001 -- a module without the selector: say how it was read only
        return how
    return f"block_k={config.block_k} block_r={config.block_r} {how}"


def roles_called(calls: list[Call]) -> list[str]:
    return list(dict.fromkeys(c.role for c in calls))


# ---------------------------------------------------------------------------------------------
# DeepGEMM stand-in
# ---------------------------------------------------------------------------------------------

DEEPGEMM_STAND_IN = (
    "deep_gemm stand-in: fp8_paged_mqa_logits = Triton fp8 twin (verify.core.fp8_twin, DeepGEMM's "
    "signature and math), fp8_mqa_logits = torch (same math, gathered keys), get_num_sms = torch's SM "
    "count; the real DeepGEMM does not run on this machine"
)


def _nonpaged_logits(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    clean_logits: bool = False,
    max_seqlen_k: int = 0,
) -> torch.Tensor:
    """DeepGEMM ``fp8_mqa_logits``: ``sum_h relu(q_h . k_j * s_j) w_h`` for j in [ks, ke), in fp32."""
    k8, scale = kv
    rows, heads, _ = q.shape
    n = k8.shape[0]
    width = max(max_seqlen_k, n)
    out = torch.full((rows, width), float("-inf"), dtype=torch.float32, device=q.device)
    kf = k8.float()
    acc = torch.zeros(rows, n, dtype=torch.float32, device=q.device)
    for h in range(heads):
        acc += (q[:, h].float() @ kf.T * scale.unsqueeze(0)).relu_() * weights[:, h : h + 1].float()
    out[:, :n] = acc
    cols = torch.arange(width, device=q.device).unsqueeze(0)
    out.masked_fill_((cols < ks.unsqueeze(1)) | (cols >= ke.unsqueeze(1)), float("-inf"))
    return out


def deep_gemm_stand_in() -> types.ModuleType:
    """A ``deep_gemm`` module for upstream's sm_90 / sm_100 C4 path on a machine without it."""
    mod = types.ModuleType("deep_gemm")
    mod.__dict__["IS_BF16K_STAND_IN"] = True

    def get_num_sms() -> int:
        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
        return 132

    def fp8_paged_mqa_logits(
        q: torch.Tensor,
        kv: torch.Tensor,
        weights: torch.Tensor,
        seq_lens: torch.Tensor,
        page_table: torch.Tensor,
        metadata: Any,
        max_len: int,
        clean_logits: bool,
    ) -> torch.Tensor:
        from verify.core.fp8_twin import fp8_paged_mqa_logits_twin

        return fp8_paged_mqa_logits_twin(
            q, kv, weights, seq_lens.reshape(-1), page_table, metadata, max_len, clean_logits
        )

    def get_paged_mqa_logits_metadata(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("DeepGEMM's own metadata kernel is not available here; upstream's JIT one is used")

    mod.__dict__.update(
        get_num_sms=get_num_sms,
        fp8_paged_mqa_logits=fp8_paged_mqa_logits,
        fp8_mqa_logits=_nonpaged_logits,
        get_paged_mqa_logits_metadata=get_paged_mqa_logits_metadata,
    )
    return mod


def install_deep_gemm_stand_in() -> str | None:
    """Put the stand-in in ``sys.modules`` unless a working DeepGEMM imports; returns its name
    for the results, or None when the real one is in use."""
    # sglang's DeepGEMM wrapper decides at import whether DeepGEMM is there (and then imports
    # deep_gemm.utils); let it decide with the real library's absence first, so only the C4
    # indexer's direct imports see the stand-in.
    try:
        import sglang.srt.layers.deep_gemm_wrapper.configurer  # noqa: F401
    except Exception:  # noqa: BLE001, S110 -- not importable here: nothing decided, nothing to order
        pass
    existing = sys.modules.get("deep_gemm")
    if existing is not None:
        return DEEPGEMM_STAND_IN if getattr(existing, "IS_BF16K_STAND_IN", False) else None
    try:
        import deep_gemm  # noqa: F401

        if not getattr(sys.modules["deep_gemm"], "IS_STUB", False):
            return None
    except Exception:  # noqa: BLE001, S110 -- absent or broken: the stand-in serves
        pass
    sys.modules["deep_gemm"] = deep_gemm_stand_in()
    return DEEPGEMM_STAND_IN
