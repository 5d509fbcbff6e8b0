"""GPU benchmark, kernels: the device ceilings (copy bandwidth, bf16 matmul) and each Triton kernel's
bf16 error and GB/s against its torch reference (SConv, XSA, MoE permute/unpermute, grouped GEMM).
Run through benchmarks/gpu.py."""

from __future__ import annotations

import math

import gpu_common as common
from gpu_common import CEIL, err_row, gbps_row, get_kernels, random_doc_ids, row, section, tflops_row, timeit

# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


@section
def bench_ceilings(dev):
    import torch

    n = (1 << 20) if common.ARGS.tiny else (1 << 29)  # 1 GiB of bf16
    x = torch.randn(n, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = timeit(lambda: y.copy_(x), dev, iters=20)
    CEIL["copy_GBps"] = 2 * x.numel() * 2 / (ms * 1e-3) / 1e9
    row("ceiling", f"device copy {x.numel() * 2 / 2**30:.2f} GiB bf16 (read+write)", CEIL["copy_GBps"], "GB/s", None,
        f"{ms:.3f} ms")
    x = y = None  # free the 1 GiB pair before the matmul ceiling
    m = 256 if common.ARGS.tiny else 8192
    a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    ms = timeit(lambda: a @ b, dev, warmup=3, iters=10)
    CEIL["matmul_TFLOPs"] = 2 * m**3 / (ms * 1e-3) / 1e12
    row("ceiling", f"bf16 matmul {m}^3", CEIL["matmul_TFLOPs"], "TFLOP/s", None, f"{ms:.3f} ms")


@section
def bench_sconv(dev, K):
    import torch
    import torch.nn.functional as F

    from marin_ablate.marin.kernels.reference import sconv_reference
    from marin_ablate.marin.kernels.sconv import sconv_bwd, sconv_fwd

    B, S, C = (2, 64, 32) if common.ARGS.tiny else (8, 4096, 2048)
    bf = torch.bfloat16
    x = torch.randn(B, S, C, device=dev, dtype=bf)
    w = torch.randn(4, C, device=dev, dtype=bf) * 0.5
    doc = random_doc_ids(B, S, 512 if not common.ARGS.tiny else 16, dev)
    dy = torch.randn_like(x)
    shape = f"B{B} S{S} C{C} bf16"

    # bf16 correctness against the fp32 reference (the interpreter cannot check bf16 on CPU)
    err_row("sconv", "fwd bf16 vs fp32 reference", sconv_fwd(x, w, doc), sconv_reference(x.float(), w.float(), doc),
            1e-2)
    xs, ws, ds, dys = x[:2, : min(S, 1024), :512], w[:, :512], doc[:2, : min(S, 1024)], dy[:2, : min(S, 1024), :512]
    dx, dw = sconv_bwd(xs.contiguous(), ws.contiguous(), ds.contiguous(), dys.contiguous())
    xr, wr = xs.float().requires_grad_(), ws.float().requires_grad_()
    dxr, dwr = torch.autograd.grad(sconv_reference(xr, wr, ds), (xr, wr), dys.float())
    err_row("sconv", "bwd dx bf16 vs fp32 reference", dx, dxr, 1e-2)
    err_row("sconv", "bwd dw (fp32 accumulate) vs fp32 reference", dw, dwr, 2e-2)

    act = B * S * C * 2
    fwd_bytes, bwd_bytes = 2 * act + doc.numel() * 8, 3 * act + doc.numel() * 8
    best = gbps_row("sconv", f"triton fwd {shape}", fwd_bytes, timeit(lambda: sconv_fwd(x, w, doc), dev))
    if not common.ARGS.quick and not common.ARGS.tiny:
        for bs, bc, nw in ((16, 256, 4), (8, 256, 4), (32, 256, 8), (16, 512, 8), (8, 512, 4), (32, 128, 4)):
            ms = timeit(lambda: sconv_fwd(x, w, doc, block_s=bs, block_c=bc, num_warps=nw), dev)
            best = max(best, gbps_row("sconv", f"  fwd block_s={bs} block_c={bc} warps={nw}", fwd_bytes, ms))
    best_b = gbps_row("sconv", f"triton bwd dx+dw {shape}", bwd_bytes, timeit(lambda: sconv_bwd(x, w, doc, dy), dev))
    if not common.ARGS.quick and not common.ARGS.tiny:
        for bs, bc, tiles, nw in ((8, 128, 8, 4), (16, 128, 8, 4), (8, 256, 16, 4), (16, 256, 4, 8), (2, 2048, 32, 8)):
            ms = timeit(lambda: sconv_bwd(x, w, doc, dy, block_s=bs, block_c=bc, tiles=tiles, num_warps=nw), dev)
            best_b = max(best_b, gbps_row("sconv", f"  bwd block_s={bs} block_c={bc} tiles={tiles} warps={nw}",
                                          bwd_bytes, ms))
    for nm, gb in (("fwd", best), ("bwd", best_b)):
        row("sconv", f"best triton {nm} vs the 2.5 TB/s target", gb, "GB/s", "met" if gb >= 2500 else "not met")

    # Baselines: depthwise F.conv1d on (B, C, S) (no document masking, transposes not timed) and the
    # torch reference (with masking), eager and compiled.
    x_BCS = x.transpose(1, 2).contiguous()
    w_C1K = w.flip(0).T.contiguous().unsqueeze(1)
    conv = lambda: F.conv1d(F.pad(x_BCS, (K - 1, 0)), w_C1K, groups=C)  # noqa: E731
    gbps_row("sconv", "F.conv1d depthwise fwd (no doc mask)", 2 * act, timeit(conv, dev))
    gbps_row("sconv", "torch reference fwd eager", fwd_bytes, timeit(lambda: sconv_reference(x, w, doc), dev))
    if not common.ARGS.quick and dev.type == "cuda":
        ref_c = torch.compile(sconv_reference)
        gbps_row("sconv", "torch reference fwd torch.compile", fwd_bytes, timeit(lambda: ref_c(x, w, doc), dev))

    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    kern = get_kernels("triton" if common.TRITON_OK else "torch")

    def fb(f):
        return lambda: torch.autograd.grad(f(xg, wg, doc), (xg, wg), dy)

    gbps_row("sconv", "triton fwd+bwd (autograd)", fwd_bytes + bwd_bytes, timeit(fb(kern.sconv), dev))
    gbps_row("sconv", "torch reference fwd+bwd eager", fwd_bytes + bwd_bytes, timeit(fb(sconv_reference), dev))


@section
def bench_xsa(dev):
    import torch

    from marin_ablate.marin.kernels import xsa_gate_torch
    from marin_ablate.marin.kernels.reference import xsa_reference
    from marin_ablate.marin.kernels.xsa import xsa_bwd, xsa_fwd

    B, H, Kv, S, D = (2, 4, 2, 32, 16) if common.ARGS.tiny else (8, 16, 4, 4096, 128)
    bf = torch.bfloat16
    y = torch.randn(B, H, S, D, device=dev, dtype=bf)
    v = torch.randn(B, Kv, S, D, device=dev, dtype=bf)
    a = torch.randn(B, S, H, device=dev, dtype=bf)
    dz = torch.randn(B, H, S, D, device=dev, dtype=bf)
    shape = f"B{B} H{H} K{Kv} S{S} D{D} bf16"

    err_row("xsa", "fwd bf16 vs fp32 reference", xsa_fwd(y, v), xsa_reference(y.float(), v.float()), 1e-2)
    err_row("xsa", "gate fwd bf16 vs fp32 reference", xsa_fwd(y, v, a), xsa_gate_torch(y.float(), v.float(), a.float()),
            1e-2)
    sl = slice(0, min(S, 512))
    ys, vs, as_, dzs = (t[:, :, sl].contiguous() for t in (y, v, a.transpose(1, 2), dz))
    as_ = as_.transpose(1, 2).contiguous()
    dy, dv, dg = xsa_bwd(ys, vs, as_, dzs)
    yr, vr, ar = (t.float().requires_grad_() for t in (ys, vs, as_))
    ref = torch.autograd.grad(xsa_gate_torch(yr, vr, ar), (yr, vr, ar), dzs.float())
    for nm, got, r in zip(("dy", "dv", "dgate"), (dy, dv, dg), ref, strict=True):
        err_row("xsa", f"gate bwd {nm} bf16 vs fp32 reference", got, r, 2e-2)

    q_bytes, kv_bytes = y.numel() * 2, v.numel() * 2
    fwd_bytes, bwd_bytes = 2 * q_bytes + kv_bytes, 3 * q_bytes + 2 * kv_bytes
    gbps_row("xsa", f"triton fwd {shape}", fwd_bytes, timeit(lambda: xsa_fwd(y, v), dev))
    gbps_row("xsa", "triton bwd", bwd_bytes, timeit(lambda: xsa_bwd(y, v, None, dz), dev))
    gbps_row("xsa", "triton fused gate fwd", fwd_bytes + a.numel() * 2, timeit(lambda: xsa_fwd(y, v, a), dev))
    gbps_row("xsa", "triton fused gate bwd", bwd_bytes + 2 * a.numel() * 2, timeit(lambda: xsa_bwd(y, v, a, dz), dev))
    gbps_row("xsa", "torch reference fwd eager", fwd_bytes, timeit(lambda: xsa_reference(y, v), dev))
    gbps_row("xsa", "torch reference + gate fwd eager", fwd_bytes, timeit(lambda: xsa_gate_torch(y, v, a), dev))
    if not common.ARGS.quick and dev.type == "cuda":
        ref_c = torch.compile(xsa_gate_torch)
        gbps_row("xsa", "torch reference + gate fwd torch.compile", fwd_bytes, timeit(lambda: ref_c(y, v, a), dev))
    if not common.ARGS.quick and not common.ARGS.tiny:
        for bs, nw in ((8, 4), (32, 4), (16, 8), (32, 8)):
            gbps_row("xsa", f"  fwd block_s={bs} warps={nw}", fwd_bytes,
                     timeit(lambda: xsa_fwd(y, v, block_s=bs, num_warps=nw), dev))
            gbps_row("xsa", f"  bwd block_s={bs} warps={nw}", bwd_bytes,
                     timeit(lambda: xsa_bwd(y, v, None, dz, block_s=bs, num_warps=nw), dev))


@section
def bench_moe_permute(dev):
    import torch

    from marin_ablate.marin.kernels.torch_ops import permute_torch, sort_by_expert, unpermute_torch

    T, W, K, E = (64, 32, 2, 4) if common.ARGS.tiny else (32768, 1024, 8, 64)
    bf = torch.bfloat16
    x = torch.randn(T, W, device=dev, dtype=bf)
    eidx = torch.rand(T, E, device=dev).topk(K, dim=1).indices
    keep = torch.rand(T, K, device=dev) > 0.01
    src, _ = sort_by_expert(eidx, E, keep)
    N = src.numel()
    c = torch.rand(T, K, device=dev)
    yn = torch.randn(N, W, device=dev, dtype=bf)
    dy = torch.randn(T, W, device=dev, dtype=bf)
    kt = get_kernels("triton")
    err_row("moe", "permute bf16 exact", kt.permute(x, src, K), permute_torch(x, src, K), 0.0)
    err_row("moe", "unpermute bf16 vs fp32", kt.unpermute(yn, src, c), unpermute_torch(yn.float(), src, c), 1e-2)
    shape = f"T{T} W{W} top{K} N{N} bf16"
    rowb = W * 2
    gbps_row("moe", f"triton permute fwd {shape}", 2 * N * rowb, timeit(lambda: kt.permute(x, src, K), dev))
    gbps_row("moe", "torch permute fwd (index)", 2 * N * rowb, timeit(lambda: permute_torch(x, src, K), dev))
    gbps_row("moe", "triton unpermute fwd", N * rowb + T * rowb, timeit(lambda: kt.unpermute(yn, src, c), dev))
    gbps_row("moe", "torch unpermute fwd (index_add)", N * rowb + T * rowb,
             timeit(lambda: unpermute_torch(yn, src, c), dev))
    xg, yg, cg = x.clone().requires_grad_(), yn.clone().requires_grad_(), c.clone().requires_grad_()
    dxn = torch.randn(N, W, device=dev, dtype=bf)
    for nm, f in (("triton", kt.permute), ("torch", permute_torch)):
        out = f(xg, src, K)
        gbps_row("moe", f"{nm} permute bwd", N * rowb + T * rowb,
                 timeit(lambda: torch.autograd.grad(out, xg, dxn, retain_graph=True), dev))
    for nm, f in (("triton", kt.unpermute), ("torch", unpermute_torch)):
        out = f(yg, src, cg)
        gbps_row("moe", f"{nm} unpermute bwd", 3 * N * rowb,
                 timeit(lambda: torch.autograd.grad(out, (yg, cg), dy, retain_graph=True), dev))


@section
def bench_grouped_gemm(dev):
    import torch

    from marin_ablate.marin.kernels.torch_ops import grouped_mm_torch, sort_by_expert

    T, K, E, I, O = (64, 2, 4, 32, 32) if common.ARGS.tiny else (16384, 8, 64, 1024, 512)
    # The interpreter's bf16 tl.dot is wrong (fp16 is exact): on CPU check the code path in fp16.
    bf = torch.bfloat16 if dev.type == "cuda" else torch.float16
    eidx = torch.rand(T, E, device=dev).topk(K, dim=1).indices
    _, offs = sort_by_expert(eidx, E)
    N = T * K
    x = torch.randn(N, I, device=dev, dtype=bf)
    w = torch.randn(E, I, O, device=dev, dtype=bf) / math.sqrt(I)
    dy = torch.randn(N, O, device=dev, dtype=bf)
    kt = get_kernels("triton")
    err_row("gmm", f"triton fwd {str(bf)[6:]} vs fp32 torch", kt.grouped_mm(x, w, offs),
            grouped_mm_torch(x.float(), w.float(), offs), 2e-2)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
    got = torch.autograd.grad(kt.grouped_mm(xg, wg, offs), (xg, wg), dy)
    ref = torch.autograd.grad(grouped_mm_torch(xr, wr, offs), (xr, wr), dy.float())
    err_row("gmm", "triton bwd dx vs fp32 torch", got[0], ref[0], 2e-2)
    err_row("gmm", "triton bwd dw vs fp32 torch", got[1], ref[1], 2e-2)
    flops = 2 * N * I * O
    shape = f"N{N} I{I} O{O} E{E} {str(bf)[6:]}"
    tflops_row("gmm", f"triton grouped GEMM fwd {shape}", flops, timeit(lambda: kt.grouped_mm(x, w, offs), dev))
    tflops_row("gmm", "torch grouped_mm fwd (torch._grouped_mm on sm90)", flops,
               timeit(lambda: grouped_mm_torch(x, w, offs), dev))
    for nm, f in (("triton", kt.grouped_mm), ("torch", grouped_mm_torch)):
        tflops_row("gmm", f"{nm} grouped GEMM fwd+bwd", 3 * flops,
                   timeit(lambda: torch.autograd.grad(f(xg, wg, offs), (xg, wg), dy), dev))
