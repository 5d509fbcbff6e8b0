"""The Findings verdicts fall in families, each under Holm's step-down method on its own (analysis/report/findings.py,
docs/method.md "Verdict families"): quality (the family of record), throughput and wall-clock,
scale trends. A verdict the unadjusted interval alone would make is withheld when Holm does not reject it within its
family, the report says which family each verdict belongs to, a lone factor's TOTAL is counted once, and under a
null truth at most 5% of simulated studies show any false verdict in a family."""

import numpy as np
import pytest
from benchmod import bench
from statsmodels.stats.multitest import multipletests

from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.report.findings import _p_value, verdict_family
from marin_ablate.analysis.report.writer import family_statement, findings_table
from marin_ablate.cli.main import main

F3 = ["xsa", "sconv", "qk_norm"]


def _small(seed=8):
    t = SimTruth(factors=F3, main={"xsa": 0.012})
    df = simulate_table(t, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8}, seeds=1, rng=np.random.default_rng(seed))
    return analyze_table(df, n_boot=0, replicates=False, law_forms=("power",))


def test_a_verdict_holm_does_not_reject_is_withheld_with_its_adjusted_p_and_the_family_is_stated():
    a = _small()
    ft = findings_table(a).set_index("component")
    fam = verdict_family(a)
    cell = ft.loc["xsa", "scale verdict"]  # its unadjusted slope interval excludes 1; Holm over its family does not
    assert fam["n"] == {"quality": 4, "speed": 8, "scale": 4}
    assert cell.startswith("no detectable trend (Holm over 4 scale trend verdicts: adjusted p ") and \
        cell.endswith("the unadjusted interval excludes 1)")
    assert not fam[("scale", "xsa")][0] and fam[("scale", "xsa")][1] >= 0.05
    assert ("Verdict families, each controlled on its own by Holm's step-down method at family-wise error 5% (a "
            "verdict stands only when its adjusted p is below 0.05): quality M_flop (4 verdicts, the family of "
            "record); throughput R and wall-clock M_flop·R (8 verdicts); scale trend (4 verdicts); the intervals "
            "shown are the unadjusted 95% ones.") == family_statement(a)


def test_each_family_is_statsmodels_holm_over_the_p_values_read_off_its_own_intervals():
    from marin_ablate.analysis.fit.attribution import component_contrasts
    from marin_ablate.analysis.report.findings import scale_trend

    a = _small()
    fam = verdict_family(a)
    comp = a.components.set_index(["response", "component"])
    fit = a.fits["quality"]
    ps = {"quality": {}, "speed": {}, "scale": {}}
    for f in F3 + ["TOTAL"]:
        for resp in ("ln_M", "ln_R", "ln_W"):  # H100 throughput: every response is a verdict
            r = comp.loc[(resp, f)]
            ps["quality" if resp == "ln_M" else "speed"][(resp, f)] = _p_value(
                r["shapley"], r["shapley_lo"], r["shapley_hi"], r["shapley_df"], a.level)
        i = None if f == "TOTAL" else F3.index(f)
        c0, c1 = component_contrasts(fit, 0.0), component_contrasts(fit, 1.0)
        dc = (c1["total"] - c0["total"]) if i is None else (c1["shapley"][i] - c0["shapley"][i])
        ps["scale"][("scale", f)] = _p_value(*scale_trend(fit, i, a.level), fit.contrast_df(dc), a.level)
    assert fam["n"] == {g: len(v) for g, v in ps.items()}
    for g, cells in ps.items():
        rej, p_adj, _, _ = multipletests(list(cells.values()), alpha=0.05, method="holm")
        for k, r_, p_ in zip(cells, rej, p_adj, strict=True):
            assert fam[k] == (bool(r_), pytest.approx(p_, rel=1e-9), g)


#: Marin's published MuonH ladder (tests/analysis/test_analysis_ofat.py: AdamH baseline against MuonH, Paloma macro
#: loss, one run per rung) with a planted throughput column: MuonH about 2% faster per FLOP, a little scatter.
MUONH_TOKENS_PER_S = (1.0, 1.023, 1.0, 1.017, 1.0, 1.022, 1.0, 1.018)


def _muonh_study(tmp_path):
    import pandas as pd
    from test_analysis_ofat import MARIN_MUONH

    rows = [{"arm": a, "rung": r, "flops": c, "loss": v, "optimizer": lv, "tokens": c / 6e8, "tokens_per_s": 1e6 * x}
            for (a, lv, r, c, v), x in zip(MARIN_MUONH, MUONH_TOKENS_PER_S, strict=True)]
    pd.DataFrame(rows).to_csv(tmp_path / "muonh.csv", index=False)
    assert main(["analyze", "--import.table", str(tmp_path / "muonh.csv"), "--study-dir", str(tmp_path / "s")]) == 0
    from marin_ablate.analysis.io.results import collect

    return analyze_table(collect(tmp_path / "s", write=False), pin_linf=1.6, pin_alpha=0.0941, n_boot=0,
                         replicates=False, law_forms=("power",))


def test_throughput_verdicts_do_not_dilute_the_quality_family(tmp_path, capsys):
    """Marin's MuonH ladder: quality, throughput and wall-clock each exclude 1 unadjusted. Pooled with the quality,
    scale-trend and duplicated TOTAL verdicts in one Holm family of 8, R and W read "consistent with no effect";
    in their own family of 2 they stand, and the quality verdict is Holm over the quality family alone."""
    a = _muonh_study(tmp_path)
    fam = verdict_family(a)
    assert fam["n"] == {"quality": 1, "speed": 2, "scale": 1}
    comp = a.components.set_index(["response", "component"])
    ps = {}
    for resp in ("ln_M", "ln_R", "ln_W"):
        r = comp.loc[(resp, "optimizer")]
        assert r["shapley_lo"] > 0  # every unadjusted interval excludes 1
        ps[resp] = _p_value(r["shapley"], r["shapley_lo"], r["shapley_hi"], r["shapley_df"], a.level)
    # the rule this replaced: one family of every cell, optimizer and TOTAL each counted, scale trends beside them
    pooled = [ps["ln_M"], ps["ln_M"], ps["ln_R"], ps["ln_R"], ps["ln_W"], ps["ln_W"],
              *[fam[("scale", "optimizer")][1]] * 2]
    assert list(multipletests(pooled, alpha=0.05, method="holm")[0][2:6]) == [False] * 4
    assert fam[("ln_R", "optimizer")][:2] == (True, pytest.approx(2 * ps["ln_R"], rel=1e-9))
    assert fam[("ln_W", "optimizer")][0] and fam[("ln_M", "optimizer")] == (True, pytest.approx(ps["ln_M"]), "quality")
    ft = findings_table(a).set_index("component")
    assert ft.loc["optimizer", "throughput R"].endswith(": gain")
    assert ft.loc["optimizer", "wall-clock M_flop·R"].endswith(": gain")
    assert ft.loc["TOTAL", "throughput R"].endswith(": gain")


def test_a_lone_factor_s_total_is_its_own_contrast_counted_once(tmp_path, capsys):
    a = _muonh_study(tmp_path)
    fam = verdict_family(a)
    assert not any(k[-1] == "TOTAL" for k in fam if k != "n")
    assert sum(fam["n"].values()) == 4  # optimizer's quality, throughput, wall-clock and scale trend
    assert family_statement(a).endswith("quality M_flop (1 verdict, the family of record); throughput R and "
                                        "wall-clock M_flop·R (2 verdicts); scale trend (1 verdict); optimizer is the "
                                        "lone factor, so TOTAL is its own contrast, counted once; the intervals "
                                        "shown are the unadjusted 95% ones.")


@pytest.mark.slow  # one null study of 7 factors: ~3-5 s of one core
@pytest.mark.parametrize("design,study", [("fraction_7_1", 3), ("fraction_7_1", 7), ("smoke", 1)])
def test_seeded_null_studies_show_no_false_verdict_where_unadjusted_intervals_would(design, study):
    """Null studies (nothing does anything; H100 throughput, so every response is a verdict) of benchmarks/rates.py
    `null_fraction_7_1` / `null_smoke` (a marin535-like 2^(7-1) fraction on 3 rungs, the smoke design on 4),
    chosen because an unadjusted interval in each excludes 1: Findings withhold every such verdict under Holm
    within its family and show none in any family. With the families' level x10 these studies show false
    verdicts (tests/rate_mutations.py); the rate over 100 studies per design and family is in
    benchmarks/RESULTS.md."""
    got = bench("rates").null_findings(design, study)
    assert got["withheld"], "the premise failed: no unadjusted interval excludes 1 in this study"
    assert not any(got["false"].values()), got["false"]
