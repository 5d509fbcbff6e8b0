"""Monte-Carlo rates of the analysis on simulated studies with known truth: how often its intervals cover the
truth (components, placebo replicates, the law's L∞/α/A, OFAT multipliers), how often a null study shows a false
verdict, and how close the precision planner's predicted half-widths come to the realized ones.

Usage: OMP_NUM_THREADS=1 python benchmarks/rates.py [--only attribution,ofat] [--studies N]

A rate is a benchmark's job: each row of RATES used to be a test that simulated tens to hundreds of studies
(minutes of CPU). The test suite keeps a small seeded version of each (RATES[...].test): a few studies whose
standardized errors must stay near 1 and whose intervals must cover, which fails when the estimator's variance
is off by a factor (tests/rate_mutations.py applies those mutations; docs/testing.md lists them). Each row's
`bar` is what the former test asserted on its rate; the table prints the rate with its exact binomial 95%
interval, and `rms z`: the root mean square of each interval's error in units of its own half-width on the
truth's side times 1.96 (about 1 for a calibrated 95% interval, under 1 for a conservative one).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

Z95 = 1.959963984540054


def scored(quantity: str, est: float, lo: float, hi: float, truth: float) -> dict:
    """One interval against its truth: whether it covers, and z, the error in units of the interval's half-width
    on the truth's side, times 1.96 (a 95% interval's half-width is 1.96 standard errors). An open side (a
    non-finite end: "not identified") covers and gives z = 0."""
    half = (hi - est) if truth > est else (est - lo)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return {"quantity": quantity, "covers": True, "z": 0.0}
    z = (truth - est) / half * Z95 if half > 0 else (0.0 if truth == est else np.inf)
    return {"quantity": quantity, "covers": bool(lo <= truth <= hi), "z": float(z)}


def calibration(rows: list[dict]) -> tuple[int, float]:
    """(intervals that miss their truth, root mean square z) over `scored` rows."""
    z = np.array([r["z"] for r in rows], float)
    return sum(not r["covers"] for r in rows), float(np.sqrt(np.mean(z**2)))


def _quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*a, **k)


# --- the simulated studies -------------------------------------------------------------------------------------


def attribution(i: int) -> list[dict]:
    """A 2^3 factorial, 4 rungs, 2 seeds, random truth: Shapley, leave-one-out and all-others-on ln M intervals
    (joint law fit, the larger of HC3 and the model SE) against the true values at C_ref."""
    from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table
    from marin_ablate.analysis.pipeline import analyze_table

    factors = ["xsa", "sconv", "latent_moe"]
    rng = np.random.default_rng(10_000 + i)
    truth = random_truth(factors, rng)
    df = simulate_table(truth, rungs={f"r{j}": 1e8 * 4**j for j in range(4)}, seeds=2, rng=rng)
    a = analyze_table(df, n_boot=0, boot_method="none", responses=("quality",), law_forms=("power",))
    c = a.components[a.components["response"] == "ln_M"].set_index("component")
    return [scored(f"{kind} ln_M", c.loc[f, kind], c.loc[f, f"{kind}_lo"], c.loc[f, f"{kind}_hi"], v)
            for kind, true in (("shapley", truth.shapley(a.c_ref)), ("loo", truth.loo(a.c_ref)),
                               ("aoi", truth.aoi(a.c_ref)))
            for f, v in true.items()]


def placebo_study(seeds: int, seed: int = 0, stream_sd: float = 0.0):
    """The calibration study's shape: xsa and qk_norm with effects, a planted placebo with none, 3 rungs."""
    from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table

    rng = np.random.default_rng(seed)
    truth = SimTruth(factors=["xsa", "qk_norm", "placebo"], main={"xsa": 0.05, "qk_norm": -0.03},
                     throughput={"xsa": -0.02}, noise_sd=0.01, planted={"placebo": {"M_flop": 1.0, "R": 1.0}},
                     stream_factors=("placebo",) if stream_sd else (), stream_sd=stream_sd)
    return simulate_table(truth, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8}, seeds=seeds, rng=rng)


def placebo(i: int, seeds: int = 20) -> list[dict]:
    """One calibration-shaped study of `seeds` replicates; each replicate's placebo ln M and ln R interval (the
    report's coverage table) against the planted truth 0."""
    from marin_ablate.analysis.pipeline import analyze_table

    a = analyze_table(placebo_study(seeds=seeds, seed=3 + i), n_boot=0, boot_method="none")
    reps = a.replicates[a.replicates["response"].isin(["ln_M", "ln_R"])]
    return [scored(f"placebo {r.response}", r.estimate, r.lo, r.hi, 0.0) for r in reps.itertuples()]


F7 = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer"]
NULL_DESIGNS = {"fraction_7_1": (3, 7000), "smoke": (4, 7100)}  # rungs, first seed


#: The Findings columns that are verdicts, and the family each falls in (analysis/report/findings.py: Holm within
#: each family on its own)
COLUMN_FAMILY = {"quality M_flop": "quality", "throughput R": "speed", "wall-clock M_flop·R": "speed",
                 "scale verdict": "scale"}


def null_findings(design: str, i: int) -> dict:
    """A study where nothing does anything (H100 throughput: every response is a verdict), as Findings read it:
    {"false": {family: its false gain/loss verdicts}, "withheld": the cells where the unadjusted interval alone
    would have made one}."""
    from marin_ablate.analysis.calibration.simulate import SimTruth, design_rows, simulate_table, study_design
    from marin_ablate.analysis.pipeline import analyze_table
    from marin_ablate.analysis.report.writer import findings_table

    nr, seed0 = NULL_DESIGNS[design]
    D = design_rows(7, 1) if design == "fraction_7_1" else study_design("smoke", F7)
    df = simulate_table(SimTruth(factors=F7, main={}), rungs={f"r{j}": 1e8 * 2**j for j in range(nr)}, seeds=1,
                        design=D, rng=np.random.default_rng(seed0 + i))
    a = analyze_table(df, n_boot=0, boot_method="none", replicates=False, law_forms=("power",))
    false, withheld = {g: [] for g in dict.fromkeys(COLUMN_FAMILY.values())}, []
    for r in findings_table(a).to_dict("records"):
        for k, v in r.items():
            v = str(v)
            if k not in COLUMN_FAMILY:
                continue
            if v.endswith((": gain", ": loss")) or ": gain;" in v or ": loss;" in v or (
                    k == "scale verdict" and "with scale" in v):
                false[COLUMN_FAMILY[k]].append((r["component"], k, v))
            if "the unadjusted interval excludes 1" in v:
                withheld.append((r["component"], k, v))
    return {"false": false, "withheld": withheld}


def null_family(design: str) -> Callable[[int], list[dict]]:
    def one(i: int) -> list[dict]:
        got = null_findings(design, i)
        return [*({"quantity": f"{design}: no false {g} verdict", "covers": not b} for g, b in got["false"].items()),
                {"quantity": f"{design}: no false verdict, unadjusted intervals", "covers": not got["withheld"]}]
    return one


def law_shifts(i: int) -> list[dict]:
    """2 seeds x 4 rungs with a (seed x rung) loss shift 4x the run noise: the law's L∞ and α intervals (on the
    cluster means) against the truth; an end that is not identified counts as covering."""
    from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
    from marin_ablate.analysis.pipeline import analyze_table

    t = SimTruth(factors=["qk_norm", "sconv"], main={"qk_norm": 0.05, "sconv": 0.08},
                 throughput={"qk_norm": -0.02, "sconv": 0.03}, noise_sd=0.003, seed_sd=0.003, rung_sd=0.012)
    df = simulate_table(t, rungs={f"r{j}": 1e8 * 4**j for j in range(4)}, seeds=2, rng=np.random.default_rng(100 + i))
    a = _quiet(analyze_table, df, n_boot=0, boot_method="none", law_forms=("power",), replicates=False,
               responses=("quality",))
    return [scored(k, getattr(a.law, k), *a.law.ci(k), v) for k, v in (("linf", t.linf), ("alpha", t.alpha))]


OFAT_F = ["xsa", "sconv", "qk_norm"]
OFAT_RUNGS = {"r1": 1e8, "r2": 4e8, "r3": 1.6e9, "r4": 6.4e9}
STAR = np.array([[-1, -1, -1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], float)


def ofat(i: int) -> list[dict]:
    """A 4-rung, 2-seed one-factor-at-a-time study, law fitted on the baseline: each change's M interval at each
    rung against the true single-change multiplier."""
    from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
    from marin_ablate.analysis.ofat import analyze_ofat

    t = SimTruth(factors=OFAT_F, main={"xsa": 0.05, "sconv": 0.1, "qk_norm": -0.04}, scale={"sconv": 0.02},
                 flops_extra={"sconv": 0.01}, linf=2.0, A=400.0, alpha=0.2, noise_sd=0.003, seed_sd=0.0)
    df = simulate_table(t, rungs=OFAT_RUNGS, seeds=2, design=STAR, rng=np.random.default_rng(100 + i))
    tab = analyze_ofat(df).table
    out = []
    for j, f in enumerate(OFAT_F):
        x = -np.ones((1, 3))
        x[0, j] = 1
        for r in OFAT_RUNGS:
            row = tab[(tab["factor"] == f) & (tab["rung"] == r)].iloc[0]
            true = float(t.log_m(x, t.z([row["compute"]]))[0])
            out.append(scored("single change ln M", np.log(row["M"]), np.log(row["M_lo"]), np.log(row["M_hi"]), true))
    return out


LAW = {"linf": 2.1, "A": 350.0, "alpha": 0.18}


def ladder(seed: int, noise: float = 0.004, rungs: int = 6, seeds: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A baseline ladder on the law L = L∞ + A·C^(−α) (LAW) with Gaussian run noise."""
    rng = np.random.default_rng(seed)
    C = np.repeat(np.logspace(16, 19, rungs), seeds)
    return C, LAW["linf"] + LAW["A"] * C ** (-LAW["alpha"]) + rng.normal(0, noise, len(C))


def law_profile(i: int) -> list[dict]:
    """A noisy 6-rung, 3-seed ladder: the law's profile-likelihood intervals (L∞, α; A by the delta method)."""
    from marin_ablate.analysis.fit.joint import fit_joint
    from marin_ablate.analysis.fit.law_intervals import law_of

    C, L = ladder(seed=100 + i)
    fit = law_of(fit_joint(C, L, np.zeros((len(L), 0)), []))
    return [scored(k, getattr(fit, k), *fit.ci(k), v) for k, v in LAW.items()]


PRECISION_LAYOUTS = {"smoke-like 2^6 x 4 rungs x 1 seed": (6, 4, 1), "GPU-style 2^5 x 3 rungs x 2 seeds": (5, 3, 2)}


def realized_halfwidths(k: int, n_rungs: int, seeds: int, n: int = 100, noise: float = 0.005):
    """The precision planner's predicted 95% half-width of each Shapley ln M (C_ref and 10x) for one truth, and
    the realized half-widths of `n` studies of that truth that differ only in their noise (what analyze_table
    fits for ln M): (prediction table, realized (n, k) at 1x, at 10x, (table, noise-free losses, truth))."""
    from marin_ablate.analysis.calibration.precision import Layout, Noise, predict
    from marin_ablate.analysis.calibration.simulate import design_rows, random_truth, simulate_table
    from marin_ablate.analysis.fit.attribution import code_table, component_table
    from marin_ablate.analysis.fit.joint import quality_fit

    factors = [f"f{i}" for i in range(k)]
    D = design_rows(k)
    rng = np.random.default_rng(7)
    truth = random_truth(factors, rng)
    truth.flops_extra, truth.noise_sd, truth.seed_sd = {}, 0.0, 0.0
    df = simulate_table(truth, rungs={f"r{j}": 1e8 * 2**j for j in range(n_rungs)}, seeds=seeds, rng=rng, design=D)
    X, _, _ = code_table(df, factors)
    C, L0 = df["train_flops"].to_numpy(float), df["eval_macro_loss"].to_numpy(float)
    z = np.log(C / np.exp(np.mean(np.log(C))))
    s = df["seed"].to_numpy()
    clusters = (df["seed"].astype(str) + "|" + df["rung"].astype(str)).to_numpy()
    kw = dict(scale=True, seeds=s if seeds > 1 else None, clusters=clusters)
    hw, hw10 = [], []
    for _ in range(n):  # the simulator's noise model: a shift per seed plus independent run noise
        L = L0 + rng.normal(0, 0.005, seeds)[s] + rng.normal(0, noise, len(L0))
        fq, _ = quality_fit(X, z, C, L, factors, interactions=True, **kw)
        t, t10 = component_table(fq, 0.0), component_table(fq, np.log(10.0))
        hw.append(((t["shapley_hi"] - t["shapley_lo"]) / 2).to_numpy())
        hw10.append(((t10["shapley_hi"] - t10["shapley_lo"]) / 2).to_numpy())
    lay = Layout(D, tuple(factors), tuple(6e16 * 2**j for j in range(n_rungs)), seeds)
    pred, _ = predict(lay, Noise(noise), law=(truth.linf, truth.A, truth.alpha),
                      log_m=lambda X_, C_: truth.log_m(X_, truth.z(C_)), between=False)  # the model interval
    return pred, np.array(hw), np.array(hw10), (df, L0, truth)


# --- the registry and the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    name: str
    one: Callable[[int], list[dict]]  # study i -> its `scored` rows (or {"quantity", "covers"} rows)
    studies: int  # how many the benchmark simulates by default (the former test's count, or more)
    test: str  # the small seeded test that stays in the suite
    bar: str  # what the former test asserted on the rate


RATES: dict[str, Rate] = {r.name: r for r in (
    Rate("attribution", attribution, 200,
         "test_analysis_attribution.py::test_component_intervals_of_three_seeded_studies_cover_at_a_calibrated_width",
         "Shapley, LOO and AOI ln M coverage >= 0.90 each"),
    Rate("placebo", placebo, 5,
         "test_analysis_calibration.py::test_placebo_replicates_cover_and_their_scatter_matches_their_se",
         "one study of 20 replicates: coverage >= 0.85 and sd/se < 1.2, ln M and ln R"),
    Rate("null_fraction_7_1", null_family("fraction_7_1"), 100,
         "test_analysis_family.py::test_seeded_null_studies_show_no_false_verdict_where_unadjusted_intervals_would",
         "at most 5 of 100 null studies with a false verdict in a family"),
    Rate("null_smoke", null_family("smoke"), 100,
         "test_analysis_family.py::test_seeded_null_studies_show_no_false_verdict_where_unadjusted_intervals_would",
         "at most 5 of 100 null studies with a false verdict in a family"),
    Rate("law_shifts", law_shifts, 20,
         "test_analysis_findings.py::test_law_intervals_with_rung_shifts_cover_at_a_calibrated_width",
         "L∞ and α each cover (or are not identified) in >= 17 of 20"),
    Rate("ofat", ofat, 40,
         "test_analysis_ofat.py::test_single_change_intervals_of_seeded_studies_cover_at_a_calibrated_width",
         "coverage of the 480 intervals in [0.90, 0.99]"),
    Rate("law_profile", law_profile, 30,
         "test_analysis_scaling.py::test_law_profile_intervals_of_seeded_ladders_cover_at_a_calibrated_width",
         "coverage of L∞, A, α together >= 0.85"),
)}


def rate_table(rate: Rate, studies: int) -> list[str]:
    from marin_ablate.analysis.fit.replicates import clopper_pearson

    t0, rows = time.time(), []
    for i in range(studies):
        rows += rate.one(i)
    secs = time.time() - t0
    out = []
    for q in dict.fromkeys(r["quantity"] for r in rows):
        mine = [r for r in rows if r["quantity"] == q]
        k = sum(r["covers"] for r in mine)
        lo, hi = clopper_pearson(k, len(mine))
        rms = f"{calibration(mine)[1]:.2f}" if "z" in mine[0] else "-"
        out.append(f"| {rate.name} | {q} | {len(mine)} | {k / len(mine):.3f} [{lo:.3f}, {hi:.3f}] | {rms} | "
                   f"{rate.bar} | {secs:.0f} s / {studies} |")
    return out


def precision_table(n: int) -> list[str]:
    """Predicted against median realized half-widths, per layout and factor (the former test: within 15%)."""
    out = []
    for name, (k, nr, seeds) in PRECISION_LAYOUTS.items():
        t0 = time.time()
        pred, hw, hw10, _ = realized_halfwidths(k, nr, seeds, n=n)
        secs = time.time() - t0
        for col, real in (("hw_1x", hw), ("hw_10x", hw10)):
            ratio = pred[col].to_numpy() / np.median(real, axis=0)
            out.append(f"| precision | {name}, {col} | {n} | predicted / median realized: {ratio.min():.3f} to "
                       f"{ratio.max():.3f} over {k} factors | - | within 15% | {secs:.0f} s / {n} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [*RATES, "precision"]
    ap.add_argument("--only", default=",".join(names), help=f"comma-separated, from: {', '.join(names)}")
    ap.add_argument("--studies", type=int, default=None, help="studies per rate (default: each rate's own)")
    args = ap.parse_args(argv)
    only = args.only.split(",")
    bad = [x for x in only if x not in names]
    if bad:
        ap.error(f"--only {','.join(bad)}: allowed values: {', '.join(names)}")
    print("| rate | quantity | n | covers (exact 95%) | rms z | the former test's bar | time |")
    print("|---|---|---|---|---|---|---|")
    for name in only:
        lines = precision_table(args.studies or 100) if name == "precision" else \
            rate_table(RATES[name], args.studies or RATES[name].studies)
        print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
