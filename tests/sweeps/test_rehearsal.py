"""The rehearsal (`plan STUDY --dry_run`, part c): one training step + checkpoint save on an accelerator
that is not the host, through a process group that serves only the accelerator (planning/rehearsal.py)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

from marin_ablate.ablations.studies import get_study
from marin_ablate.planning.dryrun import in_fresh_process
from marin_ablate.planning.rehearsal import Discipline, RehearsalError, rehearsal_spec, rehearse_rank


def _meta_group(world: int = 4):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("meta:fake", store=FakeStore(), rank=0, world_size=world)


def test_a_collective_on_a_host_tensor_fails_naming_it():
    _meta_group()
    try:
        with Discipline():
            dist.all_reduce(torch.ones(3, device="meta"))  # the accelerator: served
            with pytest.raises(RehearsalError, match=r"allreduce_.*host tensor \(float32\[\] on cpu\).*"
                                                     r"test_rehearsal.py:\d+ in test_a_collective_on"):
                dist.all_reduce(torch.zeros(()))
    finally:
        dist.destroy_process_group()


def test_a_group_with_a_host_backend_serves_host_collectives_when_asked():
    """What a run that keeps host collectives needs ("cuda:nccl,cpu:gloo" on a GPU): the rehearsal
    builds "meta:fake,cpu:fake" and lets them through, counted as host collectives."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("meta:fake,cpu:fake", store=FakeStore(), rank=0, world_size=4)
    try:
        d = Discipline(host_collectives=True)
        with d:
            dist.all_reduce(torch.zeros(()))
            dist.all_reduce(torch.ones(3, device="meta"))
        assert d.collectives == {"c10d::allreduce_ (host)": 1, "c10d::allreduce_ (accelerator)": 1}
    finally:
        dist.destroy_process_group()


def test_a_host_accelerator_mix_fails_and_a_host_read_is_a_listed_stand_in():
    d = Discipline()
    with d:
        a = torch.ones(4, device="meta")
        assert float(a.sum()) == 1.0  # stood in
        b = a + torch.tensor(2.0)  # a 0-dim host scalar: CUDA kernels take it
        assert b.device.type == "meta"
        with pytest.raises(RehearsalError, match=r"aten.add.Tensor mixes host and accelerator.*float32\[4\] on cpu"):
            a + torch.ones(4)
    assert sum(d.host_reads.values()) == 1 and all("test_rehearsal.py" in k for k in d.host_reads)


def _hero_rack(*overrides: str):
    study = get_study("hero_rack")
    spec = study.runs()[0][0].with_overrides(list(overrides))
    small, _ = rehearsal_spec(spec, study.hero.gpus)
    return small, study.hero.gpus, spec.model.ep_shards


@pytest.mark.slow  # builds the hero_rack rehearsal before refusing
def test_hero_rack_with_a_host_update_is_refused_before_its_step_naming_the_field(tmp_path):
    """FSDP2's CPUOffloadPolicy kept the gradients on the host, so clip_grad_norm_ all-reduced a host
    scalar that NCCL (here, the accelerator-only group) refuses in the first step; a host update is now
    refused before any collective, naming the field (the rehearsal's own refusal of a host collective:
    test_a_collective_on_a_host_tensor_fails_naming_it)."""
    with pytest.raises(ValueError, match=r"TrainConfig.offload='cpu'.*allowed values: 'none'"):
        small, world, ep = _hero_rack("train.offload=cpu")
        in_fresh_process(rehearse_rank, small, world, ep, 0, tmp_path)


@pytest.mark.slow  # a whole hero_rack step at its per-GPU shape
def test_hero_rack_without_offload_takes_a_whole_step_on_the_accelerator(tmp_path):
    small, world, ep = _hero_rack("train.offload=none")
    r = in_fresh_process(rehearse_rank, small, world, ep, 0, tmp_path)
    assert r["param_device"] == "meta" and r["experts_per_rank"] == 384 // ep
    c = r["collectives"]
    assert not any(k.endswith("(host)") for k in c)
    # forward/backward (all-gather, all-to-all, reduce-scatter), clipping and the sphere norms
    # (all-reduce), distributed Newton-Schulz (gather/scatter to owners)
    for op in ("_allgather_base_", "alltoall_base_", "_reduce_scatter_base_", "allreduce_", "gather_", "scatter_"):
        assert c.get(f"c10d::{op} (accelerator)", 0) > 0, (op, c)
    saved = re.search(r"(\d+) items of this rank planned, (\d+) written to 1 file", r["checkpoint"])
    assert saved and int(saved[1]) == int(saved[2]) > 0, r["checkpoint"]
    assert any("dist_forward_backward" in k for k in r["host_reads"])


def test_the_rehearsal_plays_the_first_and_last_rank_of_every_ep_group_the_loops_ranks_included():
    from marin_ablate.planning.rehearsal import MAX_REHEARSED_RANKS, rehearsal_ranks

    hero = rehearsal_ranks(704, 64, 11)  # 11 racks of EP64
    assert hero == sorted({r for k in range(11) for r in (64 * k, 64 * k + 63)}) and len(hero) == 22
    assert {0, 63, 64, 703} <= set(hero)  # the loop's ranks (dry run part a)
    assert rehearsal_ranks(128, 64, 2) == [0, 63, 64, 127]  # hero_2rack
    assert rehearsal_ranks(4, 4) == [0, 3] and rehearsal_ranks(1, 8) == [0] and rehearsal_ranks(8, 8) == [0, 7]
    # EP8 over 11 racks of 64 is 176 EP groups: the edges of each rack and of its first and last EP group
    many = rehearsal_ranks(704, 8, 11)
    assert len(many) == 44 <= MAX_REHEARSED_RANKS
    assert many[:4] == [0, 7, 56, 63] and many[-4:] == [640, 647, 696, 703]


def _program(rank: int, world: int = 8, ep: int = 4) -> list[tuple]:
    """The collectives one step issues on a world of 2 racks x EP 4 (as Discipline records them): the EP
    all-to-all, the cross-rack reduce-scatter of the expert slice (ranks r and r + 4) and the world clip."""
    e0 = rank - rank % ep
    return [("c10d::alltoall_base_", tuple(range(e0, e0 + ep)), ((64, 16), (64, 16)), ("bfloat16",) * 2, "moe.py:1"),
            ("c10d::_reduce_scatter_base_", (rank % ep, rank % ep + ep), ((8, 16), (16, 16)), ("float32",) * 2,
             "ep.py:2"),
            ("c10d::allreduce_", tuple(range(world)), ((),), ("float32",), "loop.py:3")]


def test_a_divergence_on_an_interior_rank_or_an_ep_group_edge_fails_naming_both_calls():
    """Every pair of played ranks is compared on the groups they share: a call planted on rank 4 (the first of the
    second rack, inside the world) on the cross-rack group it shares with rank 0 only, or on rank 3 (the last of
    the first EP group) on its EP group, is named with both ranks' calls."""
    from marin_ablate.planning.rehearsal import compare_ranks

    ranks = [0, 3, 4, 7]
    assert compare_ranks([{"rank": r, "calls": _program(r)} for r in ranks]) is None
    rows = [{"rank": r, "calls": _program(r)} for r in ranks]
    rows[2]["calls"].insert(1, ("c10d::allreduce_", (0, 4), ((2,),), ("float32",), "planted.py:7 in step"))
    err = compare_ranks(rows)
    assert err.startswith("ranks 0 and 4 diverge at collective #1 on a group they share: rank 0 issues "
                          "c10d::_reduce_scatter_base_ on the shared group of 2 rank(s), float32[8, 16], "
                          "float32[16, 16] from ep.py:2; rank 4 issues c10d::allreduce_ on the shared group of 2 "
                          "rank(s), float32[2] from planted.py:7 in step"), err
    rows = [{"rank": r, "calls": _program(r)} for r in ranks]
    op, group, shapes, dtypes, _ = rows[1]["calls"][0]
    rows[1]["calls"][0] = (op, group, ((65, 16), (64, 16)), dtypes, "planted.py:9 in dispatch")
    err = compare_ranks(rows)
    assert err.startswith("ranks 0 and 3 diverge at collective #1 on a group they share: rank 0 issues "
                          "c10d::alltoall_base_ on the shared group of 4 rank(s), bfloat16[64, 16], bfloat16[64, 16] "
                          "from moe.py:1; rank 3 issues c10d::alltoall_base_ on the shared group of 4 rank(s), "
                          "bfloat16[65, 16], bfloat16[64, 16] from planted.py:9 in dispatch"), err


def _rank_where_rank_4_reduces_once_more(spec, world, ep, rank, run_dir, host_backend):
    """A planted bug: rank 4 (the first of the second rack) issues an all-reduce its peers never issue (on NCCL:
    every rank hangs); a rehearsal of the world's first and last rank alone passes it."""
    from marin_ablate.marin.train import loop

    step = loop.Trainer.train_step

    def planted(self, stage):
        if self.pd.rank == 4:
            dist.all_reduce(torch.zeros(1, device="meta"))
        return step(self, stage)

    loop.Trainer.train_step = planted
    return rehearse_rank(spec, world, ep, rank, run_dir, host_backend)


def _hero_node():
    study = get_study("hero_node")
    return study.runs()[0][0], study.hero.gpus, study.runs()[0][0].model.ep_shards


@pytest.mark.slow
def test_the_rehearsal_fails_naming_the_first_collective_only_an_interior_rank_issues(tmp_path):
    """Two racks of EP 4 (world 8): ranks 0, 3, 4 and 7 play a step each; rank 4's planted all-reduce on the world
    group fails the rehearsal, naming rank 0's call and rank 4's."""
    from marin_ablate.ablations.studies import hero
    from marin_ablate.planning.rehearsal import rehearse

    study = hero(ep_groups=2, ep_size=4, n_layers=2, steps=200, name="hero_2x4")
    spec = study.runs()[0][0]
    rep = rehearse(spec, study.hero.gpus, spec.model.ep_shards, tmp_path, rank_fn=_rank_where_rank_4_reduces_once_more)
    assert rep["ranks"] == [0, 3, 4, 7] and not rep["ok"]
    assert re.search(r"ranks 0 and 4 diverge at collective #1 on a group they share: rank 0 issues c10d::\S+ on the "
                     r"shared group of \d+ rank\(s\), .* from marin/\S+ in \w+; rank 4 issues c10d::allreduce_ on "
                     r"the shared group of 8 rank\(s\), float32\[1\] from .*test_rehearsal.py", rep["error"]), \
        rep["error"]
    assert "watchdog" in rep["error"]


@pytest.mark.slow
def test_hero_node_ranks_issue_one_collective_sequence_over_every_context_stage(tmp_path):
    from marin_ablate.planning.rehearsal import compare_ranks, host_read_budget, host_reads_allowed, rehearse

    spec, world, ep = _hero_node()
    rep = rehearse(spec, world, ep, tmp_path)
    assert rep["ok"], rep["error"]
    a, b = rep["rows"]
    assert a["steps"] == 3 and [s for s, _ in a["stages"]] == [32, 64, 128]  # 4k -> 16k -> 65k, narrowed
    assert len(a["calls"]) == len(b["calls"]) > 0 and compare_ranks(rep["rows"]) is None
    per_step = sum(a["host_reads"].values()) / a["steps"]
    assert 0 < per_step <= host_reads_allowed(rep["n_layers"])
    assert host_read_budget(rep["rows"], rep["n_layers"]) is None
    assert any("read_splits" in site for site in a["host_reads"])  # ragged's split read counts, stood in
    a["host_reads"]["planted.py:1 in step"] = 100 * a["steps"]  # 100 host reads planted in every step
    assert "host reads of device values per step, above the budget" in host_read_budget(rep["rows"], rep["n_layers"])
    op, group, shapes, dtypes, caller = b["calls"][5]  # rank 3 with a rank-dependent shape at its 6th collective
    b["calls"][5] = (op, group, (shapes[0] + (1,), *shapes[1:]), dtypes, caller)
    assert "diverge at collective #6" in compare_ranks(rep["rows"])


@pytest.mark.slow
def test_hero_2rack_rehearses_the_cross_rack_collectives_and_its_ranks_agree(tmp_path):
    """Two racks: the expert slice gathered/reduce-scattered across racks (groups of 2), Newton-Schulz's
    cross-rack owners, the world-wide clip all-reduce (128 ranks) -- and ranks 0 and 127 issue one sequence."""
    from marin_ablate.planning.rehearsal import rehearse

    study = get_study("hero_2rack")
    spec = study.runs()[0][0]
    rep = rehearse(spec, study.hero.gpus, spec.model.ep_shards, tmp_path)
    assert rep["ok"], rep["error"]
    calls = rep["rows"][0]["calls"]
    sizes = {(op, len(group)) for op, group, *_ in calls}
    assert ("c10d::_allgather_base_", 2) in sizes and ("c10d::_reduce_scatter_base_", 2) in sizes  # across racks
    assert any(op.startswith("c10d::gather_") and n == 2 for op, n in sizes)  # Newton-Schulz owner, across racks
    assert ("c10d::allreduce_", 128) in sizes  # the world-wide clip norm
