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
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the GPU machine runs the repo without installing it

H200_BF16_DENSE_TFLOPS = 989.4  # datasheet dense bf16, for a second MFU column


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--quick", action="store_true", help="a ~1-minute subset: no config sweeps, no compile, no full model")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU dry run of the code paths)")
    p.add_argument("--out", default=None, help="markdown file to append to (default benchmarks/RESULTS.md on cuda)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--budget-s", type=float, default=450.0, help="skip remaining optional sections past this")
    p.add_argument("--compile-cpu", action="store_true", help="also run the torch.compile'd blocks on CPU (slow)")
    args = p.parse_args(argv)
    if args.device not in (None, "cuda", "cpu"):
        p.error(f"--device={args.device!r}; allowed values: 'cuda', 'cpu'")
    return args


ARGS = None
ROWS: list[dict] = []
CEIL = {"copy_GBps": None, "matmul_TFLOPs": None}
T0 = time.time()


def row(section, name, value, unit, vs=None, note=""):
    ROWS.append(dict(section=section, name=name, value=value, unit=unit, vs=vs, note=note))
    v = f"{value:,.3g}" if isinstance(value, (int, float)) and value is not None else str(value)
    print(f"  {section:10s} {name:48s} {v:>12s} {unit:8s} {vs or '':>10s} {note}", flush=True)


def gbps_row(section, name, nbytes, ms, note=""):
    gb = nbytes / (ms * 1e-3) / 1e9
    vs = f"{100 * gb / CEIL['copy_GBps']:.0f}% copy" if CEIL["copy_GBps"] else None
    row(section, name, gb, "GB/s", vs, note or f"{ms:.3f} ms")
    return gb


def tflops_row(section, name, flops, ms, note=""):
    tf = flops / (ms * 1e-3) / 1e12
    vs = f"{100 * tf / CEIL['matmul_TFLOPs']:.0f}% mm" if CEIL["matmul_TFLOPs"] else None
    row(section, name, tf, "TFLOP/s", vs, note or f"{ms:.2f} ms")
    return tf


def err_row(section, name, got, ref, tol):
    import torch

    got, ref = got.float(), ref.float()
    rel = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
    row(section, name, rel, "rel err", "ok" if rel <= tol else "FAIL", f"max|Δ|/max|ref|, tol {tol:g}")
    return rel


def elapsed() -> float:
    return time.time() - T0


def section(fn):
    """Run one section; report its failure as a row and carry on."""

    def run(*a, **k):
        name = fn.__name__.removeprefix("bench_")
        print(f"\n== {name} (t={elapsed():.0f}s)", flush=True)
        t = time.time()
        try:
            fn(*a, **k)
        except Exception as e:  # noqa: BLE001 - one failure must not kill the rest
            traceback.print_exc()
            row(name, "SECTION FAILED", f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}", "", None)
        print(f"   ({time.time() - t:.1f}s)", flush=True)

    return run


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timeit(fn, dev, warmup=2, iters=10) -> float:
    """Milliseconds per call (CUDA events on GPU, wall clock on CPU)."""
    import torch

    if ARGS.tiny:
        warmup, iters = 1, 2
    for _ in range(warmup):
        fn()
    sync(dev)
    if dev.type == "cuda":
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize(dev)
        return s.elapsed_time(e) / iters
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) * 1e3 / iters


def random_doc_ids(B, S, mean_len, dev):
    """Packed-document ids: boundaries at random positions, ~S/mean_len documents per row."""
    import torch

    starts = (torch.rand(B, S, device=dev) < 1.0 / mean_len).long()
    starts[:, 0] = 1
    return torch.cumsum(starts, 1) - 1


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


@section
def bench_ceilings(dev):
    import torch

    n = (1 << 20) if ARGS.tiny else (1 << 29)  # 1 GiB of bf16
    x = torch.randn(n, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = timeit(lambda: y.copy_(x), dev, iters=20)
    CEIL["copy_GBps"] = 2 * x.numel() * 2 / (ms * 1e-3) / 1e9
    row("ceiling", f"device copy {x.numel() * 2 / 2**30:.2f} GiB bf16 (read+write)", CEIL["copy_GBps"], "GB/s", None,
        f"{ms:.3f} ms")
    del x, y
    m = 256 if ARGS.tiny else 8192
    a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    ms = timeit(lambda: a @ b, dev, warmup=3, iters=10)
    CEIL["matmul_TFLOPs"] = 2 * m**3 / (ms * 1e-3) / 1e12
    row("ceiling", f"bf16 matmul {m}^3", CEIL["matmul_TFLOPs"], "TFLOP/s", None, f"{ms:.3f} ms")


@section
def bench_sconv(dev, K):
    import torch
    import torch.nn.functional as F

    from marin.kernels.reference import sconv_reference
    from marin.kernels.sconv import sconv_bwd, sconv_fwd

    B, S, C = (2, 64, 32) if ARGS.tiny else (8, 4096, 2048)
    bf = torch.bfloat16
    x = torch.randn(B, S, C, device=dev, dtype=bf)
    w = torch.randn(4, C, device=dev, dtype=bf) * 0.5
    doc = random_doc_ids(B, S, 512 if not ARGS.tiny else 16, dev)
    dy = torch.randn_like(x)
    shape = f"B{B} S{S} C{C} bf16"

    # bf16 correctness against the fp32 reference (the interpreter cannot check bf16 on CPU)
    err_row("sconv", "fwd bf16 vs fp32 reference", sconv_fwd(x, w, doc), sconv_reference(x.float(), w.float(), doc), 1e-2)
    xs, ws, ds, dys = x[:2, : min(S, 1024), :512], w[:, :512], doc[:2, : min(S, 1024)], dy[:2, : min(S, 1024), :512]
    dx, dw = sconv_bwd(xs.contiguous(), ws.contiguous(), ds.contiguous(), dys.contiguous())
    xr, wr = xs.float().requires_grad_(), ws.float().requires_grad_()
    dxr, dwr = torch.autograd.grad(sconv_reference(xr, wr, ds), (xr, wr), dys.float())
    err_row("sconv", "bwd dx bf16 vs fp32 reference", dx, dxr, 1e-2)
    err_row("sconv", "bwd dw (fp32 accumulate) vs fp32 reference", dw, dwr, 2e-2)

    act = B * S * C * 2
    fwd_bytes, bwd_bytes = 2 * act + doc.numel() * 8, 3 * act + doc.numel() * 8
    best = gbps_row("sconv", f"triton fwd {shape}", fwd_bytes, timeit(lambda: sconv_fwd(x, w, doc), dev))
    if not ARGS.quick and not ARGS.tiny:
        for bs, bc, nw in ((16, 256, 4), (8, 256, 4), (32, 256, 8), (16, 512, 8), (8, 512, 4), (32, 128, 4)):
            ms = timeit(lambda: sconv_fwd(x, w, doc, block_s=bs, block_c=bc, num_warps=nw), dev)
            best = max(best, gbps_row("sconv", f"  fwd block_s={bs} block_c={bc} warps={nw}", fwd_bytes, ms))
    best_b = gbps_row("sconv", f"triton bwd dx+dw {shape}", bwd_bytes, timeit(lambda: sconv_bwd(x, w, doc, dy), dev))
    if not ARGS.quick and not ARGS.tiny:
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
    if not ARGS.quick and dev.type == "cuda":
        ref_c = torch.compile(sconv_reference)
        gbps_row("sconv", "torch reference fwd torch.compile", fwd_bytes, timeit(lambda: ref_c(x, w, doc), dev))

    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    kern = get_kernels("triton" if TRITON_OK else "torch")

    def fb(f):
        return lambda: torch.autograd.grad(f(xg, wg, doc), (xg, wg), dy)

    gbps_row("sconv", "triton fwd+bwd (autograd)", fwd_bytes + bwd_bytes, timeit(fb(kern.sconv), dev))
    gbps_row("sconv", "torch reference fwd+bwd eager", fwd_bytes + bwd_bytes, timeit(fb(sconv_reference), dev))


@section
def bench_xsa(dev):
    import torch

    from marin.kernels import xsa_gate_torch
    from marin.kernels.reference import xsa_reference
    from marin.kernels.xsa import xsa_bwd, xsa_fwd

    B, H, Kv, S, D = (2, 4, 2, 32, 16) if ARGS.tiny else (8, 16, 4, 4096, 128)
    bf = torch.bfloat16
    y = torch.randn(B, H, S, D, device=dev, dtype=bf)
    v = torch.randn(B, Kv, S, D, device=dev, dtype=bf)
    a = torch.randn(B, S, H, device=dev, dtype=bf)
    dz = torch.randn(B, H, S, D, device=dev, dtype=bf)
    shape = f"B{B} H{H} K{Kv} S{S} D{D} bf16"

    err_row("xsa", "fwd bf16 vs fp32 reference", xsa_fwd(y, v), xsa_reference(y.float(), v.float()), 1e-2)
    err_row("xsa", "gate fwd bf16 vs fp32 reference", xsa_fwd(y, v, a), xsa_gate_torch(y.float(), v.float(), a.float()), 1e-2)
    sl = slice(0, min(S, 512))
    ys, vs, as_, dzs = (t[:, :, sl].contiguous() for t in (y, v, a.transpose(1, 2), dz))
    as_ = as_.transpose(1, 2).contiguous()
    dy, dv, dg = xsa_bwd(ys, vs, as_, dzs)
    yr, vr, ar = (t.float().requires_grad_() for t in (ys, vs, as_))
    ref = torch.autograd.grad(xsa_gate_torch(yr, vr, ar), (yr, vr, ar), dzs.float())
    for nm, got, r in zip(("dy", "dv", "dgate"), (dy, dv, dg), ref):
        err_row("xsa", f"gate bwd {nm} bf16 vs fp32 reference", got, r, 2e-2)

    q_bytes, kv_bytes = y.numel() * 2, v.numel() * 2
    fwd_bytes, bwd_bytes = 2 * q_bytes + kv_bytes, 3 * q_bytes + 2 * kv_bytes
    gbps_row("xsa", f"triton fwd {shape}", fwd_bytes, timeit(lambda: xsa_fwd(y, v), dev))
    gbps_row("xsa", "triton bwd", bwd_bytes, timeit(lambda: xsa_bwd(y, v, None, dz), dev))
    gbps_row("xsa", "triton fused gate fwd", fwd_bytes + a.numel() * 2, timeit(lambda: xsa_fwd(y, v, a), dev))
    gbps_row("xsa", "triton fused gate bwd", bwd_bytes + 2 * a.numel() * 2, timeit(lambda: xsa_bwd(y, v, a, dz), dev))
    gbps_row("xsa", "torch reference fwd eager", fwd_bytes, timeit(lambda: xsa_reference(y, v), dev))
    gbps_row("xsa", "torch reference + gate fwd eager", fwd_bytes, timeit(lambda: xsa_gate_torch(y, v, a), dev))
    if not ARGS.quick and dev.type == "cuda":
        ref_c = torch.compile(xsa_gate_torch)
        gbps_row("xsa", "torch reference + gate fwd torch.compile", fwd_bytes, timeit(lambda: ref_c(y, v, a), dev))
    if not ARGS.quick and not ARGS.tiny:
        for bs, nw in ((8, 4), (32, 4), (16, 8), (32, 8)):
            gbps_row("xsa", f"  fwd block_s={bs} warps={nw}", fwd_bytes, timeit(lambda: xsa_fwd(y, v, block_s=bs, num_warps=nw), dev))
            gbps_row("xsa", f"  bwd block_s={bs} warps={nw}", bwd_bytes,
                     timeit(lambda: xsa_bwd(y, v, None, dz, block_s=bs, num_warps=nw), dev))


@section
def bench_moe_permute(dev):
    import torch

    from marin.kernels.torch_ops import permute_torch, sort_by_expert, unpermute_torch

    T, W, K, E = (64, 32, 2, 4) if ARGS.tiny else (32768, 1024, 8, 64)
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
    gbps_row("moe", "torch unpermute fwd (index_add)", N * rowb + T * rowb, timeit(lambda: unpermute_torch(yn, src, c), dev))
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

    from marin.kernels.torch_ops import grouped_mm_torch, sort_by_expert

    T, K, E, I, O = (64, 2, 4, 32, 32) if ARGS.tiny else (16384, 8, 64, 1024, 512)
    # The interpreter's bf16 tl.dot is wrong (fp16 is exact): on CPU check the code path in fp16.
    bf = torch.bfloat16 if dev.type == "cuda" else torch.float16
    eidx = torch.rand(T, E, device=dev).topk(K, dim=1).indices
    _, offs = sort_by_expert(eidx, E)
    N = T * K
    x = torch.randn(N, I, device=dev, dtype=bf)
    w = torch.randn(E, I, O, device=dev, dtype=bf) / math.sqrt(I)
    dy = torch.randn(N, O, device=dev, dtype=bf)
    kt = get_kernels("triton")
    err_row("gmm", f"triton fwd {str(bf)[6:]} vs fp32 torch", kt.grouped_mm(x, w, offs), grouped_mm_torch(x.float(), w.float(), offs), 2e-2)
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


@section
def bench_model_parity(dev):
    """The whole model on the same weights and batch: kernels='triton' against kernels='torch', then
    the fast configuration (flex attention, Triton kernels, blocks compiled) against eager sdpa/torch."""
    import torch

    from dataclasses import replace

    from marin.config import PRESETS, Recipe
    from marin.model import MarinModel

    cfg = PRESETS["cpu_l" if dev.type == "cuda" else "tiny"]()
    B, S = (4, cfg.seq_len) if dev.type == "cuda" else (1, 32)
    tokens = torch.randint(0, cfg.vocab_size, (B, S), device=dev)
    doc = random_doc_ids(B, S, 32, dev)
    amp = dev.type == "cuda"
    # CPU has no flex backward: there the fast configuration is checked forward only.
    fast = dict(attention="flex" if dev.type == "cuda" else "sdpa", kernels="triton", compiled=dev.type == "cuda")

    def run(attention, kernels, compiled, state=None):
        torch.manual_seed(0)
        with torch.device(dev):
            model = MarinModel(replace(cfg, kernels=kernels, attention=attention), Recipe()).eval()  # eval: dropless
        if state is not None:
            model.load_state_dict(state)
        if compiled:
            for block in model.blocks:
                block.compile()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(tokens, doc, tokens)
        out.loss.backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.loss.item(), grads, model.state_dict()

    ref_loss, ref_grads, state = run("sdpa", "torch", False)
    for label, kw in (("kernels=triton eager", dict(attention="sdpa", kernels="triton", compiled=False)),
                      (f"attention={fast['attention']} kernels=triton{' compiled' if fast['compiled'] else ''}", fast)):
        loss, grads, _ = run(**kw, state=state)
        rel = abs(loss - ref_loss) / abs(ref_loss)
        row("parity", f"model loss {label} vs sdpa/torch eager (bf16)", rel, "rel err", "ok" if rel <= 1e-2 else "FAIL",
            f"loss {ref_loss:.4f} vs {loss:.4f}")
        worst = max(((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm().clamp_min(1e-12)).item() for n in ref_grads)
        row("parity", f"  worst parameter-gradient rel. L2 error, {label}", worst, "rel err",
            "ok" if worst <= 5e-2 else "FAIL", f"{len(ref_grads)} parameters")


@section
def bench_syncs(dev):
    """Host syncs in one eager training forward+backward (kernels torch and triton, sdpa): CUDA's
    sync debug mode raises at the first op that waits for the device. On CPU there is nothing to
    wait for (tests/test_compile.py checks the same through graph breaks)."""
    import torch

    from dataclasses import replace

    from marin.config import PRESETS, Recipe
    from marin.model import MarinModel

    if dev.type != "cuda":
        row("syncs", "host syncs in forward+backward", "n/a on CPU", "")
        return
    cfg = PRESETS["cpu_l"]()
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), device=dev)
    doc = random_doc_ids(4, cfg.seq_len, 32, dev)
    for kernels in (["torch", "triton"] if TRITON_OK else ["torch"]):
        with torch.device(dev):
            model = MarinModel(replace(cfg, kernels=kernels), Recipe()).train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(tokens, doc, tokens).loss.backward()  # warm-up: lazy init may sync once
        sync(dev)
        try:
            torch.cuda.set_sync_debug_mode("error")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(tokens, doc, tokens)
            out.loss.backward()
            verdict, note = "none", ""
        except RuntimeError as e:
            verdict, note = "FOUND", str(e).splitlines()[0][:100]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        row("syncs", f"host syncs in a training fwd+bwd, kernels={kernels}", verdict, "", "ok" if verdict == "none" else "FAIL", note)


# ---- blocks ---------------------------------------------------------------------------------


def plain_block_cls():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from marin.kernels.torch_ops import grouped_mm_torch

    class PlainBlock(nn.Module):
        """What a peer runs: pre-RMSNorm GQA attention (SDPA, causal, QK RMSNorm with learned gain) and
        a top-K softmax MoE (sorted rows, torch._grouped_mm SwiGLU experts, index_add combine) plus one
        shared SwiGLU expert. No document masking (the SDPA flash path)."""

        def __init__(self, d, H, Hkv, h, E, K, m, m_shared):
            super().__init__()
            self.H, self.Hkv, self.h, self.E, self.K = H, Hkv, h, E, K
            self.n1, self.n2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
            self.qn, self.kn = nn.Parameter(torch.ones(h)), nn.Parameter(torch.ones(h))
            self.wq, self.wk = nn.Linear(d, H * h, bias=False), nn.Linear(d, Hkv * h, bias=False)
            self.wv, self.wo = nn.Linear(d, Hkv * h, bias=False), nn.Linear(H * h, d, bias=False)
            self.router = nn.Linear(d, E, bias=False)
            s = 0.5 / math.sqrt(d)
            self.w_gate = nn.Parameter(torch.randn(E, d, m) * s)
            self.w_up = nn.Parameter(torch.randn(E, d, m) * s)
            self.w_down = nn.Parameter(torch.randn(E, m, d) * s)
            self.s_gate, self.s_up = nn.Linear(d, m_shared, bias=False), nn.Linear(d, m_shared, bias=False)
            self.s_down = nn.Linear(m_shared, d, bias=False)

        def forward(self, x_BSD):
            B, S, D = x_BSD.shape
            H, Hkv, h, E, K = self.H, self.Hkv, self.h, self.E, self.K
            a = F.rms_norm(x_BSD, (D,), self.n1)
            q = F.rms_norm(self.wq(a).view(B, S, H, h).transpose(1, 2), (h,), self.qn)
            k = F.rms_norm(self.wk(a).view(B, S, Hkv, h).transpose(1, 2), (h,), self.kn)
            v = self.wv(a).view(B, S, Hkv, h).transpose(1, 2)
            if Hkv != H:  # explicit GQA expansion keeps SDPA on its flash kernel in every torch version
                k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x_BSD = x_BSD + self.wo(y.transpose(1, 2).reshape(B, S, H * h))
            m_TD = F.rms_norm(x_BSD, (D,), self.n2).view(B * S, D)
            probs = self.router(m_TD).float().softmax(-1)
            wts_TK, idx_TK = probs.topk(K, dim=-1)
            flat = idx_TK.reshape(-1)
            order = torch.sort(flat, stable=True).indices
            tok = order // K
            counts = torch.zeros(E, device=flat.device, dtype=torch.int32).scatter_add_(
                0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            xs = m_TD[tok]
            hid = F.silu(grouped_mm_torch(xs, self.w_gate, offs)) * grouped_mm_torch(xs, self.w_up, offs)
            ys = grouped_mm_torch(hid, self.w_down, offs) * wts_TK.reshape(-1)[order, None].to(xs.dtype)
            routed = torch.zeros_like(m_TD).index_add(0, tok, ys)
            shared = self.s_down(F.silu(self.s_gate(m_TD)) * self.s_up(m_TD))
            return x_BSD + (routed + shared).view(B, S, D)

    return PlainBlock


def block_fwd_flops_per_token(d, H, Hkv, h, keys, E, K, width, m, n_shared, m_shared, latent):
    """Matmul FLOPs of one block per token (forward), counted as marin.flops counts them."""
    f = 2 * (2 * d * H * h + 2 * d * Hkv * h) + 4 * H * h * keys + 2 * d * E
    f += 2 * K * 3 * width * m + n_shared * 2 * 3 * d * m_shared
    if latent:
        f += 4 * d * width
    return f


def recipe_context(cfg, doc, B, S, dev):
    """The ForwardContext MarinModel.forward builds: dense masks for sdpa, BlockMasks for flex."""
    from marin.model import ForwardContext, attention_masks, block_masks, rope_tables

    masks = (block_masks if cfg.attention == "flex" else attention_masks)(doc, B, S, cfg.window, dev)
    cos, sin = rope_tables(S, int(cfg.head_dim * cfg.rope_fraction), cfg.rope_theta, dev)
    return ForwardContext(doc, *masks, cos, sin, 1.0)


def recipe_variants(dev, compiled):
    """(attention, kernels) pairs to time, the target configuration first. Eager flex is torch's
    unfused reference (not a speed candidate), and CPU has no flex backward: sdpa there."""
    kernels = ["triton", "torch"] if TRITON_OK else ["torch"]
    if compiled and dev.type == "cuda":
        return [("flex", k) for k in kernels] + [("sdpa", kernels[0])]
    return [("sdpa", k) for k in kernels]


@section
def bench_blocks(dev, compiled=False):
    import torch

    from marin.config import ModelConfig, Recipe
    from marin.flops import mean_keys_per_query
    from marin.model import Block

    bf = torch.bfloat16
    if ARGS.tiny:
        B, S, d, H, Hkv, h, E, K, m, win = 2, 64, 64, 4, 2, 16, 8, 2, 32, 32
    else:
        B, S, d, H, Hkv, h, E, K, m, win = 8, 4096, 2048, 16, 4, 128, 64, 8, 512, 2048
    T = B * S
    x = torch.randn(B, S, d, device=dev, dtype=bf)
    g = torch.randn(B, S, d, device=dev, dtype=bf)
    doc = random_doc_ids(B, S, S // 8, dev)
    geo = f"B{B} S{S} d{d}"

    # Plain: E experts top-K at width d, one shared expert of hidden m, causal attention.
    plain = plain_block_cls()(d, H, Hkv, h, E, K, m, m).to(dev, bf)
    f_plain = 3 * T * block_fwd_flops_per_token(d, H, Hkv, h, (S + 1) / 2, E, K, d, m, 1, m, False)

    # Recipe: all switches on; latent geometry 2E experts top-2K at d/2 (same routed FLOPs), a local
    # layer (sliding window, half-RoPE) with document masking.
    def recipe_block(attention, kernels):
        cfg = ModelConfig(d_model=d, n_layers=4, n_heads=H, head_dim=h, n_kv_heads=Hkv, n_kv_heads_global=max(1, Hkv // 2),
                          vocab_size=256, seq_len=S, window=win, n_experts=2 * E, top_k=2 * K, expert_hidden=m,
                          n_shared_experts=1, shared_hidden=m, latent_ratio=2, ep_shards=8, kernels=kernels,
                          attention=attention)
        blk = Block(cfg, Recipe(), 0).to(dev, bf).train()
        with torch.no_grad():  # the model's init: identity SConv, zero gate, trunc-normal matrices
            for n_, p in blk.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0, 0.5 / math.sqrt(d))
                elif "sconv" in n_:
                    p.zero_()
                    p[0] = 1
        return blk, recipe_context(cfg, doc, B, S, dev)

    f_recipe = 3 * T * block_fwd_flops_per_token(d, H, Hkv, h, mean_keys_per_query(S, win), 2 * E, 2 * K, d // 2, m,
                                                 1, m, True)

    def step(mod, ctx):
        xg = x.clone().requires_grad_()

        def run():
            out = mod(xg, ctx)[0] if ctx is not None else mod(xg)
            out.backward(g)

        return run

    wrap = torch.compile if compiled else (lambda mod: mod)
    how = "torch.compile" if compiled else "eager"
    runs = [(f"plain {how}", lambda: (wrap(plain), None), f_plain)]
    runs += [(f"recipe {how} attention={a} kernels={k}", lambda a=a, k=k: (lambda b, c: (wrap(b), c))(*recipe_block(a, k)),
              f_recipe) for a, k in recipe_variants(dev, compiled)]
    tf = {}
    for name, build, flops in runs:
        if compiled and elapsed() > ARGS.budget_s - 90:  # a block compiles in about a minute
            row("blocks", name, "skipped (time budget)", "")
            continue
        try:
            t = time.time()
            mod, ctx = build()
            fn = step(mod, ctx)
            fn()
            sync(dev)
            first = time.time() - t
            ms = timeit(fn, dev, warmup=1, iters=3 if ARGS.quick else 5)
            tf[name] = tflops_row("blocks", f"{name} fwd+bwd {geo}", flops, ms, f"{ms:.1f} ms; first call {first:.1f}s")
            del mod, ctx, fn
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row("blocks", name, f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}", "")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    recipe_best = max((v for k, v in tf.items() if k.startswith("recipe")), default=None)
    if compiled and recipe_best and f"plain {how}" in tf:
        ratio = recipe_best / tf[f"plain {how}"]
        row("blocks", "best compiled recipe / compiled plain (target >= 1.1)", ratio, "x", "met" if ratio >= 1.1 else "not met")
    if not compiled:
        row("blocks", "plain: model FLOPs/token fwd", f_plain / 3 / T, "FLOP", None, "causal keys (S+1)/2")
        row("blocks", "recipe: model FLOPs/token fwd", f_recipe / 3 / T, "FLOP", None,
            f"window {win} keys, latent 2E/top-2K at d/2")


@section
def bench_full_model(dev):
    """A training step of the whole model with the recipe's own optimizer (Hyperball: Newton–Schulz
    on every matrix and expert stack), bf16 autocast, blocks compiled as TrainConfig.compile does."""
    import torch

    from dataclasses import replace

    from marin.config import PRESETS, Recipe, RunSpec, TrainConfig
    from marin.flops import flops_per_token
    from marin.model import MarinModel
    from marin.optim import build_optimizer, resolve_hparams

    name = "tiny" if ARGS.tiny else "d1024"
    recipe = Recipe()
    base = PRESETS[name]()
    B, S = (2, base.seq_len) if ARGS.tiny else (8, base.seq_len)
    tokens = torch.randint(0, base.vocab_size, (B, S), device=dev)
    targets = torch.randint(0, base.vocab_size, (B, S), device=dev)
    doc = random_doc_ids(B, S, max(8, S // 8), dev)
    amp = dev.type == "cuda"
    compile_ = dev.type == "cuda" or ARGS.compile_cpu
    attention, kernels = recipe_variants(dev, compile_)[0]
    cfg = replace(base, attention=attention, kernels=kernels)
    with torch.device(dev):  # initialise on the device: ~3B parameters at d1024
        model = MarinModel(cfg, recipe).train()
    if compile_:
        for block in model.blocks:
            block.compile()
    spec = RunSpec(model=cfg, recipe=recipe, train=TrainConfig(steps=1000, batch_size=B, device=dev.type))
    opt = build_optimizer(model, resolve_hparams(spec))

    def fwd_bwd():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(tokens, doc, targets)
        out.loss.backward()

    def train_step():
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.update_router_biases()

    t = time.time()
    train_step()
    sync(dev)
    first = time.time() - t
    iters = 2 if ARGS.tiny else 4
    ms = timeit(train_step, dev, warmup=1, iters=iters)
    ms_fb = timeit(fwd_bwd, dev, warmup=0, iters=iters)
    opt.zero_grad(set_to_none=True)
    fpt = flops_per_token(cfg, recipe, S)
    nparams = sum(p.numel() for p in model.parameters())
    label = f"{name} attention={attention} kernels={kernels}{' compiled blocks' if compile_ else ' eager'}"
    row("model", f"{label} train step (Hyperball) B{B} S{S}", ms, "ms", None,
        f"{nparams / 1e9:.2f}B params; first step {first:.1f}s")
    row("model", f"{name} forward+backward only", ms_fb, "ms", None, f"optimizer {ms - ms_fb:.1f} ms")
    row("model", f"{name} tokens/s", B * S / (ms * 1e-3), "tok/s")
    for what, t_ms in (("train step", ms), ("fwd+bwd", ms_fb)):
        achieved = fpt * B * S / (t_ms * 1e-3)
        if CEIL["matmul_TFLOPs"]:
            mfu = 100 * achieved / 1e12 / CEIL["matmul_TFLOPs"]
            row("model", f"{name} MFU ({what}) vs measured bf16 matmul", mfu, "%",
                ("met" if mfu >= 45 else "not met") if what == "train step" else None,
                f"{achieved / 1e12:.1f} TFLOP/s model FLOPs (marin.flops); target >= 45%")
        if dev.type == "cuda":
            row("model", f"{name} MFU ({what}) vs {H200_BF16_DENSE_TFLOPS:.0f} TFLOP/s datasheet",
                100 * achieved / 1e12 / H200_BF16_DENSE_TFLOPS, "%")
    if dev.type == "cuda":
        row("model", "peak memory", torch.cuda.max_memory_allocated(dev) / 2**30, "GiB")


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

TRITON_OK = False


def get_kernels(backend):
    from marin.kernels import get_kernels as gk

    return gk(backend)


def write_markdown(path: Path, dev_name: str, header: str) -> None:
    lines = [f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC — {dev_name}", "",
             header, "", "| section | measurement | value | unit | vs | note |", "|---|---|---|---|---|---|"]
    for r in ROWS:
        v = r["value"]
        v = f"{v:,.4g}" if isinstance(v, (int, float)) else str(v)
        lines.append(f"| {r['section']} | {r['name'].strip()} | {v} | {r['unit']} | {r['vs'] or ''} | {r['note']} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a") as f:
        if new:
            f.write("# GPU benchmark results\n\nAppended by `benchmarks/gpu.py` (one section per run).\n")
        f.write("\n".join(lines) + "\n")
    print(f"\nappended {len(ROWS)} rows to {path}")


def main(argv=None) -> int:
    global ARGS, TRITON_OK
    ARGS = parse_args(argv)
    want = ARGS.device or ("cuda" if _cuda_available() else "cpu")
    if want == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton code paths run under the interpreter
        ARGS.tiny = True  # full shapes on CPU would take hours
    import torch

    dev = torch.device(want)
    try:
        import triton

        TRITON_OK = True
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
    if TRITON_OK:
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
    if ARGS.quick or elapsed() < ARGS.budget_s - 30:
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
