"""statsmodels is the estimator of record of every linear model (docs/method.md §4.4, "What is statsmodels'
and what is ours"): each fit here is checked against the statsmodels call it is, and the joint nonlinear law,
which statsmodels cannot fit, against statsmodels' OLS on the same Jacobian."""

import numpy as np
import pytest
import statsmodels.api as sm

from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table
from marin_ablate.analysis.fit.attribution import anova_table, fit_effects
from marin_ablate.analysis.fit.joint import fit_joint, quality_design
from marin_ablate.analysis.pipeline import analyze_table

F = ["xsa", "sconv", "qk_norm"]


def _design(rng, n_rep=2):
    X = np.array([[(i >> b) & 1 for b in range(3)] for i in range(8)] * n_rep, float) * 2 - 1
    z = np.repeat(np.linspace(-1, 1, n_rep), 8)
    y = 0.1 * X[:, 0] - 0.05 * X[:, 1] + 0.02 * X[:, 0] * z + rng.normal(0, 0.02, len(X)) * (1 + (X[:, 2] > 0))
    return X, z, y


@pytest.mark.parametrize("hc", ["HC0", "HC1", "HC2", "HC3"])
def test_effects_fit_is_statsmodels_ols_with_its_robust_covariance(hc):
    X, z, y = _design(np.random.default_rng(0), n_rep=3)
    fit = fit_effects(X, z, y, F, scale=True, hc=hc)
    K = np.flatnonzero(fit.alias.kept)
    ref = sm.OLS(y, fit.X[:, K]).fit(cov_type=hc)
    np.testing.assert_allclose(fit.theta[K], ref.params, atol=1e-12)
    np.testing.assert_allclose(fit.cov[np.ix_(K, K)], ref.cov_params(), rtol=1e-10, atol=1e-16)
    np.testing.assert_allclose(fit.cov_model[np.ix_(K, K)], sm.OLS(y, fit.X[:, K]).fit().cov_params(), rtol=1e-10)
    assert fit.dof == ref.df_resid


def test_coefficient_table_and_anova_are_statsmodels_t_and_f_tests_on_the_larger_covariance():
    X, z, y = _design(np.random.default_rng(1), n_rep=3)
    fit = fit_effects(X, z, y, F, scale=True, hc="HC3")
    K = np.flatnonzero(fit.alias.kept)
    rob, mod = sm.OLS(y, fit.X[:, K]).fit(cov_type="HC3"), sm.OLS(y, fit.X[:, K]).fit()
    tab = fit.coef_table()
    np.testing.assert_allclose(tab["estimate"], rob.params, atol=1e-12)
    np.testing.assert_allclose(tab["se"], np.maximum(rob.bse, mod.bse), rtol=1e-10)
    an = anova_table(fit).set_index("term")
    np.testing.assert_allclose(an.loc["xsa", "F"], tab.set_index("term").loc["xsa", "t"] ** 2, rtol=1e-10)
    fam = [j for j, t in enumerate(fit.terms) if t.kind == "2fi" and fit.alias.kept[j]]
    R = np.zeros((len(fam), len(K)))
    for i, j in enumerate(fam):
        R[i, list(K).index(j)] = 1
    V = max((rob.cov_params(), mod.cov_params()), key=lambda m: np.trace(R @ m @ R.T))
    ft = mod.f_test(R, cov_p=V)
    np.testing.assert_allclose(an.loc["all two-factor interactions", "F"], float(np.squeeze(ft.fvalue)), rtol=1e-10)


def test_a_run_fitted_exactly_by_its_own_column_adds_nothing_to_the_sandwich():
    """Leverage 1 (residual 0 by construction): statsmodels' HC3 would divide 0 by 0; that term is zero."""
    X, z, y = _design(np.random.default_rng(2), n_rep=2)
    X[:, 2] = -1.0
    X[-1, 2] = 1.0  # qk_norm on in one run only: the intercept and its column span that run's indicator
    fit = fit_effects(X, z, y, F, scale=False, interactions=False, hc="HC3")
    assert fit.leverage.max() > 1 - 1e-9 and np.all(np.isfinite(fit.cov))
    keep = fit.leverage < 1 - 1e-9  # the other runs' sandwich is statsmodels' HC3 on them, the lone run's term zero
    K = np.flatnonzero(fit.alias.kept)
    res = sm.OLS(y, fit.X[:, K]).fit()
    Xi = fit.X[:, K] @ res.normalized_cov_params
    w = np.where(keep, np.asarray(res.resid) ** 2 / np.where(keep, 1 - fit.leverage, 1) ** 2, 0.0)
    np.testing.assert_allclose(fit.cov[np.ix_(K, K)], (Xi * w[:, None]).T @ Xi, rtol=1e-10, atol=1e-18)


def test_joint_law_linearised_covariance_is_statsmodels_ols_on_its_jacobian():
    rng = np.random.default_rng(3)
    df = simulate_table(random_truth(F, rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9, "r3": 6.4e9}, seeds=1, rng=rng)
    a = analyze_table(df, n_boot=0, responses=("quality",), replicates=False)
    t = a.table
    _, _, _, E, cols = quality_design(t[[f"x_{f}" for f in a.factors]].to_numpy(), t["z"].to_numpy(), a.factors,
                                      interactions=True, scale=True)
    jf = fit_joint(t["train_flops"].to_numpy(float), t["eval_macro_loss"].to_numpy(float), E, cols)
    ols = sm.OLS(jf.resid, jf.jac)  # one Gauss–Newton step from the optimum: the linearised model
    for ours, ref in ((jf.cov, ols.fit(cov_type="HC3").cov_params()), (jf.cov_model, ols.fit().cov_params())):
        # agreement to the conditioning of JᵀJ (two pseudo-inverses of a nearly collinear law block)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    assert jf.dof == ols.fit().df_resid


def test_observed_total_line_is_statsmodels_wls_with_the_per_rung_variances():
    from marin_ablate.analysis.report.findings import observed_total

    rng = np.random.default_rng(5)
    df = simulate_table(random_truth(["xsa", "sconv"], rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9}, seeds=2,
                        rng=rng)
    a = analyze_table(df, n_boot=0, responses=("quality",), replicates=False)
    ch = a.checks[a.checks["response"] == "ln_M"]
    zz = a.rungs.set_index("rung")["z"].reindex(ch["rung"]).to_numpy(float)
    w = sm.WLS(ch["observed"].to_numpy(float), sm.add_constant(zz), weights=1 / ch["obs_se"].to_numpy(float) ** 2)
    ref = w.fit(cov_type="fixed scale")
    est, lo, hi, _ = observed_total(a, "ln_M")
    np.testing.assert_allclose(est, ref.params[0], rtol=1e-10)
    from scipy import stats
    np.testing.assert_allclose(hi - est, stats.t.ppf(0.975, a.fits["quality"].dof) * ref.bse[0], rtol=1e-10)


def test_throughput_df_leave_out_the_reference_runs_zero_residuals():
    """Two arms on four rungs, one run each: the all-off arm is each rung's throughput reference (ln R = 0 by
    construction), so the throughput fit has 8 − rank([4 rung indicators, x, x·z]) = 2 df, not 8 − 4."""
    from marin_ablate.analysis.calibration.simulate import SimTruth

    truth = SimTruth(factors=["optimizer"], main={"optimizer": 0.1}, throughput={"optimizer": 0.01})
    df = simulate_table(truth, rungs={f"r{j}": 1e8 * 2**j for j in range(4)}, seeds=1,
                        design=np.array([[-1.0], [1.0]]), rng=np.random.default_rng(0))
    a = analyze_table(df, n_boot=0, replicates=False)
    fit = a.fits["throughput"]
    assert fit.dof == 2 and fit.sm_results.df_resid == 2
    K = np.flatnonzero(fit.alias.kept)
    ref = sm.OLS(a.table["ln_R"].to_numpy(float), fit.X[:, K])
    ref.df_resid = 2.0
    np.testing.assert_allclose(fit.cov_model[np.ix_(K, K)], ref.fit().cov_params(), rtol=1e-10)


def test_a_contrast_carrying_the_rung_shift_variance_takes_satterthwaites_df():
    """The model-based variance of a quality contrast is v_w (on the residual df) + v_b (the rung-shift part, on the
    between-cluster df, a handful): its t quantile is on min(df, (v_w + v_b)²/(v_w²/df + v_b²/df_b))."""
    from scipy import stats

    from marin_ablate.analysis.calibration.simulate import SimTruth
    from marin_ablate.analysis.fit.attribution import component_contrasts

    truth = SimTruth(factors=["xsa", "sconv"], main={"xsa": 0.05}, rung_sd=0.02)
    df = simulate_table(truth, rungs={f"r{j}": 1e8 * 2**j for j in range(4)}, seeds=2, rng=np.random.default_rng(11))
    fit = analyze_table(df, n_boot=0, responses=("quality",), replicates=False).fits["quality"]
    assert fit.cov_between is not None and 0 < fit.dof_between < fit.dof  # measured: 2 seeds × 4 rungs
    c = component_contrasts(fit, 0.0)["total"]
    # a ladder whose rung shifts dominate: 90% of the model-based variance is the shift's
    fit.cov_between, fit.cov = 0.9 * fit.cov_model, 0.5 * fit.cov_model
    want = 1 / (0.1**2 / fit.dof + 0.9**2 / fit.dof_between)
    assert fit.contrast_df(c) == pytest.approx(want, rel=1e-12) and want < fit.dof / 2
    est, se, lo, hi, _ = fit.contrast(c)
    assert hi - est == pytest.approx(stats.t.ppf(0.975, round(want, 3)) * se, rel=1e-9)
    fit.cov = 2 * fit.cov_model  # the robust variance is the larger: the residual df
    assert fit.contrast_df(c) == fit.dof


def test_between_seed_half_width_is_statsmodels_t_interval_of_the_mean():
    from scipy import stats

    from marin_ablate.analysis.fit.replicates import t_half

    v = [0.11, 0.07, 0.15, 0.09]
    assert t_half(v, 0.95) == pytest.approx(stats.t.ppf(0.975, 3) * np.std(v, ddof=1) / 2, rel=1e-12)


def test_pure_error_lack_of_fit_is_statsmodels_anova_of_the_model_against_the_cell_means():
    """For an OLS response the lack-of-fit F of checks._lof is anova_lm(model, cell-means model)."""
    from statsmodels.stats.anova import anova_lm

    from marin_ablate.analysis.fit.checks import _lof

    X, z, y = _design(np.random.default_rng(6), n_rep=3)
    z = np.repeat([-1.0, 0.0, 1.0], 8)
    X = np.vstack([X[:8]] * 3)
    y = np.vstack([y[:8]] * 3).ravel() + np.random.default_rng(7).normal(0, 0.02, 24)
    Xr, zr = np.vstack([X, X]), np.concatenate([z, z])
    yr = np.concatenate([y, y + np.random.default_rng(8).normal(0, 0.02, 24)])
    fit = fit_effects(Xr, zr, yr, F, scale=True, interactions=False)
    cells = np.array([f"{tuple(x)}|{zz}" for x, zz in zip(Xr, zr, strict=True)])
    F_, p_, dlof, dpe = _lof(fit.resid, cells, fit.dof)
    D = (cells[:, None] == np.unique(cells)[None, :]).astype(float)
    tab = anova_lm(fit.sm_results, sm.OLS(yr, D).fit())
    assert (dlof, dpe) == (int(tab["df_diff"].iloc[1]), int(tab["df_resid"].iloc[1]))
    np.testing.assert_allclose([F_, p_], [tab["F"].iloc[1], tab["Pr(>F)"].iloc[1]], rtol=1e-9)
