"""Build worker: compile a list of upstream JIT instantiations for one architecture.

Runs in its own process with the patched upstream on PYTHONPATH; reads a JSON request on stdin
and prints one JSON line with a result per kernel (compiler output included on failure).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from typing import Any


def main() -> int:
    request = json.loads(sys.stdin.read())
    major, minor, suffix = request["arch"]
    # The patched tree's own module, on PYTHONPATH only here (so mypy has no sglang to read).
    arch = importlib.import_module("sglang.kernels.jit.utils.arch")

    results: list[dict[str, Any]] = []
    for kernel in request["kernels"]:
        namespace: dict[str, Any] = {}
        start = time.monotonic()
        try:
            exec("import torch", namespace)  # noqa: S102 - runs the kernels/ manifest, our own file
            for line in kernel["imports"]:
                exec(line, namespace)  # noqa: S102 - same
            with arch.override_jit_cuda_arch(major, minor, suffix):
                module = eval(kernel["call"], namespace)
            results.append(
                {
                    "kernel": kernel["name"],
                    "ok": module is not None,
                    "loaded": bool(request["load"]),
                    "seconds": time.monotonic() - start,
                    "message": "",
                }
            )
        except BaseException as exc:  # noqa: BLE001 - a compiler error must not hide the other kernels
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            results.append(
                {
                    "kernel": kernel["name"],
                    "ok": False,
                    "loaded": False,
                    "seconds": time.monotonic() - start,
                    "message": text[-6000:],
                }
            )
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
