"""Pure-torch references of the recipe's custom ops (docs/method.md §2.1). The model runs these when
`ModelConfig.kernels == "torch"`; the Triton kernels in this package are tested against them.

Signatures are stable: (B, S, C) for SConv, (B, H, S, D) queries-side and (B, Hkv, S, D) values for XSA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

XSA_EPS = 1e-6


def sconv_reference(x_BSC: Tensor, w_KC: Tensor, doc_ids_BS: Tensor | None = None) -> Tensor:
    """Short causal depthwise conv: out[b,t,c] = Σ_l w[l,c]·x[b,t−l,c] (SConv, docs/method.md §2.1).

    A tap is zeroed when t−l < 0 or when position t−l lies in another packed document, so the
    conv never reads across a document boundary. No bias.
    """
    B, S, C = x_BSC.shape
    K = w_KC.shape[0]
    if w_KC.shape != (K, C):
        raise ValueError(f"sconv_reference: w_KC has shape {tuple(w_KC.shape)}, want (K, {C})")
    out_BSC = x_BSC * w_KC[0]
    for lag in range(1, min(K, S)):
        # x shifted right by `lag` along S; the first `lag` positions read zero padding (t−l < 0).
        shifted_BSC = F.pad(x_BSC[:, : S - lag], (0, 0, lag, 0))
        if doc_ids_BS is not None:
            same_BS = torch.zeros_like(doc_ids_BS, dtype=torch.bool)
            same_BS[:, lag:] = doc_ids_BS[:, lag:] == doc_ids_BS[:, : S - lag]
            shifted_BSC = shifted_BSC * same_BS.unsqueeze(-1).to(x_BSC.dtype)
        out_BSC = out_BSC + shifted_BSC * w_KC[lag]
    return out_BSC


def xsa_reference(y_BHSD: Tensor, v_BKSD: Tensor) -> Tensor:
    """Exclusive self attention (arXiv 2603.09078): remove from each head's output its component
    along the token's own value vector, z = y − (⟨y,v⟩ / (‖v‖² + 1e-6))·v.

    Under GQA query head h is served by KV head h // (H / Hkv) (the grouping SDPA's enable_gqa uses).
    The projection is computed in fp32 and cast back to y's dtype.
    """
    B, H, S, D = y_BHSD.shape
    Hkv = v_BKSD.shape[1]
    if H % Hkv != 0 or v_BKSD.shape != (B, Hkv, S, D):
        raise ValueError(f"xsa_reference: v_BKSD shape {tuple(v_BKSD.shape)} does not serve "
                         f"y_BHSD {tuple(y_BHSD.shape)}; allowed: (B, Hkv, S, D) with H % Hkv == 0")
    y = y_BHSD.float().view(B, Hkv, H // Hkv, S, D)
    v = v_BKSD.float().unsqueeze(2)
    coef = (y * v).sum(-1, keepdim=True) / ((v * v).sum(-1, keepdim=True) + XSA_EPS)
    return (y - coef * v).view(B, H, S, D).to(y_BHSD.dtype)
