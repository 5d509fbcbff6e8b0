"""Figures of the report (seaborn/matplotlib, Agg backend). Each returns its path, or None when the
study has nothing to draw for it (the report then says so)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.attribution import interaction_matrix  # noqa: E402
from analysis.pipeline import StudyAnalysis  # noqa: E402
from analysis.responses import RESPONSES, by_column  # noqa: E402


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def forest(a: StudyAnalysis, path: Path, response: str = "ln_M") -> Path | None:
    """Per-component multiplier exp(Shapley) with its 95% CI, one marker per rung."""
    d = a.per_rung[(a.per_rung["response"] == response) & a.per_rung["estimable"]] if len(a.per_rung) else a.per_rung
    if not len(d):
        return None
    comps = list(dict.fromkeys(d["component"]))
    rungs = list(dict.fromkeys(d.sort_values("compute")["rung"]))
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(comps) * max(1, len(rungs) / 2)))
    pal = sns.color_palette("viridis", len(rungs))
    for j, r in enumerate(rungs):
        e = d[d["rung"] == r].set_index("component").reindex(comps)
        yy = np.arange(len(comps)) + (j - (len(rungs) - 1) / 2) * 0.8 / max(len(rungs), 1)
        m = np.exp(e["effect"])
        ax.errorbar(m, yy, xerr=[m - np.exp(e["lo"]), np.exp(e["hi"]) - m], fmt="o", color=pal[j], label=str(r), capsize=2)
    ax.axvline(1.0, color="grey", lw=1, ls="--")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels collide on a log axis
    ax.set_yticks(range(len(comps)), comps)
    ax.invert_yaxis()
    r = by_column(response)
    ax.set_xlabel(r.axis if r else response)
    ax.legend(title="rung", fontsize=8)
    ax.set_title(f"{r.label if r else response} per component and rung (Shapley, 95% CI)")
    return _save(fig, path)


def waterfall(a: StudyAnalysis, path: Path, response: str = "ln_M") -> Path | None:
    """Shapley values stacked from the all-off arm to the all-on arm (the total gain)."""
    c = a.components[(a.components["response"] == response)] if len(a.components) else a.components
    if not len(c):
        return None
    c = c.set_index("component")
    comps = [f for f in a.factors if f in c.index and np.isfinite(c.loc[f, "shapley"])]
    if not comps:
        return None
    vals = c.loc[comps, "shapley"].to_numpy()
    start = np.concatenate([[0], np.cumsum(vals)[:-1]])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * (len(comps) + 1), 4))
    cols = ["tab:green" if v >= 0 else "tab:red" for v in vals]
    ax.bar(range(len(comps)), vals, bottom=start, color=cols)
    half = (c.loc[comps, "shapley_hi"] - c.loc[comps, "shapley_lo"]).to_numpy() / 2
    ax.errorbar(range(len(comps)), start + vals, yerr=half, fmt="none", ecolor="black", capsize=3, lw=1)
    tot = c.loc["TOTAL", "shapley"] if "TOTAL" in c.index else vals.sum()
    ax.bar(len(comps), tot, color="tab:blue")
    if "TOTAL" in c.index and np.isfinite(c.loc["TOTAL", "shapley_lo"]):
        ax.errorbar([len(comps)], [tot], yerr=[[tot - c.loc["TOTAL", "shapley_lo"]], [c.loc["TOTAL", "shapley_hi"] - tot]],
                    fmt="none", ecolor="black", capsize=3, lw=1)
    ax.set_xticks(range(len(comps) + 1), comps + ["total"], rotation=30, ha="right")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylabel(f"Shapley value ({response}); multiplier = exp")
    ax.set_title("Shapley waterfall, all-off → all-on, with 95% CIs")
    return _save(fig, path)


def interaction_heatmap(a: StudyAnalysis, path: Path, response: str = "quality") -> Path | None:
    """2β_ij on the ln scale; aliased or absent pairs blank and marked."""
    fit = a.fits.get(response)
    if fit is None or len(a.factors) < 2:
        return None
    est, ali = interaction_matrix(fit)
    if est.isna().all().all() and not ali.any().any():
        return None
    # Aliased pairs: show the estimate of their alias group (labelled), never a blank cell.
    for j, t in enumerate(fit.terms):
        if t.kind == "2fi" and fit.alias.group_of(j) is not None:
            e, *_ = fit.contrast(2.0 * fit.alias_sum(j))
            a_, b_ = t.factors
            est.loc[a_, b_] = est.loc[b_, a_] = e
    annot = est.map(lambda v: "" if not np.isfinite(v) else f"{v:+.3f}")
    annot = annot.where(~ali, annot + "\n(alias)")
    est = est.astype(float)
    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(a.factors), 1.2 + 0.7 * len(a.factors)))
    v = np.nanmax(np.abs(est.to_numpy())) if np.isfinite(est.to_numpy()).any() else 1.0
    sns.heatmap(est, annot=annot, fmt="", cmap="RdBu_r", center=0, vmin=-v, vmax=v, ax=ax, cbar_kws={"label": "2·β_ij"})
    ax.set_title(f"Two-factor interactions ({fit.response})")
    return _save(fig, path)


def loss_curves(a: StudyAnalysis, raw: pd.DataFrame, path: Path) -> Path | None:
    """Train loss curves (summary.json loss_curve), one line per run, coloured by arm."""
    if "loss_curve" not in raw:
        return None
    rows = []
    for r in raw[raw["status"] == "completed"].itertuples():
        lc = getattr(r, "loss_curve", None)
        if not isinstance(lc, str):
            continue
        for step, loss in json.loads(lc):
            rows.append({"step": step, "loss": loss, "arm": str(getattr(r, "arm", "")), "rung": str(getattr(r, "rung", "")),
                         "run": r.run_id})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    order = dict(zip(a.rungs["rung"], a.rungs["compute"]))
    rungs = sorted(d["rung"].unique(), key=lambda r: (order.get(r, np.inf), r))  # by compute, not as strings
    xs = a.table[[f"x_{f}" for f in a.factors]].to_numpy()
    kind = dict(zip(a.table["run_id"], np.where(np.all(xs == 1, 1), "all-on", np.where(np.all(xs == -1, 1), "all-off", "other arms"))))
    pal = {"all-on": "tab:green", "all-off": "tab:red", "other arms": "lightgrey"}
    fig, axes = plt.subplots(1, len(rungs), figsize=(4.5 * len(rungs), 3.6), squeeze=False)
    for ax, rg in zip(axes[0], rungs):
        for (arm, run), g in d[d["rung"] == rg].groupby(["arm", "run"], sort=False):
            kd = kind.get(run, "other arms")
            hi = kd != "other arms"
            ax.plot(g["step"], g["loss"], color=pal[kd], lw=1.6 if hi else 0.6, zorder=3 if hi else 1, label=kd)
        ax.set_title(f"rung {rg}")
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
    h, lab = axes[0][0].get_legend_handles_labels()
    uniq = dict(zip(lab, h))
    axes[0][-1].legend(uniq.values(), uniq.keys(), title="arm", fontsize=7)
    return _save(fig, path)


def scaling_fit(a: StudyAnalysis, path: Path) -> Path | None:
    """Baseline losses with the reference law and its 95% delta-method band; other arms faded."""
    if a.law is None:
        return None
    t = a.table
    base = np.all(np.stack([t[f"x_{f}"] == -1 for f in a.factors]), axis=0)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(t.loc[~base, "train_flops"], t.loc[~base, "eval_macro_loss"], s=8, color="grey", alpha=0.4, label="other arms")
    ax.scatter(t.loc[base, "train_flops"], t.loc[base, "eval_macro_loss"], s=18, color="tab:blue", label="baseline arm")
    lo_c, hi_c = float(t["train_flops"].min()), float(t["train_flops"].max())
    if a.target_compute:
        hi_c = max(hi_c, a.target_compute)
    Cg = np.logspace(np.log10(lo_c) - 0.1, np.log10(hi_c) + 0.1, 100)
    lab = ("L∞, α not identified" if {"linf", "alpha"} & set(a.law.not_identified)
           else f"L∞={a.law.linf:.3f}, α={a.law.alpha:.3f}")
    ax.plot(Cg, a.law.predict(Cg), color="tab:blue", label=lab)
    lo, hi = a.law.band(Cg)
    ax.fill_between(Cg, lo, hi, color="tab:blue", alpha=0.2, label="95% band")
    ax.set_xscale("log")
    ax.set_xlabel("training compute C (analytic FLOPs)")
    ax.set_ylabel("eval macro loss")
    ax.legend(fontsize=8)
    ax.set_title("Reference law L = L∞ + A·C^−α (fitted on all arms)")
    return _save(fig, path)


def drop_rate(raw: pd.DataFrame, path: Path) -> Path | None:
    """Routed-token drop rate per EP transport level."""
    if "drop_rate" not in raw or "ep_transport" not in raw:
        return None
    d = raw[(raw["status"] == "completed") & raw["drop_rate"].notna()]
    if not len(d):
        return None
    fig, ax = plt.subplots(figsize=(5, 3.6))
    sns.boxplot(d, x="ep_transport", y="drop_rate", ax=ax, color="lightgrey")
    sns.stripplot(d, x="ep_transport", y="drop_rate", ax=ax, size=3, alpha=0.6)
    ax.set_title("Drop rate per transport")
    return _save(fig, path)


def planted(a: StudyAnalysis, path: Path) -> Path | None:
    """Planted factors: every replicate's 95% interval (and the pooled one) against the planted truth."""
    d = a.replicates if a.replicates is not None and len(a.replicates) else a.planted
    if d is None or not len(d):
        return None
    d = d.assign(replicate=d["replicate"].astype(str) if "replicate" in d else "pooled")
    if a.replicates is not None and a.planted is not None:
        d = pd.concat([d, a.planted.assign(replicate="pooled")], ignore_index=True)
    resp = [r.column for r in RESPONSES.values() if r.truth_key and r.column in set(d["response"])]
    facs = list(dict.fromkeys(d["factor"]))
    reps = list(dict.fromkeys(d["replicate"]))
    fig, axes = plt.subplots(1, len(resp), figsize=(6.5 * len(resp), 0.8 + 0.22 * len(facs) * len(reps)), squeeze=False)
    for ax, r in zip(axes[0], resp):
        e = d[(d["response"] == r) & d["estimable"]]
        for i, f in enumerate(facs):
            g = e[e["factor"] == f]
            yy = i + (np.array([reps.index(x) for x in g["replicate"]]) - (len(reps) - 1) / 2) * 0.8 / len(reps)
            m = np.exp(g["estimate"].to_numpy(float))
            col = np.where(g["covers"].to_numpy(bool), "tab:blue", "tab:red")
            for y_, m_, lo_, hi_, c_, rep in zip(yy, m, np.exp(g["lo"]), np.exp(g["hi"]), col, g["replicate"]):
                ax.errorbar(m_, y_, xerr=[[m_ - lo_], [hi_ - m_]], fmt="s" if rep == "pooled" else "o", color=c_,
                            ms=3, capsize=1.5, lw=1)
            t = np.exp(d[(d["response"] == r) & (d["factor"] == f)]["truth"].iloc[0])
            ax.plot([t, t], [i - 0.45, i + 0.45], color="black", lw=1.5)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0, 8.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels collide on a log axis
        ax.set_yticks(range(len(facs)), facs)
        ax.invert_yaxis()
        name = by_column(r).axis
        ax.set_xlabel(name)
        ax.set_title(f"{name}: each seed alone (dots), all pooled (square), 95% CI;\n"
                     "planted truth in black, an interval that misses it in red", fontsize=9)
    return _save(fig, path)


def all_figures(a: StudyAnalysis, raw: pd.DataFrame, out_dir: Path) -> dict[str, Path | None]:
    out_dir = Path(out_dir)
    extra = {"planted": planted(a, out_dir / "planted_truths.png")} if a.planted is not None else {}
    return {**extra,
        **{f"forest_{r.name}": forest(a, out_dir / f"forest_{r.name}.png", r.column)
           for r in RESPONSES.values() if r.figure},
        "waterfall": waterfall(a, out_dir / "shapley_waterfall.png"),
        "interactions": interaction_heatmap(a, out_dir / "interactions.png"),
        "loss_curves": loss_curves(a, raw, out_dir / "loss_curves.png"),
        "scaling": scaling_fit(a, out_dir / "scaling_fit.png"),
        "drop_rate": drop_rate(raw, out_dir / "drop_rate.png"),
    }
