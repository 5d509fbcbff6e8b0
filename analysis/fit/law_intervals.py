"""The reference law's intervals from a joint fit (docs/method.md §4.1): profile likelihood for L∞ and α,
the delta method for A, and the law as a LawFit (`law_of`) for the report, the figures and the checks.
The fit itself is analysis/fit/joint.py."""

from __future__ import annotations

import numpy as np
from scipy import optimize, stats

from marin_ablate.analysis.fit.joint import JointFit, between_clusters, fit_joint
from marin_ablate.analysis.fit.scaling import LawFit

#: Where a profile stops looking: L∞ cannot be negative (a cross-entropy is >= 0) and lies below every
#: observed loss (the upper end is set per fit in profile_ci), α must be > 0.
PROFILE_BOUNDS = {"linf": (0.0, None), "alpha": (1e-4, None)}

def profile_ci(jf: JointFit, name: str, q: float, level: float = 0.95) -> tuple[float, float]:
    """Profile-likelihood interval of linf or alpha (docs/method.md §4.4, *Law parameters: rung-level shifts*):
    {v : RSS(v) − RSS_min <= max(q²·s², q_b²·s²_b)}, every other parameter refitted at v; s² = RSS_min/dof, and with
    clusters the between-cluster mean square s²_b on its own df (`between_clusters`). An end that does not close
    before the parameter's range (L∞ in [0, smallest loss], α > 0) is that bound; one that does not close at all is
    ±inf (the report then says the side is not identified)."""
    if jf.data is None or jf.dof <= 0 or name not in ("linf", "alpha") or name in jf.pinned:
        raise ValueError(f"profile of {name!r} needs an unpinned linf/alpha and a fit with residual df")
    C, L, E, seeds = jf.data
    v0 = jf.get(name)
    rss0 = float(jf.resid @ jf.resid)
    allow = q * q * rss0 / jf.dof
    s2b, dfb = between_clusters(jf)
    if jf.clusters is not None:
        if dfb <= 0:
            raise ValueError(f"profile of {name!r}: the rung clusters leave no df for the law")
        allow = max(allow, float(stats.t.ppf(0.5 + level / 2, dfb)) ** 2 * s2b)
    thr = rss0 + allow
    i = jf.names.index(name)
    se = float(np.sqrt(max(jf.cov[i, i], np.nan_to_num(jf.cov_model[i, i]), 0.0)))
    step0 = max(se, 1e-3 * max(abs(v0), 1.0))
    lo_b, hi_b = PROFILE_BOUNDS[name]
    if name == "linf":
        hi_b = float(np.min(L))
    cache: dict[float, float] = {}

    def excess(v: float) -> float:  # > 0 outside the interval
        if v not in cache:
            kw = {"pin_linf": v} if name == "linf" else {"pin_alpha": v}
            try:
                f = fit_joint(C, L, E, jf.effect_cols, form=jf.form, seeds=seeds, start=jf, warm_only=True,
                              clusters=jf.clusters,
                              **{**{"pin_linf": jf.pinned.get("linf"), "pin_alpha": jf.pinned.get("alpha")}, **kw})
                cache[v] = float(f.resid @ f.resid) - thr
            except ValueError:  # the law stops falling with compute there: far outside
                cache[v] = np.inf
        return cache[v]

    def end(sign: int) -> float:
        bound = lo_b if sign < 0 else hi_b
        inside, step = v0, step0
        for _ in range(40):
            v = inside + sign * step
            if bound is not None and sign * (v - bound) >= 0:
                if excess(bound) <= 0:
                    return float(bound)
                v = bound
            if excess(v) > 0:
                out = v
                for _ in range(30):  # a refit that fails (inf) has no root to bracket: close in on it
                    if np.isfinite(excess(out)):
                        break
                    mid = 0.5 * (inside + out)
                    inside, out = (mid, out) if excess(mid) <= 0 else (inside, mid)
                if not np.isfinite(excess(out)):
                    return float(inside)
                return float(optimize.brentq(excess, min(inside, out), max(inside, out), xtol=1e-4 * step0))
            inside, step = v, 2.0 * step
        return float(sign * np.inf)

    return end(-1), end(+1)


def law_of(jf: JointFit, level: float = 0.95) -> LawFit:
    """The reference law (the all-off arm's curve) of a joint fit, as a LawFit: profile-likelihood
    intervals for L∞ and α (profile_ci), a delta-method interval for A."""
    q = float(stats.t.ppf(0.5 + level / 2, max(jf.dof, 1)))
    cov_h, cov_m = jf.law_block()
    cov = cov_h if np.trace(cov_h) >= np.nan_to_num(np.trace(cov_m)) else cov_m
    ni = [{"ln_a": "A"}.get(k, k) for k in jf.not_identified if k != "kappa"]
    L = jf.data[1]
    s2b, dfb = between_clusters(jf)
    why = ""
    free = [k for k in ("linf", "alpha") if k not in jf.pinned]
    if jf.clusters is not None and dfb <= 0 and free:
        why = (f"{len(np.unique(jf.clusters.astype(str)))} (seed × rung) clusters leave no df for the law once each "
               "carries its own loss shift (its own init and data order): L∞ and α not identified, and the "
               "quality intervals cannot include such a shift; add a rung or a seed")
    elif "linf" in free and not 0.0 <= jf.linf < float(np.min(L)):
        why = (f"the fitted L∞ = {jf.linf:.3g} lies outside its range [0, smallest loss {float(np.min(L)):.4g}): "
               "the rungs do not pin L∞ and α")
    if why:
        ni = list(dict.fromkeys(ni + free))
    prof = {k: profile_ci(jf, k, q, level) if jf.dof > 0 else jf.wald_ci(k, q) for k in ("linf", "alpha")
            if k not in jf.pinned and k not in ni}
    # ln A = ln a + α ln C0: its variance by the delta method, inflated to the between-cluster error
    g = np.array([0.0, 1.0, np.log(jf.c0)])
    se = float(np.sqrt(max(g @ cov_h @ g, g @ cov_m @ g, 0.0)))
    qa = q
    if dfb > 0 and jf.dof > 0:
        qb = float(stats.t.ppf(0.5 + level / 2, dfb)) * np.sqrt(s2b / max(float(jf.resid @ jf.resid) / jf.dof, 1e-300))
        qa = max(q, qb)
    lnA = np.log(jf.A)
    ends_A = [A for _, A, _ in jf.valley_laws]  # a valley's laws: A moves with the pinned curvature
    prof["A"] = (float(min([np.exp(lnA - qa * se), *ends_A])), float(max([np.exp(lnA + qa * se), *ends_A])))
    if jf.dof <= 0:
        prof = {}
    return LawFit(linf=jf.linf, A=jf.A, alpha=jf.alpha, c0=jf.c0, cov=cov, n=jf.n, pinned=dict(jf.pinned),
                  rss=float(jf.resid @ jf.resid), profile=prof, not_identified=ni, dof=jf.dof, why=why,
                  between_df=dfb if jf.clusters is not None else None, ends=jf.valley_laws)
