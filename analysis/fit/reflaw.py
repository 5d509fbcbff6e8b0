"""A pinned reference law: L∞ and α fitted once on the baseline arm's own wide ladder (docs/method.md §4.1).

A design's rungs span too little compute (8x on CPU) to fix the law's curvature: two seeds of one
study then fit laws whose local slopes, and so every multiplier, differ by large factors. Marin pins
its law (L∞, α) from a separate compute-optimal baseline sweep over a wide span; so does this
harness: `sweeps/reference.py` runs the baseline arm on `Study.reference_rungs` once per machine and
configuration, this module fits L = L∞ + A·C^(−α) on it, and the study's analysis pins (L∞, α), refits
A and every effect on its own runs, and carries the pins' uncertainty into every effect.

One mechanism for every ladder: the profile likelihood over L∞ (α, A refitted at each value), whose
accepted pairs (`PinnedLaw.valley`) follow the likelihood's curved valley. A ladder that sees its loss
bend accepts a short arc; one whose loss does not bend (every CPU ladder: 64x of compute is a
near-straight line in ln C) fixes the local slope but not the curvature and accepts every L∞ down to 0,
each with its own α, all agreeing on dL/dln C over the ladder's span. Either way the study fits at the
best pair and every multiplier's interval reaches its value at both ends of the valley
(analysis/fit/joint.py `valley_term`), plus α's spread across it (`pin_term`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The file a study folder holds its pinned law in (a copy of the cached fit).
LAW_FILE = "reference_law.json"


@dataclass(frozen=True)
class PinnedLaw:
    """(L∞, α) of a reference ladder with their 2x2 covariance; A is refitted by every study."""

    linf: float
    alpha: float
    cov: np.ndarray  # 2x2 over (linf, alpha): α's variance at the pinned L∞ (the spread across the valley)
    A: float
    c_lo: float  # compute span of the ladder (FLOPs)
    c_hi: float
    n: int
    dof: int
    key: str = ""  # what determines it: a hash of the ladder's run ids
    created: str = ""  # UTC date the ladder's fit was written
    source: str = ""  # the cached file it was copied from
    # The (L∞, α(L∞)) pairs of the ladder's profile likelihood that its data accept, by L∞: the spread along
    # the valley. A law built in code with none carries `cov` alone; a file without one is the former
    # straight-ellipse rule's (refused by `from_dict`).
    valley: tuple[tuple[float, float], ...] = ()

    @property
    def cov_propagated(self) -> np.ndarray:
        """The covariance the study's intervals carry: `cov` scaled by (t(dof)/z)² at 95%, so the pins'
        few residual df (a 7-rung ladder leaves 4) widen the multipliers as they widen the law's own interval."""
        from scipy import stats

        return self.cov * (float(stats.t.ppf(0.975, max(self.dof, 1))) / float(stats.norm.ppf(0.975))) ** 2

    def se(self, name: str) -> float:
        i = ("linf", "alpha").index(name)
        return float(np.sqrt(max(self.cov[i, i], 0.0)))

    def ci(self, name: str, level: float = 0.95) -> tuple[float, float]:
        """The parameter's interval: the valley's span (L∞: its profile-likelihood interval), widened by t on the
        ladder's df times the spread across it (α)."""
        from scipy import stats

        q = float(stats.t.ppf(0.5 + level / 2, max(self.dof, 1)))
        i = ("linf", "alpha").index(name)
        vals = [v[i] for v in self.valley] or [getattr(self, name)]
        return (min(vals) - q * self.se(name), max(vals) + q * self.se(name))

    def slope(self, c: float) -> float:
        """dL/dln C of the pinned law at compute c (negative): what every multiplier rests on."""
        return -self.alpha * self.A * c ** (-self.alpha)

    @property
    def is_published(self) -> bool:
        """Pinned from a published law (`published`), not fitted on a baseline ladder here."""
        return self.key == PUBLISHED_KEY

    @property
    def origin(self) -> str:
        """Where the pins come from, in the words the notes use: a published law and its source, or the baseline
        arm's own ladder and the date of its fit."""
        if self.is_published:
            return f"a published law ({self.source})"
        return f"the baseline arm's own ladder (fitted {self.created})"

    def describe(self) -> str:
        """One line: what the ladder pinned and over what span (the run, the analysis and the report say it)."""
        span = f"{self.n} baseline runs over {self.c_lo:.3g}..{self.c_hi:.3g} FLOPs"
        if self.is_published:  # its authors' numbers: no profile of ours, no interval of theirs
            return (f"L∞ = {self.linf:.4g}, α = {self.alpha:.4g} as published ({span}, no interval stated); every "
                    "multiplier reads through these two values")
        if not self.valley or self.valley[0][0] > 0.0:  # the profile closes above L∞ = 0: the curvature is bounded
            lo, hi = self.ci("linf"), self.ci("alpha")
            return (f"L∞ = {self.linf:.4g} [{lo[0]:.4g}, {lo[1]:.4g}], α = {self.alpha:.4g} [{hi[0]:.4g}, {hi[1]:.4g}] "
                    f"(the L∞ its profile likelihood accepts, α refitted along it: {span}); every multiplier's "
                    "interval reaches its value at both ends")
        (l0, a0), (l1, a1) = self.valley[0], self.valley[-1]
        return (f"its local slope, not its curvature ({span} do not fix how the loss bends): every L∞ from {l0:.4g} "
                f"to {l1:.4g} fits, with α from {a0:.4g} to {a1:.4g}; fitted at L∞ = {self.linf:.4g}, "
                f"α = {self.alpha:.4g}; every multiplier's interval reaches its value at both ends")

    def to_dict(self) -> dict:
        return {"linf": self.linf, "alpha": self.alpha, "cov": np.asarray(self.cov).tolist(), "A": self.A,
                "c_lo": self.c_lo, "c_hi": self.c_hi, "n": self.n, "dof": self.dof, "key": self.key,
                "created": self.created, "source": self.source, "valley": [list(v) for v in self.valley],
                "linf_ci": list(self.ci("linf")), "alpha_ci": list(self.ci("alpha"))}

    @classmethod
    def from_dict(cls, d: dict) -> "PinnedLaw":
        if isinstance(d, dict) and "cov" in d and not d.get("valley"):
            raise ValueError(f"pinned reference law: no `valley` (written by the former straight-ellipse rule); "
                             f"allowed: a {LAW_FILE} with its accepted (L∞, α) pairs: run `marin-ablate run` on the "
                             "study again (it refits the cached ladder, its runs reused), or analyze with "
                             "--no-pinned-law")
        try:
            cov = np.asarray(d["cov"], float).reshape(2, 2)
            valley = tuple((float(a), float(b)) for a, b in d.get("valley", ()))
            return cls(float(d["linf"]), float(d["alpha"]), cov, float(d["A"]), float(d["c_lo"]), float(d["c_hi"]),
                       int(d["n"]), int(d["dof"]), str(d.get("key", "")), str(d.get("created", "")),
                       str(d.get("source", "")), valley)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"pinned reference law: field {e} missing or malformed; allowed: the file "
                             f"`marin-ablate run` writes ({LAW_FILE})") from None


#: The key of a pinned law copied from a published one (`published`); a ladder's key is a hash of its run ids
PUBLISHED_KEY = "published"


def published(p: Any, created: str = "") -> PinnedLaw:
    """A published law (`ablations.ladders.PublishedLaw`: L∞, α, A, its span and runs, its source) as a pinned
    law with no covariance of its own (its authors state none): reading every arm through their L∞ and α is
    what makes a multiplier theirs to compare. Its valley is that one pair."""
    return PinnedLaw(float(p.linf), float(p.alpha), np.zeros((2, 2)), float(p.A), float(p.c_lo), float(p.c_hi),
                     int(p.n), max(int(p.n) - 2, 0), key=PUBLISHED_KEY, created=created, source=str(p.source),
                     valley=((float(p.linf), float(p.alpha)),))


def fit_reference(C, L, *, seeds=None, key: str = "", created: str = "", level: float = 0.95) -> PinnedLaw:
    """L = L∞ + A·C^(−α) on the baseline ladder's runs, pinned along its profile likelihood (`_profile`):
    the (L∞, α(L∞)) pairs whose fit the data accept, at whatever width the ladder leaves them — a short
    arc where it identifies the law, the whole range [0, smallest loss) where it fixes only the slope.
    ValueError when no L∞ there fits a falling law (too narrow a span, too few runs, or α's interval
    reaching 0). `seeds`: the runs' seeds, each a sum-to-zero loss shift (its own init and data order)."""
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
    """The ladder's profile likelihood over L∞ in [0, smallest loss): at each L∞, α, A and the seed
    shifts refitted. A pair (L∞, α(L∞)) is accepted when RSS(L∞) − RSS_min <= t²(df)·RSS_min/df (the
    F(1, df) test, RSS_min the free fit's where it converges, df the ladder's residual df) and α stays
    above 0 at `level` (its conditional interval). The accepted L∞ form one interval, located by
    bisection between the grid's neighbours; the law is the accepted pair of least RSS (the free fit
    where it lies in range), with α's conditional covariance; the valley is VALLEY_POINTS accepted pairs
    from end to end. It follows the likelihood's curved valley, so every pair on it fits the ladder;
    a straight ellipse's ends need not. No accepted pair: ValueError. `noise_var`: a run's noise variance
    stated rather than measured (`predicted_reference`: RSS_min/df replaced by it, α's variance noise_var·(JᵀJ)⁻¹)."""
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


#: The most α a pinned law may have: language-model losses fall as C^(−0.05..0.5); beyond 3 a law is not a
#: loss curve but a tampered or foreign file.
ALPHA_MAX = 3.0


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def check_pinned(d, where: str, *, key: str | None = None, study: str | None = None) -> PinnedLaw:
    """A pinned law read from a file (`where` names it), checked like input: every number finite, L∞ >= 0,
    0 < α <= ALPHA_MAX, A > 0, 0 < c_lo < c_hi, n >= dof >= 0, a symmetric positive semi-definite 2x2
    covariance, the valley's pairs admissible, and (when given) the ladder `key` and the `study` it was
    copied for. ValueError naming the file, the field and the allowed values."""
    def bad(field: str, allowed: str) -> ValueError:
        v = d.get(field) if isinstance(d, dict) else None
        return ValueError(f"{where}: field {field!r} is {v!r}; allowed values: {allowed} (delete the file: the next "
                          "`marin-ablate run` refits it from the baseline ladder's runs)")

    if not isinstance(d, dict):
        raise ValueError(f"{where}: a JSON object was expected, got {type(d).__name__}")
    rules = {"linf": (lambda v: v >= 0, "a finite number >= 0 (a loss)"),
             "alpha": (lambda v: 0 < v <= ALPHA_MAX, f"a finite number in (0, {ALPHA_MAX:g}]"),
             "A": (lambda v: v > 0, "a finite number > 0"), "c_lo": (lambda v: v > 0, "a finite number > 0 (FLOPs)"),
             "c_hi": (lambda v: v > d.get("c_lo", 0), "a finite number > c_lo (FLOPs)"),
             "dof": (lambda v: v >= 0 and float(v).is_integer(), "an integer >= 0"),
             "n": (lambda v: v >= max(d.get("dof", 0), 1) and float(v).is_integer(), "an integer >= dof, >= 1")}
    for field, (ok, allowed) in rules.items():
        if not (_finite(d.get(field)) and ok(d[field])):
            raise bad(field, allowed)
    cov = d.get("cov")
    shape_ok = (isinstance(cov, list) and len(cov) == 2 and all(isinstance(r, list) and len(r) == 2 for r in cov)
                and all(_finite(x) for r in cov for x in r))
    c = np.asarray(cov, float) if shape_ok else None
    if c is None or not np.allclose(c, c.T, rtol=1e-9, atol=0) or min(np.diag(c)) < 0 \
            or np.linalg.eigvalsh(c).min() < -1e-12 * max(float(np.abs(c).max()), 1e-300):
        raise bad("cov", "a symmetric positive semi-definite 2x2 matrix of finite numbers (the covariance of L∞, α)")
    valley = d.get("valley", [])
    if not (isinstance(valley, list) and all(isinstance(v, list) and len(v) == 2 and all(map(_finite, v))
                                             and v[0] >= 0 and 0 < v[1] <= ALPHA_MAX for v in valley)):
        raise bad("valley", f"a list of [L∞ >= 0, α in (0, {ALPHA_MAX:g}]] pairs")
    for field in ("key", "created", "source", "study"):
        if not isinstance(d.get(field, ""), str):
            raise bad(field, "a string")
    if key is not None and d.get("key") != key:
        raise ValueError(f"{where}: its ladder key is {d.get('key')!r}, not {key!r} (this study's baseline ladder): "
                         "the law of another ladder; delete the file and run again")
    if study is not None and d.get("study") not in (None, study):
        raise ValueError(f"{where}: pinned for study {d.get('study')!r}, not {study!r} (this folder's): another "
                         "study's law; delete the file and run again, or analyze with --no-pinned-law")
    return PinnedLaw.from_dict(d)


def read_pinned(study_dir: str | Path, study: str | None = None) -> PinnedLaw | None:
    """The pinned law a study folder holds (`run` copies it there, naming the study), checked
    (`check_pinned`, against `study` when given), else None."""
    from marin_ablate.marin.schema import read_json_text

    p = Path(study_dir) / LAW_FILE
    if not p.exists():
        return None
    try:
        d = read_json_text(p)
    except (OSError, ValueError) as e:
        raise ValueError(f"{str(p)!r} is damaged ({e}); delete it and run the study again to rewrite it") from None
    return check_pinned(d, str(p), study=study)
