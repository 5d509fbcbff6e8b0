"""How long a command takes to parse its line and refuse nothing: `marin-ablate COMMAND ... --help` and a `plan STUDY
--json` in a fresh process, for the installed package ("now") and each `--tree LABEL=PYTHONPATH` (e.g. a `git
worktree` of an older commit: its root), interleaved round by round so that a loaded machine slows every tree alike.

Usage: OMP_NUM_THREADS=1 python benchmarks/cli_start.py [--rounds 7] [--tree LABEL=PYTHONPATH ...]
Prints per tree and command the median wall seconds and its ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINES = {
    "--help": ["--help"],
    "run --help": ["run", "--help"],
    "analyze --help": ["analyze", "--help"],
    "plan smoke --json": ["plan", "smoke", "--json", "--rungs", "cpu_s32", "--train.steps=4"],
}
# the entry point of either layout: marin_ablate/cli/main.py now, marin_ablate/main.py before the CLI moved
ENTRY = "import importlib, sys\nsys.exit(importlib.import_module(sys.argv[1]).main(sys.argv[2:]))"


def once(argv: list[str], pythonpath: str | None, cwd: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    old = pythonpath and not (Path(pythonpath) / "marin_ablate" / "cli").is_dir()
    entry = "marin_ablate.main" if old else "marin_ablate.cli.main"
    r = subprocess.run([sys.executable, "-c", ENTRY, entry, *argv], env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        where = pythonpath or "the installed package"
        raise SystemExit(f"{argv} under {where}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PYTHONPATH")
    args = ap.parse_args()
    trees = [("now", None)] + [tuple(t.split("=", 1)) for t in args.tree]
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as cwd:  # not the checkout: its folders must not shadow a tree
        Path(cwd, "cache").mkdir()
        os.environ["MARIN_CACHE_DIR"] = str(Path(cwd, "cache"))
        for _ in range(args.rounds):
            for cmd, argv in LINES.items():
                for label, pp in trees:
                    times.setdefault((label, cmd), []).append(once(argv, pp, cwd))
    print(f"{'command':<22}" + "".join(f"{label:>14}" for label, _ in trees) + "   ratio to " + trees[0][0])
    for cmd in LINES:
        med = [statistics.median(times[(label, cmd)]) for label, _ in trees]
        print(f"{cmd:<22}" + "".join(f"{m:>13.3f}s" for m in med) + "   "
              + " ".join(f"{m / med[0]:.2f}" for m in med[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
