"""``python -m verify``: what ``nox -s verify_recall`` runs.

- ``--server URL [--baseline URL] ...``: the live tier (tier 3) against an OpenAI-compatible SGLang
  server; every option is ``python -m verify.live``'s.
- otherwise: tier 1 kernel parity (needs a CUDA GPU; skipped with a note on a CPU machine),
  tier 2 indexer recall with the fp8 diagnosis (production kernels on a GPU; exact emulation at
  reduced sizes on a CPU), and with ``--tiers forward`` the forward tier (upstream's C4 indexer
  forward; the dispatch probe alone on a CPU), against the patched tree in ``sglang-upstream/``.
  ``--platform`` picks the GPU profile whose fp8 path tier 2 and the forward tier run.

Results go to ``--out`` (default ``build/verify/<UTC time>``); the exit status is non-zero when
any suite fails its gate.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = "verify/results/h200"  # where the H200 run of this repository is committed


def _baseline_tree(root: Path) -> Path | None:
    """An unpatched copy of upstream (the base commit) for the flag-off bit-identity check."""
    from bf16k import gitutil, upstream

    repo = root / "sglang-upstream"
    if not gitutil.is_repo(repo):
        return None
    base = gitutil.out(["rev-parse", "--verify", "-q", upstream.BASE_REF], repo)
    dest = root / "build" / "upstream-baseline"
    if not gitutil.is_repo(dest):
        gitutil.git(["clone", "-q", "--shared", "--no-checkout", str(repo), str(dest)], root)
    gitutil.git(["checkout", "-q", "-f", "--detach", base], dest)
    return dest / "python"


def _run(name: str, fn: Callable[[list[str]], int], argv: list[str]) -> int:
    print(f"\n=== {name}: {' '.join(argv)}", flush=True)
    try:
        code = int(fn(argv) or 0)
    except SystemExit as exc:  # the suites' argparse exits
        code = int(exc.code or 0)
    print(f"=== {name}: exit {code}", flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--server" or a.startswith("--server=") for a in args):
        from verify.live.cli import main as live_main

        return int(live_main(args) or 0)

    parser = argparse.ArgumentParser(prog="python -m verify", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results folder (default build/verify/<time>)")
    parser.add_argument("--tiers", nargs="+", choices=("1", "2", "forward"), default=["1", "2"])
    parser.add_argument(
        "--platform", default="auto", help="GPU profile of the fp8 path: auto, sm90, sm100, sm120, hip"
    )
    parser.add_argument(
        "--backend", choices=("cpu", "gpu"), default=None, help="tier 2 backend (default: gpu if CUDA)"
    )
    ns, rest = parser.parse_known_args(args)
    out = ns.out or ROOT / "build" / "verify" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)

    import torch

    gpu = torch.cuda.is_available()
    codes: dict[str, int] = {}
    if "1" in ns.tiers:
        if gpu:
            from verify.parity import read, store

            baseline = _baseline_tree(ROOT)
            store_args = ["--out", str(out / "parity")] + (
                ["--baseline-tree", str(baseline)] if baseline else []
            )
            codes["tier 1 store parity"] = _run("tier 1 store parity", store.main, store_args)
            codes["tier 1 read parity"] = _run(
                "tier 1 read parity", read.main, ["--out", str(out / "parity")]
            )
        else:
            print(f"tier 1 (kernel parity) needs a CUDA GPU: skipped here; the H200 run is in {RECORDED}/")
    if "2" in ns.tiers:
        from verify.recall.cli import main as recall_main

        backend = ns.backend or ("gpu" if gpu else "cpu")
        codes["tier 2 recall"] = _run(
            "tier 2 recall",
            recall_main,
            ["--out", str(out / "recall"), "--backend", backend, "--platform", ns.platform, *rest],
        )
    if "forward" in ns.tiers:
        from verify.forward.cli import main as forward_main

        fargs = ["--out", str(out / "forward"), "--platform", ns.platform]
        baseline = _baseline_tree(ROOT) if gpu else None
        if baseline is not None:
            fargs += ["--baseline-tree", str(baseline)]
        code = _run("forward tier", forward_main, fargs)
        if code == 3:  # no GPU: the dispatch probe ran; the scenarios are recorded for the H200
            print(
                f"forward tier: scenarios need a CUDA GPU (the dispatch probe ran); the H200 run is in {RECORDED}/forward/"
            )
            code = 0
        codes["forward tier"] = code
    print("\nverify_recall summary (" + str(out) + "):")
    for name, code in codes.items():
        print(f"  {name:<22} {'pass' if code == 0 else f'FAIL (exit {code})'}")
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
