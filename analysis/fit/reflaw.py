"""A pinned reference law: L∞ and α fitted once on the baseline arm's own wide ladder (docs/method.md §4.1).

A design's rungs span too little compute (8x on CPU) to fix the law's curvature: two seeds of one
study then fit laws whose local slopes, and so every multiplier, differ by large factors. Marin pins
its law (L∞, α) from a separate compute-optimal baseline sweep over a wide span; so does this
harness: `sweeps/reference.py` runs the baseline arm on `Study.reference_rungs` once per machine and
configuration, this module fits L = L∞ + A·C^(−α) on it with the covariance of (L∞, α), and the
study's analysis pins both, refits A and every effect on its own runs, and adds the pinned
parameters' covariance to every effect by the delta method (analysis/fit/joint.py `fit_joint(pin_cov=)`).

A ladder whose loss does not bend (every CPU ladder: 64x of compute is a near-straight line in ln C)
fixes the law's local slope but not its curvature: every L∞ in a wide range fits, each with its own α,
and they agree on dL/dln C over the ladder's span to a few percent. Such a ladder pins the law along
that profile (`PinnedLaw.valley`: the accepted (L∞, α) pairs): the study fits at its best pair and
every multiplier's interval reaches its value at both ends of the valley (analysis/fit/joint.py `valley_term`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The file a study folder holds its pinned law in (a copy of the cached fit).
LAW_FILE = "reference_law.json"


@dataclass(frozen=True)
class PinnedLaw:
    """(L∞, α) of a reference ladder with their 2x2 covariance; A is refitted by every study."""

    linf: float
    alpha: float
    cov: np.ndarray  # 2x2 over (linf, alpha): the larger of HC3 and s²(JᵀJ)⁻¹ (by trace)
    A: float
    c_lo: float  # compute span of the ladder (FLOPs)
    c_hi: float
    n: int
    dof: int
    key: str = ""  # what determines it: a hash of the ladder's run ids
    created: str = ""  # UTC date the ladder's fit was written
    source: str = ""  # the cached file it was copied from
    # The (L∞, α) pairs of the ladder's profile that its data accept, by L∞, where the ladder fixes the
    # slope but not the curvature; empty where it identifies both (then `cov` is the whole spread).
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
        """The parameter's interval: t on the ladder's df, spanning the valley where there is one."""
        from scipy import stats

        q = float(stats.t.ppf(0.5 + level / 2, max(self.dof, 1)))
        i = ("linf", "alpha").index(name)
        vals = [v[i] for v in self.valley] or [getattr(self, name)]
        return (min(vals) - q * self.se(name), max(vals) + q * self.se(name))

    def slope(self, c: float) -> float:
        """dL/dln C of the pinned law at compute c (negative): what every multiplier rests on."""
        return -self.alpha * self.A * c ** (-self.alpha)

    def describe(self) -> str:
        """One line: what the ladder pinned and over what span (the run, the analysis and the report say it)."""
        span = f"{self.n} baseline runs over {self.c_lo:.3g}..{self.c_hi:.3g} FLOPs"
        lo, hi = self.ci("linf"), self.ci("alpha")
        if not self.valley:
            return (f"L∞ = {self.linf:.4g} [{lo[0]:.4g}, {lo[1]:.4g}], α = {self.alpha:.4g} [{hi[0]:.4g}, {hi[1]:.4g}] "
                    f"({span})")
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
        try:
            cov = np.asarray(d["cov"], float).reshape(2, 2)
            valley = tuple((float(a), float(b)) for a, b in d.get("valley", ()))
            return cls(float(d["linf"]), float(d["alpha"]), cov, float(d["A"]), float(d["c_lo"]), float(d["c_hi"]),
                       int(d["n"]), int(d["dof"]), str(d.get("key", "")), str(d.get("created", "")),
                       str(d.get("source", "")), valley)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"pinned reference law: field {e} missing or malformed; allowed: the file "
                             f"`marin-ablate run` writes ({LAW_FILE})") from None


def fit_reference(C, L, *, seeds=None, key: str = "", created: str = "", level: float = 0.95) -> PinnedLaw:
    """L = L∞ + A·C^(−α) on the baseline ladder's runs, with (L∞, α) pinned by their covariance where
    the ladder identifies both, else along the profile its data accept (`_valley`); ValueError when
    neither pins a falling law (too narrow a span, too few runs, or α's interval reaching 0). `seeds`:
    the runs' seeds, each a sum-to-zero loss shift (its own init and data order)."""
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
    bad = [] if jf is None else [k for k in ("linf", "alpha") if k in jf.not_identified]
    if jf is not None and not bad and 0.0 <= jf.linf < float(L.min()):
        ii = [jf.names.index("linf"), jf.names.index("alpha")]
        law = PinnedLaw(jf.linf, jf.alpha, _larger_cov(jf, ii), jf.A, float(C.min()), float(C.max()), len(L), jf.dof,
                        key, created)
        a_lo, _ = law.ci("alpha", level)
        l_lo, l_hi = law.ci("linf", level)
        if a_lo > 0 and l_lo >= 0 and l_hi < float(L.min()):
            return law
    return _valley(C, L, seeds, jf, key, created, level)


def _larger_cov(jf, ii: list[int]) -> np.ndarray:
    """The pins' covariance: the larger (by trace) of HC3 and s²(JᵀJ)⁻¹ over parameters `ii`."""
    cov_h = jf.cov[np.ix_(ii, ii)]
    cov_m = np.nan_to_num(jf.cov_model[np.ix_(ii, ii)])
    return cov_h if np.trace(cov_h) >= np.trace(cov_m) else cov_m


def _valley(C, L, seeds, free, key: str, created: str, level: float) -> PinnedLaw:
    """The ladder's profile over L∞ in [0, smallest loss) (analysis/fit/joint.py ENVELOPE_GRID): the pairs
    (L∞, α(L∞)) whose RSS the profile test accepts (t² on the residual df of the free fit) and whose α
    stays above 0 at `level`. The law is the best accepted pair, with α's conditional covariance;
    no accepted pair: ValueError."""
    from scipy import stats

    from marin_ablate.analysis.fit.joint import ENVELOPE_GRID, fit_joint

    fits = []
    for frac in ENVELOPE_GRID:
        try:
            fits.append(fit_joint(C, L, np.zeros((len(L), 0)), [], seeds=seeds, pin_linf=frac * float(L.min())))
        except ValueError:  # α <= 0 at this L∞
            continue
    rss = lambda f: float(f.resid @ f.resid)  # noqa: E731
    span = f"reference ladder over {C.min():.3g}..{C.max():.3g} FLOPs"
    if not fits:
        raise ValueError(f"{span}: the law does not fall with compute at any L∞ in [0, smallest loss "
                         f"{float(L.min()):.4g}); allowed: a ladder whose loss falls (a wider compute span)")
    rss0, dof = (rss(free), free.dof) if free is not None else (min(map(rss, fits)), fits[0].dof - 1)
    if dof <= 0:
        raise ValueError(f"{span}: {len(L)} runs leave no residual df; allowed: more rungs or seeds")
    q = float(stats.t.ppf(0.5 + level / 2, dof))
    ok = []
    for f in fits:
        i = f.names.index("alpha")
        se = float(np.sqrt(max(f.cov[i, i], np.nan_to_num(f.cov_model[i, i]), 0.0)))
        if rss(f) - rss0 <= q * q * rss0 / dof and f.alpha - q * se > 0:
            ok.append(f)
    if not ok:
        lo = fits[0]
        i = lo.names.index("alpha")
        raise ValueError(f"{span}: α = {lo.alpha:.4g} [{lo.alpha - q * np.sqrt(lo.cov_model[i, i]):.4g}, "
                         f"{lo.alpha + q * np.sqrt(lo.cov_model[i, i]):.4g}] at L∞ = 0 on {len(L)} runs, and no L∞ in "
                         f"[0, smallest loss {float(L.min()):.4g}) both fits and leaves α > 0: the interval leaves "
                         "α > 0 unsupported, so it cannot pin the law; allowed: more seeds or a wider span")
    best = min(ok, key=rss)
    i = best.names.index("alpha")
    cov = np.zeros((2, 2))
    cov[1, 1] = _larger_cov(best, [i])[0, 0]
    return PinnedLaw(best.linf, best.alpha, cov, best.A, float(C.min()), float(C.max()), len(L), dof, key, created,
                     valley=tuple((f.linf, f.alpha) for f in ok))


#: The most α a pinned law may have: language-model losses fall as C^(−0.05..0.5); beyond 3 a law is not a
#: loss curve but a tampered or foreign file.
ALPHA_MAX = 3.0


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def check_pinned(d, where: str, *, key: str | None = None, study: str | None = None) -> PinnedLaw:
    """A pinned law read from a file (`where` names it), checked like input: every number finite, L∞ >= 0,
    0 < α <= ALPHA_MAX, A > 0, 0 < c_lo < c_hi, n > dof >= 1, a symmetric positive semi-definite 2x2
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
             "dof": (lambda v: v >= 1 and float(v).is_integer(), "an integer >= 1"),
             "n": (lambda v: v > d.get("dof", 0) and float(v).is_integer(), "an integer > dof")}
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
