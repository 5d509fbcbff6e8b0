"""`marin-ablate run STUDY [--executor local|debug|slurm] [--out DIR] [--workers N] [--slurm.FIELD V]`: the design
planned and checked once before anything is written, the LR profile and the reference law's baseline ladder when
the study has them, the design's runs submitted through the executor, a summary of their states, then the analysis
of the study (analysis/study_folder.py). `run STUDY --tune` profiles every arm's LR instead (sweeps/tune_arms.py)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import ClassVar

from marin_ablate.cli.common import StudyOptions, study_from_args
from marin_ablate.cli.parse import flags_of, parse
from marin_ablate.marin.fields import option
from marin_ablate.sweeps.job import UntilOptions, exec_options
from marin_ablate.sweeps.sweep import ExecConfig, LogOptions
from marin_ablate.sweeps.tuning import TuneOptions


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
    tune: TuneOptions | None = option(None, section=TuneOptions, mode=True, help=TuneOptions.__doc__)
    until: UntilOptions | None = option(None, section=UntilOptions, help=UntilOptions.__doc__)


def _hint(args: RunOptions, command: str = "status", **kw) -> str:
    """The command that finds this study's runs again: the study as given (a registered name, or the path:attribute
    it was loaded from), with the same --out, --rungs, --seeds and overrides (how the LRs were set changes the run
    ids: --tuned, --no-profile too)."""
    if command == "status":
        from marin_ablate.cli.status import StatusOptions

        obj = StatusOptions(study=args.study, rungs=args.rungs, seeds=args.seeds, out=args.out,
                            overrides=args.overrides, tuned=args.tuned, no_profile=args.no_profile)
    else:
        obj = replace(args, tune=None, execution=ExecConfig(), log=LogOptions(), **kw)
    return shlex.join(["marin-ablate", command, *flags_of(obj)])


def cmd_run(argv: list[str]) -> int:
    args = parse(RunOptions, argv)  # first: `--help` and a bad option import nothing more
    if args.tune is not None:  # a mode: the LR profile instead of the design
        return cmd_tune(args)
    from marin_ablate.analysis.study_folder import analyze_study
    from marin_ablate.sweeps.job import DesignOptions, run_design, run_until
    from marin_ablate.sweeps.state import all_done
    from marin_ablate.sweeps.tracking import log_locations, parse_log_to

    study = study_from_args(args)
    opts = exec_options(args.execution, study, args.log)
    d = DesignOptions(tuple(args.overrides), args.tuned, args.no_profile, args.no_pin, args.allow_repeat)
    say = lambda line: print(line, flush=True)  # noqa: E731
    if args.until is not None:  # the study's seeds are the pilot, then blocks of added seeds (sweeps/job.py)
        rep = run_until(study, args.out, args.until.spec(), opts, d, say)
    else:
        rep = run_design(study, args.out, opts, d, say)
    c = rep.counts
    if c["failed"]:
        print(f"failed runs keep their error in summary.json; `{_hint(args)}` lists them; --retry-failed runs them "
              "again")
    if c["running"] or c["queued"]:
        print(f"{c['running'] + c['queued']} run(s) belong to another process or SLURM job and are not finished; "
              f"`{_hint(args)}` follows them")
    for line in log_locations(rep.study_dir, parse_log_to(args.log.log_to)):
        print(line)
    if opts.wait and not args.no_analyze and c["completed"]:
        try:  # the study's analysis with `analyze`'s defaults; one it cannot read yet is a note: the runs are fine
            print("\n".join(analyze_study(rep.study_dir).lines))
        except ValueError as e:
            print(f"note: analysis of {rep.study_dir} stopped: {e}")
    return 0 if not opts.wait or all_done(c) else 1


#: run's options that are the design's, not the profile's: refused with --tune
_DESIGN_ONLY = ("tuned", "no_profile", "no_pin", "no_analyze", "allow_repeat")


def cmd_tune(args: RunOptions) -> int:
    """`run STUDY --tune`: every arm's LR grid at one rung, profiled; the multipliers `run --tuned` uses."""
    from marin_ablate.sweeps.tune_arms import tune_study
    from marin_ablate.sweeps.tuning import tune_dir

    extra = [f"--{n.replace('_', '-')}" for n in _DESIGN_ONLY if getattr(args, n)]
    if extra:
        raise ValueError(f"--tune profiles the LRs instead of running the design; {', '.join(extra)} "
                         "is the design's; allowed: --tune without it, or run without --tune")
    study = study_from_args(args)
    opts = exec_options(args.execution, study, args.log)
    res = tune_study(study, args.out, opts, args.tune, overrides=args.overrides)
    print("\n".join(res.lines()))
    print(f"wrote {tune_dir(args.out, study.name) / 'lr_multipliers.json'}; use `{_hint(args, 'run', tuned=True)}`")
    return 0 if not res.missing else 1
