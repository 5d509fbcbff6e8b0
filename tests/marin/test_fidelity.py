"""Details that match Marin's hero code (docs/fidelity.md), each pinned against a hand computation."""

from __future__ import annotations

import torch
import torch.utils.checkpoint as ckpt

from marin_ablate.marin.config import FACTORS, ModelConfig, Recipe
from marin_ablate.marin.model import GatedNorm, MarinModel
from marin_ablate.marin.moe import Router, combine_weights, router_probs
from marin_ablate.marin.presets import preset
from marin_ablate.marin.update_rules import build_optimizer, group_assignment

CFG = ModelConfig(seq_len=16, window=8)


def test_architecture_outside_the_seven_factors_is_identical_in_every_arm():
    on, off = MarinModel(CFG, Recipe()), MarinModel(CFG, Recipe.baseline())
    # Parameters a factor owns: attention SConv / q-k gains (sconv, qk_norm), latent projections and
    # the expert bank shape (latent_moe). Everything else must exist in both arms with equal shapes.
    factor_owned = ("sconv", "q_norm", "k_norm", "latent_", "moe.w_", "router.weight")
    shared_on = {n: p.shape for n, p in on.named_parameters() if not any(k in n for k in factor_owned)}
    shared_off = {n: p.shape for n, p in off.named_parameters() if not any(k in n for k in factor_owned)}
    assert shared_on == shared_off
    for name in ("embed_norm.weight", "embed_gated_norm.w_down.weight", "final_gated_norm.w_up.weight",
                 "blocks.0.attn_gated_norm.w_down.weight", "blocks.1.mlp_gated_norm.w_up.weight",
                 "blocks.0.attn.gate.weight"):
        assert name in shared_on
    # Optimizer groups: outside the factor-owned parameters, only the optimizer factor moves a group.
    mixed = Recipe.baseline().with_(optimizer="hyperball")
    g_on = group_assignment(build_optimizer(on, _hp("hyperball")))
    g_mixed = group_assignment(build_optimizer(MarinModel(CFG, mixed), _hp("hyperball")))
    assert {n: g_on[n] for n in shared_on} == {n: g_mixed[n] for n in shared_on}
    assert len(FACTORS) == 7


def _hp(level: str):
    from marin_ablate.marin.config import RunSpec, TrainConfig  # noqa: PLC0415
    from marin_ablate.marin.update_rules import resolve_hparams  # noqa: PLC0415
    return resolve_hparams(RunSpec(model=CFG, recipe=Recipe().with_(optimizer=level),
                                   train=TrainConfig(steps=10, lr=1e-2, adam_lr=1e-3)))


def test_gated_norm_is_y_times_sigmoid_of_silu_low_rank_and_every_norm_has_eps_1e_5():
    torch.manual_seed(0)
    g = GatedNorm(8, 4)
    y = torch.randn(3, 8)
    want = y * torch.sigmoid(torch.nn.functional.silu(y @ g.w_down.weight.T) @ g.w_up.weight.T)
    torch.testing.assert_close(g(y), want)
    m = MarinModel(CFG, Recipe())
    assert m.embed_gated_norm.w_down.weight.shape == (min(128, CFG.d_model), CFG.d_model)
    assert {mod.eps for mod in m.modules() if type(mod).__name__ == "RMSNorm"} == {1e-5}
    assert preset("d768").gated_norm_width == 128 and preset("tiny").gated_norm_width == 64
    assert all(preset(p).gated_norm == "on" for p in ("tiny", "cpu_s", "cpu_m", "cpu_l", "d768", "hero_535b"))


def test_forward_is_embed_norm_gatednorm_blocks_final_norm_gatednorm_head():
    torch.manual_seed(0)
    m = MarinModel(CFG, Recipe()).eval()
    tok = torch.randint(0, CFG.vocab_size, (2, 16))
    seen = []
    m.embed_gated_norm.register_forward_hook(lambda mod, i, o: seen.append(("embed_gn", i[0])))
    m.final_gated_norm.register_forward_hook(lambda mod, i, o: seen.append(("final_gn", o)))
    logits = m(tok).logits_BSV
    x = m.embed(tok)
    torch.testing.assert_close(seen[0][1], torch.nn.functional.rms_norm(x, (CFG.d_model,), m.embed_norm.weight, 1e-5))
    torch.testing.assert_close(logits, m.lm_head(seen[1][1]))


def test_combine_weights_divide_by_sum_plus_1e_9_and_stay_finite_when_all_underflow():
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0], [-200.0, -200.0, -200.0, -200.0]])
    idx = torch.tensor([[1, 3], [0, 1]])
    w = combine_weights(logits, idx, 2.5)
    g = torch.sigmoid(torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(w[0], 2.5 * g / (g.sum() + 1e-9))
    assert torch.isfinite(w).all() and (w[1] >= 0).all()
    s30 = combine_weights(torch.full((1, 4), -30.0), idx[:1], 2.5)  # Marin: 2.5·σ/(2σ + 1e-9)
    sig = torch.sigmoid(torch.tensor(-30.0)).item()
    assert abs(s30[0, 0].item() - 2.5 * sig / (2 * sig + 1e-9)) < 1e-6
    torch.testing.assert_close(router_probs(torch.full((1, 4), -1e4)), torch.full((1, 4), 0.25))


def _router() -> Router:
    torch.manual_seed(0)
    r = Router(8, 8, 2, balance="quantile", combine_scale=2.5, aux_weight=0.0, aux_free_rate=0.0,
               qb_estimator="hist", qb_hist_bins=100)
    torch.nn.init.normal_(r.weight)
    return r.train()


def test_qb_statistics_are_not_recorded_under_no_grad():
    r = _router()
    with torch.no_grad():
        r(torch.randn(32, 8))
    assert r._margins == []
    r(torch.randn(32, 8))
    assert len(r._margins) == 1


def test_qb_statistics_are_recorded_once_under_a_reentrant_activation_checkpoint():
    r = _router()
    x = torch.randn(32, 8, requires_grad=True)
    out = ckpt.checkpoint(lambda t: r(t).combine_TK, x, use_reentrant=True)
    assert r._margins == []  # the checkpointed forward runs without grad
    out.sum().backward()  # the recompute runs with grad: recorded once
    assert len(r._margins) == 1


def test_every_gpu_rung_holds_65536_tokens_per_ep_shard():
    from marin_ablate.ablations.ladders import GPU_RUNGS, HERO_RUNGS, rung_of_preset  # noqa: PLC0415
    from marin_ablate.marin.flops import resolved  # noqa: PLC0415
    for name, r in GPU_RUNGS.items():
        assert r.model().ep_shards == r.batch_size * 4096 // 65_536, name
        assert r.describe()["tokens_per_ep_shard"] == 65_536, name
        assert resolved(r.model(), Recipe(), rung_of_preset(name))["tokens_per_ep_shard"] == 65_536, name
    # the hero ladder: 1,024 sequences of 4,096 per rack over its 64 GPUs, whatever the rack count; its
    # H100 d512 rung holds them on one node of 8 (524,288 tokens per shard, as Marin's H100 ladder)
    h100 = HERO_RUNGS["hero_d512"]
    assert (h100.gpus, h100.model().ep_shards, h100.describe()["tokens_per_ep_shard"]) == (8, 8, 524_288)
    for name, r in HERO_RUNGS.items():
        if r is h100:
            continue
        racks = r.gpus // 64
        assert r.batch_size == 1024 * racks and r.model().ep_shards == 64, name
        assert r.describe()["tokens_per_ep_shard"] == 1024 * racks * 4096 // (64 * racks) == 65_536, name
        info = {"ep_shards": 64, "tokens_per_step": r.tokens_per_step, "replica_groups": racks}
        assert resolved(r.model(), Recipe(), info)["tokens_per_ep_shard"] == 65_536, name


def test_qb_topk_rank_rounds_t_k_over_e_down_like_marin_and_hist_keeps_it_unrounded():
    from marin_ablate.marin.moe import margin_histogram, qb_bias, qb_n_star, qb_threshold_hist, qb_threshold_topk  # noqa: PLC0415
    assert qb_n_star(111, 8, 64) == 13  # 13.875: Marin's integer division, where round() gives 14
    assert qb_n_star(7, 8, 384) == 1  # floor 0 -> at least one
    assert qb_n_star(65_536, 8, 384) == 1365  # 1365.33 at 65,536 tokens per EP shard
    m = torch.arange(111.0)[:, None].expand(111, 4).contiguous()  # margins 0..110 in every column
    assert torch.equal(qb_threshold_topk(m, qb_n_star(111, 8, 64)), torch.full((4,), 98.0))  # 13th largest
    # hist: the target rank is the float T·K/E (Marin `_qb_beta_hist` target_rank = T·K/E), not floored.
    r = Router(8, 64, 8, balance="quantile", combine_scale=2.5, aux_weight=0.0, aux_free_rate=0.0,
               qb_estimator="hist", qb_hist_bins=64)
    m_TE = torch.randn(111, 64, generator=torch.Generator().manual_seed(0))
    r._margins = [m_TE]
    r.update_bias()
    lo, hi = m_TE.min().double(), m_TE.max().double()
    counts = margin_histogram(m_TE, lo, hi, 64)
    want = qb_bias(qb_threshold_hist(counts, lo, hi, 111 * 8 / 64))
    floored = qb_bias(qb_threshold_hist(counts, lo, hi, 13.0))
    assert torch.allclose(r.bias_E, want, atol=1e-6) and not torch.allclose(r.bias_E, floored, atol=1e-4)


def test_expert_bank_is_one_hyperball_sphere_by_default_and_per_expert_as_the_named_option():
    from dataclasses import replace  # noqa: PLC0415

    from marin_ablate.marin.config import TrainConfig  # noqa: PLC0415
    from marin_ablate.marin.update_rules import MarinOptimizer, param_groups  # noqa: PLC0415

    assert TrainConfig().expert_sphere == "bank"  # Marin's hero: axes range(1, ndim) of [L, E, in, out]
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(3, 4, 5, generator=g) * torch.tensor([0.5, 1.0, 2.0])[:, None, None]  # unequal experts
    d = torch.randn(3, 4, 5, generator=g)
    eta = 0.3
    for sphere in ("bank", "expert"):
        w = torch.nn.Parameter(w0.clone())
        hp = replace(_hp("hyperball"), lr=eta, expert_sphere=sphere)
        opt = MarinOptimizer(param_groups([("experts", w)], {"experts": "expert"}, hp))
        with torch.no_grad():
            opt._project(w, opt.param_groups[0], d)  # one MuonH move along the direction d
        if sphere == "bank":  # hand computation: the whole bank is one vector
            r = w0.norm()
            x = w0 - eta * r * d / d.norm()
            want = x * r / x.norm()
            assert abs(float(w.detach().norm() - r)) < 1e-5
            per_expert_moved = (torch.linalg.matrix_norm(w.detach()) - torch.linalg.matrix_norm(w0)).abs().max()
            assert per_expert_moved > 1e-3  # experts trade norm inside the bank
        else:
            r = torch.linalg.matrix_norm(w0, keepdim=True)
            x = w0 - eta * r * d / torch.linalg.matrix_norm(d, keepdim=True)
            want = x * r / torch.linalg.matrix_norm(x, keepdim=True)
        torch.testing.assert_close(w.detach(), want, rtol=1e-5, atol=1e-6)
    # a bad level names the field and the allowed values
    import pytest  # noqa: PLC0415
    with pytest.raises(ValueError, match="expert_sphere.*bank.*expert"):
        TrainConfig(expert_sphere="layer")
