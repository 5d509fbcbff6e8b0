"""The holdout study: Marin's hold-one-feature-out (the recipe, then each feature removed alone) at its
fast-track rungs, read through Marin's fast-ladder law (ablations/holdout.py, docs/holdout.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from marin_ablate.ablations.designs import arms
from marin_ablate.ablations.holdout import HOLDOUTS, MARIN_NOT_HELD_OUT, marin_arm
from marin_ablate.ablations.studies import get_study
from marin_ablate.marin.config import Recipe
from marin_ablate.marin.presets import preset

LINF, ALPHA = 1.2, 0.0842  # Marin experiments/grug/fast_track/README.md: L = 1.2 + 58.67·C^(−0.0842)


def test_holdout_arms_are_the_recipe_then_each_feature_removed_alone_at_marins_levels():
    s = get_study("holdout")
    assert s.arm_names == ["recipe", "no_xsa", "no_sconv", "no_latent", "no_muonh", "no_attn_gate", "no_gated_norm",
                           "full_rope_local", "no_qk_norm", "no_qb", "no_ragged"]
    specs = {m["arm"]: sp for sp, m in s.runs() if m["rung"] == "d512"}
    base = specs["recipe"]
    assert base.recipe == Recipe() and base.model == preset("d512", ["attention=flex", "kernels=triton"])
    changed = {}
    for arm, sp in specs.items():
        diff = {f"recipe.{k}": v for k, v in vars(sp.recipe).items() if getattr(base.recipe, k) != v}
        diff.update({f"model.{k}": v for k, v in vars(sp.model).items() if getattr(base.model, k) != v})
        assert sp.train == base.train and sp.data == base.data, arm  # data-matched, as Marin's
        changed[arm] = diff
    assert changed == {"recipe": {}, "no_xsa": {"recipe.xsa": "none"}, "no_sconv": {"recipe.sconv": "none"},
                       "no_latent": {"recipe.latent_moe": "full_width"},  # Marin's drop_latent
                       "no_muonh": {"recipe.optimizer": "adamh"},  # Marin's drop_muonh: AdamH on the hyperball
                       "no_attn_gate": {"model.attn_gate": False}, "no_gated_norm": {"model.gated_norm": "off"},
                       "full_rope_local": {"model.rope_fraction": 1.0},
                       "no_qk_norm": {"recipe.qk_norm": "learned_gain"},
                       "no_qb": {"recipe.router_balance": "switch_aux"}, "no_ragged": {"recipe.ep_transport": "fixed"}}
    # Marin's fast-track rungs: batch 128, 2,385 / 6,930 steps; every arm at the heuristic LRs (not LR-coupled)
    assert [(r.name, r.batch_size, r.steps()) for r in s.rungs] == [("d512", 128, 2385), ("d768", 128, 6930)]
    assert s.lr_coupled == () and s.hardware is not None
    assert (s.published_law.linf, s.published_law.alpha) == (LINF, ALPHA)
    # Marin's names: each of its ablations with an arm maps to it, the others are named as not held out
    assert {marin_arm(h.marin): h.arm for h in HOLDOUTS if h.marin} == {h.arm: h.arm for h in HOLDOUTS if h.marin}
    assert [h.arm for h in HOLDOUTS if h.marin is None] == ["no_qk_norm", "no_qb", "no_ragged"]
    with pytest.raises(ValueError, match="halve_sparsity.*no arm here.*allowed values: none, drop_xsa"):
        marin_arm("halve_sparsity")
    assert set(MARIN_NOT_HELD_OUT) == {"halve_granularity", "halve_sparsity", "drop_gqa"}


def test_full_width_latent_level_is_marins_drop_latent_384_experts_top_8_at_width_d_half_hidden():
    import torch

    from marin_ablate.marin.flops import params_active_marin
    from marin_ablate.marin.moe import MoE

    cfg = preset("d512")
    lat, full, std = (cfg.moe_geometry(replace(Recipe(), latent_moe=lv)) for lv in ("latent", "full_width",
                                                                                    "standard"))
    assert (full.n_experts, full.top_k, full.width, full.hidden, full.latent) == (384, 8, 512, 128, False)
    assert full.width * full.hidden == lat.width * lat.hidden  # the same parameters per expert
    assert (std.n_experts, std.top_k) == (192, 4)  # our factorial's baseline level is another change
    # Marin's active count: the routed FLOPs are the same, the latent projections 2·d·ℓ per layer are gone
    gap = params_active_marin(cfg, Recipe()) - params_active_marin(cfg, replace(Recipe(), latent_moe="full_width"))
    assert gap == cfg.n_layers * 2 * 512 * 256
    small = replace(preset("tiny"), ep_shards=1)
    moe = MoE(small, replace(Recipe(), latent_moe="full_width"))
    assert not hasattr(moe, "latent_down") and moe.w_gate_EWH.shape == (small.n_experts, small.d_model,
                                                                          small.expert_hidden // 2)
    out = moe(torch.randn(2, 8, small.d_model))
    assert out.y_BSD.shape == (2, 8, small.d_model) and torch.isfinite(out.y_BSD).all()
    with pytest.raises(ValueError, match="expert_hidden=33 is not divisible by latent_ratio=2"):
        replace(small, expert_hidden=33).moe_geometry(replace(Recipe(), latent_moe="full_width"))


def test_labelled_arms_name_each_row_and_refuse_labels_that_do_not_fit():
    d = arms(["a", "b"], [[1, 1], [-1, 1]], labels=("recipe", "no_a"))
    from marin_ablate.ablations.designs import arm_name

    assert [arm_name(d, i) for i in range(2)] == ["recipe", "no_a"] and d.describe()["labels"] == ["recipe", "no_a"]
    for bad in (("recipe",), ("x", "x"), ("recipe", "no a")):
        with pytest.raises(ValueError, match="Design.labels"):
            arms(["a", "b"], [[1, 1], [-1, 1]], labels=bad)


def _prepared(tmp_path: Path) -> list[str]:
    from marin_ablate.marin.data import prepare as prep

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"format": prep.FORMAT, "tokens": 10 ** 10, "dtype": "uint16",
                                                      "documents": 1, "shards": [],
                                                      "tokenizer": {"vocab_size": 16384}}))
    (tmp_path / "eval" / "web" / "val").mkdir(parents=True)
    return [f"--data.corpus={corpus}", f"--data.eval_dir={tmp_path / 'eval'}"]


def test_plan_holdout_prints_its_arms_and_their_gpu_cost(tmp_path, capsys):
    from marin_ablate.cli.main import main

    data = _prepared(tmp_path)
    assert main(["plan", "holdout", *data]) == 0
    text = capsys.readouterr().out
    assert "arms (11): recipe, no_xsa, no_sconv, no_latent, no_muonh, no_attn_gate" in text
    assert "reference law: L∞ = 1.2 and α = 0.0842 pinned from Marin's fast ladder" in text
    assert main(["plan", "holdout", "--json", *data]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["n_runs"], r["gpus"]) for r in d["rungs"]] == [("d512", 11, 8), ("d768", 11, 8)]
    # 11 arms x the rung's FLOPs at the assumed 20% of an H100's 989 TFLOP/s
    assert d["cost"]["gpu_hours"] == pytest.approx(d["cost"]["train_flops"] / (0.2 * 989e12) / 3600, rel=1e-6)
    assert d["published_law"]["linf"] == LINF and d["published_law"]["alpha"] == ALPHA


def _hand_ln_m(L, C, Lb, Cb):
    return (np.log(Lb - LINF) - np.log(L - LINF)) / ALPHA + np.log(Cb) - np.log(C)


def test_marins_holdout_table_imports_as_the_holdout_arms_and_reads_through_its_law(tmp_path, capsys):
    from marin_ablate.cli.main import main

    # Marin's baselines 3.156 / 2.872 (its fast ladder README), the arms' losses made up here
    rows = [("none", "d512", 3.156), ("drop_xsa", "d512", 3.17), ("drop_muonh", "d512", 3.23),
            ("drop_latent", "d512", 3.158), ("none", "d768", 2.872), ("drop_xsa", "d768", 2.884),
            ("drop_muonh", "d768", 2.94), ("drop_latent", "d768", 2.873)]
    src = tmp_path / "marin.csv"
    pd.DataFrame(rows, columns=["ablation", "rung", "loss"]).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src), "--import.layout", "marin_holdout",
                 "--study-dir", str(tmp_path / "marin")]) == 0
    # each imported arm holds the holdout study's levels of that arm
    ours = {m["arm"]: m["factors"] for _, m in get_study("holdout").runs() if m["rung"] == "d512"}
    for d in (tmp_path / "marin" / "runs").iterdir():
        meta = json.loads((d / "meta.json").read_text())
        assert meta["factors"] == ours[meta["arm"]], meta["arm"]
    assert main(["analyze", str(tmp_path / "marin"), "--report-dir", str(tmp_path / "rep")]) == 0
    got = pd.read_csv(tmp_path / "rep" / "ofat.csv")
    spec = {(m["arm"], m["rung"]): s for s, m in get_study("holdout").runs()}
    from marin_ablate.ablations.ladders import GPU_RUNGS, flops_per_token

    def C(arm, rung):
        s = spec[(arm, rung)]
        return flops_per_token(s.model, s.recipe) * GPU_RUNGS[rung].tokens()

    loss = {(marin_arm(a), r): v for a, r, v in rows}
    for r in got.to_dict("records"):
        want = _hand_ln_m(r["loss"], C(r["arm"], r["rung"]), loss[("recipe", r["rung"])], C("recipe", r["rung"]))
        assert np.log(r["M"]) == pytest.approx(want, abs=1e-9), (r["arm"], r["rung"])
    md = (tmp_path / "rep" / "report.md").read_text()
    # Marin's own Sc, losses only: ((L - 1.2)/(L_b - 1.2))^(1/0.0842); MuonH at d512: 1.554
    muonh = next(ln for ln in md.splitlines() if ln.startswith("| optimizer (hyperball -> adamh) | d512"))
    assert muonh.split("|")[-2].strip() == f"{((3.23 - LINF) / (3.156 - LINF)) ** (1 / ALPHA):.3f}" == "1.554"
    assert "pinned from the study folder's law: Marin's fast ladder" in md


def test_a_marin_table_with_an_unknown_ablation_or_column_is_refused_before_anything_is_written(tmp_path):
    from marin_ablate.analysis.io.importer import import_file

    for rows, msg in (([{"ablation": "drop_gqa", "rung": "d512", "loss": 3.2}], "row 1, column 'ablation'.*drop_gqa"),
                      ([{"ablation": "none", "rung": "d9", "loss": 3.2}], "row 1, column 'rung'.*allowed values: d512"),
                      ([{"ablation": "none", "rung": "d512", "loss": 3.2, "sc": 1}], "column 'sc'")):
        src = tmp_path / "m.json"
        src.write_text(json.dumps(rows))
        with pytest.raises(ValueError, match=msg):
            import_file(src, tmp_path / "out", layout="marin_holdout")
        assert not (tmp_path / "out").exists()


def test_a_marin_table_without_the_recipe_row_at_a_rung_is_refused_naming_the_rung(tmp_path, capsys):
    from marin_ablate.cli.main import main

    rows = [("none", "d512", 3.156), ("drop_xsa", "d512", 3.17), ("drop_xsa", "d768", 2.884),
            ("drop_muonh", "d768", 2.94)]
    src = tmp_path / "marin.csv"
    pd.DataFrame(rows, columns=["ablation", "rung", "loss"]).to_csv(src, index=False)
    assert main(["analyze", "--import.table", str(src), "--import.layout", "marin_holdout",
                 "--study-dir", str(tmp_path / "marin")]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "rung(s) d768: no row of ablation 'none' (the recipe arm" in err[0], err
    assert not (tmp_path / "marin").exists()


@pytest.mark.slow
def test_a_cpu_rehearsal_of_holdout_runs_end_to_end_to_a_report_with_the_ofat_table(tmp_path, monkeypatch, capsys):
    from marin_ablate.cli.main import main

    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["run", "holdout", "--rungs", "cpu_s16", "--out", str(tmp_path / "out")]) == 0
    sdir = tmp_path / "out" / "holdout"
    md = (sdir / "report" / "report.md").read_text()
    assert "# holdout: one-factor-at-a-time analysis" in md and "## Each feature's worth" in md
    got = pd.read_csv(sdir / "report" / "ofat.csv")
    assert sorted(got["arm"]) == sorted(h.arm for h in HOLDOUTS) and (got["rung"] == "cpu_s16").all()
    table = pd.read_parquet(sdir / "results.parquet").set_index("arm")
    assert (table["status"] == "completed").all() and len(table) == 11
    Lb, Cb = table.loc["recipe", ["eval_macro_loss", "train_flops"]]
    for r in got.to_dict("records"):  # every arm read through Marin's L∞ and α, paired with the recipe arm
        L, C = table.loc[r["arm"], ["eval_macro_loss", "train_flops"]]
        assert np.log(r["M"]) == pytest.approx(_hand_ln_m(L, C, Lb, Cb), abs=1e-9), r["arm"]
