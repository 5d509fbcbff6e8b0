"""Triton MoE kernels: permute (gather rows into expert order), unpermute (weighted combine back to
tokens) and a grouped GEMM for GPUs without torch._grouped_mm, each with autograd.

Conventions as marin/kernels/torch_ops.py: src_N[n] = t·K + k of routed row n; offsets_E cumulative
int32 group ends. Every scatter is written as a gather through the inverse map pos_TK (row of
assignment (t,k), −1 when dropped), so no kernel uses atomics and results are deterministic.
Grouped GEMM: programs walk (group, row-tile) pairs from a tile table built on device (no host
sync); its backward reuses the forward kernel for dx (w read transposed via strides) and a
per-group reduction kernel for dw. Rows of x past offsets_E[-1] belong to no group: their y and
dx are exact zeros and dw never reads them, whatever x and dy hold there.
Each launcher is a custom op (marin::permute_fwd/_bwd, marin::unpermute_fwd/_bwd,
marin::grouped_mm_fwd/_dw) with autograd, so torch.compile traces the wrappers without a graph break.
Imports triton: reach it through get_kernels("triton") only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from marin_ablate.marin.kernels._common import acc_dtype, check_runnable, kernel_op, needed, next_pow2, save_inputs

# ---- Permute / unpermute -------------------------------------------------------------------------


@triton.jit
def gather_rows_kernel(x_ptr, idx_ptr, out_ptr, N, W, DIV, sxr, sxw, sor, sow,
                        BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    # out[n] = x[idx[n] // DIV]
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    src = tl.load(idx_ptr + offs_n, mask=mask_n, other=0).to(tl.int64) // DIV
    for w0 in range(0, W, BLOCK_W):
        offs_w = w0 + tl.arange(0, BLOCK_W)
        m = mask_n[:, None] & (offs_w < W)[None, :]
        v = tl.load(x_ptr + src[:, None] * sxr + offs_w[None, :] * sxw, mask=m, other=0.0)
        tl.store(out_ptr + offs_n[:, None].to(tl.int64) * sor + offs_w[None, :] * sow, v, mask=m)


@triton.jit
def combine_rows_kernel(y_ptr, pos_ptr, c_ptr, out_ptr, T, W, syr, syw, sor, sow,
                         K: tl.constexpr, HAS_C: tl.constexpr, ACC: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    # out[t] = Σ_k c[t,k]·y[pos[t,k]] (c ≡ 1 without HAS_C); pos < 0 marks a dropped assignment.
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    for w0 in range(0, W, BLOCK_W):
        offs_w = w0 + tl.arange(0, BLOCK_W)
        mask_w = offs_w < W
        acc = tl.zeros((BLOCK_T, BLOCK_W), dtype=ACC)
        for k in tl.static_range(K):
            p = tl.load(pos_ptr + offs_t * K + k, mask=mask_t, other=-1).to(tl.int64)
            ok = p >= 0
            row = tl.load(y_ptr + p[:, None] * syr + offs_w[None, :] * syw,
                          mask=ok[:, None] & mask_w[None, :], other=0.0).to(ACC)
            if HAS_C:
                c = tl.load(c_ptr + offs_t * K + k, mask=ok, other=0.0).to(ACC)
                row = row * c[:, None]
            acc += row
        tl.store(out_ptr + offs_t[:, None].to(tl.int64) * sor + offs_w[None, :] * sow,
                 acc.to(out_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_w[None, :])


@triton.jit
def unpermute_bwd_kernel(dy_ptr, y_ptr, src_ptr, c_ptr, dyn_ptr, dc_ptr, N, W, K,
                          sdr, sdw, syr, syw, sor, sow,
                          ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    # d y_N[n] = c[s]·dy[s // K] and dc[s] = ⟨dy[s // K], y_N[n]⟩ with s = src[n].
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    s = tl.load(src_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
    t = s // K
    c = tl.load(c_ptr + s, mask=mask_n, other=0.0).to(ACC)
    dot = tl.zeros((BLOCK_N,), dtype=ACC)
    for w0 in range(0, W, BLOCK_W):
        offs_w = w0 + tl.arange(0, BLOCK_W)
        m = mask_n[:, None] & (offs_w < W)[None, :]
        g = tl.load(dy_ptr + t[:, None] * sdr + offs_w[None, :] * sdw, mask=m, other=0.0).to(ACC)
        yv = tl.load(y_ptr + offs_n[:, None].to(tl.int64) * syr + offs_w[None, :] * syw, mask=m, other=0.0).to(ACC)
        dot += tl.sum(g * yv, axis=1)
        tl.store(dyn_ptr + offs_n[:, None].to(tl.int64) * sor + offs_w[None, :] * sow,
                 (g * c[:, None]).to(dyn_ptr.dtype.element_ty), mask=m)
    tl.store(dc_ptr + s, dot.to(dc_ptr.dtype.element_ty), mask=mask_n)


def _inverse(src_N: torch.Tensor, T: int, K: int) -> torch.Tensor:
    pos = torch.full((T * K,), -1, device=src_N.device, dtype=torch.int64)
    pos[src_N] = torch.arange(src_N.numel(), device=src_N.device)
    return pos


def row_blocks(W: int, elem: int) -> tuple[int, int]:
    # ~32 fp32 values per thread at 4 warps: the unpermute backward holds two such tiles.
    block_w = min(next_pow2(W), max(16, 4096 // elem))
    return max(1, min(32, 4096 // block_w)), block_w


def _launch_gather(x, idx, div, n_rows):
    W = x.shape[1]
    out = torch.empty((n_rows, W), device=x.device, dtype=x.dtype)
    bn, bw = row_blocks(W, x.element_size())
    gather_rows_kernel[(triton.cdiv(n_rows, bn),)](x, idx, out, n_rows, W, div, *x.stride(), *out.stride(),
                                                    BLOCK_N=bn, BLOCK_W=bw)
    return out


def _launch_combine(y, pos_TK, c_TK, T, K, acc_like):
    W = y.shape[1]
    out = torch.empty((T, W), device=y.device, dtype=y.dtype)
    bt, bw = row_blocks(W, y.element_size())
    combine_rows_kernel[(triton.cdiv(T, bt),)](
        y, pos_TK, c_TK if c_TK is not None else pos_TK, out, T, W, *y.stride(), *out.stride(),
        K=K, HAS_C=c_TK is not None, ACC=acc_dtype(acc_like), BLOCK_T=bt, BLOCK_W=bw)
    return out


@kernel_op("permute_fwd")
def _permute_fwd_op(x_TW: torch.Tensor, src_N: torch.Tensor, top_k: int) -> torch.Tensor:
    """Gather: out[n] = x[src_N[n] // top_k]."""
    return _launch_gather(x_TW, src_N, top_k, src_N.shape[0])


@_permute_fwd_op.register_fake
def _(x_TW, src_N, top_k):
    return x_TW.new_empty((src_N.shape[0], x_TW.shape[1]))


@kernel_op("permute_bwd")
def _permute_bwd_op(dxn_NW: torch.Tensor, src_N: torch.Tensor, T: int, top_k: int) -> torch.Tensor:
    """dx[t] = Σ_k dxn[n(t,k)]: the unweighted combine through the inverse map (no atomics)."""
    return _launch_combine(dxn_NW, _inverse(src_N, T, top_k), None, T, top_k, dxn_NW)


@_permute_bwd_op.register_fake
def _(dxn_NW, src_N, T, top_k):
    return dxn_NW.new_empty((T, dxn_NW.shape[1]))


def _permute_setup(ctx, inputs, output):
    x_TW, src_N, top_k = inputs
    ctx.T, ctx.top_k = x_TW.shape[0], top_k
    ctx.save_for_backward(src_N)


def _permute_backward(ctx, dxn_NW):
    (src_N,) = ctx.saved_tensors
    return _permute_bwd_op(dxn_NW, src_N, ctx.T, ctx.top_k), None, None


_permute_fwd_op.register_autograd(_permute_backward, setup_context=_permute_setup)


@kernel_op("unpermute_fwd")
def _unpermute_fwd_op(y_NW: torch.Tensor, src_N: torch.Tensor, combine_TK: torch.Tensor) -> torch.Tensor:
    """Weighted combine: y_TW[t] = Σ_k combine[t,k]·y_NW[n(t,k)], a dropped (t,k) adding 0."""
    T, K = combine_TK.shape
    return _launch_combine(y_NW, _inverse(src_N, T, K), combine_TK.contiguous(), T, K, y_NW)


@_unpermute_fwd_op.register_fake
def _(y_NW, src_N, combine_TK):
    return y_NW.new_empty((combine_TK.shape[0], y_NW.shape[1]))


@kernel_op("unpermute_bwd")
def _unpermute_bwd_op(dy_TW: torch.Tensor, y_NW: torch.Tensor, src_N: torch.Tensor,
                      combine_TK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d y_NW, d combine_TK); a dropped assignment gets a zero combine gradient."""
    N, W = y_NW.shape
    K = combine_TK.shape[1]
    dyn = torch.empty_like(y_NW, memory_format=torch.contiguous_format)
    dc = torch.zeros(combine_TK.shape, device=y_NW.device, dtype=combine_TK.dtype)
    bn, bw = row_blocks(W, y_NW.element_size())
    unpermute_bwd_kernel[(triton.cdiv(N, bn),)](
        dy_TW, y_NW, src_N, combine_TK.contiguous(), dyn, dc, N, W, K,
        *dy_TW.stride(), *y_NW.stride(), *dyn.stride(),
        ACC=acc_dtype(y_NW if y_NW.dtype == torch.float64 else combine_TK), BLOCK_N=bn, BLOCK_W=bw)
    return dyn, dc


@_unpermute_bwd_op.register_fake
def _(dy_TW, y_NW, src_N, combine_TK):
    return y_NW.new_empty(y_NW.shape), combine_TK.new_empty(combine_TK.shape)


def _unpermute_backward(ctx, dy_TW):
    y_NW, src_N, combine_TK = ctx.saved_tensors
    dyn, dc = _unpermute_bwd_op(dy_TW, y_NW, src_N, combine_TK)
    return needed(ctx, dyn, None, dc)


_unpermute_fwd_op.register_autograd(_unpermute_backward, setup_context=save_inputs)


def _check_routing(src_N, T: int, K: int, name: str) -> None:
    if src_N.dim() != 1 or src_N.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
        raise ValueError(f"{name}: src_N must be a 1-D integer tensor, got {src_N.dtype} of shape {tuple(src_N.shape)}")
    if src_N.numel() > T * K:
        raise ValueError(f"{name}: src_N has {src_N.numel()} rows, more than T*K={T * K} assignments")


def permute_triton(x_TW: torch.Tensor, src_N: torch.Tensor, top_k: int) -> torch.Tensor:
    """Rows of x in routed (expert-sorted) order: out[n] = x[src_N[n] // top_k]."""
    if x_TW.dim() != 2 or top_k < 1:
        raise ValueError(f"permute: want x_TW 2-D and top_k >= 1, got shape {tuple(x_TW.shape)}, top_k={top_k}")
    _check_routing(src_N, x_TW.shape[0], top_k, "permute")
    check_runnable(x_TW, src_N, name="permute")
    return _permute_fwd_op(x_TW, src_N, top_k)


def unpermute_triton(y_NW: torch.Tensor, src_N: torch.Tensor, combine_TK: torch.Tensor) -> torch.Tensor:
    """y_TW[t] = Σ_k combine[t,k]·y_NW[n(t,k)]. A dropped (t,k) contributes 0: it is absent from src_N,
    or listed with a zero row of y_NW (the grouped GEMM's output past offsets_E[-1])."""
    if y_NW.dim() != 2 or combine_TK.dim() != 2 or src_N.numel() != y_NW.shape[0]:
        raise ValueError(f"unpermute: want y_NW (N, W), src_N (N,), combine_TK (T, K); got {tuple(y_NW.shape)}, "
                         f"{tuple(src_N.shape)}, {tuple(combine_TK.shape)}")
    _check_routing(src_N, *combine_TK.shape, "unpermute")
    check_runnable(y_NW, src_N, combine_TK, name="unpermute")
    return _unpermute_fwd_op(y_NW, src_N, combine_TK)


# ---- Grouped GEMM --------------------------------------------------------------------------------


@triton.jit
def gmm_kernel(x_ptr, w_ptr, y_ptr, offs_ptr, tile_end_ptr, tile_group_ptr, E, I, O,
                sxn, sxi, swe, swi, swo, syn, syo,
                ACC: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    tile = tl.program_id(0)
    pid_o = tl.program_id(1)
    e = tl.load(tile_group_ptr + tile)
    if e < E:  # tiles past the last group's are padding of the fixed-size grid
        start = tl.load(offs_ptr + e - 1, mask=e > 0, other=0).to(tl.int64)
        end = tl.load(offs_ptr + e).to(tl.int64)
        first_tile = tl.load(tile_end_ptr + e - 1, mask=e > 0, other=0)
        rows = start + (tile - first_tile).to(tl.int64) * BM + tl.arange(0, BM)
        mask_r = rows < end
        offs_o = pid_o * BN + tl.arange(0, BN)
        mask_o = offs_o < O
        acc = tl.zeros((BM, BN), dtype=ACC)
        w_base = w_ptr + e.to(tl.int64) * swe
        for k0 in range(0, I, BK):
            offs_k = k0 + tl.arange(0, BK)
            mask_k = offs_k < I
            a = tl.load(x_ptr + rows[:, None] * sxn + offs_k[None, :] * sxi,
                        mask=mask_r[:, None] & mask_k[None, :], other=0.0)
            b = tl.load(w_base + offs_k[:, None] * swi + offs_o[None, :] * swo,
                        mask=mask_k[:, None] & mask_o[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PREC, out_dtype=ACC)
        tl.store(y_ptr + rows[:, None] * syn + offs_o[None, :] * syo, acc.to(y_ptr.dtype.element_ty),
                 mask=mask_r[:, None] & mask_o[None, :])


@triton.jit
def gmm_dw_kernel(x_ptr, dy_ptr, dw_ptr, offs_ptr, I, O,
                   sxn, sxi, syn, syo, swe, swi, swo,
                   ACC: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # dw[e] = x[rows of e]^T @ dy[rows of e]; BM tiles I, BN tiles O, BK steps over the group's rows.
    pid = tl.program_id(0)
    e = tl.program_id(1)
    n_o = tl.cdiv(O, BN)
    offs_i = (pid // n_o) * BM + tl.arange(0, BM)
    offs_o = (pid % n_o) * BN + tl.arange(0, BN)
    mask_i = offs_i < I
    mask_o = offs_o < O
    start = tl.load(offs_ptr + e - 1, mask=e > 0, other=0).to(tl.int64)
    end = tl.load(offs_ptr + e).to(tl.int64)
    acc = tl.zeros((BM, BN), dtype=ACC)
    for r0 in range(start, end, BK):
        rows = r0 + tl.arange(0, BK)
        mask_r = rows < end
        a = tl.load(x_ptr + rows[None, :] * sxn + offs_i[:, None] * sxi,
                    mask=mask_i[:, None] & mask_r[None, :], other=0.0)
        b = tl.load(dy_ptr + rows[:, None] * syn + offs_o[None, :] * syo,
                    mask=mask_r[:, None] & mask_o[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PREC, out_dtype=ACC)
    tl.store(dw_ptr + e.to(tl.int64) * swe + offs_i[:, None] * swi + offs_o[None, :] * swo,
             acc.to(dw_ptr.dtype.element_ty), mask=mask_i[:, None] & mask_o[None, :])


def gmm_blocks(N: int, I: int, O: int, elem: int = 2) -> tuple[int, int, int, int, int]:
    # 128x128x64 bf16 tiles use wgmma without spills on sm_90; fp32 tiles that size spill: halve BM.
    bm = 16 if N <= 512 else (128 if elem <= 2 else 64)
    bn = min(128, max(16, next_pow2(O)))
    bk = min(64, max(16, next_pow2(I)))
    return bm, bn, bk, (8 if bm * bn >= 128 * 128 else 4), 3


def _prec(x: torch.Tensor) -> str:
    # fp32 inputs: exact products (tests, and fp32 training); bf16/fp16 ignore this setting.
    return "ieee" if x.dtype in (torch.float32, torch.float64) else "tf32"


def _tile_table(offsets_E: torch.Tensor, N: int, bm: int):
    """(tile_end_E, tile_group_M, M): the row tiles of each group, laid out on device without a sync."""
    offs = offsets_E.to(torch.int64)
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).clamp_min(0)
    tile_end = torch.cumsum((counts + bm - 1) // bm, 0).to(torch.int32)
    n_tiles = triton.cdiv(N, bm) + offsets_E.numel()  # ≥ Σ_e ceil(count_e / bm)
    tile_group = torch.searchsorted(tile_end, torch.arange(n_tiles, device=offs.device, dtype=torch.int32),
                                    right=True).to(torch.int32)
    return tile_end, tile_group, n_tiles


def gmm_fwd(x_NI, w_EIO, offsets_E, *, w_transposed=False, blocks=None):
    """y = x @ w[e] per group; with w_transposed, w_EIO is read as (E, O, I) and y = x @ w[e]^T."""
    N, I = x_NI.shape
    E = w_EIO.shape[0]
    if w_transposed:
        O = w_EIO.shape[1]
        swe, swo, swi = w_EIO.stride()
    else:
        O = w_EIO.shape[2]
        swe, swi, swo = w_EIO.stride()
    bm, bn, bk, nw, ns = blocks or gmm_blocks(N, I, O, x_NI.element_size())
    y = torch.zeros((N, O), device=x_NI.device, dtype=x_NI.dtype)
    if N == 0:
        return y
    offs = offsets_E.to(device=x_NI.device, dtype=torch.int32).contiguous()
    tile_end, tile_group, n_tiles = _tile_table(offs, N, bm)
    gmm_kernel[(n_tiles, triton.cdiv(O, bn))](
        x_NI, w_EIO, y, offs, tile_end, tile_group, E, I, O,
        *x_NI.stride(), swe, swi, swo, *y.stride(),
        ACC=acc_dtype(x_NI), PREC=_prec(x_NI), BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=ns)
    return y


def gmm_dw(x_NI, dy_NO, offsets_E, *, blocks=None):
    """dw[e] = x[rows of e]^T @ dy[rows of e] in x's dtype, one group per offsets_E entry."""
    N, I = x_NI.shape
    O = dy_NO.shape[1]
    E = offsets_E.shape[0]
    bm = min(64, max(16, next_pow2(I)))
    bn = min(128, max(16, next_pow2(O)))
    bk = 16 if N <= 512 else 64
    nw = 8 if bm * bn >= 128 * 64 else 4
    if blocks is not None:
        bm, bn, bk, nw = blocks
    dw = torch.empty((E, I, O), device=x_NI.device, dtype=x_NI.dtype)
    offs = offsets_E.to(device=x_NI.device, dtype=torch.int32).contiguous()
    gmm_dw_kernel[(triton.cdiv(I, bm) * triton.cdiv(O, bn), E)](
        x_NI, dy_NO, dw, offs, I, O, *x_NI.stride(), *dy_NO.stride(), *dw.stride(),
        ACC=acc_dtype(x_NI), PREC=_prec(x_NI), BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=3)
    return dw


@kernel_op("grouped_mm_fwd")
def _gmm_fwd_op(x_NI: torch.Tensor, w_EIO: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
    """y = x @ w[e] per group, zeros past the last group. Also the backward's dx, on a w^T view."""
    return gmm_fwd(x_NI, w_EIO, offsets_E)


@_gmm_fwd_op.register_fake
def _(x_NI, w_EIO, offsets_E):
    return x_NI.new_empty((x_NI.shape[0], w_EIO.shape[2]))


@kernel_op("grouped_mm_dw")
def _gmm_dw_op(x_NI: torch.Tensor, dy_NO: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
    """dw[e] = x[rows of e]^T @ dy[rows of e]; rows past the last group are never read."""
    return gmm_dw(x_NI, dy_NO, offsets_E)


@_gmm_dw_op.register_fake
def _(x_NI, dy_NO, offsets_E):
    return x_NI.new_empty((offsets_E.shape[0], x_NI.shape[1], dy_NO.shape[1]))


def _gmm_backward(ctx, dy_NO):
    x_NI, w_EIO, offsets_E = ctx.saved_tensors
    # dx = dy @ w[e]^T: the forward kernel reads the transposed view through its strides.
    dx = _gmm_fwd_op(dy_NO, w_EIO.transpose(1, 2), offsets_E) if ctx.needs_input_grad[0] else None
    dw = _gmm_dw_op(x_NI, dy_NO, offsets_E) if ctx.needs_input_grad[1] else None
    return dx, dw, None


_gmm_fwd_op.register_autograd(_gmm_backward, setup_context=save_inputs)


def grouped_mm_triton(x_NI: torch.Tensor, w_EIO: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
    """y[n] = x[n] @ w[e] for rows n of group e (offsets_E: cumulative int32 ends); rows past the
    last group are zeros. Triton forward and backward, for GPUs without torch._grouped_mm."""
    if x_NI.dim() != 2 or w_EIO.dim() != 3 or x_NI.shape[1] != w_EIO.shape[1]:
        raise ValueError(f"grouped_mm: shapes x {tuple(x_NI.shape)} and w {tuple(w_EIO.shape)} do not match "
                         "(want x_NI and w_EIO with the same I)")
    if offsets_E.dim() != 1 or offsets_E.numel() != w_EIO.shape[0]:
        raise ValueError(f"grouped_mm: offsets_E must be 1-D with {w_EIO.shape[0]} entries, "
                         f"got {tuple(offsets_E.shape)}")
    check_runnable(x_NI, w_EIO, name="grouped_mm")
    if w_EIO.dtype != x_NI.dtype:  # fp32 master weights under bf16 autocast: tl.dot wants one dtype
        w_EIO = w_EIO.to(x_NI.dtype)
    return _gmm_fwd_op(x_NI, w_EIO, offsets_E)
