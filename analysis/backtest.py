"""Backtests: how far does a small-scale answer travel? (docs/method.md §4.10)

Refit on rungs 1..k (k from `min_rungs` to n − 1), extrapolate each component's quality multiplier and the TOTAL
to every later rung, and score each prediction against what that rung measured (its paired per-rung estimate, or
its runs analysed alone): the ratio error, coverage |e| ≤ √(h_pred² + h_meas²), agreement of the verdicts and
Kendall's τ of the ranking. With 3–4 rungs a handful of correlated checks: weak evidence either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.fit.attribution import component_table
from marin_ablate.analysis.fit.checks import WIDE_RATIO
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.responses import law, law_column

#: The fewest rungs a backtest fit may use: one rung has no factor × log C term, so nothing to extrapolate.
MIN_RUNGS = 2
#: Below this many scored (fit, later rung) pairs the summary calls the backtest weak evidence.
WEAK_PAIRS = 4
#: analyze_table options a backtest passes through unchanged (the rest it sets itself).
FIT_OPTIONS = ("pin_linf", "pin_alpha", "hc", "mixed", "interactions", "third_levels", "level", "law_forms",
               "pinned_law", "stein")


def verdict(lo: float, hi: float) -> str:
    """gain / loss / no effect from a ln-scale interval, unadjusted ('' when there is none)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    return "gain" if lo > 0 else "loss" if hi < 0 else "no effect"


def score(rows: pd.DataFrame) -> pd.DataFrame:
    """The scores of prediction rows (columns pred, pred_lo, pred_hi, meas, meas_lo, meas_hi, ln scale):
    error, covered (|error| ≤ √(h_pred² + h_meas²), half-widths on the sides facing each other; None
    where either has no interval), inside (the measured point in the predicted interval), each side's
    verdict and their agreement."""
    out = rows.copy()
    p, plo, phi = (out[c].to_numpy(float) for c in ("pred", "pred_lo", "pred_hi"))
    m, mlo, mhi = (out[c].to_numpy(float) for c in ("meas", "meas_lo", "meas_hi"))
    err = p - m
    h_p = np.where(err > 0, p - plo, phi - p)  # the prediction's side facing the measurement
    h_m = np.where(err > 0, mhi - m, m - mlo)
    ok = np.isfinite(err) & np.isfinite(h_p) & np.isfinite(h_m)
    with np.errstate(invalid="ignore"):
        out["error"] = err
        out["bound"] = np.where(ok, np.hypot(h_p, h_m), np.nan)
        out["covered"] = [bool(abs(e) <= b) if k else None for e, b, k in zip(err, out["bound"], ok, strict=True)]
        out["inside"] = [bool(lo <= v <= hi) if k else None for v, lo, hi, k in zip(m, plo, phi, ok, strict=True)]
    out["pred_verdict"] = [verdict(lo, hi) for lo, hi in zip(plo, phi, strict=True)]
    out["meas_verdict"] = [verdict(lo, hi) for lo, hi in zip(mlo, mhi, strict=True)]
    out["agree"] = [(a == b) if a and b else None for a, b in zip(out["pred_verdict"], out["meas_verdict"],
                                                                   strict=True)]
    return out


def kendall_tau(pred: np.ndarray, meas: np.ndarray) -> float:
    """Kendall's τ-b between the predicted and measured values of the components (NaN below 3 pairs)."""
    ok = np.isfinite(pred) & np.isfinite(meas)
    return float(stats.kendalltau(pred[ok], meas[ok]).statistic) if ok.sum() >= 3 else float("nan")


@dataclass
class Backtest:
    """Every (k, target rung, component) prediction with its scores (`rows`), one row per (k, target)
    (`pairs`: scored, covered, agreed, τ), and why a k or a value was not scored (`notes`)."""

    rows: pd.DataFrame
    pairs: pd.DataFrame
    rungs: list[str]  # the ladder, compute order
    level: float
    notes: list[str] = field(default_factory=list)

    def by_component(self) -> pd.DataFrame:
        """Per component (TOTAL last): scored predictions, how many were covered, decisions agreed, and the
        median ratio error exp|e|."""
        r = self.rows[self.rows["covered"].notna()]
        out = []
        for comp in dict.fromkeys(self.rows["component"]):
            g = r[r["component"] == comp]
            out.append({"component": comp, "scored": len(g), "covered": int(g["covered"].sum()),
                        "agreed": int(g["agree"].fillna(False).sum()),
                        "median ratio error": float(np.exp(np.median(np.abs(g["error"])))) if len(g) else np.nan})
        return pd.DataFrame(out)

    def predictions(self) -> pd.DataFrame:
        """Every prediction beside its measurement, as multipliers: fit, rung, component, predicted [interval],
        measured [interval] (its source), ratio error exp(e), covered, the two verdicts."""
        return pd.DataFrame([{"fitted on": f"{x.k} rungs", "rung": x.target_rung, "component": x.component,
                              "predicted": _mult(x.pred, x.pred_lo, x.pred_hi),
                              "measured": _mult(x.meas, x.meas_lo, x.meas_hi) + (f" ({x.meas_source})"
                                                                                 if x.meas_source else ""),
                              "ratio": f"{_exp(x.error):.3f}" if math.isfinite(x.error) else "—",
                              "covered": "—" if x.covered is None else "yes" if x.covered else "NO",
                              "verdicts": f"{x.pred_verdict or '—'} / {x.meas_verdict or '—'}"}
                             for x in self.rows.itertuples()])

    def _widest(self) -> pd.DataFrame:
        """The scored predictions of the widest fit at the nearest rung it was scored on (normally k + 1)."""
        r = self.rows[self.rows["covered"].notna()]
        if not len(r):
            return r
        k = int(r["k"].max())
        j = int(r[r["k"] == k]["target"].min())
        return r[(r["k"] == k) & (r["target"] == j)]

    def summary(self) -> str:
        """One line: the widest fit's record at the next rung, the record over every (fit, later rung)
        pair, and, when few pairs were scored, that this is weak evidence."""
        r = self.rows[self.rows["covered"].notna()]
        nx = self._widest()
        if not len(nx):
            return f"over {len(self.rungs)} rungs nothing was scored ({'; '.join(self.notes) or 'no fit'})"
        k, j = int(nx["k"].iloc[0]), int(nx["target"].iloc[0])
        tau = self.pairs[(self.pairs["k"] == k) & (self.pairs["target"] == j)]["tau"]
        tau_s = f", Kendall's τ of the ranking {tau.iloc[0]:.2f}" if len(tau) and math.isfinite(tau.iloc[0]) else ""
        miss = nx[~nx["covered"].astype(bool)]
        wide = nx[nx["covered"].astype(bool) & (np.exp(nx["pred_hi"] - nx["pred_lo"]) > WIDE_RATIO)]
        line = (f"fitted on {k} rungs, the model's predictions at rung {j} ({nx['target_rung'].iloc[0]}) "
                f"covered {int(nx['covered'].sum())} of {len(nx)} values ({_what(nx)}"
                + (f"; {' and '.join(wide['component'])} only by an interval spanning over {WIDE_RATIO:g}x"
                   if len(wide) else "")
                + f") and agreed on {int(nx['agree'].fillna(False).sum())} of {len(nx)} decisions{tau_s}")
        if len(miss):
            line += "; missed: " + ", ".join(f"{x.component} (predicted {_exp(x.pred):.3g}x, measured "
                                             f"{_exp(x.meas):.3g}x)" for x in miss.itertuples())
        n_pairs = int(self.pairs["scored"].gt(0).sum())
        if n_pairs > 1:
            line += (f"; over all {n_pairs} (fit, later rung) pairs: covered {int(r['covered'].sum())} of {len(r)}, "
                     f"agreed on {int(r['agree'].fillna(False).sum())} of {len(r)}")
        if n_pairs < WEAK_PAIRS:
            line += (f" — {len(self.rungs)} rungs give {n_pairs} such pair{'s' if n_pairs > 1 else ''} sharing "
                     "runs: weak evidence, a miss says more than a hit")
        return line

    def failed(self) -> bool:
        """Some prediction of the widest fit at the next rung was not covered."""
        nx = self._widest()
        return bool(len(nx)) and bool((~nx["covered"].astype(bool)).any())


def _exp(v: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.exp(v))


def _mult(est: float, lo: float, hi: float) -> str:
    if not math.isfinite(est):
        return "—"
    return f"{_exp(est):.3f}" + (f" [{_exp(lo):.3f}, {_exp(hi):.3f}]" if math.isfinite(lo) and math.isfinite(hi)
                                 else " (no interval)")


def _what(nx: pd.DataFrame) -> str:
    n = int((nx["component"] != "TOTAL").sum())
    return f"{n} component{'s' if n != 1 else ''}" + (" and TOTAL" if (nx["component"] == "TOTAL").any() else "")


def rung_labels(raw: pd.DataFrame, full) -> pd.Series:
    """Each raw run's rung as the full analysis named it (its own `rung` column, or the analysed runs'
    labels by row; a run the analysis left out and that names no rung gets none)."""
    if "rung" in raw and raw["rung"].notna().all():
        return raw["rung"].astype(str)
    return raw.index.to_series().map(full.table["rung"].astype(str))


def measured_at(raw: pd.DataFrame, full, rung: str, fit_kw: dict) -> pd.DataFrame:
    """What rung `rung` measured per component and TOTAL (ln scale): the full analysis's paired estimate
    where same-rung pairs ran, else rung `rung`'s runs analysed alone (main effects; L∞ and α pinned at the
    full ladder's law, or its pinned law). Columns component, meas, meas_lo, meas_hi, source, why (what left a
    value unmeasured). TOTAL only with two or more factors (with one it is that factor's value again)."""
    comps = [*full.factors, "TOTAL"] if len(full.factors) > 1 else list(full.factors)
    out = pd.DataFrame({"component": comps, "meas": np.nan, "meas_lo": np.nan, "meas_hi": np.nan, "source": "",
                        "why": "no same-rung pair, and no quality fit to analyse the rung alone with"})
    p = full.paired if full.paired is not None and len(full.paired) else None
    if p is not None:
        g = p[(p["rung"].astype(str) == rung) & (p["pairs"] > 0)].set_index("component")
        for i, c in enumerate(comps):
            if c in g.index:
                x = g.loc[c]
                out.loc[i, ["meas", "meas_lo", "meas_hi"]] = [x["paired"], x["paired_lo"], x["paired_hi"]]
                out.loc[i, "source"] = "paired"
    need = out["source"] == ""
    jf = full.joint.get("power")
    if need.any() and jf is not None:
        sub = raw[rung_labels(raw, full) == rung]
        kw = {k: v for k, v in fit_kw.items() if k in ("hc", "third_levels", "level", "pinned_law")}
        if kw.get("pinned_law") is None:
            kw.update(pin_linf=jf.linf, pin_alpha=jf.alpha)
        try:
            ra = analyze_table(sub, n_boot=0, boot_method="none", replicates=False, responses=(law().name,),
                               interactions=False, law_forms=("power",), factors=None, **kw)
        except ValueError as e:
            out.loc[need, "why"] = f"no same-rung pair, and its runs alone cannot be analysed ({e})"
            return out
        c = ra.components
        c = c[c["response"] == law_column()].set_index("component") if len(c) else c
        for i in np.flatnonzero(need.to_numpy()):
            comp = comps[i]
            if comp == "TOTAL" and set(ra.factors) != set(full.factors):  # the TOTAL of fewer factors is another
                out.loc[i, "why"] = (f"no all-on/all-off pair, and its runs vary only {', '.join(ra.factors)}: "
                                     "their TOTAL is not the study's")
            elif comp in c.index and bool(c.loc[comp, "shapley_estimable"]):
                x = c.loc[comp]
                out.loc[i, ["meas", "meas_lo", "meas_hi"]] = [x["shapley"], x["shapley_lo"], x["shapley_hi"]]
                out.loc[i, "source"] = "rung alone"
            else:
                out.loc[i, "why"] = "no same-rung pair, and not estimable from its runs alone (not varied there?)"
    return out


def power_interval(a, compute: float) -> pd.DataFrame:
    """The power-law fit's own interval of each component's Shapley value (TOTAL too) at `compute`: what the
    pipeline's extrapolation holds before it takes the union with the curved law form's interval
    (`analyze_table`, docs/method.md §4.4). Index component; columns shapley_lo, shapley_hi."""
    name = law().name
    fit = a.reduced.get(name, a.fits.get(name))
    if fit is None:
        return pd.DataFrame(columns=["shapley_lo", "shapley_hi"])
    t = component_table(fit, float(np.log(compute / a.c_ref)), a.level)
    return t.set_index("component")[["shapley_lo", "shapley_hi"]]


def backtest(raw: pd.DataFrame, full, *, min_rungs: int = MIN_RUNGS, **fit_kw) -> Backtest:
    """Refit on rungs 1..k for k = min_rungs..n−1 and score each later rung's predictions (module docstring).
    `full`: the analysis of the whole table (its rungs, law and paired estimates); `fit_kw`: the options it
    was fitted with (FIT_OPTIONS), passed to every refit."""
    bad = [k for k in fit_kw if k not in FIT_OPTIONS]
    if bad:
        raise ValueError(f"backtest options {bad}; allowed values: {', '.join(FIT_OPTIONS)}")
    rungs = [str(r) for r in full.rungs["rung"]]
    computes = [float(c) for c in full.rungs["compute"]]
    if not (isinstance(min_rungs, int) and min_rungs >= MIN_RUNGS):
        raise ValueError(f"--backtest.min_rungs {min_rungs!r}; allowed values: an integer >= {MIN_RUNGS}")
    if len(rungs) < min_rungs + 1:
        raise ValueError(f"--backtest needs a ladder of at least {min_rungs + 1} rungs (a fit on {min_rungs} and a "
                         f"later rung to score it on); this study has {len(rungs)} ({', '.join(rungs)}); allowed "
                         f"values: a study with >= {min_rungs + 1} rungs, or a smaller --backtest.min_rungs "
                         f"(>= {MIN_RUNGS})")
    level = float(fit_kw.get("level", full.level))
    labels = rung_labels(raw, full)
    measured = {r: measured_at(raw, full, r, fit_kw) for r in rungs[min_rungs:]}
    rows, pairs, notes = [], [], []
    for k in range(min_rungs, len(rungs)):
        sub = raw[labels.isin(rungs[:k])]
        for j in range(k, len(rungs)):
            try:
                a = analyze_table(sub, n_boot=0, boot_method="none", replicates=False, responses=(law().name,),
                                  target_compute=computes[j], force_extrapolation=True, **fit_kw)
            except ValueError as e:
                notes.append(f"k={k}: not fitted ({e})")
                break
            e = a.extrapolation
            e = e[e["response"] == law_column()].set_index("component") if e is not None and len(e) else None
            if e is None:
                notes.append(f"k={k}: no quality fit on rungs {', '.join(rungs[:k])} "
                             f"({'; '.join(n for n in a.notes if 'law' in n) or 'see the analysis notes'})")
                break
            m = measured[rungs[j]].set_index("component")
            pw = power_interval(a, computes[j])
            block = []
            for comp in m.index:
                x = e.loc[comp] if comp in e.index else None
                pr = (x["shapley"], x["shapley_lo"], x["shapley_hi"]) if x is not None else (np.nan,) * 3
                pp = tuple(pw.loc[comp]) if comp in pw.index and x is not None and math.isfinite(pr[0]) \
                    else (np.nan,) * 2
                block.append({"k": k, "fit_rungs": ",".join(rungs[:k]), "target": j + 1, "target_rung": rungs[j],
                              "compute": computes[j], "component": comp,
                              "pred": pr[0], "pred_lo": pr[1], "pred_hi": pr[2],
                              "pred_lo_power": pp[0], "pred_hi_power": pp[1],
                              "meas": m.loc[comp, "meas"], "meas_lo": m.loc[comp, "meas_lo"],
                              "meas_hi": m.loc[comp, "meas_hi"], "meas_source": m.loc[comp, "source"],
                              "meas_why": "" if m.loc[comp, "source"] else m.loc[comp, "why"]})
            b = score(pd.DataFrame(block))
            rows.append(b)
            s = b[b["covered"].notna()]
            comp_only = b[b["component"] != "TOTAL"]
            pairs.append({"k": k, "target": j + 1, "target_rung": rungs[j], "scored": len(s),
                          "covered": int(s["covered"].sum()), "agreed": int(s["agree"].fillna(False).sum()),
                          "tau": kendall_tau(comp_only["pred"].to_numpy(float), comp_only["meas"].to_numpy(float))})
    rows_df = pd.concat(rows, ignore_index=True) if rows else score(pd.DataFrame(
        columns=["k", "fit_rungs", "target", "target_rung", "compute", "component", "pred", "pred_lo", "pred_hi",
                 "pred_lo_power", "pred_hi_power", "meas", "meas_lo", "meas_hi", "meas_source", "meas_why"],
        dtype=float))
    unscored = rows_df[rows_df["covered"].isna()] if len(rows_df) else rows_df
    for x in unscored.itertuples():
        why = (f"not measured there: {x.meas_why}" if not math.isfinite(x.meas) else
               "no predicted value" if not math.isfinite(x.pred) else "no interval")
        notes.append(f"k={x.k} → {x.target_rung}: {x.component} not scored ({why})")
    return Backtest(rows=rows_df, pairs=pd.DataFrame(pairs, columns=["k", "target", "target_rung", "scored",
                                                                     "covered", "agreed", "tau"]),
                    rungs=rungs, level=level, notes=notes)
