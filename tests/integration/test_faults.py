"""Faults and bad input: each test reproduces one way a run, a study or the CLI went wrong, and pins
the behaviour that replaced it. Training-side faults (checkpoints, metrics, locks on `train`) and
sweep/CLI faults live in separate sections."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.ablations.study import Study
from marin_ablate.cli.main import main as cli_main
from marin_ablate.marin.config import DataConfig, ModelConfig, RunSpec, TrainConfig
from marin_ablate.sweeps.executors import ExecOptions, SlurmOptions
from marin_ablate.sweeps.runs import write_run_files
from marin_ablate.sweeps.state import probe
from marin_ablate.sweeps.sweep import planned_runs

ROOT = Path(__file__).resolve().parents[2]


# --- sweeps and CLI ---


def sweep_study(steps: int = 3, checkpoint_every: int = 2, factors=("xsa",), seeds=(0,), name: str = "faults") -> Study:
    """Tiny preset, a few steps per run (seconds on one CPU thread)."""
    rung = Rung("tiny", "tiny", fixed_steps=steps, batch_size=2,
                train_overrides={"eval_batches": 1, "eval_every": steps, "checkpoint_every": checkpoint_every,
                                 "log_every": 1})
    return Study(name=name, description="fault tests", factors=tuple(factors), design=full_factorial(list(factors)),
                 rungs=(rung,), seeds=tuple(seeds), executor={"executor": "local", "max_parallel": 1,
                                                              "cpus_per_task": 1, "timeout_min": 20})


def slow_study() -> Study:
    """One run long enough to be stopped in the middle (imported by the `run` subprocess below)."""
    return sweep_study(steps=400, checkpoint_every=1000, name="slow")


def big_study() -> Study:
    """8,192 runs: 2^7 arms x 64 seeds (planned, never run)."""
    factors = ("xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer")
    return sweep_study(factors=factors, seeds=tuple(range(64)), name="big")


@pytest.mark.parametrize("make, field, allowed", [
    (lambda: TrainConfig(lr=-1e-3), "lr", "None or a finite number > 0"),
    (lambda: TrainConfig(adam_lr=-1.0), "adam_lr", "None or a finite number > 0"),
    (lambda: TrainConfig(log_every=0), "log_every", "an integer >= 1"),
    (lambda: TrainConfig(spike_window=0), "spike_window", "an integer >= 1"),
    (lambda: TrainConfig(checkpoint_every=-1), "checkpoint_every", "an integer >= 0"),
    (lambda: TrainConfig(eval_every=-1), "eval_every", "an integer >= 0"),
    (lambda: TrainConfig(warmup_frac=1.5), "warmup_frac", "a number in [0, 1]"),
    (lambda: TrainConfig(beta2=1.0), "beta2", "None or a number in [0, 1)"),
    (lambda: TrainConfig(grad_clip=float("nan")), "grad_clip", "None or a finite number > 0"),
    (lambda: ModelConfig(norm_eps=-1e-6), "norm_eps", "a finite number > 0"),
    (lambda: ModelConfig(rope_theta=0.0), "rope_theta", "a finite number > 0"),
    (lambda: ModelConfig(seq_len=32, window=64), "window", "1..32"),
    (lambda: ModelConfig(z_loss_weight=-1.0), "z_loss_weight", "a finite number >= 0"),
    (lambda: DataConfig(data_seed=-1), "data_seed", "an integer in [0, 2**64)"),
    (lambda: RunSpec(seed=2**64), "seed", "an integer in [0, 2**64)"),
    (lambda: ExecOptions(workers=0), "workers", "an integer >= 1"),
    (lambda: ExecOptions(poll_s=0), "poll_s", "a finite number > 0"),
    (lambda: SlurmOptions(time_min=0), "time_min", "None or an integer >= 1"),
])
def test_out_of_range_settings_are_refused_naming_field_and_range(make, field, allowed):
    with pytest.raises(ValueError) as e:
        make()
    assert f".{field}" in str(e.value) and f"{field}=" in str(e.value) and allowed in str(e.value), str(e.value)


def test_range_checks_are_the_same_for_train_run_tune_and_status(tmp_path, capsys):
    cases = [["train", "--preset", "tiny", "--train.log_every=0"],
             ["run", "test_faults:slow_study", "--train.log_every=0"],
             ["run", "test_faults:slow_study", "--tune", "--train.log_every=0"],
             ["status", "test_faults:slow_study", "--train.log_every=0"]]
    for argv in cases:
        argv = [*argv, "--run-dir" if argv[0] == "train" else "--out", str(tmp_path)]
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "TrainConfig.log_every=0 is out of range; allowed values: an integer >= 1" in err, (argv, err)
    assert cli_main(["run", "test_faults:slow_study", "--workers", "0", "--out", str(tmp_path)]) == 2  # ran with 2
    assert "--workers=0 is out of range" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expect", [
    (["plan", "no_such_module_xyz:study"], "cannot import (ModuleNotFoundError"),
    (["plan", ":study"], "allowed values: a registered study, path/to/file.py:attribute or package.module:attribute"),
    (["plan", "os.path:join"], "cannot be called with"),
    (["plan", "math:pi"], "is a float; allowed values: a Study, or a function returning one"),
    (["plan", "nope"], "unknown study 'nope'"),
    (["plan", "--preset", "nope"], "unknown preset 'nope'"),
])
def test_bad_names_are_one_line_errors_with_exit_2(argv, expect, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err and err.count("\n") == 1, err


def test_an_unusable_path_is_one_line_naming_it_with_exit_2(tmp_path, capsys):
    from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, write_study

    rng = np.random.default_rng(0)
    study = write_study(simulate_table(random_truth(["xsa", "sconv"], rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9},
                                       seeds=2, rng=rng), tmp_path / "study")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert cli_main(["analyze", str(study), "--report-dir", str(blocker / "report"), "--n-boot", "0"]) == 2
    err = capsys.readouterr().err
    assert str(blocker) in err and "Traceback" not in err and err.count("\n") == 1, err
    (tmp_path / "lr").mkdir()
    bad = tmp_path / "lr" / "slow" / "tune"
    bad.mkdir(parents=True)
    (bad / "lr_multipliers.json").write_text('{"recipe": ')
    assert cli_main(["run", "test_faults:slow_study", "--out", str(tmp_path / "lr"), "--tuned"]) == 2
    err = capsys.readouterr().err
    assert "lr_multipliers.json' is damaged" in err and err.count("\n") == 1, err


def test_analyze_counts_a_copied_run_once_names_unreadable_and_nan_runs_and_writes_only_under_out(tmp_path, capsys):
    from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, write_study
    from marin_ablate.analysis.io.results import collect, inventory
    from marin_ablate.analysis.pipeline import analyze_table

    rng = np.random.default_rng(1)
    df = simulate_table(random_truth(["xsa", "sconv"], rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9}, seeds=2,
                        rng=rng)
    study = write_study(df, tmp_path / "study")
    runs = sorted((study / "runs").iterdir())
    shutil.copytree(runs[0], study / "runs" / "copy-of-first")  # a copied run folder
    nan_dir = runs[1]
    s = json.loads((nan_dir / "summary.json").read_text())
    (nan_dir / "summary.json").write_text(json.dumps(dict(s, eval_macro_loss=float("nan"))))  # NaN survives JSON
    (runs[2] / "summary.json").write_bytes(b'{"status": "compl\xff')  # one bad byte
    t = collect(study, write=False)
    assert (t["status"] == "duplicate").sum() == 1 and (t["status"] == "unreadable").sum() == 1
    inv = inventory(t)
    reasons = dict(inv.excluded)
    assert inv.n_runs == len(df)  # the copy is not a run
    assert "copy-of-first" in reasons[runs[0].name] and "counted once" in reasons[runs[0].name]
    assert str(runs[2] / "summary.json") in reasons[runs[2].name]
    assert reasons[nan_dir.name] == "completed, but eval_macro_loss is nan"
    a = analyze_table(t, n_boot=0)
    assert any(nan_dir.name in n and "nan" in n for n in a.notes)  # the report lists it with its reason
    out = tmp_path / "elsewhere"
    assert cli_main(["analyze", str(study), "--report-dir", str(out), "--n-boot", "0", "--no-figures"]) == 2
    assert not (study / "results.parquet").exists() and not (study / "report").exists()
    assert (out / "results.parquet").exists() and (out / "report.md").exists()
    said = capsys.readouterr()
    assert "left out" in said.out
    assert said.err.strip().splitlines() == [f"marin-ablate analyze: error: 1 run folder(s) left out as damaged: "
                                             f"{reasons[runs[2].name]}; the report is written without it: "
                                             f"{out / 'report.md'}"]  # the copy and the NaN run are no damage


@pytest.mark.slow
def test_run_exits_nonzero_while_another_process_holds_a_run(tmp_path, capsys):
    study = sweep_study()  # the study the CLI below runs
    run = planned_runs(study, tmp_path)[0]
    write_run_files(run)
    held = subprocess.Popen([sys.executable, "-c", "import sys, time; from marin_ablate.marin.runlock import RunLock; "
                             f"assert RunLock({str(run.dir)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # noqa: E501
    try:
        assert held.stdout.readline().strip() == "held"
        # the other arm completes; this one belongs to the other process
        rc = cli_main(["run", "test_faults:sweep_study", "--out", str(tmp_path), "--executor", "debug",
                       "--no-analyze"])
        out = capsys.readouterr().out
        assert rc == 1, out  # used to exit 0 while a run was still running
        assert "1 completed" in out and "1 running" in out and "not finished" in out
    finally:
        held.kill()
        held.wait()
    assert probe(run.dir).state == "pending"


@pytest.mark.slow
def test_sigterm_to_the_run_driver_stops_its_workers_which_checkpoint(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{Path(__file__).parent}")  # the study is imported from this file
    cmd = [sys.executable, "-m", "marin_ablate", "run", "test_faults:slow_study", "--out", str(tmp_path),
           "--executor", "local", "--workers", "1", "--threads", "1", "--no-analyze"]
    drv = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    run_dir = next(iter(planned_runs(slow_study(), tmp_path))).dir
    t0 = time.time()
    while not (run_dir / "metrics.jsonl").exists() or (run_dir / "metrics.jsonl").stat().st_size < 200:
        assert drv.poll() is None, drv.communicate()
        assert time.time() - t0 < 240, "the run never started"
        time.sleep(0.5)
    assert probe(run_dir).state == "running"
    drv.send_signal(signal.SIGTERM)
    out, err = drv.communicate(timeout=120)
    assert drv.returncode == 128 + signal.SIGTERM, (out, err)  # non-zero: the run is unfinished
    assert "stopped the local workers" in err
    st = probe(run_dir)  # the worker is gone (lock free) and left a checkpoint to resume from
    assert st.state == "partial", (st, out, err)
    assert any((run_dir / "checkpoints").glob("ckpt_*"))


@pytest.mark.slow
def test_status_of_an_8192_run_study_stays_compact(tmp_path, capsys):
    assert cli_main(["status", "test_faults:big_study", "--out", str(tmp_path), "--limit", "20"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("big: 0/8192 done, 0 running, 0 failed, 8192 pending")
    assert len(out) <= 24, len(out)  # counts, a note, a header and 20 rows
