"""Shared test setup. TRITON_INTERPRET must be set before any @triton.jit runs (CPU machines).

Tests live in one folder per package (tests/marin, tests/sweeps, tests/analysis, tests/ablations), plus
tests/integration (end-to-end: CLI, SLURM, multi-node, faults) and tests/repo (docs, layering, the
fidelity table). The folders are not packages, so a test file's basename must be unique across them;
the package is imported as installed, under its one name (`marin_ablate`, `pip install -e .`), and pyproject's
`pythonpath` puts this folder and each test folder on the path, so helpers (`ranks`, `pkgcopy`) and study
references such as "test_faults:sweep_study" import the same from any folder."""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
# One torch thread per test process, and (inherited through the environment) per rank, CLI run and SLURM
# job it starts: on the 2-core CI machine two threads per process oversubscribe the cores as soon as a
# second process runs (a CPU-rung step 7.9x slower measured; docs/testing.md). Set before torch is imported;
# a test about threads sets its own.
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _own_run_time_cache(tmp_path_factory, monkeypatch):
    """Run times recorded by a test's studies (planning/costmodel.py) go to its own cache, not the user's."""
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path_factory.mktemp("marin-cache")))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """A test that sets torch's thread count (train's `TrainConfig.threads`) leaves 1 for the next one."""
    yield
    torch = sys.modules.get("torch")  # never imported here for a test that does not use it
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


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


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, README's test command) the tests that share the one SLURM
    cluster run on one worker, one after another: the killed-node test takes a node down, and the array tests
    count what the queue holds. They go first: the longest unit of work starts while the other worker takes
    the rest, so neither waits on the other at the end."""
    slurm = [item for item in items if item.get_closest_marker("slurm") is not None]
    for item in slurm:
        item.add_marker(pytest.mark.xdist_group("slurm"))
    items[:] = slurm + [item for item in items if item.get_closest_marker("slurm") is None]
