#!/usr/bin/env python3
"""One-GPU benchmark of the recipe's kernels and blocks (run on one H200; ≤ 8 min, --quick ≤ 1 min).

Measures: device copy bandwidth and the bf16 matmul rate (the ceilings); each Triton kernel's bf16
error against the fp32 reference and its GB/s against the copy bandwidth (SConv vs depthwise
F.conv1d and the torch reference, XSA, MoE permute / unpermute, the Triton grouped GEMM vs
torch._grouped_mm); the recipe block (all switches on, marin.model.Block) vs a plain block (SDPA
with QK norm, top-8 of 64 experts via torch._grouped_mm, one shared expert) fwd+bwd TFLOP/s, eager
and torch.compile'd; a full-model training step's MFU at the d1024 preset. Before the speed of the
fast path (flex attention, Triton kernels, compiled blocks) it checks its parity with eager
sdpa/torch on one model, and that an eager training step makes no host sync. Prints a table and
appends it (markdown, with date and device) to benchmarks/RESULTS.md.

Imports only torch and marin.{config, model, moe, dispatch, kernels, flops, optim} (the GPU machine
has no submitit / optuna / datasets). Every section runs in its own try/except. CPU dry run of the code
paths: `python benchmarks/gpu.py --device cpu --quick --tiny` (Triton under its interpreter).
The sections live by what they measure: `gpu_kernels.py` (ceilings and kernels), `gpu_model.py`
(parity, host syncs, blocks, full model); `gpu_common.py` holds the options, rows and timing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however this file is run

import gpu_common as common  # noqa: E402
from gpu_common import ROOT, elapsed, row, write_markdown  # noqa: E402
from gpu_kernels import bench_ceilings, bench_grouped_gemm, bench_moe_permute, bench_sconv, bench_xsa  # noqa: E402
from gpu_model import bench_blocks, bench_full_model, bench_model_parity, bench_syncs  # noqa: E402


def main(argv=None) -> int:
    common.ARGS = ARGS = common.parse_args(argv)
    want = ARGS.device or ("cuda" if _cuda_available() else "cpu")
    if want == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton code paths run under the interpreter
        ARGS.tiny = True  # full shapes on CPU would take hours
    import torch

    dev = torch.device(want)
    try:
        import triton

        common.TRITON_OK = True
        tv = triton.__version__
    except ImportError:
        tv = "absent"
    dev_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    header = (f"torch {torch.__version__}, triton {tv}, device {dev_name}"
              f"{', --quick' if ARGS.quick else ''}{', --tiny' if ARGS.tiny else ''}")
    print(header, flush=True)
    torch.manual_seed(0)
    print(f"  {'section':10s} {'measurement':48s} {'value':>12s} {'unit':8s} {'vs':>10s} note")

    bench_ceilings(dev)
    if ARGS.blocks_only:
        bench_blocks(dev, compiled=dev.type == "cuda" or ARGS.compile_cpu)
        print(f"\ntotal {elapsed():.0f}s")
        return 0
    if common.TRITON_OK:
        bench_sconv(dev, 4)
        bench_xsa(dev)
        bench_moe_permute(dev)
        bench_grouped_gemm(dev)
        bench_model_parity(dev)
    else:
        row("kernels", "Triton sections", "skipped: triton not installed", "")
    bench_syncs(dev)
    # The two targets that need torch.compile come before the eager blocks (reference rows only), so
    # a tight time budget cuts those first.
    if not ARGS.quick:
        if dev.type == "cuda" or ARGS.compile_cpu:
            bench_blocks(dev, compiled=True)
        if elapsed() < ARGS.budget_s - 60:
            bench_full_model(dev)
        else:
            row("model", "full model", "skipped (time budget)", "")
    if ARGS.no_blocks:
        pass
    elif ARGS.quick or elapsed() < ARGS.budget_s - 30:
        bench_blocks(dev)
    else:
        row("blocks", "eager blocks", "skipped (time budget)", "")
    print(f"\ntotal {elapsed():.0f}s")
    out = ARGS.out or (str(ROOT / "benchmarks" / "RESULTS.md") if dev.type == "cuda" else None)
    if out and not ARGS.no_write:
        write_markdown(Path(out), dev_name, header)
    return 0


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
