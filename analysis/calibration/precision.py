"""The precision planner (docs/method.md §4.9): each component's expected 95% half-width of ln M before a run
starts, from the analysis's own estimator (`joint.quality_fit`) on the noise-free losses of the planned design at a
stated truth, its covariance taken at that truth (delta method, with the (seed × rung) cluster term at the median
of its moment estimate). Each number is the *median* over studies.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from marin_ablate.analysis.fit.attribution import component_contrasts, component_table
from marin_ablate.analysis.fit.joint import between_clusters, pin_term, quality_fit, valley_term
from marin_ablate.analysis.fit.reflaw import predicted_reference
from marin_ablate.analysis.fit.replicates import BETWEEN_SEEDS_MIN
from marin_ablate.analysis.fit.stopping import seeds_for, stein_t
from marin_ablate.analysis.io.results import factor_columns, load_table
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.responses import law, law_column

#: Stated defaults where no noise source is given: the per-run loss noise, and the calibration study's
#: fitted law (docs/calibration/: α 0.2253, L∞ 1.736 and 1.22 nats of reducible loss at its C_ref).
DEFAULT_SD = 0.01
DEFAULT_LAW = {"linf": 1.736, "alpha": 0.2253, "reducible_at_cref": 1.22}
#: The component x seed sd in ln M the smoke study measured (per-seed estimates of 12 seeds, benchmarks/RESULTS.md
#: "Seed replication"): the planner's prior where no noise source measures its own (docs/method.md §4.11).
MEASURED_SEED_SD = (("optimizer", 0.33), ("sconv", 0.15))
MEASURED_SEED_SD_OTHER = 0.05
#: Options the target search tries: seeds per arm (seeds are what narrow a component x seed term), and fractions
#: of the study's design.
MAX_SEEDS = 32
#: The planner's assumed effect: every component's ln M = this (a ~10% multiplier, the size of the
#: recipe's components), all in the same direction; a shift shared by a (seed × rung) cluster moves
#: the law's local slope and with it every multiplier in proportion to its size.
DEFAULT_EFFECT = 0.1
FRACTIONS = {"full design": 1, "half fraction": 2, "quarter fraction": 4}


@dataclass(frozen=True)
class Noise:
    """Loss noise of one run (`sd`) and the shift every arm of one (seed, rung) shares (`rung_sd`),
    with where they came from; `law` (L∞, A, α) when the source fitted one."""

    sd: float
    rung_sd: float = 0.0
    source: str = f"default: {DEFAULT_SD} nats per run, no (seed × rung) shift (assumed; measure it with a noise study)"
    law: tuple[float, float, float] | None = None
    # The component x seed sd in ln M of each component ("TOTAL" too): how much its effect moves from seed to seed
    # beyond what the run noise explains (docs/method.md §4.4); a component it does not name moves by `seed_sd_other`.
    seed_sd: tuple[tuple[str, float], ...] = ()
    seed_sd_other: float = 0.0

    def __post_init__(self):
        if not (self.sd > 0 and math.isfinite(self.sd)) or not (self.rung_sd >= 0 and math.isfinite(self.rung_sd)):
            raise ValueError(f"noise sd={self.sd}, rung_sd={self.rung_sd}; allowed values: sd > 0, rung_sd >= 0 (nats)")
        object.__setattr__(self, "seed_sd", tuple(sorted(dict(self.seed_sd).items())))
        bad = {k: v for k, v in (*self.seed_sd, ("(other)", self.seed_sd_other)) if not (v >= 0 and math.isfinite(v))}
        if bad:
            raise ValueError(f"component x seed sd {bad}; allowed values: finite, >= 0 (ln M)")

    def component_seed_sd(self, component: str, components: Sequence[str]) -> float:
        """The component x seed sd of a component; the TOTAL's, unless given, adds the components' in quadrature."""
        d = dict(self.seed_sd)
        if component in d:
            return d[component]
        if component == "TOTAL":
            return math.sqrt(sum(self.component_seed_sd(c, components) ** 2 for c in components))
        return self.seed_sd_other


@dataclass(frozen=True)
class Layout:
    """A planned study: ±1 design (arms × factors), per-run compute of each rung, seeds per arm."""

    design: np.ndarray
    factors: tuple[str, ...]
    computes: tuple[float, ...]
    seeds: int

    @property
    def n_runs(self) -> int:
        return len(self.design) * len(self.computes) * self.seeds


def _law(noise: Noise, c_ref: float) -> tuple[float, float, float]:
    if noise.law is not None:
        return noise.law
    d = DEFAULT_LAW
    return d["linf"], d["reducible_at_cref"] * c_ref ** d["alpha"], d["alpha"]


def _runs(lay: Layout, law, log_m=None):
    """Noise-free runs of the layout: X, z (rung compute over C_ref), C, L, seed labels, clusters."""
    D = np.asarray(lay.design, float)
    n_a = len(D)
    X = np.tile(D, (len(lay.computes) * lay.seeds, 1))
    C = np.repeat(np.asarray(lay.computes, float), n_a * lay.seeds)
    seed = np.tile(np.repeat(np.arange(lay.seeds), n_a), len(lay.computes))
    rung = np.repeat(np.arange(len(lay.computes)), n_a * lay.seeds)
    c_ref = float(np.exp(np.mean(np.log(C))))
    z = np.log(C / c_ref)
    lnm = np.zeros(len(C)) if log_m is None else np.asarray(log_m(X, C), float)
    linf, A, alpha = law
    L = linf + A * (np.exp(lnm) * C) ** (-alpha)
    clusters = np.array([f"{s}|{r}" for s, r in zip(seed, rung, strict=True)])
    return X, z, C, L, seed, clusters, c_ref


def _fits(lay: Layout, law, log_m=None, pinned: bool = False):
    """(Shapley fit, its JointFit, c_ref): the pipeline's quality fit, or its main-effects refit where
    the full model leaves a Shapley value non-estimable (as analysis/pipeline.py does)."""
    X, z, C, L, seed, clusters, c_ref = _runs(lay, law, log_m)
    # one rung cannot fix α: the analysis then needs it pinned (--pin-alpha), and so does the prediction
    pins = (law[0], law[2]) if pinned else (None, law[2]) if len(lay.computes) < 2 else (None, None)
    kw = dict(scale=len(lay.computes) >= 2, seeds=seed if lay.seeds > 1 else None, clusters=clusters, pins=pins)
    fq, jf = quality_fit(X, z, C, L, list(lay.factors), interactions=True, **kw)
    if any(not fq.estimable(c) for c in component_contrasts(fq, 0.0)["shapley"]):
        fq, jf = quality_fit(X, z, C, L, list(lay.factors), interactions=False, **kw)
    return fq, jf, c_ref


def _covariance(jf, noise: Noise) -> tuple[np.ndarray, np.ndarray, dict]:
    """(robust, model-based) Var θ̂ over the joint fit's parameters at the truth, as the analysis
    computes them (it takes the larger per contrast), and the df they rest on."""
    J = jf.jac
    bread = np.linalg.pinv(J.T @ J)
    h = np.clip(((J @ bread) * J).sum(1), 0, 1 - 1e-9)
    _, dfb = between_clusters(jf)
    labels, inv = np.unique(jf.clusters.astype(str), return_inverse=True)
    n_bar = float(np.mean(np.bincount(inv)))
    s2, r2 = noise.sd**2, noise.rung_sd**2
    # The shift's share of the residuals: the cluster indicators Z less their least-squares fit, at the
    # median of its χ²(df_b) scale; it enters HC3's e_n² and s² alike.
    Z = np.zeros((len(inv), len(labels)))
    Z[np.arange(len(inv)), inv] = 1.0
    R = Z - J @ (bread @ (J.T @ Z))
    med = float(stats.chi2.median(dfb)) / dfb if dfb > 0 else 1.0
    shift2 = r2 * med * (R**2).sum(axis=1)
    # HC3 at its expectation: E e_n² = σ²(1 − h_n) + shift, weighted by (1 − h_n)⁻²
    hc3 = bread @ ((J * ((s2 * (1 - h) + shift2) / (1 - h) ** 2)[:, None]).T @ J) @ bread
    model = (s2 + float(shift2.sum()) / max(jf.dof, 1)) * bread
    sig2b = 0.0
    if dfb > 0 and jf.dof - dfb > 0:
        # the analysis's moment estimate σ̂²_b = max(0, (s²_b − s²_w)/n̄), s²_b ~ (σ² + n̄σ²_b)·χ²(df_b)/df_b: its median
        sig2b = max(0.0, ((s2 + n_bar * r2) * med - s2) / n_bar)
        S = np.zeros((len(labels), J.shape[1]))
        np.add.at(S, inv, J)
        model = model + sig2b * bread @ (S.T @ S) @ bread
    return hc3, model, {"dof": jf.dof, "cluster_df": int(dfb), "clusters": len(labels), "cluster_var": sig2b}


def predict(lay: Layout, noise: Noise, *, level: float = 0.95, ratios: tuple[float, ...] = (1.0, 10.0),
            log_m=None, law: tuple[float, float, float] | None = None,
            pin_cov: np.ndarray | None = None, pin_valley: tuple = (),
            between: bool = True) -> tuple[pd.DataFrame, dict]:
    """Per component (and TOTAL): the median 95% half-width of its ln M at each `ratios` × C_ref, and an info dict.
    `log_m(X, C)`: each run's true ln M (default none); `law`: (L∞, A, α) (default: the noise source's, else
    DEFAULT_LAW at this layout's C_ref); `pin_cov`, `pin_valley`: L∞ and α pinned as `run` pins them; `between` (two
    or more seeds): at least the median between-seed t interval (docs/method.md §4.9)."""
    if lay.seeds < 1 or not lay.computes or len(lay.design) < 2:
        raise ValueError(f"layout: seeds={lay.seeds}, {len(lay.computes)} rungs, {len(lay.design)} arms; "
                         "allowed values: seeds >= 1, at least one rung and two arms")
    law = law or _law(noise, float(np.exp(np.mean(np.log(lay.computes)))))
    try:
        fq, jf, c_ref = _fits(lay, law, log_m, pinned=pin_cov is not None)
    except ValueError as e:
        raise ValueError(f"precision: the analysis's fit cannot be made on {len(lay.design)} arms × "
                         f"{len(lay.computes)} rung(s) ({e}); a seed panel measures noise (use it as --noise PATH), "
                         "the plan to size is a factorial on at least two rungs") from None
    hc3, model, info = _covariance(jf, noise)
    extra = np.zeros_like(hc3)  # the pinned law's part, which every seed shares
    if pin_cov is not None:  # the pins' own uncertainty, by the delta method the analysis uses
        extra = pin_term(jf, np.asarray(pin_cov, float))[0]
        if len(pin_valley):
            extra = extra + valley_term(jf, pin_valley)[0]
        hc3, model = hc3 + extra, model + extra
    _, _, _, T = jf.theta_std(len(fq.terms), fq.terms)
    fit = replace(fq, cov=T @ hc3 @ T.T, cov_model=T @ model @ T.T, cov_law=T @ extra @ T.T)
    one = None
    if between and lay.seeds >= BETWEEN_SEEDS_MIN:  # one seed's model interval, for the between-seed sd
        one = predict(replace(lay, seeds=1), noise, level=level, ratios=ratios, log_m=log_m, law=law,
                      pin_cov=pin_cov, pin_valley=pin_valley, between=False)[0]
    out = None
    for ratio in ratios:
        t = component_table(fit, math.log(ratio), level)
        hw = np.where(t["shapley_estimable"], (t["shapley_hi"] - t["shapley_lo"]) / 2, np.nan)
        law_se = t["shapley_se_law"].to_numpy(float)
        if one is not None:  # the seeds' interval at C_ref; at least it beyond (docs/method.md §4.4)
            seeds = _between_half(one[f"hw_{ratio:g}x"].to_numpy(), one.attrs["dof"], list(t["component"]), noise,
                                  lay.seeds, level, law_se)
            hw = np.where(np.isfinite(hw), seeds, np.nan) if ratio == 1 else np.fmax(hw, seeds)
        col = pd.DataFrame({"component": t["component"], f"hw_{ratio:g}x": hw, f"law_se_{ratio:g}x": law_se})
        out = col if out is None else out.merge(col, on="component")
    out.attrs["dof"] = jf.dof
    info.update(c_ref=c_ref, law=law, runs=lay.n_runs, main_effects_only=not any(t_.kind == "2fi" for t_ in fq.terms))
    return out, info


def _between_half(one_hw: np.ndarray, one_dof: int, components: list[str], noise: Noise, k: int,
                  level: float, law_se: np.ndarray) -> np.ndarray:
    """The median between-seed t half-width over k seeds: t(k−1)·√(s²/k + se_law²), s² = one seed's model variance
    less the law's share + the component x seed variance, at the median of the sample sd's χ²(k−1) scale."""
    q = float(stats.t.ppf(0.5 + level / 2, max(one_dof, 1)))
    seed = np.array([noise.component_seed_sd(c, [x for x in components if x != "TOTAL"]) ** 2 for c in components])
    s2 = np.maximum((one_hw / q) ** 2 - law_se**2, 0.0) + seed
    med = float(stats.chi2.median(k - 1)) / (k - 1)
    return float(stats.t.ppf(0.5 + level / 2, k - 1)) * np.sqrt(s2 * med / k + law_se**2)


# Noise sources


def default_noise() -> Noise:
    """The stated default: DEFAULT_SD nats per run, no (seed × rung) shift, the smoke study's measured component x
    seed sd (MEASURED_SEED_SD)."""
    sd = ", ".join(f"{c} {v:g}" for c, v in MEASURED_SEED_SD)
    return Noise(DEFAULT_SD, seed_sd=MEASURED_SEED_SD, seed_sd_other=MEASURED_SEED_SD_OTHER,
                 source=f"default: {DEFAULT_SD} nats per run, no (seed × rung) shift (assumed; measure it with a noise "
                        f"study); component x seed sd in ln M as the smoke study measured it: {sd}, the others "
                        f"{MEASURED_SEED_SD_OTHER:g}")


def seed_sd_of(a) -> dict[str, float]:
    """{component or TOTAL: its component x seed sd in ln M} of an analysed study with two or more seeds: the
    per-seed estimates' sd with one seed's model variance (the mean of theirs) taken out; {} with one seed."""
    if not getattr(a, "per_seed", None) or not len(a.components) or "between_seeds" not in a.components:
        return {}
    c = a.components[a.components["response"] == law_column()]
    out = {}
    for r in c.itertuples():
        if r.between_seeds < 2 or not math.isfinite(r.shapley_se_between):
            continue
        se1 = [float(x.components.set_index(["response", "component"]).loc[(law_column(), r.component), "shapley_se"])
               for x in a.per_seed.values() if (law_column(), r.component) in
               set(zip(x.components["response"], x.components["component"], strict=True))]
        s2 = r.shapley_se_between**2 * r.between_seeds - (float(np.nanmean(se1)) ** 2 if se1 else 0.0)
        out[str(r.component)] = math.sqrt(max(s2, 0.0))
    return out


def noise_from(path: str | Path) -> Noise:
    """The noise of a finished study folder (or results file): a seed panel (one rung, or at most two
    arms) gives the seed-to-seed sd per rung; an analysed factorial gives its fit's residuals."""
    df = load_table(path)
    ok = df[df["status"] == "completed"].copy() if "status" in df else df.copy()
    ok = ok[np.isfinite(pd.to_numeric(ok.get("eval_macro_loss"), errors="coerce"))]
    if not len(ok):
        raise ValueError(f"--noise {path}: no completed run with a loss; allowed values: a finished noise study or an "
                         "analysed study (folder or results file)")
    n_rungs, n_arms = ok["rung"].nunique(), ok["arm"].nunique() if "arm" in ok else 1
    if n_rungs >= 2 and n_arms > 2 and factor_columns(ok):
        return _residual_noise(ok, path)
    return _panel_noise(ok, path)


def _panel_noise(ok: pd.DataFrame, path) -> Noise:
    """Seed panel: pooled seed-to-seed sd of each (arm, rung); with two arms sharing seeds, the paired
    difference's sd/√2 is the per-run noise and the rest the (seed × rung) shift every arm shares."""
    L = ok["eval_macro_loss"].astype(float)
    keys = ["arm", "rung"] if "arm" in ok else ["rung"]
    g = L.groupby([ok[k] for k in keys])
    dfs = g.count() - 1
    if int(dfs.clip(lower=0).sum()) < 1:
        raise ValueError(f"--noise {path}: each arm ran one seed per rung; a seed panel needs at least two seeds")
    total = float(np.sqrt((g.var(ddof=1).fillna(0) * dfs.clip(lower=0)).sum() / dfs.clip(lower=0).sum()))
    run, how = total, "no pair of arms sharing seeds: all of it taken as per-run noise"
    if "arm" in ok and ok["arm"].nunique() == 2 and "seed" in ok:
        w = ok.pivot_table(index=["rung", "seed"], columns="arm", values="eval_macro_loss", aggfunc="mean").dropna()
        if len(w) >= 2:
            d = (w.iloc[:, 0] - w.iloc[:, 1])
            d = d - d.groupby(level=0).transform("mean")
            dfd = len(w) - w.index.get_level_values(0).nunique()
            if dfd >= 1:
                run = float(np.sqrt((d**2).sum() / dfd / 2))
                how = f"per-run noise from the two arms' paired difference ({dfd} df)"
    shared = math.sqrt(max(0.0, total**2 - run**2))
    src = (f"noise study {path}: seed-to-seed sd {total:.4g} nats over {len(ok)} runs; {how}; "
           f"(seed × rung) shift sd {shared:.3g}")
    return Noise(sd=max(run, 1e-6), rung_sd=shared, source=src)


def _residual_noise(ok: pd.DataFrame, path) -> Noise:
    """An analysed study: the joint fit's within-cluster residual sd and its between-cluster excess."""
    a = analyze_table(ok, n_boot=0, boot_method="none", responses=(law().name,), law_forms=("power",))
    seeds = seed_sd_of(a)
    jf = a.joint.get("power")
    if jf is None or jf.dof <= 0:
        raise ValueError(f"--noise {path}: its quality fit has no residual df ({'; '.join(a.notes[-2:])})")
    _, inv = np.unique(jf.clusters.astype(str), return_inverse=True)
    n_g = np.bincount(inv).astype(float)
    r = jf.resid
    s2b, dfb = between_clusters(jf)
    dfw = jf.dof - max(dfb, 0)
    s2w = float(np.sum((r - (np.bincount(inv, weights=r) / n_g)[inv]) ** 2)) / max(dfw, 1)
    rung = math.sqrt(max(0.0, (s2b - s2w) / float(np.mean(n_g)))) if dfb > 0 and np.isfinite(s2b) else 0.0
    own = (jf.linf, jf.A, jf.alpha) if jf.alpha > 0 and math.isfinite(jf.A) else None
    src = (f"residuals of the analysed study {path}: within (seed × rung) sd {math.sqrt(s2w):.4g} nats on {dfw} df, "
           + (f"shift sd {rung:.3g} on {dfb} cluster df" if dfb > 0
              else "no cluster df to measure a (seed × rung) shift")
           + (f"; its law L∞ {own[0]:.4g}, A {own[1]:.4g}, α {own[2]:.4g}" if own
              else "; its law not used (α ≤ 0)"))
    if seeds:
        src += (f"; component x seed sd over its {int(ok['seed'].nunique())} seeds: "
                + ", ".join(f"{c} {v:.3g}" for c, v in seeds.items()))
    other = float(np.median([v for c, v in seeds.items() if c != "TOTAL"])) if seeds else 0.0
    return Noise(sd=math.sqrt(s2w), rung_sd=rung, source=src, law=own, seed_sd=tuple(seeds.items()),
                 seed_sd_other=other)


# A study's layout, its cost, and the options that reach a target


def _per_run(study) -> list[dict]:
    """Per rung: name, per-run compute and per-run cost (gpu_hours or core_seconds) from describe()."""
    out = []
    for r in study.describe()["rungs"]:
        n = max(int(r["n_runs"]), 1)
        cost = r.get("gpu_hours", r.get("core_seconds"))
        out.append({"rung": r["name"], "compute": float(r["train_flops"]) / n,
                    "cost": float(cost) / n if cost is not None else float("nan")})
    return out


def cost_unit(study) -> str:
    return "gpu_hours" if getattr(study, "hardware", None) is not None else "core_seconds"


def study_layout(study) -> tuple[Layout, list[dict]]:
    rows = _per_run(study)
    lay = Layout(np.asarray(study.design.matrix, float), tuple(f.name for f in study.factors),
                 tuple(r["compute"] for r in rows), len(study.seeds))
    return lay, rows


def _extra_rungs(study, rows: list[dict]) -> list[dict]:
    """Registered rungs of the study's ladder family not in it, each with its per-run compute and cost."""
    from marin_ablate.ablations.ladders import ladder, ladder_family

    names = [r["rung"] for r in rows]
    fam = ladder_family(names)
    have = [r["compute"] for r in rows]
    out = []
    for name in fam:
        if name in names:
            continue
        try:
            one = _per_run(replace(study, rungs=ladder([name]), seeds=study.seeds[:1]))[0]
        except (ValueError, KeyError):
            continue
        if all(abs(math.log(one["compute"] / c)) > math.log(1.5) for c in have):
            out.append(one)
    return sorted(out, key=lambda r: r["compute"])


def _fraction(study, div: int):
    if div == 1:
        return np.asarray(study.design.matrix, float), ""
    from marin_ablate.ablations.designs import fraction

    n = len(study.design.matrix) // div
    d = fraction([f.name for f in study.factors], runs=n)
    return np.asarray(d.matrix, float), f"resolution {d.resolution}" if d.resolution else ""


def assumed_effects(X: np.ndarray, C: np.ndarray, effect: float = DEFAULT_EFFECT) -> np.ndarray:
    """ln M of each run when every component's Shapley value is `effect` (main effects only)."""
    return 0.5 * effect * (np.asarray(X, float) + 1).sum(axis=1)


def options(study, noise: Noise, target: float, *, level: float = 0.95, max_seeds: int = MAX_SEEDS) -> pd.DataFrame:
    """Per (fraction, rung set): the fewest seeds whose widest component half-width at C_ref reaches
    `target`, with its runs, compute and cost (the plan's own per-run numbers); cheapest first."""
    if not (target > 0 and math.isfinite(target)):
        raise ValueError(f"--target-halfwidth {target}; allowed values: a positive ln-scale half-width, e.g. 0.05")
    lay, rows = study_layout(study)
    extra = _extra_rungs(study, rows)
    rung_sets = [("", rows)]
    below = [r for r in extra if r["compute"] < min(x["compute"] for x in rows)]
    above = [r for r in extra if r["compute"] > max(x["compute"] for x in rows)]
    if above:
        rung_sets.append((f"+ rung {above[0]['rung']}", rows + above[:1]))
    if below:
        rung_sets.append((f"+ rung {below[-1]['rung']}", below[-1:] + rows))
    if len(above) >= 2:
        rung_sets.append((f"+ rungs {above[0]['rung']}, {above[1]['rung']}", rows + above[:2]))
    law = _law(noise, float(np.exp(np.mean(np.log(lay.computes)))))
    out = []
    for fname, div in FRACTIONS.items():
        try:
            D, res = _fraction(study, div)
        except ValueError:
            continue
        if div > 1 and len(D) < len(lay.factors) + 1:
            continue
        for rname, rs in rung_sets:
            for s in range(1, max_seeds + 1):
                ly = Layout(D, lay.factors, tuple(r["compute"] for r in rs), s)
                try:
                    t, info = predict(ly, noise, level=level, ratios=(1.0,), law=law, log_m=assumed_effects)
                except ValueError:
                    break
                widest = float(t.loc[t["component"] != "TOTAL", "hw_1x"].max())
                # a shift the clusters cannot measure is left out of the analysis's intervals: no honest width
                blind = noise.rung_sd > 0 and info["cluster_df"] <= 0
                if (widest <= target and not blind) or s == max_seeds:
                    runs = len(D) * s * len(rs)
                    out.append({"option": " ".join(x for x in (fname + (f" ({res})" if res else ""), rname,
                                                              f"{s} seed{'s' * (s > 1)}") if x),
                                "arms": len(D), "rungs": len(rs), "seeds": s, "runs": runs,
                                "train_flops": len(D) * s * sum(r["compute"] for r in rs),
                                cost_unit(study): len(D) * s * sum(r["cost"] for r in rs),
                                "widest_halfwidth": widest, "reaches": widest <= target and not blind,
                                "main_effects_only": info["main_effects_only"]})
                    break
    df = pd.DataFrame(out)
    return df.sort_values(["reaches", cost_unit(study)], ascending=[False, True]).reset_index(drop=True)


def study_pin(study, noise: Noise, pinned=None) -> tuple[np.ndarray | None, tuple | None, str, tuple]:
    """(pin covariance, law, line, valley) of the law `run` pins for this study: the measured one (`pinned`,
    a PinnedLaw from this machine's cache), else its ladder's covariance predicted at `noise`; (None,
    None, "", ()) for a study without a reference ladder."""
    from marin_ablate.ablations.ladders import ladder

    rungs = getattr(study, "reference_rungs", ())
    if not rungs:
        return None, None, "", ()
    if pinned is not None:
        return (pinned.cov_propagated, (pinned.linf, pinned.A, pinned.alpha),
                f"reference law pinned from this machine's baseline ladder ({pinned.source}, {pinned.created}): "
                f"{pinned.describe()}", pinned.valley)
    n_seeds = len(getattr(study, "reference_seeds", (0,)))
    one = [r["compute"] for r in _per_run(replace(study, rungs=ladder(rungs), seeds=study.seeds[:1]))]
    lay, _ = study_layout(study)
    law = noise.law or _law(noise, float(np.exp(np.mean(np.log(lay.computes)))))
    # each ladder run is its own (seed × rung) cluster: its noise is the run's and the rung's shift
    pred = predicted_reference(one * n_seeds, law, noise.sd**2 + noise.rung_sd**2,
                               seeds=np.repeat(np.arange(n_seeds), len(one)))
    return (pred.cov_propagated, None,
            f"L∞ and α pinned from the {len(rungs)}-rung × {n_seeds}-seed baseline ladder `run` measures first "
            f"({rungs[0]}..{rungs[-1]}; not run on this machine yet: the (L∞, α) its profile would accept "
            f"predicted at this noise: L∞ from {pred.valley[0][0]:.3g} to {pred.valley[-1][0]:.3g})", pred.valley)


def format_precision(study, noise: Noise, *, target: float | None = None, level: float = 0.95, pinned=None) -> str:
    """The `plan STUDY --precision` section."""
    lay, _ = study_layout(study)
    pin_cov, pin_law, pin_line, valley = study_pin(study, noise, pinned)
    t, info = predict(lay, noise, level=level, log_m=assumed_effects, pin_cov=pin_cov,
                      law=pin_law if noise.law is None else None,
                      pin_valley=valley if noise.law is None or pin_law is None else ())
    linf, A, alpha = info["law"]
    c_ref = info["c_ref"]
    lines = [f"\nprecision: expected {level:.0%} half-width of ln M per component (the median over studies of the "
             "analysis's model interval, no bootstrap; docs/method.md §4.9)",
             f"noise: {noise.source}",
             f"law: L∞ {linf:.4g}, A {A:.4g}, α {alpha:.4g}"
             + (" (from the noise source)" if noise.law else " (the pinned law)" if pin_law else
                " (default: the calibration study's α and reducible loss "
                f"{DEFAULT_LAW['reducible_at_cref']} nats at C_ref)")
             + f"; local slope at C_ref {alpha * A * c_ref ** -alpha:.4g} nats per ln C; every component assumed "
             f"ln M = {DEFAULT_EFFECT} (a larger effect widens its interval where clusters carry a shift)",
             *([f"pinned law: {pin_line}"] if pin_line else []),
             f"layout: {len(lay.design)} arms × {len(lay.computes)} rungs × {lay.seeds} seed(s) = {lay.n_runs} runs, "
             f"residual df {info['dof']}, {info['clusters']} (seed × rung) clusters, cluster df {info['cluster_df']}"]
    if info["cluster_df"] <= 0:
        lines.append("  the clusters leave no df for a (seed × rung) shift: the analysis's intervals cannot "
                     "include one (these widths omit it); add a seed or a rung")
    if len(lay.computes) < 2:
        lines.append(f"  one rung: α pinned at {alpha:.4g}, as the analysis needs it (--pin-alpha); no scale trend, so "
                     "the 10× column carries the multipliers unchanged")
    if info["main_effects_only"]:
        lines.append("  this fraction aliases main effects with interactions: "
                     "Shapley values from the main-effects model")
    rows = [{"component": r.component, f"±ln M at C_ref {c_ref:.3g}": f"{r.hw_1x:.4f}",
             "as a multiplier": f"×/÷ {math.exp(r.hw_1x):.3f}" if np.isfinite(r.hw_1x) else "not estimable",
             "±ln M at 10× C_ref": f"{r.hw_10x:.4f}"} for r in t.itertuples()]
    cols = list(rows[0])
    w = [max(len(c), *(len(r[c]) for r in rows)) for c in cols]
    lines += (["  ".join(c.ljust(x) for c, x in zip(cols, w, strict=True))]
              + ["  ".join(r[c].ljust(x) for c, x in zip(cols, w, strict=True)) for r in rows])
    if target is not None:
        o = options(study, noise, target, level=level)
        unit = cost_unit(study)
        lines.append(f"\ntarget half-width {target:g} (widest component at C_ref), "
                     f"options (seeds tried up to {MAX_SEEDS}):")
        lines += [f"  {'reaches' if r.reaches else 'short  '}  {r.option}: {r.runs} runs, {r.train_flops:.3g} FLOPs, "
                  f"{unit} {getattr(r, unit):.4g}, widest ±{r.widest_halfwidth:.4f}"
                  + (" (main effects only)" if r.main_effects_only else "") for r in o.itertuples()]
        best = o[o["reaches"]]
        lines.append(f"cheapest reaching {target:g}: {best.iloc[0]['option']}" if len(best) else
                     f"no option tried reaches {target:g}: more seeds than {MAX_SEEDS} or a lower-noise setup")
    return "\n".join(lines)


def plan_precision(study, noise_path: str | None = None, target: float | None = None, as_json: bool = False,
                   pinned=None) -> str:
    """`plan STUDY --precision [--noise PATH] [--target-halfwidth H] [--json]`: the section, or its JSON;
    `pinned`: the PinnedLaw this machine measured for the study (else its ladder's is predicted)."""
    if target is not None and not (target > 0 and math.isfinite(target)):
        raise ValueError(f"--target-halfwidth {target}; allowed values: a positive ln-scale half-width, e.g. 0.05")
    noise = noise_from(noise_path) if noise_path else default_noise()
    if not as_json:
        return format_precision(study, noise, target=target, pinned=pinned)
    lay, _ = study_layout(study)
    pin_cov, pin_law, pin_line, valley = study_pin(study, noise, pinned)
    t, info = predict(lay, noise, log_m=assumed_effects, pin_cov=pin_cov, law=pin_law if noise.law is None else None,
                      pin_valley=valley if noise.law is None or pin_law is None else ())
    out = {"noise": {"sd": noise.sd, "rung_sd": noise.rung_sd, "source": noise.source},
           "assumed_effect": DEFAULT_EFFECT, **{k: v for k, v in info.items() if k != "law"}, "pinned_law": pin_line,
           "law": dict(zip(("linf", "A", "alpha"), info["law"], strict=True)),
           "components": t.rename(columns={"hw_1x": "halfwidth_c_ref", "hw_10x": "halfwidth_10x_c_ref"})
           .to_dict("records")}
    if target is not None:
        out["target_halfwidth"] = target
        out["options"] = options(study, noise, target).to_dict("records")
    return json.dumps(out, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def until_expectation(study, noise: Noise, until, level: float = 0.95, pinned=None) -> pd.DataFrame:
    """What `run STUDY --until.halfwidth H` expects to run (docs/method.md §4.11): per named value its expected
    seed sd (one seed's model standard error and the component x seed sd in quadrature), the seeds Stein's rule
    asks for at that sd from the study's seeds as the pilot, and the cost of the seeds in all (the plan's own
    per-run numbers; the LR profile's runs not included)."""
    lay, rows = study_layout(study)
    k = lay.seeds
    pin_cov, pin_law, _, valley = study_pin(study, noise, pinned)  # the law as `run` pins it (format_precision)
    kw = dict(level=level, ratios=(1.0,), log_m=assumed_effects, between=False, pin_cov=pin_cov,
              law=pin_law if noise.law is None else None, pin_valley=valley if noise.law is None or pin_law is None
              else ())
    one, _ = predict(replace(lay, seeds=1), noise, **kw)
    q1 = float(stats.t.ppf(0.5 + level / 2, max(int(one.attrs["dof"]), 1)))
    factors = [c for c in one["component"] if c != "TOTAL"]
    per_seed = len(lay.design) * sum(r["cost"] for r in rows)
    out = []
    for r in one.itertuples():
        if until.components and r.component not in until.components:
            continue
        law = float(r.law_se_1x)
        sd = math.sqrt(max((r.hw_1x / q1) ** 2 - law**2, 0.0) + noise.component_seed_sd(r.component, factors) ** 2)
        n = max(min(seeds_for(sd, law, k, until.halfwidth, level), until.max_seeds), k)
        out.append({"component": r.component, "seed_sd": sd, "seeds": n, cost_unit(study): per_seed * n,
                    "law_half": stein_t(max(k, 2), level) * law})
    return pd.DataFrame(out)


def until_lines(study, until, pinned=None) -> list[str]:
    """`plan STUDY --until.halfwidth H`: what `run` with the same flags expects to run (`until_expectation`), a line
    per named value and the total, at the planner's default noise and component x seed sd (docs/method.md §4.11)."""
    t = until_expectation(study, default_noise(), until, pinned=pinned)
    unit, k, n = cost_unit(study), len(study.seeds), int(t["seeds"].max())
    lines = [f"\n--until.halfwidth {until.halfwidth:g}: the study's {k} seeds are the pilot; Stein's rule then runs "
             "the seeds each named value is expected to need at the planner's component x seed sd (the smoke "
             "study's measured ones; the pilot measures its own):"]
    lines += [f"  {r.component}: seed sd {r.seed_sd:.3g} in ln M, {r.seeds} seeds" + (
        f" (out of the seeds' reach: the pinned law's share alone is ±{r.law_half:.3g}; a longer reference ladder "
        "narrows it)" if r.law_half >= until.halfwidth else "") for r in t.itertuples()]
    total = float(t[unit].max())
    lines.append(f"expected: {n} seeds in all ({n - k} added; capped at --until.max_seeds {until.max_seeds}), "
                 f"{unit.replace('_', ' ')} {total:.4g} for the design (the LR profile's runs come on top)")
    return lines
