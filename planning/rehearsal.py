"""`plan STUDY --dry_run`, part (c): one whole training step and checkpoint save of the configured layout with the
accelerator (`meta` standing in for `cuda`) and the host (`cpu`) as different devices, failing where a GPU would:
a collective on a host tensor, an op mixing host and accelerator tensors or refused by its meta kernel, collective
sequences that differ between the rehearsed ranks (on NCCL they hang until the watchdog), more host reads per step
than `host_reads_allowed`. What stands in for what, and why: docs/hero.md "The rehearsal"."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import time
import traceback
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from marin_ablate.marin import ep, ep_exchange
from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.ep import ep_state_dict
from marin_ablate.marin.kernels import torch_ops
from marin_ablate.marin.parallel import save_planner
from marin_ablate.marin.train.distributed import ParallelDims, check_dist_layout
from marin_ablate.marin.train.loop import Trainer
from marin_ablate.marin.train.stages import apply_q_scale
from marin_ablate.planning.dryrun import forget_meshes, narrowed, start_rank

ACCEL, HOST = torch.device("meta"), torch.device("cpu")
_aten = torch.ops.aten
_COPIES = {_aten._to_copy.default, _aten.copy_.default, _aten.copy.default, _aten._copy_from.default,
           _aten._copy_from_and_resize.default, _aten.lift_fresh.default, _aten.detach.default,
           _aten.alias.default, _aten.set_.source_Tensor}
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor")


#: Host reads of device values allowed per step (each waits for the GPU to drain): HOST_READS_FIXED for the
#: step's own (dist_forward_backward's logged statistics, loss and grad norm: 8 measured) and HOST_READS_PER_LAYER
#: for each MoE layer (the router's token count in the QB update, and ragged EP's split read in the forward and
#: the recomputed forward: 3 measured); above it the rehearsal fails naming the call sites (docs/hero.md).
HOST_READS_FIXED, HOST_READS_PER_LAYER = 12, 4


def host_reads_allowed(n_layers: int) -> int:
    """The host-read budget of one step of an `n_layers` model (the hero: 12 + 4 x 48 = 204)."""
    return HOST_READS_FIXED + HOST_READS_PER_LAYER * n_layers


class RehearsalError(RuntimeError):
    """The step would fail on a GPU: one line naming the call and its caller."""


#: Rooted collectives: which of their tensors is this rank's own part (c10d::gather_(outputs, inputs, group,
#: root, ...): the root alone passes the gathered list; scatter_ mirrors it), compared across ranks with the root
_ROOTED = {"c10d::gather_": slice(-1, None), "c10d::scatter_": slice(0, 1)}


def _group_ranks(args, kwargs) -> tuple[int, ...]:
    """The ranks of the process group a collective's arguments name (a c10d ProcessGroup object, or a
    functional collective's group name); () when none is found."""
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, torch.ScriptObject):
            try:
                return tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(a)))
            except RuntimeError:  # a ReduceOp, not a group
                continue
        if isinstance(a, str):
            try:
                return tuple(dist.get_process_group_ranks(dist.distributed_c10d._resolve_process_group(a)))
            except (ValueError, RuntimeError, KeyError):
                continue
    return ()


def _caller() -> str:
    """The innermost frame of this project (marin/, sweeps/, ablations/) outside this module, else the
    innermost frame outside torch: where the offending call was made."""
    frames = traceback.extract_stack()[:-2]
    ours = [f for f in frames if any(s in f.filename for s in ("/marin/", "/sweeps/", "/ablations/"))
            and not f.filename.endswith("planning/rehearsal.py")]
    f = ours[-1] if ours else frames[-1]
    starts = [f.filename.rfind(f"/{top}/") for top in ("marin", "sweeps", "ablations")]
    name = f.filename[max(starts) + 1:] if max(starts) >= 0 else f.filename  # repository-relative
    return f"{name}:{f.lineno} in {f.name}"


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} on {t.device.type}"


class Discipline(TorchDispatchMode):
    """Device discipline of a GPU step (docs/hero.md "The rehearsal"): refuses host collectives and host/accelerator
    mixes, stands in for host reads of accelerator values and lists them by call site."""

    def __init__(self, host_collectives: bool = False):
        super().__init__()
        self.host_collectives = host_collectives
        self.host_reads: Counter[str] = Counter()
        self.transfers: Counter[str] = Counter()  # accelerator -> host copies that are not reads (offload)
        self.collectives: Counter[str] = Counter()
        # every collective in order: (op, group ranks, shapes, dtypes, caller) -- compared across ranks
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        ns = func.namespace
        if ns in _COLLECTIVE_NAMESPACES:
            host = [t for t in tensors if t.device.type != ACCEL.type]
            if host and not self.host_collectives:
                raise RehearsalError(f"{func} of a host tensor ({_describe(host[0])}) from {_caller()}: the "
                                     "process group serves only the accelerator, as NCCL serves only cuda "
                                     "(No backend type associated with device type cpu)")
            self.collectives[f"{func.name()} ({'host' if host else 'accelerator'})"] += 1
            own = _ROOTED.get(func.name(), slice(None))  # a rooted op: the root alone holds the peers' buffers
            name = func.name() + (f" (root {args[3]})" if func.name() in _ROOTED else "")
            self.calls.append((name, _group_ranks(args, kwargs), tuple(tuple(t.shape) for t in tensors[own]),
                               tuple(str(t.dtype).removeprefix("torch.") for t in tensors[own]), _caller()))
            return func(*args, **kwargs)
        if func is _aten._local_scalar_dense.default and tensors[0].device == ACCEL:
            self.host_reads[_caller()] += 1
            t = tensors[0]
            return True if t.dtype == torch.bool else 1 if not t.is_floating_point() else 1.0
        if func in _COPIES:
            src = tensors[1] if func in (_aten.copy_.default, _aten.copy.default) else tensors[0]
            dst_dev = (tensors[0].device if func in (_aten.copy_.default, _aten.copy.default)
                       else kwargs.get("device", src.device))
            if src.device == ACCEL and torch.device(dst_dev).type == HOST.type:
                site = _caller()
                (self.transfers if "torch/distributed" in "".join(traceback.format_stack()[-12:])
                 else self.host_reads)[site] += 1
                if func in (_aten.copy_.default,):
                    return tensors[0].zero_() if tensors[0].device.type == HOST.type else tensors[0]
                return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype, device=HOST)
            return func(*args, **kwargs)
        devs = {t.device.type for t in tensors if t.dim() > 0 or t.device == ACCEL}
        if len(devs) > 1:
            host = next(t for t in tensors if t.device.type != ACCEL.type and t.dim() > 0)
            raise RehearsalError(f"{func} mixes host and accelerator tensors ({_describe(host)}) from {_caller()}: "
                                 "on a GPU this raises 'Expected all tensors to be on the same device'")
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as e:
            if isinstance(e, RehearsalError):
                raise
            msg = " ".join(str(e).split())[:300]
            raise RehearsalError(f"{func} on {', '.join(_describe(t) for t in tensors[:3])} "
                                 f"from {_caller()}: {msg}") from e


class AutocastStandIn:
    """torch.autocast for the accelerator stand-in (torch.autocast has no meta device): a region that
    records whether autocast is on (`stack`), so the trainer's `torch.autocast(device.type, ...)`, the
    router's fp32 region and activation checkpointing's recompute run unchanged. It does not cast: the
    step's dtypes are FSDP2's bf16 compute (MixedPrecisionPolicy), not autocast's (tried as a
    TorchFunctionMode: checkpoint's recompute does not run through it, so forward and recompute differ)."""

    def __init__(self):
        self.stack: list[bool] = [False]

    def autocast(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled=None):
        if device_type != ACCEL.type:
            return _TORCH_AUTOCAST(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        if enabled and dtype not in (None, torch.bfloat16):
            raise RehearsalError(f"autocast dtype {dtype} from {_caller()}: the rehearsal models bf16 only")
        stack = self.stack

        class _Region:
            def __enter__(self):
                stack.append(bool(enabled))

            def __exit__(self, *exc):
                stack.pop()

        return _Region()


_TORCH_AUTOCAST = torch.autocast
_TORCH_AUTOCAST_QUERIES = (torch.is_autocast_enabled, torch.get_autocast_dtype)
_TORCH_AMP = (torch.amp.autocast, torch.amp.is_autocast_available)


def _patch_autocast(amp: AutocastStandIn | None) -> None:
    """torch.autocast, is_autocast_enabled and get_autocast_dtype answer for the accelerator stand-in
    from `amp` (None restores torch's)."""
    if amp is None:
        torch.autocast = _TORCH_AUTOCAST
        torch.amp.autocast, torch.amp.is_autocast_available = _TORCH_AMP
        torch.is_autocast_enabled, torch.get_autocast_dtype = _TORCH_AUTOCAST_QUERIES
        return
    enabled, dtype = _TORCH_AUTOCAST_QUERIES
    torch.autocast = torch.amp.autocast = amp.autocast  # torch.utils.checkpoint's recompute too
    torch.amp.is_autocast_available = lambda d: d == ACCEL.type or _TORCH_AMP[1](d)
    torch.is_autocast_enabled = lambda *a: amp.stack[-1] if a and a[0] == ACCEL.type else enabled(*a)
    torch.get_autocast_dtype = lambda d: torch.bfloat16 if d == ACCEL.type else dtype(d)


class _Sync:
    """A device stream or event of the stand-in: work on the accelerator stand-in is synchronous, so every
    event has completed and no stream waits."""

    def __init__(self, *args, **kwargs):
        pass

    wait = wait_stream = wait_event = synchronize = lambda self, *args, **kwargs: None

    def record(self, stream=None):
        return self

    def record_event(self, event=None):
        return event or _Sync()

    def query(self) -> bool:
        return True


def _device_handle():
    """What FSDP2 and DCP ask `torch.<device>` for (torch.cuda on a GPU): torch.cpu's functions, with
    streams whose events exist (torch.cpu's record none, which FSDP2's HSDP path refuses on a non-CPU
    device) and device 0."""
    import contextlib
    import types

    h = types.ModuleType("torch.meta")
    h.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("__")})
    current = _Sync()
    h.Stream = h.Event = _Sync
    h.current_stream = lambda device=None: current
    h.stream = lambda s=None: contextlib.nullcontext(s)
    h.current_device = lambda: 0
    h.is_initialized = h.is_available = lambda: True
    h.device_count = lambda: 1
    h.synchronize = lambda device=None: None
    return h


def rehearsal_spec(spec: RunSpec, world: int, **narrow) -> tuple[RunSpec, list[str]]:
    """The spec at narrowed width (planning.dryrun.narrowed) that keeps what the step's devices and dtypes
    depend on: precision, mixed precision, offload, the optimizer, recompute and the chunked loss; and
    the stand-ins it takes, for the output."""
    small = narrowed(spec, world, steps=1, **narrow)
    t = dataclasses.replace(small.train, precision=spec.train.precision, mixed_precision=spec.train.mixed_precision,
                            eval_every=0)
    subs = []
    if spec.model.attention == "flex":
        subs.append("flex attention (compiled): sdpa of the same q, k, v (device, dtype and output shape kept)")
    if spec.model.kernels == "triton":
        subs.append("kernels='triton': torch's ops of the same functions (device, dtype and shape kept)")
    if spec.train.compile:
        subs.append("TrainConfig.compile: the blocks run eager (the same ops, one at a time)")
    if spec.recipe.ep_transport in ("ragged", "dropless") and spec.model.ep_shards > 1:
        subs.append("ragged EP's split read (marin.ep_exchange.read_splits): even splits of the sendable rows")
    return dataclasses.replace(small, train=t), subs


_SPLIT_READ = "marin/ep_exchange.py in read_splits (stood in: even splits)"


def _even_splits(splits_2CS: torch.Tensor, rows: int) -> list:
    """ragged EP's host read stood in: every chunk sends (and receives) `rows` split evenly over the
    ranks, what a balanced router sends under capacity (the shapes downstream follow from these)."""
    _, chunks, s = splits_2CS.shape
    each = rows // (chunks * s)
    return [[[each] * s for _ in range(chunks)] for _ in range(2)]


def _save_checkpoint(trainer, groups, path: Path) -> str:
    """This rank's DCP save as far as a fake group lets it go: the state dict, the save planner's local
    and (one-rank) global plan, and FileSystemWriter's write of this rank's items; what ran, in words."""
    from torch.distributed.checkpoint import FileSystemWriter

    sd = ep_state_dict(trainer.model, groups, trainer.opt)
    planner = save_planner()  # the trainer's: plan caching on
    planner.set_up_planner(sd, None, is_coordinator=True)
    writer = FileSystemWriter(str(path), thread_count=1, single_file_per_rank=True)
    writer.set_up_storage_writer(True)
    local = writer.prepare_local_plan(planner.create_local_plan())
    plans, _ = planner.create_global_plan([local])
    plans = writer.prepare_global_plan(plans)
    plan = planner.finish_plan(plans[0])
    fut = writer.write_data(plan, planner)
    fut.wait()
    results = fut.value()
    n = sum(1 for _ in path.rglob("*.distcp"))
    return (f"DCP save planner + FileSystemWriter: {len(plan.items)} items of this rank planned, {len(results)} "
            f"written to {n} file (values stood in); metadata not committed (needs every rank's plan)")


def rehearse_rank(spec: RunSpec, world: int, ep_size: int, rank: int, run_dir, host_backend: bool = False) -> dict:
    """`rank` of a `world`-rank group through one training step and a checkpoint save on the accelerator
    stand-in (docs/hero.md "The rehearsal"); raises RehearsalError naming the call that would fail on a GPU."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group, _fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    spec, run_dir, stages = start_rank(spec, ep_size, run_dir, "the rehearsal", world)
    one = world == 1  # a one-GPU rung: the single-process trainer (virtual EP), no process group
    backend = "none (one process)" if one else "meta:fake,cpu:fake" if host_backend else "meta:fake"
    if not one:
        check_dist_layout(spec, stages, world)
        dist.init_process_group(backend, store=FakeStore(), rank=rank, world_size=world)
    # FSDP2 takes its device from the mesh's device handle (none for meta) and refuses meta parameters
    # at its lazy init (meant for deferred init): here meta *is* the accelerator
    saved = (_fully_shard._get_device_from_mesh, _fsdp_param_group.FSDPParamGroup._validate_no_meta_params,
             ep_exchange.read_splits)
    _fully_shard._get_device_from_mesh = lambda mesh: ACCEL if mesh.device_type == ACCEL.type else saved[0](mesh)
    _fsdp_param_group.FSDPParamGroup._validate_no_meta_params = lambda self: None
    torch.meta = _device_handle()  # the device handle FSDP2 asks for streams and events (torch.cuda on a GPU)
    # ragged EP's split read stood in, and counted as the host read it is on a GPU
    def read_splits(splits, rows):
        mode.host_reads[_SPLIT_READ] += 1
        return _even_splits(splits, rows)

    ep_exchange.read_splits = read_splits
    # the accelerator is a Hopper/Blackwell GPU (sm90+): torch._grouped_mm in bf16 with aligned rows
    saved_gmm = torch_ops.native_grouped_mm_ok
    torch_ops.native_grouped_mm_ok = lambda x, w: (saved_gmm(x, w) if x.device != ACCEL else
                                                   x.dtype == w.dtype == torch.bfloat16 and x.shape[1] % 8 == 0
                                                   and w.shape[2] % 8 == 0)
    mode = Discipline(host_collectives=host_backend)
    t0 = time.perf_counter()
    try:
        groups = None if one else ep.build_ep_groups(ep_size, ACCEL.type, spec.train.effective().replica_groups)
        # the checkpoint writer's own gloo group cannot be built on a fake store: the save below runs
        # the writer's state dict and DCP's planner and file writer directly
        d = ParallelDims(world, rank, groups, False) if not one else ParallelDims()
        d.checkpointer = lambda: None
        amp = AutocastStandIn()
        _patch_autocast(amp)  # the trainer's `torch.autocast(device.type, ...)` and the router's
        # backward in this thread: the modes are thread-local (a device thread would not see them)
        with mode, torch.autograd.set_multithreading_enabled(False):
            trainer = Trainer(spec, run_dir, stages, ACCEL, d, time.perf_counter())
            trainer.init_model()  # a fresh start (`Trainer.start` without its directory bookkeeping)
            trainer.main = True
            where = {n: p.device.type for n, p in list(trainer.model.named_parameters())[:1]}
            for stage in stages:  # one step at each context stage's shape and q multiplier
                trainer.st.step = stage.start_step
                apply_q_scale(trainer.model, stage.q_scale)
                trainer.train_step(stage)
            ckpt = _save_checkpoint(trainer, groups, run_dir / "checkpoints" / "rehearsal")
        local = [m.w_up_EWH.shape[0] for _, m in ep.moe_layers(trainer.model)]
    finally:
        (_fully_shard._get_device_from_mesh, _fsdp_param_group.FSDPParamGroup._validate_no_meta_params,
         ep_exchange.read_splits) = saved
        del torch.meta
        _patch_autocast(None)
        torch_ops.native_grouped_mm_ok = saved_gmm
        if not one:
            dist.destroy_process_group()
            forget_meshes()
    return {"rank": rank, "backend": backend, "experts_per_rank": local[0] if local else 0,
            "param_device": next(iter(where.values()), ""), "checkpoint": ckpt,
            "host_reads": dict(mode.host_reads), "transfers": dict(mode.transfers),
            "collectives": dict(mode.collectives), "calls": mode.calls, "steps": len(stages),
            "stages": [(s.seq_len, s.batch_size) for s in stages], "seconds": time.perf_counter() - t0}


def _call(c: tuple, shared: bool) -> str:
    op, ranks, shapes, dtypes, caller = c
    group = f"{'the shared' if shared else 'its'} group of {len(ranks)} rank(s)"
    return f"{op} on {group}, {', '.join(f'{d}{list(s)}' for s, d in zip(shapes, dtypes, strict=True))} from {caller}"


def _first_difference(ra: int, rb: int, label: str, xa: list, xb: list, key) -> str | None:
    """One line naming the first call where the sequences `xa` (rank ra's) and `xb` (rank rb's) differ, else None."""
    for k in range(max(len(xa), len(xb))):
        ca = xa[k] if k < len(xa) else None
        cb = xb[k] if k < len(xb) else None
        if ca is None or cb is None or key(ca) != key(cb):
            shared = label.startswith("a group")
            da = _call(ca, shared) if ca else "nothing (its sequence ended)"
            db = _call(cb, shared) if cb else "nothing (its sequence ended)"
            return (f"ranks {ra} and {rb} diverge at collective #{k + 1} on {label}: rank {ra} issues {da}; "
                    f"rank {rb} issues {db}. On NCCL both would wait until the watchdog's timeout")
    return None


def compare_ranks(rows: list[dict]) -> str | None:
    """None when the rehearsed ranks' collective sequences agree, else one line naming the first call that
    differs (docs/hero.md "The rehearsal"): first, for every pair of rehearsed ranks, on the groups the two share (a
    mismatch there hangs both), then each rank against the first on its own groups, compared by group size
    (the same program on every rank)."""
    members = {}  # group ranks -> the same as a set, built once (the world's tuple is long)
    def on(row: dict, peer: int) -> list:
        return [c for c in row["calls"] if peer in members.setdefault(c[1], frozenset(c[1]))]

    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            got = _first_difference(a["rank"], b["rank"], "a group they share", on(a, b["rank"]), on(b, a["rank"]),
                                    lambda c: c[:4])
            if got:
                return got
    first = rows[0] if rows else None
    for b in rows[1:]:
        got = _first_difference(first["rank"], b["rank"], "groups of the same size", first["calls"], b["calls"],
                                lambda c: (c[0], len(c[1]), c[2], c[3]))
        if got:
            return got
    return None


def host_read_budget(rows: list[dict], n_layers: int) -> str | None:
    """None when every rehearsed rank reads at most `host_reads_allowed(n_layers)` device values per step,
    else one line with the count and the call sites."""
    budget = host_reads_allowed(n_layers)
    for r in rows:
        per_step = sum(r["host_reads"].values()) / max(1, r["steps"])
        if per_step > budget:
            sites = ", ".join(f"{s} (x{n})" for s, n in sorted(r["host_reads"].items(), key=lambda x: -x[1])[:5])
            return (f"rank {r['rank']}: {per_step:.1f} host reads of device values per step, above the budget "
                    f"{budget} = HOST_READS_FIXED {HOST_READS_FIXED} + HOST_READS_PER_LAYER {HOST_READS_PER_LAYER} "
                    f"x {n_layers} layers (each waits for the GPU to drain): {sites}")
    return None


#: Above this many edge ranks (first and last of every EP group) the rehearsal plays the edges of each rack and
#: of the first and last EP group in each rack instead (`rehearsal_ranks`); the hero plays 22 (11 racks of EP64).
MAX_REHEARSED_RANKS = 64


def rehearsal_ranks(world: int, ep_size: int, racks: int = 1) -> list[int]:
    """The ranks part (c) plays: the first and last rank of each EP group (so of each rack: a rack is a whole
    number of EP groups), which includes the loop's 0, ep-1, ep and world-1; above MAX_REHEARSED_RANKS, the edges
    of each rack and of the first and last EP group in each rack. A divergence planted on a rank it does not
    play is not seen: a rank inside an EP group runs the same program as its edges unless the code branches on
    the rank itself."""
    if world <= 1:
        return [0]
    groups = [(g, g + ep_size - 1) for g in range(0, world, ep_size)]
    if 2 * len(groups) > MAX_REHEARSED_RANKS:
        per = world // max(1, racks)
        groups = [e for k in range(0, world, per) for e in ((k, k + ep_size - 1), (k + per - ep_size, k + per - 1))]
    return sorted({r for g in groups for r in g})


def _rank_in_fresh_process(args: tuple) -> dict:
    fn, *rest = args
    return fn(*rest)


def rehearse(spec: RunSpec, world: int, ep_size: int, work_dir, host_backend: bool = False,
             rank_fn=None, workers: int | None = None, **narrow) -> dict:
    """Part (c): the ranks of `rehearsal_ranks` (each in a fresh process, `workers` at a time; default the
    cores, at most 4) through `rank_fn` (default `rehearse_rank`), their collective sequences compared pair by
    pair and their host reads bounded; `ok` false with `error` naming the call that fails (a GPU would fail or
    hang there too)."""
    rank_fn = rank_fn or rehearse_rank
    t0 = time.perf_counter()
    small, subs = rehearsal_spec(spec, world, **narrow)
    ranks = rehearsal_ranks(world, ep_size, spec.train.effective().replica_groups)
    rows, error = [], None
    jobs = [(rank_fn, small, world, ep_size, r, Path(work_dir) / f"rehearse{r}", host_backend) for r in ranks]
    n = max(1, min(workers or min(4, os.cpu_count() or 1), len(jobs)))
    # one process per rank (maxtasksperchild=1): nothing torch keeps across process groups leaks between ranks
    with mp.get_context("spawn").Pool(n, maxtasksperchild=1) as pool:
        pending = [pool.apply_async(_rank_in_fresh_process, (j,)) for j in jobs]
        for p in pending:
            try:
                rows.append(p.get())
            except RehearsalError as e:
                error = error or str(e)
    if error is None:
        error = compare_ranks(rows) or host_read_budget(rows, small.model.n_layers)
    return {"world": world, "ep_size": ep_size, "ranks": ranks, "rows": rows, "ok": error is None, "error": error,
            "stand_ins": subs, "offload": spec.train.offload, "precision": small.train.precision,
            "mixed_precision": small.train.mixed_precision, "d_model": small.model.d_model,
            "n_layers": small.model.n_layers, "seconds": time.perf_counter() - t0}


def format_rehearsal(rep: dict) -> str:
    layout = (f"world {rep['world']} = {rep['world'] // rep['ep_size']} x EP {rep['ep_size']}, process group serving "
              "the accelerator only" if rep["world"] > 1
              else f"one process (virtual EP {rep['ep_size']}, no process group)")
    head = (f"dry run (c): one training step + checkpoint save at {layout}, accelerator 'meta' standing in for cuda, "
            f"host 'cpu'; offload={rep['offload']}, precision {rep['precision']}, mixed precision "
            f"{rep['mixed_precision']}, d_model {rep['d_model']}, {rep['n_layers']} layers")
    out = [head] + [f"  stand-in: {s}" for s in rep["stand_ins"]]
    for r in rep["rows"]:
        out.append(f"  rank {r['rank']:>5}: {r['experts_per_rank']} experts, parameters on {r['param_device']}, "
                   f"{r['steps']} step(s) (seq_len, sequences: {', '.join(map(str, r['stages']))}), "
                   f"{sum(r['collectives'].values())} collectives, "
                   f"{sum(r['host_reads'].values()) / max(1, r['steps']):.1f} host reads per step "
                   f"(budget {host_reads_allowed(rep['n_layers'])}), {r['seconds']:.1f} s")
        first = rep["rows"][0]
        if r is first or r["host_reads"] != first["host_reads"]:  # the same call sites on every rank: listed once
            out += [f"    host read stood in: {site} (x{n})" for site, n in sorted(r["host_reads"].items())]
        if r is first or r["checkpoint"] != first["checkpoint"]:
            out.append(f"    checkpoint: {r['checkpoint']}")
    out.append(f"  PASS: forward, backward, clip_grad_norm_, optimizer step, checkpoint save; the collective sequences "
               f"of the {len(rep['rows'])} rank(s) agree, pair by pair" if rep["ok"] else f"  FAIL: {rep['error']}")
    out.append(f"  took {rep['seconds']:.1f} s")
    return "\n".join(out)
