"""Does the main job's answer survive a change of seed? The arithmetic of benchmarks/seed_replication.py.

The same study is run at K disjoint seed sets. Each set's Findings give, per component and the TOTAL, an
estimate of ln M with its 95% interval and a verdict (gain / loss / none). Two sets agree on a component
when their estimates differ by no more than the combined half-width √(h_i² + h_j²) (h the ln-scale
half-width: the half-width of the difference of two independent estimates), their verdicts are not
"gain" at one and "loss" at the other, and their intervals do not lie wholly on opposite sides of 1.
The study's answer replicates (docs/method.md §4.4) when at least `WITHIN_MIN` of all pairs agree in the
first sense and no pair flips or lies on opposite sides. No torch import.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

#: The fraction of (component, set pair) differences that must lie within their combined half-widths.
WITHIN_MIN = 0.95
#: Columns of a per-set table: one row per (set, component), ln-scale estimate and interval.
SET_COLUMNS = ("set", "seeds", "component", "est", "lo", "hi", "verdict")
VERDICTS = ("gain", "loss", "none")


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


def replicates(p: pd.DataFrame, within_min: float = WITHIN_MIN) -> tuple[bool, str]:
    """(True, why) when the answer survives the change of seed: at least `within_min` of all pairs within
    their combined half-widths, no gain/loss flip, no intervals wholly on opposite sides of 1."""
    if not len(p):
        return False, "no pair of seed sets to compare"
    s = summary(p).iloc[-1]
    why = (f"{s['within']} of {s['pairs']} pairs ({s['within_frac']:.0%}) within their combined 95% half-widths "
           f"(needed {within_min:.0%}); {s['flips']} gain/loss flip(s); {s['opposite']} pair(s) with intervals on "
           "opposite sides of 1")
    return bool(s["within_frac"] >= within_min and s["flips"] == 0 and s["opposite"] == 0), why


def findings_rows(a, set_name: str, response: str = "ln_M") -> list[dict]:
    """One study analysis's Findings at C_ref as per-set rows (SET_COLUMNS): per component and the TOTAL
    the value Findings lead with (the observed TOTAL where the model's fails its check), its interval and
    its family-controlled verdict."""
    from marin_ablate.analysis.report.findings import finding, recommended_total

    comp = a.components
    seeds = ",".join(str(int(s)) for s in sorted(a.table["seed"].dropna().unique())) if "seed" in a.table else ""
    rows = []
    for f in [*a.factors, "TOTAL"]:
        if f == "TOTAL":
            est, lo, hi, _ = recommended_total(a, response)
        else:
            c = comp[(comp["response"] == response) & (comp["component"] == f)]
            est, lo, hi = ((float(c.iloc[0][k]) for k in ("shapley", "shapley_lo", "shapley_hi")) if len(c)
                           else (math.nan,) * 3)
        cell = finding(a, response, f)
        verdict = next((v for v in ("gain", "loss") if f": {v}" in cell and not cell.endswith("CPU")), "none")
        rows.append({"set": set_name, "seeds": seeds, "component": f, "est": est, "lo": lo, "hi": hi,
                     "verdict": verdict, "cell": cell})
    return rows
