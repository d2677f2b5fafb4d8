"""Platform profiles: what upstream SGLang runs for the C4 indexer on each GPU, and how to load it.

Upstream picks the fp8 C4 path per GPU in two places: the DeepSeek-V4 branch of its model hook
(``srt/arg_groups/model_hook.py``, which sets ``SGLANG_OPT_USE_TILELANG_INDEXER``,
``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH``, ``SGLANG_OPT_USE_TOPK_V2`` ... from the platform), and
``forward_c4_indexer`` (which reads those and the platform to pick the scorer, the top-k and the
metadata). A profile never copies those decisions: :func:`applied` forces the platform facts with
upstream's own ``override_platform``, runs upstream's hook on a DeepSeek-V4 config with them, and
leaves the resulting environment in place; :mod:`verify.forward` then runs upstream's real
``forward_c4_indexer`` under it and records, with spies, which function each step called.

This module is also the one place that says which production function runs on the local machine
for a profile and how it is loaded (:func:`load`): the tiers, the diagnosis and the bench take
upstream's functions from here.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE_NAMES = ("sm90", "sm100", "sm120", "hip")

# What a DeepSeek-V4 server's GPU says about itself, as upstream's PlatformContext names it.
_NO = {"is_sm90": False, "is_sm100": False, "is_sm100_or_sm110": False, "is_sm120": False, "is_blackwell": False}
FACTS: dict[str, dict[str, Any]] = {
    "sm90": {**_NO, "is_cuda": True, "is_hip": False, "is_sm90": True, "device_capability": (9, 0), "device_sm": 90},
    "sm100": {**_NO, "is_cuda": True, "is_hip": False, "is_sm100": True, "is_sm100_or_sm110": True,
              "is_blackwell": True, "device_capability": (10, 0), "device_sm": 100},
    "sm120": {**_NO, "is_cuda": True, "is_hip": False, "is_sm120": True, "is_blackwell": True,
              "device_capability": (12, 0), "device_sm": 120},
    "hip": {**_NO, "is_cuda": False, "is_hip": True, "device_capability": (9, 4), "device_sm": 94},
}
# The GPUs each profile stands for, for reports.
HARDWARE = {
    "sm90": "Hopper (H100 / H200)",
    "sm100": "datacenter Blackwell (B200 / GB200)",
    "sm120": "Blackwell workstation / consumer (RTX PRO 6000 / RTX 50xx)",
    "hip": "ROCm (MI300 / MI355)",
}
# Shared memory per CUDA profile, in bytes: (the most one program may use, per SM), as
# ``torch.cuda.get_device_properties`` reports them (shared_memory_per_block_optin,
# shared_memory_per_multiprocessor) on H100 / H200 and B200, and as CUDA's programming guide lists
# them for compute capability 12.0 (99 KB a block, 100 KB an SM). The bf16 kernel's grouped config
# depends on them, so checks that stand in for another GPU use that GPU's numbers.
SHARED_MEMORY: dict[str, tuple[int, int]] = {
    "sm90": (227 * 1024, 228 * 1024),
    "sm100": (227 * 1024, 228 * 1024),
    "sm120": (99 * 1024, 100 * 1024),
}
# The upstream switches the DeepSeek-V4 hook sets per platform (read back after it ran).
HOOK_ENVS = (
    "SGLANG_OPT_USE_TILELANG_INDEXER",
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
    "SGLANG_OPT_USE_TOPK_V2",
    "SGLANG_OPT_USE_AITER_INDEXER",
    "SGLANG_OPT_USE_JIT_INDEXER_METADATA",
    "SGLANG_OPT_DSV4_NONPAGED_INDEXER",
)

# A DeepSeek-V4-Flash-shaped config.json for upstream's own ModelConfig: the indexer dims are the
# model's (64 heads x 128, rope 64, top-k 512); nothing here is read for weights.
STAND_IN_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "index_topk": 512,
    "q_lora_rank": 1024,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 448,
    "head_dim": 512,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "v_head_dim": 512,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4],
    "max_position_embeddings": 1048576,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "window_size": 128,
    "sliding_window": 128,
    "torch_dtype": "bfloat16",
    "vocab_size": 129280,
}


class ProfileError(RuntimeError):
    """A profile could not be applied (unknown name, upstream not importable, hook failed)."""


def local_profile() -> str | None:
    """The profile of this machine's GPU, or None without one."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    if getattr(torch.version, "hip", None):
        return "hip"
    major, _ = torch.cuda.get_device_capability()
    return {9: "sm90", 10: "sm100", 12: "sm120"}.get(major)


def resolve(name: str) -> str:
    """``auto`` -> the local GPU's profile; otherwise the name, checked."""
    if name == "auto":
        found = local_profile()
        if found is None:
            raise ProfileError("--platform auto needs a GPU (sm_90, sm_100, sm_120 or ROCm); name a profile instead")
        return found
    if name not in PROFILE_NAMES:
        raise ProfileError(f"unknown platform profile {name!r}; known: auto, {', '.join(PROFILE_NAMES)}")
    return name


@dataclass
class Applied:
    """A profile in force: the facts, and what upstream's hook set for them."""

    name: str
    facts: dict[str, Any]
    hook_env: dict[str, str | None]
    replaced: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.name,
            "hardware": HARDWARE[self.name],
            "facts": {k: list(v) if isinstance(v, tuple) else v for k, v in self.facts.items()},
            "upstream_hook_env": self.hook_env,
            "replaced": self.replaced,
        }


def _stand_in_config_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="bf16k-dsv4-config-"))
    (path / "config.json").write_text(json.dumps(STAND_IN_CONFIG, indent=1))
    return path


def run_upstream_hook(facts: dict[str, Any]) -> dict[str, str | None]:
    """Run upstream's model hook for a DeepSeek-V4 server on a machine with ``facts``.

    Returns the hook's settings of :data:`HOOK_ENVS` (None: left unset). The process
    environment is changed by the hook; callers restore it (:func:`applied` does).
    """
    import argparse

    from sglang.srt.arg_groups.model_hook import handle_model_specific_adjustments
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    config_dir = _stand_in_config_dir()
    try:
        server_args = ServerArgs.from_cli_args(parser.parse_args(["--model-path", str(config_dir)]))
        with override_platform(**facts):
            handle_model_specific_adjustments(server_args)
    finally:
        for f in config_dir.iterdir():
            f.unlink()
        config_dir.rmdir()
    return {k: os.environ.get(k) for k in HOOK_ENVS}


@contextlib.contextmanager
def _saved_environ() -> Iterator[None]:
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def applied(name: str) -> Iterator[Applied]:
    """Make this process look like a DeepSeek-V4 server on ``name``'s GPU, as far as upstream's
    C4-indexer code can tell: platform facts (``override_platform``), the environment upstream's
    hook sets for them, and ``metadata._IS_SM120`` (a module constant upstream computes at import
    from the real device). Everything is restored on exit."""
    name = resolve(name)
    facts = FACTS[name]
    try:
        from sglang.srt.layers.attention.dsv4 import metadata
        from sglang.srt.runtime_context import override_platform
    except Exception as exc:
        raise ProfileError(f"upstream SGLang does not import: {type(exc).__name__}: {exc}") from exc
    with _saved_environ():
        for key in HOOK_ENVS:  # the hook decides; a caller's leftovers must not
            os.environ.pop(key, None)
        try:
            hook_env = run_upstream_hook(facts)
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            raise ProfileError(f"upstream's DeepSeek-V4 model hook failed for {name}: {detail}") from exc
        saved_sm120 = metadata._IS_SM120
        metadata._IS_SM120 = bool(facts["is_sm120"])
        restore, replaced = _profile_shared_memory(name)
        try:
            with override_platform(**facts):
                yield Applied(name, facts, hook_env, replaced)
        finally:
            metadata._IS_SM120 = saved_sm120
            restore()


def kernel_shared_memory(module: Any, name: str) -> Any:
    """``name``'s shared memory as patch 4's kernel module takes it (its ``SharedMemory``)."""
    return module.SharedMemory(*SHARED_MEMORY[name])


def _profile_shared_memory(name: str) -> tuple[Callable[[], None], list[str]]:
    """Make the series' kernel modules select ``name``'s launch configs: each one's per-device
    shared-memory lookup (the paged kernel's and the prefill kernel's) answers with the profile's
    numbers (SHARED_MEMORY), where they differ from this GPU's. Only on a CUDA machine (the modules
    are imported for it; a CPU process may need them interpreted, which an import here would settle
    too early) and only for a module that has the lookup. Returns (undo, what was replaced, for the
    run's record)."""
    import torch

    if name not in SHARED_MEMORY or not torch.cuda.is_available():
        return (lambda: None), []
    undo: list[Callable[[], None]] = []
    notes: list[str] = []
    for role, what in (("score_bf16", "the bf16 kernel's"), ("score_bf16_prefill", "the bf16 prefill kernel's")):
        try:
            module = importlib.import_module(FUNCTIONS[role][0])  # the package the dispatch imports
        except Exception:  # noqa: BLE001, S112 -- no such kernel in this tree (unpatched, older series)
            continue
        lookup = getattr(module, "_shared_memory", None)
        if lookup is None or not hasattr(module, "SharedMemory"):
            continue
        profile = kernel_shared_memory(module, name)
        local = lookup(torch.cuda.current_device())
        if local == profile:
            continue
        module._shared_memory = lambda index, profile=profile: profile

        def restore(module: Any = module, lookup: Any = lookup) -> None:
            module._shared_memory = lookup

        undo.append(restore)
        notes.append(f"{what} shared-memory lookup answers with {name}'s ({profile.per_block} B a program, "
                     f"{profile.per_sm} B an SM; this GPU has {local.per_block} and {local.per_sm}), so it selects "
                     "that GPU's launch configs")

    def undo_all() -> None:
        for fn in reversed(undo):
            fn()

    return undo_all, notes


# ---------------------------------------------------------------------------------------------
# Loading upstream's functions (the one place that does)
# ---------------------------------------------------------------------------------------------


@dataclass
class Found:
    obj: Any
    name: str


@dataclass
class Missing:
    reason: str


Loaded = Found | Missing


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


# Every production function the C4 indexer path can call, by role. The tiers ask for a role; the
# dispatch probe (verify.forward.probe) spies on exactly these names in upstream's modules.
FUNCTIONS: dict[str, tuple[str, str]] = {
    "q": ("sglang.kernels.ops.attention.dsv4.elementwise", "fused_q_indexer_rope_hadamard_quant"),
    "store_fp8": ("sglang.kernels.ops.attention.dsv4.attn", "fused_store_cache"),
    "compress": ("sglang.kernels.ops.attention.dsv4.compress", "compress_forward"),
    "compress_store": ("sglang.kernels.ops.attention.dsv4.compress", "compress_norm_rope_store"),
    "score_bf16": ("sglang.kernels.ops.attention.dsv4.bf16_index_logits", "bf16_paged_mqa_logits"),
    "score_bf16_prefill": ("sglang.kernels.ops.attention.dsv4.bf16_mqa_logits", "bf16_mqa_logits"),
    "score_tilelang": ("sglang.kernels.ops.attention.dsa.tilelang_kernel", "tilelang_fp8_paged_mqa_logits"),
    "score_torch": ("sglang.srt.layers.attention.dsv4.indexer", "fp8_paged_mqa_logits_torch"),
    "score_torch_sm120": ("sglang.srt.layers.attention.dsv4.indexer", "fp8_paged_mqa_logits_torch_sm120"),
    "score_aiter": ("sglang.srt.layers.attention.dsv4.indexer", "_aiter_fp8_paged_mqa_logits"),
    "score_deepgemm": ("deep_gemm", "fp8_paged_mqa_logits"),
    "score_twin": ("verify.core.fp8_twin", "fp8_paged_mqa_logits_twin"),
    "topk_v1": ("sglang.kernels.ops.attention.dsv4.topk", "topk_transform_paged"),
    "topk_v2": ("sglang.kernels.ops.attention.dsv4", "topk_transform_paged_v2"),
    "topk_v2_plan": ("sglang.kernels.ops.attention.dsv4", "plan_topk_v2"),
    "metadata_jit": ("sglang.kernels.ops.attention.dsv4.attn", "get_paged_mqa_logits_metadata"),
}


def load(role: str) -> Loaded:
    """The production function for ``role`` (see :data:`FUNCTIONS`), imported from the tree on
    sys.path; the torch scorers fall back to their own source text when the indexer module does
    not import (the GPU machine has no ``sgl_kernel``)."""
    module, attr = FUNCTIONS[role]
    got = import_attr(module, attr)
    if isinstance(got, Missing) and module == "sglang.srt.layers.attention.dsv4.indexer":
        return _indexer_function_from_source(attr, f"module import failed: {got.reason}")
    return got


def load_module(role: str) -> tuple[Any, str]:
    """The module holding ``role``'s function (see :data:`FUNCTIONS`) and how it was reached: by
    package import, else -- for a self-contained module such as patch 4's kernel (torch + triton
    only) -- loaded as a standalone file from the tree on sys.path, since sglang's ``__init__``
    chain fails on machines without ``sgl_kernel``. Raises :class:`ProfileError` when neither
    route works."""
    module, _ = FUNCTIONS[role]
    try:
        return importlib.import_module(module), "package import"
    except BaseException as exc:  # noqa: BLE001 -- the chain can fail in many ways
        first_error = short_error(exc)
    relative = module.replace(".", "/") + ".py"
    path = next((Path(e or ".") / relative for e in sys.path if (Path(e or ".") / relative).is_file()), None)
    if path is None:
        raise ProfileError(f"{relative} not found on sys.path; put the patched upstream's python/ on PYTHONPATH "
                           f"(package import failed: {first_error})")
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
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec",
                       flags=__future__.annotations.compiler_flag)
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
