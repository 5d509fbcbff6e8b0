"""The LR profile's optimum as a measured quantity: a quadratic in log2 LR over every seed's points,
its vertex and the vertex's Fieller interval (docs/method.md §4.6).

Each seed's profile is a few eval losses at log2 multipliers x of the heuristic LR. Pooled over seeds,
loss = c_s + b1·x + b2·x² (one intercept per seed: a seed's whole curve sits higher or lower, its shape
is shared), the optimum is x* = −b1/(2·b2). Its interval is Fieller's (Fieller 1954): the x at which
the fitted slope b1 + 2·b2·x is not distinguishable from 0 by a t test on the fit's residual df — exact
under normal errors, and unbounded when the curvature itself is not distinguishable from 0 (a flat
profile does not fix its optimum, and the interval says so rather than a delta method's finite width).
No torch import.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
from scipy import stats


def optimum_interval(points: Mapping[int, Sequence[tuple[float, float]]], level: float = 0.95) -> dict:
    """{seed: [(log2 multiplier, eval loss)]} -> the pooled vertex and its Fieller interval (log2 scale).

    Returns x_opt, lo, hi (±inf for an unbounded side), df, n_points, n_seeds, and `note` ('' for an
    interior, bounded optimum). Non-finite losses (failed runs) are left out."""
    import statsmodels.api as sm

    rows = [(s, float(x), float(y)) for s, pts in points.items() for x, y in pts if math.isfinite(float(y))]
    seeds = sorted({s for s, _, _ in rows})
    out = {"x_opt": math.nan, "lo": math.nan, "hi": math.nan, "df": 0, "n_points": len(rows), "n_seeds": len(seeds),
           "note": ""}
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
    disc = max(b * b - 4 * a * c, 0.0)
    r = math.sqrt(disc)
    out["lo"], out["hi"] = (-b - r) / (2 * a), (-b + r) / (2 * a)
    return out


def interval_text(est: Mapping, digits: int = 2) -> str:
    """"2.1x [1.4, 3.2]" of an `optimum_interval` result, as LR multipliers (2^x); unbounded ends named."""
    if not math.isfinite(est.get("x_opt", math.nan)):
        return f"no optimum ({est.get('note') or 'not estimable'})"

    def m(v: float) -> str:
        return "0" if v == -math.inf else "inf" if v == math.inf else f"{2.0 ** v:.{digits}g}"

    return f"{2.0 ** est['x_opt']:.{digits}g}x [{m(est['lo'])}, {m(est['hi'])}]"
