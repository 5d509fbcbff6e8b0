"""sweeps on a real SLURM cluster (`.ci/slurm.sh start`; SLURM_CONF from its env.sh).

Skipped with a reason when SLURM_CONF is unset or `sinfo` fails; under CI (CI=true or
MARIN_REQUIRE_SLURM=1) the same condition FAILS, so a broken cluster cannot pass as a skip.
Tiny preset, a few steps, one CPU per task.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ablations.designs import full_factorial
from ablations.ladders import Rung
from ablations.studies import Study
from sweeps.cli import main as cli_main
from sweeps.executors import ExecOptions, SlurmOptions, wait
from sweeps.runs import read_json
from sweeps.sweep import planned_runs, run_study

pytestmark = pytest.mark.slurm


def _slurm_problem() -> str | None:
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is unset (start a cluster: bash .ci/slurm.sh start; source /tmp/marin-slurm/env.sh)"
    if shutil.which("sinfo") is None:
        return "sinfo is not on PATH"
    r = subprocess.run(["sinfo", "-h", "-o", "%P %a %T"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return f"sinfo failed: {r.stderr.strip()}"
    if "up" not in r.stdout:
        return f"no partition is up: {r.stdout.strip()!r}"
    return None


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    problem = _slurm_problem()
    if problem:
        if os.environ.get("CI", "").lower() == "true" or os.environ.get("MARIN_REQUIRE_SLURM") == "1":
            pytest.fail(f"SLURM tests are required here (CI / MARIN_REQUIRE_SLURM) but: {problem}", pytrace=False)
        pytest.skip(problem)


def tiny_study(factors=("xsa", "sconv"), steps: int = 4, checkpoint_every: int = 2, name: str = "tiny_slurm") -> Study:
    rung = Rung("tiny", "tiny", fixed_steps=steps, batch_size=2,
                train_overrides={"eval_batches": 1, "eval_every": steps, "checkpoint_every": checkpoint_every,
                                 "log_every": 1})
    # timeout 20 min: submitit counts a USR2 in the last 20% (or 10 min) of the limit as a time-out
    return Study(name=name, description="tiny SLURM test study", factors=tuple(factors),
                 design=full_factorial(list(factors)), rungs=(rung,), seeds=(0,),
                 executor={"executor": "slurm", "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 20})


def _sacct_states(job_id: str) -> list[str]:
    r = subprocess.run(["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                       text=True, timeout=60)
    return [s.split()[0] for s in r.stdout.split("\n") if s.strip()]


def test_study_goes_in_as_one_array_and_a_rerun_submits_nothing(tmp_path, capsys):
    study = tiny_study()
    rep = run_study(study, tmp_path, ExecOptions(executor="slurm", poll_s=1.0), progress=False)
    assert rep.submitted == 4 and rep.counts["completed"] == 4, rep
    arrays = {j.split("_")[0] for j in rep.job_ids}
    assert len(arrays) == 1 and sorted(int(j.split("_")[1]) for j in rep.job_ids) == [0, 1, 2, 3]
    for run in planned_runs(study, tmp_path):
        s = read_json(run.dir / "summary.json")
        assert s["status"] == "completed" and s["step"] == 4
        assert read_json(run.dir / "job.json")["job_id"] in rep.job_ids
    script = next((tmp_path / "tiny_slurm" / "submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-3%4" in script and "#SBATCH --cpus-per-task=1" in script
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=USR2@90" in script

    # the CLI on the finished study: nothing is submitted
    rc = cli_main(["run", f"{__name__}:tiny_study", "--out", str(tmp_path), "--executor", "slurm", "--no-analyze"])
    out = capsys.readouterr().out
    assert rc == 0 and "nothing to submit (4 runs; skipped: 4 completed)" in out
    assert len(list((tmp_path / "tiny_slurm" / "submitit").iterdir())) == 1


def test_preempted_run_requeues_resumes_and_matches_an_uninterrupted_run(tmp_path):
    study = tiny_study(factors=("xsa",), steps=120, checkpoint_every=10, name="tiny_preempt")
    # the reference: the same specs, uninterrupted, in this process
    ref = run_study(study, tmp_path / "ref", ExecOptions(executor="debug"), progress=False)
    assert ref.counts["completed"] == 2

    rep = run_study(study, tmp_path / "slurm", ExecOptions(executor="slurm", wait=False, poll_s=1.0), progress=False)
    run, job = rep.submission.runs[0], rep.submission.jobs[0]
    metrics = run.dir / "metrics.jsonl"
    t0 = time.time()
    while True:  # interrupt mid-run: after a checkpoint, well before the end
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        steps = [json.loads(x)["step"] for x in lines if '"loss"' in x]
        if steps and max(steps) >= 15:
            break
        assert time.time() - t0 < 120, "the run did not start"
        time.sleep(0.05)
    # USR2 to the job's tasks, as SLURM sends it before the time limit. scancel retries while
    # the job is being requeued and would signal the requeued job again: stop it once delivered.
    scancel = subprocess.Popen(["scancel", "--signal=USR2", job.job_id])
    log = run.dir / "train.log"
    while "interrupted at step" not in log.read_text():
        assert time.time() - t0 < 150, "USR2 was not delivered"
        time.sleep(0.05)
    scancel.terminate()
    scancel.wait()
    counts = wait(rep.submission, rep.submission.runs, poll_s=1.0, timeout_s=170)
    assert counts["completed"] == 2, counts

    text = log.read_text()
    assert text.count("interrupted at step") == 1 and text.count("resumed") == 1
    assert "REQUEUED" in _sacct_states(job.job_id)
    got, want = read_json(run.dir / "summary.json"), read_json(planned_runs(study, tmp_path / "ref")[0].dir / "summary.json")
    assert got["run_id"] == want["run_id"] and got["step"] == want["step"] == 120
    assert got["eval_macro_loss"] == want["eval_macro_loss"]
    assert got["loss_curve"] == want["loss_curve"]
