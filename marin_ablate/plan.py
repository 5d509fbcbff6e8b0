"""`marin-ablate plan STUDY [--json]`: a study's design, alias table, runs, cost and time, the runs
made before the design, and per rung the tokens needed against the corpus (a hero study: its time
model and sbatch); `--dry-run` rehearses the first run on CPU and `--precision` states the expected
precision of the multipliers instead. `plan --preset P` prints one model preset's resolved config,
parameter and FLOP counts instead of a study's (marin_ablate/describe.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from marin_ablate import options
from marin_ablate.common import (
    ExecConfig,
    StudyOptions,
    arm_key,
    epochs_checked,
    exec_options,
    format_num,
    format_table,
    study_from_args,
)
from marin_ablate.marin.config import PRESETS
from marin_ablate.marin.fields import option


@dataclass(frozen=True)
class DryRunOptions:
    """On CPU, for the first run: (a) the training loop at the full world size through a fake process group
    (first, last and EP-edge ranks, narrowed width, 2 steps + eval); (b) one rank's memory at full width (fake
    tensors); (c) one step + checkpoint save with the accelerator and the host as different devices
    (planning/rehearsal.py); exit 1 naming the lines over budget or the call that fails."""

    gpus: int | None = option(None, lo=1, help="GPUs per run (none: the study's); a GPU study's rungs on fewer GPUs "
                                              "than their own take virtual EP shards and micro-batches that fit")
    ep: int | None = option(None, lo=1, help="EP group size (none: model.ep_shards)")
    capacity_gib: float = option(173.0, lo=0, lo_open=True, help="memory per GPU (GB200: 173 GiB)")
    reserve_gib: float = option(0.0, lo=0, help="kept free per GPU beyond the table's own lines (CUDA context, "
                                                "NCCL, fragmentation)")


@dataclass(frozen=True)
class PrecisionOptions:
    """Each component's expected 95% half-width of ln M at C_ref and 10x C_ref instead of the plan
    (analysis/calibration/precision.py)."""

    noise: str | None = option(None, metavar="PATH", help="a finished noise study or an analysed study (folder or "
                                                          "results file); none: a stated assumption")
    target_halfwidth: float | None = option(None, lo=0, lo_open=True, metavar="H",
                                            help="the cheapest seeds / rungs / fraction whose widest component "
                                                 "half-width at C_ref is <= H (ln scale)")


@dataclass(frozen=True)
class PlanOptions(StudyOptions):
    """Print a study's design, alias table, runs and cost (a hero study: its time model and sbatch), or with
    --preset P a model preset's resolved config, parameter and FLOP counts."""

    command: ClassVar[str] = "plan"
    study: str | None = option(None, positional=True, metavar="STUDY",
                               help="a registered study (`marin-ablate studies`), path/to/file.py:attribute or "
                                    "package.module:attribute; or none with --preset")
    preset: str | None = option(None, metavar="P", help=f"a model preset instead of a STUDY: its resolved config, "
                                                        f"parameter and FLOP counts; one of: {', '.join(PRESETS)}")
    baseline: bool = option(False, help="--preset: start from Recipe.baseline() instead of Recipe()")
    execution: ExecConfig = option(ExecConfig(), inline=True, section=ExecConfig)
    json: bool = option(False, help="machine-readable plan")
    runs: bool = option(False, help="list every run (id, rung, arm, seed)")
    allow_repeat: bool = option(False, help="accept a GPU rung that needs more tokens than its corpus holds "
                                            "(more than one epoch)")
    dry_run: DryRunOptions | None = option(None, section=DryRunOptions, mode=True, help=DryRunOptions.__doc__)
    precision: PrecisionOptions | None = option(None, section=PrecisionOptions, mode=True,
                                                help=PrecisionOptions.__doc__)


def cmd_dry_run(study: Any, args: PlanOptions) -> int:
    from marin_ablate.sweeps.sweep import apply_spec_overrides

    spec = study.runs()[0][0]
    if args.overrides:
        spec = apply_spec_overrides(spec, args.overrides)
    hero = getattr(study, "hero", None)
    dr = args.dry_run
    if hero is None and spec.train.device.startswith("cuda"):
        from marin_ablate.planning.layout_report import dry_run_rungs

        return dry_run_rungs(study, args)
    if hero is not None and not dr.gpus:
        hero.check(spec)  # the layout the time model and the sbatch are planned for
    gpus = dr.gpus or (hero.gpus if hero is not None else study.rungs[0].gpus or 1)
    ep = dr.ep or spec.model.ep_shards
    from marin_ablate.planning.layout_report import dry_run_parts, format_stages

    reh, loop, reps = dry_run_parts(spec, gpus, ep, dr, args.json)
    print(json.dumps({"rehearsal": reh, "loop": loop, **reps[0], "stages": reps}, indent=1, default=str)
          if args.json else format_stages(reps))
    return 0 if reh["ok"] and all(r["ok"] for r in reps) else 1


def cmd_preset(args: PlanOptions) -> int:
    """`plan --preset P`: the preset's resolved config, parameter and FLOP counts (a ladder rung's batch and
    EP shards too); a study's options are refused naming them."""
    from marin_ablate.common import rung_of_preset
    from marin_ablate.describe import DescribeOptions, cmd_describe

    if args.study is not None:
        raise ValueError(f"STUDY {args.study!r} and --preset {args.preset}: plan takes one of them; allowed: "
                         f"`plan {args.study}` or `plan --preset {args.preset}`")
    # the study's options given (flags_of: the non-default ones; [1:] drops the empty STUDY)
    study_only = options.flags_of(replace(args, study="", preset=None, baseline=False, json=False, overrides=()))[1:]
    if study_only:
        raise ValueError(f"--preset {args.preset}: {study_only[0]} is a study's option; allowed with --preset: "
                         "--json, --baseline, --model.F=V, --recipe.F=V")
    bad = [x for x in args.overrides if not x.startswith(("model.", "recipe."))]
    if bad:
        raise ValueError(f"--preset {args.preset}: --{bad[0].split('=', 1)[0]} changes no count of a preset; allowed "
                         "sections: --model.F=V, --recipe.F=V")
    d = DescribeOptions(preset=args.preset, overrides=args.overrides, baseline=args.baseline, json=args.json)
    return cmd_describe(d, rung_of_preset(args.preset))


def cmd_plan(argv: list[str]) -> int:
    args = options.parse(PlanOptions, argv)
    if args.preset is not None:
        return cmd_preset(args)
    if args.study is None:
        raise ValueError("plan needs a STUDY (`marin-ablate studies` lists them) or --preset P (one of: "
                         f"{', '.join(PRESETS)})")
    if args.baseline:
        raise ValueError("--baseline starts a --preset from Recipe.baseline(); a study names its arms; allowed: "
                         "--preset P --baseline")
    study = study_from_args(args)
    if args.dry_run is not None:
        return cmd_dry_run(study, args)
    if args.precision is not None:
        from marin_ablate.analysis.calibration.precision import plan_precision

        pr = args.precision
        print(plan_precision(study, pr.noise, pr.target_halfwidth, args.json, pinned=_cached_law(study)))
        return 0
    from marin_ablate.sweeps.executors import get_executor
    from marin_ablate.sweeps.progress import rung_prior
    from marin_ablate.sweeps.sweep import analysis_refusal, check_layouts, check_specs, planned_runs, study_resources

    d = study.describe()
    opts = exec_options(args.execution, study)
    planned = planned_runs(study, args.out, overrides=args.overrides)  # the runs, ids and specs `run` makes
    runs = [(r.spec, r.meta) for r in planned]
    run_rows = [{"run_id": s.run_id, **{k: m[k] for k in ("rung", "arm", "seed", "design_row")}} for s, m in runs]
    prior = rung_prior(d["rungs"])  # the time prior: the rungs as the study defines them
    if args.overrides:
        _rungs_as_overridden(d, runs, study)
    d["epochs"] = epochs_checked(study, runs, d["rungs"], args.allow_repeat)
    check_specs(planned, opts.executor)  # what `train` and `run` refuse, plan refuses too (before costing them)
    d["analysis_refusal"] = analysis_refusal(planned)  # what `run` refuses as a table `analyze` would refuse
    slots = get_executor(opts.executor).slots(opts)
    d["execution"] = {"executor": opts.executor, "workers": slots}
    d["time"] = _time_estimate(planned, prior, slots, opts.threads)
    check_layouts(planned, opts, study_resources(study))
    d["before_design"] = _before_design(study, args.out)
    if "hero" in d:
        from marin_ablate.planning.hero import HeroSlurm, checkpoint_plan, render_sbatch

        hs = HeroSlurm()
        d["hero"]["checkpoint"] = checkpoint_plan(runs[0][0], study.hero.gpus, hs.preemption_window_s)
        d["hero"]["sbatch_script"] = render_sbatch(study.hero, hs)
        from marin_ablate.planning.timemodel import time_model
        from marin_ablate.sweeps.sweep import apply_spec_overrides

        spec = apply_spec_overrides(runs[0][0], args.overrides) if args.overrides else runs[0][0]
        study.hero.check(spec)  # a --model.F=V override may change the layout the plan is for
        tm = d["hero"]["time_model"] = time_model(spec, study.hero, job_limit_s=hs.time_min(study.hero) * 60)
        d["hero"]["jobs_of_time_limit"] = math.ceil(tm["days_point"] * 1440 / hs.time_min(study.hero))
        if not tm["checkpoint"]["fits"]:
            raise ValueError(f"TrainConfig.checkpoint_interval_s={runs[0][0].train.checkpoint_interval_s}: the longest "
                             f"gap between checkpoints ({tm['checkpoint']['max_gap_s'] / 3600:.1f} h) is not shorter "
                             f"than the job's time limit ({hs.time_min(study.hero)} min); "
                             f"allowed values: 0 < seconds < {hs.time_min(study.hero) * 60}")
    if args.json:
        d = dict(d, runs=run_rows) if args.runs else d
        print(json.dumps(d, indent=1, default=str))
        return 0
    des = d["design"]
    print(f"study {d['name']}: {d['description']}")
    print(f"design: {des['kind']}, {des['n_runs']} arms over {len(d['factors'])} factors, "
          f"resolution {des.get('resolution_roman') or des.get('resolution')}")
    if des.get("generators"):
        print(f"generators: {', '.join(des['generators'])}")
    if des.get("defining_relation"):
        rel = list(des["defining_relation"])
        print(f"defining relation: {' = '.join(rel if rel[0] == 'I' else ['I', *rel])}")
    print("\nfactors (letter  name  recipe level / baseline level):")
    for letter, f in zip(des.get("letters", ""), d["factors"], strict=True):
        print(f"  {letter}  {f.get('name')}  {f.get('high', f.get('recipe', ''))} / "
              f"{f.get('low', f.get('baseline', ''))}")
    if d.get("fixed_recipe"):
        print("fixed: " + ", ".join(f"{k}={v}" for k, v in d["fixed_recipe"].items()))
    if d.get("alias_table"):
        print(f"\nalias table (up to order {des.get('alias_max_order', 3)}):")
        shown: set[frozenset] = set()
        for eff, al in d["alias_table"].items():  # an alias group once (AB = CD = EF is one line, not three)
            group = frozenset([eff, *al])
            if al and group in shown:
                continue
            shown.add(group)
            print(f"  {eff} = {' = '.join(al) if al else '(clear)'}")
    print(f"all two-factor interactions estimable: {d.get('all_2fi_estimable')}")
    print(f"\narms ({len(d['arms'])}): {', '.join(d['arms'])}")
    print(arm_key(study))
    print(f"seeds: {d['seeds']}\n\nrungs:")
    cols = [c for c in ("name", "d_model", "n_layers", "params_active", "params_total", "tokens", "steps", "batch_size",
                        "n_runs", "train_flops", "gpus", "gpu_hours", "core_seconds", "timeout_min")
            if any(c in r for r in d["rungs"])]
    print(format_table(d["rungs"], cols))
    if "train_flops" in cols:
        print("(train_flops, gpu_hours, core_seconds: the rung's total over its n_runs runs)")
    print(f"\nruns: {d['n_runs']} ({', '.join(f'{k}: {v}' for k, v in d['n_runs_by_rung'].items())})")
    if d["analysis_refusal"]:
        print(f"refused by `run`: {d['analysis_refusal']}")
    # the assumed seconds (est_*) stay in --json; the time line below is the measured model's
    print("cost: " + ", ".join(f"{k}={format_num(v)}" for k, v in d["cost"].items()
                               if not k.startswith(("est_", "max_par"))))
    for row in d["before_design"]:
        cs = f", ~{row['core_seconds']:.0f} core-s" if row.get("core_seconds") else ""
        at = f": {row['runs']} runs at {row['rungs']}" if row["runs"] else ""
        print(f"before the design: {row['what']}{at}{cs}"
              + (f" (up to {row['max_runs']} when an optimum is on the grid's edge)" if row.get("max_runs") else "")
              + (f"; {row['state']}" if row.get("state") else ""))
    if d.get("published_law"):
        law = d["published_law"]
        print(f"reference law: L∞ = {law['linf']:g} and α = {law['alpha']:g} pinned from {law['source']}")
    ex = d["execution"]
    print(f"execution: {ex['executor']}, " + (f"{ex['workers']} run(s) at once (--workers)" if ex["workers"]
                                              else "runs at once as the scheduler allows"))
    if d["time"]:
        t = d["time"]
        print(f"time: {t['text']}"
              + (f"; {t['completed']} of {d['n_runs']} runs already done" if t["completed"] else ""))
    print("\ndata (tokens one run needs / tokens in data.corpus):")
    print(format_table([{**r, "corpus_tokens": r["corpus_tokens"] if r["corpus_tokens"] is not None else "unknown",
                   "epochs": round(r["epochs"], 3) if r["epochs"] is not None else "-"} for r in d["epochs"]],
                 ["rung", "device", "tokens_needed", "corpus_tokens", "epochs", "corpus"]))
    if d.get("companions"):
        print(f"companion studies: {', '.join(d['companions'])}")
    if args.runs:
        print("\n" + format_table(run_rows, ["run_id", "rung", "arm", "seed", "design_row"]))
    if "hero" in d:
        from marin_ablate.planning.hero import format_checkpoint

        hero = {k: v for k, v in d["hero"].items() if k not in ("checkpoint", "sbatch_script", "layout", "time_model")}
        print("\nhero: " + ", ".join(f"{k}={format_num(v)}" for k, v in hero.items()))
        print("layout: " + ", ".join(f"{k}={format_num(v)}" for k, v in d["hero"]["layout"].items()))
        print(format_checkpoint(d["hero"]["checkpoint"]))
        from marin_ablate.planning.timemodel import format_time_model

        print(format_time_model(d["hero"]["time_model"]))
        print("\nsbatch (what `run hero --executor slurm` would submit; one task per GPU, requeued on USR2):\n")
        print(d["hero"]["sbatch_script"])
    return 0


def _cached_law(study: Any):
    """The PinnedLaw this machine's cache holds for the study's baseline ladder, else None."""
    if not getattr(study, "reference_rungs", ()):
        return None
    from marin_ablate.analysis.fit.reflaw import LAW_FILE, check_pinned
    from marin_ablate.marin.schema import read_json
    from marin_ablate.sweeps.reference import cache_root, reference_key, reference_specs

    key = reference_key(reference_specs(study))
    got = read_json(cache_root() / key / LAW_FILE, strict=True)
    if not got or not got.get("valley"):  # none, or a former fit: `run` refits it
        return None
    return check_pinned(got, str(cache_root() / key / LAW_FILE), key=key)


def _before_design(study: Any, out: str) -> list[dict]:
    """The runs `run` makes before the design (docs/method.md §4.6, §4.1): the LR profile of each
    LR-coupled factor's levels and the baseline ladder that pins the reference law, with their cost."""
    from marin_ablate.sweeps.tuning import profile_cost, profile_skipped, read_profile

    rows = []
    skipped = profile_skipped(study)
    if skipped:
        rows.append({"what": f"no LR profile: {skipped}", "runs": 0, "rungs": "", "core_seconds": 0, "max_runs": 0,
                     "state": "", "n_runs": 0})
    pc = profile_cost(study)
    if pc is not None:
        done = read_profile(out, study.name)
        rows.append({"what": f"LR profile ({', '.join(pc['groups'])}, 5 log-spaced LRs each, at each of "
                             f"{len(pc['seeds'])} seed(s))", "runs": pc["runs"],
                     "rungs": pc["rung"], "core_seconds": pc["core_seconds"], "max_runs": pc["max_runs"],
                     "state": f"done ({done.get('created')})" if done else "", "n_runs": pc["runs"]})
    if getattr(study, "reference_rungs", ()):
        from marin_ablate.ablations.ladders import ladder
        from marin_ablate.sweeps.reference import cache_root, reference_key, reference_specs

        key = reference_key(reference_specs(study))
        cached = (cache_root() / key / "reference_law.json").exists()
        rungs = ladder(study.reference_rungs)
        n_seeds = len(getattr(study, "reference_seeds", (0,)))
        est = [r.est_wall_s() for r in rungs]
        rows.append({"what": f"baseline ladder pinning the reference law "
                             f"({n_seeds} seed(s); once per machine and config)",
                     "runs": len(rungs) * n_seeds, "rungs": f"{rungs[0].name}..{rungs[-1].name}",
                     "core_seconds": n_seeds * sum(est) if all(e is not None for e in est) else None,
                     "state": f"cached ({cache_root() / key})" if cached else ""})
    return rows


def _rungs_as_overridden(d: dict, runs: list, study: Any) -> None:
    """The rung table and FLOP cost of the specs the --SECTION.F=V overrides give (the runs `run` trains)."""
    from marin_ablate.marin.flops import flops_per_token, params_active, params_total
    from marin_ablate.planning.costmodel import spec_flops

    total = 0.0
    for row in d["rungs"]:
        specs = [s for s, m in runs if m["rung"] == row["name"]]
        if not specs:
            continue
        s = specs[0]
        tr = s.train.effective()
        row.update(d_model=s.model.d_model, n_layers=s.model.n_layers, n_heads=s.model.n_heads,
                   seq_len=s.model.seq_len, vocab_size=s.model.vocab_size, steps=tr.steps, batch_size=tr.batch_size,
                   tokens=tr.steps * tr.batch_size * s.model.seq_len,
                   params_active=params_active(s.model, study.base_recipe),
                   params_total=params_total(s.model, study.base_recipe),
                   flops_per_token=flops_per_token(s.model, study.base_recipe),
                   train_flops=sum(spec_flops(x) for x in specs))
        total += row["train_flops"]
    d["cost"]["train_flops"] = total


def _time_estimate(planned: list, prior: tuple[float, float] | None, slots: int | None,
                   threads: int | None = None) -> dict | None:
    """Wall time of the runs not done yet: the cost model of `run` and `run --tune` (`progress.plan_estimate`)."""
    from marin_ablate.marin.schema import read_json
    from marin_ablate.sweeps.progress import plan_estimate

    e = plan_estimate([r.spec for r in planned], prior, slots, threads, [r.dir for r in planned])
    if e is None:
        return None
    done = sum(1 for r in planned if ((read_json(r.dir / "summary.json") or {}).get("status") == "completed"))
    return {"seconds": e.seconds, "lo_90": e.lo, "hi_90": e.hi, "n_measured": e.n_measured, "load": e.load_note,
            "completed": done, "text": e.text()}
