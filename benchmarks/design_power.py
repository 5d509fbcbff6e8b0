"""Seeds or rungs? The main job's design chosen for power at a fixed budget (docs/method.md §4.11).

Usage:
  OMP_NUM_THREADS=1 python benchmarks/design_power.py [--budget-seeds 3 --budget-rungs cpu_s32,cpu_s64,cpu_s128]
      [--draws 20000]

For each candidate layout of the smoke study (its 16 arms on a set of rungs, K seeds, each seed with its own LR
profile at cpu_s64), the precision planner (analysis/calibration/precision.py) gives one seed's model interval per
component; each seed's estimate then scatters with that and the component x seed sd measured on the smoke study
(SEED_SD: the optimizer 0.33, sconv 0.15, the others 0.05 in ln M; the TOTAL in quadrature). The table prints, at
the budget of the reference layout (default: today's 3 seeds x cpu_s32/64/128, costed with each rung's wall-time
assumption plus the profile), the seeds each rung set affords, the median 95% half-width of the optimizer, sconv
and the TOTAL, and the power of Findings' Holm-controlled verdict at a true ×1.5 for the optimizer and sconv
(Monte Carlo over per-seed estimates: the between-seed t interval on K − 1 df, as the analysis reports it at C_ref,
docs/method.md §4.4; Holm over the 8 quality verdicts with the other values at no effect).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

#: The component x seed sd in ln M measured on the smoke study's per-seed estimates (12 seeds at cpu_s32..s128,
#: benchmarks/RESULTS.md "Seed replication"); a component not named moves by OTHER_SD.
SEED_SD = {"optimizer": 0.33, "sconv": 0.15}
OTHER_SD = 0.05
LEVEL = 0.95


def layout_cost(study, rungs: list[str], seeds: int) -> float:
    """Core-seconds of the study on `rungs` at `seeds` seeds: the design runs and each seed's LR profile."""
    from dataclasses import replace

    from marin_ablate.ablations.ladders import ladder
    from marin_ablate.sweeps.tuning import profile_cost

    s = replace(study, rungs=ladder(rungs), seeds=tuple(range(seeds)))
    design = float(s.describe()["cost"]["est_core_seconds"])
    prof = profile_cost(replace(study, seeds=tuple(range(seeds))))
    return design + (float(prof["core_seconds"]) if prof else 0.0)


def one_seed(study, rungs: list[str]) -> pd.DataFrame:
    """One seed's median model half-width per component at C_ref (the planner, no between-seed floor)."""
    from dataclasses import replace

    from marin_ablate.ablations.ladders import ladder
    from marin_ablate.analysis.calibration.precision import Noise, predict, study_layout

    lay, _ = study_layout(replace(study, rungs=ladder(rungs), seeds=(0,)))
    t, _ = predict(lay, Noise(0.01), ratios=(1.0,), between=False)  # the planner's default run noise and law
    return t


def seed_sd(component: str, components: list[str]) -> float:
    if component == "TOTAL":
        return math.sqrt(sum(seed_sd(c, components) ** 2 for c in components))
    return SEED_SD.get(component, OTHER_SD)


def simulate(one: pd.DataFrame, k: int, mu: dict[str, float], draws: int, rng) -> dict[str, np.ndarray]:
    """Per component: its half-widths and whether Holm over the 8 quality verdicts calls it, over `draws` studies."""
    comps = list(one["component"])
    factors = [c for c in comps if c != "TOTAL"]
    q1 = stats.t.ppf(0.5 + LEVEL / 2, max(int(one.attrs["dof"]), 1))
    se1 = one["hw_1x"].to_numpy() / q1
    sd = np.array([math.sqrt(se1[i] ** 2 + seed_sd(c, factors) ** 2) for i, c in enumerate(comps)])
    m = np.array([mu.get(c, 0.0) for c in comps])
    x = m + sd * rng.standard_normal((draws, k, len(comps)))
    if "TOTAL" in comps:  # the TOTAL is the sum of the components at each seed
        j = comps.index("TOTAL")
        x[:, :, j] = x[:, :, [comps.index(f) for f in factors]].sum(-1)
    est = x.mean(1)
    s = x.std(1, ddof=1)
    qk = stats.t.ppf(0.5 + LEVEL / 2, k - 1)
    half = qk * s / math.sqrt(k)
    p = 2 * stats.t.sf(np.abs(est) / (s / math.sqrt(k)), k - 1)
    # Holm's step-down over the 8 verdicts of each study
    order = np.argsort(p, 1)
    ps = np.take_along_axis(p, order, 1)
    thr = (1 - LEVEL) / (len(comps) - np.arange(len(comps)))
    ok = np.cumprod(ps < thr[None, :], 1).astype(bool)
    rej = np.zeros_like(ok)
    np.put_along_axis(rej, order, ok, 1)
    return {c: (half[:, i], rej[:, i]) for i, c in enumerate(comps)}


def main() -> int:
    from marin_ablate.ablations.studies import smoke

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-seeds", type=int, default=3)
    ap.add_argument("--budget-rungs", default="cpu_s32,cpu_s64,cpu_s128")
    ap.add_argument("--draws", type=int, default=20000)
    args = ap.parse_args()
    study = smoke()
    budget = layout_cost(study, args.budget_rungs.split(","), args.budget_seeds)
    candidates = [["cpu_s32", "cpu_s64", "cpu_s128"], ["cpu_s32", "cpu_s64"], ["cpu_s16", "cpu_s32"],
                  ["cpu_s64", "cpu_s128"], ["cpu_s32", "cpu_s128"]]  # one rung: no scale trend, and α unpinned
    rng = np.random.default_rng(0)
    rows = []
    for rungs in candidates:
        one = one_seed(study, rungs)
        per_seed = layout_cost(study, rungs, 1)
        ks = sorted({max(2, int(budget // per_seed)), args.budget_seeds, 6, 8, 12})
        for k in ks:
            cost = layout_cost(study, rungs, k)
            row = {"rungs": "+".join(r.removeprefix("cpu_") for r in rungs), "seeds": k, "core_s": round(cost),
                   "x budget": round(cost / budget, 2)}
            null = simulate(one, k, {}, args.draws, rng)
            for c in ("optimizer", "sconv", "TOTAL"):
                row[f"hw {c}"] = round(float(np.median(null[c][0])), 3)
            row["P(hw opt <= 0.405)"] = round(float(np.mean(null["optimizer"][0] <= math.log(1.5))), 3)
            for c in ("optimizer", "sconv"):
                called = simulate(one, k, {c: math.log(1.5)}, args.draws, rng)[c][1]
                row[f"power {c} x1.5"] = round(float(np.mean(called)), 3)
            row["false calls (null)"] = round(float(np.mean(np.any(np.stack([v[1] for v in null.values()]), 0))), 3)
            rows.append(row)
    tab = pd.DataFrame(rows)
    print(f"budget: {budget:.0f} core-s ({args.budget_seeds} seeds x {args.budget_rungs}, design + per-seed LR "
          "profile, each rung's wall-time assumption)")
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(tab.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
