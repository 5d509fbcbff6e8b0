"""`marin-ablate studies`, and what `plan`, `run` and `status` share: their option dataclasses
(`StudyOptions`, `ExecConfig`, `LogOptions`; marin_ablate/options.py makes the flags), the study and
execution options they resolve, a preset's ladder rung, the corpus check and the table layout
(marin_ablate/main.py dispatches here and to marin_ablate/plan.py, run.py, status.py).

    marin-ablate studies [--json]             the registered studies, one line each
    marin-ablate plan --preset NAME [--json]  resolved config, parameter and FLOP counts of a preset

    marin-ablate plan STUDY [--json]          design, alias table, runs, cost (hero: its sbatch)
    marin-ablate run STUDY [--executor local|debug|slurm] [--out DIR] [--workers N] [--slurm.FIELD V]
    marin-ablate run STUDY --tune [--tune.points 5] [--tune.span 4] [--tune.storage PATH|URL]
    marin-ablate status STUDY [--out DIR] [--json]

Every command that builds runs takes `--model.F=V`, `--train.F=V`, `--data.F=V`, `--recipe.F=V`. A bad
option raises ValueError (marin_ablate/main.py prints one line and exits 2) before anything is written or
submitted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Sequence

from marin_ablate import options
from marin_ablate.marin.fields import SPEC_SECTIONS, option

DEFAULT_OUT = "runs"


# ---------------------------------------------------------------------------------------------
# The option dataclasses the commands share (marin_ablate/options.py turns them into flags)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudiesOptions:
    """The registered studies (plugins' included), one line each."""

    command: ClassVar[str] = "studies"
    json: bool = option(False, help="a JSON list of {name, description} (default: a table)")


def cmd_studies(argv: list[str]) -> int:
    """Every registered study with its one-line description: what `plan`, `run` and `status` accept as STUDY."""
    from marin_ablate.ablations.studies import STUDIES, get_study

    opts = options.parse(StudiesOptions, argv)
    rows = [{"name": n, "description": get_study(n).description} for n in STUDIES]
    if opts.json:
        print(json.dumps(rows, indent=1))
    else:
        width = max(len(r["name"]) for r in rows)
        print("\n".join(f"{r['name']:<{width}}  {r['description']}" for r in rows))
    return 0


@dataclass(frozen=True)
class StudyOptions:
    """What names a study's runs: the study, its rungs and seeds, the output root and the spec overrides."""

    study: str = option(positional=True, metavar="STUDY",
                        help="a registered study (`marin-ablate studies`), path/to/file.py:attribute or "
                             "package.module:attribute (a Study or a function returning one)")
    rungs: str | None = option(None, metavar="A,B", help="comma-separated rungs (none: the study's)")
    seeds: str | None = option(None, metavar="0,1", help="comma-separated seeds (none: the study's)")
    out: str = option(DEFAULT_OUT, metavar="DIR", help="output root; runs go to OUT/STUDY/runs/RUN_ID")
    overrides: tuple[str, ...] = option((), spec=SPEC_SECTIONS, help="e.g. --data.corpus=DIR (a prepared corpus)")


@dataclass(frozen=True)
class ExecConfig:
    """How the runs execute: the executor and its row's options (`--NAME.FIELD`: each executor row that
    declares an `options` dataclass gets its section, `--slurm.time_min` the slurm row's)."""

    executor: str | None = option(None, metavar="NAME",
                                  help="a registered executor: local, debug, slurm (none: the study's, else local)")
    workers: int | None = option(None, lo=1, help="local: parallel worker processes (none: the study's "
                                                  "max_parallel, else 2)")
    threads: int | None = option(None, lo=1, help="local/debug: torch threads per worker (none: cpus // workers)")
    retry_failed: bool = option(False, help="run failed runs again (their old summary is kept aside)")
    no_wait: bool = option(False, help="submit and return (slurm)")
    gpu_mem_gib: float = option(79.1, lo=0, lo_open=True,
                                help="GiB per GPU: a GPU rung on fewer GPUs than its own (--slurm.gpus_per_run, or one "
                                     "GPU per run locally) takes the micro-batches that fit it (default: an H100)")
    backends: tuple = option((), sections=lambda: executor_sections(),
                             help="the {name} executor row's options; any of them implies --executor {name}")


def executor_sections() -> dict[str, type]:
    """{name: options dataclass} of the registered executors that declare one (plugins' included)."""
    from marin_ablate.sweeps.executors import EXECUTORS

    return {n: ex.options for n, ex in EXECUTORS.items() if getattr(ex, "options", None) is not None}


@dataclass(frozen=True)
class LogOptions:
    """Where the runs' metrics go and which checkpoints a finished run keeps."""

    log_to: str | None = option(None, metavar="SINKS", help="wandb,tensorboard: every run's metrics, grouped by "
                                "study, tagged with arm, rung and levels")
    keep_checkpoints: str | None = option(None, choices=("none", "final", "all"),
                                          help="what a completed run keeps: none (the default on CPU), final (its "
                                               "newest checkpoint; the default on GPU) or all; an unfinished run "
                                               "always keeps what it resumes from")


# ---------------------------------------------------------------------------------------------
# plan --preset: marin_ablate.describe does the arithmetic; the ladder rung of a preset is looked up here
# ---------------------------------------------------------------------------------------------


def rung_of_preset(preset_name: str) -> dict | None:
    """The batch, EP shards, token budget and overrides of the ladder rung named like the preset, else None."""
    from marin_ablate.ablations.ladders import RUNGS

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


def _csv(v: str | None, cast: Any = str) -> list | None:
    if v is None:
        return None
    try:
        return [cast(x.strip()) for x in v.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"cannot parse {v!r} as a comma-separated list of {cast.__name__}") from None


def study_from_args(opts: Any) -> Any:
    from marin_ablate.sweeps.sweep import resolve_study

    return resolve_study(opts.study, _csv(opts.rungs), _csv(opts.seeds, int))


def exec_options(cfg: ExecConfig, study: Any):
    """The ExecOptions of the command line's ExecConfig and the study's defaults: a `--NAME.*` section
    implies `--executor NAME`; its options reach the executor as `ExecOptions.options` (the slurm row's
    also as `ExecOptions.slurm`)."""
    from marin_ablate.sweeps.executors import EXECUTORS, ExecOptions, SlurmOptions

    ex = dict(getattr(study, "executor", ()) or ())
    given = dict(cfg.backends)
    if len(given) > 1:
        raise ValueError(f"{' and '.join(f'--{n}.*' for n in given)}: the options of {len(given)} executors; "
                         "allowed: one executor's section")
    executor = cfg.executor or next(iter(given), None) or ex.get("executor") or "local"
    if executor not in EXECUTORS:
        raise ValueError(f"--executor={executor!r} is not known; allowed values: {', '.join(EXECUTORS)}")
    for name in given:
        if name != executor:
            raise ValueError(f"--{name}.* options are the {name} executor's, given with --executor {executor}; "
                             f"allowed: --executor {name}, or no --{name}.* option")
    own = getattr(EXECUTORS[executor], "options", None)
    backend = given.get(executor, own() if own is not None else None)
    slurm = backend if executor == "slurm" else SlurmOptions()
    if slurm.array_parallelism is None and ex.get("slurm_array_parallelism"):
        slurm = replace(slurm, array_parallelism=ex["slurm_array_parallelism"])
        backend = slurm if executor == "slurm" else backend
    workers = cfg.workers if cfg.workers is not None else int(ex.get("max_parallel", 2))
    return ExecOptions(executor=executor, workers=workers, threads=cfg.threads, retry_failed=cfg.retry_failed,
                       gpu_mem_gib=cfg.gpu_mem_gib,
                       wait=not cfg.no_wait, slurm=slurm, options=backend)


def set_log_to(args: LogOptions) -> None:
    from marin_ablate.sweeps.tracking import KEEP_ENV, LOG_TO_ENV, parse_log_to

    if args.keep_checkpoints is not None:  # inherited like the sinks
        os.environ[KEEP_ENV] = args.keep_checkpoints
    if args.log_to is not None:  # the worker processes inherit it (sweeps/tracking.py)
        from marin_ablate.marin.train.metrics import check_log_to

        names = parse_log_to(args.log_to)
        check_log_to(names)  # before any run is launched: a missing backend would fail every run
        os.environ[LOG_TO_ENV] = ",".join(names)


# ---------------------------------------------------------------------------------------------
# Shared checks and tables
# ---------------------------------------------------------------------------------------------


def epochs_checked(study: Any, runs: Sequence[tuple[Any, dict]], rung_rows: list[dict] | None = None,
                   allow_repeat: bool = False) -> list[dict]:
    """Per rung: tokens needed, tokens in the corpus, epochs; ValueError when a GPU rung's data
    would be the embedded corpus or would repeat without --allow-repeat (ablations/epochs.py).
    `runs`: the study's planned (spec, meta), overrides applied; `rung_rows`: its `describe()["rungs"]`."""
    from marin_ablate.ablations.epochs import check_epochs, study_epoch_rows
    from marin_ablate.marin.data.mixture import check_mixture_domains

    rows = study_epoch_rows(rung_rows if rung_rows is not None else study.describe()["rungs"], runs)
    check_epochs(rows, allow_repeat)
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
