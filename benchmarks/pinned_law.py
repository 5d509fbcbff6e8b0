"""The pinned reference law on planted baseline ladders: the profile valley against the straight ellipse it
replaced and an oracle law (docs/method.md §4.1 "Pinned reference law").

Usage: OMP_NUM_THREADS=1 python benchmarks/pinned_law.py [--ladders 50] [--cases bend1,bend3,straight1,straight3]

Each ladder is the baseline arm on 7 rungs over 64x of compute (the smoke study's reference ladder's span),
1 or 3 seeds, drawn from a planted law: `bend` L = 2.0 + 400·C^−0.2 (the ladder sees it bend; the old rule
mostly took its identified branch) or `straight` L = 0.5 + 15·C^−0.06 (a near-straight line in ln C, as CPU
ladders measure it); run noise sd 0.01 (0.02 straight) and a (seed × rung) loss shift sd 0.02. Each pins the
law of one planted study: a 2^3 factorial (xsa 0.05, sconv 0.05, optimizer 0.15 in ln M per unit of coding,
so Shapley values 0.1, 0.1, 0.3 and TOTAL 0.5) on 4 rungs over 8x, 1 seed, analysed without bootstrap.

Methods: `new` = analysis/fit/reflaw.py `fit_reference` (the profile likelihood of the ladder, its accepted
(L∞, α(L∞)) pairs carried by their ends); `old` = the rule it replaced, rebuilt here: where the free fit's
L∞ and α intervals (Wald, t on the ladder's df) lay inside [0, smallest loss) and α > 0, (L∞, α) pinned with
their 2x2 covariance and carried by refits at both ends of each principal axis of its 95% ellipse
(analysis/fit/joint.py `pin_term`), else the valley on the 7-point grid `OLD_GRID`; `oracle` = L∞ and α pinned
exactly at the truth. Printed per case and method: how often the old rule took its identified branch, the
coverage of the planted L∞ and α by the pinned law's interval, the coverage of the 4 Shapley values
(components and TOTAL) at C_ref and at 10x C_ref, and the median over studies of each interval's width
(hi − lo of ln M) over the oracle's on the same study.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

FACTORS = ["xsa", "sconv", "optimizer"]
MAIN = {"xsa": 0.05, "sconv": 0.05, "optimizer": 0.15}
LADDER = {f"r{n}": n * 8192.0 for n in (16, 32, 64, 128, 256, 512, 1024)}  # 64x
DESIGN_RUNGS = {f"r{n}": n * 8192.0 for n in (32, 64, 128, 256)}  # 8x, inside the ladder
LAWS = {"bend": dict(linf=2.0, A=400.0, alpha=0.2, noise_sd=0.01),
        "straight": dict(linf=0.5, A=15.0, alpha=0.06, noise_sd=0.02)}
CASES = {"bend1": ("bend", 1), "bend3": ("bend", 3), "straight1": ("straight", 1), "straight3": ("straight", 3)}
#: The L∞ grid of the rule this replaced, as fractions of the smallest loss.
OLD_GRID = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95)


def truth(kind: str):
    from marin_ablate.analysis.calibration.simulate import SimTruth

    t = SimTruth(FACTORS, main=dict(MAIN), c_ref=1e14, seed_sd=0.0, flops_per_token=1e6, **LAWS[kind])
    t.rung_sd = 0.02
    return t


def old_reference(C, L, seeds):
    """The pinned law as the replaced rule built it: (PinnedLaw, "identified" | "valley")."""
    from scipy import stats

    from marin_ablate.analysis.fit.joint import fit_joint
    from marin_ablate.analysis.fit.reflaw import PinnedLaw, _larger_cov

    C, L = np.asarray(C, float), np.asarray(L, float)
    seeds = np.asarray(seeds) if seeds is not None and len(set(seeds)) > 1 else None
    span = (float(C.min()), float(C.max()), len(L))
    try:
        jf = fit_joint(C, L, np.zeros((len(L), 0)), [], seeds=seeds)
    except ValueError:
        jf = None
    if jf is not None and not {"linf", "alpha"} & set(jf.not_identified) and 0.0 <= jf.linf < L.min():
        ii = [jf.names.index("linf"), jf.names.index("alpha")]
        law = PinnedLaw(jf.linf, jf.alpha, _larger_cov(jf, ii), jf.A, *span, jf.dof)
        q = float(stats.t.ppf(0.975, max(jf.dof, 1)))
        if jf.alpha - q * law.se("alpha") > 0 and jf.linf - q * law.se("linf") >= 0 \
                and jf.linf + q * law.se("linf") < L.min():
            return law, "identified"
    fits = []
    for frac in OLD_GRID:
        try:
            fits.append(fit_joint(C, L, np.zeros((len(L), 0)), [], seeds=seeds, pin_linf=frac * float(L.min())))
        except ValueError:
            continue
    rss = lambda f: float(f.resid @ f.resid)  # noqa: E731
    rss0, dof = (rss(jf), jf.dof) if jf is not None else (min(map(rss, fits)), fits[0].dof - 1)
    q = float(stats.t.ppf(0.975, dof))
    se = lambda f: float(np.sqrt(_larger_cov(f, [f.names.index("alpha")])[0, 0]))  # noqa: E731
    ok = [f for f in fits if rss(f) - rss0 <= q * q * rss0 / dof and f.alpha - q * se(f) > 0]
    if not ok:
        raise ValueError("old rule: no accepted pair")
    best = min(ok, key=rss)
    cov = np.zeros((2, 2))
    cov[1, 1] = _larger_cov(best, [best.names.index("alpha")])[0, 0]
    return PinnedLaw(best.linf, best.alpha, cov, best.A, *span, dof, valley=tuple((f.linf, f.alpha) for f in ok)), \
        "valley"


def shapley_rows(a) -> dict[str, tuple[float, float, float, float, float, float]]:
    """{component: (est, lo, hi at C_ref, est, lo, hi at 10x C_ref)} of ln M_flop."""
    out = {}
    for f in FACTORS + ["TOTAL"]:
        vals = []
        for tab in (a.components, a.extrapolation):
            r = tab[(tab["response"] == "ln_M") & (tab["component"] == f)].iloc[0]
            vals += [float(r["shapley"]), float(r["shapley_lo"]), float(r["shapley_hi"])]
        out[f] = tuple(vals)
    return out


def one(case: str, i: int) -> dict:
    from marin_ablate.analysis.calibration.simulate import simulate_table
    from marin_ablate.analysis.fit.reflaw import fit_reference
    from marin_ablate.analysis.pipeline import analyze_table

    kind, n_seeds = CASES[case]
    t = truth(kind)
    rng = np.random.default_rng(10_000 * (1 + list(CASES).index(case)) + i)
    base = simulate_table(t, rungs=LADDER, seeds=n_seeds, rng=rng)
    base = base[base["arm"] == "---"]
    C, L, seeds = base["train_flops"], base["eval_macro_loss"], base["seed"]
    df = simulate_table(t, rungs=DESIGN_RUNGS, seeds=1, rng=np.random.default_rng(i))
    kw = dict(n_boot=0, boot_method="none", law_forms=("power",), replicates=False, responses=("quality",))
    c_ref = float(np.exp(np.mean(np.log(df["train_flops"].to_numpy(float)))))
    kw["target_compute"] = 10 * c_ref
    want = {f: 2 * MAIN[f] for f in FACTORS} | {"TOTAL": 2 * sum(MAIN.values())}
    rec = {"oracle": {"rows": shapley_rows(analyze_table(df, pin_linf=t.linf, pin_alpha=t.alpha, **kw))}}
    for name, build in (("new", lambda: (fit_reference(C, L, seeds=seeds), "")), ("old", lambda: old_reference(
            C, L, seeds))):
        try:
            law, branch = build()
        except ValueError:
            rec[name] = {"refused": True}
            continue
        lo, hi = law.ci("linf")
        alo, ahi = law.ci("alpha")
        rec[name] = {"branch": branch, "linf": lo <= t.linf <= hi, "alpha": alo <= t.alpha <= ahi,
                     "linf_w": hi - lo, "rows": shapley_rows(analyze_table(df, pinned_law=law, **kw))}
    rec["want"] = want
    return rec


def _rates(recs: list[dict], m: str) -> dict:
    got = [r for r in recs if not r[m].get("refused")]
    cov = {k: [] for k in ("ref", "10x")}
    ratio = {k: [] for k in ("comp_ref", "tot_ref", "comp_10x", "tot_10x")}
    tot10 = []
    for r in got:
        for f, v in r[m]["rows"].items():
            o, w = r["oracle"]["rows"][f], r["want"][f]
            cov["ref"].append(v[1] <= w <= v[2])
            cov["10x"].append(v[4] <= w <= v[5])
            key = "tot" if f == "TOTAL" else "comp"
            ratio[f"{key}_ref"].append((v[2] - v[1]) / (o[2] - o[1]))
            ratio[f"{key}_10x"].append((v[5] - v[4]) / (o[5] - o[4]))
            if f == "TOTAL":
                tot10.append(np.exp(v[5] - v[4]))
    law = m != "oracle"
    return {"got": got, "cov": cov, "ratio": ratio, "tot10": tot10,
            "linf": f"{sum(r[m]['linf'] for r in got)}/{len(got)}" if law else "exact",
            "alpha": f"{sum(r[m]['alpha'] for r in got)}/{len(got)}" if law else "exact",
            "linf_w": f"{np.median([r[m]['linf_w'] for r in got]):.3f}" if law else "0"}


def summarize(case: str, recs: list[dict]) -> list[str]:
    """The main table's rows of one case: every ladder."""
    out = []
    for m in ("old", "new", "oracle"):
        x = _rates(recs, m)
        ident = sum(r[m]["branch"] == "identified" for r in x["got"]) if m == "old" else None
        out.append("| " + " | ".join([
            case, m, f"{len(x['got'])}/{len(recs)}", "" if ident is None else f"{ident}", x["linf"], x["alpha"],
            x["linf_w"], f"{np.mean(x['cov']['ref']):.3f}", f"{np.mean(x['cov']['10x']):.3f}",
            *(f"{np.median(x['ratio'][k]):.2f}" for k in ("comp_ref", "tot_ref", "comp_10x", "tot_10x")),
            f"x{np.median(x['tot10']):.2f}"]) + " |")
    return out


def summarize_identified(case: str, recs: list[dict]) -> list[str]:
    """The second table's rows of one case: only the ladders the old rule pinned by its straight ellipse."""
    sub = [r for r in recs if not r["old"].get("refused") and r["old"]["branch"] == "identified"]
    if not sub:
        return []
    out = []
    for m in ("old", "new", "oracle"):
        x = _rates(sub, m)
        out.append("| " + " | ".join([
            case, m, f"{len(sub)}", x["linf"], f"{np.mean(x['cov']['ref']):.3f}", f"{np.mean(x['cov']['10x']):.3f}",
            *(f"{np.median(x['ratio'][k]):.2f}" for k in ("comp_ref", "tot_ref", "comp_10x")),
            f"{np.median(x['ratio']['tot_10x']):.2f} ({np.percentile(x['ratio']['tot_10x'], 90):.2f})",
            f"x{np.median(x['tot10']):.2f} (x{np.percentile(x['tot10'], 90):.3g})"]) + " |")
    return out


HEADER = ("| case | method | laws pinned | old: identified branch | L∞ covered | α covered | median L∞ CI width "
          "| Shapley covered at C_ref | at 10x | width / oracle: components at C_ref | TOTAL at C_ref "
          "| components at 10x | TOTAL at 10x | median TOTAL interval at 10x (hi/lo) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
HEADER_IDENTIFIED = ("| case | method | ladders | L∞ covered | Shapley covered at C_ref | at 10x | width / oracle: "
                     "components at C_ref | TOTAL at C_ref | components at 10x | TOTAL at 10x (90th pct) "
                     "| TOTAL interval at 10x (90th pct) |\n|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ladders", type=int, default=50)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"--cases {bad}; allowed values: {', '.join(CASES)}")
    import warnings

    warnings.filterwarnings("ignore")
    lines, ident = [HEADER], [HEADER_IDENTIFIED]
    for case in cases:
        t0 = time.time()
        recs = [one(case, i) for i in range(args.ladders)]
        lines += summarize(case, recs)
        ident += summarize_identified(case, recs)
        print(f"{case}: {args.ladders} ladders in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    print("\n".join(lines))
    print("\nOnly the ladders the old rule pinned by its straight ellipse (its identified branch); widths: median "
          "(90th percentile) over them:\n")
    print("\n".join(ident))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
