"""Plain-torch MoE data movement and grouped GEMM: the `kernels="torch"` set and the references the
Triton MoE kernels (marin/kernels/moe.py) are tested against. No triton import here.

Conventions (shared with marin/dispatch.py): `src_N` holds, for each routed row n in expert-sorted
order, its flat assignment index t·K + k into (T, K); `offsets_E` are cumulative int32 group ends
(torch._grouped_mm's `offs`); rows past offsets[-1] come back as zeros.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sort_by_expert(expert_idx_TK: Tensor, n_experts: int, keep_TK: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(src_N, offsets_E): kept assignments in stable expert order, and the cumulative group ends."""
    if expert_idx_TK.dim() != 2:
        raise ValueError(f"sort_by_expert: expert_idx_TK must be 2-D (tokens, top_k), got {tuple(expert_idx_TK.shape)}")
    e_M = expert_idx_TK.reshape(-1).long()
    if keep_TK is None:
        src_M = torch.sort(e_M, stable=True).indices
        e_sorted = e_M[src_M]
    else:
        kept_M = torch.nonzero(keep_TK.reshape(-1)).squeeze(1)
        order = torch.sort(e_M[kept_M], stable=True).indices
        src_M = kept_M[order]
        e_sorted = e_M[src_M]
    offsets_E = torch.cumsum(torch.bincount(e_sorted, minlength=n_experts), 0).to(torch.int32)
    return src_M, offsets_E


def permute_torch(x_TW: Tensor, src_N: Tensor, top_k: int) -> Tensor:
    """Rows of x in routed order: out[n] = x[src_N[n] // top_k]."""
    return x_TW[src_N // top_k]


def unpermute_torch(y_NW: Tensor, src_N: Tensor, combine_TK: Tensor) -> Tensor:
    """y_TW[t] = Σ_k combine[t,k]·y_NW[n(t,k)] over the routed rows of token t (dropped rows add 0)."""
    T, K = combine_TK.shape
    w_N1 = combine_TK.reshape(-1)[src_N].unsqueeze(1).to(y_NW.dtype)
    out = torch.zeros((T, y_NW.shape[1]), device=y_NW.device, dtype=y_NW.dtype)
    return out.index_add(0, src_N // K, y_NW * w_N1)


class _MaterializeGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient: torch._grouped_mm's backward rejects
    zero-stride gradients (an expanded ones from `.sum().backward()`), measured on H200."""

    @staticmethod
    def forward(ctx, y: Tensor) -> Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        return g.contiguous()


def _native_grouped_mm_ok(x_NI: Tensor, w_EIO: Tensor) -> bool:
    if not (x_NI.is_cuda and hasattr(torch, "_grouped_mm")):
        return False
    if x_NI.dtype != torch.bfloat16 or w_EIO.dtype != torch.bfloat16:
        return False
    if torch.cuda.get_device_capability(x_NI.device) < (9, 0):
        return False
    # The kernel wants 16-byte aligned rows in every operand.
    return x_NI.shape[1] % 8 == 0 and w_EIO.shape[2] % 8 == 0


def grouped_mm_torch(x_NI: Tensor, w_EIO: Tensor, offsets_E: Tensor) -> Tensor:
    """y[n] = x[n] @ w[e] for rows n in group e = [offsets[e-1], offsets[e]) (offsets: cumulative
    int32 group ends, as torch._grouped_mm takes them). Rows past offsets[-1] come back as zeros.

    torch._grouped_mm on CUDA sm90+ in bf16; elsewhere a loop over non-empty groups (autograd-exact).
    """
    if x_NI.dim() != 2 or w_EIO.dim() != 3 or x_NI.shape[1] != w_EIO.shape[1]:
        raise ValueError(f"grouped_mm: shapes x {tuple(x_NI.shape)} and w {tuple(w_EIO.shape)} do not match "
                         "(want x_NI and w_EIO with the same I)")
    if offsets_E.numel() != w_EIO.shape[0]:
        raise ValueError(f"grouped_mm: {offsets_E.numel()} offsets for {w_EIO.shape[0]} experts")
    N, O = x_NI.shape[0], w_EIO.shape[2]
    if torch.is_autocast_enabled(x_NI.device.type):
        # Autocast does not cover _grouped_mm; without this cast fp32 master weights would send a
        # bf16 run down the per-expert loop.
        dt = torch.get_autocast_dtype(x_NI.device.type)
        x_NI, w_EIO = x_NI.to(dt), w_EIO.to(dt)
    if _native_grouped_mm_ok(x_NI, w_EIO):
        offs = offsets_E.to(device=x_NI.device, dtype=torch.int32)
        total = int(offs[-1]) if offs.numel() else 0
        # The kernel leaves rows past the last group unspecified, forward and backward (measured on
        # H200: garbage in dx), so it only ever sees the grouped rows.
        y = _MaterializeGrad.apply(torch._grouped_mm(x_NI[:total], w_EIO, offs=offs))
        return torch.cat([y, y.new_zeros(N - total, O)]) if total < N else y
    ends = offsets_E.tolist()
    # unbind once: indexing w[e] per expert would allocate a full (E, I, O) zero gradient per expert.
    w_list = w_EIO.unbind(0)
    parts, start = [], 0
    for e, end in enumerate(ends):
        if end > start:
            parts.append(x_NI[start:end] @ w_list[e])
        start = end
    if start < N:
        parts.append(x_NI.new_zeros(N - start, O))
    if not parts:
        return x_NI.new_zeros(N, O) + 0 * w_EIO.sum()
    return torch.cat(parts, 0)

