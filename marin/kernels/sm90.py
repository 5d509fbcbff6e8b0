"""Compile every Triton kernel of this package for Hopper (sm_90) on a machine without a GPU.

The interpreter (TRITON_INTERPRET=1) runs kernels as numpy and accepts code the real compiler
rejects; this builds each kernel through triton's full pipeline (TTIR -> PTX -> cubin with the
ptxas bundled in the triton wheel) at the shapes and dtypes the model uses (bf16 operands, the
default block sizes, runtime specialisation of unit strides and 16-divisible ints mimicked), and
reads registers, spill stack and shared memory from the cubin. `python -m marin_ablate.marin.kernels.sm90`
prints the table (run it with TRITON_INTERPRET unset). Needs triton; imports it.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from marin_ablate.marin.kernels import moe, sconv, xsa


@dataclass(frozen=True)
class KernelBuild:
    name: str
    config: str
    registers: int | None
    stack_bytes: int | None  # > 0 means spills (or a local array)
    shared_bytes: int
    uses_wgmma: bool


def _jit(kernel) -> JITFunction:
    # Under TRITON_INTERPRET=1 @triton.jit yields an InterpretedFunction; rebuild the real one.
    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def compile_sm90(kernel, ptrs: dict[str, str], consts: dict, *, unit_strides=(), num_warps=4, num_stages=3,
                 capability: int = 90) -> KernelBuild:
    """Compile `kernel` for cuda:`capability`; pointer args typed by `ptrs` (e.g. "*bf16"), other
    non-constexpr args i32 and 16-divisible, `unit_strides` specialised to 1 as triton does at launch."""
    fn = _jit(kernel)
    names = list(inspect.signature(fn.fn).parameters)
    consts = dict(consts, **{n: 1 for n in unit_strides})
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n not in consts}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    regs = stack = None
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if os.path.exists(cuobjdump):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+)", out)
        if m:
            regs, stack = int(m.group(1)), int(m.group(2))
    cfg = ", ".join(f"{a}={b}" for a, b in consts.items() if a not in unit_strides and not isinstance(b, tl.dtype))
    return KernelBuild(fn.fn.__name__, f"{cfg}, warps={num_warps}", regs, stack, k.metadata.shared,
                       "wgmma" in k.asm["ptx"])


def builds() -> list[KernelBuild]:
    """Every kernel at the model's bf16 shapes and this package's default block sizes."""
    bf, f32 = "*bf16", tl.float32
    s_bs, s_bc, s_nw = sconv.launch_config(2048)
    x_bs, x_bd = xsa.blocks(128, None)
    r_bn, r_bw = moe.row_blocks(1024, 2)
    g_bm, g_bn, g_bk, g_nw, g_ns = moe.gmm_blocks(1 << 17, 1024, 512, 2)
    return [
        compile_sm90(sconv.sconv_fwd_kernel, dict(x_ptr=bf, w_ptr=bf, doc_ptr="*i64", out_ptr=bf),
                     dict(K=4, HAS_DOC=True, ACC=f32, BLOCK_S=s_bs, BLOCK_C=s_bc),
                     unit_strides=("sxc", "swc", "sds", "soc"), num_warps=s_nw),
        compile_sm90(sconv.sconv_bwd_kernel,
                     dict(x_ptr=bf, w_ptr=bf, doc_ptr="*i64", dy_ptr=bf, dx_ptr=bf, dwp_ptr="*fp32"),
                     dict(K=4, KP=4, HAS_DOC=True, ACC=f32, BLOCK_S=s_bs, BLOCK_C=s_bc),
                     unit_strides=("sxc", "swc", "sds", "syc", "sdxc"), num_warps=s_nw),
        compile_sm90(xsa.xsa_fwd_kernel, dict(y_ptr=bf, v_ptr=bf, g_ptr=bf, z_ptr=bf),
                     dict(G=4, HAS_GATE=True, ACC=f32, EPS=xsa.XSA_EPS, BLOCK_S=x_bs, BLOCK_D=x_bd),
                     unit_strides=("syd", "svd", "sgh", "szd"), num_warps=4),
        compile_sm90(xsa.xsa_bwd_kernel,
                     dict(y_ptr=bf, v_ptr=bf, g_ptr=bf, dz_ptr=bf, dy_ptr=bf, dv_ptr=bf, dg_ptr=bf),
                     dict(G=4, HAS_GATE=True, ACC=f32, EPS=xsa.XSA_EPS, BLOCK_S=x_bs, BLOCK_D=x_bd),
                     unit_strides=("syd", "svd", "sgh", "sdzd", "sdyd", "sdvd", "sdgh"), num_warps=8),
        compile_sm90(moe.gather_rows_kernel, dict(x_ptr=bf, idx_ptr="*i64", out_ptr=bf),
                     dict(BLOCK_N=r_bn, BLOCK_W=r_bw), unit_strides=("sxw", "sow")),
        compile_sm90(moe.combine_rows_kernel, dict(y_ptr=bf, pos_ptr="*i64", c_ptr="*fp32", out_ptr=bf),
                     dict(K=8, HAS_C=True, ACC=f32, BLOCK_T=r_bn, BLOCK_W=r_bw), unit_strides=("syw", "sow")),
        compile_sm90(moe.unpermute_bwd_kernel,
                     dict(dy_ptr=bf, y_ptr=bf, src_ptr="*i64", c_ptr="*fp32", dyn_ptr=bf, dc_ptr="*fp32"),
                     dict(ACC=f32, BLOCK_N=r_bn, BLOCK_W=r_bw), unit_strides=("sdw", "syw", "sow")),
        compile_sm90(moe.gmm_kernel,
                     dict(x_ptr=bf, w_ptr=bf, y_ptr=bf, offs_ptr="*i32", tile_end_ptr="*i32", tile_group_ptr="*i32"),
                     dict(ACC=f32, PREC="tf32", BM=g_bm, BN=g_bn, BK=g_bk), unit_strides=("sxi", "swo", "syo"),
                     num_warps=g_nw, num_stages=g_ns),
        # dx = dy @ w^T: the same kernel with w read transposed (unit stride on I instead of O)
        compile_sm90(moe.gmm_kernel,
                     dict(x_ptr=bf, w_ptr=bf, y_ptr=bf, offs_ptr="*i32", tile_end_ptr="*i32", tile_group_ptr="*i32"),
                     dict(ACC=f32, PREC="tf32", BM=g_bm, BN=min(128, g_bn), BK=g_bk),
                     unit_strides=("sxi", "swi", "syo"), num_warps=g_nw, num_stages=g_ns),
        compile_sm90(moe.gmm_dw_kernel, dict(x_ptr=bf, dy_ptr=bf, dw_ptr=bf, offs_ptr="*i32"),
                     dict(ACC=f32, PREC="tf32", BM=64, BN=128, BK=64), unit_strides=("sxi", "syo", "swo"), num_warps=8),
    ]


def main(argv: list[str] | None = None) -> int:
    import json
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise ValueError("TRITON_INTERPRET is set: the interpreter patches triton.language, so the compiler "
                         "cannot run in this process; allowed: run with TRITON_INTERPRET unset")
    results = builds()
    if "--json" in argv:
        print(json.dumps([b.__dict__ for b in results]))
        return 0
    print(f"triton {triton.__version__}, target cuda sm_90")
    print(f"{'kernel':24s} {'regs':>5s} {'stack':>6s} {'smem':>7s} {'wgmma':>6s}  config")
    for b in results:
        print(f"{b.name:24s} {b.registers!s:>5s} {b.stack_bytes!s:>6s} {b.shared_bytes:>7d} {b.uses_wgmma!s:>6s}  "
              f"{b.config}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
