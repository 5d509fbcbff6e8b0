"""The second interval of the report: a bootstrap that refits the joint law and every effects model.

wild: Rademacher signs on leverage-scaled residuals (Davidson & Flachaire 2008), loss residuals for
quality, ln R residuals for throughput, the same signs for both; cells: resample runs within each
arm × rung cell. Wall-clock replicates are the sum of the paired quality and throughput replicates.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.attribution import design_matrix


def bootstrap(ok, X, z, C, L, lnR, factors, fits, reduced, joint, masks, seeds, pins, n_boot, method, rng,
              interactions, scale):
    from analysis.pipeline import quality_fit

    n = len(L)
    out: dict[str, np.ndarray] = {}
    blaw = np.full((n_boot, 3), np.nan)
    qkeys = [(k, f, joint[j], inter) for k, f, j, inter in
             (("quality", fits.get("quality"), "power", interactions),
              ("quality/main", reduced.get("quality"), "power/main", False)) if f is not None and j in joint]
    rkeys = [(k, f) for k, f in (("throughput", fits.get("throughput")), ("throughput/main", reduced.get("throughput")))
             if f is not None]
    for k, f, _, _ in qkeys:
        out[k] = np.full((n_boot, len(f.terms)), np.nan)
    for k, f in rkeys:
        out[k] = np.full((n_boot, len(f.terms)), np.nan)
    mR = masks.get("throughput", np.isfinite(lnR))
    cells = (ok["arm"].astype(str) + "|" + ok["rung"].astype(str)) if "arm" in ok else ok["rung"].astype(str)
    cell_idx = [np.flatnonzero(cells.to_numpy() == c) for c in pd.unique(cells)]
    for b in range(n_boot):
        v = rng.choice((-1.0, 1.0), size=n)
        idx = np.arange(n) if method == "wild" else np.concatenate([rng.choice(ci, size=len(ci)) for ci in cell_idx])
        for k, f, jf, inter in qkeys:
            if method == "wild":
                r = jf.resid / np.sqrt(np.clip(1 - jf.leverage, 1e-3, None))
                Lb = (L - jf.resid) + v * r
            else:
                Lb = L[idx]
            try:
                fb, jb = quality_fit(X[idx], z[idx], C[idx], Lb, factors, interactions=inter, scale=scale,
                                     seeds=None if seeds is None else seeds[idx], pins=pins, start=jf)
            except (ValueError, np.linalg.LinAlgError):
                continue
            out[k][b] = fb.theta
            if k == "quality":
                blaw[b] = (jb.linf, jb.A, jb.alpha)
        for k, f in rkeys:
            K = np.flatnonzero(f.alias.kept)
            if method == "wild":
                y = lnR.copy()
                r = f.resid / np.sqrt(np.clip(1 - f.leverage, 1e-3, None))
                y[mR] = (lnR[mR] - f.resid) + v[mR] * r
                Xb, yb = f.X[:, K], y[mR]
            else:
                ii = idx[mR[idx]]
                Xb, yb = design_matrix(f.terms, f.factors, X[ii], z[ii])[:, K], lnR[ii]
            if len(yb) < len(K):
                continue
            th, *_ = np.linalg.lstsq(Xb, yb, rcond=None)
            out[k][b] = 0.0
            out[k][b, K] = th
    if "quality" in out and "throughput" in out and "wall" in fits:
        out["wall"] = out["quality"] + out["throughput"]
    if "wall" in reduced:
        q, r = out.get("quality/main", out.get("quality")), out.get("throughput/main", out.get("throughput"))
        if q is not None and r is not None:
            out["wall/main"] = q + r
    return out, (blaw if "quality" in out else None)
