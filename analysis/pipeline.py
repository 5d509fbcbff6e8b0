"""Results table -> law, multipliers, effects, components, extrapolation, checks (docs/method.md).

`analyze_table(df)` is the whole analysis without plots or files. The reference law and the quality
effects are one fit on every run (analysis/fit/joint.py); throughput is an OLS on ln R; wall-clock adds
the two. It uses what is estimable and records in `notes` everything it left out, and in `warnings`
what a reader must know before trusting a number (analysis/fit/checks.py).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.fit.attribution import (
    EffectsFit,
    alias_structure,
    anova_table,
    code_table,
    component_contrasts,
    component_table,
    design_matrix,
    fit_effects,
    mark_not_varied,
    refuse_single_rung,
)
from marin_ablate.analysis.fit.bootstrap import bootstrap
from marin_ablate.analysis.fit.checks import lost_runs, paired_per_rung, total_checks, warnings_for
from marin_ablate.analysis.fit.joint import JointFit, quality_fit
from marin_ablate.analysis.fit.law_intervals import law_of
from marin_ablate.analysis.fit.replicates import (
    BETWEEN_SEEDS_MIN,
    REPLICATE_SEEDS_MAX,
    Stein,
    between_seed_interval,
    between_seed_law,
    between_seed_per_rung,
    coverage_summary,
    per_seed_analyses,
    planted_truths,
    replicate_checks,
    truth_check,
)
from marin_ablate.analysis.fit.scaling import LawFit, log_multiplier
from marin_ablate.analysis.io.pinned_law import PinnedLaw
from marin_ablate.analysis.io.results import Inventory, factor_columns, inventory
from marin_ablate.analysis.responses import RESPONSES, Response, ordered
from marin_ablate.analysis.table_shape import (
    check_extrapolation,
    check_pinned_linf,
    check_seed_blocks,
    rung_labels,
    rung_table,
)

BOOT_METHODS = ("wild", "cells", "none")


@dataclass
class StudyAnalysis:
    """Everything the report shows. Effects are on the ln scale; multipliers are exp of them."""

    table: pd.DataFrame  # used runs with x_<factor>, z, ln_M, ln_R, ln_W
    inventory: Inventory
    factors: list[str]
    law: LawFit | None
    c_ref: float
    rungs: pd.DataFrame  # rung, compute, z
    fits: dict[str, EffectsFit]
    components: pd.DataFrame  # at the reference compute (z = 0)
    per_rung: pd.DataFrame
    extrapolation: pd.DataFrame | None
    anova: dict[str, pd.DataFrame]
    boot_theta: dict[str, np.ndarray] = field(default_factory=dict)
    # A main-effects(+scale) refit per response whose full model leaves a Shapley value non-estimable;
    # its key in boot_theta is "<response>/main".
    reduced: dict[str, EffectsFit] = field(default_factory=dict)
    boot_law: np.ndarray | None = None  # (B, 3) linf, A, alpha paired with boot_theta["quality"]
    notes: list[str] = field(default_factory=list)
    target_compute: float | None = None
    joint: dict[str, JointFit] = field(default_factory=dict)  # "power", "curved", "power/main"
    checks: pd.DataFrame | None = None  # TOTAL two ways + lack of fit
    paired: pd.DataFrame | None = None  # per component and rung, the paired (same-rung) quality estimate
    warnings: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # lost runs and what they cost
    level: float = 0.95
    # Planted factors of known effect (analysis/fit/replicates.py): the pooled check, and with several
    # seeds each seed's own analysis and the coverage over those replicates.
    planted: pd.DataFrame | None = None
    replicates: pd.DataFrame | None = None
    coverage: pd.DataFrame | None = None
    pinned_law: PinnedLaw | None = None  # L∞ and α pinned from a reference ladder (analysis/fit/reflaw.py)
    lr_profile: dict | None = None  # the study's lr_profile.json (sweeps/tuning.py), for the headline (findings.py)
    per_seed: dict = field(default_factory=dict)  # {seed: that seed's runs analysed alone} with 3+ seeds (§4.4)

    def alias_groups(self) -> list[str]:
        fit = next(iter(self.fits.values()), None)
        return [] if fit is None else [fit.term_label(g[0][0]) for g in fit.alias.groups]

    def not_estimable(self) -> list[str]:
        fit = next(iter(self.fits.values()), None)
        if fit is None:
            return []
        return [fit.terms[j].name + (f" (a combination of {', '.join(fit.terms[k].name for k in ks)})" if ks else "")
                for j, ks in fit.alias.not_estimable.items()]

    def top_compute(self) -> float:
        return float(self.rungs["compute"].max())

    def arm_prediction(self, codes: dict[str, int], compute: float, level: float = 0.95,
                       force: bool = False) -> dict:
        """Predicted ln M and loss of an arm (factor -> ±1) at `compute`, with intervals that include
        the spread between the law forms; the loss interval is on the log scale (never below zero)."""
        check_extrapolation(compute, self.top_compute(), force)
        fit = self.fits.get("quality")
        if fit is None or self.law is None:
            raise ValueError("no quality fit: the reference law was not estimable")
        x = np.array([[float(codes[f]) for f in self.factors]])
        z = float(np.log(compute / self.c_ref))
        c = fit.predict_phi(x, z)[0] - fit.predict_phi(-np.ones_like(x), z)[0]
        out: dict = {}
        los, his, lnm = [], [], []
        for form in ("power", "curved"):
            jf = self.joint.get(form)
            if jf is None:
                continue
            e_row = c[jf.effect_cols]
            if not fit.estimable(c):
                raise ValueError("the arm's prediction is not estimable from this design")
            loss, g = jf.loss_grad(compute, e_row)
            se_ln = np.sqrt(jf.contrast_var(g)) / max(loss, 1e-12)
            q = float(stats.t.ppf(0.5 + level / 2, max(jf.dof, 1)))
            th = jf.params[[jf.names.index(f"theta{j}") for j in range(len(e_row))]]
            gm = np.zeros(len(jf.names))
            gm[[jf.names.index(f"theta{j}") for j in range(len(e_row))]] = e_row
            se_m = np.sqrt(jf.contrast_var(gm))
            if form == "power":
                out.update({"ln_M": float(e_row @ th), "ln_M_se": float(se_m), "loss": float(loss)})
            lnm.append((float(e_row @ th - q * se_m), float(e_row @ th + q * se_m)))
            los.append(float(loss * np.exp(-q * se_ln)))
            his.append(float(loss * np.exp(q * se_ln)))
        out["ln_M_lo"], out["ln_M_hi"] = min(v[0] for v in lnm), max(v[1] for v in lnm)
        out["loss_lo"], out["loss_hi"] = min(los), max(his)
        out["law_forms"] = len(los)
        return out


def _sum_fit(r: Response, parts: list[EffectsFit], both: np.ndarray, X, z) -> EffectsFit:
    """A sum response (e.g. ln W = ln M + ln R): coefficients add; covariances add (the parts' noises
    are independent: loss and throughput)."""
    q = parts[0]
    al = alias_structure(design_matrix(q.terms, q.factors, X[both], z[both]))
    n = int(both.sum())
    laws = [p.cov_law for p in parts if p.cov_law is not None]
    return EffectsFit(response=r.column, factors=q.factors, terms=q.terms, alias=al,
                      theta=sum(p.theta for p in parts), cov=sum(p.cov for p in parts), dof=min(p.dof for p in parts),
                      n=n, resid=np.zeros(n), leverage=np.zeros(n), X=q.X, method=" + ".join(r.parts),
                      cov_model=sum(p.cov_model if p.cov_model is not None else p.cov for p in parts),
                      cov_law=sum(laws) if laws else None)


@dataclass
class _Prepared:
    """The coded runs every response is fitted on (analyze_table's shared state)."""

    ok: pd.DataFrame
    X: np.ndarray
    z: np.ndarray
    C: np.ndarray
    L: np.ndarray
    factors: list[str]
    rungs: pd.DataFrame
    scale: bool
    seeds: np.ndarray | None
    pins: tuple
    interactions: bool
    hc: str
    mixed: bool
    level: float
    notes: list[str]
    clusters: np.ndarray | None = None  # runs sharing a random stream at one rung (analysis/fit/joint.py)
    fits: dict[str, EffectsFit] = field(default_factory=dict)
    reduced: dict[str, EffectsFit] = field(default_factory=dict)
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    ref_groups: dict[str, np.ndarray] = field(default_factory=dict)  # a ratio response's reference group per run
    joint: dict[str, JointFit] = field(default_factory=dict)
    law: LawFit | None = None
    pin_cov: np.ndarray | None = None  # the pinned law's (L∞, α) covariance (analysis/fit/reflaw.py)
    pin_valley: tuple = ()  # its accepted (L∞, α) pairs: the ladder's profile valley
    c_ref: float = math.nan  # the geometric mean of the runs' compute: where z = 0


def _fit_law(p: _Prepared, r: Response, law_forms: tuple[str, ...]) -> None:
    """Reference law and quality effects: one fit on every run (baseline-arm runs are not special)."""
    X, z, C, L, factors = p.X, p.z, p.C, p.L, p.factors
    kw = dict(interactions=p.interactions, scale=p.scale, seeds=p.seeds, pins=p.pins, pin_cov=p.pin_cov,
              pin_valley=p.pin_valley)
    if not p.scale and p.pins[1] is None:
        p.notes.append("reference law not estimable: one rung cannot fix α; pin it (--pin-alpha)")
    else:
        for form in law_forms:
            try:
                fq, jf = quality_fit(X, z, C, L, factors, **kw, form=form, start=p.joint.get("power"),
                                     clusters=p.clusters, envelope=form == "power")
            except ValueError as e:
                p.notes.append(f"reference law ({form} form) not estimable: {e}")
                continue
            if form == "power" and ({"alpha", "ln_a"} & set(jf.not_identified)):
                # The rungs do not fix the law's curvature (α → 0 with L∞ → −∞: a straight line in
                # ln C fits as well). A multiplier needs only the local slope dL/d ln C, which the
                # rungs do fix; α, A, L∞ and anything that extrapolates are reported as such.
                p.notes.append("reference law curvature not identified (α, A, L∞): the multipliers rest on the "
                               "law's local slope, and their intervals span it at every L∞ in [0, smallest loss) "
                               "the data accept; law parameters and extrapolation are not identified (pin the law "
                               "from a wider baseline ladder: `marin-ablate run` does for a study with reference "
                               "rungs)")
                p.joint[form], p.law = jf, law_of(jf, p.level)
                p.fits[r.name] = fq
                break
            if form != "power" and jf.not_identified:
                p.notes.append(f"the {form} law form is not identified by {len(p.rungs)} rungs: "
                               "the law form's effect on extrapolation cannot be assessed")
                continue
            p.joint[form] = jf
            if form == "power":
                p.fits[r.name], p.law = fq, law_of(jf, p.level)
        if r.name in p.fits:
            shap = component_contrasts(p.fits[r.name], 0.0)["shapley"]
            badf = [f for f, c in zip(factors, shap, strict=True) if not p.fits[r.name].estimable(c)]
            if badf and p.interactions:
                red, jr = quality_fit(X, z, C, L, factors, **{**kw, "interactions": False})
                p.reduced[r.name], p.joint["power/main"] = red, jr
                p.notes.append(f"{r.name}: with two-factor interactions the Shapley value of {', '.join(badf)} is "
                               "not estimable from the runs present; Shapley values from the main-effects model "
                               "(assumes no interactions), LOO/AOI from the full model")
    p.ok[r.column] = log_multiplier(L, C, p.law) if p.law is not None else np.nan
    p.masks[r.name] = np.ones(len(p.ok), bool)


def _ols_column(p: _Prepared, r: Response) -> np.ndarray:
    """transform(source) per run; NaN where it has no value (the note says how many)."""
    ok = p.ok
    src = pd.to_numeric(ok[r.source], errors="coerce").to_numpy(float) if r.source in ok else np.full(len(ok), np.nan)
    if r.transform == "ln_ratio":  # against the baseline arm on the same hardware and rung
        hw = ok["hardware"].astype(str) if "hardware" in ok else pd.Series("?", index=ok.index)
        key = list(zip(ok["rung"], hw, strict=True))
        base = np.all(p.X == -1, axis=1)
        ref_sum: dict = {}
        for k_, m_, b_ in zip(key, src, base, strict=True):
            if b_ and np.isfinite(m_):
                s_, n_ = ref_sum.get(k_, (0.0, 0))
                ref_sum[k_] = (s_ + m_, n_ + 1)
        ratio = np.array([m_ / (ref_sum[k_][0] / ref_sum[k_][1]) if k_ in ref_sum else np.nan
                          for m_, k_ in zip(src, key, strict=True)], float)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(ratio)
        if np.isnan(y).any():
            p.notes.append(f"{int(np.isnan(y).sum())} run(s) without a baseline {r.name} on the same "
                           f"hardware and rung: no {r.name} ratio")
        p.ref_groups[r.name] = np.array([f"{k_[0]}|{k_[1]}" for k_ in key])
        return y
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(src > 0, np.log(src), np.nan)
    if np.isnan(y).any():
        p.notes.append(f"{int(np.isnan(y).sum())} run(s) without a positive {r.source}: no {r.label}")
    return y


def _fit_ols(p: _Prepared, r: Response) -> None:
    """OLS of the transformed source on the factor model, with a main-effects refit where the full
    model leaves a Shapley value non-estimable."""
    y = _ols_column(p, r)
    p.ok[r.column] = y
    m = np.isfinite(y)
    if m.sum() < 2:
        return
    # the random effect the design holds is the (seed × rung) cluster's shift (docs/method.md §4.4)
    ref = p.ref_groups.get(r.name)
    kw = dict(response=r.column, scale=p.scale, hc=p.hc, mixed=p.mixed, groups=p.clusters[m],
              ref_groups=None if ref is None else ref[m])
    fr = fit_effects(p.X[m], p.z[m], y[m], p.factors, interactions=p.interactions, **kw)
    p.fits[r.name], p.masks[r.name] = fr, m
    p.notes.extend(f"{r.name}: {n}" for n in fr.notes)
    shap = component_contrasts(fr, 0.0)["shapley"]
    if p.interactions and any(not fr.estimable(c) for c in shap):
        p.reduced[r.name] = fit_effects(p.X[m], p.z[m], y[m], p.factors, interactions=False, **kw)


def _fit_sum(p: _Prepared, r: Response) -> None:
    p.ok[r.column] = sum(p.ok[RESPONSES[q].column] for q in r.parts)
    if not all(q in p.fits for q in r.parts):
        return
    both = np.logical_and.reduce([p.masks[q] for q in r.parts])
    p.fits[r.name] = _sum_fit(r, [p.fits[q] for q in r.parts], both, p.X, p.z)
    p.masks[r.name] = both
    if any(q in p.reduced for q in r.parts):
        red = [p.reduced.get(q, p.fits[q]) for q in r.parts]
        if all(f.terms == red[0].terms for f in red):
            p.reduced[r.name] = _sum_fit(r, red, both, p.X, p.z)
        else:  # one part kept its interactions, another lost them: their coefficients do not add
            p.notes.append(f"{r.name}: no main-effects-only fit ({' and '.join(r.parts)} reduce to different "
                           "terms); a value its full fit cannot estimate stays not estimable")


def _needed(responses: tuple[str, ...]) -> list[Response]:
    """The responses asked for and the parts their sums need, in fitting order."""
    names = list(dict.fromkeys(responses))
    for n in list(names):
        names += [q for q in RESPONSES[n].parts if q not in names]
    return ordered(names)


def analyze_table(df: pd.DataFrame, **kw) -> StudyAnalysis:
    """`_analyze_table` with numpy's and scipy's RuntimeWarnings (an exp that overflows where a law
    parameter is not identified, say) kept off the console and the notebook: each distinct one becomes
    one line of the report's Warnings instead (the values it concerns are shown as not identified)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        a = _analyze_table(df, **kw)
    numeric = sorted({str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)})
    for w in caught:
        if not issubclass(w.category, RuntimeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if numeric:
        a.warnings.append(f"numerical: {'; '.join(numeric)} while fitting (where a parameter is not identified; "
                          "the numbers concerned are shown as not identified or as intervals that say little)")
    return a


@dataclass(frozen=True)
class _Options:
    """The options of one analysis (`analyze_table`'s keywords), handed from stage to stage."""

    factors: list[str] | None = None
    pin_linf: float | None = None
    pin_alpha: float | None = None
    n_boot: int = 200
    boot_method: str = "wild"
    hc: str = "HC3"
    mixed: bool = False
    interactions: bool = True
    target_compute: float | None = None
    third_levels: str = "drop"
    level: float = 0.95
    seed: int = 0
    responses: tuple[str, ...] | None = None  # names from analysis/responses.py (default: every registered one)
    force_extrapolation: bool = False
    law_forms: tuple[str, ...] = ("power", "curved")
    replicates: bool = True  # each seed also analysed alone (seeds as replicates; planted truths' coverage)
    pinned_law: PinnedLaw | None = None  # a reference ladder's L∞ and α (analysis/fit/reflaw.py), pinned with spread
    stein: Stein | None = None  # the pilot of a `run --until` study (analysis/fit/replicates.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "responses", tuple(RESPONSES) if self.responses is None else tuple(self.responses))
        bad = [r for r in self.responses if r not in RESPONSES]
        if bad:
            raise ValueError(f"responses {bad}; allowed values: {', '.join(RESPONSES)}")
        if self.boot_method not in BOOT_METHODS:
            raise ValueError(f"boot_method {self.boot_method!r}; allowed values: {', '.join(BOOT_METHODS)}")
        if self.target_compute is not None and not self.target_compute > 0:
            raise ValueError(f"target_compute must be > 0 FLOPs, got {self.target_compute}")
        if self.pinned_law is not None:  # the ladder's pins override pin_linf / pin_alpha
            object.__setattr__(self, "pin_linf", self.pinned_law.linf)
            object.__setattr__(self, "pin_alpha", self.pinned_law.alpha)


def _analyze_table(df: pd.DataFrame, **kw) -> StudyAnalysis:
    """The attribution on a results table, in stages: the coded runs (`_prepare`), each response's fit
    (`_fit_responses`), the bootstrap, the contrasts (`_contrasts`), the per-seed replication that widens them
    (`_replicate`), then the checks and warnings (`_check`). The keywords are `_Options`' (docs/method.md §4)."""
    o = _Options(**kw)
    prep, inv = _prepare(df, o)
    fits, reduced = _fit_responses(prep, o)
    boot_theta, boot_law = {}, None
    if o.n_boot > 0 and o.boot_method != "none" and fits:
        boot_theta, boot_law = bootstrap(prep.ok, prep.X, prep.z, prep.C, prep.L, prep.factors, prep.fits,
                                         prep.reduced, prep.joint, prep.masks, prep.seeds, prep.pins, o.n_boot,
                                         o.boot_method, np.random.default_rng(o.seed), o.interactions, prep.scale,
                                         pin_cov=prep.pin_cov, pin_valley=prep.pin_valley)
    components, per_rung, extrap = _contrasts(prep, o, fits, reduced, boot_theta)
    per_seed, components, per_rung, extrap = _replicate(df, prep, o, components, per_rung, extrap)
    a = StudyAnalysis(table=prep.ok, inventory=inv, factors=list(prep.factors), law=prep.law, c_ref=prep.c_ref,
                      rungs=prep.rungs, fits=fits, components=components, per_rung=per_rung, extrapolation=extrap,
                      anova={n: anova_table(f) for n, f in fits.items()}, boot_theta=boot_theta, boot_law=boot_law,
                      notes=prep.notes, target_compute=o.target_compute, reduced=reduced, joint=prep.joint,
                      level=o.level, pinned_law=o.pinned_law,
                      per_seed={k: v for k, v in per_seed.items() if not isinstance(v, str)})
    _check(a, df, prep.X, o, per_seed)
    return a


def _prepare(df: pd.DataFrame, o: _Options) -> tuple[_Prepared, Inventory]:
    """The completed runs at two levels of each factor, coded ±1, with their rungs, compute, z = ln(C/C_ref) of
    their rung, seeds and (random stream × rung) clusters; refusals before any fit."""
    for col in ("status", "train_flops", "eval_macro_loss"):
        if col not in df.columns:
            raise ValueError(f"results table lacks column {col!r}")
    inv = inventory(df)
    notes = [ln for ln in inv.lines()]
    ok = df[(df["status"] == "completed") & np.isfinite(df["train_flops"].astype(float))
            & (df["train_flops"].astype(float) > 0) & np.isfinite(df["eval_macro_loss"].astype(float))].copy()
    factors = factor_columns(ok) if o.factors is None else o.factors
    if not factors:
        raise ValueError("no factor varies among the completed runs: nothing to attribute" + inv.why_none())
    X, keep, n3 = code_table(ok, factors, o.third_levels)
    notes += n3
    ok, X = ok[keep].copy(), X[keep]
    if not len(ok):
        raise ValueError("no completed run at the two levels of the study's factors" + inv.why_none())
    varying = [i for i in range(len(factors)) if len(np.unique(X[:, i])) > 1]
    if len(varying) < len(factors):
        notes.append("left out (one level only among the runs kept): "
                     + ", ".join(f for i, f in enumerate(factors) if i not in varying))
        factors, X = [factors[i] for i in varying], X[:, varying]
        if not factors:
            raise ValueError("no factor varies at two levels among the runs kept: nothing to attribute")
    for i, f in enumerate(factors):
        ok[f"x_{f}"] = X[:, i]
    C, L = ok["train_flops"].to_numpy(float), ok["eval_macro_loss"].to_numpy(float)
    ok["rung"] = rung_labels(ok, C).to_numpy()
    c_ref = float(np.exp(np.mean(np.log(C))))
    rungs = rung_table(ok, C, c_ref)
    # Scale terms use the rung's compute, not the run's own: a level that only changes the FLOPs
    # counted (2x, same losses) then gets M_flop = 1/2 exactly, the law carrying the run's own C.
    ok["z"] = z = rungs.set_index("rung")["z"].reindex(ok["rung"]).to_numpy(float)
    if len(rungs) < 2:
        notes.append("one rung: no factor × log C terms; multipliers assume no scale dependence")
    seeds = ok["seed"].to_numpy() if "seed" in ok and ok["seed"].nunique() > 1 else None
    check_seed_blocks(ok)
    if o.pinned_law is not None:
        notes.append(f"reference law pinned from {o.pinned_law.origin}: {o.pinned_law.describe()}; A refitted on this "
                     "study's runs; the pins' spread is in every multiplier's interval (delta method and bootstrap "
                     "draws)")
    check_pinned_linf(ok, o.pin_linf, o.pinned_law)
    # Runs sharing a random stream at one rung share its loss shift: the law's clusters (analysis/fit/joint.py)
    stream = (ok["random_stream"].astype(str) if "random_stream" in ok and ok["random_stream"].notna().all()
              else ok["seed"].astype(str) if "seed" in ok else pd.Series("", index=ok.index))
    pl = o.pinned_law
    prep = _Prepared(ok=ok, X=X, z=z, C=C, L=L, factors=factors, rungs=rungs, scale=len(rungs) >= 2, seeds=seeds,
                     pins=(o.pin_linf, o.pin_alpha), interactions=o.interactions, hc=o.hc, mixed=o.mixed,
                     level=o.level, notes=notes, clusters=(stream + "|" + ok["rung"].astype(str)).to_numpy(),
                     pin_cov=None if pl is None else pl.cov_propagated, pin_valley=() if pl is None else pl.valley,
                     c_ref=c_ref)
    return prep, inv


def _fit_responses(prep: _Prepared, o: _Options) -> tuple[dict[str, EffectsFit], dict[str, EffectsFit]]:
    """Each response asked for (and the parts its sums need), one branch per family (analysis/responses.py);
    (fits, main-effects refits) of the responses shown. A part fitted only for a sum stays in prep."""
    for r in _needed(o.responses):
        if r.family == "law":
            _fit_law(prep, r, o.law_forms)
        elif r.family == "ols":
            _fit_ols(prep, r)
        else:
            _fit_sum(prep, r)
    return ({n: f for n, f in prep.fits.items() if n in o.responses},
            {n: f for n, f in prep.reduced.items() if n in o.responses})


def _contrasts(prep: _Prepared, o: _Options, fits: dict, reduced: dict, boot_theta: dict):
    """(components at C_ref, per rung, at the target compute or None): each component's Shapley value,
    leave-one-out and add-one-in with their intervals (analysis/fit/attribution.py)."""
    def comp_at(n: str, zz: float) -> pd.DataFrame:
        if n in reduced:
            return component_table(reduced[n], zz, o.level, boot_theta.get(f"{n}/main"), fits[n], boot_theta.get(n))
        return component_table(fits[n], zz, o.level, boot_theta.get(n))

    comp = [comp_at(n, 0.0) for n in fits]
    components = pd.concat(comp, ignore_index=True) if comp else pd.DataFrame()
    per_rung = _per_rung({n: reduced.get(n, f) for n, f in fits.items()}, prep.rungs, o.level,
                         {n: boot_theta.get(f"{n}/main" if n in reduced else n) for n in fits})
    per_rung = mark_not_varied(per_rung, prep.ok, prep.factors)  # a factor's value only where its levels both ran
    extrap = None
    if o.target_compute is not None and fits:
        check_extrapolation(o.target_compute, float(prep.rungs["compute"].max()), o.force_extrapolation)
        zt = float(np.log(o.target_compute / prep.c_ref))
        extrap = pd.concat([comp_at(n, zt) for n in fits], ignore_index=True)
        extrap.insert(2, "target_compute", o.target_compute)
        _law_form_spread(prep, o, fits, reduced, extrap, zt)
        if not prep.scale:
            prep.notes.append("extrapolation without scale terms: the multipliers are carried unchanged to the target")
    return components, per_rung, extrap


def _law_form_spread(p: _Prepared, o: _Options, fits: dict, reduced: dict, extrap: pd.DataFrame,
                     zt: float) -> None:
    """Widens each extrapolated interval to the union of the power-law and curved-law intervals and records
    the difference of the two Shapley estimates (law_form_spread), where the curved form is identified."""
    extrap["law_form_spread"] = np.nan
    lawr = next((RESPONSES[n] for n in fits if RESPONSES[n].family == "law"), None)
    if "curved" not in p.joint or lawr is None:
        return
    fq2, _ = quality_fit(p.X, p.z, p.C, p.L, p.factors, interactions=o.interactions, scale=p.scale, seeds=p.seeds,
                         pins=p.pins, form="curved", start=p.joint["curved"])
    alt = {lawr.name: fq2}  # and every sum with the law among its parts, the curved law in its place
    for r in (RESPONSES[n] for n in fits if lawr.name in RESPONSES[n].parts):
        alt[r.name] = _sum_fit(r, [fq2 if q == lawr.name else p.fits[q] for q in r.parts], p.masks[r.name], p.X, p.z)
    for n, f2 in alt.items():
        e2 = component_table(f2, zt, o.level)
        m = (extrap["response"] == f2.response).to_numpy()
        for kind in ("shapley", "loo", "aoi"):
            if n in reduced and kind == "shapley":
                continue  # the reduced model has no curved twin; its spread stays unassessed
            for end, pick in (("lo", np.fmin), ("hi", np.fmax)):
                extrap.loc[m, f"{kind}_{end}"] = pick(extrap.loc[m, f"{kind}_{end}"].to_numpy(),
                                                      e2[f"{kind}_{end}"].to_numpy())
            if kind == "shapley":
                extrap.loc[m, "law_form_spread"] = np.abs(extrap.loc[m, kind].to_numpy() - e2[kind].to_numpy())


def _replicate(df: pd.DataFrame, prep: _Prepared, o: _Options, components, per_rung, extrap):
    """Seeds as replicates (analysis/fit/replicates.py): each seed analysed alone; every interval at C_ref and per
    rung is the between-seed t interval of the per-seed values (Stein's for the values a `run --until` study named),
    the extrapolated and the law's widened to at least it. (per_seed, components, per_rung, extrap)."""
    ok = prep.ok
    n_seeds = ok["seed"].nunique() if "seed" in ok else 1
    if not o.replicates or n_seeds < BETWEEN_SEEDS_MIN:
        return {}, components, per_rung, extrap
    one = replace(o, n_boot=0, boot_method="none", replicates=False, stein=None, seed=0, mixed=False,
                  force_extrapolation=True)  # each seed's extrapolation to the same target

    truths = planted_truths(df)
    limit = None if truths else REPLICATE_SEEDS_MAX  # planted truths: every seed counts in the coverage
    per_seed = per_seed_analyses(df, lambda sub: analyze_table(sub, **vars(one)), limit,
                                 first=o.stein.pilot if o.stein else ())
    if sum(not isinstance(x, str) for x in per_seed.values()) < BETWEEN_SEEDS_MIN:
        return per_seed, components, per_rung, extrap
    stein = replace(o.stein, n_seeds=int(n_seeds)) if o.stein is not None else None
    if len(components):
        components = between_seed_interval(components, per_seed, o.level, stein=stein)
    if extrap is not None and len(extrap):
        extrap = between_seed_interval(extrap, per_seed, o.level, table_of=lambda a: a.extrapolation, widen_only=True)
    per_rung = between_seed_per_rung(per_rung, per_seed, o.level)
    wl = between_seed_law(prep.law, per_seed, o.level) if prep.law is not None else []
    alone = (f"{n_seeds} seeds, each also analysed alone" if len(per_seed) == n_seeds else
             f"{n_seeds} seeds, {len(per_seed)} of them also analysed alone (more cost an analysis each)")
    extra = (", every extrapolated one at least that" if extrap is not None else "") + (
        f"; the law's {' and '.join(wl)} interval at least the seeds' too" if wl else "")
    prep.notes.append(f"{alone}: every Shapley interval at C_ref and per rung, and each scale trend in Findings, is "
                      "the between-seed t interval of the per-seed estimates with the pinned law's own spread added "
                      "(the seeds are the replicates)" + extra
                      + (f"; Stein's two-stage interval (pilot seeds {', '.join(map(str, stein.pilot))}) for the "
                         "values `run --until` named" if stein else ""))
    return per_seed, components, per_rung, extrap


def _check(a: StudyAnalysis, df: pd.DataFrame, X: np.ndarray, o: _Options, per_seed: dict) -> None:
    """Lost runs, the TOTAL two ways, paired per-rung contrasts, warnings; planted truths against the intervals."""
    a.notes += refuse_single_rung(a)
    a.lost = lost_runs(df, a, o.third_levels)
    a.checks = total_checks(a, X)
    a.paired = paired_per_rung(a) if a.law is not None else None
    a.warnings = warnings_for(a, df)
    truths = planted_truths(df)
    if not truths:
        return
    a.planted = truth_check(a.components, truths)
    if len(per_seed) >= 2:
        a.replicates = replicate_checks(per_seed, truths)
        a.coverage = coverage_summary(a.replicates, o.level)
    a.warnings += [f"planted factor {r.factor}: its {r.response} interval misses the planted truth "
                   f"({math.exp(r.truth):.3g}x)" for r in a.planted.itertuples() if r.estimable and not r.covers]


def _per_rung(fits, rungs, level, boot_theta) -> pd.DataFrame:
    rows = []
    for name, fit in fits.items():
        for r in rungs.itertuples():
            cc = component_contrasts(fit, float(r.z))
            for i, f in enumerate(fit.factors + ["TOTAL"]):
                c = cc["total"] if f == "TOTAL" else cc["shapley"][i]
                est, se, lo, hi, ok = fit.contrast(c, level)
                row = {"response": fit.response, "component": f, "rung": r.rung, "compute": r.compute,
                       "effect": est, "lo": lo, "hi": hi, "estimable": ok, "se_law": fit.law_se(c)}
                if boot_theta.get(name) is not None and ok:
                    q = (1 - level) / 2
                    row["boot_lo"], row["boot_hi"] = (float(v)
                                                      for v in np.nanquantile(boot_theta[name] @ c, [q, 1 - q]))
                rows.append(row)
    return pd.DataFrame(rows)
