"""Live visibility: train's per-step line, a study's ETA and running runs in `run`/`status`, and a
study's runs reaching offline W&B and TensorBoard grouped by study and tagged with arm/rung/levels."""

import io
import json
import os
import re

import pytest

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.ablations.study import Study
from marin_ablate.cli import status as status_commands
from marin_ablate.marin.runlock import RunLock
from marin_ablate.marin.train.step_progress import StepProgress, format_line
from marin_ablate.sweeps.executors import ExecOptions
from marin_ablate.sweeps.progress import Progress, last_train_record, run_live, study_eta
from marin_ablate.sweeps.runs import write_run_files
from marin_ablate.sweeps.sweep import planned_runs, run_study


def tiny_study(name: str = "tiny_watch", steps: int = 3) -> Study:
    rung = Rung("tiny", "tiny", fixed_steps=steps, batch_size=2, est_tokens_per_s=1000.0,
                train_overrides={"eval_batches": 1, "eval_every": steps, "checkpoint_every": 2, "log_every": 1})
    return Study(name=name, description="tiny test study", factors=("xsa",), design=full_factorial(["xsa"]),
                 rungs=(rung,), seeds=(0,), executor={"executor": "debug"})


# ---------------------------------------------------------------------------------------------
# train's per-step line
# ---------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_step_line_in_logs_shows_step_loss_throughput_mfu_drops_and_eta():
    clock, out = FakeClock(), io.StringIO()
    p = StepProgress(100, start_step=10, stream=out, tty=False, clock=clock)
    clock.t += 30.0  # 10 steps (10 -> 20) in 30 s: 80 steps left take 240 s
    line = p.update({"step": 19, "loss": 3.45678, "tokens_per_s": 12345.0, "mfu": 0.3123, "drop_rate": 0.004})
    assert line == "step 20/100 (20%) | loss 3.4568 | 12.3k tok/s | mfu 31.2% | drop 0.40% | eta 4m00s"
    assert out.getvalue() == line + "\n"
    assert format_line({"step": 0, "loss": 2.0}, 5, None) == "step 1/5 (20%) | loss 2.0000"


def test_step_line_on_a_terminal_is_a_tqdm_bar_with_the_numbers():
    out = io.StringIO()
    p = StepProgress(50, stream=out, tty=True)
    p.update({"step": 9, "loss": 1.5, "tokens_per_s": 2e6, "mfu": None, "drop_rate": 0.0})
    p.close()
    text = out.getvalue()
    assert "\r" in text and "10/50" in text and "loss 1.5000 | 2M tok/s | drop 0.00%" in text


# ---------------------------------------------------------------------------------------------
# study progress: ETA and running runs
# ---------------------------------------------------------------------------------------------


def _model(**kw):
    from marin_ablate.planning.costmodel import CostModel, prior_from

    return CostModel(*prior_from([90.0, 390.0], [100.0, 400.0], 10.0), **kw)  # 10 s + 1 s/FLOP


def test_eta_without_measured_runs_is_the_plan_with_a_wide_interval_and_credits_running_steps():
    runs = [{"state": "running", "flops": 90.0, "step": 30, "total": 40},
            {"state": "pending", "flops": 390.0}, {"state": "failed", "flops": 390.0}]
    e = study_eta(runs, _model(), slots=2)
    assert e.seconds == pytest.approx((100 * 0.25 + 400) / 2) and e.n_measured == 0
    assert e.lo < 0.7 * e.seconds and e.hi > 1.3 * e.seconds  # an assumption is stated as one
    assert study_eta([{"state": "pending", "flops": None}], _model(), 1) is None


def test_eta_moves_towards_finished_runs_and_leaves_out_cold_starts():
    """Runs 1.5x slower than the plan: one finished run moves the ETA towards 1.5x, twenty bring it
    there with a narrow interval; a worker's first run (one-time start-up costs) is not data."""
    from marin_ablate.planning.costmodel import mark_cold

    pending = [{"state": "pending", "flops": 390.0}] * 4
    first = study_eta([{"state": "completed", "flops": 90.0, "wall_s": 150.0}, *pending], _model(), 1)
    assert 1600 < first.seconds < 1.1 * 1.5 * 1600 and first.n_measured == 1
    many = [{"state": "completed", "flops": f, "wall_s": 1.5 * (10 + f)} for f in (90.0, 390.0) * 10]
    late = study_eta([*many, *pending], _model(), 1)
    assert late.seconds == pytest.approx(1.5 * 1600, rel=0.1) and late.hi - late.lo < 0.5 * late.seconds
    assert late.n_measured == 20
    cold = mark_cold([{"state": "completed", "flops": 90.0, "wall_s": 500.0, "started_at": 10.0},
                      {"state": "completed", "flops": 90.0, "wall_s": 100.0, "started_at": 20.0}], since=5.0, slots=1)
    assert [r.get("cold", False) for r in cold] == [True, False]
    assert study_eta([*cold, *pending], _model(), 1).seconds == pytest.approx(1600, rel=0.05)


def _running_run(tmp_path):
    """A planned run held by a lock (as a worker holds it), with 3 train lines and an eval line."""
    run = planned_runs(tiny_study(), tmp_path)[0]
    write_run_files(run)
    lines = [{"step": s, "loss": 4.0 - s} for s in range(3)] + [{"step": 3, "eval_macro_loss": 9.0, "loss": None}]
    lines[-1].pop("loss")
    (run.dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3, "lo')
    lock = RunLock(run.dir)
    assert lock.acquire()
    return run, lock


def test_run_live_reads_step_total_last_loss_and_elapsed_from_the_run_dir(tmp_path):
    run, lock = _running_run(tmp_path)
    try:
        assert last_train_record(run.dir / "metrics.jsonl") == {"step": 2, "loss": 2.0}
        since = json.loads((run.dir / ".lock").read_text())["since"]
        assert run_live(run.dir, now=since + 65) == {"step": 3, "total": 3, "loss": 2.0, "elapsed_s": 65}
    finally:
        lock.release()


def test_run_progress_shows_eta_and_each_running_runs_step_and_loss(tmp_path):
    run, lock = _running_run(tmp_path)
    runs = planned_runs(tiny_study(), tmp_path)
    out = io.StringIO()
    try:
        from marin_ablate.planning.costmodel import spec_flops

        pending = next(r for r in runs if r.run_id != run.run_id)  # the running run has no step left
        p = Progress(len(runs), "tiny_watch", stream=out, tty=False, runs=runs, slots=1,
                     prior=(0.0, 60.0 / spec_flops(pending.spec)), scale_for_load=False)
        p.update({})
    finally:
        lock.release()
    head, running = out.getvalue().splitlines()
    assert head.startswith("tiny_watch: 0/2 done, 1 running, 0 failed, 1 pending")
    assert re.search(r"ETA 1m00s \(0m\d\ds-\dm\d\ds\)$", head)
    assert running.startswith(f"  {run.run_id} tiny {run.meta['arm']} seed 0: step 3/3 loss 2.0000")


def _status(tmp_path, monkeypatch, capsys, *flags):
    monkeypatch.setattr(status_commands, "study_from_args", lambda args: tiny_study())
    assert status_commands.cmd_status(["tiny_watch", "--out", str(tmp_path), *flags]) == 0
    return capsys.readouterr().out


def test_status_json_and_compact_table_show_a_running_runs_step_loss_and_elapsed(tmp_path, monkeypatch, capsys):
    run, lock = _running_run(tmp_path)
    try:
        st = json.loads(_status(tmp_path, monkeypatch, capsys, "--json"))
        compact = _status(tmp_path, monkeypatch, capsys)
        every = _status(tmp_path, monkeypatch, capsys, "--all")
    finally:
        lock.release()
    row = next(r for r in st["runs"] if r["run_id"] == run.run_id)
    assert (row["state"], row["step"], row["total"], row["loss"]) == ("running", 3, 3, 2.0)
    assert row["elapsed_s"] >= 0 and st["counts"]["running"] == 1 and st["eta_s"] > 0
    other = next(r for r in st["runs"] if r["run_id"] != run.run_id)
    assert other["state"] == "pending" and other["step"] is None
    assert run.run_id in compact and other["run_id"] not in compact and "3/3" in compact
    assert run.run_id in every and other["run_id"] in every


def test_status_shows_no_python_none_a_completed_runs_total_and_the_arm_codes_key(tmp_path, monkeypatch, capsys):
    rung = Rung("tiny", "tiny", fixed_steps=3, batch_size=2, est_tokens_per_s=1000.0,
                train_overrides={"eval_batches": 1, "eval_every": 3, "log_every": 1})
    study = Study(name="tiny_key", description="two factors", factors=("xsa", "sconv"),
                  design=full_factorial(["xsa", "sconv"]), rungs=(rung,), seeds=(0,), executor={"executor": "debug"})
    runs = planned_runs(study, tmp_path)
    for r in runs:
        write_run_files(r)
    done = runs[0]
    (done.dir / "summary.json").write_text(json.dumps({"run_id": done.run_id, "status": "completed", "step": 3,
                                                       "wall_s": 2.0, "final_train_loss": 3.5}))
    monkeypatch.setattr(status_commands, "study_from_args", lambda args: study)
    assert status_commands.cmd_status(["tiny_key", "--out", str(tmp_path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    row = next(r for r in st["runs"] if r["run_id"] == done.run_id)
    assert (row["state"], row["step"], row["total"]) == ("completed", 3, 3)
    assert status_commands.cmd_status(["tiny_key", "--out", str(tmp_path), "--all"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "3/3" in out
    assert "arm codes: one sign per factor in this order: xsa (+ xsa, - none), sconv (+ short_conv, - none)" in out


# ---------------------------------------------------------------------------------------------
# W&B and TensorBoard
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow  # real runs with wandb and tensorboard
def test_a_studys_runs_reach_offline_wandb_and_tensorboard_grouped_and_tagged(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MARIN_LOG_TO", "wandb,tensorboard")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    study = tiny_study(steps=2)
    rep = run_study(study, tmp_path, ExecOptions(executor="debug"), progress=False)
    assert rep.counts["completed"] == 2
    assert "WANDB_RUN_GROUP" not in os.environ  # set around each run only
    for run in planned_runs(study, tmp_path):
        name = f"tiny_watch/tiny/{run.meta['arm']}/seed0"  # the run's name in both tools, not its hex id
        tb = run.dir / "tensorboard" / name.replace("/", "_")
        assert [p.name for p in (run.dir / "tensorboard").iterdir()] == [tb.name]
        acc = EventAccumulator(str(tb), size_guidance={"tensors": 0, "scalars": 0}).Reload()
        assert [e.step for e in acc.Scalars("loss")] == [0, 1]
        text = acc.Tensors("tags/text_summary")[0].tensor_proto.string_val[0].decode()
        assert "study: tiny_watch" in text and f"arm: {run.meta['arm']}" in text and "rung: tiny" in text
        assert f"xsa: {run.meta['factors']['xsa']}" in text
        offline = list((run.dir / "wandb").glob("offline-run-*"))
        assert len(offline) == 1
        blob = next(offline[0].glob("*.wandb")).read_bytes()
        for s in ("tiny_watch", f"arm:{run.meta['arm']}", "rung:tiny", f"xsa:{run.meta['factors']['xsa']}",
                  run.run_id, name):
            assert s.encode() in blob, s


def test_progress_and_plan_count_the_steps_a_run_trains_not_the_rungs(tmp_path):
    """token_multiplier (calibration's extra-compute arm) trains steps x m: step n/total, ETA and plan cost."""
    rung = Rung("tiny", "tiny", fixed_steps=3, batch_size=2, est_tokens_per_s=1000.0,
                train_overrides={"eval_batches": 1, "eval_every": 3, "checkpoint_every": 2, "token_multiplier": 2})
    study = Study(name="tiny_x2", description="x2 tokens", factors=("xsa",), design=full_factorial(["xsa"]),
                  rungs=(rung,), seeds=(0,), executor={"executor": "debug"})
    run = planned_runs(study, tmp_path)[0]
    write_run_files(run)
    assert run_live(run.dir)["total"] == 6 == run.spec.train.effective().steps
    p = Progress(2, "tiny_x2", stream=io.StringIO(), tty=False, runs=planned_runs(study, tmp_path))
    counts, rows = p.snapshot()
    assert counts["pending"] == 2 and [r["work"] for r in rows] == [2, 2]
    from marin_ablate.planning.costmodel import spec_flops

    x1 = [2 * spec_flops(r.spec) for r in planned_runs(tiny_study(steps=3), tmp_path / "x1")]
    assert [r["flops"] for r in rows] == pytest.approx(x1)  # the ETA counts the doubled steps
    from marin_ablate.ablations.studies import get_study

    cal = get_study("calibration", seeds=[0]).describe()
    for r in cal["rungs"]:  # 8 of the 16 arms train twice the steps
        assert r["core_seconds"] == pytest.approx(r["est_wall_s"] * (8 * 1 + 8 * 2), rel=0.01)  # est_wall_s is rounded
