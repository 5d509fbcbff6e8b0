"""The reference law's uncertainty in every multiplier (docs/method.md §4.1), and LR provenance in the report."""

from __future__ import annotations

import numpy as np
import pytest
from benchmod import bench
from scipy import stats

from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
from marin_ablate.analysis.fit.joint import between_clusters
from marin_ablate.analysis.fit.reflaw import PinnedLaw, fit_reference, read_pinned
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.report.writer import render_markdown

F = ["xsa", "sconv", "optimizer"]
DESIGN_RUNGS = {f"r{n}": n * 8192.0 for n in (32, 64, 128, 256)}  # 8x: the smoke ladder's span
LADDER = {f"r{n}": n * 8192.0 for n in (16, 32, 64, 128, 256, 512, 1024)}  # 64x: the baseline ladder's


def truth(rung_sd: float = 0.02) -> SimTruth:
    t = SimTruth(F, main={"xsa": 0.05, "sconv": 0.05, "optimizer": 0.15}, linf=2.0, A=400.0, alpha=0.2,
                 c_ref=1e14, noise_sd=0.01, seed_sd=0.0, flops_per_token=1e6)
    t.rung_sd = rung_sd
    return t


def total(a) -> tuple[float, float, float]:
    c = a.components
    r = c[(c["response"] == "ln_M") & (c["component"] == "TOTAL")].iloc[0]
    return float(r["shapley"]), float(r["shapley_lo"]), float(r["shapley_hi"])


def analyze(df, **kw):
    return analyze_table(df, n_boot=0, boot_method="none", law_forms=("power",), replicates=False, **kw)


def test_an_unidentified_curvature_widens_the_headline_to_every_accepted_linf():
    """Seed 0 of this planted study fits L∞ = −6 (α → 0: a straight line in ln C). Every L∞ in
    [0, smallest loss) whose fit the profile test accepts gives its own TOTAL; the headline interval holds each."""
    df = simulate_table(truth(), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(0))
    a = analyze(df)
    assert a.law.linf < 0 and "linf" in a.law.not_identified
    est, lo, hi = total(a)
    jf = a.joint["power"]
    rss0 = float(jf.resid @ jf.resid)
    s2b, dfb = between_clusters(jf)  # the split-plot test of a law parameter (analysis/fit/law_intervals.py profile_ci)
    allow = max(stats.t.ppf(0.975, jf.dof) ** 2 * rss0 / jf.dof, stats.t.ppf(0.975, dfb) ** 2 * s2b)
    accepted = 0
    for frac in (0.0, 0.4, 0.8, 0.9):
        v = frac * float(df["eval_macro_loss"].min())
        b = analyze(df, pin_linf=v)
        jb = b.joint["power"]
        if float(jb.resid @ jb.resid) - rss0 <= allow:
            accepted += 1
            assert lo <= total(b)[0] <= hi, (v, total(b)[0], (lo, hi))
    assert accepted >= 2


def test_a_pinned_law_carries_its_own_interval_into_every_multiplier():
    df = simulate_table(truth(), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(0))
    base = simulate_table(truth(), rungs=LADDER, seeds=1, rng=np.random.default_rng(100))
    base = base[base["arm"] == "---"]
    law = fit_reference(base["train_flops"], base["eval_macro_loss"], key="k", created="today")
    assert 0 < law.linf < base["eval_macro_loss"].min() and law.cov.shape == (2, 2) and law.dof == 4
    with_cov = analyze(df, pinned_law=law)
    without = analyze(df, pin_linf=law.linf, pin_alpha=law.alpha)
    est, lo, hi = total(with_cov)
    assert est == pytest.approx(total(without)[0], abs=1e-6)  # the same point estimate, a wider interval
    assert hi - lo > 1.05 * (total(without)[2] - total(without)[1])
    # the TOTAL the law at either end of the pinned valley gives lies inside the headline
    for v in (law.valley[0], law.valley[-1]):
        assert lo <= total(analyze(df, pin_linf=v[0], pin_alpha=v[1]))[0] <= hi
    assert any("reference law pinned from the baseline arm's own ladder" in n for n in with_cov.notes)


def _ladder_rss(C, L, **pins) -> float:
    from marin_ablate.analysis.fit.joint import fit_joint

    f = fit_joint(C, L, np.zeros((len(L), 0)), [], **pins)
    return float(f.resid @ f.resid)


def test_a_ladder_that_identifies_the_law_pins_it_along_its_profile_not_a_straight_ellipse():
    """A planted 7-rung ladder whose free fit identifies L∞ and α: the straight 95% ellipse of their covariance
    reaches pairs the ladder rejects (its long axis leaves the curved valley of the likelihood), and refitting the
    study there made TOTAL's interval at 10x C_ref x2425 where an oracle law's (L∞, α exact) is x1.88. The law is
    pinned along the ladder's profile instead: every pair kept fits the ladder, and the interval stays near the
    oracle's."""
    from marin_ablate.analysis.fit.joint import fit_joint

    base = simulate_table(truth(), rungs=LADDER, seeds=1, rng=np.random.default_rng(1001))
    base = base[base["arm"] == "---"]
    C, L = base["train_flops"].to_numpy(float), base["eval_macro_loss"].to_numpy(float)
    law = fit_reference(C, L)
    free = fit_joint(C, L, np.zeros((len(L), 0)), [])
    rss0 = float(free.resid @ free.resid)
    allow = stats.t.ppf(0.975, free.dof) ** 2 * rss0 / free.dof
    assert law.dof == free.dof == 4 and 0 < law.valley[0][0] < law.linf < law.valley[-1][0] < L.min()
    assert law.linf == pytest.approx(free.linf, rel=1e-6)  # the free fit is the profile's least RSS
    for v, a in law.valley:
        assert _ladder_rss(C, L, pin_linf=v, pin_alpha=a) - rss0 <= allow * (1 + 1e-6)
    ii = [free.names.index("linf"), free.names.index("alpha")]
    lam, U = np.linalg.eigh(np.maximum(free.cov, free.cov_model)[np.ix_(ii, ii)])
    q = stats.t.ppf(0.975, free.dof)
    off = []
    for sgn in (1.0, -1.0):
        v, a = np.array([free.linf, free.alpha]) + sgn * q * np.sqrt(lam[-1]) * U[:, -1]
        try:
            off.append(v >= L.min() or _ladder_rss(C, L, pin_linf=v, pin_alpha=a) - rss0 > allow)
        except ValueError:  # no falling law there
            off.append(True)
    assert any(off)
    df = simulate_table(truth(), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(1))
    target = 10 * analyze(df).c_ref
    widths = []
    for kw in ({"pinned_law": law}, {"pin_linf": 2.0, "pin_alpha": 0.2}):
        e = analyze(df, target_compute=target, **kw).extrapolation
        r = e[(e["response"] == "ln_M") & (e["component"] == "TOTAL")].iloc[0]
        assert r["shapley_lo"] <= 0.5 <= r["shapley_hi"]  # the planted TOTAL, 2·(0.05 + 0.05 + 0.15)
        widths.append(float(r["shapley_hi"] - r["shapley_lo"]))
    assert widths[0] <= 1.5 * widths[1], widths


def test_the_pinned_linf_interval_of_eight_seeded_ladders_covers_the_planted_one_at_a_calibrated_width():
    """8 planted 7-rung one-seed ladders (benchmarks/pinned_law.py's first `bend1` ladders, whose coverage over 50
    and more is in benchmarks/RESULTS.md): the profile's L∞ interval holds the planted 2.0 on all but at most one,
    and the errors have a root mean square in [0.6, 1.6] of their own standard errors (benchmarks/rates.py
    `calibration`): 1.02 here; 2.20 and 0.46 with the profile's allowance x1/4 and x4 (tests/rate_mutations.py)."""
    rates = bench("rates")
    rows = []
    for k in range(8):
        base = simulate_table(truth(), rungs=LADDER, seeds=1, rng=np.random.default_rng(10_000 + k))
        base = base[base["arm"] == "---"]
        law = fit_reference(base["train_flops"], base["eval_macro_loss"])
        rows.append(rates.scored("linf", law.linf, *law.ci("linf"), 2.0))
    misses, rms = rates.calibration(rows)
    assert misses <= 1 and 0.6 <= rms <= 1.6, (misses, rms)


def test_two_seeds_with_one_pinned_law_agree_within_their_combined_intervals():
    base = simulate_table(truth(), rungs=LADDER, seeds=1, rng=np.random.default_rng(100))
    base = base[base["arm"] == "---"]
    law = fit_reference(base["train_flops"], base["eval_macro_loss"])
    got = [total(analyze(simulate_table(truth(), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(s)),
                         pinned_law=law)) for s in (0, 1)]
    (e0, l0, h0), (e1, l1, h1) = got
    assert abs(e0 - e1) <= np.hypot((h0 - l0) / 2, (h1 - l1) / 2)


def test_a_narrow_ladder_cannot_pin_a_law():
    base = simulate_table(truth(), rungs={"r1": 8192.0, "r2": 16384.0, "r3": 32768.0}, seeds=1,
                          rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="3 distinct computes; a pinned law needs >= 4"):
        fit_reference(base["train_flops"], base["eval_macro_loss"])


def straight(rung_sd: float = 0.02) -> SimTruth:
    """A law that barely bends over the ladder's 64x (α = 0.06), as every CPU ladder measures it."""
    t = SimTruth(F, main={"xsa": 0.05, "sconv": 0.05, "optimizer": 0.15}, linf=0.5, A=15.0, alpha=0.06,
                 c_ref=1e14, noise_sd=0.02, seed_sd=0.0, flops_per_token=1e6)
    t.rung_sd = rung_sd
    return t


def test_a_ladder_that_fixes_the_slope_but_not_the_curvature_pins_it_along_its_valley():
    """The smoke study's baseline ladder as measured on a 2-core machine (seed 0, cpu_s16..cpu_s1024): its
    free fit's α interval reaches 0, yet every L∞ from 0 to near the losses fits with α rising to match."""
    C = [15259926528.0 * 2**k for k in range(7)]
    L = [3.4032, 3.2538, 3.0919, 2.9526, 2.7975, 2.7666, 2.6718]
    law = fit_reference(C, L)
    linfs, alphas = zip(*law.valley, strict=True)
    assert linfs[0] == 0.0 and linfs[-1] > 2.0 and all(np.diff(alphas) > 0)
    assert (law.linf, law.alpha) in law.valley and law.cov[0, 0] == 0.0 and law.cov[1, 1] > 0
    assert law.ci("linf")[0] == 0.0 and law.ci("linf")[1] == linfs[-1]
    assert "its local slope, not its curvature" in law.describe()


def test_a_valley_pinned_law_holds_the_multiplier_of_every_law_on_its_valley():
    base = simulate_table(straight(), rungs=LADDER, seeds=1, rng=np.random.default_rng(100))
    law = fit_reference(*(base[base["arm"] == "---"][c] for c in ("train_flops", "eval_macro_loss")))
    assert len(law.valley) >= 3 and law.valley[-1][0] > 2.0  # a planted straight ladder: curvature unidentified
    got = []
    for s in (0, 1):
        df = simulate_table(straight(), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(s))
        est, lo, hi = total(analyze(df, pinned_law=law))
        for linf, alpha in law.valley:
            assert lo <= total(analyze(df, pin_linf=linf, pin_alpha=alpha))[0] <= hi, (s, linf)
        got.append((est, lo, hi))
    (e0, l0, h0), (e1, l1, h1) = got
    assert abs(e0 - e1) <= np.hypot((h0 - l0) / 2, (h1 - l1) / 2)


def test_beyond_its_ladder_a_study_s_interval_reaches_both_ends_of_the_valley():
    """Past the ladder's span the valley's laws part: L∞ = 0 and L∞ near the losses extrapolate different
    slopes, so the interval is set by the valley's ends, not by α's conditional spread."""
    base = simulate_table(straight(), rungs=LADDER, seeds=1, rng=np.random.default_rng(100))
    law = fit_reference(*(base[base["arm"] == "---"][c] for c in ("train_flops", "eval_macro_loss")))
    quiet = straight(rung_sd=0.0)
    quiet.noise_sd = 0.002
    far = {f"r{n}": n * 8192.0 for n in (4096, 8192, 16384, 32768)}  # 4x past the ladder's largest rung
    df = simulate_table(quiet, rungs=far, seeds=1, rng=np.random.default_rng(0))
    _, lo, hi = total(analyze(df, pinned_law=law))
    ends = [total(analyze(df, pin_linf=v, pin_alpha=a))[0] for v, a in (law.valley[0], law.valley[-1])]
    assert max(ends) - min(ends) > 1.0  # the valley's two laws part by more than a factor e in M
    assert all(lo <= e <= hi for e in ends), (ends, (lo, hi))


def test_a_valley_pinned_law_s_band_reaches_both_end_laws_and_stays_on_the_data():
    base = simulate_table(straight(), rungs=LADDER, seeds=1, rng=np.random.default_rng(100))
    law = fit_reference(*(base[base["arm"] == "---"][c] for c in ("train_flops", "eval_macro_loss")))
    df = simulate_table(straight(), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(0))
    fit = analyze(df, pinned_law=law).law
    C = np.unique(df["train_flops"].to_numpy(float))
    lo, hi = fit.band(C)
    assert float(np.max(hi - lo)) < float(np.ptp(df["eval_macro_loss"]))  # not the linearised valley's width
    far = C.max() * np.array([1.0, 8.0, 64.0, 512.0])  # where the valley's two laws part
    lo, hi = fit.band(far)
    assert len(fit.ends) == 2
    for linf, A, alpha in fit.ends:
        assert np.all((lo <= linf + A * far**-alpha) & (linf + A * far**-alpha <= hi))
    assert fit.ci("A")[0] <= min(A for _, A, _ in fit.ends) and max(A for _, A, _ in fit.ends) <= fit.ci("A")[1]


def test_the_report_gives_a_valley_pinned_law_its_ladder_s_interval_and_no_user_pin_warning(tmp_path):
    base = simulate_table(straight(), rungs=LADDER, seeds=1, rng=np.random.default_rng(100))
    law = fit_reference(*(base[base["arm"] == "---"][c] for c in ("train_flops", "eval_macro_loss")))
    df = simulate_table(straight(), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(0))
    md = render_markdown(analyze(df, pinned_law=law), df, {}, tmp_path, title="t")
    section = md.split("## Reference law")[1]
    lo, hi = law.ci("linf")
    assert f"| linf | 0.0000 | pinned: {lo:.4g} | pinned: {hi:.4g} |" in section
    assert "L∞ and α are pinned from the baseline ladder, their columns its interval: its local slope" in section
    assert "pinned by the user" not in md and "profile-likelihood intervals" not in section.split("##")[0]


def test_a_ladder_whose_loss_does_not_fall_cannot_pin_the_law():
    C = [15259926528.0 * 2**k for k in range(7)]
    L = 3.0 + 0.02 * np.random.default_rng(0).standard_normal(7)
    with pytest.raises(ValueError, match="reference ladder over 1.53e\\+10..9.77e\\+11 FLOPs: "):
        fit_reference(C, L)


def test_the_pinned_law_file_round_trips_and_a_damaged_one_is_refused(tmp_path):
    law = PinnedLaw(2.0, 0.2, np.array([[0.04, 0.005], [0.005, 0.001]]), 400.0, 1e11, 1e13, 7, 4, "k", "today", "src",
                    valley=((0.0, 0.1), (2.0, 0.2)))
    import json

    (tmp_path / "reference_law.json").write_text(json.dumps(law.to_dict()))
    back = read_pinned(tmp_path)
    assert back.linf == 2.0 and np.array_equal(back.cov, law.cov) and back.source == "src" and back.valley == law.valley
    (tmp_path / "reference_law.json").write_text("{\"linf\": 2.0}")
    with pytest.raises(ValueError, match="reference_law.json: field 'alpha' is None; allowed values: a finite number"):
        read_pinned(tmp_path)
    # the former straight-ellipse rule wrote no valley: refused, naming how to refit it
    (tmp_path / "reference_law.json").write_text(json.dumps({**law.to_dict(), "valley": []}))
    with pytest.raises(ValueError, match="no `valley` \\(written by the former straight-ellipse rule\\); allowed: "):
        read_pinned(tmp_path)


@pytest.mark.parametrize("source", ["profile", "tuned", "heuristic"])
def test_the_report_says_untuned_only_when_a_run_ran_the_heuristic_lr(tmp_path, source):
    df = simulate_table(truth(0.0), rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(0))
    df["lr_source"] = source
    df["lr_scale"] = np.where(df["optimizer"] == "on", 4.0, 0.7) if source != "heuristic" else 1.0
    df["lr_profile"] = None if source == "heuristic" else "runs/smoke/profile/lr_profile.json"
    df["lr_profile_date"] = None if source == "heuristic" else "2026-12-01 23:20 UTC"
    a = analyze(df)
    md = render_markdown(a, df, {}, tmp_path, title="t")
    if source == "heuristic":
        assert "LRs untuned" in md and "learning rates are not tuned per arm" in md
        assert "- learning rates (32 runs): Marin's heuristic LR (no per-arm profile)" in md
    else:
        assert "untuned" not in md and "not tuned" not in md
        find = md.split("## Findings")[1].split("## Warnings")[0]
        row = next(ln for ln in find.splitlines() if ln.startswith("| optimizer "))
        assert ("LRs profiled per level" if source == "profile" else "LRs tuned per arm") in row
        assert "from `runs/smoke/profile/lr_profile.json` (2026-12-01 23:20 UTC); multipliers 0.7–4" in md


def test_a_published_law_is_named_as_published_never_as_a_ladder_fitted_on_no_date():
    """Marin's fast-ladder law (pinned by `--import.layout marin_holdout` or a study's published_law) says where it
    comes from; the ladder's wording ('fitted )', 'its profile likelihood accepts') is a ladder's only."""
    from types import SimpleNamespace

    from marin_ablate.ablations.ladders import FAST_LADDER_LAW
    from marin_ablate.analysis.fit.reflaw import PinnedLaw, published
    from marin_ablate.analysis.report.provenance import pinned_law_provenance

    law = PinnedLaw.from_dict(published(FAST_LADDER_LAW).to_dict())  # as the study folder holds it
    assert law.is_published and law.origin == f"a published law ({FAST_LADDER_LAW.source})"
    assert law.describe().startswith(f"L∞ = {FAST_LADDER_LAW.linf:.4g}, α = {FAST_LADDER_LAW.alpha:.4g} as published")
    [line] = pinned_law_provenance(SimpleNamespace(pinned_law=law))
    assert line.startswith("- reference law pinned from a published law (`Marin's fast ladder")
    for text in (law.origin, law.describe(), line):
        assert "fitted )" not in text and ", )" not in text and "profile likelihood" not in text, text
