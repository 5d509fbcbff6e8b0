"""The hero's plan: configs that can run (flex only compiled), activation memory measured as the
maximum over time and fitted per layer kind, the estimate against a real CPU measurement, the time
model (FLOPs with the optimizer, bytes per link, one duration with its interval), checkpoint cadence
against the job limit, no optimizer on the host (the expert slice ZeRO-sharded across racks), and the
smoke runs' dry runs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from marin_ablate.ablations.studies import get_study
from marin_ablate.marin.config import ModelConfig, Recipe, RunSpec, TrainConfig

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
    from marin_ablate.ablations.ladders import GPU_RUNGS
    from marin_ablate.ablations.studies import get_study

    _, spec = _hero()
    assert (spec.model.attention, spec.model.kernels, spec.train.compile) == ("flex", "triton", True)
    for name in GPU_RUNGS:
        s = get_study("noise", rungs=(name,)).runs()[0][0]
        assert (s.model.attention, s.model.kernels, s.train.compile) == ("flex", "triton", True), name
    with pytest.raises(ValueError, match="attention"):
        dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile=False))


def test_the_flex_stand_in_is_only_used_for_a_compiled_configuration_and_the_table_names_it():
    from marin_ablate.planning.memory import substitutions, uses_flex_footprint

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

    from marin_ablate.planning.memory import ActivationTracker

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
    from marin_ablate.planning.memory import activation_peak, fit_activations

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
    from marin_ablate.planning.memory import fit_activations

    spec = _small(L=8, global_every=1)
    bent = lambda s, n, seqs, g: 1000 + 100 * n + (60 if n == 3 else 0)  # a kink at 3 layers
    with pytest.raises(RuntimeError, match="not linear"):
        fit_activations(spec, 8, measure=bent)
    fit = fit_activations(spec, 8, measure=lambda s, n, seqs, g: 1000 + 100 * n)
    assert fit["peak"] == pytest.approx(1000 + 800)


@pytest.mark.slow
@pytest.mark.parametrize("d,L", [(32, 2), (64, 3), (96, 4)])
def test_estimate_is_within_10_percent_of_a_real_cpu_step_measured_by_the_allocator(d, L):
    from marin_ablate.planning.dryrun import Sharding, dry_run
    from marin_ablate.planning.memory import measured_step_peak

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
    CPU; flex and bf16 are the GPU's: planning/rehearsal.py and the one-rack run check those)."""
    from marin_ablate.planning.dryrun import Sharding, dry_run
    from marin_ablate.planning.memory import measured_step_peak

    torch.set_num_threads(1)
    spec = _small(d=d, L=L, activation_checkpoint="block", loss_chunk_tokens=256)
    one = Sharding("one process", lambda m, g: m, ns_whole_group=False)
    pred = dry_run(spec, 1, 1, capacity_gib=100.0, levels=("hyperball",), sharding=one)["tables"]["hyperball"]["total"]
    meas = measured_step_peak(spec)
    print(f"d{d} L{L} recompute + chunked loss: predicted {pred / 2**20:.2f} MiB, "
          f"measured {meas['peak'] / 2**20:.2f} MiB")
    assert pred == pytest.approx(meas["peak"], rel=0.10)


@pytest.mark.slow
def test_uniform_pattern_hero_is_estimated_within_10_percent_of_the_tracker_at_4_layers():
    from marin_ablate.planning.memory import activation_peak, fit_activations

    _, spec = _hero()
    uniform = dataclasses.replace(spec, model=dataclasses.replace(spec.model, global_every=1, n_layers=4))
    fit = fit_activations(uniform, 16, depths=(1, 2, 3))
    direct = activation_peak(uniform, 4, 16)
    print(f"uniform hero at 4 layers: fit {fit['peak'] / GiB:.2f} GiB, direct {direct / GiB:.2f} GiB")
    assert fit["peak"] == pytest.approx(direct, rel=0.10)


@pytest.mark.slow
def test_gpu_lines_are_their_own_and_nothing_is_on_the_host():
    from marin_ablate.planning.dryrun import GpuAllowances, Sharding, dry_run

    spec = _small(d=32, L=2)
    one = Sharding("one process", lambda m, g: m, ns_whole_group=False)
    probe = dry_run(spec, 1, 1, capacity_gib=100.0, levels=("hyperball",), sharding=one, gpu=GpuAllowances(
        cuda_context_gib=0.0, nvls_gib_per_comm=0.0))
    t = probe["tables"]["hyperball"]
    lines = {r["line"].split(" (")[0] for r in t["rows"]}
    assert {"NCCL NVLS buffers", "CUDA context + library workspaces", "allocator fragmentation allowance"} <= lines
    assert t["host"] == 0 and "offload" not in t
    assert all(r["bytes"] > 0 for r in t["rows"] if r["line"].startswith(("parameters", "gradients", "optimizer")))


def test_host_update_is_refused_naming_the_field_before_any_work():
    from marin_ablate.marin.train.distributed import check_dist_layout, sharding_config
    from marin_ablate.marin.train.stages import context_plan
    from marin_ablate.planning.timemodel import time_model

    st, spec = _hero()
    assert spec.train.offload == "none"
    host = dataclasses.replace(spec, train=dataclasses.replace(spec.train, offload="cpu"))
    msg = r"TrainConfig.offload='cpu'.*allowed values: 'none'"
    with pytest.raises(ValueError, match=msg):
        sharding_config(host.train)
    with pytest.raises(ValueError, match=msg):
        check_dist_layout(host, context_plan(host), 704)
    with pytest.raises(ValueError, match=msg):
        time_model(host, st.hero)


def test_wall_clock_interval_writes_temporary_checkpoints_between_checkpoint_every(tmp_path):
    from marin_ablate.marin.presets import preset
    from marin_ablate.marin.train import train

    spec = RunSpec(model=preset("tiny", ["seq_len=32"]), recipe=Recipe(),
                   train=TrainConfig(steps=4, batch_size=2, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=0, checkpoint_interval_s=1e-9, threads=1))
    train(spec, tmp_path / "tick", resume=False)
    assert sorted(p.name for p in (tmp_path / "tick" / "checkpoints").glob("ckpt_*"))  # saved without checkpoint_every
    never = dataclasses.replace(spec, train=dataclasses.replace(spec.train, checkpoint_interval_s=0.0))
    train(never, tmp_path / "never", resume=False)
    # no temporary checkpoint between: only the final one, of the last step, that `final` keeps
    assert [p.name for p in (tmp_path / "never" / "checkpoints").glob("ckpt_*")] == ["ckpt_000000004"]


# ---- 3. time model ---------------------------------------------------------------------------


def test_hero_time_models_point_estimate_is_within_25_percent_of_marins_78_6_days():
    # Assumptions() are the model's defaults, fixed in planning/timemodel.py before this comparison:
    # moving them (or the model) so the point leaves Marin's measured 78.6 days by > 25% fails here
    from marin_ablate.planning.timemodel import MARIN_MEASURED, Assumptions, format_time_model, time_model

    st, spec = _hero()
    tm = time_model(spec, st.hero, Assumptions(), job_limit_s=st.hero.job_time_min * 60)
    marin = MARIN_MEASURED["hero, pooled-wave"]["days"]
    assert marin == 78.6
    assert abs(tm["days_point"] / marin - 1) <= 0.25, tm["days_point"]
    assert tm["days"][0] < tm["days_point"] < tm["days"][1] and tm["days"][1] / tm["days"][0] < 2
    text = format_time_model(tm)
    # one duration on the page, with its interval, and which measurement the efficiency rests on
    assert text.count(" days") == 2 and "duration: " in text and "(interval " in text
    assert "~10% MFU on one H200" in text and "Marin's" in text
    assert "across racks" in text and "Newton-Schulz" in text and "host transfer" in text
    assert 0 < tm["ns_flops_per_rank"] < tm["ns_flops_if_every_rank"]
    rack = get_study("hero_rack")
    assert sum(time_model(rack.runs()[0][0], rack.hero)["bytes_across_racks"].values()) == 0


def test_the_time_model_prices_every_context_stage_at_its_shape_and_each_restart_of_the_job_chain():
    from marin_ablate.planning.hero import HeroSlurm
    from marin_ablate.planning.timemodel import Assumptions, time_model

    st, spec = _hero()
    limit_s = HeroSlurm().time_min(st.hero) * 60
    tm = time_model(spec, st.hero, job_limit_s=limit_s)
    stages = tm["stages"]
    assert [(s["seq_len"], s["batch_size"]) for s in stages] == [(4096, 11_264), (16_384, 2_816), (65_536, 704)]
    assert sum(s["steps"] for s in stages) == spec.train.steps == 390_251
    assert stages[0]["step_point_s"] < stages[1]["step_point_s"] < stages[2]["step_point_s"]  # attention grows
    rs, a = tm["restart"], Assumptions()
    one = a.startup_s[1] + rs["state_bytes"] / (a.storage_gbps[1] * 1e9) + a.compile_s[1]
    assert rs["seconds"][1] == pytest.approx(one) and rs["load_s"] == rs["save_s"] > 0
    steps_s = sum(s["steps"] * s["step_point_s"] for s in stages)
    assert rs["count"] == math.ceil(steps_s / (limit_s - one)) - 1 > 500
    assert tm["days_point"] * 86400 == pytest.approx(steps_s + rs["count"] * one)
    assert time_model(spec, st.hero)["restart"]["count"] == 0  # no job limit, no chain


def test_the_hero_plan_prints_no_second_duration():
    d = get_study("hero").describe()
    assert not {"expected_days", "expected_seconds", "gpu_hours", "assumed_mfu"} & set(d["hero"])
    assert "gpu_hours" not in d["rungs"][0] and "assumed_mfu" not in d["cost"]


def test_sbatch_time_the_rungs_timeout_and_the_checkpoint_cadence_agree():
    from marin_ablate.planning.hero import HeroSlurm, hero_resources, render_sbatch
    from marin_ablate.planning.timemodel import time_model

    for name in ("hero", "hero_2rack", "hero_rack", "hero_node", "hero_gpu"):
        st = get_study(name)
        limit = st.hero.job_time_min
        assert st.describe()["rungs"][0]["timeout_min"] == limit == HeroSlurm().time_min(st.hero)
        assert hero_resources(st.hero)["time_min"] == limit and f"#SBATCH --time={limit}\n" in render_sbatch(st.hero)
        tm = time_model(st.runs()[0][0], st.hero, job_limit_s=limit * 60)
        assert tm["checkpoint"]["fits"] and tm["checkpoint"]["max_gap_s"] < limit * 60, name
    assert HeroSlurm(time_per_job="02:00:00").time_min(get_study("hero").hero) == 120


def test_hero_runs_rack_local_and_the_plan_refuses_another_layout_naming_both_fields():
    from marin_ablate.ablations.studies import HeroPlan

    st, spec = _hero()
    assert spec.train.replica_groups == st.hero.ep_groups == 11
    rack = get_study("hero_rack")
    assert rack.runs()[0][0].train.replica_groups == rack.hero.ep_groups == 1
    flat = dataclasses.replace(spec, train=dataclasses.replace(spec.train, replica_groups=1))
    with pytest.raises(ValueError, match=r"TrainConfig.replica_groups=1 must equal HeroPlan.ep_groups=11"):
        HeroPlan().check(flat)


@pytest.mark.slow
def test_under_hsdp_the_expert_zero_collectives_and_the_gradient_reduction_cross_racks_not_the_gathers():
    from marin_ablate.marin.flops import params_routed, params_total
    from marin_ablate.planning.timemodel import time_model

    st, spec = _hero()
    hsdp = time_model(spec, st.hero)
    flat = time_model(dataclasses.replace(spec, train=dataclasses.replace(spec.train, replica_groups=1)), st.hero)
    n_routed = params_routed(spec.model, spec.recipe)
    n_dense = params_total(spec.model, spec.recipe) - n_routed
    across = hsdp["bytes_across_racks"]
    assert not any(k.startswith("FSDP") for k in across)  # non-expert gathers stay in the rack
    # the expert slice (1/64 of the routed parameters) gathered twice (forward, recompute) in bf16 and its
    # fp32 gradient reduce-scattered once over the 11 racks: what an all-reduce of it would send
    gather = "expert slice all-gather over 11 ranks (bf16, 2 forward passes)"
    assert across[gather] == pytest.approx(2 * 2 * n_routed / 64 * 10 / 11, rel=1e-9)
    assert across["expert slice reduce-scatter of fp32 gradients over 11 ranks"] == pytest.approx(
        4 * n_routed / 64 * 10 / 11, rel=1e-9)
    ns = "Newton-Schulz of expert matrices to owners over 11 ranks and back (fp32)"
    assert across[ns] == pytest.approx(2 * 4 * n_routed / 704 * 10 / 11, rel=1e-9)  # each rank's shard, twice
    assert across["gradient all-reduce of the rank's non-expert shard over 11 replicas (fp32, ring)"] == \
        pytest.approx(2 * 4 * n_dense / 64 * 10 / 11, rel=1e-9)
    assert len(across) == 4
    name = "FSDP all-gather of bf16 non-expert parameters over 704 ranks (forward + backward)"
    assert flat["bytes_across_racks"][name] == pytest.approx(2 * 2 * n_dense * 703 / 704, rel=1e-9)
    assert sum(flat["bytes_across_racks"].values()) > 2 * sum(across.values())
    with pytest.raises(ValueError, match=r"TrainConfig.replica_groups=3 with world_size=704"):
        time_model(dataclasses.replace(spec, train=dataclasses.replace(spec.train, replica_groups=3)), st.hero)


@pytest.mark.slow  # the full hero model on the meta device, sharded for 704 fake ranks, three times
def test_hero_expert_slice_shards_3072_rows_over_11_racks_unpadded_and_the_flat_layout_builds():
    """The hero's rank 0 and rank 703 (first and last rack): each expert stack of the 6-expert slice
    holds 280 of its 3072 rows (10 racks; the last 272, and the dry run counts the largest shard); FSDP
    over all 704 ranks (`replica_groups=1`, where FSDP2 would refuse 3072 rows over 11) builds too."""
    from marin_ablate.marin.flops import params_routed
    from marin_ablate.planning.dryrun import current_sharding, rank_state

    _, spec = _hero()
    layers = spec.model.n_layers
    per_row = 6 * 3072 * 3  # one row of each of the 3 stacks of 6 experts (width = hidden = 3072)
    first = rank_state(spec, 704, 64, 0, current_sharding(spec))
    last = rank_state(spec, 704, 64, 703, current_sharding(spec))
    assert first["by_role"]["expert"] == layers * per_row * 280 and last["by_role"]["expert"] == layers * per_row * 280
    assert 10 * 280 + 272 == 3072 and params_routed(spec.model, spec.recipe) // 64 == layers * per_row * 3072
    flat = dataclasses.replace(spec, train=dataclasses.replace(spec.train, replica_groups=1))
    st = rank_state(flat, 704, 64, 703, current_sharding(flat))
    assert st["by_role"]["expert"] == layers * per_row * 280 and st["experts_per_rank"] == 6


def test_checkpoint_cadence_fits_the_job_limit_only_with_the_hourly_temporary_checkpoint():
    from marin_ablate.planning.timemodel import checkpoint_cadence

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
    and half its EP slice (one rank per slice in a rack: ZeRO across the racks); as one flat group 1/8
    and half its slice."""
    from marin_ablate.marin.flops import params_routed, params_total
    from marin_ablate.planning.dryrun import current_sharding, rank_state

    model = ModelConfig(d_model=64, n_layers=2, n_heads=4, head_dim=16, seq_len=64, window=32, n_experts=8,
                        top_k=2, ep_shards=4)
    n_routed = params_routed(model, Recipe())
    n_dense = params_total(model, Recipe()) - n_routed
    for racks, shard, slice_part in ((2, 4, 2), (1, 8, 2)):
        spec = RunSpec(model=model, recipe=Recipe(), train=TrainConfig(batch_size=16, replica_groups=racks))
        st = rank_state(spec, 8, 4, 5, current_sharding(spec))
        dense = sum(v for k, v in st["by_role"].items() if k != "expert")
        assert n_dense / shard <= dense <= 1.1 * n_dense / shard  # FSDP2 pads rows up to a multiple
        assert st["by_role"]["expert"] == n_routed // 4 // slice_part and st["experts_per_rank"] == 2
    assert "HSDP" in current_sharding(RunSpec(model=model, train=TrainConfig(replica_groups=2))).name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hero", "hero_2rack", "hero_rack", "hero_node", "hero_gpu"])
def test_hero_and_its_smoke_runs_fit_165_gib_per_rank_with_nothing_on_the_host(name):
    # the dry run's memory table (part b) on the study's own layout; nothing may sit in host memory
    from marin_ablate.planning.dryrun import dry_run

    st = get_study(name)
    spec = st.runs()[0][0]
    st.hero.check(spec)
    assert spec.train.offload == "none" and spec.train.batch_size == 16 * st.hero.gpus
    rep = dry_run(spec, st.hero.gpus, spec.model.ep_shards, capacity_gib=173.0)
    assert rep["experts_per_rank"] == (8 if name == "hero_gpu" else 6) and rep["sequences_per_rank"] == 16
    for level, t in rep["tables"].items():
        assert t["ok"] and t["total"] <= 165 * GiB and t["host"] == 0, (name, level, t["total"] / GiB)
        # only the hero has racks to shard its expert slice across; its gathered layer is a line of its own
        assert any("ExpertShard" in r["line"] for r in t["rows"]) == (name in ("hero", "hero_2rack"))


@pytest.mark.slow
def test_the_hero_fits_at_every_context_stage():
    """4k x 16, 16k x 4 and 65k x 1 sequences per GPU: the memory table at each stage's own shape (the 4k
    stage is the run's own spec, dry-run by the `hero` case of the test above)."""
    from marin_ablate.marin.train.stages import stage_specs
    from marin_ablate.planning.dryrun import dry_run

    st = get_study("hero")
    spec = st.runs()[0][0]
    stages = stage_specs(spec)
    first = stages[0][1]  # the run's own shape: only the stage list itself is dropped
    assert first.model == spec.model and first.train == dataclasses.replace(spec.train, context_stages=())
    assert stages[0][0].seq_len == 4096 and spec.train.batch_size // st.hero.gpus == 16
    shapes = []
    for stage, at, _ in stages[1:]:
        rep = dry_run(at, st.hero.gpus, at.model.ep_shards, capacity_gib=173.0)
        shapes.append((stage.seq_len, rep["sequences_per_rank"]))
        for level, t in rep["tables"].items():
            assert t["ok"] and t["total"] <= 165 * GiB, (stage.seq_len, level, t["total"] / GiB)
    assert shapes == [(16_384, 4), (65_536, 1)]
