"""Precision bought with seeds (docs/method.md §4.11): Stein's two-stage rule behind `run --until`, its interval in
the analysis, the report's "What it would take", and the seed term in extrapolated intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
from marin_ablate.analysis.fit.replicates import Stein
from marin_ablate.analysis.fit.stopping import (
    SEEDS_CAP,
    SteinPlan,
    Until,
    read_plan,
    seeds_for,
    stein_plan,
    target_half,
    what_it_would_take,
)
from marin_ablate.analysis.pipeline import analyze_table

RUNGS = {"cpu_s32": 32 * 1024.0, "cpu_s64": 64 * 1024.0}
FACTORS = ["sconv", "optimizer", "xsa"]
SEED_SD = {"optimizer": 0.33, "sconv": 0.10, "xsa": 0.05}
KW = dict(n_boot=0, boot_method="none", law_forms=("power",), responses=("quality",))


def truth(**kw) -> SimTruth:
    return SimTruth(FACTORS, main={"sconv": 0.2, "optimizer": 0.15, "xsa": 0.0}, linf=2.0, A=60.0, alpha=0.15,
                    c_ref=3e12, flops_per_token=6 * 2.4e5, noise_sd=0.004, seed_sd=0.01, **kw)


# ---- Stein's rule: the arithmetic ---------------------------------------------------------------------------------


def test_stein_plan_runs_the_seeds_the_pilot_sd_asks_for_and_no_fewer_than_the_pilot():
    est = {"optimizer": [0.1, 0.5, -0.2, 0.4], "xsa": [0.0, 0.01, -0.01, 0.0]}
    plan = stein_plan((0, 1, 2, 3), est, {"optimizer": 0.02, "xsa": 0.01}, Until(0.2))
    s, t = np.std(est["optimizer"], ddof=1), stats.t.ppf(0.975, 3)
    assert plan.needs["optimizer"] == math.ceil((t * s) ** 2 / (0.2**2 - (t * 0.02) ** 2))
    assert plan.needs["xsa"] == 4 and plan.seeds == plan.needs["optimizer"] and not plan.capped
    assert plan.expected_half("optimizer") <= 0.2
    capped = stein_plan((0, 1, 2, 3), est, {"optimizer": 0.02, "xsa": 0.01}, Until(0.2, max_seeds=6))
    assert capped.seeds == 6 and capped.capped == "until.max_seeds=6"
    budget = stein_plan((0, 1, 2, 3), est, {"optimizer": 0.02}, Until(0.2, components=("optimizer",), minutes=5),
                        budget_seeds=5)
    assert budget.seeds == 5 and "until.minutes" in budget.capped
    assert SteinPlan.from_dict(plan.to_dict()) == plan


def test_the_pinned_laws_share_is_beyond_the_seeds_reach():
    t = stats.t.ppf(0.975, 3)
    assert seeds_for(0.3, 0.0, 4, 0.2) == math.ceil((t * 0.3 / 0.2) ** 2)  # Stein's N without a pinned law
    assert seeds_for(0.3, 0.03, 4, 0.2) == math.ceil((t * 0.3) ** 2 / (0.2**2 - (t * 0.03) ** 2))  # more with one
    assert seeds_for(0.3, 0.2 / t, 4, 0.2) == SEEDS_CAP + 1  # the law alone fills the target: no N reaches it
    assert seeds_for(0.0, 0.01, 4, 0.2) == 4
    est = {"TOTAL": [0.1, 0.5, -0.2, 0.4], "xsa": [0.0, 0.01, -0.01, 0.0]}
    plan = stein_plan((0, 1, 2, 3), est, {"TOTAL": 0.07, "xsa": 0.001}, Until(0.2, max_seeds=40))
    assert plan.out_of_reach() == {"TOTAL": pytest.approx(t * 0.07)} and plan.seeds == 40
    assert plan.capped == "until.max_seeds=40"


def test_until_refuses_what_it_cannot_plan_naming_the_field():
    with pytest.raises(ValueError, match=r"until.halfwidth=0; allowed values: a positive"):
        Until(0)
    with pytest.raises(ValueError, match=r"until.max_seeds=1; allowed values: an integer in 2..10000"):
        Until(0.1, max_seeds=1)
    with pytest.raises(ValueError, match=r"until.components \['nope'\]: no estimate at the pilot; allowed values: "
                                         r"optimizer"):
        stein_plan((0, 1), {"optimizer": [0.1, 0.2]}, {}, Until(0.1, components=("nope",)))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        stein_plan((0,), {"optimizer": [0.1]}, {}, Until(0.1))


def test_a_damaged_until_file_is_refused_naming_it(tmp_path):
    (tmp_path / "until.json").write_text("{\"pilot\": [0, 1]}")
    with pytest.raises(ValueError, match=r"until.json: .*missing field\(s\)"):
        read_plan(tmp_path)
    assert read_plan(tmp_path / "none") is None


def _stopped(rule: str, rng, studies: int, mu: float, sd: float, h: float, n0: int = 3, n_max: int = 40):
    """`studies` studies of per-seed estimates N(mu, sd²), each stopped by `rule`: (estimates, half-widths).
    stein: N from the pilot's sd, interval t(n0−1)·s0/√N; width: add a seed until t(n−1)·s_n/√n <= h;
    significance: add a seed until the interval excludes 0 (both at most n_max seeds)."""
    x = rng.normal(mu, sd, (studies, n_max))
    n = np.arange(1, n_max + 1)
    mean = np.cumsum(x, 1) / n
    var = (np.cumsum(x * x, 1) - n * mean**2) / np.maximum(n - 1, 1)
    half = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * np.sqrt(np.maximum(var, 0) / n)
    if rule == "stein":  # no cap: the seeds after the pilot enter through their mean, N(mu, sd²/(N − n0))
        s0 = np.sqrt(var[:, n0 - 1])
        k = np.maximum(np.ceil((stats.t.ppf(0.975, n0 - 1) * s0 / h) ** 2), n0)
        later = rng.normal(mu, sd / np.sqrt(np.maximum(k - n0, 1)))
        est = (mean[:, n0 - 1] * n0 + np.where(k > n0, later * (k - n0), 0.0)) / k
        return est, stats.t.ppf(0.975, n0 - 1) * s0 / np.sqrt(k)
    stop = half <= h if rule == "width" else np.abs(mean) > half
    stop[:, : n0 - 1], stop[:, -1] = False, True
    k, rows = stop.argmax(1), np.arange(studies)
    return mean[rows, k], half[rows, k]


def test_stein_keeps_coverage_where_stopping_on_width_or_significance_does_not():
    """The three rules on per-seed estimates alone (the planted studies through the whole analysis are in
    benchmarks/seed_replication.py --stopping, benchmarks/RESULTS.md)."""
    rng = np.random.default_rng(0)
    cov, width = {}, {}
    for rule in ("stein", "width", "significance"):
        est, half = _stopped(rule, rng, 4000, 0.0, 0.3, 0.15, n_max=200)
        cov[rule], width[rule] = float(np.mean(np.abs(est) <= half)), float(np.max(half))
    assert abs(cov["stein"] - 0.95) < 0.012 and width["stein"] <= 0.15  # exact, and never wider than asked
    assert cov["width"] < 0.92 and cov["significance"] < 0.85


# ---- the analysis reads Stein's interval for the values `run --until` named ---------------------------------------


def test_a_until_study_reports_steins_interval_for_the_named_values_and_the_usual_one_elsewhere():
    t = truth(seed_effect_sd=SEED_SD)
    df = simulate_table(t, rungs=RUNGS, seeds=7, rng=np.random.default_rng(3))
    pins = dict(pin_linf=t.linf, pin_alpha=t.alpha)
    a = analyze_table(df, stein=Stein(pilot=(0, 1, 2), components=("optimizer",)), **pins, **KW)
    alone = {s: analyze_table(df[df["seed"] == s], replicates=False, **pins, **KW).components.set_index("component")
             for s in range(7)}
    c = a.components.set_index("component")
    pilot = [alone[s].loc["optimizer", "shapley"] for s in (0, 1, 2)]
    o = c.loc["optimizer"]
    half = stats.t.ppf(0.975, 2) * math.sqrt(np.var(pilot, ddof=1) / 7 + o["shapley_se_law"] ** 2)
    assert o["shapley_lo"] == pytest.approx(o["shapley"] - half, abs=1e-12)
    assert o["shapley_hi"] == pytest.approx(o["shapley"] + half, abs=1e-12)
    s = c.loc["sconv"]
    every = [alone[k].loc["sconv", "shapley"] for k in range(7)]  # not named: its own 7 seeds, t on 6 df
    half_s = stats.t.ppf(0.975, 6) * math.sqrt(np.var(every, ddof=1) / 7 + s["shapley_se_law"] ** 2)
    assert s["shapley_hi"] == pytest.approx(s["shapley"] + half_s, abs=1e-12) and s["shapley_df"] == 6
    assert any("Stein's two-stage interval (pilot seeds 0, 1, 2)" in n for n in a.notes)


def test_extrapolated_intervals_carry_the_seed_term():
    t = truth(seed_effect_sd=SEED_SD)
    df = simulate_table(t, rungs=RUNGS, seeds=4, rng=np.random.default_rng(4))
    pins = dict(pin_linf=t.linf, pin_alpha=t.alpha)
    target = 10 * max(df["train_flops"])
    a = analyze_table(df, target_compute=target, force_extrapolation=True, **pins, **KW)
    alone = [analyze_table(df[df["seed"] == s], target_compute=target, force_extrapolation=True, replicates=False,
                           **pins, **KW).extrapolation.set_index("component").loc["optimizer", "shapley"]
             for s in range(4)]
    e = a.extrapolation.set_index("component").loc["optimizer"]
    half = stats.t.ppf(0.975, 3) * np.std(alone, ddof=1) / 2
    assert e["between_seeds"] == 4
    assert e["shapley_hi"] == pytest.approx(max(e["shapley_model_hi"], e["shapley"] + half), abs=1e-12)
    assert e["shapley_hi"] - e["shapley_lo"] >= 2 * half - 1e-12


# ---- the report: what it would take -------------------------------------------------------------------------------


def test_target_half_aims_wide_values_at_one_point_five_and_no_effect_values_at_half_their_estimate():
    wide = math.log(1.5)
    assert target_half(0.3, -0.4, 1.0, "consistent with no effect") == pytest.approx(0.15)
    assert target_half(0.5, 0.0001, 0.9999, "gain") == pytest.approx(wide)
    assert target_half(0.01, -0.2, 0.22, "consistent with no effect") == pytest.approx(math.log(1.05))
    assert target_half(0.5, 0.4, 0.6, "gain") is None  # narrow enough, and called


def test_what_it_would_take_names_the_seeds_minutes_and_the_line_that_runs_them():
    rows = [{"component": "optimizer", "est": 0.26, "lo": -0.3, "hi": 0.82, "verdict": "consistent with no effect",
             "seed_sd": 0.3, "law_se": 0.0},
            {"component": "sconv", "est": 0.4, "lo": 0.3, "hi": 0.5, "verdict": "gain", "seed_sd": 0.1,
             "law_se": 0.0}]
    out = what_it_would_take(rows, 3, "smoke", seconds_per_seed=240.0, workers=2)
    assert [r["component"] for r in out] == ["optimizer"]
    r = out[0]
    assert r["target"] == pytest.approx(0.13) and r["seeds"] == math.ceil((stats.t.ppf(0.975, 2) * 0.3 / 0.13) ** 2)
    assert r["minutes"] == pytest.approx((r["seeds"] - 3) * 240 / 2 / 60)
    assert r["how"] == "marin-ablate run smoke --until.halfwidth 0.13 --until.components optimizer"
    one = what_it_would_take([{**rows[0], "seed_sd": math.nan}], 1, "smoke", 240.0, 2)
    assert one[0]["seeds"] is None and "two or more seeds" in one[0]["how"]


def test_the_report_says_what_it_would_take_for_each_value_that_needs_it(tmp_path):
    from marin_ablate.analysis.report.writer import take_rows, take_section

    t = truth(seed_effect_sd=SEED_SD)
    df = simulate_table(t, rungs=RUNGS, seeds=3, rng=np.random.default_rng(6)).assign(wall_s=60.0, study="sim")
    a = analyze_table(df, pin_linf=t.linf, pin_alpha=t.alpha, **KW)
    rows = {r["component"]: r for r in take_rows(a, tmp_path)}
    comp = a.components.set_index("component")
    assert "optimizer" in rows and rows["optimizer"]["seeds"] > 3
    assert rows["optimizer"]["seed_sd"] == pytest.approx(comp.loc["optimizer", "shapley_se_between"] * math.sqrt(3))
    lines = take_section(a, tmp_path)
    assert lines[0] == "## What it would take"
    assert any("`marin-ablate run sim --until.halfwidth" in ln for ln in lines)
    assert isinstance(pd.DataFrame(list(rows.values())), pd.DataFrame)


# ---- the planner: each component's seed sd, and what `--until` expects to run -----------------------------------


def test_the_planner_widens_each_component_by_its_own_seed_sd():
    from marin_ablate.analysis.calibration.precision import Layout, Noise, predict
    from marin_ablate.analysis.calibration.simulate import design_rows

    lay = Layout(design_rows(3), ("a", "b", "c"), (1e12, 2e12), 6)
    flat, _ = predict(lay, Noise(0.01), ratios=(1.0,))
    seedy, _ = predict(lay, Noise(0.01, seed_sd=(("b", 0.3),), seed_sd_other=0.0), ratios=(1.0,))
    one, _ = predict(Layout(lay.design, lay.factors, lay.computes, 1), Noise(0.01), ratios=(1.0,), between=False)
    f, s, o = (t.set_index("component")["hw_1x"] for t in (flat, seedy, one))
    q1 = stats.t.ppf(0.975, one.attrs["dof"])
    want = (stats.t.ppf(0.975, 5) * math.sqrt((o["b"] / q1) ** 2 + 0.3**2) / math.sqrt(6)
            * math.sqrt(stats.chi2.median(5) / 5))
    assert s["b"] == pytest.approx(max(want, f["b"]), rel=1e-9) and s["b"] > 3 * f["b"]
    assert s["a"] == pytest.approx(f["a"]) and s["TOTAL"] > f["TOTAL"]  # the TOTAL carries b's in quadrature


def test_plan_until_expects_more_seeds_for_the_component_that_moves_most_with_the_seed():
    from marin_ablate.ablations.studies import smoke
    from marin_ablate.analysis.calibration.precision import default_noise, until_expectation

    t = until_expectation(smoke(), default_noise(), Until(0.2)).set_index("component")
    assert t.loc["optimizer", "seeds"] > t.loc["sconv", "seeds"] >= t.loc["xsa", "seeds"] == 8  # the pilot's 8
    assert t.loc["TOTAL", "seeds"] >= t.loc["optimizer", "seeds"]
    assert t.loc["optimizer", "seed_sd"] == pytest.approx(0.33, abs=0.02)
    named = until_expectation(smoke(), default_noise(), Until(0.2, components=("sconv",)))
    assert list(named["component"]) == ["sconv"]
