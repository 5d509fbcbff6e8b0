"""The expert-parallel exchange on torch.distributed: the fixed, pooled-wave and ragged all-to-all
transports of one EP group (docs/method.md §2.1 "EP transports"; the layout, sharding and
checkpoints are marin/ep.py).

Drops. Every rank decides its own drops with the functions `plan_drops` uses (marin.dispatch), so real
EP on S ranks keeps what virtual EP with S shards keeps (pinned by tests/marin/test_ep.py):
- fixed needs only local information (per-(sender, expert) cell capacity);
- pooled_wave ranks its rows per destination (`pooled_wave_slots`, the sender gate), sends static
  pools, and each receiver applies `pooled_wave_receiver_keep` to what arrived (the receiver gate);
- ragged first all-gathers the S x E count matrix, from which every rank computes every receiver's
  accepted cells (`ragged_accepted`).

Host reads (docs/method.md §2.1): none for fixed and pooled_wave; ragged reads every chunk's split sizes in
one `.tolist()` per dispatch. Drop counts that only feed metrics stay on the device (DispatchStats).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from marin_ablate.marin.dispatch import (
    TRANSPORTS,
    DispatchStats,
    ExpertWeights,
    cell_counts,
    check_transport,
    expert_offsets,
    fixed_cell_capacity,
    plan_drops,
    pooled_wave_capacities,
    pooled_wave_receiver_keep,
    pooled_wave_slots,
    ragged_accepted,
    ragged_capacities,
    ragged_chunk_layout,
    ranks_in_groups,
    swiglu_grouped,
    transport_bytes,
)
from marin_ablate.marin.ep_layout import check_ep_layout
from marin_ablate.marin.kernels.torch_ops import count_ids

EP_TRANSPORTS = TRANSPORTS  # every transport the planner knows has a real-EP exchange


class _AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward is the mirrored exchange (splits swapped; None: equal splits).
    Written out because torch's functional `all_to_all_single_autograd` costs ~4 s on its first call
    per process (measured on gloo CPU), which dominates short runs and tests."""

    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list[int] | None, in_splits: list[int] | None, group) -> Tensor:
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        rows = x.shape[0] if out_splits is None else sum(out_splits)
        out = x.new_empty((rows,) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        rows = g.shape[0] if ctx.in_splits is None else sum(ctx.in_splits)
        gx = g.new_empty((rows,) + tuple(g.shape[1:]))
        dist.all_to_all_single(gx, g.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return gx, None, None, None


class _GradScale(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by a constant."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return g * ctx.scale, None


def read_splits(splits_2CS: Tensor, rows: int) -> list:
    """ragged's one host read: every chunk's (input, output) split sizes as host ints (one `.tolist()`);
    `rows` (the rows this rank could send) is for a stand-in that cannot read values (planning/rehearsal.py)."""
    return splits_2CS.tolist()


_a2a = _AllToAll.apply  # (x, out_splits, in_splits, group): rows in_splits[q] go to rank q, out_splits[q] come back


def _a2a_equal(x: Tensor, group) -> Tensor:
    """Equal-split all_to_all_single of a tensor that carries no gradient (ids, flags)."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous(), group=group)
    return out


def _all_gather_flat(out: Tensor, inp: Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.12
    gather(out, inp, group=group)


def _swiglu_bmm(x_EMW: Tensor, w_gate_EWH: Tensor, w_up_EWH: Tensor, w_down_EHW: Tensor) -> Tensor:
    """Static-shape experts: every local expert sees the same padded row count (fixed, pooled_wave)."""
    h = F.silu(torch.bmm(x_EMW, w_gate_EWH)) * torch.bmm(x_EMW, w_up_EWH)
    return torch.bmm(h, w_down_EHW)


def _with_zero_row(x_RW: Tensor) -> Tensor:
    """x with one zero row appended: index R reads zeros (a padded slot or a dropped row)."""
    return torch.cat([x_RW, x_RW.new_zeros(1, x_RW.shape[1])])


class EPDispatcher:
    """Expert-parallel Dispatcher (docs/method.md §2.1 "EP transports"; the drops as in the module docstring):
    tokens of this rank are one shard of the EP group, `experts` holds this rank's E/S local experts, expert
    ids are global. fixed and pooled_wave send static padded cells or pools through equal splits to
    static-shape experts (bmm); ragged all-gathers the S x E counts, then per chunk of local experts sends
    the accepted rows with split sizes to the grouped GEMM; every return mirrors the dispatch.
    dropless=True (eval): the ragged exchange with nothing clipped, whatever the transport.
    Planned drops (`keep_TK`, a micro-batch of an accumulated step; or `virtual` > 1, a rank holding several
    of the run's ModelConfig.ep_shards shards): `plan` gathers the group's expert ids and decides the drops
    over every virtual shard with `plan_drops`, and the ragged exchange carries the kept rows unclipped,
    whatever the transport (the same kept set, so the same math; the bytes of another exchange).
    Stats are this rank's (dropped_per_shard: ragged only, known from the counts; bytes_moved: what this
    rank sends, dispatch + return). All ranks of the group must pass the same T_s.
    """

    def __init__(self, transport: str, group, n_experts: int, capacity_factor: float | None, n_chunks: int = 2,
                 waves: int = 3, virtual: int = 1):
        check_transport(transport, capacity_factor, n_chunks=n_chunks, waves=waves)
        self.group, self.S, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        check_ep_layout(n_experts, self.S, self.S)
        self.transport, self.n_experts, self.capacity_factor = transport, n_experts, capacity_factor
        self.n_chunks, self.waves = n_chunks, waves
        self.virtual = virtual  # the run's EP shards each rank holds (its tokens in that many contiguous shards)
        self.n_local = n_experts // self.S
        # Multiplies the local experts' gradients (marin.parallel sets 1/W when no FSDP unit over "dp"
        # averages them), so the slices hold gradients of the mean of the per-rank losses.
        self.grad_scale = 1.0
        # marin.parallel.ExpertShard when the slice is ZeRO-sharded over dp: gathered here, per layer
        self.expert_shard = None

    def __repr__(self) -> str:
        return (f"EPDispatcher(transport={self.transport!r}, ep={self.S}, rank={self.rank}, "
                f"n_experts={self.n_experts}, capacity_factor={self.capacity_factor}, n_chunks={self.n_chunks}, "
                f"waves={self.waves})")

    def plan(self, expert_idx_TK: Tensor, n_experts: int, row_bytes: int) -> tuple[Tensor, Tensor | int]:
        """(keep_TK, bytes crossing shards) of this rank's tokens of a step: the group's expert ids gathered
        (rank order is shard order), `plan_drops` over its S x virtual shards, this rank's rows kept."""
        T, K = expert_idx_TK.shape
        ids = torch.empty(self.S * T * K, dtype=expert_idx_TK.dtype, device=expert_idx_TK.device)
        _all_gather_flat(ids, expert_idx_TK.contiguous().view(-1), self.group)
        ids_TK = ids.view(self.S * T, K)
        shards = self.S * self.virtual
        keep_TK = plan_drops(ids_TK, n_experts=n_experts, n_shards=shards, transport=self.transport,
                             capacity_factor=self.capacity_factor, n_chunks=self.n_chunks, waves=self.waves,
                             check_ids=False)
        nbytes = transport_bytes(ids_TK, keep_TK, n_experts=n_experts, n_shards=shards, transport=self.transport,
                                 capacity_factor=self.capacity_factor, row_bytes=row_bytes, waves=self.waves)
        return keep_TK[self.rank * T:(self.rank + 1) * T], nbytes

    def __call__(self, x_TW: Tensor, expert_idx_TK: Tensor, combine_TK: Tensor, experts: ExpertWeights, *,
                 dropless: bool, keep_TK: Tensor | None = None) -> tuple[Tensor, DispatchStats]:
        if experts.n_experts != self.n_local:
            raise ValueError(f"experts hold {experts.n_experts} experts; this EP rank needs n_experts/ep = "
                             f"{self.n_experts}/{self.S} = {self.n_local} (shard the model with shard_experts)")
        if self.expert_shard is not None:
            experts = ExpertWeights(*(self.expert_shard.gather(w)
                                      for w in (experts.w_gate_EWH, experts.w_up_EWH, experts.w_down_EHW)))
        if self.grad_scale != 1.0:
            experts = ExpertWeights(*(_GradScale.apply(w, self.grad_scale)
                                      for w in (experts.w_gate_EWH, experts.w_up_EWH, experts.w_down_EHW)))
        if keep_TK is None and self.virtual > 1 and not dropless:
            keep_TK, _ = self.plan(expert_idx_TK, self.n_experts, x_TW.shape[1] * x_TW.element_size())
        if keep_TK is not None:  # planned drops: the kept rows through the unclipped ragged exchange
            e_N, keep_N = expert_idx_TK.reshape(-1).long(), keep_TK.reshape(-1)
            counts_E = count_ids(torch.where(keep_N, e_N, self.n_experts), self.n_experts + 1)[:self.n_experts]
            return self._ragged(x_TW, expert_idx_TK, combine_TK, experts, counts_E, None, True, keep_N)
        if self.transport == "pooled_wave" and not dropless:
            return self._pooled_wave(x_TW, expert_idx_TK, combine_TK, experts)
        counts_1E, rank_N = cell_counts(expert_idx_TK, self.n_experts, 1)
        if self.transport == "fixed" and not dropless:
            return self._fixed(x_TW, expert_idx_TK, combine_TK, experts, rank_N)
        return self._ragged(x_TW, expert_idx_TK, combine_TK, experts, counts_1E[0], rank_N, dropless)

    # -- fixed: static shapes ---------------------------------------------------------------------
    def _fixed(self, x_TW, idx_TK, combine_TK, experts: ExpertWeights, rank_N):
        T, K = idx_TK.shape
        W, S, El, E = x_TW.shape[1], self.S, self.n_local, self.n_experts
        cap = fixed_cell_capacity(T, K, E, self.capacity_factor)
        e_N = idx_TK.reshape(-1).long()
        keep_N = rank_N < cap
        # cells are receiver-major because experts are; a dropped row points at the spare slot E*cap
        slot_N = torch.where(keep_N, e_N * cap + rank_N, E * cap)
        tok_N = torch.arange(T * K, device=x_TW.device) // K
        src_slot = torch.full((E * cap + 1,), T, dtype=torch.long, device=x_TW.device)
        src_slot.scatter_(0, slot_N, tok_N)
        send = _with_zero_row(x_TW)[src_slot[:-1]]  # padded rows are zero rows
        recv = _a2a(send, None, None, self.group)
        x_EMW = recv.view(S, El, cap, W).transpose(0, 1).reshape(El, S * cap, W)
        # Zero padding rows give zero outputs (no biases, silu(0) = 0), and zero gradients.
        out_EMW = _swiglu_bmm(x_EMW, experts.w_gate_EWH, experts.w_up_EWH, experts.w_down_EHW)
        back = out_EMW.view(El, S, cap, W).transpose(0, 1).reshape(S * El * cap, W)
        ret = _with_zero_row(_a2a(back, None, None, self.group))
        w_N1 = (combine_TK.reshape(-1) * keep_N).unsqueeze(1).to(ret.dtype)
        y_TW = torch.zeros_like(x_TW).index_add(0, tok_N, (ret[slot_N] * w_N1).to(x_TW.dtype))
        dropped = (~keep_N).sum()
        nbytes = 2 * (S - 1) * El * cap * W * x_TW.element_size()
        return y_TW, DispatchStats(assigned=T * K, dropped=dropped, dropped_per_shard=None, bytes_moved=nbytes)

    # -- pooled_wave: static pools per destination and wave, receiver buffers per wave ------------
    def _pooled_wave(self, x_TW, idx_TK, combine_TK, experts: ExpertWeights):
        T, K = idx_TK.shape
        W, S, El, E, Wv = x_TW.shape[1], self.S, self.n_local, self.n_experts, self.waves
        pool, buffer = pooled_wave_capacities(T, K, E, S, self.capacity_factor, Wv)
        dev = x_TW.device
        e_N = idx_TK.reshape(-1).long()
        wave_N, slot_N = pooled_wave_slots(e_N // El, S, Wv)
        sent_N = slot_N < pool
        # Send buffer layout: [destination][wave][pool slot]; R rows, plus a spare slot R for the
        # rows the sender drops.
        R = S * Wv * pool
        pos_N = torch.where(sent_N, ((e_N // El) * Wv + wave_N) * pool + slot_N, R)
        tok_N = torch.arange(T * K, device=dev) // K
        src_R = torch.full((R + 1,), T, dtype=torch.long, device=dev).scatter_(0, pos_N, tok_N)[:-1]
        ids_R = torch.full((R + 1,), -1, dtype=torch.long, device=dev).scatter_(0, pos_N, e_N)[:-1]
        recv = _a2a(_with_zero_row(x_TW)[src_R], None, None, self.group)
        rid_R = _a2a_equal(ids_R, self.group)  # [sender][wave][slot]: the expert id, -1 for padding
        # The receiver gate of plan_drops, over what arrived.
        r_R = torch.arange(R, device=dev)
        sender_R, wave_R, slot_R = r_R // (Wv * pool), (r_R // pool) % Wv, r_R % pool
        arrived_R = rid_R >= 0
        keep_R = pooled_wave_receiver_keep(arrived_R, wave_R, rid_R.clamp(min=0), slot_R, sender_R,
                                           n_experts=E, n_shards=S, waves=Wv, buffer=buffer)
        # Kept rows fill per-(local expert, wave) buffers of `buffer` rows, in receiver-rank order
        # (any order: the experts act row by row); the spare slot B collects the rest.
        B = El * Wv * buffer
        local_R = (rid_R - self.rank * El).clamp(0, El - 1)
        grp_R = local_R * Wv + wave_R
        rank_R = ranks_in_groups(torch.where(keep_R, grp_R, El * Wv), El * Wv + 1)
        buf_R = torch.where(keep_R, grp_R * buffer + rank_R, B)
        src_B = torch.full((B + 1,), R, dtype=torch.long, device=dev).scatter_(0, buf_R, r_R)[:-1]
        x_EMW = _with_zero_row(recv)[src_B].view(El, Wv * buffer, W)
        out_EMW = _swiglu_bmm(x_EMW, experts.w_gate_EWH, experts.w_up_EWH, experts.w_down_EHW)
        back = _with_zero_row(out_EMW.reshape(B, W))[buf_R]  # dropped and padding rows return zeros
        ret = _with_zero_row(_a2a(back, None, None, self.group))
        kept_R = _a2a_equal(keep_R.long(), self.group)  # the receiver's verdict on each row I sent
        keep_N = sent_N & (torch.cat([kept_R, kept_R.new_zeros(1)])[pos_N] > 0)
        w_N1 = (combine_TK.reshape(-1) * keep_N).unsqueeze(1).to(ret.dtype)
        y_TW = torch.zeros_like(x_TW).index_add(0, tok_N, (ret[pos_N] * w_N1).to(x_TW.dtype))
        nbytes = 2 * (S - 1) * Wv * pool * W * x_TW.element_size()
        return y_TW, DispatchStats(assigned=T * K, dropped=(~keep_N).sum(), dropped_per_shard=None, bytes_moved=nbytes)

    # -- ragged: counts first, then split sizes --------------------------------------------------
    def _ragged(self, x_TW, idx_TK, combine_TK, experts: ExpertWeights, counts_E, rank_N, dropless: bool,
                keep_N: Tensor | None = None):
        T, K = idx_TK.shape
        W, S, El, E, r = x_TW.shape[1], self.S, self.n_local, self.n_experts, self.rank
        counts_SE = torch.empty(S * E, dtype=torch.long, device=counts_E.device)
        _all_gather_flat(counts_SE, counts_E.contiguous(), self.group)  # the count exchange
        counts_SE = counts_SE.view(S, E)
        chunks, Ec = ragged_chunk_layout(El, self.n_chunks)
        if dropless:
            accepted_SE = counts_SE
        else:
            _, chunk_cap = ragged_capacities(T, K, El, self.capacity_factor, self.n_chunks)
            accepted_SE = ragged_accepted(counts_SE, self.n_chunks, chunk_cap)
        e_N = idx_TK.reshape(-1).long()
        if keep_N is None:
            keep_N = rank_N < accepted_SE[r, e_N]
        # Send order: kept rows by (chunk, global expert) -- receiver-major inside a chunk, (t, k)
        # order inside a cell (stable) -- the dropped after; chunk c's rows are then one slice.
        chunk_N = (e_N % El) // Ec
        src_N = torch.sort(torch.where(keep_N, chunk_N * E + e_N, chunks * E), stable=True).indices
        acc_SQX = accepted_SE.view(S, S, chunks, Ec)  # (sender, receiver, chunk, expert in chunk)
        recv_CSX = acc_SQX[:, r].transpose(0, 1)  # rows I receive per chunk, sender, local expert
        # The one host read: every chunk's split sizes (all_to_all_single takes them as ints).
        splits = read_splits(torch.stack([acc_SQX[r].sum(-1).T, recv_CSX.sum(-1)]), T * K)  # [in/out][chunk][rank]
        y_TW = torch.zeros_like(x_TW)
        start = 0
        for c in range(chunks):
            in_splits, out_splits = splits[0][c], splits[1][c]
            src_c = src_N[start:start + sum(in_splits)]
            start += sum(in_splits)
            tok_c = src_c // K
            recv = _a2a(x_TW[tok_c], out_splits, in_splits, self.group)
            # Arrivals are sender-major; the grouped GEMM wants them expert-major (senders in order).
            label = torch.repeat_interleave(torch.arange(Ec, device=x_TW.device).repeat(S), recv_CSX[c].reshape(-1),
                                            output_size=sum(out_splits))
            perm = torch.sort(label, stable=True).indices
            out = swiglu_grouped(recv[perm], expert_offsets(label[perm], Ec), experts.slice(c * Ec, (c + 1) * Ec))
            back = torch.empty_like(out).index_copy(0, perm, out) if out.numel() else out
            ret = _a2a(back, in_splits, out_splits, self.group)
            w_M1 = combine_TK.reshape(-1)[src_c].unsqueeze(1).to(ret.dtype)
            y_TW = y_TW.index_add(0, tok_c, (ret * w_M1).to(y_TW.dtype))
        sent = [sum(col) for col in zip(*splits[0], strict=True)]  # rows to each receiver, all chunks (host ints)
        off_rows = sum(sent) - sent[r]
        nbytes = 2 * off_rows * W * x_TW.element_size() + (S - 1) * E * 8
        return y_TW, DispatchStats(assigned=T * K, dropped=T * K - sum(sent),
                                   dropped_per_shard=(counts_SE - accepted_SE).sum(1), bytes_moved=nbytes)

