"""A rung on fewer GPUs than its own (planning/layout.py): the EP group and virtual shards a GPU count gives, the
fewest micro-batches whose memory fits (from the dry run's memory model), a refusal naming the numbers when
one sequence per micro-batch does not fit, and `run` applying the layout without changing any run id."""

from __future__ import annotations

import pytest

from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
from marin_ablate.marin.presets import preset
from marin_ablate.planning.layout import (
    accumulation_rows,
    choose_layout,
    ep_layout,
    wall_factor,
    with_layout,
)

SPEC = RunSpec(model=preset("tiny", ["seq_len=64", "ep_shards=4"]), recipe=Recipe(),
               train=TrainConfig(batch_size=16, threads=1))


@pytest.fixture(scope="module")
def act1():
    from marin_ablate.planning.memory import fit_activations

    return fit_activations(SPEC, 1)


def test_fewer_gpus_than_ep_shards_hold_virtual_shards_in_one_ep_group():
    d1024 = RunSpec(model=preset("tiny", ["n_experts=64", "top_k=4", "ep_shards=16"]))
    assert ep_layout(d1024, 1) == (1, 16)  # one process: every shard virtual
    assert ep_layout(d1024, 8) == (8, 2)
    assert ep_layout(d1024, 16) == (16, 1) and ep_layout(d1024, 32) == (16, 1)
    with pytest.raises(ValueError, match=r"12 GPUs per run for ModelConfig.ep_shards=16: each GPU holds whole EP "
                                         r"shards; allowed values: divisors of 16 or multiples of 16"):
        ep_layout(d1024, 12)


@pytest.mark.slow
def test_the_layout_takes_the_fewest_micro_batches_that_fit(act1):
    roomy = choose_layout(SPEC, 1, 1000.0, act1=act1)
    assert roomy["micro_batches"] == 1 and roomy["sequences_per_micro_batch"] == 16
    # 90% of what the whole batch at once needs: the batch must be split
    lay = choose_layout(SPEC, 1, roomy["predicted_gib"] * 0.9 / 0.95, act1=act1)
    assert lay["micro_batches"] > 1 and lay["sequences_per_micro_batch"] * lay["micro_batches"] == 16
    assert lay["predicted_gib"] <= lay["capacity_gib"] * 0.90 and lay["headroom_note"] is None  # 10% free
    assert lay["predicted_gib"] < roomy["predicted_gib"]  # fewer sequences at once hold less
    bigger = choose_layout(SPEC, 1, lay["capacity_gib"] * 1.5, act1=act1)
    assert bigger["micro_batches"] <= lay["micro_batches"]  # more memory never needs more micro-batches


@pytest.mark.slow
def test_a_layout_keeps_a_tenth_of_the_gpu_free_or_says_why_not(act1):
    """10% free by default (HEADROOM); where one sequence per micro-batch leaves less, the layout takes that, down
    to 5% (MIN_HEADROOM), and says what more micro-batches cannot shrink; below 5% it is refused."""
    one = choose_layout(SPEC, 1, 1000.0, headroom=1 - 1e-12, min_headroom=0.0, act1=act1)  # one sequence at a time
    assert one["micro_batches"] == 16
    p1 = one["predicted_gib"]
    roomy = choose_layout(SPEC, 1, p1 / 0.85, act1=act1)
    assert roomy["free"] >= 0.10 and roomy["headroom_note"] is None
    tight = choose_layout(SPEC, 1, p1 / 0.93, act1=act1)
    assert tight["micro_batches"] == 16 and tight["free"] == pytest.approx(0.07, abs=1e-9)
    assert tight["headroom_note"].startswith(f"7.0% of the GPU free, under the wanted 10%: even one sequence per "
                                             f"micro-batch needs {p1:.1f} GiB; more micro-batches cannot shrink")
    with pytest.raises(ValueError, match=r"even 1 sequence per micro-batch \(16 micro-batches\) needs [0-9.]+ GiB per "
                                         r"GPU, over [0-9.]+ GiB \(95% of the capacity"):
        choose_layout(SPEC, 1, p1 / 0.97, act1=act1)


@pytest.mark.slow
def test_a_layout_that_cannot_fit_is_refused_naming_the_numbers(act1):
    with pytest.raises(ValueError, match=r"64-wide model, batch 16 on 1 GPU\(s\) of 0.001 GiB: even 1 sequence "
                                         r"per micro-batch \(16 micro-batches\) needs [0-9.]+ GiB per GPU, over "
                                         r"[0-9.]+ GiB .*allowed: more GPUs per run \(about \d+ or more\), or GPUs "
                                         r"with more memory"):
        choose_layout(SPEC, 1, 0.001, act1=act1)


def test_accumulation_keeps_the_step_s_residual_streams_pins_and_qb_margins():
    assert accumulation_rows(SPEC, 16, 1) == ()  # one batch: nothing beyond the measured step
    rows = {r["line"].split(":")[1].strip().split(" (")[0]: r["bytes"] for r in accumulation_rows(SPEC, 16, 4)}
    tokens, m = 16 * 64, SPEC.model
    g = m.moe_geometry(SPEC.recipe)
    assert rows["residual streams of 4 micro-batches"] == 2 * tokens * m.d_model * 4
    assert rows["the step's routing pins"] == tokens * g.top_k * 9 * m.n_layers
    # the hist estimator bins each micro-batch's margins as they come; topk keeps the step's margins
    assert rows["QB margin histograms of the step"] == g.n_experts * m.qb_hist_bins * 8 * m.n_layers
    topk = RunSpec(model=preset("tiny", ["seq_len=64", "qb_estimator=topk"]))
    rows = {r["line"].split(":")[1].strip().split(" (")[0]: r["bytes"] for r in accumulation_rows(topk, 16, 4)}
    assert rows["QB margins of the step's other 3 micro-batches"] == (tokens - tokens // 4) * g.n_experts * 4 * 2
    assert wall_factor(SPEC, 1) == 1.0 and wall_factor(SPEC, 4) == pytest.approx(4 / 3)


def test_run_applies_the_layout_to_gpu_runs_on_fewer_gpus_without_changing_their_ids(tmp_path, monkeypatch):
    from marin_ablate.ablations import get_study
    from marin_ablate.planning import layout
    from marin_ablate.sweeps.executors import ExecOptions, SlurmOptions
    from marin_ablate.sweeps.sweep import planned_runs, with_layouts

    asked = []
    monkeypatch.setattr(layout, "cached_layout", lambda spec, gpus, cap: asked.append((gpus, cap)) or
                        {"micro_batches": 4 if gpus == 1 else 1})
    study = get_study("marin535")
    runs = planned_runs(study, tmp_path)[:3]
    one = with_layouts(runs, ExecOptions(executor="slurm", slurm=SlurmOptions(gpus_per_run=1), gpu_mem_gib=139.8),
                       study)
    assert [r.run_id for r in one] == [r.run_id for r in runs]  # the same runs
    assert {r.spec.train.micro_batches for r in one} == {4} and set(asked) == {(1, 139.8)}
    own = with_layouts(runs, ExecOptions(executor="slurm"), study)  # the rungs' own GPUs: as planned
    assert [r.spec for r in own] == [r.spec for r in runs]
    local = with_layouts(runs, ExecOptions(executor="local"), study)  # a local GPU node: one GPU per run
    assert {r.spec.train.micro_batches for r in local} == {4}
    assert with_layout(SPEC, {"micro_batches": 2}).run_id == SPEC.run_id
