"""Triton short causal depthwise conv (SConv, docs/method.md §2.1) with packed-document masking.

out[b,t,c] = Σ_l w[l,c]·x[b,t−l,c], a tap zeroed when t−l < 0 or doc_ids[b,t−l] ≠ doc_ids[b,t].
Memory-bound: one pass over (S, C) tiles; the K shifted row loads of a tile hit L1/L2, so DRAM
traffic is ~one read of x and one write of out (fwd), one read of x and dy and one write of dx (bwd).
The backward computes dx and the dw partial sums in the same pass, from the same shifted dy loads:
for output t' = t+l and tap l, the mask (t+l < S, doc[t+l] = doc[t]) is the same for dx[t] and dw[l].
Registered as the custom ops marin::sconv_fwd and marin::sconv_bwd (with autograd), so
torch.compile traces through sconv_triton without a graph break.
Imports triton at module load: reach it through marin.kernels.get_kernels("triton") only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from marin_ablate.marin.kernels._common import (
    acc_dtype,
    check_runnable,
    kernel_op,
    needed,
    next_pow2,
    optional_arg,
    save_inputs,
)


@triton.jit
def sconv_fwd_kernel(
    x_ptr, w_ptr, doc_ptr, out_ptr,
    S, C,
    sxb, sxs, sxc, swk, swc, sdb, sds, sob, sos, soc,
    K: tl.constexpr, HAS_DOC: tl.constexpr, ACC: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_s = offs_s < S
    mask_c = offs_c < C
    if HAS_DOC:
        doc_t = tl.load(doc_ptr + b * sdb + offs_s * sds, mask=mask_s, other=-1)
    acc = tl.zeros((BLOCK_S, BLOCK_C), dtype=ACC)
    for l in tl.static_range(K):
        src = offs_s - l
        ok = mask_s & (src >= 0)
        # The x load is masked by bounds only and the document test applied after, so the doc-id
        # and x loads are in flight together instead of one waiting on the other.
        xv = tl.load(x_ptr + b * sxb + src[:, None] * sxs + offs_c[None, :] * sxc,
                     mask=ok[:, None] & mask_c[None, :], other=0.0).to(ACC)
        if HAS_DOC:
            doc_src = tl.load(doc_ptr + b * sdb + src * sds, mask=ok, other=-1)
            xv = tl.where((doc_src == doc_t)[:, None], xv, 0.0)
        wv = tl.load(w_ptr + l * swk + offs_c * swc, mask=mask_c, other=0.0).to(ACC)
        acc += xv * wv[None, :]
    tl.store(out_ptr + b * sob + offs_s[:, None] * sos + offs_c[None, :] * soc,
             acc.to(out_ptr.dtype.element_ty), mask=mask_s[:, None] & mask_c[None, :])


@triton.jit
def sconv_bwd_kernel(
    x_ptr, w_ptr, doc_ptr, dy_ptr, dx_ptr, dwp_ptr,
    S, C,
    sxb, sxs, sxc, swk, swc, sdb, sds, syb, sys_, syc, sdxb, sdxs, sdxc,
    TILES,  # runtime: one compiled kernel serves every tiles value
    K: tl.constexpr, KP: tl.constexpr, HAS_DOC: tl.constexpr, ACC: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # One program: TILES consecutive S tiles of one (batch row, C tile); it writes dx for them and
    # one [K, BLOCK_C] partial of dw (summed over programs on the host, deterministic, no atomics).
    pid_s = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    kk = tl.arange(0, KP)
    dw_acc = tl.zeros((KP, BLOCK_C), dtype=ACC)
    for i in range(TILES):
        offs_s = (pid_s * TILES + i) * BLOCK_S + tl.arange(0, BLOCK_S)
        mask_s = offs_s < S
        m2 = mask_s[:, None] & mask_c[None, :]
        xv = tl.load(x_ptr + b * sxb + offs_s[:, None] * sxs + offs_c[None, :] * sxc, mask=m2, other=0.0).to(ACC)
        if HAS_DOC:
            doc_t = tl.load(doc_ptr + b * sdb + offs_s * sds, mask=mask_s, other=-1)
        dx = tl.zeros((BLOCK_S, BLOCK_C), dtype=ACC)
        for l in tl.static_range(K):
            dst = offs_s + l
            ok = mask_s & (dst < S)
            dyl = tl.load(dy_ptr + b * syb + dst[:, None] * sys_ + offs_c[None, :] * syc,
                          mask=ok[:, None] & mask_c[None, :], other=0.0).to(ACC)
            if HAS_DOC:  # applied after the load, as in the forward
                doc_dst = tl.load(doc_ptr + b * sdb + dst * sds, mask=ok, other=-1)
                dyl = tl.where((doc_dst == doc_t)[:, None], dyl, 0.0)
            wv = tl.load(w_ptr + l * swk + offs_c * swc, mask=mask_c, other=0.0).to(ACC)
            dx += dyl * wv[None, :]
            part = tl.sum(dyl * xv, axis=0)
            dw_acc = tl.where(kk[:, None] == l, dw_acc + part[None, :], dw_acc)
        tl.store(dx_ptr + b * sdxb + offs_s[:, None] * sdxs + offs_c[None, :] * sdxc,
                 dx.to(dx_ptr.dtype.element_ty), mask=m2)
    row = b * tl.num_programs(0) + pid_s
    tl.store(dwp_ptr + row * K * C + kk[:, None] * C + offs_c[None, :], dw_acc,
             mask=(kk[:, None] < K) & mask_c[None, :])


def _check(x_BSC: torch.Tensor, w_KC: torch.Tensor, doc_ids_BS: torch.Tensor | None) -> None:
    if x_BSC.dim() != 3:
        raise ValueError(f"sconv: x_BSC must be 3-D (batch, seq, channels), got shape {tuple(x_BSC.shape)}")
    if w_KC.dim() != 2 or w_KC.shape[1] != x_BSC.shape[2]:
        raise ValueError(f"sconv: w_KC must be (kernel, {x_BSC.shape[2]}), got shape {tuple(w_KC.shape)}")
    if doc_ids_BS is not None and tuple(doc_ids_BS.shape) != tuple(x_BSC.shape[:2]):
        raise ValueError(f"sconv: doc_ids_BS must have shape {tuple(x_BSC.shape[:2])}, got {tuple(doc_ids_BS.shape)}")
    check_runnable(x_BSC, w_KC, doc_ids_BS, name="sconv")


def launch_config(C: int) -> tuple[int, int, int]:
    """(block_s, block_c, num_warps): 16 x 256 tiles over 8 warps keep both kernels at <= 128
    registers without spills for bf16 on sm_90 (ptxas, triton 3.7); the GPU benchmark sweeps others."""
    block_c = min(256, next_pow2(C))
    block_s = max(1, min(16, 4096 // block_c))
    return block_s, block_c, (8 if block_s * block_c >= 4096 else 4)


def sconv_fwd(x_BSC, w_KC, doc_ids_BS=None, *, block_s=None, block_c=None, num_warps=None):
    B, S, C = x_BSC.shape
    K = w_KC.shape[0]
    bs, bc, nw = launch_config(C)
    block_s, block_c, num_warps = block_s or bs, block_c or bc, num_warps or nw
    out = torch.empty((B, S, C), device=x_BSC.device, dtype=x_BSC.dtype)
    doc, sd = optional_arg(doc_ids_BS, x_BSC, 2)
    grid = (triton.cdiv(S, block_s), triton.cdiv(C, block_c), B)
    sconv_fwd_kernel[grid](
        x_BSC, w_KC, doc, out, S, C,
        *x_BSC.stride(), *w_KC.stride(), *sd, *out.stride(),
        K=K, HAS_DOC=doc_ids_BS is not None, ACC=acc_dtype(x_BSC),
        BLOCK_S=block_s, BLOCK_C=block_c, num_warps=num_warps,
    )
    return out


def sconv_bwd(x_BSC, w_KC, doc_ids_BS, dy_BSC, *, block_s=None, block_c=None, tiles=None, num_warps=None):
    B, S, C = x_BSC.shape
    K = w_KC.shape[0]
    bs, bc, nw = launch_config(C)
    block_s, block_c, num_warps = block_s or bs, block_c or bc, num_warps or nw
    tiles = tiles or max(1, min(8, triton.cdiv(S, block_s)))
    dx = torch.empty_like(x_BSC, memory_format=torch.contiguous_format)
    n_s = triton.cdiv(S, block_s * tiles)
    acc_t = torch.float64 if x_BSC.dtype == torch.float64 else torch.float32
    dw_part = torch.empty((B * n_s, K, C), device=x_BSC.device, dtype=acc_t)
    doc, sd = optional_arg(doc_ids_BS, x_BSC, 2)
    grid = (n_s, triton.cdiv(C, block_c), B)
    sconv_bwd_kernel[grid](
        x_BSC, w_KC, doc, dy_BSC, dx, dw_part, S, C,
        *x_BSC.stride(), *w_KC.stride(), *sd, *dy_BSC.stride(), *dx.stride(), tiles,
        K=K, KP=next_pow2(K), HAS_DOC=doc_ids_BS is not None, ACC=acc_dtype(x_BSC),
        BLOCK_S=block_s, BLOCK_C=block_c, num_warps=num_warps,
    )
    dw = dw_part.sum(0).to(w_KC.dtype)
    return dx, dw


@kernel_op("sconv_fwd")
def _sconv_fwd_op(x_BSC: torch.Tensor, w_KC: torch.Tensor, doc_ids_BS: torch.Tensor | None) -> torch.Tensor:
    """SConv forward at the default tiles."""
    return sconv_fwd(x_BSC, w_KC, doc_ids_BS)


@_sconv_fwd_op.register_fake
def _(x_BSC, w_KC, doc_ids_BS):
    return x_BSC.new_empty(x_BSC.shape)


@kernel_op("sconv_bwd")
def _sconv_bwd_op(x_BSC: torch.Tensor, w_KC: torch.Tensor, doc_ids_BS: torch.Tensor | None,
                  dy_BSC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SConv backward: (dx, dw) from one pass over x and dy."""
    return sconv_bwd(x_BSC, w_KC, doc_ids_BS, dy_BSC)


@_sconv_bwd_op.register_fake
def _(x_BSC, w_KC, doc_ids_BS, dy_BSC):
    return x_BSC.new_empty(x_BSC.shape), w_KC.new_empty(w_KC.shape)


def _sconv_backward(ctx, dy_BSC):
    x_BSC, w_KC, doc_ids_BS = ctx.saved_tensors
    dx, dw = _sconv_bwd_op(x_BSC, w_KC, doc_ids_BS, dy_BSC)
    return needed(ctx, dx, dw, None)


_sconv_fwd_op.register_autograd(_sconv_backward, setup_context=save_inputs)


def sconv_triton(x_BSC: torch.Tensor, w_KC: torch.Tensor, doc_ids_BS: torch.Tensor | None = None) -> torch.Tensor:
    """Short causal depthwise conv with document masking (docs/method.md §2.1 SConv), Triton fwd + bwd."""
    _check(x_BSC, w_KC, doc_ids_BS)
    return _sconv_fwd_op(x_BSC, w_KC, doc_ids_BS)
