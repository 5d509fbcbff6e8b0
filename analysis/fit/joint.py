"""One fit of the reference law and the quality effects on every run (docs/method.md §4.1, *Joint law*):

    L_n = L∞ + a·exp(−α·u_n − κ·u_n²/2) + δ_seed(n) + ε_n,   u_n = ln(C_n/C0) + e_n·θ,

e_n·θ = ln M_flop of run n (zero at the all-off arm, so its curve is the reference law). κ = 0 is the power law
(Kaplan et al. 2020; Hoffmann et al. 2022); the "curved" form (Caballero et al. 2023) measures how much an
extrapolation depends on the law's form. Covariance: HC3 (MacKinnon & White 1985) and s²(JᵀJ)⁻¹, the larger
per contrast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from marin_ablate.analysis.fit.attribution import EffectsFit, Term, alias_structure, build_terms, design_matrix
from marin_ablate.analysis.fit.lsq import levenberg_marquardt
from marin_ablate.analysis.responses import law_column

FORMS = ("power", "curved")
#: A parameter whose variance inflation (bread_ii·(JᵀJ)_ii) exceeds this is "not identified".
NOT_IDENTIFIED_VIF = 1e6
#: Levenberg–Marquardt iterations per start (MINPACK: twice as many evaluations); a fit that reaches
#: it has not converged (the report warns).
MAX_ITER = 200


@dataclass
class JointFit:
    form: str
    c0: float
    names: list[str]  # parameter names, in order
    params: np.ndarray
    cov: np.ndarray  # HC3
    cov_model: np.ndarray  # s²(JᵀJ)⁻¹
    dof: int
    n: int
    resid: np.ndarray
    leverage: np.ndarray
    effect_cols: list[int]  # term indices of θ in the standard (intercept + logC) basis
    pinned: dict[str, float] = field(default_factory=dict)
    not_identified: list[str] = field(default_factory=list)
    converged: bool = True
    data: tuple | None = None  # (C, L, E, seeds) the fit saw: profile intervals refit on it
    # Runs sharing a random stream at one rung (seed × rung): their common loss shift is a random
    # effect the law's parameters see only through the cluster means (between_clusters).
    clusters: np.ndarray | None = None
    # J at the optimum: the precision planner's σ²(JᵀJ)⁻¹ (analysis/calibration/precision.py)
    jac: np.ndarray | None = None
    # The rung-shift part of cov_model (_cluster_term) and the df of the between-cluster mean square it rests
    # on: a contrast's t quantile takes the Satterthwaite df of its two variance parts (docs/method.md §4.4).
    cov_cluster: np.ndarray | None = None
    between_df: int = 0
    # L∞ and α pinned with a spread: the ellipse's part over (linf, ln a, alpha), pinned rows included (the band and A
    # see the pins move with ln a), and the valley's share of `cov` and its end laws (L∞, A, α), which they reach.
    cov_pins: np.ndarray | None = None
    cov_valley: np.ndarray | None = None
    # What every study sharing this law shares, added to cov and cov_model (`_widen`): the pins' spread and valley and
    # an unidentified curvature's envelope; the between-seed interval adds it to the seeds' scatter (replicates.py)
    cov_law: np.ndarray | None = None
    valley_laws: tuple = ()

    def get(self, name: str) -> float:
        return self.pinned[name] if name in self.pinned else float(self.params[self.names.index(name)])

    @property
    def linf(self) -> float:
        return self.get("linf")

    @property
    def alpha(self) -> float:
        return self.get("alpha")

    @property
    def kappa(self) -> float:
        return self.get("kappa") if "kappa" in self.names or "kappa" in self.pinned else 0.0

    @property
    def A(self) -> float:
        with np.errstate(over="ignore"):  # a bootstrap refit can drift to a huge A: inf, not an exception
            return float(np.exp(self.get("ln_a") + self.alpha * np.log(self.c0)))

    def contrast_var(self, g: np.ndarray) -> float:
        g = np.nan_to_num(g)
        return float(max(g @ self.cov @ g, g @ self.cov_model @ g, 0.0))

    def theta_std(self, n_terms: int, terms: list[Term]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(θ, cov, cov_model, T) in the standard basis (intercept, logC, effects) with f(all-off) ≡ 0."""
        T = np.zeros((n_terms, len(self.names)))
        for j, t in enumerate(self.effect_cols):
            col, kind = self.names.index(f"theta{j}"), terms[t].kind
            T[t, col] = 1.0
            if kind in ("main", "2fi"):  # f(all-off) ≡ 0: the intercept takes −(its value there)
                T[0, col] = 1.0 if kind == "main" else -1.0
            elif kind == "main_x_scale":
                T[next(i for i, tt in enumerate(terms) if tt.kind == "scale"), col] = 1.0
        return T @ self.params, T @ self.cov @ T.T, T @ self.cov_model @ T.T, T

    def law_block(self) -> tuple[np.ndarray, np.ndarray]:
        """(cov HC3, cov model) over (linf, ln a, alpha); a pinned parameter's rows are its pins' spread
        (`cov_pins`), zero when it was pinned as exact; a valley's part is left to `valley_laws`."""
        out = []
        pinned = [i for i, k in enumerate(("linf", "ln_a", "alpha")) if k in self.pinned]
        for cv in (self.cov, self.cov_model):
            c = np.zeros((3, 3))
            cv = cv - self.cov_valley if self.cov_valley is not None else cv
            ii = [i for i, k in enumerate(("linf", "ln_a", "alpha")) if k in self.names]
            pp = [self.names.index(("linf", "ln_a", "alpha")[i]) for i in ii]
            c[np.ix_(ii, ii)] = cv[np.ix_(pp, pp)]
            if self.cov_pins is not None:
                for i in pinned:
                    c[i, :], c[:, i] = self.cov_pins[i, :], self.cov_pins[:, i]
            out.append(c)
        return out[0], out[1]

    def loss_grad(self, C: float, e_row: np.ndarray) -> tuple[float, np.ndarray]:
        """Loss of an arm with effect row e_row (over θ) at compute C and its gradient over params."""
        th = self._theta()
        u = float(np.log(C / self.c0) + e_row @ th)
        f = float(np.exp(self.get("ln_a") - self.alpha * u - 0.5 * self.kappa * u * u))
        g = np.zeros(len(self.names))
        d = {"linf": 1.0, "ln_a": f, "alpha": -f * u, "kappa": -0.5 * f * u * u}
        for k, v in d.items():
            if k in self.names:
                g[self.names.index(k)] = v
        dth = -f * (self.alpha + self.kappa * u) * e_row
        for j in range(len(e_row)):
            g[self.names.index(f"theta{j}")] = dth[j]
        return self.linf + f, g

    def _theta(self) -> np.ndarray:
        return np.array([self.params[self.names.index(f"theta{j}")] for j in range(len(self.effect_cols))])

    def wald_ci(self, name: str, q: float) -> tuple[float, float]:
        if name in self.pinned:
            return (self.pinned[name],) * 2
        if name in self.not_identified or name not in self.names:
            return (np.nan, np.nan)
        i = self.names.index(name)
        se = np.sqrt(max(self.cov[i, i], self.cov_model[i, i]))
        return (float(self.params[i] - q * se), float(self.params[i] + q * se))


def effect_design(terms: list[Term], factors: list[str], kept: np.ndarray, X_nk: np.ndarray,
                  z_n: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Columns of the kept non-constant terms minus their value at the all-off arm: e_n with e·θ = ln M."""
    cols = [j for j in np.flatnonzero(kept) if terms[j].kind not in ("intercept", "scale")]
    D = design_matrix(terms, factors, X_nk, z_n) - design_matrix(terms, factors, -np.ones_like(X_nk), z_n)
    return D[:, cols], cols


def _seed_blocks(seeds) -> np.ndarray:
    if seeds is None:
        return np.zeros((0, 0))
    lev = list(dict.fromkeys(np.asarray(seeds).tolist()))
    if len(lev) < 2:
        return np.zeros((len(seeds), 0))
    s = np.asarray(seeds)
    B = np.zeros((len(s), len(lev) - 1))
    for j, v in enumerate(lev[1:]):
        B[:, j] = (s == v).astype(float) - (s == lev[0]).astype(float)
    return B


class _JointProblem:
    """The joint law's least squares: the free parameters' layout (law, κ, θ, seed blocks), residuals, Jacobian."""

    def __init__(self, C, L, E, seeds, form: str, pin_linf: float | None, pin_alpha: float | None):
        self.c0 = float(np.exp(np.mean(np.log(C))))
        self.x, self.L, self.E = np.log(C / self.c0), L, E
        self.pinned = pinned = {k: v for k, v in (("linf", pin_linf), ("alpha", pin_alpha)) if v is not None}
        self.B = _seed_blocks(seeds) if seeds is not None else np.zeros((len(L), 0))
        self.q, self.s = E.shape[1], self.B.shape[1]
        names = [k for k in ("linf", "ln_a", "alpha") if k not in pinned] + (["kappa"] if form == "curved" else [])
        self.names = names + [f"theta{j}" for j in range(self.q)] + [f"seed{j}" for j in range(self.s)]
        self.idx = {k: i for i, k in enumerate(self.names)}

    def unpack(self, p):
        idx, q, s = self.idx, self.q, self.s
        g = lambda k: self.pinned[k] if k in self.pinned else p[idx[k]]  # noqa: E731
        th = p[idx["theta0"]: idx["theta0"] + q] if q else np.zeros(0)
        de = p[len(self.names) - s:] if s else np.zeros(0)
        return g("linf"), p[idx["ln_a"]], g("alpha"), (p[idx["kappa"]] if "kappa" in idx else 0.0), th, de

    def resid(self, p):
        linf, la, al, ka, th, de = self.unpack(p)
        u = self.x + self.E @ th
        return linf + np.exp(la - al * u - 0.5 * ka * u * u) + self.B @ de - self.L

    def jac(self, p):
        linf, la, al, ka, th, de = self.unpack(p)
        idx, q, s = self.idx, self.q, self.s
        u = self.x + self.E @ th
        f = np.exp(la - al * u - 0.5 * ka * u * u)
        J = np.zeros((len(self.L), len(self.names)))
        cols = {"linf": np.ones_like(f), "ln_a": f, "alpha": -f * u, "kappa": -0.5 * f * u * u}
        for k, v in cols.items():
            if k in idx:
                J[:, idx[k]] = v
        if q:
            J[:, idx["theta0"]: idx["theta0"] + q] = (-f * (al + ka * u))[:, None] * self.E
        if s:
            J[:, len(self.names) - s:] = self.B
        return J


def fit_joint(C, L, E, effect_cols: list[int], *, form: str = "power", seeds=None, pin_linf: float | None = None,
              pin_alpha: float | None = None, start: JointFit | None = None, warm_only: bool = False,
              clusters=None, fast_refit: bool = False, pin_cov: np.ndarray | None = None,
              pin_valley: tuple = (), envelope: bool = False) -> JointFit:
    """Least-squares fit of the joint law; raises ValueError when the loss does not fall with compute. The variance
    parts beyond the sandwich (`_widen`): `pin_cov` and `pin_valley`, a reference ladder's pinned (L∞, α) covariance
    and accepted pairs (`pin_term`, `valley_term`); `envelope`, an unidentified curvature (`_curvature_term`).
    `warm_only`: start from `start` alone. `fast_refit`: solve by analysis/fit/lsq.py (linear in runs) for the
    bootstrap's warm refits; MINPACK stays the solver of every reported fit (where the rungs leave the law's curvature
    flat, where it stops decides whether α stays positive)."""
    if form not in FORMS:
        raise ValueError(f"form {form!r}; allowed values: {', '.join(FORMS)}")
    C, L, E = np.asarray(C, float), np.asarray(L, float), np.asarray(E, float)
    pb = _JointProblem(C, L, E, seeds, form, pin_linf, pin_alpha)
    best = _solve(pb, _starts(pb, start, warm_only), fast_refit)
    p = best.x
    al = pb.unpack(p)[2]
    if not al > 0:
        raise ValueError(f"the fitted law does not fall with compute (alpha = {al:.3g})")
    J, e = pb.jac(p), pb.resid(p)
    cov, cov_model, dof, h, ni, bread = _sandwich(J, e, pb.names)
    jf = JointFit(form=form, c0=pb.c0, names=pb.names, params=p, cov=cov, cov_model=cov_model, dof=dof, n=len(L),
                  resid=-e, leverage=h, effect_cols=list(effect_cols), pinned=pb.pinned, not_identified=ni,
                  converged=bool(best.success), data=(C, L, E, seeds),
                  clusters=None if clusters is None else np.asarray(clusters), jac=J)
    if not warm_only:
        _widen(jf, J, bread, pin_cov, pin_valley, envelope)
    return jf


def _starts(pb: _JointProblem, start: JointFit | None, warm_only: bool) -> list[np.ndarray]:
    """Where the solver starts: `start`'s parameters (a warm refit), then a cold start per α guess, the law's
    scale set through the mean loss (none when `warm_only` has a warm start)."""
    names, idx, L = pb.names, pb.idx, pb.L
    pin_linf, pin_alpha = pb.pinned.get("linf"), pb.pinned.get("alpha")
    starts = [] if start is None else [np.array([start.params[start.names.index(k)] if k in start.names else 0.0
                                                 for k in names])]
    span = max(float(np.ptp(L)), 1e-3)
    for al0 in (() if warm_only and starts else (pin_alpha,) if pin_alpha is not None else (0.1, 0.3, 0.8)):
        linf0 = pin_linf if pin_linf is not None else float(np.min(L)) - 0.5 * span
        p0 = np.zeros(len(names))
        if "linf" in idx:
            p0[idx["linf"]] = linf0
        p0[idx["ln_a"]] = np.log(max(float(np.mean(L)) - linf0, 1e-6))
        if "alpha" in idx:
            p0[idx["alpha"]] = al0
        starts.append(p0)
    return starts


def _solve(pb: _JointProblem, starts: list[np.ndarray], fast_refit: bool):
    """The least cost over the starts (MINPACK's Levenberg–Marquardt, or analysis/fit/lsq.py's for `fast_refit`);
    a start whose solver fails or leaves non-finite parameters is skipped."""
    best = None
    for p0 in starts:
        try:
            if fast_refit:
                r = levenberg_marquardt(pb.resid, pb.jac, p0, xtol=1e-12, ftol=1e-12, max_iter=MAX_ITER)
            else:
                r = optimize.least_squares(pb.resid, p0, jac=pb.jac, method="lm", xtol=1e-12, ftol=1e-12,
                                           max_nfev=2 * MAX_ITER)
        except (ValueError, FloatingPointError):
            continue
        if np.all(np.isfinite(r.x)) and (best is None or r.cost < best.cost - 1e-15):
            best = r
    if best is None:
        raise ValueError("the joint law fit failed on every start")
    return best


def _sandwich(J: np.ndarray, e: np.ndarray, names: list[str]) -> tuple:
    """(HC3 covariance, s²(JᵀJ)⁻¹, residual df, leverages, the law parameters not identified, (JᵀJ)⁻¹) at the
    optimum: a law parameter whose variance inflation reaches NOT_IDENTIFIED_VIF, or every one without df."""
    n = len(e)
    JtJ = J.T @ J
    bread = np.linalg.pinv(JtJ)
    rank = int(np.linalg.matrix_rank(J, tol=1e-10 * max(np.linalg.norm(J), 1e-300)))
    dof = n - rank
    h = np.clip(((J @ bread) * J).sum(1), 0, 1)
    safe = (1 - h) > 1e-8
    w = np.where(safe, e**2 / np.where(safe, 1 - h, 1) ** 2, 0.0)
    cov = bread @ ((J * w[:, None]).T @ J) @ bread
    s2 = float(e @ e) / dof if dof > 0 else np.nan
    vif = np.diag(bread) * np.diag(JtJ)
    ni = [k for i, k in enumerate(names) if k in LAW_PARAMS and not vif[i] < NOT_IDENTIFIED_VIF]
    if dof <= 0:
        ni = [k for k in names if k in LAW_PARAMS]
    return cov, s2 * bread, dof, h, ni, bread


def _widen(jf: JointFit, J: np.ndarray, bread: np.ndarray, pin_cov, pin_valley: tuple, envelope: bool) -> None:
    """The variance parts beyond the sandwich, added in place: the (seed × rung) shifts (`_cluster_term`), the
    pins' spread and valley (`pin_term`, `valley_term`), and an unidentified curvature (`_curvature_term`)."""
    if jf.clusters is not None:
        jf.cov_cluster = _cluster_term(jf, J, bread)
        jf.cov_model = jf.cov_model + jf.cov_cluster
        jf.between_df = int(between_clusters(jf)[1])
    law = np.zeros_like(jf.cov)
    if pin_cov is not None and jf.pinned:
        extra, jf.cov_pins = pin_term(jf, np.asarray(pin_cov, float))
        if len(pin_valley):
            jf.cov_valley, jf.valley_laws = valley_term(jf, pin_valley)
            extra = extra + jf.cov_valley
        law = law + extra
    L, ni = jf.data[1], set(jf.not_identified)
    if envelope and jf.form == "power" and "linf" in jf.names and jf.dof > 0 \
            and ({"alpha", "ln_a"} & ni or not 0.0 <= jf.linf < float(np.min(L))):
        law = law + _curvature_term(jf)
    jf.cov, jf.cov_model, jf.cov_law = jf.cov + law, jf.cov_model + law, law


#: L∞ values `_curvature_term` tries, as fractions of [0, smallest loss).
ENVELOPE_GRID = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95)


def _curvature_term(jf: JointFit, level: float = 0.95) -> np.ndarray:
    """Where the rungs do not fix the law's curvature: refit with L∞ held at each value of ENVELOPE_GRID the profile
    test (`profile_ci`) accepts and return Σ_v d_v d_vᵀ / q² over the two extreme accepted fits (d_v their shift), so
    each contrast's interval spans its value at every accepted curvature (docs/method.md §4.1). None accepted: the fit
    nearest the data's preference stands for them."""
    C, L, E, seeds = jf.data
    q = float(stats.t.ppf(0.5 + level / 2, max(jf.dof, 1)))
    rss0 = float(jf.resid @ jf.resid)
    allow = q * q * rss0 / jf.dof
    s2b, dfb = between_clusters(jf)
    if jf.clusters is not None and dfb > 0:
        allow = max(allow, float(stats.t.ppf(0.5 + level / 2, dfb)) ** 2 * s2b)
    fits = []
    for frac in ENVELOPE_GRID:
        v = frac * float(np.min(L))
        try:
            f = fit_joint(C, L, E, jf.effect_cols, form="power", seeds=seeds, pin_linf=v,
                          pin_alpha=jf.pinned.get("alpha"), clusters=jf.clusters)
        except ValueError:
            continue
        rss = float(f.resid @ f.resid)
        p = np.array([v if k == "linf" else f.params[f.names.index(k)] for k in jf.names])
        fits.append((rss - rss0 <= allow, rss, p))
    if not fits:
        return np.zeros((len(jf.names), len(jf.names)))
    ok = [p for a, _, p in fits if a] or [min(fits, key=lambda t: t[1])[2]]
    ends = [ok[0]] if len(ok) == 1 else [ok[0], ok[-1]]
    D = np.stack([p - jf.params for p in ends], 1)
    return D @ D.T / (q * q)


def pin_term(jf: JointFit, pin_cov: np.ndarray, z: float = 1.959963984540054) -> tuple[np.ndarray, np.ndarray]:
    """The pinned (L∞, α)'s covariance in every parameter (docs/method.md §4.1, *Into the study*): refit with the pins
    at the end of each principal axis of their 95% ellipse that moves the effects more and return Σ_k d_k d_kᵀ / z²
    (and the same over (linf, ln a, alpha)): the delta method where the fit is linear in the pins, each contrast's
    value at that end where it bends. An end a refit cannot reach is approached at half the step and extrapolated."""
    keys = [k for k in ("linf", "alpha") if k in jf.pinned]
    ii = [("linf", "alpha").index(k) for k in keys]
    sig = pin_cov[np.ix_(ii, ii)]
    C, L, E, seeds = jf.data
    lam, U = np.linalg.eigh(sig)
    eff = np.array([k.startswith("theta") for k in jf.names])  # the side is chosen by the effects' shift
    out, law = np.zeros((len(jf.names), len(jf.names))), np.zeros((3, 3))
    for k in range(len(keys)):
        if not lam[k] > 0:
            continue
        step = z * np.sqrt(lam[k]) * U[:, k]
        best = None
        for sgn in (1.0, -1.0):
            for frac in (1.0, 0.5, 0.25):
                kw = {"pin_linf": jf.pinned.get("linf"), "pin_alpha": jf.pinned.get("alpha"),
                      **{f"pin_{name}": jf.pinned[name] + sgn * frac * step[j] for j, name in enumerate(keys)}}
                try:
                    f = fit_joint(C, L, E, jf.effect_cols, form=jf.form, seeds=seeds, start=jf, warm_only=True,
                                  clusters=jf.clusters, **kw)
                except ValueError:
                    continue
                d = (f.params - jf.params) / frac
                if best is None or float(d[eff] @ d[eff]) > float(best[0][eff] @ best[0][eff]):
                    best = (d, {name: sgn * step[j] for j, name in enumerate(keys)})
                break
        if best is not None:
            out += np.outer(best[0], best[0]) / (z * z)
            d, pins = best  # (Δlinf, Δln a, Δalpha): free parameters from d, pinned ones from their own shift
            g = np.array([pins[k] if k in pins else d[jf.names.index(k)] if k in jf.names else 0.0
                          for k in ("linf", "ln_a", "alpha")])
            law += np.outer(g, g) / (z * z)
    return out, law


def valley_term(jf: JointFit, valley, z: float = 1.959963984540054) -> tuple[np.ndarray, tuple]:
    """The pinned law's valley in every parameter (docs/method.md §4.1, *Into the study*): with d_lo, d_hi the
    parameters' shifts refitted at its two ends, s = (d_hi − d_lo)/2, m = (d_hi + d_lo)/2 and r = ‖m‖/‖s‖ over the
    effects, (V = ((1 + r)·s sᵀ + (1 + 1/r)·m mᵀ) / z², the end laws (L∞, A, α)): z²·cᵀVc >= (|c·s| + |c·m|)²
    (Cauchy–Schwarz), so every contrast's 95% interval reaches its value at either end."""
    C, L, E, seeds = jf.data
    ends = [valley[0]] if len(valley) == 1 else [valley[0], valley[-1]]
    ds, laws = [], []
    for linf, alpha in ends:
        try:
            f = fit_joint(C, L, E, jf.effect_cols, form=jf.form, seeds=seeds, pin_linf=float(linf),
                          pin_alpha=float(alpha), start=jf, clusters=jf.clusters)
        except ValueError:  # this end's law does not fall over the study's rungs: the other end stands
            continue
        ds.append(f.params - jf.params)
        laws.append((f.linf, f.A, f.alpha))
    if len(ds) < 2:
        out = sum((np.outer(d, d) for d in ds), np.zeros((len(jf.names), len(jf.names))))
        return out / (z * z), tuple(laws)
    s, m = (ds[1] - ds[0]) / 2, (ds[1] + ds[0]) / 2
    eff = np.array([k.startswith("theta") for k in jf.names])
    eff = eff if eff.any() else np.ones_like(eff)
    ns, nm = float(np.linalg.norm(s[eff])), float(np.linalg.norm(m[eff]))
    r = nm / ns if nm > 0.0 and ns > 0.0 else 1.0  # any r > 0 keeps the bound; 1 is Σ_e d_e d_eᵀ
    return ((1 + r) * np.outer(s, s) + (1 + 1 / r) * np.outer(m, m)) / (z * z), tuple(laws)


def _cluster_term(jf: JointFit, J: np.ndarray, bread: np.ndarray) -> np.ndarray:
    """The covariance a (seed × rung) random shift adds: σ²_b·(JᵀJ)⁻¹(Σ_g s_g s_gᵀ)(JᵀJ)⁻¹, s_g the cluster's summed
    Jacobian rows, σ²_b = max(0, (s²_b − s²_w)/n̄) by moments (docs/method.md §4.4); zero without df for σ²_b."""
    s2b, dfb = between_clusters(jf)
    if dfb <= 0 or not np.isfinite(s2b) or jf.dof - dfb <= 0:
        return np.zeros_like(bread)
    labels, inv = np.unique(jf.clusters.astype(str), return_inverse=True)
    n_g = np.bincount(inv).astype(float)
    r = jf.resid
    r_g = np.bincount(inv, weights=r) / n_g
    s2w = float(np.sum((r - r_g[inv]) ** 2)) / (jf.dof - dfb)
    sig2b = max(0.0, (s2b - s2w) / float(np.mean(n_g)))
    if sig2b == 0.0:
        return np.zeros_like(bread)
    S = np.zeros((len(labels), J.shape[1]))
    np.add.at(S, inv, J)
    return sig2b * bread @ (S.T @ S) @ bread


LAW_PARAMS = ("linf", "ln_a", "alpha", "kappa")


def between_clusters(jf: JointFit) -> tuple[float, int]:
    """(mean square, df) of the residuals' cluster means: the split-plot "whole-plot" error (Box, Hunter & Hunter
    2005, §9; docs/method.md §4.4, *Law parameters: rung-level shifts*) the law's parameters, the seed blocks and
    the effects constant inside every cluster are fitted on. df ≤ 0: the clusters cannot separate the shifts from
    the law. Without clusters: (nan, 0)."""
    if jf.clusters is None:
        return np.nan, 0
    _, L, E, seeds = jf.data
    g = jf.clusters
    labels, inv = np.unique(g.astype(str), return_inverse=True)
    G = len(labels)
    n_g = np.bincount(inv, minlength=G).astype(float)
    mean = lambda v: np.bincount(inv, weights=v, minlength=G) / n_g  # noqa: E731
    r_g = mean(jf.resid)
    # an effect constant inside every cluster is a between-cluster parameter
    cols = [mean(E[:, j]) for j in range(E.shape[1]) if np.allclose(E[:, j], mean(E[:, j])[inv])]
    B = _seed_blocks(seeds) if seeds is not None else np.zeros((len(L), 0))
    cols += [mean(B[:, j]) for j in range(B.shape[1])]
    p_b = sum(k in jf.names for k in LAW_PARAMS)  # the law's own free parameters, each a cluster-level one
    if cols:
        M = np.column_stack(cols)
        p_b += int(np.linalg.matrix_rank(M, tol=1e-9 * max(np.linalg.norm(M), 1e-300)))
    df = G - p_b
    if df <= 0:
        return np.nan, df
    return float(n_g @ r_g**2) / df, df


def quality_design(X, z, factors, *, interactions: bool, scale: bool) -> tuple:
    """(terms, candidate design, alias structure, effect design E, its term indices) of the quality fit."""
    terms = build_terms(factors, interactions=interactions, scale=scale)
    Xf = design_matrix(terms, factors, X, z)
    al = alias_structure(Xf)
    E, cols = effect_design(terms, factors, al.kept, X, z)
    return terms, Xf, al, E, cols


def quality_fit(X, z, C, L, factors, *, interactions: bool, scale: bool, seeds=None, pins=(None, None),
                form: str = "power", start: JointFit | None = None,
                warm_only: bool = False, design: tuple | None = None, clusters=None, pin_cov=None,
                pin_valley: tuple = (), envelope: bool = False) -> tuple[EffectsFit, JointFit]:
    """The joint law + quality effects fit, its coefficients in the standard effects basis. `warm_only`: start from
    `start` alone with the fast solver (a bootstrap refit); `design`: `quality_design` of these rows when the caller has
    it; `pin_cov`, `pin_valley`, `envelope`: as `fit_joint`."""
    terms, Xf, al, E, cols = design or quality_design(X, z, factors, interactions=interactions, scale=scale)
    jf = fit_joint(C, L, E, cols, form=form, seeds=seeds, pin_linf=pins[0], pin_alpha=pins[1], start=start,
                   warm_only=warm_only, fast_refit=warm_only, clusters=clusters, pin_cov=pin_cov,
                   pin_valley=pin_valley, envelope=envelope)
    th, cov, cm, T = jf.theta_std(len(terms), terms)
    fit = EffectsFit(response=law_column(), factors=list(factors), terms=terms, alias=al, theta=th, cov=cov, dof=jf.dof,
                     n=len(L), resid=jf.resid, leverage=jf.leverage, X=Xf, method=f"joint law ({form}), HC3",
                     cov_model=cm)
    if jf.cov_cluster is not None and jf.between_df > 0 and np.any(jf.cov_cluster):
        fit.cov_between, fit.dof_between = T @ jf.cov_cluster @ T.T, jf.between_df
    if jf.cov_law is not None:
        fit.cov_law = T @ jf.cov_law @ T.T
    return fit, jf
