"""report.md / report.html of a study: Findings first (one interval and a verdict per component, the
qualifiers of each verdict in the same row), the forest figure, then warnings, the end arms' eval
loss per rung, the law, attribution, per-rung and extrapolated multipliers, forecasts, figures; the
second interval, the full eval table, aliasing and the robust ANOVA in an appendix (docs/method.md)."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from marin_ablate.analysis.fit.checks import drop_rates
from marin_ablate.analysis.fit.law_intervals import PROFILE_BOUNDS
from marin_ablate.analysis.fit.regimes import regime_frames
from marin_ablate.analysis.fit.stopping import core_seconds_per_seed, what_it_would_take
from marin_ablate.analysis.io.results import factor_coding, profile_seconds
from marin_ablate.analysis.pipeline import StudyAnalysis
from marin_ablate.analysis.report.backtest import backtest_lines
from marin_ablate.analysis.report.findings import (
    RECORD_FAMILY,
    SCALE_FAMILY,
    arm_kinds,
    family_label,
    finding,
    interval_verdict,
    qualifiers,
    recommended_total,
    rests_on,
    scale_cells,
    verdict_family,
)
from marin_ablate.analysis.report.html import render_html
from marin_ablate.analysis.report.provenance import provenance
from marin_ablate.analysis.report.tables import (
    attribution_table,
    informative,
    md_table,
    mult_text,
    paired_section,
    per_rung_table,
)
from marin_ablate.analysis.responses import RESPONSES, law_column
from marin_ablate.marin.schema import atomic_write_text

DEFINITIONS = (
    "Quality multiplier M_flop = C_eq / C with C_eq = ((L − L∞)/A)^(−1/α) from the baseline arm's law, C the run's "
    "own analytic FLOPs. Throughput ratio R = model FLOP/s of the arm / of the baseline arm on the same hardware and "
    "rung; wall-clock multiplier = M_flop·R (all three reported). Factors are coded +1 recipe level, −1 baseline "
    "level. A component's multiplier is exp(Shapley value) of the fitted ln-scale model = "
    "exp(2β_i + 2γ_i·ln(C/C_ref)): the all-off → all-on change of that factor averaged over the others. "
    "LOO = leave-one-out from all-on, AOI = add-one-in from all-off; LOO − Shapley = Shapley − AOI = 2Σ_j β_ij "
    "(the interaction signal). CI: the larger of HC3 and model-based, law fitted jointly (its uncertainty "
    "included); with two or more seeds the Shapley CI is the between-seed t interval (the law's spread added); "
    "boot: wild bootstrap refitting law and model."
)


def local_slope(a: StudyAnalysis) -> tuple[float, float, float] | None:
    """dL/d ln C across the ladder, with its 95% interval: the loss on ln C with one offset per arm
    (statsmodels OLS, HC3). It is what a quality multiplier rests on where the law's L∞, α and A are not
    identified separately (M = exp(ΔL / slope) to first order)."""
    import statsmodels.api as sm

    t = a.table
    cols = [f"x_{f}" for f in a.factors if f"x_{f}" in t]
    if len(t) < 3 or not cols or t["train_flops"].nunique() < 2:
        return None
    arm = pd.Categorical(t[cols].astype(int).astype(str).agg("".join, axis=1))
    X = pd.get_dummies(arm, dtype=float).to_numpy()
    X = np.column_stack([np.log(t["train_flops"].to_numpy(float)), X])
    try:
        fit = sm.OLS(t["eval_macro_loss"].to_numpy(float), X).fit(cov_type="HC3")
    except (ValueError, np.linalg.LinAlgError):
        return None
    if fit.df_resid < 1:
        return None
    lo, hi = fit.conf_int(0.05)[0]
    return float(fit.params[0]), float(lo), float(hi)


def _coding_line(a: StudyAnalysis, raw: pd.DataFrame) -> list[str]:
    """Which level of each factor is +1 (a multiplier is the +1 level's over the −1 level's)."""

    try:
        coding = factor_coding(raw)
    except ValueError:  # a table without its runs' definitions: nothing to state
        return []
    parts = [f"{f}: +1 = {coding[f][1]}, −1 = {coding[f][0]}" for f in a.factors if f in coding]
    return ["", "Coding (each multiplier is the +1 level over the −1 level): " + "; ".join(parts) + ".", ""] \
        if parts else []


def _per_decade_note(a: StudyAnalysis) -> list[str]:
    """Once under Findings: a ladder narrower than a decade states its slope per 10x beyond its own span."""
    if len(a.rungs) < 2:
        return []
    span = float(np.log10(a.rungs["compute"].max() / a.rungs["compute"].min()))
    if span >= 1.0:
        return []
    return ["", f"Per decade of compute: the slope across the ladder, which spans {span:.2g} decades "
            f"({a.rungs['compute'].min():.3g}–{a.rungs['compute'].max():.3g} FLOPs); a full decade (10×) is "
            f"{1 / span:.2g}× the span measured, so read it as a rate, not as a change seen."]


AT_SCALE_FILE = "drops_at_scale.json"  # benchmarks/ep_drops.py --only rungs --json OUT/STUDY/drops_at_scale.json


def drops_section(a: StudyAnalysis, study_dir: Path | None) -> list[str]:
    """The study's own drop rates per transport beside the ones where Marin's claim is checkable (GPU rungs,
    65,536 tokens per EP shard, measured by benchmarks/ep_drops.py into STUDY/drops_at_scale.json), and why
    they differ: a pooled capacity over few tokens overflows more often than a per-cell one."""
    d = drop_rates(a)
    if not len(d) or d["drop_rate"].max() <= 0:
        return []
    own = ", ".join(f"{lv} {100 * g['drop_rate'].min():.1f}–{100 * g['drop_rate'].max():.1f}%"
                    for lv, g in d.groupby("level", sort=False))
    L = ["## Drop rates: this study's shards and the scale of Marin's claim", "",
         f"This study's EP transports drop {own} of routed tokens (per rung under Warnings). Marin's claim — ragged "
         "all-to-all drops ~0.01–0.14% where the fixed per-cell transport drops 5.5–7.1% — was measured at GPU scale "
         "(our GPU rungs plan shards of 65,536 tokens)."]
    recipe_more = d.loc[d["code"] > 0, "drop_rate"].mean() > d.loc[d["code"] < 0, "drop_rate"].mean()
    if recipe_more:  # the smoke's reading: the recipe (ragged) transport drops more at its tiny shards
        L[-1] += (" The ragged transport's capacity is the smaller factor (1.15× the mean load, pooled over all of "
                  "a receiver's experts and senders) against the fixed one's 1.33× per (sender, expert) cell. Pooling "
                  "wins where it averages the skew of a shard's few documents away, which takes many tokens per "
                  "shard; over the few tokens of a CPU rung's shard a receiver's load swings almost as much as one "
                  "cell's, and the smaller factor overflows more often, so ragged drops more here (Marin's "
                  "measurement and the rates at scale below are the other regime).")
    else:
        L[-1] += " Here the recipe's transport drops less, as at scale."
    L.append("")
    rows = None
    if study_dir is not None and (study_dir / AT_SCALE_FILE).is_file():
        try:
            rows = json.loads((study_dir / AT_SCALE_FILE).read_text())["rows"]
            rows = [r for r in rows if all(isinstance(r.get(k), (int, float)) for k in ("fixed_drop", "ragged_drop"))]
        except (OSError, ValueError, KeyError, TypeError):
            rows = None
            L += [f"({AT_SCALE_FILE} could not be read: measure it again with the command below.)", ""]
    if rows:
        L += [f"Measured at the GPU rungs' load ({AT_SCALE_FILE}, from `benchmarks/ep_drops.py --only rungs`): "
              + "; ".join(f"{r['rung']} ({r['S']} shards of {r['Ts']:,} tokens) fixed {100 * r['fixed_drop']:.2f}%, "
                          f"ragged {100 * r['ragged_drop']:.3f}%" for r in rows) + ".", ""]
    else:
        L += ["Where the claim is checkable, measure it (router and dispatch only, minutes on CPU): "
              f"`python benchmarks/ep_drops.py --only rungs --json STUDY_DIR/{AT_SCALE_FILE}`; the report then "
              "prints those rates here.", ""]
    return L


def take_rows(a: StudyAnalysis, study_dir: Path | None = None) -> list[dict]:
    """The report's "What it would take" (analysis/fit/stopping.py): per quality value at C_ref
    consistent with no effect or wider than ×/÷ 1.5, the seeds its measured seed scatter says would bring it to a
    stated half-width, the added minutes on this machine and the `run --until` line."""
    comp, col = a.components, law_column()
    if not len(comp) or "between_seeds" not in comp:
        return []
    rows = []
    for r in comp[comp["response"] == col].itertuples():
        est, lo, hi = float(r.shapley), float(r.shapley_lo), float(r.shapley_hi)
        if r.component == "TOTAL":
            est, lo, hi, _ = recommended_total(a, col)
        k = int(r.between_seeds)
        rows.append({"component": r.component, "est": est, "lo": lo, "hi": hi,
                     "verdict": finding(a, col, r.component).partition(": ")[2],
                     "seed_sd": float(r.shapley_se_between) * math.sqrt(k) if k >= 2 else math.nan,
                     "law_se": float(getattr(r, "shapley_se_law", 0.0))})
    t = a.table
    k = int(t["seed"].nunique()) if "seed" in t else 1
    study = str(t["study"].dropna().iloc[0]) if "study" in t and t["study"].notna().any() else "STUDY"
    per_seed_s = core_seconds_per_seed(t, profile_seconds(study_dir) if study_dir is not None else None)
    return what_it_would_take(rows, k, study, per_seed_s, os.cpu_count() or 1, a.level)


def take_section(a: StudyAnalysis, study_dir: Path | None = None) -> list[str]:
    rows = take_rows(a, study_dir)
    if not rows:
        return []
    tab = pd.DataFrame({"value": [r["component"] for r in rows],
                        "now": [mult_text(r["est"], r["lo"], r["hi"]) for r in rows],
                        "to ±": [f"{r['target']:.3g} (×/÷ {math.exp(r['target']):.3g})" for r in rows],
                        "seeds in all": [str(r["seeds"]) if r["seeds"] else "—" for r in rows],
                        "added minutes here": [f"{r['minutes']:.0f}" if math.isfinite(r["minutes"]) else "—"
                                               for r in rows],
                        "how": [f"`{r['how']}`" if r["how"].startswith("marin-ablate") else r["how"] for r in rows]})
    return ["## What it would take", "",
            "Each value consistent with no effect (to half its estimate, at least ×/÷ 1.05) or wider than ×/÷ 1.5 "
            "(to ×/÷ 1.5): the seeds in all its measured seed scatter says would bring its 95% interval to that "
            "half-width (Stein's rule on this study's seeds as the pilot, docs/method.md §4.11), what the added "
            "seeds cost on this machine's cores (each seed's runs and LR profile as this study measured them), and "
            "the line that runs them and stops there.", "", md_table(tab), ""]


def family_statement(a: StudyAnalysis) -> str:
    """Which family each Findings verdict belongs to, and how each is controlled (analysis/report/findings.py,
    verdict_family): one line."""
    n = verdict_family(a)["n"]
    order = [RECORD_FAMILY] + [g for g in n if g not in (RECORD_FAMILY, SCALE_FAMILY)] + [SCALE_FAMILY]
    parts = [f"{family_label(a, g)} ({n[g]} verdict{'s' * (n[g] != 1)}"
             f"{', the family of record' if g == RECORD_FAMILY else ''})"
             for g in order if g in n]
    lone = (f"; {a.factors[0]} is the lone factor, so TOTAL is its own contrast, counted once"
            if len(a.factors) == 1 else "")
    return (f"Verdict families, each controlled on its own by Holm's step-down method at family-wise error "
            f"{1 - a.level:.0%} (a verdict stands only when its adjusted p is below {1 - a.level:.2g}): "
            f"{'; '.join(parts) or 'none'}{lone}; the intervals shown are the unadjusted {a.level:.0%} ones.")


def verdict(est, lo, hi) -> str:
    """gain / loss / consistent with no effect / not estimable, from a ln-scale 95% interval."""
    ok = all(isinstance(v, float) and math.isfinite(v) for v in (est, lo))
    return interval_verdict(lo, hi) if ok else "not estimable"


def findings_table(a: StudyAnalysis) -> pd.DataFrame:
    """Per component: the one recommended interval and a verdict per response at C_ref, then its scale
    trend (analysis/report/findings.py says what each cell may claim)."""
    resp = [(r.column, r.label) for r in RESPONSES.values()]
    return pd.DataFrame([{"component": f, **{label: finding(a, r, f) for r, label in resp},
                          "qualifiers": qualifiers(a, f), **scale_cells(a, f)}
                         for f in a.factors + ["TOTAL"]])


def say_once(tab: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Findings' qualifiers that stand in most rows (at least 3, and more than half) are taken out of the
    rows and said once in a note under the table, naming the rows they do not apply to."""
    if "qualifiers" not in tab or len(tab) < 3:
        return tab, []
    parts = [[] if q in ("—", "", None) else str(q).split("; ") for q in tab["qualifiers"]]
    counts = Counter(q for p in parts for q in dict.fromkeys(p))
    common = [q for q, n in counts.items() if n >= 3 and n > len(tab) / 2]
    if not common:
        return tab, []
    notes = []
    for q in common:
        without = [str(c) for c, p in zip(tab["component"], parts, strict=True) if q not in p]
        notes.append(f"- {q}" + (f" (all rows but {', '.join(without)})" if without else " (every row)"))
    tab = tab.assign(qualifiers=["; ".join(x for x in p if x not in common) or "—" for p in parts])
    return tab, ["", "Qualifiers of most rows, said once:", *notes]


def regime_section(a: StudyAnalysis, raw: pd.DataFrame) -> list[str]:
    """Each component's multiplier at each level of a regime factor (analysis/fit/regimes.py)."""
    L: list[str] = []
    for regime, t in regime_frames(a.fits, raw, a.level).items():
        lo, hi = t["low_level"].iloc[0], t["high_level"].iloc[0]
        change = {"gain": "grows", "loss": "shrinks"}
        tab = pd.DataFrame({
            "component": t["component"], "response": t["label"],
            f"{regime} = {lo}": [mult_text(*v) for v in zip(t["low"], t["low_lo"], t["low_hi"], strict=True)],
            f"{regime} = {hi}": [mult_text(*v) for v in zip(t["high"], t["high_lo"], t["high_hi"], strict=True)],
            f"change ({hi} / {lo})": [f"{mult_text(*v)}: {change.get(verdict(*v), verdict(*v))}"
                                      for v in zip(t["change"], t["change_lo"], t["change_hi"], strict=True)]})
        L += [f"## Effects by regime: {regime}", "",
              f"Each component's multiplier (Shapley over the other components, at C_ref) with `{regime}` held at "
              "each level, and their ratio: whether the effect grows or shrinks with the regime "
              "(docs/method.md, \"Effects by regime\").", "", md_table(tab), ""]
    return L


def planted_section(a: StudyAnalysis) -> list[str]:
    """Factors of known effect against their truth: the pooled intervals, then coverage over replicates."""
    if a.planted is None:
        return []
    label = {r.column: r.label for r in RESPONSES.values()}
    p = a.planted
    n_seeds = a.table["seed"].nunique() if "seed" in a.table else 1
    L = ["## Planted truths", "",
         f"Factors planted with a known effect, against their truth. All {n_seeds} seed(s) pooled: one draw of "
         "each interval.", "",
         md_table(pd.DataFrame({"factor": p["factor"], "response": p["response"].map(label),
                                "truth": np.exp(p["truth"]),
                                "estimate [95% CI]": [mult_text(e, lo, hi) if ok else "not estimable"
                                                      for e, lo, hi, ok in zip(p["estimate"], p["lo"], p["hi"],
                                                                               p["estimable"], strict=True)],
                                "covers": ["yes" if c else "NO" if ok else "—"
                                           for c, ok in zip(p["covers"], p["estimable"], strict=True)],
                                "ln error": p["error"]}), 4)]
    c = a.coverage
    if c is None or not len(c):
        return L + ["One seed: coverage needs replicates (run the study with more seeds; each seed is then also "
                    "analysed alone).", ""]
    n = int(c["replicates"].max())
    L += [f"### Coverage over {n} replicates", "",
          "Each seed analysed alone as a study of its own (its own init and data order, no bootstrap). Coverage: "
          "the fraction of replicates whose 95% interval contains the truth (a not-estimable number counts as a "
          "miss), with its exact (Clopper-Pearson) 95% interval. Scatter / SE: the standard deviation of the "
          "replicates' ln estimates over the mean standard error they report; near 1 when the intervals are as "
          "wide as the noise, below 1 when they are wider (conservative), above 1 when narrower.", "",
          md_table(pd.DataFrame({"factor": c["factor"], "response": c["response"].map(label),
                                 "truth": np.exp(c["truth"]),
                                 "covered": [f"{k}/{m}" for k, m in zip(c["covered"], c["replicates"], strict=True)],
                                 "coverage [exact 95%]": [f"{v:.2f} [{lo:.2f}, {hi:.2f}]" for v, lo, hi in
                                                          zip(c["coverage"], c["coverage_lo"], c["coverage_hi"],
                                                              strict=True)],
                                 "mean estimate": np.exp(c["mean_estimate"]), "largest ln error": c["max_abs_error"],
                                 "scatter / SE": c["sd_over_se"]}), 4)]
    return L


def _domains(raw: pd.DataFrame) -> list[str]:
    return [c[len("loss_"):] for c in raw.columns if c.startswith("loss_") and c != "loss_curve"]


def _rung_order(a: StudyAnalysis, rungs) -> list:
    """Rungs by compute (their numeric order), unknown ones last: never sorted as strings."""
    comp = dict(zip(a.rungs["rung"].astype(str), a.rungs["compute"], strict=True))
    return sorted(rungs, key=lambda r: (comp.get(str(r), math.inf), str(r)))


def eval_sets(a: StudyAnalysis, raw: pd.DataFrame) -> list[str]:
    """What the runs trained and were evaluated on (their spec.json data section), and per rung in
    compute order the all-off and all-on arms' macro eval loss (mean over seeds of completed runs);
    every arm and domain is in the appendix (eval_table)."""
    def names(col: str, empty: str) -> str:
        vals = sorted({str(v) for v in raw[col].dropna()}) if col in raw else []
        return ", ".join(f"`{v}`" for v in vals) or empty

    L = [f"- training corpus: {names('data_corpus', 'unknown')}",
         f"- eval sets: {names('data_eval_dir', 'the corpus held-out split')}; domains: "
         f"{', '.join(_domains(raw)) or 'unknown'}", ""]
    ok = raw[raw["status"] == "completed"] if "status" in raw else raw
    if not len(ok) or not {"rung", "run_id", "eval_macro_loss"} <= set(ok.columns):
        return L
    kind = ok["run_id"].map(arm_kinds(a)).fillna("other arms")
    comp = dict(zip(a.rungs["rung"].astype(str), a.rungs["compute"], strict=True))
    rows = []
    for r in _rung_order(a, ok["rung"].unique()):
        at = ok["rung"] == r
        m = {k: ok.loc[at & (kind == k), "eval_macro_loss"].mean() for k in ("all-off", "all-on")}
        rows.append({"rung": str(r), "compute (FLOPs)": f"{comp.get(str(r), np.nan):.3g}",
                     "all-off macro loss": m["all-off"], "all-on macro loss": m["all-on"],
                     "all-on − all-off": m["all-on"] - m["all-off"]})
    return L + ["Macro eval loss of the two end arms per rung (every arm and domain: Appendix, \"Evaluation per "
                "arm\"); — where that arm did not run.", "", md_table(pd.DataFrame(rows), 4)]


def eval_table(a: StudyAnalysis, raw: pd.DataFrame) -> list[str]:
    """Per rung (compute order) and arm: mean over seeds of completed runs of the macro and per-domain
    loss and bits per byte."""
    doms = _domains(raw)
    ok = raw[raw["status"] == "completed"] if "status" in raw else raw
    cols = ["eval_macro_loss", "macro_bpb"] + [c for d in doms for c in (f"loss_{d}", f"bpb_{d}") if c in ok]
    cols = [c for c in cols if c in ok]
    if not len(ok) or not {"rung", "arm"} <= set(ok.columns) or not cols:
        return ["No completed run with eval losses.", ""]
    t = ok.groupby(["rung", "arm"], sort=False)[cols].mean(numeric_only=True).reset_index()
    pos = {r: i for i, r in enumerate(_rung_order(a, t["rung"].unique()))}
    t = t.assign(_o=t["rung"].map(pos)).sort_values(["_o", "arm"]).drop(columns="_o")
    t = t.rename(columns={"eval_macro_loss": "macro loss", "macro_bpb": "macro bpb",
                          **{f"loss_{d}": f"loss {d}" for d in doms}, **{f"bpb_{d}": f"bpb {d}" for d in doms}})
    return [md_table(t, 4)]


def _figure(k: str, p: Path | None, out_dir: Path) -> list[str]:
    if p is None:
        return [f"- {k}: nothing to draw for this study", ""]
    return [f"### {k}", "", f"![{k}]({Path(p).relative_to(out_dir).as_posix()})", ""]


def render_markdown(a: StudyAnalysis, raw: pd.DataFrame, figures: dict[str, Path | None], out_dir: Path,
                    forecasts: list[dict] | None = None, title: str = "study", command: str | None = None,
                    backtest=None) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    study_dir = out_dir.parent if out_dir is not None else None
    L = [f"# Attribution report: {title}", "", f"_generated {now}_", ""] + provenance(a, raw, command) + [""]
    L += findings_section(a, raw, backtest) + take_section(a, study_dir) + paired_section(a)
    # the first response's forest figure: the Findings at a glance, per rung
    lead = next((f"forest_{r.name}" for r in RESPONSES.values() if r.figure), None)
    if lead in figures:
        L += _figure(lead, figures[lead], out_dir)
    if a.checks is not None and len(a.checks):
        ch = a.checks.copy()
        tab = pd.DataFrame({"TOTAL": ch["response"].map({r.column: r.name for r in RESPONSES.values()}),
                            "rung": ch["rung"],
                            "model": [mult_text(m, lo, hi)
                                      for m, lo, hi in zip(ch["model"], ch["model_lo"], ch["model_hi"], strict=True)],
                            "observed all-on vs all-off": [mult_text(m, lo, hi) if math.isfinite(m) else "not observed"
                                                           for m, lo, hi in zip(ch["observed"], ch["obs_lo"],
                                                                                ch["obs_hi"], strict=True)],
                            "agree": ["—" if v is None else ("yes" if v else "NO") for v in ch["agree"]]})
        L += ["TOTAL two ways: the model's all-on vs all-off multiplier beside the one the two arms' own runs show "
              "(where they disagree, trust the observed one: the effects model misses something).", "", md_table(tab)]
    L += drops_section(a, study_dir) + regime_section(a, raw) + planted_section(a)
    L += ["## Warnings", ""] + ([f"- {w}" for w in a.warnings] or ["- none"]) + [""]
    L += ["## Runs", ""] + [f"- {n}" for n in a.notes + a.lost] + [""]
    L += ["## Evaluation sets", ""] + eval_sets(a, raw) + [""]
    L += law_section(a)
    tab, absent = informative(attribution_table(a))
    L += [f"## Attribution at the reference compute C_ref = {a.c_ref:.3g} FLOPs", "", DEFINITIONS, "",
          md_table(tab)] + ([absent, ""] if absent else [])
    L += ["## Per rung (quality multiplier, Shapley, 95% CI, from the fitted scale model)", "",
          "Each column evaluates the fitted model (factor × log C terms) at that rung's compute; it is not a "
          "separate fit of that rung's runs.", "", md_table(per_rung_table(a))]
    if a.extrapolation is not None:
        L += [f"## Extrapolation to the target compute {a.target_compute:.3g} FLOPs "
              f"({a.target_compute / a.top_compute():.3g}x the top rung)", "",
              "Multipliers carried by the fitted factor × log C terms. The interval is the union of the power-law and "
              "curved-law fits' intervals (the spread between law forms is part of it) where the curved form is "
              "identified; otherwise it assumes the power law.", "",
              md_table(informative(attribution_table(a, a.extrapolation))[0])]
    L += ["## Forecasts (pre-registered)", ""]
    if forecasts:
        L += [md_table(pd.DataFrame(forecasts)[["created_utc", "arm", "compute", "predicted", "lo", "hi", "outcome",
                                                 "inside", "status"]], 4)]
    else:
        L += ["No forecast was written for this study.", ""]
    L += ["## Figures", ""]
    for k, p in figures.items():
        if k != lead:
            L += _figure(k, p, out_dir)
    return "\n".join(L + appendix_section(a, raw))


def findings_section(a: StudyAnalysis, raw: pd.DataFrame, backtest) -> list[str]:
    """## Findings: what the numbers rest on, how to read them, a row per component, families, backtest, coding."""
    between = "between_seeds" in a.components and (a.components["shapley_se_between"].notna()).any()
    tab, notes = say_once(findings_table(a))
    return ["## Findings", "", f"**{rests_on(a)}**", "",
            f"C_ref = {a.c_ref:.3g} FLOPs is the reference compute: the geometric mean of the runs' training compute "
            "(the ladder's centre in ln C, where the factor × log C terms vanish; ◆ in the forest figure). Losses are "
            "held-out cross-entropy in nats per token (eval_macro_loss: the mean over the evaluation domains).", "",
            f"One 95% interval per number (multipliers at the reference compute C_ref = {a.c_ref:.3g} FLOPs; Shapley "
            "value of the fitted model, law uncertainty included"
            + ("; the between-seed interval of the per-seed estimates" if between else "")
            + "), and a verdict: gain (interval above 1), loss (below 1), consistent with no effect (contains 1), "
            "not estimable (a gain or loss stands only where the family control stated below the table keeps it); "
            "qualifiers: what each verdict rests on (details under Warnings).", "",
            md_table(tab), *notes, "", family_statement(a)] + _per_decade_note(a) + backtest_lines(backtest) \
        + _coding_line(a, raw)


def _law_ci(a: StudyAnalysis, k: str) -> tuple:
    """The law table's interval of parameter k: a pinned law's own, or the profile's ends, (bound) where it hit one."""
    law, pinned_law = a.law, getattr(a, "pinned_law", None)
    if k in law.pinned and pinned_law is not None:  # the ladder's own interval (its valley, if any)
        lo, hi = pinned_law.ci(k)
        return (f"pinned: {lo:.4g}", f"pinned: {hi:.4g}")
    if k in law.pinned:
        return ("pinned", "pinned")
    lo, hi = law.ci(k)
    if not (math.isfinite(lo) or math.isfinite(hi)):
        return ("not identified", "not identified")
    bound = PROFILE_BOUNDS.get(k, (None, None))[0]
    # a profile end that reached the parameter's bound: that side is not identified by the rungs
    top = float(a.table["eval_macro_loss"].min()) if k == "linf" else None  # L∞ lies below every loss
    return ("not identified" if not math.isfinite(lo) else f"{lo:.4g} (bound)" if lo == bound else lo,
            "not identified" if not math.isfinite(hi) else f"{hi:.4g} (bound)"
            if top is not None and abs(hi - top) <= 1e-9 * top else hi)


def _law_est(law, k: str):
    """A parameter the rungs do not pin has no estimate either (an L∞ of −88 is not one)."""
    ni = k in law.not_identified or (k == "A" and {"linf", "alpha"} & set(law.not_identified))
    return "not identified" if ni else getattr(law, k)


def law_section(a: StudyAnalysis) -> list[str]:
    """## Reference law: its parameters and intervals, how they were had, the local slope, the law-form check."""
    L = ["## Reference law (all arms, jointly)", ""]
    if a.law is None:
        return L + ["Not estimable: no quality multipliers (see Runs).", ""]
    law, pinned_law = a.law, getattr(a, "pinned_law", None)
    rows = [{"parameter": k, "estimate": _law_est(law, k),
             **dict(zip(("95% CI lo", "95% CI hi"), ("not identified",) * 2 if _law_est(law, k) == "not identified"
                        else _law_ci(a, k), strict=True))} for k in ("linf", "A", "alpha")]
    L += [md_table(pd.DataFrame(rows), 4),
          f"L = L∞ + A·(M·C)^−α fitted on all {law.n} runs ({law.dof} residual df), each arm a compute "
          "multiplier M on the all-off arm's curve. "
          + ("L∞ and α: profile-likelihood intervals (every other "
             "parameter refitted, F(1, df) cut-off); an end marked (bound) reached L∞ = 0, the smallest loss or "
             "α = 0 without leaving the interval, so the rungs bound that side only by the parameter's range. "
             if pinned_law is None else "")
          + "A: delta method with the larger of the HC3 and model-based variances."
          + (f" {'A rests' if pinned_law is not None else 'L∞, α and A rest'} on the {law.between_df} df of "
             "the (seed × rung) cluster means: each rung's "
             "own init and data order shift all its arms together (docs/method.md §4.4)."
             if law.between_df and law.between_df > 0 else "")
          + (f" Not identified: {law.why}." if law.why else "")
          + (f" L∞ and α are pinned from {'a published law' if pinned_law.is_published else 'the baseline ladder'}"
             f", their columns its interval: {pinned_law.describe()} (docs/method.md §4.1)."
             if pinned_law is not None else "")
          + " L, L∞ and A are in nats per token.", ""]
    slope = local_slope(a)
    if law.not_identified and slope is not None:
        L += [f"Why the multipliers stand without L∞, α and A: a multiplier needs only how much loss an e-fold of "
              f"compute buys where the rungs are, the law's local slope dL/d ln C, which the ladder fixes: "
              f"{slope[0]:.4g} nats per token per e-fold [{slope[1]:.4g}, {slope[2]:.4g}] (the loss on ln C "
              "with one offset per arm, OLS with HC3, 95%). Beyond the ladder (extrapolation) they need the "
              "curvature the rungs do not fix.", ""]
    if "curved" in a.joint:
        k = a.joint["curved"]
        lo, hi = k.wald_ci("kappa", 1.96)
        L += [f"Law-form check: the curved form (exponent drifting with log C) has κ = {k.kappa:.3g} "
              f"[{lo:.3g}, {hi:.3g}]"
              + (" — the power law is consistent with the ladder." if lo <= 0 <= hi
                 else " — the ladder bends."), ""]
    return L


def appendix_section(a: StudyAnalysis, raw: pd.DataFrame) -> list[str]:
    """## Appendix: the bootstrap interval, the evaluation per arm, aliasing, each fit's coefficients and ANOVA."""
    L = ["## Appendix", "", "### Second interval: bootstrap", "",
         "The bootstrap column (\"M_flop boot CI\") refits the joint law and the effects model on resampled data. It "
         "is the second opinion, not the recommended interval: with few runs per contrast it is too narrow (a "
         "percentile bootstrap of a t-like statistic), so where the two differ, the Findings interval is the one "
         "with the stated coverage (measured in benchmarks/RESULTS.md).", ""]
    L += ["### Evaluation per arm", "", "Every rung (compute order) and arm: mean over seeds of completed runs.", ""]
    L += eval_table(a, raw) + [""]
    L += ["### Aliasing", ""]
    groups, ne = a.alias_groups(), a.not_estimable()
    if not groups and not ne:
        L += ["Every candidate term is estimable separately.", ""]
    if groups:
        L += ["Alias groups (estimated only together, never separately):", ""] + [f"- {g}" for g in groups] + [""]
    if ne:
        L += ["Not estimable:", ""] + [f"- {x}" for x in ne] + [""]
    for name, fit in a.fits.items():
        L += [f"### Coefficients and ANOVA: {name} ({fit.response}, {fit.method}, {fit.n} runs, {fit.dof} residual df)",
              "", "Standard errors: the larger of HC3 and model-based per coefficient. The ANOVA is the Wald F test "
              "with the same covariance (F = t² for one column), so the two tables agree.", ""]
        L += [md_table(fit.coef_table()[["term", "estimate", "se", "lo", "hi", "p"]], 4)]
        L += [md_table(a.anova[name], 4)]
    return L


def write_report(a: StudyAnalysis, raw: pd.DataFrame, out_dir: str | Path, *, forecasts: list[dict] | None = None,
                 title: str = "study", figures: bool = True, command: str | None = None,
                 backtest=None) -> tuple[Path, Path]:
    """Writes out_dir/report.md, out_dir/report.html and out_dir/figures/*.png. `backtest`: the ladder's
    backtest (analysis/backtest.py), or why it did not run, for the line under Findings."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = {}
    if figures:
        from marin_ablate.analysis.report.plots import all_figures

        with warnings.catch_warnings():  # a figure's exp of a vast interval: drawn clipped, never printed raw
            warnings.simplefilter("ignore", RuntimeWarning)
            figs = all_figures(a, raw, out_dir / "figures")
    md = render_markdown(a, raw, figs, out_dir, forecasts, title, command, backtest)
    atomic_write_text(out_dir / "report.md", md)
    html = render_html(md, title)
    atomic_write_text(out_dir / "report.html", html)
    return out_dir / "report.md", out_dir / "report.html"
