"""MarinModel (docs/method.md §2, §2.1): every recipe switch trains, stays causal, keeps documents apart,
and each component does exactly its math."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from marin_ablate.marin.config import BASELINE_LEVELS, MODEL_FACTORS, RECIPE_LEVELS, ModelConfig, Recipe
from marin_ablate.marin.kernels.reference import sconv_reference, xsa_reference
from marin_ablate.marin.model import Attention, ForwardContext, MarinModel, attention_masks, rope_tables

# Small enough for 64 combos on one CPU thread; T = B·S divisible by ep_shards (4).
CFG = ModelConfig(seq_len=16, window=6, n_layers=2, global_every=2)
B, S = 2, 16

# All 2^6 recipe/baseline combos of the model factors, then the extra levels once each.
RECIPES = [Recipe(**dict(zip(MODEL_FACTORS, lv, strict=True)))
           for lv in itertools.product(*[(RECIPE_LEVELS[f][0], BASELINE_LEVELS[f]) for f in MODEL_FACTORS])]
RECIPES += [Recipe(qk_norm="none"), Recipe(router_balance="aux_free"), Recipe(ep_transport="dropless")]


@torch.no_grad()
def _wake(model: MarinModel, scale: float = 0.3) -> MarinModel:
    """Move identity-at-init pieces (SConv taps, zero gates) off their init, so a leak through them
    would show."""
    for name, role in model.param_roles().items():
        p = model.get_parameter(name)
        if role in ("sconv", "gate"):
            p.add_(scale * torch.randn_like(p))
    return model


def _ctx(cfg: ModelConfig, x_BSD: torch.Tensor, doc_ids_BS=None) -> ForwardContext:
    Bx, Sx, _ = x_BSD.shape
    local, glob = attention_masks(doc_ids_BS, Bx, Sx, cfg.window, x_BSD.device)
    cos, sin = rope_tables(Sx, int(cfg.head_dim * cfg.rope_fraction), cfg.rope_theta, x_BSD.device)
    return ForwardContext(doc_ids_BS, local, glob, cos, sin, 1.0)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: "-".join(getattr(r, f) for f in MODEL_FACTORS))
def test_every_model_factor_combo_trains_with_finite_grads_and_is_causal(recipe):
    torch.manual_seed(0)
    model = _wake(MarinModel(CFG, recipe))
    tokens = torch.randint(0, CFG.vocab_size, (B, S))
    docs = torch.zeros(B, S, dtype=torch.long)
    docs[:, 9:] = 1

    model.train()
    out = model(tokens, docs, tokens.roll(-1, 1))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name

    model.eval()
    t = 7
    changed = tokens.clone()
    changed[:, t + 1:] = torch.randint(0, CFG.vocab_size, (B, S - t - 1))
    with torch.no_grad():
        a, b = model(tokens, docs).logits_BSV, model(changed, docs).logits_BSV
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


@pytest.mark.parametrize("sites", [("k", "attn_out", "mlp_out"), ("k", "v", "attn_out", "mlp_out")])
def test_documents_never_see_each_other_with_every_switch_on(sites):
    cfg = ModelConfig(seq_len=16, window=8, sconv_sites=sites, gated_norm="on")
    model = _wake(MarinModel(cfg, Recipe())).eval()
    tokens = torch.randint(0, cfg.vocab_size, (B, S))
    docs = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [3] * 10 + [4] * 6])
    changed = tokens.clone()
    changed[0, :5] = torch.randint(0, cfg.vocab_size, (5,))  # document 0 only
    changed[1, :10] = torch.randint(0, cfg.vocab_size, (10,))  # document 3 only
    with torch.no_grad():
        a, b = model(tokens, docs).logits_BSV, model(changed, docs).logits_BSV
    torch.testing.assert_close(a[0, 5:], b[0, 5:], rtol=0, atol=1e-5)
    torch.testing.assert_close(a[1, 10:], b[1, 10:], rtol=0, atol=1e-5)
    assert not torch.allclose(a[0, :5], b[0, :5])


def test_xsa_output_is_orthogonal_to_the_serving_value_vector():
    y = torch.randn(2, 6, 9, 8)
    v = torch.randn(2, 3, 9, 8)
    z = xsa_reference(y, v)
    v_served = v.repeat_interleave(2, dim=1)  # query head j is served by kv head j // 2
    cos = F.cosine_similarity(z, v_served, dim=-1)
    assert cos.abs().max() < 1e-4
    # Per-head loop: only the own-value component is removed.
    for j in range(6):
        vj = v[:, j // 2]
        coef = (y[:, j] * vj).sum(-1, keepdim=True) / ((vj * vj).sum(-1, keepdim=True) + 1e-6)
        torch.testing.assert_close(z[:, j], y[:, j] - coef * vj, rtol=1e-5, atol=1e-5)


def test_attention_without_xsa_equals_sdpa_and_xsa_is_applied_to_that_output():
    cfg = ModelConfig(seq_len=16, window=6)
    x = torch.randn(B, S, cfg.d_model)
    docs = torch.tensor([[0] * 6 + [1] * 10, [0] * 16])
    for xsa in ("none", "xsa"):
        torch.manual_seed(1)
        attn = Attention(cfg, Recipe(xsa=xsa, sconv="none"), layer=0)
        with torch.no_grad():
            attn.gate.weight.normal_()
        ctx = _ctx(cfg, x, docs)
        q, k, v = attn.project_qkv(x, ctx)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask_local, enable_gqa=True)
        if xsa == "xsa":
            y = xsa_reference(y, v)
        y = y * 2 * torch.sigmoid(attn.gate(x)).transpose(1, 2).unsqueeze(-1)
        want = attn.wo(y.transpose(1, 2).reshape(B, S, -1))
        torch.testing.assert_close(attn(x, ctx), want, rtol=1e-5, atol=1e-6)


def test_sconv_reference_matches_a_per_position_loop_and_stops_at_document_starts():
    x = torch.randn(2, 11, 5, dtype=torch.float64)
    w = torch.randn(4, 5, dtype=torch.float64)
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2], [5] * 11])
    out = sconv_reference(x, w, docs)
    want = torch.zeros_like(x)
    for b in range(2):
        for t in range(11):
            for lag in range(4):
                if t - lag >= 0 and docs[b, t - lag] == docs[b, t]:
                    want[b, t] += w[lag] * x[b, t - lag]
    torch.testing.assert_close(out, want)


def test_sconv_model_at_init_equals_the_same_weights_without_sconv():
    torch.manual_seed(0)
    on = MarinModel(CFG, Recipe()).eval()
    off = MarinModel(CFG, Recipe(sconv="none")).eval()
    missing, unexpected = off.load_state_dict(on.state_dict(), strict=False)
    assert not missing and unexpected and all("sconv" in k for k in unexpected)
    tokens = torch.randint(0, CFG.vocab_size, (B, S))
    with torch.no_grad():
        torch.testing.assert_close(on(tokens).logits_BSV, off(tokens).logits_BSV, rtol=0, atol=1e-6)


def test_fixed_qk_norm_bounds_attention_logits_by_1p3_sqrt_head_dim():
    cfg = ModelConfig(seq_len=16, window=16)
    x = torch.randn(B, S, cfg.d_model) * 10
    bound = cfg.qk_mult * math.sqrt(cfg.head_dim)
    peaks = {}
    for level in RECIPE_LEVELS["qk_norm"]:
        for layer in (0, cfg.n_layers - 1):  # a local (RoPE) and a global (NoPE) layer
            torch.manual_seed(0)
            attn = Attention(cfg, Recipe(qk_norm=level), layer)
            with torch.no_grad():  # huge projections: unnormed logits would be huge
                attn.wq.weight.mul_(50)
                attn.wk.weight.mul_(50)
                peaks[level, layer] = attn.attention_logits(x, _ctx(cfg, x)).abs().max().item()
    assert peaks["fixed_1.3", 0] <= bound * (1 + 1e-5) and peaks["fixed_1.3", 1] <= bound * (1 + 1e-5)
    assert peaks["fixed_1.3", 0] > 0.5 * bound  # the bound is approached, not vacuous
    assert peaks["none", 0] > 10 * bound
    assert peaks["learned_gain", 0] <= math.sqrt(cfg.head_dim) * (1 + 1e-5)  # gain 1, multiplier 1


def test_init_follows_roles_truncated_normal_matrices_zero_gates_identity_sconv():
    cfg = ModelConfig(d_model=128, n_heads=8, expert_hidden=64, shared_hidden=64)
    model = MarinModel(cfg, Recipe())
    roles = model.param_roles()
    assert set(roles) == {n for n, _ in model.named_parameters()}
    assert set(roles.values()) == {"matrix", "expert", "lm_head", "embed", "router", "gate", "norm", "sconv"}
    std = cfg.init_scale / math.sqrt(cfg.d_model)
    for name, role in roles.items():
        p = model.get_parameter(name)
        if role in ("matrix", "expert", "lm_head", "embed", "router"):
            assert p.abs().max() <= 3 * std + 1e-7, name
            if p.numel() > 4000:
                assert abs(p.std().item() / (0.9866 * std) - 1) < 0.1, name  # std of N(0,1) cut at ±3
        if role == "expert":
            assert p.dim() == 3 and p.shape[0] == cfg.n_experts
        if role == "gate":
            assert (p == 0).all() and name.endswith("attn.gate.weight")
        if role == "norm":
            assert (p == 1).all()
        if role == "sconv":
            assert (p[0] == 1).all() and (p[1:] == 0).all()


def test_loss_is_ce_plus_weighted_mean_square_lse_plus_aux():
    for balance in ("quantile", "switch_aux"):
        model = MarinModel(CFG, Recipe(router_balance=balance)).train()
        tokens = torch.randint(0, CFG.vocab_size, (B, S))
        targets = tokens.roll(-1, 1)
        targets[0, -1] = -100
        out = model(tokens, None, targets)
        logits = out.logits_BSV.float().reshape(-1, CFG.vocab_size)
        valid = targets.reshape(-1) != -100
        lse = torch.logsumexp(logits, -1)[valid]
        torch.testing.assert_close(out.z_loss, CFG.z_loss_weight * lse.pow(2).mean())
        torch.testing.assert_close(out.ce_loss, F.cross_entropy(logits[valid], targets.reshape(-1)[valid]))
        torch.testing.assert_close(out.loss, out.ce_loss + out.z_loss + out.aux_loss)
        if balance == "switch_aux":  # λ·E·Σ f·P ≈ λ per layer near balance, summed over layers
            assert 0.5 * CFG.n_layers * CFG.router_aux_weight < out.aux_loss < 2 * CFG.n_layers * CFG.router_aux_weight
        else:
            assert out.aux_loss == 0


def test_eval_is_dropless_while_training_drops_per_transport():
    # fixed at cf 0.5 must drop; ragged with a pool of 8x the mean load can never clip a chunk.
    cfg = ModelConfig(seq_len=16, window=16, capacity_fixed=0.5, capacity_ragged=8.0)
    tokens = torch.randint(0, cfg.vocab_size, (4, 16))
    for transport in ("fixed", "ragged", "dropless"):
        model = MarinModel(cfg, Recipe(ep_transport=transport))
        train_stats = model.train()(tokens).stats
        eval_stats = model.eval()(tokens).stats
        assert eval_stats["dropped"] == 0 and eval_stats["assigned"] == train_stats["assigned"]
        assert (train_stats["dropped"] > 0) == (transport == "fixed")
    for key in ("dropped", "assigned", "load_cv", "max_load_ratio", "router_z", "drop_rate"):
        assert key in train_stats


def test_router_bias_changes_only_at_update_and_applies_to_the_next_forward():
    model = MarinModel(CFG, Recipe())
    router = model.blocks[0].moe.router
    tokens = torch.randint(0, CFG.vocab_size, (4, 16))
    model.train()
    model(tokens)
    assert (router.bias_E == 0).all()  # computed at step t ...
    eval_before = model.eval()(tokens).logits_BSV
    model.train()
    model.update_router_biases()
    assert (router.bias_E != 0).any()  # ... applied from step t+1, eval included
    assert abs(router.bias_E.mean().item()) < 1e-6
    bias = router.bias_E.clone()
    model.update_router_biases()  # no training forward since: nothing pending, bias kept
    assert torch.equal(router.bias_E, bias)
    assert not torch.allclose(model.eval()(tokens).logits_BSV, eval_before)


def test_bf16_model_keeps_router_logits_and_bias_in_fp32_and_trains():
    model = MarinModel(CFG, Recipe()).to(torch.bfloat16)
    tokens = torch.randint(0, CFG.vocab_size, (B, S))
    x = model.embed(tokens).reshape(B * S, -1)
    assert model.blocks[0].moe.router(x).logits_TE.dtype == torch.float32
    assert model.blocks[0].moe.router.bias_E.dtype == torch.float32
    out = model(tokens, None, tokens)
    out.loss.backward()
    assert out.logits_BSV.dtype == torch.bfloat16 and torch.isfinite(out.loss)


def test_context_scale_multiplies_q():
    cfg = ModelConfig(seq_len=16, window=16)
    attn = Attention(cfg, Recipe(), 0)
    x = torch.randn(1, S, cfg.d_model)
    ctx = _ctx(cfg, x)
    q1 = attn.project_qkv(x, ctx)[0]
    ctx.q_scale = 1 + 0.1 * math.log(4)
    torch.testing.assert_close(attn.project_qkv(x, ctx)[0], q1 * ctx.q_scale)


def test_ep_shards_that_do_not_divide_the_experts_at_both_latent_levels_fail_in_config():
    # 16 latent experts, but only 8 at the standard level: caught before any model is built
    with pytest.raises(ValueError, match="ep_shards=16 must divide.*16 and 8.*allowed values"):
        ModelConfig(ep_shards=16)


@pytest.mark.slow  # the Triton interpreter runs at numpy speed
def test_triton_kernels_model_matches_torch_reference_model():
    pytest.importorskip("triton")
    torch.manual_seed(0)
    ref = _wake(MarinModel(CFG, Recipe()))
    tri = MarinModel(dataclasses.replace(CFG, kernels="triton"), Recipe())
    tri.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, CFG.vocab_size, (1, S))
    docs = torch.tensor([[0] * 7 + [1] * 9])
    out_ref, out_tri = ref.eval()(tokens, docs, tokens), tri.eval()(tokens, docs, tokens)
    torch.testing.assert_close(out_tri.logits_BSV, out_ref.logits_BSV, rtol=1e-4, atol=1e-5)
    out_ref.loss.backward()
    out_tri.loss.backward()
    for (name, p), q in zip(ref.named_parameters(), tri.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)
