"""RoPE pairing (docs/fidelity.md "RoPE pairing"): Marin's hero rotates interleaved pairs (2j, 2j+1) of the
rotary half ("fused" RoPE); ours rotates split halves (j, j+R). The two are one fixed permutation of the
rotary dims apart, so attention logits agree when q and k are permuted alike (equivalent from scratch),
while the same weights give different logits (not weight-compatible)."""

from __future__ import annotations

import math

import torch

from marin_ablate.marin.config import ModelConfig
from marin_ablate.marin.model import apply_rope, rope_tables


def _marin_fused(x_BHSh: torch.Tensor, theta: float, rotary_dim: int) -> torch.Tensor:
    """Independent reference, written from Marin's formula (hero/model.py `_apply_rotary_embedding_fused`):
    out = c ⊙ x + s ⊙ flip_pairs(x) with c = repeat(cos, 2), s = (−sin, sin) interleaved, identity past
    the rotary dims; frequencies theta^(−j/half) for j < half = rotary_dim/2."""
    S, h = x_BHSh.shape[-2], x_BHSh.shape[-1]
    half = rotary_dim // 2
    inv = [theta ** (-j / half) for j in range(half)]
    c = torch.ones(S, h, dtype=torch.float64)
    s = torch.zeros(S, h, dtype=torch.float64)
    for p in range(S):
        for j in range(half):
            c[p, 2 * j] = c[p, 2 * j + 1] = math.cos(p * inv[j])
            s[p, 2 * j], s[p, 2 * j + 1] = -math.sin(p * inv[j]), math.sin(p * inv[j])
    flipped = x_BHSh.double().reshape(*x_BHSh.shape[:-1], h // 2, 2).flip(-1).reshape(x_BHSh.shape)
    return c * x_BHSh.double() + s * flipped


def _split_to_interleaved(h: int, rot: int) -> torch.Tensor:
    """Index map P: interleaved position 2j <- split j, 2j+1 <- split j+R (R = rot/2); the rest stay."""
    R = rot // 2
    idx = list(range(h))
    for j in range(R):
        idx[2 * j], idx[2 * j + 1] = j, j + R
    return torch.tensor(idx)


def test_ours_rotates_split_halves_which_is_marins_interleaved_rope_under_one_fixed_permutation():
    cfg = ModelConfig()
    h, rot, S = cfg.head_dim, int(cfg.head_dim * cfg.rope_fraction), 12
    assert (h, rot) == (16, 8)  # half-RoPE: the first half of each head is rotated
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, S, h, dtype=torch.float64), torch.randn(2, 3, S, h, dtype=torch.float64)
    cos, sin = rope_tables(S, rot, cfg.rope_theta, "cpu")
    ours_q, ours_k = apply_rope(q, cos.double(), sin.double()), apply_rope(k, cos.double(), sin.double())
    P = _split_to_interleaved(h, rot)
    marin_q, marin_k = _marin_fused(q[..., P], cfg.rope_theta, rot), _marin_fused(k[..., P], cfg.rope_theta, rot)
    # ours == P^T marin(P x): the same rotation on relabelled dims (fp32 tables: ~1e-7)
    torch.testing.assert_close(ours_q[..., P], marin_q, rtol=0, atol=2e-6)
    torch.testing.assert_close(ours_k[..., P], marin_k, rtol=0, atol=2e-6)
    # so logits agree when q and k are permuted alike (a from-scratch run learns either convention) ...
    torch.testing.assert_close(ours_q @ ours_k.transpose(-1, -2), marin_q @ marin_k.transpose(-1, -2),
                               rtol=0, atol=1e-5)
    # ... but the same weights (no permutation) give other logits: not weight-compatible with Marin's
    same = _marin_fused(q, cfg.rope_theta, rot) @ _marin_fused(k, cfg.rope_theta, rot).transpose(-1, -2)
    assert (same - ours_q @ ours_k.transpose(-1, -2)).abs().max() > 0.1
    # the unrotated half passes through untouched in both
    torch.testing.assert_close(ours_q[..., rot:], q[..., rot:], rtol=0, atol=0)
