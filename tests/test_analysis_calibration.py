"""The calibration study's planted levels: its design and the exact waste check.

"Waste" is the same training with twice the FLOPs counted: identical losses at 2x C. Crossed with
every other arm, the joint law fit must give it M_flop = 0.5 exactly (to optimiser tolerance),
whatever the other factors and the law do. The waste factor reaches the analysis as any factor
does: a column and its coding in the runs' metadata.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis.pipeline import analyze_table
from analysis.simulate import random_truth, simulate_table


def _waste_table(seed: int):
    rng = np.random.default_rng(seed)
    truth = random_truth(["xsa", "qk_norm", "optimizer"], rng, scale_sd=0.04, inter_sd=0.05)
    truth.flops_extra = {}
    base = simulate_table(truth, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8}, seeds=1, fraction=0, rng=rng)
    coding = {**json.loads(base["coding"].iloc[0]),
              "waste": {"field": "train.flops_multiplier", "low": "off", "high": "on"}}
    base["coding"] = json.dumps(coding)
    base["waste"] = "off"
    twin = base.copy()
    twin["waste"] = "on"  # same losses, FLOPs counted twice
    twin["train_flops"] = 2 * base["train_flops"]
    twin["model_flops_per_s"] = 2 * base["model_flops_per_s"]
    twin["run_id"] = base["run_id"] + "w"
    return pd.concat([base, twin], ignore_index=True)


def test_waste_level_recovers_m_flop_one_half_exactly():
    for seed in (0, 1):
        a = analyze_table(_waste_table(seed), n_boot=0, boot_method="none")
        c = a.components.set_index(["response", "component"])
        assert abs(c.loc[("ln_M", "waste"), "shapley"] - np.log(0.5)) < 1e-6, c.loc[("ln_M", "waste")]
        assert abs(c.loc[("ln_R", "waste"), "shapley"] - np.log(2.0)) < 1e-9
        assert abs(c.loc[("ln_W", "waste"), "shapley"]) < 1e-6  # same wall-clock to the same loss


def test_calibration_study_crosses_waste_with_every_arm():
    from ablations.studies import get_study

    st = get_study("calibration")
    names = [f.name for f in st.factors]
    M = np.asarray(st.design.matrix)
    w = names.index("waste")
    others = {tuple(np.delete(r, w)) for r in M if r[w] > 0}
    assert others == {tuple(np.delete(r, w)) for r in M if r[w] < 0}  # every waste run has its twin
    specs = [s for s, _ in st.runs(rungs=["cpu_s32"])]
    on = [s for s in specs if s.train.flops_multiplier == 2.0]
    assert len(on) == 8 and all(s.train.effective().steps in (32, 64) for s in specs)
    assert {s.train.effective().steps for s in specs if s.train.token_multiplier == 2} == {64}
