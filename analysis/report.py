"""report.md / report.html of a study: attribution table, law, per-rung and extrapolated multipliers,
interactions and aliasing, ANOVA, forecasts beside outcomes, figures (DESIGN §4; issue 6)."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.pipeline import StudyAnalysis

DEFINITIONS = (
    "Quality multiplier M_flop = C_eq / C with C_eq = ((L − L∞)/A)^(−1/α) from the baseline arm's law, C the run's "
    "own analytic FLOPs. Throughput ratio R = model FLOP/s of the arm / of the baseline arm on the same hardware and "
    "rung; wall-clock multiplier = M_flop·R (all three reported). Factors are coded +1 recipe level, −1 baseline "
    "level. A component's multiplier is exp(Shapley value) of the fitted ln-scale model = exp(2β_i + 2γ_i·ln(C/C_ref)): "
    "the all-off → all-on change of that factor averaged over the others. LOO = leave-one-out from all-on, AOI = "
    "add-one-in from all-off; LOO − Shapley = Shapley − AOI = 2Σ_j β_ij (the interaction signal). CI: "
    "heteroskedasticity-robust (plus the reference law's uncertainty); boot: wild bootstrap refitting law and model."
)


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, (float, np.floating)):
        a = abs(v)
        return f"{v:.{digits}g}" if (a >= 1e4 or (a < 1e-3 and a > 0)) else f"{v:.{digits}f}"
    return str(v)


def md_table(df: pd.DataFrame, digits: int = 3) -> str:
    if df is None or not len(df):
        return "_(empty)_\n"
    cols = list(df.columns)
    out = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(_fmt(v, digits).replace("|", "/") for v in row) + " |")
    return "\n".join(out) + "\n"


def _mult(est, lo, hi) -> str:
    if not (isinstance(est, float) and math.isfinite(est)):
        return "not estimable"
    s = f"{math.exp(est):.3f}"
    if isinstance(lo, float) and math.isfinite(lo):
        s += f" [{math.exp(lo):.3f}, {math.exp(hi):.3f}]"
    return s


def attribution_table(a: StudyAnalysis, components: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per component: quality (Shapley, LOO, AOI), throughput and wall-clock multipliers."""
    comp = a.components if components is None else components
    rows = []
    for f in a.factors + ["TOTAL"]:
        row = {"component": f}
        for resp, label in (("ln_M", "M_flop"), ("ln_R", "R"), ("ln_W", "M_flop·R")):
            c = comp[(comp["response"] == resp) & (comp["component"] == f)]
            if not len(c):
                row[label] = "n/a"
                continue
            c = c.iloc[0]
            row[label] = _mult(c["shapley"], c["shapley_lo"], c["shapley_hi"])
            if resp == "ln_M":
                row["M_flop boot CI"] = (_mult(c["shapley"], c["shapley_boot_lo"], c["shapley_boot_hi"]).split(" ", 1)[-1]
                                         if math.isfinite(c.get("shapley_boot_lo", np.nan)) else "—")
                if f != "TOTAL":
                    row["M_flop LOO"] = _mult(c["loo"], c["loo_lo"], c["loo_hi"])
                    row["M_flop AOI"] = _mult(c["aoi"], c["aoi_lo"], c["aoi_hi"])
                else:
                    row["M_flop LOO"] = row["M_flop AOI"] = ""
                row["aliased with"] = c.get("aliased_with", "") or ""
        rows.append(row)
    return pd.DataFrame(rows)


def _per_rung_table(a: StudyAnalysis) -> pd.DataFrame:
    d = a.per_rung
    if not len(d):
        return d
    d = d[d["response"] == "ln_M"]
    piv = {}
    for r in d.itertuples():
        piv.setdefault(r.component, {})[f"{r.rung} ({r.compute:.2g})"] = _mult(r.effect, r.lo, r.hi) if r.estimable else "not estimable"
    return pd.DataFrame([{"component": k, **v} for k, v in piv.items()])


def render_markdown(a: StudyAnalysis, raw: pd.DataFrame, figures: dict[str, Path | None], out_dir: Path,
                    forecasts: list[dict] | None = None, title: str = "study") -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    L = [f"# Attribution report: {title}", "", f"_generated {now}; {len(a.table)} runs analysed, factors: "
         f"{', '.join(a.factors)}_", ""]
    L += ["## Runs", ""] + [f"- {n}" for n in a.notes] + [""]
    L += ["## Reference law (baseline arm)", ""]
    if a.law is None:
        L += ["Not estimable: no quality multipliers (see notes above).", ""]
    else:
        law = a.law
        rows = [{"parameter": k, "estimate": getattr(law, k), "95% CI lo": law.ci(k)[0], "95% CI hi": law.ci(k)[1],
                 "pinned": "yes" if k in law.pinned else ""} for k in ("linf", "A", "alpha")]
        L += [md_table(pd.DataFrame(rows), 4), f"{law.n} baseline runs; L = L∞ + A·C^−α.", ""]
    L += [f"## Attribution at the reference compute C_ref = {a.c_ref:.3g} FLOPs", "", DEFINITIONS, "",
          md_table(attribution_table(a))]
    L += ["## Per rung (quality multiplier, Shapley, 95% CI)", "", md_table(_per_rung_table(a))]
    if a.extrapolation is not None:
        L += [f"## Extrapolation to the target compute {a.target_compute:.3g} FLOPs", "",
              "Multipliers carried by the fitted factor × log C terms (an extrapolation: the interval covers the "
              "model's uncertainty, not a change of regime).", "", md_table(attribution_table(a, a.extrapolation))]
    L += ["## Aliasing", ""]
    groups = a.alias_groups()
    ne = a.not_estimable()
    if not groups and not ne:
        L += ["Every candidate term is estimable separately.", ""]
    else:
        if groups:
            L += ["Alias groups (estimated only together, never separately):", ""] + [f"- {g}" for g in groups] + [""]
        if ne:
            L += ["Not estimable:", ""] + [f"- {x}" for x in ne] + [""]
    for name, fit in a.fits.items():
        L += [f"## Coefficients and ANOVA: {name} ({fit.response}, {fit.method}, {fit.n} runs, {fit.dof} residual df)", ""]
        L += [md_table(fit.coef_table()[["term", "estimate", "se", "lo", "hi", "p"]], 4)]
        L += [md_table(a.anova[name], 4)]
    L += ["## Forecasts (pre-registered)", ""]
    if forecasts:
        L += [md_table(pd.DataFrame(forecasts)[["created_utc", "arm", "compute", "predicted", "lo", "hi", "outcome",
                                                 "inside", "status"]], 4)]
    else:
        L += ["No forecast was written for this study.", ""]
    L += ["## Figures", ""]
    for k, p in figures.items():
        if p is None:
            L += [f"- {k}: nothing to draw for this study", ""]
        else:
            L += [f"### {k}", "", f"![{k}]({Path(p).relative_to(out_dir).as_posix()})", ""]
    return "\n".join(L)


def write_report(a: StudyAnalysis, raw: pd.DataFrame, out_dir: str | Path, *, forecasts: list[dict] | None = None,
                 title: str = "study", figures: bool = True) -> tuple[Path, Path]:
    """Writes out_dir/report.md, out_dir/report.html and out_dir/figures/*.png."""
    import markdown

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = {}
    if figures:
        from analysis.plots import all_figures

        figs = all_figures(a, raw, out_dir / "figures")
    md = render_markdown(a, raw, figs, out_dir, forecasts, title)
    (out_dir / "report.md").write_text(md)
    body = markdown.markdown(md, extensions=["tables"])
    html = ("<!doctype html><html><head><meta charset='utf-8'><title>" + title + "</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>" + body +
            "</body></html>")
    (out_dir / "report.html").write_text(html)
    return out_dir / "report.md", out_dir / "report.html"
