"""Marin's newest hero details (docs/fidelity.md): gate/router weight decay, the stored KV-head layout
of global layers, bf16 router logits, the per-shard QB top-k estimator and the pooled-wave transport.
Each test computes the expected value independently of the code under test."""

import math
from dataclasses import replace

import pytest
import torch

from marin_ablate.marin.config import ModelConfig, Recipe, RunSpec, TrainConfig
from marin_ablate.marin.dispatch import (
    LocalDispatcher,
    plan_drops,
    pooled_wave_capacities,
    pooled_wave_keep,
    transport_bytes,
)
from marin_ablate.marin.hparams import resolve_hparams
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.moe import Router, qb_n_star, qb_threshold_topk
from marin_ablate.marin.presets import hero_535b, preset
from marin_ablate.marin.update_rules import build_optimizer, decay_fraction, set_lr


def _tiny(**kw) -> ModelConfig:
    return replace(ModelConfig(), **kw)


# ---- gate / router weight decay -------------------------------------------------------------------


def test_gate_and_router_weights_decay_linearly_to_zero_and_no_other_adam_parameter_decays():
    spec = RunSpec(model=_tiny(), recipe=Recipe(), train=TrainConfig(steps=10, batch_size=2))
    assert spec.train.gate_router_weight_decay == 0.02  # Marin's hero and ladder default
    model = MarinModel(spec.model, spec.recipe)
    hp = resolve_hparams(spec)
    opt = build_optimizer(model, hp)
    roles = model.param_roles()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)  # the gate starts at zero, where decay is invisible
    for step, frac in ((0, 1.0), (5, 0.5), (10, 0.0)):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for p in model.parameters():
            p.grad = torch.zeros_like(p)  # the Adam direction is 0: only decay moves a parameter
        set_lr(opt, 1.0, decay_fraction(step, 10))
        opt.step()
        for n, p in model.named_parameters():
            if roles[n] in ("gate", "router"):
                # Marin: p <- p - lr * (adam + wd * (1 - t/T) * p)
                want = before[n] * (1 - hp.adam_lr * 0.02 * frac)
                torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-7)
                if frac > 0:
                    assert not torch.equal(p.detach(), before[n])
            elif roles[n] in ("embed", "norm", "sconv"):
                torch.testing.assert_close(p.detach(), before[n], rtol=0, atol=0)


def test_gate_router_weight_decay_zero_switches_it_off_and_adamw_keeps_its_own_decay():
    spec = RunSpec(model=_tiny(), recipe=Recipe(), train=TrainConfig(steps=10, batch_size=2,
                                                                    gate_router_weight_decay=0.0))
    opt = build_optimizer(MarinModel(spec.model, spec.recipe), resolve_hparams(spec))
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups if g["kind"] == "adam")
    spec = RunSpec(model=_tiny(), recipe=replace(Recipe(), optimizer="adamw"), train=TrainConfig(steps=10))
    opt = build_optimizer(MarinModel(spec.model, spec.recipe), resolve_hparams(spec))
    router = [g for g in opt.param_groups if g["role"] == "router"][0]
    assert router["kind"] == "adamw" and router["weight_decay"] == pytest.approx(0.1)
    assert not router["anneal_weight_decay"]
    with pytest.raises(ValueError, match="gate_router_weight_decay"):
        TrainConfig(gate_router_weight_decay=-0.01)


def test_gate_router_decay_at_step_t_is_one_minus_t_over_steps_from_its_switch_on_step():
    # Marin: wd·clip(1 - count/total, 0) with count the updates before this one, so step t of T
    # (0-based) decays at 1 - t/T: the full peak at step 0, 1/T of it at the last step
    T = 8
    assert [decay_fraction(t, T) for t in range(T + 2)] == [1 - t / T for t in range(T + 1)] + [0.0]
    # switched on at step 5 (Marin's hero: 58,014): nothing before it, the same anneal from it on
    assert [decay_fraction(t, T, 5) for t in range(T)] == [0.0] * 5 + [1 - t / T for t in range(5, T)]
    assert TrainConfig().gate_router_decay_start == 0  # the ladder's, and ours, from step 0
    from marin_ablate.ablations.studies import get_study

    (hero_spec, _), = get_study("hero").runs()
    assert hero_spec.train.gate_router_decay_start == 58_014  # Marin's hero
    from marin_ablate.ablations.ladders import HERO_RUNGS

    assert {r.train_config().gate_router_decay_start for r in HERO_RUNGS.values()} == {0}  # its ladder
    with pytest.raises(ValueError, match="gate_router_decay_start"):
        TrainConfig(gate_router_decay_start=-1)


def test_a_real_runs_loss_first_moves_the_step_after_the_decay_switches_on(tmp_path):
    """The trainer's call site (marin/train/loop.py) decays at 0-based step t by 1 - t/T from the switch-on
    step s: the update of step s is the first decayed one, so losses 0..s equal the undecayed run's and
    loss s+1 differs. A call site one step early decays update s-1 (loss s moves); one step late leaves
    loss s+1 equal."""
    from marin_ablate.marin.train import train

    def curve(start: int) -> list[float]:
        spec = RunSpec(model=preset("tiny", ["seq_len=32"]), recipe=Recipe(),
                       train=TrainConfig(steps=6, batch_size=2, eval_every=0, eval_batches=1, log_every=1,
                                         checkpoint_every=0, threads=1, gate_router_decay_start=start,
                                         gate_router_weight_decay=50.0))  # large: visible within one step
        return [loss for _, loss in train(spec, tmp_path / f"s{start}", resume=False)["loss_curve"]]

    late, never = curve(3), curve(6)  # switched on at step 3 of 6; never switched on
    assert len(late) == len(never) == 6
    assert late[:4] == never[:4] and late[4] != never[4] and late[5] != never[5]


# ---- global layers store the local KV-head count --------------------------------------------------


def test_global_layers_store_the_local_kv_heads_and_attend_with_the_first_global_ones():
    cfg = _tiny(n_kv_heads=2, n_kv_heads_global=1, n_layers=2, global_every=2)
    stored, per_layer = MarinModel(cfg, Recipe()), MarinModel(replace(cfg, kv_layout="per_layer"), Recipe())
    h = cfg.head_dim
    glob = stored.blocks[1].attn
    assert glob.is_global and glob.wk.weight.shape == (2 * h, cfg.d_model)
    assert per_layer.blocks[1].attn.wk.weight.shape == (h, cfg.d_model)
    # the per-layer model with the stored model's weights, global K/V cut to the used first head
    sd = stored.state_dict()
    for name in ("blocks.1.attn.wk.weight", "blocks.1.attn.wv.weight"):
        sd[name] = sd[name][:h]
    sd["blocks.1.attn.sconv.k.weight"] = sd["blocks.1.attn.sconv.k.weight"][:, :h]
    per_layer.load_state_dict(sd)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    out_s, out_p = stored(tokens, targets_BS=tokens), per_layer(tokens, targets_BS=tokens)
    torch.testing.assert_close(out_s.logits_BSV, out_p.logits_BSV)
    out_s.loss.backward()
    # the unused stored heads get no gradient but stay on the matrix's hyperball sphere
    assert torch.count_nonzero(glob.wk.weight.grad[h:]) == 0
    assert torch.count_nonzero(glob.wk.weight.grad[:h]) > 0


def test_hero_stores_twelve_kv_heads_in_every_layer():
    cfg = hero_535b()
    assert cfg.kv_layout == "stored"
    assert {cfg.kv_heads_stored(layer) for layer in range(cfg.n_layers)} == {12}
    assert cfg.kv_heads(3) == 6 and cfg.is_global(3)


# ---- router logit precision -----------------------------------------------------------------------


def test_bf16_router_logits_are_bf16_products_cast_to_fp32_and_the_hero_and_gpu_rungs_use_them():
    torch.manual_seed(1)
    router = Router(64, 16, 4, balance="quantile", combine_scale=2.5, aux_weight=0.0, aux_free_rate=0.0,
                    qb_estimator="hist", qb_hist_bins=100, precision="bf16")
    torch.nn.init.normal_(router.weight, std=0.2)
    x = torch.randn(512, 64)
    out = router.eval()(x)
    want = (x.bfloat16() @ router.weight.bfloat16().T).float()
    torch.testing.assert_close(out.logits_TE, want, rtol=0, atol=0)
    fp32 = x @ router.weight.T
    assert (out.logits_TE - fp32).abs().max() > 1e-4  # the rounding is real
    assert hero_535b().router_precision == "bf16" and preset("d512").router_precision == "bf16"
    assert ModelConfig().router_precision == "fp32"  # CPU rungs compute in fp32 throughout
    with pytest.raises(ValueError, match="router_precision"):
        ModelConfig(router_precision="fp16")


# ---- QB top-k per shard ---------------------------------------------------------------------------


def test_qb_topk_threshold_is_each_shards_n_star_th_margin_averaged_over_shards():
    T, E, K, S = 40, 4, 2, 2
    m = torch.arange(T * E, dtype=torch.float32).view(T, E) % 37
    n_star = qb_n_star(T // S, K, E)  # floor(20 * 2 / 4) = 10
    assert n_star == 10
    want = torch.stack([torch.sort(m[s * 20:(s + 1) * 20], dim=0, descending=True).values[n_star - 1]
                        for s in range(S)]).mean(0)
    torch.testing.assert_close(qb_threshold_topk(m, n_star, S), want)
    # a virtual-EP router uses its shards; one shard is the global top-k
    router = Router(8, E, K, balance="quantile", combine_scale=2.5, aux_weight=0.0, aux_free_rate=0.0,
                    qb_estimator="topk", qb_hist_bins=10, qb_shards=S)
    assert router.qb_shards == S
    from marin_ablate.marin.moe import MoE  # noqa: PLC0415
    cfg = _tiny(qb_estimator="topk")
    assert MoE(cfg, Recipe()).router.qb_shards == cfg.ep_shards  # a virtual-EP model: its shards
    assert not torch.allclose(qb_threshold_topk(m, qb_n_star(T, K, E), 1), want)


# ---- pooled-wave transport ------------------------------------------------------------------------


def test_pooled_wave_capacities_follow_marins_ceilings():
    # hero shard: 65,536 tokens x top-8, 384 experts over 64 shards, cf 1.15, 3 waves
    pool, buffer = pooled_wave_capacities(65_536, 8, 384, 64, 1.15, 3)
    assert pool == math.ceil(1.15 * 65_536 * 8 / (64 * 3))
    assert buffer == math.ceil(1.15 * 65_536 * 8 / (6 * 3))


def test_pooled_wave_drops_at_the_sender_pool_and_at_a_full_receiver_buffer():
    # 2 shards of 4 tokens, top-1, 4 experts (2 per shard), 2 waves, cf 1: pool 1, buffer 1
    e = torch.tensor([[0], [0], [0], [1], [0], [2], [3], [1]])
    sender, kept = pooled_wave_keep(e, n_experts=4, n_shards=2, capacity_factor=1.0, waves=2)
    # shard 0 sends 4 rows to shard 0: ranks 0..3 -> waves 0,1,0,1, slots 0,0,1,1; slot 1 > pool
    assert sender.tolist() == [True, True, False, False, True, True, True, True]
    # wave 0, expert 0 gets slot 0 of shard 0 (token 0) and of shard 1 (token 4): buffer 1 keeps
    # the lower sender at the same slot
    assert kept.tolist() == [True, True, False, False, False, True, True, True]
    keep = plan_drops(e, n_experts=4, n_shards=2, transport="pooled_wave", capacity_factor=1.0, waves=2)
    assert keep.view(-1).tolist() == kept.tolist()


def test_pooled_wave_receivers_fill_round_robin_over_senders_not_sender_first():
    # 3 shards, 3 experts (1 per shard), top-1, 2 tokens per shard all to expert 0, one wave:
    # pool ceil(2*2/3) = 2 per destination, buffer ceil(2*2/1) = 4 at expert 0: 6 rows arrive
    e = torch.zeros(6, 1, dtype=torch.long)
    sender, kept = pooled_wave_keep(e, n_experts=3, n_shards=3, capacity_factor=2.0, waves=1)
    assert sender.all()
    # slot 0 of shards 0,1,2 first, then slot 1 of shard 0: tokens 0, 2, 4, 1 kept; 3 and 5 dropped
    assert kept.tolist() == [True, True, True, False, True, False]


def test_pooled_wave_is_dropless_with_room_and_trains_through_the_local_dispatcher():
    torch.manual_seed(0)
    e = torch.randint(0, 16, (64, 4))
    assert plan_drops(e, n_experts=16, n_shards=4, transport="pooled_wave", capacity_factor=8.0).all()
    keep = plan_drops(e, n_experts=16, n_shards=4, transport="pooled_wave", capacity_factor=1.0, waves=3)
    assert 0 < int((~keep).sum()) < keep.numel()
    nbytes = transport_bytes(e, keep, n_experts=16, n_shards=4, transport="pooled_wave", capacity_factor=1.0,
                             row_bytes=10, waves=3)
    pool, _ = pooled_wave_capacities(16, 4, 16, 4, 1.0, 3)
    assert nbytes == 2 * 3 * 4 * 3 * pool * 10
    model = MarinModel(_tiny(), replace(Recipe(), ep_transport="pooled_wave")).train()
    assert isinstance(model.blocks[0].moe.dispatcher, LocalDispatcher)
    assert model.blocks[0].moe.dispatcher.waves == 3
    tokens = torch.randint(0, 256, (4, 64))
    out = model(tokens, targets_BS=tokens)
    out.loss.backward()
    assert math.isfinite(float(out.loss.detach()))


# ---- the hero's scaling ladder ----------------------------------------------------------------------


def test_hero_ladder_is_marins_rung_table_at_791_tokens_per_active_parameter():
    from marin_ablate.ablations.ladders import GPU_RUNGS, HERO_RUNGS  # noqa: PLC0415

    # experiments/grug/moe_hero_ep/launch_scaling_ladder.py docstring (GB200 racks of 64 GPUs) and
    # launch_h100_scaling_ladder.py docstring (d512: one node of 8 H100s): GPUs, batch, steps, tokens
    table = {"d512": (8, 1024, 3930, 16), "d768": (64, 1024, 11420, 48), "d1024": (128, 2048, 15276, 128),
             "d1536": (384, 6144, 15128, 381), "d2048": (704, 11264, 20072, 926)}  # tokens in billions
    assert set(HERO_RUNGS) == {f"hero_{d}" for d in table}
    for d, (gpus, batch, steps, tokens) in table.items():
        r = HERO_RUNGS[f"hero_{d}"]
        assert (r.gpus, r.batch_size, r.steps()) == (gpus, batch, steps)
        assert r.tokens() == steps * batch * 4096 and round(r.tokens() / 1e9) == tokens
        cfg = r.model()
        racks = batch // 1024  # 1,024 sequences per EP group, one group per rack (per H100 node at d512)
        assert (cfg.vocab_size, cfg.ep_shards) == (128_256, gpus // racks)
        assert r.tokens_per_step // (racks * cfg.ep_shards) == 1024 * 4096 // cfg.ep_shards
        assert r.train_config().eval_every == round(steps / 20)
        assert r.train_config().replica_groups == racks  # rack-local (HSDP), as the hero
        # the same widths as the fast ladder, about 13x the tokens per parameter
        fast = GPU_RUNGS[d]
        assert cfg.d_model == fast.model().d_model and r.tokens_per_active_param / fast.tokens_per_active_param > 13


def test_the_context_q_multiplier_scales_the_logits_of_every_attention_layer_local_and_global():
    """A context stage's q multiplier 1 + c·ln(L/L0) reaches every attention layer, the local (RoPE, window) and
    the global (NoPE) ones alike: each layer's pre-mask logits at multiplier s are s times those at 1."""
    torch.manual_seed(0)
    cfg = _tiny(n_layers=4, global_every=2, seq_len=16, window=8)
    m = MarinModel(cfg, Recipe()).eval()
    x = torch.randn(2, 16, cfg.d_model)
    tok = torch.zeros(2, 16, dtype=torch.long)
    kinds = [b.attn.is_global for b in m.blocks]
    assert kinds == [False, True, False, True]
    base = [b.attn.attention_logits(x, m.context(tok, None)) for b in m.blocks]
    s = 1.0 + 0.1 * math.log(4)  # 4k -> 16k by the hero's rule
    m.q_scale = s
    with torch.no_grad():
        for b, want in zip(m.blocks, base, strict=True):
            torch.testing.assert_close(b.attn.attention_logits(x, m.context(tok, None)), s * want, rtol=1e-5, atol=1e-6)


def test_the_hero_extends_its_context_4k_16k_65k_holding_tokens_per_step_with_marins_q_rule():
    """Marin's newest hero record: 4,096 -> 16,384 at the handoff near step 216,000 (55% of 390,251 steps) ->
    65,536 from 95% of the steps, tokens per step held, q multiplied by 1.3·(1 + 0.1·ln(L/4096)): 1.48 at 16k."""
    import math

    from marin_ablate.ablations.studies import get_study
    from marin_ablate.marin.train import context_plan

    (spec, _), = get_study("hero").runs()
    stages = context_plan(spec)
    assert [(s.start_step, s.seq_len, s.batch_size) for s in stages] == [
        (0, 4096, 11_264), (216_000, 16_384, 2_816), (370_738, 65_536, 704)]
    assert {s.seq_len * s.batch_size for s in stages} == {46_137_344}
    total_q = [spec.model.qk_mult * s.q_scale for s in stages]
    assert total_q == pytest.approx([1.3, 1.3 * (1 + 0.1 * math.log(4)), 1.3 * (1 + 0.1 * math.log(16))], abs=1e-12)
    assert total_q[1] == pytest.approx(1.4802, abs=1e-4)  # Marin's hero rule at 16k (the "yarn (0.1)" arm's qk_mult)
    assert spec.train.context_q_rule == "yarn"
    assert spec.data.shuffle == "indexed"
