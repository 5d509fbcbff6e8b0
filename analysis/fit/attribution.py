"""Effects-coded attribution of ln M to the recipe components (docs/method.md §4.4).

Factors coded x_i = +1 (recipe level) / −1 (baseline level), z = ln(C/C_ref) of the run's rung; a response y
(ln M_flop, ln R, ...) is fitted on

    y = b0 + b_z·z + Σ_i β_i x_i + Σ_{i<j} β_ij x_i x_j + Σ_i γ_i x_i z   (z terms with ≥ 2 rungs).

Per component i, f(S) the predicted y of the arm with the factors in S on: Shapley φ_i = Σ_{S∌i}
|S|!(k−|S|−1)!/k! [f(S∪i) − f(S)] = 2β_i + 2γ_i z (an x_i x_j term is +1 at all-on and at all-off);
LOO_i = f(N) − f(N∖i) = φ_i + 2Σ_j β_ij (from all-on); AOI_i = f({i}) − f(∅) = φ_i − 2Σ_j β_ij (from all-off);
all enumerated over the 2^k arms (tests check the closed forms). Columns identical up to sign (a regular fraction)
form alias groups, reported only as the group; a contrast outside the design's row space is not estimable.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from math import factorial

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.io.results import factor_codes, factor_coding

HC_TYPES = ("HC0", "HC1", "HC2", "HC3")


@dataclass(frozen=True)
class Term:
    """A model column: product of the coded factors in `factors`, times z when `scale`."""

    factors: tuple[str, ...]
    scale: bool = False

    @property
    def name(self) -> str:
        base = ":".join(self.factors) if self.factors else ("intercept" if not self.scale else "")
        if self.scale:
            return f"{base}:logC" if base else "logC"
        return base

    @property
    def kind(self) -> str:
        if not self.factors:
            return "scale" if self.scale else "intercept"
        if len(self.factors) == 1:
            return "main_x_scale" if self.scale else "main"
        return "2fi"


def build_terms(factors: list[str], *, interactions: bool = True, scale: bool = False) -> list[Term]:
    """Hierarchical order: intercept, logC, main effects, two-factor interactions, factor×logC."""
    terms = [Term(())]
    if scale:
        terms.append(Term((), True))
    terms += [Term((f,)) for f in factors]
    if interactions:
        terms += [Term(p) for p in itertools.combinations(factors, 2)]
    if scale:
        terms += [Term((f,), True) for f in factors]
    return terms


def design_matrix(terms: list[Term], factors: list[str], X_nk: np.ndarray, z_n: np.ndarray) -> np.ndarray:
    """Columns of `terms` evaluated at coded factors X_nk (±1) and z_n."""
    col = {f: i for i, f in enumerate(factors)}
    out = np.ones((X_nk.shape[0], len(terms)))
    for j, t in enumerate(terms):
        for f in t.factors:
            out[:, j] *= X_nk[:, col[f]]
        if t.scale:
            out[:, j] *= z_n
    return out


@dataclass
class AliasStructure:
    """Which candidate columns are estimated; alias groups (same column up to sign); the rest."""

    kept: np.ndarray  # bool (p,)
    groups: list[list[tuple[int, int]]]  # each group: [(term index, sign relative to the first)]
    not_estimable: dict[int, list[int]]  # dropped column -> kept columns it is a combination of
    rowspace_V: np.ndarray  # (p, r) orthonormal basis of the design's row space

    def group_of(self, j: int) -> list[tuple[int, int]] | None:
        return next((g for g in self.groups if any(j == t for t, _ in g)), None)


def alias_structure(Xf: np.ndarray, tol: float = 1e-9) -> AliasStructure:
    """Greedy rank in hierarchical order + ±identical-column groups (our own check, no library)."""
    n, p = Xf.shape
    norms = np.linalg.norm(Xf, axis=0)
    kept = np.zeros(p, bool)
    Q = np.zeros((n, 0))
    for j in range(p):
        if norms[j] <= tol:
            continue
        v = Xf[:, j] - Q @ (Q.T @ Xf[:, j]) if Q.shape[1] else Xf[:, j].copy()
        v = v - Q @ (Q.T @ v) if Q.shape[1] else v  # re-orthogonalise for stability
        if np.linalg.norm(v) > 1e-7 * norms[j]:
            kept[j] = True
            Q = np.column_stack([Q, v / np.linalg.norm(v)])
    groups: list[list[tuple[int, int]]] = []
    not_est: dict[int, list[int]] = {}
    K = np.flatnonzero(kept)
    for j in np.flatnonzero(~kept):
        if norms[j] <= tol:
            not_est[int(j)] = []
            continue
        match = next(((int(k), s) for k in K for s in (1, -1)
                      if np.allclose(Xf[:, j], s * Xf[:, k], atol=1e-9 * max(norms[k], 1.0))), None)
        if match:
            g = next((g for g in groups if g[0][0] == match[0]), None)
            if g is None:
                g = [(match[0], 1)]
                groups.append(g)
            g.append((int(j), match[1]))
        else:
            coef, *_ = np.linalg.lstsq(Xf[:, K], Xf[:, j], rcond=None)
            not_est[int(j)] = [int(K[i]) for i in np.flatnonzero(np.abs(coef) > 1e-8)]
    _, s, Vt = np.linalg.svd(Xf, full_matrices=False)
    r = int(np.sum(s > 1e-9 * (s[0] if len(s) else 1.0)))
    return AliasStructure(kept=kept, groups=groups, not_estimable=not_est, rowspace_V=Vt[:r].T)


@dataclass
class EffectsFit:
    """Fitted coefficients over all candidate terms (0 for dropped ones) and their covariance."""

    response: str
    factors: list[str]
    terms: list[Term]
    alias: AliasStructure
    theta: np.ndarray  # (p,) full
    cov: np.ndarray  # (p, p) full
    dof: int
    n: int
    resid: np.ndarray
    leverage: np.ndarray
    X: np.ndarray  # (n, p) full candidate design
    method: str = "ols-HC3"
    notes: list[str] = field(default_factory=list)
    # The model-based covariance s²(XᵀX)⁻¹: each contrast uses the larger of it and the robust one, since
    # HC estimators are biased low for contrasts carried by few runs (Bell & McCaffrey 2002).
    cov_model: np.ndarray | None = None
    # The statsmodels results object of an OLS response (None for the joint law's quality fit, which is
    # ours) and the candidate columns it estimated: the Appendix's coefficient table reads it.
    sm_results: object | None = None
    sm_cols: np.ndarray | None = None
    # The rung-shift part of cov_model (quality, analysis/fit/joint.py) and the df it rests on: see contrast_df.
    cov_between: np.ndarray | None = None
    # The part of cov every study sharing its law shares (quality: the pinned law's spread, analysis/fit/joint.py)
    cov_law: np.ndarray | None = None
    dof_between: int = 0

    def contrast_df(self, c: np.ndarray) -> float:
        """The df of a contrast's t quantile: the residual df, or Satterthwaite's df of the model-based variance's
        two parts where it is the larger and holds a rung-shift part (docs/method.md §4.4), at most the residual df."""
        if self.cov_between is None or self.dof_between <= 0 or self.dof <= 0 or self.cov_model is None:
            return float(self.dof)
        vm, vr = float(c @ self.cov_model @ c), float(c @ self.cov @ c)
        vb = max(float(c @ self.cov_between @ c), 0.0)
        if vr >= vm or vb <= 0:
            return float(self.dof)
        vw = max(vm - vb, 0.0)
        return min(float(self.dof), float((vw + vb) ** 2 / (vw**2 / self.dof + vb**2 / self.dof_between)))

    def estimable(self, c: np.ndarray) -> bool:
        V = self.alias.rowspace_V
        return bool(np.linalg.norm(c - V @ (V.T @ c)) <= 1e-7 * max(np.linalg.norm(c), 1e-12))

    def law_se(self, c: np.ndarray) -> float:
        """The standard error of c·θ that the law every study shares carries (0 without a pinned law)."""
        return float(np.sqrt(max(c @ self.cov_law @ c, 0.0))) if self.cov_law is not None else 0.0

    def contrast(self, c: np.ndarray, level: float = 0.95) -> tuple[float, float, float, float, bool]:
        """(estimate, se, lo, hi, estimable) of c·θ; NaN for a contrast the design cannot estimate."""
        if not self.estimable(c):
            return (np.nan, np.nan, np.nan, np.nan, False)
        q = _t_quantile(level, self.contrast_df(c))
        est = float(c @ self.theta)
        se = float(np.sqrt(self.contrast_var(c)))
        if self.dof <= 0 or not se > ZERO_WIDTH * max(abs(est), 1.0):
            # no residual df, or residuals that are zero by construction (a lone baseline run per rung
            # is its own throughput reference): the estimate stands, an interval does not
            return (est, se, np.nan, np.nan, True)
        return (est, se, est - q * se, est + q * se, True)

    def contrast_var(self, c: np.ndarray) -> float:
        v = float(c @ self.cov @ c)
        if self.cov_model is not None:
            v = max(v, float(c @ self.cov_model @ c))
        return max(v, 0.0)

    def alias_sum(self, j: int) -> np.ndarray:
        """The contrast the design estimates for term j: j alone, or the signed sum of its alias group
        as seen from j (a regular fraction estimates only such sums)."""
        c = np.zeros(len(self.terms))
        g = self.alias.group_of(j)
        if g is None:
            c[j] = 1.0
            return c
        s_j = dict(g)[j]
        for t, s in g:
            c[t] = s_j * s
        return c

    def term_label(self, j: int) -> str:
        g = self.alias.group_of(j)
        if g is None:
            return self.terms[j].name
        return " = ".join(("−" if s < 0 else "") + self.terms[t].name for t, s in g)

    def coef_table(self, level: float = 0.95) -> pd.DataFrame:
        """One row per estimated column (alias groups as one row, labelled with all members)."""
        rows = []
        for j in np.flatnonzero(self.alias.kept):
            est, se, lo, hi, _ = self.contrast(self.alias_sum(j), level)
            t = est / se if se > 0 else np.nan
            p = 2 * stats.t.sf(abs(t), max(self.dof, 1)) if np.isfinite(t) and self.dof > 0 else np.nan
            if self.sm_results is not None and self.dof > 0 and np.isfinite(se) and se > 0:
                # an OLS response: statsmodels' t test of the column, on the covariance the contrast uses
                tt = self.sm_results.t_test(self.alias_sum(j)[self.sm_cols], cov_p=self._cov_k([j]), use_t=True)
                est, se = float(np.squeeze(tt.effect)), float(np.squeeze(tt.sd))
                t, p = float(np.squeeze(tt.tvalue)), float(np.squeeze(tt.pvalue))
                lo, hi = (float(v) for v in np.squeeze(tt.conf_int(alpha=1 - level)))
            rows.append({"term": self.term_label(j), "kind": self.terms[j].kind, "estimate": est, "se": se,
                         "t": t, "p": p, "lo": lo, "hi": hi, "aliased": self.alias.group_of(j) is not None})
        return pd.DataFrame(rows)

    def _cov_k(self, cols: list[int]) -> np.ndarray:
        """The covariance over the statsmodels columns a test of `cols` uses: robust or model-based, the
        larger (for one column: its larger variance; for a family: the larger trace)."""
        K = self.sm_cols
        cands = [self.cov[np.ix_(K, K)]] + ([self.cov_model[np.ix_(K, K)]] if self.cov_model is not None else [])
        pos = [int(np.flatnonzero(K == j)[0]) for j in cols]
        return max(cands, key=lambda m: float(np.trace(m[np.ix_(pos, pos)])))

    def predict_phi(self, X_mk: np.ndarray, z: float | np.ndarray) -> np.ndarray:
        z_m = np.broadcast_to(np.asarray(z, float), (X_mk.shape[0],))
        return design_matrix(self.terms, self.factors, X_mk, z_m)


_TQ: dict[tuple[float, int], float] = {}


#: A standard error below this fraction of the estimate is a zero-width interval: not an interval.
ZERO_WIDTH = 1e-9


def _t_quantile(level: float, dof: float) -> float:
    """Two-sided t critical value (cached: contrasts are many, df few)."""
    if dof <= 0:
        return float("nan")
    key = (level, round(float(dof), 3))  # a Satterthwaite df is fractional: 3 decimals are plenty
    if key not in _TQ:
        _TQ[key] = float(stats.t.ppf(0.5 + level / 2, key[1]))
    return _TQ[key]


def _ols(Xk: np.ndarray, y: np.ndarray, hc: str, df_resid: int | None = None):
    """statsmodels OLS with the `hc` sandwich (docs/method.md §4.4): (θ, robust cov, residuals, leverage, (XᵀX)⁻¹,
    results); a run its own column fits exactly adds nothing to the sandwich (statsmodels' `_HCCM`, its term zeroed)."""
    import statsmodels.api as sm
    from statsmodels.stats.sandwich_covariance import _HCCM

    model = sm.OLS(y, Xk)
    if df_resid is not None and df_resid > 0:  # fewer df than n − p: the response spent some on its reference
        model.df_resid = float(df_resid)
    res = model.fit()
    h = np.clip(res.get_influence().hat_matrix_diag, 0.0, 1.0)
    e = np.asarray(res.resid)
    safe = (1 - h) > 1e-10
    if res.df_resid <= 0 or (df_resid is not None and df_resid <= 0):
        cov = np.zeros((Xk.shape[1],) * 2)
    elif safe.all():
        cov = np.asarray(model.fit(cov_type=hc).cov_params())
    else:
        one_minus = np.where(safe, 1 - h, 1.0)
        scale = {"HC0": e**2, "HC1": e**2 * len(y) / res.df_resid, "HC2": e**2 / one_minus,
                 "HC3": e**2 / one_minus**2}[hc]
        cov = np.asarray(_HCCM(res, np.where(safe, scale, 0.0)))
    return np.asarray(res.params), cov, e, h, np.asarray(res.normalized_cov_params), res


def fit_effects(X_nk: np.ndarray, z_n: np.ndarray, y_n: np.ndarray, factors: list[str], *,
                response: str = "ln_M", interactions: bool = True, scale: bool = False, hc: str = "HC3",
                groups: np.ndarray | None = None, mixed: bool = False,
                ref_groups: np.ndarray | None = None) -> EffectsFit:
    """statsmodels OLS with the `hc` robust covariance, or `MixedLM` with a random intercept per `groups` (the
    (seed × rung) cluster of each run). `ref_groups`: each run's reference group for a response taken relative to a
    group mean (ln R); the residual df is then n − rank([group indicators, X]) (docs/method.md §4.4)."""
    if hc not in HC_TYPES:
        raise ValueError(f"hc {hc!r}; allowed values: {', '.join(HC_TYPES)}")
    terms = build_terms(factors, interactions=interactions, scale=scale)
    Xf = design_matrix(terms, factors, X_nk, z_n)
    al = alias_structure(Xf)
    K = np.flatnonzero(al.kept)
    Xk = Xf[:, K]
    dof = len(y_n) - len(K)
    if ref_groups is not None:
        D = (np.asarray(ref_groups)[:, None] == np.unique(ref_groups)[None, :]).astype(float)
        dof = len(y_n) - int(np.linalg.matrix_rank(np.column_stack([D, Xk]), tol=1e-9 * max(len(y_n), 1)))
    theta_k, cov_k, e, h, XtX_inv, sm_res = _ols(Xk, y_n, hc, df_resid=dof)
    method = f"ols-{hc}"
    notes: list[str] = []
    if mixed:
        if groups is None:
            raise ValueError("mixed=True needs groups (the (seed × rung) cluster of each run)")
        import warnings

        import statsmodels.api as sm

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                res = sm.MixedLM(y_n, Xk, groups=np.asarray(groups)).fit(reml=True)
            msgs = list(dict.fromkeys(str(w.message) for w in caught))
            if msgs:
                notes.append(f"mixed model: {len(msgs)} optimizer warning(s), e.g. {msgs[-1]!r}")
            theta_k = np.asarray(res.fe_params)
            cov_k = np.asarray(res.cov_params())[: len(K), : len(K)]
            e = y_n - Xk @ theta_k
            method = "mixedlm-cluster"
        except Exception as ex:  # singular random-effect fits fall back to OLS, with a note
            notes.append(f"mixed model failed ({type(ex).__name__}: {ex}); OLS used")
    p = len(terms)
    theta = np.zeros(p)
    theta[K] = theta_k
    cov = np.zeros((p, p))
    cov[np.ix_(K, K)] = cov_k
    cov_model = np.zeros((p, p))
    if dof > 0:
        cov_model[np.ix_(K, K)] = np.asarray(sm_res.cov_params())  # s²(XᵀX)⁻¹, statsmodels' nonrobust
    if dof <= 0:
        notes.append("saturated design: no residual degrees of freedom, no standard errors")
    return EffectsFit(response=response, factors=list(factors), terms=terms, alias=al, theta=theta, cov=cov,
                      dof=dof, n=len(y_n), resid=e, leverage=h, X=Xf, method=method, notes=notes,
                      cov_model=cov_model if method.startswith("ols") else None, sm_results=sm_res, sm_cols=K)


def all_arms(k: int) -> np.ndarray:
    """(2^k, k) coded arms; row index bit i set ⇔ factor i on."""
    m = np.arange(2**k)
    return np.where((m[:, None] >> np.arange(k)[None, :]) & 1, 1.0, -1.0)


def component_contrasts(fit: EffectsFit, z: float) -> dict[str, np.ndarray]:
    """Contrast vectors over θ: shapley, loo, aoi (each k × p) and total (p,), at z, by enumeration."""
    k = len(fit.factors)
    if k > 12:
        raise ValueError(f"factors: {k} factors; enumeration supports at most 12")
    Phi = fit.predict_phi(all_arms(k), z)  # (2^k, p)
    full = 2**k - 1
    shap = shapley_rows(Phi, k)
    loo, aoi = np.zeros_like(shap), np.zeros_like(shap)
    for i in range(k):
        loo[i] = Phi[full] - Phi[full & ~(1 << i)]
        aoi[i] = Phi[1 << i] - Phi[0]
    return {"shapley": shap, "loo": loo, "aoi": aoi, "total": Phi[full] - Phi[0]}


def shapley_rows(Phi: np.ndarray, k: int) -> np.ndarray:
    """(k, p) Shapley contrasts over the model rows Phi (2^k, p) of `all_arms(k)`: φ_i = Σ_{S∌i} w_S [f(S∪i) − f(S)]."""
    m = np.arange(2**k)
    size = np.array([bin(i).count("1") for i in m])
    out = np.zeros((k, Phi.shape[1]))
    for i in range(k):
        S = m[(m & (1 << i)) == 0]
        w = np.array([factorial(s) * factorial(k - s - 1) / factorial(k) for s in size[S]])
        out[i] = w @ (Phi[S | (1 << i)] - Phi[S])
    return out


def component_table(fit: EffectsFit, z: float, level: float = 0.95, boot_theta: np.ndarray | None = None,
                    loo_fit: EffectsFit | None = None, loo_boot: np.ndarray | None = None) -> pd.DataFrame:
    """Per component: Shapley, LOO, AOI on the ln scale, CIs (analytic; bootstrap when given).

    `loo_fit` (with `loo_boot`): the model LOO/AOI come from when `fit` is a reduced (main-effects)
    model used for the Shapley values because the full model cannot estimate them.
    """
    cc = component_contrasts(fit, z)
    cl = component_contrasts(loo_fit, z) if loo_fit is not None else cc
    rows = []
    for i, f in enumerate(fit.factors + ["TOTAL"]):
        row = {"response": fit.response, "component": f}
        for kind in ("shapley", "loo", "aoi"):
            use_loo = loo_fit is not None and kind != "shapley"
            src, bt, ccs = (loo_fit, loo_boot, cl) if use_loo else (fit, boot_theta, cc)
            c = ccs["total"] if f == "TOTAL" else ccs[kind][i]
            est, se, lo, hi, ok = src.contrast(c, level)
            row.update({kind: est, f"{kind}_se": se, f"{kind}_lo": lo, f"{kind}_hi": hi, f"{kind}_estimable": ok,
                        f"{kind}_df": src.contrast_df(c), f"{kind}_se_law": src.law_se(c)})
            if bt is not None and ok:
                b = bt @ c
                q = (1 - level) / 2
                row[f"{kind}_boot_lo"], row[f"{kind}_boot_hi"] = (float(x) for x in np.nanquantile(b, [q, 1 - q]))
            else:
                row[f"{kind}_boot_lo"] = row[f"{kind}_boot_hi"] = np.nan
        row["aliased_with"] = _component_alias_note(loo_fit or fit, f)
        rows.append(row)
    return pd.DataFrame(rows)


def varied_rungs(table: pd.DataFrame, factors: list[str]) -> dict[str, list[str]]:
    """{factor: the rungs at which its two levels both occur among the analysed runs}."""
    return {f: [str(r) for r, n in table.groupby("rung")[f"x_{f}"].nunique().items() if n > 1] for f in factors}


def mark_not_varied(per_rung: pd.DataFrame, table: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Per-rung values of a factor at a rung where its levels never both ran are not data: the
    scale model would carry them in from other rungs. Their effect and interval become NaN and
    `varied` False (the report says "not varied here")."""
    if not len(per_rung):
        return per_rung
    vr = varied_rungs(table, factors)
    out = per_rung.copy()
    out["varied"] = [c == "TOTAL" or str(r) in vr.get(c, [])
                     for c, r in zip(out["component"], out["rung"], strict=True)]
    out.loc[~out["varied"], ["effect", "lo", "hi"]] = np.nan
    return out


def refuse_single_rung(a) -> list[str]:
    """Extrapolated values of a factor varied at one rung only are refused (NaN) — with one rung
    there is no scale trend to carry; returns the lines saying so."""
    e = a.extrapolation
    if e is None:
        return []
    out = []
    for f, vr in varied_rungs(a.table, a.factors).items():
        if len(vr) == 1 and len(a.rungs) > 1:
            m = (e["component"] == f).to_numpy()
            cols = [c for c in e.columns if c.split("_")[0] in ("shapley", "loo", "aoi") and e[c].dtype.kind == "f"]
            e.loc[m, cols] = np.nan
            out.append(f"extrapolation of {f} refused: varied at rung {vr[0]} only, "
                       "so there is no scale trend to carry")
    return out


def _component_alias_note(fit: EffectsFit, f: str) -> str:
    return "; ".join(dict.fromkeys(fit.term_label(j) for j, t in enumerate(fit.terms)
                                   if f in t.factors and fit.alias.group_of(j) is not None))


def interaction_matrix(fit: EffectsFit) -> tuple[pd.DataFrame, pd.DataFrame]:
    """2β_ij (the ln-scale interaction on the all-on vs all-off contrast scale) and estimability."""
    est = pd.DataFrame(np.nan, index=fit.factors, columns=fit.factors)
    ali = pd.DataFrame(False, index=fit.factors, columns=fit.factors)
    for j, t in enumerate(fit.terms):
        if t.kind == "2fi":
            a, b = t.factors
            c = np.zeros(len(fit.terms))
            c[j] = 2.0
            e, *_ = fit.contrast(c)
            aliased = fit.alias.group_of(j) is not None
            if aliased or not np.isfinite(e):
                e = np.nan
            est.loc[a, b] = est.loc[b, a] = e
            ali.loc[a, b] = ali.loc[b, a] = aliased
    return est, ali


def anova_table(fit: EffectsFit) -> pd.DataFrame:
    """Wald F tests with the fit's own covariance (robust, the one the coefficient table uses): one
    row per estimated column (F = t² of its coefficient row) and one per term family (all 2FIs, all
    factor × log C), so the ANOVA and the coefficients cannot disagree."""
    K = [j for j in np.flatnonzero(fit.alias.kept) if fit.terms[j].kind != "intercept"]
    rows = []
    dof = max(fit.dof, 1)

    def wald(cols: list[int]) -> tuple[float, float]:
        if fit.sm_results is not None and fit.dof > 0:  # an OLS response: statsmodels' F tests
            R = np.zeros((len(cols), len(fit.sm_cols)))
            for i, j in enumerate(cols):
                R[i, int(np.flatnonzero(fit.sm_cols == j)[0])] = 1.0
            ft = fit.sm_results.f_test(R, cov_p=fit._cov_k(cols))
            return float(np.squeeze(ft.fvalue)), float(np.squeeze(ft.pvalue))
        th = fit.theta[cols]
        cands = [fit.cov[np.ix_(cols, cols)]]
        if fit.cov_model is not None:
            cands.append(fit.cov_model[np.ix_(cols, cols)])
        V = max(cands, key=lambda m: float(np.trace(m)))  # the more conservative of robust / model-based
        if len(cols) == 1:
            V = np.array([[max(float(m[0, 0]) for m in cands)]])
        F = float(th @ np.linalg.pinv(V) @ th) / len(cols)
        return F, (float(stats.f.sf(F, len(cols), dof)) if fit.dof > 0 and np.isfinite(F) else np.nan)

    for j in K:
        F, p = wald([j])
        rows.append({"term": fit.term_label(j), "df": 1, "F": F, "p": p})
    for kind, lab in (("2fi", "all two-factor interactions"), ("main_x_scale", "all factor × log C")):
        cols = [j for j in K if fit.terms[j].kind == kind]
        if len(cols) > 1:
            F, p = wald(cols)
            rows.append({"term": lab, "df": len(cols), "F": F, "p": p})
    rows.append({"term": "Residual", "df": fit.dof, "F": np.nan, "p": np.nan})
    return pd.DataFrame(rows)


def code_table(df: pd.DataFrame, factors: list[str],
               third_levels: str = "error") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Coded (n, k) ±1 matrix of `factors`, each coded by the definition its runs recorded (low −1,
    high +1). A run at another level (a third level the study's design does not contrast) raises,
    or with third_levels='drop' is left out and named in the notes."""
    if third_levels not in ("error", "drop"):
        raise ValueError(f"third_levels {third_levels!r}; allowed values: error, drop")
    coding = factor_coding(df)
    codes = np.zeros((len(df), len(factors)))
    keep = np.ones(len(df), bool)
    notes = []
    for i, f in enumerate(factors):
        c = factor_codes(df, f, coding)
        bad = np.array([v is None for v in c])
        if bad.any():
            levels = sorted({str(v) for v in df[f][bad]}) if f in df.columns else ["(none recorded)"]
            low, high = coding[f]
            if third_levels == "error":
                raise ValueError(
                    f"factor {f!r} has level(s) {', '.join(levels)} outside the two-level attribution; allowed "
                    f"values: {high} (+1), {low} (−1); restrict the table to two levels (third_levels='drop')")
            notes.append(f"factor {f}: {int(bad.sum())} run(s) at level(s) {', '.join(levels)} left out "
                         f"(the study contrasts {low} with {high})")
            keep &= ~bad
        codes[:, i] = np.where(bad, 0, c).astype(float)
    return codes, keep, notes
