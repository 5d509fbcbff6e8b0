"""Reduced coverage study (the full one is benchmarks/coverage.py): every scenario of the rotation,
the 2-seed marin535 design, intervals cover the truth or the report flags them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

# Multi-process training, torch.compile, simulated studies or real SLURM jobs (minutes on 2 cores) are marked
# `slow` one by one: the development loop (`python -m pytest -m "not slow"`) keeps the fast checks of this file.


def _coverage_module():
    spec = importlib.util.spec_from_file_location("coverage_bench",
                                                  Path(__file__).parents[2] / "benchmarks" / "coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_intervals_cover_or_are_flagged_across_all_scenarios():
    cov = _coverage_module()
    agg: dict[str, list] = {}
    for i in range(len(cov.SCENARIOS) * 2):
        for k, v in cov.one("m2", i).items():
            agg.setdefault(k, []).extend(v)
    ok = {k: np.mean([b for _, b in v]) for k, v in agg.items()}
    for k in ("component M_flop", "TOTAL M_flop", "TOTAL R", "per rung M_flop", "10x extrapolation M_flop",
              "law linf", "law alpha"):
        assert ok[k] >= 0.85, (k, ok[k])


def test_throughput_truth_is_the_shapley_value_of_the_simulated_ln_r():
    """The benchmark's truth for a component's R, against Shapley's formula enumerated over every
    coalition of the simulator's own ln R (an all-on-only effect included): efficiency and each value."""
    import itertools
    from math import factorial

    from marin_ablate.analysis.calibration.simulate import random_truth

    factors = ["a", "b", "c", "d"]
    truth = random_truth(factors, np.random.default_rng(3))
    truth.throughput_allon = -0.2
    k = len(factors)

    def v(on: set) -> float:  # ln R of the arm with `on` at +1, the rest at -1 (as simulate_table builds it)
        x = {f: 1.0 if f in on else -1.0 for f in factors}
        return sum(truth.throughput.get(f, 0.0) * (x[f] + 1) for f in factors) + truth.throughput_allon * (len(on) == k)

    eff = truth.throughput_effect()
    for f in factors:
        rest = [g for g in factors if g != f]
        phi = sum(factorial(len(S)) * factorial(k - len(S) - 1) / factorial(k) * (v(set(S) | {f}) - v(set(S)))
                  for n in range(k) for S in itertools.combinations(rest, n))
        assert abs(eff[f] - phi) < 1e-12, (f, eff[f], phi)
    assert abs(sum(eff.values()) - truth.throughput_total()) < 1e-12
