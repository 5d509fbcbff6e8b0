"""The report's tables of multipliers: the attribution table (Shapley, LOO, AOI, per response), the per-rung
table, the paired per-rung section, and which of their columns carry information for a design (`informative`):
what a design cannot estimate is left out and said once (docs/report.md)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from marin_ablate.analysis.fit.replicates import BETWEEN_SEEDS_MIN
from marin_ablate.analysis.pipeline import StudyAnalysis
from marin_ablate.analysis.report.findings import qualified_text
from marin_ablate.analysis.responses import RESPONSES, law_column


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, (float, np.floating)):
        a = abs(v)
        return f"{v:.{digits}g}" if (a >= 1e4 or (a < 1e-3 and a > 0)) else f"{v:.{digits}f}"
    return str(v)


def md_table(df: pd.DataFrame, digits: int = 3) -> str:
    if df is None or not len(df):
        return "_(empty)_\n"
    cols = list(df.columns)
    out = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(_fmt(v, digits).replace("|", "/") for v in row) + " |")
    return "\n".join(out) + "\n"


def _exp(x: float) -> str:
    """exp(x) as a multiplier; an estimate past float range (a degenerate fit) reads as such, not a crash."""
    try:
        return f"{math.exp(x):.3f}"
    except OverflowError:
        return "> 1e308"


def mult_text(est, lo, hi) -> str:
    """exp(est) [exp(lo), exp(hi)]: a ln-scale estimate and interval as a multiplier; "not estimable" without one."""
    if not (isinstance(est, float) and math.isfinite(est)):
        return "not estimable"
    s = _exp(est)
    if isinstance(lo, float) and math.isfinite(lo):
        s += f" [{_exp(lo)}, {_exp(hi)}]"
    return s


def attribution_table(a: StudyAnalysis, components: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per component: quality (Shapley, LOO, AOI), throughput and wall-clock multipliers."""
    comp = a.components if components is None else components
    rows = []
    for f in a.factors + ["TOTAL"]:
        row = {"component": f}
        for r in RESPONSES.values():
            resp, label = r.column, r.symbol
            # no fit estimable (e.g. a loss of 1e308 overflows every law): no component rows, each cell n/a
            c = comp[(comp["response"] == resp) & (comp["component"] == f)] if "response" in comp else comp
            if not len(c):
                row[label] = "n/a"
                continue
            c = c.iloc[0]
            row[label] = mult_text(c["shapley"], c["shapley_lo"], c["shapley_hi"])
            if r.family == "law":
                row["M_flop boot CI"] = (
                    mult_text(c["shapley"], c["shapley_boot_lo"], c["shapley_boot_hi"]).split(" ", 1)[-1]
                    if math.isfinite(c.get("shapley_boot_lo", np.nan)) else "—")
                for k in ("loo", "aoi"):
                    row[f"M_flop {k.upper()}"] = mult_text(c[k], c[f"{k}_lo"], c[f"{k}_hi"]) if f != "TOTAL" else ""
                row["aliased"] = "yes (see Appendix)" if (c.get("aliased_with", "") or "") else ""
        rows.append(row)
    out = pd.DataFrame(rows)
    # intervals that carry the seeds' scatter: a bootstrap over runs does not see it (the appendix keeps it)
    out.attrs["seed_widened"] = bool((comp.get("between_seeds", pd.Series(dtype=float)) >= BETWEEN_SEEDS_MIN).any())
    return out


#: Attribution columns a design can leave not estimable for every component
CONTRAST_COLUMNS = ("M_flop LOO", "M_flop AOI")


def informative(tab: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """`tab` without the leave-one-out / add-one-in columns that no component of this design can estimate,
    and the one sentence that says why they are absent (None when every column stays)."""
    comp = tab[tab["component"] != "TOTAL"] if "component" in tab else tab
    gone = [c for c in CONTRAST_COLUMNS if c in tab and len(comp) and comp[c].eq("not estimable").all()]
    said = []
    if gone:
        why = ("they need two-factor interactions this design aliases with others (the alias groups are in the "
               "Appendix)" if "aliased" in tab and (tab["aliased"] != "").any()
               else "this design's runs do not reach the arms they compare")
        said.append(f"{' and '.join(c.removeprefix('M_flop ') for c in gone)} are left out: not estimable for any "
                    f"component, as {why}; Shapley is.")
    if tab.attrs.get("seed_widened") and "M_flop boot CI" in tab:
        gone.append("M_flop boot CI")
        said.append("The bootstrap interval is left out here: it resamples runs, so it cannot see how an effect "
                    "moves from seed to seed, which these intervals carry (the Appendix keeps it).")
    return (tab.drop(columns=gone), " ".join(said)) if said else (tab, None)


def per_rung_table(a: StudyAnalysis) -> pd.DataFrame:
    d = a.per_rung
    if not len(d):
        return d
    d = d[d["response"] == law_column()]
    piv = {}
    for r in d.itertuples():
        piv.setdefault(r.component, {})[f"{r.rung} ({r.compute:.2g})"] = (
            "not varied here" if not getattr(r, "varied", True) else mult_text(r.effect, r.lo, r.hi) if r.estimable
            else "not estimable")
    return pd.DataFrame([{"component": k, **v} for k, v in piv.items()])


def paired_section(a: StudyAnalysis) -> list[str]:
    """Findings per rung: each component's paired estimate (its arms against the same rung's arms that differ
    in it alone, through the law's local inverse: the authors' convention) beside the scale model's value."""
    p = a.paired
    if p is None or not len(p) or not (p["pairs"] > 0).any():
        return []
    model = (a.per_rung[a.per_rung["response"] == law_column()].set_index(["component", "rung"])
             if len(a.per_rung) else None)
    # only the components and rungs that hold a same-rung pair: the others would be a table of "no pair"
    has = p[p["pairs"] > 0]
    rungs, comps = set(has["rung"]), list(dict.fromkeys(has["component"]))
    rows = []
    for comp in comps:
        row = {"component": comp}
        for r in p[(p["component"] == comp) & p["rung"].isin(rungs)].itertuples():
            m = model.loc[(comp, r.rung)] if model is not None and (comp, r.rung) in model.index else None
            ms = (qualified_text(m["effect"], m["lo"], m["hi"]) if m is not None and bool(m.get("estimable", True))
                  and bool(m.get("varied", True)) else "—")
            row[f"{r.rung}"] = (f"paired {qualified_text(r.paired, r.paired_lo, r.paired_hi)} · model {ms}" if r.pairs
                                else f"no same-rung pair · model {ms}")
        rows.append(row)
    left = [c for c in dict.fromkeys(p["component"]) if c not in comps]
    out_rungs = [r for r in dict.fromkeys(p["rung"]) if r not in rungs]
    absent = ([f"{', '.join(left)}: no two arms of a rung differ in {'it' if len(left) == 1 else 'any one of them'} "
               "alone"] if left else []) + ([f"rung{'s' * (len(out_rungs) > 1)} {', '.join(out_rungs)}: no such "
                                              "pair"] if out_rungs else [])
    return ["Per rung, quality M_flop paired (each arm against the same rung's arm that differs from it in this "
            "component alone, through the law's local inverse — the per-rung convention of published ladders; "
            "mean over such pairs) beside the scale model's smoothed value."
            + (f" Left out ({'; '.join(absent)}): their per-rung values are the scale model's, in the per-rung "
               "table below." if absent else ""), "", md_table(pd.DataFrame(rows)), ""]
