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


def grouped_mm_torch(x_NI: Tensor, w_EIO: Tensor, offsets_E: Tensor) -> Tensor:
    """y[n] = x[n] @ w[e] for rows n of group e; torch._grouped_mm on CUDA sm90+ bf16, else a loop."""
    if x_NI.dim() != 2 or w_EIO.dim() != 3 or x_NI.shape[1] != w_EIO.shape[1]:
        raise ValueError(f"grouped_mm: shapes x {tuple(x_NI.shape)} and w {tuple(w_EIO.shape)} do not match "
                         "(want x_NI and w_EIO with the same I)")
    if offsets_E.numel() != w_EIO.shape[0]:
        raise ValueError(f"grouped_mm: {offsets_E.numel()} offsets for {w_EIO.shape[0]} experts")
    N, O = x_NI.shape[0], w_EIO.shape[2]
    if (x_NI.is_cuda and hasattr(torch, "_grouped_mm") and x_NI.dtype == torch.bfloat16
            and w_EIO.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x_NI.device) >= (9, 0)
            and x_NI.shape[1] % 8 == 0 and O % 8 == 0):
        offs = offsets_E.to(device=x_NI.device, dtype=torch.int32)
        y = torch._grouped_mm(x_NI, w_EIO, offs=offs)
        # Rows past the last group are unspecified in torch._grouped_mm: zero them without a sync.
        row_ok = torch.arange(N, device=x_NI.device) < offs[-1]
        return torch.where(row_ok[:, None], y, y.new_zeros(()))
    parts, start = [], 0
    for e, end in enumerate(offsets_E.tolist()):
        if end > start:
            parts.append(x_NI[start:end] @ w_EIO[e])
        start = end
    if start < N:
        parts.append(x_NI.new_zeros(N - start, O))
    if not parts:
        return x_NI.new_zeros(N, O) + 0 * w_EIO.sum()
    return torch.cat(parts, 0)
