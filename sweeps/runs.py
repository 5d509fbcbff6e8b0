"""Run identity, run directories and idempotent execution of one run (docs/architecture.md §3): a completed run
is skipped, a partial one resumes from its checkpoint, a failed one keeps its error in summary.json (rerun only
with `retry_failed`), and the run lock makes sure two workers never run the same run at once.
No torch import here: `marin.train` is imported only when a run actually executes."""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from marin_ablate.marin import plugins
from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.schema import (  # noqa: F401  (atomic_write_*, read_json, spec_json, SUMMARY_KEYS re-exported)
    SUMMARY_KEYS,
    RunSummary,
    atomic_write_json,
    atomic_write_text,
    check_name,
    foreign,
    read_json,
    spec_json,
    write_meta,
    write_spec,
    write_summary,
)
from marin_ablate.sweeps.state import claim


def study_dir(out: str | Path, study: str) -> Path:
    """OUT/STUDY; a study name that is not one safe path component (marin.schema.check_name) is refused."""
    return Path(out) / check_name(study, "study name")


def run_dir(study_dir_: str | Path, run_id: str) -> Path:
    return Path(study_dir_) / "runs" / run_id


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study: its spec, its meta.json and its directory."""

    spec: RunSpec
    meta: dict
    dir: Path

    @property
    def run_id(self) -> str:
        return self.spec.run_id


def plan_runs(runs: Iterable[tuple[RunSpec, Mapping]], study_dir_: str | Path) -> list[PlannedRun]:
    """Pair each (spec, meta) with its run directory; run ids must be distinct. meta.json names the run id
    too (marin.schema.foreign: every file of a run folder names its run)."""
    out, seen = [], {}
    for spec, meta in runs:
        rid = check_name(spec.run_id, "run id")
        if rid in seen:
            raise ValueError(f"runs: two runs share run_id {rid} ({seen[rid]} and {dict(meta)}); "
                             "their specs are identical")
        seen[rid] = dict(meta)
        out.append(PlannedRun(spec, {**dict(meta), "run_id": rid}, run_dir(study_dir_, rid)))
    return out


def write_run_files(run: PlannedRun) -> None:
    """spec.json and meta.json, atomically; an existing directory must hold the same run, inside its study
    (a symbolic link to another study's folder is refused: writing through it would change that study)."""
    if run.dir.is_symlink() or run.dir.exists():
        why = foreign(run.dir, run.dir.parent)
        if why is not None:
            raise ValueError(why)
    run.dir.mkdir(parents=True, exist_ok=True)
    old = read_json(run.dir / "spec.json")
    if old is not None and RunSpec.from_dict(old).run_id != run.run_id:
        raise ValueError(f"run directory {str(run.dir)!r} holds run {RunSpec.from_dict(old).run_id}, "
                         f"not {run.run_id}")
    if old is None:
        write_spec(run.dir, run.spec)
    if read_json(run.dir / "meta.json") != run.meta:
        write_meta(run.dir, run.meta)


def write_runs(runs: Iterable[PlannedRun], study_dir_: str | Path) -> None:
    """Every run's files (`write_run_files`), then the study folder's `plugins.json`: a record of the sources of
    this process's registry rows, which a later `analyze` compares with its own (marin.plugins; never imported)."""
    plugins.read_record(study_dir_)  # a damaged record is refused before any run folder is written
    for r in runs:
        write_run_files(r)
    plugins.write_record(study_dir_)


# ---- Failures (where a run stands is decided in sweeps/state.py) ---------------------------------


def failure_summary(spec: RunSpec | str, error: str, wall_s: float | None = None,
                    failed_step: int | None = None) -> dict:
    """A summary.json for a run that raised (or whose job died): every RunSummary key, status failed.
    `spec`: the run's spec, or its run id where the spec cannot be built (a plugin missing in a worker)."""
    run_id = spec if isinstance(spec, str) else spec.run_id
    return RunSummary(run_id=run_id, status="failed", error=error, failed_step=failed_step, wall_s=wall_s,
                      hardware=socket.gethostname()).to_dict()


def record_failure(run: "PlannedRun | tuple[RunSpec | str, Path]", error: str, wall_s: float | None = None,
                   details: str | None = None) -> dict:
    """Write a failed summary.json (atomically) and the full traceback beside it in error.txt."""
    spec, d = (run.spec, run.dir) if isinstance(run, PlannedRun) else run
    step = _last_checkpoint_step(d)
    summary = failure_summary(spec, error, wall_s, step)
    if details:
        atomic_write_text(d / "error.txt", details)
    write_summary(d, summary)
    return summary


def _last_checkpoint_step(d: Path) -> int | None:
    # ckpt_<step>/ directories (marin.train.checkpoint)
    return max((int(n) for p in (d / "checkpoints").glob("ckpt_*") if (n := p.name.split("_")[1]).isdigit()),
               default=None)


def clear_failure(run_dir_: str | Path) -> None:
    """Move a failed summary and its error.txt aside (summary.failed-<time>.json, error.failed-<time>.txt)
    so the run can be retried; the run resumes from its last checkpoint, if any."""
    d = Path(run_dir_)
    summary = read_json(d / "summary.json")
    if summary is not None and summary.get("status") == "failed":
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}.{time.time_ns() % 10**9:09d}"
        os.replace(d / "summary.json", d / f"summary.failed-{stamp}.json")
        if (d / "error.txt").exists():  # its traceback goes with it: a retry that succeeds leaves no error.txt
            os.replace(d / "error.txt", d / f"error.failed-{stamp}.txt")


# ---- Executing one run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTask:
    """What a worker needs to execute one run (picklable: plain data only); `plugins`: the modules and
    study files whose import registers the rows its spec names (`marin.plugins.ensure` imports them)."""

    spec_dict: dict
    meta: dict
    dir: str
    retry_failed: bool = False
    plugins: tuple[str, ...] = ()

    @classmethod
    def of(cls, run: PlannedRun, retry_failed: bool = False) -> "RunTask":
        return cls(run.spec.to_dict(), dict(run.meta), str(run.dir), retry_failed, tuple(plugins.sources()))

    @property
    def spec(self) -> RunSpec:
        """The RunSpec, built from plain data once the rows it names are registered (`marin.plugins.ensure`
        imports the task's plugins first: a worker process has not imported them)."""
        plugins.ensure(self.plugins)
        return RunSpec.from_dict(self.spec_dict)

    @property
    def run_id(self) -> str:
        return self.spec.run_id


def _unbuildable(task: RunTask, d: Path, e: Exception) -> dict:
    """A run whose spec this worker cannot build (a plugin that does not import here): recorded as failed
    with the reason, under its lock, so `status` and `run` name it. Its folder is named by its run id."""
    err = f"{type(e).__name__}: {e}"
    err += "".join(f"; {line}" for line in plugins.failures() if line not in err)
    d.mkdir(parents=True, exist_ok=True)
    lock, ended = claim(d, task.retry_failed)
    if lock is None:
        return {"run_id": d.name, "outcome": "skipped", "status": ended, "error": None}
    try:
        if ended == "failed":
            clear_failure(d)
        record_failure((d.name, d), f"cannot build the run in this worker: {err}", 0.0, traceback.format_exc())
    finally:
        lock.release()
    return {"run_id": d.name, "outcome": "failed", "status": "failed", "error": err}


def execute(task: RunTask, *, train_fn: Any = None) -> dict:
    """Run one task to its end, idempotently. Returns {"run_id", "outcome", "status", "error"}:
    outcome is "skipped" (completed, failed without retry, or locked by another worker), "ran"
    (train returned a summary), "interrupted" (a signal stopped train; the run is partial and
    resumable) or "failed" (train raised; the error is recorded in summary.json). The task's plugins
    are imported first (`RunTask.spec`): a worker process builds the spec from plain data. The run is
    claimed through its lock (`sweeps.state.claim`).

    Under submitit a SIGUSR2 makes train checkpoint and hand the signal back to submitit, whose
    handler requeues the job and exits (SystemExit passes through here, the lock is released)."""
    d = Path(task.dir)
    try:
        spec = task.spec
    except Exception as e:  # noqa: BLE001 - a plugin that fails here only: the run's error, never a silent pending
        return _unbuildable(task, d, e)
    d.mkdir(parents=True, exist_ok=True)
    if read_json(d / "meta.json") is None:  # a worker on a fresh checkout of the directory
        write_run_files(PlannedRun(spec, task.meta, d))

    def skipped(status: str) -> dict:
        err = (read_json(d / "summary.json") or {}).get("error") if status == "failed" else None
        return {"run_id": spec.run_id, "outcome": "skipped", "status": status, "error": err}

    lock, ended = claim(d, task.retry_failed)
    if lock is None:
        return skipped(ended)
    t0 = time.time()
    try:
        if ended == "failed":
            clear_failure(d)
        if train_fn is None:
            from marin_ablate.sweeps.tracking import (
                tracked_train as train_fn,  # marin.train.train, plus $MARIN_LOG_TO sinks
            )
        try:
            out = train_fn(spec, d, resume=True)
        except Exception as e:  # noqa: BLE001 - a run's failure is data, recorded, never retried silently
            err = f"{type(e).__name__}: {e}"
            record_failure((spec, d), err, time.time() - t0, traceback.format_exc())
            return {"run_id": spec.run_id, "outcome": "failed", "status": "failed", "error": err}
        status = out.get("status") if isinstance(out, dict) else None
        if status == "interrupted":
            return {"run_id": spec.run_id, "outcome": "interrupted", "status": "partial", "error": None}
        if status not in ("completed", "failed"):
            err = f"train returned status {status!r}; expected 'completed', 'failed' or 'interrupted'"
            record_failure((spec, d), err, time.time() - t0)
            return {"run_id": spec.run_id, "outcome": "failed", "status": "failed", "error": err}
        if read_json(d / "summary.json") is None:  # a train_fn that returns without writing it
            write_summary(d, {"run_id": spec.run_id, **out})
        return {"run_id": spec.run_id, "outcome": "ran", "status": status, "error": out.get("error")}
    finally:
        lock.release()
