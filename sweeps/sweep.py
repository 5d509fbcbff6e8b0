"""Run a study: plan its runs, write their directories, submit what is not done, wait, report.

`run_study(study, out, opts)` is the Python API behind `marin-ablate run`; `study_status` behind
`marin-ablate status`. A study is anything with `name`, `runs(rungs=)` returning
[(RunSpec, meta)], as `ablations.studies.Study` (docs/architecture.md §4)."""

from __future__ import annotations

import importlib
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from marin_ablate.ablations.epochs import check_study_epochs
from marin_ablate.ablations.studies import STUDIES, build_study, get_study
from marin_ablate.marin import plugins
from marin_ablate.marin.config import Recipe
from marin_ablate.marin.fields import option
from marin_ablate.marin.schema import read_json
from marin_ablate.planning import costmodel
from marin_ablate.planning.costmodel import slowdown_now
from marin_ablate.planning.hero import hero_resources
from marin_ablate.sweeps import state
from marin_ablate.sweeps.executors import EXECUTORS, ExecOptions, Submission, get_executor, validate, wait
from marin_ablate.sweeps.progress import Progress, eta_model, run_flops, run_live, rung_prior, study_eta
from marin_ablate.sweeps.runs import PlannedRun, clear_failure, plan_runs, spec_json, study_dir, write_runs

STUDY_NAME_FORMS = "a registered study, path/to/file.py:attribute or package.module:attribute"


def resolve_study(name: str, rungs: Sequence[str] | None = None, seeds: Sequence[int] | None = None) -> Any:
    """A registered study (`ablations.studies.get_study`), `path/to/file.py:attribute` (the file is
    loaded from where it is; no PYTHONPATH) or `package.module:attribute`. The attribute is a Study
    or a builder; `rungs`/`seeds` go to a builder that takes them, else restrict the study
    (`ablations.studies.build_study`)."""
    if ":" not in name:
        if name not in STUDIES:
            raise ValueError(f"unknown study {name!r}; allowed values: {', '.join(STUDIES)} "
                             f"(or path/to/file.py:attribute, package.module:attribute)")
        return get_study(name, rungs, seeds)
    where, _, attr = name.rpartition(":")
    if not where or not attr.isidentifier():
        raise ValueError(f"study {name!r}: allowed values: {STUDY_NAME_FORMS}")
    try:
        module = plugins.load_file(where) if where.endswith(".py") or "/" in where else importlib.import_module(where)
    except FileNotFoundError:
        raise ValueError(f"study {name!r}: no file {where!r}; allowed values: {STUDY_NAME_FORMS}") from None
    except plugins.FOREIGN_FAILURES as e:  # any failure (or exit) importing a user's module is a bad study name
        raise ValueError(f"study {name!r}: cannot import ({type(e).__name__}: {e})") from None
    if not hasattr(module, attr):
        raise ValueError(f"study {name!r}: {where} has no attribute {attr!r}")
    return build_study(getattr(module, attr), name, rungs, seeds)


def planned_runs(study: Any, out: str | Path, *, lr_multipliers: Mapping[int, Mapping[str, float]] | None = None,
                 rungs: Sequence[str] | None = None, overrides: Sequence[str] = (),
                 sdir: Path | None = None, provenance: Mapping[str, Any] | None = None) -> list[PlannedRun]:
    """The study's runs with the command line's overrides, at the LR multipliers `lr_plan` chose
    ({seed: {arm: multiplier}}; `provenance`, how they were set, is recorded in each meta.json)."""
    runs = study.runs(rungs=rungs)
    if overrides:
        runs = [(s.with_overrides(overrides), m) for s, m in runs]
    sdir = sdir or study_dir(out, study.name)
    return at_lrs(plan_runs(runs, sdir), sdir, lr_multipliers, provenance, overrides)


def at_lrs(runs: Sequence[PlannedRun], sdir: Path, lr_multipliers: Mapping[int, Mapping[str, float]] | None,
           provenance: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()) -> list[PlannedRun]:
    """Planned runs at the heuristic LRs -> the same runs at their arm's multiplier at their seed
    ({seed: {arm: multiplier}}, the one shape of docs/method.md §4.6): only `TrainConfig.lr_scale` changes (and
    with it the run id), so what was checked of them holds. A `--train.lr_scale=V` override keeps V. Every seed of
    the runs needs its mapping, and every arm it names must be one of theirs."""
    if not lr_multipliers and not provenance:
        return list(runs)
    seeds = list(dict.fromkeys(r.meta.get("seed") for r in runs))  # in the design's order
    arms = list(dict.fromkeys(r.meta.get("arm") for r in runs))
    mult = {s: dict(m) for s, m in (lr_multipliers or {}).items()
            if isinstance(s, int) and not isinstance(s, bool) and isinstance(m, Mapping)}
    if lr_multipliers and [s for s in seeds if s not in mult]:
        missing = ", ".join(str(s) for s in seeds if s not in mult)
        raise ValueError(f"lr_multipliers give no seed {missing}; allowed values: {{seed: {{arm: multiplier}}}} with "
                         f"every seed of the study ({', '.join(map(str, seeds))})")
    bad = sorted({str(a) for m in mult.values() for a in m if a not in arms})
    if bad:
        raise ValueError(f"lr_multipliers name unknown arm(s) {bad}; allowed values: {', '.join(map(str, arms))}")
    keep = any(o.split("=", 1)[0].strip() == "train.lr_scale" for o in overrides)
    out = []
    for r in runs:
        spec = r.spec
        if mult and not keep:
            m = float(mult[r.meta["seed"]].get(r.meta["arm"], 1.0))
            spec = replace(spec, train=replace(spec.train, lr_scale=m))
        meta = {**r.meta, **provenance, "lr_multiplier": float(spec.train.lr_scale)} if provenance else r.meta
        out.append((spec, meta))
    return plan_runs(out, sdir)


def _spec_key(r: PlannedRun) -> str:
    """What a run's checks depend on: its spec without the seed (a study's seeds share them)."""
    return spec_json({k: v for k, v in r.spec.to_dict().items() if k != "seed"})


def _where(r: PlannedRun) -> str:
    return ", ".join(f"{k} {r.meta[k]}" for k in ("rung", "arm") if r.meta.get(k) is not None)


def check_specs(runs: Sequence[PlannedRun], executor: str) -> None:
    """What `train` checks of a spec before it writes anything (marin.train.loop.check_spec), for every
    run, before any run directory is written or a run launched; the device is checked on this machine
    only where the executor trains here. The error names the run."""
    from marin_ablate.marin.train.loop import check_spec

    here = get_executor(executor).trains_here
    seen: set[str] = set()
    for r in runs:
        key = _spec_key(r)  # the seeds share their checks
        if key in seen:
            continue
        seen.add(key)
        try:
            check_spec(r.spec, here=here)
        except ValueError as e:
            raise ValueError(f"run {r.run_id} ({_where(r)}): {e}") from None


def analysis_refusal(runs: Sequence[PlannedRun]) -> str | None:
    """Why `analyze` would refuse these runs' table before any fit, in one line, else None (`refusal_of_counts`)."""
    return refusal_of_counts(len(runs), len({r.spec.seed for r in runs}))


def refusal_of_counts(rows: int, n: int) -> str | None:
    """Why `analyze` would refuse a table of `rows` runs over `n` seeds before any fit, in one line, else None: its
    joint law fit carries one loss shift per seed, so it costs about rows x seeds^2 per step and refuses a table
    beyond analysis.table_shape.JOINT_COST_MAX. `run` refuses such a study before anything is planned or written,
    `plan` says so."""
    if n < 2:
        return None
    from marin_ablate.analysis.table_shape import JOINT_COST_MAX

    if rows * n * n <= JOINT_COST_MAX:
        return None
    per_seed = rows / n  # the runs of one seed: the study's arms x rungs
    most = int((JOINT_COST_MAX / per_seed) ** (1 / 3))
    while per_seed * (most + 1) ** 3 <= JOINT_COST_MAX:  # the float cube root may fall one short
        most += 1
    return (f"{rows:,} runs of {n:,} seeds: `analyze` refuses their table (its joint law fit carries one loss shift "
            f"per seed and costs about rows x seeds^2 = {rows * n * n:.2g} per step, beyond {JOINT_COST_MAX:.0e}); "
            f"allowed values: --seeds with at most {most} seeds ({per_seed:,.0f} runs each)")


def check_layouts(runs: Sequence[PlannedRun], opts: ExecOptions, resources: Any) -> None:
    """Every multi-GPU run's world (`--slurm.gpus_per_run` or its rung's GPUs) tiles its EP groups and splits its
    batches (marin.train.distributed.check_dist_layout), before anything is written or submitted: a run
    that would fail at its first collective is refused here, named."""
    from marin_ablate.marin.train.distributed import check_dist_layout
    from marin_ablate.marin.train.stages import context_plan

    if opts.executor != "slurm" or resources is None:
        return
    seen: set[tuple[str, int]] = set()
    for r in runs:
        gpus = opts.slurm.gpus_per_run if opts.slurm.gpus_per_run is not None else int(resources(r).get("gpus") or 0)
        key = (_spec_key(r), gpus)
        if gpus <= 1 or key in seen:
            continue
        seen.add(key)
        try:
            check_dist_layout(r.spec, context_plan(r.spec), gpus)
        except ValueError as e:
            raise ValueError(f"run {r.run_id} ({_where(r)}) on {gpus} GPUs: {e}; use --slurm.gpus_per_run a "
                             f"divisor or a multiple of its ModelConfig.ep_shards={r.spec.model.ep_shards}, or the "
                             "rung's own GPUs") from None


def study_resources(study: Any, sdir: Path | None = None) -> Any:
    """run -> {gpus, time_min, cpus_per_task, mem_gb} from the study's rungs and executor defaults
    (the hero: its whole job shape; `sdir`, the study folder, keeps its pre-flight reports)."""
    ex = dict(getattr(study, "executor", ()) or ())
    rungs = getattr(study, "rungs", ())
    gpus_by_rung = {r.name: int(getattr(r, "gpus", 0) or 0) for r in rungs}
    tasks_by_rung = {r.name: (int(getattr(r, "nodes", 1)), int(getattr(r, "tasks_per_node", 1))) for r in rungs}
    try:
        timeouts = {r["name"]: int(r["timeout_min"]) for r in study.describe().get("rungs", []) if r.get("timeout_min")}
    except Exception:  # noqa: BLE001 - a study without describe(): executor defaults only
        timeouts = {}
    hero = getattr(study, "hero", None)  # the hero: its layout, 4 h jobs requeued until done (planning/hero.py)
    hero_res = None if hero is None else hero_resources(
        hero, folder=str(Path(sdir).resolve() / "preflight") if sdir else "$SLURM_SUBMIT_DIR")

    def resources(run: PlannedRun) -> dict:
        rung = run.meta.get("rung")
        if hero_res is not None:
            return hero_res
        gpus = int(ex.get("gpus_per_run") or gpus_by_rung.get(rung, 0))
        cpus = int(ex.get("cpus_per_gpu", 1)) if gpus else int(ex.get("cpus_per_task", 1))
        per_node = int(ex.get("gpus_per_node", 8))
        # sbatch --mem is per node
        mem = (float(ex["mem_gb_per_gpu"]) * min(gpus, per_node) if gpus and ex.get("mem_gb_per_gpu")
               else ex.get("mem_gb"))
        nodes, tasks = tasks_by_rung.get(rung, (1, 1))
        return {"gpus": gpus, "gpus_per_node": per_node, "nodes": nodes, "tasks_per_node": tasks,
                "time_min": timeouts.get(rung) or ex.get("timeout_min") or 60, "cpus_per_task": cpus, "mem_gb": mem}

    return resources


# ---- How a study's runs execute: the command line's options and the study's defaults -------------


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


# ---- run / status --------------------------------------------------------------------------------


@dataclass
class RunReport:
    study: str
    study_dir: Path
    n_runs: int
    submitted: int
    skipped: dict[str, int]
    job_ids: list[str]
    counts: dict[str, int]
    submission: Submission | None = field(default=None, repr=False)

    def lines(self, shows_jobs: bool = False) -> list[str]:
        """What was submitted (with its job ids where the executor has them) and the runs' states, for the console."""
        skipped = ", ".join(f"{v} {k}" for k, v in self.skipped.items()) or "none"
        jobs = sorted({j.split("_")[0] for j in self.job_ids})
        where = f" as job(s) {', '.join(jobs)}" if shows_jobs else ""
        c = self.counts
        return [f"{self.study}: nothing to submit ({self.n_runs} runs; skipped: {skipped})" if self.submitted == 0 else
                f"{self.study}: {self.submitted} of {self.n_runs} runs submitted to {self.submission.executor}{where} "
                f"(skipped: {skipped})",
                f"{self.study}: " + ", ".join(f"{c[k]} {k}" for k in state.STATES if c.get(k)
                                              or k in ("completed", "failed")) + f"; results in {self.study_dir}"]


@dataclass
class StudyPlan:
    """A study's design, planned once (`plan_study`): its runs at the heuristic LRs with the overrides and layouts
    applied. `check` makes every check `preflight` makes, once, before the LR profile or the reference ladder
    writes anything; `at_lrs` gives the same runs at the LRs the profile chose; `run_plan` writes and submits them."""

    study: Any
    sdir: Path
    runs: list[PlannedRun]
    opts: ExecOptions
    resources: Any
    overrides: tuple[str, ...] = ()
    checked: bool = False

    def check(self) -> StudyPlan:
        if not self.checked:
            refused = analysis_refusal(self.runs)  # thousands of seeds `analyze` would refuse: before any write
            if refused:
                raise ValueError(refused)
            preflight(self.runs, self.sdir, self.opts, self.resources)
        return replace(self, checked=True)

    def at_lrs(self, lr_multipliers: Mapping[int, Mapping[str, float]] | None,
               provenance: Mapping[str, Any] | None = None) -> StudyPlan:
        return replace(self, runs=at_lrs(self.runs, self.sdir, lr_multipliers, provenance, self.overrides))


def plan_study(study: Any, out: str | Path, opts: ExecOptions, *, rungs: Sequence[str] | None = None,
               overrides: Sequence[str] = (), epochs: bool = False, allow_repeat: bool = False) -> StudyPlan:
    """The study's design planned (nothing checked or written yet: `StudyPlan.check`); `epochs`: each rung's data
    checked against its corpus first (ablations/epochs.py: refused when unfit, more than one epoch without
    `allow_repeat`), as `run` does."""
    sdir = study_dir(out, study.name)
    n_rungs = len(rungs) if rungs is not None else len(study.rungs)
    refused = refusal_of_counts(study.design.n_runs * n_rungs * len(study.seeds), len(study.seeds))
    if refused:  # before thousands of specs are built: `run` spent 45 s planning a table `analyze` refuses
        raise ValueError(refused)
    runs = planned_runs(study, out, rungs=rungs, overrides=overrides, sdir=sdir)
    if epochs:
        check_study_epochs([(r.spec, r.meta) for r in runs], study.describe()["rungs"], allow_repeat)
    hero = getattr(study, "hero", None)
    for r in runs if hero is not None else ():  # the layout the hero's job shape was planned for
        hero.check(r.spec)
    if hero is None:
        runs = with_layouts(runs, opts, study)
    return StudyPlan(study, sdir, runs, opts, study_resources(study, sdir), tuple(overrides))


def run_plan(plan: StudyPlan, *, progress: bool = True) -> RunReport:
    """A plan's runs checked (unless `check` was), written, the unfinished ones submitted, waited for."""
    plan = plan.check()
    return run_planned(plan.runs, plan.sdir, plan.opts, resources=plan.resources, label=plan.study.name,
                       progress=progress, rung_rows=plan.study.describe()["rungs"], checked=True)


def run_study(study: Any, out: str | Path, opts: ExecOptions, *,
              lr_multipliers: Mapping[int, Mapping[str, float]] | None = None, rungs: Sequence[str] | None = None,
              overrides: Sequence[str] = (), progress: bool = True,
              provenance: Mapping[str, Any] | None = None) -> RunReport:
    """Plan and check (before anything is written or submitted), write run dirs, submit the runs that are not
    done, and (opts.wait) wait for them with a progress line."""
    plan = plan_study(study, out, opts, rungs=rungs, overrides=overrides).check()
    return run_plan(plan.at_lrs(lr_multipliers, provenance), progress=progress)


def gpus_per_run(r: PlannedRun, opts: ExecOptions, own: int) -> int:
    """The GPUs a GPU run gets: --slurm.gpus_per_run (else its rung's own) under slurm, one elsewhere."""
    if opts.executor == "slurm":
        return opts.slurm.gpus_per_run if opts.slurm.gpus_per_run is not None else own
    return 1


def with_layouts(runs: Sequence[PlannedRun], opts: ExecOptions, study: Any) -> list[PlannedRun]:
    """GPU runs on fewer GPUs than their rung's own count train in the layout planning.layout picks for
    ExecOptions.gpu_mem_gib (virtual EP shards, TrainConfig.micro_batches; not in the run id: the same runs).
    One layout per rung, the larger micro-batch count of its recipe and baseline arms' (the arms' memory
    differs little; measuring each of 32 arms would take half an hour of CPU at submission)."""
    from marin_ablate.planning.layout import cached_layout, with_layout

    own = {r.name: int(r.gpus) for r in getattr(study, "rungs", ())}
    by_rung: dict[Any, list[PlannedRun]] = {}
    for r in runs:
        by_rung.setdefault(r.meta.get("rung"), []).append(r)
    k_of: dict[Any, int] = {}
    for rung, rs in by_rung.items():
        gpus = gpus_per_run(rs[0], opts, own.get(rung, 0))
        if not rs[0].spec.train.device.startswith("cuda") or not gpus or gpus >= own.get(rung, 0):
            continue
        reps = [r for r in rs if r.spec.recipe in (Recipe(), Recipe.baseline())] or rs[:1]
        try:
            k_of[rung] = max(cached_layout(r.spec, gpus, opts.gpu_mem_gib)["micro_batches"] for r in reps)
        except ValueError as e:
            raise ValueError(f"rung {rung} on {gpus} GPU(s): {e}") from None
    return [PlannedRun(with_layout(r.spec, {"micro_batches": k_of[r.meta.get("rung")]}), r.meta, r.dir)
            if r.meta.get("rung") in k_of else r for r in runs]


def check_reachable(runs: Sequence[PlannedRun], ex: Any) -> None:
    """An executor whose workers are other processes gets each run's rows by import (marin.plugins):
    an optimizer level registered inside a function cannot reach them; refused before anything is written."""
    if ex.in_process:
        return
    bad = plugins.unreachable("optimizer", sorted({r.spec.recipe.optimizer for r in runs}))
    if bad:
        raise ValueError(f"Recipe.optimizer={bad[0]!r} was registered inside a function, so a {ex.name} worker "
                         "cannot import it; register it at a module's top level (a study file, FILE.py:NAME) or "
                         f"by a {plugins.ENTRY_POINT_GROUP!r} entry point; allowed executors here: debug")


class Terminated(KeyboardInterrupt):
    """SIGTERM to the driver: handled as Ctrl-C is (workers checkpoint and stop), exit 128+15."""

    signum = signal.SIGTERM


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def preflight(runs: Sequence[PlannedRun], sdir: Path, opts: ExecOptions, resources: Any = None) -> Any:
    """Everything refused before a run directory is written, in one place: what `train` refuses of each
    spec (`check_specs`), multi-GPU layouts (`check_layouts`), the executor's options and the output folder
    (`validate`), plugin rows a worker process cannot import (`check_reachable`). Returns the executor."""
    check_specs(runs, opts.executor)
    check_layouts(runs, opts, resources)
    validate(opts, sdir)
    ex = get_executor(opts.executor)
    check_reachable(runs, ex)
    return ex


def run_planned(runs: Sequence[PlannedRun], sdir: Path, opts: ExecOptions, *, resources: Any = None,
                label: str = "", progress: bool = True, rung_rows: Sequence[dict] | None = None,
                checked: bool = False) -> RunReport:
    """Validate (`preflight`: nothing is written before), write run dirs, submit what is not done, wait
    (opts.wait). `rung_rows`: the study's `describe()["rungs"]`, whose assumed throughput is the progress
    line's ETA prior (`sweeps.progress.rung_prior`); `checked`: `StudyPlan.check` made the checks already.

    SIGTERM to this process (a job's time limit, `kill`) is treated as Ctrl-C: local workers get
    SIGTERM in turn (each run checkpoints at its next step) and the driver exits non-zero."""
    ex = get_executor(opts.executor) if checked else preflight(runs, sdir, opts, resources)
    started = time.time()
    write_runs(runs, sdir)
    todo, skipped = state.select(runs, opts.retry_failed)
    if opts.retry_failed:  # cleared here, once: two workers must not both retry the same run
        for r in todo:
            clear_failure(r.dir)
    slots = ex.slots(opts)
    prog = Progress(len(runs), label or sdir.name, runs=runs, prior=rung_prior(rung_rows) if rung_rows else None,
                    slots=slots) if progress else None
    dirs = [r.dir for r in runs]
    main = threading.current_thread() is threading.main_thread()
    prev_term = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    sub = Submission(ex.name)
    try:
        sub = ex.submit(todo, sdir, opts, resources, (lambda: prog.update(state.count_dirs(dirs))) if prog else None)
        if todo and opts.wait and ex.waits:
            counts = wait(sub, runs, poll_s=opts.poll_s, progress=prog)
            sub.release()
        else:
            counts = state.count_dirs(dirs)
            if prog:
                prog.update(counts)
                prog.close()
    except BaseException:  # Ctrl-C, SIGTERM, or a failure of the driver itself: never orphan the workers
        if prog:
            prog.close()
        msg = ex.cancel(sub)
        if msg:
            print(f"{msg} ({sdir})", file=sys.stderr)
        raise
    finally:
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)
        # this host's measured run times, for the next plan's and ETA's cost model
        k = slots or 1
        costmodel.record(costmodel.mark_cold(costmodel.finished(r.dir for r in todo), started, k), k)
    return RunReport(label or sdir.name, sdir, len(runs), len(todo), skipped, sub.job_ids, counts, sub)


def study_status(study: Any, out: str | Path, *, lr_multipliers: Mapping[int, Mapping[str, float]] | None = None,
                 rungs: Sequence[str] | None = None, overrides: Sequence[str] = ()) -> dict:
    """`marin-ablate status`: counts by state, one row per run (run_id, rung, arm, seed, state, error, job, its
    progress: step of total, loss, elapsed), and the ETA of the runs left with its 90% interval."""
    runs = planned_runs(study, out, lr_multipliers=lr_multipliers, rungs=rungs, overrides=overrides)
    statuses = state.survey(r.dir for r in runs)
    rows = []
    for r, st in zip(runs, statuses, strict=True):
        row = {"run_id": r.run_id, "rung": r.meta.get("rung"), "arm": r.meta.get("arm"), "seed": r.meta.get("seed"),
               "state": st.state, "error": st.error, "damaged": st.damaged, "job_id": st.job.get("job_id"),
               "eval_macro_loss": st.summary.get("eval_macro_loss") if st.state == "completed" else None,
               "step": None, "total": None, "loss": None, "elapsed_s": None}
        if st.state.split(",")[0] in ("running", "partial"):
            row.update(run_live(r.dir))
        elif st.state == "completed":
            summ = read_json(r.dir / "summary.json") or {}
            row.update(step=summ.get("step"), loss=summ.get("final_train_loss"), wall_s=summ.get("wall_s"),
                       total=run_live(r.dir)["total"])
        rows.append(row)
    counts = state.count(statuses)
    slots = max(1, counts.get("running", 0))
    k, note = slowdown_now(slots)  # the load now: the running runs (ours) included
    eta = study_eta([dict(r, state=r["state"].split(",")[0], flops=run_flops(x.dir)) for r, x in zip(rows, runs,
                                                                                                       strict=True)],
                    eta_model(rung_prior(study.describe()["rungs"]), slots), slots, k or 1.0, note)
    left = counts["completed"] + counts["failed"] < len(runs)
    return {"study": study.name, "study_dir": str(study_dir(out, study.name)), "n_runs": len(runs), "counts": counts,
            "runs": rows, "eta": eta if left else None, "eta_s": (eta.seconds if eta else None) if left else 0.0,
            "eta_90": [eta.lo, eta.hi] if eta and left else None}
