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

import pandas as pd
import pytest

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.ablations.study import Study
from marin_ablate.cli.main import main as cli_main
from marin_ablate.sweeps.executors import ExecOptions, wait
from marin_ablate.sweeps.runs import read_json
from marin_ablate.sweeps.sweep import planned_runs, run_study


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


SLURM_PROBLEM = _slurm_problem()
# Under CI a missing cluster must fail, never pass as a skip (the fixture below fails instead).
SLURM_REQUIRED = os.environ.get("CI", "").lower() == "true" or os.environ.get("MARIN_REQUIRE_SLURM") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.slurm,
    pytest.mark.skipif(SLURM_PROBLEM is not None and not SLURM_REQUIRED, reason=f"no SLURM cluster: {SLURM_PROBLEM}"),
]


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    if SLURM_PROBLEM is not None:
        pytest.fail(f"SLURM tests are required here (CI / MARIN_REQUIRE_SLURM) but: {SLURM_PROBLEM}", pytrace=False)


def tiny_study(factors=("xsa",), steps: int = 4, checkpoint_every: int = 2, name: str = "tiny_slurm",
               seeds: tuple[int, ...] = (0,)) -> Study:
    rung = Rung("tiny", "tiny", fixed_steps=steps, batch_size=2,
                train_overrides={"eval_batches": 1, "eval_every": steps, "checkpoint_every": checkpoint_every,
                                 "log_every": 1})
    # timeout 20 min: submitit counts a USR2 in the last 20% (or 10 min) of the limit as a time-out
    return Study(name=name, description="tiny SLURM test study", factors=tuple(factors),
                 design=full_factorial(list(factors)), rungs=(rung,), seeds=seeds,
                 executor={"executor": "slurm", "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 20})


def _sacct_states(job_id: str) -> list[str]:
    r = subprocess.run(["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                       text=True, timeout=60)
    return [s.split()[0] for s in r.stdout.split("\n") if s.strip()]


def test_study_goes_in_as_one_array_and_a_rerun_submits_nothing(tmp_path, capsys):
    study = tiny_study()
    rep = run_study(study, tmp_path, ExecOptions(executor="slurm", poll_s=1.0), progress=False)
    assert rep.submitted == 2 and rep.counts["completed"] == 2, rep
    arrays = {j.split("_")[0] for j in rep.job_ids}
    assert len(arrays) == 1 and sorted(int(j.split("_")[1]) for j in rep.job_ids) == [0, 1]
    for run in planned_runs(study, tmp_path):
        s = read_json(run.dir / "summary.json")
        assert s["status"] == "completed" and s["step"] == 4
        assert read_json(run.dir / "job.json")["job_id"] in rep.job_ids
    script = next((tmp_path / "tiny_slurm" / "submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --cpus-per-task=1" in script
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=USR2@90" in script
    assert any(ln.startswith("srun ") and "--kill-on-bad-exit=1" in ln for ln in script.splitlines())

    # the CLI on the finished study: nothing is submitted
    rc = cli_main(["run", f"{__name__}:tiny_study", "--out", str(tmp_path), "--executor", "slurm", "--no-analyze"])
    out = capsys.readouterr().out
    assert rc == 0 and "nothing to submit (2 runs; skipped: 2 completed)" in out
    assert len(list((tmp_path / "tiny_slurm" / "submitit").iterdir())) == 1


def test_an_array_sbatch_refuses_ends_in_one_line_naming_what_it_asked_and_what_sbatch_said(tmp_path, capsys):
    from marin_ablate.sweeps.state import count_dirs

    rc = cli_main(["run", f"{__name__}:tiny_study", "--out", str(tmp_path), "--executor", "slurm",
                   "--slurm.mem_gb", "100000", "--no-analyze"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("marin-ablate run: error:")]
    assert rc == 2 and len(err) == 1, err
    assert "sbatch refused an array of 2 run(s) asking" in err[0] and "mem_gb=100000" in err[0]
    assert "Memory specification can not be satisfied" in err[0] and err[0].endswith("(nothing was submitted)")
    assert count_dirs([r.dir for r in planned_runs(tiny_study(), tmp_path)])["pending"] == 2


def test_a_study_larger_than_max_array_size_goes_in_as_several_arrays_runs_and_is_analysed(tmp_path, capsys):
    from marin_ablate.analysis.io.results import collect, inventory
    from marin_ablate.sweeps.executors import slurm_max_array_size

    limit = slurm_max_array_size()
    n = 6  # 2 arms x 3 seeds: a full array and a partial one at the CI cluster's MaxArraySize of 4
    assert limit < n, f"the CI cluster's MaxArraySize is {limit}; .ci/slurm.sh sets a small one (4)"
    study = tiny_study(factors=("xsa",), steps=2, checkpoint_every=100, name="wide_slurm", seeds=(0, 1, 2))
    rep = run_study(study, tmp_path, ExecOptions(executor="slurm", poll_s=1.0), progress=False)
    arrays: dict[str, list[int]] = {}
    for j in rep.job_ids:
        arrays.setdefault(j.split("_")[0], []).append(int(j.split("_")[1]))
    assert rep.submitted == n and rep.counts["completed"] == n, rep
    assert len(arrays) == -(-n // limit) and all(max(ix) < limit for ix in arrays.values()), arrays
    inv = inventory(collect(tmp_path / "wide_slurm", write=False))
    assert inv.n_runs == inv.n_completed == n and not inv.excluded
    rep2 = run_study(study, tmp_path, ExecOptions(executor="slurm", poll_s=1.0), progress=False)
    assert rep2.submitted == 0 and rep2.skipped == {"completed": n} and not rep2.job_ids


def _train_steps(run_dir: Path) -> int:
    p = run_dir / "metrics.jsonl"
    lines = p.read_text().splitlines() if p.exists() else []
    return max([json.loads(x)["step"] for x in lines if '"loss"' in x] or [-1])


def test_preempted_runs_requeue_resume_and_match_uninterrupted_runs(tmp_path):
    """Arm 0 gets USR2 (what SLURM sends before the time limit): train checkpoints, submitit's
    handler requeues. Arm 1 is requeued by SLURM (`scontrol requeue`, as preemption in REQUEUE
    mode): SIGTERM, train checkpoints, SLURM starts it again. Both resume and end bit-identical
    to the same runs done in one go. 60 steps: the signals land near step 15, and under a loaded machine's
    latency well before the end."""
    study = tiny_study(factors=("xsa",), steps=60, checkpoint_every=10, name="tiny_preempt")
    ref = run_study(study, tmp_path / "ref", ExecOptions(executor="debug"), progress=False)
    assert ref.counts["completed"] == 2

    rep = run_study(study, tmp_path / "slurm", ExecOptions(executor="slurm", wait=False, poll_s=1.0), progress=False)
    (usr2_run, requeue_run), (usr2_job, requeue_job) = rep.submission.runs, rep.submission.jobs
    t0 = time.time()
    while min(_train_steps(usr2_run.dir), _train_steps(requeue_run.dir)) < 15:  # mid-run, after a checkpoint
        assert time.time() - t0 < 120, "the runs did not start"
        time.sleep(0.05)
    # scancel retries while the job is being requeued and would signal the requeued job again:
    # stop it once the signal has been delivered
    scancel = subprocess.Popen(["scancel", "--signal=USR2", usr2_job.job_id])
    subprocess.run(["scontrol", "requeue", requeue_job.job_id], check=True, timeout=60)
    for run in (usr2_run, requeue_run):
        while "interrupted at step" not in (run.dir / "train.log").read_text():
            assert time.time() - t0 < 150, f"{run.meta['arm']} was not interrupted"
            time.sleep(0.05)
    scancel.terminate()
    scancel.wait()
    counts = wait(rep.submission, rep.submission.runs, poll_s=1.0, timeout_s=170)
    assert counts["completed"] == 2, counts

    for run, job, sig in ((usr2_run, usr2_job, "signal 12"), (requeue_run, requeue_job, "signal 15")):
        text = (run.dir / "train.log").read_text()
        assert text.count("interrupted at step") == 1 and sig in text and text.count("resumed") == 1
        assert "REQUEUED" in _sacct_states(job.job_id)
        got = read_json(run.dir / "summary.json")
        want = read_json(tmp_path / "ref" / "tiny_preempt" / "runs" / run.run_id / "summary.json")
        assert got["step"] == want["step"] == 60
        assert got["eval_macro_loss"] == want["eval_macro_loss"] and got["loss_curve"] == want["loss_curve"]


def smoke_four_arms(rungs=("cpu_s",), seeds=(0,)) -> Study:
    """The smoke study on 4 of its 16 arms: all-off, all-on and one more row with its mirror image (the
    resolution IV fraction holds each row's mirror), so every factor runs at both levels in a SLURM task."""
    from dataclasses import replace

    from marin_ablate.ablations.designs import arms
    from marin_ablate.ablations.studies import smoke

    study = smoke(seeds=seeds, rungs=rungs)
    rows = [tuple(r) for r in study.design.matrix]
    off = tuple(-1 for _ in study.design.factors)
    other = next(r for r in rows if r != off and tuple(-c for c in r) != off)
    picked = [off, tuple(-c for c in off), other, tuple(-c for c in other)]
    assert all(r in rows for r in picked), picked
    return replace(study, design=arms(study.design.factors, picked))


def test_smoke_through_slurm_gives_the_same_table_as_the_local_executor(tmp_path):
    """`run STUDY --executor slurm` with `--slurm.*` flags reproduces the local study (CPU runs are
    deterministic, so "within noise" is exact here): the smoke study's smallest rung, a few steps, 4 of its
    arms (each arm's task goes through SLURM the same way; the array code has its own tests above)."""
    small = [f"{__name__}:smoke_four_arms", "--rungs", "cpu_s", "--seeds", "0", "--train.steps=4", "--no-analyze",
             "--no-profile", "--no-pin"]
    assert cli_main(["run", *small, "--out", str(tmp_path / "local"), "--executor", "debug", "--threads", "1"]) == 0
    assert cli_main(["run", *small, "--out", str(tmp_path / "slurm"), "--executor", "slurm",
                     "--slurm.cpus_per_task", "1", "--slurm.mem_gb", "1"]) == 0
    from marin_ablate.analysis.io.results import collect

    cols = ["run_id", "arm", "eval_macro_loss", "final_train_loss", "drop_rate", "status"]
    local = collect(tmp_path / "local" / "smoke")[cols].sort_values("run_id").reset_index(drop=True)
    slurm = collect(tmp_path / "slurm" / "smoke")[cols].sort_values("run_id").reset_index(drop=True)
    assert len(local) == 4 and (slurm["status"] == "completed").all()
    assert {"all_on", "all_off"} <= set(local["arm"]), local["arm"]
    pd.testing.assert_frame_equal(local, slurm, rtol=1e-6, atol=1e-7)


def test_a_study_file_optimizer_and_response_reach_slurm_array_tasks(tmp_path):
    """tests/integration/test_plugins.py's study file (a Lion-like optimizer and a response registered at its top
    level) run through SLURM: the array tasks get plain data only, and a fresh `analyze` fits the response."""
    from test_plugins import _study_to_report

    sd, md = _study_to_report(tmp_path, {"executor": "slurm", "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 20})
    jobs = [json.loads(p.read_text()) for p in sorted(sd.glob("runs/*/job.json"))]
    assert {j["executor"] for j in jobs} == {"slurm"} and all(j.get("job_id") for j in jobs)
    assert "# Attribution report: lionx" in md and "| tokens/s T |" in md
