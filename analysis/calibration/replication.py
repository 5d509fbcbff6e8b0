"""Does the main job's answer survive a change of seed? The arithmetic of benchmarks/seed_replication.py
(docs/method.md §4.11, "What it cannot tell"): per component the pairs of disjoint seed sets, flips, and the
variance test (Cochran's Q of the set means summed over components, against its distribution under correct
intervals drawn from the pivot: both tails fail it). No torch import.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.report.findings import finding, recommended_total

#: Columns of a per-set table: one row per (set, component), ln-scale estimate and interval.
SET_COLUMNS = ("set", "seeds", "component", "est", "lo", "hi", "verdict")
VERDICTS = ("gain", "loss", "none")
#: The variance test's two-sided level, and its Monte Carlo draws.
VARIANCE_ALPHA, VARIANCE_DRAWS = 0.05, 20_000


def variance_test(sets: pd.DataFrame, level: float = 0.95, draws: int = VARIANCE_DRAWS, seed: int = 0) -> dict:
    """Do the set means scatter as their intervals say? Per component Cochran's Q over its sets, summed over
    components, against the sum's distribution under correct intervals (module docstring). `df` per row (the
    t quantile's df; default the set's seeds − 1). Returns Q, its expected value, the two-sided p, the side
    ("too narrow" / "too wide" / ""), per-component Q and df, and passes (p ≥ VARIANCE_ALPHA)."""
    rng = np.random.default_rng(seed)
    q_obs, null, per = 0.0, np.zeros(draws), {}
    for comp, g in sets.groupby("component", sort=False):
        g = g[np.isfinite(g[["est", "lo", "hi"]].to_numpy(float)).all(axis=1) & (g["hi"] > g["lo"])]
        if len(g) < 2:
            continue
        df = (g["df"].to_numpy(float) if "df" in g else
              np.array([max(len(str(s).split(",")) - 1, 1) for s in g["seeds"]], float))
        se = (g["hi"].to_numpy(float) - g["lo"].to_numpy(float)) / 2 / stats.t.ppf(0.5 + level / 2, df)
        m = g["est"].to_numpy(float)
        w = 1 / se**2
        q = float(np.sum(w * (m - np.sum(w * m) / np.sum(w)) ** 2))
        z = rng.standard_normal((draws, len(g)))
        u = rng.chisquare(df, (draws, len(g))) / df
        wz = 1 / u
        null += np.sum(wz * (z - (np.sum(wz * z, 1) / np.sum(wz, 1))[:, None]) ** 2, 1)
        q_obs += q
        per[str(comp)] = {"Q": q, "sets": len(g)}
    if not per:
        return {"Q": math.nan, "expected": math.nan, "p": math.nan, "side": "", "per_component": per,
                "passes": False, "why": "no component with two finite intervals"}
    lo_p, hi_p = float(np.mean(null <= q_obs)), float(np.mean(null >= q_obs))
    p = min(1.0, 2 * min(lo_p, hi_p))
    side = "" if p >= VARIANCE_ALPHA else ("too wide" if lo_p < hi_p else "too narrow")
    exp = float(np.mean(null))
    why = (f"set means scatter Q = {q_obs:.3g} against {exp:.3g} expected under correct intervals over "
           f"{len(per)} component(s), two-sided p = {p:.2g}" + (f": intervals {side}" if side else ""))
    return {"Q": q_obs, "expected": exp, "p": p, "side": side, "per_component": per, "passes": p >= VARIANCE_ALPHA,
            "why": why}


def verdict_counts(sets: pd.DataFrame) -> dict[str, int]:
    """{set: how many of its components (and TOTAL) carry a gain or loss verdict}."""
    return {str(k): int((g["verdict"] != "none").sum()) for k, g in sets.groupby("set", sort=False)}


def pairs(sets: pd.DataFrame) -> pd.DataFrame:
    """Every component's pairs of sets: |Δ ln M|, the combined half-width, and whether the pair lies within
    it, flips (gain vs loss) or has intervals wholly on opposite sides of 1. A pair with a missing
    interval (not estimable at one set) counts as not within."""
    missing = [c for c in SET_COLUMNS if c not in sets]
    if missing:
        raise ValueError(f"per-set table lacks column(s) {missing}; allowed values: a table with {list(SET_COLUMNS)}")
    bad = sorted(set(sets["verdict"]) - set(VERDICTS))
    if bad:
        raise ValueError(f"verdict values {bad}; allowed values: {', '.join(VERDICTS)}")
    rows = []
    for comp, g in sets.groupby("component", sort=False):
        g = g.set_index("set")
        for a, b in itertools.combinations(list(g.index), 2):
            x, y = g.loc[a], g.loc[b]
            ha, hb = (float(x["hi"]) - float(x["lo"])) / 2, (float(y["hi"]) - float(y["lo"])) / 2
            diff = abs(float(x["est"]) - float(y["est"]))
            comb = math.hypot(ha, hb)
            ok = all(math.isfinite(v) for v in (diff, comb))
            rows.append({"component": comp, "set_a": a, "set_b": b, "diff": diff, "combined_half_width": comb,
                         "ratio": diff / comb if ok and comb > 0 else math.nan,
                         "within": bool(ok and diff <= comb),
                         "flip": {x["verdict"], y["verdict"]} == {"gain", "loss"},
                         "opposite": bool((x["lo"] > 0 and y["hi"] < 0) or (y["lo"] > 0 and x["hi"] < 0))})
    return pd.DataFrame(rows, columns=["component", "set_a", "set_b", "diff", "combined_half_width", "ratio",
                                       "within", "flip", "opposite"])


def summary(p: pd.DataFrame) -> pd.DataFrame:
    """Per component (and "all"): pairs, how many lie within their combined half-widths, the largest
    |Δ| over its combined half-width, flips and opposite-side pairs."""
    def row(name: str, g: pd.DataFrame) -> dict:
        return {"component": name, "pairs": len(g), "within": int(g["within"].sum()),
                "within_frac": float(g["within"].mean()) if len(g) else math.nan,
                "max_ratio": float(np.nanmax(g["ratio"])) if g["ratio"].notna().any() else math.nan,
                "flips": int(g["flip"].sum()), "opposite": int(g["opposite"].sum())}

    out = [row(str(c), g) for c, g in p.groupby("component", sort=False)]
    out.append(row("all", p))
    return pd.DataFrame(out)


def replicates(p: pd.DataFrame, variance: dict | None = None) -> tuple[bool, str]:
    """(True, why) when the answer survives the change of seed: no gain/loss flip, no intervals wholly on opposite
    sides of 1, and (given) the variance test passes; the pairs within their combined half-widths are reported."""
    if not len(p):
        return False, "no pair of seed sets to compare"
    s = summary(p).iloc[-1]
    why = (f"{s['flips']} gain/loss flip(s); {s['opposite']} pair(s) with intervals on opposite sides of 1; "
           f"{s['within']} of {s['pairs']} pairs ({s['within_frac']:.0%}) within their combined 95% half-widths")
    ok = bool(s["flips"] == 0 and s["opposite"] == 0)
    if variance is not None:
        why += f"; variance test: {variance['why']}"
        ok = ok and bool(variance["passes"])
    return ok, why


def findings_rows(a, set_name: str, response: str = "ln_M") -> list[dict]:
    """One study analysis's Findings at C_ref as per-set rows (SET_COLUMNS): per component and the TOTAL
    the value Findings lead with (the observed TOTAL where the model's fails its check), its interval and
    its family-controlled verdict."""
    comp = a.components
    seeds = ",".join(str(int(s)) for s in sorted(a.table["seed"].dropna().unique())) if "seed" in a.table else ""
    rows = []
    for f in [*a.factors, "TOTAL"]:
        c = comp[(comp["response"] == response) & (comp["component"] == f)]
        est, lo, hi = ((float(c.iloc[0][k]) for k in ("shapley", "shapley_lo", "shapley_hi")) if len(c)
                       else (math.nan,) * 3)
        df = float(c.iloc[0]["shapley_df"]) if len(c) and "shapley_df" in c else math.nan
        if f == "TOTAL":
            est, lo, hi, _ = recommended_total(a, response)
        cell = finding(a, response, f)
        verdict = next((v for v in ("gain", "loss") if f": {v}" in cell and not cell.endswith("CPU")), "none")
        rows.append({"set": set_name, "seeds": seeds, "component": f, "est": est, "lo": lo, "hi": hi,
                     "verdict": verdict, "cell": cell, "df": df})
    return rows
