"""Compile the read kernels for sm_90, sm_100 and sm_120 without a GPU and report what the compiler
made of them.

Triton compiles for a named target without a device (it carries its own ptxas), so CPU machines
and CI can check what only a GPU run would otherwise reveal: that every launch config compiles
under the installed Triton (the GPU machine has 3.6), that the dot became the target's tensor-core
op (Hopper ``wgmma``, datacenter Blackwell ``tcgen05.mma``, sm_120's ``mma.sync``), that the key
loads are pipelined (async copies into shared memory, the main loop's ``async_wait`` leaving tiles
in flight), that shared memory fits what one program may use on that GPU (sm_120: 99 KB, where
H100 / H200 / B200 allow 227 KB), and (Triton's bundled ``ptxas -v``) the registers a thread uses
and whether any spill. The default set is what production launches, with the configs the kernel
module selects for that GPU's shared memory: the decode config with the length-aware split (as
the indexer calls it, ``clean_logits=False``; and with the tail fill), MTP verify groups of 2 and
4, the prefill config (one row at a time: grouped rows run only under the length-aware split),
bf16 q with 32 heads, and (sm_90) the fp8 twin; and the prefill kernel (``bf16_mqa_logits``)
under the config the module selects for that GPU's shared memory, as the indexer calls it (paged,
``clean_logits=False``; ``--all`` adds the fill and bf16 q at 32 heads). Run it as::

    PYTHONPATH=<repo>:<patched tree>/python python -m verify.bench.read_compile [--all] [--targets sm120]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from verify.core import platform as P
from verify.core.provenance import SERIES_HASH, series_hash

COMPARISON_GROUPS_OF_4 = "MTP verify, groups of 4, at the decode config's stages (not launched)"

# The profiles compiled for: Triton's target capability and the op the dot must become there.
TARGETS: dict[str, tuple[int, str]] = {
    "sm90": (90, "wgmma"),
    "sm100": (100, "tcgen05.mma"),
    "sm120": (120, "mma.sync"),
}

_BF16_SIGNATURE = {
    "q_ptr": "*fp8e4nv",
    "k_ptr": "*bf16",
    "w_ptr": "*fp32",
    "lens_ptr": "*i32",
    "pt_ptr": "*i32",
    "out_ptr": "*fp32",
}
_PREFILL_SIGNATURE = {
    "q_ptr": "*fp8e4nv",
    "k_ptr": "*bf16",
    "w_ptr": "*fp32",
    "ks_ptr": "*i32",
    "ke_ptr": "*i32",
    "pt_ptr": "*i32",
    "out_ptr": "*fp32",
}
_TWIN_SIGNATURE = {
    "q_ptr": "*fp8e4nv",
    "k_ptr": "*fp8e4nv",
    "sc_ptr": "*fp32",
    "w_ptr": "*fp32",
    "lens_ptr": "*i32",
    "pt_ptr": "*i32",
    "out_ptr": "*fp32",
}
_INT_ARGS = [
    "rows",
    "groups",
    "n_out",
    "n_keys",
    "num_tiles",
    "max_pages",
    "split_n",
    "num_splits",
    "num_sms",
    "max_split_n",
    "stride_qr",
    "stride_qh",
    "stride_kp",
    "stride_sp",
    "stride_wr",
    "stride_lr",
    "stride_ptr",
    "stride_or",
]
# What the launcher would see for the pool's real strides (multiples of 16).
_ALIGNED = [
    "q_ptr",
    "k_ptr",
    "sc_ptr",
    "w_ptr",
    "lens_ptr",
    "ks_ptr",
    "ke_ptr",
    "pt_ptr",
    "out_ptr",
    "n_out",
    "split_n",
    "stride_qr",
    "stride_qh",
    "stride_kp",
    "stride_sp",
    "stride_wr",
    "stride_ptr",
    "stride_or",
]


# The prefill kernel loads one key tile per program and walks query rows against it (the next
# row's q prefetched into registers), so it has no key pipeline for `pipelined` to judge.
PREFILL_KERNEL = "_bf16_mqa_logits_kernel"


@dataclass
class CompileReport:
    kernel: str
    config: dict[str, Any]
    shared_bytes: int
    tensor_core: bool  # the dot became the target's tensor-core op (TARGETS)
    loop_waits: list[int]  # async_wait counts inside the first scf.for that has any (the key loop)
    variant: str = ""
    async_copies: int = 0  # cp.async copies into shared memory (pipelined key loads)
    registers: int | None = None  # per thread, from ptxas -v (None: ptxas not run)
    spill_bytes: int | None = None
    target: str = "sm90"
    production: bool = True  # False: a comparison variant, not launched by the indexer

    @property
    def shared_limit(self) -> int:
        return P.SHARED_MEMORY[self.target][0]

    @property
    def pipelined(self) -> bool:
        """A later key tile's copy is in flight while one is scored. Two stages never are under
        Triton 3.6-3.8: the loop waits for every copy, then issues the next after the dot."""
        return self.async_copies > 0 and bool(self.loop_waits) and self.loop_waits[0] >= 1

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= self.shared_limit

    @property
    def ok(self) -> bool:
        """It would launch on that GPU, on its tensor cores (what a GPU-less check can settle)."""
        return self.tensor_core and self.fits

    @property
    def notes(self) -> list[str]:
        """What may cost speed on that GPU (only a run there can say how much)."""
        out = []
        if self.kernel != PREFILL_KERNEL and not self.pipelined:
            out.append("no key tile in flight while one is scored")
        if self.spill_bytes:
            out.append(f"{self.spill_bytes} B of register spills")
        return out

    @property
    def clean(self) -> bool:
        return self.ok and not self.notes


def ptxas_usage(ptx: str, capability: int = 90) -> tuple[int | None, int | None]:
    """(registers per thread, spill store bytes) from Triton's bundled ptxas for the target
    (``sm_90a``; Blackwell targets through its ``ptxas-blackwell`` where bundled, as Triton
    itself picks it); (None, None) when that ptxas cannot be found or run."""
    import subprocess
    import tempfile

    import triton

    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = bin_dir / "ptxas"
    if capability >= 100 and (bin_dir / "ptxas-blackwell").is_file():
        ptxas = bin_dir / "ptxas-blackwell"
    if not ptxas.is_file():
        return None, None
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        proc = subprocess.run(
            [str(ptxas), f"-arch=sm_{capability}a", "-v", str(src), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True,
            text=True,
            check=False,
        )
    regs = re.findall(r"Used (\d+) registers", proc.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", proc.stderr)
    if proc.returncode != 0 or not regs:
        return None, None
    return int(regs[0]), int(spills[0]) if spills else 0


def compile_for(
    target: str,
    kernel: Any,
    pointer_sig: dict[str, str],
    config: Any,
    heads: int = 64,
    variant: str = "",
    **constexprs: Any,
) -> CompileReport:
    """Compile one Triton kernel of the read path for a profile's GPU (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    names = kernel.arg_names
    signature = dict(pointer_sig)
    signature.update({name: "i32" for name in _INT_ARGS if name in names})
    consts: dict[str, Any] = {"H": heads, "D": 128, "PAGE": 64}
    for name, value in (
        ("BLOCK_N", getattr(config, "block_n", None)),
        ("SWAP_AB", getattr(config, "swap_ab", None)),
        ("INTERPRET", False),
    ):  # the kernels that have them (the twin keeps an interpreter branch)
        if name in names:
            consts[name] = value
    consts.update(constexprs)
    signature.update({name: "constexpr" for name in consts})
    # What the launcher specialises: 16-byte alignment of pointers and of the integers not listed
    # in do_not_specialize (the counts are, so a server compiles one variant for all of them).
    unspecialised = {p.name for p in getattr(kernel, "params", []) if getattr(p, "do_not_specialize", False)}
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]]
        for a in _ALIGNED
        if a in names and a not in unspecialised
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
    capability, tensor_op = TARGETS[target]
    compiled = triton_compile(
        source,
        target=GPUTarget("cuda", capability, 32),
        # The prefill kernel's configs have no pipeliner stages (it prefetches by hand) but may cap registers.
        options={"num_warps": config.num_warps, "num_stages": getattr(config, "num_stages", 1)}
        | ({"maxnreg": config.maxnreg} if getattr(config, "maxnreg", None) else {}),
    )
    ttgir = compiled.asm["ttgir"]
    loop = ttgir[ttgir.index("scf.for") :] if "scf.for" in ttgir else ""
    waits = [int(n) for n in re.findall(r"async_wait[^{\n]*\{num = (\d+)", loop)]
    registers, spills = ptxas_usage(compiled.asm["ptx"], capability)
    fields = ("block_n", "split_n", "swap_ab", "num_warps", "num_stages", "block_k", "block_r", "maxnreg")
    return CompileReport(
        kernel=kernel.__name__,
        config={k: getattr(config, k) for k in fields if hasattr(config, k)},
        shared_bytes=int(compiled.metadata.shared),
        tensor_core=tensor_op in compiled.asm["ptx"],
        loop_waits=waits,
        variant=variant,
        async_copies=ttgir.count("async_copy_global_to_local"),
        registers=registers,
        spill_bytes=spills,
        target=target,
    )


def bf16_constexprs(
    module: Any, config: Any, *, group_rows: int, length_aware: bool, fill_tail: bool
) -> dict[str, Any]:
    """The constexprs ``bf16_paged_mqa_logits_with_config`` passes for a launch like this one
    (fp8 q, as the indexer hands it over; one 128-row block of lengths when length-aware)."""
    group_p = 1 << (group_rows - 1).bit_length()
    return {
        "Q_FP8": True,
        "FILL_TAIL": fill_tail,
        "GROUP": group_rows,
        "GROUP_P": group_p,
        "LEN_AWARE": length_aware,
        "DOUBLINGS": module._split_doublings(config.block_n, config.max_split_n),
        "MIN_SPLIT_BLOCKS": module._MIN_SPLIT_BLOCKS,
        "Q_AMORTIZE_SPLIT": module._Q_AMORTIZE_SPLIT,
        "PROGRAMS_PER_SM": module._PROGRAMS_PER_SM,
        "LEN_BLOCK": module._LEN_BLOCK,
        "LEN_BLOCKS": 1 if length_aware else 0,
    }


def production_variants(module: Any, target: str = "sm90") -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, config, launch options) of every bf16 kernel variant the indexer launches on a
    profile's GPU: MTP groups under the config the module selects for that GPU's shared memory."""
    decode, prefill = module.CONFIGS["decode"], module.CONFIGS["prefill"]
    shared = P.kernel_shared_memory(module, target)

    def grouped(group_rows: int) -> Any:
        return module.select_config(8, 0, 64, group_rows, shared)

    return [
        (
            "decode (indexer: length-aware, clean_logits=False)",
            decode,
            {"group_rows": 1, "length_aware": True, "fill_tail": False},
        ),
        ("decode, clean_logits=True", decode, {"group_rows": 1, "length_aware": True, "fill_tail": True}),
        ("MTP verify, groups of 2", grouped(2), {"group_rows": 2, "length_aware": True, "fill_tail": False}),
        ("MTP verify, groups of 4", grouped(4), {"group_rows": 4, "length_aware": True, "fill_tail": False}),
        ("prefill", prefill, {"group_rows": 1, "length_aware": False, "fill_tail": False}),
    ]


def prefill_constexprs(config: Any, *, clean_logits: bool, q_fp8: bool = True) -> dict[str, Any]:
    """The constexprs ``bf16_mqa_logits_with_config`` passes (the indexer's call: paged, fp8 q)."""
    return {
        "BLOCK_K": config.block_k,
        "BLOCK_R": config.block_r,
        "PAGED": True,
        "Q_FP8": q_fp8,
        "FILL": clean_logits,
    }


def prefill_variants(
    module: Any, target: str, all_variants: bool = False
) -> list[tuple[str, Any, dict[str, Any], bool]]:
    """(name, config, constexpr options, production) of the prefill kernel for a profile's GPU: the
    config the module selects for its shared memory as the indexer calls it (``all_variants``: also
    with the fill, and bf16 q at 32 heads); and (not launched there) the large-smem config where it
    is not selected."""
    config = module.select_prefill_config(P.kernel_shared_memory(module, target), 64)
    out: list[tuple[str, Any, dict[str, Any], bool]] = [
        ("prefill kernel (indexer: paged, clean_logits=False)", config, {"clean_logits": False}, True)
    ]
    if all_variants:
        out += [
            ("prefill kernel, clean_logits=True", config, {"clean_logits": True}, True),
            (
                "prefill kernel, bf16 q, 32 heads",
                config,
                {"clean_logits": False, "q_fp8": False, "heads": 32},
                True,
            ),
        ]
    large = module.CONFIGS["large_smem"]
    if config != large:
        out.append(
            ("prefill kernel, the 227-KB GPUs' config (not launched)", large, {"clean_logits": False}, False)
        )
    return out


def compile_read_kernels(
    all_configs: bool = False, targets: tuple[str, ...] = ("sm90",)
) -> list[CompileReport]:
    """The bf16 kernel (fp8 and bf16 q) for each target, and the fp8 twin (sm_90: it stands in for
    DeepGEMM on the H200); the default configs or, with ``all_configs``, the whole sweep."""
    from verify.core import fp8_twin
    from verify.core.upstream import load_bf16_kernel_module

    if fp8_twin.INTERPRETED:
        raise RuntimeError(
            "unset TRITON_INTERPRET: the compile check needs the compiled (not interpreted) kernels"
        )
    module, _ = load_bf16_kernel_module()
    kernel = module._bf16_paged_mqa_logits_kernel
    decode = module.CONFIGS["decode"]
    reports = []
    for target in targets:
        for name, config, launch in production_variants(module, target):
            reports.append(
                compile_for(
                    target,
                    kernel,
                    _BF16_SIGNATURE,
                    config,
                    variant=name,
                    **bf16_constexprs(module, config, **launch),
                )
            )
        # What groups of 4 took before the kernel module chose their stages by shared memory.
        grouped4: dict[str, Any] = {"group_rows": 4, "length_aware": True, "fill_tail": False}
        report = compile_for(
            target,
            kernel,
            _BF16_SIGNATURE,
            decode,
            variant=COMPARISON_GROUPS_OF_4,
            **bf16_constexprs(module, decode, **grouped4),
        )
        reports.append(replace(report, production=False))
        plain: dict[str, Any] = {"group_rows": 1, "length_aware": False, "fill_tail": True}
        for config in list(module.CONFIG_SWEEP) if all_configs else []:
            reports.append(
                compile_for(
                    target,
                    kernel,
                    _BF16_SIGNATURE,
                    config,
                    variant="sweep",
                    **bf16_constexprs(module, config, **plain),
                )
            )
        reports.append(
            compile_for(
                target,
                kernel,
                {**_BF16_SIGNATURE, "q_ptr": "*bf16"},
                decode,
                heads=32,
                variant="bf16 q, 32 heads",
                **{
                    **bf16_constexprs(module, decode, group_rows=1, length_aware=True, fill_tail=False),
                    "Q_FP8": False,
                },
            )
        )
    from verify.core.upstream import load_bf16_prefill_module

    prefill_module, _ = load_bf16_prefill_module()
    for target in targets:
        for name, config, options, production in prefill_variants(prefill_module, target, all_configs):
            options = dict(options)
            heads = options.pop("heads", 64)
            sig = {**_PREFILL_SIGNATURE, "q_ptr": "*fp8e4nv" if options.get("q_fp8", True) else "*bf16"}
            report = compile_for(
                target,
                prefill_module._bf16_mqa_logits_kernel,
                sig,
                config,
                heads=heads,
                variant=name,
                **prefill_constexprs(config, **options),
            )
            reports.append(report if production else replace(report, production=False))
    if "sm90" in targets:
        reports.append(
            compile_for(
                "sm90",
                fp8_twin._fp8_paged_mqa_logits_twin_kernel,
                _TWIN_SIGNATURE,
                decode,
                variant="fp8 twin",
            )
        )
    return reports


def as_json(reports: list[CompileReport]) -> dict[str, Any]:
    import triton

    return {
        "triton": triton.__version__,
        SERIES_HASH: series_hash(),
        "shared_memory": {
            t: {"per_block": P.SHARED_MEMORY[t][0], "per_sm": P.SHARED_MEMORY[t][1]}
            for t in sorted({r.target for r in reports})
        },
        "reports": [
            {
                **asdict(r),
                "ok": r.ok,
                "pipelined": r.pipelined,
                "notes": r.notes,
                "shared_limit": r.shared_limit,
            }
            for r in reports
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--all", action="store_true", help="every config of CONFIG_SWEEP, not just the default"
    )
    parser.add_argument(
        "--targets",
        nargs="+",
        choices=sorted(TARGETS),
        default=list(TARGETS),
        help="the GPUs to compile for (default: all)",
    )
    parser.add_argument("--out", type=Path, help="also write the reports as JSON to this file")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    print(f"triton {triton.__version__}, targets {' '.join(args.targets)}")
    reports = compile_read_kernels(args.all, tuple(args.targets))
    bad = 0
    for r in reports:
        # Production variants must launch everywhere; on sm_90, the GPU their configs were tuned
        # on, they must also be free of notes.
        failed = r.production and not (r.clean if r.target == "sm90" else r.ok)
        bad += failed
        tag = "BAD" if failed else ("ok " if r.production else "cmp")
        print(
            f"{tag} {r.target:<5} {r.kernel:<34} {r.variant:<52} {r.config} "
            f"smem={r.shared_bytes} (limit {r.shared_limit}) {TARGETS[r.target][1]}={r.tensor_core} "
            f"async_copies={r.async_copies} loop async_wait={r.loop_waits} "
            f"registers={r.registers} spill_bytes={r.spill_bytes}"
            + (f" notes: {'; '.join(r.notes)}" if r.notes else "")
        )
    if args.out:
        import json

        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(as_json(reports), indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
