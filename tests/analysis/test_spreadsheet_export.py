"""What is exported for spreadsheets is neutralised (analysis/report/spreadsheet.py, OWASP's CSV-injection
rule): a text cell that a spreadsheet would evaluate gets a leading `'`, numbers stay numbers; and imported
tables that used to stop the report with a traceback (a loss of 1e308, rungs at one compute) are refused in
one line."""

from __future__ import annotations

import csv
import io
import itertools

import pandas as pd
import pytest

from marin_ablate.analysis.report.spreadsheet import neutral, spreadsheet_csv
from marin_ablate.cli.main import main


def test_text_a_spreadsheet_evaluates_is_prefixed_and_numbers_stay_numbers():
    arms = ["=1+1", "+xsa", "-x", "@SUM(A1)", "\tx", "\rx", "plain", '=HYPERLINK("http://e.x")']
    df = pd.DataFrame({"arm": arms, "ln_M": [-0.5, 0.1, -2.0, 0.0, 1.0, -1e-9, 3.0, -7.0], "=cmd": range(8)})
    text = spreadsheet_csv(df).decode()
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == ["arm", "ln_M", "'=cmd"]
    assert [r[0] for r in rows[1:]] == ["'" + a if a != "plain" else a for a in arms]
    back = pd.read_csv(io.StringIO(text, newline=""))
    assert back["ln_M"].tolist() == df["ln_M"].tolist()  # a negative number is a value, written as one
    assert neutral(-3.5) == -3.5 and neutral("a=b") == "a=b" and neutral("\rx") == "'\rx"


def test_a_formula_named_rung_or_arm_is_text_in_ofat_csv(tmp_path, capsys):
    rows = [{"arm": arm, "rung": rung, "changes": ch, "flops": c, "loss": 3.0 + 100 * c ** -0.2 + d}
            for rung, c in (("=1+1", 1e15), ("s2", 4e15), ("s3", 1.6e16))
            for arm, ch, d in (("base", "", 0.0), ('=HYPERLINK("http://e.x","ok")', "xsa", 0.01),
                               ("@sconv", "sconv", -0.01))]
    pd.DataFrame(rows).to_csv(tmp_path / "f.csv", index=False)
    assert main(["analyze", str(tmp_path / "f.csv"), "--report-dir", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "ofat.csv").read_text()
    cells = [c for r in csv.reader(text.splitlines()) for c in r]
    assert "'=1+1" in cells and "'=HYPERLINK(\"http://e.x\",\"ok\")" in cells and "'@sconv" in cells
    assert not [c for c in cells if c[:1] in ("=", "+", "@") or (c[:1] == "-" and not _number(c))]
    back = pd.read_csv(tmp_path / "rep" / "ofat.csv")
    assert back["ln_M"].dtype.kind == "f" and (back["ln_M"] < 0).any()  # the worse change: a negative number


def _number(c: str) -> bool:
    try:
        float(c)
    except ValueError:
        return False
    return True


def _factorial(tmp_path, name: str, edit) -> str:
    rows = []
    for rung, c in (("s1", 1e15), ("s2", 4e15), ("s3", 1.6e16)):
        for x, s in itertools.product((0, 1), (0, 1)):
            rows.append({"arm": f"a{x}{s}", "rung": rung, "xsa": ("none", "xsa")[x],
                         "sconv": ("none", "short_conv")[s], "flops": c,
                         "loss": 3.0 + 100 * c ** -0.2 - 0.02 * x - 0.01 * s})
    edit(rows)
    pd.DataFrame(rows).to_csv(tmp_path / name, index=False)
    return str(tmp_path / name)


def test_a_loss_of_1e308_in_an_imported_table_is_refused_naming_its_row(tmp_path, capsys):
    """No model has a loss of 1e308 nats per token: the row is named (it used to make every multiplier n/a with
    "SVD did not converge"), and nothing is written."""
    src = _factorial(tmp_path, "big.csv", lambda rows: rows[0].update(loss=1e308))
    assert main(["analyze", src, "--n-boot", "0", "--no-figures", "--report-dir", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["marin-ablate analyze: error: row 1, column 'loss': '1e+308' is out of range; allowed values: a "
                   "finite number > 0 and <= 1e+06"]
    assert not (tmp_path / "rep").exists()


def test_rungs_at_one_compute_are_refused_in_one_line_naming_them(tmp_path, capsys):
    src = _factorial(tmp_path, "one.csv", lambda rows: [r.update(flops=1e15) for r in rows])
    assert main(["analyze", src, "--n-boot", "0", "--no-figures", "--report-dir", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["marin-ablate analyze: error: rungs s1, s2, s3 are all at 1e+15 FLOPs: a rung is a scale, and "
                   "rungs at one compute give the law and the scale terms no span; allowed values: one rung label "
                   "per compute (relabel the runs, or give each rung its own training FLOPs)"]
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("v", ["-1.5", "-inf", "1e308"])
def test_a_numeric_string_is_still_text_to_neutralise_only_when_it_is_text(v):
    assert neutral(float(v)) == float(v)
    assert neutral(v) == ("'" + v if v.startswith("-") else v)
