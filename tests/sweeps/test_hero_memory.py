"""The hero's plan: configs that can run (flex only compiled), activation memory measured as the
maximum over time and fitted per layer kind, the estimate against a real CPU measurement, the time
model (FLOPs with the optimizer, bytes per link, a days range), checkpoint cadence, the offload
escape."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablations.studies import get_study
from marin.config import ModelConfig, Recipe, RunSpec, TrainConfig

GiB = 2**30


def _hero():
    st = get_study("hero")
    return st, st.runs()[0][0]


# ---- 1. configs that can run ----------------------------------------------------------------


def test_flex_without_compile_on_cuda_is_refused_naming_attention_and_compile():
    m = ModelConfig(attention="flex")
    with pytest.raises(ValueError, match=r"ModelConfig\.attention.*compile=True.*'sdpa'"):
        RunSpec(model=m, train=TrainConfig(device="cuda", compile=False))
    assert RunSpec(model=m, train=TrainConfig(device="cuda", compile=True)).model.attention == "flex"
    assert RunSpec(model=ModelConfig(attention="sdpa"), train=TrainConfig(device="cuda")).train.compile is False


def test_hero_and_every_gpu_rung_run_the_fused_path_and_the_hero_with_compile_off_is_refused():
    from ablations.ladders import GPU_RUNGS
    from ablations.studies import get_study

    _, spec = _hero()
    assert (spec.model.attention, spec.model.kernels, spec.train.compile) == ("flex", "triton", True)
    for name in GPU_RUNGS:
        s = get_study("noise", rungs=(name,)).runs()[0][0]
        assert (s.model.attention, s.model.kernels, s.train.compile) == ("flex", "triton", True), name
    with pytest.raises(ValueError, match="attention"):
        dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile=False))


def test_the_flex_stand_in_is_only_used_for_a_compiled_configuration_and_the_table_names_it():
    from sweeps.memory import substitutions, uses_flex_footprint

    _, spec = _hero()
    subs = substitutions(spec)
    assert any("_FlexFootprint" in s for s in subs) and any("triton" in s for s in subs)
    eager = dataclasses.replace(spec.train, compile=False)
    fake = type("Spec", (), {"model": spec.model, "train": eager})()  # what RunSpec refuses to build
    with pytest.raises(ValueError, match="attention='flex' without TrainConfig.compile"):
        uses_flex_footprint(fake)


# ---- 2. memory: max over time, fitted per layer kind, checked against a real run ------------


def _small(d: int = 64, L: int = 2, B: int = 8, global_every: int = 4, **train) -> RunSpec:
    m = ModelConfig(d_model=d, n_layers=L, n_heads=d // 16, head_dim=16, n_kv_heads=2, n_kv_heads_global=1,
                    seq_len=128, window=32, expert_hidden=d // 2, shared_hidden=d // 2, ep_shards=1,
                    global_every=global_every)
    return RunSpec(model=m, recipe=Recipe(), train=TrainConfig(batch_size=B, steps=2, **train))


def test_activation_peak_is_the_maximum_over_time_not_the_snapshot_at_the_total_peak():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from sweeps.memory import ActivationTracker

    # a 3 MiB temporary freed before the 4 MiB weight's gradient arrives: the total peaks in the
    # backward's aftermath, when activations + temporaries are small; the maximum over time sees 3 MiB
    def run(cls):
        with FakeTensorMode(allow_non_fake_inputs=True):
            w = torch.nn.Linear(1024, 1024, bias=False)
            mt = cls()
            mt.track_external(w)
            with mt:
                big = torch.zeros(768, 1024)
                del big
                w(torch.zeros(4, 1024)).sum().backward()
                after = torch.zeros(16, 1024)  # noqa: F841 - the total's peak: weight + gradient + this
        return mt

    at_total_peak = next(iter(run(MemTracker).get_tracker_snapshot("peak").values()))
    acts = sum(v for k, v in at_total_peak.items() if str(k).endswith(("ACT", "TEMP")))
    assert acts < 768 * 1024 * 4 <= run(ActivationTracker).act_peak


@pytest.mark.slow
def test_depth_fit_separates_local_and_global_blocks_and_predicts_a_deeper_model():
    from sweeps.memory import activation_peak, fit_activations

    spec = _small(L=6, global_every=3)  # layers 2 and 5 global: 4 local + 2 global
    # each layer stores only its own KV heads, so a global block keeps less than a local one (under
    # the default "stored" layout the two kinds keep almost the same bytes)
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, kv_layout="per_layer"))
    fit = fit_activations(spec, 8)
    assert fit["per_local"] != pytest.approx(fit["per_global"], rel=1e-3)
    direct = activation_peak(spec, 6, 8)
    assert fit["peak"] == pytest.approx(direct, rel=0.03)
    # one kind only: the all-local slope alone would mis-state an all-global model
    assert fit["n_local"] == 4 and fit["n_global"] == 2


def test_depth_fit_refuses_peaks_that_are_not_linear_in_depth():
    from sweeps.memory import fit_activations

    spec = _small(L=8, global_every=1)
    bent = lambda s, n, seqs, g: 1000 + 100 * n + (60 if n == 3 else 0)  # a kink at 3 layers
    with pytest.raises(RuntimeError, match="not linear"):
        fit_activations(spec, 8, measure=bent)
    fit = fit_activations(spec, 8, measure=lambda s, n, seqs, g: 1000 + 100 * n)
    assert fit["peak"] == pytest.approx(1000 + 800)


@pytest.mark.slow
@pytest.mark.parametrize("d,L", [(32, 2), (64, 3), (96, 4)])
def test_estimate_is_within_10_percent_of_a_real_cpu_step_measured_by_the_allocator(d, L):
    from sweeps.dryrun import Sharding, dry_run
    from sweeps.memory import measured_step_peak

    torch.set_num_threads(1)
    spec = _small(d=d, L=L)
    one = Sharding("one process", lambda m, g: m, ns_whole_group=False)
    pred = dry_run(spec, 1, 1, capacity_gib=100.0, levels=("hyperball",), sharding=one)["tables"]["hyperball"]["total"]
    meas = measured_step_peak(spec)
    print(f"d{d} L{L}: predicted {pred / 2**20:.2f} MiB, measured {meas['peak'] / 2**20:.2f} MiB")
    assert pred == pytest.approx(meas["peak"], rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("d,L", [(64, 3), (96, 4)])
def test_estimate_is_within_10_percent_of_the_allocator_in_the_heros_regime(d, L):
    """The hero's activation regime: blocks recomputed in the backward and the loss in chunks (fp32 on
    CPU; flex and bf16 are the GPU's: sweeps/rehearsal.py and the one-rack run check those)."""
    from sweeps.dryrun import Sharding, dry_run
    from sweeps.memory import measured_step_peak

    torch.set_num_threads(1)
    spec = _small(d=d, L=L, activation_checkpoint="block", loss_chunk_tokens=256)
    one = Sharding("one process", lambda m, g: m, ns_whole_group=False)
    pred = dry_run(spec, 1, 1, capacity_gib=100.0, levels=("hyperball",), sharding=one)["tables"]["hyperball"]["total"]
    meas = measured_step_peak(spec)
    print(f"d{d} L{L} recompute + chunked loss: predicted {pred / 2**20:.2f} MiB, measured {meas['peak'] / 2**20:.2f} MiB")
    assert pred == pytest.approx(meas["peak"], rel=0.10)


@pytest.mark.slow
def test_uniform_pattern_hero_is_estimated_within_10_percent_of_the_tracker_at_4_layers():
    from sweeps.memory import activation_peak, fit_activations

    _, spec = _hero()
    uniform = dataclasses.replace(spec, model=dataclasses.replace(spec.model, global_every=1, n_layers=4))
    fit = fit_activations(uniform, 16, depths=(1, 2, 3))
    direct = activation_peak(uniform, 4, 16)
    print(f"uniform hero at 4 layers: fit {fit['peak'] / GiB:.2f} GiB, direct {direct / GiB:.2f} GiB")
    assert fit["peak"] == pytest.approx(direct, rel=0.10)


@pytest.mark.slow
def test_gpu_lines_are_their_own_and_offload_moves_the_state_to_the_host():
    from sweeps.dryrun import GpuAllowances, Sharding, dry_run

    spec = _small(d=32, L=2)
    one = Sharding("one process", lambda m, g: m, ns_whole_group=False)
    probe = dry_run(spec, 1, 1, capacity_gib=100.0, levels=("hyperball",), sharding=one, gpu=GpuAllowances(
        cuda_context_gib=0.0, nvls_gib_per_comm=0.0))
    lines = {r["line"].split(" (")[0] for r in probe["tables"]["hyperball"]["rows"]}
    assert {"NCCL NVLS buffers", "CUDA context + library workspaces", "allocator fragmentation allowance"} <= lines
    total = probe["tables"]["hyperball"]["total"]
    tight = dry_run(spec, 1, 1, capacity_gib=1.02 * total / GiB, levels=("hyperball",), sharding=one,
                    gpu=GpuAllowances(cuda_context_gib=0.0, nvls_gib_per_comm=0.0))
    t = tight["tables"]["hyperball"]
    assert t["headroom"] < 0.10 and "offload" in t
    o = t["offload"]
    assert o["total"] < t["total"] and o["host"] > 0
    assert not any(r["bytes"] for r in o["rows"] if r["line"].startswith(("parameters", "gradients", "optimizer")))
    assert "offload" not in probe["tables"]["hyperball"]  # plenty of headroom: no offload table
    on = dataclasses.replace(spec, train=dataclasses.replace(spec.train, offload="cpu"))
    conf = dry_run(on, 1, 1, capacity_gib=1.02 * total / GiB, levels=("hyperball",), sharding=one,
                   gpu=GpuAllowances(cuda_context_gib=0.0, nvls_gib_per_comm=0.0))["tables"]["hyperball"]
    assert "offload" not in conf and conf["total"] == pytest.approx(o["total"]) and conf["host"] == o["host"]


@pytest.mark.slow
def test_offload_option_trains_two_gloo_ranks_as_without_it(tmp_path):
    # On CPU the host is the device: CPUOffloadPolicy moves nothing, but its path (sharded parameters
    # and optimizer step where the policy puts them) must train, and equal the run without it.
    from test_train_dist import DROPLESS, LOSS_TOL, _lines, _one_run

    spec = dataclasses.replace(DROPLESS, train=dataclasses.replace(DROPLESS.train, steps=2))
    off = dataclasses.replace(spec, train=dataclasses.replace(spec.train, offload="cpu"))
    _one_run(tmp_path, spec, "plain", 2)
    _one_run(tmp_path, off, "offload", 2)
    a, b = _lines(tmp_path / "plain"), _lines(tmp_path / "offload")
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) < LOSS_TOL and abs(x["grad_norm"] - y["grad_norm"]) < 1e-4 * x["grad_norm"]


def test_offload_policy_reaches_fully_shard():
    from unittest import mock

    from marin import parallel
    from marin.train.distributed import sharding_config

    assert sharding_config(TrainConfig(offload="cpu")).offload and not sharding_config(TrainConfig()).offload
    seen = []
    with mock.patch("torch.distributed.fsdp.fully_shard", lambda m, **kw: seen.append(kw)):
        groups = mock.Mock(dp_size=2, world_size=2, mesh={"dp": None}, world_mesh=None)
        with mock.patch.object(parallel, "moe_layers", lambda m: []):
            parallel.apply_fsdp(torch.nn.Linear(2, 2), groups, parallel.ShardingConfig(offload=True))
    from torch.distributed.fsdp import CPUOffloadPolicy

    assert seen and all(isinstance(kw.get("offload_policy"), CPUOffloadPolicy) for kw in seen)


def test_wall_clock_interval_writes_temporary_checkpoints_between_checkpoint_every(tmp_path):
    from marin.config import preset
    from marin.train import train

    spec = RunSpec(model=preset("tiny", ["seq_len=32"]), recipe=Recipe(),
                   train=TrainConfig(steps=4, batch_size=2, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=0, checkpoint_interval_s=1e-9, threads=1))
    train(spec, tmp_path / "tick", resume=False)
    assert sorted(p.name for p in (tmp_path / "tick" / "checkpoints").glob("ckpt_*"))  # saved without checkpoint_every
    never = dataclasses.replace(spec, train=dataclasses.replace(spec.train, checkpoint_interval_s=0.0))
    train(never, tmp_path / "never", resume=False)
    assert not list((tmp_path / "never" / "checkpoints").glob("ckpt_*"))


# ---- 3. time model ---------------------------------------------------------------------------


def test_hero_time_model_contains_marins_measured_throughput_and_keeps_cross_rack_bytes_to_the_gradient():
    from sweeps.timemodel import MARIN_MEASURED, format_time_model, time_model

    st, spec = _hero()
    tm = time_model(spec, st.hero, job_limit_s=4 * 3600)
    assert tm["days"][1] / tm["days"][0] < 2
    assert len(MARIN_MEASURED) == 2 and MARIN_MEASURED["hero, pooled-wave"]["days"] == 78.6
    for point in MARIN_MEASURED.values():  # every measured point inside the printed range
        for key, value in point.items():
            assert tm[key][0] <= value <= tm[key][1], (key, value, tm[key])
    across = sum(tm["bytes_across_racks"].values())
    assert 0 < across <= 2 * tm["grad_shard_bytes"]  # a ring all-reduce of the shard, nothing else
    assert 0 < tm["ns_flops_per_rank"] < tm["ns_flops_if_every_rank"]
    text = format_time_model(tm)
    assert "across racks" in text and "Newton-Schulz" in text and "days" in text
    rack = get_study("hero_rack")
    assert sum(time_model(rack.runs()[0][0], rack.hero)["bytes_across_racks"].values()) == 0


def test_hero_runs_rack_local_and_the_plan_refuses_another_layout_naming_both_fields():
    from ablations.studies import HeroPlan

    st, spec = _hero()
    assert spec.train.replica_groups == st.hero.ep_groups == 11
    rack = get_study("hero_rack")
    assert rack.runs()[0][0].train.replica_groups == rack.hero.ep_groups == 1
    flat = dataclasses.replace(spec, train=dataclasses.replace(spec.train, replica_groups=1))
    with pytest.raises(ValueError, match=r"TrainConfig.replica_groups=1 must equal HeroPlan.ep_groups=11"):
        HeroPlan().check(flat)


@pytest.mark.slow
def test_only_the_gradient_reduction_crosses_racks_under_hsdp_and_fsdp_over_the_world_sends_the_gathers():
    from sweeps.timemodel import time_model

    st, spec = _hero()
    hsdp = time_model(spec, st.hero)
    flat = time_model(dataclasses.replace(spec, train=dataclasses.replace(spec.train, replica_groups=1)), st.hero)
    assert list(hsdp["bytes_across_racks"]) == ["gradient all-reduce of the rank's shard over 11 replicas (fp32, ring)"]
    assert any(k.startswith("FSDP all-gather") for k in hsdp["bytes_inside_rack"])
    gathers = {k: v for k, v in flat["bytes_across_racks"].items() if k.startswith("FSDP all-gather")}
    assert len(gathers) == 2 and not any(k.startswith("FSDP") for k in flat["bytes_inside_rack"])
    # FSDP2 gathers the bf16 non-expert parameters twice a step (forward, backward), 703/704 of them per rank
    from marin.flops import params_routed, params_total

    n_dense = params_total(spec.model, spec.recipe) - params_routed(spec.model, spec.recipe)
    name = "FSDP all-gather of bf16 non-expert parameters over 704 ranks (forward + backward)"
    assert flat["bytes_across_racks"][name] == pytest.approx(2 * 2 * n_dense * 703 / 704, rel=1e-9)
    assert sum(flat["bytes_across_racks"].values()) > 2 * sum(hsdp["bytes_across_racks"].values())
    assert "gradient all-reduce" not in " ".join(flat["bytes_across_racks"])  # nothing replicated
    with pytest.raises(ValueError, match=r"TrainConfig.replica_groups=3 with world_size=704"):
        time_model(dataclasses.replace(spec, train=dataclasses.replace(spec.train, replica_groups=3)), st.hero)


def test_checkpoint_cadence_fits_the_job_limit_only_with_the_hourly_temporary_checkpoint():
    from sweeps.timemodel import checkpoint_cadence

    _, spec = _hero()
    t = spec.train
    assert t.checkpoint_every == 1000 and t.checkpoint_interval_s == 3600
    assert checkpoint_cadence(t, (15.0, 23.0), 4 * 3600)["fits"]
    without = dataclasses.replace(t, checkpoint_interval_s=0.0)
    c = checkpoint_cadence(without, (15.0, 23.0), 4 * 3600)
    assert not c["fits"] and c["max_gap_s"] == pytest.approx(23_000)
    with pytest.raises(ValueError, match="checkpoint_interval_s"):
        TrainConfig(checkpoint_interval_s=-1)
    with pytest.raises(ValueError, match="offload.*'none', 'cpu'"):
        TrainConfig(offload="gpu")


def test_dry_run_state_is_measured_on_the_configured_rack_local_layout():
    """8 ranks, EP 4: as 2 racks (HSDP) a rank holds 1/4 of the non-expert parameters (sharded in its rack)
    and its whole EP slice (replicated across racks); as one flat group 1/8 and half its slice."""
    from marin.flops import params_routed, params_total
    from sweeps.dryrun import current_sharding, rank_state

    model = ModelConfig(d_model=64, n_layers=2, n_heads=4, head_dim=16, seq_len=64, window=32, n_experts=8,
                        top_k=2, ep_shards=4)
    n_routed = params_routed(model, Recipe())
    n_dense = params_total(model, Recipe()) - n_routed
    for racks, shard, slice_part in ((2, 4, 1), (1, 8, 2)):
        spec = RunSpec(model=model, recipe=Recipe(), train=TrainConfig(batch_size=16, replica_groups=racks))
        st = rank_state(spec, 8, 4, 5, current_sharding(spec))
        dense = sum(v for k, v in st["by_role"].items() if k != "expert")
        assert n_dense / shard <= dense <= 1.1 * n_dense / shard  # FSDP2 pads rows up to a multiple
        assert st["by_role"]["expert"] == n_routed // 4 // slice_part and st["experts_per_rank"] == 2
    assert "HSDP" in current_sharding(RunSpec(model=model, train=TrainConfig(replica_groups=2))).name
