"""Run identity end to end (marin/schema.py `foreign`, `check_name`): a run id is one safe path component,
refused before anything is written; every file of a run folder names the folder's run, and a folder that
names another run, or resolves outside its study through a symbolic link, is left out naming the file and
both ids; `status` counts only a valid summary of the run itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from marin_ablate.ablations.studies import get_study
from marin_ablate.analysis.io.results import collect, inventory
from marin_ablate.cli.main import main
from marin_ablate.marin.flops import trained_totals
from marin_ablate.marin.schema import check_name, foreign
from marin_ablate.marin.train.metrics import MetricsLog
from marin_ablate.sweeps.runs import write_run_files, write_runs
from marin_ablate.sweeps.sweep import planned_runs


def _rows() -> list[dict]:
    """Three arms (a baseline and two single changes) at two rungs, in the import schema."""
    return [{"arm": a, "rung": r, "changes": ch, "flops": c, "loss": 3.0 + 100 * c ** -0.2 - d}
            for r, c in (("s1", 1e15), ("s2", 4e15)) for a, ch, d in (("base", "", 0), ("+xsa", "xsa", 0.02),
                                                                      ("+sconv", "sconv", 0.01))]


@pytest.mark.parametrize("rid", [".", "..", "a/b", "..\\x", "-x", ".hidden", "x\ny", "x" * 129])
def test_an_unsafe_run_id_is_refused_before_anything_is_written(tmp_path, capsys, rid):
    rows = _rows()
    rows[3]["run_id"] = rid
    src = tmp_path / "t.json"
    src.write_text(json.dumps(rows))
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 2
    err = capsys.readouterr().err
    assert "row 4, column 'run_id'" in err and "one path component: no '.', '..', '/', control character" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # nothing written


def test_the_import_reports_rows_in_and_runs_written_and_they_are_equal(tmp_path, capsys):
    rows = _rows()
    rows[0]["run_id"] = "r.0"  # a dot inside an id is a safe name
    src = tmp_path / "t.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 0
    assert f"imported 6 rows as 6 runs into {tmp_path / 'study'}" in capsys.readouterr().out
    t = collect(tmp_path / "study", write=False)
    assert len(t) == 6 and set(t["status"]) == {"completed"} and "r.0" in set(t["run_id"])


def test_a_given_run_id_equal_to_a_generated_one_is_refused(tmp_path, capsys):
    from marin_ablate.analysis.io.importer import _run_id

    rows = _rows()
    rows[5]["run_id"] = _run_id({"run_id": None, "rung": "s1", "arm": "base", "seed": 0}, "t")  # row 1's own id
    src = tmp_path / "t.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 2
    err = capsys.readouterr().err
    assert "row 6, column 'run_id'" in err and "is row 1's too; allowed values: one id per row" in err, err
    assert not (tmp_path / "study").exists()


def test_a_study_name_or_run_id_must_be_one_safe_path_component():
    assert check_name("smoke_2", "study name") == "smoke_2"
    for bad in ("..", "a/b", "", "x\x00", 3):
        with pytest.raises(ValueError, match="allowed values: 1 to 128 letters"):
            check_name(bad, "study name")


def _study(tmp: Path, name: str = "smoke", rung: str = "cpu_s32") -> Path:
    """The smoke study's own run folders (spec.json and meta.json as `run` writes them) with a summary each."""
    runs = planned_runs(get_study("smoke", rungs=[rung], seeds=[0]), tmp)
    root = tmp / name
    write_runs(runs, root)
    for i, r in enumerate(runs):
        own = trained_totals(r.spec.to_dict())  # what this spec trains: its steps, tokens and FLOPs
        (r.dir / "summary.json").write_text(json.dumps({
            "run_id": r.run_id, "status": "completed", "eval_macro_loss": 3.0 + 0.01 * i,
            "train_flops": own["flops"][0], "tokens": own["tokens"], "step": own["step"], "tokens_per_s": 1e4,
            "model_flops_per_s": 1e11, "hardware": "cpu"}))
    return root


def test_every_file_of_a_planned_run_names_its_run_and_the_study_reads_whole(tmp_path):
    root = _study(tmp_path)
    d = sorted((root / "runs").iterdir())[0]
    assert json.loads((d / "spec.json").read_text())["run_id"] == d.name
    assert json.loads((d / "meta.json").read_text())["run_id"] == d.name
    log = MetricsLog(d / "metrics.jsonl", d.name)
    log.append({"step": 0, "loss": 5.0})
    assert json.loads((d / "metrics.jsonl").read_text()) == {"run_id": d.name, "step": 0, "loss": 5.0}
    t = collect(root, write=False)
    assert set(t["status"]) == {"completed"} and len(t) == 16


def test_a_summary_borrowed_from_another_studys_run_is_left_out_naming_the_file_and_both_ids(tmp_path):
    root = _study(tmp_path)
    other = _study(tmp_path / "o", rung="cpu_s64")  # the same arms at another rung: other run ids
    mine, theirs = sorted((root / "runs").iterdir())[0], sorted((other / "runs").iterdir())[0]
    shutil.copy(theirs / "summary.json", mine / "summary.json")
    t = collect(root, write=False).set_index("run_id")
    assert t.loc[mine.name, "status"] == "foreign"
    assert t.loc[mine.name, "error"].startswith(
        f"runs/{mine.name}/summary.json names run {theirs.name!r}, not {mine.name!r} (the folder's)")
    assert (mine.name, t.loc[mine.name, "error"]) in inventory(t.reset_index()).excluded
    assert (t["status"] == "completed").sum() == 15


def test_a_summary_linked_from_elsewhere_is_left_out_naming_the_link(tmp_path):
    root = _study(tmp_path)
    mine = sorted((root / "runs").iterdir())[0]
    (tmp_path / "kept.json").write_text((mine / "summary.json").read_text())  # the same run's id, kept elsewhere
    (mine / "summary.json").unlink()
    (mine / "summary.json").symlink_to(tmp_path / "kept.json")
    assert foreign(mine, root / "runs") == (
        f"runs/{mine.name}/summary.json resolves to {tmp_path / 'kept.json'}, outside runs/{mine.name} (a symbolic "
        "link): a run folder holds its own files; copy the file in, or remove the link")
    assert collect(root, write=False).set_index("run_id").loc[mine.name, "status"] == "foreign"


def test_a_run_folder_linked_from_another_study_is_left_out_and_run_refuses_to_write_through_it(tmp_path):
    root = _study(tmp_path)
    other = _study(tmp_path / "o", name="smoke")  # the same runs, measured in another study folder
    d = sorted((root / "runs").iterdir())[0]
    shutil.rmtree(d)
    d.symlink_to(other / "runs" / d.name)
    t = collect(root, write=False).set_index("run_id")
    assert t.loc[d.name, "status"] == "foreign"
    assert t.loc[d.name, "error"].startswith(f"runs/{d.name} resolves to {other / 'runs' / d.name}, outside this "
                                             "study's runs/ (a symbolic link)")
    runs = planned_runs(get_study("smoke", rungs=["cpu_s32"], seeds=[0]), tmp_path)
    with pytest.raises(ValueError, match=f"runs/{d.name} resolves to .*outside this study's runs/"):
        write_run_files(next(r for r in runs if r.run_id == d.name))


def test_a_checkpoint_or_metrics_of_another_run_make_the_folder_foreign(tmp_path):
    root = _study(tmp_path)
    a, b = sorted((root / "runs").iterdir())[:2]
    (a / "checkpoints" / "ckpt_000000002").mkdir(parents=True)
    (a / "checkpoints" / "ckpt_000000002" / "meta.json").write_text(json.dumps({"run_id": "0123456789abcdef"}))
    MetricsLog(b / "metrics.jsonl", "fedcba9876543210").append({"step": 0, "loss": 5.0})
    t = collect(root, write=False).set_index("run_id")
    assert t.loc[a.name, "error"].startswith(f"runs/{a.name}/checkpoints/ckpt_000000002/meta.json names run "
                                             f"'0123456789abcdef', not {a.name!r}")
    assert t.loc[b.name, "error"].startswith(f"runs/{b.name}/metrics.jsonl names run 'fedcba9876543210'")


def test_status_counts_a_summary_of_another_type_or_run_as_not_finished_and_names_it(tmp_path, capsys):
    root = _study(tmp_path)
    a, b = sorted((root / "runs").iterdir())[:2]
    s = json.loads((a / "summary.json").read_text())
    (a / "summary.json").write_text(json.dumps({**s, "eval_macro_loss": "abc"}))
    (b / "summary.json").write_text(json.dumps({**s, "run_id": a.name}))
    assert main(["status", "smoke", "--out", str(tmp_path), "--rungs", "cpu_s32", "--seeds", "0", "--all"]) == 0
    out = capsys.readouterr().out
    assert "smoke: 14/16 done, 0 running, 0 failed, 2 pending" in out, out
    assert (f"damaged {a.name}" in out and "field 'eval_macro_loss' is 'abc'; allowed values: a number or null"
            in out), out
    assert f"damaged {b.name}" in out and f"names run {a.name!r}, not {b.name!r}" in out, out
    assert "`run` refuses this folder until that file is moved back or removed" in out
    assert main(["run", "smoke", "--out", str(tmp_path), "--rungs", "cpu_s32", "--seeds", "0", "--no-pin",
                 "--no-profile", "--executor", "debug"]) == 2
    assert f"runs/{b.name}/summary.json names run {a.name!r}, not {b.name!r}" in capsys.readouterr().err
