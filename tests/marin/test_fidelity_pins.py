"""Details of docs/fidelity.md that an earlier test bounded but did not pin: each test recomputes the
detail from Marin's constants written out here (never read back from the code under test), so a
changed constant or a reordered step fails it (`tests/fidelity_mutations.py` shows which)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from marin_ablate.ablations.ladders import GPU_RUNGS
from marin_ablate.marin.config import ModelConfig, Recipe, RunSpec, TrainConfig
from marin_ablate.marin.model import Attention, ForwardContext, MarinModel, attention_masks, rope_tables
from marin_ablate.marin.moe import MoE, qb_threshold_hist
from marin_ablate.marin.presets import hero_535b, preset
from marin_ablate.marin.update_rules import build_optimizer, newton_schulz, resolve_hparams

EPS = 1e-5  # Marin GrugModelConfig.layer_norm_eps
CFG = ModelConfig(seq_len=16, window=8)


def _rms(x, w, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _gated(gn, y):
    return y * torch.sigmoid(F.silu(y @ gn.w_down.weight.T) @ gn.w_up.weight.T)


def _ctx(cfg, x):
    local, glob = attention_masks(None, x.shape[0], x.shape[1], cfg.window, x.device)
    cos, sin = rope_tables(x.shape[1], int(cfg.head_dim * cfg.rope_fraction), cfg.rope_theta, x.device)
    return ForwardContext(None, local, glob, cos, sin, 1.0)


def test_every_norm_site_is_rmsnorm_eps_1e_5_then_gatednorm_stem_blocks_and_head():
    torch.manual_seed(0)
    m = MarinModel(CFG, Recipe()).eval()
    with torch.no_grad():  # gains away from 1 so a skipped or reordered norm shows
        for mod in m.modules():
            if type(mod).__name__ == "RMSNorm":
                mod.weight.uniform_(0.5, 1.5)
    tok = torch.randint(0, CFG.vocab_size, (2, 16))
    seen: dict[str, torch.Tensor] = {}

    def keep(key, out=False):  # a hook that records the first call and changes nothing
        def hook(mod, args, *rest):
            seen.setdefault(key, rest[0][0] if out else args[0])
        return hook

    m.blocks[0].register_forward_pre_hook(keep("block0_in"))
    m.blocks[0].attn.register_forward_pre_hook(keep("attn0_in"))
    m.blocks[0].moe.register_forward_pre_hook(keep("moe0_in"))
    m.blocks[-1].register_forward_hook(keep("last_out", out=True))
    m.lm_head.register_forward_pre_hook(keep("head_in"))
    with torch.no_grad():
        m(tok)
        x0 = m.embed(tok)
        b0 = m.blocks[0]
        torch.testing.assert_close(seen["block0_in"], _gated(m.embed_gated_norm, _rms(x0, m.embed_norm.weight)),
                                   rtol=1e-5, atol=1e-6)
        x = seen["block0_in"]
        a = _gated(b0.attn_gated_norm, _rms(x, b0.attn_norm.weight))
        torch.testing.assert_close(seen["attn0_in"], a, rtol=1e-5, atol=1e-6)
        x = x + b0.attn(a, _ctx(CFG, x))
        torch.testing.assert_close(seen["moe0_in"], _gated(b0.mlp_gated_norm, _rms(x, b0.mlp_norm.weight)),
                                   rtol=1e-5, atol=1e-6)
        want = _gated(m.final_gated_norm, _rms(seen["last_out"], m.final_norm.weight))
        torch.testing.assert_close(seen["head_in"], want, rtol=1e-5, atol=1e-6)


def test_fixed_qk_norm_logits_are_1p3_times_unit_rms_q_dot_k_over_sqrt_h():
    torch.manual_seed(0)
    cfg = ModelConfig(seq_len=16, window=16)
    layer = cfg.n_layers - 1  # a global (NoPE) layer: no rotation in the reference
    attn = Attention(cfg, Recipe(), layer)
    x = torch.randn(2, 16, cfg.d_model)
    H, Hk, h = cfg.n_heads, cfg.kv_heads(layer), cfg.head_dim
    with torch.no_grad():
        q = (x @ attn.wq.weight.T).view(2, 16, H, h).transpose(1, 2)
        k = (x @ attn.wk.weight.T)[..., :Hk * h].view(2, 16, Hk, h).transpose(1, 2)
        q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)  # parameter-free, eps 1e-6
        k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6)
        k = k.repeat_interleave(H // Hk, dim=1)
        want = 1.3 * (q @ k.transpose(-1, -2)) / math.sqrt(h)
        torch.testing.assert_close(attn.attention_logits(x, _ctx(cfg, x)), want, rtol=1e-5, atol=1e-6)


def test_init_is_sigma_half_over_sqrt_d_truncated_at_three_sigma():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=128, n_heads=8, vocab_size=512)
    m = MarinModel(cfg, Recipe())
    sigma = 0.5 / math.sqrt(128)  # Marin heuristic.py initializer_std = 0.5/sqrt(d)
    w = m.lm_head.weight.detach()  # 65,536 draws
    assert w.abs().max() <= 3 * sigma * (1 + 1e-6)
    assert w.abs().max() > 2.9 * sigma  # the cut is at 3 sigma, not below
    # the standard deviation of N(0, 1) truncated at ±3 is 0.98658
    assert w.std().item() == pytest.approx(0.98658 * sigma, rel=0.02)


def test_attention_gate_is_two_sigmoid_of_x_wg_per_head():
    torch.manual_seed(0)
    cfg = ModelConfig(seq_len=16, window=16)
    attn = Attention(cfg, Recipe(xsa="none", sconv="none"), 0)
    with torch.no_grad():
        attn.gate.weight.normal_(0, 1.0)
    x = torch.randn(2, 16, cfg.d_model)
    ctx = _ctx(cfg, x)
    with torch.no_grad():
        q, k, v = attn.project_qkv(x, ctx)
        rep = cfg.n_heads // k.shape[1]
        y = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                           attn_mask=ctx.mask_local, scale=1 / math.sqrt(cfg.head_dim))
        g = 2 * torch.sigmoid(x @ attn.gate.weight.T)  # B S H
        z = y * g.transpose(1, 2).unsqueeze(-1)
        want = attn.wo(z.transpose(1, 2).reshape(2, 16, -1))
        torch.testing.assert_close(attn(x, ctx), want, rtol=1e-5, atol=1e-6)


def test_sconv_is_kernel_4_at_k_attn_out_and_mlp_out_on_every_preset():
    for name in ("tiny", "cpu_s", "cpu_m", "cpu_l", "d512", "d768", "d1024", "d2048", "hero_535b"):
        cfg = preset(name)
        assert cfg.sconv_kernel == 4 and cfg.sconv_sites == ("k", "attn_out", "mlp_out"), name
    m = MarinModel(CFG, Recipe())
    convs = {n: p.shape for n, p in m.named_parameters() if m.param_roles()[n] == "sconv"}
    kv = CFG.kv_heads_stored(0) * CFG.head_dim
    assert convs == {f"blocks.{i}.{site}.weight": (4, width) for i in range(CFG.n_layers)
                     for site, width in (("attn.sconv.k", kv), ("attn.sconv.attn_out", CFG.d_model),
                                         ("sconv_mlp_out", CFG.d_model))}


def test_qb_histogram_has_10000_bins_and_interpolates_linearly_in_the_crossing_bin():
    assert ModelConfig().qb_hist_bins == 10_000 and hero_535b().qb_hist_bins == 10_000
    assert ModelConfig().qb_estimator == "hist"
    # 4 bins over [0, 4): counts 0, 2, 4, 2. n* = 3: the top bin holds 2, so the threshold lies one
    # quarter of the way down bin 2 (1 of its 4 margins needed): 3 - 1/4 = 2.75
    counts = torch.tensor([[0.0, 2.0, 4.0, 2.0]], dtype=torch.float64)
    beta = qb_threshold_hist(counts, torch.tensor(0.0, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64),
                             3.0)
    assert beta.item() == pytest.approx(2.75, abs=1e-9)


def test_latent_moe_normalises_the_down_projection_before_the_experts():
    torch.manual_seed(0)
    moe = MoE(CFG, Recipe()).eval()
    with torch.no_grad():
        moe.latent_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, CFG.d_model)
    captured = {}
    orig = moe.dispatcher

    def spy(u, *a, **kw):
        captured["u"] = u
        return orig(u, *a, **kw)

    moe.dispatcher = spy
    with torch.no_grad():
        moe(x)
        u = moe.latent_down(x.reshape(16, -1))
        torch.testing.assert_close(captured["u"], _rms(u, moe.latent_norm.weight), rtol=1e-5, atol=1e-6)


def test_transport_capacities_are_marins_1p33_fixed_1p15_ragged_and_1p15_pooled_wave_over_3_waves():
    for cfg in (ModelConfig(), preset("d768"), hero_535b()):
        assert (cfg.capacity_fixed, cfg.capacity_ragged, cfg.capacity_pooled_wave, cfg.pooled_waves) == \
            (1.33, 1.15, 1.15, 3)


def test_ragged_receivers_split_their_local_experts_into_marins_two_chunks_each_clipped_on_its_own():
    """Marin's ragged flavor: each receiver's local experts in 2 chunks, each chunk its own receive buffer of half
    the pooled capacity (no carry-over), on every preset; the model's dispatcher drops as 2 chunks do."""
    from marin_ablate.marin.dispatch import plan_drops, ragged_capacities, ragged_chunk_layout  # noqa: PLC0415

    for cfg in (ModelConfig(), preset("d768"), hero_535b()):
        assert cfg.ragged_chunks == 2
    hero = hero_535b()
    assert ragged_chunk_layout(hero.n_experts // hero.ep_shards, hero.ragged_chunks) == (2, 3)  # 6 experts per rank
    pooled, per_chunk = ragged_capacities(65_536, 8, 6, 1.15, hero.ragged_chunks)
    assert (pooled, per_chunk) == (math.ceil(1.15 * 65_536 * 8), math.ceil(math.ceil(1.15 * 65_536 * 8) / 2))
    # 4 experts on 2 receivers, top-1, cf 1: each receiver pools 4 rows, 2 per chunk (one expert each). Sender 0
    # sends experts 0, 0, 0, 1; sender 1 sends 0, 1, 1, 1: receiver 0's chunk of expert 0 takes 2 of its 4 rows
    # although its other chunk (expert 1) has room for 2 of the 4 it is sent (pooled, 4 of expert 0 would fit)
    idx = torch.tensor([[0], [0], [0], [1], [0], [1], [1], [1]])
    moe = MoE(replace(CFG, n_experts=4, top_k=1, ep_shards=2, capacity_ragged=1.0, latent_ratio=1), Recipe())
    keep = plan_drops(idx, n_experts=4, n_shards=2, transport="ragged", capacity_factor=1.0,
                      n_chunks=moe.dispatcher.n_chunks)
    assert keep.flatten().tolist() == [True, True, False, True, False, True, False, False]


def test_muonh_step_moves_eta_times_the_radius_along_the_orthogonalized_direction_then_projects_back():
    torch.manual_seed(0)
    spec = RunSpec(model=CFG, recipe=Recipe(), train=TrainConfig(steps=10, lr=0.05, adam_lr=1e-3))
    m = MarinModel(CFG, Recipe())
    opt = build_optimizer(m, resolve_hparams(spec))
    w = m.blocks[0].attn.wq.weight
    w0 = w.detach().clone()
    for p in m.parameters():
        p.grad = torch.randn_like(p)
    g = w.grad.clone()
    opt.step()
    r = w0.norm()
    u = g + 0.95 * g  # Nesterov at the first step: buffer = g, direction = g + mu * buffer
    o = newton_schulz(u)
    x = w0 - 0.05 * r * o / o.norm()
    torch.testing.assert_close(w.detach(), r * x / x.norm(), rtol=1e-5, atol=1e-7)


def test_fast_ladder_batches_are_marins_128_128_256_512_1024():
    assert {n: r.batch_size for n, r in GPU_RUNGS.items()} == \
        {"d512": 128, "d768": 128, "d1024": 256, "d1536": 512, "d2048": 1024}


def test_fast_ladder_trains_marins_2385_6930_9270_steps_at_60_tokens_per_active_parameter():
    # Marin experiments/grug/fast_track/README.md results (MoE, 60 TPP): steps 2,385 / 6,930 / 9,270 and
    # tokens 1.25B / 3.63B / 9.72B at batch 128 / 128 / 256 of 4,096 tokens (launch.py MOE_TPP,
    # `_h100_ladder_rung` baseline_batch; steps = round(60 x active / tokens per step))
    for name, steps, tokens_b in (("d512", 2385, 1.25), ("d768", 6930, 3.63), ("d1024", 9270, 9.72)):
        r = GPU_RUNGS[name]
        assert r.steps() == steps and r.tokens() == steps * r.batch_size * 4096, name
        assert round(r.tokens() / 1e9, 2) == tokens_b, name


def test_hero_and_ladder_split_kv_heads_four_to_one_local_and_eight_to_one_global():
    for name, (kv, kvg) in {"d768": (1, 1), "d1024": (2, 1), "d2048": (4, 2), "hero_535b": (12, 6)}.items():
        cfg = preset(name)
        assert (cfg.n_kv_heads, cfg.n_kv_heads_global) == (kv, kvg), name
        assert cfg.n_heads == cfg.d_model // 128


def test_xsa_subtracts_the_value_projection_with_eps_1e_minus_6():
    from marin_ablate.marin.kernels import get_kernels  # noqa: PLC0415

    torch.manual_seed(0)
    y = torch.randn(1, 4, 8, 16, dtype=torch.float64)
    v = torch.randn(1, 2, 8, 16, dtype=torch.float64) * 1e-3  # |v|^2 ~ 1.6e-5: the 1e-6 matters
    vq = v.repeat_interleave(2, dim=1)  # query head h is served by KV head h // 2
    dot = (y * vq).sum(-1, keepdim=True)
    want = y - dot / (vq.pow(2).sum(-1, keepdim=True) + 1e-6) * vq
    got = get_kernels("torch").xsa(y, v)  # computed in fp32 (the kernels' contract)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_combine_weights_of_every_preset_sum_to_2p5_per_token():
    torch.manual_seed(0)
    for name in ("tiny", "cpu_s", "d768", "hero_535b"):
        assert preset(name).combine_scale == 2.5, name  # Marin model.py _ROUTING_RENORM_SUM
    moe = MoE(CFG, Recipe())
    out = moe.router(torch.randn(32, CFG.d_model))
    torch.testing.assert_close(out.combine_TK.sum(-1), torch.full((32,), 2.5))


def test_newton_schulz_is_marins_quintic_schedule_after_frobenius_normalisation_plus_1e_8():
    torch.manual_seed(0)
    # ‖u‖ ~ 1.5e-7: Marin's hero ε 1e-8 shifts the scale by ~6%, levanter's default 1e-7 by ~40%
    u = torch.randn(12, 20, dtype=torch.float32) * 1e-8
    coeffs = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
              (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))  # levanter NEWTON_SCHULZ_COEFFICIENTS
    x = u.double() / (u.double().norm() + 1e-8)
    for a, b, c in coeffs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    torch.testing.assert_close(newton_schulz(u).double(), x, rtol=1e-4, atol=1e-5)
    # the trainer runs that schedule's 5 iterations: the MuonH groups of the default run, and the hero's
    from marin_ablate.ablations.studies import get_study  # noqa: PLC0415

    (hero, _), = get_study("hero").runs()
    assert resolve_hparams(hero).ns_steps == 5
    opt = build_optimizer(MarinModel(CFG, Recipe()), resolve_hparams(RunSpec(model=CFG, recipe=Recipe(),
                                                                          train=TrainConfig(steps=10))))
    muonh = [g for g in opt.param_groups if g.get("kind") == "muonh"]
    assert muonh and {g["ns_steps"] for g in muonh} == {5}


def test_z_loss_is_1e_4_times_the_mean_squared_logsumexp_of_the_fp32_logits_on_every_preset():
    # Marin launch_scaling_ladder.py GrugTrainerConfig(z_loss_weight=1e-4), levanter's CE +
    # w·logsumexp² per valid token; computed here from the logits the model returns, weight written out
    torch.manual_seed(0)
    m = MarinModel(CFG, Recipe()).train()
    tokens = torch.randint(0, CFG.vocab_size, (2, 16))
    targets = tokens.roll(-1, 1)
    targets[:, -3:] = -100  # ignored targets weigh nothing
    out = m(tokens, None, targets)
    logits_NV = out.logits_BSV.double().reshape(-1, CFG.vocab_size)
    valid_N = targets.reshape(-1) != -100
    lse_N = torch.log(torch.exp(logits_NV - logits_NV.max(-1, keepdim=True).values).sum(-1)) + logits_NV.max(-1).values
    z = 1e-4 * (lse_N[valid_N] ** 2).sum() / valid_N.sum()
    assert z > 1e-4  # lse² ≫ 1 at init (lse ≈ log V), so a 10x weight moves it far past the tolerance
    torch.testing.assert_close(out.z_loss.double(), z, rtol=1e-5, atol=0)
    ce = -(logits_NV.log_softmax(-1)[valid_N, targets.reshape(-1)[valid_N]]).mean()
    torch.testing.assert_close(out.loss.double(), ce + z + out.aux_loss.double(), rtol=1e-5, atol=0)
    # every preset trains at that weight (the forward above pins what the weight does)
    assert {preset(p).z_loss_weight for p in ("tiny", "cpu_s", "d768", "d2048", "hero_535b")} == {1e-4}


#: Marin hero/model.py GrugModelConfig: sliding_window 2048, global_every 4; the global layers are every
#: 4th (1-based) and the last, so a depth that is no multiple of 4 still ends on a global layer
WINDOW, EVERY = 2048, 4


def _gpu_and_hero_models():
    from marin_ablate.ablations.ladders import HERO_RUNGS  # noqa: PLC0415

    rungs = {**GPU_RUNGS, **HERO_RUNGS}
    return {**{n: r.model() for n, r in rungs.items()}, "hero_535b": hero_535b()}


def test_every_gpu_rung_and_the_hero_attend_locally_within_the_last_2048_tokens():
    models = _gpu_and_hero_models()
    assert {n: m.window for n, m in models.items()} == {n: WINDOW for n in models}
    # the mask the forward builds from it: query i sees keys i-2047 .. i (self included), no more
    S = WINDOW + 52
    local, glob = attention_masks(None, 1, S, models["d512"].window, "cpu")
    i = S - 1
    assert torch.nonzero(local[0, 0, i]).flatten().tolist() == list(range(i - WINDOW + 1, i + 1))
    assert int(glob[0, 0, i].sum()) == S


def test_global_layers_are_every_fourth_and_the_last_on_every_gpu_rung_and_the_hero():
    for name, cfg in _gpu_and_hero_models().items():
        n = cfg.n_layers
        want = [i for i in range(n) if (i + 1) % EVERY == 0 or i == n - 1]
        assert [i for i in range(n) if cfg.is_global(i)] == want, name
    # d512's six layers: layer 4 (1-based) and the last; the built blocks follow it
    cfg = preset("d512")
    small = ModelConfig(d_model=64, n_layers=cfg.n_layers, n_heads=4, head_dim=16, seq_len=32, window=8,
                        global_every=cfg.global_every)
    assert [b.attn.is_global for b in MarinModel(small, Recipe()).blocks] == [False, False, False, True, False, True]


def test_next_steps_qb_bias_is_minus_beta_centred_to_zero_mean_per_layer():
    # Marin hero train.py `_apply_qb_betas`: new_bias = -beta; new_bias - mean(new_bias) over the experts
    from marin_ablate.marin.moe import Router  # noqa: PLC0415

    torch.manual_seed(0)
    E, K, T = 8, 2, 64
    r = Router(16, E, K, balance="quantile", combine_scale=2.5, aux_weight=0.0, aux_free_rate=0.0,
               qb_estimator="topk", qb_hist_bins=10_000).train()
    torch.nn.init.normal_(r.weight)
    x = torch.randn(T, 16)
    r(x)
    logits = (x @ r.weight.T).detach().double()
    top = logits.topk(K + 1, dim=-1).values  # bias 0 at the first step: selection on the raw logits
    margins = logits - top[:, K:K + 1]
    n_star = max(1, T * K // E)
    beta = margins.topk(n_star, dim=0).values[-1]  # each expert's n*-th largest margin
    r.update_bias()
    want = -beta + beta.mean()
    assert abs(float(beta.mean())) > 1e-2  # so the centring moves the bias by a visible shift
    torch.testing.assert_close(r.bias_E.double(), want, rtol=1e-5, atol=1e-6)
    # replaced, not accumulated: a bias shifted by a constant selects the same experts and moves every margin by
    # that constant, so the next (centred) bias is the same whatever constant the previous one carried
    for est in ("topk", "hist"):
        after = []
        for shift in (0.0, 5.0):
            q = Router(16, E, K, balance="quantile", combine_scale=2.5, aux_weight=0.0, aux_free_rate=0.0,
                       qb_estimator=est, qb_hist_bins=10_000).train()
            with torch.no_grad():
                q.weight.copy_(r.weight)
                q.bias_E.copy_(want.float() + shift)
            q(torch.randn(T, 16, generator=torch.Generator().manual_seed(1)))
            q.update_bias()
            after.append(q.bias_E.double().clone())
        torch.testing.assert_close(after[1], after[0], rtol=0, atol=1e-5), est
        assert abs(float(after[0].mean())) < 1e-6 and float((after[0] - want).abs().max()) > 1e-3, est


def test_adamh_steps_at_muonhs_learning_rate_and_adam_at_its_own():
    # Marin hero/optimizer.py GrugMoeMuonHConfig.build: "adamh": adamh_transform_at(learning_rate) -- the
    # MuonH rate, 13/3 of the Adam rate below its 0.05 cap -- and "adam": adam_transform_at(adam_lr)
    spec = RunSpec(model=CFG, recipe=Recipe(), train=TrainConfig(steps=100, batch_size=4))
    hp = resolve_hparams(spec)
    assert hp.lr == pytest.approx(min(0.05, 13 / 3 * hp.adam_lr), rel=1e-12) and hp.lr > 2 * hp.adam_lr
    for level, adamh_roles in (("hyperball", {"lm_head"}), ("adamh", {"lm_head", "matrix", "expert"})):
        s = RunSpec(model=CFG, recipe=Recipe(optimizer=level), train=spec.train)
        opt = build_optimizer(MarinModel(s.model, s.recipe), resolve_hparams(s))
        by_role = {g["role"]: (g["kind"], g["lr"]) for g in opt.param_groups}
        assert {r for r, (k, _) in by_role.items() if k == "adamh"} == adamh_roles, level
        for role, (kind, lr) in by_role.items():
            assert lr == (hp.adam_lr if kind == "adam" else hp.lr), (level, role, kind)
