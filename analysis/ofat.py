"""One-factor-at-a-time (OFAT) studies: one baseline arm plus one arm per change (docs/method.md §4.8).

The baseline is found from the runs (the arm every other arm differs from in one factor), never from how the
levels are coded, so no value moves when a study codes them the other way round. Per change and rung: M paired by
rung through the baseline's law recentred on that rung's baseline runs (Marin's convention), R and W = M·R, each
with a t interval on the residual df.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, stats

from marin_ablate.analysis.io.results import factor_coding, factor_columns, inventory

DESIGNS = ("auto", "factorial", "ofat")
#: What a one-factor-at-a-time study cannot tell, printed with every OFAT report.
CANNOT_TELL = (
    "interactions: each change is measured once, against the baseline only, so whether two changes "
    "help each other, overlap or conflict is not measured",
    "a change's contribution inside the full recipe: the single-change (add-one-in) multiplier is neither "
    "the Shapley value nor the leave-one-out (from the full recipe) value a factorial study estimates",
    "the recipe's TOTAL: the product of the single-change multipliers is not the all-changes multiplier "
    "(no arm holds every change); run the full recipe, or a factorial, to measure it",
)


@dataclass
class Star:
    """The OFAT structure of a set of runs: the baseline's levels and, per other arm, its one change."""

    factors: list[str]
    baseline: tuple  # levels of the baseline arm, in `factors` order
    labels: dict[tuple, str]  # levels -> arm label
    changes: dict[tuple, tuple[str, str, str]]  # levels -> (factor, baseline level, arm level)
    left_out: list[str] = field(default_factory=list)  # arms more than one change from the baseline

    @property
    def covers_all(self) -> bool:
        return not self.left_out


def _levels(df: pd.DataFrame, factors: list[str]) -> list[tuple]:
    return [tuple("" if pd.isna(v) else str(v) for v in row) for row in df[factors].itertuples(index=False)]


def _ncomp(a: tuple, b: tuple) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def find_star(df: pd.DataFrame) -> Star | None:
    """The arm with the most single-change neighbours among the completed runs (ties: the arm with
    most factors at their coded low level; still tied: refused), or None without one."""
    ok = df[df["status"] == "completed"] if "status" in df else df
    factors = factor_columns(df)
    if not factors or ok.empty:
        return None
    levels = _levels(ok, factors)
    arms = list(dict.fromkeys(levels))
    if len(arms) < 2:
        return None
    nb = {a: sum(_ncomp(a, b) == 1 for b in arms) for a in arms}
    best = max(nb.values())
    if best == 0:
        return None
    cands = [a for a in arms if nb[a] == best]
    if len(cands) > 1:  # e.g. two arms, or every change a level of one factor: the coded low level decides
        coding = factor_coding(df)
        low = {a: sum(lv == str(coding.get(f, (None,))[0]) for f, lv in zip(factors, a, strict=True)) for a in cands}
        top = max(low.values())
        cands = [a for a in cands if low[a] == top]
    arm_col = ok["arm"].astype(str).tolist() if "arm" in ok else [None] * len(ok)
    label = {}
    for lv, name in zip(levels, arm_col, strict=True):
        label.setdefault(lv, name or ",".join(f"{f}={v}" for f, v in zip(factors, lv, strict=True)))
    if len(cands) > 1:
        raise ValueError(f"no unique baseline: arms {', '.join(repr(label[a]) for a in cands)} each differ from "
                         f"{best} other arm(s) by one change; allowed values: a design where one arm holds every "
                         "factor's baseline (coded low) level")
    base = cands[0]
    changes = {a: next((f, b, x) for f, x, b in zip(factors, a, base, strict=True) if x != b)
               for a in arms if _ncomp(a, base) == 1}
    left = [label[a] for a in arms if a != base and a not in changes]
    return Star(factors, base, label, changes, left)


def design_kind(df: pd.DataFrame) -> tuple[str, Star | None, str]:
    """("ofat" | "factorial", the star, a note): OFAT when every arm is one change from one baseline
    and there are at least two changes (one change is also a 2-arm factorial, analysed as such)."""
    try:
        star = find_star(df)
    except ValueError:
        return "factorial", None, ""
    if star is None:
        return "factorial", None, ""
    if star.covers_all and len(star.changes) >= 2:
        return "ofat", star, ""
    # A factorial pooled with single-change arms: a factor whose other level appears in one arm only.
    lone = sorted({c[0] for c in star.changes.values()
                   if sum(c[0] == d[0] and c[2] == d[2] for d in _arm_changes(star)) == 1})
    if star.left_out and lone:
        return "factorial", star, (
            f"the runs pool a factorial with single-change arms ({', '.join(lone)}) around arm "
            f"{star.labels[star.baseline]!r}: analysed as a factorial (those factors' interactions are not "
            f"estimable); --design ofat compares each single-change arm with {star.labels[star.baseline]!r} alone")
    return "factorial", star, ""


def _arm_changes(star: Star) -> list[tuple[str, str, str]]:
    """(factor, baseline level, level) of every arm's differing factors, one entry per arm and factor."""
    return [(f, b, x) for a in star.labels for f, b, x in zip(star.factors, star.baseline, a, strict=True) if x != b]


@dataclass
class OfatLaw:
    """The baseline's law: values, which were pinned, the covariance of the fitted ones over
    (linf, ln A, alpha) (zero rows for pinned ones) and the residual df it leaves."""

    linf: float
    A: float
    alpha: float
    pinned: tuple[str, ...]
    cov: np.ndarray
    identified: bool = True
    why: str = ""


@dataclass
class OfatAnalysis:
    baseline: str
    baseline_levels: dict[str, str]
    law: OfatLaw | None
    table: pd.DataFrame  # one row per change × rung
    dof: int  # residual df of the quality intervals
    dof_R: int
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cannot_tell: tuple[str, ...] = CANNOT_TELL
    # the baseline holds every factor at its coded high level and each arm lowers one: a hold-one-out
    # (Marin's hold-one-feature-out), whose report reads each change as the worth of the feature removed
    held_out: bool = False


PARAMS = ("linf", "A", "alpha")


def paired_ln_m(L_arm: float, lnC_arm: float, L_base: float, lnC_base: float, linf: float,
                alpha: float) -> tuple[float, np.ndarray, np.ndarray]:
    """ln M of an arm against its own rung's baseline through the law's local inverse (docs/method.md §4.8; Marin's
    convention, experiments/grug/moe/agent.md): ln M = (ln(L̄_b − L∞) − ln(L̄ − L∞))/α + ln C_b − ln C. Returns (ln M,
    its gradient over the law's (L∞, ln A, α), its gradient over the two mean losses (arm, baseline))."""
    ga, gb = L_arm - linf, L_base - linf
    lnm = (np.log(gb) - np.log(ga)) / alpha + lnC_base - lnC_arm
    g_law = np.array([(1 / ga - 1 / gb) / alpha, 0.0, -(np.log(gb) - np.log(ga)) / alpha ** 2])
    return float(lnm), g_law, np.array([-1 / (alpha * ga), 1 / (alpha * gb)])


def _fit_law(C: np.ndarray, L: np.ndarray, pins: dict[str, float]) -> tuple[OfatLaw, np.ndarray, int]:
    """Least squares of the baseline's losses on L∞ + A·C^(−α) over the unpinned parameters;
    returns the law, its residuals and the number of fitted parameters."""
    free = [k for k in PARAMS if k not in pins]
    nscales = len(np.unique(np.round(np.log(C), 6)))
    if len(free) > nscales or (len(free) == 3 and nscales < 3):
        raise ValueError(f"the baseline ran at {nscales} scale(s), too few to fit {', '.join(free)} of its law; "
                         "pin them (--pin-linf, --pin-alpha, --pin-A: e.g. the published law)")
    if not free:
        law = OfatLaw(pins["linf"], pins["A"], pins["alpha"], tuple(PARAMS), np.zeros((3, 3)))
        return law, L - law.linf - law.A * C ** (-law.alpha), 0
    c0 = float(np.exp(np.mean(np.log(C))))
    unpack, best = _solve_law(C, L, pins, free, c0)
    linf, lna0, alpha = unpack(best.x)
    A = float(np.exp(lna0 + alpha * np.log(c0)))
    law = OfatLaw(float(linf), A, float(alpha), tuple(k for k in PARAMS if k in pins), _law_cov(best.jac, free, c0))
    if "linf" in free and not 0 <= linf < float(np.min(L)):
        law.identified, law.why = False, f"fitted L∞ {linf:.4g} lies outside [0, smallest baseline loss)"
    if "alpha" in free and not alpha > 0:
        law.identified, law.why = False, f"fitted α {alpha:.4g} is not positive: the loss does not fall with compute"
    return law, L - (law.linf + law.A * C ** (-law.alpha)), len(free)


def _solve_law(C: np.ndarray, L: np.ndarray, pins: dict[str, float], free: list[str], c0: float):
    """(unpack, the least squares) over the free ones of (L∞, ln A·c0^(−α), α); A alone starts at its exact value."""
    lc = np.log(C / c0)

    def unpack(p):
        d = dict(zip(free, p, strict=True))
        linf = d.get("linf", pins.get("linf"))
        alpha = d.get("alpha", pins.get("alpha"))
        lna0 = d["A"] if "A" in d else np.log(pins["A"]) - pins["alpha"] * np.log(c0)  # ln of A·c0^(−α)
        return linf, lna0, alpha

    def resid(p):
        linf, lna0, alpha = unpack(p)
        return linf + np.exp(lna0 - alpha * lc) - L

    def jac(p):
        linf, lna0, alpha = unpack(p)
        e = np.exp(lna0 - alpha * lc)
        cols = {"linf": np.ones_like(lc), "A": e, "alpha": -lc * e}
        return np.stack([cols[k] for k in free], 1)

    if free == ["A"]:  # linear in A: start at the exact least-squares solution
        x = C ** (-pins["alpha"])
        A = float(np.sum((L - pins["linf"]) * x) / np.sum(x * x))
        return unpack, optimize.least_squares(resid, np.log(A) - pins["alpha"] * np.log(c0), jac=jac, method="lm",
                                              xtol=1e-15, ftol=1e-15, gtol=1e-15)
    best, span = None, float(np.ptp(L)) or 0.1
    for a0 in ((pins["alpha"],) if "alpha" in pins else (0.1, 0.3, 0.8)):
        linf0 = pins.get("linf", float(np.min(L)) - 0.5 * span)
        x0 = {"linf": linf0, "alpha": a0, "A": float(np.log(max(np.mean(L) - linf0, 1e-9)))}
        try:
            r = optimize.least_squares(resid, [x0[k] for k in free], jac=jac, method="lm", xtol=1e-15, ftol=1e-15,
                                       gtol=1e-15, max_nfev=20000)
        except ValueError:
            continue
        if np.all(np.isfinite(r.x)) and (best is None or r.cost < best.cost):
            best = r
    if best is None:
        raise ValueError("the baseline's law did not fit; pin it (--pin-linf, --pin-alpha, --pin-A)")
    return unpack, best


def _law_cov(J: np.ndarray, free: list[str], c0: float) -> np.ndarray:
    """(JᵀJ)⁻¹ of the fitted coordinates (ln a0 = ln A − α ln c0) mapped to (linf, ln A, alpha), up to s²."""
    d = {"linf": (1.0, 0.0, 0.0), "A": (0.0, 1.0, -np.log(c0)), "alpha": (0.0, 0.0, 1.0)}
    Tm = np.array([d[k] for k in free])  # d(free coordinate) / d(linf, ln A, alpha)
    cov_free = np.linalg.pinv(J.T @ J)
    sel = [PARAMS.index(k) for k in free]
    Tinv = np.linalg.pinv(Tm[:, sel])
    cov = np.zeros((3, 3))
    cov[np.ix_(sel, sel)] = Tinv @ cov_free @ Tinv.T
    return cov


@dataclass
class _OfatRuns:
    """The runs an OFAT analysis reads (`_ofat_runs`) and the row indices of each changed arm × rung cell."""

    ok: pd.DataFrame
    C: np.ndarray
    L: np.ndarray
    levels: list[tuple]
    is_base: np.ndarray
    rung: np.ndarray
    hw: np.ndarray
    cells: dict[tuple, list[int]]


@dataclass
class _Throughput:
    """ln model FLOP/s per run, the baseline's per (rung, hardware), and the pooled within-cell scatter."""

    lm: np.ndarray
    bref: dict[tuple, list[float]]
    s2: float
    dof: int


def analyze_ofat(df: pd.DataFrame, *, pin_linf: float | None = None, pin_alpha: float | None = None,
                 pin_A: float | None = None, level: float = 0.95, star: Star | None = None) -> OfatAnalysis:
    """Each change's multipliers per rung against the baseline arm (module docstring): the runs (`_ofat_runs`),
    the baseline's law and the quality scatter (`_quality`), the throughput scatter (`_throughput`), then per
    change × rung cell M (`_quality_cell`), R (`_throughput_cell`) and W = M·R with their t intervals."""
    pins = {k: float(v) for k, v in (("linf", pin_linf), ("A", pin_A), ("alpha", pin_alpha)) if v is not None}
    for k, flag in (("alpha", "--pin-alpha"), ("A", "--pin-A")):
        if k in pins and not pins[k] > 0:
            raise ValueError(f"{flag} {pins[k]}: allowed values: a number > 0")
    if "A" in pins and "alpha" not in pins:  # A is the law's scale in units of C^α: it means nothing without α
        raise ValueError(f"--pin-A {pins['A']:g} without --pin-alpha: A is in units of C^α; allowed values: --pin-A "
                         "with --pin-alpha (and --pin-linf, for a published law), or no --pin-A")
    star = star or find_star(df)
    if star is None:
        raise ValueError("not a one-factor-at-a-time design: no arm that other arms differ from by one change; "
                         "allowed values: --design factorial for this study")
    notes, warns = [], []
    runs = _ofat_runs(df, star, notes)
    law, dof, s2 = _quality(runs, pins, notes)
    thr = _throughput(runs, warns)
    q = float(stats.t.ppf(0.5 + level / 2, dof)) if dof > 0 else float("nan")
    qr = float(stats.t.ppf(0.5 + level / 2, thr.dof)) if thr.dof > 0 else float("nan")
    base_at: dict[str, list[int]] = {}
    for i in np.flatnonzero(runs.is_base):
        base_at.setdefault(runs.rung[i], []).append(i)
    rows = []
    order = {lv: (star.factors.index(c[0]), c[2]) for lv, c in star.changes.items()}
    for (lv, r), ix in sorted(runs.cells.items(), key=lambda kv: (order[kv[0][0]], float(np.mean(runs.C[kv[1]])))):
        row = _quality_cell(runs, star, law, (lv, r), ix, base_at.get(r, []), s2 if dof > 0 else None, notes)
        lnr, ser = _throughput_cell(runs, thr, r, ix)
        row.update(ln_R=lnr, ln_R_se=ser, ln_W=row["ln_M"] + lnr, ln_W_se=float(np.hypot(row["ln_M_se"], ser)))
        qw = max(q, qr) if np.isfinite(q) and np.isfinite(qr) else np.nan  # W: the smaller df's quantile
        for k, qq in (("M", q), ("R", qr), ("W", qw)):
            est, s_ = row[f"ln_{k}"], row[f"ln_{k}_se"]
            row[k], row[f"{k}_lo"], row[f"{k}_hi"] = np.exp(est), np.exp(est - qq * s_), np.exp(est + qq * s_)
        rows.append(row)
    if any(not np.isfinite(rw["ln_R"]) for rw in rows):
        notes.append("no throughput ratio where a cell or the baseline lacks model FLOP/s on the same rung "
                     "and hardware")
    coding = factor_coding(df) if "coding" in df else {}
    held_out = bool(rows) and all(coding.get(f, (None, None))[1] == b for f, b in zip(star.factors, star.baseline,
                                                                                      strict=True))
    return OfatAnalysis(star.labels[star.baseline], dict(zip(star.factors, star.baseline, strict=True)), law,
                        pd.DataFrame(rows), dof, thr.dof, notes, warns, held_out=held_out)


def _ofat_runs(df: pd.DataFrame, star: Star, notes: list[str]) -> _OfatRuns:
    """The completed, finite runs of the baseline and of arms one change from it; ValueError if the first has none."""
    ok = df[(df["status"] == "completed") if "status" in df else slice(None)].copy()
    C = pd.to_numeric(ok["train_flops"], errors="coerce").to_numpy(float)
    L = pd.to_numeric(ok["eval_macro_loss"], errors="coerce").to_numpy(float)
    good = np.isfinite(C) & (C > 0) & np.isfinite(L)
    ok, C, L = ok[good], C[good], L[good]
    levels = _levels(ok, star.factors)
    keep = np.array([lv == star.baseline or lv in star.changes for lv in levels])
    if star.left_out:
        notes.append(f"left out (more than one change from the baseline): {', '.join(star.left_out)}")
    ok, C, L = ok[keep], C[keep], L[keep]
    levels = [lv for lv, k in zip(levels, keep, strict=True) if k]
    is_base = np.array([lv == star.baseline for lv in levels])
    rung = ok["rung"].astype(str).to_numpy() if "rung" in ok else np.round(np.log10(C), 1).astype(str)
    hw = ok["hardware"].astype(str).to_numpy() if "hardware" in ok else np.full(len(ok), "?")
    if not is_base.any():
        base_name = star.labels[star.baseline]
        why = inventory(df.loc[df["arm"].astype(str) == base_name] if "arm" in df else df).why_none()
        raise ValueError(f"the baseline arm {base_name!r} has no completed run: nothing to compare with{why}")
    cells: dict[tuple, list[int]] = {}
    for i, (lv, r) in enumerate(zip(levels, rung, strict=True)):
        if lv != star.baseline:
            cells.setdefault((lv, r), []).append(i)
    return _OfatRuns(ok, C, L, levels, is_base, rung, hw, cells)


def _quality(runs: _OfatRuns, pins: dict[str, float], notes: list[str]) -> tuple[OfatLaw | None, int, float]:
    """(the baseline's law or None, df, s²): s² pooled from its residuals and each changed cell's replicates."""
    C, L, is_base = runs.C, runs.L, runs.is_base
    law, why = None, ""
    try:
        o = np.lexsort((L[is_base], C[is_base]))  # a fixed order: the fit must not depend on the rows' order
        law, res, p = _fit_law(C[is_base][o], L[is_base][o], pins)
    except ValueError as e:
        why = str(e)
        res, p = np.array([]), 0
    ss = float(np.sum(res ** 2)) + sum(float(np.sum((L[ix] - L[ix].mean()) ** 2)) for ix in runs.cells.values())
    dof = max(len(res) - p, 0) + sum(len(ix) - 1 for ix in runs.cells.values())
    s2 = ss / dof if dof > 0 else float("nan")
    if law is not None and not law.identified:
        why, law = f"the baseline's law is not identified ({law.why}); pin it (--pin-linf, --pin-alpha, --pin-A)", None
    if why:
        notes.append(f"quality multipliers not estimable: {why}")
    if dof == 0 and law is not None:
        notes.append("no residual df (one run per cell and a law with as many free parameters as the baseline has "
                     "runs): intervals not estimable; add a seed or pin the law")
    return law, dof, s2


def _throughput(runs: _OfatRuns, warns: list[str]) -> _Throughput:
    """ln model FLOP/s per run, the baseline's per (rung, hardware), the scatter pooled in (arm, rung, hardware)."""
    ok, levels, rung, hw = runs.ok, runs.levels, runs.rung, runs.hw
    mfs = pd.to_numeric(ok["model_flops_per_s"], errors="coerce").to_numpy(float) if "model_flops_per_s" in ok \
        else np.full(len(ok), np.nan)
    lm = np.where(mfs > 0, np.log(np.where(mfs > 0, mfs, 1.0)), np.nan)
    bref: dict[tuple, list[float]] = {}
    for i in np.flatnonzero(runs.is_base & np.isfinite(lm)):
        bref.setdefault((rung[i], hw[i]), []).append(lm[i])
    groups: dict[tuple, list[float]] = {}
    for i in np.flatnonzero(np.isfinite(lm)):
        groups.setdefault((levels[i], rung[i], hw[i]), []).append(lm[i])
    ssr = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in groups.values())
    dof_R = sum(len(v) - 1 for v in groups.values())
    if any("cpu" in h.lower() for h in hw):
        warns.append("throughput measured on CPU: R and W are machine-load noise there, not informative")
    return _Throughput(lm, bref, ssr / dof_R if dof_R > 0 else float("nan"), dof_R)


def _quality_cell(runs: _OfatRuns, star: Star, law: OfatLaw | None, cell: tuple, ix: list[int], ib: list[int],
                  s2: float | None, notes: list[str]) -> dict:
    """A cell's row: mean loss, compute, ln M against its rung's baseline runs `ib` and its se (s2 None: no df)."""
    (lv, r), L, C = cell, runs.L, runs.C
    f, b, x = star.changes[lv]
    mu, lc, n = float(L[ix].mean()), float(np.mean(np.log(C[ix]))), len(ix)
    row = {"change": f"{f}: {b} -> {x}", "factor": f, "baseline_level": b, "level": x, "arm": star.labels[lv],
           "rung": r, "compute": float(np.exp(lc)), "n": n, "loss": mu}
    lnm = se = np.nan
    if law is not None and not ib:
        notes.append(f"{row['change']} at {r}: no baseline run at this rung to pair with: no multiplier")
    elif law is not None and min(mu, float(L[ib].mean())) > law.linf:
        lnm, g_law, g_means = paired_ln_m(mu, lc, float(L[ib].mean()), float(np.mean(np.log(C[ib]))),
                                          law.linf, law.alpha)
        row["baseline_loss"] = float(L[ib].mean())
        if s2 is not None:
            se = float(np.sqrt(s2 * (g_law @ law.cov @ g_law + g_means[0] ** 2 / n + g_means[1] ** 2 / len(ib))))
    elif law is not None:
        notes.append(f"{row['change']} at {r}: a mean loss at or below L∞ {law.linf:.4g}: no multiplier")
    row.update(ln_M=lnm, ln_M_se=se)
    return row


def _throughput_cell(runs: _OfatRuns, thr: _Throughput, r: str, ix: list[int]) -> tuple[float, float]:
    """(ln R, se) of a cell against the baseline's runs on its rung, per hardware both ran on, averaged."""
    hw, lm = runs.hw, thr.lm
    d, var = [], []
    for hh in sorted({hw[i] for i in ix}):
        a = [lm[i] for i in ix if hw[i] == hh and np.isfinite(lm[i])]
        bb = thr.bref.get((r, hh))
        if a and bb:
            d.append(np.mean(a) - np.mean(bb))
            var.append(thr.s2 * (1 / len(a) + 1 / len(bb)))
    lnr = float(np.mean(d)) if d else np.nan
    return lnr, float(np.sqrt(np.sum(var)) / len(var)) if d and thr.dof > 0 else np.nan


def _fmt(est: float, lo: float, hi: float) -> str:
    if not np.isfinite(est):
        return "not estimable"
    return f"{est:.3f} [{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) else f"{est:.3f} (interval not estimable)"


def report_lines(a: OfatAnalysis, title: str = "") -> list[str]:
    """The OFAT report as Markdown lines (also printed by `analyze`)."""
    out = [f"# {title or 'study'}: one-factor-at-a-time analysis", "",
           f"Baseline arm: **{a.baseline}** (" + ", ".join(f"{f}={v}" for f, v in a.baseline_levels.items()) +
           "); each other arm differs from it by one change (docs/method.md §4.8).", ""]
    if a.law is not None:
        lw = a.law
        src = ("pinned" if len(lw.pinned) == 3
               else f"fitted on the baseline's runs ({', '.join(lw.pinned) or 'none'} pinned)")
        out += [f"Law of the baseline, {src}: L(C) = {lw.linf:.4g} + {lw.A:.4g}·C^(−{lw.alpha:.4g}).", ""]
    out += ["| change | rung | compute (FLOPs) | runs | loss | M (quality) | R (throughput) | W (wall-clock) |",
            "|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['change']} | {r['rung']} | {r['compute']:.3g} | {r['n']} | {r['loss']:.4f} | "
            f"{_fmt(r['M'], r['M_lo'], r['M_hi'])} | {_fmt(r['R'], r['R_lo'], r['R_hi'])} | "
            f"{_fmt(r['W'], r['W_lo'], r['W_hi'])} |" for r in a.table.to_dict("records")]
    if a.held_out:
        out += held_out_lines(a)
    out += ["", f"95% t intervals: quality on {a.dof} residual df, throughput on {a.dof_R}. M = C_eq/C, C_eq the "
            "compute at which the baseline's law, recentred on the same rung's baseline runs, reaches the arm's mean "
            "loss (paired by rung); R = model FLOP/s over the baseline's "
            "on the same rung and hardware; W = M·R.", "", "## What a one-factor-at-a-time study cannot tell", ""]
    out += [f"- {t}" for t in a.cannot_tell]
    if a.notes or a.warnings:
        out += ["", "## Notes", ""] + [f"- warning: {w}" for w in a.warnings] + [f"- {n}" for n in a.notes]
    return out


def held_out_lines(a: OfatAnalysis) -> list[str]:
    """A hold-one-out read as Marin reads its hold-one-feature-out (marin-community/marin#9288): each feature's
    worth Sc = 1/M, the compute the arm without it needs to reach the baseline's loss over the baseline's own
    (> 1: worth keeping), and Sw = 1/W on wall-clock; beside them Marin's own formula, losses only,
    ((L − L∞)/(L_b − L∞))^(1/α), which equals 1/M where the arm trains the baseline's compute."""
    out = ["", "## Each feature's worth (hold-one-out: Sc = 1/M, Sw = 1/W)", "",
           "| feature removed | rung | Sc (quality) | Sw (wall-clock) | Sc, losses only |", "|---|---|---|---|---|"]
    for r in a.table.to_dict("records"):
        inv = {k: (1 / r[k], 1 / r[f"{k}_hi"], 1 / r[f"{k}_lo"]) for k in ("M", "W")}
        loss_only = np.nan
        if a.law is not None and np.isfinite(r.get("baseline_loss", np.nan)):
            loss_only = ((r["loss"] - a.law.linf) / (r["baseline_loss"] - a.law.linf)) ** (1 / a.law.alpha)
        out.append(f"| {r['factor']} ({r['baseline_level']} -> {r['level']}) | {r['rung']} | {_fmt(*inv['M'])} | "
                   f"{_fmt(*inv['W'])} | {'not estimable' if not np.isfinite(loss_only) else f'{loss_only:.3f}'} |")
    return out
