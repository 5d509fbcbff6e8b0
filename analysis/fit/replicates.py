"""Seeds as replicates (docs/method.md §4.4): each seed analysed alone, the between-seed interval, and planted
truths ("Planted truths"). A contrast between arms of one seed cancels the noise its random stream carries, so
the residuals never see it; the scatter of the per-seed estimates measures it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.fit.law_intervals import PROFILE_BOUNDS
from marin_ablate.analysis.io.results import codings
from marin_ablate.analysis.responses import RESPONSES


def planted_truths(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{factor: {response column: true ln multiplier}} from the runs' coding (each response's
    truth_key, analysis/responses.py); a sum response's truth (ln_W = ln_M + ln_R) when all its parts are planted.

    Runs that disagree on a factor's truth (two studies pooled) are refused: the check would be meaningless."""
    seen: dict[str, dict[str, float]] = {}
    for coding, _ in codings(df):
        for name, d in coding.items():
            t = d.get("truth")
            if not t:
                continue
            column_of = {r.truth_key: r.column for r in RESPONSES.values() if r.truth_key}
            lnt = {column_of[k]: math.log(float(v)) for k, v in t.items() if k in column_of}
            for r in RESPONSES.values():
                cols = [RESPONSES[q].column for q in r.parts]
                if cols and all(c in lnt for c in cols):
                    lnt[r.column] = sum(lnt[c] for c in cols)
            if name in seen and seen[name] != lnt:
                raise ValueError(f"factor {name!r}: the runs record two different planted truths "
                                 f"({seen[name]} and {lnt}); analyse one study at a time")
            seen[name] = lnt
    return seen


def truth_check(components: pd.DataFrame, truths: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Per planted factor and response: truth, the recommended (Shapley) estimate and interval, covered?"""
    rows = []
    for f, t in truths.items():
        for resp, lnt in t.items():
            c = (components[(components["response"] == resp) & (components["component"] == f)] if len(components)
                 else components)
            est, lo, hi, se = ((float(c.iloc[0][k]) for k in ("shapley", "shapley_lo", "shapley_hi", "shapley_se"))
                               if len(c) else (np.nan,) * 4)
            ok = bool(len(c)) and bool(c.iloc[0]["shapley_estimable"]) and math.isfinite(lo) and math.isfinite(hi)
            rows.append({"factor": f, "response": resp, "truth": lnt, "estimate": est, "lo": lo, "hi": hi, "se": se,
                         "estimable": ok, "covers": bool(ok and lo <= lnt <= hi), "error": est - lnt})
    return pd.DataFrame(rows, columns=["factor", "response", "truth", "estimate", "lo", "hi", "se", "estimable",
                                       "covers", "error"])


#: Seeds needed before each component's own between-seed interval is used. Two give a t interval on one df
#: (t = 12.7): wide, but exact under normal seed effects, so two seeds are never silently one (docs/method.md §4.4).
BETWEEN_SEEDS_MIN = 2


#: Seeds analysed alone for the between-seed interval when no truth is planted: beyond it the first ones
#: (by seed) stand for all (an interval t(K−1)·sd/√K over fewer seeds is wider: conservative), so a table of
#: a thousand seeds costs 32 analyses, not a thousand (a 20,000-row table ran over 30 min).
REPLICATE_SEEDS_MAX = 32


@dataclass(frozen=True)
class Stein:
    """Stein's two-stage rule as a study ran it (`run --until`, docs/method.md §4.11): a named value's interval at
    C_ref is est ± t(n0 − 1)·s0/√N, s0 the sd of its n0 pilot estimates and N the seeds in the table (Stein 1945).
    `components` () names every component and the TOTAL."""

    pilot: tuple[int, ...]
    components: tuple[str, ...] = ()
    n_seeds: int = 0  # N, the seeds in the analysed table (set by the pipeline)

    def names(self, component: str) -> bool:
        return not self.components or component in self.components


def per_seed_analyses(df: pd.DataFrame, analyze: Callable[[pd.DataFrame], Any],
                      limit: int | None = None, first: Sequence[int] = ()) -> dict[int, Any]:
    """{seed: that seed's runs analysed alone (a StudyAnalysis)}, or the reason the analysis refused them;
    the seeds in `first` (a Stein pilot) and then the first `limit` seeds when a limit is given."""
    seeds = [int(s) for s in sorted(df["seed"].dropna().unique())]
    chosen = [s for s in first if s in seeds]
    chosen += [s for s in seeds if s not in chosen][:None if limit is None else max(limit - len(chosen), 0)]
    out: dict[int, Any] = {}
    for seed in sorted(chosen):
        try:
            out[seed] = analyze(df[df["seed"] == seed])
        except ValueError as e:
            out[seed] = str(e)
    return out


def t_half(values: list[float], level: float) -> float:
    """Half-width of the between-seed t interval of the mean, statsmodels' DescrStatsW.tconfint_mean."""
    from statsmodels.stats.weightstats import DescrStatsW

    lo, hi = DescrStatsW(np.asarray(values, float)).tconfint_mean(alpha=1 - level)
    return float(hi - lo) / 2


def between_seed_law(law, per_seed: dict[int, Any], level: float = 0.95) -> list[str]:
    """Widens the law's L∞ and α intervals to at least est ± t(K−1)·sd/√K over the K seeds whose own fit identifies
    both (docs/method.md §4.4), within the parameters' ranges. Returns the parameters widened."""
    laws = [a.law for a in per_seed.values() if not isinstance(a, str) and a.law is not None
            and not {"linf", "alpha"} & set(a.law.not_identified)]
    widened = []
    for k in ("linf", "alpha"):
        v = [float(getattr(x, k)) for x in laws if k not in x.pinned]
        if k not in law.profile or len(v) < BETWEEN_SEEDS_MIN:
            continue
        half, est = t_half(v, level), float(getattr(law, k))
        lo, hi = law.profile[k]
        new = (max(min(lo, est - half), PROFILE_BOUNDS[k][0]), max(hi, est + half))
        if new != (lo, hi):
            law.profile[k] = new
            widened.append(k)
    return widened


def seed_estimates(per_seed: dict[int, Any], table_of: Callable[[Any], pd.DataFrame | None]
                   ) -> dict[int, dict[tuple[str, str], float]]:
    """{seed: {(response, component): its estimable Shapley value}} of each seed's own `table_of(analysis)`
    (the components at C_ref, or the extrapolation); the first row of a key counts."""
    out = {}
    for seed, a in per_seed.items():
        c = None if isinstance(a, str) else table_of(a)
        e: dict = {}
        if c is not None and len(c):
            for key, v in zip(zip(c["response"], c["component"], strict=True),
                              c["shapley"].where(c["shapley_estimable"]), strict=True):
                if key not in e and not math.isnan(v):
                    e[key] = float(v)
        out[seed] = e
    return out


def seed_half(values: Sequence[float], se_law: float, level: float, pilot: Sequence[float] | None = None,
              n_seeds: int | None = None) -> tuple[float, int]:
    """(half-width, df) of the between-seed interval of K per-seed estimates: t(K−1)·√(s²/K + se_law²), s their sd
    and se_law the shared law's standard error (the pinned law every seed reads its multipliers through, which their
    scatter cannot see); with a Stein `pilot` (n0 estimates) and `n_seeds` N, t(n0−1)·√(s0²/N + se_law²)."""
    v, n = (list(pilot), int(n_seeds or len(values))) if pilot is not None else (list(values), len(values))
    df = len(v) - 1
    return float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(float(np.var(v, ddof=1)) / n + se_law**2), df


def between_seed_interval(components: pd.DataFrame, per_seed: dict[int, Any], level: float = 0.95,
                          table_of: Callable[[Any], pd.DataFrame | None] = lambda a: a.components,
                          stein: Stein | None = None, widen_only: bool = False) -> pd.DataFrame:
    """Each Shapley interval from the K ≥ BETWEEN_SEEDS_MIN seeds that estimate it, each analysed alone (docs/method.md
    §4.4, *The component × seed error term*): est ± `seed_half` (Stein's for a value a `run --until` study named), its
    verdict's p read on K − 1 df. `widen_only`: keep the model interval where wider (an extrapolation, whose law-form
    spread the seeds cannot see). Adds shapley_se_between, between_seeds, shapley_model_lo/hi and shapley_df;
    `table_of` picks each seed's table matching `components` (C_ref or an extrapolation)."""
    out = components.copy()
    out["shapley_se_between"], out["between_seeds"] = np.nan, 0
    out["shapley_model_lo"], out["shapley_model_hi"] = out["shapley_lo"], out["shapley_hi"]  # the pooled model's
    est = seed_estimates(per_seed, table_of)
    for i, r in out.iterrows():
        key = (r["response"], r["component"])
        v = [e[key] for e in est.values() if key in e]
        out.at[i, "between_seeds"] = len(v)
        if len(v) < BETWEEN_SEEDS_MIN or not r["shapley_estimable"]:
            continue
        pilot = [est[s][key] for s in stein.pilot if key in est.get(s, {})] if stein else []
        law = float(r.get("shapley_se_law", 0.0) or 0.0)
        if stein is not None and stein.names(r["component"]) and len(pilot) == len(stein.pilot) >= 2:
            half, df = seed_half(v, law, level, pilot, stein.n_seeds)
        else:
            half, df = seed_half(v, law, level)
        out.at[i, "shapley_se_between"] = float(np.std(v, ddof=1)) / math.sqrt(len(v))
        lo, hi = r["shapley"] - half, r["shapley"] + half
        if widen_only and lo >= r["shapley_lo"]:
            continue
        if "shapley_df" in out:
            out.at[i, "shapley_df"] = df  # the seeds' t: so is its verdict's p
        out.at[i, "shapley_lo"] = min(r["shapley_lo"], lo) if widen_only else lo
        out.at[i, "shapley_hi"] = max(r["shapley_hi"], hi) if widen_only else hi
    return out


def between_seed_per_rung(per_rung: pd.DataFrame, per_seed: dict[int, Any], level: float = 0.95) -> pd.DataFrame:
    """Each per-rung value's interval from the K ≥ BETWEEN_SEEDS_MIN seeds whose own analysis estimates it
    (`seed_half`), as at C_ref (docs/method.md §4.4)."""
    out = per_rung.copy()
    if not len(out):
        return out
    key = ["response", "component", "rung"]
    est: dict = {}
    for a in per_seed.values():
        if isinstance(a, str) or not len(a.per_rung):
            continue
        for k, v in zip(a.per_rung[key].itertuples(index=False, name=None), a.per_rung["effect"], strict=True):
            if math.isfinite(v):
                est.setdefault(k, []).append(float(v))
    for i, k in zip(out.index, out[key].itertuples(index=False, name=None), strict=True):
        v, e = est.get(k, []), out.at[i, "effect"]
        if len(v) < BETWEEN_SEEDS_MIN or not math.isfinite(e):
            continue
        half = seed_half(v, float(out.at[i, "se_law"]) if "se_law" in out else 0.0, level)[0]
        out.at[i, "lo"], out.at[i, "hi"] = e - half, e + half
    return out


def replicate_checks(per_seed: dict[int, Any], truths: dict[str, dict[str, float]]) -> pd.DataFrame:
    """`truth_check` of every seed analysed alone. A replicate the analysis refused is kept, every
    number not estimable, with the reason."""
    rows = []
    for seed, a in per_seed.items():
        ok = not isinstance(a, str)
        tc = truth_check(a.components if ok else pd.DataFrame(), truths)
        tc["note"] = "" if ok else a
        tc.insert(0, "replicate", seed)
        rows.append(tc)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for k successes in n trials."""
    from statsmodels.stats.proportion import proportion_confint

    if n == 0:
        return (np.nan, np.nan)
    lo, hi = proportion_confint(k, n, alpha=1 - level, method="beta")
    return float(lo), float(hi)


def coverage_summary(reps: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per planted factor and response over the replicates: how many intervals cover the truth (a
    replicate whose number is not estimable does not count as covering), the coverage's exact
    interval, the mean estimate, the largest error, and the scatter of the estimates over the mean
    standard error the replicates report (≈ 1 when the intervals are as wide as the noise)."""
    rows = []
    for (f, resp), g in reps.groupby(["factor", "response"], sort=False):
        est = g.loc[g["estimable"], "estimate"].to_numpy(float)
        se = g.loc[g["estimable"], "se"].to_numpy(float)
        k, n = int(g["covers"].sum()), len(g)
        lo, hi = clopper_pearson(k, n, level)
        sd = float(np.std(est, ddof=1)) if len(est) >= 2 else np.nan
        rows.append({"factor": f, "response": resp, "truth": float(g["truth"].iloc[0]), "replicates": n,
                     "not_estimable": int((~g["estimable"]).sum()), "covered": k, "coverage": k / n if n else np.nan,
                     "coverage_lo": lo, "coverage_hi": hi, "mean_estimate": float(est.mean()) if len(est) else np.nan,
                     "max_abs_error": float(np.max(np.abs(est - g["truth"].iloc[0]))) if len(est) else np.nan,
                     "sd_estimates": sd, "mean_se": float(se.mean()) if len(se) else np.nan,
                     "sd_over_se": sd / float(se.mean()) if len(se) and se.mean() > 0 else np.nan})
    return pd.DataFrame(rows)
