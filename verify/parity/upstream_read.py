"""Tier 1's view of the patched upstream's read path, through :mod:`verify.platform` (the one
place that loads upstream's functions).

On the GPU machine ``sglang.srt.layers.attention.dsv4.indexer`` does not import (it pulls in
``sgl_kernel`` through ``layernorm``), and on CPU machines it needs torchvision; the platform
loader then reaches each piece from the upstream source itself:

- ``load_bf16_kernel_module``: the series' ``bf16_index_logits`` module (torch + triton only),
  loaded as a standalone file when the ``sglang`` package's ``__init__`` chain fails;
  ``load_bf16_prefill_module``: its prefill kernel module ``bf16_mqa_logits``, likewise.
- ``load_upstream_fp8_torch_reader``: upstream's ``fp8_paged_mqa_logits_torch`` (pure torch),
  compiled from the function's own source text in ``indexer.py`` when the module fails.

Both return ``(object, how)`` where ``how`` says which route worked, for the results file, and
raise :class:`UpstreamMissing` when the tree is not on ``sys.path``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from verify import platform as P


class UpstreamMissing(RuntimeError):
    """The patched upstream (or the piece asked for) is not on ``sys.path``."""


def load_bf16_kernel_module() -> tuple[ModuleType, str]:
    """Patch 4's kernel module, by package import or else as a standalone file."""
    try:
        module, route = P.load_module("score_bf16")
    except P.ProfileError as exc:
        raise UpstreamMissing(str(exc)) from exc
    return module, route


def load_bf16_prefill_module() -> tuple[ModuleType, str]:
    """The series' prefill kernel module (``bf16_mqa_logits``), by package import or else as a
    standalone file."""
    try:
        module, route = P.load_module("score_bf16_prefill")
    except P.ProfileError as exc:
        raise UpstreamMissing(str(exc)) from exc
    return module, route


def load_upstream_fp8_torch_reader() -> tuple[Callable[..., Any], str]:
    """Upstream's torch fp8 paged-logits reader (gathers pages, bf16 bmm, masked with 0)."""
    got = P.load("score_torch")
    if isinstance(got, P.Missing):
        raise UpstreamMissing(got.reason)
    return got.obj, ("package import" if "(from source:" not in got.name else got.name)
