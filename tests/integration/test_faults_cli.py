"""Bad numbers on the command line: every numeric argument has bounds, refused in one line naming
the argument and the allowed values before any work starts (nan, inf, negatives, absurd sizes)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from marin_ablate.cli.main import main as cli_main


def _one_line(capsys) -> str:
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("argv, flag, allowed", [
    (["analyze", "nowhere", "--n-boot", "1000000000"], "--n-boot", "an integer in 0..1000000"),
    (["analyze", "nowhere", "--n-boot", "-1"], "--n-boot", "an integer in 0..1000000"),
    (["analyze", "nowhere", "--pin-alpha", "nan"], "--pin-alpha", "a finite number > 0"),
    (["analyze", "nowhere", "--pin-linf", "-3"], "--pin-linf", "a finite number >= 0"),
    (["analyze", "nowhere", "--pin-linf", "inf"], "--pin-linf", "a finite number >= 0"),
    (["analyze", "nowhere", "--target=-1e21"], "--target", "a finite number > 0"),
    (["analyze", "nowhere", "--seed", "-5"], "--seed", "an integer in [0, 2**64)"),
    (["analyze", "nowhere", "--forecast", "--target", "inf"], "--target", "a finite number > 0"),
    (["run", "smoke", "--workers", "0"], "workers", "an integer >= 1"),
    (["run", "smoke", "--slurm.mem_gb", "nan"], "mem_gb", "None or a finite number > 0"),
    (["run", "smoke", "--executor", "slurm", "--slurm.signal_delay_s", "-1"], "signal_delay_s", "an integer >= 1"),
    (["run", "smoke", "--tune.span", "inf"], "--tune.span", "a finite number > 1"),
    (["run", "smoke", "--tune.points", "2"], "--tune.points", "an integer in 3..64"),
    (["plan", "smoke", "--dry-run", "--dry-run.capacity_gib", "inf"], "--dry-run.capacity_gib", "a finite number > 0"),
    (["status", "smoke", "--limit", "-2"], "--limit", "an integer >= 0"),
    (["train", "--preset", "tiny", "--run-dir", "nowhere", "--stop-after", "0"], "--stop-after", "an integer >= 1"),
])
def test_numeric_arguments_out_of_range_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, flag,
                                                                      allowed):
    monkeypatch.chdir(tmp_path)
    assert cli_main(argv) == 2
    line = _one_line(capsys)
    assert flag in line and allowed in line, line
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_infinite_lr_scale_is_refused_naming_the_field(tmp_path, capsys):
    assert cli_main(["plan", "smoke", "--train.lr_scale=inf"]) == 2
    line = _one_line(capsys)
    assert "lr_scale" in line and "a finite number > 0" in line, line


def test_infinity_in_lr_multipliers_json_is_refused_naming_the_file(tmp_path, capsys):
    from marin_ablate.sweeps.tuning import tune_dir

    path = tune_dir(tmp_path, "smoke") / "lr_multipliers.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"recipe": Infinity, "baseline": 1.0}')
    assert json.loads(path.read_text())["recipe"] == float("inf")  # what Python's json reads it as
    assert cli_main(["status", "smoke", "--out", str(tmp_path), "--tuned"]) == 2
    line = _one_line(capsys)
    assert str(path) in line and "'recipe'" in line and "a finite number > 0" in line, line


def test_a_bootstrap_beyond_the_machines_memory_is_refused_before_any_draw(monkeypatch):
    import os

    from marin_ablate.analysis.study_folder import boot_bytes, check_boot_memory

    table = pd.DataFrame({"xsa": [0, 1], "sconv": [0, 1]})
    check_boot_memory(200, table)  # the default fits anywhere
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    n = ram // boot_bytes(1, 2) + 1  # one replicate more than the whole memory holds
    with pytest.raises(ValueError,
                       match=rf"--n-boot {n} needs about .* GiB .*allowed values here: an integer in 0\.\.\d+"):
        check_boot_memory(n, table)
    assert boot_bytes(10**9, 7) > 22 * 2**30  # the 22.8 GB an unbounded run grew to before it was killed


@pytest.mark.parametrize("sink", ["tensorboard", "wandb"])
def test_a_missing_log_backend_is_refused_before_any_run_is_launched(tmp_path, capsys, monkeypatch, sink):
    import sys

    monkeypatch.setitem(sys.modules, sink, None)  # Python's own "not importable here"
    assert cli_main(["run", "test_faults:slow_study", "--out", str(tmp_path), "--log-to", sink]) == 2
    line = _one_line(capsys)
    assert f"--log-to {sink} needs the '{sink}' extra" in line and f"pip install 'marin-ablate[{sink}]'" in line
    assert not list(tmp_path.rglob("spec.json"))  # no run was launched


def test_the_end_of_run_names_where_the_logs_are_and_the_sync_command(tmp_path):
    from marin_ablate.sweeps.tracking import log_locations

    runs = tmp_path / "runs"
    (runs / "a" / "wandb" / "offline-run-20260101_000000-a").mkdir(parents=True)
    (runs / "b" / "tensorboard").mkdir(parents=True)
    lines = log_locations(tmp_path, ("wandb", "tensorboard"))
    assert f"tensorboard --logdir {runs}" in lines[0]
    assert "W&B offline runs: 1 under" in lines[1] and f"wandb sync {runs}/*/wandb/offline-run-*" in lines[1]
