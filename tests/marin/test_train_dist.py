"""Distributed training (docs/architecture.md §5): 2 gloo ranks with real EP over ModelConfig.ep_shards=2 train
`tiny` exactly as one process with virtual EP over the same 2 shards (same drops, same losses), resume
from a sharded checkpoint identically, and a bad layout fails before any collective.

One launch of 2 forked ranks serves the equivalence and resume tests (each rank runs: a full run, a
run stopped after 3 steps, its resume) and writes its summaries to a JSON file; a second launch of 4
ranks (dp 2 x ep 2, dropless) pins the data-parallel half.
"""

import dataclasses
import json
import os
import shutil
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ranks import free_port, run_ranks

from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train import train

# Multi-process training, torch.compile, simulated studies or real SLURM jobs (minutes on 2 cores) are marked
# `slow` one by one: the development loop (`python -m pytest -m "not slow"`) keeps the fast checks of this file.


WORLD = 2
# qb_estimator=hist: its histograms all-reduce exactly (topk thresholds are averaged over ranks).
SPEC = RunSpec(model=preset("tiny", ["seq_len=64", "ep_shards=2", "qb_estimator=hist"]),
               recipe=Recipe(ep_transport="ragged"),
               train=TrainConfig(steps=5, batch_size=2, eval_every=0, eval_batches=1, log_every=1,
                                 checkpoint_every=2, threads=1))
LOSS_TOL = 1e-5
TIMEOUT_S = 600  # seconds a launch may take before its ranks are killed (a loaded machine)



def _lines(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


# the full run with activation checkpointing of every block (no checkpoints written: only its losses matter)
RECOMPUTE = dataclasses.replace(SPEC, train=dataclasses.replace(SPEC.train, activation_checkpoint="block",
                                                                checkpoint_every=0))


def _worker(rank: int, ports: list[int], tmp: str) -> None:
    # torchrun's variables: train() initialises the process group itself (and destroys it), so each
    # of the four runs below gets a fresh port: one launch of 2 ranks serves every test of this world size.
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    out: dict = {}
    try:
        os.environ["MASTER_PORT"] = str(ports[0])
        out["full"] = train(SPEC, Path(tmp) / "full", resume=False, keep_checkpoints="all")
        os.environ["MASTER_PORT"] = str(ports[1])
        out["stopped"] = train(SPEC, Path(tmp) / "cut", resume=False, stop_after=3)
        os.environ["MASTER_PORT"] = str(ports[2])
        out["resumed"] = train(SPEC, Path(tmp) / "cut", keep_checkpoints="all")  # the tests below reuse them
        out["initialized_after"] = dist.is_initialized()
        os.environ["MASTER_PORT"] = str(ports[3])
        out["recompute"] = train(RECOMPUTE, Path(tmp) / "recompute", resume=False)
    except Exception:
        out["error"] = traceback.format_exc()
    with open(os.path.join(tmp, f"r{rank}.json"), "w") as f:
        json.dump(out, f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    t0 = time.perf_counter()
    ref = train(SPEC, tmp / "single", resume=False)
    t1 = time.perf_counter()
    run_ranks(_worker, ([free_port() for _ in range(4)], str(tmp)), WORLD, TIMEOUT_S)
    ranks = [json.loads((tmp / f"r{r}.json").read_text()) for r in range(WORLD)]
    for r in ranks:
        assert "error" not in r, r["error"]
    print(f"single {t1 - t0:.1f}s, 2 ranks x 4 runs {time.perf_counter() - t1:.1f}s")
    return tmp, ref, ranks


@pytest.mark.slow
def test_two_rank_ep_run_equals_single_process_virtual_ep(runs):
    tmp, ref, ranks = runs
    single, full = _lines(tmp / "single"), _lines(tmp / "full")
    assert [r["step"] for r in full] == [r["step"] for r in single] == list(range(SPEC.train.steps))
    for a, b in zip(single, full, strict=True):
        assert abs(a["loss"] - b["loss"]) < LOSS_TOL, (a["step"], a["loss"], b["loss"])
        assert abs(a["ce"] - b["ce"]) < LOSS_TOL, a["step"]
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * a["grad_norm"], a["step"]
        assert a["drop_rate"] == b["drop_rate"], a["step"]  # the same tokens dropped, step by step
        assert a["tokens"] == b["tokens"]  # tokens count the global batch
    assert sum(r["drop_rate"] for r in single) > 0  # the ragged transport must drop here
    for r in ranks:  # every rank returns rank 0's summary
        s = r["full"]
        assert s["status"] == "completed" and s["step"] == ref["step"] and s["tokens"] == ref["tokens"]
        assert abs(s["eval_macro_loss"] - ref["eval_macro_loss"]) < LOSS_TOL
        assert s["drop_rate"] == ref["drop_rate"]
        assert s["loss_curve"] == ranks[0]["full"]["loss_curve"]
        assert "world 2: dp 1 x ep 2" in s["hardware"]
        assert not r["initialized_after"]  # train() tears down the process group it started


@pytest.mark.slow
def test_two_rank_resume_from_sharded_checkpoint_continues_identically(runs):
    tmp, _, ranks = runs
    for r in ranks:
        assert r["stopped"]["status"] == "interrupted" and r["stopped"]["step"] == 3
        assert r["resumed"]["status"] == "completed"
    ck = tmp / "cut" / "checkpoints"
    # the periodic one (step 2), the preemption checkpoint (step 3), the resumed run's periodic one
    # (step 4) and its final one (step 5): kept, as keep_checkpoints="all" says (the default keeps the final one only)
    assert sorted(p.name for p in ck.iterdir()) == ["ckpt_000000002", "ckpt_000000003", "ckpt_000000004",
                                                     "ckpt_000000005"]
    assert sorted(p.name for p in (ck / "ckpt_000000003").iterdir()) == ["dcp", "meta.json", "rng_0.pt", "rng_1.pt"]
    full, cut = _lines(tmp / "full"), _lines(tmp / "cut")
    assert [r["step"] for r in cut] == list(range(SPEC.train.steps))  # lines after the checkpoint dropped
    for a, b in zip(full, cut, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-6 and a["drop_rate"] == b["drop_rate"], a["step"]
    assert abs(ranks[0]["resumed"]["eval_macro_loss"] - ranks[0]["full"]["eval_macro_loss"]) < 1e-6


@pytest.mark.slow
def test_one_process_resumes_the_two_rank_checkpoint(runs):
    # DCP reshards: the step-3 checkpoint of the 2-rank run continues in one process (virtual EP)
    tmp, ref, _ = runs
    one = tmp / "cut_in_one"
    shutil.copytree(tmp / "cut", one)
    (one / "summary.json").unlink()
    for later in ("ckpt_000000004", "ckpt_000000005"):
        shutil.rmtree(one / "checkpoints" / later)
    summary = train(SPEC, one)
    assert summary["status"] == "completed" and summary["tokens"] == ref["tokens"]
    single, resumed = _lines(tmp / "single"), _lines(one)
    assert [r["step"] for r in resumed] == list(range(SPEC.train.steps))
    assert resumed[:3] == _lines(tmp / "cut")[:3]  # the 2-rank lines before the checkpoint are kept
    # the 2-rank resume's line, then this one's
    assert (one / "train.log").read_text().count("from ckpt_000000003 at step 3") == 2
    for a, b in zip(single, resumed, strict=True):
        assert abs(a["loss"] - b["loss"]) < LOSS_TOL and a["drop_rate"] == b["drop_rate"], a["step"]


@pytest.mark.slow
def test_background_checkpoint_holds_the_state_of_its_step(runs):
    # The full run's step-2 checkpoint was staged, then written by a thread while steps 2 and 3 trained
    # (committed at step 4's): one process resuming it reproduces the rest of the 2-rank run.
    tmp, _, _ = runs
    one = tmp / "from_async_ckpt"
    shutil.copytree(tmp / "full", one)
    (one / "summary.json").unlink()
    assert sorted(p.name for p in (one / "checkpoints").iterdir()) == ["ckpt_000000002", "ckpt_000000004",
                                                                       "ckpt_000000005"]
    for later in ("ckpt_000000004", "ckpt_000000005"):
        shutil.rmtree(one / "checkpoints" / later)
    assert train(SPEC, one)["status"] == "completed"
    assert (one / "train.log").read_text().count("from ckpt_000000002 at step 2") == 1
    for a, b in zip(_lines(tmp / "full"), _lines(one), strict=True):
        assert abs(a["loss"] - b["loss"]) < LOSS_TOL and a["drop_rate"] == b["drop_rate"], a["step"]


@pytest.mark.slow
def test_two_rank_run_with_block_recompute_equals_the_run_without(runs):
    # Activation checkpointing under FSDP2: each recomputed block gathers its shards again in the
    # backward; losses, gradient norms and the routing (drops; QB biases drive the next steps' routing)
    # are those of the run that keeps every activation.
    tmp, _, ranks = runs
    assert all(r["recompute"]["status"] == "completed" for r in ranks)
    full, rec = _lines(tmp / "full"), _lines(tmp / "recompute")
    assert [r["step"] for r in rec] == list(range(SPEC.train.steps))
    for a, b in zip(full, rec, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-6, (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * a["grad_norm"], a["step"]
        assert a["drop_rate"] == b["drop_rate"] and abs(a["load_cv"] - b["load_cv"]) < 1e-6, a["step"]


DROPLESS = RunSpec(model=SPEC.model, recipe=Recipe(ep_transport="dropless"),
                   train=TrainConfig(steps=3, batch_size=4, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=0, threads=1))


def _runs_worker(rank: int, world: int, runs: list[tuple[RunSpec, str, int]], tmp: str) -> None:
    """One rank of each (spec, name, port) run in turn, in tmp/name; its summaries (or the error) go to
    tmp/<first name>_r<rank>.json."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    out: dict = {}
    try:
        for spec, name, port in runs:
            os.environ["MASTER_PORT"] = str(port)
            out[name] = train(spec, Path(tmp) / name, resume=False)
    except Exception:
        out["error"] = traceback.format_exc()
    with open(os.path.join(tmp, f"{runs[0][1]}_r{rank}.json"), "w") as f:
        json.dump(out, f)


def _launch(tmp: Path, runs: list[tuple[RunSpec, str]], world: int) -> list[dict]:
    """The (spec, name) runs in one launch of `world` forked ranks; every rank's {name: summary}, none failed."""
    run_ranks(_runs_worker, (world, [(spec, name, free_port()) for spec, name in runs], str(tmp)), world, TIMEOUT_S)
    outs = [json.loads((tmp / f"{runs[0][1]}_r{r}.json").read_text()) for r in range(world)]
    for out in outs:
        assert "error" not in out, out["error"]
    return outs


RACKS = {1: "world 4: dp 2 x ep 2", 2: "world 4: 2 racks x dp 1 x ep 2"}  # HSDP at 2: replicated racks


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """One launch of 4 ranks trains DROPLESS in both rack layouts; the one-process reference runs once."""
    tmp = tmp_path_factory.mktemp("four")
    ref = train(DROPLESS, tmp / "single", resume=False)
    runs = [(dataclasses.replace(DROPLESS, train=dataclasses.replace(DROPLESS.train, replica_groups=racks)),
             f"racks{racks}") for racks in RACKS]
    return tmp, ref, _launch(tmp, runs, 4)


@pytest.mark.slow
@pytest.mark.parametrize("racks", list(RACKS))
def test_four_ranks_dp2_x_ep2_dropless_equal_single_process(four, racks):
    # Dropless: no capacity, so any dp x ep layout must reproduce the one-process run; this pins the
    # data-parallel half (rows per replica, expert gradients averaged over dp, the norm over both).
    # Two racks of one EP group each: everything replicated across racks, reduced across them.
    tmp, ref, outs = four
    summaries = [out[f"racks{racks}"] for out in outs]
    for summary in summaries:
        assert RACKS[racks] in summary["hardware"]
    single, dp = _lines(tmp / "single"), _lines(tmp / f"racks{racks}")
    assert [r["step"] for r in dp] == list(range(DROPLESS.train.steps))
    for a, b in zip(single, dp, strict=True):
        assert abs(a["loss"] - b["loss"]) < LOSS_TOL, (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * a["grad_norm"], a["step"]
        assert a["drop_rate"] == b["drop_rate"] == 0.0
    assert abs(summaries[-1]["eval_macro_loss"] - ref["eval_macro_loss"]) < LOSS_TOL


@pytest.mark.parametrize("world,batch,match", [
    (3, 6, r"ep_shards=2.*world_size=3"),  # EP groups of 2 cannot tile 3 ranks
    (4, 2, r"batch_size.*2 sequences.*world_size=4"),  # 2 rows cannot split over 4 ranks
])
def test_bad_distributed_layout_fails_before_any_collective(monkeypatch, tmp_path, world, batch, match):
    # WORLD_SIZE > 1 with no peers: reaching init_process_group would hang, so a prompt error proves
    # the check runs first.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    spec = RunSpec(model=SPEC.model, recipe=SPEC.recipe, train=TrainConfig(steps=1, batch_size=batch, threads=1))
    with pytest.raises(ValueError, match=match):
        train(spec, tmp_path / "run")
    assert not dist.is_initialized()
    assert not (tmp_path / "run").exists()  # nothing written either


@pytest.mark.parametrize("world,racks,match", [
    ("4", 3, r"TrainConfig.replica_groups=3 with world_size=4.*allowed values"),  # 3 racks cannot tile 4
    ("8", 8, r"TrainConfig.replica_groups=8 with world_size=8 and ModelConfig.ep_shards=2"),  # racks < EP
    (None, 2, r"TrainConfig.replica_groups=2 .*world_size=1; allowed values here: 1"),  # one process
])
def test_bad_replica_groups_fail_before_anything_is_written(monkeypatch, tmp_path, world, racks, match):
    if world is not None:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", world)
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
    spec = RunSpec(model=SPEC.model, recipe=SPEC.recipe,
                   train=TrainConfig(steps=1, batch_size=8, threads=1, replica_groups=racks))
    with pytest.raises(ValueError, match=match):
        train(spec, tmp_path / "run")
    assert not dist.is_initialized()
    assert not (tmp_path / "run").exists()


COMPILED = RunSpec(model=SPEC.model, recipe=SPEC.recipe,
                   train=TrainConfig(steps=3, batch_size=2, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=0, threads=1, precision="bf16", compile=True))


@pytest.mark.slow
def test_two_rank_ep_run_with_compiled_blocks_matches_eager(tmp_path, monkeypatch):
    # The GPU rungs train EP with TrainConfig.compile: blocks holding all-to-alls compile (the exchange
    # sizes are read on the host, so the graph breaks there) and train as eager blocks do. aot_eager
    # stands in for inductor (minutes of CPU codegen); the forked ranks inherit the patch.
    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_(self, backend="aot_eager"))
    eager = train(dataclasses.replace(COMPILED, train=dataclasses.replace(COMPILED.train, compile=False)),
                  tmp_path / "eager", resume=False)
    for out in _launch(tmp_path, [(COMPILED, "compiled")], WORLD):
        assert out["compiled"]["status"] == "completed"
    ref, got = _lines(tmp_path / "eager"), _lines(tmp_path / "compiled")
    assert [r["step"] for r in got] == list(range(COMPILED.train.steps)) and eager["status"] == "completed"
    assert abs(got[0]["loss"] - ref[0]["loss"]) < 1e-3 * ref[0]["loss"]  # same weights: bf16 rounding only
    for a, b in zip(ref, got, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-2 * a["loss"], (a["step"], a["loss"], b["loss"])


def test_mixed_precision_is_a_train_config_level_on_for_gpu_rungs_and_the_hero():
    from marin_ablate.ablations.ladders import GPU_RUNGS
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.marin.train.distributed import sharding_config

    assert sharding_config(TrainConfig(precision="bf16", mixed_precision="bf16")).mixed_precision
    assert not sharding_config(TrainConfig()).mixed_precision  # CPU runs: fp32 everywhere
    with pytest.raises(ValueError, match=r"TrainConfig.mixed_precision: 'bf16' computes in bf16 and needs "
                                         r"precision='bf16'"):
        TrainConfig(mixed_precision="bf16")
    with pytest.raises(ValueError, match=r"TrainConfig.mixed_precision='fp16' is not a known level; "
                                         r"allowed values: 'none', 'bf16'"):
        TrainConfig(mixed_precision="fp16")
    for rung in GPU_RUNGS.values():
        assert dict(rung.train_overrides)["mixed_precision"] == "bf16"
    hero = get_study("hero").runs()[0][0]
    assert hero.train.mixed_precision == "bf16" and hero.train.precision == "bf16"
