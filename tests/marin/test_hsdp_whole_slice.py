"""The hero's own layout on 4 real gloo ranks: 2 racks x (dp_shard 1 x EP 2), so each rack holds a whole
EP slice of the experts per rank, as the hero's 64-rank racks of EP 64 do, its fp32 state ZeRO-sharded
across the racks (marin.parallel.ExpertShard; the non-expert parameters FSDP2 over a one-rank dp_shard
dim, their gradients averaged over the racks). Every optimizer level's two
steps equal one process; no block returns a view to FSDP2 (docs/hero.md). The dp_shard = 2 layout is
tests/marin/test_hsdp.py.
"""

import os
import warnings

import pytest
import torch
import torch.distributed as dist
from ranks import free_port, read_results, run_ranks, write_result
from test_hsdp import CLIP, LEVELS, RECIPE, SEED, STEP_TOL, _cfg, _full, _hp, _maxrel, _ref_model

pytestmark = pytest.mark.slow

WORLD, REPLICAS, EP = 4, 2, 2  # dp_shard = WORLD / REPLICAS / EP = 1
ROWS = 2
TIMEOUT_S = 600


def _batch(step: int) -> torch.Tensor:
    return torch.randint(0, 64, (WORLD * ROWS, 17), generator=torch.Generator().manual_seed(200 + step))


def _worker(rank: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    write_result(os.path.join(tmp, f"r{rank}.json"), lambda: _work(rank))


def _work(rank: int) -> dict:
    from torch.distributed.tensor import DTensor

    from marin_ablate.marin.ep import build_ep_groups, expert_param_names
    from marin_ablate.marin.parallel import build_sharded_model, clip_grad_norm_
    from marin_ablate.marin.update_rules import build_optimizer

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    groups = build_ep_groups(EP, replicas=REPLICAS)
    out: dict = {"dp_shard": groups.dp_shard_size}
    views: list[str] = []
    for level in LEVELS:
        model = build_sharded_model(_cfg(), RECIPE, groups, SEED).train()
        # the hero's expert state (marin.parallel.ExpertShard): the EP-sliced stack (n_experts / EP experts)
        # ZeRO-sharded on dim 1 across the racks, torch.chunk sizes, nothing whole on any rank
        n_e = _cfg().moe_geometry(RECIPE).n_experts
        out["zero_slices"] = all(isinstance(p, DTensor) and p.shape[0] == n_e // EP
                                 and p.to_local().shape[1] == torch.chunk(torch.empty(p.shape[1]), REPLICAS)[
                                     groups.mesh.get_local_rank("dp")].shape[0] < p.shape[1]
                                 for n, p in model.named_parameters() if n in set(expert_param_names(model)))
        opt = build_optimizer(model, _hp(level), expert_group=groups.ep_group)
        ref = _ref_model().train()
        ref_opt = build_optimizer(ref, _hp(level))
        init = {n: p.detach().clone() for n, p in ref.named_parameters()}
        for i in range(2):
            rows = _batch(i)[rank * ROWS:(rank + 1) * ROWS]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loss = model(rows[:, :-1], None, rows[:, 1:]).loss
            views += [str(w.message)[:80] for w in caught if "returned a view tensor" in str(w.message)]
            loss.backward()
            clip_grad_norm_(model, CLIP, groups.rack_group)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tok = _batch(i)
            ref(tok[:, :-1], None, tok[:, 1:]).loss.backward()
            torch.nn.utils.clip_grad_norm_(list(ref.parameters()), CLIP)
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
        out[f"step_{level}"] = _maxrel(_full(model, groups), dict(ref.named_parameters()))
        out[f"moved_{level}"] = max(float((p.detach() - init[n]).abs().max()) for n, p in ref.named_parameters())
    out["views"] = views
    dist.barrier()
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def whole_slice(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hsdp1")
    run_ranks(_worker, (free_port(), str(tmp)), WORLD, TIMEOUT_S)
    return read_results(tmp / f"r{r}.json" for r in range(WORLD))


def test_each_rank_holds_its_ep_slice_zero_sharded_across_the_racks(whole_slice):
    assert all(o["dp_shard"] == 1 and o["zero_slices"] for o in whole_slice)


@pytest.mark.parametrize("level", LEVELS)
def test_two_racks_of_whole_slices_step_like_one_process(whole_slice, level):
    for o in whole_slice:
        assert o[f"moved_{level}"] > 1e-3  # the reference moved: equality is not trivial
        assert o[f"step_{level}"] < STEP_TOL, (level, o[f"step_{level}"])


def test_no_fsdp_unit_returns_a_view(whole_slice):
    assert all(o["views"] == [] for o in whole_slice), whole_slice[0]["views"]
