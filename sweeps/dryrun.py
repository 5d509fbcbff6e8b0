"""`plan STUDY --dry-run`: will one rank of a large layout fit its GPU? Measured on CPU, in seconds.

- State: the model is built on the meta device and sharded by `Sharding.apply` (today
  marin.ep.parallelize) inside a fake process group of the full world size (torch's FakeStore), for
  the first and last rank and the edges of the first EP group; each rank's local parameters are counted
  by optimizer group. Gradients and optimizer state follow from them (fp32; one momentum buffer for
  MuonH/Muon, two Adam moments otherwise: marin.optim).
- Activations: one rank's forward + backward at full width under FakeTensorMode and torch's
  MemTracker (torch.distributed._tools.mem_tracker) at 1 and 2 layers, extrapolated linearly to the
  model's depth (per-layer memory is linear in depth), bf16 autocast as on the GPU.
- Transients: the recompute of one block (measured, checkpointing off, minus the kept input), the
  loss chunk's fp32 logits and their gradient, the Newton–Schulz working set of the sharding.
The table is in GB and GiB against the capacity minus a reserve; a line that breaks the budget is
named. Precedent: torchtitan scripts/estimate/estimation.py (fake PG + FakeTensorMode + FSDP tracker).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from marin.config import RunSpec
from marin.optim import group_kinds

GiB, GB = 2**30, 1e9
ONE_BUFFER = ("muonh", "muon")  # one fp32 momentum; every other kind keeps Adam's two moments


@dataclass(frozen=True)
class Sharding:
    """How a rank holds the model: `apply(model, groups)` shards it in place (one call, so a better
    sharding drops in); `ns_whole_group` says whether Newton–Schulz stacks a whole parameter group
    (else one whole matrix at a time)."""

    name: str
    apply: Callable
    ns_whole_group: bool


def current_sharding() -> Sharding:
    from marin import ep

    return Sharding("ep.parallelize(dp='none'): experts over EP, the rest replicated",
                    lambda m, g: ep.parallelize(m, g, dp="none"), ns_whole_group=True)


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def rank_state(spec: RunSpec, world: int, ep_size: int, rank: int, sharding: Sharding) -> dict:
    """Local parameter elements by role, experts per rank, the largest whole matrix (elements), for
    `rank` of a `world`-rank fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from marin import ep
    from marin.model import MarinModel

    if dist.is_initialized():
        raise RuntimeError("the dry run needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        groups = ep.build_ep_groups(ep_size)
        with torch.device("meta"):
            model = MarinModel(spec.model, spec.recipe)
        roles = model.param_roles()
        biggest = max(p.numel() if roles[n] != "expert" else p[0].numel() for n, p in model.named_parameters())
        model = sharding.apply(model, groups) or model
        by_role: dict[str, int] = {}
        for n, p in model.named_parameters():
            by_role[roles[n]] = by_role.get(roles[n], 0) + _local(p).numel()
        experts = [_local(m.w_up_EWH).shape[0] for _, m in ep.moe_layers(model)]
        return {"rank": rank, "dp_rank": rank // ep_size, "ep_rank": rank % ep_size, "by_role": by_role,
                "experts_per_rank": experts[0], "largest_matrix": biggest}
    finally:
        dist.destroy_process_group()


def measure_activations(spec: RunSpec, layers: int, seqs: int, checkpoint: str) -> float:
    """Peak bytes of activations + temporaries of one rank's forward + backward at full width and
    `layers` layers (parameters and gradients are not counted: the state lines hold them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from marin.model import MarinModel

    cfg = dataclasses.replace(spec.model, n_layers=layers)
    with torch.device("meta"):
        model = MarinModel(cfg, spec.recipe, activation_checkpoint=checkpoint,
                           loss_chunk_tokens=spec.train.loss_chunk_tokens)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cpu").train()
        tok = torch.zeros(seqs, cfg.seq_len, dtype=torch.long)
        mt = MemTracker()
        mt.track_external(model)
        with mt:
            # no autocast cache: a cached bf16 copy of every weight is a one-process artefact
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                out = model(tok, torch.zeros_like(tok), tok)
            out.loss.backward()
        peak = mt.get_tracker_snapshot("peak")
    dev = next(iter(peak.values()))
    return float(sum(v for k, v in dev.items() if str(k).endswith(("ACT", "TEMP"))))


def memory_table(spec: RunSpec, state: dict, world: int, act: dict, sharding: Sharding, level: str) -> list[dict]:
    """Per-rank memory lines (bytes) for optimizer `level` from the measured state and activations."""
    kinds = group_kinds(level)
    by_role = state["by_role"]
    n = sum(by_role.values())
    rows = [{"line": "parameters (fp32 master)", "bytes": 4 * n},
            {"line": "gradients (fp32)", "bytes": 4 * n}]
    for role, k in sorted(by_role.items()):
        kind = kinds[role]
        rows.append({"line": f"optimizer {kind} [{role}]", "bytes": 4 * k * (1 if kind in ONE_BUFFER else 2)})
    L = spec.model.n_layers
    rows.append({"line": f"activations kept ({L} layers x {act['per_layer'] / GiB:.2f} GiB)",
                 "bytes": act["base"] + L * act["per_layer"]})
    rows.append({"line": "transient: one block recomputed in the backward", "bytes": act["recompute"]})
    ns_groups = [r for r in by_role if kinds[r] in ONE_BUFFER]
    ns_elems = (max((by_role[r] for r in ns_groups), default=0) if sharding.ns_whole_group
                else state["largest_matrix"])
    rows.append({"line": "transient: Newton-Schulz working set " + ("(a whole group stacked)" if sharding.ns_whole_group
                                                                    else "(one whole matrix)"),
                 "bytes": 3 * 4 * ns_elems})
    return rows


def dry_run(spec: RunSpec, world: int, ep_size: int, *, capacity_gib: float, reserve_gib: float,
            levels: tuple[str, ...] = ("hyperball", "adamw"), sharding: Sharding | None = None,
            seqs_per_rank: int | None = None) -> dict:
    """The dry run: per-rank tables for each optimizer level; `ok` false names the lines over budget."""
    t0 = time.perf_counter()
    sharding = sharding or current_sharding()
    if spec.train.batch_size % world:
        raise ValueError(f"TrainConfig.batch_size={spec.train.batch_size} does not split over {world} GPUs; "
                         f"allowed values: multiples of {world}")
    seqs = seqs_per_rank or spec.train.batch_size // world
    ranks = sorted({0, ep_size - 1, min(ep_size, world - 1), world - 1})
    states = [rank_state(spec, world, ep_size, r, sharding) for r in ranks]
    if len({tuple(sorted(s["by_role"].items())) for s in states}) != 1:
        raise RuntimeError(f"ranks {ranks} hold different state: {states}")
    ck = spec.train.activation_checkpoint
    a1, a2 = (measure_activations(spec, n, seqs, ck) for n in (1, 2))
    full1, full2 = (measure_activations(spec, n, seqs, "none") for n in (1, 2))
    act = {"per_layer": a2 - a1, "base": a1 - (a2 - a1),
           "recompute": (full2 - full1) - (a2 - a1) if ck == "block" else 0.0}
    budget = (capacity_gib - reserve_gib) * GiB
    tables = {}
    for level in levels:
        rows = memory_table(spec, states[0], world, act, sharding, level)
        total = sum(r["bytes"] for r in rows)
        over = [r["line"] for r in rows if r["bytes"] > budget]
        tables[level] = {"rows": rows, "total": total, "ok": total <= budget,
                         "over_budget": over or ([f"total ({total / GiB:.1f} GiB)"] if total > budget else [])}
    return {"world": world, "ep_size": ep_size, "ranks": ranks, "sharding": sharding.name,
            "experts_per_rank": states[0]["experts_per_rank"], "sequences_per_rank": seqs,
            "activation_checkpoint": ck, "loss_chunk_tokens": spec.train.loss_chunk_tokens,
            "capacity_gib": capacity_gib, "reserve_gib": reserve_gib, "tables": tables,
            "ok": all(t["ok"] for t in tables.values()), "seconds": time.perf_counter() - t0}


def format_report(rep: dict) -> str:
    budget = rep["capacity_gib"] - rep["reserve_gib"]
    out = [f"dry run: world {rep['world']} = {rep['world'] // rep['ep_size']} x EP {rep['ep_size']}, ranks "
           f"{rep['ranks']}, {rep['experts_per_rank']} experts per rank, {rep['sequences_per_rank']} sequences "
           f"per rank, activation_checkpoint={rep['activation_checkpoint']}, loss_chunk_tokens="
           f"{rep['loss_chunk_tokens']}", f"sharding: {rep['sharding']}"]
    for level, t in rep["tables"].items():
        out.append(f"\n{level}: per-rank memory (budget {budget:.0f} GiB = {rep['capacity_gib']:.0f} GiB capacity "
                   f"- {rep['reserve_gib']:.0f} GiB reserve)")
        w = max(len(r["line"]) for r in t["rows"])
        out.append(f"  {'line'.ljust(w)}  {'GB':>9}  {'GiB':>9}")
        for r in t["rows"] + [{"line": "total", "bytes": t["total"]}]:
            out.append(f"  {r['line'].ljust(w)}  {r['bytes'] / GB:9.1f}  {r['bytes'] / GiB:9.1f}")
        out.append("  fits" if t["ok"] else f"  DOES NOT FIT: over budget: {'; '.join(t['over_budget'])}")
    out.append(f"\ndry run took {rep['seconds']:.1f} s")
    return "\n".join(out)
