"""One-factor-at-a-time studies (analysis/ofat.py): each change's multiplier against the baseline arm,
checked against the closed form of the law written out here, and independent of how levels are coded."""

import json

import numpy as np
import pandas as pd
import pytest
from benchmod import bench

from marin_ablate.analysis.calibration.simulate import SimTruth, design_rows, simulate_table
from marin_ablate.analysis.ofat import analyze_ofat, design_kind, find_star

F = ["xsa", "sconv", "qk_norm"]
LAW = dict(linf=2.0, A=400.0, alpha=0.2)
RUNGS2 = {"r1": 1e8, "r2": 4e8}
RUNGS4 = {"r1": 1e8, "r2": 4e8, "r3": 1.6e9, "r4": 6.4e9}
STAR = np.array([[-1, -1, -1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], float)


def _truth(**kw):
    kw = {"noise_sd": 0.003, "seed_sd": 0.0, **kw}
    return SimTruth(factors=F, main={"xsa": 0.05, "sconv": 0.1, "qk_norm": -0.04}, scale={"sconv": 0.02},
                    flops_extra={"sconv": 0.01}, **LAW, **kw)


def _ofat(rungs, seeds=1, design=STAR, seed=0, **kw):
    return simulate_table(_truth(**kw), rungs=rungs, seeds=seeds, design=design, rng=np.random.default_rng(seed))


def _hand(df, factor, rung, linf, A, alpha):
    """M = C_eq / C paired by rung: C_eq = C_b·((L̄ − L∞)/(L̄_b − L∞))^(−1/α), the law recentred on the same
    rung's baseline (mean loss L̄_b, compute C_b); L̄ the arm's mean loss, C its (geometric mean) compute. A drops out."""
    arm = "".join("+" if f == factor else "-" for f in F)
    cell, base = (df[(df["arm"] == a) & (df["rung"] == rung)] for a in (arm, "---"))
    L, C = cell["eval_macro_loss"].mean(), np.exp(np.log(cell["train_flops"]).mean())
    Lb, Cb = base["eval_macro_loss"].mean(), np.exp(np.log(base["train_flops"]).mean())
    return Cb * ((L - linf) / (Lb - linf)) ** (-1 / alpha) / C


def _row(a, factor, rung):
    t = a.table
    return t[(t["factor"] == factor) & (t["rung"] == rung)].iloc[0]


@pytest.mark.parametrize("rungs,seeds", [(RUNGS2, 1), (RUNGS4, 2)])
def test_pinned_law_multiplier_equals_the_closed_form(rungs, seeds):
    df = _ofat(rungs, seeds)
    a = analyze_ofat(df, pin_linf=LAW["linf"], pin_alpha=LAW["alpha"], pin_A=LAW["A"])
    assert len(a.table) == len(F) * len(rungs)
    for f in F:
        for r in rungs:
            assert abs(np.log(_row(a, f, r)["M"]) - np.log(_hand(df, f, r, **LAW))) < 1e-6


def test_pinned_exponent_and_floor_fit_A_on_the_baseline_by_least_squares():
    df = _ofat(RUNGS2, seeds=2)
    base = df[df["arm"] == "---"]
    x = base["train_flops"].to_numpy() ** -LAW["alpha"]
    A = float(np.sum((base["eval_macro_loss"].to_numpy() - LAW["linf"]) * x) / np.sum(x * x))  # linear LSQ in A
    a = analyze_ofat(df, pin_linf=LAW["linf"], pin_alpha=LAW["alpha"])
    assert abs(a.law.A / A - 1) < 1e-9
    for f in F:
        for r in RUNGS2:
            assert abs(np.log(_row(a, f, r)["M"]) - np.log(_hand(df, f, r, LAW["linf"], A, LAW["alpha"]))) < 1e-6
    assert a.dof == (len(base) - 1) + len(F) * len(RUNGS2) * (2 - 1)  # baseline residuals + replicate scatter
    assert np.isfinite(_row(a, "xsa", "r1")["M_lo"])


def test_free_law_on_noise_free_ladder_recovers_the_true_single_change_multiplier():
    t = _truth(noise_sd=0.0)
    df = simulate_table(t, rungs=RUNGS4, seeds=1, design=STAR)
    a = analyze_ofat(df)
    assert a.law is not None and abs(a.law.alpha - LAW["alpha"]) < 1e-4
    for i, f in enumerate(F):
        x = -np.ones((1, 3))
        x[0, i] = 1
        for r, tok in RUNGS4.items():
            C = float(df[(df["arm"] == "".join("+" if g == f else "-" for g in F))
                         & (df["rung"] == r)]["train_flops"].iloc[0])
            assert abs(np.log(_row(a, f, r)["M"]) - float(t.log_m(x, t.z([C]))[0])) < 1e-4
    # 4 baseline runs, 3 law parameters, one run per cell: 1 df (exact fit: zero variance, finite width)
    assert a.dof == 1


def test_values_do_not_move_when_the_levels_are_coded_the_other_way():
    df = _ofat(RUNGS4, seeds=2)
    flipped = df.copy()
    coding = {f: {**c, "low": c["high"], "high": c["low"]} for f, c in json.loads(df["coding"].iloc[0]).items()}
    flipped["coding"] = json.dumps(coding)
    flipped["arm"] = [f"arm{i}" for i in flipped["design_row"]]  # arm names carry no baseline either
    flipped = flipped.sample(frac=1.0, random_state=3).reset_index(drop=True)
    for kw in ({"pin_linf": 2.0, "pin_alpha": 0.2, "pin_A": 400.0}, {}):
        a, b = analyze_ofat(df, **kw), analyze_ofat(flipped, **kw)
        assert b.baseline == "arm0"
        cols = ["M", "M_lo", "M_hi", "R", "R_lo", "R_hi", "W"]
        ta = a.table.sort_values(["factor", "rung"])[cols].to_numpy(float)
        tb = b.table.sort_values(["factor", "rung"])[cols].to_numpy(float)
        np.testing.assert_allclose(tb, ta, rtol=1e-9)


def test_throughput_is_against_the_baseline_arm_on_the_same_rung():
    df = _ofat(RUNGS2, seeds=2)
    df["model_flops_per_s"] = np.where(df["arm"] == "+--", 2.0, 1.0) * 4e14 * np.where(df["seed"] == 0, 1.01, 0.99)
    a = analyze_ofat(df, pin_linf=2.0, pin_alpha=0.2, pin_A=400.0)
    np.testing.assert_allclose(_row(a, "xsa", "r1")["R"], 2.0, rtol=1e-12)
    np.testing.assert_allclose(_row(a, "sconv", "r2")["R"], 1.0, rtol=1e-12)
    row = _row(a, "xsa", "r2")
    assert row["R_lo"] < 2.0 < row["R_hi"] and np.isclose(row["W"], row["M"] * row["R"])


def test_two_scales_refuse_a_free_law_with_a_line_naming_the_pins():
    a = analyze_ofat(_ofat(RUNGS2))
    assert a.law is None and a.table["M"].isna().all()
    assert any("--pin-linf" in n and "2 scale(s)" in n for n in a.notes)
    assert a.table["R"].notna().all()  # throughput needs no law


def test_a_pinned_a_without_a_pinned_alpha_is_refused_in_one_line():
    """A is the law's scale in units of C^α (L∞ + A·C^−α): pinned without α it means nothing (it was a KeyError)."""
    df = _ofat(RUNGS4)
    with pytest.raises(ValueError, match=r"^--pin-A 400 without --pin-alpha: A is in units of C\^α; allowed values: "
                                         r"--pin-A with --pin-alpha"):
        analyze_ofat(df, pin_A=400.0)
    with pytest.raises(ValueError, match="without --pin-alpha"):
        analyze_ofat(df, pin_linf=1.5, pin_A=400.0)


def test_design_recognition_star_factorial_and_pooled():
    assert design_kind(_ofat(RUNGS2))[0] == "ofat"
    fact = simulate_table(_truth(), rungs=RUNGS2, seeds=1, design=design_rows(3))
    assert design_kind(fact)[0] == "factorial"
    # A 2x2 factorial on xsa and sconv pooled with a single-change qk_norm arm: factorial, with a note.
    pooled_design = np.array([[-1, -1, -1], [1, -1, -1], [-1, 1, -1], [1, 1, -1], [-1, -1, 1]], float)
    pooled = _ofat(RUNGS2, design=pooled_design)
    kind, star, note = design_kind(pooled)
    assert kind == "factorial" and "qk_norm" in note and "--design ofat" in note
    a = analyze_ofat(pooled, pin_linf=2.0, pin_alpha=0.2, pin_A=400.0, star=star)
    assert set(a.table["factor"]) == set(F) and any("++-" in n for n in a.notes)
    np.testing.assert_allclose(_row(a, "qk_norm", "r2")["M"], _hand(pooled, "qk_norm", "r2", **LAW), rtol=1e-9)


def test_baseline_is_the_centre_not_the_first_arm():
    df = _ofat(RUNGS2)
    df = pd.concat([df[df["arm"] != "---"], df[df["arm"] == "---"]], ignore_index=True)  # baseline last
    star = find_star(df)
    assert star.labels[star.baseline] == "---" and len(star.changes) == 3


def test_cli_analyze_reports_ofat_and_what_it_cannot_tell(tmp_path, capsys):
    from marin_ablate.cli.main import main

    src = tmp_path / "ofat.csv"
    _ofat(RUNGS2, seeds=2).to_csv(src, index=False)
    rc = main(["analyze", str(src), "--pin-linf", "2", "--pin-alpha", "0.2", "--pin-A", "400",
               "--report-dir", str(tmp_path / "rep")])
    assert rc == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "cannot tell" in md and "Shapley" in md and "interactions" in md and "TOTAL" in md
    got = pd.read_csv(tmp_path / "rep" / "ofat.csv")
    assert len(got) == 6 and "Baseline arm" in capsys.readouterr().out
    assert main(["analyze", str(src), "--pin-A", "400", "--design", "factorial"]) == 2
    assert "--pin-A" in capsys.readouterr().err


def test_single_change_intervals_of_seeded_studies_cover_at_a_calibrated_width():
    """Four seeded studies of benchmarks/rates.py `ofat` (4 rungs, 2 seeds, law fitted on the baseline; its
    coverage over 40 studies: benchmarks/RESULTS.md): at most 2 of the 48 M intervals miss the true
    single-change multiplier, and the errors have a root mean square in [0.7, 1.4] of their own standard errors:
    0.99 here; 1.98 and 0.49 with the standard error x1/2 and x2 (tests/rate_mutations.py)."""
    rates = bench("rates")
    misses, rms = rates.calibration([r for i in range(4) for r in rates.ofat(i)])
    assert misses <= 2 and 0.7 <= rms <= 1.4, (misses, rms)


def test_pinned_law_interval_is_the_delta_method_on_the_pooled_residual_variance():
    """With L∞, α, A pinned only the two mean losses of the pair are uncertain: se ln M =
    s/α·√(1/(n·g²) + 1/(n_b·g_b²)), g = L̄ − L∞ (arm), g_b (the same rung's baseline), s² the baseline's squared
    residuals about the law plus every other cell's replicate scatter, over their df."""
    from scipy import stats

    df = _ofat(RUNGS4, seeds=2)
    a = analyze_ofat(df, pin_linf=LAW["linf"], pin_alpha=LAW["alpha"], pin_A=LAW["A"])
    base = df[df["arm"] == "---"]
    ss = float(np.sum((base["eval_macro_loss"] - LAW["linf"] - LAW["A"] * base["train_flops"] ** -LAW["alpha"]) ** 2))
    other = df[df["arm"] != "---"].groupby(["arm", "rung"])["eval_macro_loss"]
    ss += float(other.apply(lambda v: np.sum((v - v.mean()) ** 2)).sum())
    dof = len(base) + len(df[df["arm"] != "---"]) - other.ngroups
    assert a.dof == dof
    s = np.sqrt(ss / dof)
    for f in F:
        arm = "".join("+" if g == f else "-" for g in F)
        for r in RUNGS4:
            L = df[(df["arm"] == arm) & (df["rung"] == r)]["eval_macro_loss"]
            Lb = df[(df["arm"] == "---") & (df["rung"] == r)]["eval_macro_loss"]
            se = s / LAW["alpha"] * np.sqrt(1 / (len(L) * (L.mean() - LAW["linf"]) ** 2)
                                            + 1 / (len(Lb) * (Lb.mean() - LAW["linf"]) ** 2))
            row = _row(a, f, r)
            np.testing.assert_allclose(np.log(row["M_hi"] / row["M"]), stats.t.ppf(0.975, dof) * se, rtol=1e-9)


def test_a_single_change_with_a_published_law_is_read_as_ofat(tmp_path, capsys):
    from marin_ablate.cli.main import main

    df = _ofat(RUNGS2, design=STAR[:2])  # baseline and +xsa only: also a 2-arm factorial
    assert design_kind(df)[0] == "factorial"
    src = tmp_path / "one.csv"
    df.to_csv(src, index=False)
    assert main(["analyze", str(src), "--pin-linf", "2", "--pin-alpha", "0.2", "--pin-A", "400",
                 "--report-dir", str(tmp_path / "rep")]) == 0
    got = pd.read_csv(tmp_path / "rep" / "ofat.csv")
    np.testing.assert_allclose(got["M"], [_hand(df, "xsa", r, **LAW) for r in RUNGS2], rtol=1e-9)


#: Marin's published ladders (marin-community/marin issues 5230 and 5596, Paloma macro loss; the README's law
#: L = 1.6 + 95.18·C^(−0.0941)): the baseline AdamH arm and one change per ladder, one run per cell.
MARIN_LAW = dict(pin_linf=1.6, pin_alpha=0.0941, pin_A=95.18)
MARIN_NO_QK = [("baseline", "fixed_1.3", "d512", 2.19e17, 3.8104), ("no-qk-norm", "none", "d512", 2.19e17, 3.8332),
               ("baseline", "fixed_1.3", "d768", 1.70e18, 3.4339), ("no-qk-norm", "none", "d768", 1.70e18, 3.4232)]
MARIN_MUONH = [(arm, lv, r, c, loss)
               for r, c, lb, lm in (("d512", 2.19e17, 3.8104, 3.7542), ("d768", 1.70e18, 3.4339, 3.3988),
                                    ("d1024", 9.00e18, 3.1605, 3.1357), ("d1280", 2.83e19, 3.0065, 2.9888))
               for arm, lv, loss in (("adamh", "adamh", lb), ("muonh", "hyperball", lm))]


def _marin_csv(path, rows, factor):
    pd.DataFrame([{"arm": a, "rung": r, "flops": c, "loss": v, factor: lv}
                  for a, lv, r, c, v in rows]).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("rows,factor,want", [(MARIN_NO_QK, "qk_norm", [0.897, 1.064]),
                                              (MARIN_MUONH, "optimizer", [1.315, 1.228, 1.186, 1.144])])
def test_marins_published_ladders_reproduce_the_authors_per_rung_multipliers_through_ofat(tmp_path, capsys, rows,
                                                                                          factor, want):
    """Each arm against its own rung's baseline through the pinned law: the authors' numbers to 3 digits."""
    from marin_ablate.cli.main import main

    src = _marin_csv(tmp_path / "marin.csv", rows, factor)
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 0
    assert main(["analyze", str(tmp_path / "study"), "--design", "ofat", *sum(([f"--{k.replace('_', '-')}", str(v)]
                                                                               for k, v in MARIN_LAW.items()), []),
                 "--report-dir", str(tmp_path / "rep")]) == 0
    got = pd.read_csv(tmp_path / "rep" / "ofat.csv").sort_values("compute")
    np.testing.assert_allclose(got["M"], want, atol=5e-4)
    assert np.isfinite(got["M_lo"]).all() and (got["M_lo"] < got["M"]).all() and (got["M"] < got["M_hi"]).all()


def test_marins_muonh_ladder_typed_with_an_optimizer_column_gives_the_authors_numbers_in_findings(tmp_path):
    """One import, one analyze (the factorial path, L∞ and α pinned to the authors' law): Findings carry the
    paired per-rung estimate 1.315 / 1.228 / 1.186 / 1.144 beside the model's smoothed one."""
    from marin_ablate.cli.main import main

    src = _marin_csv(tmp_path / "muonh.csv", MARIN_MUONH, "optimizer")
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 0
    assert main(["analyze", str(tmp_path / "study"), "--pin-linf", "1.6", "--pin-alpha", "0.0941",
                 "--report-dir", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    findings = md[md.index("## Findings"):md.index("## Warnings")]
    row = next(ln for ln in findings.splitlines() if ln.startswith("| optimizer | paired"))
    got = [float(c.split("paired ")[1].split()[0]) for c in row.split("|")[2:-1]]
    np.testing.assert_allclose(got, [1.315, 1.228, 1.186, 1.144], atol=5e-4)


def test_the_observed_total_carries_the_laws_own_uncertainty():
    """TOTAL two ways: the all-on vs all-off pair of a rung through the joint law's local inverse, its variance
    the two mean losses' scatter plus what the law's L∞ and α carry (the larger of HC3 and model-based)."""
    from marin_ablate.analysis.fit.checks import paired_quality
    from marin_ablate.analysis.ofat import paired_ln_m
    from marin_ablate.analysis.pipeline import analyze_table

    df = _ofat(RUNGS4, seeds=2, design=np.array([[-1, -1, -1], [1, 1, 1], [1, -1, -1], [-1, 1, 1]], float))
    a = analyze_table(df, n_boot=0, responses=("quality",), replicates=False)
    jf, t = a.joint["power"], a.table
    s = float(np.sqrt(jf.resid @ jf.resid / jf.dof))
    at = (t["rung"] == "r2").to_numpy()
    X = t[[f"x_{f}" for f in a.factors]].to_numpy()
    on, off = np.flatnonzero(at & (X == 1).all(1)), np.flatnonzero(at & (X == -1).all(1))
    est, se = paired_quality(a, on, off, s)
    L, C = t["eval_macro_loss"].to_numpy(float), t["train_flops"].to_numpy(float)
    want, g_law, g_m = paired_ln_m(L[on].mean(), np.log(C[on]).mean(), L[off].mean(), np.log(C[off]).mean(),
                                   jf.linf, jf.alpha)
    cov, cov_model = jf.law_block()
    v_law = max(g_law @ cov @ g_law, g_law @ cov_model @ g_law)
    assert est == pytest.approx(want, rel=1e-12) and v_law > 0
    assert se**2 == pytest.approx(s**2 * (g_m[0] ** 2 / len(on) + g_m[1] ** 2 / len(off)) + v_law, rel=1e-9)
    ch = a.checks[(a.checks["response"] == "ln_M") & (a.checks["rung"] == "r2")].iloc[0]
    assert ch["observed"] == pytest.approx(est, rel=1e-12) and ch["obs_se"] == pytest.approx(se, rel=1e-12)
