"""torch.compile of the model: the training forward is one graph, a compiled run does not
recompile from step to step, and it computes what eager computes.

CPU stands in for the GPU. Under bf16 autocast the grouped GEMMs run through torch._grouped_mm as
on an H200 (in fp32 on CPU, compiled code falls back to a per-expert loop that reads the offsets on
the host, so it is traced in bf16 here). A graph break is also where eager code would wait for the
device (`.item()`, `.tolist()`, value-dependent shapes), so "one graph" means "no sync in forward".
"""

import copy

import pytest
import torch

from marin_ablate.marin.config import ModelConfig, Recipe
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.presets import tiny

# Multi-process training, torch.compile, simulated studies or real SLURM jobs: minutes on 2 cores.
# `python -m pytest -m "not slow"` leaves this file out of the development loop; CI runs it.
pytestmark = pytest.mark.slow


RECIPES = {
    "recipe": Recipe(),
    "baseline": Recipe.baseline(),
    "extras": Recipe(qk_norm="none", router_balance="aux_free", ep_transport="dropless", optimizer="adamh"),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _batch(cfg: ModelConfig, B=2, S=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    doc_ids = (torch.arange(S) // 23).expand(B, S)  # three packed documents per row
    return tokens, doc_ids, tokens.roll(-1, 1)


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _assert_one_graph(model, *inputs):
    with _bf16():
        ex = torch._dynamo.explain(model)(*inputs)
    reasons = [f"{r.reason.splitlines()[0]} at {r.user_stack[-1] if r.user_stack else '?'}" for r in ex.break_reasons]
    assert ex.graph_break_count == 0 and ex.graph_count == 1, reasons


@pytest.mark.parametrize("name", list(RECIPES))
def test_training_forward_traces_as_one_graph(name):
    cfg = tiny()
    torch.manual_seed(0)
    model = MarinModel(cfg, RECIPES[name]).train()
    _assert_one_graph(model, *_batch(cfg))


def test_training_forward_with_histogram_balancing_and_standard_moe_traces_as_one_graph():
    cfg = ModelConfig(qb_estimator="hist")
    torch.manual_seed(0)
    model = MarinModel(cfg, Recipe(latent_moe="standard")).train()
    _assert_one_graph(model, *_batch(cfg))


def test_training_forward_with_triton_kernels_traces_as_one_graph():
    pytest.importorskip("triton")
    cfg = ModelConfig(kernels="triton")
    torch.manual_seed(0)
    model = MarinModel(cfg, Recipe()).train()
    _assert_one_graph(model, *_batch(cfg))


@pytest.mark.parametrize("estimator", ["topk", "hist"])
def test_compiled_training_matches_eager_and_never_recompiles(estimator):
    # aot_eager traces forward and backward like inductor does, without its ~2 min CPU codegen.
    cfg = ModelConfig(qb_estimator=estimator)
    torch.manual_seed(0)
    eager = MarinModel(cfg, Recipe()).train()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            tokens, doc_ids, targets = _batch(cfg, seed=step)
            outs = []
            for model, fwd in ((eager, eager), (compiled_model, compiled)):
                with _bf16():
                    out = fwd(tokens, doc_ids, targets)
                out.loss.backward()
                outs.append(out)
                with torch.no_grad():  # a plain SGD step, then the QB bias from this step's routing
                    for p in model.parameters():
                        p.sub_(0.05 * p.grad)
                        p.grad = None
                model.update_router_biases()
            ref, got = outs
            assert abs(got.loss.item() - ref.loss.item()) < 2e-3 * abs(ref.loss.item()), step
            assert got.stats["assigned"] == ref.stats["assigned"]
            assert abs(got.stats["drop_rate"] - ref.stats["drop_rate"]) < 0.02, step
    # The QB biases were updated in both (bf16 rounding moves the thresholds a little, not the pattern).
    for (name, b_ref), b_got in zip(eager.named_buffers(), compiled_model.buffers(), strict=True):
        assert b_ref.abs().max() > 0 and torch.cosine_similarity(b_ref, b_got, dim=0) > 0.9, name


def test_trainer_compiles_each_block_once_per_layer_kind_and_matches_eager(tmp_path, monkeypatch):
    # TrainConfig.compile compiles blocks, not the model (torchtitan's choice): graphs per layer kind,
    # not per layer. aot_eager stands in for inductor, whose CPU codegen takes minutes.
    import json

    from torch._dynamo.utils import counters

    from marin_ablate.marin.config import RunSpec, TrainConfig
    from marin_ablate.marin.presets import preset
    from marin_ablate.marin.train import train

    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_(self, backend="aot_eager"))
    cfg = preset("tiny", ["n_layers=5", "seq_len=64"])  # layers 0-2 local, 3 and 4 global
    losses = {}
    for compiled in (False, True):
        t = TrainConfig(steps=3, batch_size=2, eval_every=0, eval_batches=1, log_every=1, checkpoint_every=0,
                        threads=1, precision="bf16", compile=compiled)
        counters.clear()
        summary = train(RunSpec(model=cfg, train=t), tmp_path / str(compiled), resume=False)
        assert summary["status"] == "completed", summary.get("error")
        rows = [json.loads(x) for x in (tmp_path / str(compiled) / "metrics.jsonl").read_text().splitlines()]
        losses[compiled] = [r["loss"] for r in rows if "loss" in r]
        if compiled:
            # local and global layer kinds, each in training and in the final eval (dropless): 2 x 2
            assert counters["stats"]["unique_graphs"] == 4
    # Same weights at step 0; after that bf16 rounding differences grow through two large updates.
    assert losses[True][0] == pytest.approx(losses[False][0], rel=1e-3)
    assert losses[True] == pytest.approx(losses[False], rel=1e-2)


def test_compiled_flex_blocks_take_fresh_block_masks_each_step_without_recompiling():
    # The model builds new BlockMasks (new mask_mod closures over new doc ids) every forward; compiled
    # blocks must treat them as inputs, not recompile. Forward only: CPU has no flex backward.
    from torch._dynamo.utils import counters

    flex_cfg = ModelConfig(attention="flex", n_layers=3)  # layers 0, 1 local, layer 2 global
    torch.manual_seed(0)
    flex = MarinModel(flex_cfg, Recipe()).eval()
    sdpa = MarinModel(ModelConfig(n_layers=3), Recipe()).eval()
    sdpa.load_state_dict(flex.state_dict())
    for block in flex.blocks:
        block.compile(backend="aot_eager")
    counters.clear()
    with torch.no_grad():
        for step in range(3):
            tokens = torch.randint(0, flex_cfg.vocab_size, (2, 64))
            doc_ids = (torch.arange(64) // (10 + step)).expand(2, 64).contiguous()  # new boundaries each step
            with _bf16():
                got, ref = flex(tokens, doc_ids, tokens), sdpa(tokens, doc_ids, tokens)
            assert abs(got.loss.item() - ref.loss.item()) < 1e-3 * ref.loss.item(), step
    assert counters["stats"]["unique_graphs"] == 2  # one per layer kind, for all three steps
