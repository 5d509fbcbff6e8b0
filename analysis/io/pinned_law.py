"""The pinned reference law as a record and a file (`reference_law.json`, docs/method.md §4.1): L∞ and α with their
spread along the ladder's profile valley (`PinnedLaw`, fitted by analysis/fit/reflaw.py), a published law as one
(`published`), and the file read like input (`check_pinned`, `read_pinned`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from marin_ablate.marin.schema import read_json_text

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
        return self.cov * (float(stats.t.ppf(0.975, max(self.dof, 1))) / float(stats.norm.ppf(0.975))) ** 2

    def se(self, name: str) -> float:
        i = ("linf", "alpha").index(name)
        return float(np.sqrt(max(self.cov[i, i], 0.0)))

    def ci(self, name: str, level: float = 0.95) -> tuple[float, float]:
        """The parameter's interval: the valley's span (L∞: its profile-likelihood interval), widened by t on the
        ladder's df times the spread across it (α)."""
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
    p = Path(study_dir) / LAW_FILE
    if not p.exists():
        return None
    try:
        d = read_json_text(p)
    except (OSError, ValueError) as e:
        raise ValueError(f"{str(p)!r} is damaged ({e}); delete it and run the study again to rewrite it") from None
    return check_pinned(d, str(p), study=study)
