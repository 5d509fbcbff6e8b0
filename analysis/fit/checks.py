"""What a reader must know before trusting a number (docs/method.md §4.4): TOTAL two ways (the model's all-on vs
all-off contrast beside the two arms' own runs at each rung), the pure-error lack-of-fit F test (Box, Hunter &
Hunter 2005, §10), lost runs and the warnings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.fit.attribution import (
    alias_structure,
    build_terms,
    code_table,
    component_contrasts,
    design_matrix,
)
from marin_ablate.analysis.fit.replicates import BETWEEN_SEEDS_MIN
from marin_ablate.analysis.ofat import paired_ln_m
from marin_ablate.analysis.responses import RESPONSES

#: An interval whose multiplier spans more than this ratio (hi/lo) is flagged as uninformative.
WIDE_RATIO = 10.0
#: The factor whose levels are the EP transports, and the mean drop rate above which the report names them.
DROP_FACTOR, DROP_WARN = "ep_transport", 0.01


def _lof(resid: np.ndarray, cells: np.ndarray, dof: int) -> tuple[float, float, int, int]:
    sspe, dpe = 0.0, 0
    for c in pd.unique(cells):
        r = resid[cells == c]
        sspe += float(np.sum((r - r.mean()) ** 2))
        dpe += len(r) - 1
    rss = float(resid @ resid)
    dlof = dof - dpe
    if dpe <= 0 or dlof <= 0 or sspe <= 0:
        return np.nan, np.nan, dlof, dpe
    F = ((rss - sspe) / dlof) / (sspe / dpe)
    return F, float(stats.f.sf(F, dlof, dpe)), dlof, dpe


def total_checks(a, X: np.ndarray) -> pd.DataFrame:
    """Per response and rung: the model TOTAL, the observed all-on vs all-off contrast, whether they agree."""
    t = a.table
    on, off = np.all(X == 1, axis=1), np.all(X == -1, axis=1)
    rows = []
    for resp in (RESPONSES[n] for n in a.fits if RESPONSES[n].total_check and RESPONSES[n].family != "sum"):
        name, col, law_family = resp.name, resp.column, resp.family == "law"
        fit = a.reduced.get(name, a.fits.get(name))
        src = a.joint["power"] if law_family else fit
        resid, dof = src.resid, src.dof
        s = np.sqrt(float(resid @ resid) / max(dof, 1))
        cells = (t["arm"].astype(str) + "|" + t["rung"].astype(str)).to_numpy() if "arm" in t else t["rung"].to_numpy()
        m = np.ones(len(t), bool) if law_family else np.isfinite(t[col].to_numpy(float))
        F, p, dlof, dpe = _lof(resid, cells[m], dof)
        q = float(stats.t.ppf(0.5 + a.level / 2, max(dof, 1)))
        for r in a.rungs.itertuples():
            at = (t["rung"] == r.rung).to_numpy()
            est, se, lo, hi, okc = fit.contrast(component_contrasts(fit, float(r.z))["total"], a.level)
            row = {"response": col, "rung": r.rung, "model": est, "model_lo": lo, "model_hi": hi,
                   "observed": np.nan, "obs_lo": np.nan, "obs_hi": np.nan, "obs_se": np.nan, "agree": None,
                   "lof_F": F, "lof_p": p, "lof_df": f"{dlof}, {dpe}"}
            i_on, i_off = np.flatnonzero(on & at & m), np.flatnonzero(off & at & m)
            if len(i_on) and len(i_off):
                if law_family:
                    obs, se_o = paired_quality(a, i_on, i_off, s)
                else:
                    y = t[col].to_numpy(float)
                    obs = y[i_on].mean() - y[i_off].mean()
                    se_o = s * np.sqrt(1 / len(i_on) + 1 / len(i_off))
                if np.isfinite(obs):
                    row.update(observed=obs, obs_lo=obs - q * se_o, obs_hi=obs + q * se_o, obs_se=se_o)
                    if okc:
                        row["agree"] = bool(abs(est - obs) <= q * np.hypot(se, se_o))
            rows.append(row)
    return pd.DataFrame(rows)


def paired_quality(a, i_on: np.ndarray, i_off: np.ndarray, s: float) -> tuple[float, float]:
    """ln M_flop of the runs i_on against the runs i_off of the same rung through the joint law's local inverse
    (`paired_ln_m`) and its standard error, the law's own uncertainty included (docs/method.md §4.4, *TOTAL two
    ways*); (NaN, NaN) when a mean loss is at or below L∞."""
    t, jf = a.table, a.joint["power"]
    Lv, Cv = t["eval_macro_loss"].to_numpy(float), t["train_flops"].to_numpy(float)
    Lo, Lf = float(Lv[i_on].mean()), float(Lv[i_off].mean())
    if not (Lo > jf.linf and Lf > jf.linf):
        return (np.nan, np.nan)
    est, g_law, g_means = paired_ln_m(Lo, float(np.mean(np.log(Cv[i_on]))), Lf, float(np.mean(np.log(Cv[i_off]))),
                                      jf.linf, jf.alpha)
    cov, cov_model = jf.law_block()
    v_law = max(float(g_law @ cov @ g_law), float(np.nan_to_num(g_law @ cov_model @ g_law)), 0.0)
    ends = [paired_ln_m(Lo, float(np.mean(np.log(Cv[i_on]))), Lf, float(np.mean(np.log(Cv[i_off]))), linf, alpha)[0]
            for linf, _, alpha in jf.valley_laws if Lo > linf and Lf > linf]
    if ends:  # a pinned valley's ends: the interval reaches the farther one (joint.valley_term, for one contrast)
        v_law += max((e - est) ** 2 for e in ends) / 1.959963984540054**2
    return (est, float(np.sqrt(s**2 * (g_means[0] ** 2 / len(i_on) + g_means[1] ** 2 / len(i_off)) + v_law)))


def paired_per_rung(a) -> pd.DataFrame:
    """Per component and rung, the mean `paired_quality` over the pairs of arms at that rung that differ in it alone
    (TOTAL: all-on vs all-off), docs/method.md "What Findings say" (*Paired per rung*); NaN where no such pair ran."""
    t = a.table
    if a.joint.get("power") is None or not a.factors:
        return pd.DataFrame()
    jf = a.joint["power"]
    s = float(np.sqrt(float(jf.resid @ jf.resid) / max(jf.dof, 1)))
    q = float(stats.t.ppf(0.5 + a.level / 2, max(jf.dof, 1)))
    X = t[[f"x_{f}" for f in a.factors]].to_numpy()
    arms = {tuple(x) for x in X}
    rows = []
    for r in a.rungs.itertuples():
        at = (t["rung"] == r.rung).to_numpy()
        for i, f in enumerate(a.factors + ["TOTAL"]):
            pairs = ([(tuple([1.0] * len(a.factors)), tuple([-1.0] * len(a.factors)))] if f == "TOTAL"
                     else [(x, x[:i] + (-1.0,) + x[i + 1:]) for x in arms if x[i] == 1.0])
            ests, vars_ = [], []
            for on, off in pairs:
                i_on = np.flatnonzero(at & np.all(X == on, 1))
                i_off = np.flatnonzero(at & np.all(X == off, 1))
                if len(i_on) and len(i_off):
                    e, se = paired_quality(a, i_on, i_off, s)
                    if np.isfinite(e):
                        ests.append(e)
                        vars_.append(se**2)
            est = float(np.mean(ests)) if ests else np.nan
            se = float(np.sqrt(np.sum(vars_)) / len(vars_)) if ests else np.nan
            rows.append({"component": f, "rung": r.rung, "paired": est, "paired_lo": est - q * se,
                         "paired_hi": est + q * se, "pairs": len(ests)})
    return pd.DataFrame(rows)


def lost_runs(raw: pd.DataFrame, a, third_levels: str) -> list[str]:
    """Runs that did not complete, by arm and rung, and which Shapley values they made non-estimable."""
    raw = raw[raw["status"].fillna("missing") != "duplicate"]  # a copied run folder: counted once, never lost
    st = raw["status"].fillna("missing")
    lost = raw[st != "completed"]
    if not len(lost):
        return []
    out = []
    try:
        Xa, keep, _ = code_table(raw, a.factors, third_levels)
    except ValueError:
        return [f"{len(lost)} run(s) lost"]
    base = np.all(Xa == -1, axis=1) & (st != "completed").to_numpy()
    if base.any():
        out.append(f"{int(base.sum())} all-off (baseline) run(s) lost: the law is fitted on every arm, so it is "
                   "still estimated, from the other arms")
    rz = dict(zip(a.rungs["rung"], a.rungs["z"], strict=True))
    z = np.array([rz.get(str(r), 0.0) for r in raw.get("rung", pd.Series(["?"] * len(raw)))])
    terms = build_terms(a.factors, interactions=True, scale=len(a.rungs) >= 2)
    full = alias_structure(design_matrix(terms, a.factors, Xa[keep], z[keep]))
    done = keep & (st == "completed").to_numpy()
    now = alias_structure(design_matrix(terms, a.factors, Xa[done], z[done]))
    cc = component_contrasts(a.fits.get("quality") or next(iter(a.fits.values())), 0.0) if a.fits else None
    if cc is not None:
        def est(al, c):
            V = al.rowspace_V
            return np.linalg.norm(c - V @ (V.T @ c)) <= 1e-7 * max(np.linalg.norm(c), 1e-12)
        cost = [f for f, c in zip(a.factors, cc["loo"], strict=True) if est(full, c) and not est(now, c)]
        out.append("lost runs cost the leave-one-out/add-one-in values of " + ", ".join(cost) if cost
                   else "lost runs cost no estimable component value")
    by = lost.groupby([lost.get("arm", pd.Series("?", index=lost.index)).astype(str),
                       lost.get("rung", pd.Series("?", index=lost.index)).astype(str)]).size()
    out += [f"lost: arm {arm} at rung {rung} ({k} run(s))" for (arm, rung), k in by.items()]
    return out


def _stream_warnings(a) -> list[str]:
    """A factor whose two levels never share a random stream (init seed and data order) is confounded
    with seed noise that the residuals do not see: runs of one seed share their stream across arms."""
    t = a.table
    if "random_stream" not in t or t["random_stream"].isna().any():
        return []
    return [f"{f}: its two levels never share a random stream (init seed and data order), so its contrast carries "
            "seed-to-seed noise that the residuals, taken between arms that share one, do not measure: its interval "
            "can be too narrow (replicate it over seeds)" for f in a.factors
            if not set(t.loc[t[f"x_{f}"] < 0, "random_stream"]) & set(t.loc[t[f"x_{f}"] > 0, "random_stream"])]


#: How a run's LR was set (analysis/io/results.py `lr_source`); every other value is the heuristic.
LR_SET_PER_ARM = ("profile", "tuned")


def lr_untuned(t: pd.DataFrame) -> bool:
    """Some analysed run ran the heuristic LR, not one profiled or tuned for its arm (its meta.json's
    lr_source; a table without that column: untuned unless the LRs differ per arm)."""
    if "lr_source" in t and t["lr_source"].notna().all():
        return not t["lr_source"].isin(LR_SET_PER_ARM).all()
    return "lr" not in t or t["lr"].nunique() <= 1


def drop_rates(a) -> pd.DataFrame:
    """Mean routed-token drop rate of the analysed runs per rung (compute order) and EP transport
    level, the baseline level (coded −1) first: columns rung, level, code, drop_rate."""
    t = a.table
    if "drop_rate" not in t or DROP_FACTOR not in t:
        return pd.DataFrame(columns=["rung", "level", "code", "drop_rate"])
    code = t[f"x_{DROP_FACTOR}"] if f"x_{DROP_FACTOR}" in t else pd.Series(-1, index=t.index)  # one level: baseline
    d = pd.DataFrame({"rung": t["rung"].astype(str), "level": t[DROP_FACTOR].astype(str), "code": code,
                      "drop_rate": pd.to_numeric(t["drop_rate"], errors="coerce")})
    d = d.dropna(subset=["drop_rate"]).groupby(["rung", "level", "code"], as_index=False)["drop_rate"].mean()
    order = {str(r): i for i, r in enumerate(a.rungs["rung"])}  # a.rungs is in compute order
    d["_o"] = d["rung"].map(order).fillna(len(order))
    return d.sort_values(["_o", "code"]).drop(columns="_o").reset_index(drop=True)


def drop_warning(a) -> str:
    """Both transports' drop rates per rung when either drops more than DROP_WARN of routed tokens."""
    d = drop_rates(a)
    if not len(d) or d["drop_rate"].max() <= DROP_WARN:
        return ""
    levels = list(dict.fromkeys(d["level"]))
    per_rung = [f"{r} " + " / ".join(f"{100 * g.set_index('level')['drop_rate'].get(lv, np.nan):.1f}%"
                                     for lv in levels).replace("nan%", "not run")
                for r, g in d.groupby("rung", sort=False)]
    return (f"EP transports drop routed tokens ({' / '.join(levels)}, per rung): {', '.join(per_rung)}; the quality "
            f"cost of the drops is part of the {DROP_FACTOR} effect")


def unmeasured_shift(a) -> str:
    """Why the quality intervals omit a (seed × rung) loss shift ('' when they include it): the clusters leave the law
    no df to measure one (docs/method.md §4.4)."""
    law = a.law
    if law is None or law.between_df is None or law.between_df > 0 or {"linf", "alpha"} <= set(law.pinned):
        return ""
    n = a.table["rung"].nunique() * (a.table["seed"].nunique() if "seed" in a.table else 1)
    return (f"{n} (seed × rung) clusters leave no df to measure a loss shift shared by one cluster; "
            "add a seed, a rung, or pin L∞ or α")


def seed_warning(n_seeds: int) -> str:
    """What one seed, or two, cost every interval (docs/method.md §4.4, *Seeds as replicates*)."""
    if n_seeds >= 2:
        return ("two seeds: the component x seed term is measured on 1 df, so every interval at C_ref, per rung and "
                "extrapolated is at least the t interval on 1 df (t = 12.7) of the two seeds' estimates: honest, and "
                "wide; each added seed narrows it (the report's 'What it would take' says how many)")
    return ("one seed: no replicate runs, so seed noise and lack of fit cannot be separated from effects; every "
            "interval rests on the run residuals and omits how a component's effect moves with the seed (its init, "
            "data order and LR profile), which on the smoke study moved the optimizer by 0.78 in ln M against "
            f"intervals of ±0.11: run {BETWEEN_SEEDS_MIN} or more seeds (each interval then carries that term)")


def warnings_for(a, raw: pd.DataFrame) -> list[str]:
    """Warnings computed from the data; each says what it costs the reader."""
    t = a.table
    w = [f"the joint law fit ({name}) did not converge (iteration limit reached): every number that rests on it "
         "(law, quality and wall-clock multipliers) may be off its least-squares optimum"
         for name, jf in a.joint.items() if not jf.converged]
    if a.law is not None:
        if a.law.not_identified:
            w.append(f"law parameter(s) {', '.join(a.law.not_identified)} not identified: their intervals are "
                     "not reported" + (f" ({a.law.why})" if a.law.why else ""))
        if a.law.pinned and getattr(a, "pinned_law", None) is None:  # a ladder's pins carry their spread
            w.append("law parameter(s) pinned by the user: "
                     f"{', '.join(f'{k}={v:g}' for k, v in a.law.pinned.items())}; "
                     "their uncertainty is not in the intervals")
    shift = unmeasured_shift(a)
    if shift:
        w.append("quality multipliers (every ln_M and ln_W value, per rung and extrapolated too): "
                 f"their intervals omit any (seed × rung) shift: {shift}")
    nr = len(a.rungs)
    if nr < 4:
        w.append(f"{nr} rung(s): the law's form cannot be checked (a broken power law and a power law agree on "
                 f"{nr} points); per-rung and extrapolated multipliers assume the power law")
    ns = t["seed"].nunique() if "seed" in t else 1
    if ns <= BETWEEN_SEEDS_MIN:
        w.append(seed_warning(ns))
    if a.target_compute is not None:
        ratio = a.target_compute / a.top_compute()
        w.append(f"extrapolation: the target is {ratio:.3g}x the top rung's compute"
                 + ("" if "curved" in a.joint else "; the law-form spread could not be assessed, so the interval "
                    "assumes the power law holds to the target"))
    hw = t["hardware"].astype(str).str.lower() if "hardware" in t else pd.Series(dtype=str)
    if hw.str.contains("cpu").any():
        sd = float(np.nanstd(a.fits["throughput"].resid)) if "throughput" in a.fits else np.nan
        w.append(f"throughput measured on CPU (residual sd of ln R {sd:.3f}): CPU throughput is noisy and says "
                 "little about GPU kernels")
    if lr_untuned(t):
        w.append("learning rates are not tuned per arm: an arm that needs another LR is penalised "
                 "(`marin-ablate run STUDY` profiles them unless --no-profile; `tune STUDY` then `run --tuned`)")
    w += [f"some runs see their data more than once (max {c} {pd.to_numeric(t[c], errors='coerce').max():.2g})"
          for c in ("epochs", "data_epochs") if c in t and pd.to_numeric(t[c], errors="coerce").max() > 1]
    dw = drop_warning(a)
    if dw:
        w.append(dw)
    w += _stream_warnings(a)
    if a.alias_groups():
        w.append(f"{len(a.alias_groups())} alias group(s): some interactions are estimated only in sums "
                 "(see the appendix); the Shapley values assume the aliased higher-order terms are negligible")
    if a.checks is not None and len(a.checks):
        bad = a.checks[a.checks["agree"] == False]  # noqa: E712
        w += [f"TOTAL {r.response} at rung {r.rung}: the model says {np.exp(r.model):.3g}x, the all-on vs "
              f"all-off runs say {np.exp(r.observed):.3g}x; the effects model misses something (higher-order "
              f"effects?), trust the observed contrast; every component value of {r.response} rests on the "
              "same model and is suspect too" for r in bad.itertuples()]
        w += [f"lack of fit for {r.response} (F={r.lof_F:.3g}, p={r.lof_p:.2g}): replicates disagree with the effects "
              "model more than with each other" for r in a.checks.drop_duplicates("response").itertuples()
              if np.isfinite(r.lof_p) and r.lof_p < 0.05]
    comp = a.components
    if len(comp):
        wide = comp[np.exp(comp["shapley_hi"] - comp["shapley_lo"]) > WIDE_RATIO]
        for r in wide.itertuples():
            w.append(f"{r.component} ({r.response}): the interval spans more than {WIDE_RATIO:g}x, it says little")
    if a.extrapolation is not None:
        e = a.extrapolation
        wide = e[np.exp(e["shapley_hi"] - e["shapley_lo"]) > WIDE_RATIO]
        if len(wide):
            w.append(f"extrapolated intervals spanning more than {WIDE_RATIO:g}x: "
                     + ", ".join(f"{r.component} ({r.response})" for r in wide.itertuples()))
    runs = raw[raw["status"] != "duplicate"]  # a copy of a run is not a run
    lost = int((runs["status"] != "completed").sum())
    if lost:
        w.append(f"{lost} of {len(runs)} runs lost (failed or missing); see Runs")
    return w
