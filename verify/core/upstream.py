"""The one loader of upstream's (patched) functions: every tier takes them from here.

:data:`FUNCTIONS` names, by role, every production function the C4 indexer path can call and
where upstream defines it; the forward tier's spies (:mod:`verify.core.stand_ins`) wrap the same
roles where ``forward_c4_indexer`` looks them up. :func:`load` imports a role from the tree on
``sys.path`` and returns :class:`Found` or :class:`Missing` (why not), so a caller can fall back
and record why; where upstream's package import chain fails on a machine (the GPU machine has no
``sgl_kernel``), :func:`load_module` and the torch scorers reach the same code from its source
files. Which role a platform runs is :mod:`verify.core.platform`'s question, not this module's.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# The repository checkout holding verify/ (a worker under another tree imports verify from it).
CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass
class Found:
    obj: Any
    name: str


@dataclass
class Missing:
    reason: str


Loaded = Found | Missing


class UpstreamMissing(RuntimeError):
    """The patched upstream (or the piece asked for) is not on ``sys.path``."""


def short_error(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return " ".join(f"{type(exc).__name__}: {exc}{where}".split())[:300]


def import_attr(module: str, attr: str) -> Loaded:
    """``module.attr`` from the tree on sys.path, or why not."""
    try:
        mod = importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 -- any import failure is reported, not raised
        return Missing(f"import {module} failed: {short_error(exc)}")
    if not hasattr(mod, attr):
        return Missing(f"{module} has no {attr} (series patch missing?)")
    return Found(getattr(mod, attr), f"{module}.{attr}")


@dataclass(frozen=True)
class Function:
    """Where a role's production function lives, and where the indexer's forward calls it from."""

    module: str
    attr: str
    # the module whose global the forward looks the function up in at call time, when it is not
    # the defining one: the spies must replace the name there
    called_from: str | None = None
    spied: bool = True  # False: not called by forward_c4_indexer (a store, the q kernel, the twin)

    @property
    def spy_site(self) -> tuple[str, str]:
        return (self.called_from or self.module, self.attr)


_INDEXER = "sglang.srt.layers.attention.dsv4.indexer"
_DSV4_OPS = "sglang.kernels.ops.attention.dsv4"

# Every production function the C4 indexer path can call, by role. The tiers ask for a role; the
# dispatch probe (verify.core.probe) spies on the spied ones where the forward calls them.
FUNCTIONS: dict[str, Function] = {
    "q": Function(f"{_DSV4_OPS}.elementwise", "fused_q_indexer_rope_hadamard_quant", spied=False),
    "store_fp8": Function(f"{_DSV4_OPS}.attn", "fused_store_cache", spied=False),
    "compress": Function(f"{_DSV4_OPS}.compress", "compress_forward", spied=False),
    "compress_store": Function(f"{_DSV4_OPS}.compress", "compress_norm_rope_store", spied=False),
    "score_bf16": Function(f"{_DSV4_OPS}.bf16_index_logits", "bf16_paged_mqa_logits"),
    # one request's long prefill, where upstream's fp8 path gathers its keys for fp8_mqa_logits
    "score_bf16_prefill": Function(f"{_DSV4_OPS}.bf16_mqa_logits", "bf16_mqa_logits"),
    "score_tilelang": Function(
        "sglang.kernels.ops.attention.dsa.tilelang_kernel", "tilelang_fp8_paged_mqa_logits"
    ),
    "score_torch": Function(_INDEXER, "fp8_paged_mqa_logits_torch"),
    "score_torch_sm120": Function(_INDEXER, "fp8_paged_mqa_logits_torch_sm120"),
    "score_aiter": Function(_INDEXER, "_aiter_fp8_paged_mqa_logits"),
    "score_deepgemm": Function("deep_gemm", "fp8_paged_mqa_logits"),
    "score_deepgemm_nonpaged": Function("deep_gemm", "fp8_mqa_logits"),
    "score_twin": Function("verify.core.fp8_twin", "fp8_paged_mqa_logits_twin", spied=False),
    "topk_v1": Function(f"{_DSV4_OPS}.topk", "topk_transform_paged", called_from=_INDEXER),
    "topk_v2": Function(_DSV4_OPS, "topk_transform_paged_v2", called_from=_INDEXER),
    "topk_torch": Function(_INDEXER, "topk_transform_pytorch_vectorized"),
    "metadata_jit": Function(f"{_DSV4_OPS}.attn", "get_paged_mqa_logits_metadata", called_from=_DSV4_OPS),
    "metadata_topk_v2_plan": Function(_DSV4_OPS, "plan_topk_v2"),
    "metadata_deepgemm": Function("deep_gemm", "get_paged_mqa_logits_metadata"),
}


def spied_roles() -> dict[str, tuple[str, str]]:
    """role -> (module, attribute) where ``forward_c4_indexer`` looks each spied function up."""
    return {role: fn.spy_site for role, fn in FUNCTIONS.items() if fn.spied}


def load(role: str) -> Loaded:
    """The production function for ``role`` (see :data:`FUNCTIONS`), imported from the tree on
    sys.path; the torch scorers fall back to their own source text when the indexer module does
    not import (the GPU machine has no ``sgl_kernel``)."""
    fn = FUNCTIONS[role]
    got = import_attr(fn.module, fn.attr)
    if isinstance(got, Missing) and fn.module == _INDEXER:
        return _indexer_function_from_source(fn.attr, f"module import failed: {got.reason}")
    return got


def load_module(role: str) -> tuple[ModuleType, str]:
    """The module holding ``role``'s function (see :data:`FUNCTIONS`) and how it was reached: by
    package import, else -- for a self-contained module such as patch 4's kernel (torch + triton
    only) -- loaded as a standalone file from the tree on sys.path, since sglang's ``__init__``
    chain fails on machines without ``sgl_kernel``. Raises :class:`UpstreamMissing` when neither
    route works."""
    module = FUNCTIONS[role].module
    try:
        return importlib.import_module(module), "package import"
    except BaseException as exc:  # noqa: BLE001 -- the chain can fail in many ways
        first_error = short_error(exc)
    relative = module.replace(".", "/") + ".py"
    path = next((Path(e or ".") / relative for e in sys.path if (Path(e or ".") / relative).is_file()), None)
    if path is None:
        raise UpstreamMissing(
            f"{relative} not found on sys.path; put the patched upstream's python/ on PYTHONPATH "
            f"(package import failed: {first_error})"
        )
    name = "_verify_" + module.rsplit(".", 1)[-1]
    route = f"standalone file {path} (package import failed: {first_error})"
    if name in sys.modules:
        return sys.modules[name], route
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod, route


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


def _indexer_function_from_source(attr: str, why: str, root: Path | None = None) -> Loaded:
    """Compile one top-level function of upstream's ``indexer.py`` from its own source text, for
    machines where the module's imports fail for reasons unrelated to it (or from the tree at
    ``root``, a ``.../python/sglang`` directory). Nothing is copied into this repository: the
    text is read from the tree at run time."""
    import __future__

    import ast

    import torch

    root = root or sglang_root()
    if root is None:
        return Missing(why)
    path = root / "srt/layers/attention/dsv4/indexer.py"
    namespace: dict[str, Any] = {
        "torch": torch,
        "F": torch.nn.functional,
        "Any": Any,
        # the module picks fnuz only on gfx942 ROCm; every CUDA device uses e4m3fn
        "FP8_DTYPE": torch.float8_e4m3fn,
        "_arange_cache": {},
    }
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == attr)
        code = compile(
            ast.Module(body=[node], type_ignores=[]),
            str(path),
            "exec",
            flags=__future__.annotations.compiler_flag,
        )
        exec(code, namespace)  # noqa: S102 -- upstream's own source, by design
    except BaseException as exc:  # noqa: BLE001
        return Missing(f"{why}; source route failed: {short_error(exc)}")
    namespace[attr].__globals__.setdefault(attr, namespace[attr])  # recursive chunking calls itself
    return Found(namespace[attr], f"{path.relative_to(root.parent)}::{attr} (from source: {why})")


def indexer_function_from_tree(attr: str, root: Path) -> Loaded:
    """A top-level function of ``root``'s ``srt/layers/attention/dsv4/indexer.py``, from source."""
    return _indexer_function_from_source(attr, f"the tree at {root}", root)


def call_guarded(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """Run ``fn``; return (result, None) or (None, the error in one line)."""
    try:
        return fn(), None
    except BaseException as exc:  # noqa: BLE001
        return None, short_error(exc)


def module_available(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# The pieces the tiers run, each as ``Found(obj, name)`` or ``Missing(reason)``
# ---------------------------------------------------------------------------------------------


def fp8_store() -> Loaded:
    """upstream's index-K fp8 store (JIT ``store.cuh``)."""
    return load("store_fp8")


def fused_norm_rope_store() -> Loaded:
    """The fused compressor tail (norm, RoPE, Hadamard, fp8 store): production's default writer."""
    got = load("compress_store")
    if isinstance(got, Missing):
        return got
    plan = import_attr(f"{_DSV4_OPS}.compress", "CompressorDecodePlan")
    if isinstance(plan, Missing):
        return plan
    return Found((got.obj, plan.obj), got.name)


def q_kernel() -> Loaded:
    return load("q")


def topk_paged() -> Loaded:
    return load("topk_v1")


def bf16_scorer() -> Loaded:
    """Patch 4's Triton kernel."""
    return load("score_bf16")


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
        return indexer_function_from_tree("fp8_paged_mqa_logits_torch", root)
    return load("score_torch")


def fp8_triton_twin() -> Loaded:
    """The Triton fp8 twin of the bf16 kernel that the read bench uses (DeepGEMM's signature and
    math: fp8 x fp8 dots, fp32 sums, times each key's scale; -inf past the row's length)."""
    return load("score_twin")


def paged_metadata() -> Loaded:
    return load("metadata_jit")


def load_bf16_kernel_module() -> tuple[ModuleType, str]:
    """Patch 4's kernel module, by package import or else as a standalone file."""
    return load_module("score_bf16")


def load_bf16_prefill_module() -> tuple[ModuleType, str]:
    """The series' prefill kernel module (``bf16_mqa_logits``), by package import or else as a
    standalone file."""
    return load_module("score_bf16_prefill")


def load_upstream_fp8_torch_reader() -> tuple[Callable[..., Any], str]:
    """Upstream's torch fp8 paged-logits reader (gathers pages, bf16 bmm, masked with 0); raises
    :class:`UpstreamMissing` when it loads by neither route."""
    got = load("score_torch")
    if isinstance(got, Missing):
        raise UpstreamMissing(got.reason)
    return got.obj, ("package import" if "(from source:" not in got.name else got.name)


# ---------------------------------------------------------------------------------------------
# A worker process that imports another tree (the unpatched baseline)
# ---------------------------------------------------------------------------------------------

# The series' switches a worker under another tree must not inherit.
_SERIES_ENV = ("SGLANG_DSV4_BF16_INDEX_K", "SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR")


def worker_env(tree: Path, jit_cache: Path | None) -> dict[str, str]:
    """Environment for a worker that must import ``sglang`` from ``tree`` and nothing else.

    Other PYTHONPATH entries (e.g. a folder of carried wheels) are kept, except any that hold
    an ``sglang`` package of their own.
    """
    env = dict(os.environ)
    for name in _SERIES_ENV:
        env.pop(name, None)
    kept = [
        entry
        for entry in env.get("PYTHONPATH", "").split(os.pathsep)
        if entry and not (Path(entry) / "sglang" / "__init__.py").exists()
    ]
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(CHECKOUT), *kept])
    if jit_cache is not None:
        env["SGLANG_JIT_CACHE_DIR"] = str(jit_cache)
    return env
