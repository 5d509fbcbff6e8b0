"""The training loop (docs/architecture.md): every factor combination trains, tiny runs learn, preemption and
exact resume, context stages, divergence and bad-input handling."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from train_signalled import signal_after

from marin_ablate.cli import parse as options
from marin_ablate.cli.train import TrainOptions
from marin_ablate.marin.config import (
    BASELINE_LEVELS,
    FACTORS,
    RECIPE_LEVELS,
    ContextStage,
    DataConfig,
    Recipe,
    RunSpec,
    TrainConfig,
)
from marin_ablate.marin.presets import preset, spec_of_preset
from marin_ablate.marin.train import context_plan, is_spike, train

ROOT = Path(__file__).resolve().parents[2]
TINY = preset("tiny", ["seq_len=64"])


def _fast(steps: int, batch: int = 2, **kw) -> TrainConfig:
    base = dict(steps=steps, batch_size=batch, eval_every=0, eval_batches=1, log_every=1, checkpoint_every=0,
                threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_macro_loss" in r]


@pytest.mark.slow
def test_every_factor_combination_takes_three_finite_steps(tmp_path):
    combos = list(itertools.product(*[(RECIPE_LEVELS[f][0], BASELINE_LEVELS[f]) for f in FACTORS]))
    assert len(combos) == 2 ** 7
    for i, levels in enumerate(combos):
        recipe = Recipe(**dict(zip(FACTORS, levels, strict=True)))
        # no final checkpoint: a study's CPU run keeps none either (sweeps/tracking.py default_retention)
        summary = train(RunSpec(model=TINY, recipe=recipe, train=_fast(3)), tmp_path / f"r{i}", resume=False,
                        keep_checkpoints="none")
        lines, _ = _metrics(tmp_path / f"r{i}")
        assert summary["status"] == "completed", (recipe, summary["error"])
        assert [r["step"] for r in lines] == [0, 1, 2], recipe
        assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in lines), recipe
        assert math.isfinite(summary["eval_macro_loss"]), recipe


@pytest.mark.slow
def test_tiny_run_learns_the_embedded_corpus(tmp_path):
    spec = RunSpec(model=TINY, train=_fast(200, batch=2, eval_every=200, eval_batches=2, log_every=20))
    summary = train(spec, tmp_path / "run")
    _, evals = _metrics(tmp_path / "run")
    first, last = evals[0], evals[-1]
    assert (first["step"], last["step"]) == (0, 200)
    assert last["eval_macro_loss"] <= 0.7 * first["eval_macro_loss"], (first["eval_macro_loss"],
                                                                        last["eval_macro_loss"])
    domains = set(summary["eval_domain_loss"])
    assert domains == {"code", "docs", "prose", "scripture"}
    for d in domains:
        assert last["eval_domain_loss"][d] < first["eval_domain_loss"][d], d
    # macro = unweighted mean of the domains; bpb = nats / ln 2 / bytes per token (1 for bytes)
    assert summary["eval_macro_loss"] == pytest.approx(sum(summary["eval_domain_loss"].values()) / len(domains))
    assert summary["macro_bpb"] == pytest.approx(summary["eval_macro_loss"] / math.log(2))
    assert summary["tokens"] == 200 * 2 * 64
    assert summary["train_flops"] == pytest.approx(summary["flops_per_token"] * summary["tokens"])
    for key in ("run_id", "status", "error", "failed_step", "step", "tokens", "params_total", "params_active",
                "flops_per_token", "train_flops", "eval_macro_loss", "eval_domain_loss", "macro_bpb",
                "final_train_loss", "tokens_per_s", "model_flops_per_s", "mfu", "drop_rate", "max_grad_norm",
                "spikes", "spike_steps", "wall_s", "hardware", "code_version", "loss_curve"):
        assert key in summary, key
    assert summary["run_id"] == spec.run_id and summary["step"] == 200
    assert 0.0 < summary["drop_rate"] < 1.0  # ragged transport at cf 1.15 drops a little on tiny batches


@pytest.mark.slow
def test_sigterm_at_step_k_then_resume_matches_an_uninterrupted_run(tmp_path):
    argv = ["--preset", "tiny", "--model.seq_len=64", "--train.steps", "24", "--train.batch_size=2",
            "--train.eval_every=8", "--train.eval_batches=1", "--train.checkpoint_every=10",
            "--train.log_every=1", "--train.threads=1"]
    args = options.parse(TrainOptions, argv + ["--run-dir", "x"])
    spec = spec_of_preset(args.preset, args.overrides, args.baseline, args.seed)
    ref = train(spec, tmp_path / "ref")

    run = tmp_path / "cut"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "tests/train_signalled.py", "13", "TERM", *argv, "--run-dir", str(run)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert not (run / "summary.json").exists()
    cks = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert cks == ["ckpt_000000010", "ckpt_000000014"]  # periodic, then the one the signal asked for
    lines, _ = _metrics(run)
    assert lines[-1]["step"] == 13

    resumed = train(spec, run)
    assert resumed["status"] == "completed"
    assert resumed["final_train_loss"] == ref["final_train_loss"]
    assert resumed["eval_macro_loss"] == ref["eval_macro_loss"]
    assert resumed["loss_curve"] == ref["loss_curve"]
    assert ([(r["step"], r["loss"]) for r in _metrics(run)[0]]
            == [(r["step"], r["loss"]) for r in _metrics(tmp_path / "ref")[0]])
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp files left


def _train_signalled(run_dir: Path, monkeypatch, sig: signal.Signals, at_step: int) -> tuple[dict, list]:
    """A 6-step tiny run that sends itself `sig` after step `at_step`, under a recording handler
    installed before train's (as submitit's or a local worker's is): (summary, signals it got)."""
    received = []
    old = signal.signal(sig, lambda s, f: received.append(s))
    try:
        with monkeypatch.context() as mp:
            signal_after(mp, at_step, sig)
            out = train(RunSpec(model=TINY, train=_fast(6)), run_dir)
    finally:
        signal.signal(sig, old)
    return out, received


def test_sigusr2_checkpoints_then_hands_the_signal_to_the_previous_handler(tmp_path, monkeypatch):
    out, received = _train_signalled(tmp_path / "run", monkeypatch, signal.SIGUSR2, at_step=2)
    assert out["status"] == "interrupted" and out["step"] == 3
    assert received == [signal.SIGUSR2]  # e.g. submitit's handler, which requeues the job
    assert (tmp_path / "run" / "checkpoints" / "ckpt_000000003" / "meta.json").exists()
    assert train(RunSpec(model=TINY, train=_fast(6)), tmp_path / "run")["step"] == 6


def test_a_previous_handler_that_raises_leaves_the_run_interrupted_and_resumable_not_failed(tmp_path, monkeypatch):
    # submitit's USR2 handler runs `scontrol requeue`; on a loaded node the requeue's own SIGTERM can kill that
    # command first, and submitit raises CalledProcessError out of the handler train hands the signal to
    def requeue_killed(signum, frame):  # noqa: ARG001
        raise subprocess.CalledProcessError(-signal.SIGTERM, ["scontrol", "requeue", "42_0"])

    old = signal.signal(signal.SIGUSR2, requeue_killed)
    try:
        with monkeypatch.context() as mp:
            signal_after(mp, 2, signal.SIGUSR2)
            out = train(RunSpec(model=TINY, train=_fast(6)), tmp_path / "run")
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert out["status"] == "interrupted" and out["step"] == 3
    assert not (tmp_path / "run" / "summary.json").exists()
    assert "WARNING the handler SIGUSR2 was handed back to raised CalledProcessError" in (
        tmp_path / "run" / "train.log").read_text()
    assert train(RunSpec(model=TINY, train=_fast(6)), tmp_path / "run")["step"] == 6


def test_sigterm_during_the_last_step_completes_the_run_and_still_reaches_the_previous_handler(tmp_path, monkeypatch):
    # A local worker stops taking runs on TERM; a TERM that lands in a run's last step must not be
    # swallowed by train's own handler just because the run then completed.
    out, received = _train_signalled(tmp_path / "run", monkeypatch, signal.SIGTERM, at_step=5)
    assert out["status"] == "completed" and out["step"] == 6
    assert received == [signal.SIGTERM]


def test_two_stage_context_schedule_switches_length_with_constant_tokens_per_step(tmp_path):
    t = _fast(10, batch=4, context_stages=(ContextStage(0.5, 128),))
    train(RunSpec(model=TINY, train=t), tmp_path / "run")
    lines, _ = _metrics(tmp_path / "run")
    assert [(r["seq_len"], r["batch_size"]) for r in lines] == [(64, 4)] * 5 + [(128, 2)] * 5
    assert [r["q_scale"] for r in lines] == [1.0] * 5 + [pytest.approx(1 + 0.1 * math.log(2))] * 5
    tokens = [r["tokens"] for r in lines]
    assert all(b - a == 256 for a, b in zip([0] + tokens, tokens, strict=False))
    with pytest.raises(ValueError, match="context_stages"):
        context_plan(RunSpec(model=TINY, train=_fast(10, batch=4, context_stages=(ContextStage(0.5, 96),))))


def test_diverged_run_writes_a_failed_summary_with_step_and_reason(tmp_path):
    t = _fast(5, lr=1e30, adam_lr=1e30)
    summary = train(RunSpec(model=TINY, recipe=Recipe.baseline(), train=t), tmp_path / "run")
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk == summary
    assert summary["status"] == "failed" and summary["failed_step"] == 1 and summary["step"] == 1
    assert "non-finite" in summary["error"] and "step 1" in summary["error"]


def test_bad_input_fails_before_any_work(tmp_path, capsys):
    from marin_ablate.cli.main import main

    assert main(["train", "--preset", "nope", "--run-dir", str(tmp_path / "a")]) == 2
    assert "unknown preset 'nope'; allowed values: tiny" in capsys.readouterr().err
    assert main(["train", "--preset", "tiny", "--recipe.xsa=maybe", "--run-dir", str(tmp_path / "b")]) == 2
    assert "Recipe.xsa='maybe'" in capsys.readouterr().err
    assert main(["train", "--preset", "tiny", "--train.lr_schedule=step", "--run-dir", str(tmp_path / "c")]) == 2
    assert "TrainConfig.lr_schedule" in capsys.readouterr().err
    with pytest.raises(ValueError, match="DataConfig.corpus='/no/such/corpus'"):
        train(RunSpec(model=TINY, train=_fast(3), data=DataConfig(corpus="/no/such/corpus")), tmp_path / "d")
    assert not (tmp_path / "d").exists()
    with pytest.raises(ValueError, match="log_to='mlflow' is not a known sink; allowed values: wandb, tensorboard"):
        train(RunSpec(model=TINY, train=_fast(3)), tmp_path / "g", log_to=("mlflow",))
    assert not (tmp_path / "g").exists()
    small = tmp_path / "small"
    small.mkdir()
    (small / "train.txt").write_text("a tiny corpus\n")
    (small / "heldout.txt").write_text("too small to eval\n")
    with pytest.raises(ValueError, match="fewer than one batch"):
        train(RunSpec(model=TINY, train=_fast(3), data=DataConfig(corpus=str(small))), tmp_path / "e")
    assert not list((tmp_path / "e" / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="vocab_size"):
        train(RunSpec(model=replace(TINY, vocab_size=128), train=_fast(3)), tmp_path / "f")


def test_spike_rule_uses_the_running_median():
    hist = [2.0] * 9
    assert not is_spike(10.0, hist, 1.5, 50)  # fewer than 10 losses: no verdict yet
    hist.append(2.0)
    assert is_spike(3.01, hist, 1.5, 50) and not is_spike(3.0, hist, 1.5, 50)
    assert is_spike(3.01, [2.0, 2.0, 100.0], 1.5, 3)  # the median ignores one earlier spike


@pytest.mark.slow  # imports tensorboard and wandb and trains
def test_metrics_also_reach_tensorboard_and_offline_wandb_when_asked(tmp_path, monkeypatch):
    """The optional sinks of: the same per-step records land in TensorBoard event files and in
    an offline W&B run (no network), beside metrics.jsonl."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    spec = RunSpec(model=TINY, recipe=Recipe(), train=_fast(4), seed=0)
    summary = train(spec, tmp_path / "run", log_to=("tensorboard", "wandb"))
    assert summary["status"] == "completed"
    steps, _ = _metrics(tmp_path / "run")

    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    loss_tag = next(t for t in acc.Tags()["scalars"] if t.endswith("loss"))
    tb = {e.step: e.value for e in acc.Scalars(loss_tag)}
    jsonl = {r["step"]: r[loss_tag.split("/")[-1]] for r in steps}
    assert len(tb) == 4 and tb.keys() == jsonl.keys() and all(math.isclose(tb[s], jsonl[s], rel_tol=1e-6) for s in tb)
    offline = list((tmp_path / "run" / "wandb").glob(f"offline-run-*-{spec.run_id}/*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0


def test_a_requeued_run_loads_its_checkpoint_without_drawing_random_weights(tmp_path, monkeypatch):
    """A resumed run builds on meta, materialises, and loads: the random initialiser (marin.parallel's
    blocked_trunc_normal_, which init_weights draws every matrix with) is never called for it, and it
    ends where an uninterrupted run ends; a fresh start draws every matrix."""
    from marin_ablate.marin import parallel

    spec = RunSpec(model=TINY, train=_fast(6, checkpoint_every=3))
    ref = train(spec, tmp_path / "ref")
    assert train(spec, tmp_path / "cut", stop_after=3)["status"] == "interrupted"
    drawn: list[str] = []
    real = parallel.blocked_trunc_normal_

    def counting(p, name, *a, **kw):
        drawn.append(name)
        return real(p, name, *a, **kw)

    monkeypatch.setattr(parallel, "blocked_trunc_normal_", counting)
    resumed = train(spec, tmp_path / "cut")
    assert resumed["status"] == "completed" and drawn == []
    assert resumed["loss_curve"] == ref["loss_curve"] and resumed["eval_macro_loss"] == ref["eval_macro_loss"]
    train(spec, tmp_path / "fresh")  # the control: a fresh start draws its matrices through the same function
    assert len(drawn) > 0 and "lm_head.weight" in drawn


def test_checkpoint_saves_plan_once_with_dcp_plan_caching(tmp_path, monkeypatch):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.planner import SavePlanner

    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.parallel import AsyncCheckpointer, save_planner

    for k in [k for k in vars(SavePlanner) if k.startswith("_cached")]:
        monkeypatch.setattr(SavePlanner, k, {})
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    dcp.save(sd, checkpoint_id=str(tmp_path / "a"), planner=save_planner(), no_dist=True)
    cached = SavePlanner._cached_global_plan["DefaultSavePlanner"]  # the global plan, kept for the next save
    dcp.save(sd, checkpoint_id=str(tmp_path / "b"), planner=save_planner(), no_dist=True)
    assert SavePlanner._cached_global_plan["DefaultSavePlanner"] == cached
    out = {"w": torch.zeros(2, 3)}
    dcp.load(out, checkpoint_id=str(tmp_path / "b"), no_dist=True)
    assert torch.equal(out["w"], sd["w"])
    seen = {}
    monkeypatch.setattr(dcp, "async_save", lambda state, **kw: seen.update(kw))
    AsyncCheckpointer(None).save(MarinModel(TINY, Recipe()), tmp_path / "c")
    assert seen["planner"]._enable_plan_caching  # the trainer's saves plan through the caching planner
