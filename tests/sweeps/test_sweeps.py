"""sweeps: run identity, run directories, idempotent execution, validation, executors, tuning fit."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.ablations.study import Study
from marin_ablate.marin.config import DataConfig
from marin_ablate.marin.runlock import RunLock
from marin_ablate.sweeps.executors import ExecOptions, SlurmOptions, validate
from marin_ablate.sweeps.progress import Progress, format_counts
from marin_ablate.sweeps.runs import (
    RunTask,
    atomic_write_json,
    atomic_write_text,
    execute,
    plan_runs,
    read_json,
    write_run_files,
)
from marin_ablate.sweeps.state import probe, select
from marin_ablate.sweeps.sweep import planned_runs, run_study
from marin_ablate.sweeps.tuning import fit_profile, lr_grid


def tiny_study(factors=("xsa",), steps: int = 3, name: str = "tiny", data: DataConfig = DataConfig()) -> Study:
    """2^k arms of the tiny preset, a few steps each: seconds per run on one CPU thread."""
    rung = Rung("tiny", "tiny", fixed_steps=steps, batch_size=2,
                train_overrides={"eval_batches": 1, "eval_every": steps, "checkpoint_every": 2, "log_every": 1})
    return Study(name=name, description="tiny test study", factors=tuple(factors),
                 design=full_factorial(list(factors)), rungs=(rung,), seeds=(0,), data=data,
                 executor={"executor": "local", "max_parallel": 2, "cpus_per_task": 1, "timeout_min": 20})


# ---------------------------------------------------------------------------------------------
# identity and files
# ---------------------------------------------------------------------------------------------


def test_run_ids_are_stable_distinct_and_name_the_run_directory(tmp_path):
    a = planned_runs(tiny_study(("xsa", "sconv")), tmp_path)
    b = planned_runs(tiny_study(("xsa", "sconv")), tmp_path)
    ids = [r.run_id for r in a]
    assert ids == [r.run_id for r in b]  # same study -> same ids, same order
    assert len(set(ids)) == 4 and all(len(i) == 16 for i in ids)
    assert [r.dir for r in a] == [tmp_path / "tiny" / "runs" / i for i in ids]
    longer = planned_runs(tiny_study(("xsa", "sconv"), steps=4), tmp_path)
    assert not set(ids) & {r.run_id for r in longer}  # any spec change is a new run
    with pytest.raises(ValueError, match="share run_id"):
        plan_runs([(a[0].spec, a[0].meta), (a[0].spec, a[1].meta)], tmp_path)


def test_run_files_are_written_once_and_refuse_another_run(tmp_path):
    runs = planned_runs(tiny_study(), tmp_path)
    write_run_files(runs[0])
    spec = json.loads((runs[0].dir / "spec.json").read_text())
    assert spec == {**runs[0].spec.to_dict(), "run_id": runs[0].run_id}  # every run file names its run
    assert read_json(runs[0].dir / "meta.json") == runs[0].meta == {
        "run_id": runs[0].run_id,
        "study": "tiny", "rung": "tiny", "arm": runs[0].meta["arm"], "seed": 0, "design_row": 0,
        "factors": {"xsa": "none"}, "coding": {"xsa": {"field": "recipe.xsa", "low": "none", "high": "xsa", "code": -1,
                                      "values": {"none": "none", "xsa": "xsa"}}}}
    alien = replace(runs[1], dir=runs[0].dir)
    with pytest.raises(ValueError, match="holds run"):
        write_run_files(alien)


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path):
    p = tmp_path / "summary.json"
    atomic_write_json(p, {"status": "completed"})
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(p, '{"status": "torn \ud800"}')  # fails after the temp file is open
    assert read_json(p) == {"status": "completed"}
    assert [q.name for q in tmp_path.iterdir()] == ["summary.json"]  # no temp file left behind


def test_progress_line_counts_states_and_prints_only_changes():
    assert format_counts({"completed": 3, "running": 1, "failed": 1, "pending": 2, "partial": 1}, 8, 75.0, "s") == \
        "s: 3/8 done, 1 running, 1 failed, 3 pending (1 partial) [1m15s]"
    buf = io.StringIO()
    p = Progress(2, "s", stream=buf, tty=False)
    for c in ({"pending": 2}, {"pending": 2}, {"completed": 1, "pending": 1}):
        p.update(c)
    assert len(buf.getvalue().splitlines()) == 2


# ---------------------------------------------------------------------------------------------
# validation and locking
# ---------------------------------------------------------------------------------------------


def test_bad_executor_options_raise_before_anything_is_written(tmp_path):
    study = tiny_study()
    with pytest.raises(ValueError, match="executor='nope'.*allowed values: local, debug, slurm"):
        run_study(study, tmp_path, ExecOptions(executor="nope"))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="out=.*not a writable folder"):
        run_study(study, blocker / "out", ExecOptions(executor="debug"))
    with pytest.raises(ValueError, match="workers"):
        run_study(study, tmp_path, ExecOptions(executor="local", workers=0))
    # a partition that does not exist (or no SLURM at all): refused before submission
    with pytest.raises(ValueError,
                       match="partition='no-such-partition' does not exist|SLURM client commands|sinfo failed"):
        run_study(study, tmp_path, ExecOptions(executor="slurm", slurm=SlurmOptions(partition="no-such-partition")))
    assert not (tmp_path / "tiny" / "runs").exists() and not (tmp_path / "tiny" / "submitit").exists()
    with pytest.raises(ValueError, match="gpus_per_run"):
        validate(ExecOptions(executor="slurm", slurm=SlurmOptions(gpus_per_run=-1)), tmp_path)


def test_run_lock_keeps_a_second_process_out(tmp_path):
    run = planned_runs(tiny_study(), tmp_path)[0]
    write_run_files(run)
    lock = RunLock(run.dir)
    assert lock.acquire()
    assert not RunLock(run.dir).acquire() and probe(run.dir).state == "running"  # a second claim here
    assert RunLock(run.dir).held_elsewhere()  # probing does not drop the held lock
    probe_src = ("import sys; from marin_ablate.marin.runlock import RunLock; "
                 "from marin_ablate.sweeps.state import probe; "
                 f"print(RunLock({str(run.dir)!r}).acquire(), probe({str(run.dir)!r}).state)")
    out = subprocess.run([sys.executable, "-c", probe_src], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "running"]
    lock.release()
    assert probe(run.dir).state == "pending"
    assert select([run], retry_failed=False)[0] == [run]


# ---------------------------------------------------------------------------------------------
# execution (real training)
# ---------------------------------------------------------------------------------------------


def test_failed_run_keeps_its_error_and_is_retried_only_when_asked(tmp_path):
    (tmp_path / "no_such_corpus").mkdir()  # exists (so the pre-launch checks pass), holds no text: each run fails
    study = tiny_study(data=DataConfig(corpus=str(tmp_path / "no_such_corpus")))
    rep = run_study(study, tmp_path / "out", ExecOptions(executor="debug"), progress=False)
    assert rep.counts["failed"] == 2 and rep.submitted == 2
    run = planned_runs(study, tmp_path / "out")[0]
    first = read_json(run.dir / "summary.json")
    assert first["status"] == "failed" and "no_such_corpus" in first["error"] and first["run_id"] == run.run_id
    assert "Traceback" in (run.dir / "error.txt").read_text()
    again = run_study(study, tmp_path / "out", ExecOptions(executor="debug"), progress=False)
    assert again.submitted == 0 and again.skipped == {"failed": 2}
    assert read_json(run.dir / "summary.json") == first  # not silently retried
    retried = run_study(study, tmp_path / "out", ExecOptions(executor="debug", retry_failed=True), progress=False)
    assert retried.submitted == 2 and retried.counts["failed"] == 2
    assert len(list(run.dir.glob("summary.failed-*.json"))) == 1  # the first failure, kept aside
    assert execute(RunTask.of(run))["outcome"] == "skipped"


@pytest.mark.slow  # an interrupted and a resumed real run
def test_interrupted_run_stays_partial_and_the_next_run_resumes_it(tmp_path, monkeypatch):
    from train_signalled import signal_after

    study = tiny_study(steps=4)
    run = planned_runs(study, tmp_path)[0]
    write_run_files(run)
    with monkeypatch.context() as mp:
        signal_after(mp, 1, signal.SIGTERM)  # train sends itself SIGTERM after step 1
        first = execute(RunTask.of(run))
    assert first["outcome"] == "interrupted" and probe(run.dir).state == "partial"
    rep = run_study(study, tmp_path, ExecOptions(executor="debug"), progress=False)
    assert rep.submitted == 2 and rep.counts["completed"] == 2
    assert "resumed" in (run.dir / "train.log").read_text() and read_json(run.dir / "summary.json")["step"] == 4


@pytest.mark.slow
def test_local_executor_runs_each_run_once_and_a_rerun_submits_nothing(tmp_path):
    # in a fresh interpreter: submitit's LocalJob reads its folder in `__del__`, and a job still referenced at
    # exit does that through half-torn-down modules, one "Exception ignored" traceback per job (six ended
    # README's first command); a finished submission releases its jobs and keeps their ids
    code = (f"from test_sweeps import tiny_study\n"
            f"from marin_ablate.sweeps.executors import ExecOptions\n"
            f"from marin_ablate.sweeps.sweep import run_study\n"
            f"rep = run_study(tiny_study(), {str(tmp_path)!r}, ExecOptions(executor='local', workers=2, poll_s=0.5),\n"
            f"                progress=False)\n"
            f"assert rep.submitted == 2 and rep.counts['completed'] == 2, rep\n"
            f"assert len(rep.job_ids) == 2 and rep.submission.jobs == [], rep\n")
    path = [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}  # no empty entry: it would mean cwd
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    study = tiny_study()
    for run in planned_runs(study, tmp_path):
        s = read_json(run.dir / "summary.json")
        assert s["status"] == "completed" and s["step"] == 3 and s["run_id"] == run.run_id
        assert (run.dir / "train.log").read_text().count(f"start {run.run_id}") == 1
        assert read_json(run.dir / "meta.json")["study"] == "tiny"
    again = run_study(study, tmp_path, ExecOptions(executor="local", workers=2), progress=False)
    assert again.submitted == 0 and again.skipped == {"completed": 2} and again.job_ids == []


# ---------------------------------------------------------------------------------------------
# tuning
# ---------------------------------------------------------------------------------------------


def test_lr_profile_finds_an_interior_optimum_and_flags_the_edge():
    grid = lr_grid(5, 4.0)
    assert grid == [-2.0, -1.0, 0.0, 1.0, 2.0]
    p = fit_profile(grid, [3.0 + 0.1 * (x - 0.5) ** 2 for x in grid], grid)
    assert not p.edge and p.x_opt == pytest.approx(0.5) and p.multiplier == pytest.approx(2 ** 0.5)
    edge = fit_profile(grid, [3.0 + 0.1 * (x - 3.0) ** 2 for x in grid], grid)
    assert edge.edge and edge.x_opt == 2.0 and "edge" in edge.reason
    concave = fit_profile(grid, [3.0 - 0.1 * x * x for x in grid], grid)
    assert concave.edge and "not convex" in concave.reason
    failed = fit_profile(grid, [float("inf"), 3.2, 3.1, 3.15, 3.3], grid)  # a diverged point is left out
    assert len(failed.x) == 4 and not failed.edge


@pytest.mark.slow  # real tuning trials, twice
def test_tune_records_trials_in_a_journal_and_a_rerun_reuses_them(tmp_path):
    from marin_ablate.sweeps.tune_arms import tune_study
    from marin_ablate.sweeps.tuning import TuneOptions, tuned_multipliers

    study = tiny_study(steps=2)
    opts = ExecOptions(executor="debug")
    res = tune_study(study, tmp_path, opts, TuneOptions(points=3, span=4.0), progress=False)
    assert res.rung == "tiny" and res.grid == [-2.0, 0.0, 2.0] and res.report.submitted == 6
    assert set(res.profiles) == {"all_off", "all_on"} and all(len(p.x) == 3 for p in res.profiles.values())
    assert (tmp_path / "tiny" / "tune" / "optuna.journal").stat().st_size > 0
    assert tuned_multipliers(tmp_path, "tiny") == res.multipliers
    again = tune_study(study, tmp_path, opts, TuneOptions(points=3, span=4.0), progress=False)
    assert again.report.submitted == 0 and again.multipliers == res.multipliers
    assert {a: p.loss for a, p in again.profiles.items()} == {a: p.loss for a, p in res.profiles.items()}
