"""`build`: compile every CUDA kernel instantiation the bf16 path uses, through upstream's own JIT loader.

`kernels/manifest.toml` names each instantiation (the upstream builder call with its template
arguments) and the architectures. For each architecture a worker process (`bf16k.build_worker`)
imports the patched upstream, pins the target with upstream's `override_jit_cuda_arch`, and calls
the builder, which runs nvcc through upstream's ninja file and loads the module. One process per
architecture because upstream memoises each builder per argument tuple, not per target.

The compiled modules land in upstream's JIT cache layout under `build/jit-cache` (set as
`SGLANG_JIT_CACHE_DIR`), which a deployment can ship and point `SGLANG_JIT_CACHE_DIR` at.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bf16k.errors import ToolError
from bf16k.project import Target

MANIFEST = "kernels/manifest.toml"


@dataclass(frozen=True)
class Kernel:
    name: str
    imports: tuple[str, ...]
    call: str
    why: str


@dataclass(frozen=True)
class Arch:
    name: str  # e.g. sm_90a
    major: int
    minor: int
    suffix: str  # "a" / "f": the target upstream's loader picks for this GPU


def load_manifest(root: Path) -> tuple[list[Kernel], list[Arch]]:
    path = root / MANIFEST
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ToolError(f"{path} is missing") from exc
    kernels = [
        Kernel(k["name"], tuple(k.get("imports", [])), k["call"], k.get("why", "")) for k in data["kernel"]
    ]
    archs = [
        Arch(a["name"], int(a["major"]), int(a["minor"]), str(a.get("suffix", ""))) for a in data["arch"]
    ]
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise ToolError(f"{path}: kernel names must be unique")
    return kernels, archs


def cuda_home() -> Path:
    """CUDA's install folder. The `nvcc` on PATH may be a wrapper outside it, so CUDA_HOME wins."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(env)] if env else []
    candidates.append(Path("/usr/local/cuda"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent)
    for cand in candidates:
        if (cand / "bin" / "nvcc").exists() and (cand / "include" / "cuda_runtime.h").exists():
            return cand
    raise ToolError(
        "no CUDA toolkit found: `build` needs nvcc (set CUDA_HOME to the toolkit folder, "
        "e.g. /usr/local/cuda)"
    )


def local_gpu_arch(python: str) -> Arch | None:
    code = (
        "import torch,json;"
        "print(json.dumps(torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None))"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolError(f"cannot import torch in {python}: {proc.stderr.strip()[-500:]}")
    cap = json.loads(proc.stdout.strip() or "null")
    if not cap:
        return None
    major, minor = int(cap[0]), int(cap[1])
    # The loader picks the suffix itself for the local GPU; the name is for the table only.
    return Arch(f"sm_{major}{minor} (local)", major, minor, "")


@dataclass
class Result:
    kernel: str
    arch: str
    ok: bool
    seconds: float
    loaded: bool
    message: str


def run_worker(
    t: Target, kernels: list[Kernel], arch: Arch, cache: Path, python: str, load: bool
) -> list[Result]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(t.upstream_dir / "python"), str(t.root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["SGLANG_JIT_CACHE_DIR"] = str(cache)
    env["CUDA_HOME"] = str(cuda_home())
    request = {
        "arch": [arch.major, arch.minor, arch.suffix or None],
        "load": load,
        "kernels": [{"name": k.name, "imports": list(k.imports), "call": k.call} for k in kernels],
    }
    proc = subprocess.run(
        [python, "-m", "bf16k.build_worker"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        cwd=t.root,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise ToolError(
            f"the build worker for {arch.name} failed (exit {proc.returncode}):\n{proc.stderr.strip()[-4000:]}"
        )
    data = json.loads(lines[-1])
    return [
        Result(r["kernel"], arch.name, r["ok"], r["seconds"], r["loaded"], r["message"])
        for r in data["results"]
    ]


def build(
    t: Target, *, archs: list[str] | None = None, python: str | None = None, cache: Path | None = None
) -> list[Result]:
    kernels, default_archs = load_manifest(t.root)
    if not (t.upstream_dir / "python" / "sglang").is_dir():
        raise ToolError(f"{t.upstream_dir} holds no upstream tree: run `nox -s apply` first")
    python = python or sys.executable
    cuda_home()  # fail early, with the message, when there is no toolkit
    gpu = local_gpu_arch(python)
    if archs:
        by_name = {a.name: a for a in default_archs}
        if gpu:
            by_name.setdefault(gpu.name, gpu)
        unknown = [a for a in archs if a not in by_name]
        if unknown:
            raise ToolError(f"unknown architecture(s) {unknown}; known: {sorted(by_name)}")
        chosen = [by_name[a] for a in archs]
    else:
        chosen = [gpu] if gpu else default_archs
    cache = cache or (t.build_dir / "jit-cache")
    cache.mkdir(parents=True, exist_ok=True)
    where = (
        f"local GPU {gpu.name}: compile and load"
        if gpu
        else "no GPU: compile (and load the host module) only"
    )
    print(f"build: {len(kernels)} kernel instantiation(s) x {', '.join(a.name for a in chosen)} ({where})")
    results: list[Result] = []
    for arch in chosen:
        results += run_worker(t, kernels, arch, cache, python, load=gpu is not None and arch == gpu)
    print(table(results))
    print(f"JIT cache: {cache} (ship it and set SGLANG_JIT_CACHE_DIR to it)")
    failed = [r for r in results if not r.ok]
    if failed:
        first = failed[0]
        raise ToolError(
            f"{len(failed)} build(s) failed; first: kernel '{first.kernel}' for {first.arch}:\n{first.message}"
        )
    return results


def table(results: list[Result]) -> str:
    width = max([len("kernel")] + [len(r.kernel) for r in results])
    aw = max([len("arch")] + [len(r.arch) for r in results])
    lines = [f"{'kernel':<{width}}  {'arch':<{aw}}  {'result':<8} {'seconds':>7}"]
    for r in results:
        status = ("loaded" if r.loaded else "built") if r.ok else "FAILED"
        lines.append(f"{r.kernel:<{width}}  {r.arch:<{aw}}  {status:<8} {r.seconds:7.1f}")
    return "\n".join(lines)
