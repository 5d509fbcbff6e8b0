"""Bounds of the numeric command-line arguments no options dataclass checks, before any work.

One table, keyed by the argparse destination, shared by every `marin-ablate` command (an argument a
command lacks is skipped). The range rules are marin.config's, so `--seed` here and `seed` in a spec
allow the same values. argparse's `type=float` takes "nan" and "inf": every float rule is finite.
"""

from __future__ import annotations

import argparse
from typing import Any

from marin.config import NONNEG, POS, POS_INT, SEED

NONNEG_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0")
MAX_BOOT = 1_000_000  # replicates: beyond this the bootstrap takes days and its draws no longer fit in memory


def _int_range(lo: int, hi: int) -> tuple:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi, f"an integer in {lo}..{hi}")


#: argparse dest -> (rule, allowed-range text); the flag named in errors is --dest with dashes.
CLI_BOUNDS: dict[str, tuple] = {
    # analyze / forecast / calibrate
    "n_boot": _int_range(0, MAX_BOOT),
    "pin_linf": NONNEG,  # L∞, the irreducible loss: a loss, never negative
    "pin_alpha": POS,  # the law's exponent
    "pin_A": POS,  # the law's scale
    "target": POS,  # FLOPs
    "seed": SEED,
    # train
    "steps": POS_INT,
    "stop_after": POS_INT,
    # plan --dry-run
    "gpus": POS_INT,
    "ep": POS_INT,
    "capacity_gib": POS,
    "reserve_gib": NONNEG,
    # status
    "limit": NONNEG_INT,
    # execution (--workers, --mem-gb, ...), tune (--points, --span) and data prepare (--num-proc, ...)
    # options are checked by the option dataclasses they build (sweeps.executors, sweeps.tuning,
    # marin.data.prepare), also before any work
}


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the first argument out of range, its value and the allowed values."""
    for dest, (ok, allowed) in CLI_BOUNDS.items():
        value: Any = getattr(args, dest, None)
        if value is not None and not ok(value):  # None: not given (the command's default applies)
            raise ValueError(f"--{dest.replace('_', '-')} {value!r} is out of range; allowed values: {allowed}")
