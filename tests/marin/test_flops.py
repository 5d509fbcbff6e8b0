"""Analytic accounting (marin/flops.py) against the built model, torch's FLOP counter, the hero's
published counts (docs/method.md §2.2), and the describe CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from marin_ablate.cli.main import main as cli_main
from marin_ablate.marin import flops
from marin_ablate.marin.config import BASELINE_LEVELS, MODEL_FACTORS, RECIPE_LEVELS, ModelConfig, Recipe
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.presets import preset

COMBOS = [Recipe(**dict(zip(MODEL_FACTORS, lv, strict=True)))
          for lv in itertools.product(*[(RECIPE_LEVELS[f][0], BASELINE_LEVELS[f]) for f in MODEL_FACTORS])]
EXTRAS = [Recipe(qk_norm="none"), Recipe(router_balance="aux_free"), Recipe(ep_transport="dropless")]


def _meta(cfg: ModelConfig, recipe: Recipe) -> MarinModel:
    with torch.device("meta"):
        return MarinModel(cfg, recipe)


def _counts_from_model(model: MarinModel) -> tuple[int, int]:
    """(total, active) counted from the built model: active drops embed, lm_head and the routed
    experts a token does not use."""
    roles = model.param_roles()
    g = model.cfg.moe_geometry(model.recipe)
    total = active = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if roles[name] == "expert":
            active += p.numel() * g.top_k // g.n_experts
        elif roles[name] not in ("embed", "lm_head"):
            active += p.numel()
    return total, active


@pytest.mark.parametrize("cfg", [ModelConfig(),
                                 ModelConfig(gated_norm="on", sconv_sites=("k", "v", "attn_out", "mlp_out"),
                                             attn_gate=False, n_shared_experts=1)],
                         ids=["tiny", "tiny_all_options"])
def test_param_counts_equal_the_built_model_for_every_combo(cfg):
    for recipe in COMBOS + EXTRAS:
        total, active = _counts_from_model(_meta(cfg, recipe))
        assert flops.params_total(cfg, recipe) == total, recipe
        assert flops.params_active(cfg, recipe) == active, recipe


def test_hero_counts_535b_total_and_22p8b_active_on_the_meta_device():
    cfg = preset("hero_535b")
    total, active = _counts_from_model(_meta(cfg, Recipe()))
    assert abs(total / 535e9 - 1) < 0.015
    assert abs(active / 22.8e9 - 1) < 0.03
    assert (total, active) == (flops.params_total(cfg, Recipe()), flops.params_active(cfg, Recipe()))


@pytest.mark.parametrize("name,active", [("d768", 61e6), ("d1024", 162e6), ("d1536", 481e6), ("d2048", 1.2e9)])
def test_rungs_match_marins_published_active_counts_in_marins_convention(name, active):
    # launch_scaling_ladder.py docstring table; convention: small_scale_abl_launch.py _active_params
    assert abs(flops.params_active_marin(preset(name), Recipe()) / active - 1) < 0.03


@pytest.mark.parametrize("cfg", [preset("tiny"), preset("hero_535b"), preset("d1024")], ids=["tiny", "hero", "d1024"])
def test_latent_and_alpha_matched_standard_have_equal_routed_params_flops_and_bytes(cfg):
    lat, std = Recipe(latent_moe="latent"), Recipe(latent_moe="standard")
    assert flops.params_routed(cfg, lat) == flops.params_routed(cfg, std)
    assert flops.forward_flops_breakdown(cfg, lat)["routed"] == flops.forward_flops_breakdown(cfg, std)["routed"]
    assert flops.dispatch_bytes_per_token(cfg, lat) == flops.dispatch_bytes_per_token(cfg, std)
    # What latent adds on top: the two projections (and a router over twice the experts).
    extra = flops.params_total(cfg, lat) - flops.params_total(cfg, std)
    per_layer = 2 * cfg.d_model * cfg.latent_dim + cfg.latent_dim + cfg.d_model * cfg.n_experts // 2
    assert extra == cfg.n_layers * per_layer


def _grouped_mm_flops(a, b, offs=None, *args, out_val=None, **kwargs) -> int:
    """FlopCounterMode has no formula for aten._grouped_mm (it counts 0): 2 FLOPs per multiply-add of
    the rows inside the groups, forward (N,I)x(E,I,O) and both backward layouts."""
    rows = int(offs[-1])
    if out_val.dim() == 3:  # dw: (I, N) x (N, O) -> (E, I, O), reduced over the grouped rows
        return 2 * rows * out_val.shape[1] * out_val.shape[2]
    return 2 * rows * a.shape[1] * out_val.shape[1]  # (N, I) x (E, I, O) -> (N, O)


_grouped_mm_flops._get_raw = True  # FlopCounterMode: hand over tensors (the offsets), not shapes
GROUPED_MM_FLOPS = {torch.ops.aten._grouped_mm: _grouped_mm_flops}


@pytest.mark.parametrize("recipe", [Recipe(ep_transport="dropless"), Recipe.baseline().with_(ep_transport="dropless")],
                         ids=["recipe", "baseline"])
def test_matmul_flops_agree_with_torch_flop_counter(recipe):
    cfg = ModelConfig(gated_norm="on")
    model = MarinModel(cfg, recipe)
    B, S = 2, 32
    tokens = torch.randint(0, cfg.vocab_size, (B, S))
    want = flops.forward_flops_breakdown(cfg, recipe, S, attention="dense")  # a masked SDPA computes S x S
    want_fwd = sum(want[k] for k in flops.MATMUL_TERMS)
    # The math backend decomposes SDPA into counted bmm's (the fused CPU kernel has no FLOP formula).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False, custom_mapping=GROUPED_MM_FLOPS) as counter:
        with torch.no_grad():
            model.eval()(tokens)
    assert abs(counter.get_total_flops() / (B * S) / want_fwd - 1) < 0.02
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False, custom_mapping=GROUPED_MM_FLOPS) as counter:
        model.train()(tokens, None, tokens).loss.backward()
    assert abs(counter.get_total_flops() / (B * S) / (3 * want_fwd) - 1) < 0.02


def test_causal_attention_counts_windowed_keys_and_training_is_three_forwards():
    assert flops.mean_keys_per_query(8, None) == 4.5
    assert flops.mean_keys_per_query(8, 8) == 4.5
    assert flops.mean_keys_per_query(8, 2) == (1 + 2 * 7) / 8
    cfg = ModelConfig(seq_len=64, window=16, n_layers=4, global_every=4)  # layers 0-2 local, 3 global
    b = flops.forward_flops_breakdown(cfg, Recipe())
    per_key = 4 * cfg.n_heads * cfg.head_dim
    assert b["attn_scores"] == per_key * (3 * flops.mean_keys_per_query(64, 16) + 32.5)
    assert flops.flops_per_token(cfg, Recipe()) == 3 * sum(b.values())
    assert b["sconv"] > 0 and b["xsa"] > 0
    base = flops.forward_flops_breakdown(cfg, Recipe.baseline())
    assert base["sconv"] == 0 and base["xsa"] == 0
    with pytest.raises(ValueError, match="attention.*allowed values"):
        flops.forward_flops_breakdown(cfg, Recipe(), attention="sparse")


def test_plan_preset_prints_json_with_counts(capsys):
    rc = cli_main(["plan", "--preset", "tiny", "--model.d_model=128", "--recipe.latent_moe=standard", "--json"])
    assert rc == 0
    info = json.loads(capsys.readouterr().out)
    cfg, recipe = preset("tiny", ["d_model=128"]), Recipe(latent_moe="standard")
    assert info["model"]["d_model"] == 128 and info["recipe"]["latent_moe"] == "standard"
    assert info["params_total"] == flops.params_total(cfg, recipe)
    assert info["params_active"] == flops.params_active(cfg, recipe)
    assert info["flops_per_token"] == flops.flops_per_token(cfg, recipe)
    assert cli_main(["plan", "--preset", "hero_535b"]) == 0
    assert "params_total" in capsys.readouterr().out


def test_plan_preset_rejects_unknown_levels_with_allowed_values(capsys):
    assert cli_main(["plan", "--preset", "tiny", "--recipe.xsa=maybe"]) == 2
    err = capsys.readouterr().err
    assert "Recipe.xsa" in err and "allowed values" in err and "'none'" in err
    assert cli_main(["plan", "--preset", "d99"]) == 2
    assert "allowed values" in capsys.readouterr().err


def test_accounting_and_describe_import_no_torch():
    code = "import sys, marin_ablate.marin.flops, marin_ablate.cli.plan; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
