"""What Findings may claim (docs/method.md, "What Findings say"): where a factor was varied, the
observed TOTAL when the model's disagrees, the scale trend of each component, and which intervals
are no interval at all.

Every function reads a finished StudyAnalysis (analysis/pipeline.py); none refits anything.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.fit.attribution import EffectsFit, component_contrasts, varied_rungs
from marin_ablate.analysis.fit.checks import DROP_FACTOR, WIDE_RATIO, drop_rates, lr_untuned, unmeasured_shift
from marin_ablate.analysis.fit.lr_profile import choice_cost, interval_text
from marin_ablate.analysis.fit.replicates import BETWEEN_SEEDS_MIN, seed_half, t_half
from marin_ablate.analysis.io.results import codings
from marin_ablate.analysis.responses import RESPONSES, by_column, is_sum, law, law_column, part_columns, uses_law


def _exp(v: float) -> float:
    """exp that saturates to inf (a runaway estimate prints as inf, it does not raise)."""
    with np.errstate(over="ignore"):
        return float(np.exp(v))


def arm_kinds(a) -> dict[str, str]:
    """{run_id: "all-on" | "all-off" | "other arms"} of the analysed runs, from their ±1 coding."""
    t = a.table
    if not a.factors or "run_id" not in t:
        return {}
    xs = t[[f"x_{f}" for f in a.factors]].to_numpy()
    return dict(zip(t["run_id"], np.where(np.all(xs == 1, 1), "all-on", np.where(np.all(xs == -1, 1), "all-off",
                                                                                    "other arms")), strict=True))


def not_varied_at(a, f: str, compute: float) -> str:
    """'' when factor f's value at `compute` rests on rungs that vary it, else the line saying why not
    (docs/method.md, "What Findings say": *Not varied here*)."""
    vr = varied_rungs(a.table, a.factors).get(f, [])
    if not vr:
        return f"{f} is not varied at any rung"
    comp = a.rungs.set_index("rung")["compute"]
    cs = comp.reindex(vr).to_numpy(float)
    if len(vr) == 1:
        if abs(math.log(compute / cs[0])) < 1e-9:
            return ""
        return f"{f} is varied at rung {vr[0]} only: no scale trend, its value is not carried to other compute"
    if cs.min() * (1 - 1e-9) <= compute <= cs.max() * (1 + 1e-9):
        return ""
    return f"{f} is varied at rungs {', '.join(vr)} only ({cs.min():.3g}–{cs.max():.3g} FLOPs): not varied here"


def observed_total(a, response: str) -> tuple[float, float, float, str]:
    """The all-on vs all-off contrast the two arms' own runs show, carried to C_ref: per rung the
    observed contrast (analysis/fit/checks.py, total_checks) with its standard error; one rung: that rung
    (its compute named); two or more: the weighted least-squares line in ln C evaluated at C_ref.
    A sum response adds its parts' contrasts rung by rung. (est, lo, hi, where); NaN when unobserved."""
    ch = a.checks
    if ch is None or not len(ch):
        return (np.nan, np.nan, np.nan, "")
    if is_sum(response):
        parts = [ch[ch["response"] == p].set_index("rung") for p in part_columns(response)]
        common = [x for x in parts[0].index if all(x in q.index for q in parts)]
        d = pd.DataFrame({"rung": common, "observed": sum(q.loc[common, "observed"].to_numpy() for q in parts),
                          "obs_se": np.sqrt(sum(q.loc[common, "obs_se"].to_numpy() ** 2 for q in parts))})
    else:
        d = ch[ch["response"] == response][["rung", "observed", "obs_se"]]
    d = d[np.isfinite(d["observed"].to_numpy(float)) & (d["obs_se"].to_numpy(float) > 0)]
    if not len(d):
        return (np.nan, np.nan, np.nan, "")
    z = a.rungs.set_index("rung")["z"].reindex(d["rung"]).to_numpy(float)
    y, se = d["observed"].to_numpy(float), d["obs_se"].to_numpy(float)
    fit = a.fits.get(by_column(response).name)
    q = float(stats.t.ppf(0.5 + a.level / 2, max(fit.dof if fit is not None else 1, 1)))
    if len(d) == 1:
        return (float(y[0]), float(y[0] - q * se[0]), float(y[0] + q * se[0]), f"at rung {d['rung'].iloc[0]}")
    import statsmodels.api as sm

    # statsmodels WLS with the known per-rung variances: cov_type="fixed scale" keeps scale 1, so the
    # intercept's standard error is √[(XᵀWX)⁻¹]₀₀, not rescaled by the line's own scatter
    res = sm.WLS(y, np.column_stack([np.ones_like(z), z]), weights=1 / se**2).fit(cov_type="fixed scale")
    b0, s = float(res.params[0]), float(res.bse[0])
    return (b0, b0 - q * s, b0 + q * s, f"{len(d)} rungs, at C_ref")


def total_disagrees(a, response: str) -> str:
    """The name of the failed check when the model's TOTAL for `response` cannot be trusted, '' when it can
    (docs/method.md, "What Findings say": *Lack of fit: the observed TOTAL*); a sum response fails with a part."""
    cache = a.__dict__.setdefault("_total_disagrees", {})
    if a.checks is None:
        return _total_disagrees(a, response)
    if response not in cache:
        cache[response] = _total_disagrees(a, response)
    return cache[response]


def _total_disagrees(a, response: str) -> str:
    ch = a.checks
    if ch is None or not len(ch):
        return ""
    out = []
    for resp in part_columns(response):
        c = ch[ch["response"] == resp]
        bad = c[c["agree"] == False]  # noqa: E712
        if len(bad):
            out.append(f"TOTAL two ways: the model and the all-on vs all-off runs disagree for {resp} at "
                       + ", ".join(bad["rung"].astype(str)))
            continue
        comp = a.components
        m = comp[(comp["response"] == resp) & (comp["component"] == "TOTAL")] if len(comp) else comp
        o, olo, ohi, _ = observed_total(a, resp)
        if len(m) and not interval_fails(o, olo, ohi):
            m = m.iloc[0]
            if math.isfinite(m["shapley_lo"]) and not (olo <= m["shapley"] <= ohi
                                                       or m["shapley_lo"] <= o <= m["shapley_hi"]):
                out.append(f"TOTAL two ways pooled over rungs: the model's {_exp(m['shapley']):.3g}x against "
                           f"the all-on vs all-off runs' {_exp(o):.3g}x for {resp}")
    return "; ".join(out)


def scale_trend(fit: EffectsFit, i: int | None, level: float) -> tuple[float, float, float]:
    """Slope of a component's ln multiplier per decade of compute (Shapley; i None: TOTAL), with its
    interval: the difference of its contrast at z = 1 and z = 0, times ln 10 (the model is linear in z)."""
    c0, c1 = component_contrasts(fit, 0.0), component_contrasts(fit, 1.0)
    c = (c1["total"] - c0["total"]) if i is None else (c1["shapley"][i] - c0["shapley"][i])
    est, se, lo, hi, ok = fit.contrast(c * math.log(10), level)
    return (est, lo, hi) if ok else (np.nan, np.nan, np.nan)


def interval_fails(est: float, lo: float, hi: float) -> str:
    """Why an interval is no interval ('' when it is one): none (0 residual df) or zero width. (A bootstrap
    interval that disagrees is a diagnostic beside the verdict, boot_disagrees, never a veto.)"""
    if not (isinstance(est, float) and math.isfinite(est)):
        return "not estimable"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "not estimable: no interval (no residual df or zero width)"
    if hi - lo <= 1e-9 * max(abs(est), 1.0):
        return "not estimable: zero-width interval"
    return ""


def boot_disagrees(est: float, boot_lo: float, boot_hi: float) -> str:
    """The bootstrap diagnostic of one value ('' when its percentile interval holds the estimate)."""
    if not (math.isfinite(boot_lo) and math.isfinite(boot_hi) and math.isfinite(est)):
        return ""
    if boot_hi - boot_lo <= 1e-9 * max(abs(est), 1.0):
        return "zero-width bootstrap interval (Appendix)"
    if not boot_lo <= est <= boot_hi:
        return "its bootstrap interval excludes the estimate (Appendix)"
    return ""


def recommended_total(a, resp: str) -> tuple[float, float, float, str]:
    """The TOTAL Findings lead with: the model's Shapley TOTAL at C_ref, or — when the TOTAL two ways
    check fails for resp — the observed all-on vs all-off contrast (observed_total) if it has an
    interval. (est, lo, hi, "model" | "observed")."""
    comp = a.components
    c = comp[(comp["response"] == resp) & (comp["component"] == "TOTAL")] if len(comp) else comp
    est, lo, hi = ((float(c.iloc[0][k]) for k in ("shapley", "shapley_lo", "shapley_hi")) if len(c)
                   else (np.nan,) * 3)
    if is_sum(resp) and total_disagrees(a, resp):
        # wall-clock = quality + throughput: replace only the part whose check fails (half-widths in quadrature)
        parts = [recommended_total(a, p) for p in part_columns(resp)]
        if "observed" in [p[3] for p in parts] and not any(interval_fails(*p[:3]) for p in parts):
            w, hw = sum(p[0] for p in parts), math.hypot(*((p[2] - p[1]) / 2 for p in parts))
            return (w, w - hw, w + hw, "observed")
        return (est, lo, hi, "model")
    if total_disagrees(a, resp):
        o, olo, ohi, _ = observed_total(a, resp)
        if not interval_fails(o, olo, ohi):
            olo, ohi, _ = observed_between(a, resp, o, olo, ohi)
            return (o, olo, ohi, "observed")
    return (est, lo, hi, "model")


def observed_between(a, resp: str, o: float, lo: float, hi: float) -> tuple[float, float, int | None]:
    """The observed TOTAL's interval widened, as every model interval at C_ref is (docs/method.md §4.4), to at
    least the between-seed t interval of the seeds' own observed TOTALs (three or more): (lo, hi, the K − 1
    df its verdict is read on when the between-seed interval is the wider, else None)."""
    v = [x[0] for x in (observed_total(s, resp) for s in (getattr(a, "per_seed", None) or {}).values())
         if math.isfinite(x[0])]
    if len(v) < BETWEEN_SEEDS_MIN:
        return lo, hi, None
    half = t_half(v, a.level)
    return min(lo, o - half), max(hi, o + half), (len(v) - 1 if o - half < lo else None)


def _mult(est, lo, hi) -> str:
    s = f"{_exp(est):.3f}"
    return s + (f" [{_exp(lo):.3f}, {_exp(hi):.3f}]" if math.isfinite(lo) and math.isfinite(hi) else "")


#: A ln interval wider than this ratio is not printed as numbers (its ends carry no information).
UNREADABLE_RATIO = 1e3


def qualified_text(est, lo, hi) -> str:
    """`_mult` with its "says little" qualifier; an interval spanning over UNREADABLE_RATIO is named, not
    printed (a paired cell of one run through an unidentified law reaches 1e30)."""
    if math.isfinite(lo) and math.isfinite(hi) and hi - lo > math.log(UNREADABLE_RATIO):
        return f"{_exp(est):.3f} [interval spans over {UNREADABLE_RATIO:g}x: says nothing]"
    return _mult(est, lo, hi) + (_says_little(lo, hi) if math.isfinite(lo) and math.isfinite(hi) else "")


def interval_verdict(lo: float, hi: float) -> str:
    return "gain" if lo > 0 else "loss" if hi < 0 else "consistent with no effect"


#: How each family of Findings verdicts is controlled (docs/method.md, "Verdict families"):
#: Holm's step-down at family-wise error 1 − level, within each family on its own.
FAMILY_METHOD = "holm"
#: The family of record (the question the study asks: what each component does to quality per FLOP), and
#: the family of the scale-trend verdicts; a response's cells fall in the family it names (analysis/responses.py).
RECORD_FAMILY, SCALE_FAMILY = "quality", "scale"


def _dof(a, resp: str) -> int:
    """Residual df of the fit a response's Findings value comes from (the smaller of its parts' for a sum)."""
    r = by_column(resp)
    fit = a.fits.get(r.name) if r is not None else None
    return max(int(fit.dof), 1) if fit is not None else 1


def _p_value(est: float, lo: float, hi: float, dof: float, level: float) -> float:
    """Two-sided p of ln-effect 0 read off the t interval it is reported with (half-width = t_q·se), so a
    verdict and its interval can never disagree before adjustment."""
    q = float(stats.t.ppf(0.5 + level / 2, dof))
    se = (hi - lo) / (2 * q)
    return float(2 * stats.t.sf(abs(est) / se, dof)) if se > 0 else 1.0


def family_of(key: tuple) -> str:
    """The family a verdict key belongs to: (response column | "observed", ...) -> its response's
    `verdicts` (or its own name); ("scale", f) -> SCALE_FAMILY."""
    if key[0] == "scale":
        return SCALE_FAMILY
    r = by_column(key[1] if key[0] == "observed" else key[0])
    return (r.verdicts or r.name) if r is not None else str(key[0])


def family_label(a, fam: str) -> str:
    """A family as the report names it: its responses' labels, or "scale trends"."""
    if fam == SCALE_FAMILY:
        return "scale trend"
    return " and ".join(r.label for r in RESPONSES.values() if (r.verdicts or r.name) == fam) or fam


def _key(a, key: tuple) -> tuple:
    """A lone factor's TOTAL is that factor's own contrast: one hypothesis, counted once in its family."""
    if len(a.factors) == 1 and key[-1] == "TOTAL" and key[0] != "observed":
        return (*key[:-1], a.factors[0])
    return key


def verdict_family(a) -> dict:
    """{key: (rejected, Holm-adjusted p, family)} over every Findings verdict, plus "n": {family: its size},
    each family adjusted on its own (statsmodels.stats.multitest). Built once per analysis by evaluating every
    Findings cell with the unadjusted verdict."""
    fam = getattr(a, "_family", None)
    if fam is not None:
        return fam
    from statsmodels.stats.multitest import multipletests

    a._family_pending = []
    try:
        for f in a.factors + ["TOTAL"]:
            for r in RESPONSES.values():
                finding(a, r.column, f)
            scale_cells(a, f)
        cells = dict(a._family_pending)
    finally:
        del a._family_pending
    groups: dict[str, list] = {}
    for k in cells:
        groups.setdefault(family_of(k), []).append(k)
    fam = {"n": {g: len(keys) for g, keys in groups.items()}}
    for g, keys in groups.items():
        rej, p_adj, _, _ = multipletests([cells[k] for k in keys], alpha=1 - a.level, method=FAMILY_METHOD)
        fam.update({k: (bool(r), float(p), g) for k, r, p in zip(keys, rej, p_adj, strict=True)})
    a._family = fam
    return fam


def _decide(a, key: tuple, est: float, lo: float, hi: float, dof: float) -> str:
    """The verdict of one Findings cell, controlled within its family: gain / loss when Holm over that
    family's verdicts rejects "no effect"; else consistent with no effect (saying so when the unadjusted
    interval alone would have excluded it)."""
    raw = interval_verdict(lo, hi)
    key = _key(a, key)
    pending = getattr(a, "_family_pending", None)
    if pending is not None:
        pending.append((key, _p_value(est, lo, hi, dof, a.level)))
        return raw
    fam = verdict_family(a)
    if key not in fam or raw == "consistent with no effect" or fam[key][0]:
        return raw
    g = fam[key][2]
    return (f"consistent with no effect (Holm over {fam['n'][g]} {family_label(a, g)} verdicts: adjusted p "
            f"{fam[key][1]:.2g}; the unadjusted interval excludes 1)")


def on_cpu(a) -> bool:
    t = a.table
    return "hardware" in t and t["hardware"].astype(str).str.lower().str.contains("cpu").any()


def finding(a, resp: str, f: str) -> str:
    """The Findings cell of component f (or TOTAL) for response column resp (analysis/responses.py) at C_ref; a
    quality-based value whose interval cannot include a (seed × rung) shift says so (checks.unmeasured_shift)."""
    cell = _finding(a, resp, f)
    shift = unmeasured_shift(a) if uses_law(resp) and cell[:1].isdigit() else ""
    return cell + (f"; the interval omits a rung shift ({shift})" if shift else "")


def _finding(a, resp: str, f: str) -> str:
    comp = a.components
    c = comp[(comp["response"] == resp) & (comp["component"] == f)] if len(comp) else comp
    if not len(c):
        return "not estimable"
    c = c.iloc[0]
    if f != "TOTAL":
        why = not_varied_at(a, f, a.c_ref)
        if why:
            return f"not varied here ({why})"
    est, lo, hi = float(c["shapley"]), float(c["shapley_lo"]), float(c["shapley_hi"])
    bad = interval_fails(est, lo, hi)
    if bad:
        return (f"{_exp(est):.3f}: " if math.isfinite(est) else "") + bad
    test = total_disagrees(a, resp)
    if test and f != "TOTAL" and resp != law_column() and on_cpu(a):
        return f"{_mult(est, lo, hi)}: not informative on CPU"
    if test and f == "TOTAL":
        o, olo, ohi, src = recommended_total(a, resp)
        if src == "observed":
            df_between = observed_between(a, resp, *observed_total(a, resp)[:3])[2] if not is_sum(resp) else None
            v = ("not informative on CPU" if resp != law_column() and on_cpu(a)
                 else _decide(a, ("observed", resp), o, olo, ohi,
                              df_between or _dof(a, law_column() if is_sum(resp) else resp)))
            where = "the failing part observed" if is_sum(resp) else observed_total(a, resp)[3]
            return (f"observed all-on vs all-off {_mult(o, olo, ohi)} ({where}): {v}; the "
                    f"model's {_exp(est):.3f} is unreliable ({test})")
    if test:
        return f"{_mult(est, lo, hi)}: unreliable ({test})"
    if resp != law_column() and on_cpu(a):
        return f"{_mult(est, lo, hi)}: not informative on CPU"
    dof = float(c["shapley_df"]) if "shapley_df" in c and math.isfinite(c["shapley_df"]) else _dof(a, resp)
    return f"{_mult(est, lo, hi)}: {_decide(a, (resp, f), est, lo, hi, dof)}"


def _says_little(lo: float, hi: float) -> str:
    """The qualifier of a cell whose ln interval spans more than WIDE_RATIO (every interval Findings shows)."""
    return f" (spans over {WIDE_RATIO:g}x: says little)" if _exp(hi - lo) > WIDE_RATIO else ""


def scale_cells(a, f: str) -> dict[str, str]:
    """Quality multiplier of f at the smallest and largest rung, its slope per decade of compute
    (× per 10× compute, with interval) and the scale verdict, e.g. "gain growing with scale"."""
    out = {"smallest rung": "—", "largest rung": "—", "per decade of compute": "—", "scale verdict": "—"}
    fit = a.reduced.get(law().name, a.fits.get(law().name))
    pr = a.per_rung
    if fit is None or not len(pr) or len(a.rungs) < 2:
        if fit is not None:
            out["scale verdict"] = "one rung: no scale trend"
        return out
    d = pr[(pr["response"] == law_column()) & (pr["component"] == f)].set_index("rung")
    ends = {}
    for key, r in (("smallest rung", a.rungs.iloc[0]), ("largest rung", a.rungs.iloc[-1])):
        x = d.loc[r["rung"]] if r["rung"] in d.index else None
        if x is None or ("varied" in d and not bool(x["varied"])):
            out[key] = f"{r['rung']}: not varied here"
        elif not (math.isfinite(x["effect"]) and math.isfinite(x["lo"])):
            out[key] = f"{r['rung']}: not estimable"
        else:
            out[key] = f"{r['rung']}: {_mult(x['effect'], x['lo'], x['hi'])}{_says_little(x['lo'], x['hi'])}"
            ends[key] = (x["lo"], x["hi"])
    vr = varied_rungs(a.table, a.factors).get(f, []) if f != "TOTAL" else list(a.rungs["rung"])
    if len(vr) < 2:
        out["scale verdict"] = "varied at one rung only: no scale trend"
        return out
    i = None if f == "TOTAL" else fit.factors.index(f)
    s, lo, hi = scale_trend(fit, i, a.level)
    if not (math.isfinite(s) and math.isfinite(lo)):
        out["scale verdict"] = "trend not estimable"
        return out
    c0, c1 = component_contrasts(fit, 0.0), component_contrasts(fit, 1.0)
    dc = (c1["total"] - c0["total"]) if i is None else (c1["shapley"][i] - c0["shapley"][i])
    lo, hi, df_between = _slope_between(a, f, s, lo, hi, fit.law_se(dc * math.log(10)))
    out["per decade of compute"] = "×" + _mult(s, lo, hi) + _says_little(lo, hi)
    top = ends.get("largest rung")
    tv = interval_verdict(*top) if top else "—"
    d = _decide(a, ("scale", f), s, lo, hi, df_between or fit.contrast_df(dc))
    if d == "gain":
        out["scale verdict"] = {"gain": "gain growing with scale", "loss": "loss shrinking with scale"}.get(
            tv, "rising with scale")
    elif d == "loss":
        out["scale verdict"] = {"gain": "gain shrinking with scale", "loss": "loss growing with scale"}.get(
            tv, "falling with scale")
    else:
        out["scale verdict"] = "no detectable trend" + d.removeprefix("consistent with no effect")
    return out


def _slope_between(a, f: str, s: float, lo: float, hi: float,
                   se_law: float = 0.0) -> tuple[float, float, int | None]:
    """A component's slope per decade from the seeds' own slopes (`seed_half`, the law's spread `se_law` added), as
    at C_ref (docs/method.md §4.4): (lo, hi, K − 1 df); the pooled model's interval and None below BETWEEN_SEEDS_MIN."""
    v = []
    for b in (getattr(a, "per_seed", None) or {}).values():
        fb = b.reduced.get(law().name, b.fits.get(law().name))
        if fb is not None and (f == "TOTAL" or f in fb.factors):
            x = scale_trend(fb, None if f == "TOTAL" else fb.factors.index(f), a.level)[0]
            if math.isfinite(x):
                v.append(x)
    if len(v) < BETWEEN_SEEDS_MIN:
        return lo, hi, None
    half, df = seed_half(v, se_law, a.level)
    return s - half, s + half, df


#: Factors whose change moves the best learning rate: a field of the train section or one naming the
#: optimizer (in any section). With LRs untuned per arm their verdicts carry that qualifier beside them.
LR_COUPLED_SECTIONS, LR_COUPLED_ATTRS = ("train",), ("optimizer",)


def lr_coupled(field: str) -> bool:
    section, _, attr = field.partition(".")
    return section in LR_COUPLED_SECTIONS or attr in LR_COUPLED_ATTRS


def _fields(a) -> dict[str, str]:
    """{factor: its field}, the first coding that names it winning."""
    return {name: str(d.get("field", "")) for coding, _ in reversed(codings(a.table)) for name, d in coding.items()}


def qualifiers(a, f: str) -> str:
    """What qualifies component f's verdicts (or TOTAL's), shown beside them in Findings: LRs not
    tuned for an LR-coupled factor, both EP transports' drop rates, aliasing, an interval too wide
    to say anything. The Warnings section says the same at length."""
    q = []
    fields = _fields(a)
    coupled = [g for g in a.factors if lr_coupled(fields.get(g, ""))]
    if lr_untuned(a.table) and (f in coupled or (f == "TOTAL" and coupled)):
        q.append("LRs untuned for this arm (see `marin-ablate run` without --no-profile)" if f != "TOTAL"
                 else f"LRs untuned for {', '.join(coupled)}")
    elif f in coupled and "lr_source" in a.table:  # how the LRs were set (docs/method.md §4.6)
        src = sorted(set(a.table["lr_source"].dropna()))
        q.append("LRs " + " and ".join({"profile": "profiled per level", "tuned": "tuned per arm"}.get(x, x)
                                       for x in src))
    d = drop_rates(a)
    if f in (DROP_FACTOR, "TOTAL") and DROP_FACTOR in a.factors and len(d) and d["drop_rate"].max() > 0:
        span = []
        for lv, g in d.groupby("level", sort=False):
            lo, hi = 100 * g["drop_rate"].min(), 100 * g["drop_rate"].max()
            span.append(f"{lv} {lo:.1f}%" if hi - lo < 0.05 else f"{lv} {lo:.1f}–{hi:.1f}%")
        q.append("drops " + ", ".join(span) + " of routed tokens (per rung in Warnings)")
    comp = a.components
    c = comp[comp["component"] == f] if len(comp) else comp
    if len(c) and f != "TOTAL" and (c.get("aliased_with", pd.Series("", index=c.index)).fillna("") != "").any():
        q.append("aliased interactions assumed negligible (Appendix)")
    wide = [by_column(r).label if by_column(r) else r
            for r, lo, hi in zip(c.get("response", []), c.get("shapley_lo", []), c.get("shapley_hi", []), strict=True)
            if math.isfinite(lo) and math.isfinite(hi) and _exp(hi - lo) > WIDE_RATIO]
    if wide:
        q.append(f"{', '.join(wide)}: interval spans over {WIDE_RATIO:g}x")
    q += [f"{by_column(r).label if by_column(r) else r}: {why}" for r, e, blo, bhi in
          zip(c.get("response", []), c.get("shapley", []), c.get("shapley_boot_lo", []), c.get("shapley_boot_hi", []),
              strict=False)
          if (why := boot_disagrees(float(e), float(blo), float(bhi)))]
    return "; ".join(q) or "—"


def _law_slope(a) -> float:
    """−dL/d ln C of the reference law at C_ref (nats per ln C): what converts a loss cost into ln M; NaN without
    a law whose local slope is known."""
    law = a.law
    if law is None or not all(math.isfinite(float(v)) for v in (law.alpha, law.A, law.linf)):
        return math.nan
    return float(law.alpha * (law.predict(a.c_ref) - law.linf))


def rests_on(a) -> str:
    """The report's one-line headline of what the answer rests on: how many seeds and what the intervals are
    built on, how the LRs were set and how uncertain the profiled optima are (docs/method.md §4.4, §4.6)."""
    t = a.table
    seeds = sorted(int(s) for s in t["seed"].dropna().unique()) if "seed" in t else []
    comp = a.components
    k = int(comp["between_seeds"].max()) if len(comp) and "between_seeds" in comp else 0
    if len(seeds) >= BETWEEN_SEEDS_MIN and k >= BETWEEN_SEEDS_MIN:
        what = (f"{len(seeds)} seeds ({', '.join(map(str, seeds))}), each analysed alone too: every interval at C_ref "
                f"is the between-seed t interval of its per-seed estimates ({k - 1} df, the pinned law's spread "
                "added), so it carries the component x seed variation")
    else:
        what = (f"{len(seeds) or 1} seed(s): the intervals rest on the run residuals and omit component x seed "
                f"variation (its init, data order and LR profile; {BETWEEN_SEEDS_MIN}+ seeds measure it)")
    src = set(t["lr_source"].dropna()) if "lr_source" in t else set()
    prof = a.lr_profile or {}
    if "profile" in src and "seeds" in prof:
        per = {str(s): m for s, m in (prof.get("multipliers") or {}).items()}
        levels = []
        for g, est in (prof.get("pooled") or {}).items():
            f, _, lv = g.partition("=")
            each = [per[s][f][lv] for s in map(str, prof["seeds"]) if lv in per.get(s, {}).get(f, {})]
            cost = choice_cost(est, _law_slope(a))
            levels.append(f"{g} {', '.join(f'{m:.3g}' for m in each)}x the heuristic"
                          + (f" (pooled {interval_text(est)}" + (f"; a choice inside it costs at most {cost:.2g} "
                             "in ln M" if math.isfinite(cost) else "") + ")" if len(each) > 1 else ""))
        lr = (f"LRs profiled at each seed at {prof.get('rung', '?')}, each seed's design at its own optimum: "
              + "; ".join(levels))
    elif "profile" in src:
        lr = "LRs profiled per level at one seed and carried to every seed: the profile's noise is in no interval"
    elif "tuned" in src:
        lr = "LRs tuned per arm (`run --tune`, one seed): the tuning's noise is in no interval"
    elif src:
        lr = "LRs at Marin's heuristic, not tuned per arm"
    else:
        lr = "how the LRs were set is not recorded"
    return f"What this rests on: {what}. {lr}."
