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
from marin_ablate.sweeps.sweep import apply_spec_overrides


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
    spec = apply_spec_overrides(study.runs()[0][0], list(overrides))
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
