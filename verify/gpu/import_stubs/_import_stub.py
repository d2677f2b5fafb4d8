"""Import-time stand-ins for CUDA kernel libraries that cannot reach the offline GPU machine.

`sglang-kernel` (373 MB) and `flashinfer` cannot be carried there, but upstream modules on the
import path of the DSV4 pool, compressor and indexer import some of their ops at module level
under `if _is_cuda:` (int8 GEMMs, fp8 batched GEMMs for other quantisation methods). None of
them is on the bf16 index-K path: the kernels under test are upstream's JIT kernels and the
series' Triton kernel. Every name in a stub is a placeholder that raises when called, so a call
into one fails loudly instead of computing. `verify/gpu/run.sh` puts this folder on PYTHONPATH
(after everything else) only for packages that do not import, and logs which.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Missing:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # `class X(stubbed.Base)` at import time: X becomes a plain class.
        return (object,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name} is not installed here (import-time stub, see verify/gpu/import_stubs)"
        )


def _module_getattr(prefix: str):
    def __getattr__(name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{prefix}.{name}")

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any `<package>.<sub>` resolves to a module of placeholders."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(self.prefix + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(package_globals: dict[str, Any]) -> None:
    """Make the calling package a stub: placeholders for names, a finder for submodules."""
    name = package_globals["__name__"]
    package_globals["__getattr__"] = _module_getattr(name)
    package_globals["IS_STUB"] = True
    sys.meta_path.append(_SubmoduleFinder(name))
