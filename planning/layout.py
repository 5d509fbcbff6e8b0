"""A rung on fewer GPUs than its own count: the EP group, virtual shards and micro-batches that fit, from the dry
run's memory model (docs/architecture.md §5, "Fewer GPUs than EP shards" and "Choosing the layout"). The drops,
routing statistics and update stay those of the rung's own layout (marin/train/accum.py): only memory and time
change. The activation peak is linear in sequences (1.43 and 2.86 GiB at 1 and 2 at d512), so one measurement
at one sequence serves every micro-batch size. No torch import until used."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Callable

from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.schema import atomic_write_json, read_json
from marin_ablate.planning.costmodel import cache_dir

GiB = 2**30
LEVELS = ("hyperball", "adamw")  # a study's arms use both; the layout must fit the larger
#: The free fraction of the GPU a layout keeps (the dry run's wanted headroom, planning/dryrun.py): room for what
#: the model cannot see (compiled graphs' buffers, NCCL, fragmentation over a long run). Below it, down to
#: MIN_HEADROOM, only when no micro-batching reaches it, and the layout then says why (`headroom_note`).
HEADROOM, MIN_HEADROOM = 0.10, 0.05
#: Memory-table lines that are no tensor of torch's allocator (planning/dryrun.py GpuAllowances)
NOT_TENSORS = ("NCCL", "CUDA context", "allocator fragmentation")


def ep_layout(spec: RunSpec, gpus: int) -> tuple[int, int]:
    """(EP group size, virtual shards per GPU) of `spec` on `gpus` GPUs (1: one process, every shard virtual)."""
    from marin_ablate.marin.train.distributed import ep_group_size

    n = spec.model.ep_shards
    if gpus == 1:
        return 1, n
    if gpus % n and n % gpus:
        raise ValueError(f"{gpus} GPUs per run for ModelConfig.ep_shards={n}: each GPU holds whole EP shards; "
                         f"allowed values: divisors of {n} or multiples of {n}")
    ep = ep_group_size(n, gpus)
    return ep, n // ep if ep < n else 1


def accumulation_rows(spec: RunSpec, rows: int, k: int) -> tuple[dict, ...]:
    """What gradient accumulation keeps for the whole step beyond one micro-batch's forward + backward, per
    GPU of `rows` sequences in `k` micro-batches: the routing pass's residual streams of every micro-batch
    (input and attention output of the layer being routed), the step's routing pins (expert ids, kept flags)
    and the QB statistics of the step: the hist estimator's histogram (each micro-batch bins its margins in the
    step's range, marin.moe.RoutePin.margin_ext), the topk estimator's margins of the other micro-batches."""
    if k == 1:
        return ()
    m = spec.model
    g = m.moe_geometry(spec.recipe)
    tokens = rows * m.seq_len
    out = [{"line": f"accumulation: residual streams of {k} micro-batches (routing pass, fp32)",
            "bytes": 2 * tokens * m.d_model * 4},
           {"line": "accumulation: the step's routing pins (expert ids int64 + kept flags)",
            "bytes": tokens * g.top_k * 9 * m.n_layers}]
    if spec.recipe.router_balance == "quantile" and m.qb_estimator == "hist":  # binned as they come
        out.append({"line": "accumulation: QB margin histograms of the step (float64 counts)",
                    "bytes": g.n_experts * m.qb_hist_bins * 8 * m.n_layers})
    elif spec.recipe.router_balance == "quantile":  # topk: the step's margins, read at the update
        out.append({"line": f"accumulation: QB margins of the step's other {k - 1} micro-batches (fp32)",
                    "bytes": (tokens - tokens // k) * g.n_experts * 4 * m.n_layers})
    return tuple(out)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_layout(spec: RunSpec, gpus: int, capacity_gib: float, reserve_gib: float = 0.0,
                  headroom: float = HEADROOM, act1: dict | None = None, min_headroom: float = MIN_HEADROOM) -> dict:
    """The layout of `spec` on `gpus` GPUs of `capacity_gib`: EP group, virtual shards, and the fewest
    micro-batches whose per-GPU memory (every optimizer level of LEVELS) leaves `headroom` of the capacity
    free; when even one sequence per micro-batch does not, the one that leaves the most, if that is at least
    `min_headroom`, with `headroom_note` saying why (what more micro-batches cannot shrink). Raises ValueError
    naming the numbers when nothing leaves `min_headroom`."""
    from marin_ablate.planning.dryrun import GpuAllowances, current_sharding, memory_table, rank_state

    ep, virtual = ep_layout(spec, gpus)
    B = spec.train.batch_size
    if B % gpus:
        raise ValueError(f"TrainConfig.batch_size={B} does not split over {gpus} GPUs; allowed values: divisors of {B}")
    rows = B // gpus
    sharding = current_sharding(spec)
    state = rank_state(spec, gpus, ep if gpus > 1 else spec.model.ep_shards, 0, sharding)
    act1 = act1 or cached_activations(spec)  # the peak at one sequence; linear in sequences
    head = min(headroom, min_headroom)
    budget, floor = ((capacity_gib - reserve_gib) * (1 - h) * GiB for h in (headroom, head))
    gpu = GpuAllowances() if spec.train.device.startswith("cuda") else None
    tried = []
    for m in sorted(divisors(rows), reverse=True):  # the largest micro-batch first: the fewest passes
        k = rows // m
        sk = dataclasses.replace(spec, train=dataclasses.replace(spec.train, micro_batches=k))
        act = {**act1, "recompute": spec.train.activation_checkpoint == "block",
               **{f: act1[f] * m for f in ("base", "per_local", "per_global", "peak")}}
        st = {**state, "ep_size": 1 if gpus == 1 else ep, "tokens_per_rank": m * spec.model.seq_len}
        accum = accumulation_rows(spec, rows, k)
        tables = {lv: memory_table(sk, st, gpus, act, sharding, lv, gpu, accum) for lv in LEVELS}
        totals = {lv: sum(r["bytes"] for r in t) for lv, t in tables.items()}
        worst_level = max(totals, key=totals.get)
        tried.append((m, k, totals[worst_level], worst_level, tables[worst_level], accum))
        if totals[worst_level] <= budget:
            break
    m, k, worst, level, table, accum = tried[-1]
    note = None
    if worst > budget and worst <= floor:
        fixed = sum(r["bytes"] for r in accum)
        free = 1 - (worst / GiB + reserve_gib) / capacity_gib
        note = (f"{free:.1%} of the GPU free, under the wanted {headroom:.0%}: even one sequence per micro-batch "
                f"needs {worst / GiB:.1f} GiB; more micro-batches cannot shrink the training state or what "
                f"accumulation keeps for the step ({fixed / GiB:.1f} GiB, the routing pass's residual streams above "
                f"all); a second GPU per run, or one with more memory, keeps {headroom:.0%}")
    elif worst > budget:
        need = math.ceil(gpus * worst / budget)
        raise ValueError(f"{spec.model.d_model}-wide model, batch {B} on {gpus} GPU(s) of {capacity_gib:g} GiB: even "
                         f"{m} sequence per micro-batch ({rows} micro-batches) needs {worst / GiB:.1f} GiB per GPU, "
                         f"over {floor / GiB:.1f} GiB ({1 - head:.0%} of the capacity less {reserve_gib:g} GiB "
                         f"reserve); allowed: more GPUs per run (about {need} or more), or GPUs with more memory")
    # what torch's allocator sees (max_memory_allocated): the lines that are tensors
    tensors = sum(r["bytes"] for r in table if not r["line"].startswith(NOT_TENSORS))
    return {"gpus": gpus, "ep_group": ep, "virtual_shards": virtual, "micro_batches": k,
            "sequences_per_micro_batch": m, "sequences_per_gpu": rows, "predicted_gib": worst / GiB,
            "predicted_tensor_gib": tensors / GiB, "level": level, "capacity_gib": capacity_gib,
            "headroom": headroom, "free": 1 - (worst / GiB + reserve_gib) / capacity_gib, "headroom_note": note,
            "activation_gib_per_sequence": act1["peak"] / GiB}


def layout_cache_key(spec: RunSpec, gpus: int, capacity_gib: float) -> str:
    return hashlib.sha256(json.dumps([spec.identity_json(), gpus, capacity_gib, HEADROOM, MIN_HEADROOM]).encode()
                          ).hexdigest()[:16]


def _cached(path: Path, compute: Callable[[], dict]) -> dict:
    """compute()'s JSON, kept at `path` (written atomically)."""
    got = read_json(path)
    if got is None:
        got = compute()
        atomic_write_json(path, got)
    return got


def activation_key(spec: RunSpec) -> str:
    """What `cached_activations` keys its measurement by: the spec's identity (micro-batches aside)."""
    return hashlib.sha256(spec.identity_json().encode()).hexdigest()[:16]


def cached_activations(spec: RunSpec) -> dict:
    """planning.memory.fit_activations at one sequence, kept under MARIN_CACHE_DIR: a CPU measurement of the
    spec (~40 s a rung on 2 cores), the same on whatever machine asks for it."""
    from marin_ablate.planning.memory import fit_activations

    return _cached(cache_dir("layouts") / f"act1-{activation_key(spec)}.json", lambda: fit_activations(spec, 1))


def cached_layout(spec: RunSpec, gpus: int, capacity_gib: float) -> dict:
    """`choose_layout`, kept under MARIN_CACHE_DIR (the fake-tensor measurement takes ~40 s a rung): `plan
    --dry-run` and `run` choose the same micro-batches for the same spec, GPU count and capacity."""
    return _cached(cache_dir("layouts") / f"{layout_cache_key(spec, gpus, capacity_gib)}.json",
                   lambda: choose_layout(spec, gpus, capacity_gib))


def with_layout(spec: RunSpec, layout: dict) -> RunSpec:
    """The spec trained in `layout`: its micro-batches set (not in the run id: the same run)."""
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, micro_batches=layout["micro_batches"]))


def wall_factor(spec: RunSpec, micro_batches: int) -> float:
    """Compute of an accumulated step over a one-batch step: the routing pass is one more no-grad forward
    (a step is 3 forward-equivalents, 4 with block recompute)."""
    if micro_batches == 1:
        return 1.0
    units = 4.0 if spec.train.activation_checkpoint == "block" else 3.0
    return (units + 1.0) / units
