"""Files the harness reads are read defensively (marin.schema.loads_json and the importer's bounds): a
5000-digit integer, a 200,000-deep JSON value, a table too large to lay out as run folders, a column
named like a results column — each one line naming the file (and the row), the rest of the study read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table, write_study
from marin_ablate.analysis.io.importer import MAX_ROWS
from marin_ablate.analysis.io.results import collect
from marin_ablate.cli.main import main
from marin_ablate.marin.schema import JSON_MAX_INT_DIGITS, DamagedFile, loads_json, read_json

HUGE = "7" * 5000
DEEP = "[" * 200_000 + "]" * 200_000


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("text, says", [(f'{{"step": {HUGE}}}', "an integer of 5000 digits; allowed values: at most"),
                                        (DEEP, "nested too deeply")])
def test_a_hostile_json_value_is_one_line_never_a_traceback(tmp_path, text, says):
    with pytest.raises(ValueError, match=says):
        loads_json(text)
    f = tmp_path / "summary.json"
    f.write_text(text)
    assert read_json(f) is None  # lenient readers see a damaged file
    with pytest.raises(DamagedFile, match=f"cannot read {f}: {says}"):
        read_json(f, strict=True)
    assert loads_json("1" * JSON_MAX_INT_DIGITS) == int("1" * JSON_MAX_INT_DIGITS)


@pytest.mark.parametrize("text, says", [(f'{{"run_id": "x", "status": "completed", "tokens": {HUGE}}}',
                                         "an integer of 5000 digits"), (DEEP, "nested too deeply")])
def test_one_hostile_summary_leaves_its_run_out_by_name_and_the_rest_is_analysed(tmp_path, text, says):
    t = SimTruth(factors=["xsa", "sconv"], main={"xsa": 0.05, "sconv": 0.1})
    df = simulate_table(t, rungs={"r1": 1e8, "r2": 4e8}, seeds=1, rng=np.random.default_rng(0))
    root = write_study(df, tmp_path / "study")
    bad = sorted((root / "runs").iterdir())[2]
    (bad / "summary.json").write_text(text)
    table = collect(root, write=False).set_index("run_id")
    assert table.loc[bad.name, "status"] == "unreadable"
    assert table.loc[bad.name, "error"].startswith(f"cannot read {bad / 'summary.json'}: {says}")
    assert (table["status"] == "completed").sum() == len(df) - 1


def test_status_shows_a_damaged_summary_as_damaged(tmp_path, capsys):
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.sweeps.runs import write_run_files
    from marin_ablate.sweeps.sweep import planned_runs

    runs = planned_runs(get_study("smoke"), tmp_path)
    for r in runs:
        write_run_files(r)
    (runs[3].dir / "summary.json").write_text(f'{{"status": "completed", "step": {HUGE}}}')
    assert main(["status", "smoke", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("damaged"))
    assert line.startswith(f"damaged {runs[3].run_id} (") and "an integer of 5000 digits" in line
    assert "summary.json" in line and "the next `run` trains it again" in line


def _csv(path, rows: list[dict]):
    cols = list(dict.fromkeys(c for r in rows for c in r))
    path.write_text("\n".join([",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]) + "\n")
    return path


ROWS = [{"arm": a, "rung": "s", "xsa": lv, "loss": 3.0 - 0.1 * i, "flops": 1e18} for i, (a, lv) in
        enumerate([("base", "none"), ("+xsa", "xsa")])]


def test_import_of_a_huge_number_names_its_row_and_column(tmp_path, capsys):
    rows = [dict(ROWS[0]), dict(ROWS[1], flops=HUGE)]
    assert main(["analyze", "--import.table", str(_csv(tmp_path / "t.csv", rows))]) == 2
    err = _one_line(capsys)
    assert "row 2, column 'flops': '7777" in err and "(5,000 characters) is out of range" in err and len(err) < 300
    (tmp_path / "t.json").write_text(json.dumps(ROWS).replace('"flops": 1e+18}]', f'"flops": {HUGE}}}]'))
    assert main(["analyze", "--import.table", str(tmp_path / "t.json")]) == 2
    assert "row 2, column 'flops'" in _one_line(capsys)
    (tmp_path / "d.json").write_text(DEEP)
    assert main(["analyze", "--import.table", str(tmp_path / "d.json")]) == 2
    assert "as JSON: nested too deeply" in _one_line(capsys)


@pytest.mark.parametrize("name", ["eval_macro_loss", "study", "coding"])
def test_import_refuses_a_factor_column_named_like_a_results_column(tmp_path, capsys, name):
    rows = [dict(r, **{name: lv}) for r, lv in zip(ROWS, ("a", "b"), strict=True)]
    assert main(["analyze", "--import.table", str(_csv(tmp_path / "t.csv", rows))]) == 2
    err = _one_line(capsys)
    assert f"column {name!r}: is a column of every run's results row" in err
    assert not (tmp_path / "t").exists()


def test_import_bounds_the_run_folders_it_writes(tmp_path, capsys):
    rows = [{"arm": "a", "rung": "s", "seed": i, "loss": 3.0, "flops": 1e18} for i in range(MAX_ROWS + 1)]
    src = _csv(tmp_path / "big.csv", rows)
    assert main(["analyze", "--import.table", str(src)]) == 2
    assert (f"FILE has {MAX_ROWS + 1:,} rows, each a run folder; allowed values: at most {MAX_ROWS:,}"
            in _one_line(capsys))
    assert [p.name for p in tmp_path.iterdir()] == ["big.csv"]
