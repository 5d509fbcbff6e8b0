"""ablations/: factor registry, verified two-level designs, ladders and studies (docs/method.md §4-5)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from marin_ablate.ablations.designs import Design, arms, fraction, full_factorial
from marin_ablate.ablations.factors import RECIPE_FACTORS, Factor, get_factor, recipe_factor
from marin_ablate.ablations.ladders import GPU_RUNGS, get_rung, params_active_marin
from marin_ablate.ablations.studies import HeroPlan, get_study
from marin_ablate.ablations.study import Study
from marin_ablate.marin.config import BASELINE_LEVELS, FACTORS, RECIPE_LEVELS, Recipe, RunSpec
from marin_ablate.marin.flops import flops_per_token
from marin_ablate.marin.hparams import HEURISTICS, resolve_hparams
from marin_ablate.marin.presets import preset

SEVEN = list(FACTORS)


# ---- factors ------------------------------------------------------------------------------------


def test_recipe_factor_registry_codes_baseline_minus_and_recipe_plus():
    assert set(RECIPE_FACTORS) == set(FACTORS)
    for name, f in RECIPE_FACTORS.items():
        assert f.field == f"recipe.{name}"
        assert f.level(-1) == BASELINE_LEVELS[name]
        assert f.level(+1) == RECIPE_LEVELS[name][0]
    assert recipe_factor("router_balance", low="aux_free").low == "aux_free"


def test_unknown_factor_or_level_raises_naming_allowed_values():
    with pytest.raises(ValueError, match=r"unknown factor 'xsaa'.*allowed values: xsa, sconv"):
        get_factor("xsaa")
    with pytest.raises(ValueError, match=r"no level 'big'.*allowed values: learned_gain, fixed_1.3"):
        RECIPE_FACTORS["qk_norm"].check_level("big")
    with pytest.raises(ValueError, match=r"no level 'fast'.*allowed values: fixed_1.3, learned_gain, none"):
        recipe_factor("qk_norm", low="fast")
    with pytest.raises(ValueError, match=r"ModelConfig has no field 'windw'.*allowed values:.*window"):
        Factor("window", field="model.windw", levels={"short": 32, "long": 64})
    with pytest.raises(ValueError, match=r"allowed values: recipe.<field>, model.<field>"):
        Factor("window", field="window", levels={"short": 32, "long": 64})
    study = get_study("smoke")
    levels = study.levels(0) | {"optimizer": "sgd"}
    with pytest.raises(ValueError, match=r"factor 'optimizer' has no level 'sgd'; allowed values: adamw, hyperball"):
        study.spec("cpu_s32", levels, seed=0)
    with pytest.raises(ValueError, match=r"unknown study 'smok'; allowed values: smoke"):
        get_study("smok")


def test_factor_on_a_model_field_sets_that_field_per_arm():
    window = Factor("window", field="model.window", levels={"short": 32, "long": 64})
    design = full_factorial(["xsa", window])
    study = Study("w", "window x xsa", ("xsa", window), design, ("cpu_s",))
    got = {(m["factors"]["xsa"], m["factors"]["window"]): (s.recipe.xsa, s.model.window) for s, m in study.runs()}
    assert got == {("none", "short"): ("none", 32), ("none", "long"): ("none", 64),
                   ("xsa", "short"): ("xsa", 32), ("xsa", "long"): ("xsa", 64)}


# ---- designs -----------------------------------------------------------------------------------


def test_full_factorial_has_every_combination_and_no_defining_words():
    d = full_factorial(["a", "b", "c"])
    assert d.n_runs == 8 and len(set(d.matrix)) == 8
    assert d.resolution is None and d.defining_relation() == ["I"]
    assert d.all_2fi_estimable and d.alias_table()["AB"] == []


def test_seven_factor_resolution_iv_request_gives_16_runs():
    d = fraction(SEVEN, resolution=4)
    assert d.n_runs == 16 and d.resolution == 4 and len(d.generators) == 3
    assert d.main_effects_clear and not d.all_2fi_estimable
    assert all(len(w.lstrip("-")) == 4 for w in d.defining_relation()[1:]) and len(d.defining_relation()) == 8


def test_resolution_iv_in_32_runs_is_minimum_aberration():
    d = fraction(SEVEN, resolution=4, runs=32)
    assert d.n_runs == 32 and d.resolution == 4 and d.word_length_pattern() == {4: 1, 5: 2}


def test_alias_table_of_2_7_3_matches_hand_computation():
    # I = ABCE = BCDF = ACDG and their products ADEF, BDEG, ABFG, CEFG (Box, Hunter & Hunter, 2^(7-3)_IV)
    d = fraction(SEVEN, generators=["E=ABC", "F=BCD", "G=ACD"])
    assert sorted(d.defining_relation()[1:]) == sorted(["ABCE", "BCDF", "ACDG", "ADEF", "BDEG", "ABFG", "CEFG"])
    table = d.alias_table(max_order=3)
    assert table["AB"] == ["CE", "FG"]
    assert table["A"] == ["BCE", "BFG", "CDG", "DEF"]
    assert d.aliases("AB") == ["CE", "FG", "ACDF", "ADEG", "BCDG", "BDEF", "ABCEFG"]
    # read from the matrix: A*B equals C*E and F*G in every run
    X = d.array
    assert np.array_equal(X[:, 0] * X[:, 1], X[:, 2] * X[:, 4]) and np.array_equal(X[:, 0] * X[:, 1], X[:, 5] * X[:, 6])


def test_negative_generator_flips_the_word_sign():
    d = fraction(list("abcd"), generators=["D=-ABC"])
    assert d.defining_relation() == ["I", "-ABCD"]
    assert np.all(np.prod(d.array, axis=1) == -1)


def test_checker_rejects_resolution_iv_design_labelled_v():
    with pytest.raises(ValueError, match=r"labelled resolution V has resolution IV.*word ABCE of length 4"):
        fraction(SEVEN, generators=["E=ABC", "F=BCD", "G=ACD"], resolution=5)
    good = fraction(SEVEN, resolution=4)
    with pytest.raises(ValueError, match=r"labelled resolution V has resolution IV"):
        Design(good.factors, good.matrix, good.generators, "fraction", label_resolution=5)


def test_checker_rejects_a_matrix_that_does_not_match_its_generators():
    d = fraction(list("abcdef"), generators=["F=ABCDE"])
    X = d.array.copy()
    X[:, 5] = X[:, 0] * X[:, 1] * X[:, 2]  # really F=ABC (resolution IV) under an F=ABCDE label
    with pytest.raises(ValueError, match=r"does not match its generators.*ABCDEF.*ABCF"):
        Design(d.factors, X.tolist(), d.generators, "fraction", label_resolution=6)
    X = d.array.copy()
    X[0] = X[1]  # a repeated run: not a regular fraction
    with pytest.raises(ValueError, match="not a regular two-level fraction"):
        Design(d.factors, X.tolist(), d.generators, "fraction")


def test_impossible_resolution_raises_naming_the_numbers():
    with pytest.raises(ValueError, match=r"resolution VII is impossible for 6 factors in 8 runs.*resolution III.*"
                                         r"needs at least 64 runs"):
        fraction(list("abcdef"), resolution=7, runs=8)
    with pytest.raises(ValueError, match=r"runs=12; allowed values: powers of two"):
        fraction(list("abcdef"), runs=12)
    with pytest.raises(ValueError, match=r"resolution=2; allowed values: integers >= 3"):
        fraction(list("abcdef"), resolution=2)


# ---- ladders -----------------------------------------------------------------------------------


def test_gpu_rungs_train_60_tokens_per_active_param_with_heuristic_lrs():
    r = GPU_RUNGS["d512"]
    cfg = r.model()
    assert r.tokens() / params_active_marin(cfg, Recipe()) == pytest.approx(60, rel=0.01)  # Marin's count
    h = HEURISTICS["aug_refit"]
    adam = h.adam_lr(r.tokens(), cfg.d_model, r.tokens_per_step)
    assert r.hparams(Recipe()).lr == pytest.approx(h.muonh_lr(r.tokens(), cfg.d_model, r.tokens_per_step))
    assert r.hparams(Recipe.baseline()).lr == pytest.approx(adam)  # AdamW takes the Adam rate
    assert r.hparams(Recipe(), lr_multiplier=2.0).adam_lr == pytest.approx(2 * adam)
    assert r.train_config(Recipe(), lr_multiplier=2.0).lr_scale == 2.0  # a rung sets only the multiplier
    assert r.train_config(Recipe()).lr is None and r.train_config(Recipe()).adam_lr is None
    with pytest.raises(ValueError, match="unknown rung 'd999'; allowed values: cpu_s"):
        get_rung("d999")


# ---- studies -----------------------------------------------------------------------------------


def test_marin535_plan_reports_32_runs_per_rung_and_seed_resolution_6_all_2fi_estimable():
    plan = get_study("marin535").describe()
    json.dumps(plan)
    assert plan["n_runs_per_rung_seed"] == 32 and plan["resolution"] == 6 and plan["all_2fi_estimable"]
    assert plan["defining_relation"] == ["I", "ABCDEF"]
    assert plan["fixed_recipe"] == {"ep_transport": "ragged"}
    assert [r["name"] for r in plan["rungs"]] == ["d512", "d768", "d1024"]
    assert all(r["n_runs"] == 32 for r in plan["rungs"]) and plan["cost"]["gpu_hours"] > 0
    assert "all_on" in plan["arms"] and "all_off" in plan["arms"]


def test_smoke_runs_are_valid_distinct_runspecs_sharing_data_across_arms():
    study = get_study("smoke")
    runs = study.runs()
    assert len(runs) == 16 * 2 * 8 and study.design.resolution == 4 and study.seeds == tuple(range(8))
    assert len({s.run_id for s, _ in runs}) == len(runs)
    by_cell: dict = {}
    for spec, meta in runs:
        assert set(meta) == {"study", "rung", "arm", "seed", "design_row", "factors", "coding"}
        assert RunSpec.from_dict(json.loads(spec.canonical_json())) == spec
        assert {f: getattr(spec.recipe, f) for f in FACTORS} == meta["factors"]
        assert spec.train.threads == 1 and spec.train.device == "cpu"
        by_cell.setdefault((meta["rung"], meta["seed"]), []).append(spec)
    for specs in by_cell.values():
        assert len({(s.data, s.train.steps, s.train.batch_size, s.model) for s in specs}) == 1
    assert {m["arm"] for _, m in runs} >= {"all_on", "all_off"}
    assert study.describe()["cost"]["est_wall_s"] <= 600


def test_lr_multiplier_scales_only_the_named_arm(tmp_path):
    from marin_ablate.sweeps.sweep import planned_runs

    study = get_study("smoke")
    base = {m["arm"]: resolve_hparams(s).lr for s, m in study.runs(rungs=["cpu_s32"])}
    half = {s: {"all_off": 0.5} for s in study.seeds}
    tuned = {r.meta["arm"]: resolve_hparams(r.spec).lr
             for r in planned_runs(study, tmp_path, lr_multipliers=half, rungs=["cpu_s32"])}
    assert tuned["all_off"] == pytest.approx(0.5 * base["all_off"])
    assert all(tuned[a] == base[a] for a in base if a != "all_off")
    with pytest.raises(ValueError, match=r"unknown arm\(s\) \['nope'\]; allowed values: all_off"):
        planned_runs(study, tmp_path, lr_multipliers={s: {"nope": 2.0} for s in study.seeds})


def test_noise_panel_is_all_on_and_all_off_over_five_seeds():
    runs = get_study("noise").runs()
    assert sorted({(m["arm"], m["seed"]) for _, m in runs}) == sorted((a, s) for a in ("all_on", "all_off")
                                                                       for s in range(5))
    assert all(s.recipe == Recipe() for s, m in runs if m["arm"] == "all_on")
    off = [s.recipe for s, m in runs if m["arm"] == "all_off"]
    assert all(r == Recipe.baseline().with_(ep_transport="ragged") for r in off)


def test_hero_plan_is_marins_704_gpu_layout_18t_tokens_on_ep64_gb200():
    plan = get_study("hero").describe()["hero"]
    assert plan["tokens"] == 390_251 * 11_264 * 4096 and plan["steps"] == 390_251 and plan["eval_every"] == 3_000
    assert plan["train_flops"] == pytest.approx(plan["tokens"] * flops_per_token(preset("hero_535b"), Recipe()))
    # 11 racks x 64 GB200 (16 trays of 4), 16 sequences = 65,536 tokens per GPU and EP shard
    assert plan["gpus"] == 704 and plan["nodes"] == 176 and plan["layout"]["nvl72_racks"] == 11
    assert plan["layout"]["sequences_per_gpu_per_step"] == 16 and plan["layout"]["tokens_per_ep_shard"] == 65_536
    assert plan["layout"]["experts_per_gpu"] == 6
    assert plan["layout"]["nodes_per_ep_group"] == 16 and plan["gpus_per_node"] == 4
    with pytest.raises(ValueError, match=r"11264 sequences do not split over 640 GPUs"):
        HeroPlan(ep_groups=10).check(get_study("hero").runs()[0][0])


def test_ablations_plan_without_importing_torch():
    code = ("import sys; from marin_ablate.ablations import get_study; get_study('marin535').describe(); "
            "get_study('smoke').runs(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_arms_design_has_no_alias_structure():
    d = arms(["a", "b"], ["all_on", "all_off"])
    assert d.describe()["resolution"] is None and not d.all_2fi_estimable
    with pytest.raises(ValueError, match="arms repeat a row"):
        arms(["a", "b"], ["all_on", [1, 1]])
