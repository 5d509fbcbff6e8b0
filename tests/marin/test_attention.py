"""ModelConfig.attention: the "flex" backend (flex_attention + BlockMask, native GQA) computes exactly
what the "sdpa" reference (dense boolean masks) computes, forward and backward, and keeps causality
and document isolation.

torch has no flex_attention backward on CPU (flex_attention rejects inputs that require grad there).
The gradient tests lift that device check for their duration: eager flex then runs torch's reference
(unfused) forward and backward, the same math eager flex runs on GPU, so they check our use of flex
(mask_mod, GQA, scale) rather than torch's fused kernels.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module

from marin_ablate.marin.config import ModelConfig, Recipe, RunSpec, TrainConfig
from marin_ablate.marin.model import Attention, ForwardContext, MarinModel, attention_masks, block_masks, rope_tables
from marin_ablate.marin.presets import tiny

# Layer 0 local (window 12 < S, 2 kv heads: GQA 2:1), layer 1 global (1 kv head: GQA 4:1).
CFG = ModelConfig(seq_len=64, window=12, n_layers=2, global_every=2, n_heads=4, n_kv_heads=2, n_kv_heads_global=1)
B, S = 2, 50  # S is not a multiple of the 128-token BlockMask block (nor of 16)
DOCS = torch.tensor([[0] * 20 + [1] * 17 + [2] * 13, [5] * 9 + [6] * 41])  # boundaries inside the sequence
ATOL = 1e-5

# Eager flex is torch's unfused reference; it warns once that it is not compiled (expected here).
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture
def flex_backward_on_cpu(monkeypatch):
    monkeypatch.setattr(flex_module, "_validate_device", lambda *args: None)


@torch.no_grad()
def _wake(module: torch.nn.Module) -> torch.nn.Module:
    """Move the zero-init gates and identity SConv taps off their init, so every path carries signal."""
    for name, p in module.named_parameters():
        if "gate" in name or "sconv" in name:
            p.add_(0.3 * torch.randn_like(p))
    return module


def _ctx(cfg: ModelConfig, doc_ids_BS, Bx: int, Sx: int) -> ForwardContext:
    """The context MarinModel.forward builds for cfg.attention."""
    cos, sin = rope_tables(Sx, int(cfg.head_dim * cfg.rope_fraction), cfg.rope_theta, "cpu")
    if cfg.attention == "flex":
        blocks = block_masks(doc_ids_BS, Bx, Sx, cfg.window, "cpu")
        return ForwardContext(doc_ids_BS, *blocks, cos, sin, 1.0)
    return ForwardContext(doc_ids_BS, *attention_masks(doc_ids_BS, Bx, Sx, cfg.window, "cpu"), cos, sin, 1.0)


def _pair(cfg: ModelConfig, layer: int) -> tuple[Attention, Attention]:
    sdpa = _wake(Attention(cfg, Recipe(), layer))
    flex = Attention(dataclasses.replace(cfg, attention="flex"), Recipe(), layer)
    flex.load_state_dict(sdpa.state_dict())
    return sdpa, flex


def _out_and_grads(attn: Attention, x: torch.Tensor, docs, g: torch.Tensor):
    attn.zero_grad()
    y = attn(x, _ctx(attn.cfg, docs, *x.shape[:2]))
    (y * g).sum().backward()
    return y.detach(), {n: p.grad.clone() for n, p in attn.named_parameters()}


@pytest.mark.parametrize("docs", [None, DOCS], ids=["one_document", "packed_documents"])
@pytest.mark.parametrize("layer", [0, 1], ids=["local", "global"])
def test_flex_attention_layer_matches_sdpa_output_and_gradients(layer, docs, flex_backward_on_cpu):
    sdpa, flex = _pair(CFG, layer)
    assert flex.is_global == (layer == 1) and CFG.n_heads // flex.Hkv == (2, 4)[layer]
    x = torch.randn(B, S, CFG.d_model)
    g = torch.randn(B, S, CFG.d_model)
    y_ref, grads_ref = _out_and_grads(sdpa, x, docs, g)
    y, grads = _out_and_grads(flex, x, docs, g)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=ATOL)
    assert grads.keys() == grads_ref.keys() and {"wq.weight", "wk.weight", "wv.weight"} <= grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=0, atol=ATOL, msg=name)


def test_block_masks_follow_the_dense_mask_rule_element_by_element():
    for docs in (None, DOCS):
        dense_masks = attention_masks(docs, B, S, CFG.window, "cpu")
        for bm, dense in zip(block_masks(docs, B, S, CFG.window, "cpu"), dense_masks, strict=True):
            got = flex_module.create_mask(bm.mask_mod, B, 1, S, S, device="cpu")
            assert torch.equal(got, dense.expand(B, 1, S, S))


def test_marin_model_with_flex_matches_sdpa_loss_and_gradients(flex_backward_on_cpu):
    cfg = tiny()
    sdpa = _wake(MarinModel(cfg, Recipe())).eval()  # eval: dropless routing
    flex = MarinModel(dataclasses.replace(cfg, attention="flex"), Recipe()).eval()
    flex.load_state_dict(sdpa.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (B, S))
    targets = tokens.roll(-1, 1)
    losses, grads = [], []
    for model in (sdpa, flex):
        out = model(tokens, DOCS, targets)
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=ATOL)
    assert grads[1].keys() == grads[0].keys() and len(grads[0]) > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=ATOL, msg=name)


@torch.no_grad()
def test_flex_model_is_causal_and_keeps_documents_apart():
    cfg = dataclasses.replace(tiny(), window=12, attention="flex")
    model = _wake(MarinModel(cfg, Recipe())).eval()
    tokens = torch.randint(0, cfg.vocab_size, (B, S))
    base = model(tokens, DOCS).logits_BSV

    t = 30  # a future token: outputs up to t unchanged, later ones move
    future = tokens.clone()
    future[:, t + 1:] = torch.randint(0, cfg.vocab_size, (B, S - t - 1))
    out = model(future, DOCS).logits_BSV
    torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=ATOL)
    assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])

    other = tokens.clone()  # an earlier document: the later documents do not see it
    other[0, :20] = torch.randint(0, cfg.vocab_size, (20,))
    other[1, :9] = torch.randint(0, cfg.vocab_size, (9,))
    out = model(other, DOCS).logits_BSV
    torch.testing.assert_close(out[0, 20:], base[0, 20:], rtol=0, atol=ATOL)
    torch.testing.assert_close(out[1, 9:], base[1, 9:], rtol=0, atol=ATOL)
    assert not torch.allclose(out[0, :20], base[0, :20])


@torch.no_grad()
@pytest.mark.slow
def test_compiled_flex_attention_layer_matches_eager_forward():
    # Forward only: torch compiles no flex backward for CPU. About 20-40 s of compile on a cold cache.
    cfg = dataclasses.replace(CFG, attention="flex")
    attn = _wake(Attention(cfg, Recipe(), 0)).eval()
    x = torch.randn(B, S, cfg.d_model)
    ctx = _ctx(cfg, DOCS, B, S)
    want = attn(x, ctx)
    try:
        got = torch.compile(attn, fullgraph=True)(x, ctx)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


def test_unknown_attention_backend_raises_value_error_naming_the_field_and_levels():
    with pytest.raises(ValueError, match=r"ModelConfig\.attention='flash'.*allowed values: 'sdpa', 'flex'"):
        ModelConfig(attention="flash")


def test_flex_on_a_cpu_run_is_rejected_before_training_naming_the_field():
    # torch has no CPU flex_attention backward: fail when the spec is built, not at the first step.
    with pytest.raises(ValueError, match=r"ModelConfig\.attention.*'flex' trains on CUDA only.*allowed values.*'sdpa'"):
        RunSpec(model=ModelConfig(attention="flex"), train=TrainConfig(device="cpu"))
    # on CUDA flex runs compiled (eager flex is refused: tests/sweeps/test_hero_memory.py)
    assert RunSpec(model=ModelConfig(attention="flex"),
                   train=TrainConfig(device="cuda", compile=True)).model.attention == "flex"
