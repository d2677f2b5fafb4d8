"""Lazy access to the (patched) upstream SGLang pieces tier 2 and the diagnosis run.

Each loader imports the smallest module that holds its object and returns ``Found(obj, name)`` or
``Missing(reason)``: on the GPU machine ``sgl_kernel`` is absent, so the heavy modules (the indexer,
anything pulling ``srt/layers/layernorm.py``) fail to import; callers then fall back and record
the reason. Nothing here is imported by the CPU backend.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class Found:
    obj: Any
    name: str


@dataclass
class Missing:
    reason: str


Loaded = Found | Missing


def _short(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return " ".join(f"{type(exc).__name__}: {exc}{where}".split())[:300]


def _import_attr(module: str, attr: str) -> Loaded:
    try:
        mod = importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 -- any import failure means "use the fallback"
        return Missing(f"import {module} failed: {_short(exc)}")
    if not hasattr(mod, attr):
        return Missing(f"{module} has no {attr} (series patch missing?)")
    return Found(getattr(mod, attr), f"{module}.{attr}")


def sglang_root() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


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
    return _import_attr("sglang.kernels.ops.attention.dsv4.attn", "fused_store_cache")


def fused_norm_rope_store() -> Loaded:
    """The fused compressor tail (norm, RoPE, Hadamard, fp8 store): production's default writer."""
    got = _import_attr("sglang.kernels.ops.attention.dsv4.compress", "compress_norm_rope_store")
    if isinstance(got, Missing):
        return got
    plan = _import_attr("sglang.kernels.ops.attention.dsv4.compress", "CompressorDecodePlan")
    if isinstance(plan, Missing):
        return plan
    return Found((got.obj, plan.obj), got.name)


def q_kernel() -> Loaded:
    return _import_attr("sglang.kernels.ops.attention.dsv4.elementwise", "fused_q_indexer_rope_hadamard_quant")


def topk_paged() -> Loaded:
    return _import_attr("sglang.kernels.ops.attention.dsv4.topk", "topk_transform_paged")


def bf16_scorer() -> Loaded:
    """Patch 4's Triton kernel."""
    return _import_attr("sglang.kernels.ops.attention.dsv4.bf16_index_logits", "bf16_paged_mqa_logits")


def bf16_pool_cls() -> Loaded:
    """Patch 1's pool class, checked for the agreed bf16 interface."""
    got = _import_attr("sglang.srt.mem_cache.deepseek_v4_memory_pool", "DeepSeekV4IndexerPool")
    if isinstance(got, Missing):
        return got
    cls = got.obj
    params = inspect.signature(cls.__init__).parameters
    if "index_k_format" not in params or not hasattr(cls, "set_index_k_bf16"):
        return Missing("DeepSeekV4IndexerPool has no index_k_format / set_index_k_bf16 (patch 1 not applied)")
    return got


def _extract_function(path: Path, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """Compile one top-level function from an upstream source file, without importing its module.

    This runs upstream's own code (read from the installed tree at run time, nothing is copied
    into this repository) when its module cannot be imported for unrelated dependencies.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
    exec(code, namespace)  # noqa: S102 -- upstream source, by design
    return namespace[name]


def fp8_torch_scorer(root: Path | None = None) -> Loaded:
    """upstream's ``fp8_paged_mqa_logits_torch`` (``srt/layers/attention/dsv4/indexer.py``);
    with ``root`` (a ``.../python/sglang`` directory), compiled from that tree's source."""
    name = "fp8_paged_mqa_logits_torch"
    got: Loaded = Missing("source tree given") if root is not None else _import_attr("sglang.srt.layers.attention.dsv4.indexer", name)
    if isinstance(got, Found):
        return got
    root = root or sglang_root()
    if root is None:
        return got
    path = root / "srt/layers/attention/dsv4/indexer.py"
    try:
        ns: dict[str, Any] = {
            "torch": torch,
            "F": torch.nn.functional,
            "Any": Any,
            # the module picks fnuz only on gfx942 ROCm; every CUDA device uses e4m3fn
            "FP8_DTYPE": torch.float8_e4m3fn,
            "_arange_cache": {},
        }
        fn = _extract_function(path, name, ns)
    except BaseException as exc:  # noqa: BLE001
        return Missing(f"{got.reason}; AST extraction failed: {_short(exc)}")
    return Found(fn, f"{path.relative_to(root.parent)}::{name} (compiled from source; module import failed: {got.reason})")


TWIN = ("verify.bench.fp8_twin", "fp8_paged_mqa_logits_twin")


def fp8_triton_twin() -> Loaded:
    """The Triton fp8 twin of the bf16 kernel that the read bench uses (DeepGEMM's signature and
    math: fp8 x fp8 dots, fp32 sums, times each key's scale; -inf past the row's length)."""
    return _import_attr(*TWIN)


def paged_metadata() -> Loaded:
    return _import_attr("sglang.kernels.ops.attention.dsv4.attn", "get_paged_mqa_logits_metadata")
