"""A table's analysis is bounded (analysis/table_shape.py `JOINT_COST_MAX`, analysis/fit/replicates.py
`REPLICATE_SEEDS_MAX`): a table whose joint fit would cost more than rows × seeds² = 5e7 is refused before any
fit, in one line naming how many seeds its rows allow, and without planted truths at most 32 seeds are analysed
alone (a 20,000-row table of 1,000 seeds ran past 27 min, of 250 seeds past 30 min)."""

from __future__ import annotations

import itertools

import pandas as pd

from marin_ablate.analysis.fit.replicates import REPLICATE_SEEDS_MAX, per_seed_analyses
from marin_ablate.analysis.table_shape import JOINT_COST_MAX
from marin_ablate.cli.main import main


def test_a_table_whose_joint_fit_costs_beyond_the_bound_is_refused_before_any_fit(tmp_path, capsys):
    n = 300  # 6 rows per seed: 1,800 rows x 300² = 1.6e8 > 5e7
    rows = [{"arm": f"a{x}", "rung": r, "seed": seed, "xsa": ("none", "xsa")[x], "flops": c,
             "loss": 3.0 + 100 * c ** -0.2 - 0.02 * x + 1e-4 * (seed % 7)}
            for (r, c), seed, x in itertools.product((("s1", 1e15), ("s2", 4e15), ("s3", 1.6e16)), range(n), (0, 1))]
    pd.DataFrame(rows).to_csv(tmp_path / "many.csv", index=False)
    assert main(["analyze", str(tmp_path / "many.csv"), "--report-dir", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    most = int((JOINT_COST_MAX / 1800) ** 0.5)
    assert err == [f"marin-ablate analyze: error: 1,800 completed runs of 300 seeds: the joint law fit carries one "
                   "loss shift per seed and costs about rows × seeds² = 1.6e+08 per step, beyond 5e+07 (hours); "
                   f"allowed values: at most {most} seeds for 1,800 runs (split the table by seed, or average each "
                   "arm, rung and seed group into one row first)"]
    assert most == 166 and not (tmp_path / "rep").exists()


def test_without_planted_truths_the_first_32_seeds_are_analysed_alone():
    df = pd.DataFrame({"seed": [s for s in range(40, 0, -1) for _ in range(2)]})
    seen: list[int] = []
    out = per_seed_analyses(df, lambda sub: seen.append(int(sub["seed"].iloc[0])) or "ok", REPLICATE_SEEDS_MAX)
    assert seen == list(range(1, 33)) and list(out) == seen  # the first 32 by number, each once
    assert len(per_seed_analyses(df, lambda sub: "ok")) == 40  # planted truths: every seed (no limit)
