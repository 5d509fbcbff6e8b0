"""The reference law L(C) = L∞ + A·C^(−α) and the quality multiplier M_flop = C_eq/C (docs/method.md §4.1–2).

The fit profiles α: for fixed α the law is linear in (L∞, a) with L = L∞ + a·(C/C0)^(−α), C0 the
geometric mean of the compute (conditioning), A = a·C0^α. A grid over α then a golden-section
refinement finds the least-squares optimum; robustness is Huber IRLS (a few reweightings with a
MAD scale). L∞ and α can be pinned, as Marin pins them for single-rung studies. CIs come from a
wild bootstrap (Rademacher signs on leverage-free residuals) so one run per rung is enough.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ALPHA_GRID = np.exp(np.linspace(np.log(0.02), np.log(2.0), 96))


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
    boot: np.ndarray | None = None  # (B, 3): linf, A, alpha
    rss: float = 0.0
    profile: dict[str, tuple[float, float]] = field(default_factory=dict)  # 95% profile-likelihood CIs
    # Parameters the data cannot pin down: their interval is "not identified", never a number.
    not_identified: list[str] = field(default_factory=list)
    dof: int | None = None
    why: str = ""  # why L∞/α are not identified, when the reason is the design (a line for the report)
    between_df: int | None = None  # df of the (seed × rung) cluster means the L∞/α intervals rest on

    @property
    def log_a(self) -> float:
        return float(np.log(self.A) - self.alpha * np.log(self.c0))

    def predict(self, C) -> np.ndarray:
        return self.linf + self.A * np.asarray(C, float) ** (-self.alpha)

    def ci(self, name: str, level: float = 0.95, method: str = "profile") -> tuple[float, float]:
        """95% interval of linf, A or alpha: profile likelihood (F-based, default) or percentile bootstrap.

        The profile interval is what the law's CIs mean in the report: with 3 strongly correlated
        parameters the bootstrap percentile interval is too narrow on short ladders (measured
        ~73% coverage of a 6-rung ladder, profile ~93%; see tests/test_analysis_scaling.py).
        """
        idx = {"linf": 0, "A": 1, "alpha": 2}
        if name not in idx:
            raise ValueError(f"name {name!r}; allowed values: linf, A, alpha")
        if method not in ("profile", "boot"):
            raise ValueError(f"method {method!r}; allowed values: profile, boot")
        if name in self.pinned:
            v = getattr(self, name)
            return (v, v)
        if name in self.not_identified or (name == "A" and {"linf", "alpha"} & set(self.not_identified)):
            return (float("nan"), float("nan"))
        if method == "profile" and level == 0.95 and name in self.profile:
            return self.profile[name]
        if self.boot is None:
            return (float("nan"), float("nan"))  # no interval is honest here, a zero-width one is not
        q = (1 - level) / 2
        lo, hi = np.nanquantile(self.boot[:, idx[name]], [q, 1 - q])
        return (float(lo), float(hi))

    def band(self, C, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise bootstrap band of the fitted curve."""
        C = np.asarray(C, float)
        if self.boot is None:  # delta method over (linf, ln a, alpha)
            from scipy import stats

            p = self.predict(C)
            f = self.A * C ** (-self.alpha)
            G = np.stack([np.ones_like(C), f, -f * np.log(C / self.c0)], 1)
            se = np.sqrt(np.clip(np.einsum("ij,jk,ik->i", G, np.nan_to_num(self.cov), G), 0, None))
            qt = stats.t.ppf(0.5 + level / 2, max(self.dof or self.n - 3, 1))
            return p - qt * se, p + qt * se
        curves = self.boot[:, [0]] + self.boot[:, [1]] * C[None, :] ** (-self.boot[:, [2]])
        q = (1 - level) / 2
        return np.nanquantile(curves, q, axis=0), np.nanquantile(curves, 1 - q, axis=0)

    def to_dict(self) -> dict:
        d = {"linf": self.linf, "A": self.A, "alpha": self.alpha, "c0": self.c0, "n": self.n,
             "pinned": dict(self.pinned)}
        for k in ("linf", "A", "alpha"):
            d[f"{k}_ci"] = list(self.ci(k))
        return d


def _wls_fixed_alpha(x, y, w, alpha, linf_pin):
    """Weighted LS of y on [1, exp(−alpha·x)] (or on exp(−alpha·x) with L∞ pinned); returns (linf, a, rss)."""
    f = np.exp(-alpha * x)
    wf = w * f
    if linf_pin is not None:
        r = y - linf_pin
        a = (wf @ r) / (wf @ f)
        e = r - a * f
        return linf_pin, a, float(w @ (e * e))
    sw, sf, sy, sff, sfy = w.sum(), wf.sum(), w @ y, wf @ f, wf @ y
    det = sw * sff - sf * sf
    if det <= 1e-300:
        return np.nan, np.nan, np.inf
    a = (sw * sfy - sf * sy) / det
    linf = (sy - a * sf) / sw
    e = y - linf - a * f
    return linf, a, float(w @ (e * e))


def _fit_weighted(x, y, w, linf_pin, alpha_pin):
    if alpha_pin is not None:
        linf, a, rss = _wls_fixed_alpha(x, y, w, alpha_pin, linf_pin)
        return linf, a, alpha_pin, rss
    # Vectorised profile over the α grid, then golden-section refinement around the best point.
    F = np.exp(-ALPHA_GRID[:, None] * x[None, :])  # (G, n)
    if linf_pin is not None:
        r = y - linf_pin
        a = (F * (w * r)).sum(1) / (F * F * w).sum(1)
        rss = ((r[None] - a[:, None] * F) ** 2 * w).sum(1)
    else:
        sw, sy = w.sum(), (w * y).sum()
        sf, sff, sfy = (F * w).sum(1), (F * F * w).sum(1), (F * (w * y)).sum(1)
        det = sw * sff - sf * sf
        a = (sw * sfy - sf * sy) / det
        linf = (sy - a * sf) / sw
        rss = ((y[None] - linf[:, None] - a[:, None] * F) ** 2 * w).sum(1)
    rss = np.where(a > 0, rss, np.inf)  # a loss that falls with compute
    g = int(np.nanargmin(rss))
    lo, hi = np.log(ALPHA_GRID[max(g - 1, 0)]), np.log(ALPHA_GRID[min(g + 1, len(ALPHA_GRID) - 1)])
    phi = (np.sqrt(5) - 1) / 2
    obj = lambda la: _wls_fixed_alpha(x, y, w, np.exp(la), linf_pin)[2]  # noqa: E731
    c, d = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fc, fd = obj(c), obj(d)
    while hi - lo > 2e-5:  # ln α to ~1e-5: far below any bootstrap spread
        if fc < fd:
            hi, d, fd = d, c, fc
            c = hi - phi * (hi - lo)
            fc = obj(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + phi * (hi - lo)
            fd = obj(d)
    alpha = float(np.exp((lo + hi) / 2))
    linf, a, rss = _wls_fixed_alpha(x, y, w, alpha, linf_pin)
    return linf, a, alpha, rss


def _fit_core(x, y, linf_pin, alpha_pin, robust: bool, huber_k: float = 2.5):
    # Huber k = 2.5 (not the 95%-efficiency 1.345): on Gaussian ladders it almost never reweights,
    # so the profile intervals keep their coverage, yet a diverged run is still pulled in.
    w = np.ones_like(y)
    linf, a, alpha, rss = _fit_weighted(x, y, w, linf_pin, alpha_pin)
    if robust and len(y) > 4:
        for _ in range(4):
            r = y - linf - a * np.exp(-alpha * x)
            s = 1.4826 * np.median(np.abs(r - np.median(r)))
            if not np.isfinite(s) or s <= 0:
                break
            u = np.abs(r) / (huber_k * s)
            w = np.where(u <= 1, 1.0, 1.0 / np.maximum(u, 1e-12))
            linf, a, alpha, rss = _fit_weighted(x, y, w, linf_pin, alpha_pin)
    return linf, a, alpha, rss, w


def fit_law(C, L, *, pin_linf: float | None = None, pin_alpha: float | None = None, robust: bool = True,
            n_boot: int = 200, seed: int = 0, profile: bool = True) -> LawFit:
    """Fit L = L∞ + A·C^(−α) to (compute, loss) pairs; robust (Huber); profile-likelihood CIs
    (F-based, at the final robust weights) and a wild bootstrap (bands, propagation)."""
    C = np.asarray(C, float)
    L = np.asarray(L, float)
    ok = np.isfinite(C) & np.isfinite(L) & (C > 0)
    C, L = C[ok], L[ok]
    n_free = 3 - (pin_linf is not None) - (pin_alpha is not None)
    n_c = len(np.unique(np.round(np.log(C), 6)))
    if n_c < n_free:
        raise ValueError(
            f"the reference law needs at least {n_free} distinct compute values for {n_free} free "
            f"parameters, got {n_c} (baseline arm rungs); pin alpha and/or linf (--pin-alpha, --pin-linf)")
    c0 = float(np.exp(np.mean(np.log(C))))
    x = np.log(C / c0)
    linf, a, alpha, rss, w = _fit_core(x, L, pin_linf, pin_alpha, robust)
    if not np.isfinite(a) or a <= 0:
        raise ValueError("the reference law fit failed: the baseline loss does not fall with compute")
    # Gauss-Newton covariance over the free parameters (linf, ln a, alpha).
    f = np.exp(-alpha * x)
    J = np.stack([np.ones_like(x), a * f, -a * f * x], 1)
    free = [pin_linf is None, True, pin_alpha is None]
    Jf = J[:, free] * np.sqrt(w)[:, None]
    dof = max(len(L) - sum(free), 1)
    r = L - linf - a * f
    s2 = float(np.sum(w * r**2) / dof)
    cov = np.zeros((3, 3))
    try:
        cov_f = s2 * np.linalg.inv(Jf.T @ Jf)
        idx = np.flatnonzero(free)
        cov[np.ix_(idx, idx)] = cov_f
    except np.linalg.LinAlgError:
        cov[:] = np.nan
    pinned = {k: v for k, v in (("linf", pin_linf), ("alpha", pin_alpha)) if v is not None}
    fit = LawFit(linf=float(linf), A=float(a * c0**alpha), alpha=float(alpha), c0=c0, cov=cov, n=len(L),
                 pinned=pinned, rss=float(rss))
    if profile and len(L) > n_free:
        fit.profile = _profile_cis(x, L, w, c0, linf, a, alpha, rss, pin_linf, pin_alpha, n_free)
    if n_boot > 0 and len(L) > n_free:
        fit.boot = _wild_boot(x, L, linf, a, alpha, c0, pin_linf, pin_alpha, robust, n_boot, seed, n_free)
    return fit


def _profile_rss_A(x, y, w, c0, A, alpha_pin):
    """min over (L∞, α) of the weighted RSS with A fixed: L∞ closed form, α by grid + golden section."""
    lnA = np.log(A)

    def rss_at(al):
        f = np.exp(lnA - al * (x + np.log(c0)))
        r = y - f
        li = (w @ r) / w.sum()
        e = r - li
        return float(w @ (e * e))

    if alpha_pin is not None:
        return rss_at(alpha_pin)
    grid = ALPHA_GRID
    R = y[None, :] - np.exp(lnA - grid[:, None] * (x + np.log(c0))[None, :])
    R = R - ((R @ w) / w.sum())[:, None]
    vals = (R * R) @ w
    g = int(np.argmin(vals))
    lo, hi = np.log(grid[max(g - 1, 0)]), np.log(grid[min(g + 1, len(grid) - 1)])
    phi = (np.sqrt(5) - 1) / 2
    for _ in range(16):
        c, d = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if rss_at(np.exp(c)) < rss_at(np.exp(d)):
            hi = d
        else:
            lo = c
    return min(rss_at(np.exp((lo + hi) / 2)), float(vals[g]))


def _profile_cis(x, y, w, c0, linf, a, alpha, rss, pin_linf, pin_alpha, n_free, level=0.95):
    """Profile-likelihood intervals {θ: RSS_prof(θ) ≤ RSS_min·(1 + F₁,ₙ₋ₚ/(n − p))} (Bates & Watts 1988)."""
    from scipy import stats

    n = len(y)
    dof = max(n - n_free, 1)
    thr = rss * (1 + stats.f.ppf(level, 1, dof) / dof)
    A = a * c0**alpha
    prof = {
        "alpha": (lambda v: _wls_fixed_alpha(x, y, w, v, pin_linf)[2], alpha, True, (1e-4, 5.0)),
        "linf": (lambda v: _fit_weighted(x, y, w, v, pin_alpha)[3], linf, False, (linf - 50 * max(abs(linf), 1), float(np.min(y)) - 1e-9)),
        "A": (lambda v: _profile_rss_A(x, y, w, c0, v, pin_alpha), A, True, (A * 1e-6, A * 1e6)),
    }
    out = {}
    for name, (fn, est, logsp, (lim_lo, lim_hi)) in prof.items():
        if (name == "alpha" and pin_alpha is not None) or (name == "linf" and pin_linf is not None):
            continue
        fwd = (lambda u: np.exp(u)) if logsp else (lambda u: u)
        inv = (lambda v: np.log(v)) if logsp else (lambda v: v)
        u0 = inv(est)
        bounds = []
        for sign, lim in ((-1, lim_lo), (1, lim_hi)):
            ul = inv(lim)
            step = 0.02 if logsp else 0.02 * max(abs(est), 1e-3)
            inside, outside = u0, None
            while True:
                u = u0 + sign * step
                if (u - ul) * sign >= 0:
                    u = ul
                if fn(fwd(u)) > thr:
                    outside = u
                    break
                inside = u
                if u == ul:
                    break
                step *= 2
            if outside is None:
                bounds.append(fwd(ul) if name != "linf" or sign > 0 else -np.inf)
                continue
            for _ in range(22):  # bracket / 4e6: far below the interval's own uncertainty
                mid = (inside + outside) / 2
                if fn(fwd(mid)) > thr:
                    outside = mid
                else:
                    inside = mid
            bounds.append(float(fwd((inside + outside) / 2)))
        out[name] = (float(bounds[0]), float(bounds[1]))
    return out


def _wild_boot(x, L, linf, a, alpha, c0, pin_linf, pin_alpha, robust, n_boot, seed, n_free):
    rng = np.random.default_rng(seed)
    fitted = linf + a * np.exp(-alpha * x)
    # Inflate residuals by sqrt(n/(n−p)) so the bootstrap spread is not biased low for small ladders.
    res = (L - fitted) * np.sqrt(len(L) / max(len(L) - n_free, 1))
    out = np.full((n_boot, 3), np.nan)
    for b in range(n_boot):
        yb = fitted + res * rng.choice((-1.0, 1.0), size=len(L))
        lb, ab, alb, _, _ = _fit_core(x, yb, pin_linf, pin_alpha, robust)
        if np.isfinite(ab) and ab > 0:
            out[b] = (lb, ab * c0**alb, alb)
    return out


def log_multiplier(L, C, law: LawFit) -> np.ndarray:
    """ln M_flop = ln C_eq − ln C with C_eq = ((L − L∞)/A)^(−1/α); NaN where L ≤ L∞."""
    L = np.asarray(L, float)
    C = np.asarray(C, float)
    gap = L - law.linf
    with np.errstate(invalid="ignore", divide="ignore"):
        ln_ceq = -(np.log(gap) - np.log(law.A)) / law.alpha
        return np.where(gap > 0, ln_ceq - np.log(C), np.nan)


def log_multiplier_jacobian(L, law: LawFit) -> np.ndarray:
    """∂ ln M / ∂(linf, ln a, alpha), one row per run, for propagating the law's uncertainty."""
    L = np.asarray(L, float)
    gap = L - law.linf
    with np.errstate(invalid="ignore", divide="ignore"):
        # ln M = −(ln(L−L∞) − ln a)/α + ln C0 − ln C
        return np.stack([1.0 / (law.alpha * gap), np.full_like(L, 1.0 / law.alpha),
                         (np.log(gap) - law.log_a) / law.alpha**2], 1)


def loss_at(log_m, C, law: LawFit) -> np.ndarray:
    """The loss of a run with multiplier exp(log_m) at compute C: L∞ + A·(M·C)^(−α)."""
    return law.linf + law.A * (np.exp(np.asarray(log_m, float)) * np.asarray(C, float)) ** (-law.alpha)
