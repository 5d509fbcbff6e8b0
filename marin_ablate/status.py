"""`marin-ablate status STUDY [--out DIR] [--json]`: the counts and ETA of a study's runs, the running
ones with their progress, the failed and damaged ones with their reason (`--all`: one row per run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from marin_ablate import options
from marin_ablate.common import StudyOptions, arm_key, format_table, study_from_args
from marin_ablate.marin.fields import option


@dataclass(frozen=True)
class StatusOptions(StudyOptions):
    """Progress of a study's runs."""

    command: ClassVar[str] = "status"
    tuned: bool = option(False, help="the runs of `run --tuned`")
    no_profile: bool = option(False, help="the runs of `run --no-profile`")
    all: bool = option(False, help="one row per run (default: counts, ETA, running and failed runs)")
    json: bool = option(False, help="one JSON object")
    limit: int = option(10, lo=0, help="at most this many failed runs listed without --all")


def cmd_status(argv: list[str]) -> int:
    from marin_ablate.marin.schema import read_json
    from marin_ablate.planning.costmodel import slowdown_now
    from marin_ablate.sweeps.progress import (
        eta_model,
        format_counts,
        format_eta,
        hms,
        run_flops,
        run_live,
        rung_prior,
        study_eta,
    )
    from marin_ablate.sweeps.sweep import study_status
    from marin_ablate.sweeps.tuning import lr_plan

    args = options.parse(StatusOptions, argv)
    study = study_from_args(args)
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
        print(format_table(shown, cols))
        if any(set(r["arm"] or "") <= {"+", "-"} and r["arm"] for r in shown):
            print(arm_key(study))
    failed = [r for r in st["runs"] if r["state"] == "failed"]
    for r in failed if args.all else failed[:args.limit]:
        print(f"failed {r['run_id']} ({r['rung']} {r['arm']} seed {r['seed']}): {r['error']}")
    if len(failed) > args.limit and not args.all:
        print(f"... {len(failed) - args.limit} more failed runs (--all lists every run)")
    from marin_ablate.marin.schema import foreign

    for r in st["runs"]:  # counted with the unfinished runs, named here
        if r["damaged"]:
            other = foreign(sdir / r["run_id"], sdir)  # a file of another run: `run` refuses the folder as it is
            then = ("`run` refuses this folder until that file is moved back or removed" if other
                    else "the next `run` trains it again")
            print(f"damaged {r['run_id']} ({r['rung']} {r['arm']} seed {r['seed']}, {r['state']}): {r['damaged']}; "
                  f"{then}")
    return 0
