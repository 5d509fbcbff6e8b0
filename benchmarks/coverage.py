"""Coverage of every reported 95% interval on simulated studies with known truth.

Usage: OMP_NUM_THREADS=1 python benchmarks/coverage.py [--studies 200] [--designs m1,m2,smoke] [--scenarios lonearm]
Designs (each the registered study's own design matrix, from ablations/studies.py): m1 = marin535,
1 seed (6 factors, 2^(6-1), 3 rungs); m2 = the same with 2 seeds; smoke = 7 factors, 2^(7-3)
resolution IV, on 4 rungs (compute x2 per rung, like the smoke ladder's 32..256 steps); c5 = the
calibration design (5 factors, 16 arms, 3 rungs) with 5 seeds, whose placebo changes every run's
random stream (a loss shift shared by the arms of one seed and placebo level). Scenarios
rotate per study: plain, strong scale trends, strong interactions, heteroscedastic noise, a broken
law, lost runs (one baseline run among them), a lone-arm throughput effect (the all-on arm alone
0.82x as fast). A number counts as
"ok" when its interval covers the truth or the report flags it (not identified / disagreement /
law form not assessable / interval wider than 10x). A component's truth is its Shapley value under
the true model (an all-on-only throughput effect is shared equally by the factors).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

SCENARIOS = ("plain", "scale", "interactions", "hetero", "broken", "lost", "lonearm")
DESIGNS = {"m1": ("marin535", 1, 3), "m2": ("marin535", 2, 3), "smoke": ("smoke", 1, 4),  # study, seeds, rungs
           "c5": ("calibration", 5, 3), "g1": ("marin535", 1, 3), "g2": ("marin535", 2, 3)}
#: Designs whose runs share a random stream per seed except across these factors' levels (the
#: calibration placebo's structure): loss shift sd per (seed, stream, rung)
STREAMS = {"c5": (("placebo",), 0.02)}
#: GPU-style ladders: every (seed, rung) draws its own init and data order, a loss shift with this sd
#: shared by all arms of that seed and rung (4x the run noise)
RUNG_SD = {"g1": 0.02, "g2": 0.02}


@functools.lru_cache(maxsize=None)
def _design(study: str) -> tuple[list[str], np.ndarray]:
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.analysis.calibration.simulate import study_design

    factors = [f.name for f in get_study(study).factors]
    return factors, study_design(study, factors)


def one(design: str, i: int, scenarios: tuple[str, ...] = SCENARIOS) -> dict[str, tuple[bool, bool]]:
    from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table
    from marin_ablate.analysis.pipeline import analyze_table

    study, seeds, nr = DESIGNS[design]
    factors, D = _design(study)
    sc = scenarios[i % len(scenarios)]
    rng = np.random.default_rng(1000 * list(DESIGNS).index(design) + i)
    kw = {"scale_sd": 0.06} if sc == "scale" else {"inter_sd": 0.08} if sc == "interactions" else {}
    truth = random_truth(factors, rng, **kw)
    if sc == "hetero":
        truth.noise_hetero = 1.0
    if sc == "broken":
        truth.break_c, truth.break_delta = 5e16, 0.15
    if sc == "lonearm":  # the all-on arm alone runs 0.82x as fast
        truth.throughput_allon = -0.2
    truth.stream_factors, truth.stream_sd = STREAMS.get(design, ((), 0.0))
    truth.rung_sd = RUNG_SD.get(design, 0.0)
    rungs = {f"r{j}": 1e8 * 2**j for j in range(nr)}
    df = simulate_table(truth, rungs=rungs, seeds=seeds, design=D, rng=rng,
                        fail=2 if sc == "lost" else 0, fail_baseline=1 if sc == "lost" else 0)
    top = float(np.exp(np.log(df.loc[df["rung"] == f"r{nr - 1}", "train_flops"]).mean()))
    a = analyze_table(df, n_boot=0, boot_method="none", target_compute=10 * top, force_extrapolation=True)
    out: dict[str, tuple[bool, bool]] = {}

    def put(name, lo, hi, t, flag=False):
        cov = bool(np.isfinite(lo) and lo <= t <= hi)
        out.setdefault(name, []).append((cov, cov or flag or not np.isfinite(lo)))

    comp = a.components.set_index(["response", "component"]).reindex(
        [(r, f) for r in ("ln_M", "ln_R") for f in factors + ["TOTAL"]])
    ch = a.checks
    disagree = {r: bool((ch[ch["response"] == r]["agree"] == False).any()) for r in ("ln_M", "ln_R")}  # noqa: E712
    sh = truth.shapley(a.c_ref)
    # the report says when its quality intervals cannot include a (seed × rung) shift (analysis/fit/checks.py)
    from marin_ablate.analysis.fit.checks import unmeasured_shift

    blind = bool(unmeasured_shift(a))
    # the report warns that a stream-changing factor's intervals can be too narrow (analysis/fit/checks.py)
    streamed = {f for f in factors if any(w.startswith(f"{f}: its two levels never share") for w in a.warnings)}
    for f in factors:
        # a TOTAL disagreement warns that every component of that response is suspect (analysis/fit/checks.py)
        put("component M_flop", comp.loc[("ln_M", f), "shapley_lo"], comp.loc[("ln_M", f), "shapley_hi"], sh[f],
            disagree["ln_M"] or f in streamed or blind)
        if f in truth.stream_factors:  # scored alone too: with >= 3 seeds the between-seed interval covers it
            put("stream factor M_flop", comp.loc[("ln_M", f), "shapley_lo"], comp.loc[("ln_M", f), "shapley_hi"],
                sh[f], disagree["ln_M"] or f in streamed)
        put("component R", comp.loc[("ln_R", f), "shapley_lo"], comp.loc[("ln_R", f), "shapley_hi"],
            truth.throughput_effect()[f], disagree["ln_R"])
    put("TOTAL M_flop", comp.loc[("ln_M", "TOTAL"), "shapley_lo"], comp.loc[("ln_M", "TOTAL"), "shapley_hi"],
        sum(sh.values()), disagree["ln_M"] or blind)
    put("TOTAL R", comp.loc[("ln_R", "TOTAL"), "shapley_lo"], comp.loc[("ln_R", "TOTAL"), "shapley_hi"],
        truth.throughput_total(), disagree["ln_R"])
    # What Findings lead with: the observed all-on vs all-off contrast where the model's TOTAL fails its check
    from marin_ablate.analysis.report.findings import recommended_total

    for resp, label, t in (("ln_R", "R", truth.throughput_total()),
                           ("ln_W", "W", sum(sh.values()) + truth.throughput_total())):
        lo, hi = recommended_total(a, resp)[1:3]
        flag = blind and resp == "ln_W"  # Findings mark a quality-based value whose interval omits the shift
        put(f"Findings TOTAL {label}", lo, hi, t, flag)
        if sc == "lonearm":
            put(f"Findings TOTAL {label} (lone arm)", lo, hi, t, flag)
    pr = a.per_rung[(a.per_rung["response"] == "ln_M") & (a.per_rung["component"] != "TOTAL")]
    for r in pr.itertuples():
        put("per rung M_flop", r.lo, r.hi, truth.shapley(r.compute)[r.component], r.component in streamed or blind)
    ex = a.extrapolation.set_index(["response", "component"]).reindex(
        [(r, f) for r in ("ln_M", "ln_R") for f in factors + ["TOTAL"]])
    shx = truth.shapley(a.target_compute)
    form_flag = "curved" not in a.joint
    for f in factors + ["TOTAL"]:
        lo, hi = ex.loc[("ln_M", f), "shapley_lo"], ex.loc[("ln_M", f), "shapley_hi"]
        t = sum(shx.values()) if f == "TOTAL" else shx[f]
        put("10x extrapolation M_flop", lo, hi, t, form_flag or np.exp(hi - lo) > 10 or f in streamed or blind)
    if sc != "broken" and a.law is not None:
        for p_, t in (("alpha", truth.alpha), ("linf", truth.linf)):
            lo, hi = a.law.ci(p_)
            put(f"law {p_}", lo, hi, t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=200)
    ap.add_argument("--designs", default="m1,m2,smoke")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="the scenarios to rotate through")
    args = ap.parse_args()
    scen = tuple(args.scenarios.split(","))
    bad = [x for x in scen if x not in SCENARIOS]
    if bad:
        ap.error(f"--scenarios {bad}: allowed values: {', '.join(SCENARIOS)}")
    from marin_ablate.analysis.fit.replicates import clopper_pearson

    print("| design | quantity | n | coverage | covered or flagged | exact 95% of covered or flagged |")
    print("|---|---|---|---|---|---|")
    for d in args.designs.split(","):
        t0 = time.time()
        agg: dict[str, list] = {}
        crashed = []
        for i in range(args.studies):
            try:
                res = one(d, i, scen)
            except Exception as e:  # noqa: BLE001 — a crash is a result: counted and named, the rest still runs
                crashed.append(f"study {i}: {type(e).__name__}: {e}")
                continue
            for k_, v in res.items():
                agg.setdefault(k_, []).extend(v)
        if crashed:
            print(f"| {d} | analysis raised | {len(crashed)} | {'; '.join(crashed)[:300]} | | |", flush=True)
        for k_, v in agg.items():
            v = np.array(v)
            lo, hi = clopper_pearson(int(v[:, 1].sum()), len(v))
            print(f"| {d} | {k_} | {len(v)} | {v[:, 0].mean():.3f} | {v[:, 1].mean():.3f} | [{lo:.3f}, {hi:.3f}] |",
                  flush=True)
        print(f"| {d} | run time | {args.studies} studies | {time.time() - t0:.0f} s | | |", flush=True)


if __name__ == "__main__":
    main()
