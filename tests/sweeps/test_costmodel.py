"""The cost model behind `plan`, `run` and `tune` (planning/costmodel.py): a damaged cache line is skipped and
named, every measured run counts once (cache and study folder), and the 90% interval scaled by the
machine's load is exact on the rows real runs record (its coverage on real runs: benchmarks/costmodel.py)."""

from __future__ import annotations

import json
import time

import pytest

from marin_ablate.planning import costmodel as cm
from marin_ablate.sweeps.progress import plan_estimate
from marin_ablate.sweeps.sweep import planned_runs


def test_a_damaged_cache_line_is_skipped_and_named_by_file_line_and_field(tmp_path, capsys):
    path = tmp_path / cm.CACHE_FILE
    good = {"run_id": "r1", "flops": 1e9, "wall_s": 5.0, "host": "h", "slots": 1}
    lines = [json.dumps(good).encode(), json.dumps(dict(good, flops="abc")).encode(),
             json.dumps(dict(good, wall_s=-3.0)).encode(), b'{"run_id": "r4", "flops": 1e9, "wall_s": Infinity}',
             bytes(range(128, 250)), json.dumps(dict(good, wall_s=float("nan"))).encode(), b"[1, 2]",
             json.dumps(dict(good, slowdown=0.5)).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    problems: list[str] = []
    rows = cm.read_cache(path, problems)
    assert [r["run_id"] for r in rows] == ["r1"]
    assert problems == [f"{path} line 2: field 'flops' is 'abc', not a positive finite number: skipped",
                        f"{path} line 3: field 'wall_s' is -3.0, not a positive finite number: skipped",
                        f"{path} line 4: field 'wall_s' is inf, not a positive finite number: skipped",
                        f"{path} line 5: not a JSON line: skipped",
                        f"{path} line 6: field 'wall_s' is nan, not a positive finite number: skipped",
                        f"{path} line 7: not a JSON object: skipped",
                        f"{path} line 8: field 'slowdown' is 0.5, not a positive finite number: skipped"]
    assert "line 5: not a JSON line" in capsys.readouterr().err  # said on the console too
    # recording beside the damaged lines still appends (a bad cache never fails `run` after training)
    assert cm.record([{"run_id": "r9", "flops": 2e9, "wall_s": 7.0}], 1, path) == 1
    assert [r["run_id"] for r in cm.read_cache(path)] == ["r1", "r9"]


def test_plan_with_a_damaged_cache_states_a_sane_interval(tmp_path, monkeypatch, capsys):
    from marin_ablate.cli.main import main

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("MARIN_CACHE_DIR", str(cache))
    (cache / cm.CACHE_FILE).write_bytes(b'{"flops": "abc", "wall_s": 1}\n{"flops": 1e9, "wall_s": -5}\n'
                                        b'{"flops": 1e9, "wall_s": Infinity}\n\xff\xfe\x00garbage\n')
    assert main(["plan", "smoke", "--out", str(tmp_path / "fresh")]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and err.count(str(cache / cm.CACHE_FILE)) == 4
    line = next(x for x in out.splitlines() if x.startswith("time: "))
    assert "nan" not in line and "assumed, no run measured yet" in line


def _study():
    from marin_ablate.ablations.designs import full_factorial
    from marin_ablate.ablations.ladders import Rung
    from marin_ablate.ablations.study import Study

    rung = Rung("tiny", "tiny", fixed_steps=3, batch_size=2, est_tokens_per_s=1000.0,
                train_overrides={"eval_batches": 1, "eval_every": 3, "log_every": 1})
    return Study(name="tiny_cost", description="tiny test study", factors=("xsa",), design=full_factorial(["xsa"]),
                 rungs=(rung,), seeds=(0,), executor={"executor": "debug"})


def test_cache_rows_of_the_planned_runs_count_once_even_with_a_fresh_study_folder(tmp_path, monkeypatch):
    """The cache's measured runs of exactly these specs are data for a fresh --out (they used to be
    dropped by run id); a run both in the cache and done in the folder counts once."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("MARIN_CACHE_DIR", str(cache))
    runs = planned_runs(_study(), tmp_path / "fresh")
    rows = [{"run_id": r.run_id, "flops": cm.spec_flops(r.spec), "wall_s": 30.0, "device": "cpu",
             "slowdown": 1.5} for r in runs]
    cm.record(rows, 1, cache / cm.CACHE_FILE)
    prior = (1.0, 1.0 / cm.spec_flops(runs[0].spec))
    e = plan_estimate([r.spec for r in runs], prior, 1, 1, [r.dir for r in runs])
    assert e.n_measured == len(runs) and "fitted to 2 measured runs" in e.text()
    done = runs[0]
    done.dir.mkdir(parents=True)
    (done.dir / "summary.json").write_text(json.dumps({"status": "completed", "run_id": done.run_id, "wall_s": 30.0,
                                                       "started_at": time.time() - 40}))
    e2 = plan_estimate([r.spec for r in runs], prior, 1, 1, [r.dir for r in runs])
    assert e2.n_measured == len(runs)  # the folder's completed run is the cache's row: not a third one


def test_the_load_scales_the_estimate_and_is_said():
    m = cm.CostModel(1.0, 1.0, obs=[(9.0, 10.0, 1.0)] * 5)
    idle = m.predict([9.0], factor=1.0)
    busy = m.predict([9.0], factor=3.0, load_note="x3.00 for the load now")
    assert busy.seconds == pytest.approx(3 * idle.seconds) and busy.hi / busy.seconds > idle.hi / idle.seconds
    assert "x3.00 for the load now" in busy.text()
    # a run measured twice as slow as idle is an idle 10 s
    assert cm.CostModel(1.0, 1.0, obs=[(9.0, 20.0, 2.0)] * 20).predict([9.0]).seconds == pytest.approx(10.0, rel=0.05)
    assert cm.run_slowdown({"cpu_s": 5.0, "session_wall_s": 20.0, "threads": 1}) == 4.0
    assert cm.run_slowdown({"cpu_s": 5.0}) is None  # a run of an older version: taken as unloaded


# --- what real runs record for it ------------------------------------------------------------
# Whether the 90% interval covers real runs on a loaded and an idle machine is timing on a shared
# machine: benchmarks/costmodel.py measures it (benchmarks/RESULTS.md), no test asserts it.


def test_a_real_run_records_the_cpu_time_and_wall_its_slowdown_is_read_from(tmp_path):
    """The fields `run_slowdown` reads are written by a real run (one thread: CPU time <= wall), and a
    model fitted on such rows predicts the same run at a load k as k times its idle estimate."""
    from marin_ablate.marin.config import RunSpec, TrainConfig
    from marin_ablate.marin.presets import preset
    from marin_ablate.marin.train import train

    spec = RunSpec(model=preset("tiny", ["seq_len=64"]),
                   train=TrainConfig(steps=4, batch_size=2, eval_every=0, eval_batches=1, checkpoint_every=0,
                                     log_every=4, threads=1))
    summary = train(spec, tmp_path / "r", resume=False, keep_checkpoints="none")
    assert summary["status"] == "completed" and summary["threads"] == 1
    assert 0 < summary["cpu_s"] <= summary["session_wall_s"] * 1.05  # one thread cannot get more than the wall
    (row,) = cm.finished([tmp_path / "r"])
    assert row["flops"] == pytest.approx(cm.spec_flops(spec)) and row["slowdown"] >= 1.0
    assert row["slowdown"] == pytest.approx(cm.run_slowdown(summary), rel=1e-3)
    m = cm.CostModel(*cm.prior_from([row["flops"]], [3.0], 0.5), obs=cm.observations([row] * 4, []))
    assert m.predict([row["flops"]], factor=2.5).seconds == pytest.approx(2.5 * m.predict([row["flops"]]).seconds)


def test_plan_prints_each_alias_group_once_the_arm_key_and_what_train_flops_sums(tmp_path, capsys):
    from marin_ablate.cli.main import main

    assert main(["plan", "smoke", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n  AB = CE = DF\n") == 1 and "\n  CE = " not in out and "\n  DF = " not in out
    assert "arm codes: one sign per factor in this order: xsa (+ xsa, - none)" in out
    assert "(train_flops, gpu_hours, core_seconds: the rung's total over its n_runs runs)" in out


def test_plan_preset_shows_the_rungs_overrides_and_what_params_active_marin_counts(capsys):
    from marin_ablate.cli.main import main

    assert main(["plan", "--preset", "d512"]) == 0
    out = capsys.readouterr().out
    assert "rung d512 trains with model.attention=flex model.kernels=triton" in out and "train.compile=True" in out
    assert "params_active_marin 20.840M: Marin's count, which its ladder sizes tokens by" in out
