"""The reference law L(C) = L∞ + A·C^(−α) and the quality multiplier M_flop = C_eq/C (docs/method.md §4.1–2).

The law is fitted jointly with the quality effects on every run (analysis/fit/joint.py; analysis/fit/law_intervals.py
`law_of` returns it as a LawFit): this module holds the fitted law, its intervals and the multiplier it defines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats


@dataclass
class LawFit:
    """L(C) = linf + A·C^(−alpha); `cov` is over (linf, ln a, alpha) with a = A·C0^(−alpha)."""

    linf: float
    A: float
    alpha: float
    c0: float
    cov: np.ndarray  # 3x3 over (linf, ln a, alpha); zero rows/cols for pinned parameters
    n: int
    pinned: dict[str, float] = field(default_factory=dict)
    rss: float = 0.0
    profile: dict[str, tuple[float, float]] = field(default_factory=dict)  # 95% profile-likelihood CIs
    # Parameters the data cannot pin down: their interval is "not identified", never a number.
    not_identified: list[str] = field(default_factory=list)
    dof: int | None = None
    why: str = ""  # why L∞/α are not identified, when the reason is the design (a line for the report)
    between_df: int | None = None  # df of the (seed × rung) cluster means the L∞/α intervals rest on
    # Laws (linf, A, alpha) the band must reach at 95%: a pinned valley's ends (analysis/fit/reflaw.py)
    ends: tuple = ()

    def predict(self, C) -> np.ndarray:
        return self.linf + self.A * np.asarray(C, float) ** (-self.alpha)

    def ci(self, name: str) -> tuple[float, float]:
        """95% interval of linf, A or alpha: L∞ and α profile likelihood (F-based), A delta method
        (analysis/fit/law_intervals.py `law_of`); (v, v) when pinned, NaN when the data cannot identify it."""
        if name not in ("linf", "A", "alpha"):
            raise ValueError(f"name {name!r}; allowed values: linf, A, alpha")
        if name in self.pinned:
            return (getattr(self, name),) * 2
        if name in self.not_identified or (name == "A" and {"linf", "alpha"} & set(self.not_identified)):
            return (float("nan"), float("nan"))
        # no interval is honest here, a zero-width one is not
        return self.profile.get(name, (float("nan"), float("nan")))

    def band(self, C, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise delta-method band of the fitted curve over (linf, ln a, alpha), widened so that it
        reaches each of `ends` (their gap to the curve counted as 1.96 standard errors)."""
        C = np.asarray(C, float)
        p = self.predict(C)
        f = self.A * C ** (-self.alpha)
        G = np.stack([np.ones_like(C), f, -f * np.log(C / self.c0)], 1)
        var = np.clip(((G @ np.nan_to_num(self.cov)) * G).sum(1), 0, None)
        for linf, A, alpha in self.ends:
            var = var + ((linf + A * C ** (-alpha)) - p) ** 2 / stats.norm.ppf(0.975) ** 2
        se = np.sqrt(var)
        qt = stats.t.ppf(0.5 + level / 2, max(self.dof or self.n - 3, 1))
        return p - qt * se, p + qt * se

    def to_dict(self) -> dict:
        d = {"linf": self.linf, "A": self.A, "alpha": self.alpha, "c0": self.c0, "n": self.n,
             "pinned": dict(self.pinned)}
        for k in ("linf", "A", "alpha"):
            d[f"{k}_ci"] = list(self.ci(k))
        return d


def log_multiplier(L, C, law: LawFit) -> np.ndarray:
    """ln M_flop = ln C_eq − ln C with C_eq = ((L − L∞)/A)^(−1/α); NaN where L ≤ L∞."""
    L = np.asarray(L, float)
    C = np.asarray(C, float)
    gap = L - law.linf
    with np.errstate(invalid="ignore", divide="ignore"):
        ln_ceq = -(np.log(gap) - np.log(law.A)) / law.alpha
        return np.where(gap > 0, ln_ceq - np.log(C), np.nan)
