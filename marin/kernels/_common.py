"""Helpers shared by the Triton kernel wrappers (imports torch only; triton is imported by callers)."""

from __future__ import annotations

import os

import torch

OP_NAMESPACE = "marin"


def kernel_op(name: str):
    """Decorator: register a kernel launcher as the custom op marin::<name> (torch.library.custom_op).

    torch.compile traces a custom op as one opaque node through its fake (shape/dtype-only)
    implementation, so a compiled model keeps one graph around the kernel instead of breaking at it.
    Every launcher here is pure: it mutates no input and returns freshly allocated tensors only.
    """
    return torch.library.custom_op(f"{OP_NAMESPACE}::{name}", mutates_args=())


def save_inputs(ctx, inputs, output) -> None:
    """setup_context of an op whose backward needs all its tensor inputs."""
    ctx.save_for_backward(*inputs)


def needed(ctx, *grads):
    """`grads` with None where autograd wants no gradient (the backward of a registered op)."""
    return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad, strict=True))


def optional_arg(t: torch.Tensor | None, dummy: torch.Tensor, ndim: int):
    """(pointer, strides) to pass an optional tensor to a kernel: a dummy pointer and zero strides when
    absent (the kernel's HAS_* constexpr then never reads it)."""
    return (t, t.stride()) if t is not None else (dummy, (0,) * ndim)


def check_runnable(*tensors: torch.Tensor, name: str) -> None:
    """Triton kernels run on CUDA tensors, or on CPU under the interpreter (TRITON_INTERPRET=1)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}")
    for t in tensors:
        if t is not None and not t.is_cuda and not interpret:
            raise ValueError(f"{name}: kernels='triton' needs CUDA tensors (got device {t.device}); allowed values "
                             "on CPU: kernels='torch', or set TRITON_INTERPRET=1 before importing triton")


def acc_dtype(t: torch.Tensor):
    """fp64 inputs accumulate in fp64 (gradcheck); everything else in fp32 (bf16 loads are upcast)."""
    import triton.language as tl

    return tl.float64 if t.dtype == torch.float64 else tl.float32


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
