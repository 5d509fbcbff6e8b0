"""Sharding that fits: meta-device construction, FSDP2 for every parameter (HSDP across racks), experts
sharded over the EP dimension and by FSDP inside the rack, and a per-shard init equal to the one-process
init (docs/architecture.md §5).

Layout (torchtitan's MoE parallelism: pytorch/torchtitan, torchtitan/models/llama4/infra/parallelize.py
`apply_fsdp`, experts on the `dp_shard_mod_ep` mesh; Marin's (replica_dcn, data, expert) mesh): the
meshes of `marin.ep.EPGroups`, `replicas` racks of consecutive ranks.
- non-expert parameters: FSDP2 `fully_shard` over `groups.fsdp_mesh` (all W ranks, or ("replica",
  "shard"): sharded in a rack, replicated across racks), one unit per block, per MoE submodule
  (router, latent projections, shared experts), the embedding, the lm_head, and the root;
- expert stacks [E, W, H]: rank (g, q) keeps EP slice q (experts [q E/ep, (q+1) E/ep)), and FSDP2 over
  the rack's dp_shard ranks (`expert_fsdp_mesh`, replicated across racks) shards that slice on dim 0,
  or on dim 1 when its experts do not split evenly (`expert_placement`). The expert
  units' gradient divide factor is the world size: the all-to-all backward already summed the EP
  group's contributions, the reduce-scatter (and the cross-rack all-reduce) sums the dp replicas, and
  the mean of the per-rank losses is the objective (what FSDP2 gives every other parameter). With
  dp = 1 the slices stay plain tensors and the EP dispatcher scales their gradients by 1/W.
- mixed precision (`mixed_precision=True`): bf16 compute, fp32 master weights and fp32 gradient
  reduction (FSDP2 MixedPrecisionPolicy), as Marin's hero runs (experiments/grug/moe_hero_ep).

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

from marin.ep import EXPERT_PARAM_NAMES, EPGroups, moe_layers, shard_experts

INIT_BLOCK_ELEMS = 1 << 16  # elements per init block: a shard draws at most two blocks it does not keep


# ---------------------------------------------------------------------------------------------
# Layout-independent init
# ---------------------------------------------------------------------------------------------


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
    if not offset:
        return local, offset, shape
    return local, (offset[0] + row_offset,) + offset[1:], shape


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
    start = offset[0]
    stop = start + local.shape[0]
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
    from torch.distributed.tensor import DTensor

    cfg = model.cfg
    std = cfg.init_scale / math.sqrt(cfg.d_model)
    experts = {id(getattr(m, p)) for _, m in moe_layers(model) for p in EXPERT_PARAM_NAMES}
    params = dict(model.named_parameters())
    for name, role in model.param_roles().items():
        p = params[name]
        local = p.to_local() if isinstance(p, DTensor) else p
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


# ---------------------------------------------------------------------------------------------
# Sharding
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardingConfig:
    """How `build_sharded_model` lays the model out. mixed_precision: bf16 compute with fp32 master
    weights and fp32 gradient reduction (default on for GPU rungs and the hero); reshard_after_forward:
    free the gathered weights after each unit's forward (FSDP2's ZeRO-3; False keeps them to backward)."""

    mixed_precision: bool = False
    reshard_after_forward: bool = True
    offload: bool = False  # FSDP2 CPUOffloadPolicy: sharded fp32 params, grads, optimizer state on the host


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

    def place(p: nn.Parameter):
        return Shard(0) if p.shape[0] % n == 0 else Shard(1)

    return place


def apply_fsdp(model: nn.Module, groups: EPGroups, cfg: ShardingConfig = ShardingConfig()) -> nn.Module:
    """FSDP2 every parameter (module docstring): MoE submodules and blocks over `groups.fsdp_mesh`
    (the world, or HSDP inside racks), the expert stacks over `groups.expert_fsdp_mesh` with gradient
    divide factor W. Call after `shard_experts`."""
    from torch.distributed.fsdp import fully_shard

    kw = dict(reshard_after_forward=cfg.reshard_after_forward)
    mp = _mp_policy(cfg)
    if mp is not None:
        kw["mp_policy"] = mp
    if cfg.offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    mesh = groups.fsdp_mesh
    plain = set()  # one rank per slice and one rack: expert slices no unit shards (blocks, root leave them)
    for _, moe in moe_layers(model):
        for child in moe.children():  # router, latent projections and norm, shared experts
            for unit in (child if isinstance(child, nn.ModuleList) else [child]):
                if any(True for _ in unit.parameters()):
                    fully_shard(unit, mesh=mesh, **kw)
        if groups.dp_size > 1:  # what is left in the MoE unit: its expert stacks
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
                        cfg: ShardingConfig = ShardingConfig(), transport: str | None = None,
                        **model_kw) -> nn.Module:
    """The hero's construction: MarinModel on the meta device (no weight is allocated), EP slice of the
    experts, FSDP2 of everything, then only this rank's shards allocated on `device` and initialised
    by `init_weights` (the same global weights as `init_weights` of a one-process model, same seed).
    `model_kw` go to MarinModel (activation_checkpoint, loss_chunk_tokens)."""
    from marin.model import MarinModel

    with torch.device("meta"):
        model = MarinModel(model_cfg, recipe, **model_kw)
    shard_experts(model, groups, transport)
    apply_fsdp(model, groups, cfg)
    # FSDP2's CPUOffloadPolicy wants its shards materialised on the host (its lazy init refuses others);
    # what it does not manage (buffers, plain parameters) computes on the device (torchtitan's buffer_device)
    model.to_empty(device="cpu" if cfg.offload else device)
    if cfg.offload and torch.device(device).type != "cpu":
        from torch.distributed.tensor import DTensor

        for m in model.modules():
            for n, b in m._buffers.items():
                if b is not None:
                    m._buffers[n] = b.to(device)
            for n, p in m._parameters.items():
                if p is not None and not isinstance(p, DTensor):
                    m._parameters[n] = nn.Parameter(p.to(device), requires_grad=p.requires_grad)
    init_weights(model, seed, groups)
    return model


# ---------------------------------------------------------------------------------------------
# Sharded gradients: the global norm without a host read
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float | None, group=None) -> Tensor:
    """Global L2 norm of every gradient of an `apply_fsdp` model (each element lives on one rank of
    `group`, the rack of an HSDP layout, else the world: an all-reduce of the local sums of squares
    over it is exact), clipped in place by torch's rule max_norm/(norm + 1e-6) when below 1; returns
    the norm as a 0-dim tensor (read it when logging)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
             for p in model.parameters() if p.grad is not None]
    dev = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float32, device=dev)
    for g in grads:
        sq += g.float().pow(2).sum()
    if dist.is_initialized():
        dist.all_reduce(sq, group=group)
    norm = sq.sqrt()
    if max_norm is not None:
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return norm


# ---------------------------------------------------------------------------------------------
# Asynchronous distributed checkpoint, and its size
# ---------------------------------------------------------------------------------------------

# Optimizer state bytes per parameter element, by group kind (fp32 moments; radii and steps are O(1))


class AsyncCheckpointer:
    """Sharded checkpoints written in the background (torch.distributed.checkpoint.async_save, as
    torchtitan's CheckpointManager async mode): `save` returns once the state is staged in host memory,
    so training (or a preemption handler) goes on while the files are written; a next `save` and
    `wait` first finish the previous write. The write coordinates over its own gloo group, so its
    collectives never interleave with the training's."""

    def __init__(self, groups: EPGroups | None):
        self.groups = groups
        self.pg = None
        if groups is not None:  # a fake process group (the plan's dry run) has no peers to meet: stay fake
            self.pg = dist.new_group(backend="fake" if dist.get_backend() == "fake" else "gloo")
        self._future = None

    def save(self, model: nn.Module, path, optimizer=None) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        from marin.ep import _ep_state_dict

        self.wait()
        sd = _ep_state_dict(model, self.groups, optimizer)
        self._future = dcp.async_save(sd, checkpoint_id=str(path), process_group=self.pg,
                                      async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                      no_dist=self.groups is None)

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

    from marin.optimizers import state_bytes_by_role

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
