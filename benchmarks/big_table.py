"""Time `marin-ablate analyze FILE` on a large imported table analysed in place: ROWS rows of a 2x2 factorial
(xsa, sconv) over RUNGS rungs and ROWS / (4 x RUNGS) seeds, as a separate process per package tree, so the
peak memory is the command's own.

Usage: OMP_NUM_THREADS=1 python benchmarks/big_table.py [--rows 20000] [--rungs 5] [--n-boot 200]
       [--tree LABEL=PYTHONPATH ...] [--timeout 1800]
`--tree` adds a package tree to compare (e.g. a `git worktree` of main: its root is the PYTHONPATH entry); the
installed package is always measured as "now". Prints one row per tree: exit code, wall and CPU seconds
(the child's user + system), peak RSS, the load average before and after (the machine may be shared: CPU
seconds stay comparable where wall seconds do not), and the command's last stderr line.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd


def table(rows: int, rungs: int, seed: int = 0) -> pd.DataFrame:
    """The planted table: ln M of xsa 0.02, of sconv 0.01, noise sd 0.003 on every loss."""
    rng = np.random.default_rng(seed)
    seeds = max(1, rows // (4 * rungs))
    out = []
    for r, s in itertools.product(range(rungs), range(seeds)):
        c = 1e15 * 2.0 ** r
        for x, y in itertools.product((0, 1), (0, 1)):
            out.append({"arm": f"a{x}{y}", "rung": f"s{r}", "seed": s, "xsa": ("none", "xsa")[x],
                        "sconv": ("none", "short_conv")[y], "flops": c,
                        "loss": 3.0 + 100 * c ** -0.2 - 0.02 * x - 0.01 * y + rng.normal(0, 0.003)})
    return pd.DataFrame(out)


def measure(path: Path, pythonpath: str | None, n_boot: int, timeout: int, out: Path) -> dict:
    """One `analyze` process: its own CPU seconds and peak RSS (os.wait4 on that child alone)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, "-m", "marin_ablate", "analyze", str(path), "--no-figures", "--n-boot",
                              str(n_boot), "--report-dir", str(out)], stdout=subprocess.DEVNULL, stderr=err, env=env,
                             cwd=out.parent)
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        _, status, ru = os.wait4(p.pid, 0)
        killer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        last = (err.read().strip().splitlines() or [""])[-1]
    wall = time.perf_counter() - t0
    rc = p.returncode if p.returncode >= 0 else f"killed at {timeout} s"
    return {"rc": rc, "wall_s": round(wall, 1), "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
            "peak_MB": round(ru.ru_maxrss / 1024), "load": f"{load0:.1f}->{os.getloadavg()[0]:.1f}",
            "last line": last[:150]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rungs", type=int, default=5)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PYTHONPATH")
    ap.add_argument("--timeout", type=int, default=1800)
    args = ap.parse_args()
    trees = [("now", None)] + [tuple(t.split("=", 1)) for t in args.tree]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.csv"
        df = table(args.rows, args.rungs)
        df.to_csv(path, index=False)
        print(f"{len(df):,} rows, {df['seed'].nunique():,} seeds, {args.rungs} rungs, --n-boot {args.n_boot}")
        rows = []
        for label, pp in trees:
            rows.append({"tree": label, **measure(path, pp, args.n_boot, args.timeout, Path(tmp) / f"rep-{label}")})
        print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
