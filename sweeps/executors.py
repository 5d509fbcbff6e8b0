"""Executors: how a study's runs get executed (docs/architecture.md §4-5), each an `Executor` row of the registry
(sweeps/executor_api.py), so the driver and sweeps/state.py ask it by name and never compare names:
`slurm` (one submitit job array per resource group, each task a checkpointable `RunJob` that SIGUSR2 requeues),
`local` (`workers` submitit processes, each claiming runs through their run lock) and `debug` (in this process:
pdb works). Everything checkable is validated before anything is submitted, naming the field."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from marin_ablate.marin import plugins
from marin_ablate.marin.config import POS_INT, check_ranges, optional
from marin_ablate.marin.fields import check_fields, option
from marin_ablate.planning.slurm import SlurmOptions, sbatch_params  # noqa: F401  (re-exported)
from marin_ablate.sweeps.executor_api import EXECUTORS, Executor, get_executor, register_executor  # noqa: F401  (re-exported)
from marin_ablate.sweeps.progress import Progress
from marin_ablate.sweeps.runs import PlannedRun, RunTask, atomic_write_json, execute, read_json, record_failure
from marin_ablate.sweeps.state import count_dirs, needs_run, probe
from marin_ablate.sweeps.tracking import env_set


@dataclass(frozen=True)
class ExecOptions:
    executor: str = "local"
    workers: int = 2  # local: processes; slurm: ignored (array parallelism decides)
    threads: int | None = None  # local: torch threads per worker (None: cpus // workers, at least 1)
    retry_failed: bool = False
    wait: bool = True
    gpu_mem_gib: float = 79.1  # per GPU: the layout of a GPU rung on fewer GPUs than its own (planning/layout.py)
    poll_s: float = option(2.0, lo=0, lo_open=True)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    options: Any = None  # the executor row's own `options` (its `--NAME.*` section); slurm's is `slurm` too

    def __post_init__(self) -> None:
        check_ranges("ExecOptions", self, EXEC_RANGES)
        check_fields(self, "ExecOptions")


EXEC_RANGES = {"workers": POS_INT, "threads": optional(POS_INT)}


def _sinfo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sinfo", *args], capture_output=True, text=True, timeout=60)


def validate(opts: ExecOptions, out_dir: str | Path) -> None:
    """Everything that can be checked before a submission; raises ValueError naming the field."""
    get_executor(opts.executor).validate(opts)
    p = Path(out_dir)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write-probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"out={str(p)!r} is not a writable folder ({e.strerror or e})") from None


# ---- Worker side ---------------------------------------------------------------------------------


def _job_id() -> str | None:
    import submitit

    try:
        return submitit.JobEnvironment().job_id
    except RuntimeError:
        return None


def _set_threads(threads: int | None) -> None:
    n = threads or (int(os.environ["SLURM_CPUS_PER_TASK"]) if os.environ.get("SLURM_CPUS_PER_TASK") else None)
    if n:
        os.environ["OMP_NUM_THREADS"] = str(n)
        import torch

        torch.set_num_threads(n)


def _distributed_setup() -> int:
    """One task per device: export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from SLURM's
    environment (marin.rendezvous: the master is the job's first node, resolved); returns rank."""
    from marin_ablate.marin.rendezvous import from_env

    if int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return 0
    # the submitting shell's variables (sbatch exports them) must not override SLURM's own
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(k, None)
    r = from_env()
    r.export()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if "," in visible:  # SLURM gave the task every GPU of the node: keep the one of its local rank
        os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[r.local_rank % len(visible.split(","))]
    return r.rank


def _mark_job(task: RunTask, job_id: str | None) -> None:
    d = Path(task.dir)
    rec = read_json(d / "job.json") or {}
    rec.update(job_id=job_id, host=os.uname().nodename, pid=os.getpid(), started=time.time())
    atomic_write_json(d / "job.json", rec)


class Requeueable:
    """submitit's `helpers.Checkpointable` without importing submitit where a job is not submitted (`train` and
    `plan` run on machines without it): submitit's USR2 handler calls `checkpoint` on any callable that has one,
    which resubmits this call unchanged."""

    def checkpoint(self, *args: Any, **kwargs: Any):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


class RunJob(Requeueable):
    """One array task = one run. Checkpointable: submitit's USR2 handler calls `checkpoint(task)`
    (inherited: a DelayedSubmission of this object with the same task) and requeues the job;
    train has already written its checkpoint by then, so the requeued task resumes from it."""

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def __call__(self, task: RunTask) -> dict:
        try:
            plugins.ensure(task.plugins)  # the rows its spec names, before every rank builds it
        except ImportError:
            pass  # rank 0's `execute` records it as the run's error (a job that died would leave no reason)
        _set_threads(self.threads)
        rank = _distributed_setup()
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # where each rank ran (host names differ per node)
            atomic_write_json(Path(task.dir) / "ranks" / f"{rank}.json",
                              {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", 0)), "job_id": _job_id(),
                               "host": os.uname().nodename, "master": f"{os.environ.get('MASTER_ADDR')}:"
                                                                    f"{os.environ.get('MASTER_PORT')}"})
        if rank != 0:  # the run's files belong to rank 0; other ranks only train
            from marin_ablate.marin.train import train
            from marin_ablate.sweeps.tracking import retention

            # the same retention as rank 0 (sweeps.tracking.tracked_train): the final save is collective,
            # so a rank that skipped it would wait for the others in the summary's broadcast forever
            train(task.spec, task.dir, resume=True, keep_checkpoints=retention(task.spec))
            return {"run_id": task.run_id, "outcome": "rank", "status": None, "error": None}
        _mark_job(task, _job_id())
        return execute(task)


class Worker(Requeueable):
    """A local worker: executes the tasks in order, claiming each through its run lock; stops
    after a run was interrupted by a signal (the run stays resumable)."""

    def __init__(self, threads: int | None = 1):
        self.threads = threads

    def __call__(self, tasks: Sequence[RunTask]) -> list[dict]:
        # submitit ignores SIGTERM in jobs; a worker between runs must stop on it (train handles
        # it during a run: checkpoint, return "interrupted")
        stop: list[int] = []
        prev = signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
        try:
            _set_threads(self.threads)
            jid = _job_id()
            out = []
            for task in tasks:
                if stop:
                    break
                if not needs_run(probe(task.dir).state, task.retry_failed):
                    continue
                _mark_job(task, jid)
                res = execute(task)
                out.append(res)
                if res["outcome"] == "interrupted":
                    break
            return out
        finally:
            signal.signal(signal.SIGTERM, prev)


# ---- Driver side ---------------------------------------------------------------------------------


@dataclass
class Submission:
    """What an executor started: submitit jobs and the runs they cover."""

    executor: str
    jobs: list = field(default_factory=list)
    runs: list[PlannedRun] = field(default_factory=list)
    folder: Path | None = None
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    released: list[str] = field(default_factory=list)  # ids of the finished jobs `release` dropped

    @property
    def job_ids(self) -> list[str]:
        return [*self.released, *(j.job_id for j in self.jobs)]

    def release(self) -> None:
        """Drop the job objects once every job has finished, keeping their ids: a submitit LocalJob still alive
        when the interpreter exits reads its folder through half-torn-down modules in `__del__` and prints an
        "Exception ignored" traceback per job."""
        self.released += [str(j.job_id) for j in self.jobs]
        self.jobs.clear()


def _folder(study_dir: Path, executor: str) -> Path:
    # a fresh submitit folder per submission: job ids can repeat across clusters/state wipes
    return study_dir / "submitit" / f"{executor}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


def _submit_local(tasks: list[RunTask], sub: Submission, opts: ExecOptions) -> None:
    cpus = os.cpu_count() or 1
    threads = opts.threads or max(1, cpus // opts.workers)
    import submitit

    ex = submitit.LocalExecutor(folder=sub.folder)
    # a worker runs many runs: no wall-clock limit of its own (runs have their own budget)
    ex.update_parameters(timeout_min=7 * 24 * 60)
    # Workers start with SIGINT ignored (an ignored signal stays ignored across exec): Ctrl-C in
    # the terminal reaches the whole foreground group, and submitit's controller would die on it
    # and SIGKILL its run a second later, before the run could checkpoint. The driver catches
    # Ctrl-C alone and SIGTERMs the workers (stop_local): each run checkpoints at its next step.
    main = threading.current_thread() is threading.main_thread()
    prev_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        with env_set({"OMP_NUM_THREADS": str(threads)}), ex.batch():  # inherited by the worker processes
            for _ in range(min(opts.workers, len(tasks))):
                sub.jobs.append(ex.submit(Worker(threads), tasks))
    finally:
        if prev_sigint is not None:
            signal.signal(signal.SIGINT, prev_sigint)


#: The resources a refused sbatch names, in its one-line error (`--slurm.FIELD` and the study's executor block).
SBATCH_ASKED = ("partition", "account", "nodes", "gpus", "gpus_per_node", "cpus_per_task", "mem_gb", "time_min",
                "additional")


def _submit_slurm(runs: Sequence[PlannedRun], tasks: list[RunTask], sub: Submission, study_dir: Path,
                  opts: ExecOptions, resources: Callable | None) -> None:
    """One array per resource group."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(runs):
        res = slurm_resources(r, opts.slurm, resources)
        groups.setdefault(tuple(sorted(res.items())), []).append(i)
    import submitit
    from submitit.core.utils import FailedJobError

    max_size = slurm_max_array_size()
    for key, idx in groups.items():
        res = dict(key)
        # SLURM refuses an array with an index >= MaxArraySize: a larger group goes in as several arrays
        for chunk in (idx[k:k + max_size] for k in range(0, len(idx), max_size)):
            ex = submitit.SlurmExecutor(folder=sub.folder, max_num_timeout=res["max_num_timeout"],
                                        python=res.get("python"))
            ex.update_parameters(**sbatch_params(res, opts.slurm, len(chunk), study_dir.name))
            try:
                jobs = ex.map_array(RunJob(None), [tasks[i] for i in chunk])
            except FailedJobError as e:  # sbatch said no (a resource the cluster cannot give, an unknown option)
                _log_submission(study_dir, sub)
                said = "; ".join(ln.removeprefix("sbatch: error: ").strip() for ln in str(e).splitlines() if ln.strip())
                asked = ", ".join(f"{k}={res[k]}" for k in SBATCH_ASKED if res.get(k) not in (None, 0, False, ()))
                raise ValueError(f"sbatch refused an array of {len(chunk)} run(s) asking {asked}: {said}"
                                 + (f" ({len(sub.job_ids)} run(s) went in before it and stay queued)" if sub.job_ids
                                    else " (nothing was submitted)")) from None
            for i, j in zip(chunk, jobs, strict=True):
                record_job(runs[i], "slurm", j.job_id, folder=str(sub.folder))
            sub.jobs.extend(jobs)
    _log_submission(study_dir, sub)


def record_job(run: PlannedRun, executor: str, job_id: str, **extra: Any) -> None:
    """job.json of a submitted run: the executor that holds it and its job id (`sweeps/state.py`
    asks that executor whether the job still waits, so the run is not submitted twice)."""
    rec = read_json(run.dir / "job.json") or {}
    rec.update(executor=executor, job_id=job_id, submitted=time.time(), **extra)
    atomic_write_json(run.dir / "job.json", rec)


def slurm_max_array_size(default: int = 1001) -> int:
    """The cluster's MaxArraySize (`scontrol show config`; SLURM's default 1001 when it cannot be read)."""
    try:
        r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return default
    for line in r.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return max(1, int(value.strip()))
    return default


def slurm_resources(run: PlannedRun, s: SlurmOptions, resources: Callable | None) -> dict:
    base = dict(resources(run)) if resources else {}
    gpus = s.gpus_per_run if s.gpus_per_run is not None else int(base.get("gpus", 0) or 0)
    time_min = s.time_min or int(base.get("time_min") or 60)
    cpus = s.cpus_per_task or int(base.get("cpus_per_task") or 1)
    mem = s.mem_gb if s.mem_gb is not None else base.get("mem_gb")
    per_node = int(base.get("gpus_per_node") or 8)
    res = {"gpus": gpus, "gpus_per_node": min(gpus, per_node) if gpus else 0, "time_min": time_min,
           "cpus_per_task": cpus, "mem_gb": mem, "exclusive": bool(base.get("exclusive")),
           "nodes": 1 if gpus else int(s.nodes or base.get("nodes") or 1),
           "tasks_per_node": 1 if gpus else int(s.tasks_per_node or base.get("tasks_per_node") or 1),
           "max_num_timeout": max(s.max_num_timeout, int(base.get("max_num_timeout") or 0))}
    # a study's own job shape (the hero: planning/hero.py), hashable so runs group by it
    for k in ("signal_delay_s", "python", "setup", "srun_args", "additional", "job_name", "partition", "account"):
        if base.get(k) is not None:
            res[k] = base[k]
    return res


def _log_submission(study_dir: Path, sub: Submission) -> None:
    rec = {"time": time.time(), "executor": sub.executor, "folder": str(sub.folder),
           "job_ids": sub.job_ids, "run_ids": [r.run_id for r in sub.runs]}
    with open(study_dir / "submissions.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def wait(sub: Submission, all_runs: Sequence[PlannedRun], *, poll_s: float = 2.0, progress: Progress | None = None,
         timeout_s: float | None = None) -> dict[str, int]:
    """Poll until every job of the submission is done, updating the progress line; then record a
    failure for each run whose job died without a summary (killed, out of memory, node failure).
    Returns the final state counts over `all_runs`."""
    dirs = [r.dir for r in all_runs]
    t0 = time.time()
    pending_jobs = list(sub.jobs)
    while True:
        counts = count_dirs(dirs)
        if progress:
            progress.update(counts)
        # a SLURM job requeued after it returned (scontrol requeue, preemption by requeue) left a
        # result file but runs again: it is done only once it has left the queue
        queued = get_executor(sub.executor).queued({str(j.job_id) for j in pending_jobs}) if pending_jobs else set()
        pending_jobs = [j for j in pending_jobs if not _done(j) or str(j.job_id) in queued]
        if not pending_jobs:
            break
        if timeout_s is not None and time.time() - t0 > timeout_s:
            raise TimeoutError(f"jobs {[j.job_id for j in pending_jobs]} still running after {timeout_s:.0f}s")
        time.sleep(poll_s)
    _record_dead_jobs(sub)
    counts = count_dirs(dirs)
    if progress:
        progress.update(counts)
        progress.close()
    return counts


def stop_local(sub: Submission, grace_s: float = 30.0) -> None:
    """SIGTERM the local workers (their controller forwards it): train checkpoints at the next step
    boundary and the worker stops; runs stay partial and resume on the next `run`."""
    procs = [getattr(j, "_process", None) for j in sub.jobs]
    for p in procs:
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
    t0 = time.time()
    for p in procs:
        if p is not None:
            try:
                p.wait(timeout=max(0.1, grace_s - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                pass


def _done(job: Any) -> bool:
    try:
        return bool(job.done())
    except Exception:  # noqa: BLE001 - a flaky sacct call: ask again next poll
        return False


def _record_dead_jobs(sub: Submission) -> None:
    """A job that ended with an exception (or no result) and left its run(s) without a summary:
    write a failure summary with the job's error, so the run is not silently pending."""
    by_job: dict[str, list[PlannedRun]] = {}
    for r in sub.runs:
        rec = read_json(r.dir / "job.json") or {}
        by_job.setdefault(str(rec.get("job_id")), []).append(r)
    for job in sub.jobs:
        try:
            job.result()
            continue
        except Exception as e:  # noqa: BLE001 - turned into the run's error
            err = f"job {job.job_id} ended without a result: {type(e).__name__}: {str(e).strip()[-1500:]}"
        for r in by_job.get(str(job.job_id), []):
            if probe(r.dir).state in ("pending", "partial"):
                record_failure(r, err)


def squeue_ids() -> set[str] | None:
    """Ids (array tasks as JOB_TASK) of every job in the SLURM queue; None when squeue is absent or fails."""
    if shutil.which("squeue") is None:
        return None
    try:
        q = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(q.stdout.split()) if q.returncode == 0 else None


# ---- The executor protocol and its registry ------------------------------------------------------


class DebugExecutor:
    name, waits, shows_jobs, in_process = "debug", False, False, True
    trains_here = True  # its runs train on this machine: their device must exist here

    def validate(self, opts: ExecOptions) -> None:
        pass

    def submit(self, runs, study_dir, opts, resources, on_run_done) -> Submission:
        """In this process, one run after another: each run's task is made as it starts."""
        _set_threads(opts.threads)
        for r in runs:
            execute(RunTask.of(r))
            if on_run_done is not None:
                on_run_done()
        return Submission(self.name, runs=list(runs))

    def queued(self, job_ids: set[str]) -> set[str]:
        return set()

    def cancel(self, sub: Submission) -> str:
        return ""

    def slots(self, opts: ExecOptions) -> int | None:
        return 1


class LocalExecutor(DebugExecutor):
    name, waits, in_process = "local", True, False

    def submit(self, runs, study_dir, opts, resources, on_run_done) -> Submission:
        sub = Submission(self.name, runs=list(runs))
        if runs:
            sub.folder = _folder(study_dir, self.name)
            _submit_local([RunTask.of(r) for r in runs], sub, opts)
        return sub

    def cancel(self, sub: Submission) -> str:
        stop_local(sub)  # workers checkpoint at the next step and stop
        return "stopped the local workers; partial runs resume on the next `run`"

    def slots(self, opts: ExecOptions) -> int | None:
        return opts.workers


class SlurmExecutor:
    """sbatch job arrays through submitit; `queued` reads squeue once per call."""

    name, waits, shows_jobs, in_process = "slurm", True, True, False
    trains_here = False
    options = SlurmOptions  # its `--slurm.FIELD` section on plan and run (sweeps/sweep.py ExecConfig)

    def validate(self, opts: ExecOptions) -> None:
        if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
            raise ValueError("executor='slurm' needs the SLURM client commands (sinfo, sbatch) on PATH; "
                             "allowed values here: local, debug")
        r = _sinfo("-h", "-o", "%P")
        if r.returncode != 0:
            raise ValueError(f"executor='slurm': sinfo failed ({r.stderr.strip() or r.returncode}); "
                             "is the cluster up and SLURM_CONF set?")
        partitions = [p.rstrip("*") for p in r.stdout.split()]
        if opts.slurm.partition is not None:
            q = _sinfo("-h", "-p", opts.slurm.partition, "-o", "%P")
            if q.returncode != 0 or not q.stdout.strip():
                raise ValueError(f"slurm partition={opts.slurm.partition!r} does not exist; allowed values: "
                                 f"{', '.join(partitions) or '(none)'}")

    def submit(self, runs, study_dir, opts, resources, on_run_done) -> Submission:
        sub = Submission(self.name, runs=list(runs))
        if runs:
            sub.folder = _folder(study_dir, self.name)
            _submit_slurm(runs, [RunTask.of(r) for r in runs], sub, study_dir, opts, resources)
        return sub

    def queued(self, job_ids: set[str]) -> set[str]:
        return set(job_ids) & (squeue_ids() or set())

    def cancel(self, sub: Submission) -> str:
        if not sub.job_ids:
            return ""
        return (f"SLURM job(s) {', '.join(sorted({j.split('_')[0] for j in sub.job_ids}))} keep running; "
                "`marin-ablate status` follows them, scancel stops them")

    def slots(self, opts: ExecOptions) -> int | None:
        return None


for _ex in (LocalExecutor(), DebugExecutor(), SlurmExecutor()):
    register_executor(_ex)
