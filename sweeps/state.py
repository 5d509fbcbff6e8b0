"""Where each run of a study stands: the one place that decides it.

A run is in exactly one of STATES, read from its directory and, for SLURM runs, the queue:
  completed / failed  summary.json says so (a failed run is run again only with retry_failed);
  running             another process holds the run lock (`sweeps.runs.RunLock`);
  queued              its recorded SLURM job is still in the queue (pending, or requeued);
  partial             checkpoints exist, nothing holds or queues it: the next `run` resumes it;
  pending             nothing yet.
Everything that counts, selects, displays or waits on runs asks `survey` (one squeue call per
survey, not one per run) or `summary_state` (the check a worker repeats under the run lock).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from sweeps.runs import PlannedRun, RunLock, read_json

STATES = ("completed", "failed", "running", "queued", "partial", "pending")
#: States a `run` leaves to their owner (finished, or another process/job has them).
SETTLED = ("completed", "running", "queued")


@dataclass(frozen=True)
class RunStatus:
    dir: Path
    state: str
    summary: dict  # summary.json ({} when absent)
    job: dict  # job.json ({} when absent): executor, job_id, host, pid

    @property
    def run_id(self) -> str:
        return self.dir.name

    @property
    def error(self) -> str | None:
        return self.summary.get("error") if self.state == "failed" else None


def summary_state(run_dir: str | Path) -> str | None:
    """'completed' or 'failed' when summary.json records an end, else None."""
    s = read_json(Path(run_dir) / "summary.json") or {}
    return s["status"] if s.get("status") in ("completed", "failed") else None


def needs_run(state: str, retry_failed: bool) -> bool:
    """Whether a run in `state` is (re)started: pending, partial, or failed when retrying."""
    return state in ("pending", "partial") or (state == "failed" and retry_failed)


def squeue_ids() -> set[str] | None:
    """Ids (array tasks as JOB_TASK) of every job in the SLURM queue; None when squeue is absent or fails."""
    if shutil.which("squeue") is None:
        return None
    try:
        q = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(q.stdout.split()) if q.returncode == 0 else None


def probe(run_dir: str | Path, alive_jobs: set[str] | None = None) -> RunStatus:
    """The state of one run directory; `alive_jobs` is the SLURM queue (None: not asked)."""
    d = Path(run_dir)
    summary = read_json(d / "summary.json") or {}
    job = read_json(d / "job.json") or {}
    if summary.get("status") in ("completed", "failed"):
        return RunStatus(d, summary["status"], summary, job)
    if RunLock(d).held_elsewhere():
        return RunStatus(d, "running", summary, job)
    if alive_jobs and job.get("executor") == "slurm" and str(job.get("job_id")) in alive_jobs:
        return RunStatus(d, "queued", summary, job)
    state = "partial" if any((d / "checkpoints").glob("ckpt_*")) else "pending"
    return RunStatus(d, state, summary, job)


def survey(dirs: Iterable[str | Path]) -> list[RunStatus]:
    """Every run's state; the SLURM queue is read once, and only when some run was sent to SLURM."""
    dirs = [Path(d) for d in dirs]
    slurm = any((read_json(d / "job.json") or {}).get("executor") == "slurm" for d in dirs)
    alive = squeue_ids() if slurm else None
    return [probe(d, alive) for d in dirs]


def count(statuses: Sequence[RunStatus]) -> dict[str, int]:
    out = {s: 0 for s in STATES}
    for st in statuses:
        out[st.state] += 1
    return out


def count_dirs(dirs: Iterable[str | Path]) -> dict[str, int]:
    return count(survey(dirs))


def select(runs: Sequence[PlannedRun], retry_failed: bool) -> tuple[list[PlannedRun], dict[str, int]]:
    """The runs that need executing, and counts of those left alone by state."""
    todo, skipped = [], {}
    for r, st in zip(runs, survey(r.dir for r in runs)):
        if needs_run(st.state, retry_failed):
            todo.append(r)
        else:
            skipped[st.state] = skipped.get(st.state, 0) + 1
    return todo, skipped


def all_done(counts: dict[str, int]) -> bool:
    """Every run completed: nothing failed, running elsewhere, queued, partial or pending."""
    return sum(v for k, v in counts.items() if k != "completed") == 0
