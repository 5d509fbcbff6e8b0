"""Run identity, run directories and idempotent execution of one run (DESIGN §3, CONTRACTS).

A run's identity is `RunSpec.run_id` (a hash of its canonical JSON); its directory is
`<out>/<study>/runs/<run_id>/` with spec.json and meta.json written atomically before launch.
Executing a run is idempotent: a completed run is skipped; a partial run resumes (train resumes
from its own checkpoint); a failed run keeps its error in summary.json and is not retried unless
asked (`retry_failed`); an exclusive lock on `<run_dir>/.lock` makes sure two workers (processes,
array tasks, machines sharing the filesystem) never run the same run at once.

No torch import here: `marin.train` is imported only when a run actually executes.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from marin.config import RunSpec
from marin.runlock import RunLock  # noqa: F401  (re-exported: sweeps callers import it from here)

#: What a run directory can be in, as `run_state` reports it.
RUN_STATES = ("completed", "failed", "running", "partial", "pending")

#: summary.json keys (CONTRACTS "Training"); a failure summary written here carries all of them.
SUMMARY_KEYS = (
    "run_id", "status", "error", "failed_step", "step", "tokens", "params_total", "params_active",
    "flops_per_token", "train_flops", "eval_macro_loss", "eval_domain_loss", "macro_bpb",
    "final_train_loss", "tokens_per_s", "model_flops_per_s", "mfu", "drop_rate", "max_grad_norm",
    "spikes", "spike_steps", "wall_s", "hardware", "code_version", "loss_curve",
)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temp file in the same directory, fsync, then os.replace: a reader sees the old
    file or the new one, never a torn one (also on NFS, where rename is atomic per directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; run files are for every reader
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def read_json(path: str | Path) -> dict | None:
    """The JSON object at `path`, or None when absent or unreadable (a torn write from a killed
    process that did not use atomic writes)."""
    try:
        with open(path) as f:
            out = json.load(f)
        return out if isinstance(out, dict) else None
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------


def study_dir(out: str | Path, study: str) -> Path:
    return Path(out) / study


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
    """Pair each (spec, meta) with its run directory; run ids must be distinct."""
    out, seen = [], {}
    for spec, meta in runs:
        rid = spec.run_id
        if rid in seen:
            raise ValueError(f"runs: two runs share run_id {rid} ({seen[rid]} and {dict(meta)}); "
                             "their specs are identical")
        seen[rid] = dict(meta)
        out.append(PlannedRun(spec, dict(meta), run_dir(study_dir_, rid)))
    return out


def spec_json(spec: RunSpec) -> str:
    # byte-identical to what marin.train writes, so both writers agree
    return json.dumps(spec.to_dict(), indent=1, sort_keys=True)


def write_run_files(run: PlannedRun) -> None:
    """spec.json and meta.json, atomically; an existing directory must hold the same run."""
    run.dir.mkdir(parents=True, exist_ok=True)
    old = read_json(run.dir / "spec.json")
    if old is not None and RunSpec.from_dict(old).run_id != run.run_id:
        raise ValueError(f"run directory {str(run.dir)!r} holds run {RunSpec.from_dict(old).run_id}, "
                         f"not {run.run_id}")
    if old is None:
        atomic_write_text(run.dir / "spec.json", spec_json(run.spec))
    if read_json(run.dir / "meta.json") != run.meta:
        atomic_write_json(run.dir / "meta.json", run.meta)


# ---------------------------------------------------------------------------------------------
# Lock
# ---------------------------------------------------------------------------------------------


# RunLock lives in marin.runlock (torch-free), so that `marin-ablate train` takes the same lock.


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------


def run_state(run_dir_: str | Path) -> str:
    """One of RUN_STATES, from the directory alone: completed/failed from summary.json, running
    when another process holds the lock, partial when checkpoints exist, else pending."""
    d = Path(run_dir_)
    summary = read_json(d / "summary.json")
    if summary is not None and summary.get("status") in ("completed", "failed"):
        return summary["status"]
    if RunLock(d).held_elsewhere():
        return "running"
    if any((d / "checkpoints").glob("ckpt_*")):
        return "partial"
    return "pending"


def count_states(dirs: Sequence[Path]) -> dict[str, int]:
    out = {s: 0 for s in RUN_STATES}
    for d in dirs:
        out[run_state(d)] += 1
    return out


def failure_summary(spec: RunSpec, error: str, wall_s: float | None = None, failed_step: int | None = None) -> dict:
    """A summary.json for a run that raised (or whose job died): every CONTRACTS key, status failed."""
    s: dict[str, Any] = {k: None for k in SUMMARY_KEYS}
    s.update(run_id=spec.run_id, status="failed", error=error, failed_step=failed_step, wall_s=wall_s,
             hardware=socket.gethostname(), spikes=0, spike_steps=[], loss_curve=[])
    return s


def record_failure(run: "PlannedRun | tuple[RunSpec, Path]", error: str, wall_s: float | None = None,
                   details: str | None = None) -> dict:
    """Write a failed summary.json (atomically) and the full traceback beside it in error.txt."""
    spec, d = (run.spec, run.dir) if isinstance(run, PlannedRun) else run
    step = _last_checkpoint_step(d)
    summary = failure_summary(spec, error, wall_s, step)
    if details:
        atomic_write_text(d / "error.txt", details)
    atomic_write_json(d / "summary.json", summary)
    return summary


def _last_checkpoint_step(d: Path) -> int | None:
    steps = []
    for p in (d / "checkpoints").glob("ckpt_*"):  # ckpt_<step>/ directories (marin.train.checkpoint)
        try:
            steps.append(int(p.name.split("_")[1]))
        except (IndexError, ValueError):
            pass
    return max(steps) if steps else None


def clear_failure(run_dir_: str | Path) -> None:
    """Move a failed summary aside (summary.failed-<time>.json) so the run can be retried; the
    run resumes from its last checkpoint, if any."""
    d = Path(run_dir_)
    summary = read_json(d / "summary.json")
    if summary is not None and summary.get("status") == "failed":
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}.{time.time_ns() % 10**9:09d}"
        os.replace(d / "summary.json", d / f"summary.failed-{stamp}.json")


# ---------------------------------------------------------------------------------------------
# Executing one run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTask:
    """What a worker needs to execute one run (picklable: plain data only)."""

    spec_dict: dict
    meta: dict
    dir: str
    retry_failed: bool = False

    @classmethod
    def of(cls, run: PlannedRun, retry_failed: bool = False) -> "RunTask":
        return cls(run.spec.to_dict(), dict(run.meta), str(run.dir), retry_failed)

    @property
    def spec(self) -> RunSpec:
        return RunSpec.from_dict(self.spec_dict)

    @property
    def run_id(self) -> str:
        return self.spec.run_id


def execute(task: RunTask, *, train_fn: Any = None) -> dict:
    """Run one task to its end, idempotently. Returns {"run_id", "outcome", "status", "error"}:
    outcome is "skipped" (completed, failed without retry, or locked by another worker), "ran"
    (train returned a summary), "interrupted" (a signal stopped train; the run is partial and
    resumable) or "failed" (train raised; the error is recorded in summary.json).

    Under submitit a SIGUSR2 makes train checkpoint and hand the signal back to submitit, whose
    handler requeues the job and exits (SystemExit passes through here, the lock is released)."""
    spec = task.spec
    d = Path(task.dir)
    d.mkdir(parents=True, exist_ok=True)
    if read_json(d / "meta.json") is None:  # a worker on a fresh checkout of the directory
        write_run_files(PlannedRun(spec, task.meta, d))
    state = read_json(d / "summary.json") or {}
    if state.get("status") == "completed":
        return {"run_id": spec.run_id, "outcome": "skipped", "status": "completed", "error": None}
    if state.get("status") == "failed" and not task.retry_failed:
        return {"run_id": spec.run_id, "outcome": "skipped", "status": "failed", "error": state.get("error")}
    lock = RunLock(d)
    if not lock.acquire():
        return {"run_id": spec.run_id, "outcome": "skipped", "status": "running", "error": None}
    t0 = time.time()
    try:
        # re-read under the lock: another worker may have finished it in between
        state = read_json(d / "summary.json") or {}
        if state.get("status") == "completed" or (state.get("status") == "failed" and not task.retry_failed):
            return {"run_id": spec.run_id, "outcome": "skipped", "status": state["status"], "error": state.get("error")}
        if state.get("status") == "failed":
            clear_failure(d)
        if train_fn is None:
            from marin.train import train as train_fn
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
            atomic_write_json(d / "summary.json", out)
        return {"run_id": spec.run_id, "outcome": "ran", "status": status, "error": out.get("error")}
    finally:
        lock.release()
