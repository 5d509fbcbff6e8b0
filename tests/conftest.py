"""Shared test setup. TRITON_INTERPRET must be set before any @triton.jit runs (CPU machines).

Tests live in one folder per package (tests/marin, tests/sweeps, tests/analysis, tests/ablations), plus
tests/integration (end-to-end: CLI, SLURM, multi-node, faults) and tests/repo (docs, layering, the
fidelity table). The folders are not packages, so a test file's basename must be unique across them;
the package is imported as installed, under its one name (`marin_ablate`, `pip install -e .`), and pyproject's
`pythonpath` puts this folder and each test folder on the path, so helpers (`ranks`, `pkgcopy`) and study
references such as "test_faults:sweep_study" import the same from any folder."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _own_run_time_cache(tmp_path_factory, monkeypatch):
    """Run times recorded by a test's studies (planning/costmodel.py) go to its own cache, not the user's."""
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path_factory.mktemp("marin-cache")))


@pytest.fixture(autouse=True)
def _seed_everything():
    """Every test starts from the same RNG state, so failures reproduce."""
    import random

    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(0)
    except ImportError:
        pass
    yield
