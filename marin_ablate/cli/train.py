"""`marin-ablate train`: one run into an output directory (docs/architecture.md §4).

The command takes the run directory's lock (marin.runlock, the one `marin-ablate run` takes), so two
commands on the same --run-dir never interleave; Ctrl-C checkpoints like SIGTERM and exits 130."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import ClassVar

from marin_ablate.cli.parse import parse
from marin_ablate.marin.fields import SEED, SPEC_SECTIONS, option
from marin_ablate.marin.presets import spec_of_preset
from marin_ablate.marin.runlock import RunLock
from marin_ablate.marin.train.metrics import LOG_TO


@dataclass(frozen=True)
class TrainOptions:
    """Train one run into a run directory."""

    command: ClassVar[str] = "train"
    preset: str = option(help="model preset (marin.presets.PRESETS)")
    run_dir: str = option(metavar="DIR", help="the run directory (checkpoints, metrics, summary.json)")
    overrides: tuple[str, ...] = option((), spec=SPEC_SECTIONS,
                                        help="e.g. --train.steps=20 --recipe.qk_norm=none")
    baseline: bool = option(False, help="start from Recipe.baseline() (every factor off) instead of Recipe()")
    seed: int = option(0, lo=0, hi=2**64 - 1, allowed=SEED[1], help="the run's seed")
    no_resume: bool = option(False, help="ignore checkpoints in --run-dir and start over")
    stop_after: int | None = option(None, lo=1, metavar="N", help="checkpoint and stop after N steps of this session")
    log_to: str = option("", metavar="SINKS", help=f"comma-separated extra sinks: {', '.join(LOG_TO)}")
    keep_checkpoints: str = option("final", choices=("none", "final", "all"),
                                   help="final: a completed run keeps only its newest checkpoint; all: never prune; "
                                        "none: a completed run keeps no checkpoint")


def _is_rank0() -> bool:
    """Only one rank of a distributed launch holds the lock (they share the run directory)."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0) == 0


def cmd_train(argv: list[str]) -> int:
    args = parse(TrainOptions, argv)
    from marin_ablate.marin.train.loop import check_spec, train
    from marin_ablate.marin.train.metrics import check_log_to

    spec = spec_of_preset(args.preset, args.overrides, args.baseline, args.seed)
    log_to = tuple(x for x in args.log_to.split(",") if x)
    check_spec(spec)  # a setting train refuses, refused before the lock creates --run-dir
    check_log_to(log_to)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    lock = RunLock(args.run_dir)
    if _is_rank0() and not lock.acquire():
        try:
            holder = lock.path.read_text().strip()
        except OSError:
            holder = "unknown"
        raise ValueError(f"--run-dir {args.run_dir!r} is in use by another training process (lock {lock.path}, "
                         f"holder {holder}); wait for it or use another --run-dir")
    try:
        out = train(spec, args.run_dir, resume=not args.no_resume, stop_after=args.stop_after, log_to=log_to,
                    keep_checkpoints=args.keep_checkpoints)
    finally:
        lock.release()
    print(json.dumps({k: out.get(k) for k in ("run_id", "status", "step", "eval_macro_loss", "final_train_loss",
                                               "error")}))
    if out["status"] == "interrupted":
        sig = out.get("signal")
        return 128 + sig if sig else 0  # 143 after SIGTERM, 140 after SIGUSR2, 130 after Ctrl-C: resumable
    return 0 if out["status"] == "completed" else 1
