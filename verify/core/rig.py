"""The C4 indexer as the server builds it: upstream's pool, attention backend, indexer module and
forward batches, on one device, for the forward tier and the dispatch probe.

Upstream objects, built by upstream's own code: ``DeepSeekV4TokenToKVPool`` (sized like the pool
configurator sizes it), ``ReqToTokenPool``, the DeepSeek-V4 attention backend from
``ATTENTION_BACKENDS['dsv4']`` (the class the model runner creates), ``C4Indexer`` with a
DeepSeek-V4-Flash-shaped config (64 index heads x 128, RoPE 64, top-k 512; a small hidden size)
whose weights go in through the module's own weight loaders, ``ForwardBatch``. The model-runner
stand-in is upstream's own test scaffold (``MockDSV4ModelRunner`` from
``sglang.test.kits.attention_unittest``), with its pools replaced by pools sized for long
requests. Token placement is page-granular as the allocator's: every request owns whole
256-token pages, drawn shuffled from one free list, so requests interleave in the pool and later
requests reuse pages a finished one left behind.

Replacements (each named in the results, see :attr:`Rig.replaced`):
- FlashMLA's scheduling metadata for the sparse attention *after* the top-k (not under test):
  ``None``, which is what upstream itself builds on sm_120;
- on a machine without CUDA, ``torch.cuda.get_device_capability`` answers the profile's
  capability so the backend constructs (V4.1 helpers ask it), and the JIT-only steps
  (compressor, q kernel, JIT top-k) are not run: keys are written by the reference, q by its
  exact emulation, and the top-k is upstream's torch backend.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

PAGE_TOKENS = 256  # DeepSeek-V4's page: 256 tokens, 64 compressed keys
RATIO = 4
SLOTS_PER_PAGE = PAGE_TOKENS // RATIO
INDEX_HEADS = 64
INDEX_HEAD_DIM = 128
ROPE_DIM = 64
INDEX_TOPK = 512
LAYER_ID = 0

# DeepSeek-V4-Flash's compressed-layer RoPE (YaRN): what its C4 layers use.
ROPE = {"base": 160000, "factor": 16.0, "original_seq_len": 65536, "beta_fast": 32, "beta_slow": 1}


@dataclass
class RigConfig:
    device: str = "cuda"
    flag: bool = True  # --deepseek-v4-indexer-k-dtype bf16 (off: the option unset, upstream's fp8)
    max_reqs: int = 8
    full_tokens: int = 1 << 18  # pool capacity in tokens
    max_context_len: int = 1 << 17
    hidden_size: int = 256
    q_lora_rank: int = 256
    draft_tokens: int = 0  # MTP target-verify rows per request (0: no speculation)
    topk_backend: str = "sgl-kernel"  # upstream's --dsa-topk-backend
    seed: int = 1234  # the model (weights) and the tokens
    page_seed: int | None = None  # the page assignment (default: seed); a PD receiver differs only here


@dataclass
class Weights:
    """The indexer's parameters in fp32, as a checkpoint holds them (the reference reads these)."""

    wq_b: torch.Tensor  # [H*128, q_lora]
    weights_proj: torch.Tensor  # [H, hidden]
    wkv: torch.Tensor  # [2*128, hidden] (overlap half first)
    wgate: torch.Tensor  # [2*128, hidden]
    ape: torch.Tensor  # [4, 2*128] checkpoint layout
    norm: torch.Tensor  # [128]
    eps: float


@dataclass
class Request:
    rid: int  # req_pool index (1-based: row 0 is upstream's padding row)
    seed: int
    pages: list[int] = field(default_factory=list)
    length: int = 0  # tokens whose KV is in the pool


def make_weights(cfg: RigConfig, g: torch.Generator) -> Weights:
    h, d = cfg.hidden_size, INDEX_HEAD_DIM

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        # rounded to bf16 once: the module stores bf16 weights, the reference upcasts them exactly
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).float()

    return Weights(
        wq_b=rnd(INDEX_HEADS * d, cfg.q_lora_rank, scale=cfg.q_lora_rank**-0.5),
        weights_proj=rnd(INDEX_HEADS, h, scale=h**-0.5),
        wkv=rnd(2 * d, h, scale=h**-0.5),
        wgate=rnd(2 * d, h, scale=h**-0.5),
        ape=torch.randn(RATIO, 2 * d, generator=g) * 0.5,
        norm=1.0 + 0.1 * torch.randn(d, generator=g),
        eps=1e-6,
    )


def batched_token_inputs(
    req: Request, start: int, stop: int, cfg: RigConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_inputs` for positions [start, stop), generated in blocks of 256 positions
    (one generator per block: long prompts would otherwise take a generator per token)."""
    xs, qs = [], []
    for block in range(start // 256, (stop - 1) // 256 + 1 if stop > start else start // 256):
        g = torch.Generator().manual_seed(req.seed * 1_000_003 + block)
        xb = torch.randn(256, cfg.hidden_size, generator=g)
        qb = torch.randn(256, cfg.q_lora_rank, generator=g)
        lo, hi = max(start, block * 256), min(stop, block * 256 + 256)
        xs.append(xb[lo - block * 256 : hi - block * 256])
        qs.append(qb[lo - block * 256 : hi - block * 256])
    if not xs:
        return torch.empty(0, cfg.hidden_size, dtype=torch.bfloat16), torch.empty(
            0, cfg.q_lora_rank, dtype=torch.bfloat16
        )
    return torch.cat(xs).to(torch.bfloat16), torch.cat(qs).to(torch.bfloat16)


@contextlib.contextmanager
def _cpu_capability(capability: tuple[int, int]) -> Iterator[list[str]]:
    """Without CUDA, answer the profile's capability to the code that asks torch directly."""
    replaced: list[str] = []
    if torch.cuda.is_available():
        yield replaced
        return
    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: capability
    replaced.append(
        f"torch.cuda.get_device_capability -> {capability} (no CUDA device: the backend asks it at construction)"
    )
    try:
        yield replaced
    finally:
        torch.cuda.get_device_capability = saved


class Rig:
    """One C4 indexer layer of a DeepSeek-V4 server: pool, backend, indexer, requests."""

    def __init__(self, cfg: RigConfig, capability: tuple[int, int]) -> None:
        from sglang.kernels.ops.attention.deepseek_v4_rope import precompute_freqs_cis
        from sglang.srt.layers.attention import deepseek_v4_backend
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.runtime_context import get_context
        from sglang.test.kits.attention_unittest.attention_methods import dsv4_attention as kit

        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.replaced: list[str] = []
        self._gen = torch.Generator().manual_seed(cfg.seed)
        self.weights = make_weights(cfg, self._gen)

        mode = ForwardMode.TARGET_VERIFY if cfg.draft_tokens else ForwardMode.DECODE
        case = kit.DSV4AttentionCase(
            name="bf16k-forward-tier",
            backend="dsv4",
            forward_mode=mode,
            num_heads=64,
            page_size=PAGE_TOKENS,
            prefix_lens=(PAGE_TOKENS,),
            extend_lens=(cfg.draft_tokens,) if cfg.draft_tokens else (),
        )
        model_config = kit.TinyDSV4ModelConfig(
            num_heads=64, context_len=cfg.max_context_len, compression_ratios=[RATIO]
        )
        self._capability_cm = _cpu_capability(capability)
        self.replaced += self._capability_cm.__enter__()
        runner = kit.MockDSV4ModelRunner(
            case=case,
            model_config=model_config,
            dtype=torch.bfloat16,
            device=cfg.device,
            max_context_len=PAGE_TOKENS,
            swa_size=PAGE_TOKENS * 2,
            compression_ratios=[RATIO],
        )
        # The scaffold publishes its server args; republish them with the series' index-K dtype and
        # the top-k backend under test (the scaffold knows neither).
        scaffold = runner._server_args_override
        scaffold.restore()
        fields = dict(scaffold._fields, dsa_topk_backend=cfg.topk_backend)
        if cfg.flag:
            fields["deepseek_v4_indexer_k_dtype"] = "bf16"
        self._server_args = get_context().override_server_args(**fields)
        runner.server_args = self._server_args.install()
        runner._server_args_override = self._server_args

        # Pools sized for long requests, as the pool configurator sizes them.
        full = cfg.full_tokens
        runner.req_to_token_pool = ReqToTokenPool(
            size=cfg.max_reqs,
            max_context_len=cfg.max_context_len,
            device=cfg.device,
            enable_memory_saver=False,
        )
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import resolve_compress_state_ring_size

        pool = DeepSeekV4TokenToKVPool(
            max_num_reqs=cfg.max_reqs,
            swa_size=full,
            c4_size=full // RATIO,
            c128_size=full // 128,
            c4_state_pool_size=full // PAGE_TOKENS * resolve_compress_state_ring_size(RATIO),
            c128_state_pool_size=cfg.max_reqs,
            page_size=PAGE_TOKENS,
            swa_page_size=PAGE_TOKENS,
            dtype=torch.float8_e4m3fn,
            c4_state_dtype=torch.float32,
            c128_state_dtype=torch.float32,
            qk_nope_head_dim=kit.DSV4_QK_NOPE_HEAD_DIM,
            qk_rope_head_dim=kit.DSV4_QK_ROPE_HEAD_DIM,
            indexer_head_dim=INDEX_HEAD_DIM,
            layer_num=1,
            device=cfg.device,
            enable_memory_saver=False,
            compression_ratios=[RATIO],
            kv_source_layers=[],
            full_size=full,
        )
        # Full locations map to themselves in the SWA pool (it is as large as the full pool).
        pool.register_mapping(torch.arange(full + PAGE_TOKENS, dtype=torch.int64, device=cfg.device))
        runner.token_to_kv_pool = pool
        self.runner = runner
        self.pool = pool

        # FlashMLA's metadata serves the attention after the top-k, which this tier does not run.
        self._saved_flashmla = deepseek_v4_backend._create_flashmla_metadata
        deepseek_v4_backend._create_flashmla_metadata = lambda: None
        self.replaced.append(
            "deepseek_v4_backend._create_flashmla_metadata -> None (FlashMLA schedule for the sparse "
            "attention after the top-k; not under test; upstream builds None on sm_120 too)"
        )
        self.backend = ATTENTION_BACKENDS["dsv4"](runner)

        self.freqs_cis = precompute_freqs_cis(
            dim=ROPE_DIM,
            seqlen=cfg.max_context_len + PAGE_TOKENS,
            original_seq_len=ROPE["original_seq_len"],
            base=ROPE["base"],
            factor=ROPE["factor"],
            beta_fast=ROPE["beta_fast"],
            beta_slow=ROPE["beta_slow"],
        ).to(self.device)
        self.indexer = self._make_indexer()
        num_pages = full // PAGE_TOKENS
        # Page 0 holds upstream's dummy/padding slots; requests never own it.
        pages_gen = torch.Generator().manual_seed(cfg.seed if cfg.page_seed is None else cfg.page_seed)
        perm = torch.randperm(num_pages - 1, generator=pages_gen) + 1
        self.free_pages: list[int] = perm.tolist()
        self.requests: dict[int, Request] = {}

    # -- construction -----------------------------------------------------------------------------
    def _make_indexer(self) -> Any:
        from types import SimpleNamespace

        from sglang.srt.layers.attention.dsv4.indexer import C4Indexer

        # The DeepSeekV4Config fields C4Indexer and its Compressor read.
        config = SimpleNamespace(
            hidden_size=self.cfg.hidden_size,
            index_n_heads=INDEX_HEADS,
            index_head_dim=INDEX_HEAD_DIM,
            qk_rope_head_dim=ROPE_DIM,
            index_topk=INDEX_TOPK,
            q_lora_rank=self.cfg.q_lora_rank,
            rms_norm_eps=self.weights.eps,
            compress_ratios=[RATIO],
        )
        indexer = C4Indexer(config, LAYER_ID, self.freqs_cis)
        w = self.weights
        with torch.no_grad():
            indexer.wq_b.weight.copy_(w.wq_b.to(torch.bfloat16))
            indexer.weights_proj.weight.copy_(w.weights_proj.to(torch.bfloat16))
            comp = indexer.compressor
            # A checkpoint's wkv and wgate arrive as one fused weight, kv rows first (the model's
            # loader concatenates them so); ape goes through the module's own loader hotfix.
            comp.wkv_gate.weight.copy_(torch.cat([w.wkv, w.wgate]).to(torch.bfloat16))
            comp.load_ape_weight(comp.ape, w.ape.clone())
            comp.norm.weight.copy_(w.norm)
        comp.norm.variance_epsilon = w.eps
        indexer.to(self.device)
        # The module keeps the table it was given on its own device.
        indexer.freqs_cis = self.freqs_cis
        indexer.compressor.freqs_cis = self.freqs_cis
        return indexer

    def close(self) -> None:
        from sglang.srt.layers.attention import deepseek_v4_backend

        deepseek_v4_backend._create_flashmla_metadata = self._saved_flashmla
        self._server_args.restore()
        self._capability_cm.__exit__(None, None, None)

    # -- requests ---------------------------------------------------------------------------------
    def new_request(self, seed: int) -> Request:
        rid = next(i for i in range(1, self.cfg.max_reqs + 1) if i not in self.requests)
        req = Request(rid=rid, seed=seed)
        self.requests[rid] = req
        return req

    def reserve(self, req: Request, total_tokens: int) -> None:
        """Give ``req`` pages (drawn from the shuffled free list) for ``total_tokens`` tokens and
        write its req_to_token row, as the allocator and scheduler would."""
        need = -(-total_tokens // PAGE_TOKENS) - len(req.pages)
        if need > len(self.free_pages):
            raise RuntimeError(f"pool too small: need {need} pages, {len(self.free_pages)} free")
        for _ in range(max(0, need)):
            req.pages.append(self.free_pages.pop(0))
        pages = torch.tensor(req.pages, dtype=torch.int64)
        pos = torch.arange(len(req.pages) * PAGE_TOKENS)
        locs = pages[pos // PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS
        row = self.runner.req_to_token_pool.req_to_token[req.rid]
        row[: locs.numel()] = locs.to(row.dtype).to(row.device)

    def finish(self, req: Request) -> None:
        """The request ends; its pages go back to the front of the free list, keys left in place."""
        self.free_pages = req.pages + self.free_pages
        del self.requests[req.rid]

    def locs(self, req: Request, start: int, stop: int) -> torch.Tensor:
        pages = torch.tensor(req.pages, dtype=torch.int64)
        pos = torch.arange(start, stop)
        return pages[pos // PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS

    def slot_of(self, req: Request, key_index: torch.Tensor) -> torch.Tensor:
        """Pool slot of the request's compressed key ``i`` (tokens 4i..4i+3)."""
        pages = torch.tensor(req.pages, dtype=torch.int64)
        return pages[key_index // SLOTS_PER_PAGE] * SLOTS_PER_PAGE + key_index % SLOTS_PER_PAGE

    # -- batches ----------------------------------------------------------------------------------
    def batch(self, reqs: list[Request], extend_lens: list[int], mode: str) -> Any:
        """A ForwardBatch over ``reqs``: each processes ``extend_lens[i]`` new tokens after its
        current length (decode: 1; target_verify: the draft count; extend: any)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        dev = self.device
        fm = {
            "decode": ForwardMode.DECODE,
            "extend": ForwardMode.EXTEND,
            "mixed": ForwardMode.MIXED,  # a prefill chunk and decoding requests in one batch
            "target_verify": ForwardMode.TARGET_VERIFY,
        }[mode]
        prefix = [r.length for r in reqs]
        seq = [p + n for p, n in zip(prefix, extend_lens)]
        for r, s in zip(reqs, seq):
            self.reserve(r, s)
        positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)])
        out_locs = torch.cat([self.locs(r, p, s) for r, p, s in zip(reqs, prefix, seq)])
        n = int(positions.numel())
        if mode == "target_verify":
            # The verify batch's seq_lens are the accepted lengths; the drafts come after them.
            seq_field = prefix
        else:
            seq_field = seq
        fb = ForwardBatch(
            forward_mode=fm,
            batch_size=len(reqs),
            input_ids=torch.zeros(n, dtype=torch.int64, device=dev),
            req_pool_indices=torch.tensor([r.rid for r in reqs], dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_field, dtype=torch.int32, device=dev),
            seq_lens_cpu=torch.tensor(seq_field, dtype=torch.int32),
            out_cache_loc=out_locs.to(dev),
            seq_lens_sum=sum(seq_field),
            positions=positions.to(dev),
        )
        if mode in ("extend", "mixed"):
            ext = torch.tensor(extend_lens, dtype=torch.int32, device=dev)
            fb.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=dev)
            fb.extend_prefix_lens_cpu = list(prefix)
            fb.extend_seq_lens = ext
            fb.extend_seq_lens_cpu = list(extend_lens)
            fb.extend_start_loc = torch.zeros_like(ext)
            if len(reqs) > 1:
                fb.extend_start_loc[1:] = torch.cumsum(ext[:-1], dim=0)
            fb.extend_num_tokens = n
        if mode == "target_verify":
            fb.spec_info = self._verify_input(fb, reqs, prefix)
        return fb

    def _verify_input(self, fb: Any, reqs: list[Request], prefix: list[int]) -> Any:
        """upstream's EAGLE verify input for a chain of ``draft_tokens`` drafts per request, with
        the fields upstream's own attention test kit fills (the DeepSeek-V4 backend reads
        ``draft_token`` and ``draft_token_num``)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        n, bs, dev = self.cfg.draft_tokens, len(reqs), self.device
        seq = [p + n for p in prefix]
        mask = torch.cat([torch.ones(n, s, dtype=torch.bool, device=dev).tril(s - n).flatten() for s in seq])
        index = torch.arange(bs * n, dtype=torch.long, device=dev).view(bs, n)
        return EagleVerifyInput(
            draft_token=fb.input_ids,
            custom_mask=mask,
            positions=fb.positions,
            retrieve_index=index,
            retrieve_next_token=torch.full_like(index, -1),
            retrieve_next_sibling=torch.full_like(index, -1),
            retrieve_cum_len=torch.arange(bs + 1, dtype=torch.int32, device=dev) * n,
            spec_steps=n - 1,
            topk=1,
            draft_token_num=n,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=fb.seq_lens_sum,
            seq_lens_cpu=fb.seq_lens_cpu,
        )

    def inputs(self, reqs: list[Request], extend_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, qs = [], []
        for r, n in zip(reqs, extend_lens):
            x, q = batched_token_inputs(r, r.length, r.length + n, self.cfg)
            xs.append(x)
            qs.append(q)
        return torch.cat(xs).to(self.device), torch.cat(qs).to(self.device)

    def commit(self, reqs: list[Request], extend_lens: list[int]) -> None:
        for r, n in zip(reqs, extend_lens):
            r.length += n


def ceil_pages(tokens: int) -> int:
    return math.ceil(tokens / PAGE_TOKENS)
