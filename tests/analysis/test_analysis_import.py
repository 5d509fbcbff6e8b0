"""`marin-ablate analyze --import.table FILE` (analysis/io/importer.py): a CSV round-trips into a study
folder the analysis reads, and every bad cell is refused with one line naming its row and column, before
anything is written."""

import json

import numpy as np
import pandas as pd
import pytest

from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
from marin_ablate.analysis.io.results import collect
from marin_ablate.analysis.ofat import analyze_ofat
from marin_ablate.cli.main import main

F = ["xsa", "sconv", "qk_norm"]
LEVELS = {"xsa": ("none", "xsa"), "sconv": ("none", "short_conv"), "qk_norm": ("learned_gain", "fixed_1.3")}
STAR = np.array([[-1, -1, -1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], float)
PINS = dict(pin_linf=2.0, pin_alpha=0.2, pin_A=400.0)


def _sim():
    t = SimTruth(factors=F, main={"xsa": 0.05, "sconv": 0.1, "qk_norm": -0.04}, levels=LEVELS, noise_sd=0.003,
                 seed_sd=0.0)
    return simulate_table(t, rungs={"r1": 1e8, "r2": 4e8}, seeds=2, design=STAR, rng=np.random.default_rng(1))


def _csv(df, path):
    """The import schema: arm, rung, seed, one column per factor, loss, flops, tokens, tokens_per_s."""
    out = df[["arm", "rung", "seed", *F, "eval_macro_loss", "train_flops", "tokens", "tokens_per_s"]]
    out.rename(columns={"eval_macro_loss": "loss", "train_flops": "flops"}).to_csv(path, index=False)
    return path


def test_import_round_trips_into_the_same_multipliers(tmp_path, capsys):
    df = _sim()
    src = _csv(df, tmp_path / "ladder.csv")
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 0
    table = collect(tmp_path / "study", write=False)
    assert len(table) == len(df) and set(table["status"]) == {"completed"}
    direct, imported = analyze_ofat(df, **PINS), analyze_ofat(table, **PINS)
    cols = ["M", "M_lo", "M_hi", "R", "R_lo", "R_hi", "W"]
    np.testing.assert_allclose(imported.table.sort_values(["factor", "rung"])[cols].to_numpy(float),
                               direct.table.sort_values(["factor", "rung"])[cols].to_numpy(float), rtol=1e-9)
    # analyze reads the imported folder, and the CSV itself in place, to the same numbers
    capsys.readouterr()
    for study, out in ((tmp_path / "study", tmp_path / "rep1"), (src, tmp_path / "rep2")):
        assert main(["analyze", str(study), "--pin-linf", "2", "--pin-alpha", "0.2", "--pin-A", "400",
                     "--report-dir", str(out)]) == 0
    a, b = pd.read_csv(tmp_path / "rep1" / "ofat.csv"), pd.read_csv(tmp_path / "rep2" / "ofat.csv")
    np.testing.assert_allclose(a[cols].to_numpy(float), b[cols].to_numpy(float), rtol=1e-9)


def test_changes_column_and_params_tokens_give_the_same_runs(tmp_path, capsys):
    rows = [{"arm": "base", "rung": "s", "changes": "", "params": 1e8, "tokens": 2e9, "loss": 3.1},
            {"arm": "+xsa", "rung": "s", "changes": "xsa", "params": 1e8, "tokens": 2e9, "loss": 3.0},
            {"arm": "+opt", "rung": "s", "changes": "optimizer=hyperball", "params": 1e8, "tokens": 2e9, "loss": 2.9}]
    src = tmp_path / "c.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src)]) == 0
    t = collect(tmp_path / "c", write=False).set_index("arm")
    # a level the file does not name is never relabelled as the registry's baseline level: it says so instead
    assert (t.loc["+xsa", "xsa"] == "xsa" and t.loc["+xsa", "optimizer"] == "baseline"
            and t.loc["base", "xsa"] == "baseline")
    assert t.loc["+opt", "optimizer"] == "hyperball"
    assert "the baseline arm's optimizer is not named in the file; recorded as 'baseline', not as the registry's " \
           "'adamw'" in capsys.readouterr().out
    np.testing.assert_allclose(t["train_flops"].to_numpy(float), 6 * 1e8 * 2e9)


def test_analyze_a_results_csv_without_run_id_status_or_error(tmp_path):
    df = _sim().drop(columns=["run_id", "status", "error"])
    df.to_csv(tmp_path / "r.csv", index=False)
    assert main(["analyze", str(tmp_path / "r.csv"), "--pin-linf", "2", "--pin-alpha", "0.2", "--pin-A", "400",
                 "--report-dir", str(tmp_path / "rep")]) == 0


BAD = [  # (what, edit of the good CSV, row, column)
    ("missing column", lambda d: d.drop(columns=["loss"]), None, "loss"),
    ("missing compute", lambda d: d.drop(columns=["flops"]).drop(columns=["tokens"]), None, "flops"),
    ("wrong type", lambda d: d.assign(loss=d["loss"].astype(object).where(d.index != 2, "abc")), 3, "loss"),
    ("negative loss", lambda d: d.assign(loss=d["loss"].where(d.index != 4, -1.0)), 5, "loss"),
    ("empty loss", lambda d: d.assign(loss=d["loss"].astype(object).where(d.index != 1, "")), 2, "loss"),
    ("non-integer seed", lambda d: d.assign(seed=d["seed"].astype(object).where(d.index != 0, "1.5")), 1, "seed"),
    ("unknown level", lambda d: d.assign(xsa=d["xsa"].where(d.index != 6, "xsa_v2")), 7, "xsa"),
    ("duplicate arm/rung/seed", lambda d: pd.concat([d, d.iloc[[3]]], ignore_index=True), len(_sim()) + 1, "arm"),
    ("arm with two level sets", lambda d: d.assign(sconv=d["sconv"].where(d.index != 8, "short_conv")), None, "sconv"),
    ("bad status", lambda d: d.assign(status=["completed"] * (len(d) - 1) + ["done"]), len(_sim()), "status"),
]


@pytest.mark.parametrize("what,edit,row,col", BAD, ids=[b[0] for b in BAD])
def test_bad_cell_is_one_line_naming_row_and_column(tmp_path, capsys, what, edit, row, col):
    good = pd.read_csv(_csv(_sim(), tmp_path / "good.csv"))
    src = tmp_path / "bad.csv"
    edit(good).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"column {col!r}" in err and "allowed values" in err, err
    if row is not None:
        assert f"row {row}," in err, err
    else:
        assert "row " in err or "missing" in err, err
    assert not (tmp_path / "study").exists()  # validated before anything is written
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_import_refuses_a_folder_that_holds_runs(tmp_path, capsys):
    src = _csv(_sim(), tmp_path / "l.csv")
    assert main(["analyze", "--import.table", str(src)]) == 0
    assert main(["analyze", "--import.table", str(src)]) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.slow
def test_factorial_import_round_trips_into_the_same_attribution(tmp_path):
    from marin_ablate.analysis.calibration.simulate import design_rows
    from marin_ablate.analysis.pipeline import analyze_table

    t = SimTruth(factors=F, main={"xsa": 0.05, "sconv": 0.1, "qk_norm": -0.04}, levels=LEVELS)
    df = simulate_table(t, rungs={"r1": 1e8, "r2": 4e8, "r3": 1.6e9}, seeds=2, design=design_rows(3))
    src = _csv(df, tmp_path / "f.csv")
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "f")]) == 0
    a = analyze_table(df, n_boot=0, replicates=False)
    b = analyze_table(collect(tmp_path / "f", write=False), n_boot=0, replicates=False)
    cols = ["shapley", "shapley_lo", "shapley_hi", "loo", "aoi"]
    key = ["response", "component"]
    ca, cb = a.components.sort_values(key), b.components.sort_values(key)
    assert list(ca["component"]) == list(cb["component"]) and set(ca["response"]) == {"ln_M", "ln_R", "ln_W"}
    np.testing.assert_allclose(cb[cols].to_numpy(float), ca[cols].to_numpy(float), rtol=1e-6, atol=1e-9)


def test_json_rows_with_a_factors_object_and_a_failed_run(tmp_path):
    import json

    rows = [{"arm": "base", "rung": "s", "factors": {"xsa": "none"}, "flops": 1e18, "loss": 3.1, "source": "tab 2"},
            {"arm": "x", "rung": "s", "factors": {"xsa": "xsa"}, "flops": 1e18, "loss": 3.0},
            {"arm": "x", "rung": "s", "seed": 1, "factors": {"xsa": "xsa"}, "flops": 1e18, "status": "failed",
             "error": "diverged at step 900"}]
    src = tmp_path / "t.json"
    src.write_text(json.dumps({"runs": rows}))
    assert main(["analyze", "--import.table", str(src)]) == 0
    t = collect(tmp_path / "t", write=False).set_index(["arm", "seed"])
    assert t.loc[("x", 1), "status"] == "failed" and t.loc[("x", 1), "error"] == "diverged at step 900"
    assert t.loc[("x", 0), "xsa"] == "xsa" and t.loc[("base", 0), "eval_macro_loss"] == pytest.approx(3.1)
    src.write_text(json.dumps([{**rows[0], "factors": ["none"]}]))
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "u")]) == 2


def test_a_registered_factor_is_coded_by_the_levels_the_file_holds(tmp_path, capsys):
    """Marin's AdamH baseline typed as optimizer=adamh (not the registry's adamw): adamh is coded −1, hyperball +1,
    with a one-line note, and no run is dropped as a third level."""
    rows = [{"arm": a, "rung": r, "flops": c, "loss": v, "optimizer": lv}
            for r, c in (("s", 1e18), ("m", 4e18))
            for a, lv, v in (("adamh", "adamh", 3.2), ("muonh", "hyperball", 3.1))]
    src = tmp_path / "m.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src)]) == 0
    assert ("note: optimizer: coded by the levels in the file, adamh (−1, the baseline arm's) and hyperball (+1); "
            "the registry's are adamw and hyperball") in capsys.readouterr().out
    t = collect(tmp_path / "m", write=False)
    coding = json.loads(t["coding"].iloc[0])["optimizer"]
    assert (coding["low"], coding["high"]) == ("adamh", "hyperball") and len(t) == 4


def test_a_third_level_is_named_at_import(tmp_path, capsys):
    rows = [{"arm": a, "rung": "s", "flops": 1e18, "loss": v, "optimizer": lv}
            for a, lv, v in (("adamw", "adamw", 3.3), ("adamh", "adamh", 3.2), ("muonh", "hyperball", 3.1))]
    src = tmp_path / "t.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src)]) == 0
    assert ("note: optimizer: level(s) adamh (1 run(s)) beyond the two coded (adamw, hyperball)"
            in capsys.readouterr().out)
