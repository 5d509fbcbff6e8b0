"""`marin-ablate status STUDY [--out DIR] [--json]`: the counts and ETA of a study's runs, the running ones with
their progress, the failed and damaged ones with their reason (`--all`: one row per run); sweeps/sweep.py
`study_status` computes them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from marin_ablate.ablations.study import text_table
from marin_ablate.cli.common import StudyOptions, study_from_args
from marin_ablate.cli.parse import parse
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
    args = parse(StatusOptions, argv)
    from marin_ablate.marin.schema import foreign
    from marin_ablate.sweeps.progress import format_counts, format_eta, hms
    from marin_ablate.sweeps.sweep import study_status
    from marin_ablate.sweeps.tuning import lr_plan

    study = study_from_args(args)
    mult, _ = lr_plan(study, args.out, None, tuned=args.tuned, profile=not args.no_profile)
    st = study_status(study, args.out, lr_multipliers=mult, overrides=args.overrides)
    eta = st.pop("eta")
    if args.json:
        print(json.dumps(st, indent=1, default=str))
        return 0
    print(format_counts(st["counts"], st["n_runs"], 0.0, study.name).rsplit(" [", 1)[0]
          + (f", {format_eta(eta)}" if eta else "") + f"  ({st['study_dir']})")
    for r in st["runs"]:
        r.update({"elapsed": hms(r["elapsed_s"])} if r["elapsed_s"] is not None else {},
                 **({"progress": f"{r['step']}/{r['total']}"} if r["step"] is not None and r["total"] is not None
                    else {}))
    shown = st["runs"] if args.all else [r for r in st["runs"] if r["state"].startswith(("running", "partial"))]
    if shown:
        print(text_table(shown, ["run_id", "rung", "arm", "seed", "state", "progress", "loss", "elapsed",
                                 "eval_macro_loss", "job_id"]))
        if any(r["arm"] and set(r["arm"]) <= {"+", "-"} for r in shown):
            print(study.arm_key())
    failed = [r for r in st["runs"] if r["state"] == "failed"]
    for r in failed if args.all else failed[:args.limit]:
        print(f"failed {r['run_id']} ({r['rung']} {r['arm']} seed {r['seed']}): {r['error']}")
    if len(failed) > args.limit and not args.all:
        print(f"... {len(failed) - args.limit} more failed runs (--all lists every run)")
    sdir = Path(st["study_dir"]) / "runs"
    for r in (r for r in st["runs"] if r["damaged"]):  # counted with the unfinished runs, named here
        then = ("`run` refuses this folder until that file is moved back or removed"
                if foreign(sdir / r["run_id"], sdir) else "the next `run` trains it again")
        print(f"damaged {r['run_id']} ({r['rung']} {r['arm']} seed {r['seed']}, {r['state']}): {r['damaged']}; "
              f"{then}")
    return 0
