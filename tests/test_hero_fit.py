"""Making the hero fit: activation checkpointing and the chunked loss change no number; the hero's
eval batch and data path; the per-rank memory plan and its dry run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from marin.config import ModelConfig, Recipe
from marin.model import MarinModel

CFG = ModelConfig(seq_len=16, window=6, n_layers=2, global_every=2)
B, S = 2, 16


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, CFG.vocab_size, (B, S + 1), generator=g)
    docs = (torch.arange(S) >= S // 3).long().expand(B, S)
    targets = tok[:, 1:].clone()
    targets[0, :3] = -100  # some ignored targets: the sums must skip them
    return tok[:, :-1], docs, targets


def _twin(recipe: Recipe, cfg: ModelConfig = CFG, **kw) -> tuple[MarinModel, MarinModel]:
    torch.manual_seed(3)
    ref = MarinModel(cfg, recipe).train()
    other = MarinModel(cfg, recipe, **kw).train()
    other.load_state_dict(ref.state_dict())
    return ref, other


def _step(model: MarinModel, seed: int):
    tok, docs, targets = _batch(seed)
    out = model(tok, docs, targets)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.update_router_biases()
    biases = [r.bias_E.clone() for r in (b.moe.router for b in model.blocks)]
    model.zero_grad(set_to_none=True)
    return out, grads, biases


TOPK = dataclasses.replace(CFG, qb_estimator="topk")


@pytest.mark.parametrize("recipe,cfg", [(Recipe(), CFG), (Recipe(), TOPK), (Recipe(router_balance="aux_free"), CFG),
                                        (Recipe(router_balance="switch_aux"), CFG)],
                         ids=["qb_hist", "qb_topk", "aux_free", "switch_aux"])
def test_block_checkpointing_leaves_losses_grads_and_router_biases_unchanged(recipe, cfg):
    ref, ck = _twin(recipe, cfg, activation_checkpoint="block")
    for seed in range(3):  # biases of step s steer the routing of step s+1: drift would compound
        a, ga, ba = _step(ref, seed)
        b, gb, bb = _step(ck, seed)
        torch.testing.assert_close(b.loss, a.loss, rtol=0, atol=0)
        torch.testing.assert_close(b.aux_loss, a.aux_loss, rtol=0, atol=0)
        for n in ga:
            torch.testing.assert_close(gb[n], ga[n], rtol=1e-6, atol=1e-7, msg=n)
        for x, y in zip(bb, ba):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    if recipe.router_balance != "switch_aux":  # the balancing really moved the biases
        assert any(bool(b.abs().sum() > 0) for b in ba)


def test_block_checkpointing_records_router_statistics_once_per_forward():
    _, ck = _twin(Recipe(), TOPK, activation_checkpoint="block")
    tok, docs, targets = _batch()
    ck(tok, docs, targets).loss.backward()  # the backward reruns every block
    assert [b.moe.router._n_forwards for b in ck.blocks] == [1, 1]


@pytest.mark.parametrize("chunk", [1, 5, 7, B * S, 4 * B * S])
def test_chunked_loss_equals_full_loss_and_gradients(chunk):
    ref, ch = _twin(Recipe(), loss_chunk_tokens=chunk)
    a, ga, _ = _step(ref, 0)
    b, gb, _ = _step(ch, 0)
    assert a.logits_BSV is not None and b.logits_BSV is None  # the chunked forward never built them
    for f in ("loss", "ce_loss", "z_loss"):
        torch.testing.assert_close(getattr(b, f), getattr(a, f), rtol=1e-6, atol=1e-6)
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], rtol=1e-5, atol=1e-7, msg=n)


def test_loss_matches_an_independent_cross_entropy():
    torch.manual_seed(0)
    model = MarinModel(CFG, Recipe(), loss_chunk_tokens=5).train()
    tok, docs, targets = _batch()
    out = model(tok, docs, targets)
    with torch.no_grad():
        logits = MarinModel.forward(model, tok, docs).logits_BSV.double().reshape(B * S, -1)
    t = targets.reshape(-1)
    keep = t != -100
    lp = torch.log_softmax(logits[keep], -1)
    ce = -lp.gather(1, t[keep, None]).mean()
    z = CFG.z_loss_weight * torch.logsumexp(logits[keep], -1).pow(2).mean()
    torch.testing.assert_close(out.ce_loss.double(), ce, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.z_loss.double(), z, rtol=1e-5, atol=1e-9)


def test_all_targets_ignored_gives_zero_loss_with_a_graph():
    torch.manual_seed(0)
    model = MarinModel(CFG, Recipe(router_balance="quantile"), loss_chunk_tokens=7).train()
    tok, docs, targets = _batch()
    out = model(tok, docs, torch.full_like(targets, -100))
    assert float(out.ce_loss.detach()) == 0.0 and out.loss.requires_grad
    out.loss.backward()


def test_memory_switches_reject_bad_levels():
    with pytest.raises(ValueError, match="activation_checkpoint.*none, block"):
        MarinModel(CFG, Recipe(), activation_checkpoint="full")
    from marin.config import TrainConfig
    with pytest.raises(ValueError, match="activation_checkpoint"):
        TrainConfig(activation_checkpoint="layer")
    with pytest.raises(ValueError, match="loss_chunk_tokens"):
        TrainConfig(loss_chunk_tokens=-1)
    with pytest.raises(ValueError, match="eval_batch_size"):
        TrainConfig(eval_batch_size=0)
    assert dataclasses.replace(TrainConfig(), activation_checkpoint="block").activation_checkpoint == "block"


def _small_hero(**train):
    """The hero's layout rules at a width and world a CPU test affords: 8 GPUs, EP 4, 2 sequences each."""
    from marin.config import RunSpec, TrainConfig

    model = ModelConfig(d_model=64, n_layers=2, n_heads=4, head_dim=16, seq_len=64, window=32, n_experts=8,
                        top_k=2, ep_shards=4)
    t = TrainConfig(**{"batch_size": 16, "activation_checkpoint": "block", "loss_chunk_tokens": 32, **train})
    return RunSpec(model=model, recipe=Recipe(), train=t)


def test_dry_run_at_a_reduced_layout_fits_with_checkpointing_and_names_the_line_without_it():
    from sweeps.dryrun import GiB, dry_run

    on = dry_run(_small_hero(), 8, 4, capacity_gib=1.0, reserve_gib=0.5, levels=("hyperball", "adamw"))
    assert on["ranks"] == [0, 3, 4, 7] and on["experts_per_rank"] == 2 and on["sequences_per_rank"] == 2
    t = {lv: {r["line"].split(" (")[0]: r["bytes"] for r in on["tables"][lv]["rows"]} for lv in on["tables"]}
    assert t["hyperball"]["parameters"] == t["hyperball"]["gradients"] > 0
    assert t["hyperball"]["activations kept"] > 0 and t["hyperball"]["transient: one block recomputed in the backward"] > 0
    # the AdamW arm keeps two moments where MuonH keeps one momentum
    assert t["adamw"]["optimizer adamw [matrix]"] == 2 * t["hyperball"]["optimizer muonh [matrix]"]
    # a budget between the two: checkpointing on fits, off does not, and the table says which line broke it
    total_on = on["tables"]["hyperball"]["total"]
    off_spec = _small_hero(activation_checkpoint="none")
    cap = 0.5 + 1.02 * total_on / GiB
    off = dry_run(off_spec, 8, 4, capacity_gib=cap, reserve_gib=0.5, levels=("hyperball",))
    assert total_on <= (cap - 0.5) * GiB and not off["ok"]
    kept_off = {r["line"].split(" (")[0]: r["bytes"] for r in off["tables"]["hyperball"]["rows"]}["activations kept"]
    assert kept_off > t["hyperball"]["activations kept"]
    assert off["tables"]["hyperball"]["over_budget"]
