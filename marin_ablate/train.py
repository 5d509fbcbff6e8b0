"""`marin-ablate train`: one run into an output directory (docs/architecture.md §4).

The command takes the run directory's lock (marin.runlock, the one `marin-ablate run` takes), so two
commands on the same --out never interleave; Ctrl-C checkpoints like SIGTERM and exits 130.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import fields, replace

from marin.config import (
    FACTORS,
    RECIPE_LEVELS,
    DataConfig,
    Recipe,
    RunSpec,
    TrainConfig,
    apply_overrides,
    preset,
    split_overrides,
)
from marin.runlock import RunLock
from marin.train.metrics import LOG_TO


def train_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", required=True, help="model preset (marin.config.PRESETS)")
    parser.add_argument("--recipe", action="append", default=[], metavar="FACTOR=LEVEL",
                        help="set a recipe switch; 'baseline' alone gives Recipe.baseline()")
    parser.add_argument("--set", action="append", default=[], metavar="[SECTION.]FIELD=VALUE",
                        help="override a field of the spec: model./train./data./recipe.FIELD=VALUE as every command "
                             "takes (a bare FIELD=VALUE is model.FIELD)")
    parser.add_argument("--train-set", action="append", default=[], metavar="FIELD=VALUE", help="TrainConfig override")
    parser.add_argument("--data-set", action="append", default=[], metavar="FIELD=VALUE", help="DataConfig override")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--no-resume", action="store_true", help="ignore checkpoints in --out and start over")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="checkpoint and stop after N steps of this session")
    parser.add_argument("--log-to", default="", help=f"comma-separated extra sinks: {', '.join(LOG_TO)}")
    parser.add_argument("--keep-checkpoints", choices=("none", "final", "all"), default="final",
                        help="final: a completed run keeps only its newest checkpoint; all: never prune; none: "
                             "a completed run keeps no checkpoint")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    sets = split_overrides(list(args.set))
    model = preset(args.preset, sets["model"])
    recipe = Recipe()
    for item in args.recipe:
        if item == "baseline":
            recipe = Recipe.baseline()
            continue
        if "=" not in item:
            raise ValueError(f"--recipe {item!r} must look like factor=level; factors: {', '.join(FACTORS)}")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in RECIPE_LEVELS:
            raise ValueError(f"unknown recipe factor {k!r}; allowed values: {', '.join(FACTORS)}")
        recipe = recipe.with_(**{k: v})
    recipe = apply_overrides(recipe, sets["recipe"]) if sets["recipe"] else recipe
    tr = _int_fields(apply_overrides(TrainConfig(), sets["train"] + list(args.train_set)))
    if args.steps is not None:
        tr = replace(tr, steps=args.steps)
    data = apply_overrides(DataConfig(), sets["data"] + list(args.data_set))
    return RunSpec(model=model, recipe=recipe, train=tr, data=data, seed=args.seed)


def _int_fields(cfg):
    """apply_overrides parses a None-default field as float; `int | None` fields want ints (so that
    `--train-set threads=1` and threads=1 give the same run id)."""
    fix = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, float) and str(f.type).replace(" ", "") in ("int|None", "Optional[int]"):
            if not v.is_integer():
                raise ValueError(f"{type(cfg).__name__}.{f.name}={v!r} must be an integer")
            fix[f.name] = int(v)
    return replace(cfg, **fix) if fix else cfg




def _is_rank0() -> bool:
    """Only one rank of a distributed launch holds the lock (they share the run directory)."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0) == 0


def cmd_train(args: argparse.Namespace) -> int:
    from marin.train.loop import check_spec, train
    from marin.train.metrics import check_log_to

    spec = spec_from_args(args)
    log_to = tuple(x for x in args.log_to.split(",") if x)
    check_spec(spec)  # a setting train refuses, refused before the lock creates --out
    check_log_to(log_to)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    lock = RunLock(args.out)
    if _is_rank0() and not lock.acquire():
        try:
            holder = lock.path.read_text().strip()
        except OSError:
            holder = "unknown"
        raise ValueError(f"--out {args.out!r} is in use by another training process (lock {lock.path}, "
                         f"holder {holder}); wait for it or use another --out")
    try:
        out = train(spec, args.out, resume=not args.no_resume, stop_after=args.stop_after, log_to=log_to,
                    keep_checkpoints=args.keep_checkpoints)
    finally:
        lock.release()
    print(json.dumps({k: out.get(k) for k in ("run_id", "status", "step", "eval_macro_loss", "final_train_loss",
                                               "error")}))
    if out["status"] == "interrupted":
        sig = out.get("signal")
        return 128 + sig if sig else 0  # 143 after SIGTERM, 140 after SIGUSR2, 130 after Ctrl-C: resumable
    return 0 if out["status"] == "completed" else 1
