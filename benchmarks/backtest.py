"""How far a k-rung fit's extrapolation travels, on planted studies whose effects change with scale.

Usage: OMP_NUM_THREADS=1 python benchmarks/backtest.py [--studies 100] [--noise 0.002]

Each study: four factors, full 2^4 factorial, one seed, four rungs 4x apart in compute (1.8 decades, like a
GPU ladder d512..d1280), the law pinned at its truth as a reference ladder pins it (docs/method.md §4.1). The
factors' true quality multipliers (Shapley, ln scale) change with scale in four ways, drawn afresh per study
(analysis/calibration/simulate.py, `ScaleStep`):
  lin   a + b·ln(C/C_ref): linear in ln C, the effects model's own form;
  sat   a logistic step from a gain at small compute to 0–40% of it at large (saturating: MuonH's fading gain);
  flip  a logistic step from a gain (or loss) to the opposite sign, its midpoint between rungs 2 and 4;
  null  no effect.
Every study goes through `analyze_table` and the backtest (analysis/backtest.py). Per shape and k, over
the k-rung fits' predictions at rung k + 1: how often the predicted interval covers the truth there, how often
the backtest flags the prediction (not covered against the measured value), how often it flags the ones that
miss the truth and the ones that cover it, and how often the predicted and measured verdicts agree; with the
report's interval (the union of the power and curved law forms' intervals) and with the power-law fit's own.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

SHAPES = ("lin", "sat", "flip", "null")
RUNGS = {f"r{j + 1}": 1e8 * 4**j for j in range(4)}  # tokens; C = 6e8 FLOPs/token × tokens
FPT = 6e8


def planted_truth(rng: np.random.Generator, noise: float):
    """A SimTruth with one factor per shape (module docstring), C_ref the ladder's geometric mean compute."""
    from marin_ablate.analysis.calibration.simulate import ScaleStep, SimTruth

    C = np.array([FPT * t for t in RUNGS.values()])
    c_ref = float(np.exp(np.log(C).mean()))
    sign = lambda: float(rng.choice([-1.0, 1.0]))  # noqa: E731
    a, b = sign() * rng.uniform(0.05, 0.2), rng.normal(0, 0.04)
    s_sat = sign() * rng.uniform(0.15, 0.35)
    s_flip = sign() * rng.uniform(0.15, 0.3)
    steps = {"sat": ScaleStep(s_sat, s_sat * rng.uniform(0.0, 0.4), float(np.exp(rng.uniform(*np.log(C[[0, 3]])))),
                              rng.uniform(0.5, 1.5)),
             "flip": ScaleStep(s_flip, -s_flip * rng.uniform(0.5, 1.0), float(np.exp(rng.uniform(*np.log(C[[1, 3]])))),
                               rng.uniform(0.3, 1.0))}
    return SimTruth(factors=list(SHAPES), main={"lin": a / 2}, scale={"lin": b / 2}, steps=steps, c_ref=c_ref,
                    seed_sd=0.0, noise_sd=noise, flops_per_token=FPT)


def score_truth(rows: pd.DataFrame, truth) -> pd.DataFrame:
    """The backtest's next-rung predictions (target = k + 1, components only) with the truth at the target's
    compute: truth, covers_truth (pred_lo ≤ truth ≤ pred_hi), flagged (the backtest's `covered` is False), and
    the same two with the power-law fit's own interval (`_power`), before the union with the curved form's."""
    from marin_ablate.analysis.backtest import score

    r = rows[(rows["target"] == rows["k"] + 1) & (rows["component"] != "TOTAL")].copy()
    r["truth"] = [truth.shapley(c)[f] for c, f in zip(r["compute"], r["component"], strict=True)]
    r["covers_truth"] = (r["pred_lo"] <= r["truth"]) & (r["truth"] <= r["pred_hi"])
    r["flagged"] = r["covered"].map(lambda v: None if v is None else not v)
    r["covers_truth_power"] = (r["pred_lo_power"] <= r["truth"]) & (r["truth"] <= r["pred_hi_power"])
    pw = score(r.drop(columns=["pred_lo", "pred_hi"]).rename(columns={"pred_lo_power": "pred_lo",
                                                                       "pred_hi_power": "pred_hi"}))
    r["flagged_power"] = pw["covered"].map(lambda v: None if v is None else not v).to_numpy()
    return r


def tally(scored: pd.DataFrame) -> pd.DataFrame:
    """Per shape (the component) and k: n, coverage of the truth, the backtest's flag rate overall, among the
    predictions that miss the truth and among those that cover it, and the verdicts' agreement."""
    out = []
    d = scored[scored["flagged"].notna()]
    for (shape, k), g in d.groupby(["component", "k"], sort=False):
        miss, hit = g[~g["covers_truth"]], g[g["covers_truth"]]
        pmiss = g[~g["covers_truth_power"]]
        out.append({"shape": shape, "fit": f"{k} rungs -> rung {k + 1}", "n": len(g),
                    "covers truth": g["covers_truth"].mean(), "flagged": g["flagged"].astype(bool).mean(),
                    "flagged | misses truth": miss["flagged"].astype(bool).mean() if len(miss) else np.nan,
                    "n misses": len(miss),
                    "flagged | covers truth": hit["flagged"].astype(bool).mean() if len(hit) else np.nan,
                    "verdicts agree": g["agree"].astype(float).mean(),
                    "median |error vs truth|": float(np.median(np.abs(g["pred"] - g["truth"]))),
                    "median half-width": float(np.median((g["pred_hi"] - g["pred_lo"]) / 2)),
                    "power: covers truth": g["covers_truth_power"].mean(),
                    "power: flagged | misses truth": (pmiss["flagged_power"].astype(bool).mean() if len(pmiss)
                                                      else np.nan),
                    "power: n misses": len(pmiss),
                    "power: median half-width": float(np.median((g["pred_hi_power"] - g["pred_lo_power"]) / 2))})
    order = {s: i for i, s in enumerate(SHAPES)}
    return pd.DataFrame(out).sort_values(["shape", "fit"], key=lambda c: c.map(order) if c.name == "shape" else c,
                                         ignore_index=True)


def one(i: int, noise: float) -> pd.DataFrame:
    from marin_ablate.analysis.backtest import backtest
    from marin_ablate.analysis.calibration.simulate import simulate_table
    from marin_ablate.analysis.pipeline import analyze_table

    rng = np.random.default_rng(4900 + i)
    truth = planted_truth(rng, noise)
    df = simulate_table(truth, rungs=RUNGS, seeds=1, rng=rng)
    kw = dict(pin_linf=truth.linf, pin_alpha=truth.alpha)
    a = analyze_table(df, n_boot=0, boot_method="none", replicates=False, responses=("quality",), **kw)
    return score_truth(backtest(df, a, **kw).rows, truth).assign(study=i)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=100)
    ap.add_argument("--noise", type=float, default=0.002, help="run-to-run loss sd (nats)")
    args = ap.parse_args()
    from marin_ablate.analysis.fit.replicates import clopper_pearson

    t0 = time.time()
    parts, crashed = [], []
    for i in range(args.studies):
        try:
            parts.append(one(i, args.noise))
        except Exception as e:  # noqa: BLE001 — a crash is a result: counted and named, the rest still runs
            crashed.append(f"study {i}: {type(e).__name__}: {e}")
    tab = tally(pd.concat(parts, ignore_index=True))
    print("The report's interval (the power and curved law forms' union):")
    print("| shape | fit | n | covers truth [exact 95%] | median half-width | backtest flags | flags when it misses "
          "the truth (n) | flags when it covers | verdicts agree | median abs. ln error vs truth |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in tab.to_dict("records"):
        lo, hi = clopper_pearson(int(round(r["covers truth"] * r["n"])), r["n"])
        print(f"| {r['shape']} | {r['fit']} | {r['n']} | {r['covers truth']:.3f} [{lo:.3f}, {hi:.3f}] | "
              f"{r['median half-width']:.3f} | {r['flagged']:.3f} | {r['flagged | misses truth']:.3f} "
              f"({r['n misses']}) | {r['flagged | covers truth']:.3f} | {r['verdicts agree']:.3f} | "
              f"{r['median |error vs truth|']:.3f} |")
    print("\nThe power-law fit's own interval (before the union with the curved form's):")
    print("| shape | fit | n | covers truth [exact 95%] | median half-width | flags when it misses the truth (n) |")
    print("|---|---|---|---|---|---|")
    for r in tab.to_dict("records"):
        lo, hi = clopper_pearson(int(round(r["power: covers truth"] * r["n"])), r["n"])
        print(f"| {r['shape']} | {r['fit']} | {r['n']} | {r['power: covers truth']:.3f} [{lo:.3f}, {hi:.3f}] | "
              f"{r['power: median half-width']:.3f} | {r['power: flagged | misses truth']:.3f} "
              f"({r['power: n misses']}) |")
    if crashed:
        print(f"analysis raised in {len(crashed)} studies: {'; '.join(crashed)[:500]}")
    print(f"{args.studies} studies, noise sd {args.noise} nats, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
