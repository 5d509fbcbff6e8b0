"""Time `analyze` on a results table of 256 x seeds runs: 2^6 factorial x 4 rungs x seeds.

Usage: OMP_NUM_THREADS=1 python benchmarks/analysis.py [--n-boot 200] [--repeats 3] [--seeds 1]
       [--analysis-only]
Prints one table row per stage (median wall seconds and process CPU seconds over repeats) and the
load average (`os.getloadavg`) before and after: the machine may be shared, and CPU seconds stay
comparable where wall seconds do not. With three or more seeds each seed is also analysed alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# This file is named like the package it times: keep its own directory off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=1, help="runs = 256 x seeds")
    ap.add_argument("--analysis-only", action="store_true", help="only the two analyze_table stages")
    args = ap.parse_args()
    if args.seeds < 1 or args.repeats < 1 or args.n_boot < 0:
        raise SystemExit("--seeds and --repeats must be >= 1, --n-boot >= 0")
    load0 = os.getloadavg()

    from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, write_study
    from marin_ablate.analysis.io.results import collect
    from marin_ablate.analysis.pipeline import analyze_table
    from marin_ablate.analysis.report.writer import write_report

    factors = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport"]
    rng = np.random.default_rng(0)
    df = simulate_table(random_truth(factors, rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9, "r3": 6.4e9},
                        seeds=args.seeds, rng=rng, loss_curves=True)
    n = len(df)
    assert n == 256 * args.seeds
    tmp = Path(tempfile.mkdtemp(prefix="bench-analysis-"))
    stages = {
        "analyze_table, no bootstrap": lambda: analyze_table(df, n_boot=0, boot_method="none"),
        f"analyze_table, wild bootstrap B={args.n_boot}": lambda: analyze_table(df, n_boot=args.n_boot),
    }
    if not args.analysis_only:
        write_study(df, tmp / "study")
        stages = {f"collect {n} run dirs -> parquet": lambda: collect(tmp / "study"), **stages,
                  "analyze_table, mixed model (seed)": lambda: analyze_table(df, n_boot=0, mixed=True)}
        a = analyze_table(df, n_boot=args.n_boot)
        stages["report.md + html + 7 figures"] = lambda: write_report(a, df, tmp / "report", title="bench")
    rows = []
    for name, fn in stages.items():
        ts, cs = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            res = fn()
            ts.append(time.perf_counter() - t0)
            cs.append(time.process_time() - c0)
        rows.append((name, statistics.median(ts), min(ts), statistics.median(cs)))
        if name.startswith("analyze_table"):
            last = res
    terms = len(last.fits["quality"].terms)
    load1 = os.getloadavg()
    print(f"\n{n} runs, 6 factors, 4 rungs, {args.seeds} seed(s); {terms} candidate terms per response, 3 responses; "
          f"load average {load0[0]:.1f} before, {load1[0]:.1f} after ({os.cpu_count()} CPUs)")
    print(f"| {'stage':<40} | {'median s':>9} | {'min s':>7} | {'CPU s':>7} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 9}|{'-' * 9}|")
    for name, med, mn, cpu in rows:
        print(f"| {name:<40} | {med:>9.3f} | {mn:>7.3f} | {cpu:>7.3f} |")


if __name__ == "__main__":
    main()
