"""The calibration study's planted levels: its design and the exact waste check.

"Waste" is the same training with twice the FLOPs counted: identical losses at 2x C. Crossed with
every other arm, the joint law fit must give it M_flop = 0.5 exactly (to optimiser tolerance),
whatever the other factors and the law do. The waste factor reaches the analysis as any factor
does: a column and its coding in the runs' metadata.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from benchmod import bench
from scipy import stats

from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table
from marin_ablate.analysis.pipeline import analyze_table


def _waste_table(seed: int):
    rng = np.random.default_rng(seed)
    truth = random_truth(["xsa", "qk_norm", "optimizer"], rng, scale_sd=0.04, inter_sd=0.05)
    truth.flops_extra = {}
    base = simulate_table(truth, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8}, seeds=1, fraction=0, rng=rng)
    coding = {**json.loads(base["coding"].iloc[0]),
              "waste": {"field": "train.flops_multiplier", "low": "off", "high": "on"}}
    base["coding"] = json.dumps(coding)
    base["waste"] = "off"
    twin = base.copy()
    twin["waste"] = "on"  # same losses, FLOPs counted twice
    twin["train_flops"] = 2 * base["train_flops"]
    twin["model_flops_per_s"] = 2 * base["model_flops_per_s"]
    twin["run_id"] = base["run_id"] + "w"
    return pd.concat([base, twin], ignore_index=True)


def test_waste_level_recovers_m_flop_one_half_exactly():
    for seed in (0, 1):
        a = analyze_table(_waste_table(seed), n_boot=0, boot_method="none")
        c = a.components.set_index(["response", "component"])
        assert abs(c.loc[("ln_M", "waste"), "shapley"] - np.log(0.5)) < 1e-6, c.loc[("ln_M", "waste")]
        assert abs(c.loc[("ln_R", "waste"), "shapley"] - np.log(2.0)) < 1e-9
        assert abs(c.loc[("ln_W", "waste"), "shapley"]) < 1e-6  # same wall-clock to the same loss


def test_calibration_study_crosses_waste_with_every_arm():
    from marin_ablate.ablations.studies import get_study

    st = get_study("calibration", seeds=[0])
    assert get_study("calibration").seeds == tuple(range(10))  # ten replicates by default
    names = [f.name for f in st.factors]
    M = np.asarray(st.design.matrix)
    w = names.index("waste")
    others = {tuple(np.delete(r, w)) for r in M if r[w] > 0}
    assert others == {tuple(np.delete(r, w)) for r in M if r[w] < 0}  # every waste run has its twin
    specs = [s for s, _ in st.runs(rungs=["cpu_s32"])]
    on = [s for s in specs if s.train.flops_multiplier == 2.0]
    assert len(on) == 8 and all(s.train.effective().steps in (32, 64) for s in specs)
    assert {s.train.effective().steps for s in specs if s.train.token_multiplier == 2} == {64}


# ---- planted truths: recorded with the runs, checked pooled and replicate by replicate ----------------


def test_planted_truth_travels_from_the_factor_to_the_results_table(tmp_path):
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.analysis.fit.replicates import planted_truths
    from marin_ablate.analysis.io.results import collect
    from marin_ablate.marin.schema import RunMeta, write_meta

    st = get_study("calibration")
    for i, (spec, meta) in enumerate(st.runs(rungs=["cpu_s32"])[:4]):
        assert RunMeta.from_dict(meta).to_dict() == meta  # the truth survives a round trip
        write_meta(tmp_path / "runs" / f"r{i}", meta)
    table = collect(tmp_path, write=False)
    t = planted_truths(table)
    assert set(t) == {"placebo", "extra_compute", "waste"}  # the real factors plant nothing
    assert t["waste"] == {"ln_M": np.log(0.5), "ln_R": np.log(2.0), "ln_W": 0.0}
    assert t["placebo"] == {"ln_M": 0.0, "ln_R": 0.0, "ln_W": 0.0}


def test_factor_truth_rejects_unknown_response_and_non_positive_multiplier():
    import pytest

    from marin_ablate.ablations.factors import Factor

    with pytest.raises(ValueError, match=r"truth keys \['loss'\]; allowed values: M_flop, R"):
        Factor("p", field="train.seed_stream", levels={"a": 0, "b": 1}, truth={"loss": 1.0})
    with pytest.raises(ValueError, match=r"truth\['R'\]=0.0; allowed values: a multiplier > 0"):
        Factor("p", field="train.seed_stream", levels={"a": 0, "b": 1}, truth={"R": 0.0})
    f = Factor("p", field="train.seed_stream", levels={"a": 0, "b": 1}, truth={"M_flop": 1})
    assert f.truth_dict == {"M_flop": 1.0} and f.to_dict()["truth"] == {"M_flop": 1.0}


_placebo_study = bench("rates").placebo_study  # xsa, qk_norm and a planted placebo; 3 rungs


def test_each_seed_is_analysed_alone_as_one_replicate():
    df = _placebo_study(seeds=3)
    a = analyze_table(df, n_boot=0, boot_method="none")
    reps = a.replicates
    assert sorted(reps["replicate"].unique()) == [0, 1, 2]
    assert set(reps["response"]) == {"ln_M", "ln_R", "ln_W"} and set(reps["factor"]) == {"placebo"}
    alone = analyze_table(df[df["seed"] == 1], n_boot=0, boot_method="none", replicates=False).components
    c = alone[(alone["component"] == "placebo") & (alone["response"] == "ln_M")].iloc[0]
    r = reps[(reps["replicate"] == 1) & (reps["response"] == "ln_M")].iloc[0]
    assert (r["estimate"], r["lo"], r["hi"]) == (c["shapley"], c["shapley_lo"], c["shapley_hi"])
    cov = a.coverage.set_index("response")
    assert cov.loc["ln_M", "replicates"] == 3
    assert cov.loc["ln_M", "covered"] == int(reps[reps["response"] == "ln_M"]["covers"].sum())
    # the pooled check is the study's own interval for the planted factor
    p = a.planted.set_index("response").loc["ln_M"]
    own = a.components[(a.components["component"] == "placebo") & (a.components["response"] == "ln_M")].iloc[0]
    assert p["estimate"] == own["shapley"] and p["covers"] == (own["shapley_lo"] <= 0 <= own["shapley_hi"])


def test_placebo_replicates_cover_and_their_scatter_matches_their_se():
    """Three seeded replicates of a study whose placebo has no effect (benchmarks/rates.py `placebo` measures the
    coverage over 100): each ln M and ln R interval covers 1, and the replicates' scatter over their mean SE lies
    in [0.5, 1.2]: 0.76 and 0.79 here (conservative: HC3 at ~24 runs, and the larger of HC3 and the model SE),
    1.52 and 1.59 with the contrast variance x1/4, 0.38 and 0.40 with it x4 (tests/rate_mutations.py)."""
    a = analyze_table(_placebo_study(seeds=3, seed=3), n_boot=0, boot_method="none")
    cov = a.coverage.set_index("response")
    for resp in ("ln_M", "ln_R"):
        assert cov.loc[resp, "covered"] == cov.loc[resp, "replicates"] == 3, cov.loc[resp]
        assert 0.5 <= cov.loc[resp, "sd_over_se"] <= 1.2, cov.loc[resp]


def test_waste_level_is_exact_in_every_replicate():
    df = pd.concat([_waste_table(s).assign(seed=s) for s in (0, 1, 2)], ignore_index=True)
    coding = json.loads(df["coding"].iloc[0])
    coding["waste"]["truth"] = {"M_flop": 0.5, "R": 2.0}
    df["coding"] = json.dumps(coding)
    a = analyze_table(df, n_boot=0, boot_method="none")
    cov = a.coverage.set_index("response")
    assert cov.loc["ln_M", "max_abs_error"] < 1e-6 and cov.loc["ln_M", "covered"] == 3
    assert cov.loc["ln_R", "max_abs_error"] < 1e-9  # the twin counts twice the FLOPs in the same seconds


def test_a_missed_planted_truth_is_a_warning_and_the_report_shows_coverage(tmp_path):
    from marin_ablate.analysis.report.writer import render_markdown

    df = _placebo_study(seeds=2)
    flip = df["placebo"] == "on"
    df.loc[flip, "eval_macro_loss"] -= 0.03  # the "placebo" now helps: its truth is wrong
    a = analyze_table(df, n_boot=0, boot_method="none")
    assert any("planted factor placebo: its ln_M interval misses" in w for w in a.warnings)
    md = render_markdown(a, df, {}, tmp_path, title="t")
    assert "## Planted truths" in md and "### Coverage over 2 replicates" in md
    assert md.index("## Planted truths") < md.index("## Warnings")
    from marin_ablate.analysis.report.plots import planted

    assert planted(a, tmp_path / "planted.png").stat().st_size > 10_000


def _stream_noise_study(seeds: int, sd: float, seed: int = 0):
    """The placebo's levels are two random streams per seed: the arms of one seed, placebo level and
    rung share a loss shift that the residuals between arms of one seed never see."""
    df = _placebo_study(seeds=seeds, seed=seed, stream_sd=sd)
    g = df.groupby(["seed", "placebo", "rung"])["random_stream"].nunique()
    assert (g == 1).all() and df["random_stream"].nunique() == 2 * seeds
    return df


@pytest.mark.slow
def test_a_contrast_carrying_seed_noise_reads_its_interval_off_the_seeds():
    df = _stream_noise_study(seeds=6, sd=0.03)
    a = analyze_table(df, n_boot=0, boot_method="none")
    off = analyze_table(df, n_boot=0, boot_method="none", replicates=False).components
    c = a.components.set_index(["response", "component"])
    o = off.set_index(["response", "component"])
    alone = [analyze_table(df[df["seed"] == s], n_boot=0, boot_method="none", replicates=False) for s in range(6)]
    reps = [x.components.set_index(["response", "component"]).loc[("ln_M", "placebo"), "shapley"] for x in alone]
    se_b = np.std(reps, ddof=1) / np.sqrt(6)
    p = c.loc[("ln_M", "placebo")]
    assert p["between_seeds"] == 6 and abs(p["shapley_se_between"] - se_b) < 1e-12
    # the seeds are the replicates: est ± t(5)·√(se_b² + se_law²), whether wider or narrower than the pooled model's
    # (which carries the (seed × stream × rung) shift's variance, analysis/fit/joint.py); the planted 0 is inside
    half = stats.t.ppf(0.975, 5) * np.sqrt(se_b**2 + p["shapley_se_law"] ** 2)
    assert p["shapley_lo"] == pytest.approx(p["shapley"] - half, rel=0, abs=1e-12)
    assert p["shapley_hi"] == pytest.approx(p["shapley"] + half, rel=0, abs=1e-12)
    assert p["shapley_lo"] <= 0.0 <= p["shapley_hi"] and p["shapley_df"] == 5
    # a factor whose levels share each seed's stream is not widened by the shared noise
    x = c.loc[("ln_M", "xsa")]
    assert (x["shapley_hi"] - x["shapley_lo"]
            < 1.5 * (o.loc[("ln_M", "xsa"), "shapley_hi"] - o.loc[("ln_M", "xsa"), "shapley_lo"]))
    assert any("between-seed t interval" in n for n in a.notes)
    # the law's L∞ and α: tested against the (seed × stream × rung) cluster means, at least as wide as
    # the within-cluster profile; and at least the between-seed interval of the seeds whose own fit
    # identifies them (each seed alone: 2 streams × 3 rungs, 5 cluster-level parameters, 1 df)
    import dataclasses

    from marin_ablate.analysis.fit.law_intervals import PROFILE_BOUNDS, profile_ci

    jf = a.joint["power"]
    assert a.law.between_df == 6 * 2 * 3 - (3 + 5 + 2)  # law, 5 seed blocks, placebo and placebo × log C
    within = dataclasses.replace(jf, clusters=None)
    q = stats.t.ppf(0.975, jf.dof)
    laws = [x.law for x in alone if not {"linf", "alpha"} & set(x.law.not_identified)]
    # here the 3 rungs leave L∞ at −4.3: outside [0, smallest loss), so L∞ and α are not identified
    assert "alpha" in a.law.profile or ("alpha" in a.law.not_identified and "outside its range" in a.law.why)
    for k in [k for k in ("linf", "alpha") if k in a.law.profile]:  # a pooled L∞ may be not identified
        lo, hi = a.law.ci(k)
        wlo, whi = profile_ci(within, k, q)
        assert lo <= wlo + 1e-9 and hi >= whi - 1e-9 and hi - lo > 1.2 * (whi - wlo), (k, lo, hi, wlo, whi)
        bound = PROFILE_BOUNDS[k][0]  # the interval stays within the parameter's range
        assert lo >= bound
        if len(laws) < 3:
            continue
        v = [getattr(x, k) for x in laws]
        h = stats.t.ppf(0.975, len(v) - 1) * np.std(v, ddof=1) / np.sqrt(len(v))
        assert hi >= getattr(a.law, k) + h - 1e-12
        assert lo <= getattr(a.law, k) - h + 1e-12 or lo == pytest.approx(bound, abs=1e-12)


def test_two_seeds_give_every_interval_their_one_df_between_seed_t_interval():
    """Two seeds are not silently one: each value's interval is est ± t(1)·√(s²/2 + se_law²) of its two per-seed
    estimates (exact under normal seed effects, t = 12.7; se_law 0 without a pinned law), whether it is wider or
    narrower than the pooled model's, and the verdict's p is read on 1 df."""
    df = _stream_noise_study(seeds=2, sd=0.03)
    a = analyze_table(df, n_boot=0, boot_method="none")
    alone = [analyze_table(df[df["seed"] == s], n_boot=0, boot_method="none", replicates=False).components
             .set_index(["response", "component"]) for s in range(2)]
    for key, r in a.components.set_index(["response", "component"]).iterrows():
        v = [x.loc[key, "shapley"] for x in alone]
        half = stats.t.ppf(0.975, 1) * np.sqrt(np.var(v, ddof=1) / 2 + r["shapley_se_law"] ** 2)
        assert r["between_seeds"] == 2 and r["shapley_df"] == 1
        assert r["shapley_lo"] == pytest.approx(r["shapley"] - half, abs=1e-12)
        assert r["shapley_hi"] == pytest.approx(r["shapley"] + half, abs=1e-12)
    assert len(a.replicates)  # the planted check still runs per seed


def test_a_factor_that_changes_every_runs_stream_is_warned():
    a = analyze_table(_stream_noise_study(seeds=2, sd=0.01), n_boot=0, boot_method="none")
    w = [x for x in a.warnings if "never share a random stream" in x]
    plain = analyze_table(_placebo_study(seeds=2), n_boot=0, boot_method="none")  # one stream per seed
    assert not [x for x in plain.warnings if "never share a random stream" in x]
    assert len(w) == 1 and w[0].startswith("placebo:")


def test_random_stream_of_a_run_follows_its_init_and_data_seeds():
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.marin.schema import random_stream

    runs = get_study("calibration", seeds=[0, 1]).runs(rungs=["cpu_s32"])
    streams = {}
    for spec, meta in runs:
        streams.setdefault((meta["seed"], meta["factors"]["placebo"]), set()).add(random_stream(spec.to_dict()))
    assert all(len(v) == 1 for v in streams.values())  # every arm of a seed and placebo level: one stream
    assert len({next(iter(v)) for v in streams.values()}) == 4  # 2 seeds x 2 placebo levels
