"""The call path of `marin-ablate run` to its first training step (tests/repo/call_path.py defines the walk)."""

from __future__ import annotations

import pytest
from call_path import returns, run_smoke, stops


def test_stops_collapse_repeats_and_returns_count_modules_seen_before():
    path = ["a", "a", "b", "a", "c", "c", "b", "d"]
    assert stops(path) == ["a", "b", "a", "c", "b", "d"]
    assert returns(path) == 2 and returns(["a", "b", "c"]) == 0 and returns([]) == 0


@pytest.mark.slow
def test_run_reaches_its_first_step_through_a_spine_that_never_returns_to_a_module(tmp_path, monkeypatch):
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    spine, walk = run_smoke(tmp_path / "out")
    assert spine[0].function == "main" and spine[-1].function == "Trainer.train_step"
    assert returns([c.module for c in spine]) == 0
    # the reader's walk (spine + one level of side calls): 36 returns when first measured, 8 once each driver
    # made its calls out one module at a time and main.py handed each command its argv (docs/architecture.md
    # §1 "The call path"; the goal: under 15)
    assert returns([c.module for c in walk]) <= 8
