"""Time `analyze` on a 256-run results table: 2^6 factorial x 4 rungs x 1 seed.

Usage: OMP_NUM_THREADS=1 python benchmarks/analysis.py [--n-boot 200] [--repeats 3]
Prints one table row per stage (median wall seconds over repeats).
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args()

    from analysis.pipeline import analyze_table
    from analysis.report import write_report
    from analysis.results import collect
    from analysis.simulate import random_truth, simulate_table, write_study

    factors = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport"]
    rng = np.random.default_rng(0)
    df = simulate_table(random_truth(factors, rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9, "r3": 6.4e9}, seeds=1, rng=rng,
                        loss_curves=True)
    assert len(df) == 256
    tmp = Path(tempfile.mkdtemp(prefix="bench-analysis-"))
    write_study(df, tmp / "study")

    stages = {
        "collect 256 run dirs -> parquet": lambda: collect(tmp / "study"),
        "analyze_table, no bootstrap": lambda: analyze_table(df, n_boot=0, boot_method="none"),
        f"analyze_table, wild bootstrap B={args.n_boot}": lambda: analyze_table(df, n_boot=args.n_boot),
        "analyze_table, mixed model (seed)": lambda: analyze_table(df, n_boot=0, mixed=True),
    }
    a = analyze_table(df, n_boot=args.n_boot)
    stages["report.md + html + 7 figures"] = lambda: write_report(a, df, tmp / "report", title="bench")
    rows = []
    for name, fn in stages.items():
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        rows.append((name, statistics.median(ts), min(ts)))
    terms = len(a.fits["quality"].terms)
    print(f"\n256 runs, 6 factors, 4 rungs, 1 seed; {terms} candidate terms per response, 3 responses")
    print(f"| {'stage':<40} | {'median s':>9} | {'min s':>7} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 9}|")
    for name, med, mn in rows:
        print(f"| {name:<40} | {med:>9.3f} | {mn:>7.3f} |")


if __name__ == "__main__":
    main()
