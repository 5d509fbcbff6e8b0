"""The GPU benchmark script runs end to end: a GPU session has 15 minutes, so
benchmarks/gpu.py must not meet its first bug there. Its CPU dry run takes every code path the
GPU run takes except CUDA-only rows, at tiny shapes, with Triton under its interpreter; it measures
nothing worth keeping, so it writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Multi-process training, torch.compile, simulated studies or real SLURM jobs: minutes on 2 cores.
# `python -m pytest -m "not slow"` leaves this file out of the development loop; CI runs it.
pytestmark = pytest.mark.slow


ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_dry_run_on_cpu_has_no_failed_section_or_check():
    pytest.importorskip("triton")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--tiny",
                           "--quick", "--no-write"], capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = [ln for ln in out.splitlines() if "SECTION FAILED" in ln or " FAIL " in ln or "FAILED" in ln]
    assert not failed, "\n".join(failed)
    for section in ("== ceilings", "== sconv", "== xsa", "== moe_permute", "== grouped_gemm", "== model_parity",
                    "== syncs", "== blocks"):
        assert section in out, f"{section} did not run"
    assert "recipe eager attention=sdpa kernels=triton" in out and "plain eager" in out
