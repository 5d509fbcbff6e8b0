"""A `benchmarks/` script as a module, for the tests that keep a small seeded version of the rate it measures
(benchmarks/rates.py, benchmarks/coverage.py): one copy of each simulated study, run at two sizes."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@functools.cache
def bench(name: str):
    """benchmarks/<name>.py, imported once per test process (as module `bench_<name>`)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module while the file executes
    spec.loader.exec_module(mod)
    return mod
