"""Distributed training: expert parallelism over EP groups of `ModelConfig.ep_shards` ranks and data
parallelism over the D = W / ep_shards groups (`marin.ep` mesh: rank = dp_rank * ep + ep_rank);
docs/architecture.md §5.

Token layout: the global batch is the single-process batch (B rows of L tokens) and rank r takes rows
[r B/W, (r+1) B/W). So DP replica g holds the contiguous rows [g B/D, (g+1) B/D), and EP rank s of it
holds the s-th contiguous 1/ep of the replica's row-major tokens: exactly shard s of `plan_drops`.
With D = 1 (W = ep_shards) the real run drops what the single-process virtual-EP run drops on the
same global batch; with D > 1 it drops what the single-process run drops on each replica's B/D rows
on their own (per-shard token count T_s = B L / W sets the capacities). A world of fewer ranks than
ep_shards (`ep_group_size`: one EP group of W ranks, ep_shards / W virtual shards each) drops what the
ep_shards-rank run drops: every rank plans the drops over all ep_shards shards (marin.ep_exchange).
Gradient accumulation (TrainConfig.micro_batches, marin.train.accum) splits each rank's rows further.
Losses: `dist_forward_backward` reweights each rank's CE and z-loss to the global token mean; the Switch aux
loss is the world's (marin.moe.Router.stat_group); QB-topk thresholds are each shard's averaged over shards
(the same under any layout of the shards), QB-hist and aux-free statistics are pooled over ranks.
Sharding: `build_train_model` (marin.parallel, docs/architecture.md §5).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from marin_ablate.marin import ep
from marin_ablate.marin.config import RunSpec, TrainConfig
from marin_ablate.marin.data import IGNORE_INDEX
from marin_ablate.marin.ep_layout import check_ep_layout
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.moe import Router
from marin_ablate.marin.parallel import (
    AsyncCheckpointer,
    ShardingConfig,
    build_sharded_model,
    clip_grad_norm_,
    init_weights,
)
from marin_ablate.marin.train.stages import Stage
from marin_ablate.marin.train.step import forward_backward
from marin_ablate.marin.train.world import world_step


@dataclass
class ParallelDims:
    """This process's place in the run, built once (torchtitan's ParallelDims, torchtitan/distributed/
    parallel_dims.py): world = replicas x rack, a rack = dp_shard x ep ranks (marin.ep.EPGroups). The
    trainer asks it instead of branching on "distributed or not": with world 1 (`ParallelDims()`)
    there are no groups, rows are the whole batch and every collective is a no-op."""

    world: int = 1
    rank: int = 0
    groups: Any = None  # marin.ep.EPGroups (None: one process)
    owns_pg: bool = False  # train() initialised the process group, so close() destroys it

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def replicas(self) -> int:
        return self.groups.replicas if self.groups is not None else 1

    @property
    def expert_group(self):
        """The EP group an expert bank's sphere spans (None: one process holds whole banks)."""
        return self.groups.ep_group if self.groups is not None else None

    @property
    def rack_group(self):
        """The ranks holding each sharded element once (the world, or this rack under HSDP)."""
        return self.groups.rack_group if self.groups is not None else None

    @property
    def world_group(self):
        """The group pooling routing statistics (None in one process)."""
        return dist.group.WORLD if self.world > 1 else None

    def rows(self, x_B: torch.Tensor) -> torch.Tensor:
        """Rank r's rows [r B/W, (r+1) B/W) of a global batch: EP rank s of DP replica g gets the
        s-th contiguous token shard of the replica's rows (what plan_drops assumes)."""
        b = x_B.shape[0] // self.world
        return x_B[self.rank * b:(self.rank + 1) * b]

    def all_reduce(self, t: torch.Tensor, op=None) -> torch.Tensor:
        """In place over the world (sum unless `op`); identity in one process."""
        if self.world > 1:
            dist.all_reduce(t, op=op if op is not None else dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def checkpointer(self):
        """The background checkpoint writer of a distributed run (None: one process writes in place)."""
        return AsyncCheckpointer(self.groups) if self.groups is not None else None

    def describe(self) -> str:
        """The layout, for logs and the summary's hardware field ("" in one process)."""
        if self.groups is None:
            return ""
        g = self.groups
        racks = f"{g.replicas} racks x " if g.replicas > 1 else ""
        return f" [world {self.world}: {racks}dp {g.dp_size // g.replicas} x ep {g.ep_size}]"

    def forward_backward(self, model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                         doc_ids: torch.Tensor, autocast: Callable, grad_clip: float | None, micro_batches: int = 1):
        """(out, loss, ce, grad_norm) of this rank's rows of the global batch, in `micro_batches` micro-batches
        (marin.train.accum) when more than one."""
        if micro_batches > 1:
            from marin_ablate.marin.train.accum import accumulate_step

            return accumulate_step(model, tokens, targets, doc_ids, autocast, grad_clip, micro_batches, self)
        if self.groups is None:  # one process, unsharded (a world of one with meshes holds DTensors)
            return forward_backward(model, tokens, targets, doc_ids, autocast, grad_clip)
        return dist_forward_backward(model, tokens, targets, doc_ids, autocast, grad_clip, self)

    def close(self) -> None:
        if self.owns_pg and dist.is_initialized():
            dist.destroy_process_group()


def launch_world_size() -> int:
    """World size of this launch: an initialised process group, torchrun's WORLD_SIZE, a SLURM task
    with SLURM_NTASKS > 1 (marin.ep.dist_env), else 1 (the single-process loop)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["WORLD_SIZE"])
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return ep.dist_env().world_size
    return 1


def check_dist_layout(spec: RunSpec, stages: list[Stage], world: int) -> None:
    """Before any collective: EP groups of ModelConfig.ep_shards ranks must tile the world and hold
    the experts evenly, and every stage's global batch must split into equal rows per rank."""
    check_no_host_update(spec.train)
    n = spec.model.ep_shards
    ep = ep_group_size(n, world)
    if world < n and n % world:
        raise ValueError(f"ModelConfig.ep_shards={n} with world_size={world}: a world smaller than the EP shards holds "
                         f"whole shards on every rank; allowed world sizes: divisors of {n}, or multiples of {n}")
    try:
        check_ep_layout(spec.model.moe_geometry(spec.recipe).n_experts, ep, world)
    except ValueError as e:
        raise ValueError(f"ModelConfig.ep_shards={n} (the EP group size) with world_size={world}: {e}") from None
    r = spec.train.effective().replica_groups
    if world % r != 0 or (world // r) % ep != 0:
        raise ValueError(f"TrainConfig.replica_groups={r} with world_size={world} and ModelConfig.ep_shards={ep}: "
                         f"racks of whole EP groups must tile the world; allowed values: divisors r of {world} "
                         f"with {world}/r a multiple of {ep}")
    for s in stages:
        if s.batch_size % world != 0:
            raise ValueError(f"TrainConfig.batch_size: the global batch of {s.batch_size} sequences (seq_len "
                             f"{s.seq_len}) does not split over world_size={world} ranks; allowed values: "
                             f"multiples of {world}")
    check_micro_batches(spec, stages, world)
    eb = spec.train.eval_batch_size
    if eb is not None and eb % world != 0:
        raise ValueError(f"TrainConfig.eval_batch_size={eb} sequences do not split over world_size={world} ranks; "
                         f"allowed values: multiples of {world}")


def ep_group_size(ep_shards: int, world: int) -> int:
    """Ranks of one EP group: ModelConfig.ep_shards, or the whole world when it has fewer ranks than the run
    has shards (each rank then holds ep_shards / world of them as virtual shards: marin.ep_exchange plans
    their drops over all ep_shards, so the run drops what its ep_shards-rank layout drops)."""
    return ep_shards if world >= ep_shards else world


def check_micro_batches(spec: RunSpec, stages: list[Stage], world: int) -> None:
    """TrainConfig.micro_batches splits every stage's rows of each rank into equal micro-batches (a longer
    context stage into fewer: `Stage.micro_batches`)."""
    for s in stages:
        rows, k = s.batch_size // world, s.micro_batches
        if rows % k:
            at = "" if k == spec.train.micro_batches else f" ({k} at this context stage)"
            raise ValueError(f"TrainConfig.micro_batches={spec.train.micro_batches}{at}: {rows} sequences per rank "
                             f"(batch {s.batch_size} at seq_len {s.seq_len} over {world} rank(s)) do not split into "
                             f"{k} equal micro-batches; allowed values: divisors of {rows}")


def sharding_config(t: TrainConfig):
    """The trainer's marin.parallel.ShardingConfig for a run's TrainConfig."""
    check_no_host_update(t)
    return ShardingConfig(mixed_precision=t.mixed_precision == "bf16")


def check_no_host_update(t: TrainConfig) -> None:
    """Refuse `TrainConfig.offload="cpu"`: FSDP2's CPUOffloadPolicy steps the optimizer on the host, and
    the run's process group (NCCL) serves only the accelerator, so its first clipping all-reduce of a
    host scalar fails; the hero fits without it (expert state ZeRO-sharded across racks, docs/hero.md)."""
    if t.offload != "none":
        raise ValueError(f"TrainConfig.offload={t.offload!r}: a sharded run keeps no state on the host (the "
                         "optimizer steps on the accelerator; expert state is sharded across racks); allowed "
                         "values: 'none'")


def build_train_model(spec: RunSpec, device: torch.device | str, groups=None, init: bool = True) -> torch.nn.Module:
    """The model `train()` trains, initialised: one process (groups=None) or this rank's shards of a
    distributed run (marin.parallel.build_sharded_model with `sharding_config`). Both draw the weights
    with the layout-independent marin.parallel.init_weights from seed + the TrainConfig seed stream,
    so every layout of a run starts from the same global weights. Built on the meta device first:
    no rank ever allocates more than it keeps. `init=False`: materialised, not drawn (`init_train_model`
    draws them; a resumed run loads its checkpoint instead)."""
    t = spec.train.effective()
    seed = spec.seed + t.seed_offset()
    kw = dict(activation_checkpoint=t.activation_checkpoint, loss_chunk_tokens=t.loss_chunk_tokens)
    if groups is not None:
        model = build_sharded_model(spec.model, spec.recipe, groups, seed, device, sharding_config(t), init=init, **kw)
        for mod in model.modules():  # the Switch statistic over the world's tokens (marin.moe.Router)
            if isinstance(mod, Router):
                mod.stat_group, mod.stat_world = dist.group.WORLD, dist.get_world_size()
        return model
    with torch.device("meta"):
        model = MarinModel(spec.model, spec.recipe, **kw)
    model.to_empty(device=device)
    if init:
        init_weights(model, seed)
    return model


def init_train_model(spec: RunSpec, model: torch.nn.Module, groups=None) -> None:
    """Draw the initial weights of a model `build_train_model(..., init=False)` built: what a fresh start
    does, and what a resume does only when no checkpoint loads."""
    init_weights(model, spec.seed + spec.train.effective().seed_offset(), groups)


def check_launch(spec: RunSpec, stages: list[Stage]) -> int:
    """This launch's world size, its layout checked before anything is written or any collective runs
    (`check_dist_layout`; one process cannot hold TrainConfig.replica_groups > 1)."""
    world = launch_world_size()
    r = spec.train.effective().replica_groups
    if world == 1 and r != 1:
        raise ValueError(f"TrainConfig.replica_groups={r} needs a launch of a multiple of {r} ranks; this one "
                         "has world_size=1; allowed values here: 1")
    if world > 1:
        check_dist_layout(spec, stages, world)
    else:
        check_micro_batches(spec, stages, 1)
    return world


def parallel_dims(spec: RunSpec, world: int, device: torch.device) -> tuple[ParallelDims, torch.device]:
    """The run's ParallelDims (and its device: a rank's own GPU), built once per launch of a checked
    `world` (`check_launch`); a distributed one is initialised by `init_dist`, the one place that
    starts torch.distributed."""
    return (ParallelDims(), device) if world == 1 else init_dist(spec, device)


def init_dist(spec: RunSpec, device: torch.device) -> tuple[ParallelDims, torch.device]:
    """Initialise torch.distributed (marin.ep.init_ep: rank and world from the launcher's environment)
    and build the meshes of ModelConfig.ep_shards and TrainConfig.replica_groups."""
    owns = not dist.is_initialized()
    world = dist.get_world_size() if dist.is_initialized() else ep.dist_env().world_size
    groups = ep.init_ep(spec.model.moe_geometry(spec.recipe).n_experts, ep_group_size(spec.model.ep_shards, world),
                        backend="gloo" if device.type == "cpu" else None,
                        replicas=spec.train.effective().replica_groups)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return ParallelDims(dist.get_world_size(), dist.get_rank(), groups, owns), device


def dist_forward_backward(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                          doc_ids: torch.Tensor, autocast: Callable, grad_clip: float | None, d: ParallelDims):
    """forward_backward on this rank's rows -> (out, loss, ce, grad_norm) of the global batch.
    CE and z-loss are reweighted by n_r W / N so that the world mean of the gradients (FSDP2's
    reduce-scatter) is the gradient of the global token mean; the grad norm (and clipping) is the
    global norm over every shard (marin.parallel.clip_grad_norm_)."""
    dev = tokens.device
    n_loc = int((targets != IGNORE_INDEX).sum())
    n_all_f = max(float(d.all_reduce(torch.tensor([float(n_loc)], dtype=torch.float64, device=dev))), 1.0)
    with autocast():
        out = model(tokens, doc_ids, targets)
    z = out.z_loss if out.z_loss is not None else out.aux_loss.new_zeros(())
    dense = out.ce_loss + z
    if n_loc:
        obj = dense * (n_loc * d.world / n_all_f) + out.aux_loss
    else:  # every target masked here: still run the backward, its collectives are collective
        obj = out.aux_loss + 0.0 * dense  # the model's token means are 0 (with a graph) here
    obj.backward()
    gnorm = float(clip_grad_norm_(model, grad_clip, d.rack_group))
    dense_v, ce_v, z_v = (float(v.detach()) if n_loc else 0.0 for v in (dense, out.ce_loss, z))
    return world_step(d, out.stats, n_loc / n_all_f, dense_v, ce_v, z_v, float(out.aux_loss.detach()), gnorm, dev)
