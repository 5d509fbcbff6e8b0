"""`marin-ablate run STUDY --tune [--tune.points 5] [--tune.span 4] [--tune.storage PATH|URL]`: the per-arm
LR profile at one rung (sweeps/tune_arms.py), written as the multipliers that `run --tuned` uses. A mode of
`run` (marin_ablate/run.py `RunOptions.tune`): the study, execution and log options are run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin_ablate.common import exec_options, format_table, set_log_to, study_from_args
from marin_ablate.marin.fields import SEED, option


@dataclass(frozen=True)
class TuneSection:
    """Instead of the design: the per-arm learning-rate profile at the smallest rung (the multipliers
    `run --tuned` uses)."""

    # hi: sweeps.tuning.POINTS_MAX (not imported here: it pulls Optuna into `run --help`)
    points: int = option(5, lo=3, hi=64, help="LR points per arm (log-spaced; a quadratic needs three; each is one run "
                                              "per arm)")
    span: float = option(4.0, lo=1, lo_open=True, help="multipliers from 1/SPAN to SPAN of the heuristic LR")
    storage: str | None = option(None, metavar="PATH|URL", help="Optuna storage: a journal file path (none: "
                                 "OUT/STUDY/tune/optuna.journal) or an RDB URL")
    rung: str | None = option(None, help="rung to tune at (none: the smallest)")
    seed: int | None = option(None, lo=0, hi=2**64 - 1, allowed=SEED[1],
                              help="seed to tune with (none: the study's first)")


#: run's options that are the design's, not the profile's: refused with --tune
_DESIGN_ONLY = ("tuned", "no_profile", "no_pin", "no_analyze", "allow_repeat")


def cmd_tune(args: Any) -> int:
    """`run STUDY --tune`: `args` is run's RunOptions with its `tune` section given."""
    from marin_ablate.sweeps.tune_arms import tune_dir, tune_study
    from marin_ablate.sweeps.tuning import TuneOptions

    extra = [f"--{n.replace('_', '-')}" for n in _DESIGN_ONLY if getattr(args, n)]
    if extra:
        raise ValueError(f"--tune profiles the LRs instead of running the design; {', '.join(extra)} "
                         "is the design's; allowed: --tune without it, or run without --tune")
    study = study_from_args(args)
    opts = exec_options(args.execution, study)
    set_log_to(args.log)
    t = args.tune
    res = tune_study(study, args.out, opts,
                     TuneOptions(points=t.points, span=t.span, storage=t.storage, rung=t.rung, seed=t.seed),
                     overrides=args.overrides)
    print(f"{study.name}: LR profile at rung {res.rung}, seed {res.seed}, log2 multipliers {res.grid}")
    rows = res.rows()
    if rows:
        print(format_table(rows, ["arm", "points", "best_grid_multiplier", "multiplier", "lr", "loss_opt", "edge"]))
    for r in rows:
        if r["edge"]:
            print(f"edge: {r['arm']}: {r['note']}")
    for arm, xs in res.missing.items():
        print(f"missing: {arm}: log2 multipliers {xs} have no finished run")
    print(f"wrote {tune_dir(args.out, study.name) / 'lr_multipliers.json'}; use `{_tuned_hint(args)}`")
    return 0 if not res.missing else 1


def _tuned_hint(args: Any) -> str:
    """The `run` command that uses these multipliers: the study as given (a registered name, or the
    path:attribute it was loaded from), with the same --out, --rungs, --seeds and overrides, and --tuned."""
    import shlex
    from dataclasses import replace

    from marin_ablate.options import flags_of

    run = replace(args, tune=None, tuned=True, execution=type(args.execution)(), log=type(args.log)())
    return shlex.join(["marin-ablate", "run", *flags_of(run)])
