"""Platform profiles: what upstream SGLang runs for the C4 indexer on each GPU, and how to load it.

Upstream picks the fp8 C4 path per GPU in two places: the DeepSeek-V4 branch of its model hook
(``srt/arg_groups/model_hook.py``, which sets ``SGLANG_OPT_USE_TILELANG_INDEXER``,
``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH``, ``SGLANG_OPT_USE_TOPK_V2`` ... from the platform), and
``forward_c4_indexer`` (which reads those and the platform to pick the scorer, the top-k and the
metadata). A profile never copies those decisions: :func:`applied` forces the platform facts with
upstream's own ``override_platform``, runs upstream's hook on a DeepSeek-V4 config with them, and
leaves the resulting environment in place; :mod:`verify.core.probe` and the forward tier then run
upstream's real ``forward_c4_indexer`` under it and record, with spies, which function each step
called. Upstream's functions themselves are loaded by :mod:`verify.core.upstream`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify.core.upstream import FUNCTIONS

PROFILE_NAMES = ("sm90", "sm100", "sm120", "hip")

# What a DeepSeek-V4 server's GPU says about itself, as upstream's PlatformContext names it.
_NO = {
    "is_sm90": False,
    "is_sm100": False,
    "is_sm100_or_sm110": False,
    "is_sm120": False,
    "is_blackwell": False,
}
FACTS: dict[str, dict[str, Any]] = {
    "sm90": {
        **_NO,
        "is_cuda": True,
        "is_hip": False,
        "is_sm90": True,
        "device_capability": (9, 0),
        "device_sm": 90,
    },
    "sm100": {
        **_NO,
        "is_cuda": True,
        "is_hip": False,
        "is_sm100": True,
        "is_sm100_or_sm110": True,
        "is_blackwell": True,
        "device_capability": (10, 0),
        "device_sm": 100,
    },
    "sm120": {
        **_NO,
        "is_cuda": True,
        "is_hip": False,
        "is_sm120": True,
        "is_blackwell": True,
        "device_capability": (12, 0),
        "device_sm": 120,
    },
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
            raise ProfileError(
                "--platform auto needs a GPU (sm_90, sm_100, sm_120 or ROCm); name a profile instead"
            )
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
    for role, what in (
        ("score_bf16", "the bf16 kernel's"),
        ("score_bf16_prefill", "the bf16 prefill kernel's"),
    ):
        try:
            module: Any = importlib.import_module(FUNCTIONS[role].module)  # the package the dispatch imports
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
        notes.append(
            f"{what} shared-memory lookup answers with {name}'s ({profile.per_block} B a program, "
            f"{profile.per_sm} B an SM; this GPU has {local.per_block} and {local.per_sm}), so it selects "
            "that GPU's launch configs"
        )

    def undo_all() -> None:
        for fn in reversed(undo):
            fn()

    return undo_all, notes


def force_mma_sync_lowering() -> str:
    """Build upstream's TileLang fp8 paged-logits kernel with ``TL_DISABLE_WGMMA`` from now on: on a
    GPU other than an sm_120, the closest it gets to the kernel sm_120 runs (TileLang 0.1.12 emits
    byte-identical CUDA for the two, :mod:`verify.recall.sm120` checks it)."""
    import sglang.kernels.ops.attention.dsa.tilelang_kernel as tk
    import tilelang

    tk.pass_configs[tilelang.PassConfigKey.TL_DISABLE_WGMMA] = True
    tk.fp8_paged_mqa_logits_kernel.cache_clear()
    return (
        "TileLang fp8_paged_mqa_logits built with TL_DISABLE_WGMMA: sm_90 takes the mma.sync + ldmatrix "
        "lowering whose CUDA source is byte-identical to TileLang's sm_120 source (checked in this run)"
    )
