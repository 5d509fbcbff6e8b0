"""When every run is rejected, the refusal lists each run's reason (analysis/io/results.py `Inventory.why_none`):
a one-factor-at-a-time table, a factorial study folder, and a folder whose runs are all left out."""

from __future__ import annotations

import itertools
import json

import pandas as pd

from marin_ablate.cli.main import main


def _rows(failed_error: str) -> list[dict]:
    return [{"arm": f"a{x}{s}", "rung": r, "xsa": ("none", "xsa")[x], "sconv": ("none", "short_conv")[s],
             "flops": c, "loss": "", "status": "failed", "error": f"{failed_error} {r}{x}{s}"}
            for r, c in (("s1", 1e15), ("s2", 4e15)) for x, s in itertools.product((0, 1), (0, 1))]


def _error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_a_single_change_table_whose_runs_all_failed_names_each_failure(tmp_path, capsys):
    rows = [{"arm": a, "rung": r, "changes": ch, "flops": c, "loss": "", "status": "failed", "error": f"OOM {a} {r}"}
            for r, c in (("s1", 1e15), ("s2", 4e15)) for a, ch in (("base", ""), ("+xsa", "xsa"), ("+sc", "sconv"))]
    pd.DataFrame(rows).to_csv(tmp_path / "o.csv", index=False)
    assert main(["analyze", str(tmp_path / "o.csv"), "--report-dir", str(tmp_path / "rep")]) == 2
    err = _error_lines(capsys)
    assert err[0] == "marin-ablate analyze: error: no factor varies among the completed runs: nothing to attribute"
    assert err[1] == "  6 runs: 0 completed, 6 failed, 0 missing"
    assert sorted(x.split(": ", 2)[2] for x in err[2:]) == sorted(f"OOM {a} {r}" for a in ("base", "+xsa", "+sc")
                                                                  for r in ("s1", "s2"))


def test_a_factorial_study_whose_runs_all_failed_names_each_failure(tmp_path, capsys):
    pd.DataFrame(_rows("NaN loss at")).to_csv(tmp_path / "f.csv", index=False)
    assert main(["analyze", "--import.table", str(tmp_path / "f.csv")]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "f"), "--n-boot", "0", "--no-figures"]) == 2
    err = _error_lines(capsys)
    assert err[0] == ("marin-ablate analyze: error: no factor varies among the completed runs: nothing to attribute")
    assert err[1] == "  8 runs: 0 completed, 8 failed, 0 missing"
    assert sorted(x.split(": ", 2)[2] for x in err[2:]) == sorted(f"NaN loss at {r}{x}{s}" for r in ("s1", "s2")
                                                                  for x in "01" for s in "01")


def test_a_folder_whose_runs_are_all_left_out_names_each_reason_up_to_a_limit(tmp_path, capsys):
    rows = [dict(r, status="completed", loss=3.0, error="") for r in _rows("")] * 1
    rows = [dict(r, rung=f"s{i}", flops=1e15 * 2 ** i) for i in range(6) for r in rows[:4]]  # 24 runs
    pd.DataFrame(rows).to_csv(tmp_path / "f.csv", index=False)
    assert main(["analyze", "--import.table", str(tmp_path / "f.csv")]) == 0
    capsys.readouterr()
    for d in (tmp_path / "f" / "runs").iterdir():  # every summary says it is another run's
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**s, "run_id": "0123456789abcdef"}))
    assert main(["analyze", str(tmp_path / "f"), "--n-boot", "0", "--no-figures"]) == 2
    err = _error_lines(capsys)
    assert err[1] == "  24 runs: 0 completed, 0 failed, 0 missing, 24 left out"
    assert len(err) == 2 + 20 + 1 and err[-1] == "  ... and 4 more"
    assert all(" names run '0123456789abcdef', not " in x for x in err[2:-1])
