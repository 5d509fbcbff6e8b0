"""Shared test setup. TRITON_INTERPRET must be set before any @triton.jit runs (CPU machines).

Tests live in one folder per package (tests/marin, tests/sweeps, tests/analysis, tests/ablations), plus
tests/integration (end-to-end: CLI, SLURM, multi-node, faults) and tests/repo (docs, layering, the
fidelity table). The folders are not packages, so a test file's basename must be unique across them;
the package is imported as installed, under its one name (`marin_ablate`, `pip install -e .`), and pyproject's
`pythonpath` puts this folder and each test folder on the path, so helpers (`ranks`, `checkout`) and study
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


#: The files of the tests that share the one SLURM cluster (`slurm` marker): the killed-node test takes a node
#: down, and the array tests count what the queue holds, so one xdist worker runs them one after another.
SLURM_FILES = ("test_slurm.py", "test_slurm_nodes.py")


def _on_the_cluster(nodeid: str) -> bool:
    return nodeid.split("::")[0].rsplit("/", 1)[-1] in SLURM_FILES


def pytest_collection_modifyitems(config, items):
    """The SLURM tests go first: the longest unit of work starts while the other workers take the rest, so
    none waits on it at the end. A `slurm` marker outside SLURM_FILES, or a test there without it, fails: the
    scheduler below sees node ids only, and a SLURM test it put on another worker would share the cluster."""
    for item in items:
        if (item.get_closest_marker("slurm") is not None) != _on_the_cluster(item.nodeid):
            item.stash[_STRAY] = (f"the `slurm` marker and the SLURM files ({', '.join(SLURM_FILES)}) disagree on "
                                  f"{item.nodeid}; allowed: every test of those files marked `slurm`, no other")
    items[:] = [i for i in items if _on_the_cluster(i.nodeid)] + [i for i in items if not _on_the_cluster(i.nodeid)]


_STRAY = pytest.StashKey[str]()


def pytest_runtest_setup(item):
    if _STRAY in item.stash:
        pytest.fail(item.stash[_STRAY], pytrace=False)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (README's slow stage): each test its own unit of work, except the SLURM tests, one
    unit on one worker. Ours, not xdist's: xdist 3.8 groups by rewriting node ids, which pytest 9.2 ignores
    (every test ran ungrouped; docs/testing.md, "Parallel runs")."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlurmOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "slurm" if _on_the_cluster(nodeid) else nodeid

    return SlurmOnOneWorker(config, log)
