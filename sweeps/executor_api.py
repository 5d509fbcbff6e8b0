"""The executor protocol and registry (docs/architecture.md §4): how runs get executed, by name. `sweeps/executors.py`
registers the built-in `local`, `debug` and `slurm` at its import (this module imports no implementation, so
`sweeps.state` asks the rows without an import cycle); `register_executor` adds another (docs/extending.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from marin_ablate.marin import plugins

if TYPE_CHECKING:
    from marin_ablate.sweeps.executors import ExecOptions, Submission
    from marin_ablate.sweeps.runs import PlannedRun


class Executor(Protocol):
    """How runs get executed. `submit` returns a `Submission` whose `jobs` have `job_id`, `done()`
    and `result()` (submitit's Job), and writes `job.json` (`record_job`) for each run it queues."""

    name: str
    waits: bool  # `run` polls its jobs until done (False: `submit` has run everything already)
    shows_jobs: bool  # its job ids mean something to the user (printed by `run`)
    in_process: bool  # runs execute in the driver's process (False: workers import the plugins, marin.plugins)
    trains_here: bool  # its runs train on this machine, so `run` checks their device exists here

    def validate(self, opts: ExecOptions) -> None:
        """Raise ValueError naming the field for anything wrong, before anything is submitted."""

    def submit(self, runs: Sequence[PlannedRun], study_dir: Path, opts: ExecOptions,
               resources: Callable[[PlannedRun], dict] | None, on_run_done: Callable[[], None] | None) -> Submission:
        """Start `runs`; `resources(run)` is the study's per-run job shape (gpus, time_min, cpus, mem)."""

    def queued(self, job_ids: set[str]) -> set[str]:
        """Of these job ids (recorded by this executor), those still queued or running."""

    def cancel(self, sub: Submission) -> str:
        """The driver is stopping (Ctrl-C, SIGTERM): stop what cannot outlive it; a line for the user."""

    def slots(self, opts: ExecOptions) -> int | None:
        """Runs executing at once (for the progress line's estimate); None: unknown."""


#: name -> executor; `--executor NAME`, `ExecOptions.executor` and job.json's "executor" name a row.
EXECUTORS: dict[str, Executor] = {}


def register_executor(ex: Executor) -> Executor:
    """Add an executor (a name already registered is an error)."""
    if ex.name in EXECUTORS:
        raise ValueError(f"executor {ex.name!r} is already registered")
    missing = [a for a in ("name", "waits", "shows_jobs", "in_process", "trains_here") if not hasattr(ex, a)]
    if missing:
        raise ValueError(f"executor {getattr(ex, 'name', ex)!r} lacks {', '.join(missing)}; an executor row "
                         f"declares name, waits, shows_jobs, in_process and trains_here (sweeps/executor_api.py)")
    EXECUTORS[ex.name] = ex
    plugins.note("executor", ex.name)
    return ex


def get_executor(name: str) -> Executor:
    """The row `name` (the built-in ones are registered by importing `sweeps.executors`, which
    re-exports this function)."""
    if name not in EXECUTORS:
        raise ValueError(f"executor={name!r} is not known; allowed values: {', '.join(EXECUTORS)}")
    return EXECUTORS[name]
