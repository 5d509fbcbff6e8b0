"""Triton Exclusive Self Attention output projection (XSA, arXiv 2603.09078; docs/method.md §2.1) under GQA.

z = y − (⟨y,v⟩ / (‖v‖² + 1e-6))·v per (batch, query head, token), v from the KV head serving the
query head (h // (H/K)). Optionally fused with the headwise gate: out = 2σ(a)·z, a from gate_BSH.
One program owns a (batch, KV head, S tile) and loops over the G = H/K query heads it serves: v is
read once per tile, and dv (a sum over those G heads) is accumulated in registers, so no atomics.
Outputs are allocated (B, S, H, D)-contiguous and returned as a (B, H, S, D) view: the usual
`z.transpose(1, 2).reshape(B, S, H*D)` before W_o is then free.
Backward, with n = ‖v‖² + eps, a = ⟨y,v⟩, g = ⟨dz,v⟩:
  dy = dz − (g/n)·v;  dv = Σ_heads [−(a/n)·dz − (g/n)·y + (2·a·g/n²)·v].
Registered as the custom ops marin::xsa_fwd and marin::xsa_bwd (with autograd; the gate is an
optional input), so torch.compile traces through xsa_triton and xsa_gate_triton without a graph break.
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

XSA_EPS = 1e-6


@triton.jit
def xsa_fwd_kernel(
    y_ptr, v_ptr, g_ptr, z_ptr,
    S, D,
    syb, syh, sys_, syd, svb, svh, svs, svd, sgb, sgs, sgh, szb, szh, szs, szd,
    G: tl.constexpr, HAS_GATE: tl.constexpr, ACC: tl.constexpr, EPS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_s = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    m2 = (offs_s < S)[:, None] & (offs_d < D)[None, :]
    v = tl.load(v_ptr + b * svb + kh * svh + offs_s[:, None] * svs + offs_d[None, :] * svd, mask=m2, other=0.0).to(ACC)
    inv_n = 1.0 / (tl.sum(v * v, axis=1) + EPS)
    for g in range(G):
        h = kh * G + g
        y = tl.load(y_ptr + b * syb + h * syh + offs_s[:, None] * sys_ + offs_d[None, :] * syd,
                    mask=m2, other=0.0).to(ACC)
        coef = tl.sum(y * v, axis=1) * inv_n
        z = y - coef[:, None] * v
        if HAS_GATE:
            a = tl.load(g_ptr + b * sgb + offs_s * sgs + h * sgh, mask=offs_s < S, other=0.0).to(ACC)
            z = z * (2.0 * tl.sigmoid(a))[:, None]
        tl.store(z_ptr + b * szb + h * szh + offs_s[:, None] * szs + offs_d[None, :] * szd,
                 z.to(z_ptr.dtype.element_ty), mask=m2)


@triton.jit
def xsa_bwd_kernel(
    y_ptr, v_ptr, g_ptr, dz_ptr, dy_ptr, dv_ptr, dg_ptr,
    S, D,
    syb, syh, sys_, syd, svb, svh, svs, svd, sgb, sgs, sgh,
    sdzb, sdzh, sdzs, sdzd, sdyb, sdyh, sdys, sdyd, sdvb, sdvh, sdvs, sdvd, sdgb, sdgs, sdgh,
    G: tl.constexpr, HAS_GATE: tl.constexpr, ACC: tl.constexpr, EPS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_s = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < S
    m2 = mask_s[:, None] & (offs_d < D)[None, :]
    v = tl.load(v_ptr + b * svb + kh * svh + offs_s[:, None] * svs + offs_d[None, :] * svd, mask=m2, other=0.0).to(ACC)
    inv_n = 1.0 / (tl.sum(v * v, axis=1) + EPS)
    dv = tl.zeros((BLOCK_S, BLOCK_D), dtype=ACC)
    for g in range(G):
        h = kh * G + g
        y = tl.load(y_ptr + b * syb + h * syh + offs_s[:, None] * sys_ + offs_d[None, :] * syd,
                    mask=m2, other=0.0).to(ACC)
        dz = tl.load(dz_ptr + b * sdzb + h * sdzh + offs_s[:, None] * sdzs + offs_d[None, :] * sdzd,
                     mask=m2, other=0.0).to(ACC)
        coef = tl.sum(y * v, axis=1) * inv_n
        if HAS_GATE:
            a = tl.load(g_ptr + b * sgb + offs_s * sgs + h * sgh, mask=mask_s, other=0.0).to(ACC)
            sig = tl.sigmoid(a)
            z = y - coef[:, None] * v
            da = tl.sum(dz * z, axis=1) * (2.0 * sig * (1.0 - sig))
            tl.store(dg_ptr + b * sdgb + offs_s * sdgs + h * sdgh, da.to(dg_ptr.dtype.element_ty), mask=mask_s)
            dz = dz * (2.0 * sig)[:, None]
        gn = tl.sum(dz * v, axis=1) * inv_n
        dy = dz - gn[:, None] * v
        dv += -coef[:, None] * dz - gn[:, None] * y + (2.0 * coef * gn)[:, None] * v
        tl.store(dy_ptr + b * sdyb + h * sdyh + offs_s[:, None] * sdys + offs_d[None, :] * sdyd,
                 dy.to(dy_ptr.dtype.element_ty), mask=m2)
    tl.store(dv_ptr + b * sdvb + kh * sdvh + offs_s[:, None] * sdvs + offs_d[None, :] * sdvd,
             dv.to(dv_ptr.dtype.element_ty), mask=m2)


def _check(y_BHSD, v_BKSD, gate_BSH=None) -> None:
    if y_BHSD.dim() != 4 or v_BKSD.dim() != 4:
        raise ValueError(f"xsa: y_BHSD and v_BKSD must be 4-D, got {tuple(y_BHSD.shape)} and {tuple(v_BKSD.shape)}")
    B, H, S, D = y_BHSD.shape
    Bv, K, Sv, Dv = v_BKSD.shape
    if (Bv, Sv, Dv) != (B, S, D):
        raise ValueError(f"xsa: v_BKSD must be ({B}, K, {S}, {D}), got {tuple(v_BKSD.shape)}")
    if K < 1 or H % K != 0:
        raise ValueError(f"xsa: query heads H={H} must be a multiple of KV heads K={K}; allowed K: divisors of {H}")
    if gate_BSH is not None and tuple(gate_BSH.shape) != (B, S, H):
        raise ValueError(f"xsa: gate_logits_BSH must have shape {(B, S, H)}, got {tuple(gate_BSH.shape)}")
    check_runnable(y_BHSD, v_BKSD, gate_BSH, name="xsa")


def blocks(D: int, block_s: int | None) -> tuple[int, int]:
    # 16 x 128 tiles: 48 registers (fwd, 4 warps) and 60 (bwd, 8 warps) for bf16 on sm_90 (ptxas).
    block_d = next_pow2(D)
    return (block_s or max(1, min(64, 2048 // block_d))), block_d


def _bhsd_view_of_bshd(like_BHSD: torch.Tensor) -> torch.Tensor:
    B, H, S, D = like_BHSD.shape
    return torch.empty((B, S, H, D), device=like_BHSD.device, dtype=like_BHSD.dtype).transpose(1, 2)


def xsa_fwd(y_BHSD, v_BKSD, gate_BSH=None, *, block_s=None, num_warps=4):
    B, H, S, D = y_BHSD.shape
    K = v_BKSD.shape[1]
    block_s, block_d = blocks(D, block_s)
    z = _bhsd_view_of_bshd(y_BHSD)
    g, sg = optional_arg(gate_BSH, y_BHSD, 3)
    grid = (triton.cdiv(S, block_s), K, B)
    xsa_fwd_kernel[grid](
        y_BHSD, v_BKSD, g, z, S, D, *y_BHSD.stride(), *v_BKSD.stride(), *sg, *z.stride(),
        G=H // K, HAS_GATE=gate_BSH is not None, ACC=acc_dtype(y_BHSD), EPS=XSA_EPS,
        BLOCK_S=block_s, BLOCK_D=block_d, num_warps=num_warps,
    )
    return z


def xsa_bwd(y_BHSD, v_BKSD, gate_BSH, dz_BHSD, *, block_s=None, num_warps=8):
    B, H, S, D = y_BHSD.shape
    K = v_BKSD.shape[1]
    block_s, block_d = blocks(D, block_s)
    dy = _bhsd_view_of_bshd(y_BHSD)
    dv = torch.empty_like(v_BKSD)
    dg = torch.empty_like(gate_BSH) if gate_BSH is not None else None
    g, sg = optional_arg(gate_BSH, y_BHSD, 3)
    dg_arg, sdg = optional_arg(dg, y_BHSD, 3)
    grid = (triton.cdiv(S, block_s), K, B)
    xsa_bwd_kernel[grid](
        y_BHSD, v_BKSD, g, dz_BHSD, dy, dv, dg_arg, S, D,
        *y_BHSD.stride(), *v_BKSD.stride(), *sg, *dz_BHSD.stride(), *dy.stride(), *dv.stride(), *sdg,
        G=H // K, HAS_GATE=gate_BSH is not None, ACC=acc_dtype(y_BHSD), EPS=XSA_EPS,
        BLOCK_S=block_s, BLOCK_D=block_d, num_warps=num_warps,
    )
    return dy, dv, dg


@kernel_op("xsa_fwd")
def _xsa_fwd_op(y_BHSD: torch.Tensor, v_BKSD: torch.Tensor, gate_BSH: torch.Tensor | None) -> torch.Tensor:
    """XSA forward, gated by 2σ(gate) when a gate is given; a (B, H, S, D) view of (B, S, H, D) storage."""
    return xsa_fwd(y_BHSD, v_BKSD, gate_BSH)


@_xsa_fwd_op.register_fake
def _(y_BHSD, v_BKSD, gate_BSH):
    return _bhsd_view_of_bshd(y_BHSD)


@kernel_op("xsa_bwd")
def _xsa_bwd_op(y_BHSD: torch.Tensor, v_BKSD: torch.Tensor, gate_BSH: torch.Tensor | None,
                dz_BHSD: torch.Tensor) -> list[torch.Tensor]:
    """XSA backward: [dy, dv], and d gate appended when gated (a custom op cannot return None)."""
    return [t for t in xsa_bwd(y_BHSD, v_BKSD, gate_BSH, dz_BHSD) if t is not None]


@_xsa_bwd_op.register_fake
def _(y_BHSD, v_BKSD, gate_BSH, dz_BHSD):
    grads = [_bhsd_view_of_bshd(y_BHSD), torch.empty_like(v_BKSD)]
    return grads + ([torch.empty_like(gate_BSH)] if gate_BSH is not None else [])


def _xsa_backward(ctx, dz_BHSD):
    y_BHSD, v_BKSD, gate_BSH = ctx.saved_tensors
    dy, dv, *dg = _xsa_bwd_op(y_BHSD, v_BKSD, gate_BSH, dz_BHSD)
    return needed(ctx, dy, dv, dg[0] if dg else None)


_xsa_fwd_op.register_autograd(_xsa_backward, setup_context=save_inputs)


def xsa_triton(y_BHSD: torch.Tensor, v_BKSD: torch.Tensor) -> torch.Tensor:
    """XSA: remove from each head's output its component along the token's own value (GQA-aware)."""
    _check(y_BHSD, v_BKSD)
    return _xsa_fwd_op(y_BHSD, v_BKSD, None)


def xsa_gate_triton(y_BHSD: torch.Tensor, v_BKSD: torch.Tensor, gate_logits_BSH: torch.Tensor) -> torch.Tensor:
    """XSA fused with the headwise output gate: 2σ(a)·xsa(y, v), a = gate_logits_BSH (one per head)."""
    _check(y_BHSD, v_BKSD, gate_logits_BSH)
    return _xsa_fwd_op(y_BHSD, v_BKSD, gate_logits_BSH)
