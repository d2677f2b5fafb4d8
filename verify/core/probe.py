"""Which function upstream's C4 indexer calls on each platform: the dispatch probe.

Under a profile (:func:`verify.core.platform.applied`: upstream's own hook and platform facts),
this builds the real pool, attention backend and ``C4Indexer`` (:class:`~verify.core.rig.Rig`),
builds the indexer metadata with the backend's own ``init_forward_metadata_indexer``, and runs
``forward_c4_indexer`` for a decode batch and a long single-request prefill with every candidate
function spied on (:class:`~verify.core.stand_ins.Spies` in probe mode: no kernel runs, each
spy answers an empty result). What it records is upstream's choice, not a copy of it: the scorer,
the top-k, whether DeepGEMM metadata (and row chunking) was built, the shape of the lengths the
scorer got, and whether the non-paged gather path was taken. Runs on a CPU.
"""

from __future__ import annotations

import sys
import types
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from verify.core import platform as P
from verify.core import upstream as U

from .rig import INDEX_HEAD_DIM, INDEX_HEADS, INDEX_TOPK, Rig, RigConfig
from .stand_ins import SCORERS, TOPKS, Spies, install_deep_gemm_stand_in, roles_called

TILELANG_MODULE = "sglang.kernels.ops.attention.dsa.tilelang_kernel"


@dataclass
class Dispatch:
    profile: str
    flag: bool
    mode: str
    scorer: list[str]
    topk: list[str]
    metadata: str
    seq_lens_dim: int | None
    clean_logits: bool | None
    nonpaged_gather: bool
    replaced: list[str] = field(default_factory=list)


def _metadata_kind(im: Any) -> str:
    dg = im.deep_gemm_metadata
    if dg is None:
        # bf16 plans its row chunks from the logits budget without a schedule (on a CPU there is no
        # budget: the metadata reads it from a CUDA device)
        if getattr(im, "rows_per_chunk", None):
            return f"none (no DeepGEMM schedule; row-chunked by the logits budget, {im.rows_per_chunk} rows a chunk)"
        return "none (no DeepGEMM schedule, no row chunking)"
    if isinstance(dg, list):
        return f"DeepGEMM schedule, row-chunked ({len(dg)} chunks of {im.rows_per_chunk} rows)"
    return "DeepGEMM schedule (one chunk)"


def _tilelang_placeholder() -> str | None:
    """Without TileLang installed, upstream's module cannot import; give the probe a module of
    that name whose one function the spies wrap, so the *selection* can be observed."""
    if TILELANG_MODULE in sys.modules or U.module_available("tilelang"):
        return None
    mod = types.ModuleType(TILELANG_MODULE)

    def tilelang_fp8_paged_mqa_logits(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("TileLang is not installed here (dispatch probe placeholder)")

    mod.__dict__["tilelang_fp8_paged_mqa_logits"] = tilelang_fp8_paged_mqa_logits
    sys.modules[TILELANG_MODULE] = mod
    return f"{TILELANG_MODULE}: placeholder module (TileLang not installed; the probe only observes its selection)"


def probe_call(
    rig: Rig, spies: Spies, seq_lens: list[int], mode: str, batch_size: int
) -> tuple[Any, list[Any]]:
    """One ``forward_c4_indexer`` over rows of ``seq_lens`` compressed keys, skip_compressor."""
    from sglang.srt.layers.attention.dsv4 import indexer as indexer_mod
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    dev = rig.device
    rows = len(seq_lens)
    pages = -(-max(seq_lens) // 64)
    page_table = torch.arange(1, rows * pages + 1, dtype=torch.int32, device=dev).view(rows, pages)
    core = SimpleNamespace(
        page_table=page_table, c4_topk_lengths_raw=torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    )
    im = rig.backend.init_forward_metadata_indexer(core)
    rig.backend.forward_metadata = SimpleNamespace(
        indexer_metadata=im,
        core_metadata=SimpleNamespace(
            positions=torch.arange(rows, device=dev),
            c4_sparse_page_indices=torch.full((rows, INDEX_TOPK), -1, dtype=torch.int32, device=dev),
            c4_sparse_raw_indices=None,
        ),
    )
    indexer = rig.indexer
    q = torch.zeros(rows, INDEX_HEADS, INDEX_HEAD_DIM, device=dev).to(torch.float8_e4m3fn)
    indexer.compute_weights = lambda x, skip_scale=False: torch.ones(rows, INDEX_HEADS, device=dev)
    indexer.compute_q = lambda q_lora, positions, w: (q, w.unsqueeze(-1))
    fm = ForwardMode.EXTEND if mode == "extend" else ForwardMode.DECODE
    fb = SimpleNamespace(
        forward_mode=fm,
        _original_forward_mode=None,
        tbo_parent_token_range=None,
        batch_size=batch_size,
        seq_lens=None,
        seq_lens_cpu=None,
        extend_seq_lens_cpu=None,
        extend_seq_lens=None,
        extend_start_loc=None,
        extend_num_tokens=rows,
    )
    if mode == "extend":
        # what _get_nonpaged_indexer_plan reads for a single-request prefill of `rows` tokens
        fb.seq_lens = torch.tensor([4 * max(seq_lens)], dtype=torch.int32, device=dev)
        fb.seq_lens_cpu = [4 * max(seq_lens)]
        fb.extend_seq_lens_cpu = [rows]
        fb.extend_seq_lens = torch.tensor([rows], dtype=torch.int32, device=dev)
        fb.extend_start_loc = torch.zeros(1, dtype=torch.int32, device=dev)
    spies.take()
    indexer_mod.C4IndexerBackendMixin.forward_c4_indexer(
        rig.backend,
        x=torch.zeros(rows, 8, device=dev),
        q_lora=torch.zeros(rows, 8, device=dev),
        c4_indexer=indexer,
        forward_batch=fb,
        skip_compressor=True,
    )
    return im, spies.take()


def probe(profile: str, flag: bool) -> list[Dispatch]:
    """Upstream's selections on ``profile`` with the series flag ``flag``: decode and prefill."""
    out: list[Dispatch] = []
    with P.applied(profile) as applied:
        replaced = list(applied.replaced)
        placeholder = _tilelang_placeholder()
        if placeholder:
            replaced.append(placeholder)
        stand_in = install_deep_gemm_stand_in()
        if stand_in:
            replaced.append(stand_in)
        from sglang.srt.layers.attention.dsv4 import indexer as indexer_mod

        saved_is_cuda = indexer_mod.is_cuda
        cuda_fact = bool(applied.facts["is_cuda"])
        indexer_mod.is_cuda = lambda: cuda_fact
        replaced.append(
            f"indexer.is_cuda -> {cuda_fact} (the profile's fact; upstream asks the device directly)"
        )
        saved_capturing = torch.cuda.is_current_stream_capturing
        if not torch.cuda.is_available():
            torch.cuda.is_current_stream_capturing = lambda: False
            replaced.append(
                "torch.cuda.is_current_stream_capturing -> False (no CUDA device; nothing is captured)"
            )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        rig = Rig(
            RigConfig(device=device, flag=flag, max_reqs=4, full_tokens=1 << 16, max_context_len=1 << 15),
            tuple(applied.facts["device_capability"]),
        )
        spies = Spies(probe=True).install(rig.backend)
        try:
            for mode, lens, bs in (
                ("decode", [700, 300, 4100], 3),
                ("extend", [(i + 1) // 4 for i in range(9000)], 1),
            ):
                im, calls = probe_call(rig, spies, lens, mode, bs)
                scorer_calls = [c for c in calls if c.role in SCORERS]
                out.append(
                    Dispatch(
                        profile=applied.name,
                        flag=flag,
                        mode=f"{mode} ({len(lens)} rows)",
                        scorer=roles_called(scorer_calls),
                        topk=roles_called([c for c in calls if c.role in TOPKS]),
                        metadata=_metadata_kind(im),
                        seq_lens_dim=scorer_calls[0].seq_lens_dim if scorer_calls else None,
                        clean_logits=scorer_calls[0].clean_logits if scorer_calls else None,
                        nonpaged_gather=any(c.role == "gather_nonpaged" for c in calls),
                        replaced=replaced
                        + rig.replaced
                        + [
                            "every candidate scorer / top-k / metadata kernel: a spy that records the call and answers an empty result (no kernel runs in the probe)"
                        ],
                    )
                )
        finally:
            spies.uninstall()
            rig.close()
            indexer_mod.is_cuda = saved_is_cuda
            torch.cuda.is_current_stream_capturing = saved_capturing
    return out


def table(rows: list[Dispatch]) -> str:
    lines = [
        "| profile | flag | call | scorer | top-k | metadata | lengths | gather |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in rows:
        lines.append(
            f"| {d.profile} | {'bf16' if d.flag else 'fp8'} | {d.mode} | {', '.join(d.scorer) or '-'} | "
            f"{', '.join(d.topk) or '-'} | {d.metadata} | {d.seq_lens_dim}-D | {'yes' if d.nonpaged_gather else 'no'} |"
        )
    return "\n".join(lines)


def as_dicts(rows: list[Dispatch]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


_ROLES: dict[str, dict[str, str]] = {}


def profile_roles(profile: str) -> dict[str, str]:
    """The fp8 (flag-off) decode path upstream picks on ``profile``: ``{"scorer", "topk",
    "metadata"}`` roles, read off the dispatch probe (cached per process)."""
    if profile not in _ROLES:
        decode = next(d for d in probe(profile, False) if d.mode.startswith("decode"))
        _ROLES[profile] = {
            "scorer": decode.scorer[0] if decode.scorer else "none",
            "topk": decode.topk[0] if decode.topk else "none",
            "metadata": decode.metadata,
        }
    return dict(_ROLES[profile])
