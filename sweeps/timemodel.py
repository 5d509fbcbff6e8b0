"""The hero's time model (`plan hero`): FLOPs per step with the optimizer, bytes per rank per step on
each link for the rack-local layout, a step-time and days range under stated assumptions, and the
checkpoint cadence against the job's time limit (docs/hero.md).

Layout (Marin's mesh (replica_dcn, data, expert)): a group is one NVL72 rack of G = ep_size ranks;
non-expert parameters are FSDP-sharded inside the group and replicated over the R groups; each rank
holds its EP slice of the experts, replicated over groups; only the gradient reduction crosses racks.
Newton-Schulz runs once per matrix per group, on an owner rank (round-robin by size): each rank sends
its shard of a matrix to the owner and receives the update back.
Assumptions are fields of `Assumptions`; every number printed follows from them and the config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from marin.config import RunSpec

GB = 1e9


@dataclass(frozen=True)
class Assumptions:
    """What the time model does not measure. efficiency: achieved fraction of peak bf16 FLOP/s of
    the model's and Newton-Schulz's matmul work (Marin measured 21.8% MFU end to end on the hero,
    ~241k tok/s per rack; the H200 notes measure the fused MoE block at ~35% of peak). NVLink 5:
    900 GB/s per direction per GPU; inter-rack: one 400 Gb/s NIC per GPU (50 GB/s), at the stated
    fraction of line rate. exposed: the fraction of the cross-rack gradient reduction not hidden
    behind the backward; the in-rack collectives of FSDP overlap with compute except `fsdp_exposed`."""

    peak_flops: float = 2.5e15
    efficiency: tuple[float, float] = (0.22, 0.30)
    nvlink_gbps: float = 900.0
    nvlink_fraction: tuple[float, float] = (0.5, 0.8)
    net_gbps: float = 50.0
    net_fraction: tuple[float, float] = (0.6, 0.9)
    exposed: tuple[float, float] = (0.0, 1.0)
    fsdp_exposed: tuple[float, float] = (0.0, 0.3)
    offload_c2c_gbps: float = 450.0  # NVLink-C2C Grace <-> Blackwell, per direction per GPU (900 GB/s shared)


#: The layout Marin measured: 11 racks as 11 replicas, 11,264 sequences of 4,096 tokens per step.
MARIN_LAYOUT = {"racks": 11, "replica_groups": 11, "tokens_per_step": 11_264 * 4096}
#: Marin's measured throughput of the hero (GB200, 11 racks x EP64), which the time model's range must
#: contain (tests/sweeps/test_hero_memory.py). Marin's MFU counts its own analytic FLOPs per token.
MARIN_MEASURED: dict[str, dict[str, float]] = {
    # the production run, pooled-wave transport: 21.8% MFU, ~241k tok/s per rack, 78.6 days
    "hero, pooled-wave": {"mfu": 0.218, "tokens_per_s_per_rack": 241e3, "days": 78.6},
    # the ragged transport's head-to-head restore of the live hero (marin-community/marin
    # experiments/grug/moe_hero_ep/README.md "Why this recipe", PR 8549): 22.87% vs 22.71% MFU
    "hero, ragged (restore)": {"mfu": 0.2287},
}


def _ns_flops(m: int, n: int, steps: int) -> float:
    """One Newton-Schulz quintic on an m x n matrix: X Xᵀ (2m²n), b A + c A² (2m³), the update (2m²n)."""
    m, n = min(m, n), max(m, n)
    return steps * (4 * m * m * n + 2 * m ** 3)


def optimizer_work(spec: RunSpec, level: str = "hyperball") -> dict:
    """Newton-Schulz FLOPs over every matrix the level orthogonalizes (one copy of the model), and the
    fp32 elements of those matrices (non-expert and expert), from the meta-device model's shapes."""
    import torch

    from marin.model import MarinModel
    from marin.optim import group_kinds

    kinds = group_kinds(level)
    with torch.device("meta"):
        model = MarinModel(spec.model, spec.recipe)
    roles = model.param_roles()
    flops = {"matrix": 0.0, "expert": 0.0}
    elems = {"matrix": 0, "expert": 0}
    for name, p in model.named_parameters():
        role = roles[name]
        if kinds[role] not in ("muonh", "muon") or role not in flops:
            continue
        if p.dim() == 3:  # an expert stack: one matrix per expert
            flops[role] += p.shape[0] * _ns_flops(p.shape[1], p.shape[2], spec.train.ns_steps)
        else:
            flops[role] += _ns_flops(p.shape[0], p.shape[-1], spec.train.ns_steps)
        elems[role] += p.numel()
    return {"ns_flops": flops, "ns_elems": elems}


def collectives(spec: RunSpec, plan, opt: dict) -> list[dict]:
    """Every collective of a step for the configured `TrainConfig.replica_groups` r: bytes per rank per
    step, the link it runs on ("rack": NVLink; "network": a group that spans racks runs at the
    network's rate, a ring through the racks passing every rank's bytes over its slowest link) and its
    kind (what overlaps it: `Assumptions`). The shard group is world/r ranks: r = racks keeps FSDP
    inside a rack and sends only the gradient reduction across; r = 1 shards over the world."""
    from marin.flops import params_routed, params_total

    m, t = spec.model, spec.train.effective()
    W, G, R, ep = plan.gpus, plan.ep_size, plan.ep_groups, plan.ep_size
    r = t.replica_groups
    S = W // r  # ranks one copy of the model is sharded over
    d = S // ep  # ranks of the shard group holding the same EP slice (FSDP shards the slice over them)
    shard_link = "network" if S > G else "rack"
    n_routed = params_routed(m, spec.recipe)
    n_dense = params_total(m, spec.recipe) - n_routed
    pb = 2 if t.mixed_precision == "bf16" else 4  # FSDP2 gathers in the compute dtype
    g = m.moe_geometry(spec.recipe)
    cap = m.capacity_factor(spec.recipe) or 1.0
    tokens_rank = t.batch_size * m.seq_len // W
    passes = 3 if t.activation_checkpoint == "block" else 2  # forward, recomputed forward, backward
    f = lambda n: (n - 1) / n  # noqa: E731 - the fraction of a gathered/reduced buffer a rank exchanges
    rows = [
        (f"FSDP all-gather of {'bf16' if pb == 2 else 'fp32'} non-expert parameters over {S} ranks (forward + backward)",
         2 * f(S) * n_dense * pb, shard_link, "fsdp"),
        (f"FSDP reduce-scatter of fp32 non-expert gradients over {S} ranks", f(S) * n_dense * 4, shard_link, "fsdp"),
    ]
    if d > 1:  # the EP slice FSDP-sharded over d ranks, one per EP group
        rows += [(f"FSDP all-gather of the EP slice's experts over {d} ranks (forward + backward)",
                  2 * f(d) * n_routed / ep * pb, shard_link, "fsdp"),
                 (f"FSDP reduce-scatter of the EP slice's fp32 expert gradients over {d} ranks",
                  f(d) * n_routed / ep * 4, shard_link, "fsdp")]
    rows.append((f"EP all-to-all (dispatch + combine, {passes} passes, capacity {cap:g})",
                 2 * passes * f(ep) * tokens_rank * g.top_k * cap * g.width * 2 * m.n_layers, "rack", "ep"))
    rows.append(("Newton-Schulz to owners and back (fp32)",
                 2 * 4 * (f(S) * opt["ns_elems"]["matrix"] / S + f(d) * opt["ns_elems"]["expert"] / S),
                 shard_link, "ns"))
    if r > 1:  # HSDP: the rank's gradient shard all-reduced over the r replicas (a ring)
        rows.append((f"gradient all-reduce of the rank's shard over {r} replicas (fp32, ring)",
                     2 * f(r) * 4 * (n_dense + n_routed) / S, "network" if R > 1 else "rack", "grad"))
    return [{"name": n, "bytes": b, "link": k, "kind": kind} for n, b, k, kind in rows if b > 0]


def time_model(spec: RunSpec, plan, a: Assumptions = Assumptions(), level: str = "hyperball",
               job_limit_s: float | None = None) -> dict:
    """FLOPs, bytes per link and a step-time range for `spec` laid out as `plan` (a HeroPlan) with the
    spec's own `TrainConfig.replica_groups`."""
    from marin.ep import check_replicas
    from marin.flops import flops_per_token, params_total

    check_replicas(spec.train.replica_groups, plan.ep_size, plan.gpus)  # any layout that tiles, for comparison
    m, t = spec.model, spec.train.effective()
    G, R = plan.ep_size, plan.ep_groups
    S = plan.gpus // t.replica_groups
    tokens_step = t.batch_size * m.seq_len
    tokens_rank = tokens_step // plan.gpus
    model_flops_rank = flops_per_token(m, spec.recipe) * tokens_rank
    opt = optimizer_work(spec, level)
    # each matrix once per shard group (a rack under HSDP): the group's S ranks split the non-expert
    # matrices by owner and the EP slices' experts among themselves; every replica does its own
    ns_rank = (opt["ns_flops"]["matrix"] + opt["ns_flops"]["expert"]) / S
    colls = collectives(spec, plan, opt)
    inside = {c["name"]: c["bytes"] for c in colls if c["link"] == "rack"}
    across = {c["name"]: c["bytes"] for c in colls if c["link"] == "network"}
    n_all = params_total(m, spec.recipe)
    shard_bytes = 4 * n_all / S  # one rank's fp32 gradient shard (non-expert + its experts)
    lo_hi = []
    for i in (1, 0):  # fast end: high efficiency, fast links, little exposed
        exposure = {"ep": 1.0, "ns": 1.0, "fsdp": a.fsdp_exposed[1 - i], "grad": a.exposed[1 - i]}
        bw = {"rack": a.nvlink_gbps * GB * a.nvlink_fraction[i], "network": a.net_gbps * GB * a.net_fraction[i]}
        compute = (model_flops_rank + ns_rank) / (a.peak_flops * a.efficiency[i])
        lo_hi.append(compute + sum(c["bytes"] * exposure[c["kind"]] / bw[c["link"]] for c in colls))
    days = tuple(s * t.steps / 86400 for s in lo_hi)
    out = {"tokens_per_step": tokens_step, "tokens_per_rank": tokens_rank, "replica_groups": t.replica_groups,
           "shard_group": S, "shard_group_racks": max(1, S // G), "racks": R,
           "model_flops_per_rank": model_flops_rank, "ns_flops_per_rank": ns_rank,
           "ns_flops_per_group": opt["ns_flops"]["matrix"] + opt["ns_flops"]["expert"] * 1.0,
           "ns_flops_if_every_rank": opt["ns_flops"]["matrix"] + opt["ns_flops"]["expert"] / G,
           "collectives": colls, "bytes_inside_rack": inside, "bytes_across_racks": across,
           "grad_shard_bytes": shard_bytes,
           "step_s": tuple(lo_hi), "days": days,
           "tokens_per_s_per_rack": tuple(tokens_step / R / s for s in reversed(lo_hi)),
           "mfu": tuple(model_flops_rank / s / a.peak_flops for s in reversed(lo_hi)),
           "assumptions": asdict(a)}
    if t.offload == "cpu":  # fp32 shard to the host and back, gradients down, once per step over C2C
        out["offload_s"] = 3 * shard_bytes / (a.offload_c2c_gbps * GB)
        out["step_s"] = tuple(s + out["offload_s"] for s in out["step_s"])
        out["days"] = tuple(s * t.steps / 86400 for s in out["step_s"])
    out["offload_cost_s"] = 3 * shard_bytes / (a.offload_c2c_gbps * GB)
    out["checkpoint"] = checkpoint_cadence(t, out["step_s"], job_limit_s)
    return out


def checkpoint_cadence(t, step_s: tuple[float, float], job_limit_s: float | None) -> dict:
    """Seconds between checkpoints (checkpoint_every steps, or the wall-clock interval when shorter) at
    both ends of the step-time range; `fits` when the longest gap is shorter than the job's time limit."""
    by_steps = tuple(t.checkpoint_every * s for s in step_s) if t.checkpoint_every else (float("inf"),) * 2
    gap = tuple(min(b, t.checkpoint_interval_s or float("inf")) for b in by_steps)
    return {"by_steps_s": by_steps, "interval_s": t.checkpoint_interval_s, "max_gap_s": max(gap),
            "job_limit_s": job_limit_s, "fits": job_limit_s is None or max(gap) < job_limit_s}


def format_time_model(tm: dict) -> str:
    a = tm["assumptions"]
    r, S = tm["replica_groups"], tm["shard_group"]
    lines = [f"time model (per rank per step; {tm['tokens_per_rank']:,} tokens per rank, {tm['tokens_per_step']:,} per step):",
             f"  layout: TrainConfig.replica_groups={r}: one copy of the model sharded over {S} ranks ("
             + ("inside one rack" if tm["shard_group_racks"] == 1 else f"spanning {tm['shard_group_racks']} racks")
             + (f"), replicated over {r} groups" if r > 1 else ")"),
             (f"  model FLOPs {tm['model_flops_per_rank'] / 1e15:.2f} PFLOP; optimizer (Newton-Schulz, each matrix once "
              f"per group) {tm['ns_flops_per_rank'] / 1e12:.1f} TFLOP ({tm['ns_flops_per_rank'] / tm['model_flops_per_rank']:.2%}"
              f" of the model's; {tm['ns_flops_if_every_rank'] / 1e12:.0f} TFLOP if every rank ran every non-expert matrix)"),
             "  bytes inside the rack (NVLink):"]
    lines += [f"    {k}: {v / GB:.1f} GB" for k, v in tm["bytes_inside_rack"].items()]
    lines.append("  bytes across racks (network):")
    lines += [f"    {k}: {v / GB:.1f} GB" for k, v in tm["bytes_across_racks"].items()]
    lines.append(f"    (the rank's fp32 gradient shard: {tm['grad_shard_bytes'] / GB:.1f} GB)")
    lo, hi = tm["step_s"]
    lines.append(f"  step {lo:.1f}-{hi:.1f} s -> {tm['days'][0]:.1f}-{tm['days'][1]:.1f} days, "
                 f"{tm['tokens_per_s_per_rack'][0] / 1e3:.0f}k-{tm['tokens_per_s_per_rack'][1] / 1e3:.0f}k tok/s per rack, "
                 f"MFU {tm['mfu'][0]:.1%}-{tm['mfu'][1]:.1%}")
    if all(tm[k] == v for k, v in MARIN_LAYOUT.items()):  # Marin's layout: its measurements apply
        fmt = {"mfu": lambda v: f"{v:.1%} MFU", "tokens_per_s_per_rack": lambda v: f"{v / 1e3:.0f}k tok/s per rack",
               "days": lambda v: f"{v:.1f} days"}
        for name, point in MARIN_MEASURED.items():
            inside = all(tm[k][0] <= v <= tm[k][1] for k, v in point.items())
            lines.append(f"  Marin measured ({name}): " + ", ".join(fmt[k](v) for k, v in point.items())
                         + (": inside the range" if inside else ": OUTSIDE the range"))
    lines.append(f"  assumptions: matmul efficiency {a['efficiency'][0]:.0%}-{a['efficiency'][1]:.0%} of "
                 f"{a['peak_flops'] / 1e15:.1f} PFLOP/s; NVLink {a['nvlink_gbps']:.0f} GB/s x "
                 f"{a['nvlink_fraction'][0]:.0%}-{a['nvlink_fraction'][1]:.0%}, EP and Newton-Schulz traffic exposed, "
                 f"FSDP {a['fsdp_exposed'][0]:.0%}-{a['fsdp_exposed'][1]:.0%} exposed; network {a['net_gbps']:.0f} GB/s x "
                 f"{a['net_fraction'][0]:.0%}-{a['net_fraction'][1]:.0%}, {a['exposed'][0]:.0%}-{a['exposed'][1]:.0%} exposed")
    lines.append(f"  offload (TrainConfig.offload='cpu'): +{tm['offload_cost_s']:.2f} s per step over NVLink-C2C "
                 f"({a['offload_c2c_gbps']:.0f} GB/s)" + (" (included above)" if "offload_s" in tm else " (not configured)"))
    c = tm["checkpoint"]
    lines.append(f"  checkpoints: every {c['by_steps_s'][0] / 3600:.1f}-{c['by_steps_s'][1] / 3600:.1f} h of steps"
                 + (f", a temporary one every {c['interval_s'] / 3600:.1f} h" if c["interval_s"] else "")
                 + (f"; longest gap {c['max_gap_s'] / 3600:.1f} h "
                    + ("<" if c["fits"] else ">=") + f" the job limit {c['job_limit_s'] / 3600:.1f} h" if c["job_limit_s"] else ""))
    return "\n".join(lines)
