"""Reach the read-path code of the patched upstream on ``PYTHONPATH`` without its whole stack.

On the GPU machine ``sglang.srt.layers.attention.dsv4.indexer`` does not import (it pulls in
``sgl_kernel`` through ``layernorm``), and on CPU machines it needs torchvision. The two pieces
the read checks need are self-contained, so each loader first tries the normal import and then
falls back to loading the piece from the upstream source file itself:

- ``load_bf16_kernel_module``: patch 4's ``bf16_index_logits`` module (torch + triton only),
  loaded as a standalone file when the ``sglang`` package's ``__init__`` chain fails.
- ``load_upstream_fp8_torch_reader``: upstream's ``fp8_paged_mqa_logits_torch`` (pure torch),
  compiled from the function's own source text in ``indexer.py`` when the module fails.

Both return ``(object, how)`` where ``how`` says which route worked, for the results file.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

KERNEL_MODULE = "sglang.kernels.ops.attention.dsv4.bf16_index_logits"
KERNEL_FILE = "sglang/kernels/ops/attention/dsv4/bf16_index_logits.py"
INDEXER_MODULE = "sglang.srt.layers.attention.dsv4.indexer"
INDEXER_FILE = "sglang/srt/layers/attention/dsv4/indexer.py"
FP8_TORCH_READER = "fp8_paged_mqa_logits_torch"


class UpstreamMissing(RuntimeError):
    """The patched upstream (or the piece asked for) is not on ``sys.path``."""


def find_upstream_file(relative: str) -> Path:
    """The first ``sys.path`` entry holding ``relative`` (the patched tree's ``python/``)."""
    for entry in sys.path:
        candidate = Path(entry or ".") / relative
        if candidate.is_file():
            return candidate
    raise UpstreamMissing(
        f"{relative} not found on sys.path; put the patched upstream's python/ on PYTHONPATH"
    )


def load_bf16_kernel_module() -> tuple[ModuleType, str]:
    """Patch 4's kernel module, by package import or else as a standalone file."""
    try:
        return importlib.import_module(KERNEL_MODULE), "package import"
    except Exception as error:  # noqa: BLE001 - sglang's __init__ chain can fail in many ways
        first_error = f"{type(error).__name__}: {str(error).strip()[:200]}"
    path = find_upstream_file(KERNEL_FILE)
    name = "_verify_bf16_index_logits"
    if name in sys.modules:
        return sys.modules[name], f"standalone file {path} (package import failed: {first_error})"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module, f"standalone file {path} (package import failed: {first_error})"


def _function_from_source(path: Path, function: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            module = ast.Module(body=[node], type_ignores=[])
            # Upstream's module defers annotations; keep that for the lone function too.
            code = compile(
                module, filename=str(path), mode="exec", flags=__future__.annotations.compiler_flag
            )
            exec(code, namespace)  # noqa: S102 - upstream's own source, on the user's PYTHONPATH
            return namespace[function]
    raise UpstreamMissing(f"{function} not found in {path}")


def load_upstream_fp8_torch_reader() -> tuple[Callable[..., Any], str]:
    """Upstream's torch fp8 paged-logits reader (gathers pages, bf16 bmm, masked with 0)."""
    try:
        module = importlib.import_module(INDEXER_MODULE)
        return getattr(module, FP8_TORCH_READER), "package import"
    except Exception as error:  # noqa: BLE001 - any import failure sends us to the source route
        first_error = (
            f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        )
    path = find_upstream_file(INDEXER_FILE)
    namespace: dict[str, Any] = {
        "torch": torch,
        "F": torch.nn.functional,
        "Any": Any,
        # The CUDA (not ROCm fnuz) format, as upstream picks on NVIDIA.
        "FP8_DTYPE": torch.float8_e4m3fn,
        "_arange_cache": {},
    }
    fn = _function_from_source(path, FP8_TORCH_READER, namespace)
    return fn, f"source of {path} (module import failed: {first_error})"
