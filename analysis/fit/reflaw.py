"""A pinned reference law (docs/method.md §4.1, *Pinned reference law*): L∞ and α fitted once on the baseline
arm's own wide ladder, along its profile likelihood over L∞ (`PinnedLaw.valley`: the accepted pairs follow the
likelihood's curved valley, which a straight ellipse leaves), as Marin pins its law from a separate sweep.
"""

from __future__ import annotations

import numpy as np

# the pinned law's record and file (analysis/io/pinned_law.py), re-exported: its fit and its reading under one name
from marin_ablate.analysis.io.pinned_law import LAW_FILE, PinnedLaw, check_pinned, published, read_pinned  # noqa: F401


def fit_reference(C, L, *, seeds=None, key: str = "", created: str = "", level: float = 0.95) -> PinnedLaw:
    """L = L∞ + A·C^(−α) on the baseline ladder's runs, pinned along its profile likelihood (`_profile`); ValueError
    when no L∞ in [0, smallest loss) fits a falling law. `seeds`: the runs' seeds, each a sum-to-zero loss shift."""
    from marin_ablate.analysis.fit.joint import fit_joint

    C, L = np.asarray(C, float), np.asarray(L, float)
    if len(C) < 4 or len(np.unique(np.round(np.log(C), 6))) < 4:
        raise ValueError(f"reference ladder: {len(np.unique(np.round(np.log(C), 6)))} distinct computes; a pinned "
                         "law needs >= 4 (L∞, A, α and one residual df)")
    several = seeds is not None and len(set(np.asarray(seeds).tolist())) > 1
    seeds = np.asarray(seeds) if several else None
    try:
        jf = fit_joint(C, L, np.zeros((len(L), 0)), [], seeds=seeds)
    except ValueError:  # the free fit's α runs to <= 0: only the profile can say what the ladder accepts
        jf = None
    return _profile(C, L, seeds, jf, key, created, level)


def _larger_cov(jf, ii: list[int]) -> np.ndarray:
    """The pins' covariance: the larger (by trace) of HC3 and s²(JᵀJ)⁻¹ over parameters `ii`."""
    cov_h = jf.cov[np.ix_(ii, ii)]
    cov_m = np.nan_to_num(jf.cov_model[np.ix_(ii, ii)])
    return cov_h if np.trace(cov_h) >= np.trace(cov_m) else cov_m


#: L∞ values the ladder's profile starts from, as fractions of [0, smallest loss); its ends are then
#: located between neighbours by bisection to PROFILE_XTOL of the smallest loss.
PROFILE_GRID = tuple(np.round(np.linspace(0.0, 0.95, 20), 4)) + (0.975, 0.99, 0.995)
PROFILE_XTOL = 1e-4
#: Accepted pairs the valley keeps (evenly spaced in L∞, both ends and the best included): what the
#: bootstrap draws from and the report's describe() spans.
VALLEY_POINTS = 9


class _Profile:
    """The ladder's profile likelihood over L∞ (`_profile`): each L∞'s fit (α, A, seed shifts refitted), cached,
    and whether the data accept it."""

    def __init__(self, C, L, seeds, free, level: float, noise_var: float | None):
        from scipy import stats

        self.C, self.L, self.seeds, self.noise_var = C, L, seeds, noise_var
        self.top = float(L.min())
        self.span = f"reference ladder over {C.min():.3g}..{C.max():.3g} FLOPs"
        self.cache: dict[float, object] = {}
        self.inside = free is not None and 0.0 <= free.linf < self.top and free.alpha > 0
        grid = [frac * self.top for frac in PROFILE_GRID]
        self.grid = sorted({*grid, free.linf}) if self.inside else grid
        fits = {v: self.at(v) for v in self.grid}
        if not any(f is not None for f in fits.values()):
            raise ValueError(f"{self.span}: the law does not fall with compute at any L∞ in [0, smallest loss "
                             f"{self.top:.4g}); allowed: a ladder whose loss falls (a wider compute span)")
        some = next(f for f in fits.values() if f is not None)
        self.rss0, self.dof = ((_rss(free), free.dof) if free is not None
                               else (min(_rss(f) for f in fits.values() if f), some.dof - 1))
        if self.dof <= 0:
            raise ValueError(f"{self.span}: {len(L)} runs leave no residual df; allowed: more rungs or seeds")
        self.q = float(stats.t.ppf(0.5 + level / 2, self.dof))
        self.allow = self.q * self.q * (self.rss0 / self.dof if noise_var is None else noise_var)
        self.lowest = fits[self.grid[0]] or some  # what a refusal quotes

    def at(self, v: float):
        from marin_ablate.analysis.fit.joint import fit_joint

        if v not in self.cache:
            try:
                self.cache[v] = fit_joint(self.C, self.L, np.zeros((len(self.L), 0)), [], seeds=self.seeds,
                                          pin_linf=float(v))
            except ValueError:  # α <= 0 at this L∞
                self.cache[v] = None
        return self.cache[v]

    def var_alpha(self, f) -> float:
        i = f.names.index("alpha")
        if self.noise_var is not None:
            return self.noise_var * float(np.linalg.pinv(f.jac.T @ f.jac)[i, i])
        return float(_larger_cov(f, [i])[0, 0])

    def accepted(self, v: float) -> bool:
        f = self.at(v)
        return (f is not None and _rss(f) - self.rss0 <= self.allow
                and f.alpha - self.q * float(np.sqrt(max(self.var_alpha(f), 0.0))) > 0)


def _rss(f) -> float:
    return float(f.resid @ f.resid)


def _profile(C, L, seeds, free, key: str, created: str, level: float, noise_var: float | None = None) -> PinnedLaw:
    """The ladder's profile likelihood over L∞ in [0, smallest loss) (docs/method.md §4.1, *One mechanism*): a pair
    (L∞, α(L∞)) is accepted when RSS(L∞) − RSS_min <= t²(df)·RSS_min/df and α stays above 0 at `level`; the accepted
    L∞ form one interval (its ends by bisection), the law is its pair of least RSS, with α's conditional covariance,
    and the valley VALLEY_POINTS accepted pairs from end to end. No accepted pair: ValueError. `noise_var`: a run's
    noise variance stated rather than measured (`predicted_reference`: in place of RSS_min/df)."""
    pr = _Profile(C, L, seeds, free, level, noise_var)
    ok = [v for v in pr.grid if pr.accepted(v)]
    if not ok:
        lo, q = pr.lowest, pr.q
        i = lo.names.index("alpha")
        raise ValueError(f"{pr.span}: α = {lo.alpha:.4g} [{lo.alpha - q * np.sqrt(lo.cov_model[i, i]):.4g}, "
                         f"{lo.alpha + q * np.sqrt(lo.cov_model[i, i]):.4g}] at L∞ = {lo.linf:.4g} on {len(L)} runs, "
                         f"and no L∞ in [0, smallest loss {pr.top:.4g}) both fits and leaves α > 0: the interval "
                         "leaves α > 0 unsupported, so it cannot pin the law; allowed: more seeds or a wider span")
    best = free.linf if pr.inside and pr.accepted(free.linf) else _least_rss(pr, ok)
    lo_v, hi_v = _accepted_ends(pr, ok, best)
    pts = sorted({*np.linspace(lo_v, hi_v, VALLEY_POINTS).tolist(), best})
    pts = [v for v in pts if pr.accepted(v)]
    law = pr.at(best)
    cov = np.zeros((2, 2))
    cov[1, 1] = pr.var_alpha(law)
    return PinnedLaw(float(best), law.alpha, cov, law.A, float(C.min()), float(C.max()), len(L), pr.dof, key,
                     created, valley=tuple((float(v), pr.at(v).alpha) for v in pts))


def _least_rss(pr: _Profile, ok: list[float]) -> float:
    """The accepted L∞ of least RSS: the best grid point, refined between its neighbours (bounded Brent)."""
    from scipy import optimize

    grid, at = pr.grid, pr.at
    b = min(ok, key=lambda v: _rss(at(v)))
    j = grid.index(b)
    lo_v, hi_v = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    r = optimize.minimize_scalar(lambda v: _rss(at(v)) if at(v) is not None else np.inf, bounds=(lo_v, hi_v),
                                 method="bounded", options={"xatol": PROFILE_XTOL * pr.top})
    return float(r.x) if pr.accepted(float(r.x)) and _rss(at(float(r.x))) < _rss(at(b)) else b


def _accepted_ends(pr: _Profile, ok: list[float], best: float) -> tuple[float, float]:
    """The accepted interval around the best pair: each end between its last accepted and first rejected grid
    point, located by bisection to PROFILE_XTOL of the smallest loss."""
    grid = pr.grid
    j = grid.index(min(ok, key=lambda v: abs(v - best)))
    ends = []
    for step, stop in ((-1, -1), (1, len(grid))):
        k = j
        while k + step != stop and pr.accepted(grid[k + step]):
            k += step
        v_in = grid[k]
        if k + step == stop:
            ends.append(v_in)
            continue
        v_out = grid[k + step]
        while abs(v_out - v_in) > PROFILE_XTOL * pr.top:
            mid = 0.5 * (v_in + v_out)
            v_in, v_out = (mid, v_out) if pr.accepted(mid) else (v_in, mid)
        ends.append(v_in)
    return min(ends[0], best), max(ends[1], best)


def predicted_reference(C, law: tuple[float, float, float], noise_var: float, *, seeds=None,
                        level: float = 0.95) -> PinnedLaw:
    """The law `fit_reference` would pin on a ladder at computes C (seeds: each run's) drawn from the law
    (L∞, A, α) with noise of variance `noise_var` per run, before it is run (the precision planner,
    analysis/calibration/precision.py): the same profile on the noise-free losses, with the noise stated."""
    from marin_ablate.analysis.fit.joint import fit_joint

    C = np.asarray(C, float)
    linf, A, alpha = law
    L = linf + A * C ** (-alpha)
    several = seeds is not None and len(set(np.asarray(seeds).tolist())) > 1
    seeds = np.asarray(seeds) if several else None
    free = fit_joint(C, L, np.zeros((len(L), 0)), [], seeds=seeds)
    return _profile(C, L, seeds, free, "", "", level, noise_var=noise_var)
