"""`plan STUDY --dry-run [--dry-run.gpus G]` for a GPU study: every rung at G GPUs per run (default: its own
count), in the layout `planning.layout.choose_layout` picks (EP group, virtual shards, micro-batches), through
the dry run's three parts (planning/dryrun.py, planning/rehearsal.py), then one line per rung: layout, memory
predicted and measured against the capacity, and wall time per run at the study's assumed MFU."""

from __future__ import annotations

import json
import tempfile
from typing import Any

from marin_ablate.marin.config import Recipe
from marin_ablate.marin.train.stages import stage_specs
from marin_ablate.planning.dryrun import dry_run, format_loop, format_report, loop_dry_run
from marin_ablate.planning.layout import accumulation_rows, choose_layout, wall_factor, with_layout
from marin_ablate.planning.rehearsal import format_rehearsal, rehearse


def rung_specs(study: Any, overrides=()) -> dict[str, Any]:
    """One run of each rung, with the command line's overrides: the recipe's arm (all switches on) where the
    design has it, else the rung's first run (`run` lays out every arm on its own: planning.layout)."""
    out: dict[str, Any] = {}
    for spec, meta in study.runs():
        rung = meta.get("rung")
        if rung not in out or (spec.recipe == Recipe() and out[rung].recipe != Recipe()):
            out[rung] = spec
    return {r: s.with_overrides(overrides) for r, s in out.items()}


def dry_run_parts(spec: Any, gpus: int, ep: int, dr: Any, quiet: bool,
                  extra: tuple = ()) -> tuple[dict, dict, list[dict]]:
    """The dry run's three parts for one spec (`dr`: the --dry-run options), parts (c) and (a) printed as they
    finish unless `quiet`: (c) first, since the step on an accelerator that is not the host fails where a GPU
    would; (a) raises naming what breaks; (b) at every context stage's shape (its seq_len and sequences per
    step). Returns (rehearsal, loop, one memory report per context stage)."""
    with tempfile.TemporaryDirectory(prefix="marin-dryrun-") as work:
        reh = rehearse(spec, gpus, ep, work)
        if not quiet:
            print(format_rehearsal(reh) + "\n", flush=True)
        loop = loop_dry_run(spec, gpus, ep, work)
    if not quiet:
        print(format_loop(loop) + "\n", flush=True)
    reps = []
    for stage, at, _ in stage_specs(spec):
        rep = dry_run(at, gpus, ep, capacity_gib=dr.capacity_gib, reserve_gib=dr.reserve_gib, extra=extra)
        rep["stage"] = {"from_step": stage.start_step, "seq_len": stage.seq_len, "batch_size": stage.batch_size}
        reps.append(rep)
    return reh, loop, reps


def format_stages(reps: list[dict]) -> str:
    """The memory reports of `dry_run_parts`, each headed by its context stage where there are several."""
    out = []
    for rep in reps:
        st = rep["stage"]
        if len(reps) > 1:
            out.append(f"context stage from step {st['from_step']:,}: seq_len {st['seq_len']:,}, "
                       f"{st['batch_size']:,} sequences per step")
        out.append(format_report(rep) + "\n")
    return "\n".join(out)


def dry_run_rungs(study: Any, args: Any) -> int:
    dr = args.dry_run
    hours = {r["name"]: r.get("gpu_hours_per_run") for r in study.describe().get("rungs", [])}
    own = {r.name: r.gpus for r in study.rungs}
    rows, reports, ok = [], {}, True
    for rung, spec in rung_specs(study, args.overrides).items():
        gpus = dr.gpus or own.get(rung) or 1
        head = f"== rung {rung} on {gpus} GPU(s) of {dr.capacity_gib:g} GiB"
        try:
            lay = choose_layout(spec, gpus, dr.capacity_gib, dr.reserve_gib)
        except ValueError as e:
            ok = False
            rows.append({"rung": rung, "gpus": gpus, "error": str(e)})
            if not args.json:
                print(f"{head}: DOES NOT FIT: {e}\n", flush=True)
            continue
        sk = with_layout(spec, lay)
        ep = dr.ep or (lay["ep_group"] if gpus > 1 else spec.model.ep_shards)
        if not args.json:
            print(f"{head}: EP group {lay['ep_group']} x {lay['virtual_shards']} virtual shard(s) per GPU, "
                  f"{lay['micro_batches']} micro-batch(es) of {lay['sequences_per_micro_batch']} sequences", flush=True)
            if lay.get("headroom_note"):
                print(f"  headroom: {lay['headroom_note']}", flush=True)
        reh, loop, reps = dry_run_parts(sk, gpus, ep, dr, args.json,
                                        accumulation_rows(spec, lay["sequences_per_gpu"], lay["micro_batches"]))
        if not args.json:
            print(format_stages(reps), flush=True)
        worst = max(t["total"] for rep in reps for t in rep["tables"].values()) / 2**30
        h = hours.get(rung)
        wall = h / gpus * wall_factor(spec, lay["micro_batches"]) if h else None
        fits = all(rep["ok"] for rep in reps)
        ok = ok and fits and reh["ok"]
        rows.append({"rung": rung, **lay, "measured_gib": worst, "fits": fits, "rehearsal_ok": reh["ok"],
                     "wall_hours_per_run": wall})
        reports[rung] = {"rehearsal": reh, "loop": loop, **reps[0], "stages": reps}
    if args.json:
        print(json.dumps({"layouts": rows, "rungs": reports}, indent=1, default=str))
    else:
        print(format_layouts(rows, dr.capacity_gib))
    return 0 if ok else 1


def format_layouts(rows: list[dict], capacity_gib: float) -> str:
    out = [f"per-rung layouts (GPU memory {capacity_gib:g} GiB; wall time at the study's assumed MFU, the routing "
           "pass of accumulated steps included)",
           f"  {'rung':6} {'GPUs':>4} {'EP x virtual':>12} {'micro-batches':>15} {'predicted':>10} {'dry run':>9} "
           f"{'fits':>5} {'wall h/run':>10}"]
    for r in rows:
        if "error" in r:
            out.append(f"  {r['rung']:6} {r['gpus']:>4}  DOES NOT FIT: {r['error']}")
            continue
        wall = f"{r['wall_hours_per_run']:.1f}" if r.get("wall_hours_per_run") else "-"
        out.append(f"  {r['rung']:6} {r['gpus']:>4} {r['ep_group']:>5} x {r['virtual_shards']:<4} "
                   f"{r['micro_batches']:>5} x {r['sequences_per_micro_batch']:<7} {r['predicted_gib']:>8.1f}G "
                   f"{r['measured_gib']:>7.1f}G {'yes' if r['fits'] and r['rehearsal_ok'] else 'NO':>5} {wall:>10}")
    out += [f"  {r['rung']}: {r['headroom_note']}" for r in rows if r.get("headroom_note")]
    return "\n".join(out)


def dry_run_study(study: Any, args: Any) -> int:
    """`plan STUDY --dry-run` (`args`: the plan's options): a GPU study's rungs (`dry_run_rungs`), else the first run
    through the dry run's three parts at the study's (or --dry-run.gpus) GPUs; exit 1 when a part fails."""
    spec = study.runs()[0][0].with_overrides(args.overrides)
    hero, dr = getattr(study, "hero", None), args.dry_run
    if hero is None and spec.train.device.startswith("cuda"):
        return dry_run_rungs(study, args)
    if hero is not None and not dr.gpus:
        hero.check(spec)  # the layout the time model and the sbatch are planned for
    gpus = dr.gpus or (hero.gpus if hero is not None else study.rungs[0].gpus or 1)
    reh, loop, reps = dry_run_parts(spec, gpus, dr.ep or spec.model.ep_shards, dr, args.json)
    print(json.dumps({"rehearsal": reh, "loop": loop, **reps[0], "stages": reps}, indent=1, default=str)
          if args.json else format_stages(reps))
    return 0 if reh["ok"] and all(r["ok"] for r in reps) else 1
