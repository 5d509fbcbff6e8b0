"""The precision planner (analysis/calibration/precision.py): its predicted half-widths against the analysis's
realized intervals on simulated studies, its noise sources, and the `plan --precision` output."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from benchmod import bench

from marin_ablate.analysis.calibration.precision import Layout, Noise, noise_from, predict
from marin_ablate.analysis.calibration.simulate import design_rows, random_truth, simulate_table, write_study
from marin_ablate.analysis.fit.attribution import component_table
from marin_ablate.analysis.fit.joint import quality_fit
from marin_ablate.analysis.pipeline import analyze_table


def _realized(k: int, n_rungs: int, seeds: int, n: int = 10):
    """The planner's prediction for one truth and the median realized 95% half-width of each Shapley ln M (C_ref
    and 10x) over `n` studies that differ only in their noise (benchmarks/rates.py `realized_halfwidths`)."""
    pred, hw, hw10, study = bench("rates").realized_halfwidths(k, n_rungs, seeds, n=n)
    return pred, np.median(hw, axis=0), np.median(hw10, axis=0), study


@pytest.mark.parametrize("k,n_rungs,seeds", [(6, 4, 1), (5, 3, 2)], ids=["smoke-like 2^6 x 4 rungs x 1 seed",
                                                                      "GPU-style 2^5 x 3 rungs x 2 seeds"])
def test_predicted_halfwidth_is_within_10pct_of_the_median_realized_one_over_ten_seeded_studies(k, n_rungs, seeds):
    """Within 5% here; with the planner's noise variance x1.5 or x0.67 the prediction is 17-25% off
    (tests/rate_mutations.py). benchmarks/rates.py `precision` compares over 100 studies (benchmarks/RESULTS.md)."""
    pred, med, med10, _ = _realized(k, n_rungs, seeds)
    np.testing.assert_allclose(pred["hw_1x"].to_numpy(), med, rtol=0.10)
    np.testing.assert_allclose(pred["hw_10x"].to_numpy(), med10, rtol=0.10)


def test_the_realized_width_is_the_one_analyze_table_reports():
    """The validation fits quality_fit directly (fast); analyze_table's component interval is that fit's."""
    factors = [f"f{i}" for i in range(4)]
    rng = np.random.default_rng(3)
    truth = random_truth(factors, rng)
    truth.flops_extra = {}
    df = simulate_table(truth, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8}, seeds=1, rng=rng, design=design_rows(4))
    a = analyze_table(df, n_boot=0, boot_method="none", responses=("quality",), law_forms=("power",), replicates=False)
    ok = a.table
    fq, _ = quality_fit(ok[[f"x_{f}" for f in factors]].to_numpy(), ok["z"].to_numpy(), ok["train_flops"].to_numpy(),
                        ok["eval_macro_loss"].to_numpy(), factors, interactions=True, scale=True,
                        clusters=("0|" + ok["rung"].astype(str)).to_numpy())
    t = component_table(fq, 0.0)
    np.testing.assert_allclose(t["shapley_hi"].to_numpy(), a.components["shapley_hi"].to_numpy(), rtol=1e-9)


def test_halfwidth_scales_with_the_noise_and_shrinks_with_seeds():
    lay = Layout(design_rows(4), tuple("abcd"), (1e12, 2e12, 4e12), 1)
    one, _ = predict(lay, Noise(0.01))
    two, _ = predict(lay, Noise(0.02))
    np.testing.assert_allclose(two["hw_1x"], 2 * one["hw_1x"], rtol=1e-6)  # no effects: linear in σ
    s2, _ = predict(Layout(lay.design, lay.factors, lay.computes, 2), Noise(0.01), between=False)
    assert (s2["hw_1x"] < 0.75 * one["hw_1x"]).all()  # twice the runs: ~1/√2 the model interval
    assert (one["hw_10x"] > one["hw_1x"]).all()  # extrapolating widens


def test_a_fraction_that_aliases_main_effects_falls_back_to_the_main_effects_model():
    D = design_rows(4, fraction=1)  # 2^(4-1): 2FIs aliased in pairs, Shapley still estimable? main effects clear
    t, info = predict(Layout(D, tuple("abcd"), (1e12, 2e12, 4e12), 1), Noise(0.01))
    assert np.isfinite(t["hw_1x"]).all()
    D3 = design_rows(5, fraction=2)  # 2^(5-2) resolution III: main effects alias 2FIs
    t3, info3 = predict(Layout(D3, tuple("abcde"), (1e12, 2e12, 4e12), 1), Noise(0.01))
    assert info3["main_effects_only"] and np.isfinite(t3["hw_1x"]).all()


def test_noise_from_a_seed_panel_separates_run_noise_from_the_shared_shift(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(40):
        shift = rng.normal(0, 0.03)  # shared by both arms of a seed
        for arm in ("all_on", "all_off"):
            rows.append({"run_id": f"{seed}{arm}", "status": "completed", "rung": "d512", "arm": arm, "seed": seed,
                         "eval_macro_loss": 3.0 + (arm == "all_on") * -0.05 + shift + rng.normal(0, 0.01)})
    pd.DataFrame(rows).to_csv(tmp_path / "noise.csv", index=False)
    nz = noise_from(tmp_path / "noise.csv")
    assert 0.007 < nz.sd < 0.013 and 0.02 < nz.rung_sd < 0.04
    assert "paired difference" in nz.source


def test_noise_from_an_analysed_study_is_its_residual_sd(tmp_path):
    factors = [f"f{i}" for i in range(4)]
    rng = np.random.default_rng(1)
    truth = random_truth(factors, rng, noise_sd=0.01)
    truth.flops_extra = {}
    df = simulate_table(truth, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8, "r3": 8e8}, seeds=1, rng=rng,
                        design=design_rows(4))
    write_study(df, tmp_path / "study")
    nz = noise_from(tmp_path / "study")
    assert 0.008 < nz.sd < 0.012, nz
    assert nz.law is not None and "residuals of the analysed study" in nz.source


def test_noise_rejects_a_panel_without_replicates(tmp_path):
    pd.DataFrame([{"run_id": "a", "status": "completed", "rung": "r", "arm": "x", "seed": 0,
                   "eval_macro_loss": 3.0}]).to_csv(tmp_path / "n.csv", index=False)
    with pytest.raises(ValueError, match="at least two seeds"):
        noise_from(tmp_path / "n.csv")
    with pytest.raises(ValueError, match="sd"):
        Noise(0.0)


def test_plan_precision_cli_prints_widths_sources_and_the_cheapest_option(tmp_path, capsys):
    from marin_ablate.cli.main import main

    assert main(["plan", "smoke", "--precision", "--precision.target_halfwidth", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "noise: default: 0.01 nats per run" in out and "±ln M at 10× C_ref" in out
    assert "cheapest reaching 0.05:" in out and "TOTAL" in out
    assert main(["plan", "smoke", "--precision", "--precision.target_halfwidth", "-1"]) == 2
    assert "--precision.target_halfwidth=-1" in capsys.readouterr().err
    assert main(["plan", "smoke", "--precision", "--precision.noise", str(tmp_path / "nothing")]) == 2
    assert main(["plan", "smoke", "--precision", "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert len(d["components"]) == 8 and d["noise"]["sd"] == pytest.approx(0.01)
    assert main(["plan", "smoke", "--json", "--precision.target_halfwidth", "0.05"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert any(o["reaches"] is True for o in d["options"]) and d["target_halfwidth"] == pytest.approx(0.05)


def test_options_never_reach_a_target_with_a_shift_the_clusters_cannot_measure():
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.analysis.calibration.precision import options

    o = options(get_study("marin535"), Noise(0.005, rung_sd=0.02), 1.0, max_seeds=2)
    one_seed = o[(o["seeds"] == 1) & (o["rungs"] == 3)]
    assert not one_seed["reaches"].any()  # 3 clusters, 3 law parameters: the shift is invisible
    assert o["reaches"].any()


def test_plan_precision_reads_a_noise_study_folder(tmp_path, capsys):
    from marin_ablate.analysis.calibration.simulate import SimTruth
    from marin_ablate.cli.main import main

    factors = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "optimizer"]
    truth = SimTruth(factors, main={"xsa": 0.05}, noise_sd=0.004, seed_sd=0.01)
    panel = simulate_table(truth, rungs={"d512": 1e8}, seeds=5, rng=np.random.default_rng(2),
                           design=np.array([[1.0] * 6, [-1.0] * 6]))
    write_study(panel, tmp_path / "noise")
    assert main(["plan", "marin535", "--precision", "--precision.noise", str(tmp_path / "noise")]) == 0
    out = capsys.readouterr().out
    assert f"noise study {tmp_path / 'noise'}: seed-to-seed sd" in out and "paired difference (4 df)" in out
    assert "the clusters leave no df for a (seed × rung) shift" in out  # 1 seed x 3 rungs, and the panel shows one
