"""Each component's multiplier under each level of a regime factor (docs/method.md "Effects by regime"):
φ_i | r=c = 2β_i + 2γ_i z + 2c·β_ir, enumerated over the other factors' arms at fixed r, so every term counts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from marin_ablate.analysis.fit.attribution import EffectsFit, all_arms, shapley_rows
from marin_ablate.analysis.io.results import codings, factor_coding
from marin_ablate.analysis.responses import RESPONSES


def regime_factors(df: pd.DataFrame) -> list[str]:
    """Factors the runs' codings mark as regimes, in first-seen order."""
    return list(dict.fromkeys(name for coding, _ in codings(df) for name, d in coding.items()
                              if d.get("regime") is True))


def regime_contrasts(fit: EffectsFit, regime: str, z: float) -> dict[int, np.ndarray]:
    """{code: (k−1, p) Shapley contrast rows of the other factors with `regime` held at code}."""
    if regime not in fit.factors:
        raise ValueError(f"regime {regime!r} is not a factor of the fit; allowed values: {', '.join(fit.factors)}")
    j = fit.factors.index(regime)
    k = len(fit.factors) - 1
    return {code: shapley_rows(fit.predict_phi(np.insert(all_arms(k), j, float(code), axis=1), z), k)
            for code in (-1, 1)}


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
