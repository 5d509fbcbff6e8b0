"""Effects by regime (analysis/fit/regimes.py): each component's multiplier at each level of a regime
factor, against the closed form 2β_i + 2c·β_ir of a model fitted to data with known coefficients."""

import json

import numpy as np
import pandas as pd
import pytest

from marin_ablate.analysis.fit.attribution import all_arms, fit_effects
from marin_ablate.analysis.fit.regimes import regime_factors, regime_table


def test_component_multiplier_at_each_regime_level_is_its_main_effect_plus_the_regime_interaction():
    rng = np.random.default_rng(0)
    X = np.repeat(all_arms(3), 4, axis=0)  # factors a, b, tokens; 4 replicates of each arm
    a, b, r = X.T
    y = 0.2 * a - 0.1 * b + 0.15 * a * r + 0.05 * r + rng.normal(0, 0.01, len(a))
    fit = fit_effects(X, np.zeros(len(a)), y, ["a", "b", "tokens"])
    t = regime_table(fit, "tokens", ("x1", "x4"), z=0.0).set_index("component")
    assert list(t.index) == ["a", "b"]
    # phi_a | r = -1: 2(0.2) - 2(0.15) = 0.1; | r = +1: 0.7; change 4(0.15) = 0.6
    assert t.loc["a", "low"] == pytest.approx(0.1, abs=0.02)
    assert t.loc["a", "high"] == pytest.approx(0.7, abs=0.02)
    assert t.loc["a", "change"] == pytest.approx(0.6, abs=0.03)
    assert t.loc["a", "change_lo"] > 0.5  # the change is resolved
    # b does not interact with the regime: the same effect at both levels, change ~0 inside its CI
    assert t.loc["b", "low"] == pytest.approx(-0.2, abs=0.02) and t.loc["b", "high"] == pytest.approx(-0.2, abs=0.02)
    assert t.loc["b", "change_lo"] < 0 < t.loc["b", "change_hi"]


def test_regime_factors_are_read_from_the_runs_codings():
    coding = {"xsa": {"low": "none", "high": "xsa"}, "tokens": {"low": "x1", "high": "x4", "regime": True}}
    df = pd.DataFrame({"coding": [json.dumps(coding)] * 2})
    assert regime_factors(df) == ["tokens"]
    with pytest.raises(ValueError, match="regime 'nope' is not a factor"):
        fit = fit_effects(all_arms(2), np.zeros(4), np.arange(4.0), ["a", "b"])
        regime_table(fit, "nope", ("lo", "hi"), 0.0)


@pytest.mark.slow
def test_overtrain_study_reports_each_components_multiplier_at_both_token_ratios(tmp_path):
    from marin_ablate.ablations import get_study
    from marin_ablate.analysis.io.results import collect
    from marin_ablate.analysis.pipeline import analyze_table
    from marin_ablate.analysis.report.writer import write_report
    from marin_ablate.sweeps.runs import RunTask, execute, plan_runs, write_run_files

    # the study's two smallest rungs (its default is cpu_s32/cpu_s64): 576 steps in all, not 1,152
    study = get_study("overtrain", rungs=("cpu_s16", "cpu_s32"), ratio=2)
    steps = {(m["rung"], m["factors"]["token_ratio"]): s.train.effective().steps for s, m in study.runs()}
    assert steps == {("cpu_s16", "x1"): 16, ("cpu_s16", "x2"): 32, ("cpu_s32", "x1"): 32, ("cpu_s32", "x2"): 64}
    sd = tmp_path / "overtrain"
    for run in plan_runs(study.runs(), sd):
        write_run_files(run)
        assert execute(RunTask.of(run))["status"] == "completed"
    raw = collect(sd)
    a = analyze_table(raw, n_boot=0, seed=0)
    write_report(a, raw, sd / "report")
    text = (sd / "report" / "report.md").read_text()
    section = text.split("## Effects by regime: token_ratio")[1].split("\n## ")[0]
    for comp in ("xsa", "qk_norm"):
        row = next(line for line in section.splitlines() if line.startswith(f"| {comp} | quality"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5 and all(c[0].isdigit() for c in cells[2:4]), row  # a multiplier at x1 and at x2
    assert "token_ratio = x1" in section and "token_ratio = x2" in section


def test_a_factor_named_like_a_results_column_is_refused():
    from marin_ablate.ablations import Factor

    with pytest.raises(ValueError, match="'tokens' is a column of every run's results row"):
        Factor("tokens", field="train.token_multiplier", levels={"x1": 1, "x4": 4})
