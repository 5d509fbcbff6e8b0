"""Accumulation and GPU counts under real gloo ranks (marin/train/accum.py, marin.train.distributed.ep_group_size):
a run is the same experiment however many processes hold it and however each splits its rows.

- 2 EP ranks with 2 micro-batches each train as the same 2 ranks with one batch each;
- 1 process with 4 micro-batches (virtual EP over 4 shards) trains as 4 EP ranks with one batch each (a rung's
  one-GPU layout against its own);
- 2 ranks holding 2 of the run's 4 EP shards each train as one process (the layout of fewer GPUs than shards);
the last two for the recipe and for the Switch aux loss (its loads pooled over the world).
Equal losses, drops and grad norms step by step, to fp32 rounding.
"""

import dataclasses
import json
from pathlib import Path

import pytest
from ranks import free_port, read_results, run_ranks, write_result

from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train import train

pytestmark = pytest.mark.slow  # forked gloo ranks: tens of seconds on 2 cores

TIMEOUT_S = 180
LOSS_TOL = 1e-5

# ep_shards=4 with the hist estimator (exact under any layout); ragged drops (the recipe's transport)
SPEC = RunSpec(model=preset("tiny", ["seq_len=64", "ep_shards=4", "qb_estimator=hist"]), recipe=Recipe(),
               train=TrainConfig(steps=3, batch_size=8, eval_every=0, eval_batches=1, log_every=1,
                                 checkpoint_every=0, threads=1))


# The recipe (QB hist, ragged) and the baseline's balancing (the Switch aux loss: a product of batch means, so
# the ranks must pool its loads; fixed cells)
RECIPES = {"recipe": Recipe(), "switch_aux": Recipe(router_balance="switch_aux", ep_transport="fixed")}


def _with(spec: RunSpec, **train) -> RunSpec:
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, **train))


def _rank(rank: int, world: int, port: int, tmp: str, spec: RunSpec, name: str) -> None:
    import os

    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    write_result(os.path.join(tmp, f"{name}_r{rank}.json"),
                 lambda: {"summary": train(spec, Path(tmp) / name, resume=False)})


def _ranks(tmp: Path, spec: RunSpec, name: str, world: int) -> list[dict]:
    run_ranks(_rank, (world, free_port(), str(tmp), spec, name), world, TIMEOUT_S)
    return [o["summary"] for o in read_results(tmp / f"{name}_r{r}.json" for r in range(world))]


def _lines(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def _same_run(a_dir: Path, b_dir: Path) -> None:
    a, b = _lines(a_dir), _lines(b_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(SPEC.train.steps))
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) < LOSS_TOL, (x["step"], x["loss"], y["loss"])
        assert abs(x["grad_norm"] - y["grad_norm"]) < 1e-4 * x["grad_norm"], x["step"]
        assert x["drop_rate"] == y["drop_rate"], x["step"]  # the same assignments dropped, step by step
    assert sum(r["drop_rate"] for r in a) > 0  # the ragged transport drops here


@pytest.mark.parametrize("arm", ["recipe", "switch_aux"])
def test_two_ep_ranks_with_two_micro_batches_equal_their_one_batch_step(tmp_path, arm):
    two = dataclasses.replace(SPEC, model=dataclasses.replace(SPEC.model, ep_shards=2), recipe=RECIPES[arm])
    ref = _ranks(tmp_path, two, "one_batch", 2)
    got = _ranks(tmp_path, _with(two, micro_batches=2), "two_micro", 2)
    assert "world 2: dp 1 x ep 2" in got[0]["hardware"] and got[0]["micro_batches"] == 2
    assert got[0]["run_id"] == ref[0]["run_id"]
    _same_run(tmp_path / "one_batch", tmp_path / "two_micro")


@pytest.mark.parametrize("arm", list(RECIPES))
def test_one_process_with_four_micro_batches_equals_four_ep_ranks(tmp_path, arm):
    spec = dataclasses.replace(SPEC, recipe=RECIPES[arm])
    one = train(_with(spec, micro_batches=4), tmp_path / "one", resume=False)
    four = _ranks(tmp_path, spec, "four", 4)
    assert "world 4: dp 1 x ep 4" in four[0]["hardware"] and one["micro_batches"] == 4
    _same_run(tmp_path / "four", tmp_path / "one")
    assert abs(one["eval_macro_loss"] - four[0]["eval_macro_loss"]) < LOSS_TOL


@pytest.mark.parametrize("arm", list(RECIPES))
def test_two_ranks_holding_two_virtual_shards_each_equal_one_process(tmp_path, arm):
    spec = dataclasses.replace(SPEC, recipe=RECIPES[arm])
    one = train(spec, tmp_path / "one", resume=False)
    two = _ranks(tmp_path, spec, "two", 2)  # ep_shards=4 over 2 ranks: an EP group of 2, 2 shards per rank
    assert "world 2: dp 1 x ep 2" in two[0]["hardware"]
    _same_run(tmp_path / "one", tmp_path / "two")
    assert abs(one["eval_macro_loss"] - two[0]["eval_macro_loss"]) < LOSS_TOL
