"""The Findings verdicts are one family under Holm's step-down method (analysis/report/findings.py, docs/method.md
"Which family the verdicts control"): a verdict the unadjusted interval alone would make is withheld when Holm
does not reject it, the report says which family and method, and under a null truth at most 5% of simulated
studies show any false verdict."""

import numpy as np
import pytest
from benchmod import bench
from statsmodels.stats.multitest import multipletests

from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.report.findings import _p_value, verdict_family
from marin_ablate.analysis.report.writer import family_statement, findings_table

F3 = ["xsa", "sconv", "qk_norm"]


def _small(seed=8):
    t = SimTruth(factors=F3, main={"xsa": 0.012})
    df = simulate_table(t, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8}, seeds=1, rng=np.random.default_rng(seed))
    return analyze_table(df, n_boot=0, replicates=False, law_forms=("power",))


def test_a_verdict_holm_does_not_reject_is_withheld_with_its_adjusted_p_and_the_family_is_stated():
    a = _small()
    ft = findings_table(a).set_index("component")
    fam = verdict_family(a)
    cell = ft.loc["xsa", "scale verdict"]  # its unadjusted slope interval excludes 1; Holm over the family does not
    assert cell.startswith(f"no detectable trend (Holm over {fam['n']} verdicts: adjusted p ") and \
        cell.endswith("the unadjusted interval excludes 1)")
    assert not fam[("scale", "xsa")][0] and fam[("scale", "xsa")][1] >= 0.05
    assert f"the {fam['n']} gain/loss and scale-trend verdicts of this table, controlled by Holm's step-down " \
           "method at family-wise error 5%" in family_statement(a)


def test_the_family_is_statsmodels_holm_over_the_p_values_read_off_each_interval():
    from marin_ablate.analysis.fit.attribution import component_contrasts
    from marin_ablate.analysis.report.findings import scale_trend

    a = _small()
    fam = verdict_family(a)
    comp = a.components.set_index(["response", "component"])
    fit = a.fits["quality"]
    ps = {}
    for f in F3 + ["TOTAL"]:
        for resp in ("ln_M", "ln_R", "ln_W"):  # H100 throughput: every response is a verdict
            r = comp.loc[(resp, f)]
            ps[(resp, f)] = _p_value(r["shapley"], r["shapley_lo"], r["shapley_hi"], r["shapley_df"], a.level)
        i = None if f == "TOTAL" else F3.index(f)
        c0, c1 = component_contrasts(fit, 0.0), component_contrasts(fit, 1.0)
        dc = (c1["total"] - c0["total"]) if i is None else (c1["shapley"][i] - c0["shapley"][i])
        ps[("scale", f)] = _p_value(*scale_trend(fit, i, a.level), fit.contrast_df(dc), a.level)
    assert fam["n"] == len(ps) == 16
    rej, p_adj, _, _ = multipletests(list(ps.values()), alpha=0.05, method="holm")
    for k, r_, p_ in zip(ps, rej, p_adj, strict=True):
        assert fam[k] == (bool(r_), pytest.approx(p_, rel=1e-9))


@pytest.mark.slow  # one null study of 7 factors: ~3-5 s of one core
@pytest.mark.parametrize("design,study", [("fraction_7_1", 3), ("fraction_7_1", 7), ("smoke", 1)])
def test_seeded_null_studies_show_no_false_verdict_where_unadjusted_intervals_would(design, study):
    """Null studies (nothing does anything; H100 throughput, so every response is a verdict) of benchmarks/rates.py
    `null_fraction_7_1` / `null_smoke` (a marin535-like 2^(7-1) fraction on 3 rungs, the smoke design on 4),
    chosen because an unadjusted interval in each excludes 1: Findings withhold every such verdict under Holm
    and show none. With the family's level x10 these studies show 1, 1 and 2 false verdicts
    (tests/rate_mutations.py); the rate over 100 studies per design is in benchmarks/RESULTS.md."""
    got = bench("rates").null_findings(design, study)
    assert got["withheld"], "the premise failed: no unadjusted interval excludes 1 in this study"
    assert not got["false"], got["false"]
