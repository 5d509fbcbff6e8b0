"""`marin-ablate studies` and `describe`, and what `plan`, `run`, `status` and `tune` share: their arguments, the
study and execution options they resolve, the corpus check and the table layout (marin_ablate/main.py
dispatches here and to marin_ablate/plan.py, run.py, status.py, tune.py).

    marin-ablate studies [--json]             the registered studies, one line each
    marin-ablate describe --preset NAME [--json]  resolved config, parameter and FLOP counts

    marin-ablate plan STUDY [--json]          design, alias table, runs, cost (hero: its sbatch)
    marin-ablate run STUDY [--executor local|debug|slurm] [--out DIR] [--workers N] [slurm options]
    marin-ablate status STUDY [--out DIR] [--json]
    marin-ablate tune STUDY [--points 5] [--span 4] [--storage PATH|URL]

A bad option raises ValueError (marin_ablate/main.py prints one line and exits 2) before anything is written or
submitted.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Sequence

DEFAULT_OUT = "runs"


# ---------------------------------------------------------------------------------------------
# describe: marin_ablate.describe does the arithmetic; the ladder rung of a preset is looked up here
# ---------------------------------------------------------------------------------------------


def studies_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="a JSON list of {name, description} (default: a table)")


def cmd_studies(args: argparse.Namespace) -> int:
    """Every registered study with its one-line description: what `plan`, `run` and `tune` accept as STUDY."""
    from ablations.studies import STUDIES, get_study

    rows = [{"name": n, "description": get_study(n).description} for n in STUDIES]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        width = max(len(r["name"]) for r in rows)
        print("\n".join(f"{r['name']:<{width}}  {r['description']}" for r in rows))
    return 0


def describe_args(p: argparse.ArgumentParser) -> None:
    from marin_ablate.describe import describe_args as model_describe_args

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
    from marin_ablate.describe import cmd_describe as print_describe

    return print_describe(args, rung_of_preset(args.preset))


# ---------------------------------------------------------------------------------------------
# Shared arguments
# ---------------------------------------------------------------------------------------------


def study_args(p: argparse.ArgumentParser) -> None:
    from ablations.studies import STUDIES

    p.add_argument("study", metavar="STUDY", help=f"a registered study ({', '.join(STUDIES)}), "
                   "path/to/file.py:attribute or package.module:attribute (a Study or a function returning one)")
    p.add_argument("--rungs", default=None, help="comma-separated rungs (default: the study's)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the study's)")


def out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output root; runs go to OUT/STUDY/runs/RUN_ID (default {DEFAULT_OUT})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a field of every run's spec (model., train., data., recipe.); changes run ids")


def exec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("execution")
    g.add_argument("--executor", default=None, help="local, debug or slurm (default: the study's, else local)")
    g.add_argument("--workers", type=int, default=None,
                   help="local: parallel worker processes (default: study's max_parallel, else 2)")
    g.add_argument("--threads", type=int, default=None,
                   help="local/debug: torch threads per worker (default cpus // workers)")
    g.add_argument("--retry-failed", action="store_true",
                   help="run failed runs again (their old summary is kept aside)")
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
    s.add_argument("--signal-delay-s", type=int, default=90,
                   help="USR2 this long before the time limit (checkpoint, requeue)")


def study_exec_args(p: argparse.ArgumentParser) -> None:
    """The arguments of a command that trains or plans a study's runs (plan, run, tune)."""
    study_args(p)
    out_args(p)
    exec_args(p)


def _csv(v: str | None, cast: Any = str) -> list | None:
    if v is None:
        return None
    try:
        return [cast(x.strip()) for x in v.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"cannot parse {v!r} as a comma-separated list of {cast.__name__}") from None


def study_from_args(args: argparse.Namespace) -> Any:
    from sweeps.sweep import resolve_study

    return resolve_study(args.study, _csv(args.rungs), _csv(args.seeds, int))


def exec_options(args: argparse.Namespace, study: Any):
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


def corpus_args(p: argparse.ArgumentParser) -> None:
    if not any("--set" in a.option_strings for a in p._actions):
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override a field of every run's spec, e.g. data.corpus=DIR (a prepared corpus)")
    p.add_argument("--allow-repeat", action="store_true",
                   help="accept a GPU rung that needs more tokens than its corpus holds (more than one epoch)")


def log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-to", default=None, metavar="SINKS",
                   help="wandb,tensorboard: every run's metrics, grouped by study, tagged with arm, rung and levels")
    p.add_argument("--keep-checkpoints", choices=("none", "final", "all"), default=None,
                   help="what a completed run keeps: none (default on CPU), final (its newest checkpoint; default "
                        "on GPU) or all; an unfinished run always keeps what it resumes from")


def set_log_to(args: argparse.Namespace) -> None:
    from sweeps.tracking import KEEP_ENV, LOG_TO_ENV, parse_log_to

    if args.keep_checkpoints is not None:  # inherited like the sinks
        os.environ[KEEP_ENV] = args.keep_checkpoints
    if args.log_to is not None:  # the worker processes inherit it (sweeps/tracking.py)
        from marin.train.metrics import check_log_to

        names = parse_log_to(args.log_to)
        check_log_to(names)  # before any run is launched: a missing backend would fail every run
        os.environ[LOG_TO_ENV] = ",".join(names)


# ---------------------------------------------------------------------------------------------
# Shared checks and tables
# ---------------------------------------------------------------------------------------------


def epochs_checked(study: Any, rung_rows: list[dict] | None = None, overrides: Sequence[str] = (),
                   allow_repeat: bool = False) -> list[dict]:
    """Per rung: tokens needed, tokens in the corpus, epochs; ValueError when a GPU rung's data
    would be the embedded corpus or would repeat without --allow-repeat (ablations/epochs.py).
    `rung_rows`: the study's `describe()["rungs"]`, when the caller has them already."""
    from ablations.epochs import check_epochs, study_epoch_rows
    from sweeps.sweep import apply_spec_overrides

    if rung_rows is None:
        rung_rows = study.describe()["rungs"]
    runs = study.runs()
    if overrides:
        runs = [(apply_spec_overrides(sp, overrides), m) for sp, m in runs]
    rows = study_epoch_rows(rung_rows, runs)
    check_epochs(rows, allow_repeat)
    from marin.data.mixture import check_mixture_domains
    for data in {sp.data for sp, _ in runs}:  # a mixture names the corpus's domains (before any run)
        check_mixture_domains(data)
    return rows


def format_num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def format_table(rows: list[dict], cols: list[str]) -> str:
    cells = [["-" if r.get(c) is None and c in r else format_num(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def arm_key(study: Any) -> str:
    """What an arm code such as `+-+` says: one sign per factor, in the design's order."""
    levels = ", ".join(f"{f.name} (+ {f.level(1)}, - {f.level(-1)})" for f in study.factors)
    return f"arm codes: one sign per factor in this order: {levels}; all_on / all_off: every factor + / -"
