"""Study-level faults: a copied run folder is one run and never a lost one, tampered meta.json and
wrongly typed summary.json fields are one line (the run named, left out), and a retried failure
leaves no stale error.txt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from marin_ablate.cli.main import main as cli_main


def _sim_study(tmp_path: Path) -> Path:
    from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, write_study

    rng = np.random.default_rng(1)
    df = simulate_table(random_truth(["xsa", "sconv"], rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9}, seeds=2,
                        rng=rng)
    return write_study(df, tmp_path / "study")


def test_a_copied_run_folder_is_counted_once_and_never_reported_lost(tmp_path, capsys):
    from marin_ablate.analysis.io.results import collect
    from marin_ablate.analysis.pipeline import analyze_table

    study = _sim_study(tmp_path)
    runs = sorted((study / "runs").iterdir())
    shutil.copytree(runs[0], study / "runs" / "copy-of-first")
    t = collect(study, write=False)
    assert (t["status"] == "duplicate").sum() == 1
    a = analyze_table(t, n_boot=0)
    assert a.lost == [] and not [w for w in a.warnings if "lost" in w], a.warnings
    assert cli_main(["analyze", str(study), "--n-boot", "0", "--no-figures",
                     "--report-dir", str(tmp_path / "rep")]) == 0
    assert "lost" not in capsys.readouterr().out


def test_tampered_meta_and_wrongly_typed_summary_fields_are_one_line_naming_the_file(tmp_path, capsys):
    from marin_ablate.analysis.io.results import collect

    study = _sim_study(tmp_path)
    runs = sorted((study / "runs").iterdir())
    meta = json.loads((runs[0] / "meta.json").read_text())
    meta["coding"]["xsa"]["truth"] = "big"
    (runs[0] / "meta.json").write_text(json.dumps(meta))
    meta = json.loads((runs[1] / "meta.json").read_text())
    (runs[1] / "meta.json").write_text(json.dumps(dict(meta, factors=["xsa"])))
    s = json.loads((runs[2] / "summary.json").read_text())
    (runs[2] / "summary.json").write_text(json.dumps(dict(s, wall_s="slow", loss_curve=7)))
    s = json.loads((runs[3] / "summary.json").read_text())
    (runs[3] / "summary.json").write_text(json.dumps(dict(s, step="abc")))
    t = collect(study, write=False)
    bad = t[t["status"] == "unreadable"].set_index("run_id")["error"].to_dict()
    assert "coding.xsa.truth is 'big'" in bad[runs[0].name] and str(runs[0] / "meta.json") in bad[runs[0].name]
    assert "'factors' and 'coding' must be objects" in bad[runs[1].name]
    assert "field 'wall_s' is 'slow'; allowed values: a number or null" in bad[runs[2].name]
    assert "field 'step' is 'abc'; allowed values: an integer or null" in bad[runs[3].name]
    capsys.readouterr()
    assert cli_main(["analyze", str(study), "--n-boot", "0", "--no-figures",
                     "--report-dir", str(tmp_path / "rep")]) == 2  # the report written, the damage named last
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "left out" in out.out and (tmp_path / "rep" / "report.md").exists()
    assert out.err.strip().splitlines() == [f"marin-ablate analyze: error: 4 run folder(s) left out as damaged: "
                                            f"{bad[runs[0].name]} (and 3 more: see the report's Runs); the report is "
                                            f"written without them: {tmp_path / 'rep' / 'report.md'}"]


def test_a_wrongly_typed_summary_field_in_status_is_no_traceback(tmp_path, capsys):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_faults import sweep_study

    from marin_ablate.sweeps.runs import write_run_files
    from marin_ablate.sweeps.sweep import planned_runs

    runs = planned_runs(sweep_study(), tmp_path)
    for r in runs:
        write_run_files(r)
    (runs[0].dir / "summary.json").write_text(json.dumps({"status": "failed", "error": 5, "failed_step": "x"}))
    meta = json.loads((runs[1].dir / "meta.json").read_text())
    (runs[1].dir / "meta.json").write_text(json.dumps(dict(meta, seed="zero")))
    assert cli_main(["status", "test_faults:sweep_study", "--out", str(tmp_path), "--all"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_successful_retry_leaves_no_error_txt_and_keeps_the_failed_record(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_faults import sweep_study

    from marin_ablate.sweeps.runs import RunTask, execute
    from marin_ablate.sweeps.sweep import planned_runs

    run = planned_runs(sweep_study(steps=2), tmp_path)[0]
    run.dir.mkdir(parents=True)
    (run.dir / "checkpoints").write_text("a file where the checkpoint folder goes")  # a real failure
    first = execute(RunTask.of(run))
    assert first["outcome"] == "failed" and (run.dir / "error.txt").exists()
    (run.dir / "checkpoints").unlink()
    again = execute(RunTask.of(run, retry_failed=True))
    assert again["outcome"] == "ran" and again["status"] == "completed"
    assert not (run.dir / "error.txt").exists()
    assert len(list(run.dir.glob("error.failed-*.txt"))) == 1 and len(list(run.dir.glob("summary.failed-*.json"))) == 1
