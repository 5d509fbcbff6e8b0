"""A pinned reference law: L∞ and α fitted once on the baseline arm's own wide ladder (docs/method.md §4.1).

A design's rungs span too little compute (8x on CPU) to fix the law's curvature: two seeds of one
study then fit laws whose local slopes, and so every multiplier, differ by large factors. Marin pins
its law (L∞, α) from a separate compute-optimal baseline sweep over a wide span; so does this
harness: `sweeps/reference.py` runs the baseline arm on `Study.reference_rungs` once per machine and
configuration, this module fits L = L∞ + A·C^(−α) on it with the covariance of (L∞, α), and the
study's analysis pins both, refits A and every effect on its own runs, and adds the pinned
parameters' covariance to every effect by the delta method (analysis/joint.py `fit_joint(pin_cov=)`).
"""

from __future__ import annotations

import json
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
        from scipy import stats

        q = float(stats.t.ppf(0.5 + level / 2, max(self.dof, 1)))
        v = getattr(self, name)
        return (v - q * self.se(name), v + q * self.se(name))

    def to_dict(self) -> dict:
        return {"linf": self.linf, "alpha": self.alpha, "cov": np.asarray(self.cov).tolist(), "A": self.A,
                "c_lo": self.c_lo, "c_hi": self.c_hi, "n": self.n, "dof": self.dof, "key": self.key,
                "created": self.created, "source": self.source,
                "linf_ci": list(self.ci("linf")), "alpha_ci": list(self.ci("alpha"))}

    @classmethod
    def from_dict(cls, d: dict) -> "PinnedLaw":
        try:
            cov = np.asarray(d["cov"], float).reshape(2, 2)
            return cls(float(d["linf"]), float(d["alpha"]), cov, float(d["A"]), float(d["c_lo"]), float(d["c_hi"]),
                       int(d["n"]), int(d["dof"]), str(d.get("key", "")), str(d.get("created", "")),
                       str(d.get("source", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"pinned reference law: field {e} missing or malformed; allowed: the file "
                             f"`marin-ablate run` writes ({LAW_FILE})") from None


def fit_reference(C, L, *, seeds=None, key: str = "", created: str = "", level: float = 0.95) -> PinnedLaw:
    """L = L∞ + A·C^(−α) on the baseline ladder's runs; ValueError when the ladder does not identify
    L∞ and α (too narrow a span, or a loss that does not bend): it cannot pin a law then. `seeds`:
    the runs' seeds, each a sum-to-zero loss shift (its own init and data order)."""
    from analysis.joint import fit_joint

    C, L = np.asarray(C, float), np.asarray(L, float)
    if len(C) < 4 or len(np.unique(np.round(np.log(C), 6))) < 4:
        raise ValueError(f"reference ladder: {len(np.unique(np.round(np.log(C), 6)))} distinct computes; a pinned "
                         "law needs >= 4 (L∞, A, α and one residual df)")
    several = seeds is not None and len(set(np.asarray(seeds).tolist())) > 1
    jf = fit_joint(C, L, np.zeros((len(L), 0)), [], seeds=np.asarray(seeds) if several else None)
    bad = [k for k in ("linf", "alpha") if k in jf.not_identified]
    if bad or not 0.0 <= jf.linf < float(L.min()):
        raise ValueError(f"reference ladder over {C.min():.3g}..{C.max():.3g} FLOPs does not identify the law "
                         f"(L∞ = {jf.linf:.3g}, α = {jf.alpha:.3g}{', not identified: ' + ', '.join(bad) if bad else ''});"
                         " allowed: a ladder whose loss bends (a wider compute span)")
    ii = [jf.names.index("linf"), jf.names.index("alpha")]
    cov_h = jf.cov[np.ix_(ii, ii)]
    cov_m = np.nan_to_num(jf.cov_model[np.ix_(ii, ii)])
    cov = cov_h if np.trace(cov_h) >= np.trace(cov_m) else cov_m
    law = PinnedLaw(jf.linf, jf.alpha, cov, jf.A, float(C.min()), float(C.max()), len(L), jf.dof, key, created)
    a_lo, a_hi = law.ci("alpha", level)
    l_lo, l_hi = law.ci("linf", level)
    if not (a_lo > 0 and l_lo >= 0 and l_hi < float(L.min())):
        # an interval that reaches a law that does not fall (α <= 0) or past the losses pins nothing
        raise ValueError(f"reference ladder: L∞ = {law.linf:.4g} [{l_lo:.4g}, {l_hi:.4g}], α = {law.alpha:.4g} "
                         f"[{a_lo:.4g}, {a_hi:.4g}] on {len(L)} runs: the interval leaves α > 0 or L∞ in [0, smallest "
                         f"loss {float(L.min()):.4g}), so it cannot pin the law; allowed: more seeds or a wider span")
    return law


def read_pinned(study_dir: str | Path) -> PinnedLaw | None:
    """The pinned law a study folder holds (`run` copies it there), else None."""
    p = Path(study_dir) / LAW_FILE
    if not p.exists():
        return None
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{str(p)!r} is damaged ({e}); delete it and run the study again to rewrite it") from None
    return PinnedLaw.from_dict(d)
