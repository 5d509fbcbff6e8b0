"""Real expert parallelism on torch.distributed: the EP layout and process groups, data parallel for
the rest of the model, sharded checkpoints (docs/method.md §2.1 "EP transports", docs/architecture.md §5).

Layout. `world = dp x ep` ranks on a 2-D device mesh ("dp", "ep"); rank = dp_rank * ep + ep_rank, so an
EP group is a block of consecutive ranks (one node on a cluster). Each EP group holds every expert once,
E/ep per rank, contiguous (rank q holds experts [q*E/ep, (q+1)*E/ep)): `shard_experts` keeps that slice
and swaps in the `EPDispatcher`; each rank is one token shard. What must divide what is checked before
any collective (marin/ep_layout.py). The rest of the sharding (FSDP2 over "dp" for the expert slices,
over every rank for the other parameters, gradients of the mean of the per-rank losses) is
`marin.parallel.apply_fsdp` (docs/architecture.md §5).

Exchange: `EPDispatcher` (marin/ep_exchange.py), every transport of the planner.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from marin_ablate.marin.dispatch import LocalDispatcher
from marin_ablate.marin.ep_exchange import EP_TRANSPORTS, EPDispatcher  # noqa: F401  (the exchange, re-exported)
from marin_ablate.marin.ep_layout import check_ep_layout, check_replicas
from marin_ablate.marin.rendezvous import from_env, init_process_group
from marin_ablate.marin.update_rules import local_part

EXPERT_PARAM_NAMES = ("w_gate_EWH", "w_up_EWH", "w_down_EHW")


# ---- Layout and process groups -------------------------------------------------------------------


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    source: str  # "torchrun", "slurm" or "single"


def dist_env() -> DistEnv:
    """Rank and world size from the launcher's environment (marin.rendezvous.from_env): torchrun's
    variables; a SLURM task of a multi-task job (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the
    master from SLURM_JOB_NODELIST, exported for init_process_group); else one process."""
    r = from_env()
    if r.source == "slurm":
        r.export()
    return DistEnv(r.rank, r.world_size, r.local_rank, r.source)


@dataclass
class EPGroups:
    """The device meshes and their groups. `mesh` is ("dp", "ep"): `ep` is the all-to-all group, `dp`
    joins the ranks holding the same experts. Rack-local sharding (HSDP, `replicas` > 1): the world is
    `replicas` groups ("racks") of `group_size` consecutive ranks, each holding the whole model once;
    `fsdp_mesh` ("replica", "shard") shards non-expert parameters inside a rack and replicates them
    across racks, `expert_mesh` ("replica", "dp_shard") does the same for this rank's EP slice, so
    only gradient all-reduces cross racks (Marin's (replica_dcn, data, expert) mesh)."""

    mesh: object  # torch.distributed.device_mesh.DeviceMesh ("dp", "ep")
    world_mesh: object  # 1-D mesh over all ranks, for FSDP2 of the non-expert parameters (replicas = 1)
    ep_size: int
    dp_size: int
    replicas: int = 1
    rack_mesh: object = None  # ("replica", "shard") over the world when replicas > 1
    expert_rack_mesh: object = None  # ("replica", "dp_shard") through this rank's EP coordinate

    @property
    def ep_group(self):
        return self.mesh.get_group("ep")

    @property
    def ep_rank(self) -> int:
        return self.mesh.get_local_rank("ep")

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp")

    @property
    def world_size(self) -> int:
        return self.ep_size * self.dp_size

    @property
    def group_size(self) -> int:
        """Ranks per rack: the model (every expert once, every other parameter once) lives in one."""
        return self.world_size // self.replicas

    @property
    def dp_shard_size(self) -> int:
        """Ranks of a rack holding the same EP slice (FSDP shards the slice over them)."""
        return self.dp_size // self.replicas

    @property
    def fsdp_mesh(self):
        """FSDP2 mesh of the non-expert parameters: 1-D over the world, or 2-D (HSDP) over racks."""
        return self.world_mesh if self.replicas == 1 else self.rack_mesh

    @property
    def expert_fsdp_mesh(self):
        """FSDP2 mesh of this rank's expert slice: "dp", or 2-D (HSDP) ("replica", "dp_shard")."""
        return self.mesh["dp"] if self.replicas == 1 else self.expert_rack_mesh

    @property
    def rack_group(self):
        """The ranks of this rack: each element of a sharded parameter or gradient lives once in it."""
        return dist.group.WORLD if self.replicas == 1 else self.rack_mesh.get_group("shard")


def init_ep(n_experts: int, ep_size: int | None = None, backend: str | None = None, replicas: int = 1) -> EPGroups:
    """Initialise torch.distributed from the environment (see `dist_env`) and build the meshes.
    The layout is checked before any collective; ep_size defaults to the world size."""
    env = dist_env()
    world = dist.get_world_size() if dist.is_initialized() else env.world_size
    ep = world if ep_size is None else ep_size
    check_ep_layout(n_experts, ep, world)
    check_replicas(replicas, ep, world)
    device = "cuda" if torch.cuda.is_available() and backend != "gloo" else "cpu"
    if not dist.is_initialized():
        if device == "cuda":
            # modulo: a task that SLURM (or submitit) narrowed to its own GPU sees it as device 0
            torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        init_process_group(backend or ("nccl" if device == "cuda" else "gloo"))
    return build_ep_groups(ep, device, replicas)


def build_ep_groups(ep_size: int, device: str = "cpu", replicas: int = 1) -> EPGroups:
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world % ep_size != 0:
        raise ValueError(f"EP size ep_size={ep_size} does not divide world_size={world}")
    check_replicas(replicas, ep_size, world)
    mesh = init_device_mesh(device, (world // ep_size, ep_size), mesh_dim_names=("dp", "ep"))
    world_mesh = init_device_mesh(device, (world,), mesh_dim_names=("world",))
    rack = expert_rack = None
    if replicas > 1:
        g = world // replicas
        rack = init_device_mesh(device, (replicas, g), mesh_dim_names=("replica", "shard"))
        m3 = init_device_mesh(device, (replicas, g // ep_size, ep_size), mesh_dim_names=("replica", "dp_shard", "ep"))
        expert_rack = m3["replica", "dp_shard"]
    return EPGroups(mesh, world_mesh, ep_size, world // ep_size, replicas, rack, expert_rack)


# ---- Building the EP model from a MarinModel (or any module holding MoE layers) ------------------


def moe_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Modules with a settable `dispatcher` and the stacked expert parameters (marin.moe.MoE)."""
    for name, m in model.named_modules():
        if hasattr(m, "dispatcher") and all(isinstance(getattr(m, p, None), nn.Parameter) for p in EXPERT_PARAM_NAMES):
            yield name, m


def expert_param_names(model: nn.Module) -> list[str]:
    return [f"{n}.{p}" if n else p for n, _ in moe_layers(model) for p in EXPERT_PARAM_NAMES]


def shard_experts(model: nn.Module, groups: EPGroups, transport: str | None = None) -> nn.Module:
    """In place: keep this rank's E/ep slice of every MoE layer's expert stacks and swap its dispatcher
    for an EPDispatcher with the same transport, capacity factor and chunks (from its LocalDispatcher)."""
    S, q = groups.ep_size, groups.ep_rank
    found = False
    for name, m in moe_layers(model):
        found = True
        E = m.w_gate_EWH.shape[0]
        check_ep_layout(E, S, groups.world_size)
        old = m.dispatcher
        if not isinstance(old, LocalDispatcher):
            raise ValueError(f"{name}.dispatcher is {type(old).__name__}; shard_experts expects a LocalDispatcher")
        El = E // S
        for p in EXPERT_PARAM_NAMES:
            full = getattr(m, p)
            setattr(m, p, nn.Parameter(full.detach()[q * El:(q + 1) * El].clone(), requires_grad=full.requires_grad))
        # the run's shards each rank holds: ModelConfig.ep_shards over a group of fewer ranks (the trainer's
        # layouts: marin.train.distributed.ep_group_size); else each rank's tokens are one shard
        virtual = old.n_shards // S if old.n_shards > S and old.n_shards % S == 0 else 1
        m.dispatcher = EPDispatcher(transport or old.transport, groups.ep_group, E, old.capacity_factor, old.n_chunks,
                                    old.waves, virtual)
        m.router.qb_shards = virtual  # this rank's tokens are its shards; update_bias averages over ranks
    if not found:
        raise ValueError("shard_experts: the model has no MoE layer (a module with `dispatcher` and "
                         f"parameters {', '.join(EXPERT_PARAM_NAMES)})")
    return model


# ---- Sharded checkpoints (torch.distributed.checkpoint): any layout saves, any layout loads ------


_EXPERT_MESHES: dict[int, object] = {}


def _expert_mesh(groups: EPGroups):
    """The ("replica", "ep", "dp_shard") view of the world: expert rows split over EP first, then by
    FSDP over the rack's dp_shard ranks (dim 0 or dim 1), the same in every rack."""
    from torch.distributed.device_mesh import DeviceMesh

    key = id(groups.mesh)
    if key not in _EXPERT_MESHES:
        r, ds, ep = groups.replicas, groups.dp_shard_size, groups.ep_size
        ranks = torch.arange(groups.world_size).reshape(r, ds, ep).permute(0, 2, 1).contiguous()
        _EXPERT_MESHES[key] = DeviceMesh(groups.mesh.device_type, ranks, mesh_dim_names=("replica", "ep", "dp_shard"))
    return _EXPERT_MESHES[key]


def forget_expert_meshes() -> None:
    """Drop the cached expert-mesh views: they are keyed by the world mesh's id, which a later mesh may
    reuse once a process group is destroyed (a process that plays several ranks in turn, planning/dryrun.py)."""
    _EXPERT_MESHES.clear()


def _fsdp_dim(t: Tensor) -> int | None:
    """The dim FSDP2 shards a DTensor on (None for a plain tensor)."""
    from torch.distributed.tensor import DTensor

    return next(pl.dim for pl in t.placements if pl.is_shard()) if isinstance(t, DTensor) else None


def _expert_dtensor(t: Tensor, groups: EPGroups, rows: int | None = None):
    """The global [E, ...] view of this rank's expert rows: a plain EP slice (replicated over dp), or
    an FSDP2 shard of it over the rack's dp_shard ranks on dim 0 or 1 (DTensor, or a dim-0 local part
    with `rows` = the slice's row count), replicated over racks."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if isinstance(t, DTensor) or rows is not None:
        local = local_part(t)
        n = t.shape[0] if isinstance(t, DTensor) else rows
        full = tuple(t.shape[1:]) if isinstance(t, DTensor) else tuple(local.shape[1:])
        shape = torch.Size((n * groups.ep_size,) + full)
        stride = torch.empty(shape, device="meta").stride()
        dim = _fsdp_dim(t) or 0
        # a ZeRO shard over "dp" spanning racks (marin.parallel.ExpertShard, one rank per slice in a
        # rack) splits over "replica"; FSDP2 inside a rack over "dp_shard"
        across = isinstance(t, DTensor) and groups.replicas > 1 and t.device_mesh.ndim == 1
        places = [Shard(dim), Shard(0), Replicate()] if across else [Replicate(), Shard(0), Shard(dim)]
        return DTensor.from_local(local, _expert_mesh(groups), places, run_check=False, shape=shape, stride=stride)
    return DTensor.from_local(t, groups.mesh, [Replicate(), Shard(0)], run_check=False)


def ep_state_dict(model: nn.Module, groups: EPGroups | None, optimizer=None) -> dict:
    """{"model": ..., "optim": ...}: expert stacks (and their optimizer states with the local expert
    dim leading) as DTensors sharded over "ep" and replicated over "dp", FSDP2 parameters as their
    DTensors, everything else plain (replicated). Optimizer states keyed by parameter name."""
    from torch.distributed.tensor import DTensor

    sd = model.state_dict()
    experts = set(expert_param_names(model))
    if groups is not None:
        for name in experts:
            sd[name] = _expert_dtensor(sd[name], groups)
    out = {"model": sd}
    if optimizer is not None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        # Creates the state of a fresh optimizer, so that a load has tensors to fill.
        osd = get_optimizer_state_dict(model, optimizer)
        if groups is not None:
            params = dict(model.named_parameters())
            bank = {n for g in osd["param_groups"] if g.get("bank_sphere") for n in g["params"]}
            for fqn, st in list(osd["state"].items()):
                if fqn in experts:
                    # a copy: these dicts are the optimizer's live state (training goes on after a save)
                    osd["state"][fqn] = st = dict(st)
                    p = params[fqn]
                    rows = local_part(p).shape[0]
                    row_split = _fsdp_dim(p) == 0  # dim 1 split: per-expert states hold every local row
                    for k, v in st.items():
                        # per-expert states lead with the local expert dim too: moments, and MuonH's
                        # radius (E_local, 1, 1); replicated saving would keep rank 0's experts only
                        if isinstance(v, DTensor):
                            st[k] = _expert_dtensor(v, groups)
                        elif (torch.is_tensor(v) and v.ndim >= 1 and v.shape[0] == rows
                              and not (k == "radius" and fqn in bank)):
                            st[k] = _expert_dtensor(v, groups, p.shape[0] if row_split else None)
        out["optim"] = osd
    return out


@contextlib.contextmanager
def _one_process_dcp(groups: EPGroups | None):
    """DCP warns "torch.distributed is disabled ... assuming the intent is to save in a single process"
    on every one-process save and load: that is exactly our intent (no_dist), so the warning is muted there."""
    with warnings.catch_warnings():
        if groups is None:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save_checkpoint(model: nn.Module, path: str | Path, groups: EPGroups | None = None, optimizer=None) -> None:
    """Save model (and optimizer) with torch.distributed.checkpoint: every rank calls it; groups=None
    in one process. Any layout (world size, EP size, FSDP2 or not) can load it."""
    import torch.distributed.checkpoint as dcp

    with _one_process_dcp(groups):
        dcp.save(ep_state_dict(model, groups, optimizer), checkpoint_id=str(path), no_dist=groups is None)


def load_checkpoint(model: nn.Module, path: str | Path, groups: EPGroups | None = None, optimizer=None,
                    storage_reader=None, planner=None) -> None:
    """Load a checkpoint saved by any number of ranks into this layout (DCP reshards); a
    storage_reader / planner replaces DCP's (marin.train.checkpoint passes ones that never unpickle code)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor

    sd = ep_state_dict(model, groups, optimizer)
    with _one_process_dcp(groups):
        dcp.load(sd, checkpoint_id=str(path), no_dist=groups is None, storage_reader=storage_reader, planner=planner)
    # DCP writes in place into the tensors it was given; copy anyway, so an entry that was a copy
    # (not a view of the parameter) still lands in the model.
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, v in sd["model"].items():
            t = own.get(name)
            if t is None:
                continue
            local_part(t).copy_(local_part(v))
    if optimizer is not None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        experts = set(expert_param_names(model))
        osd = sd["optim"]
        params = dict(model.named_parameters())
        for fqn, st in osd["state"].items():
            if fqn in experts:
                p = params[fqn]
                for k, v in st.items():
                    if isinstance(v, DTensor):
                        if isinstance(p, DTensor) and v.ndim == p.ndim and v.shape[1:] == p.shape[1:]:
                            st[k] = DTensor.from_local(v.to_local(), p.device_mesh, p.placements,
                                                       run_check=False, shape=p.shape, stride=p.stride())
                        else:
                            st[k] = v.to_local()
        set_optimizer_state_dict(model, optimizer, osd)
