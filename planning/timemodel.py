"""The hero's time model (`plan hero`, docs/hero.md "Time"): FLOPs per step with the optimizer, bytes per rank per
step on each link of the rack-local layout (docs/architecture.md §5; Marin's mesh (replica_dcn, data, expert)), a
step-time and days range under stated `Assumptions` (every number printed follows from them and the config), and
the checkpoint cadence against the job's time limit."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from marin_ablate.ablations.study import format_num
from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.ep_layout import check_replicas
from marin_ablate.marin.flops import flops_per_token, params_routed, params_total
from marin_ablate.planning.hero import HeroSlurm, checkpoint_plan, format_checkpoint, render_sbatch

GB = 1e9


@dataclass(frozen=True)
class Assumptions:
    """What the time model does not measure, fixed before any comparison with Marin's measurements
    (tests/sweeps/test_hero_memory.py compares the point estimate against them afterwards).

    efficiency: achieved fraction of peak bf16 FLOP/s of the model's and Newton-Schulz's matmul work,
    (low, point, high). This code's only GPU measurement is an eager d1024 forward + backward on an
    H200 at ~10% MFU (98.5 TFLOP/s of 989, benchmarks/RESULTS.md), host-bound and not the hero's
    compiled path, so it does not carry to the hero; the range is Marin's instead, with that caveat:
    its hero measured 21.8% MFU end to end (communication included, so its matmuls ran at least that
    efficiently), its H200 notes ~35% for the fused MoE block; 0.22-0.30, point 0.26.
    NVLink 5: 900 GB/s per direction per GPU; inter-rack: one 400 Gb/s NIC per GPU (50 GB/s), at the
    stated fraction of line rate (not measured here). exposed: the fraction of the cross-rack
    non-expert gradient all-reduce not hidden behind the backward; FSDP2's in-rack collectives
    overlap with compute except `fsdp_exposed`; the cross-rack expert gathers, reduce-scatters and
    Newton-Schulz exchanges of the ZeRO layout are synchronous (wholly exposed)."""

    peak_flops: float = 2.5e15
    efficiency: tuple[float, float, float] = (0.22, 0.26, 0.30)
    nvlink_gbps: float = 900.0
    nvlink_fraction: tuple[float, float, float] = (0.5, 0.65, 0.8)
    net_gbps: float = 50.0
    net_fraction: tuple[float, float, float] = (0.6, 0.75, 0.9)
    exposed: tuple[float, float, float] = (1.0, 0.5, 0.0)
    fsdp_exposed: tuple[float, float, float] = (0.3, 0.15, 0.0)
    # A requeued job's restart (none of it measured here; (slow, point, fast)): the allocation, launch and
    # process-group setup of 704 ranks, the checkpoint read at `storage_gbps` aggregate (DCP load into the
    # meta-built, materialised model: no random init, marin/train/checkpoint.py), and torch.compile of the
    # blocks (one graph per layer kind). Saves are DCP async: the step loop waits only for the staging to
    # host memory; the write itself at `storage_gbps` must fit the preemption window (planning/hero.py).
    startup_s: tuple[float, float, float] = (300.0, 120.0, 60.0)
    storage_gbps: tuple[float, float, float] = (15.0, 30.0, 60.0)
    compile_s: tuple[float, float, float] = (900.0, 300.0, 120.0)


#: The layout Marin measured: 11 racks as 11 replicas, 11,264 sequences of 4,096 tokens per step.
MARIN_LAYOUT = {"racks": 11, "replica_groups": 11, "tokens_per_step": 11_264 * 4096}
#: Marin's measured throughput of the hero (GB200, 11 racks x EP64), printed beside the model's point
#: estimate; the containment test allows the point estimate +-25% of the 78.6 days.
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

    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.update_rules import group_kinds

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
    kind (what overlaps it: `Assumptions`). The shard group is world/r ranks: r = racks keeps FSDP of
    the non-expert parameters inside a rack; the expert slice, one rank per slice in a rack, is
    ZeRO-sharded across the racks (marin.parallel.ExpertShard: gathered per layer in each forward pass,
    its gradient reduce-scattered, its Newton-Schulz matrices gathered to owners and scattered back)."""
    from marin_ablate.marin.parallel import zero_shards_experts

    m, t = spec.model, spec.train.effective()
    W, G, R, ep = plan.gpus, plan.ep_size, plan.ep_groups, plan.ep_size
    r = t.replica_groups
    S = W // r  # ranks one copy of the non-expert parameters is sharded over
    dp = W // ep  # ranks holding the same EP slice (the world over, every rack)
    d = S // ep  # ... of them inside one shard group
    shard_link = "network" if S > G else "rack"
    n_routed = params_routed(m, spec.recipe)
    n_dense = params_total(m, spec.recipe) - n_routed
    pb = 2 if t.mixed_precision == "bf16" else 4  # gathered in the compute dtype
    g = m.moe_geometry(spec.recipe)
    zero = zero_shards_experts(dp, d, r, g.n_experts // ep, g.width)
    cap = m.capacity_factor(spec.recipe) or 1.0
    tokens_rank = t.batch_size * m.seq_len // W
    passes = 3 if t.activation_checkpoint == "block" else 2  # forward, recomputed forward, backward
    f = lambda n: (n - 1) / n  # noqa: E731 - the fraction of a gathered/reduced buffer a rank exchanges
    slice_elems = n_routed / ep
    rows = [
        (f"FSDP all-gather of {'bf16' if pb == 2 else 'fp32'} non-expert parameters over {S} ranks "
         "(forward + backward)",
         2 * f(S) * n_dense * pb, shard_link, "fsdp"),
        (f"FSDP reduce-scatter of fp32 non-expert gradients over {S} ranks", f(S) * n_dense * 4, shard_link, "fsdp"),
    ]
    if zero:  # ExpertShard over the dp ranks: one gather per forward pass (the recompute gathers again)
        link = "network" if dp * ep > G else "rack"
        gathers = passes - 1
        rows += [(f"expert slice all-gather over {dp} ranks ({'bf16' if pb == 2 else 'fp32'}, {gathers} forward "
                  f"pass{'es' if gathers > 1 else ''})", gathers * f(dp) * slice_elems * pb, link, "zero"),
                 (f"expert slice reduce-scatter of fp32 gradients over {dp} ranks", f(dp) * slice_elems * 4, link,
                  "zero")]
    elif d > 1:  # FSDP2 of the EP slice over the shard group's d ranks
        rows += [(f"FSDP all-gather of the EP slice's experts over {d} ranks (forward + backward)",
                  2 * f(d) * slice_elems * pb, shard_link, "fsdp"),
                 (f"FSDP reduce-scatter of the EP slice's fp32 expert gradients over {d} ranks",
                  f(d) * slice_elems * 4, shard_link, "fsdp")]
    rows.append((f"EP all-to-all (dispatch + combine, {passes} passes, capacity {cap:g})",
                 2 * passes * f(ep) * tokens_rank * g.top_k * cap * g.width * 2 * m.n_layers, "rack", "ep"))
    rows.append(("Newton-Schulz of non-expert matrices to owners and back (fp32)",
                 2 * 4 * f(S) * opt["ns_elems"]["matrix"] / S, shard_link, "ns"))
    e_group = dp if zero else d  # the ranks an expert matrix is split over
    e_link = ("network" if dp * ep > G else "rack") if zero else shard_link
    rows.append((f"Newton-Schulz of expert matrices to owners over {e_group} ranks and back (fp32)",
                 2 * 4 * f(e_group) * opt["ns_elems"]["expert"] / (ep * e_group) if e_group > 1 else 0.0,
                 e_link, "ns"))
    if r > 1:  # HSDP: the rank's non-expert gradient shard (and a replicated expert slice) all-reduced (ring)
        rep = n_dense / S + (0 if zero else slice_elems / max(d, 1))
        rows.append((f"gradient all-reduce of the rank's {'non-expert ' if zero else ''}shard over {r} replicas "
                     "(fp32, ring)", 2 * f(r) * 4 * rep, "network" if R > 1 else "rack", "grad"))
    return [{"name": n, "bytes": b, "link": k, "kind": kind} for n, b, k, kind in rows if b > 0]


def time_model(spec: RunSpec, plan, a: Assumptions = Assumptions(), level: str = "hyperball",
               job_limit_s: float | None = None) -> dict:
    """FLOPs, bytes per link and the step time (a point estimate and its interval) of every context stage
    of `spec` (its own shape and steps; the top-level figures are the first stage's) laid out as `plan`
    (a HeroPlan) with the spec's own `TrainConfig.replica_groups`; the duration sums the stages and the
    restarts of a chain of jobs of `job_limit_s` (each: startup, checkpoint load, compile)."""
    from marin_ablate.marin.train.stages import stage_specs

    parts = [(st, n, _stage_time(at, plan, a, level)) for st, at, n in stage_specs(spec)]
    out = dict(parts[0][2])
    steps_s = [sum(n * tm["steps_s3"][i] for _, n, tm in parts) for i in range(3)]  # (slow, point, fast)
    ck = checkpoint_plan(spec, plan.gpus, 300)["levels"]
    state = ck.get(level, next(iter(ck.values())))["total_bytes"]
    restart_s = [a.startup_s[i] + state / (a.storage_gbps[i] * GB) + a.compile_s[i] for i in range(3)]
    # each job of the chain trains job_limit - restart seconds (the last one fewer): restarts = jobs - 1
    restarts = [max(0, math.ceil(s / max(job_limit_s - r, 1.0)) - 1) if job_limit_s else 0
                for s, r in zip(steps_s, restart_s, strict=True)]
    total = [s + k * r for s, k, r in zip(steps_s, restarts, restart_s, strict=True)]
    t = spec.train.effective()
    out.update({"stages": [{"from_step": st.start_step, "seq_len": st.seq_len, "batch_size": st.batch_size,
                            "steps": n, "q_scale": st.q_scale, "step_point_s": tm["step_point_s"],
                            "step_s": tm["step_s"], "mfu_point": tm["mfu_point"]} for st, n, tm in parts],
                "restart": {"seconds": (restart_s[2], restart_s[1], restart_s[0]), "count": restarts[1],
                            "state_bytes": state, "load_s": state / (a.storage_gbps[1] * GB),
                            "save_s": state / (a.storage_gbps[1] * GB), "days": restarts[1] * restart_s[1] / 86400},
                "days_point": total[1] / 86400, "days": (total[2] / 86400, total[0] / 86400),
                "steps_days_point": steps_s[1] / 86400, "steps": t.steps})
    out.pop("steps_s3")
    out["checkpoint"] = checkpoint_cadence(t, out["step_s"], job_limit_s)
    return out


def _stage_time(spec: RunSpec, plan, a: Assumptions, level: str) -> dict:
    """`time_model`'s figures for one stage's shape (spec.model.seq_len, batch_size), per step."""
    from marin_ablate.marin.train.distributed import check_no_host_update

    check_no_host_update(spec.train)
    check_replicas(spec.train.replica_groups, plan.ep_size, plan.gpus)  # any layout that tiles, for comparison
    m, t = spec.model, spec.train.effective()
    G, R = plan.ep_size, plan.ep_groups
    S = plan.gpus // t.replica_groups
    tokens_step = t.batch_size * m.seq_len
    tokens_rank = tokens_step // plan.gpus
    model_flops_rank = flops_per_token(m, spec.recipe) * tokens_rank
    opt = optimizer_work(spec, level)
    # each matrix once per group of ranks that splits it: the non-expert ones per shard group (a rack
    # under HSDP), the expert ones once in the world (ZeRO across racks) or per shard group
    ns_rank = (opt["ns_flops"]["matrix"] + opt["ns_flops"]["expert"] * t.replica_groups) / plan.gpus
    colls = collectives(spec, plan, opt)
    inside = {c["name"]: c["bytes"] for c in colls if c["link"] == "rack"}
    across = {c["name"]: c["bytes"] for c in colls if c["link"] == "network"}
    n_all = params_total(m, spec.recipe)
    steps = []
    for i in range(3):  # (slow end, point, fast end)
        exposure = {"ep": 1.0, "ns": 1.0, "zero": 1.0, "fsdp": a.fsdp_exposed[i], "grad": a.exposed[i]}
        bw = {"rack": a.nvlink_gbps * GB * a.nvlink_fraction[i], "network": a.net_gbps * GB * a.net_fraction[i]}
        compute = (model_flops_rank + ns_rank) / (a.peak_flops * a.efficiency[i])
        steps.append(compute + sum(c["bytes"] * exposure[c["kind"]] / bw[c["link"]] for c in colls))
    hi, point, lo = steps
    step_s = (lo, hi)
    n_steps = t.steps
    return {"tokens_per_step": tokens_step, "tokens_per_rank": tokens_rank, "replica_groups": t.replica_groups,
            "shard_group": S, "shard_group_racks": max(1, S // G), "racks": R,
            "model_flops_per_rank": model_flops_rank, "ns_flops_per_rank": ns_rank,
            "ns_flops_if_every_rank": opt["ns_flops"]["matrix"] + opt["ns_flops"]["expert"] / G,
            "collectives": colls, "bytes_inside_rack": inside, "bytes_across_racks": across,
            "params_total": n_all,
            "step_point_s": point, "step_s": step_s, "steps_s3": steps,
            "days_point": point * n_steps / 86400, "days": tuple(s * n_steps / 86400 for s in step_s),
            "tokens_per_s_per_rack": tuple(tokens_step / R / s for s in (hi, lo)),
            "mfu": tuple(model_flops_rank / s / a.peak_flops for s in (hi, lo)),
            "mfu_point": model_flops_rank / point / a.peak_flops,
            "assumptions": asdict(a)}


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
    lines = [f"time model (per rank per step; {tm['tokens_per_rank']:,} tokens per rank, "
             f"{tm['tokens_per_step']:,} per step):",
             f"  layout: TrainConfig.replica_groups={r}: non-expert parameters sharded over {S} ranks ("
             + ("inside one rack" if tm["shard_group_racks"] == 1 else f"spanning {tm['shard_group_racks']} racks")
             + (f"), replicated over {r} groups" if r > 1 else ")"),
             (f"  model FLOPs {tm['model_flops_per_rank'] / 1e15:.2f} PFLOP; optimizer (Newton-Schulz, each matrix "
              f"once per group that splits it) {tm['ns_flops_per_rank'] / 1e12:.1f} TFLOP "
              f"({tm['ns_flops_per_rank'] / tm['model_flops_per_rank']:.2%}"
              f" of the model's; {tm['ns_flops_if_every_rank'] / 1e12:.0f} TFLOP if every rank ran every "
              "non-expert matrix)"),
             "  bytes per rank per step inside the rack (NVLink), per collective:"]
    lines += [f"    {k}: {v / GB:.1f} GB" for k, v in tm["bytes_inside_rack"].items()]
    lines.append("  bytes per rank per step across racks (network), per collective:")
    lines += [f"    {k}: {v / GB:.1f} GB" for k, v in tm["bytes_across_racks"].items()] or ["    none"]
    if tm["bytes_across_racks"]:
        lines.append(f"    total {sum(tm['bytes_across_racks'].values()) / GB:.1f} GB")
    lo, hi = tm["step_s"]
    unit, per = ("days", 1.0) if tm["days_point"] >= 1 else ("hours", 24.0)
    lines.append(f"  duration: {tm['days_point'] * per:.1f} {unit} (interval {tm['days'][0] * per:.1f}-"
                 f"{tm['days'][1] * per:.1f}); step "
                 f"{tm['step_point_s']:.1f} s ({lo:.1f}-{hi:.1f}), MFU {tm['mfu_point']:.1%} "
                 f"({tm['mfu'][0]:.1%}-{tm['mfu'][1]:.1%}), {tm['tokens_per_s_per_rack'][0] / 1e3:.0f}k-"
                 f"{tm['tokens_per_s_per_rack'][1] / 1e3:.0f}k tok/s per rack")
    if len(tm.get("stages", ())) > 1:
        lines.append("  context stages (each at its own shape: attention FLOPs grow with the length):")
        lines += [f"    from step {s['from_step']:,}: seq_len {s['seq_len']:,}, {s['batch_size']:,} sequences, "
                  f"{s['steps']:,} steps of {s['step_point_s']:.1f} s ({s['step_s'][0]:.1f}-{s['step_s'][1]:.1f}), "
                  f"MFU {s['mfu_point']:.1%}, q multiplier x{s['q_scale']:.3f}" for s in tm["stages"]]
    if "restart" in tm:
        rs, gbps = tm["restart"], a["storage_gbps"][1]
        lines.append(f"  restarts: {rs['count']} requeues of the job chain, each {rs['seconds'][1] / 60:.0f} min "
                     f"({rs['seconds'][0] / 60:.0f}-{rs['seconds'][2] / 60:.0f}: startup, the checkpoint's "
                     f"{rs['state_bytes'] / 1e12:.1f} TB read in {rs['load_s']:.0f} s at {gbps:.0f} GB/s, "
                     f"compile {a['compile_s'][1]:.0f} s; no random init), {rs['days'] * 24:.0f} h in all; a save "
                     f"is assumed to write in {rs['save_s']:.0f} s at {gbps:.0f} GB/s (async: staged "
                     "to host memory first)")
    e = a["efficiency"]
    lines.append(f"  efficiency {e[1]:.0%} ({e[0]:.0%}-{e[2]:.0%}) of {a['peak_flops'] / 1e15:.1f} PFLOP/s is Marin's, "
                 "not measured here: this code's only GPU number is an eager d1024 forward + backward at ~10% MFU "
                 "on one H200 (benchmarks/RESULTS.md), host-bound and not the hero's compiled path")
    lines.append(f"  links (assumed): NVLink {a['nvlink_gbps']:.0f} GB/s x {a['nvlink_fraction'][1]:.0%} "
                 f"({a['nvlink_fraction'][0]:.0%}-{a['nvlink_fraction'][2]:.0%}); network {a['net_gbps']:.0f} GB/s x "
                 f"{a['net_fraction'][1]:.0%} ({a['net_fraction'][0]:.0%}-{a['net_fraction'][2]:.0%}); "
                 f"EP, Newton-Schulz and the expert ZeRO collectives exposed; FSDP {a['fsdp_exposed'][1]:.0%} "
                 "and the non-expert "
                 f"cross-rack all-reduce {a['exposed'][1]:.0%} exposed; no host transfer (nothing is offloaded)")
    if all(tm[k] == v for k, v in MARIN_LAYOUT.items()):  # Marin's layout: its measurements apply
        for name, point in MARIN_MEASURED.items():
            parts = [f"{v:.1%} MFU" if k == "mfu" else f"{v / 1e3:.0f}k tok/s per rack" if k == "tokens_per_s_per_rack"
                     else f"{v:.1f} days ({tm['days_point'] / v - 1:+.0%} from it)" for k, v in point.items()]
            lines.append(f"  Marin measured ({name}): " + ", ".join(parts))
    c = tm["checkpoint"]
    lines.append(f"  checkpoints: every {c['by_steps_s'][0] / 3600:.1f}-{c['by_steps_s'][1] / 3600:.1f} h of steps"
                 + (f", a temporary one every {c['interval_s'] / 3600:.1f} h" if c["interval_s"] else "")
                 + (f"; longest gap {c['max_gap_s'] / 3600:.1f} h "
                    + ("<" if c["fits"] else ">=") + f" the job limit {c['job_limit_s'] / 3600:.1f} h"
                    if c["job_limit_s"] else ""))
    return "\n".join(lines)


def hero_plan(h: dict, plan: object, spec: RunSpec) -> None:
    """`plan hero`: the study's hero record `h` (`HeroPlan.describe`) with its checkpoint plan, sbatch and time model
    for the first run's `spec` (the command line's overrides applied), refused when a checkpoint gap outlasts a job."""
    hs = HeroSlurm()
    h["checkpoint"] = checkpoint_plan(spec, plan.gpus, hs.preemption_window_s)
    h["sbatch_script"] = render_sbatch(plan, hs)
    plan.check(spec)  # a --model.F=V override may change the layout the plan is for
    tm = h["time_model"] = time_model(spec, plan, job_limit_s=hs.time_min(plan) * 60)
    h["jobs_of_time_limit"] = math.ceil(tm["days_point"] * 1440 / hs.time_min(plan))
    if not tm["checkpoint"]["fits"]:
        raise ValueError(f"TrainConfig.checkpoint_interval_s={spec.train.checkpoint_interval_s}: the longest gap "
                         f"between checkpoints ({tm['checkpoint']['max_gap_s'] / 3600:.1f} h) is not shorter than the "
                         f"job's time limit ({hs.time_min(plan)} min); allowed values: 0 < seconds < "
                         f"{hs.time_min(plan) * 60}")


def hero_lines(h: dict) -> list[str]:
    """`plan hero`'s text of the record `hero_plan` completed."""
    return ["\nhero: " + ", ".join(f"{k}={format_num(v)}" for k, v in h.items()
                                   if k not in ("checkpoint", "sbatch_script", "layout", "time_model")),
            "layout: " + ", ".join(f"{k}={format_num(v)}" for k, v in h["layout"].items()),
            format_checkpoint(h["checkpoint"]), format_time_model(h["time_model"]),
            "\nsbatch (what `run hero --executor slurm` would submit; one task per GPU, requeued on USR2):\n",
            h["sbatch_script"]]
