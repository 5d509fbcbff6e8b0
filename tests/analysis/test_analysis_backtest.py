"""Backtests (analysis/backtest.py, docs/method.md §4.10): the scoring arithmetic, the prediction against a
hand fit, a planted sign change the straight line misses and the backtest flags, Marin's MuonH ladder, the
`analyze --backtest` mode and the report's line."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from marin_ablate.analysis.backtest import backtest, kendall_tau, score
from marin_ablate.analysis.calibration.simulate import ScaleStep, SimTruth, simulate_table, write_study
from marin_ablate.analysis.pipeline import analyze_table

FPT = 6e8
RUNGS4 = {f"r{j + 1}": 1e8 * 4**j for j in range(4)}  # tokens, compute 4x apart
C4 = np.array([FPT * t for t in RUNGS4.values()])
C_REF = float(np.exp(np.log(C4).mean()))


def _rows(**cols) -> pd.DataFrame:
    return pd.DataFrame(cols)


def test_coverage_is_the_difference_within_the_combined_half_widths_of_the_sides_facing_each_other():
    """covered ⇔ |pred − meas| ≤ √(h_pred² + h_meas²), each h the half-width on the side facing the other value;
    `inside` asks only whether the measured point lies in the predicted interval."""
    r = score(_rows(pred=[0.2, 0.2, -0.1, 0.0, 0.3], pred_lo=[0.1, 0.0, -0.5, np.nan, 0.25],
                    pred_hi=[0.3, 0.9, 0.0, np.nan, 0.35],
                    meas=[0.0, 0.0, 0.05, 0.0, 0.3], meas_lo=[-0.1, -0.5, 0.0, -0.1, 0.2], meas_hi=[0.1, 0.15, 0.5, 0.1,
                                                                                                  0.4]))
    # row 0: e = 0.2 > √(0.1² + 0.1²) = 0.1414: missed, the measured 0 below the predicted [0.1, 0.3]
    # row 1: e = 0.2 ≤ √(0.2² + 0.15²) = 0.25 (the prediction's lower side 0.2, the measurement's upper 0.15)
    # row 2: e = −0.15, facing sides: the prediction's upper 0.1, the measurement's lower 0.05: √0.0125 = 0.1118
    np.testing.assert_allclose(r["error"], [0.2, 0.2, -0.15, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(r["bound"][:3], [np.hypot(0.1, 0.1), np.hypot(0.2, 0.15), np.hypot(0.1, 0.05)])
    assert list(r["covered"]) == [False, True, False, None, True]
    assert list(r["inside"]) == [False, True, False, None, True]
    assert list(r["pred_verdict"]) == ["gain", "no effect", "no effect", "", "gain"]
    assert list(r["meas_verdict"]) == ["no effect", "no effect", "no effect", "no effect", "gain"]
    assert list(r["agree"]) == [False, True, True, None, True]


def test_kendall_tau_is_scipys_tau_b_over_the_components_both_sides_hold():
    p, m = np.array([0.3, 0.1, -0.2, np.nan, 0.05]), np.array([0.2, 0.15, -0.1, 0.4, -0.3])
    assert kendall_tau(p, m) == pytest.approx(stats.kendalltau(p[[0, 1, 2, 4]], m[[0, 1, 2, 4]]).statistic)
    assert kendall_tau(p[:2], m[:2]) != kendall_tau(p[:2], m[:2])  # NaN below three components


def test_a_scale_step_moves_the_planted_shapley_value_and_keeps_the_all_off_arm_at_zero():
    step = ScaleStep(0.3, -0.2, 1e17, 0.5)
    t = SimTruth(factors=["f", "g"], main={"g": 0.05}, steps={"f": step}, c_ref=1e17)
    C = np.array([1e15, 1e17, 1e19])
    np.testing.assert_allclose(step.value(C), [-0.2 + 0.5 / (1 + np.exp(np.log(1e-2) / 0.5)), 0.05,
                                               -0.2 + 0.5 / (1 + np.exp(np.log(1e2) / 0.5))])
    z = np.log(C / t.c_ref)
    off, f_on = np.array([[-1.0, -1.0]] * 3), np.array([[1.0, -1.0]] * 3)
    np.testing.assert_allclose(t.log_m(off, z), 0.0, atol=1e-15)
    np.testing.assert_allclose(t.log_m(f_on, z), step.value(C))
    assert [t.shapley(c)["f"] for c in C] == pytest.approx(list(step.value(C)))
    with pytest.raises(ValueError, match="steps"):
        SimTruth(factors=["f"], main={}, steps={"h": step})
    with pytest.raises(ValueError, match="width"):
        ScaleStep(0.1, 0.2, 1e17, 0.0)


#: Marin's MuonH-vs-AdamH ladder (tests/analysis/test_analysis_ofat.py; the authors' law's L∞ and α pinned)
MUONH = [("d512", 2.19e17, 3.8104, 3.7542), ("d768", 1.70e18, 3.4339, 3.3988), ("d1024", 9.00e18, 3.1605, 3.1357),
         ("d1280", 2.83e19, 3.0065, 2.9888)]
MUONH_LAW = dict(pin_linf=1.6, pin_alpha=0.0941)


def _muonh_table() -> pd.DataFrame:
    return pd.DataFrame([{"arm": arm, "rung": r, "flops": c, "loss": v, "optimizer": lv}
                         for r, c, lb, lm in MUONH for arm, lv, v in (("adamh", "adamh", lb),
                                                                     ("muonh", "hyperball", lm))])


def test_a_two_rung_fit_predicts_the_straight_line_of_its_hand_fitted_multipliers_in_ln_c(tmp_path):
    """Fitted on d512/d768 with L∞ and α pinned, the joint law's A is the baseline's least squares (the arm's two
    runs fit exactly), each rung's ln M is the law's inverse of the arm's loss, and the prediction at d1024 and
    d1280 is their line in ln C, by hand; the measured values are the authors' paired 1.186 and 1.144."""
    from marin_ablate.cli.main import main

    src = tmp_path / "muonh.csv"
    _muonh_table().to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "muonh")]) == 0
    from marin_ablate.analysis.io.results import load_table

    df = load_table(tmp_path / "muonh")
    a = analyze_table(df, n_boot=0, **MUONH_LAW)
    bt = backtest(df, a, **MUONH_LAW)
    li, al = MUONH_LAW["pin_linf"], MUONH_LAW["pin_alpha"]
    C = np.array([m[1] for m in MUONH[:2]])
    g = C**-al
    A = (np.array([m[2] for m in MUONH[:2]]) - li) @ g / (g @ g)
    ln_m = -np.log((np.array([m[3] for m in MUONH[:2]]) - li) / A) / al - np.log(C)
    r = bt.rows[bt.rows["k"] == 2].set_index("target_rung")
    assert list(r["component"]) == ["optimizer", "optimizer"]  # one factor: no TOTAL beside it
    for rung, c in (("d1024", 9.00e18), ("d1280", 2.83e19)):
        want = ln_m[0] + (ln_m[1] - ln_m[0]) * np.log(c / C[0]) / np.log(C[1] / C[0])
        assert r.loc[rung, "pred"] == pytest.approx(want, rel=1e-6)
        assert r.loc[rung, "meas_source"] == "paired"
    np.testing.assert_allclose(np.exp(r["meas"]), [1.186, 1.144], atol=5e-4)
    assert bool(r.loc["d1024", "covered"]) and bool(r.loc["d1280", "covered"])  # a 1-df fit: wide intervals


def _flip_study(seed: int = 0) -> tuple[SimTruth, pd.DataFrame]:
    """A gain of 1.35x at the first three rungs that turns into a 0.78x loss at the fourth (a sign change between
    rungs 3 and 4), beside a steady factor and a null one."""
    mid = float(np.sqrt(C4[2] * C4[3]))
    t = SimTruth(factors=["flip", "b", "c"], main={"b": 0.05}, steps={"flip": ScaleStep(0.3, -0.3, mid, 0.3)},
                 c_ref=C_REF, seed_sd=0.0, noise_sd=0.0005, flops_per_token=FPT)
    return t, simulate_table(t, rungs=RUNGS4, seeds=1, rng=np.random.default_rng(seed))


def test_a_planted_sign_changing_effect_is_flagged_by_the_backtest_where_the_straight_line_misses_it():
    truth, df = _flip_study()
    law = dict(pin_linf=truth.linf, pin_alpha=truth.alpha)
    first3 = df[df["rung"].isin(["r1", "r2", "r3"])]
    ex = analyze_table(first3, n_boot=0, target_compute=C4[3], **law).extrapolation
    ex = ex[ex["response"] == "ln_M"].set_index("component")
    assert ex.loc["flip", "shapley_lo"] > 0 > truth.shapley(C4[3])["flip"]  # the straight line says gain: wrong
    a = analyze_table(df, n_boot=0, **law)
    bt = backtest(df, a, **law)
    x = bt.rows[(bt.rows["k"] == 3) & (bt.rows["component"] == "flip")].iloc[0]
    assert x["pred"] == pytest.approx(ex.loc["flip", "shapley"], rel=1e-9)  # the pipeline's own extrapolation
    assert x["meas"] < 0 and not x["covered"] and not x["agree"]
    assert x["pred_verdict"] == "gain" and x["meas_verdict"] != "gain"
    assert bt.failed() and "missed: flip (predicted" in bt.summary()
    steady = bt.rows[(bt.rows["k"] == 3) & bt.rows["component"].isin(["b", "c"])]
    assert steady["covered"].all()
    from marin_ablate.analysis.report.backtest import backtest_lines

    line = backtest_lines(bt)[1]
    assert "fitted on 3 rungs" in line and "missed: flip" in line and "unconfirmed by this ladder" in line


def test_the_benchmark_tallies_truth_coverage_and_flags_as_counted_by_hand():
    spec = importlib.util.spec_from_file_location("backtest_bench",
                                                  Path(__file__).parents[2] / "benchmarks" / "backtest.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    truth = SimTruth(factors=["lin", "flip"], main={"lin": 0.05}, scale={"lin": 0.02},
                     steps={"flip": ScaleStep(0.2, -0.2, 1e17, 0.5)}, c_ref=1e17)
    c = [1e16, 1e18, 1e18, 1e18, 1e18]
    rows = score(_rows(k=[1, 2, 2, 2, 3], target=[2, 3, 4, 3, 4], component=["lin", "lin", "lin", "flip", "flip"],
                       compute=c, pred=[0.1, 0.2, 0.2, 0.15, 0.1], pred_lo=[0.0, 0.1, 0.1, 0.05, 0.0],
                       pred_hi=[0.2, 0.3, 0.3, 0.25, 0.2], pred_lo_power=[0.05, 0.15, 0.1, 0.1, 0.05],
                       pred_hi_power=[0.15, 0.25, 0.3, 0.2, 0.15], meas=[0.1, 0.2, 0.2, -0.2, 0.1],
                       meas_lo=[0.0, 0.1, 0.1, -0.3, 0.0], meas_hi=[0.2, 0.3, 0.3, -0.1, 0.2]))
    s = bench.score_truth(rows, truth)
    assert list(s.index) == [0, 1, 3, 4]  # target k + 1 only
    # truths: lin at 1e16 0.1 + 0.04 ln(0.1) = 0.00790; at 1e18 0.19210; flip at 1e18 ≈ −0.1980
    np.testing.assert_allclose(s["truth"], [0.1 + 0.04 * np.log(0.1), 0.1 + 0.04 * np.log(10),
                                            truth.shapley(1e18)["flip"], truth.shapley(1e18)["flip"]])
    assert list(s["covers_truth"]) == [True, True, False, False]
    assert list(s["flagged"]) == [False, False, True, False]
    # the power-law interval: lin at 1e16 [0.05, 0.15] misses 0.0079; the flip row at k=2 is flagged again
    # (e = 0.35 > √(0.1² + 0.1²)), the lin row at k=1 is not (e = 0 against the measured 0.1)
    assert list(s["covers_truth_power"]) == [False, True, False, False]
    assert list(s["flagged_power"]) == [False, False, True, False]
    t = bench.tally(s).set_index(["shape", "fit"])
    assert t.loc[("flip", "2 rungs -> rung 3"), "flagged | misses truth"] == 1.0
    assert t.loc[("flip", "3 rungs -> rung 4"), "flagged | misses truth"] == 0.0
    assert t.loc[("lin", "2 rungs -> rung 3"), "covers truth"] == 1.0
    assert t.loc[("lin", "1 rungs -> rung 2"), "power: covers truth"] == 0.0
    assert t.loc[("lin", "1 rungs -> rung 2"), "power: flagged | misses truth"] == 0.0
    assert t.loc[("flip", "2 rungs -> rung 3"), "median half-width"] == pytest.approx(0.1)
    assert t.loc[("flip", "2 rungs -> rung 3"), "power: median half-width"] == pytest.approx(0.05)
    assert t["n"].sum() == 4


def test_analyze_backtest_prints_per_component_coverage_and_decisions_and_writes_its_table(tmp_path, capsys):
    from marin_ablate.cli.main import main

    truth, df = _flip_study(seed=1)
    sd = write_study(df, tmp_path / "flip")
    assert main(["analyze", str(sd), "--backtest", "--pin-linf", str(truth.linf), "--pin-alpha",
                 str(truth.alpha)]) == 0
    out = capsys.readouterr().out
    preds = out[out.index("per prediction:"):out.index("per component:")]
    for col in ("fitted on", "rung", "component", "predicted", "measured", "ratio", "covered", "verdicts"):
        assert col in preds
    assert re.search(r"^\s*3 rungs\s+r4\s+flip\s+\S+ \[\S+, \S+\]\s+\S+ \[\S+, \S+\] \(paired\)\s+\S+\s+NO\s+gain / ",
                     preds, re.M)  # the sign change: predicted a gain, not covered
    comp = out[out.index("per component:"):out.index("per fit and later rung:")]
    for col in ("component", "scored", "covered", "agreed", "median ratio error"):
        assert col in comp
    assert re.search(r"^\s*flip\s+3\s+\d\s+\d", comp, re.M)  # three scored predictions of flip (k=2: 2, k=3: 1)
    assert re.search(r"^backtest: fitted on 3 rungs, the model's predictions at rung 4 \(r4\) covered \d of 4 values "
                     r"\(3 components and TOTAL\) and agreed on \d of 4 decisions", out, re.M)
    got = pd.read_csv(sd / "report" / "backtest.csv")
    assert len(got) == 3 * 4 and set(got["k"]) == {2, 3}
    assert not (sd / "report" / "report.md").exists()  # a mode: no report


@pytest.mark.parametrize("argv,flag", [(["--backtest.min_rungs", "3"], "--backtest"),
                                       (["--backtest.min_rungs", "1"], "--backtest.min_rungs"),
                                       (["--target", "1e20"], "--target"),
                                       (["--design", "ofat"], "--backtest needs the factorial model")])
def test_analyze_backtest_refuses_what_it_cannot_score_naming_the_flag(tmp_path, capsys, argv, flag):
    """Three rungs with min_rungs 3 leave no later rung; min_rungs below 2 leaves no scale term; a --target is
    not a later rung of the study; a one-factor-at-a-time reading is never extrapolated."""
    from marin_ablate.cli.main import main

    truth, df = _flip_study()
    sd = write_study(df[df["rung"] != "r4"], tmp_path / "s3")
    assert main(["analyze", str(sd), "--backtest", *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and "allowed" in err


def test_the_report_carries_the_backtest_line_under_findings_from_three_rungs(tmp_path, capsys):
    from marin_ablate.cli.main import main

    truth, df = _flip_study()
    pins = ["--pin-linf", str(truth.linf), "--pin-alpha", str(truth.alpha), "--n-boot", "0", "--no-figures"]
    for name, sub, want in (("four", df, True), ("two", df[df["rung"].isin(["r1", "r2"])], False)):
        sd = write_study(sub, tmp_path / name)
        assert main(["analyze", str(sd), *pins]) == 0
        md = (sd / "report" / "report.md").read_text()
        findings = md[md.index("## Findings"):md.index("## Warnings")]
        assert ("How far these extrapolations travel (backtest" in findings) is want
        assert ("fitted on 3 rungs, the model's predictions at rung 4 (r4) covered" in findings) is want


def test_the_muonh_backtest_in_docs_importing_is_what_the_commands_print(tmp_path, capsys):
    """docs/importing.md's CSV, run through its two commands: every output line the page shows is printed."""
    from marin_ablate.cli.main import main

    page = (Path(__file__).parents[2] / "docs" / "importing.md").read_text()
    sec = page[page.index("## Backtesting a published ladder"):]
    csv = sec[sec.index("cat > muonh.csv <<'CSV'\n") + len("cat > muonh.csv <<'CSV'\n"):sec.index("\nCSV\n")]
    shown = sec[sec.index("```text\n") + len("```text\n"):sec.index("\n```", sec.index("```text\n"))]
    (tmp_path / "muonh.csv").write_text(csv + "\n")
    assert main(["analyze", "--import.table", str(tmp_path / "muonh.csv"), "--study-dir", str(tmp_path / "muonh")]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "muonh"), "--pin-linf", "1.6", "--pin-alpha", "0.0941", "--backtest"]) == 0
    out = [ln.rstrip() for ln in capsys.readouterr().out.splitlines()]
    for ln in shown.splitlines():
        assert ln.rstrip() in out, ln


def test_the_summary_counts_the_widest_fits_next_rung_names_misses_and_intervals_that_say_nothing():
    from marin_ablate.analysis.backtest import Backtest

    rows = score(_rows(k=[2, 2, 2, 2, 1], target=[3, 3, 3, 4, 2], target_rung=["c", "c", "c", "d", "b"],
                       component=["x", "y", "TOTAL", "x", "x"], pred=[0.2, 0.0, 0.3, 0.2, 0.1],
                       pred_lo=[0.15, -2.0, 0.1, 0.0, 0.0], pred_hi=[0.25, 2.0, 0.5, 0.4, 0.2],
                       meas=[-0.2, 0.5, 0.3, 0.2, 0.1], meas_lo=[-0.25, 0.4, 0.2, 0.1, 0.0],
                       meas_hi=[-0.15, 0.6, 0.4, 0.3, 0.2]))
    pairs = pd.DataFrame({"k": [1, 2, 2], "target": [2, 3, 4], "target_rung": ["b", "c", "d"], "scored": [1, 3, 1],
                          "covered": [1, 2, 1], "agreed": [1, 1, 1], "tau": [np.nan, np.nan, np.nan]})
    bt = Backtest(rows=rows, pairs=pairs, rungs=["a", "b", "c", "d"], level=0.95)
    assert bt.summary() == (
        "fitted on 2 rungs, the model's predictions at rung 3 (c) covered 2 of 3 values (2 components and TOTAL; "
        "y only by an interval spanning over 10x) and agreed on 1 of 3 decisions; missed: x (predicted 1.22x, "
        "measured 0.819x); over all 3 (fit, later rung) pairs: covered 4 of 5, agreed on 2 of 5 — 4 rungs give 3 "
        "such pairs sharing runs: weak evidence, a miss says more than a hit")
    assert bt.failed()
    comp = bt.by_component().set_index("component")
    assert comp.loc["x", ["scored", "covered", "agreed"]].tolist() == [3, 2, 1]  # a lower end at 0 is no gain
    assert comp.loc["x", "median ratio error"] == pytest.approx(np.exp(0.0))


def test_a_factor_not_varied_at_a_later_rung_is_not_scored_there_and_the_notes_say_why():
    truth, df = _flip_study()
    df = df[~((df["rung"] == "r4") & (df["c"] == "on"))]  # c only at its low level on r4
    law = dict(pin_linf=truth.linf, pin_alpha=truth.alpha)
    bt = backtest(df, analyze_table(df, n_boot=0, **law), **law)
    at4 = bt.rows[bt.rows["target_rung"] == "r4"].set_index(["k", "component"])
    assert at4.loc[(3, "c"), "covered"] is None and not np.isfinite(at4.loc[(3, "c"), "meas"])
    assert at4.loc[(3, "flip"), "meas_source"] == "paired"  # its pairs among the arms at c's low level
    assert at4.loc[(3, "TOTAL"), "covered"] is None  # no all-on arm; the rung's own fit has no c to add
    notes = "\n".join(bt.notes)
    assert "k=3 → r4: c not scored (not measured there: no same-rung pair, and not estimable from its runs alone" \
        in notes
    assert "k=3 → r4: TOTAL not scored (not measured there: no all-on/all-off pair, and its runs vary only flip, b: " \
           "their TOTAL is not the study's)" in notes
    assert bt.pairs.set_index(["k", "target"]).loc[(3, 4), "scored"] == 2


def test_on_a_resolution_iv_fraction_a_linear_truth_is_predicted_and_measured_rung_alone_at_the_truth():
    """The smoke study's 16-arm fraction holds no same-rung pair for a component: each is measured by the rung's
    runs analysed alone. With nearly noise-free runs of effects linear in ln C and the law pinned at its truth,
    both the 2- and 3-rung predictions and those measurements land on the planted Shapley values."""
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.analysis.calibration.simulate import study_design

    factors = [f.name for f in get_study("smoke").factors]
    rng = np.random.default_rng(7)
    t = SimTruth(factors=factors, main={f: float(rng.normal(0, 0.06)) for f in factors},
                 scale={f: float(rng.normal(0, 0.03)) for f in factors}, c_ref=C_REF, seed_sd=0.0, noise_sd=1e-6,
                 flops_per_token=FPT)
    df = simulate_table(t, rungs=RUNGS4, seeds=1, design=study_design("smoke", factors), rng=rng)
    law = dict(pin_linf=t.linf, pin_alpha=t.alpha)
    bt = backtest(df, analyze_table(df, n_boot=0, **law), **law)
    r = bt.rows[bt.rows["component"] != "TOTAL"]
    assert set(r["meas_source"]) == {"rung alone"} and len(r) == 3 * len(factors)
    want = np.array([t.shapley(c)[f] for c, f in zip(r["compute"], r["component"], strict=True)])
    np.testing.assert_allclose(r["meas"], want, atol=2e-3)
    np.testing.assert_allclose(r["pred"], want, atol=2e-3)


def test_a_backtest_that_fails_is_named_in_the_reports_line_and_the_report_is_still_written(tmp_path, monkeypatch):
    import marin_ablate.analysis.backtest as bt_mod
    from marin_ablate.cli.main import main

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(bt_mod, "backtest", boom)
    truth, df = _flip_study()
    sd = write_study(df, tmp_path / "s")
    assert main(["analyze", str(sd), "--n-boot", "0", "--no-figures"]) == 0
    md = (sd / "report" / "report.md").read_text()
    assert "How far these extrapolations travel: the backtest of this ladder was not run (RuntimeError: boom;" in md
