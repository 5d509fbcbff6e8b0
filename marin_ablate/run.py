"""`marin-ablate run STUDY [--executor local|debug|slurm] [--out DIR] [--workers N] [--slurm.FIELD V]`:
every setting checked before anything is written, the LR profile and the reference law's baseline
ladder when the study has them, the design's runs submitted through the executor, a summary of their
states, then the analysis of the study. `run STUDY --tune` profiles every arm's LR instead
(marin_ablate/tune.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from marin_ablate import options
from marin_ablate.common import (
    ExecConfig,
    LogOptions,
    StudyOptions,
    epochs_checked,
    exec_options,
    set_log_to,
    study_from_args,
)
from marin_ablate.marin.fields import option
from marin_ablate.tune import TuneSection


@dataclass(frozen=True)
class RunOptions(StudyOptions):
    """Run a study (local, debug or slurm executor), then analyse it."""

    command: ClassVar[str] = "run"
    execution: ExecConfig = option(ExecConfig(), inline=True, section=ExecConfig)
    log: LogOptions = option(LogOptions(), inline=True, section=LogOptions)
    tuned: bool = option(False, help="use the per-arm LR multipliers `run --tune` wrote")
    no_profile: bool = option(False, help="skip the LR profile of each LR-coupled factor's levels (every arm at the "
                                          "heuristic LR)")
    no_pin: bool = option(False, help="pin no reference law: neither the baseline ladder nor the study's "
                                      "published law (the analysis fits it on the design's rungs)")
    no_analyze: bool = option(False, help="do not run the analysis afterwards")
    allow_repeat: bool = option(False, help="accept a GPU rung that needs more tokens than its corpus holds "
                                            "(more than one epoch)")
    tune: TuneSection | None = option(None, section=TuneSection, mode=True, help=TuneSection.__doc__)


def analyze_study(study_dir: Path) -> int | None:
    """Run `marin-ablate analyze` on the study directory through its Python entry point; None when
    the analysis package does not provide it (a note is printed)."""
    try:
        from marin_ablate import analyze as ac
    except ImportError as e:
        print(f"note: analysis skipped ({e})")
        return None
    if not hasattr(ac, "cmd_analyze"):
        print("note: analysis skipped (marin_ablate.analyze has no cmd_analyze)")
        return None
    try:
        return int(ac.cmd_analyze([str(study_dir)]) or 0)
    except ValueError as e:  # e.g. too few rungs for the reference law: the runs themselves are fine
        print(f"note: analysis of {study_dir} stopped: {e}")
        return None


def _status_hint(args: RunOptions) -> str:
    """The `status` command that finds this study's runs: the study as given (a registered name, or the
    path:attribute it was loaded from), with the same --out, --rungs, --seeds, overrides, --tuned and --no-profile."""
    import shlex

    from marin_ablate.options import flags_of
    from marin_ablate.status import StatusOptions

    # how the LRs were set changes the run ids: status must look for the same runs
    st = StatusOptions(study=args.study, rungs=args.rungs, seeds=args.seeds, out=args.out, overrides=args.overrides,
                       tuned=args.tuned, no_profile=args.no_profile)
    return shlex.join(["marin-ablate", "status", *flags_of(st)])


def cmd_run(argv: list[str]) -> int:
    from marin_ablate.sweeps.executors import get_executor
    from marin_ablate.sweeps.sweep import run_study
    from marin_ablate.sweeps.tracking import log_locations, parse_log_to
    from marin_ablate.sweeps.tuning import lr_plan

    args = options.parse(RunOptions, argv)
    if args.tune is not None:  # a mode: the LR profile instead of the design
        from marin_ablate.tune import cmd_tune

        return cmd_tune(args)
    study = study_from_args(args)
    opts = exec_options(args.execution, study)
    set_log_to(args.log)
    epochs_checked(study, overrides=args.overrides, allow_repeat=args.allow_repeat)
    from marin_ablate.sweeps.sweep import analysis_refusal, check_layouts, check_specs, planned_runs, study_resources

    # what `train` refuses, before the LR profile or the reference ladder writes anything
    planned = planned_runs(study, args.out, overrides=args.overrides)
    check_specs(planned, opts.executor)
    check_layouts(planned, opts, study_resources(study))
    refused = analysis_refusal(planned)  # thousands of runs `analyze` would refuse: before anything is written
    if refused:
        raise ValueError(refused)
    if args.tuned:
        lr_plan(study, args.out, None, tuned=True)  # a missing or damaged file: refused before any run
    from marin_ablate.sweeps.tuning import profile_skipped, read_profile

    if (not opts.wait and study.lr_coupled and not (args.tuned or args.no_profile) and not profile_skipped(study)
            and not read_profile(args.out, study.name)):
        raise ValueError(f"--no-wait: the LR profile of {', '.join(f.name for f in study.lr_coupled)} must finish "
                         "before the design is submitted; allowed: run once without --no-wait, or --no-profile")
    mult, prov = lr_plan(study, args.out, opts if opts.wait else None, tuned=args.tuned,
                         profile=not args.no_profile, overrides=args.overrides)
    if prov.get("lr_profile_skipped"):
        print(f"{study.name}: no LR profile: {prov['lr_profile_skipped']}", flush=True)
    if prov["lr_source"] == "profile":
        print(f"{study.name}: LRs profiled per level ({prov['lr_profile']}, {prov['lr_profile_date']})", flush=True)
    from marin_ablate.analysis.fit.reflaw import LAW_FILE
    from marin_ablate.sweeps.runs import study_dir as _sdir

    if getattr(study, "published_law", None) is not None and not args.no_pin:
        from marin_ablate.sweeps.reference import pin_published

        law = pin_published(study, _sdir(args.out, study.name))
        print(f"{study.name}: L∞ and α pinned to a published law: {law.source}", flush=True)
    elif study.reference_rungs and not args.no_pin and opts.wait:
        from marin_ablate.sweeps.reference import pin_reference_law

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
    from marin_ablate.sweeps.state import STATES, all_done

    c = rep.counts
    print(f"{study.name}: " + ", ".join(f"{c[k]} {k}" for k in STATES if c.get(k) or k in ("completed", "failed"))
          + f"; results in {rep.study_dir}")
    if c["failed"]:
        print(f"failed runs keep their error in summary.json; `{_status_hint(args)}` lists them; "
              "--retry-failed runs them again")
    if c["running"] or c["queued"]:
        print(f"{c['running'] + c['queued']} run(s) belong to another process or SLURM job and are not finished; "
              f"`{_status_hint(args)}` follows them")
    for line in log_locations(rep.study_dir, parse_log_to(args.log.log_to)):
        print(line)
    if opts.wait and not args.no_analyze and c["completed"]:
        analyze_study(rep.study_dir)
    if not opts.wait:
        return 0
    return 0 if all_done(c) else 1
