"""Each component's multiplier under each level of a regime factor (docs/method.md "Effects by regime").

A regime factor is a condition the components are studied under rather than a component itself,
e.g. the tokens per parameter a rung trains (Marin's fast ladder 60, its hero ladder 791): a factor
marked `regime=True` in its study. With the regime r held at code c, component i's Shapley value
over the other components is, in the fitted effects model,

    φ_i | r=c = 2β_i + 2γ_i z + 2c·β_ir,

and the change of the effect from the low to the high regime is 4β_ir (its interval from the same
covariance). Computed by enumerating the arms of the other factors at fixed r, like
`analysis.fit.attribution.component_contrasts`, so every model term is accounted for.
"""

from __future__ import annotations

import json
from math import factorial

import numpy as np
import pandas as pd

from marin_ablate.analysis.fit.attribution import EffectsFit, all_arms
from marin_ablate.analysis.io.results import factor_coding
from marin_ablate.analysis.responses import RESPONSES


def regime_factors(df: pd.DataFrame) -> list[str]:
    """Factors the runs' codings mark as regimes, in first-seen order."""
    out: list[str] = []
    for raw in df.get("coding", pd.Series(dtype=object)):
        for name, d in (json.loads(raw) if isinstance(raw, str) and raw else {}).items():
            if d.get("regime") is True and name not in out:
                out.append(name)
    return out


def regime_contrasts(fit: EffectsFit, regime: str, z: float) -> dict[int, np.ndarray]:
    """{code: (k−1, p) Shapley contrast rows of the other factors with `regime` held at code}."""
    if regime not in fit.factors:
        raise ValueError(f"regime {regime!r} is not a factor of the fit; allowed values: {', '.join(fit.factors)}")
    j = fit.factors.index(regime)
    k = len(fit.factors) - 1
    sub = all_arms(k)
    m = np.arange(2**k)
    size = np.array([bin(i).count("1") for i in m])
    out = {}
    for code in (-1, 1):
        A = np.insert(sub, j, float(code), axis=1)
        Phi = fit.predict_phi(A, z)
        rows = np.zeros((k, Phi.shape[1]))
        for i in range(k):
            bit = 1 << i
            S = m[(m & bit) == 0]
            w = np.array([factorial(s) * factorial(k - s - 1) / factorial(k) for s in size[S]])
            rows[i] = w @ (Phi[S | bit] - Phi[S])
        out[code] = rows
    return out


def regime_table(fit: EffectsFit, regime: str, levels: tuple[str, str], z: float,
                 level: float = 0.95) -> pd.DataFrame:
    """One row per other factor: ln-scale Shapley value at the low and at the high regime level
    (their names in low_level / high_level), and their difference (high − low), each with its
    interval and estimability."""
    cc = regime_contrasts(fit, regime, z)
    others = [f for f in fit.factors if f != regime]
    rows = []
    for i, f in enumerate(others):
        row = {"response": fit.response, "component": f, "regime": regime,
               "low_level": levels[0], "high_level": levels[1]}
        for key, c in (("low", cc[-1][i]), ("high", cc[1][i]), ("change", cc[1][i] - cc[-1][i])):
            est, se, lo, hi, ok = fit.contrast(c, level)
            row.update({f"{key}": est, f"{key}_lo": lo, f"{key}_hi": hi, f"{key}_estimable": ok})
        rows.append(row)
    return pd.DataFrame(rows)


def regime_frames(fits: dict[str, EffectsFit], raw: pd.DataFrame, level: float = 0.95) -> dict[str, pd.DataFrame]:
    """{regime factor: `regime_table` rows of every response fitted with it, at the reference compute}."""
    regimes = regime_factors(raw)
    if not regimes:
        return {}
    coding = factor_coding(raw)
    out = {}
    for r in regimes:
        tabs = [regime_table(fits[name], r, coding[r], 0.0, level).assign(label=RESPONSES[name].label)
                for name in RESPONSES if name in fits and r in fits[name].factors]
        if tabs:
            out[r] = pd.concat(tabs, ignore_index=True)
    return out
