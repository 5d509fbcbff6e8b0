"""Token dispatch for the routed experts: the drop decision, a grouped GEMM, and the local dispatcher.

docs/method.md §2.1 "EP transports" (Marin 535B-A23B recipe: ragged all-to-all with pooled receiver capacity
vs fixed per-(sender, expert) capacity). The drop decision lives in one pure function, `plan_drops`,
used by the virtual-EP `LocalDispatcher` here and by the real expert-parallel dispatcher
(`marin/ep_exchange.py` `EPDispatcher`), so a single-process run drops exactly what an S-rank EP run would.

The local path is static-shaped and never reads a tensor value on the host (drop counts stay on
the device in DispatchStats), so a compiled MoE block is one graph and a GPU step does not stall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from marin_ablate.marin.kernels import KernelSet, get_kernels
from marin_ablate.marin.kernels.torch_ops import count_ids, sort_by_expert
from marin_ablate.marin.kernels.torch_ops import (
    grouped_mm_torch as grouped_mm,  # the one grouped GEMM of the torch path
)

TRANSPORTS = ("fixed", "ragged", "pooled_wave", "dropless")

# Guards ceil(cf * n) against float noise (1.15 * 20 = 22.999999999999996): a capacity is a count of
# rows, and a factor given to two decimals must not gain or lose a row through rounding error.
_CEIL_EPS = 1e-9


def _ceil(x: float) -> int:
    return int(math.ceil(x - _CEIL_EPS))


# ---- Capacities (shared by the planner, the EP transports and the benchmarks) --------------------


def fixed_cell_capacity(tokens_per_shard: int, top_k: int, n_experts: int, capacity_factor: float) -> int:
    """Rows of one (sender shard, expert) cell of the fixed transport: ceil(cf * T_s * K / E)."""
    return max(1, _ceil(capacity_factor * tokens_per_shard * top_k / n_experts))


def ragged_chunk_layout(n_local_experts: int, n_chunks: int) -> tuple[int, int]:
    """(chunks, experts per chunk) of one receiver. Like Marin, fall back to one chunk when the local
    expert count is not divisible by n_chunks (the chunking exists to bound transport memory)."""
    chunks = n_chunks if n_chunks > 1 and n_local_experts % n_chunks == 0 else 1
    return chunks, n_local_experts // chunks


def ragged_capacities(tokens_per_shard: int, top_k: int, n_local_experts: int, capacity_factor: float,
                      n_chunks: int) -> tuple[int, int]:
    """(pooled receiver capacity, per-chunk capacity) of the ragged transport, in rows.

    Pooled: max(E_local, ceil(cf * T_s * K)). It is split evenly over the chunks: each chunk of local
    experts gets max(E_chunk, ceil(pooled / chunks)) rows and capacity a chunk leaves unused is NOT
    carried to the next chunk (Marin's grug `ep_ragged_all_to_all`: each chunk owns its own receive
    buffer, so clipping is per chunk).
    """
    chunks, chunk_experts = ragged_chunk_layout(n_local_experts, n_chunks)
    pooled = max(n_local_experts, _ceil(capacity_factor * tokens_per_shard * top_k))
    return pooled, max(chunk_experts, _ceil(pooled / chunks))


def pooled_wave_capacities(tokens_per_shard: int, top_k: int, n_experts: int, n_shards: int,
                           capacity_factor: float, waves: int) -> tuple[int, int]:
    """(sender pool, receiver buffer) rows of the pooled-wave transport, per wave.

    Pool: each sender's rows for one destination shard in one wave, max(1, ceil(cf·A/(S·W)));
    buffer: each local expert's receive rows in one wave, max(1, ceil(cf·A/(E_l·W))); A = T_s·K
    (levanter grug/_moe/ep_fixed_pooled_wave_all_to_all.py `physical_pool_capacity`,
    `physical_receiver_capacity`, with every token valid)."""
    A, El = tokens_per_shard * top_k, n_experts // n_shards
    return (max(1, _ceil(capacity_factor * A / (n_shards * waves))),
            max(1, _ceil(capacity_factor * A / (El * waves))))


def ranks_in_groups(group_N: Tensor, n_groups: int, order_N: Tensor | None = None) -> Tensor:
    """Each element's rank inside its group (0 = first), by order_N (by flat position when None). The
    pooled-wave gates here and the real-EP receivers' buffer slots (marin/ep_exchange.py) rank with it."""
    N = group_N.numel()
    pos_N = torch.arange(N, device=group_N.device)
    key_N = group_N * N + (pos_N if order_N is None else order_N)
    sorted_N, perm_N = torch.sort(key_N)
    counts = count_ids(group_N, n_groups)
    starts = torch.cumsum(counts, 0) - counts
    rank_N = torch.empty_like(perm_N)
    rank_N[perm_N] = pos_N - starts[sorted_N // N]
    return rank_N


def pooled_wave_slots(dest_N: Tensor, n_dest: int, waves: int) -> tuple[Tensor, Tensor]:
    """(wave_N, slot_N) of a sender's assignments: ranked per destination in flat order, rank r goes
    to wave r % W at pool slot r // W (levanter `_moe_mlp_ep_fixed_pooled_wave_a2a_local`). The
    sender gate of `pooled_wave_keep` and of the real-EP exchange (marin/ep_exchange.py)."""
    r_N = ranks_in_groups(dest_N, n_dest)
    return r_N % waves, r_N // waves


def pooled_wave_receiver_keep(sent_N: Tensor, wave_N: Tensor, e_N: Tensor, slot_N: Tensor, shard_N: Tensor, *,
                              n_experts: int, n_shards: int, waves: int, buffer: int) -> Tensor:
    """Receiver gate: per (wave, expert) a buffer of `buffer` rows filled round-robin over senders
    (slot p of every sender before any slot p+1, levanter `_interleaved_receiver_ranks`); rows with
    sent_N False take no room. Shared by `pooled_wave_keep` and the real-EP receivers."""
    S, W = n_shards, waves
    group_N = torch.where(sent_N, wave_N * n_experts + e_N, W * n_experts)
    recv_rank_N = ranks_in_groups(group_N, W * n_experts + 1, slot_N * S + shard_N)
    return sent_N & (recv_rank_N < buffer)


def pooled_wave_keep(expert_idx_TK: Tensor, *, n_experts: int, n_shards: int, capacity_factor: float,
                     waves: int) -> tuple[Tensor, Tensor]:
    """(sender_keep_N, receiver_keep_N) of the pooled-wave transport over flat assignments n = t·K + k:
    Marin's hero transport (levanter grug/_moe/ep_fixed_pooled_wave_all_to_all.py), the sender gate
    `pooled_wave_slots` then the receiver gate `pooled_wave_receiver_keep`; a kept assignment passes both."""
    T, K = expert_idx_TK.shape
    S, W = n_shards, waves
    Ts, El = T // S, n_experts // S
    pool, buffer = pooled_wave_capacities(Ts, K, n_experts, S, capacity_factor, W)
    e_N = expert_idx_TK.reshape(-1).long()
    shard_N = torch.arange(T * K, device=e_N.device) // (Ts * K)
    wave_N, slot_N = pooled_wave_slots(shard_N * S + e_N // El, S * S, W)
    sender_keep_N = slot_N < pool
    return sender_keep_N, pooled_wave_receiver_keep(sender_keep_N, wave_N, e_N, slot_N, shard_N, n_experts=n_experts,
                                                    n_shards=S, waves=W, buffer=buffer)


def check_transport(transport: str, capacity_factor: float | None, **counts: int) -> None:
    """A transport's settings, as every dispatcher and the planner check them: a known transport, a positive
    capacity factor unless dropless, and `counts` (shards, chunks, waves) of at least 1."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r} is not known; allowed values: {', '.join(map(repr, TRANSPORTS))}")
    if transport != "dropless" and (capacity_factor is None or not capacity_factor > 0):
        raise ValueError(f"capacity_factor={capacity_factor!r} must be a positive float for transport={transport!r}")
    if any(v < 1 for v in counts.values()):
        named = [f"{k}={v}" for k, v in counts.items()]
        raise ValueError(f"{', '.join(named[:-1])} and {named[-1]} must be >= 1")


def _validate_plan(expert_idx_TK: Tensor, n_experts: int, n_shards: int, transport: str,
                   capacity_factor: float | None, n_chunks: int, check_ids: bool, waves: int = 3) -> None:
    check_transport(transport, capacity_factor, n_chunks=n_chunks, waves=waves)
    if expert_idx_TK.dim() != 2:
        raise ValueError(f"expert_idx_TK must be 2-D (tokens, top_k), got shape {tuple(expert_idx_TK.shape)}")
    if expert_idx_TK.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
        raise ValueError(f"expert_idx_TK must be an integer tensor, got dtype {expert_idx_TK.dtype}")
    if n_experts < 1 or n_shards < 1:
        raise ValueError(f"n_experts={n_experts} and n_shards={n_shards} must be positive integers")
    T = expert_idx_TK.shape[0]
    if T % n_shards != 0:
        raise ValueError(f"tokens T={T} are not divisible by n_shards={n_shards}; allowed: T % n_shards == 0")
    if n_experts % n_shards != 0:
        raise ValueError(f"n_experts={n_experts} is not divisible by n_shards={n_shards}; "
                         "allowed: n_experts % n_shards == 0 (experts live contiguously on receivers)")
    # The one check that reads values on the host (a device sync): callers passing router output skip it.
    if check_ids and expert_idx_TK.numel() and (int(expert_idx_TK.min()) < 0 or int(expert_idx_TK.max()) >= n_experts):
        raise ValueError(f"expert_idx_TK holds ids outside 0..{n_experts - 1}")


def cell_counts(expert_idx_TK: Tensor, n_experts: int, n_shards: int) -> tuple[Tensor, Tensor]:
    """(counts_SE, rank_N): assignments per (sender shard, expert) and, for each flat assignment
    n = t*K + k, its rank inside its (shard, expert) cell in (token, k) order (0 = earliest)."""
    N = expert_idx_TK.numel()
    shard_N = torch.arange(N, device=expert_idx_TK.device) // (N // n_shards)
    key_N = shard_N * n_experts + expert_idx_TK.reshape(-1).long()
    cells = n_shards * n_experts
    return count_ids(key_N, cells).view(n_shards, n_experts), ranks_in_groups(key_N, cells)


def ragged_accepted(counts_SE: Tensor, n_chunks: int, chunk_capacity: int) -> Tensor:
    """accepted_SE: rows of each (sender, expert) cell a ragged receiver accepts.

    Receiver r holds experts [r*E_l, (r+1)*E_l) in chunks of E_c experts, each chunk with
    `chunk_capacity` rows. Inside a chunk rows are taken in (expert, sender) order -- earlier experts,
    then earlier senders -- and a cell is clipped to what remains, so clipping only happens when the
    chunk overflows.
    """
    S, E = counts_SE.shape
    El = E // S
    chunks, Ec = ragged_chunk_layout(El, n_chunks)
    # (sender, receiver, chunk, expert-in-chunk) -> (receiver, chunk, expert-in-chunk, sender): the
    # priority order inside one chunk's buffer is expert-major, sender-minor.
    c_RCXS = counts_SE.view(S, S, chunks, Ec).permute(1, 2, 3, 0).reshape(S, chunks, Ec * S)
    start = torch.cumsum(c_RCXS, -1) - c_RCXS
    acc = torch.minimum(c_RCXS, (chunk_capacity - start).clamp(min=0))
    return acc.view(S, chunks, Ec, S).permute(3, 0, 1, 2).reshape(S, E)


def plan_drops(expert_idx_TK: Tensor, *, n_experts: int, n_shards: int, transport: str,
               capacity_factor: float | None, n_chunks: int = 2, waves: int = 3, check_ids: bool = True) -> Tensor:
    """keep_TK: which routed assignments survive the EP transport (docs/method.md §2.1; Marin EP drops).

    Tokens are cut into n_shards contiguous equal shards (shard s holds tokens [s*T_s, (s+1)*T_s));
    each shard sends its T_s*K assignments sorted by expert; expert e lives on receiver e // (E/S).
    Within a (sender, expert) cell the earliest (token, k) in flat order t*K+k is kept first.

    - "fixed": each (sender, expert) cell holds ceil(cf*T_s*K/E) rows (at least 1); the cell's later
      positions are dropped at the sender.
    - "ragged": pooled receiver capacity split over chunks of local experts (`ragged_capacities`); only an
      overflowing chunk clips (`ragged_accepted`); a clipped cell keeps its earliest positions.
    - "pooled_wave": the hero's static transport, `pooled_wave_keep`.
    - "dropless": keeps everything.

    check_ids=False skips the range check of the ids, the one host sync (router output is in range).
    """
    _validate_plan(expert_idx_TK, n_experts, n_shards, transport, capacity_factor, n_chunks, check_ids, waves)
    if transport == "dropless":
        return torch.ones(expert_idx_TK.shape, dtype=torch.bool, device=expert_idx_TK.device)
    T, K = expert_idx_TK.shape
    Ts = T // n_shards
    counts_SE, rank_N = cell_counts(expert_idx_TK, n_experts, n_shards)
    shard_N = torch.arange(T * K, device=rank_N.device) // (Ts * K)
    e_N = expert_idx_TK.reshape(-1).long()
    if transport == "fixed":
        keep_N = rank_N < fixed_cell_capacity(Ts, K, n_experts, capacity_factor)
    elif transport == "pooled_wave":
        keep_N = pooled_wave_keep(expert_idx_TK, n_experts=n_experts, n_shards=n_shards,
                                  capacity_factor=capacity_factor, waves=waves)[1]
    else:
        _, chunk_cap = ragged_capacities(Ts, K, n_experts // n_shards, capacity_factor, n_chunks)
        accepted_SE = ragged_accepted(counts_SE, n_chunks, chunk_cap)
        keep_N = rank_N < accepted_SE[shard_N, e_N]
    return keep_N.view(T, K)


# ---- Experts and the grouped GEMM ----------------------------------------------------------------


@dataclass
class ExpertWeights:
    """Stacked SwiGLU expert weights, experts leading: y = (silu(x Wg) * (x Wu)) Wd.

    Under expert parallelism a rank holds only its E/S local experts (the leading dim is E_local)."""

    w_gate_EWH: Tensor
    w_up_EWH: Tensor
    w_down_EHW: Tensor

    @property
    def n_experts(self) -> int:
        return self.w_gate_EWH.shape[0]

    def slice(self, start: int, stop: int) -> "ExpertWeights":
        return ExpertWeights(self.w_gate_EWH[start:stop], self.w_up_EWH[start:stop], self.w_down_EHW[start:stop])


@dataclass
class DispatchStats:
    """Drop and traffic accounting of one dispatch. bytes_moved: bytes that cross shard boundaries, dispatch
    plus the mirrored return (`transport_bytes`; 0 with one shard). Counts stay on the device (0-d int64
    tensors, dropped_per_shard of shape (S,)) so accounting never stalls a step, except the ragged real-EP
    exchange's host ints, derived from the split sizes it reads anyway; ModelOutput.stats reads them once
    per forward."""

    assigned: int
    dropped: Tensor | int
    dropped_per_shard: Tensor | list[int] | None
    bytes_moved: Tensor | int


class Dispatcher(Protocol):
    """`keep_TK` (a micro-batch of an accumulated step): the drops `plan` decided for the whole step, applied
    instead of deciding them from this call's tokens."""

    def __call__(self, x_TW: Tensor, expert_idx_TK: Tensor, combine_TK: Tensor, experts: ExpertWeights, *,
                 dropless: bool, keep_TK: Tensor | None = None) -> tuple[Tensor, DispatchStats]: ...

    def plan(self, expert_idx_TK: Tensor, n_experts: int, row_bytes: int) -> tuple[Tensor, Tensor | int]:
        """(keep_TK, bytes moved) of this rank's tokens of a whole step, as a one-batch step drops them."""
        ...


def expert_offsets(expert_sorted_N: Tensor, n_experts: int) -> Tensor:
    """Cumulative group ends (int32) of rows already sorted by expert id."""
    return torch.cumsum(count_ids(expert_sorted_N, n_experts), 0).to(torch.int32)


def swiglu_grouped(x_NW: Tensor, offsets_E: Tensor, experts: ExpertWeights, gmm=grouped_mm) -> Tensor:
    """SwiGLU experts over rows grouped by expert: (silu(x Wg) * (x Wu)) Wd per group; rows past
    offsets[-1] come out zero (`gmm`: a KernelSet's grouped_mm)."""
    h_NH = F.silu(gmm(x_NW, experts.w_gate_EWH, offsets_E)) * gmm(x_NW, experts.w_up_EWH, offsets_E)
    return gmm(h_NH, experts.w_down_EHW, offsets_E)


# ---- Virtual EP: one process, drops as an S-shard EP run would see them --------------------------


def transport_bytes(expert_idx_TK: Tensor, keep_TK: Tensor, *, n_experts: int, n_shards: int, transport: str,
                    capacity_factor: float | None, row_bytes: int, waves: int = 3) -> Tensor | int:
    """Bytes crossing shard boundaries, dispatch plus the mirrored return: rows whose receiver is another shard
    times `row_bytes`. The fixed and pooled-wave transports send every padded cell or pool, a constant of the
    shapes (the pooled-wave's in-band expert-id header, ceil(pool/width) rows per pool, is not counted); the
    ragged (and dropless) one's is a device tensor, plus the all-gathered S x E int64 count matrix."""
    S = n_shards
    if S == 1:
        return 0
    T, K = expert_idx_TK.shape
    El = n_experts // S
    if transport == "fixed":
        cap = fixed_cell_capacity(T // S, K, n_experts, capacity_factor)
        return 2 * S * (S - 1) * El * cap * row_bytes
    if transport == "pooled_wave":
        pool, _ = pooled_wave_capacities(T // S, K, n_experts, S, capacity_factor, waves)
        return 2 * waves * S * (S - 1) * pool * row_bytes
    shard_N = torch.arange(T * K, device=expert_idx_TK.device) // ((T // S) * K)
    recv_N = expert_idx_TK.reshape(-1).long() // El
    off = ((recv_N != shard_N) & keep_TK.reshape(-1)).sum()
    counts_bytes = S * (S - 1) * n_experts * 8  # every shard all-gathers its E int64 counts
    return 2 * off * row_bytes + counts_bytes


class LocalDispatcher:
    """Virtual EP (docs/method.md §2.1): drops decided by `plan_drops` over n_shards virtual shards, experts
    computed with one grouped GEMM, outputs weighted by combine_TK and scattered back to tokens,
    through the permute / grouped_mm / unpermute of a kernel set (`ModelConfig.kernels`)."""

    def __init__(self, transport: str, n_shards: int, capacity_factor: float | None, n_chunks: int = 2,
                 kernels: KernelSet | None = None, waves: int = 3):
        check_transport(transport, capacity_factor, n_shards=n_shards, n_chunks=n_chunks, waves=waves)
        self.transport, self.n_shards, self.capacity_factor = transport, n_shards, capacity_factor
        self.n_chunks, self.waves = n_chunks, waves
        self.kernels = kernels if kernels is not None else get_kernels("torch")

    def __repr__(self) -> str:
        return (f"LocalDispatcher(transport={self.transport!r}, n_shards={self.n_shards}, "
                f"capacity_factor={self.capacity_factor}, n_chunks={self.n_chunks}, kernels={self.kernels.backend!r})")

    def plan(self, expert_idx_TK: Tensor, n_experts: int, row_bytes: int,
             transport: str | None = None) -> tuple[Tensor, Tensor | int]:
        """(keep_TK, bytes crossing shards) of a whole step's tokens over this dispatcher's virtual shards."""
        kw = dict(n_experts=n_experts, n_shards=self.n_shards, transport=transport or self.transport,
                  capacity_factor=self.capacity_factor, waves=self.waves)
        keep_TK = plan_drops(expert_idx_TK, n_chunks=self.n_chunks, check_ids=False, **kw)
        return keep_TK, transport_bytes(expert_idx_TK, keep_TK, row_bytes=row_bytes, **kw)

    def __call__(self, x_TW: Tensor, expert_idx_TK: Tensor, combine_TK: Tensor, experts: ExpertWeights, *,
                 dropless: bool, keep_TK: Tensor | None = None) -> tuple[Tensor, DispatchStats]:
        T, K = expert_idx_TK.shape
        E, S = experts.n_experts, self.n_shards
        if keep_TK is not None:  # the step's drops, planned over every micro-batch's tokens
            y_TW = combine_kept(x_TW, expert_idx_TK, combine_TK, keep_TK, experts, self.kernels)
            return y_TW, DispatchStats(assigned=T * K, dropped=(~keep_TK).sum(), dropped_per_shard=None, bytes_moved=0)
        transport = "dropless" if dropless else self.transport
        if transport == "dropless" and (T % S or E % S):  # an eval batch the shards do not divide: no accounting
            y_TW = combine_kept(x_TW, expert_idx_TK, combine_TK, None, experts, self.kernels)
            return y_TW, DispatchStats(assigned=T * K, dropped=0, dropped_per_shard=None, bytes_moved=0)
        keep_TK, nbytes = self.plan(expert_idx_TK, E, x_TW.shape[1] * x_TW.element_size(), transport)
        y_TW = combine_kept(x_TW, expert_idx_TK, combine_TK, None if transport == "dropless" else keep_TK, experts,
                            self.kernels)
        dropped_S = (~keep_TK).view(S, -1).sum(1)
        return y_TW, DispatchStats(assigned=T * K, dropped=dropped_S.sum(), dropped_per_shard=dropped_S,
                                   bytes_moved=nbytes)


def combine_kept(x_TW: Tensor, expert_idx_TK: Tensor, combine_TK: Tensor, keep_TK: Tensor | None,
                 experts: ExpertWeights, kernels: KernelSet) -> Tensor:
    """y_TW = sum over kept (t,k) of combine[t,k] * SwiGLU_{e[t,k]}(x[t]) (keep_TK None: all kept).

    Static shapes: all T·K rows are permuted, the dropped ones after the last expert group, where the
    grouped GEMM returns zeros; their combine weight is zeroed too, so they get no gradient.
    """
    K = expert_idx_TK.shape[1]
    src_N, offsets_E = sort_by_expert(expert_idx_TK, experts.n_experts, keep_TK)
    out_NW = swiglu_grouped(kernels.permute(x_TW, src_N, K), offsets_E, experts, kernels.grouped_mm)
    if keep_TK is not None:
        combine_TK = combine_TK * keep_TK
    return kernels.unpermute(out_NW, src_N, combine_TK.to(out_NW.dtype)).to(x_TW.dtype)
