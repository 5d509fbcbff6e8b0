"""Shared test setup. TRITON_INTERPRET must be set before any @triton.jit runs (CPU machines)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


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
