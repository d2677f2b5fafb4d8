"""Compile the read kernels for sm_90 without a GPU and report what the compiler made of them.

Triton compiles for a named target without a device (it carries its own ptxas), so CPU machines
and CI can check what only a GPU run would otherwise reveal: that every launch config compiles
under the installed Triton (the GPU machine has 3.6), that the dot became Hopper ``wgmma``, that
the key loads are pipelined (the main loop's ``async_wait`` leaves tiles in flight), and that
shared memory fits an SM. Run it as::

    PYTHONPATH=<repo>:<patched tree>/python python -m verify.bench.read_compile [--all]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

SM90_SMEM_LIMIT = 227 * 1024

_BF16_SIGNATURE = {
    "q_ptr": "*fp8e4nv",
    "k_ptr": "*bf16",
    "w_ptr": "*fp32",
    "lens_ptr": "*i32",
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
    "n_out",
    "max_pages",
    "split_n",
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


@dataclass
class CompileReport:
    kernel: str
    config: dict[str, Any]
    shared_bytes: int
    wgmma: bool
    loop_waits: list[int]  # async_wait counts inside the first scf.for (the key loop)

    @property
    def pipelined(self) -> bool:
        return bool(self.loop_waits) and self.loop_waits[0] >= 1

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= SM90_SMEM_LIMIT


def compile_sm90(
    kernel: Any, pointer_sig: dict[str, str], config: Any, heads: int = 64, **constexprs: Any
) -> CompileReport:
    """Compile one Triton kernel of the read path for sm_90 (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    names = kernel.arg_names
    signature = dict(pointer_sig)
    signature.update({name: "i32" for name in _INT_ARGS if name in names})
    consts = {
        "H": heads,
        "D": 128,
        "PAGE": 64,
        "BLOCK_N": config.block_n,
        "SWAP_AB": config.swap_ab,
        "INTERPRET": False,
        **constexprs,
    }
    signature.update({name: "constexpr" for name in consts})
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in _ALIGNED if a in names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton_compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
    )
    ttgir = compiled.asm["ttgir"]
    loop = ttgir[ttgir.index("scf.for") :] if "scf.for" in ttgir else ""
    waits = [int(n) for n in re.findall(r"async_wait[^{\n]*\{num = (\d+)", loop)]
    return CompileReport(
        kernel=kernel.__name__,
        config={k: getattr(config, k) for k in ("block_n", "split_n", "swap_ab", "num_warps", "num_stages")},
        shared_bytes=int(compiled.metadata.shared),
        wgmma="wgmma" in compiled.asm["ptx"],
        loop_waits=waits,
    )


def compile_read_kernels(all_configs: bool = False) -> list[CompileReport]:
    """The bf16 kernel (fp8 and bf16 q) and the fp8 twin, default configs or the whole sweep."""
    from verify.bench import fp8_twin
    from verify.parity.upstream_read import load_bf16_kernel_module

    if fp8_twin.INTERPRETED:
        raise RuntimeError(
            "unset TRITON_INTERPRET: the compile check needs the compiled (not interpreted) kernels"
        )
    module, _ = load_bf16_kernel_module()
    configs = list(module.CONFIG_SWEEP) if all_configs else [module.CONFIGS["decode"]]
    kernel = module._bf16_paged_mqa_logits_kernel
    reports = []
    for config in configs:
        reports.append(compile_sm90(kernel, _BF16_SIGNATURE, config, Q_FP8=True, FILL_TAIL=True))
        reports.append(
            compile_sm90(
                kernel, {**_BF16_SIGNATURE, "q_ptr": "*bf16"}, config, heads=32, Q_FP8=False, FILL_TAIL=False
            )
        )
        reports.append(compile_sm90(fp8_twin._fp8_paged_mqa_logits_twin_kernel, _TWIN_SIGNATURE, config))
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--all", action="store_true", help="every config of CONFIG_SWEEP, not just the default"
    )
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    print(f"triton {triton.__version__}, target sm_90")
    bad = 0
    for r in compile_read_kernels(args.all):
        ok = r.wgmma and r.fits
        bad += not ok
        print(
            f"{'ok ' if ok else 'BAD'} {r.kernel:<36} {r.config} smem={r.shared_bytes} wgmma={r.wgmma} "
            f"loop async_wait={r.loop_waits}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
