"""One source of truth per factor, per run and per hyperparameter: the factor table, stable run ids,
the hyperparameter resolver, and a new factor attributed end to end with no edit under analysis/."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from marin_ablate.ablations import RUNGS, Factor, Study, full_factorial, get_study, recipe_factor
from marin_ablate.ablations.ladders import Rung
from marin_ablate.marin.config import BASELINE_LEVELS, FACTORS, MODEL_FACTORS, RECIPE_LEVELS, Recipe
from marin_ablate.marin.hparams import HEURISTICS, resolve_hparams
from marin_ablate.marin.schema import RunMeta, RunSummary, read_summary, write_summary
from marin_ablate.marin.switches import QUALITY_FACTORS, RECIPE_FACTOR_SPECS

EXTENDING = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


# ---- the factor table ---------------------------------------------------------------------------


def test_recipe_and_level_lists_follow_from_the_factor_table():
    names = tuple(s.name for s in RECIPE_FACTOR_SPECS)
    assert FACTORS == names and tuple(f.name for f in dataclasses.fields(Recipe)) == names
    assert Recipe() == Recipe(**{s.name: s.recipe for s in RECIPE_FACTOR_SPECS})
    assert Recipe.baseline() == Recipe(**BASELINE_LEVELS)
    assert RECIPE_LEVELS["router_balance"] == ("quantile", "switch_aux", "aux_free")
    assert MODEL_FACTORS == tuple(n for n in names if n != "optimizer")
    assert QUALITY_FACTORS == tuple(n for n in names if n != "ep_transport")
    with pytest.raises(ValueError, match=r"Recipe.router_balance='nope' is not a known level; allowed values: "
                                         r"'quantile', 'switch_aux', 'aux_free'"):
        Recipe(router_balance="nope")


def test_studies_list_their_factors_explicitly():
    assert get_study("marin535").design.factors == ("xsa", "sconv", "qk_norm", "latent_moe", "router_balance",
                                                    "optimizer")
    assert len(get_study("smoke").design.factors) == 7 and get_study("smoke").design.n_runs == 16


# ---- runs carry their coding --------------------------------------------------------------------


def test_each_run_records_its_factors_levels_codes_and_definitions():
    study = Study("s", "t", (Factor("window", field="model.window", levels={"short": 16, "long": 32}),
                             recipe_factor("router_balance", low="aux_free")),
                  full_factorial(["window", "router_balance"]), (RUNGS["cpu_s32"],))
    for spec, meta in study.runs():
        m = RunMeta.from_dict(json.loads(json.dumps(meta)))
        assert m.to_dict() == meta
        w, rb = m.factors
        assert (w.field, w.low, w.high) == ("model.window", "short", "long")
        assert (rb.field, rb.low, rb.high) == ("recipe.router_balance", "aux_free", "quantile")
        assert spec.model.window == {"short": 16, "long": 32}[w.level] and spec.recipe.router_balance == rb.level
        assert w.code == (1 if w.level == "long" else -1) and rb.code == (1 if rb.level == "quantile" else -1)


def test_summary_schema_reads_what_train_writes_and_keeps_extra_keys(tmp_path):
    train_dict = {"run_id": "abc", "status": "completed", "eval_macro_loss": 3.2, "loss_curve": [[0, 5.0]],
                  "spike_steps": [], "lr_peak": 0.01, "eval_domain_bpb": {"web": 1.1}}
    s = write_summary(tmp_path, train_dict)
    back = read_summary(tmp_path)
    assert back == s and back.extra == {"lr_peak": 0.01, "eval_domain_bpb": {"web": 1.1}}
    assert back.loss_curve == ((0, 5.0),) and back.to_dict()["lr_peak"] == 0.01
    with pytest.raises(ValueError, match="RunSummary.status='done' is not a known level"):
        RunSummary(run_id="x", status="done")


# ---- one hyperparameter resolver ----------------------------------------------------------------


def test_august_refit_reproduces_the_hero_peak_lrs_and_eps():
    # Marin's hero: d 6144, batch 11,264 x 4,096 tokens, 390,251 steps (~18T tokens)
    B = 11_264 * 4_096
    D = 390_251.0 * B
    h = HEURISTICS["aug_refit"]
    assert h.muonh_lr(D, 6144, B) == pytest.approx(3.29e-3, rel=0.01)
    assert h.adam_lr(D, 6144, B) == pytest.approx(7.59e-4, rel=0.01)
    assert h.eps(D, B) == pytest.approx(6.04e-15, rel=0.01, abs=0)  # approx's default abs 1e-12 would accept any ε
    spec = get_study("hero").runs()[0][0]
    hp = resolve_hparams(spec)
    assert (hp.lr, hp.adam_lr) == (pytest.approx(3.29e-3, rel=0.01), pytest.approx(7.59e-4, rel=0.01))


@pytest.mark.parametrize("level", RECIPE_LEVELS["optimizer"])
@pytest.mark.parametrize("rung", ["cpu_s64", "cpu_s256", "d512", "d1024"])
def test_a_studys_lrs_equal_the_resolvers_for_every_optimizer_level_and_rung(level, rung):
    r = RUNGS[rung]
    study = Study("lr", "t", ("optimizer",), full_factorial(["optimizer"]), (r,),
                  base_recipe=Recipe(optimizer=level))
    spec = study.spec(rung, {"optimizer": "hyperball"}, 0, lr_multiplier=2.0)
    spec = dataclasses.replace(spec, recipe=Recipe(optimizer=level))
    hp, want = resolve_hparams(spec), r.hparams(Recipe(optimizer=level), lr_multiplier=2.0)
    assert hp == want and spec.train.lr is None and spec.train.lr_scale == 2.0
    h = HEURISTICS["aug_refit"]
    cfg = r.model()
    adam = 2.0 * h.adam_lr(r.tokens(), cfg.d_model, r.tokens_per_step)
    muonh = 2.0 * h.muonh_lr(r.tokens(), cfg.d_model, r.tokens_per_step)
    assert hp.adam_lr == pytest.approx(adam)
    # Muon+AdamW is RMS-matched to AdamW and shares its lr; MuonH/AdamH take the hyperball rate
    assert hp.lr == pytest.approx(muonh if level in ("hyperball", "adamh") else adam)


# ---- done when: a model factor and a third recipe level attributed with no edit under analysis/ --


@pytest.mark.slow
def test_new_model_factor_and_third_recipe_level_are_attributed_with_cis(tmp_path):
    from marin_ablate.analysis.io.results import collect
    from marin_ablate.analysis.pipeline import analyze_table
    from marin_ablate.sweeps.runs import RunTask, execute, plan_runs, write_run_files

    rungs = tuple(Rung(f"tiny{n}", "tiny", fixed_steps=n, batch_size=2,
                       train_overrides={"eval_batches": 1, "checkpoint_every": n, "log_every": 1})
                  for n in (2, 4, 8))
    window = Factor("window", field="model.window", levels={"short": 8, "long": 32})
    balance = recipe_factor("router_balance", low="aux_free")  # aux_free (-1) vs quantile (+1)
    study = Study("new_factors", "window x router_balance", (window, balance),
                  full_factorial(["window", "router_balance"]), rungs)
    sd = tmp_path / "new_factors"
    for run in plan_runs(study.runs(), sd):
        write_run_files(run)
        assert execute(RunTask.of(run))["status"] == "completed"
    t = collect(sd)
    assert set(t["router_balance"]) == {"aux_free", "quantile"} and set(t["window"]) == {"short", "long"}
    a = analyze_table(t, n_boot=20, interactions=False, seed=0)
    assert a.factors == ["window", "router_balance"]
    comp = a.components[a.components["response"] == "ln_M"].set_index("component")
    for f in ("window", "router_balance"):
        lo, hi = comp.loc[f, "shapley_lo"], comp.loc[f, "shapley_hi"]
        assert np.isfinite([lo, hi]).all() and lo <= comp.loc[f, "shapley"] <= hi


# ---- docs/extending.md "Adding a factor" stays true ------------------------------------------------


def _section(title: str) -> str:
    text = EXTENDING.read_text()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, f"docs/extending.md has no section {title!r}"
    return m.group(1)


def test_the_adding_a_factor_tutorial_code_runs():
    blocks = re.findall(r"```python\n(.*?)```", _section("Adding a factor"), re.S)
    assert blocks, "the section shows its steps as python code"
    from marin_ablate.ablations.studies import STUDIES

    ns: dict = {"STUDIES": dict(STUDIES)}  # the last block registers the builder in ablations/studies.py
    for b in blocks:
        exec(compile(b, "docs/extending.md", "exec"), ns)  # noqa: S102 - the doc's own example
    assert ns["STUDIES"]["my_study"] is ns["my_study"]
    study = ns["my_study"]()
    assert [f.name for f in study.factors] == ["window", "router_balance"]
    assert len(study.runs()) == study.design.n_runs * len(study.rungs)
    assert math.isfinite(resolve_hparams(study.runs()[0][0]).lr)
