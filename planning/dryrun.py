"""`plan STUDY --dry_run`: will one rank of a large layout fit its GPU? Measured on CPU, in seconds
(docs/hero.md "Memory"): the rank's state sharded by the trainer's own code in a fake process group of the
full world size, activations under FakeTensorMode (planning/memory.py), the backward's and FSDP2's transients,
and the GPU's own allowances (`GpuAllowances`, assumptions); part (a), the training loop at narrowed width.
Precedent: torchtitan scripts/estimate/estimation.py (fake PG + FakeTensorMode + FSDP tracker)."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from marin_ablate.marin import ep
from marin_ablate.marin.config import ContextStage, DataConfig, RunSpec
from marin_ablate.marin.ep import EXPERT_PARAM_NAMES, moe_layers, shard_experts
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.optimizers import KINDS, group_kinds
from marin_ablate.marin.parallel import ShardingConfig, apply_fsdp
from marin_ablate.marin.train.distributed import ParallelDims, check_dist_layout, init_dist, sharding_config
from marin_ablate.marin.train.loop import StopFlag, Trainer
from marin_ablate.marin.train.metrics import Sinks
from marin_ablate.marin.train.stages import context_plan
from marin_ablate.planning.memory import fit_activations, substitutions

GiB, GB = 2**30, 1e9


@dataclass(frozen=True)
class Sharding:
    """How a rank holds the model: `apply(model, groups)` shards it in place (one call, so a better
    sharding drops in); `ns_whole_group` says whether Newton–Schulz stacks a whole parameter group
    (else one whole matrix at a time)."""

    name: str
    apply: Callable
    ns_whole_group: bool
    gathered_bytes: int = 0  # FSDP2: bytes per element of a gathered unit (2 under bf16 compute); 0: no FSDP


def current_sharding(spec: RunSpec | None = None) -> Sharding:
    """The trainer's sharding (marin.train.distributed.build_train_model): experts sliced over EP and
    FSDP2 over dp, everything else FSDP2 over the world, with the run's ShardingConfig; Newton-Schulz
    gathers one whole matrix at a time (marin.update_rules)."""
    cfg = sharding_config(spec.train) if spec is not None else ShardingConfig()

    def apply(model, groups):
        shard_experts(model, groups)
        return apply_fsdp(model, groups, cfg)

    r = spec.train.replica_groups if spec is not None else 1
    where = (f"HSDP: FSDP2 of non-expert parameters inside each of {r} racks, replicated across them; experts "
             "EP-sliced, a slice with one rank per rack ZeRO-sharded across the racks (ExpertShard), else FSDP2 "
             "over the rack's dp_shard ranks" if r > 1
             else "FSDP2 over all ranks; experts over EP x FSDP2 (or ExpertShard where FSDP2 cannot split) over dp")
    return Sharding(where + " (marin.parallel)" +
                    (", bf16 compute" if cfg.mixed_precision else ""), apply, ns_whole_group=False,
                    gathered_bytes=2 if cfg.mixed_precision else 4)


def fsdp_units(model, ep_size: int) -> dict[str, int]:
    """Elements of each FSDP2 unit of marin.parallel.apply_fsdp when gathered (a whole unit, the
    expert stacks as this rank's EP slice), from the unsharded (meta) model."""
    owner: dict[int, str] = {}
    for name, moe in moe_layers(model):
        for p in EXPERT_PARAM_NAMES:
            owner[id(getattr(moe, p))] = f"{name}.experts"
        for cname, child in moe.named_children():
            for i, unit in enumerate(child if isinstance(child, torch.nn.ModuleList) else [child]):
                for q in unit.parameters():
                    owner.setdefault(id(q), f"{name}.{cname}.{i}")
    for i, b in enumerate(getattr(model, "blocks", [])):
        for q in b.parameters():
            owner.setdefault(id(q), f"blocks.{i}")
    for attr in ("embed", "lm_head"):
        for q in getattr(model, attr).parameters():
            owner.setdefault(id(q), attr)
    units: dict[str, int] = {}
    for q in model.parameters():
        u = owner.get(id(q), "root")
        units[u] = units.get(u, 0) + (q.numel() // ep_size if u.endswith(".experts") else q.numel())
    return units


def _padded_local(p: torch.Tensor) -> int:
    """Elements this rank allocates for `p`: an FSDP2 shard is padded to ceil(size / shards) along each
    sharded dim (so every rank holds as much); a mesh dim that replicates (HSDP's racks) divides
    nothing; a plain tensor is whole."""
    if not hasattr(p, "device_mesh"):
        return p.numel()
    shape = list(p.shape)
    for i, pl in enumerate(p.placements):
        if pl.is_shard():
            shape[pl.dim] = -(-shape[pl.dim] // p.device_mesh.size(i))
    return math.prod(shape)


def rank_state(spec: RunSpec, world: int, ep_size: int, rank: int, sharding: Sharding) -> dict:
    """Local parameter elements by role, experts per rank, the largest whole matrix (elements), for
    `rank` of a `world`-rank fake process group; a one-GPU run (`world` 1) is the single-process model:
    every expert local (virtual EP), no process group and no sharding, as its trainer builds it."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("the dry run needs a process without a process group")
    one = world == 1
    if not one:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        groups = None if one else ep.build_ep_groups(ep_size, replicas=spec.train.replica_groups)  # the run's meshes
        with torch.device("meta"):
            model = MarinModel(spec.model, spec.recipe)
        roles = model.param_roles()
        biggest: dict[str, int] = {}  # the largest whole matrix of each role (one expert's for experts)
        for n, p in model.named_parameters():
            biggest[roles[n]] = max(biggest.get(roles[n], 0), p[0].numel() if roles[n] == "expert" else p.numel())
        units = fsdp_units(model, ep_size)
        model = model if one else sharding.apply(model, groups) or model
        by_role: dict[str, int] = {}
        for n, p in model.named_parameters():
            by_role[roles[n]] = by_role.get(roles[n], 0) + _padded_local(p)
        experts = [m.w_up_EWH.shape[0] for _, m in ep.moe_layers(model)]  # the EP slice (FSDP2 shards it over dp)
        # a slice ZeRO-sharded across racks (marin.parallel.ExpertShard) is gathered whole, one layer at a time
        zero = max((sum(getattr(m, p).numel() for p in ep.EXPERT_PARAM_NAMES) for _, m in ep.moe_layers(model)
                    if getattr(m.dispatcher, "expert_shard", None) is not None), default=0)
        return {"rank": rank, "dp_rank": 0 if one else rank // ep_size, "ep_rank": 0 if one else rank % ep_size,
                "by_role": by_role, "experts_per_rank": experts[0], "largest_matrix": biggest,
                "largest_unit": max(units.items(), key=lambda kv: kv[1]), "zero_gathered": zero}
    finally:
        if not one:
            dist.destroy_process_group()


@dataclass(frozen=True)
class GpuAllowances:
    """Per-rank memory outside PyTorch's tensors, each its own line (assumptions, not measurements: the
    CPU dry run cannot see them). NCCL: its docs' NCCL_BUFFSIZE (4 MiB) per channel and direction for
    every p2p peer of the EP all-to-all, and NVLink SHARP (NVLS) buffers per communicator that uses it."""

    cuda_context_gib: float = 1.0  # CUDA context, cuBLAS/cuDNN workspaces, Triton/compile caches
    nccl_buffsize: int = 4 * 2**20
    nccl_p2p_channels: int = 2
    nvls_gib_per_comm: float = 1.0
    nvls_comms: int = 2  # the shard group's all-gather/reduce-scatter and the replica group's reduction
    fragmentation: float = 0.05  # of everything else: the caching allocator's slack (expandable segments on)


def memory_table(spec: RunSpec, state: dict, world: int, act: dict, sharding: Sharding, level: str,
                 gpu: GpuAllowances | None = None, extra: tuple[dict, ...] = ()) -> list[dict]:
    """Per-rank memory lines (bytes) for optimizer `level` from the measured state and activations; `extra`
    lines (gradient accumulation's, planning/layout.py); `gpu` adds the lines a GPU rank holds beyond tensors."""
    kinds = group_kinds(level)
    by_role = state["by_role"]
    n = sum(by_role.values())
    rows = [{"line": "parameters (fp32 master)", "bytes": 4 * n}, {"line": "gradients (fp32)", "bytes": 4 * n}]
    rows += [{"line": f"optimizer {kinds[r]} [{r}]", "bytes": KINDS[kinds[r]].state_bytes * k}
             for r, k in sorted(by_role.items())]
    rows.append({"line": f"activations kept ({act['n_local']} local x {act['per_local'] / GiB:.3f} + {act['n_global']} "
                 f"global x {act['per_global'] / GiB:.3f} GiB)",
                 "bytes": act["n_local"] * act["per_local"] + act["n_global"] * act["per_global"]})
    rows.append({"line": "transient: backward working set (" + ("one block recomputed, " if act["recompute"] else "")
                 + "embedding, loss chunk)", "bytes": act["base"]})
    ns_groups = [r for r in by_role if KINDS[kinds[r]].orthogonalizes]
    ns_elems = max(((by_role if sharding.ns_whole_group else state["largest_matrix"])[r] for r in ns_groups),
                   default=0)
    rows.append({"line": "transient: Newton-Schulz working set " + ("(a whole group stacked)" if sharding.ns_whole_group
                                                                    else "(one whole matrix)"),
                 "bytes": 3 * 4 * ns_elems})
    if sharding.gathered_bytes:  # two units gathered (current + prefetched), one unit's grads + fp32 copy
        unit, elems = state["largest_unit"]
        gb = sharding.gathered_bytes
        rows.append({"line": f"transient: FSDP2 gathered weights + unsharded grads ({unit})",
                     "bytes": (2 * gb + gb + (4 if gb != 4 else 0)) * elems})
    if state.get("zero_gathered"):  # the gathered slice and its copy, its gradient, three fp32 buffers of it
        gb = sharding.gathered_bytes or 4
        rows.append({"line": "transient: one layer's expert slice gathered across racks + its gradient (ExpertShard)",
                     "bytes": (3 * gb + 3 * 4) * state["zero_gathered"]})
    rows += [dict(r) for r in extra]
    if gpu is not None:
        m, ep = spec.model, state.get("ep_size", 1)
        g = m.moe_geometry(spec.recipe)
        cap = m.capacity_factor(spec.recipe) or 1.0
        tokens = state.get("tokens_per_rank", 0)
        # dispatch receive + combine send, bf16 rows of the latent width, at the receiver's capacity
        rows.append({"line": f"EP receive buffers at capacity {cap:g} (dispatch + combine, bf16)",
                     "bytes": int(2 * tokens * g.top_k * cap * g.width * 2) if ep > 1 else 0})
        rows.append({"line": f"NCCL p2p buffers ({ep - 1} peers x {gpu.nccl_p2p_channels} channels x 2 x "
                     f"{gpu.nccl_buffsize >> 20} MiB)",
                     "bytes": (ep - 1) * gpu.nccl_p2p_channels * 2 * gpu.nccl_buffsize})
        rows.append({"line": f"NCCL NVLS buffers ({gpu.nvls_comms} communicators, assumed)",
                     "bytes": int(gpu.nvls_comms * gpu.nvls_gib_per_comm * GiB)})
        rows.append({"line": "CUDA context + library workspaces (assumed)", "bytes": int(gpu.cuda_context_gib * GiB)})
        rest = sum(r["bytes"] for r in rows)
        rows.append({"line": f"allocator fragmentation allowance ({gpu.fragmentation:.0%})",
                     "bytes": int(gpu.fragmentation * rest)})
    return rows


def dry_run(spec: RunSpec, world: int, ep_size: int, *, capacity_gib: float, reserve_gib: float = 0.0,
            levels: tuple[str, ...] = ("hyperball", "adamw"), sharding: Sharding | None = None,
            seqs_per_rank: int | None = None, gpu: GpuAllowances | None = None, headroom: float = 0.10,
            extra: tuple[dict, ...] = ()) -> dict:
    """The dry run: per-rank tables for each optimizer level; `ok` false names the lines over budget.
    A GPU run gets the `gpu` allowance lines (default GpuAllowances()); `headroom` is the free fraction
    of the capacity the report asks for."""
    t0 = time.perf_counter()
    subs = substitutions(spec)  # raises for flex without compile: that configuration is not modelled
    sharding = sharding or current_sharding(spec)
    if spec.train.batch_size % world:
        raise ValueError(f"TrainConfig.batch_size={spec.train.batch_size} does not split over {world} GPUs; "
                         f"allowed values: multiples of {world}")
    if gpu is None and spec.train.device.startswith("cuda"):
        gpu = GpuAllowances()
    seqs = seqs_per_rank or spec.train.batch_size // world // spec.train.micro_batches  # one forward's sequences
    ranks = [0] if world == 1 else sorted({0, ep_size - 1, min(ep_size, world - 1), world - 1})
    states = [rank_state(spec, world, ep_size, r, sharding) for r in ranks]
    if len({tuple(sorted(s["by_role"].items())) for s in states}) != 1:
        raise RuntimeError(f"ranks {ranks} hold different state: {states}")
    # one GPU's virtual EP shards exchange rows in its own memory: no EP receive or NCCL buffers
    state = {**states[0], "ep_size": 1 if world == 1 else ep_size, "tokens_per_rank": seqs * spec.model.seq_len}
    ck = spec.train.activation_checkpoint
    # The peak (max over time of activations + temporaries) is the first block of the backward with
    # every layer's kept activations alive: base + n_local a_local + n_global a_global, where base holds
    # that block's recompute (checkpointing on) and backward, the embedding's and the loss chunk's.
    act = {**fit_activations(spec, seqs), "recompute": ck == "block"}
    budget, capacity = (capacity_gib - reserve_gib) * GiB, capacity_gib * GiB
    tables = {}
    for level in levels:
        rows = memory_table(spec, state, world, act, sharding, level, gpu, extra)
        total = sum(r["bytes"] for r in rows)
        over = [r["line"] for r in rows if r["bytes"] > budget]
        tables[level] = {"rows": rows, "total": total, "ok": total <= budget, "headroom": 1 - total / capacity,
                         "host": sum(r.get("host", 0) for r in rows),
                         "over_budget": over or ([f"total ({total / GiB:.1f} GiB)"] if total > budget else [])}
    return {"world": world, "ep_size": ep_size, "ranks": ranks, "sharding": sharding.name,
            "experts_per_rank": states[0]["experts_per_rank"], "sequences_per_rank": seqs,
            "activation_checkpoint": ck, "loss_chunk_tokens": spec.train.loss_chunk_tokens,
            "activation_fit": {k: act[k] for k in ("points", "peaks", "residual", "base", "per_local", "per_global")},
            "substitutions": subs, "headroom_wanted": headroom,
            "capacity_gib": capacity_gib, "reserve_gib": reserve_gib, "tables": tables,
            "ok": all(t["ok"] for t in tables.values()),
            "seconds": time.perf_counter() - t0}


def _format_table(out: list[str], t: dict) -> None:
    w = max(len(r["line"]) for r in t["rows"])
    out.append(f"  {'line'.ljust(w)}  {'GB':>9}  {'GiB':>9}")
    for r in t["rows"] + [{"line": "total", "bytes": t["total"]}]:
        out.append(f"  {r['line'].ljust(w)}  {r['bytes'] / GB:9.1f}  {r['bytes'] / GiB:9.1f}")
    out.append(f"  headroom {t['headroom']:.1%} of capacity" + (f"; pinned host memory {t['host'] / GiB:.1f} GiB"
                                                                if t["host"] else ""))


def format_report(rep: dict) -> str:
    budget = rep["capacity_gib"] - rep["reserve_gib"]
    fit = rep["activation_fit"]
    head = (f"dry run: world {rep['world']} = {rep['world'] // rep['ep_size']} x EP {rep['ep_size']}, ranks "
            f"{rep['ranks']}, {rep['experts_per_rank']} experts per rank, {rep['sequences_per_rank']} sequences "
            f"per rank, activation_checkpoint={rep['activation_checkpoint']}, loss_chunk_tokens="
            f"{rep['loss_chunk_tokens']}")
    acts = ("activations: max over time of activations + temporaries (fake tensors, MemTracker) at (layers, "
            "global_every) "
            + ", ".join(f"{p}: {v / GiB:.2f} GiB" for p, v in zip(fit["points"], fit["peaks"], strict=True))
            + f"; linear fit residual {fit['residual']:.1%} of a layer")
    out = [head, f"sharding: {rep['sharding']}", acts]
    out += [f"stand-in: {s}" for s in rep["substitutions"]]
    for level, t in rep["tables"].items():
        out.append(f"\n{level}: per-rank memory (budget {budget:.0f} GiB = {rep['capacity_gib']:.0f} GiB capacity"
                   + (f" - {rep['reserve_gib']:.0f} GiB reserve)" if rep["reserve_gib"] else ")"))
        _format_table(out, t)
        out.append("  fits" if t["ok"] else f"  DOES NOT FIT: over budget: {'; '.join(t['over_budget'])}")
        if t["ok"] and t["headroom"] < rep["headroom_wanted"]:
            out.append(f"  headroom under {rep['headroom_wanted']:.0%}")
    out.append(f"\ndry run took {rep['seconds']:.1f} s")
    return "\n".join(out)


# ---- (a) The real training loop at the full world size, one rank at a time, at narrowed width ----


class FakeCollectives:
    """While active, the fake process group's data-moving collectives behave as if every rank held
    what this rank holds (FakeStore collectives move no data, so exchanged counts would be garbage);
    all-reduces are left as they are (a sum over one rank). Every all-to-all's (group size, input
    splits, output splits) is recorded."""

    def __init__(self):
        self.a2a: list[tuple[int, list[int], list[int]]] = []
        self._orig: dict[str, Callable] = {}

    def _all_to_all_single(self, out, inp, out_splits=None, in_splits=None, group=None, async_op=False):
        s = dist.get_world_size(group)
        ins = list(in_splits) if in_splits is not None else [inp.shape[0] // s] * s
        outs = list(out_splits) if out_splits is not None else [out.shape[0] // s] * s
        if len(ins) != s or len(outs) != s or sum(ins) != inp.shape[0] or sum(outs) != out.shape[0] \
                or min(ins + outs, default=0) < 0:
            raise RuntimeError(f"all_to_all_single over {s} ranks: input splits {ins} (rows {inp.shape[0]}), "
                               f"output splits {outs} (rows {out.shape[0]}) do not match")
        out.zero_()
        self.a2a.append((s, ins, outs))

    def _all_gather(self, out, inp, group=None, async_op=False):
        s = dist.get_world_size(group)
        if out.numel() != s * inp.numel():
            raise RuntimeError(f"all_gather over {s} ranks: output of {out.numel()} elements "
                               f"for inputs of {inp.numel()}")
        out.view(s, -1).copy_(inp.reshape(1, -1).clone())  # FSDP2 gathers in place: inp is a view of out

    def _reduce_scatter(self, output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        s = dist.get_world_size(group)
        if input.numel() != s * output.numel():
            raise RuntimeError(f"reduce_scatter over {s} ranks: input of {input.numel()} elements for outputs of "
                               f"{output.numel()}")
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):  # PREMUL_SUM's factor cannot be read back
            raise RuntimeError(f"reduce_scatter with op {op}: the dry run's collectives take SUM or AVG")
        mine = input.reshape(s, -1)[dist.get_rank(group)].view_as(output)
        output.copy_(mine * s if op == dist.ReduceOp.SUM else mine)  # s identical ranks summed / averaged

    def _broadcast_object_list(self, objs, src=0, group=None, device=None, group_src=None):
        pass  # every rank keeps its own objects (the fake group would deliver garbage sizes)

    def __enter__(self) -> "FakeCollectives":
        for name, fn in (("all_to_all_single", self._all_to_all_single), ("all_gather_into_tensor", self._all_gather),
                         ("all_gather_single", self._all_gather),
                         ("reduce_scatter_tensor", self._reduce_scatter),
                         ("reduce_scatter_single", self._reduce_scatter),
                         ("broadcast_object_list", self._broadcast_object_list)):
            if hasattr(dist, name):
                self._orig[name] = getattr(dist, name)
                setattr(dist, name, fn)
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._orig.items():
            setattr(dist, name, fn)


def forget_meshes() -> None:
    """One process plays several ranks in turn: drop what outlives a process group and names its
    groups (DTensor's sharding-propagation cache returns specs that hold the old DeviceMesh; the
    expert-mesh views of marin.ep are keyed by object id, which a new mesh may reuse)."""
    from torch.distributed.tensor import DTensor

    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    ep.forget_expert_meshes()


def start_rank(spec: RunSpec, ep_size: int, run_dir, what: str, world: int | None = None):
    """What a rank played in this process starts from: no process group yet, the spec at `ep_size` EP
    shards (kept at its own ModelConfig.ep_shards when `ep_size` is a `world` smaller than them: each rank
    then holds ep_shards / world virtual shards), its run folder with a checkpoints/ folder, and its context
    stages (spec, run_dir, stages)."""
    if dist.is_initialized():
        raise RuntimeError(f"{what} needs a process without a process group")
    n = spec.model.ep_shards
    if not (world is not None and ep_size == world < n and n % world == 0):
        spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, ep_shards=ep_size))
    run_dir = Path(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    return spec, run_dir, context_plan(spec)


def narrowed(spec: RunSpec, world: int, d_model: int = 64, n_layers: int = 2, seq_len: int = 128,
             seqs_per_rank: int = 2, steps: int = 2) -> RunSpec:
    """The spec at a width a CPU affords, keeping what the layout depends on: experts, top-k, the EP
    size, the recipe, the optimizer, checkpointing, the chunked loss; `steps` steps, an eval at the end,
    no checkpoint written (DCP save does not run on the fake group: the state dict is checked instead).
    CPU runs sdpa in fp32 (flex has no CPU backward); an embedded corpus is byte-tokenized.
    Context stages are kept, one step each: n stages run at seq_len / 2^n, ..., seq_len / 2, seq_len
    (tokens per step held, so each rank still has a whole sequence at the longest), stage i from step i,
    the q multiplier by the spec's own rule at these ratios (`narrowed_stages`)."""
    n = len(spec.train.context_stages)
    if n:  # every stage trains a step: the loader, the q multiplier and the step at each stage's shape
        seqs_per_rank, steps = max(seqs_per_rank, 2 ** n), max(steps, n + 1)
        stages = tuple(ContextStage(i / steps, seq_len // 2 ** (n - i)) for i in range(1, n + 1))
        seq_len //= 2 ** n

    m = dataclasses.replace(spec.model, d_model=d_model, n_layers=n_layers, n_heads=4, head_dim=16, n_kv_heads=2,
                            n_kv_heads_global=1, seq_len=seq_len, window=seq_len // 2,
                            global_every=min(spec.model.global_every, n_layers), expert_hidden=32, shared_hidden=32,
                            gated_norm_rank=min(spec.model.gated_norm_rank, 16), attention="sdpa", kernels="torch")
    t = dataclasses.replace(spec.train, steps=steps, batch_size=seqs_per_rank * world, eval_every=steps,
                            eval_batches=1, eval_batch_size=world, checkpoint_every=0, log_every=1, device="cpu",
                            precision="fp32", mixed_precision="none", compile=False,
                            context_stages=stages if n else (), threads=None,
                            loss_chunk_tokens=min(spec.train.loss_chunk_tokens, seqs_per_rank * seq_len // 2)
                            if spec.train.loss_chunk_tokens else 0,
                            # an accumulated run rehearses its routing pass: two micro-batches
                            micro_batches=2 if spec.train.micro_batches > 1 and seqs_per_rank % 2 == 0 else 1)
    data = spec.data
    if data.corpus == "embedded":
        data = DataConfig(corpus="embedded", tokenizer="byte", data_seed=data.data_seed)
    return dataclasses.replace(spec, model=m, train=t, data=data)


def loop_rank(spec: RunSpec, world: int, ep_size: int, rank: int, run_dir) -> dict:
    """`rank` of a `world`-rank fake process group through the real Trainer: setup, steps, eval,
    summary; then the distributed checkpoint's state dict. A one-GPU rung (`world` 1) trains in one
    process with virtual EP over `ep_size` shards and no process group, as its run does; its final
    checkpoint is written for real. Raises naming what is wrong."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    spec, run_dir, stages = start_rank(spec, ep_size, run_dir, "the dry run", world)
    one = world == 1
    if not one:
        check_dist_layout(spec, stages, world)
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with FakeCollectives() as fc:
            if one:
                d, device, coords = ParallelDims(), torch.device("cpu"), (0, 0)
            else:
                d, device = init_dist(spec, torch.device("cpu"))
                g = d.groups
                if (g.dp_size, g.ep_size) != (world // ep_size, ep_size):
                    raise RuntimeError(f"mesh dp x ep = {g.dp_size} x {g.ep_size}, "
                                       f"expected {world // ep_size} x {ep_size}")
                coords = (g.mesh.get_local_rank("dp"), g.mesh.get_local_rank("ep"))
                if coords != divmod(rank, ep_size):
                    raise RuntimeError(f"rank {rank} sits at (dp, ep) = {coords}, expected {divmod(rank, ep_size)}")
            # no final checkpoint on the fake group: DCP's global plan cannot validate there (its collectives
            # move no data); the rehearsal, part (c), runs the save planner and writer of one rank instead
            trainer = Trainer(spec, run_dir, stages, device, d, time.perf_counter(),
                              keep_checkpoints="final" if one else "none")
            trainer.main = True  # each rank writes rank 0's files into its own folder (no broadcast to wait for)
            trainer.start(resume=False)
            trainer.sinks = Sinks((), run_dir, spec)
            summary = trainer.run(StopFlag(), None)
            n_e = spec.model.moe_geometry(spec.recipe).n_experts
            per_rank = n_e if one else n_e // ep_size  # virtual EP keeps every expert in its one process
            local = [m.w_up_EWH.shape[0] for _, m in ep.moe_layers(trainer.model)]
            if set(local) != {per_rank}:
                raise RuntimeError(f"experts per rank {local}, expected {per_rank} in every layer")
            bad = [x for x in fc.a2a if x[0] != ep_size]
            if one and fc.a2a:
                raise RuntimeError(f"{len(fc.a2a)} all-to-alls ran in one process: virtual EP needs none")
            if not one and (not fc.a2a or bad):
                raise RuntimeError(f"all-to-alls over groups of {sorted({x[0] for x in bad})} ranks, expected {ep_size}"
                                   if bad else "no all-to-all ran: the experts were not dispatched over EP")
            if one:
                final = run_dir / "checkpoints" / f"ckpt_{trainer.st.step:09d}" / "meta.json"
                if not final.exists():
                    raise RuntimeError(f"no final checkpoint at {final.parent}")
                sd = {"model": trainer.model.state_dict(), "optim": trainer.opt.state_dict()}
            else:
                sd = ep.ep_state_dict(trainer.model, g, trainer.opt)
            names = {n for n, _ in trainer.model.named_parameters()}
            missing = sorted(names - set(sd["model"]))
            if not one:  # the EP state dict keys its optimizer state by parameter name
                missing += sorted(names - set(sd.get("optim", {}).get("state", {})))
            if missing:
                raise RuntimeError(f"checkpoint state dict lacks {missing[:5]}")
            st = trainer.st
            seq = stages[0].seq_len
            data = {"rank_slices": trainer.data.rank_rows,
                    "train_rows": int(trainer.data.train[seq].batch(0)[0].shape[0]),
                    "eval_rows": int(next(iter(trainer.eval_sets[seq].values()))[0][0].shape[0]),
                    # each context stage trained a step at its own shape (narrowed): (from step, seq_len, rows)
                    "stages": [(s.start_step, s.seq_len, int(trainer.data.train[s.seq_len].batch(s.start_step)[0]
                                                             .shape[0]), round(s.q_scale, 4)) for s in stages]}
    finally:
        if not one:
            dist.destroy_process_group()
            forget_meshes()
    losses = [summary.get("final_train_loss"), summary.get("eval_macro_loss")]
    if not all(v is not None and math.isfinite(v) for v in losses + [st.max_grad_norm]):
        raise RuntimeError(f"rank {rank}: non-finite loss or grad norm: {losses}, {st.max_grad_norm}")
    return {"rank": rank, "dp_ep": coords, "experts_per_rank": local[0], "steps": st.step,
            "loss": st.last_loss, "eval_macro_loss": summary["eval_macro_loss"],
            "all_to_alls": len(fc.a2a), "split_rows": sum(sum(x[1]) for x in fc.a2a), "data": data,
            "checkpoint_tensors": len(sd["model"]) + sum(len(v) for v in sd.get("optim", {}).get("state", {}).values())}


def in_fresh_process(fn, *args):
    """`fn(*args)` in a new interpreter: one process plays one rank, so nothing that torch keeps across
    process groups (device meshes held by DTensor specs and caches) leaks from one rank into the next.
    An exception raised there is raised here."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


def loop_dry_run(spec: RunSpec, world: int, ep_size: int, work_dir, **narrow) -> dict:
    """Part (a): the first and last rank and the edges of the first EP group through `loop_rank`."""
    t0 = time.perf_counter()
    small = narrowed(spec, world, **narrow)
    ranks = [0] if world == 1 else sorted({0, ep_size - 1, min(ep_size, world - 1), world - 1})
    rows = [in_fresh_process(loop_rank, small, world, ep_size, r, Path(work_dir) / f"rank{r}") for r in ranks]
    return {"world": world, "ep_size": ep_size, "ranks": ranks, "rows": rows, "d_model": small.model.d_model,
            "n_layers": small.model.n_layers, "seq_len": small.model.seq_len, "steps": small.train.steps,
            "sequences_per_rank": small.train.batch_size // world, "seconds": time.perf_counter() - t0}


def format_loop(rep: dict) -> str:
    layout = (f"one process (virtual EP {rep['ep_size']}, no process group; the final checkpoint written)"
              if rep["world"] == 1 else
              f"world {rep['world']} = {rep['world'] // rep['ep_size']} x EP {rep['ep_size']} (fake process group)")
    out = [f"dry run (a): the training loop at {layout}, d_model {rep['d_model']}, {rep['n_layers']} layers, "
           f"seq_len {rep['seq_len']}, {rep['sequences_per_rank']} sequences per rank, {rep.get('steps', 2)} steps + "
           "eval, CPU sdpa fp32"]
    for r in rep["rows"]:
        out.append(f"  rank {r['rank']:>5} (dp, ep) = {r['dp_ep']}: {r['experts_per_rank']} experts, "
                   f"{r['steps']} steps, loss {r['loss']:.4f}, eval {r['eval_macro_loss']:.4f}, "
                   f"{r['all_to_alls']} all-to-alls ({r['split_rows']} rows), checkpoint state dict "
                   f"{r['checkpoint_tensors']} tensors")
        if len(r["data"].get("stages", ())) > 1:
            out.append("    context stages (from step, seq_len, rows per rank, q multiplier): "
                       + ", ".join(f"({a}, {b}, {c}, {q})" for a, b, c, q in r["data"]["stages"]))
    out.append(f"  took {rep['seconds']:.1f} s")
    return "\n".join(out)
