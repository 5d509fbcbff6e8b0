"""Custom ops of the recipe, as one set per backend (`ModelConfig.kernels`).

"torch": the pure-torch references (marin/kernels/reference.py) and plain-torch MoE ops
(marin/kernels/torch_ops.py); no triton import. "triton": the Triton kernels in this package
(imported lazily, here only; on CPU they run under TRITON_INTERPRET=1 alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from marin_ablate.marin.config import KERNEL_BACKENDS


@dataclass(frozen=True)
class KernelSet:
    """Callables with the signatures of the references (shape suffixes as in docs/method.md §2.1)."""

    backend: str
    sconv: Callable  # (x_BSC, w_KC, doc_ids_BS | None) -> out_BSC
    xsa: Callable  # (y_BHSD, v_BKSD) -> z_BHSD
    xsa_gate: Callable  # (y_BHSD, v_BKSD, gate_logits_BSH) -> 2σ(a)·z, as z_BHSD
    permute: Callable  # (x_TW, src_N, top_k) -> x_NW
    unpermute: Callable  # (y_NW, src_N, combine_TK) -> y_TW
    grouped_mm: Callable  # (x_NI, w_EIO, offsets_E) -> y_NO


def xsa_gate_torch(y_BHSD, v_BKSD, gate_logits_BSH):
    """The headwise gate 2σ(a) applied to the XSA output (unfused reference)."""
    import torch

    from marin_ablate.marin.kernels.reference import xsa_reference

    z = xsa_reference(y_BHSD, v_BKSD)
    return z * (2.0 * torch.sigmoid(gate_logits_BSH.float())).transpose(1, 2).unsqueeze(-1).to(z.dtype)


def get_kernels(backend: str) -> KernelSet:
    """The op set for `backend` in KERNEL_BACKENDS."""
    if backend == "torch":
        from marin_ablate.marin.kernels.reference import sconv_reference, xsa_reference
        from marin_ablate.marin.kernels.torch_ops import grouped_mm_torch, permute_torch, unpermute_torch

        return KernelSet("torch", sconv_reference, xsa_reference, xsa_gate_torch, permute_torch,
                         unpermute_torch, grouped_mm_torch)
    if backend == "triton":
        try:
            import triton  # noqa: F401
        except ImportError as e:
            raise ValueError("kernels='triton' needs the triton package (pip install -e '.[triton]'); "
                             f"allowed values without it: 'torch' ({e})") from None
        from marin_ablate.marin.kernels.moe import grouped_mm_triton, permute_triton, unpermute_triton
        from marin_ablate.marin.kernels.sconv import sconv_triton
        from marin_ablate.marin.kernels.xsa import xsa_gate_triton, xsa_triton

        return KernelSet("triton", sconv_triton, xsa_triton, xsa_gate_triton, permute_triton,
                         unpermute_triton, grouped_mm_triton)
    raise ValueError(f"kernels={backend!r} is not a known backend; "
                     f"allowed values: {', '.join(map(repr, KERNEL_BACKENDS))}")


__all__ = ["KERNEL_BACKENDS", "KernelSet", "get_kernels", "xsa_gate_torch"]
