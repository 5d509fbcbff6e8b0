"""`marin-ablate describe | plan | run | status | tune` (sweeps/cli.py dispatches here).

    marin-ablate describe --preset NAME [--json]  resolved config, parameter and FLOP counts

    marin-ablate plan STUDY [--json]          design, alias table, runs, cost (hero: its sbatch)
    marin-ablate run STUDY [--executor local|debug|slurm] [--out DIR] [--workers N] [slurm options]
    marin-ablate status STUDY [--out DIR] [--json]
    marin-ablate tune STUDY [--points 5] [--span 4] [--storage PATH|URL]

`plan` imports no torch. A bad option raises ValueError (cli.py prints one line and exits 2)
before anything is written or submitted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

DEFAULT_OUT = "runs"


# ---------------------------------------------------------------------------------------------
# describe: marin.commands does the arithmetic; the ladder rung of a preset is looked up here
# ---------------------------------------------------------------------------------------------


def describe_args(p: argparse.ArgumentParser) -> None:
    from marin.commands import describe_args as model_describe_args

    model_describe_args(p)


def rung_of_preset(preset_name: str) -> dict | None:
    """The batch, EP shards, token budget and overrides of the ladder rung named like the preset, else None."""
    from ablations.ladders import RUNGS

    rung = RUNGS.get(preset_name)
    if rung is None or rung.preset != preset_name:
        return None
    # what the rung trains beyond the preset (the GPU rungs: flex attention, triton kernels, compile)
    over = {**{f"model.{k}": v for k, v in dict(rung.model_overrides).items()},
            **{f"train.{k}": v for k, v in dict(rung.train_overrides).items()}}
    return {"ep_shards": rung.model().ep_shards, "batch_sequences": rung.batch_size,
            "tokens_per_step": rung.tokens_per_step, "steps": rung.steps(), "tokens": rung.tokens(),
            "replica_groups": rung.train_config().replica_groups,
            "rung_overrides": " ".join(f"{k}={v}" for k, v in over.items()) or "(none)"}


def cmd_describe(args: argparse.Namespace) -> int:
    from marin.commands import cmd_describe as print_describe

    return print_describe(args, rung_of_preset(args.preset))


# ---------------------------------------------------------------------------------------------
# Shared arguments
# ---------------------------------------------------------------------------------------------


def _study_args(p: argparse.ArgumentParser) -> None:
    from ablations.studies import STUDIES

    p.add_argument("study", metavar="STUDY", help=f"a registered study ({', '.join(STUDIES)}), "
                   "path/to/file.py:attribute or package.module:attribute (a Study or a function returning one)")
    p.add_argument("--rungs", default=None, help="comma-separated rungs (default: the study's)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the study's)")


def _out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output root; runs go to OUT/STUDY/runs/RUN_ID (default {DEFAULT_OUT})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a field of every run's spec (model., train., data., recipe.); changes run ids")


def _exec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("execution")
    g.add_argument("--executor", default=None, help="local, debug or slurm (default: the study's, else local)")
    g.add_argument("--workers", type=int, default=None, help="local: parallel worker processes (default: study's max_parallel, else 2)")
    g.add_argument("--threads", type=int, default=None, help="local/debug: torch threads per worker (default cpus // workers)")
    g.add_argument("--retry-failed", action="store_true", help="run failed runs again (their old summary is kept aside)")
    g.add_argument("--no-wait", action="store_true", help="submit and return (slurm)")
    s = p.add_argument_group("slurm")
    s.add_argument("--partition", default=None)
    s.add_argument("--account", default=None)
    s.add_argument("--qos", default=None)
    s.add_argument("--time-min", type=int, default=None, help="time limit per run in minutes (default: per rung)")
    s.add_argument("--gpus-per-run", type=int, default=None, help="GPUs per run, one task each (default: per rung)")
    s.add_argument("--cpus-per-task", type=int, default=None)
    s.add_argument("--mem-gb", type=float, default=None, help="memory per run")
    s.add_argument("--array-parallelism", type=int, default=None, help="array tasks running at once (default: study's)")
    s.add_argument("--constraint", default=None)
    s.add_argument("--exclude", default=None)
    s.add_argument("--setup", action="append", default=[], metavar="LINE", help="shell line before srun (repeatable)")
    s.add_argument("--signal-delay-s", type=int, default=90, help="USR2 this long before the time limit (checkpoint, requeue)")


def _csv(v: str | None, cast: Any = str) -> list | None:
    if v is None:
        return None
    try:
        return [cast(x.strip()) for x in v.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"cannot parse {v!r} as a comma-separated list of {cast.__name__}") from None


def _study(args: argparse.Namespace) -> Any:
    from sweeps.sweep import resolve_study

    return resolve_study(args.study, _csv(args.rungs), _csv(args.seeds, int))


def _exec_options(args: argparse.Namespace, study: Any):
    from sweeps.executors import EXECUTORS, ExecOptions, SlurmOptions

    ex = dict(getattr(study, "executor", ()) or ())
    executor = args.executor or ex.get("executor") or "local"
    if executor not in EXECUTORS:
        raise ValueError(f"--executor={executor!r} is not known; allowed values: {', '.join(EXECUTORS)}")
    slurm = SlurmOptions(
        partition=args.partition, account=args.account, qos=args.qos, time_min=args.time_min,
        gpus_per_run=args.gpus_per_run, cpus_per_task=args.cpus_per_task, mem_gb=args.mem_gb,
        array_parallelism=args.array_parallelism or ex.get("slurm_array_parallelism"),
        signal_delay_s=args.signal_delay_s, constraint=args.constraint, exclude=args.exclude,
        setup=tuple(args.setup))
    workers = args.workers if args.workers is not None else int(ex.get("max_parallel", 2))
    return ExecOptions(executor=executor, workers=workers,
                       threads=args.threads, retry_failed=args.retry_failed, wait=not args.no_wait, slurm=slurm)


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------


def plan_args(parser: argparse.ArgumentParser) -> None:
    _study_args(parser)
    _out_args(parser)
    _exec_args(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable plan")
    parser.add_argument("--runs", action="store_true", help="list every run (id, rung, arm, seed)")
    parser.add_argument("--dry-run", action="store_true",
                        help="on CPU, for the first run: (a) the training loop at the full world size through a "
                             "fake process group (first, last and EP-edge ranks, narrowed width, 2 steps + eval); "
                             "(b) one rank's memory at full width (fake tensors); (c) one step + checkpoint save with "
                             "the accelerator and the host as different devices (sweeps/rehearsal.py); exit 1 naming "
                             "the lines over budget or the call that fails")
    parser.add_argument("--gpus", type=int, default=None, help="dry run: world size (default: the study's)")
    parser.add_argument("--ep", type=int, default=None, help="dry run: EP group size (default: model.ep_shards)")
    parser.add_argument("--capacity-gib", type=float, default=173.0, help="dry run: memory per GPU (GB200: 173 GiB)")
    parser.add_argument("--reserve-gib", type=float, default=0.0,
                        help="dry run: kept free per GPU beyond the table's own lines (CUDA context, NCCL, fragmentation)")
    pr = parser.add_argument_group("precision (analysis/precision.py)")
    pr.add_argument("--precision", action="store_true",
                    help="print each component's expected 95%% half-width of ln M at C_ref and 10x C_ref instead of the plan")
    pr.add_argument("--noise", default=None, metavar="PATH",
                    help="precision: a finished noise study or an analysed study (folder or results file); default: a stated assumption")
    pr.add_argument("--target-halfwidth", type=float, default=None, metavar="H",
                    help="precision: the cheapest seeds / rungs / fraction whose widest component half-width at C_ref is <= H (ln scale)")
    _data_args(parser)


def _data_args(p: argparse.ArgumentParser) -> None:
    if not any("--set" in a.option_strings for a in p._actions):
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override a field of every run's spec, e.g. data.corpus=DIR (a prepared corpus)")
    p.add_argument("--allow-repeat", action="store_true",
                   help="accept a GPU rung that needs more tokens than its corpus holds (more than one epoch)")


def _log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-to", default=None, metavar="SINKS",
                   help="wandb,tensorboard: every run's metrics, grouped by study, tagged with arm, rung and levels")
    p.add_argument("--keep-checkpoints", choices=("none", "final", "all"), default=None,
                   help="what a completed run keeps: none (default on CPU), final (its newest checkpoint; default "
                        "on GPU) or all; an unfinished run always keeps what it resumes from")


def _set_log_to(args: argparse.Namespace) -> None:
    from sweeps.tracking import KEEP_ENV, LOG_TO_ENV, parse_log_to

    if args.keep_checkpoints is not None:  # inherited like the sinks
        os.environ[KEEP_ENV] = args.keep_checkpoints
    if args.log_to is not None:  # the worker processes inherit it (sweeps/tracking.py)
        from marin.train.metrics import check_log_to

        names = parse_log_to(args.log_to)
        check_log_to(names)  # before any run is launched: a missing backend would fail every run
        os.environ[LOG_TO_ENV] = ",".join(names)


def epochs_checked(study: Any, rung_rows: list[dict], overrides: list[str], allow_repeat: bool) -> list[dict]:
    """Per rung: tokens needed, tokens in the corpus, epochs; ValueError when a GPU rung's data
    would be the embedded corpus or would repeat without --allow-repeat (ablations/epochs.py)."""
    from ablations.epochs import check_epochs, study_epoch_rows
    from sweeps.sweep import apply_spec_overrides

    runs = study.runs()
    if overrides:
        runs = [(apply_spec_overrides(sp, overrides), m) for sp, m in runs]
    rows = study_epoch_rows(rung_rows, runs)
    check_epochs(rows, allow_repeat)
    from marin.data.mixture import check_mixture_domains
    for data in {sp.data for sp, _ in runs}:  # a mixture names the corpus's domains (before any run)
        check_mixture_domains(data)
    return rows


def _fmt_num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def _table(rows: list[dict], cols: list[str]) -> str:
    cells = [["-" if r.get(c) is None and c in r else _fmt_num(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _arm_key(study: Any) -> str:
    """What an arm code such as `+-+` says: one sign per factor, in the design's order."""
    levels = ", ".join(f"{f.name} (+ {f.level(1)}, - {f.level(-1)})" for f in study.factors)
    return f"arm codes: one sign per factor in this order: {levels}; all_on / all_off: every factor + / -"


def cmd_dry_run(study: Any, args: argparse.Namespace) -> int:
    from sweeps.dryrun import dry_run, format_report
    from sweeps.sweep import apply_spec_overrides

    spec = study.runs()[0][0]
    if args.overrides:
        spec = apply_spec_overrides(spec, args.overrides)
    hero = getattr(study, "hero", None)
    if hero is not None and not args.gpus:
        hero.check(spec)  # the layout the time model and the sbatch are planned for
    gpus = args.gpus or (hero.gpus if hero is not None else study.rungs[0].gpus or 1)
    ep = args.ep or spec.model.ep_shards
    import tempfile

    from sweeps.dryrun import format_loop, loop_dry_run
    from sweeps.rehearsal import format_rehearsal, rehearse

    with tempfile.TemporaryDirectory(prefix="marin-dryrun-") as work:
        # (c) first: the step on an accelerator that is not the host fails where a GPU would
        reh = rehearse(spec, gpus, ep, work)
        if not args.json:
            print(format_rehearsal(reh) + "\n", flush=True)
        loop = loop_dry_run(spec, gpus, ep, work)  # raises naming what breaks
    if not args.json:
        print(format_loop(loop) + "\n", flush=True)
    rep = dry_run(spec, gpus, ep, capacity_gib=args.capacity_gib, reserve_gib=args.reserve_gib)
    print(json.dumps({"rehearsal": reh, "loop": loop, **rep}, indent=1, default=str) if args.json
          else format_report(rep))
    return 0 if rep["ok"] and reh["ok"] else 1


def cmd_plan(args: argparse.Namespace) -> int:
    study = _study(args)
    if getattr(args, "dry_run", False):
        return cmd_dry_run(study, args)
    if args.precision or args.noise is not None or args.target_halfwidth is not None:
        from analysis.precision import plan_precision

        print(plan_precision(study, args.noise, args.target_halfwidth, args.json, pinned=_cached_law(study)))
        return 0
    from sweeps.executors import get_executor
    from sweeps.progress import rung_prior
    from sweeps.sweep import check_specs, planned_runs

    d = study.describe()
    opts = _exec_options(args, study)
    planned = planned_runs(study, args.out, overrides=args.overrides)  # the runs, ids and specs `run` makes
    runs = [(r.spec, r.meta) for r in planned]
    run_rows = [{"run_id": s.run_id, **{k: m[k] for k in ("rung", "arm", "seed", "design_row")}} for s, m in runs]
    slots = get_executor(opts.executor).slots(opts)
    d["execution"] = {"executor": opts.executor, "workers": slots}
    # the prior: the rungs as the study defines them
    d["time"] = _time_estimate(planned, rung_prior(d["rungs"]), slots, opts.threads)
    if args.overrides:
        _rungs_as_overridden(d, runs, study)
    d["epochs"] = epochs_checked(study, d["rungs"], args.overrides, args.allow_repeat)
    check_specs(planned, opts.executor)  # what `train` and `run` refuse, plan refuses too
    d["before_design"] = _before_design(study, args.out)
    if "hero" in d:
        from sweeps.hero import HeroSlurm, checkpoint_plan, render_sbatch

        hs = HeroSlurm()
        d["hero"]["checkpoint"] = checkpoint_plan(runs[0][0], study.hero.gpus, hs.preemption_window_s)
        d["hero"]["sbatch_script"] = render_sbatch(study.hero, hs)
        from sweeps.sweep import apply_spec_overrides
        from sweeps.timemodel import time_model

        spec = apply_spec_overrides(runs[0][0], args.overrides) if args.overrides else runs[0][0]
        study.hero.check(spec)  # --set may change the layout the plan is for
        tm = d["hero"]["time_model"] = time_model(spec, study.hero, job_limit_s=hs.time_min(study.hero) * 60)
        d["hero"]["jobs_of_time_limit"] = math.ceil(tm["days_point"] * 1440 / hs.time_min(study.hero))
        if not tm["checkpoint"]["fits"]:
            raise ValueError(f"TrainConfig.checkpoint_interval_s={runs[0][0].train.checkpoint_interval_s}: the longest "
                             f"gap between checkpoints ({tm['checkpoint']['max_gap_s'] / 3600:.1f} h) is not shorter "
                             f"than the job's time limit ({hs.time_min(study.hero)} min); allowed values: 0 < seconds < "
                             f"{hs.time_min(study.hero) * 60}")
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
    for letter, f in zip(des.get("letters", ""), d["factors"]):
        print(f"  {letter}  {f.get('name')}  {f.get('high', f.get('recipe', ''))} / {f.get('low', f.get('baseline', ''))}")
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
    print(_arm_key(study))
    print(f"seeds: {d['seeds']}\n\nrungs:")
    cols = [c for c in ("name", "d_model", "n_layers", "params_active", "params_total", "tokens", "steps", "batch_size",
                        "n_runs", "train_flops", "gpus", "gpu_hours", "core_seconds", "timeout_min") if any(c in r for r in d["rungs"])]
    print(_table(d["rungs"], cols))
    if "train_flops" in cols:
        print("(train_flops, gpu_hours, core_seconds: the rung's total over its n_runs runs)")
    print(f"\nruns: {d['n_runs']} ({', '.join(f'{k}: {v}' for k, v in d['n_runs_by_rung'].items())})")
    # the assumed seconds (est_*) stay in --json; the time line below is the measured model's
    print("cost: " + ", ".join(f"{k}={_fmt_num(v)}" for k, v in d["cost"].items() if not k.startswith(("est_", "max_par"))))
    for row in d["before_design"]:
        cs = f", ~{row['core_seconds']:.0f} core-s" if row.get("core_seconds") else ""
        print(f"before the design: {row['what']}: {row['runs']} runs at {row['rungs']}{cs}"
              + (f" (up to {row['max_runs']} when an optimum is on the grid's edge)" if row.get("max_runs") else "")
              + (f"; {row['state']}" if row.get("state") else ""))
    ex = d["execution"]
    print(f"execution: {ex['executor']}, " + (f"{ex['workers']} run(s) at once (--workers)" if ex["workers"]
                                              else "runs at once as the scheduler allows"))
    if d["time"]:
        t = d["time"]
        print(f"time: {t['text']}" + (f"; {t['completed']} of {d['n_runs']} runs already done" if t["completed"] else ""))
    print("\ndata (tokens one run needs / tokens in data.corpus):")
    print(_table([{**r, "corpus_tokens": r["corpus_tokens"] if r["corpus_tokens"] is not None else "unknown",
                   "epochs": round(r["epochs"], 3) if r["epochs"] is not None else "-"} for r in d["epochs"]],
                 ["rung", "device", "tokens_needed", "corpus_tokens", "epochs", "corpus"]))
    if d.get("companions"):
        print(f"companion studies: {', '.join(d['companions'])}")
    if args.runs:
        print("\n" + _table(run_rows, ["run_id", "rung", "arm", "seed", "design_row"]))
    if "hero" in d:
        from sweeps.hero import format_checkpoint

        hero = {k: v for k, v in d["hero"].items() if k not in ("checkpoint", "sbatch_script", "layout", "time_model")}
        print("\nhero: " + ", ".join(f"{k}={_fmt_num(v)}" for k, v in hero.items()))
        print("layout: " + ", ".join(f"{k}={_fmt_num(v)}" for k, v in d["hero"]["layout"].items()))
        print(format_checkpoint(d["hero"]["checkpoint"]))
        from sweeps.timemodel import format_time_model

        print(format_time_model(d["hero"]["time_model"]))
        print("\nsbatch (what `run hero --executor slurm` would submit; one task per GPU, requeued on USR2):\n")
        print(d["hero"]["sbatch_script"])
    return 0


def _cached_law(study: Any):
    """The PinnedLaw this machine's cache holds for the study's baseline ladder, else None."""
    if not getattr(study, "reference_rungs", ()):
        return None
    from analysis.reflaw import LAW_FILE, PinnedLaw
    from marin.schema import read_json
    from sweeps.reference import cache_root, reference_key, reference_specs

    got = read_json(cache_root() / reference_key(reference_specs(study)) / LAW_FILE)
    return PinnedLaw.from_dict(got) if got else None


def _before_design(study: Any, out: str) -> list[dict]:
    """The runs `run` makes before the design (docs/method.md §4.6, §4.1): the LR profile of each
    LR-coupled factor's levels and the baseline ladder that pins the reference law, with their cost."""
    from sweeps.tuning import profile_cost, read_profile

    rows = []
    pc = profile_cost(study)
    if pc is not None:
        done = read_profile(out, study.name)
        rows.append({"what": f"LR profile ({', '.join(pc['groups'])}, 5 log-spaced LRs each)", "runs": pc["runs"],
                     "rungs": pc["rung"], "core_seconds": pc["core_seconds"], "max_runs": pc["max_runs"],
                     "state": f"done ({done.get('created')})" if done else "", "n_runs": pc["runs"]})
    if getattr(study, "reference_rungs", ()):
        from ablations.ladders import ladder
        from sweeps.reference import cache_root, reference_key, reference_specs

        key = reference_key(reference_specs(study))
        cached = (cache_root() / key / "reference_law.json").exists()
        rungs = ladder(study.reference_rungs)
        n_seeds = len(getattr(study, "reference_seeds", (0,)))
        est = [r.est_wall_s() for r in rungs]
        rows.append({"what": f"baseline ladder pinning the reference law ({n_seeds} seed(s); once per machine and config)",
                     "runs": len(rungs) * n_seeds, "rungs": f"{rungs[0].name}..{rungs[-1].name}",
                     "core_seconds": n_seeds * sum(est) if all(e is not None for e in est) else None,
                     "state": f"cached ({cache_root() / key})" if cached else ""})
    return rows


def _rungs_as_overridden(d: dict, runs: list, study: Any) -> None:
    """The rung table and FLOP cost of the specs `--set` gives (the runs `run` trains)."""
    from marin.flops import flops_per_token, params_active, params_total
    from sweeps.costmodel import spec_flops

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
    """Wall time of the runs not done yet: the cost model of `run` and `tune` (`progress.plan_estimate`)."""
    from marin.schema import read_json
    from sweeps.progress import plan_estimate

    e = plan_estimate([r.spec for r in planned], prior, slots, threads, [r.dir for r in planned])
    if e is None:
        return None
    done = sum(1 for r in planned if ((read_json(r.dir / "summary.json") or {}).get("status") == "completed"))
    return {"seconds": e.seconds, "lo_90": e.lo, "hi_90": e.hi, "n_measured": e.n_measured, "load": e.load_note,
            "completed": done, "text": e.text()}


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------


def run_args(parser: argparse.ArgumentParser) -> None:
    _study_args(parser)
    _out_args(parser)
    _exec_args(parser)
    parser.add_argument("--tuned", action="store_true", help="use the per-arm LR multipliers `tune` wrote")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the LR profile of each LR-coupled factor's levels (every arm at the heuristic LR)")
    parser.add_argument("--no-pin", action="store_true",
                        help="skip the baseline ladder that pins the reference law (fit it on the design's rungs)")
    parser.add_argument("--no-analyze", action="store_true", help="do not run the analysis afterwards")
    _data_args(parser)
    _log_args(parser)


def analyze_study(study_dir: Path) -> int | None:
    """Run `marin-ablate analyze` on the study directory through its Python entry point; None when
    the analysis package does not provide it (a note is printed)."""
    try:
        from analysis import commands as ac
    except ImportError as e:
        print(f"note: analysis skipped ({e})")
        return None
    if not hasattr(ac, "cmd_analyze") or not hasattr(ac, "analyze_args"):
        print("note: analysis skipped (analysis.commands has no cmd_analyze)")
        return None
    p = argparse.ArgumentParser(prog="marin-ablate analyze")
    ac.analyze_args(p)
    ns = p.parse_args([str(study_dir)])
    try:
        return int(ac.cmd_analyze(ns) or 0)
    except ValueError as e:  # e.g. too few rungs for the reference law: the runs themselves are fine
        print(f"note: analysis of {study_dir} stopped: {e}")
        return None


def _status_hint(args: argparse.Namespace) -> str:
    """The `status` command that finds this study's runs: the study as given (a registered name, or the
    path:attribute it was loaded from), with the same --out, --rungs, --seeds, --set, --tuned and --no-profile."""
    import shlex

    cmd = ["marin-ablate", "status", args.study]
    if args.out != DEFAULT_OUT:
        cmd += ["--out", str(args.out)]
    for flag, v in (("--rungs", args.rungs), ("--seeds", args.seeds)):
        if v:
            cmd += [flag, v]
    for o in args.overrides:
        cmd += ["--set", o]
    # how the LRs were set changes the run ids: status must look for the same runs
    cmd += [f for f, on in (("--tuned", getattr(args, "tuned", False)),
                            ("--no-profile", getattr(args, "no_profile", False))) if on]
    return shlex.join(cmd)


def cmd_run(args: argparse.Namespace) -> int:
    from sweeps.executors import get_executor
    from sweeps.sweep import run_study
    from sweeps.tracking import log_locations, parse_log_to
    from sweeps.tuning import lr_plan

    study = _study(args)
    opts = _exec_options(args, study)
    epochs_checked(study, study.describe()["rungs"], args.overrides, args.allow_repeat)
    from sweeps.sweep import check_specs, planned_runs

    # what `train` refuses, before the LR profile or the reference ladder writes anything
    check_specs(planned_runs(study, args.out, overrides=args.overrides), opts.executor)
    _set_log_to(args)
    if args.tuned:
        lr_plan(study, args.out, None, tuned=True)  # a missing or damaged file: refused before any run
    from sweeps.tuning import read_profile

    if not opts.wait and study.lr_coupled and not (args.tuned or args.no_profile) and not read_profile(args.out, study.name):
        raise ValueError(f"--no-wait: the LR profile of {', '.join(f.name for f in study.lr_coupled)} must finish "
                         "before the design is submitted; allowed: run once without --no-wait, or --no-profile")
    mult, prov = lr_plan(study, args.out, opts if opts.wait else None, tuned=args.tuned,
                         profile=not args.no_profile, overrides=args.overrides)
    if prov["lr_source"] == "profile":
        print(f"{study.name}: LRs profiled per level ({prov['lr_profile']}, {prov['lr_profile_date']})", flush=True)
    from analysis.reflaw import LAW_FILE
    from sweeps.runs import study_dir as _sdir

    if study.reference_rungs and not args.no_pin and opts.wait:
        from sweeps.reference import pin_reference_law

        law = pin_reference_law(study, _sdir(args.out, study.name), opts, args.overrides)
        print(f"{study.name}: reference law not pinned: {law}" if isinstance(law, str) else
              f"{study.name}: reference law pinned: {law.describe()} ({law.source})", flush=True)
    elif args.no_pin:
        (_sdir(args.out, study.name) / LAW_FILE).unlink(missing_ok=True)  # the analysis then fits the law itself
    rep = run_study(study, args.out, opts, lr_multipliers=mult, overrides=args.overrides, provenance=prov)
    skipped = ", ".join(f"{v} {k}" for k, v in rep.skipped.items()) or "none"
    if rep.submitted == 0:
        print(f"{study.name}: nothing to submit ({rep.n_runs} runs; skipped: {skipped})")
    else:
        jobs = sorted({j.split("_")[0] for j in rep.job_ids})
        where = f" as job(s) {', '.join(jobs)}" if get_executor(opts.executor).shows_jobs else ""
        print(f"{study.name}: {rep.submitted} of {rep.n_runs} runs submitted to {opts.executor}{where} "
              f"(skipped: {skipped})")
    from sweeps.state import STATES, all_done

    c = rep.counts
    print(f"{study.name}: " + ", ".join(f"{c[k]} {k}" for k in STATES if c.get(k) or k in ("completed", "failed"))
          + f"; results in {rep.study_dir}")
    if c["failed"]:
        print(f"failed runs keep their error in summary.json; `{_status_hint(args)}` lists them; "
              "--retry-failed runs them again")
    if c["running"] or c["queued"]:
        print(f"{c['running'] + c['queued']} run(s) belong to another process or SLURM job and are not finished; "
              f"`{_status_hint(args)}` follows them")
    for line in log_locations(rep.study_dir, parse_log_to(args.log_to)):
        print(line)
    if opts.wait and not args.no_analyze and c["completed"]:
        analyze_study(rep.study_dir)
    if not opts.wait:
        return 0
    return 0 if all_done(c) else 1


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------


def status_args(parser: argparse.ArgumentParser) -> None:
    _study_args(parser)
    _out_args(parser)
    parser.add_argument("--tuned", action="store_true", help="the runs of `run --tuned`")
    parser.add_argument("--no-profile", action="store_true", help="the runs of `run --no-profile`")
    parser.add_argument("--all", action="store_true", help="one row per run (default: counts, ETA, running and failed runs)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--limit", type=int, default=10, help="at most this many failed runs listed without --all")


def cmd_status(args: argparse.Namespace) -> int:
    from marin.schema import read_json
    from sweeps.costmodel import slowdown_now
    from sweeps.progress import eta_model, format_counts, format_eta, hms, run_flops, run_live, rung_prior, study_eta
    from sweeps.sweep import study_status
    from sweeps.tuning import lr_plan

    study = _study(args)
    mult, _ = lr_plan(study, args.out, None, tuned=args.tuned, profile=not args.no_profile)
    st = study_status(study, args.out, lr_multipliers=mult, overrides=args.overrides)
    sdir = Path(st["study_dir"]) / "runs"
    for r in st["runs"]:
        state = r["state"].split(",")[0]
        r.update(run_live(sdir / r["run_id"]) if state in ("running", "partial") else
                 {"step": None, "total": None, "loss": None, "elapsed_s": None})
        if state == "completed":
            summary = read_json(sdir / r["run_id"] / "summary.json") or {}
            r.update(step=summary.get("step"), loss=summary.get("final_train_loss"), wall_s=summary.get("wall_s"),
                     total=run_live(sdir / r["run_id"])["total"])
    rows = [dict(r, state=r["state"].split(",")[0], flops=run_flops(sdir / r["run_id"])) for r in st["runs"]]
    slots = max(1, st["counts"].get("running", 0))
    model = eta_model(rung_prior(study.describe()["rungs"]), slots)
    k, note = slowdown_now(slots)  # the load now: the running runs (ours) included
    eta = study_eta(rows, model, slots, k or 1.0, note)
    left = st["counts"]["completed"] + st["counts"]["failed"] < st["n_runs"]
    st["eta_s"] = (eta.seconds if eta else None) if left else 0.0
    st["eta_90"] = [eta.lo, eta.hi] if eta and left else None
    if args.json:
        print(json.dumps(st, indent=1, default=str))
        return 0
    eta_s = f", {format_eta(eta)}" if eta and left else ""
    print(format_counts(st["counts"], st["n_runs"], 0.0, study.name).rsplit(" [", 1)[0] + eta_s +
          f"  ({st['study_dir']})")
    for r in st["runs"]:
        if r["elapsed_s"] is not None:
            r["elapsed"] = hms(r["elapsed_s"])
        if r["step"] is not None and r["total"] is not None:
            r["progress"] = f"{r['step']}/{r['total']}"
    cols = ["run_id", "rung", "arm", "seed", "state", "progress", "loss", "elapsed", "eval_macro_loss", "job_id"]
    shown = st["runs"] if args.all else [r for r in st["runs"] if r["state"].startswith(("running", "partial"))]
    if shown:
        print(_table(shown, cols))
        if any(set(r["arm"] or "") <= {"+", "-"} and r["arm"] for r in shown):
            print(_arm_key(study))
    failed = [r for r in st["runs"] if r["state"] == "failed"]
    for r in failed if args.all else failed[:args.limit]:
        print(f"failed {r['run_id']} ({r['rung']} {r['arm']} seed {r['seed']}): {r['error']}")
    if len(failed) > args.limit and not args.all:
        print(f"... {len(failed) - args.limit} more failed runs (--all lists every run)")
    for r in st["runs"]:  # counted with the unfinished runs (`run` trains them again), named here
        if r["damaged"]:
            print(f"damaged {r['run_id']} ({r['rung']} {r['arm']} seed {r['seed']}, {r['state']}): {r['damaged']}; "
                  "the next `run` trains it again")
    return 0


# ---------------------------------------------------------------------------------------------
# tune
# ---------------------------------------------------------------------------------------------


def tune_args(parser: argparse.ArgumentParser) -> None:
    _study_args(parser)
    _out_args(parser)
    _exec_args(parser)
    parser.add_argument("--points", type=int, default=5, help="LR points per arm (log-spaced)")
    parser.add_argument("--span", type=float, default=4.0, help="multipliers from 1/SPAN to SPAN of the heuristic LR")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage: a journal file path (default OUT/STUDY/tune/optuna.journal) or an RDB URL")
    parser.add_argument("--rung", default=None, help="rung to tune at (default: the smallest)")
    parser.add_argument("--seed", type=int, default=None, help="seed to tune with (default: the study's first)")
    _log_args(parser)


def cmd_tune(args: argparse.Namespace) -> int:
    from sweeps.tuning import TuneOptions, tune_dir, tune_study

    study = _study(args)
    opts = _exec_options(args, study)
    _set_log_to(args)
    res = tune_study(study, args.out, opts,
                     TuneOptions(points=args.points, span=args.span, storage=args.storage, rung=args.rung,
                                 seed=args.seed), overrides=args.overrides)
    print(f"{study.name}: LR profile at rung {res.rung}, seed {res.seed}, log2 multipliers {res.grid}")
    rows = res.rows()
    if rows:
        print(_table(rows, ["arm", "points", "best_grid_multiplier", "multiplier", "lr", "loss_opt", "edge"]))
    for r in rows:
        if r["edge"]:
            print(f"edge: {r['arm']}: {r['note']}")
    for arm, xs in res.missing.items():
        print(f"missing: {arm}: log2 multipliers {xs} have no finished run")
    print(f"wrote {tune_dir(args.out, study.name) / 'lr_multipliers.json'}; use `marin-ablate run {study.name} --tuned`")
    return 0 if not res.missing else 1
