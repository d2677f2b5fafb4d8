"""The backend a tier-2 run or a diagnosis asks for: the GPU one (the platform profile's
production kernels) or the CPU emulation."""

from __future__ import annotations

import torch

from verify.core import platform as P

from .backend import Backend, EmulationBackend


def make_backend(
    kind: str, faults: tuple[str, ...], fp8_scorer: str = "auto", platform: str = "auto"
) -> Backend:
    """The GPU backend runs the platform profile's production kernels; the CPU backend emulates
    them (every fp8 scorer but upstream's torch fallbacks accumulates fp8 x fp8 in fp32)."""
    if kind == "gpu":
        from .gpu_backend import make_gpu_backend

        return make_gpu_backend(faults, fp8_scorer, platform=platform)
    sem = {
        "auto": "fp8-fp32acc",
        "deepgemm": "fp8-fp32acc",
        "emulation": "fp8-fp32acc",
        "torch": "fp8-torch",
        "torch-sm120": "fp8-torch",
        "tilelang": "fp8-fp32acc",
    }.get(fp8_scorer)
    if sem is None:
        raise SystemExit(f"--fp8-scorer {fp8_scorer!r} is GPU-only; on cpu use auto or torch")
    backend = EmulationBackend(device=torch.device("cpu"), faults=faults, fp8_scorer=sem)
    if platform != "auto":
        P.resolve(platform)
        backend.paths["platform"] = (
            f"{platform} ({P.HARDWARE[platform]}): CPU emulation of its fp8 scoring semantics ({sem})"
        )
    return backend
