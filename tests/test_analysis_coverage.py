"""Reduced coverage study (the full one is benchmarks/coverage.py): every scenario of the rotation,
the 2-seed marin535 design, intervals cover the truth or the report flags them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np


def _coverage_module():
    spec = importlib.util.spec_from_file_location("coverage_bench", Path(__file__).parents[1] / "benchmarks" / "coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
