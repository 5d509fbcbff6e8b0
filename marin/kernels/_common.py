"""Helpers shared by the Triton kernel wrappers (imports torch only; triton is imported by callers)."""

from __future__ import annotations

import os

import torch


def check_runnable(*tensors: torch.Tensor, name: str) -> None:
    """Triton kernels run on CUDA tensors, or on CPU under the interpreter (TRITON_INTERPRET=1)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}")
    for t in tensors:
        if t is None:
            continue
        if not t.is_cuda and not interpret:
            raise ValueError(
                f"{name}: kernels='triton' needs CUDA tensors (got device {t.device}); "
                "allowed values on CPU: kernels='torch', or set TRITON_INTERPRET=1 before importing triton"
            )


def acc_dtype(t: torch.Tensor):
    """fp64 inputs accumulate in fp64 (gradcheck); everything else in fp32 (bf16 loads are upcast)."""
    import triton.language as tl

    return tl.float64 if t.dtype == torch.float64 else tl.float32


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
