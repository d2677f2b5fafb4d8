"""The GPU backend: tier 2 through the production kernels of the (patched) upstream tree.

* q: ``fused_q_indexer_rope_hadamard_quant`` (RoPE + Hadamard + fp8 + scale folded into weights);
* fp8 store: ``fused_store_cache(type="indexer")`` into a 132-B/slot paged buffer;
* bf16 store: patch 1's ``DeepSeekV4IndexerPool.set_index_k_bf16`` into its 256-B/slot buffer;
* bf16 scorer: patch 4's ``bf16_paged_mqa_logits``;
* fp8 scorer and top-k: what upstream runs on the ``platform`` profile (:mod:`verify.core.platform`;
  the dispatch probe reads them off upstream's own forward): sm_90 / sm_100 DeepGEMM's
  ``fp8_paged_mqa_logits`` (the Triton fp8 twin stands in where DeepGEMM cannot run) and top-k
  v2; sm_120 upstream's TileLang scorer (sm_120's mma.sync lowering on other GPUs) and top-k v1.
  ``--fp8-scorer torch|triton-twin|deepgemm|tilelang|torch-sm120|emulation`` overrides the scorer.

Every step that cannot load falls back to :class:`~verify.recall.backend.EmulationBackend` on the
GPU and says so in ``paths`` (and so in results.json / summary.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from verify.core import formats as F
from verify.core import platform as P
from verify.core import upstream as U
from verify.core.scoring import row_slots, torch_select

from .backend import Backend, EmulationBackend, QueryInputs

FP8_SCORERS = ("auto", "torch", "torch-sm120", "triton-twin", "deepgemm", "tilelang", "emulation")
# --fp8-scorer name -> the platform role it loads
CHOICE_ROLE = {
    "torch": "score_torch",
    "torch-sm120": "score_torch_sm120",
    "triton-twin": "score_twin",
    "deepgemm": "score_deepgemm",
    "tilelang": "score_tilelang",
}
TORCH_SEMANTICS = ("score_torch", "score_torch_sm120")  # bf16 per-head dots (emulation "fp8-torch")


@dataclass
class GpuBackend(Backend):
    fp8_scorer_choice: str = "auto"
    platform: str = "auto"  # profile whose fp8 scorer and top-k run (see verify.core.platform)
    name: str = "gpu"
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.device.type != "cuda":
            raise RuntimeError("the gpu backend needs a CUDA device")
        self._pools: dict[int, Any] = {}
        self.fp8_input_dtype = torch.float32
        self._q = U.q_kernel()
        self._fp8_store = U.fp8_store()
        self._pool_cls = U.bf16_pool_cls()
        self._bf16_score = U.bf16_scorer()
        from verify.core.probe import profile_roles

        self.platform = P.resolve(self.platform)
        self.roles = profile_roles(self.platform)
        self.paths["platform"] = f"{self.platform} ({P.HARDWARE[self.platform]}): upstream picks {self.roles}"
        self._topk_role = self.roles["topk"] if self.roles["topk"] in ("topk_v1", "topk_v2") else "topk_v1"
        self._topk = U.load(self._topk_role)
        self._topk_plan = U.load("metadata_topk_v2_plan") if self._topk_role == "topk_v2" else None
        self._fp8_score, fp8_sem = self._pick_fp8_scorer()
        # The control arm and every fallback: exact emulation with the chosen fp8 read semantics.
        self.emul = EmulationBackend(device=self.device, fp8_scorer=fp8_sem)
        self._probe_fp8_store()
        self.emul.fp8_input_dtype = self.fp8_input_dtype
        self.paths["q"] = self._desc(self._q, "emulation (torch)")
        self.paths["store_bf16"] = self._desc(
            self._pool_cls, "emulation of set_index_k_bf16 (torch)", ".set_index_k_bf16"
        )
        self.paths["score_bf16"] = self._desc(self._bf16_score, "emulation (fp32)")
        self.paths["select"] = self._desc(self._topk, "torch.topk with topk_transform_paged semantics")
        self.paths["fp8_emul"] = f"torch emulation on {self.device} ({fp8_sem}), control arm"
        self._fp4_store = U.import_attr(
            "sglang.kernels.ops.attention.dsv4.fp4_indexer", "store_fp4_index_k_cache"
        )
        self.paths["store_fp4"] = self._desc(
            self._fp4_store, "emulation of set_index_fp4 (torch)", "(rne=False)"
        )
        for step in ("q_fp4", "score_fp4", "reference"):
            self.paths[step] = self.emul.paths[step]

    @staticmethod
    def _desc(got: U.Loaded, fallback: str, suffix: str = "") -> str:
        if isinstance(got, U.Found):
            return got.name + suffix
        return f"{fallback} -- FALLBACK: {got.reason}"

    def _pick_fp8_scorer(self) -> tuple[U.Loaded, str]:
        choice = self.fp8_scorer_choice
        if choice not in FP8_SCORERS:
            raise ValueError(f"--fp8-scorer must be one of {FP8_SCORERS}")
        if choice == "emulation":
            self.paths["score_fp8"] = "emulation (fp8-fp32acc, DeepGEMM semantics) on GPU"
            return U.Missing("emulation requested"), "fp8-fp32acc"
        role = self.roles["scorer"] if choice == "auto" else CHOICE_ROLE[choice]
        got = load_scorer(role)
        sem = "fp8-torch" if role in TORCH_SEMANTICS else "fp8-fp32acc"
        if isinstance(got, U.Missing) and choice == "auto":
            twin = U.load("score_twin")
            if isinstance(twin, U.Found):
                got, sem = (
                    U.Found(twin.obj, f"{twin.name} (the profile's {role} did not load: {got.reason})"),
                    "fp8-fp32acc",
                )
        self.paths["score_fp8"] = self._desc(got, "emulation (fp8-fp32acc)")
        return got, sem

    def _probe_fp8_store(self) -> None:
        """Production's fused path quantizes from fp32 registers; use fp32 input to the store if the
        kernel instantiates for it, else bf16 (and the emulation control follows)."""
        if isinstance(self._fp8_store, U.Missing):
            self.paths["store_fp8"] = self._desc(self._fp8_store, "emulation of fused_store_cache (torch)")
            return
        pool = F.new_pool("fp8", 1, self.device)
        keys = torch.randn(F.PAGE_SLOTS, F.HEAD_DIM, device=self.device)
        slots = torch.arange(F.PAGE_SLOTS, device=self.device)
        errors: list[str] = []
        for dtype in (torch.float32, torch.bfloat16):
            try:
                self._fp8_store.obj(
                    input=keys.to(dtype), cache=pool, indices=slots, page_size=F.PAGE_SLOTS, type="indexer"
                )
                torch.cuda.synchronize(self.device)
                self.fp8_input_dtype = dtype
                self.paths["store_fp8"] = f"{self._fp8_store.name}(type='indexer', input {dtype})"
                if errors:
                    self.paths["store_fp8"] += f" -- fp32 input rejected: {errors[0]}"
                return
            except BaseException as exc:  # noqa: BLE001
                errors.append(U.short_error(exc))
        self._fp8_store = U.Missing("; ".join(errors))
        self.paths["store_fp8"] = self._desc(self._fp8_store, "emulation of fused_store_cache (torch)")

    # -- pools --------------------------------------------------------------------------------------
    def new_pool(self, fmt: str, num_pages: int) -> torch.Tensor:
        if fmt == "bf16" and isinstance(self._pool_cls, U.Found):
            try:
                pool = self._pool_cls.obj(
                    size=(num_pages - 1) * F.PAGE_SLOTS,
                    page_size=F.PAGE_SLOTS,
                    dtype=torch.bfloat16,
                    index_head_dim=F.HEAD_DIM,
                    layer_num=1,
                    device=str(self.device),
                    enable_memory_saver=False,
                    use_fp4_indexer=False,
                    index_k_format="bf16",
                )
                view = pool.get_index_k_bf16_buffer(0)
                buf = view.reshape(view.shape[0], -1).view(torch.uint8)
                if buf.shape[0] < num_pages or buf.shape[1] != F.page_bytes("bf16"):
                    raise RuntimeError(f"pool buffer {tuple(buf.shape)} for {num_pages} pages")
                buf = buf[:num_pages]
                self._pools[buf.data_ptr()] = pool
                return buf
            except BaseException as exc:  # noqa: BLE001
                self._pool_cls = U.Missing(f"constructing DeepSeekV4IndexerPool failed: {U.short_error(exc)}")
                self.paths["store_bf16"] = self._desc(self._pool_cls, "emulation of set_index_k_bf16 (torch)")
        return F.new_pool(fmt, num_pages, self.device)

    def _store(self, fmt: str, pool: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
        slots = slots.long().contiguous()
        if fmt == "fp8" and isinstance(self._fp8_store, U.Found):
            self._fp8_store.obj(
                input=keys.to(self.fp8_input_dtype).contiguous(),
                cache=pool,
                indices=slots,
                page_size=F.PAGE_SLOTS,
                type="indexer",
            )
        elif fmt == "fp4" and isinstance(self._fp4_store, U.Found):
            self._fp4_store.obj(keys.float().contiguous(), pool, slots, page_size=F.PAGE_SLOTS, rne=False)
        elif fmt == "bf16" and pool.data_ptr() in self._pools:
            self._pools[pool.data_ptr()].set_index_k_bf16(0, slots, keys.float().contiguous())
        else:
            self.emul._store(fmt, pool, slots, keys)

    # -- q ------------------------------------------------------------------------------------------
    def _quantize_q(self, qi: QueryInputs) -> tuple[torch.Tensor, torch.Tensor]:
        if (
            isinstance(self._q, U.Found)
            and qi.q_pre is not None
            and qi.cos is not None
            and qi.sin is not None
        ):
            # One RoPE row per query, addressed by position = query index: the kernel reads
            # rope_cache[position], so a compact table replaces a 131K-row one.
            freqs = torch.complex(qi.cos.float(), qi.sin.float()).contiguous()
            positions = torch.arange(qi.q_pre.shape[0], device=self.device, dtype=torch.int64)
            assert qi.w_raw is not None, "a q before RoPE comes with its head weights"
            q8, w = self._q.obj(
                qi.q_pre.contiguous(), qi.w_raw.contiguous(), float(qi.weight_scale), freqs, positions
            )
            return q8, w.view(w.shape[0], -1).float()
        return self.emul._quantize_q(qi)

    # -- score --------------------------------------------------------------------------------------
    def _score(self, fmt, pool, q_fp8, w, q_index, seq_lens, page_table) -> torch.Tensor:
        if fmt == "f32" or q_fp8.dtype != torch.float8_e4m3fn:
            # emulated formats and the bf16-q arm: no production kernel exists for them
            return self.emul._score(fmt, pool, q_fp8, w, q_index, seq_lens, page_table)
        scorer = self._bf16_score if fmt == "bf16" else self._fp8_score
        if isinstance(scorer, U.Missing):
            return self.emul._score(fmt, pool, q_fp8, w, q_index, seq_lens, page_table)
        return call_paged_scorer(scorer, fmt, pool, q_fp8[q_index], w[q_index], seq_lens, page_table)

    # -- select -------------------------------------------------------------------------------------
    def _select(self, logits, seq_lens, page_table, topk) -> torch.Tensor:
        if isinstance(self._topk, U.Missing):
            return torch_select(logits, seq_lens, topk)
        b = logits.shape[0]
        seq = seq_lens.to(torch.int32).contiguous()
        pt = page_table.to(torch.int32).contiguous()
        out_page = torch.empty(b, topk, dtype=torch.int32, device=self.device)
        out_raw = torch.empty(b, topk, dtype=torch.int32, device=self.device)
        if self._topk_role == "topk_v2":
            assert isinstance(self._topk_plan, U.Found), self._topk_plan
            plan = self._topk_plan.obj(seq)
            self._topk.obj(logits.float().contiguous(), seq, pt, out_page, F.PAGE_SLOTS, plan, out_raw)
        else:
            self._topk.obj(logits.float().contiguous(), seq, pt, out_page, F.PAGE_SLOTS, out_raw)
        raw = out_raw.long()
        if torch.cuda.is_current_stream_capturing():
            return raw  # no host sync inside a graph capture
        # The kernel also translates positions to pool slots; count any disagreement with the
        # page table (a translation bug selects the right score but reads the wrong key).
        want = row_slots(pt).gather(1, raw.clamp(min=0))
        bad = ((want != out_page.long()) & (raw >= 0)).sum().item()
        self.stats["topk_translation_mismatch"] = self.stats.get("topk_translation_mismatch", 0) + int(bad)
        return raw


def call_paged_scorer(
    scorer: U.Found,
    fmt: str,
    pool: torch.Tensor,
    q_rows: torch.Tensor,
    w_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
) -> torch.Tensor:
    """Call a paged-logits kernel with DeepGEMM's signature the way the indexer does.

    ``pool`` is the 2-D uint8 buffer; each kernel gets the 4-D view it asserts on
    (``[pages, 64, 1, 132]`` uint8 for fp8, ``[pages, 64, 1, 128]`` bf16 for bf16). q is
    ``[rows, 1, H, 128]``; upstream's torch fallback wants 1-D ``seq_lens`` and
    ``clean_logits=False``, DeepGEMM ``[rows, 1]`` and its schedule metadata.
    """
    q4 = q_rows.unsqueeze(1).contiguous()
    w = w_rows.float().contiguous()
    seq = seq_lens.to(torch.int32).contiguous()
    pt = page_table.to(torch.int32).contiguous()
    max_len = pt.shape[1] * F.PAGE_SLOTS
    pages = pool.shape[0]
    if fmt == "bf16":
        kv = pool.view(torch.bfloat16).view(pages, F.PAGE_SLOTS, 1, F.HEAD_DIM)
        return scorer.obj(q4, kv, w, seq, pt, None, max_len, True).float()
    kv = pool.view(pages, F.PAGE_SLOTS, 1, F.FP8_SLOT_BYTES)
    if scorer.name.startswith("deep_gemm"):
        return scorer.obj(q4, kv, w, seq.unsqueeze(-1), pt, deepgemm_metadata(seq), max_len, False).float()
    # upstream's TileLang and torch scorers take 1-D lengths (the indexer keeps them so for them)
    return scorer.obj(q4, kv, w, seq, pt, None, max_len, False).float()


def load_scorer(role: str) -> U.Loaded:
    """The fp8 scorer of a platform role, as it can run on this machine: DeepGEMM's when a working
    one imports, else the Triton fp8 twin standing in for it (named); TileLang's with sm_120's
    lowering when this GPU is not an sm_120."""
    if role == "score_deepgemm":
        try:
            import deep_gemm

            if not (getattr(deep_gemm, "IS_STUB", False) or getattr(deep_gemm, "IS_BF16K_STAND_IN", False)):
                return U.Found(deep_gemm.fp8_paged_mqa_logits, "deep_gemm.fp8_paged_mqa_logits")
        except Exception:  # noqa: BLE001, S110 -- absent or broken: the twin stands in
            pass
        twin = U.load("score_twin")
        if isinstance(twin, U.Missing):
            return twin
        return U.Found(
            twin.obj,
            f"{twin.name} standing in for deep_gemm.fp8_paged_mqa_logits (DeepGEMM does not run here)",
        )
    got = U.load(role)
    if role == "score_tilelang" and isinstance(got, U.Found) and P.local_profile() != "sm120":
        got = U.Found(got.obj, f"{got.name} [{P.force_mma_sync_lowering()}]")
    return got


def deepgemm_metadata(seq: torch.Tensor) -> torch.Tensor:
    """Schedule metadata from upstream's own JIT kernel (1-D lengths), else DeepGEMM's."""
    got = U.paged_metadata()
    sms = torch.cuda.get_device_properties(seq.device).multi_processor_count
    if isinstance(got, U.Found):
        return got.obj(seq, F.PAGE_SLOTS, sms)
    import deep_gemm

    return deep_gemm.get_paged_mqa_logits_metadata(seq.unsqueeze(-1), F.PAGE_SLOTS, sms)


def make_gpu_backend(
    faults: tuple[str, ...] = (), fp8_scorer: str = "auto", device: str | None = None, platform: str = "auto"
) -> GpuBackend:
    dev = torch.device(device or "cuda")
    return GpuBackend(device=dev, faults=faults, fp8_scorer_choice=fp8_scorer, platform=platform)
