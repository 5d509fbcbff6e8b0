"""Sharding that fits: meta-device construction, FSDP2 for every parameter (HSDP across racks), experts
sharded over the EP dimension and by FSDP inside the rack, and a per-shard init equal to the one-process
init (docs/architecture.md §5).

Layout (torchtitan's MoE parallelism: pytorch/torchtitan, torchtitan/models/llama4/infra/parallelize.py
`apply_fsdp`, experts on the `dp_shard_mod_ep` mesh; Marin's (replica_dcn, data, expert) mesh): the
meshes of `marin.ep.EPGroups`, `replicas` racks of consecutive ranks.
- non-expert parameters: FSDP2 `fully_shard` over `groups.fsdp_mesh` (docs/architecture.md §5), one unit
  per block, per MoE submodule (router, latent projections, shared experts), the embedding, the lm_head, the root;
- expert stacks [E, W, H]: rank (g, q) keeps EP slice q (experts [q E/ep, (q+1) E/ep)), and FSDP2 over
  the rack's dp_shard ranks (`expert_fsdp_mesh`, replicated across racks) shards that slice on dim 0,
  or on dim 1 when its experts do not split evenly (`expert_placement`), or ZeRO-sharded across the racks
  by `ExpertShard` where `zero_across_dp` says FSDP2 cannot or should not. The expert units' gradient divide
  factor is the world size: the all-to-all backward already summed the EP group's contributions, the
  reduce-scatter (and the cross-rack all-reduce) sums the dp replicas, and the mean of the per-rank losses is
  the objective (what FSDP2 gives every other parameter). With dp = 1 the slices stay plain tensors and the
  EP dispatcher scales their gradients by 1/W.
- mixed precision (`mixed_precision=True`): FSDP2 MixedPrecisionPolicy, as Marin's hero runs.

Init: `init_weights` draws every parameter in row blocks, each from its own generator seeded by
(seed, parameter name, block), so any shard generates only its own rows and the weights do not depend
on the layout: one process and any (dp, ep) sharding of the same seed hold the same global weights.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from marin_ablate.marin.ep import EXPERT_PARAM_NAMES, EPGroups, ep_state_dict, moe_layers, shard_experts
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.optimizers import state_bytes_by_role
from marin_ablate.marin.update_rules import local_part

INIT_BLOCK_ELEMS = 1 << 16  # elements per init block: a shard draws at most two blocks it does not keep


# ---- Layout-independent init ---------------------------------------------------------------------


def _block_seed(seed: int, name: str, block: int) -> int:
    h = hashlib.blake2b(f"{seed}:{name}:{block}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def _rows_per_block(shape: torch.Size) -> int:
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    return max(1, INIT_BLOCK_ELEMS // max(row, 1))


def _global_box(p: Tensor, row_offset: int) -> tuple[Tensor, tuple[int, ...], torch.Size]:
    """(local tensor, global offset of its first element per dim, global shape) of a plain tensor or
    an FSDP2 DTensor (sharded on dim 0, or dim 1 for expert stacks); `row_offset` adds the EP offset
    of an expert slice (its global expert index of local row 0)."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        local, offset, shape = p.to_local(), tuple(offset), p.shape
    else:
        local, offset, shape = p, (0,) * p.ndim, p.shape
    return local, ((offset[0] + row_offset,) + offset[1:] if offset else offset), shape


@torch.no_grad()
def blocked_trunc_normal_(p: Tensor, name: str, seed: int, std: float, trunc: float,
                          global_rows: int | None = None, row_offset: int = 0) -> None:
    """Truncated normal N(0, std^2) clipped at +-trunc*std (Marin model.py _init_weight), drawn per row
    block of the global tensor from a generator of (seed, name, block): the elements a shard holds get
    the values they have in the whole tensor (a shard split on another dim draws its rows whole and
    keeps its columns). `global_rows` / `row_offset` place an EP expert slice."""
    local, offset, shape = _global_box(p, row_offset)
    n_rows = global_rows if global_rows is not None else shape[0]
    full_shape = torch.Size((n_rows,) + tuple(shape[1:])) if len(shape) else torch.Size(())
    if local.numel() == 0:
        return
    if len(full_shape) == 0:
        g = torch.Generator().manual_seed(_block_seed(seed, name, 0))
        local.copy_(nn.init.trunc_normal_(torch.empty(()), std=std, a=-trunc * std, b=trunc * std, generator=g))
        return
    rpb = _rows_per_block(full_shape)
    start, stop = offset[0], offset[0] + local.shape[0]
    for b in range(start // rpb, (stop - 1) // rpb + 1):
        lo, hi = b * rpb, min((b + 1) * rpb, n_rows)
        g = torch.Generator().manual_seed(_block_seed(seed, name, b))
        blk = nn.init.trunc_normal_(torch.empty((hi - lo,) + tuple(full_shape[1:])), std=std,
                                    a=-trunc * std, b=trunc * std, generator=g)
        a, c = max(lo, start), min(hi, stop)
        blk = blk[a - lo:c - lo]
        for d in range(1, blk.ndim):
            blk = blk.narrow(d, offset[d], local.shape[d])
        local[a - start:c - start].copy_(blk)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, groups: EPGroups | None = None) -> None:
    """The model's init rule (marin.model MarinModel.reset_parameters: truncated normal of sigma =
    init_scale/sqrt(d) for matrices, experts, lm_head, embedding and router; zero gates; unit norm
    gains; identity SConv taps; zero router biases) drawn layout-independently (module docstring). Works
    on one process, on EP-sliced experts (`groups` gives their global offset) and on FSDP2 shards."""
    cfg = model.cfg
    std = cfg.init_scale / math.sqrt(cfg.d_model)
    experts = {id(getattr(m, p)) for _, m in moe_layers(model) for p in EXPERT_PARAM_NAMES}
    params = dict(model.named_parameters())
    for name, role in model.param_roles().items():
        p = params[name]
        local = local_part(p)
        if role in ("matrix", "expert", "lm_head", "embed", "router"):
            rows, off = None, 0
            if id(p) in experts and groups is not None:
                rows, off = p.shape[0] * groups.ep_size, p.shape[0] * groups.ep_rank
            blocked_trunc_normal_(p, name, seed, std, cfg.init_trunc, rows, off)
        elif role in ("gate", "sconv"):
            local.zero_()
            if role == "sconv":  # identity taps: w[0] = 1 (dim 0 is the tap; FSDP2 holds it on rank 0)
                _, offset, _ = _global_box(p, 0)
                if offset[0] == 0 and local.shape[0] > 0:
                    local[0].fill_(1.0)
        elif role == "norm":
            local.fill_(1.0)
        else:
            raise ValueError(f"init_weights: parameter {name!r} has role {role!r}, which has no init rule")
    for bname, buf in model.named_buffers():
        if bname.endswith("bias_E"):
            buf.zero_()


# ---- Sharding ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardingConfig:
    """How `build_sharded_model` lays the model out. mixed_precision: bf16 compute with fp32 master
    weights and fp32 gradient reduction (default on for GPU rungs and the hero); reshard_after_forward:
    free the gathered weights after each unit's forward (FSDP2's ZeRO-3; False keeps them to backward).
    Nothing lives on the host: every shard, gradient and optimizer state is on the accelerator, and
    the optimizer steps there (docs/hero.md "Memory")."""

    mixed_precision: bool = False
    reshard_after_forward: bool = True


def _mp_policy(cfg: ShardingConfig):
    if not cfg.mixed_precision:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def expert_placement(groups: EPGroups):
    """FSDP2 shard_placement_fn of the expert stacks: dim 0 (experts) when this rank's slice splits
    evenly over the rack's dp_shard ranks, else dim 1, so no rank holds a padding expert (torchtitan
    llama4 parallelize `_experts_shard_placement_fn`: Shard(1) when dp x ep > experts)."""
    from torch.distributed.tensor import Shard

    n = groups.dp_shard_size
    return lambda p: Shard(0) if p.shape[0] % n == 0 else Shard(1)


def zero_across_dp(groups: EPGroups, moe: nn.Module) -> bool:
    """Whether `moe`'s expert stacks are sharded by `ExpertShard` over the "dp" mesh (all ranks holding
    this EP slice, across racks) instead of FSDP2: under HSDP with one rank per slice in a rack (the
    hero: dp_shard = 1, nothing to shard inside the rack, and a whole slice's fp32 state does not fit),
    and wherever FSDP2 cannot place the slice (neither dim 0 nor dim 1 splits evenly over dp: FSDP2
    pads dim 0 and refuses an uneven dim 1, e.g. 6 experts x 3072 rows over 11 racks)."""
    w = moe.w_gate_EWH
    return zero_shards_experts(groups.dp_size, groups.dp_shard_size, groups.replicas, w.shape[0], w.shape[1])


def zero_shards_experts(dp: int, dp_shard: int, replicas: int, local_experts: int, rows: int) -> bool:
    """`zero_across_dp` from sizes alone (the time model's rule too): dp ranks per EP slice, dp_shard of
    them in a rack, the slice's experts and the rows of each expert matrix."""
    if dp == 1:
        return False
    if replicas > 1:
        return dp_shard == 1  # else HSDP inside the rack (FSDP2), replicated across racks
    return local_experts % dp != 0 and rows % dp != 0


class _GatherShards(torch.autograd.Function):
    """All-gather of dim-1 shards (torch.chunk sizes, padded to equal chunks for the collective) into
    the whole [E, W, H] slice in the compute dtype; backward reduce-scatters the slice's gradient in
    fp32 (summed over the group) back to this rank's shard (ZeRO-3, as FSDP2's unit)."""

    @staticmethod
    def forward(ctx, local: Tensor, full_rows: int, group, dtype) -> Tensor:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        chunk = -(-full_rows // n)
        ctx.group, ctx.full_rows, ctx.local_rows, ctx.dtype_in, ctx.chunk = group, full_rows, local.shape[1], \
            local.dtype, chunk
        ctx.rank = rank
        x = local.to(dtype) if dtype is not None else local
        if x.shape[1] != chunk:  # the last ranks' shorter (or empty) chunks, padded for the collective
            pad = x.new_zeros(x.shape[0], chunk - x.shape[1], *x.shape[2:])
            x = torch.cat([x, pad], 1)
        out = x.new_empty(n * x.numel())  # flat buffers: gloo checks the flat sizes only
        dist.all_gather_into_tensor(out, x.contiguous().view(-1), group=group)
        # [E, n*chunk, H]
        full = out.view((n,) + tuple(x.shape)).transpose(0, 1).reshape(x.shape[0], n * chunk, *x.shape[2:])
        return full.narrow(1, 0, full_rows).contiguous()

    @staticmethod
    def backward(ctx, g_full: Tensor):
        n, chunk = dist.get_world_size(ctx.group), ctx.chunk
        g = g_full.float()
        if n * chunk != ctx.full_rows:
            g = torch.cat([g, g.new_zeros(g.shape[0], n * chunk - ctx.full_rows, *g.shape[2:])], 1)
        g_nE = g.reshape(g.shape[0], n, chunk, *g.shape[2:]).transpose(0, 1).contiguous()
        mine = g_nE.new_empty(g_nE.shape[1:])
        dist.reduce_scatter_tensor(mine.view(-1), g_nE.view(-1), op=dist.ReduceOp.SUM, group=ctx.group)
        return mine.narrow(1, 0, ctx.local_rows).to(ctx.dtype_in), None, None, None


class ExpertShard:
    """ZeRO across the "dp" mesh of an EP slice (docs/hero.md "Memory"): each expert stack is a DTensor
    sharded on dim 1 (rows of each expert's matrix, torch.chunk sizes: 3072 rows over 11 racks are
    10 x 280 + 272, no padding stored), so the fp32 master, its gradient and the optimizer state are
    1/dp of the slice per rank; the EP dispatcher gathers the whole slice per layer in the compute
    dtype (`gather`) and the backward reduce-scatters its gradient. Marin shards its hero's expert
    state over (replica_dcn, data) the same way (experiments/grug/moe_hero_ep)."""

    def __init__(self, group, compute_dtype):
        self.group, self.compute_dtype = group, compute_dtype

    @classmethod
    def apply_to(cls, moe: nn.Module, groups: EPGroups, compute_dtype=None) -> None:
        from torch.distributed.tensor import DTensor, Shard

        mesh = groups.mesh["dp"]
        n, rank = mesh.size(), mesh.get_local_rank()
        for name in EXPERT_PARAM_NAMES:
            full = getattr(moe, name)
            chunks = torch.chunk(torch.empty(full.shape, device="meta"), n, dim=1)
            rows = chunks[rank].shape[1] if rank < len(chunks) else 0
            local = torch.empty((full.shape[0], rows) + tuple(full.shape[2:]), device=full.device, dtype=full.dtype)
            dt = DTensor.from_local(local, mesh, [Shard(1)], run_check=False, shape=full.shape, stride=full.stride())
            setattr(moe, name, nn.Parameter(dt, requires_grad=full.requires_grad))
        moe.dispatcher.expert_shard = cls(mesh.get_group(), compute_dtype)
        # the gather's backward sums the dp ranks and the all-to-all's the EP group: 1/W is the mean
        moe.dispatcher.grad_scale = 1.0 / groups.world_size

    def gather(self, w: Tensor) -> Tensor:
        """The whole [E, W, H] slice of a dim-1 sharded DTensor parameter, in the compute dtype."""
        return _GatherShards.apply(w.to_local(), w.shape[1], self.group, self.compute_dtype)


def apply_fsdp(model: nn.Module, groups: EPGroups, cfg: ShardingConfig = ShardingConfig()) -> nn.Module:
    """FSDP2 every parameter (module docstring): MoE submodules and blocks over `groups.fsdp_mesh`
    (the world, or HSDP inside racks), the expert stacks over `groups.expert_fsdp_mesh` with gradient
    divide factor W, or by `ExpertShard` over "dp" where `zero_across_dp` says so. Call after
    `shard_experts`."""
    from torch.distributed.fsdp import fully_shard

    kw = dict(reshard_after_forward=cfg.reshard_after_forward)
    mp = _mp_policy(cfg)
    if mp is not None:
        kw["mp_policy"] = mp
    mesh = groups.fsdp_mesh
    plain = set()  # one rank per slice and one rack: expert slices no unit shards (blocks, root leave them)
    for _, moe in moe_layers(model):
        for child in moe.children():  # router, latent projections and norm, shared experts
            for unit in (child if isinstance(child, nn.ModuleList) else [child]):
                if any(True for _ in unit.parameters()):
                    fully_shard(unit, mesh=mesh, **kw)
        if zero_across_dp(groups, moe):  # ZeRO over every rank holding this slice (across racks)
            ExpertShard.apply_to(moe, groups, compute_dtype=torch.bfloat16 if cfg.mixed_precision else None)
            plain.update(getattr(moe, p) for p in EXPERT_PARAM_NAMES)
        elif groups.dp_size > 1:  # what is left in the MoE unit: its expert stacks
            fully_shard(moe, mesh=groups.expert_fsdp_mesh, shard_placement_fn=expert_placement(groups), **kw)
            if groups.dp_shard_size > 1:
                moe.set_gradient_divide_factor(float(groups.world_size))
            else:  # one rank per slice in a rack: FSDP2 divides a custom factor twice when a shard
                # group has one rank, so leave it its default mean over the racks and scale the rest
                moe.dispatcher.grad_scale = 1.0 / groups.group_size
            if dist.get_backend() in ("gloo", "fake"):  # no PREMUL_SUM there: sum, then divide in a kernel
                moe.set_force_sum_reduction_for_comms(True)
        else:  # nothing to shard over dp: plain EP slices, the 1/W mean applied as the gradient lands
            moe.dispatcher.grad_scale = 1.0 / groups.world_size  # survives to_empty (a hook would not)
            plain.update(getattr(moe, p) for p in EXPERT_PARAM_NAMES)
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        for b in blocks:
            fully_shard(b, mesh=mesh, ignored_params=plain, **kw)
    for head in (getattr(model, "embed", None), getattr(model, "lm_head", None)):
        if head is not None:  # their own units (torchtitan): the root unit stays gathered all step
            fully_shard(head, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, ignored_params=plain, **kw)
    return model


def build_sharded_model(model_cfg, recipe, groups: EPGroups, seed: int, device: torch.device | str = "cpu",
                        cfg: ShardingConfig = ShardingConfig(), transport: str | None = None, init: bool = True,
                        **model_kw) -> nn.Module:
    """The hero's construction: MarinModel on the meta device (no weight is allocated), EP slice of the
    experts, FSDP2 of everything, then only this rank's shards allocated on `device` and initialised
    by `init_weights` (the same global weights as `init_weights` of a one-process model, same seed);
    `init=False` leaves the shards allocated but undrawn, for a checkpoint load to fill (a requeued rank
    never draws its 8.15B-element expert slice only to overwrite it). `model_kw` go to MarinModel
    (activation_checkpoint, loss_chunk_tokens)."""
    with torch.device("meta"):
        model = MarinModel(model_cfg, recipe, **model_kw)
    shard_experts(model, groups, transport)
    apply_fsdp(model, groups, cfg)
    model.to_empty(device=device)
    if init:
        init_weights(model, seed, groups)
    return model


# ---- Sharded gradients: the global norm without a host read --------------------------------------


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float | None, group=None) -> Tensor:
    """Global L2 norm of every gradient of an `apply_fsdp` model (each element lives on one rank of
    `group`, the rack of an HSDP layout, else the world: an all-reduce of the local sums of squares
    over it is exact), clipped in place by torch's rule max_norm/(norm + 1e-6) when below 1; returns
    the norm as a 0-dim tensor (read it when logging)."""
    # expert shards of `ExpertShard` hold each element once in the world, not once per rack
    world_sharded = {id(getattr(m, p)) for _, m in moe_layers(model)
                     if getattr(m.dispatcher, "expert_shard", None) is not None for p in EXPERT_PARAM_NAMES}
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [local_part(p.grad) for p in params]
    dev = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float32, device=dev)
    sq_world = torch.zeros((), dtype=torch.float32, device=dev)
    for p, g in zip(params, grads, strict=True):
        (sq_world if id(p) in world_sharded else sq).add_(g.float().pow(2).sum())
    if dist.is_initialized():
        if world_sharded and group is not None and dist.get_world_size(group) < dist.get_world_size():
            # one all-reduce over the world: rack-sharded elements are counted once per rack there
            sq = sq / (dist.get_world_size() // dist.get_world_size(group)) + sq_world
            dist.all_reduce(sq)
        else:
            sq = sq + sq_world
            dist.all_reduce(sq, group=group)
    else:
        sq = sq + sq_world
    norm = sq.sqrt()
    if max_norm is not None:
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return norm


# ---- Asynchronous distributed checkpoint, and its size -------------------------------------------

# Optimizer state bytes per parameter element, by group kind (fp32 moments; radii and steps are O(1))


def save_planner():
    """DCP's save planner with plan caching: the global plan (every rank's items gathered to the coordinator,
    deduplicated, scattered back) is computed at the first save and reused while the state's layout is
    unchanged -- at 704 ranks that planning is most of a save (public reports at 256 ranks: 280 s first
    save, 155 s cached) against a 300 s preemption window (docs/hero.md "Time")."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    return DefaultSavePlanner(enable_plan_caching=True)


class AsyncCheckpointer:
    """Sharded checkpoints written in the background (torch.distributed.checkpoint.async_save, as
    torchtitan's CheckpointManager async mode): `save` returns once the state is staged in host memory,
    so training (or a preemption handler) goes on while the files are written; a next `save` and
    `wait` first finish the previous write. The write coordinates over its own gloo group, so its
    collectives never interleave with the training's."""

    def __init__(self, groups: EPGroups | None):
        self.groups, self._future = groups, None
        # a fake process group (the plan's dry run) has no peers to meet: stay fake
        self.pg = None if groups is None else dist.new_group(backend="fake" if dist.get_backend() == "fake" else "gloo")

    def save(self, model: nn.Module, path, optimizer=None) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.wait()
        sd = ep_state_dict(model, self.groups, optimizer)
        self._future = dcp.async_save(sd, checkpoint_id=str(path), process_group=self.pg,
                                      async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                      no_dist=self.groups is None, planner=save_planner())

    def wait(self) -> None:
        """Block until the last save is on disk (call before exit and before reading the files)."""
        if self._future is not None:
            fut, self._future = self._future, None
            fut.result()


def checkpoint_bytes_per_rank(model: nn.Module, level: str, groups: EPGroups | None = None) -> int:
    """Bytes this rank writes to a checkpoint of `model` (parameters in their dtype plus the optimizer
    state of `level`, marin.optimizers state bytes): its FSDP2 shards; plain EP expert slices once per dp
    group (DCP writes a replicated tensor once); other plain tensors on rank 0. Works on a meta-device
    model, so the plan sizes the hero without allocating it."""
    from torch.distributed.tensor import DTensor

    state_bytes = state_bytes_by_role(level)
    experts = {id(getattr(m, p)) for _, m in moe_layers(model) for p in EXPERT_PARAM_NAMES}
    params = dict(model.named_parameters())
    dp_rank = groups.dp_rank if groups is not None else 0
    rank = dist.get_rank() if dist.is_initialized() else 0
    total = 0
    for name, role in model.param_roles().items():
        p = params[name]
        if isinstance(p, DTensor):  # an HSDP replica is written by the first rack only
            n = p.to_local().numel() if all(p.device_mesh.get_local_rank(i) == 0 for i, pl in
                                            enumerate(p.placements) if pl.is_replicate()) else 0
        elif id(p) in experts:
            n = p.numel() if dp_rank == 0 else 0
        else:
            n = p.numel() if rank == 0 else 0
        total += n * (p.element_size() + state_bytes[role])
    return total
