"""Figures of the report (seaborn/matplotlib, Agg backend). Each returns its path, or None when the
study has nothing to draw for it (the report then says so)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib
import matplotlib.patches
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from marin_ablate.analysis.fit.attribution import interaction_matrix  # noqa: E402
from marin_ablate.analysis.pipeline import StudyAnalysis  # noqa: E402
from marin_ablate.analysis.report.findings import arm_kinds  # noqa: E402
from marin_ablate.analysis.responses import RESPONSES, by_column, law_column  # noqa: E402
from marin_ablate.marin.schema import atomic_write_bytes  # noqa: E402

#: The interaction heatmap's colour scale: fixed at ±ln 2 (an interaction that doubles or halves the
#: all-on vs all-off multiplier saturates), so noise never looks like a strong effect.
HEATMAP_LIMIT = float(np.log(2.0))


def _unit(column: str) -> str:
    r = by_column(column)
    return r.unit if r else "baseline"


def _save(fig, path: Path) -> Path:
    """PNG of the figure's tight bounding box: titles, labels and legends are never cut off. Rendered in
    memory, then written atomically: a full disk names the file (marin.schema.atomic_write_bytes), and a
    reader never sees half a figure."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", pad_inches=0.15, facecolor="white")
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def log_ticks(ax, which: str = "x") -> list[float]:
    """Readable ticks on a log axis: decades over three or more decades, 1-2-5 over one or more,
    else evenly spaced plain values (a log axis spanning less than a decade, e.g. multipliers 0.8–1.6,
    gets one tick or none from a decade locator); labels as plain numbers, no minor labels."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    span = np.log10(hi / lo)
    if span >= 1:
        subs = (1.0,) if span >= 3 else (1.0, 2.0, 5.0)
        decades = 10.0 ** np.arange(np.floor(np.log10(lo)), np.ceil(np.log10(hi)) + 1)
        ticks = [d * k for d in decades for k in subs if lo <= d * k <= hi]
    else:
        loc = matplotlib.ticker.MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10], min_n_ticks=3)
        ticks = [float(v) for v in loc.tick_values(lo, hi) if lo <= v <= hi and v > 0]
    axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    digits = next((d for d in range(2, 9) if len({f"{v:.{d}g}" for v in ticks}) == len(ticks)), 9)
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.{digits}g}"))  # distinct labels
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels collide on a log axis
    (ax.set_xlim if which == "x" else ax.set_ylim)(lo, hi)  # the ticks were chosen for this view
    return ticks


def forest(a: StudyAnalysis, path: Path, response: str | None = None) -> Path | None:
    """Per-component multiplier exp(Shapley) with its 95% CI, one marker per rung (default: the law response)."""
    response = response or law_column()
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
        ax.errorbar(m, yy, xerr=[m - np.exp(e["lo"]), np.exp(e["hi"]) - m], fmt="o", color=pal[j], label=str(r),
                    capsize=2)
    # the Findings' own numbers: each component at the reference compute C_ref (a black diamond)
    c = a.components[a.components["response"] == response].set_index("component") if len(a.components) else None
    if c is not None and "shapley" in c and len(c.index.intersection(comps)):
        e = c.reindex(comps)
        m = np.exp(e["shapley"].to_numpy(float))
        ax.errorbar(m, np.arange(len(comps)) - 0.45, xerr=[m - np.exp(e["shapley_lo"].to_numpy(float)),
                                                           np.exp(e["shapley_hi"].to_numpy(float)) - m],
                    fmt="D", color="black", ms=4, capsize=2, label=f"C_ref = {a.c_ref:.3g} FLOPs")
    ax.axvline(1.0, color="grey", lw=1, ls="--")
    ax.set_xscale("log")
    log_ticks(ax, "x")
    ax.set_yticks(range(len(comps)), comps)
    ax.invert_yaxis()
    r = by_column(response)
    ax.set_xlabel(f"{r.axis if r else response} (× {_unit(response)}, log scale)")
    ax.legend(title="rung", fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(f"{r.label if r else response} per component and rung, and at C_ref (◆)\n(Shapley, 95% CI)")
    return _save(fig, path)


def waterfall(a: StudyAnalysis, path: Path, response: str | None = None) -> Path | None:
    """Shapley values stacked from the all-off arm to the all-on arm (the total gain; default: the law response)."""
    response = response or law_column()
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
        ax.errorbar([len(comps)], [tot],
                    yerr=[[tot - c.loc["TOTAL", "shapley_lo"]], [c.loc["TOTAL", "shapley_hi"] - tot]],
                    fmt="none", ecolor="black", capsize=3, lw=1)
    ax.set_xticks(range(len(comps) + 1), comps + ["total"], rotation=30, ha="right")
    ax.axhline(0, color="grey", lw=0.8)
    r = by_column(response)
    ax.set_ylabel(f"Shapley value, ln(× {_unit(response)})\n(ln 2 = 0.69: ×2)")
    sec = ax.secondary_yaxis("right", functions=(np.exp, np.log))  # the same values as multipliers
    sec.set_ylabel(f"multiplier (× {_unit(response)})")
    ax.set_title(f"Shapley waterfall of {r.symbol if r else response} at C_ref = {a.c_ref:.3g} FLOPs,\n"
                 "all-off → all-on, 95% CIs")
    return _save(fig, path)


def interaction_cells(a: StudyAnalysis,
                      response: str = "quality") -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None:
    """(2β_ij, significant, aliased) per factor pair on the ln scale; an aliased pair shows its alias
    group's estimate. Significant: the 95% interval excludes 0. None when there is nothing to draw."""
    fit = a.fits.get(response)
    if fit is None or len(a.factors) < 2:
        return None
    est, ali = interaction_matrix(fit)
    sig = pd.DataFrame(False, index=est.index, columns=est.columns)
    for j, t in enumerate(fit.terms):
        if t.kind == "2fi":
            e, _, lo, hi, ok = fit.contrast(2.0 * fit.alias_sum(j), a.level)
            a_, b_ = t.factors
            if ok and np.isfinite(e):
                est.loc[a_, b_] = est.loc[b_, a_] = e
                sig.loc[a_, b_] = sig.loc[b_, a_] = bool(lo > 0 or hi < 0)
    if est.isna().all().all() and not ali.any().any():
        return None
    return est.astype(float), sig, ali


def alias_cells(a: StudyAnalysis, response: str = "quality") -> tuple[pd.DataFrame, dict] | None:
    """Which cells the heatmap draws where the design aliases interactions: one per alias group (its
    first pair, below the diagonal), labelled with the pairs it stands for (factor letters A, B, ... in
    the study's order); None for a design without aliased 2FIs (every cell drawn)."""
    fit = a.fits.get(response)
    if fit is None or fit.alias is None:
        return None
    letter = {f: chr(65 + i) for i, f in enumerate(fit.factors)}
    keep = pd.DataFrame(False, index=fit.factors, columns=fit.factors)
    label, seen, any_alias = {}, set(), False
    for j, t in enumerate(fit.terms):
        if t.kind != "2fi":
            continue
        g = fit.alias.group_of(j)
        key = frozenset(i for i, _ in g) if g else frozenset([j])
        if key in seen:
            continue
        seen.add(key)
        x, y = sorted(t.factors, key=fit.factors.index, reverse=True)  # below the diagonal: row after column
        keep.loc[x, y] = True
        if g:
            any_alias = True
            others = ["".join(sorted((letter[f] for f in fit.terms[i].factors), key=str)) for i, _ in g if i != j]
            label[(x, y)] = "= " + " = ".join(others)
    return (keep, label) if any_alias else None


def draw_interactions(est: pd.DataFrame, sig: pd.DataFrame, ali: pd.DataFrame, title: str, unit: str = "compute",
                      keep: pd.DataFrame | None = None, label: dict | None = None):
    """The heatmap on the fixed scale ±HEATMAP_LIMIT; a cell whose interval contains 0 is drawn
    grey and hatched (its value still printed). `keep` (alias_cells): only those cells are drawn, each
    alias group once with `label` naming the pairs it stands for."""
    n = len(est)
    if keep is not None:
        est = est.where(keep.reindex_like(est).fillna(False).astype(bool))
    fig, ax = plt.subplots(figsize=(2.4 + 0.8 * n, 1.6 + 0.7 * n))
    sns.heatmap(est, mask=~sig.to_numpy() | ~np.isfinite(est.to_numpy()), cmap="RdBu_r", center=0,
                vmin=-HEATMAP_LIMIT, vmax=HEATMAP_LIMIT, ax=ax, square=False, linewidths=0.5, linecolor="white",
                cbar_kws={"label": f"2·β_ij, ln(× {unit})  (±0.69 = ×2 / ×½)"})
    for i in range(n):
        for j in range(n):
            v = est.iat[i, j]
            if not np.isfinite(v):
                continue
            if not sig.iat[i, j]:
                ax.add_patch(matplotlib.patches.Rectangle((j, i), 1, 1, facecolor="#eeeeee", hatch="///",
                                                          edgecolor="#bbbbbb", lw=0))
            strong = sig.iat[i, j] and abs(v) > 0.6 * HEATMAP_LIMIT
            tag = (label or {}).get((est.index[i], est.columns[j])) if keep is not None else None
            ax.text(j + 0.5, i + 0.5,
                    f"{v:+.3f}" + (f"\n{tag}" if tag else "\n(alias)" if ali.iat[i, j] and keep is None else ""),
                    ha="center", va="center",
                    fontsize=8, color="white" if strong else "black")
    ax.set_title(title)
    return fig, ax


def interaction_heatmap(a: StudyAnalysis, path: Path, response: str = "quality") -> Path | None:
    """2β_ij on the ln scale, fixed colour scale, non-significant cells hatched; aliased pairs labelled."""
    cells = interaction_cells(a, response)
    if cells is None:
        return None
    col = a.fits[response].response
    groups = alias_cells(a, response)
    if groups is None:
        fig, _ = draw_interactions(*cells, title=f"Two-factor interactions ({col});\nhatched: 95% CI contains 0",
                                   unit=_unit(col))
    else:  # a fraction estimates alias sums only: each group once, named (A, B, ... the factors in order)
        key = ", ".join(f"{chr(65 + i)} {f}" for i, f in enumerate(a.fits[response].factors))
        fig, _ = draw_interactions(*cells, title=f"Two-factor interactions ({col}), each alias group once;\n"
                                   f"hatched: 95% CI contains 0\n{key}", unit=_unit(col), keep=groups[0],
                                   label=groups[1])
    return _save(fig, path)


def loss_curves(a: StudyAnalysis, raw: pd.DataFrame, path: Path) -> Path | None:
    """Train loss curves (summary.json loss_curve), one line per run, coloured by arm."""
    if "loss_curve" not in raw:
        return None
    rows = [{"step": step, "loss": loss, "arm": str(getattr(r, "arm", "")), "rung": str(getattr(r, "rung", "")),
             "run": r.run_id} for r in raw[raw["status"] == "completed"].itertuples()
            if isinstance(r.loss_curve, str) for step, loss in json.loads(r.loss_curve)]
    if not rows:
        return None
    d = pd.DataFrame(rows)
    order = dict(zip(a.rungs["rung"], a.rungs["compute"], strict=True))
    rungs = sorted(d["rung"].unique(), key=lambda r: (order.get(r, np.inf), r))  # by compute, not as strings
    kind = arm_kinds(a)
    pal = {"all-on": "tab:green", "all-off": "tab:red", "other arms": "lightgrey"}
    fig, axes = plt.subplots(1, len(rungs), figsize=(4.5 * len(rungs), 3.6), squeeze=False)
    for ax, rg in zip(axes[0], rungs, strict=True):
        for (arm, run), g in d[d["rung"] == rg].groupby(["arm", "run"], sort=False):
            kd = kind.get(run, "other arms")
            hi = kd != "other arms"
            ax.plot(g["step"], g["loss"], color=pal[kd], lw=1.6 if hi else 0.6, zorder=3 if hi else 1, label=kd)
        ax.set_title(f"rung {rg}")
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
    h, lab = axes[0][0].get_legend_handles_labels()
    uniq = dict(zip(lab, h, strict=True))
    axes[0][-1].legend(uniq.values(), uniq.keys(), title="arm", fontsize=7)
    return _save(fig, path)


def scaling_fit(a: StudyAnalysis, path: Path) -> Path | None:
    """Baseline losses with the reference law and its 95% delta-method band; other arms faded."""
    if a.law is None:
        return None
    t = a.table
    base = np.all(np.stack([t[f"x_{f}"] == -1 for f in a.factors]), axis=0)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(t.loc[~base, "train_flops"], t.loc[~base, "eval_macro_loss"], s=8, color="grey", alpha=0.4,
               label="other arms")
    ax.scatter(t.loc[base, "train_flops"], t.loc[base, "eval_macro_loss"], s=18, color="tab:blue", label="baseline arm")
    lo_c, hi_c = float(t["train_flops"].min()), float(t["train_flops"].max())
    if a.target_compute:
        hi_c = max(hi_c, a.target_compute)
    Cg = np.logspace(np.log10(lo_c) - 0.1, np.log10(hi_c) + 0.1, 100)
    # an unidentified law is drawn (it fits the rungs) but never labelled with numbers it does not have
    lab = ("law (L∞, α, A not identified)" if {"linf", "alpha", "ln_a", "A"} & set(a.law.not_identified)
           else f"L∞={a.law.linf:.3f}, α={a.law.alpha:.3f}")
    ax.plot(Cg, a.law.predict(Cg), color="tab:blue", label=lab)
    lo, hi = a.law.band(Cg)
    ax.fill_between(Cg, lo, hi, color="tab:blue", alpha=0.2, label="95% band")
    ax.set_xscale("log")
    log_ticks(ax, "x")
    ax.set_xlabel("training compute C (analytic FLOPs, log scale)")
    ax.set_ylabel("eval macro loss (nats per token)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("Reference law L = L∞ + A·C^−α\n(fitted on all arms)")
    return _save(fig, path)


def drop_rate(a: StudyAnalysis, raw: pd.DataFrame, path: Path) -> Path | None:
    """Routed-token drop rate per rung (compute order) and EP transport level: both transports."""
    if "drop_rate" not in raw or "ep_transport" not in raw:
        return None
    d = raw[(raw["status"] == "completed") & raw["drop_rate"].notna()]
    if not len(d):
        return None
    d = d.assign(rung=d["rung"].astype(str), drop_pct=100 * pd.to_numeric(d["drop_rate"]))
    order = [str(r) for r in a.rungs["rung"] if str(r) in set(d["rung"])] or sorted(d["rung"].unique())
    fig, ax = plt.subplots(figsize=(1.8 + 1.2 * len(order), 3.6))
    sns.boxplot(d, x="rung", y="drop_pct", hue="ep_transport", order=order, ax=ax, fill=False, showfliers=False)
    sns.stripplot(d, x="rung", y="drop_pct", hue="ep_transport", order=order, ax=ax, size=3, alpha=0.6, dodge=True,
                  legend=False)
    ax.set_xlabel("rung (compute order)")
    ax.set_ylabel("dropped routed tokens (%)")
    ax.legend(title="EP transport", fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("Drop rate per rung and transport")
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
    for ax, r in zip(axes[0], resp, strict=True):
        e = d[(d["response"] == r) & d["estimable"]]
        for i, f in enumerate(facs):
            g = e[e["factor"] == f]
            yy = i + (np.array([reps.index(x) for x in g["replicate"]]) - (len(reps) - 1) / 2) * 0.8 / len(reps)
            m = np.exp(g["estimate"].to_numpy(float))
            col = np.where(g["covers"].to_numpy(bool), "tab:blue", "tab:red")
            for y_, m_, lo_, hi_, c_, rep in zip(yy, m, np.exp(g["lo"]), np.exp(g["hi"]), col, g["replicate"],
                                                 strict=True):
                ax.errorbar(m_, y_, xerr=[[m_ - lo_], [hi_ - m_]], fmt="s" if rep == "pooled" else "o", color=c_,
                            ms=3, capsize=1.5, lw=1)
            t = np.exp(d[(d["response"] == r) & (d["factor"] == f)]["truth"].iloc[0])
            ax.plot([t, t], [i - 0.45, i + 0.45], color="black", lw=1.5)
        ax.set_xscale("log")
        log_ticks(ax, "x")
        ax.set_yticks(range(len(facs)), facs)
        ax.invert_yaxis()
        name = by_column(r).axis
        ax.set_xlabel(f"{name} (× {_unit(r)}, log scale)")
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
        "drop_rate": drop_rate(a, raw, out_dir / "drop_rate.png"),
    }
