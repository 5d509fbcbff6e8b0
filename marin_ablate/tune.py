"""`marin-ablate tune STUDY [--points 5] [--span 4] [--storage PATH|URL]`: the per-arm LR profile at one
rung (sweeps/tuning.py), written as the multipliers that `run --tuned` uses.
"""

from __future__ import annotations

import argparse

from marin_ablate.common import (
    exec_options,
    format_table,
    log_args,
    set_log_to,
    study_exec_args,
    study_from_args,
)


def tune_args(parser: argparse.ArgumentParser) -> None:
    study_exec_args(parser)
    parser.add_argument("--points", type=int, default=5, help="LR points per arm (log-spaced)")
    parser.add_argument("--span", type=float, default=4.0, help="multipliers from 1/SPAN to SPAN of the heuristic LR")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage: a journal file path (default OUT/STUDY/tune/optuna.journal) "
                             "or an RDB URL")
    parser.add_argument("--rung", default=None, help="rung to tune at (default: the smallest)")
    parser.add_argument("--seed", type=int, default=None, help="seed to tune with (default: the study's first)")
    log_args(parser)


def cmd_tune(args: argparse.Namespace) -> int:
    from sweeps.tuning import TuneOptions, tune_dir, tune_study

    study = study_from_args(args)
    opts = exec_options(args, study)
    set_log_to(args)
    res = tune_study(study, args.out, opts,
                     TuneOptions(points=args.points, span=args.span, storage=args.storage, rung=args.rung,
                                 seed=args.seed), overrides=args.overrides)
    print(f"{study.name}: LR profile at rung {res.rung}, seed {res.seed}, log2 multipliers {res.grid}")
    rows = res.rows()
    if rows:
        print(format_table(rows, ["arm", "points", "best_grid_multiplier", "multiplier", "lr", "loss_opt", "edge"]))
    for r in rows:
        if r["edge"]:
            print(f"edge: {r['arm']}: {r['note']}")
    for arm, xs in res.missing.items():
        print(f"missing: {arm}: log2 multipliers {xs} have no finished run")
    print(f"wrote {tune_dir(args.out, study.name) / 'lr_multipliers.json'}; "
          f"use `marin-ablate run {study.name} --tuned`")
    return 0 if not res.missing else 1
