"""Where each run of a study stands, decided in one place (docs/architecture.md §3 "Run state"): one of STATES,
read from its directory and the executor that holds its job. Everything that counts, selects, displays or
waits on runs asks `survey` (one question per executor per survey, e.g. one squeue call, not one per run) or
`summary_state` (the check a worker repeats under the run lock, `claim`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from marin_ablate.marin.flops import summary_contradiction
from marin_ablate.marin.runlock import RunLock
from marin_ablate.marin.schema import DamagedFile, foreign, read_json, read_summary
from marin_ablate.sweeps.executor_api import EXECUTORS

if TYPE_CHECKING:
    from marin_ablate.sweeps.runs import PlannedRun

STATES = ("completed", "failed", "running", "queued", "partial", "pending")


@dataclass(frozen=True)
class RunStatus:
    dir: Path
    state: str
    summary: dict  # summary.json ({} when absent)
    job: dict  # job.json ({} when absent): executor, job_id, host, pid
    damaged: str | None = None  # why summary.json cannot be read (the run counts as not finished: run again)

    @property
    def run_id(self) -> str:
        return self.dir.name

    @property
    def error(self) -> str | None:
        return self.summary.get("error") if self.state == "failed" else None


def verdict(run_dir: str | Path) -> tuple[dict, str | None]:
    """(summary.json, why it does not count): a summary counts when it reads as a RunSummary (every field of
    its type: a loss "abc" does not) and is this run's own (its run_id is the folder's, the file not a link
    to elsewhere), and it is what the spec.json beside it trains (marin_ablate.marin.flops.summary_contradiction:
    steps, tokens, FLOPs). One that does not is ({}, the reason naming the file); an absent one ({}, None)."""
    d = Path(run_dir)
    path = d / "summary.json"
    try:
        s = read_json(path, strict=True) or {}
        if s:
            read_summary(d, strict=True)
    except DamagedFile as e:
        return {}, str(e)
    if path.is_symlink():
        return {}, f"{path} is a symbolic link (to {path.resolve()}); a run's verdict is its own file"
    if s and s.get("run_id") not in (None, "", d.name):
        return {}, f"{path} names run {s.get('run_id')!r}, not {d.name!r} (the folder's): another run's verdict"
    why = summary_contradiction(read_json(d / "spec.json") or {}, s, f"runs/{d.name}") if s else None
    if why:
        return {}, why
    return s, None


def summary_state(run_dir: str | Path) -> str | None:
    """'completed' or 'failed' when summary.json records this run's end (`verdict`), else None."""
    s, _ = verdict(run_dir)
    return s["status"] if s.get("status") in ("completed", "failed") else None


def needs_run(state: str, retry_failed: bool) -> bool:
    """Whether a run in `state` is (re)started: pending, partial, or failed when retrying."""
    return state in ("pending", "partial") or (state == "failed" and retry_failed)


def claim(run_dir: str | Path, retry_failed: bool) -> tuple[RunLock | None, str | None]:
    """A worker's claim on a run: (its run lock, held, and the state it ended in, None or 'failed' when
    retrying) when the run needs executing; else (None, why): its ended state, or 'running' when another
    worker holds the lock. The summary is asked before the lock (cheap) and again under it: another worker
    may have finished the run in between."""
    ended = summary_state(run_dir)
    if ended is not None and not needs_run(ended, retry_failed):
        return None, ended
    lock = RunLock(run_dir)
    if not lock.acquire():
        return None, "running"
    try:
        ended = summary_state(run_dir)
    except BaseException:
        lock.release()
        raise
    if ended is not None and not needs_run(ended, retry_failed):
        lock.release()
        return None, ended
    return lock, ended


def probe(run_dir: str | Path, queued: set[tuple[str, str]] | None = None) -> RunStatus:
    """The state of one run directory; `queued` holds the (executor, job id) pairs still waiting
    (None: no executor asked)."""
    d = Path(run_dir)
    summary, damaged = verdict(d)
    if damaged is None and d.is_symlink():
        damaged = foreign(d, d.parent)
    job = read_json(d / "job.json") or {}
    if summary.get("status") in ("completed", "failed"):
        return RunStatus(d, summary["status"], summary, job)
    if RunLock(d).held_elsewhere():
        return RunStatus(d, "running", summary, job, damaged)
    if queued and (job.get("executor"), str(job.get("job_id"))) in queued:
        return RunStatus(d, "queued", summary, job, damaged)
    state = "partial" if any((d / "checkpoints").glob("ckpt_*")) else "pending"
    return RunStatus(d, state, summary, job, damaged)


def survey(dirs: Iterable[str | Path]) -> list[RunStatus]:
    """Every run's state; each executor named in some job.json is asked once about its job ids (an
    executor this process does not know is not asked: its runs read as partial or pending; the built-in
    ones are known once `sweeps.executors` is imported, as every driver does)."""
    dirs = [Path(d) for d in dirs]
    by_executor: dict[str, set[str]] = {}
    for d in dirs:
        job = read_json(d / "job.json") or {}
        if job.get("executor") in EXECUTORS and job.get("job_id") is not None:
            by_executor.setdefault(job["executor"], set()).add(str(job["job_id"]))
    queued = {(name, j) for name, ids in by_executor.items() for j in EXECUTORS[name].queued(ids)}
    return [probe(d, queued) for d in dirs]


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
    for r, st in zip(runs, survey(r.dir for r in runs), strict=True):
        if needs_run(st.state, retry_failed):
            todo.append(r)
        else:
            skipped[st.state] = skipped.get(st.state, 0) + 1
    return todo, skipped


def all_done(counts: dict[str, int]) -> bool:
    """Every run completed: nothing failed, running elsewhere, queued, partial or pending."""
    return sum(v for k, v in counts.items() if k != "completed") == 0
