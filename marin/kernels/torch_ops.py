"""Plain-torch MoE data movement and grouped GEMM: the `kernels="torch"` set and the references the
Triton MoE kernels (marin/kernels/moe.py) are tested against. No triton import here.

Conventions (shared with marin/dispatch.py): `src_N` holds, for each routed row n, its flat
assignment index t·K + k into (T, K): kept assignments first, grouped by expert, then the dropped
ones; `offsets_E` are cumulative int32 group ends (torch._grouped_mm's `offs`), so rows past
offsets[-1] are the dropped assignments and the grouped GEMM returns zeros for them. Every shape is
static (N = T·K) and nothing here reads a tensor value on the host: a compiled MoE block has no
graph break and a GPU step no device sync.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor


def count_ids(ids: Tensor, n: int) -> Tensor:
    """counts[i] = #{j: ids[j] == i} for ids in [0, n), int64 of static length n (torch.bincount's
    output length depends on the values, which breaks a torch.compile graph)."""
    ids = ids.reshape(-1).long()
    return torch.zeros(n, dtype=torch.long, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))


def sort_by_expert(expert_idx_TK: Tensor, n_experts: int, keep_TK: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(src_N, offsets_E): all T·K assignments, the kept ones in stable expert order and the dropped
    ones (keep_TK False) after offsets_E[-1]; offsets_E are the cumulative group ends of the kept."""
    if expert_idx_TK.dim() != 2:
        raise ValueError(f"sort_by_expert: expert_idx_TK must be 2-D (tokens, top_k), got {tuple(expert_idx_TK.shape)}")
    e_N = expert_idx_TK.reshape(-1).long()
    if keep_TK is not None:
        e_N = torch.where(keep_TK.reshape(-1), e_N, n_experts)  # dropped: a sentinel group after the last
    src_N = torch.sort(e_N, stable=True).indices
    offsets_E = torch.cumsum(count_ids(e_N, n_experts + 1)[:n_experts], 0).to(torch.int32)
    return src_N, offsets_E


def permute_torch(x_TW: Tensor, src_N: Tensor, top_k: int) -> Tensor:
    """Rows of x in routed order: out[n] = x[src_N[n] // top_k]."""
    return x_TW[src_N // top_k]


def unpermute_torch(y_NW: Tensor, src_N: Tensor, combine_TK: Tensor) -> Tensor:
    """y_TW[t] = Σ_k combine[t,k]·y_NW[n(t,k)] over the rows of token t listed in src_N (a dropped row
    adds 0 when the grouped GEMM zeroed it or its combine weight is 0)."""
    T, K = combine_TK.shape
    w_N1 = combine_TK.reshape(-1)[src_N].unsqueeze(1).to(y_NW.dtype)
    out = torch.zeros((T, y_NW.shape[1]), device=y_NW.device, dtype=y_NW.dtype)
    return out.index_add(0, src_N // K, y_NW * w_N1)


def _cpu_grouped_mm_dtypes() -> frozenset:
    """Dtypes this torch build's CPU torch._grouped_mm accepts (torch 2.13 has fp32 and bf16; older
    builds none). Probed once at import: a probe inside a compiled region would be traced."""
    ok = set()
    for dt in (torch.float32, torch.bfloat16):
        with contextlib.suppress(AttributeError, RuntimeError, NotImplementedError, TypeError):
            torch._grouped_mm(torch.ones(2, 8, dtype=dt), torch.ones(1, 8, 8, dtype=dt),
                              offs=torch.tensor([2], dtype=torch.int32))
            ok.add(dt)
    return frozenset(ok)


_CPU_GROUPED_MM_DTYPES = _cpu_grouped_mm_dtypes()


def native_grouped_mm_ok(x_NI: Tensor, w_EIO: Tensor) -> bool:
    if x_NI.dtype != w_EIO.dtype:
        return False
    if x_NI.device.type == "cpu":
        # torch.compile traces _grouped_mm through a meta function that accepts bf16 only (torch 2.13);
        # the CPU kernel too wants 16-byte row strides (a width-6 fp32 row raises).
        aligned = (x_NI.shape[1] * x_NI.element_size()) % 16 == 0 and (w_EIO.shape[2] * w_EIO.element_size()) % 16 == 0
        return aligned and x_NI.dtype in _CPU_GROUPED_MM_DTYPES and (
            x_NI.dtype == torch.bfloat16 or not torch.compiler.is_compiling())
    if not (x_NI.is_cuda and hasattr(torch, "_grouped_mm")) or x_NI.dtype != torch.bfloat16:
        return False
    if torch.cuda.get_device_capability(x_NI.device) < (9, 0):
        return False
    # The kernel wants 16-byte aligned rows in every operand.
    return x_NI.shape[1] % 8 == 0 and w_EIO.shape[2] % 8 == 0


def grouped_mm_torch(x_NI: Tensor, w_EIO: Tensor, offsets_E: Tensor) -> Tensor:
    """y[n] = x[n] @ w[e] for rows n in group e = [offsets[e-1], offsets[e]) (offsets: cumulative
    int32 group ends, as torch._grouped_mm takes them). Rows past offsets[-1] come back as zeros,
    and get zero gradient.

    torch._grouped_mm on CPU (fp32, bf16) and on CUDA sm90+ (bf16), with no host sync; elsewhere a
    loop over the groups (it reads the offsets on the host; the Triton grouped GEMM is the GPU path).
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
    if native_grouped_mm_ok(x_NI, w_EIO):
        offs = offsets_E.to(device=x_NI.device, dtype=torch.int32)
        # The kernel leaves rows past the last group unspecified, forward and backward (garbage dx on
        # H200, uninitialised memory on CPU). Masking both sides on the device keeps them out of y and
        # of dx without reading offs[-1] on the host. The output mask's backward also hands the kernel
        # a freshly allocated gradient: its backward rejects zero-stride ones (measured on H200).
        valid_N1 = (torch.arange(N, device=x_NI.device) < offs[-1]).unsqueeze(1)
        return torch.where(valid_N1, torch._grouped_mm(torch.where(valid_N1, x_NI, 0), w_EIO, offs=offs), 0)
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
    return torch.cat(parts, 0) if parts else x_NI.new_zeros(N, O) + 0 * w_EIO.sum()
