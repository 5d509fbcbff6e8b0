"""Gradient accumulation (marin/train/accum.py, TrainConfig.micro_batches): a step of k micro-batches is the
one-batch step in fp32 on CPU to rounding: loss, CE, z-loss, Switch aux loss, every gradient, the drops, the
router statistics and the balancing bias update; the split is not part of the run id and the run records it."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json

import pytest
import torch

from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train import train
from marin_ablate.marin.train.accum import accumulate_step
from marin_ablate.marin.train.distributed import ParallelDims
from marin_ablate.marin.train.step import forward_backward

RECIPES = {
    "recipe (QB hist, ragged)": (Recipe(), {}),
    "QB topk": (Recipe(), {"qb_estimator": "topk"}),
    "Switch aux, fixed": (Recipe(router_balance="switch_aux", ep_transport="fixed"), {}),
    "aux-free, pooled wave": (Recipe(router_balance="aux_free", ep_transport="pooled_wave"), {}),
    "baseline (standard MoE, Switch aux, fixed)": (Recipe.baseline(), {}),
    "dropless": (Recipe(ep_transport="dropless"), {}),
}


def _batch(cfg, B: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len), generator=g)
    docs = torch.cumsum((torch.rand(B, cfg.seq_len, generator=g) < 0.05).long(), 1)
    targets = tok.roll(-1, 1)
    targets[0, :7] = -100  # micro-batches with different valid-target counts: the step's token mean must hold
    targets[3, :] = -100
    return tok, targets, docs


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name", list(RECIPES))
def test_a_k_micro_batch_step_equals_the_one_batch_step(name, k):
    recipe, over = RECIPES[name]
    cfg = preset("tiny", [f"{f}={v}" for f, v in over.items()])
    torch.manual_seed(0)
    one = MarinModel(cfg, recipe).train()
    acc = copy.deepcopy(one)
    tok, targets, docs = _batch(cfg)
    o1, loss1, ce1, gn1 = forward_backward(one, tok, targets, docs, contextlib.nullcontext, None)
    o2, loss2, ce2, gn2 = accumulate_step(acc, tok, targets, docs, contextlib.nullcontext, None, k, ParallelDims())
    assert loss2 == pytest.approx(loss1, rel=1e-6) and ce2 == pytest.approx(ce1, rel=1e-6)
    assert gn2 == pytest.approx(gn1, rel=1e-5)
    aux1, z1 = float(o1.aux_loss.detach()), float(o1.z_loss.detach())
    assert float(o2.aux_loss) == pytest.approx(aux1, rel=1e-5, abs=1e-9)
    assert float(o2.z_loss) == pytest.approx(z1, rel=1e-5)
    if recipe.router_balance == "switch_aux":
        assert aux1 > 0
    for (n, p), q in zip(one.named_parameters(), acc.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-8, msg=n)
    s1, s2 = o1.stats, o2.stats
    assert s2["dropped"] == s1["dropped"] and s2["assigned"] == s1["assigned"]  # the same assignments dropped
    if recipe.ep_transport != "dropless":
        assert s1["dropped"] > 0  # the transport drops here, so the step-wide plan is exercised
    for key in ("load_cv", "max_load_ratio", "router_z", "switch_balance", "dispatch_bytes"):
        assert s2[key] == pytest.approx(s1[key], rel=1e-5), key
    one.update_router_biases()
    acc.update_router_biases()
    for a, b in zip(one.blocks, acc.blocks, strict=True):
        torch.testing.assert_close(b.moe.router.bias_E, a.moe.router.bias_E, rtol=0, atol=1e-7)
    if recipe.router_balance != "switch_aux":
        assert any(bool(b.moe.router.bias_E.abs().sum() > 0) for b in one.blocks)  # the bias really moved


def test_per_micro_batch_routing_statistics_would_differ_so_the_pins_matter():
    # Without the step's routing pinned, a micro-batch of the ragged transport decides drops over its own tokens
    # (smaller receiver pools): the counts differ from the one-batch step's, so the equality above is not free.
    cfg = preset("tiny")
    torch.manual_seed(0)
    model = MarinModel(cfg, Recipe()).train()
    tok, targets, docs = _batch(cfg)
    with torch.no_grad():
        whole = model(tok, docs, targets).stats["dropped"]
        parts = sum(model(t, d, y).stats["dropped"]
                    for t, d, y in zip(tok.chunk(4), docs.chunk(4), targets.chunk(4), strict=True))
    assert parts != whole


SPEC = RunSpec(model=preset("tiny", ["seq_len=64"]), recipe=Recipe(),
               train=TrainConfig(steps=4, batch_size=4, eval_every=0, eval_batches=1, log_every=1, checkpoint_every=0,
                                 threads=1))


def _losses(run_dir) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def test_the_split_is_not_in_the_run_id_trains_the_same_run_and_is_recorded(tmp_path):
    split = dataclasses.replace(SPEC, train=dataclasses.replace(SPEC.train, micro_batches=2))
    assert split.run_id == SPEC.run_id  # how a batch is split is not what the run computes
    ref = train(SPEC, tmp_path / "one", resume=False)
    got = train(split, tmp_path / "two", resume=False)
    assert got["run_id"] == ref["run_id"] and got["status"] == "completed"
    assert got["micro_batches"] == 2 and ref["micro_batches"] == 1  # summary.json records the split
    assert got["threads"] == 1
    assert json.loads((tmp_path / "two" / "spec.json").read_text())["train"]["micro_batches"] == 2
    for a, b in zip(_losses(tmp_path / "one"), _losses(tmp_path / "two"), strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert a["drop_rate"] == b["drop_rate"] and abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * a["grad_norm"]
    assert abs(got["eval_macro_loss"] - ref["eval_macro_loss"]) < 1e-5


def test_micro_batches_that_do_not_split_a_rank_s_rows_are_refused_before_anything_is_written(tmp_path):
    bad = dataclasses.replace(SPEC, train=dataclasses.replace(SPEC.train, micro_batches=3))
    with pytest.raises(ValueError, match=r"TrainConfig.micro_batches=3: 4 sequences per rank .* do not split into 3 "
                                         r"equal micro-batches; allowed values: divisors of 4"):
        train(bad, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r"TrainConfig.micro_batches"):
        TrainConfig(micro_batches=0)


def test_a_longer_context_stage_takes_fewer_micro_batches_of_the_same_tokens_and_trains_the_unsplit_run(tmp_path):
    from marin_ablate.marin.config import ContextStage
    from marin_ablate.marin.train.stages import context_plan

    staged = dataclasses.replace(SPEC, train=dataclasses.replace(SPEC.train, context_stages=(ContextStage(0.5, 128),)))
    split = dataclasses.replace(staged, train=dataclasses.replace(staged.train, micro_batches=4))
    assert [(s.seq_len, s.batch_size, s.micro_batches) for s in context_plan(split)] == [(64, 4, 4), (128, 2, 2)]
    ref = train(staged, tmp_path / "one", resume=False)
    got = train(split, tmp_path / "two", resume=False)
    assert got["status"] == ref["status"] == "completed"
    for a, b in zip(_losses(tmp_path / "one"), _losses(tmp_path / "two"), strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])


def test_the_hero_on_one_gpu_splits_16_micro_batches_at_4k_into_4_at_16k_and_1_at_65k():
    from marin_ablate.ablations import get_study
    from marin_ablate.marin.train.distributed import check_micro_batches
    from marin_ablate.marin.train.stages import context_plan, stage_specs

    spec = get_study("hero_gpu").runs()[0][0].with_overrides(["train.micro_batches=16"])
    stages = context_plan(spec)
    assert [(s.seq_len, s.batch_size, s.micro_batches) for s in stages] == [(4096, 16, 16), (16384, 4, 4),
                                                                           (65536, 1, 1)]
    check_micro_batches(spec, stages, 1)
    assert [at.train.micro_batches for _, at, _ in stage_specs(spec)] == [16, 4, 1]
