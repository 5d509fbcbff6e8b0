"""The report shows only the columns that carry information for its design: leave-one-out and add-one-in where
some component can estimate them, the paired per-rung table's components and rungs that hold a same-rung pair;
what is left out is said once, with why (analysis/report/writer.py `informative`, `paired_section`)."""

from __future__ import annotations

import numpy as np

from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, study_design
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.report.tables import attribution_table, informative, paired_section

SEVEN = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer"]
RUNGS = {"r0": 1e8, "r1": 2e8, "r2": 4e8}


def _analysis(factors, design=None, seed=3):
    rng = np.random.default_rng(seed)
    t = simulate_table(random_truth(factors, rng), rungs=RUNGS, seeds=1, rng=rng, design=design)
    return analyze_table(t, n_boot=0, boot_method="none")


def test_the_smoke_fraction_leaves_out_loo_and_aoi_and_says_once_why():
    a = _analysis(SEVEN, study_design("smoke", SEVEN))
    full = attribution_table(a)
    assert full.loc[full["component"] != "TOTAL", "M_flop LOO"].eq("not estimable").all()  # what the issue saw
    tab, why = informative(full)
    assert "M_flop LOO" not in tab and "M_flop AOI" not in tab and "M_flop" in tab
    assert why.startswith("LOO and AOI are left out: not estimable for any component") and "alias" in why


def test_a_full_factorial_keeps_loo_and_aoi_and_says_nothing():
    a = _analysis(["xsa", "sconv", "optimizer"])
    tab, why = informative(attribution_table(a))
    assert why is None and "M_flop LOO" in tab and "M_flop AOI" in tab
    assert not tab.loc[tab["component"] != "TOTAL", "M_flop LOO"].eq("not estimable").any()


def test_the_smoke_fractions_paired_table_is_the_total_alone_and_names_the_seven_left_out():
    a = _analysis(SEVEN, study_design("smoke", SEVEN))
    head, _, table, _ = paired_section(a)  # only all-on against all-off differ in one contrast alone
    assert [ln.split(" | ")[0] for ln in table.splitlines()[2:]] == ["| TOTAL"]
    assert "no same-rung pair" not in table and all(r in table for r in RUNGS)
    assert f"Left out ({', '.join(SEVEN)}: no two arms of a rung differ in any one of them alone)" in head


def test_a_full_factorial_pairs_every_component_at_every_rung():
    a = _analysis(["xsa", "sconv", "optimizer"])
    lines = paired_section(a)
    assert "Left out" not in lines[0] and "no same-rung pair" not in lines[2]
    assert all(f"| {c} " in lines[2] for c in ["xsa", "sconv", "optimizer"])
    assert all(r in lines[2] for r in RUNGS)


def test_intervals_widened_by_three_seeds_drop_the_run_bootstrap_column_and_say_why():
    rng = np.random.default_rng(5)
    factors = ["xsa", "sconv", "optimizer"]
    t = simulate_table(random_truth(factors, rng), rungs=RUNGS, seeds=3, rng=rng)
    a = analyze_table(t, n_boot=50, boot_method="wild")
    full = attribution_table(a)
    assert full.attrs["seed_widened"] and "M_flop boot CI" in full
    tab, why = informative(full)
    assert "M_flop boot CI" not in tab and "M_flop LOO" in tab
    assert why.startswith("The bootstrap interval is left out here: it resamples runs")
    one = informative(attribution_table(_analysis(factors)))[0]  # one seed: nothing to carry, the column stays
    assert "M_flop boot CI" in one
