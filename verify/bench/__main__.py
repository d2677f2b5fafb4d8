"""``python -m verify.bench --out DIR [--profile quick|full] [--sweep none|small|full]``: what
``nox -s bench`` runs on a CUDA GPU -- the read bench (Triton bf16 paged logits vs the fp8
baseline vs the naive gather) and the store bench (fused bf16 vs fp8 store), side by side."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verify.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--only", choices=("read", "store"), help="run one bench")
    parser.add_argument(
        "--timing",
        choices=("graph", "eager"),
        default="graph",
        help="graph: CUDA-graph replay, cold L2 (default); eager: triton do_bench per launch",
    )
    ns, rest = parser.parse_known_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU; the recorded H200 run is in verify/results/h200/", file=sys.stderr)
        return 2
    from verify.bench import read, store

    codes = []
    if ns.only in (None, "read"):
        codes.append(read.main(["--out", str(ns.out), "--timing", ns.timing, *rest]))
    if ns.only in (None, "store"):
        codes.append(store.main(["--out", str(ns.out), "--timing", ns.timing]))
    return max(int(c or 0) for c in codes)


if __name__ == "__main__":
    sys.exit(main())
