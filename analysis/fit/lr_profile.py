"""The LR profile's optimum as a measured quantity (docs/method.md §4.6): a quadratic in log2 LR over every
seed's best point and its neighbours (one intercept per seed), its vertex, the vertex's Fieller interval (Fieller
1954; unbounded where the curvature is not distinguishable from 0) and what a choice inside it costs. Only the
local window: the curves are asymmetric, and far points bend the vertex towards them. No torch import.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

#: Points of a seed's profile the quadratic uses: the best one and its neighbours on each side (an exact
#: parabola through three points: its vertex lies within half a grid step of the best point).
PROFILE_WINDOW = 3


def local_window(x: Sequence[float], loss: Sequence[float], window: int = PROFILE_WINDOW) -> tuple[list, list]:
    """The `window` finished points (in order of x) centred on the best one, shifted inward at the grid's ends."""
    pts = sorted((float(a), float(b)) for a, b in zip(x, loss, strict=True) if math.isfinite(float(b)))
    if len(pts) <= window:
        return [p[0] for p in pts], [p[1] for p in pts]
    i = min(range(len(pts)), key=lambda k: pts[k][1])
    lo = min(max(i - window // 2, 0), len(pts) - window)
    return [p[0] for p in pts[lo:lo + window]], [p[1] for p in pts[lo:lo + window]]


def optimum_interval(points: Mapping[int, Sequence[tuple[float, float]]], level: float = 0.95) -> dict:
    """{seed: [(log2 multiplier, eval loss)]} -> the pooled vertex and its Fieller interval (log2 scale).

    Returns x_opt, lo, hi (±inf for an unbounded side), df, n_points, n_seeds, curvature (b2, nats per log2²),
    resid_sd (the fit's residual sd, nats) and `note` ('' for an interior, bounded optimum). Non-finite losses
    (failed runs) are left out."""
    import statsmodels.api as sm

    rows = [(s, float(x), float(y)) for s, pts in points.items() for x, y in pts if math.isfinite(float(y))]
    seeds = sorted({s for s, _, _ in rows})
    out = {"x_opt": math.nan, "lo": math.nan, "hi": math.nan, "df": 0, "n_points": len(rows), "n_seeds": len(seeds),
           "curvature": math.nan, "resid_sd": math.nan, "note": ""}
    if not seeds:
        out["note"] = "no finished point"
        return out
    x = np.array([r[1] for r in rows])
    y = np.array([r[2] for r in rows])
    D = np.column_stack([[float(r[0] == s) for r in rows] for s in seeds] + [x, x * x])
    df = len(rows) - np.linalg.matrix_rank(D)
    out["df"] = int(df)
    if df < 1:
        out["note"] = f"{len(rows)} points for {D.shape[1]} parameters: no residual df"
        return out
    res = sm.OLS(y, D).fit()
    b1, b2 = float(res.params[-2]), float(res.params[-1])
    out["curvature"], out["resid_sd"] = b2, float(np.sqrt(res.scale))
    V = np.asarray(res.cov_params())[-2:, -2:]
    if b2 <= 0:
        out["note"] = "profile not convex (the pooled curvature is not positive): no optimum"
        return out
    out["x_opt"] = -b1 / (2 * b2)
    t2 = float(stats.t.ppf(0.5 + level / 2, df)) ** 2
    # (b1 + 2 b2 x)^2 <= t^2 var(b1 + 2 b2 x): a quadratic inequality a x^2 + b x + c <= 0
    a = 4 * (b2 * b2 - t2 * V[1, 1])
    b = 4 * (b1 * b2 - t2 * V[0, 1])
    c = b1 * b1 - t2 * V[0, 0]
    if a <= 0:
        out["lo"], out["hi"] = -math.inf, math.inf
        out["note"] = "curvature not distinguishable from 0: the optimum is not bounded by these points"
        return out
    r = math.sqrt(max(b * b - 4 * a * c, 0.0))
    out["lo"], out["hi"] = (-b - r) / (2 * a), (-b + r) / (2 * a)
    return out


def interval_text(est: Mapping, digits: int = 2) -> str:
    """"2.1x [1.4, 3.2]" of an `optimum_interval` result, as LR multipliers (2^x); unbounded ends named."""
    if not math.isfinite(est.get("x_opt", math.nan)):
        return f"no optimum ({est.get('note') or 'not estimable'})"

    def m(v: float) -> str:
        return "0" if v == -math.inf else "inf" if v == math.inf else f"{2.0 ** v:.{digits}g}"

    return f"{2.0 ** est['x_opt']:.{digits}g}x [{m(est['lo'])}, {m(est['hi'])}]"


def choice_cost(est: Mapping, slope: float) -> float:
    """What an LR choice anywhere inside the pooled optimum's interval can cost, in ln M (the second-order bound):
    b2·δ² nats, δ the interval's farther end from the vertex in log2, over the law's local slope −dL/d ln C at
    C_ref (nats per ln C). inf when the interval is unbounded; NaN without an optimum or a slope."""
    x, lo, hi, b2 = (float(est.get(k, math.nan)) for k in ("x_opt", "lo", "hi", "curvature"))
    if not (math.isfinite(x) and math.isfinite(b2) and b2 > 0 and slope > 0):
        return math.nan
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return math.inf
    return b2 * max(x - lo, hi - x) ** 2 / slope
