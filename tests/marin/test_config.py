"""marin/config.py: validation names the field and the allowed values before any work; derived
geometry (global layers, KV heads, MoE geometry, capacities); run identity."""

from __future__ import annotations

import json

import pytest

from marin_ablate.marin.config import (
    BASELINE_LEVELS,
    FACTORS,
    MODEL_FACTORS,
    RECIPE_LEVELS,
    ModelConfig,
    Recipe,
    RunSpec,
    TrainConfig,
    apply_overrides,
)
from marin_ablate.marin.presets import preset


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(top_k=17, n_experts=16), r"top_k.*allowed values: 1\.\.16"),
    (dict(d_model=66, n_heads=4), r"d_model.*not divisible by n_heads=4"),
    (dict(n_heads=4, n_kv_heads=3), r"n_kv_heads.*not divisible"),
    (dict(d_model=64, latent_ratio=3), r"latent_ratio=3 does not divide d_model=64"),
    (dict(n_experts=15, top_k=4), r"n_experts=15 is not divisible by latent_ratio"),
    (dict(qb_estimator="median"), r"qb_estimator.*allowed values: 'hist', 'topk'"),
    (dict(kernels="cuda"), r"kernels.*allowed values: 'torch', 'triton'"),
    (dict(sconv_sites=("q",)), r"sconv_sites.*allowed values: 'k', 'attn_out', 'mlp_out', 'v'"),
    (dict(head_dim=16, rope_fraction=0.1875), r"rope_fraction.*=3 are odd; allowed values: a fraction that rotates an "
                                                r"even number"),
])
def test_bad_model_config_raises_value_error_naming_the_field(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("factor", FACTORS)
def test_unknown_recipe_level_lists_the_allowed_levels(factor):
    with pytest.raises(ValueError, match=rf"Recipe\.{factor}=.*allowed values: " + ", ".join(
            repr(v) for v in RECIPE_LEVELS[factor]).replace(".", r"\.")):
        Recipe(**{factor: "nope"})
    with pytest.raises(ValueError, match="unknown recipe factor 'nope'; allowed values: xsa"):
        Recipe().with_(nope="x")


def test_recipe_defaults_are_the_recipe_and_baseline_the_peer_levels():
    assert all(Recipe().is_on(f) for f in FACTORS)
    assert not any(Recipe.baseline().is_on(f) for f in FACTORS)
    assert {f: getattr(Recipe.baseline(), f) for f in FACTORS} == BASELINE_LEVELS
    assert MODEL_FACTORS == ("xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport")


def test_global_layers_every_fourth_and_last_with_their_own_kv_heads():
    cfg = ModelConfig(n_layers=10, global_every=4, n_heads=8, n_kv_heads=4, n_kv_heads_global=2)
    assert [i for i in range(10) if cfg.is_global(i)] == [3, 7, 9]
    assert [cfg.kv_heads(i) for i in (0, 3, 9)] == [4, 2, 2]


def test_moe_geometry_standard_level_divides_experts_and_top_k_by_alpha_at_full_width():
    cfg = ModelConfig(d_model=64, n_experts=16, top_k=4, latent_ratio=2, expert_hidden=32)
    lat, std = cfg.moe_geometry(Recipe()), cfg.moe_geometry(Recipe(latent_moe="standard"))
    assert (lat.n_experts, lat.top_k, lat.width, lat.latent) == (16, 4, 32, True)
    assert (std.n_experts, std.top_k, std.width, std.latent) == (8, 2, 64, False)
    assert lat.n_experts * lat.width == std.n_experts * std.width  # equal routed params
    assert lat.top_k * lat.width == std.top_k * std.width  # equal routed FLOPs and bytes


def test_capacity_factor_follows_the_transport():
    cfg = ModelConfig()
    assert cfg.capacity_factor(Recipe()) == 1.15
    assert cfg.capacity_factor(Recipe(ep_transport="fixed")) == 1.33
    assert cfg.capacity_factor(Recipe(ep_transport="dropless")) is None


def test_overrides_parse_by_field_type_and_reject_unknown_fields():
    cfg = apply_overrides(ModelConfig(), ["d_model=128", "gated_norm=on", "init_scale=0.25", "sconv_sites=k,v"])
    assert (cfg.d_model, cfg.gated_norm, cfg.init_scale, cfg.sconv_sites) == (128, "on", 0.25, ("k", "v"))
    with pytest.raises(ValueError, match="no field 'width'; allowed values:"):
        apply_overrides(ModelConfig(), ["width=3"])
    with pytest.raises(ValueError, match="ModelConfig.d_model: cannot parse 'big'"):
        apply_overrides(ModelConfig(), ["d_model=big"])
    with pytest.raises(ValueError, match="unknown preset 'd99'; allowed values: tiny"):
        preset("d99")


def test_run_id_is_a_stable_hash_of_the_canonical_spec():
    spec = RunSpec(model=preset("cpu_s"), recipe=Recipe.baseline(), train=TrainConfig(steps=7), seed=3)
    again = RunSpec.from_dict(spec.to_dict())
    assert again == spec and again.run_id == spec.run_id
    other = RunSpec(model=preset("cpu_s"), recipe=Recipe.baseline(), train=TrainConfig(steps=7), seed=4)
    assert other.run_id != spec.run_id


def test_a_study_files_context_stage_with_a_string_fraction_is_refused_naming_the_field():
    from marin_ablate.marin.config import ContextStage

    with pytest.raises(ValueError, match=r"^TrainConfig\.context_stages: stage start_frac='0\.5' is out of range; "
                                         r"allowed values: a number in \[0, 1\)$"):
        ContextStage("0.5", 128)
    with pytest.raises(ValueError, match=r"stage seq_len=128\.0 is out of range; allowed values: an integer >= 1"):
        TrainConfig(context_stages=((0.5, 128.0),))


def test_context_stages_read_the_command_line_form_and_spec_json_alike():
    from marin_ablate.marin.config import ContextStage

    t = apply_overrides(TrainConfig(), ["context_stages=0.5:16384,0.95:65536"])
    assert t.context_stages == (ContextStage(0.5, 16384), ContextStage(0.95, 65536))
    spec = RunSpec(train=t)
    assert RunSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert apply_overrides(t, ["context_stages="]).context_stages == ()


def test_a_context_stage_that_never_trains_is_refused_naming_its_step():
    from marin_ablate.marin.config import ContextStage
    from marin_ablate.marin.train.stages import context_plan

    four = RunSpec(train=TrainConfig(steps=4, context_stages=(ContextStage(0.99, 128),)))
    with pytest.raises(ValueError, match=r"start_frac=0\.99 \(seq_len 128\) starts at step round\(0\.99 x 4\) = 4, "
                                         r"after the last step, so a stage never trains"):
        context_plan(four)
    same = RunSpec(train=TrainConfig(steps=4, context_stages=(ContextStage(0.5, 128), ContextStage(0.6, 256))))
    with pytest.raises(ValueError, match=r"round\(0\.6 x 4\) = 2, where the stage before it starts \(2\)"):
        context_plan(same)
    assert [s.start_step for s in context_plan(RunSpec(train=TrainConfig(steps=4, context_stages=(
        ContextStage(0.0, 128), ContextStage(0.5, 256)))))] == [0, 2]  # a stage from step 0 replaces stage 0
