"""Results table -> law, multipliers, effects, components, extrapolation (DESIGN §4).

`analyze_table(df)` is the whole analysis without plots or files: it uses what is estimable and
records in `notes` everything it left out (missing/failed runs, third levels, losses below L∞,
arms without a throughput baseline, non-estimable contrasts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.attribution import (EffectsFit, anova_table, code_table, component_contrasts, component_table,
                                  fit_effects)
from analysis.results import Inventory, factor_columns, inventory
from analysis.scaling import LawFit, fit_law, log_multiplier, log_multiplier_jacobian, loss_at

RESPONSES = {"quality": "ln_M", "throughput": "ln_R", "wall": "ln_W"}
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

    def alias_groups(self) -> list[str]:
        fit = next(iter(self.fits.values()), None)
        if fit is None:
            return []
        return [fit.term_label(g[0][0]) for g in fit.alias.groups]

    def not_estimable(self) -> list[str]:
        fit = next(iter(self.fits.values()), None)
        if fit is None:
            return []
        return [fit.terms[j].name + (f" (a combination of {', '.join(fit.terms[k].name for k in ks)})" if ks else "")
                for j, ks in fit.alias.not_estimable.items()]

    def arm_prediction(self, codes: dict[str, int], compute: float, level: float = 0.95) -> dict:
        """Predicted ln M and loss of an arm (factor -> ±1) at `compute`, with intervals."""
        fit = self.fits.get("quality")
        if fit is None or self.law is None:
            raise ValueError("no quality fit: the reference law was not estimable")
        x = np.array([[float(codes[f]) for f in self.factors]])
        z = float(np.log(compute / self.c_ref))
        c = fit.predict_phi(x, z)[0]
        est, se, lo, hi, ok = fit.contrast(c, level)
        key = "quality"
        if not ok and "quality" in self.reduced:
            fit, key = self.reduced["quality"], "quality/main"
            c = fit.predict_phi(x, z)[0]
            est, se, lo, hi, ok = fit.contrast(c, level)
        if not ok:
            raise ValueError("the arm's prediction is not estimable from this design")
        out = {"ln_M": est, "ln_M_se": se, "ln_M_lo": lo, "ln_M_hi": hi,
               "loss": float(loss_at(est, compute, self.law))}
        if self.boot_law is not None and key in self.boot_theta:
            lm = self.boot_theta[key] @ c
            bl = self.boot_law
            Ls = bl[:, 0] + bl[:, 1] * (np.exp(lm) * compute) ** (-bl[:, 2])
            q = (1 - level) / 2
            out["loss_lo"], out["loss_hi"] = (float(v) for v in np.nanquantile(Ls, [q, 1 - q]))
        else:  # monotone map of the ln M interval through the point law
            out["loss_lo"], out["loss_hi"] = float(loss_at(hi, compute, self.law)), float(loss_at(lo, compute, self.law))
        return out


def _rungs(df: pd.DataFrame, C: np.ndarray) -> pd.Series:
    if "rung" in df and df["rung"].notna().all():
        return df["rung"].astype(str)
    # No rung labels: cluster ln C with gaps wider than ln 1.5.
    order = np.argsort(C)
    lab = np.zeros(len(C), int)
    lc = np.log(C[order])
    lab[order] = np.concatenate([[0], np.cumsum(np.diff(lc) > np.log(1.5))])
    return pd.Series([f"r{i}" for i in lab], index=df.index)


def _boot_law_refit(law: LawFit, C, L, pins) -> LawFit | None:
    try:
        return fit_law(C, L, pin_linf=pins[0], pin_alpha=pins[1], n_boot=0, profile=False)
    except ValueError:
        return None


def analyze_table(df: pd.DataFrame, *, factors: list[str] | None = None, pin_linf: float | None = None,
                  pin_alpha: float | None = None, n_boot: int = 200, boot_method: str = "wild", hc: str = "HC2",
                  mixed: bool = False, interactions: bool = True, target_compute: float | None = None,
                  third_levels: str = "drop", level: float = 0.95, law_delta: bool = True,
                  seed: int = 0, responses: tuple[str, ...] = tuple(RESPONSES),
                  law_profile: bool = True) -> StudyAnalysis:
    """The attribution of DESIGN §4 on a results table; see the module docstrings for the math."""
    bad = [r for r in responses if r not in RESPONSES]
    if bad:
        raise ValueError(f"responses {bad}; allowed values: {', '.join(RESPONSES)}")
    if boot_method not in BOOT_METHODS:
        raise ValueError(f"boot_method {boot_method!r}; allowed values: {', '.join(BOOT_METHODS)}")
    if target_compute is not None and not target_compute > 0:
        raise ValueError(f"target_compute must be > 0 FLOPs, got {target_compute}")
    for col in ("status", "train_flops", "eval_macro_loss"):
        if col not in df.columns:
            raise ValueError(f"results table lacks column {col!r}")
    inv = inventory(df)
    notes = [ln for ln in inv.lines()]
    ok = df[(df["status"] == "completed") & np.isfinite(df["train_flops"].astype(float))
            & (df["train_flops"].astype(float) > 0) & np.isfinite(df["eval_macro_loss"].astype(float))].copy()
    if factors is None:
        factors = factor_columns(ok)
    if not factors:
        raise ValueError("no factor varies among the completed runs: nothing to attribute")
    X, keep, n3 = code_table(ok, factors, third_levels)
    notes += n3
    ok, X = ok[keep].copy(), X[keep]
    if not len(ok):
        raise ValueError("no completed run at the two levels of the study's factors")
    varying = [i for i in range(len(factors)) if len(np.unique(X[:, i])) > 1]
    if len(varying) < len(factors):
        notes.append("left out (one level only among the runs kept): "
                     + ", ".join(f for i, f in enumerate(factors) if i not in varying))
        factors, X = [factors[i] for i in varying], X[:, varying]
        if not factors:
            raise ValueError("no factor varies at two levels among the runs kept: nothing to attribute")
    for i, f in enumerate(factors):
        ok[f"x_{f}"] = X[:, i]
    C = ok["train_flops"].to_numpy(float)
    L = ok["eval_macro_loss"].to_numpy(float)
    ok["rung"] = _rungs(ok, C).to_numpy()
    c_ref = float(np.exp(np.mean(np.log(C))))
    ok["z"] = np.log(C / c_ref)
    rung_names = list(dict.fromkeys(ok["rung"]))
    rungs = pd.DataFrame({"rung": rung_names, "compute": [float(np.exp(np.log(C[ok["rung"].to_numpy() == r]).mean()))
                                                          for r in rung_names]})
    rungs["z"] = np.log(rungs["compute"] / c_ref)
    rungs = rungs.sort_values("compute").reset_index(drop=True)
    scale = len(rungs) >= 2
    if not scale:
        notes.append("one rung: no factor × log C terms; multipliers assume no scale dependence")
    base = np.all(X == -1, axis=1)
    if not base.any():
        notes.append("the all-baseline arm has no completed run: no reference law, no quality multipliers")
    rng = np.random.default_rng(seed)

    # Reference law on the baseline arm (DESIGN §4.1).
    law = None
    pins = (pin_linf, pin_alpha)
    if base.any():
        try:
            law = fit_law(C[base], L[base], pin_linf=pin_linf, pin_alpha=pin_alpha,
                          n_boot=n_boot if boot_method != "none" else 0, seed=seed, profile=law_profile)
        except ValueError as e:
            notes.append(f"reference law not estimable: {e}")
    ok["ln_M"] = log_multiplier(L, C, law) if law else np.nan
    if law is not None and np.isnan(ok["ln_M"]).any():
        notes.append(f"{int(np.isnan(ok['ln_M']).sum())} run(s) with loss ≤ fitted L∞: no multiplier (left out)")
    # Throughput ratio against the baseline arm on the same hardware and rung (DESIGN §4.3).
    mfs = ok["model_flops_per_s"].astype(float) if "model_flops_per_s" in ok else pd.Series(np.nan, index=ok.index)
    hw = ok["hardware"].astype(str) if "hardware" in ok else pd.Series("?", index=ok.index)
    key = list(zip(ok["rung"], hw))
    ref_sum: dict = {}
    for k_, m_, b_ in zip(key, mfs.to_numpy(float), base):
        if b_ and np.isfinite(m_):
            s_, n_ = ref_sum.get(k_, (0.0, 0))
            ref_sum[k_] = (s_ + m_, n_ + 1)
    ok["R"] = [m_ / (ref_sum[k_][0] / ref_sum[k_][1]) if k_ in ref_sum else np.nan
               for m_, k_ in zip(mfs.to_numpy(float), key)]
    ok["ln_R"] = np.log(ok["R"].astype(float))
    if ok["ln_R"].isna().any():
        notes.append(f"{int(ok['ln_R'].isna().sum())} run(s) without a baseline throughput on the same "
                     "hardware and rung: no throughput ratio")
    ok["ln_W"] = ok["ln_M"] + ok["ln_R"]

    fits: dict[str, EffectsFit] = {}
    reduced: dict[str, EffectsFit] = {}
    masks: dict[str, np.ndarray] = {}
    groups = ok["seed"].to_numpy() if "seed" in ok else None
    for name, col in RESPONSES.items():
        if name not in responses:
            continue
        y = ok[col].to_numpy(float)
        m = np.isfinite(y)
        if m.sum() < 2:
            continue
        jac = cov = None
        if law_delta and law is not None and name in ("quality", "wall"):
            jac, cov = log_multiplier_jacobian(L[m], law), law.cov
        fit = fit_effects(X[m], ok["z"].to_numpy()[m], y[m], factors, response=col, interactions=interactions,
                          scale=scale, hc=hc, extra_jac=jac, extra_cov=cov,
                          groups=groups[m] if groups is not None else None, mixed=mixed)
        fits[name] = fit
        masks[name] = m
        notes += [f"{name}: {n}" for n in fit.notes]
        shap = component_contrasts(fit, 0.0)["shapley"]
        bad = [f for f, c in zip(factors, shap) if not fit.estimable(c)]
        if bad and interactions:
            red = fit_effects(X[m], ok["z"].to_numpy()[m], y[m], factors, response=col, interactions=False,
                              scale=scale, hc=hc, extra_jac=jac, extra_cov=cov,
                              groups=groups[m] if groups is not None else None, mixed=mixed)
            reduced[name] = red
            notes.append(f"{name}: with two-factor interactions the Shapley value of {', '.join(bad)} is not "
                         "estimable from the runs present; Shapley values from the main-effects model "
                         "(assumes no interactions), LOO/AOI from the full model")

    # Bootstrap (DESIGN §4.4: "each with a CI"): refit the law and the effects B times.
    boot_theta: dict[str, np.ndarray] = {}
    boot_law = None
    if n_boot > 0 and boot_method != "none" and fits:
        allfits = {**fits, **{f"{n}/main": f for n, f in reduced.items()}}
        boot_theta, boot_law = _bootstrap(ok, X, C, L, law, pins, allfits,
                                          {**masks, **{f"{n}/main": masks[n] for n in reduced}}, n_boot,
                                          boot_method, rng)

    def comp_at(n: str, z: float) -> pd.DataFrame:
        if n in reduced:
            return component_table(reduced[n], z, level, boot_theta.get(f"{n}/main"), fits[n], boot_theta.get(n))
        return component_table(fits[n], z, level, boot_theta.get(n))

    comp = [comp_at(n, 0.0) for n in fits]
    components = pd.concat(comp, ignore_index=True) if comp else pd.DataFrame()
    per_rung = _per_rung({n: reduced.get(n, f) for n, f in fits.items()}, rungs, level,
                         {n: boot_theta.get(f"{n}/main" if n in reduced else n) for n in fits})
    extrap = None
    if target_compute is not None and fits:
        zt = float(np.log(target_compute / c_ref))
        extrap = pd.concat([comp_at(n, zt) for n in fits], ignore_index=True)
        extrap.insert(2, "target_compute", target_compute)
        if not scale:
            notes.append("extrapolation without scale terms: the multipliers are carried unchanged to the target")
    anova = {n: anova_table(f) for n, f in fits.items()}
    return StudyAnalysis(table=ok, inventory=inv, factors=list(factors), law=law, c_ref=c_ref, rungs=rungs,
                         fits=fits, components=components, per_rung=per_rung, extrapolation=extrap, anova=anova,
                         boot_theta=boot_theta, boot_law=boot_law, notes=notes, target_compute=target_compute,
                         reduced=reduced)


def _per_rung(fits, rungs, level, boot_theta) -> pd.DataFrame:
    rows = []
    for name, fit in fits.items():
        for r in rungs.itertuples():
            cc = component_contrasts(fit, float(r.z))["shapley"]
            for i, f in enumerate(fit.factors):
                est, se, lo, hi, ok = fit.contrast(cc[i], level)
                row = {"response": fit.response, "component": f, "rung": r.rung, "compute": r.compute,
                       "effect": est, "lo": lo, "hi": hi, "estimable": ok}
                if boot_theta.get(name) is not None and ok:
                    q = (1 - level) / 2
                    row["boot_lo"], row["boot_hi"] = (float(v) for v in np.nanquantile(boot_theta[name] @ cc[i], [q, 1 - q]))
                rows.append(row)
    return pd.DataFrame(rows)


def _bootstrap(ok, X, C, L, law, pins, fits, masks, n_boot, method, rng):
    """Wild (Rademacher on HC2-scaled residuals; loss scale for quality) or resampling within cells."""
    z = ok["z"].to_numpy()
    base = np.all(X == -1, axis=1)
    Ks = {n: np.flatnonzero(f.alias.kept) for n, f in fits.items()}
    out = {n: np.full((n_boot, len(f.terms)), np.nan) for n, f in fits.items()}
    blaw = np.full((n_boot, 3), np.nan)
    lnR = ok["ln_R"].to_numpy(float)
    fitted, scaled = {}, {}
    for n, f in fits.items():
        yhat = f.X[:, Ks[n]] @ f.theta[Ks[n]]
        fitted[n] = yhat
        scaled[n] = f.resid / np.sqrt(np.clip(1 - f.leverage, 1e-3, None))
    if "quality" in fits and law is not None:
        mq = masks["quality"]
        Lhat = np.full(len(L), np.nan)
        Lhat[mq] = loss_at(fitted["quality"], C[mq], law)
        rL = np.zeros(len(L))
        hq = np.ones(len(L)) * 0.5
        hq[mq] = fits["quality"].leverage
        rL[mq] = (L[mq] - Lhat[mq]) / np.sqrt(np.clip(1 - hq[mq], 1e-3, None))
    cells = ok["arm"].astype(str) + "|" + ok["rung"].astype(str) if "arm" in ok else ok["rung"].astype(str)
    cell_idx = [np.flatnonzero(cells.to_numpy() == c) for c in pd.unique(cells)]
    for b in range(n_boot):
        if method == "wild":
            v = rng.choice((-1.0, 1.0), size=len(L))
            idx = np.arange(len(L))
        else:
            idx = np.concatenate([rng.choice(ci, size=len(ci)) for ci in cell_idx])
            v = None
        law_b = None
        lnM_b = None
        if "quality" in fits and law is not None:
            if method == "wild":
                Lb = np.where(masks["quality"], Lhat + v * rL, L)
            else:
                Lb = L[idx]
            bb = base[idx]
            law_b = _boot_law_refit(law, C[idx][bb], Lb[bb], pins)
            if law_b is not None:
                blaw[b] = (law_b.linf, law_b.A, law_b.alpha)
                lnM_b = log_multiplier(Lb, C[idx], law_b)
        for n, f in fits.items():
            if f.response == "ln_M":
                y = lnM_b
            elif f.response == "ln_R":
                if method == "wild":
                    y = lnR.copy()
                    m = masks[n]
                    y[m] = fitted["throughput"] + v[m] * scaled["throughput"]
                else:
                    y = lnR[idx]
            else:
                if lnM_b is None:
                    continue
                yR = lnR.copy()
                if method == "wild":
                    m = masks["throughput"] if "throughput" in masks else np.isfinite(yR)
                    if "throughput" in fits:
                        yR[m] = fitted["throughput"] + v[m] * scaled["throughput"]
                else:
                    yR = lnR[idx]
                y = lnM_b + yR
            if y is None:
                continue
            m = np.isfinite(y) & (masks[n] if method == "wild" else True)
            if method != "wild":
                from analysis.attribution import design_matrix

                Xb = design_matrix(f.terms, f.factors, X[idx], z[idx])
            else:
                Xb = np.full((len(y), len(f.terms)), np.nan)
                Xb[masks[n]] = f.X
            K = Ks[n]
            A = Xb[m][:, K]
            if len(A) < len(K):
                continue
            th, *_ = np.linalg.lstsq(A, y[m], rcond=None)
            out[n][b, K] = th
            out[n][b, np.setdiff1d(np.arange(len(f.terms)), K)] = 0.0
    return out, (blaw if "quality" in fits else None)
