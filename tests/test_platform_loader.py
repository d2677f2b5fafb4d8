"""verify.core.upstream is the one loader of upstream's functions; tier 1's read checks reach patch 4's
kernel module and upstream's torch reader through it, by either route."""

from __future__ import annotations

import importlib
import sys

import pytest

from verify.core import upstream as U


def test_kernel_module_by_package_import() -> None:
    module, route = U.load_bf16_kernel_module()
    assert route == "package import" and callable(module.bf16_paged_mqa_logits)


def test_kernel_module_as_a_standalone_file_when_sglangs_import_chain_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.import_module

    def no_sglang(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name.startswith("sglang"):
            raise ImportError("No module named 'sgl_kernel'")  # what the GPU machine says
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_sglang)
    monkeypatch.delitem(sys.modules, "_verify_bf16_index_logits", raising=False)
    module, route = U.load_bf16_kernel_module()
    assert route.startswith("standalone file ") and "sgl_kernel" in route
    assert module.__name__ == "_verify_bf16_index_logits" and callable(module.bf16_paged_mqa_logits)
    fn, how = U.load_upstream_fp8_torch_reader()
    assert "from source" in how and fn.__name__ == "fp8_paged_mqa_logits_torch"


def test_a_tree_missing_from_the_path_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        importlib, "import_module", lambda name, package=None: (_ for _ in ()).throw(ImportError(name))
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "sglang-upstream" not in p])
    monkeypatch.delitem(sys.modules, "_verify_bf16_index_logits", raising=False)
    with pytest.raises(U.UpstreamMissing, match="put the patched upstream's python/ on PYTHONPATH"):
        U.load_bf16_kernel_module()
