"""Tier 2's and the diagnosis's handles on the (patched) upstream SGLang pieces they run.

Every function is loaded through :mod:`verify.platform` (``load(role)``), the one place that says
how a production function is found and what stands in when it cannot load; each loader here
returns ``Found(obj, name)`` or ``Missing(reason)`` so callers can fall back and record why.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from verify import platform as P
from verify.platform import Found, Loaded, Missing, import_attr, sglang_root, short_error

__all__ = ["Found", "Loaded", "Missing", "import_attr", "sglang_root", "short_error"]

_short = short_error


def sglang_version() -> str:
    root = sglang_root()
    if root is None:
        return "not importable"
    ver = root / "version.py"
    if ver.exists():
        for line in ver.read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'") + f" ({root})"
    return f"unknown ({root})"


def fp8_store() -> Loaded:
    """upstream's index-K fp8 store (JIT ``store.cuh``)."""
    return P.load("store_fp8")


def fused_norm_rope_store() -> Loaded:
    """The fused compressor tail (norm, RoPE, Hadamard, fp8 store): production's default writer."""
    got = P.load("compress_store")
    if isinstance(got, Missing):
        return got
    plan = import_attr("sglang.kernels.ops.attention.dsv4.compress", "CompressorDecodePlan")
    if isinstance(plan, Missing):
        return plan
    return Found((got.obj, plan.obj), got.name)


def q_kernel() -> Loaded:
    return P.load("q")


def topk_paged() -> Loaded:
    return P.load("topk_v1")


def bf16_scorer() -> Loaded:
    """Patch 4's Triton kernel."""
    return P.load("score_bf16")


def bf16_pool_cls() -> Loaded:
    """Patch 1's pool class, checked for the agreed bf16 interface."""
    got = import_attr("sglang.srt.mem_cache.deepseek_v4_memory_pool", "DeepSeekV4IndexerPool")
    if isinstance(got, Missing):
        return got
    cls = got.obj
    params = inspect.signature(cls.__init__).parameters
    if "index_k_format" not in params or not hasattr(cls, "set_index_k_bf16"):
        return Missing("DeepSeekV4IndexerPool has no index_k_format / set_index_k_bf16 (patch 1 not applied)")
    return got


def fp8_torch_scorer(root: Path | None = None) -> Loaded:
    """upstream's ``fp8_paged_mqa_logits_torch`` (``srt/layers/attention/dsv4/indexer.py``); with
    ``root`` (a ``.../python/sglang`` directory), compiled from that tree's source."""
    if root is not None:
        return P.indexer_function_from_tree("fp8_paged_mqa_logits_torch", root)
    return P.load("score_torch")


TWIN = P.FUNCTIONS["score_twin"]


def fp8_triton_twin() -> Loaded:
    """The Triton fp8 twin of the bf16 kernel that the read bench uses (DeepGEMM's signature and
    math: fp8 x fp8 dots, fp32 sums, times each key's scale; -inf past the row's length)."""
    return P.load("score_twin")


def paged_metadata() -> Loaded:
    return P.load("metadata_jit")
