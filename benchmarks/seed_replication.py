"""Does the main job's answer survive a change of seed? The README's first command at K disjoint seed sets.

Usage:
  OMP_NUM_THREADS=1 python benchmarks/seed_replication.py [--sets 4] [--seeds-per-set 3] [--out runs/seed_replication]
      [--study smoke] [--rungs cpu_s32,cpu_s64,cpu_s128] [-- EXTRA RUN FLAGS]
  OMP_NUM_THREADS=1 python benchmarks/seed_replication.py --planted 40 [--planted-seeds 3]

Each set k runs `marin-ablate run STUDY --seeds <its seeds> --out OUT/set<k>` (its own LR profile per seed;
the reference ladder is cached once per machine, so every set shares it), then analyses the folder as
`marin-ablate analyze` does. It prints, per component and the TOTAL, each set's quality multiplier at C_ref
with its 95% interval and verdict, every pair of sets' |Δ ln M| against the combined half-width
√(h_a² + h_b²), and any gain/loss flip or intervals on opposite sides of 1 (analysis/calibration/replication.py);
the last line says whether the answer replicates (≥ 95% of pairs within, no flip, no opposite sides).
Seeds are disjoint: set k holds seeds first + k·m .. first + k·m + m − 1. Finished runs are reused, so an
interrupted benchmark resumes; `--analyze-only` re-reads the sets' folders. Extra flags after `--` go to
every `run` (e.g. `-- --train.steps=8` for a quick check of the script; the numbers then mean nothing).

`--planted N`: no training. N simulated studies of the smoke design (16 arms, 3 rungs) with a planted
component x seed variation (heterogeneous: the optimizer's per-seed sd 0.33 in ln M, sconv's 0.10, the
others 0.05, what the single-seed runs showed), each analysed three ways: one seed (the old default),
all seeds with the run-residual interval only, and all seeds with the between-seed interval (the
default); prints each way's coverage of the mean effect per component.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

#: Per-seed sd of each component's ln M in --planted mode: the single-seed smoke runs' optimizer and sconv
SEED_EFFECT_SD = {"optimizer": 0.33, "sconv": 0.10}
OTHER_SD = 0.05


def set_seeds(k: int, m: int, first: int) -> list[int]:
    return list(range(first + k * m, first + (k + 1) * m))


def run_set(study: str, seeds: list[int], out: Path, rungs: str | None, extra: list[str]) -> dict:
    """`marin-ablate run` of one seed set; its wall and CPU seconds (children included)."""
    cmd = [sys.executable, "-m", "marin_ablate", "run", study, "--seeds", ",".join(map(str, seeds)),
           "--out", str(out), "--no-analyze", *(["--rungs", rungs] if rungs else []), *extra]
    t0, c0 = time.time(), os.times()
    rc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode
    c1 = os.times()
    return {"rc": rc, "wall_s": time.time() - t0,
            "cpu_s": (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)}


def analyse_set(study_dir: Path, name: str) -> list[dict]:
    from marin_ablate.analysis.calibration.replication import findings_rows
    from marin_ablate.analysis.study_folder import AnalysisOptions, analysis_of

    a, _ = analysis_of(study_dir, AnalysisOptions(no_figures=True))
    return findings_rows(a, name)


def print_tables(sets: pd.DataFrame) -> dict:
    from marin_ablate.analysis.calibration.replication import pairs, replicates, summary, variance_test, verdict_counts

    def mult(r) -> str:
        if not np.isfinite(r["est"]):
            return "not estimable"
        iv = f" [{np.exp(r['lo']):.3f}, {np.exp(r['hi']):.3f}]" if np.isfinite(r["lo"]) else ""
        return f"{np.exp(r['est']):.3f}{iv} {r['verdict']}"

    wide = sets.assign(cell=sets.apply(mult, axis=1)).pivot(index="component", columns="set", values="cell")
    wide = wide.reindex(list(dict.fromkeys(sets["component"])))
    seeds = dict(zip(sets["set"], sets["seeds"], strict=False))
    wide.columns = [f"{c} (seeds {seeds[c]})" for c in wide.columns]
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 40):
        print("\nquality M_flop at C_ref, 95% interval, verdict, per seed set:")
        print(wide.to_string())
        p = pairs(sets)
        print("\nevery pair: |Δ ln M| / combined half-width (> 1: outside), flips, opposite sides:")
        print(p.assign(ratio=p["ratio"].round(2), diff=p["diff"].round(3),
                       combined_half_width=p["combined_half_width"].round(3)).to_string(index=False))
        s = summary(p)
        print("\nper component:")
        print(s.to_string(index=False))
    v = variance_test(sets)
    print("\nvariance test of the set means against the spread their intervals imply (Cochran's Q per component):")
    print(pd.DataFrame(v["per_component"]).T.round(3).to_string())
    print(f"  {v['why']}")
    counts = verdict_counts(sets)
    print("components (and TOTAL) carrying a gain or loss verdict, per set: "
          + ", ".join(f"{k} {n}" for k, n in counts.items()))
    ok, why = replicates(p, v)
    print(f"\n{'REPLICATES' if ok else 'DOES NOT REPLICATE'}: {why}")
    return {"replicates": ok, "why": why, "summary": s.to_dict("records"), "pairs": p.to_dict("records"),
            "variance": {k: val for k, val in v.items() if k != "per_component"}, "verdicts": counts}


FACTORS = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer"]
KW = dict(n_boot=0, boot_method="none", law_forms=("power",), responses=("quality",))


def _truth(rng, main_sd: float = 0.08, zero: tuple[str, ...] = ()):
    """A planted truth; the `zero` components have no effect at any compute (no main effect, no trend)."""
    from marin_ablate.analysis.calibration.simulate import SimTruth

    sd = {f: SEED_EFFECT_SD.get(f, OTHER_SD) for f in FACTORS}
    main = {f: 0.0 if f in zero else float(rng.normal(0, main_sd)) for f in FACTORS}
    scale = {f: 0.0 if f in zero else float(rng.normal(0, 0.03)) for f in FACTORS}  # each one's trend with compute
    return SimTruth(FACTORS, main=main, scale=scale, linf=2.0, A=60.0, alpha=0.15, c_ref=3e12, noise_sd=0.004,
                    seed_sd=0.01, flops_per_token=6 * 2.4e5, seed_effect_sd=sd), sd


def _rungs(names: list[str]) -> dict[str, float]:
    return {r: float(r.removeprefix("cpu_s")) * 1024.0 for r in names}


def _covers(t, a, target: float) -> dict[str, bool]:
    """Per value (component or TOTAL) and place (C_ref, each rung, the 10x target): does its interval hold the
    mean effect over seeds?"""
    out = {}
    for where, comp, c in [("C_ref", a.components, a.c_ref), ("@10x", a.extrapolation, target)]:
        tr = t.shapley(c)
        tr["TOTAL"] = sum(tr.values())
        for r in comp.itertuples():
            out[(r.component, where)] = bool(r.shapley_lo <= tr[r.component] <= r.shapley_hi)
    for r in a.per_rung.itertuples():
        tr = t.shapley(r.compute)
        tr["TOTAL"] = sum(tr.values())
        out[(r.component, f"rung {r.rung}")] = bool(r.lo <= tr[r.component] <= r.hi)
    return out


def planted(n: int, n_seeds: int, seed: int, rungs: list[str]) -> pd.DataFrame:
    """Coverage of the mean effect per component over n simulated smoke studies of the default design (16 arms,
    `rungs`, n_seeds seeds, the law pinned as the smoke study pins it) with planted component x seed variation
    (module docstring): at C_ref with one seed (the old default) and with every seed, per rung, and at 10x the
    top rung."""
    from marin_ablate.analysis.calibration.simulate import simulate_table, study_design
    from marin_ablate.analysis.pipeline import analyze_table

    design = study_design("smoke", FACTORS)
    rng = np.random.default_rng(seed)
    hits: dict = {}
    t0 = time.time()
    for i in range(n):
        t, sd = _truth(rng)
        df = simulate_table(t, rungs=_rungs(rungs), seeds=n_seeds, design=design, rng=rng)
        pins = dict(pin_linf=t.linf, pin_alpha=t.alpha)  # as the smoke study pins its law from a ladder
        target = 10 * float(df["train_flops"].max())
        a = analyze_table(df, target_compute=target, force_extrapolation=True, **pins, **KW)
        one = analyze_table(df[df["seed"] == 0], replicates=False, **pins, **KW)
        tr = t.shapley(one.c_ref)
        tr["TOTAL"] = sum(tr.values())
        for r in one.components.itertuples():
            hits.setdefault((r.component, "C_ref, one seed"), []).append(bool(r.shapley_lo <= tr[r.component]
                                                                             <= r.shapley_hi))
        for k, v in _covers(t, a, target).items():
            hits.setdefault(k, []).append(v)
        print(f"  study {i + 1}/{n} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    tab = pd.Series({k: float(np.mean(v)) for k, v in hits.items()}).unstack()
    tab = tab.reindex(index=[*FACTORS, "TOTAL"])
    tab.insert(0, "planted sd", [sd.get(c, np.sqrt(sum(x * x for x in sd.values()))) for c in tab.index])
    return tab


def stopping(n: int, n0: int, n_max: int, target: float, seed: int, rungs: list[str]) -> pd.DataFrame:
    """Coverage at C_ref of studies stopped three ways, each over the same simulated seeds (the first N of n_max):
    Stein's two-stage rule as `run --until` runs it (pilot n0, every component and the TOTAL named), a naive
    width rule (add a seed until each value's own interval is no wider than `target`) and a significance rule (add
    a seed until each value's interval excludes 1). Components planted with no effect at any compute (xsa, qk_norm)
    show what stopping on significance does. Also the mean seeds each rule ran.

    The interval at each seed count is the analysis's own: the pooled fit's estimate with `between_seed_interval`
    over the seeds' lone analyses, as `analyze_table` builds it; a seed's lone analysis does not change as seeds
    are added, so each is made once (checked equal to the full `analyze_table` on every study's pilot)."""
    from marin_ablate.analysis.calibration.simulate import simulate_table, study_design
    from marin_ablate.analysis.fit.replicates import Stein, between_seed_interval
    from marin_ablate.analysis.fit.stopping import Until, stein_plan
    from marin_ablate.analysis.pipeline import analyze_table

    design = study_design("smoke", FACTORS)
    rng = np.random.default_rng(seed)
    hits: dict = {}
    used: dict = {}
    t0 = time.time()
    for i in range(n):
        t, _ = _truth(rng, zero=("xsa", "qk_norm"))
        df = simulate_table(t, rungs=_rungs(rungs), seeds=n_max, design=design, rng=rng)
        pins = dict(pin_linf=t.linf, pin_alpha=t.alpha)
        alone = {s: analyze_table(df[df["seed"] == s], replicates=False, force_extrapolation=True, **pins, **KW)
                 for s in range(n_max)}
        first = {}  # per value: (lo, hi, seeds) at the first N each naive rule stops, else at n_max
        tr = None
        for k in range(n0, n_max + 1):
            pooled = analyze_table(df[df["seed"] < k], replicates=False, **pins, **KW)
            comps = between_seed_interval(pooled.components, {s: alone[s] for s in range(k)})
            if k == n0:  # the shortcut is the analysis: the pilot's intervals equal the full analyze_table's
                full = analyze_table(df[df["seed"] < k], **pins, **KW).components
                assert np.allclose(full[["shapley_lo", "shapley_hi"]], comps[["shapley_lo", "shapley_hi"]],
                                   rtol=0, atol=1e-9), "the stopping benchmark's intervals left the analysis's"
                c = comps.set_index("component")
                est = {x: [alone[s].components.set_index("component").loc[x, "shapley"] for s in range(k)]
                       for x in c.index}
                law = {x: float(c.loc[x, "shapley_se_law"]) for x in c.index}
                plan = stein_plan(tuple(range(n0)), est, law, Until(target, max_seeds=n_max))
            tr = t.shapley(pooled.c_ref)
            tr["TOTAL"] = sum(tr.values())
            for x, r in comps.set_index("component").iterrows():
                for rule, stop in (("width", (r.shapley_hi - r.shapley_lo) / 2 <= target),
                                   ("significance", r.shapley_lo > 0 or r.shapley_hi < 0)):
                    if (rule, x) not in first and (stop or k == n_max):
                        first[(rule, x)] = (r.shapley_lo, r.shapley_hi, k, tr[x])
        s = analyze_table(df[df["seed"] < plan.seeds], stein=Stein(tuple(range(n0))), **pins, **KW)
        tr = t.shapley(s.c_ref)
        tr["TOTAL"] = sum(tr.values())
        for x, r in s.components.set_index("component").iterrows():
            first[("stein", x)] = (r.shapley_lo, r.shapley_hi, plan.seeds, tr[x])
        for (rule, x), (lo, hi, k, truth) in first.items():
            hits.setdefault((x, rule), []).append(bool(lo <= truth <= hi))
            used.setdefault(rule, []).append(k)
        print(f"  study {i + 1}/{n} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    tab = pd.Series({k: float(np.mean(v)) for k, v in hits.items()}).unstack()[["stein", "width", "significance"]]
    tab = tab.reindex(index=[*FACTORS, "TOTAL"])
    tab.loc["mean seeds run"] = [float(np.mean(used[r])) for r in tab.columns]
    return tab


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--seeds-per-set", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--study", default="smoke")
    ap.add_argument("--rungs", default=None, help="comma-separated rungs (default: the study's)")
    ap.add_argument("--out", default="runs/seed_replication")
    ap.add_argument("--analyze-only", action="store_true", help="analyse the sets' folders, run nothing")
    ap.add_argument("--planted", type=int, default=0, metavar="N", help="simulated studies instead of training")
    ap.add_argument("--planted-seeds", type=int, default=8)
    ap.add_argument("--planted-rungs", default="cpu_s32,cpu_s64")
    ap.add_argument("--stopping", type=int, default=0, metavar="N",
                    help="simulated studies stopped three ways (Stein's --until, naive width, significance)")
    ap.add_argument("--pilot", type=int, default=4, help="--stopping: the pilot's seeds")
    ap.add_argument("--max-seeds", type=int, default=24, help="--stopping: seeds at most")
    ap.add_argument("--target", type=float, default=0.2, help="--stopping: the half-width asked for (ln M)")
    ap.add_argument("--rng-seed", type=int, default=0, help="--stopping: the simulation's random seed")
    ap.add_argument("--json", default=None, help="write the tables here")
    args, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    if args.sets < 2 and not args.planted:
        ap.error(f"--sets {args.sets}: allowed values: 2 or more (pairs of seed sets are compared)")
    if args.seeds_per_set < 1 or args.planted_seeds < 2:
        ap.error("--seeds-per-set: allowed values >= 1; --planted-seeds: allowed values >= 2")
    if args.planted or args.stopping:
        rungs = args.planted_rungs.split(",")
        if args.planted:
            tab = planted(args.planted, args.planted_seeds, 0, rungs)
            what = (f"coverage of the mean effect over {args.planted} simulated smoke studies ({args.planted_seeds} "
                    f"seeds x {', '.join(rungs)}; planted component x seed sd in ln M)")
        else:
            tab = stopping(args.stopping, args.pilot, args.max_seeds, args.target, args.rng_seed, rungs)
            what = (f"coverage at C_ref over {args.stopping} simulated smoke studies stopped three ways (pilot "
                    f"{args.pilot} seeds, at most {args.max_seeds}, target half-width {args.target})")
        print(f"\n{what}:")
        print(tab.round(3).to_string())
        if args.json:
            Path(args.json).write_text(json.dumps(tab.to_dict(), indent=1))
        return 0
    from marin_ablate.sweeps.sweep import resolve_study

    name = resolve_study(args.study).name  # the study folder's name (a path:attribute study names its own)
    out = Path(args.out)
    rows, cost = [], []
    for k in range(args.sets):
        seeds = set_seeds(k, args.seeds_per_set, args.first_seed)
        d = out / f"set{k}"
        if not args.analyze_only:
            c = run_set(args.study, seeds, d, args.rungs, extra)
            cost.append({"set": f"set{k}", "seeds": seeds, **c})
            print(f"set{k} seeds {seeds}: rc {c['rc']}, {c['wall_s']:.0f} s wall, {c['cpu_s']:.0f} s CPU", flush=True)
        rows += analyse_set(d / name, f"set{k}")
    res = print_tables(pd.DataFrame(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"cost": cost, **res, "sets": rows}, indent=1, default=str))
    return 0 if res["replicates"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
