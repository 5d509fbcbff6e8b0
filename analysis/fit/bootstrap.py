"""The report's second interval (docs/method.md §4.4): a bootstrap that refits the joint law and every effects
model, wild (Rademacher signs on leverage-scaled residuals, Davidson & Flachaire 2008; one set of signs for every
response) or resampling runs within each arm × rung cell; a sum response's replicates add its parts'.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from marin_ablate.analysis.fit.attribution import design_matrix
from marin_ablate.analysis.fit.joint import quality_design, quality_fit
from marin_ablate.analysis.responses import RESPONSES


def bootstrap(ok, X, z, C, L, factors, fits, reduced, joint, masks, seeds, pins, n_boot, method, rng,
              interactions, scale, pin_cov=None, pin_valley=()):
    """{response (and "<response>/main" for a reduced model): (n_boot, terms) replicates of its
    coefficients}, and the (n_boot, 3) law replicates (linf, A, alpha) of the law response.
    pin_cov: pinned (L∞, α) drawn per replicate from N(pair, pin_cov) (a reference ladder's law), about a
    pair drawn uniformly from its valley `pin_valley` (about the pins where it has none)."""
    n = len(L)
    out: dict[str, np.ndarray] = {}
    blaw = np.full((n_boot, 3), np.nan)
    law_name = next((k for k in fits if RESPONSES[k].family == "law"), None)
    qkeys = [(k, f, joint[j], inter) for k, f, j, inter in
             ((law_name, fits.get(law_name), "power", interactions),
              (f"{law_name}/main", reduced.get(law_name), "power/main", False)) if f is not None and j in joint]
    rkeys = [(k, f, ok[RESPONSES[name].column].to_numpy(float), masks[name])
             for name in fits if RESPONSES[name].family == "ols"
             for k, f in ((name, fits[name]), (f"{name}/main", reduced.get(name))) if f is not None]
    for k, f, *_ in qkeys + rkeys:
        out[k] = np.full((n_boot, len(f.terms)), np.nan)
    cells = (ok["arm"].astype(str) + "|" + ok["rung"].astype(str)) if "arm" in ok else ok["rung"].astype(str)
    cell_idx = [np.flatnonzero(cells.to_numpy() == c) for c in pd.unique(cells)]
    # The design of every refit is the full one: wild keeps the rows; cells of one arm and rung
    # resample rows that share their codes and compute, so only the row order changes.
    designs = {k: quality_design(X, z, factors, interactions=inter, scale=scale) for k, _, _, inter in qkeys}
    same_rows = method == "wild" or "arm" in ok
    for b in range(n_boot):
        v = rng.choice((-1.0, 1.0), size=n)  # one set of signs for every response: their replicates pair
        idx = np.arange(n) if method == "wild" else np.concatenate([rng.choice(ci, size=len(ci)) for ci in cell_idx])
        pins_b = pins
        if pin_cov is not None and pins[0] is not None and pins[1] is not None:
            at = pin_valley[rng.integers(len(pin_valley))] if len(pin_valley) else pins
            d = rng.multivariate_normal([at[0], at[1]], pin_cov)
            pins_b = (float(d[0]), max(float(d[1]), 1e-4))
        for k, _, jf, inter in qkeys:
            if method == "wild":
                r = jf.resid / np.sqrt(np.clip(1 - jf.leverage, 1e-3, None))
                Lb = (L - jf.resid) + v * r
            else:
                Lb = L[idx]
            terms, Xf, al, E, cols = designs[k]
            try:
                fb, jb = quality_fit(X[idx], z[idx], C[idx], Lb, factors, interactions=inter, scale=scale,
                                     seeds=None if seeds is None else seeds[idx], pins=pins_b, start=jf,
                                     warm_only=True,
                                     design=(terms, Xf[idx], al, E[idx], cols) if same_rows else None)
            except (ValueError, np.linalg.LinAlgError):
                continue
            out[k][b] = fb.theta
            if k == law_name:
                blaw[b] = (jb.linf, jb.A, jb.alpha)
        for k, f, y0, m in rkeys:
            K = np.flatnonzero(f.alias.kept)
            if method == "wild":
                y = y0.copy()
                r = f.resid / np.sqrt(np.clip(1 - f.leverage, 1e-3, None))
                y[m] = (y0[m] - f.resid) + v[m] * r
                Xb, yb = f.X[:, K], y[m]
            else:
                ii = idx[m[idx]]
                Xb, yb = design_matrix(f.terms, f.factors, X[ii], z[ii])[:, K], y0[ii]
            if len(yb) < len(K):
                continue
            th, *_ = np.linalg.lstsq(Xb, yb, rcond=None)
            out[k][b] = 0.0
            out[k][b, K] = th
    for name in (k for k in fits if RESPONSES[k].family == "sum"):  # a sum's replicates: its parts' paired ones
        parts = RESPONSES[name].parts
        if all(q in out for q in parts):
            out[name] = sum(out[q] for q in parts)
        if name in reduced and all(q in out for q in parts):
            out[f"{name}/main"] = sum(out.get(f"{q}/main", out[q]) for q in parts)
    return out, (blaw if law_name in out else None)
