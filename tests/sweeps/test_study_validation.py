"""`run`, `plan` and `tune` refuse every setting `train` refuses (marin.train.loop.check_spec, one
validator), before a run directory, a study folder or a tuning storage is written."""

from __future__ import annotations

import importlib
import json
import re

import pytest

from marin_ablate.cli.main import main
from marin_ablate.marin.config import DataConfig, RunSpec, TrainConfig
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train.loop import _device, check_spec


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("command", [["plan"], ["run"], ["run", "--tune"]])
@pytest.mark.parametrize("setting, says", [
    ("data.eval_dir=/no/such/eval", "DataConfig.eval_dir='/no/such/eval': no such directory"),
    ("train.device=cuda:99", "TrainConfig.device='cuda:99' but CUDA is not available"),
    ("train.device=tpu", "TrainConfig.device='tpu' is not supported; allowed values: 'cpu', 'cuda', 'cuda:N'"),
])
def test_a_setting_train_refuses_is_refused_before_anything_is_written(tmp_path, capsys, command, setting, says):
    out = tmp_path / "out"
    assert main([command[0], "smoke", *command[1:], "--out", str(out), f"--{setting}"]) == 2
    err = _one_line(capsys)
    # names the first run it concerns: a design run, or for `run` a run of the LR profile before the design
    assert says in err and "run " in err and re.search(r"\(rung cpu_s\d+, arm ", err), err
    assert not out.exists()


def test_the_device_name_is_checked_for_runs_elsewhere_its_presence_only_here():
    assert _device(TrainConfig(device="cuda:99"), here=False).index == 99  # a SLURM job's GPU, not this machine's
    with pytest.raises(ValueError, match="CUDA is not available"):
        _device(TrainConfig(device="cuda:99"))
    for bad in ("cpu:0", "cuda:x", "cuda:"):
        with pytest.raises(ValueError, match="is not supported"):
            _device(TrainConfig(device=bad), here=False)


def test_eval_domains_are_checked_against_the_eval_dir_given_not_the_training_corpus(tmp_path):
    ev = tmp_path / "eval"
    (ev / "legal" / "val").mkdir(parents=True)
    (ev / "legal" / "val" / "a.jsonl").write_text(json.dumps({"text": "the court held that"}) + "\n")
    spec = RunSpec(model=preset("tiny"), data=DataConfig(corpus="embedded", eval_dir=str(ev), eval_domains=("legal",)))
    check_spec(spec)  # 'legal' is no domain of the embedded corpus, but it is one of eval_dir
    with pytest.raises(ValueError, match=r"\['web'\] are not domains of DataConfig.eval_dir=.*; allowed values: legal"):
        check_spec(RunSpec(model=preset("tiny"), data=DataConfig(corpus="embedded", eval_dir=str(ev),
                                                                  eval_domains=("web",))))


@pytest.mark.parametrize("url, says", [("postgresql://u@localhost/db", "ImportError"),
                                       ("nosuchdialect://x", "NoSuchModuleError")])
def test_tune_storage_without_a_driver_is_one_line_and_leaves_no_study_folder(tmp_path, capsys, url, says):
    out = tmp_path / "out"
    assert main(["run", "smoke", "--tune", "--out", str(out), "--tune.storage", url]) == 2
    err = _one_line(capsys)
    assert f"--tune.storage {url!r} cannot be opened ({says}" in err
    assert not out.exists()


def test_train_on_the_embedded_corpus_evaluates_an_eval_dir_domain_it_lacks(tmp_path):
    from marin_ablate.marin.train import train

    ev = tmp_path / "eval"
    (ev / "legal" / "val").mkdir(parents=True)
    (ev / "legal" / "val" / "a.jsonl").write_text("".join(json.dumps({"text": f"the court held that {i} " * 20})
                                                          + "\n" for i in range(8)))
    spec = RunSpec(model=preset("tiny", ["seq_len=64"]), data=DataConfig(eval_dir=str(ev), eval_domains=("legal",)),
                   train=TrainConfig(steps=2, batch_size=2, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=0, threads=1))
    out = train(spec, tmp_path / "run")
    assert out["status"] == "completed" and set(out["eval_domain_loss"]) == {"legal"}


def test_wandb_online_without_a_key_is_one_line_before_the_run_folder_exists(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--train.steps=1", "--run-dir", str(out), "--log-to", "wandb"]) == 2
    assert "--log-to wandb with WANDB_MODE=online needs an API key" in _one_line(capsys)
    assert not out.exists()
    assert main(["run", "smoke", "--out", str(tmp_path / "study"), "--log-to", "wandb"]) == 2
    assert "needs an API key" in _one_line(capsys) and not (tmp_path / "study").exists()


@pytest.mark.parametrize("make, says", [
    (lambda: preset("tiny", ["capacity_fixed=1e308"]), r"ModelConfig.capacity_fixed=1e\+308 is out of range; allowed "
                                                       r"values: a number in \(0, 1024\]"),
    (lambda: importlib.import_module("marin_ablate.ablations.factors").Factor(
        "w", field="model.window", levels={"a": 32, "b": 64}, truth=0.5),
     r"Factor 'w': truth=0.5; allowed values: a mapping of M_flop, R -> a multiplier > 0"),
])
def test_settings_that_overflowed_or_crashed_are_one_line_errors(make, says):
    with pytest.raises(ValueError, match=says):
        make()


def test_a_model_too_large_for_memory_is_named_as_a_setting(tmp_path):
    from marin_ablate.marin.train import train

    spec = RunSpec(model=preset("tiny", ["d_model=1000000000"]), train=TrainConfig(steps=1, threads=1))
    with pytest.raises(ValueError, match=r"the model \(ModelConfig.d_model=1000000000, .*\) does not fit in the memory "
                                         r"of cpu \(.*allocate"):
        train(spec, tmp_path / "run")
    assert not (tmp_path / "run" / "spec.json").exists()  # the folder is not claimed: a corrected run may use it


@pytest.mark.slow
def test_the_status_hint_after_a_failed_study_named_by_path_works(tmp_path, capsys, monkeypatch):
    import shlex

    (tmp_path / "mystudy.py").write_text("from marin_ablate.ablations.studies import smoke\n\n"
                                         "study = smoke(rungs=('cpu_s32',))\n")
    monkeypatch.chdir(tmp_path)
    # every run fails at once in setup (its first tensor cannot be allocated)
    # (the design's runs: the LR profile before them would stop the study first, naming its folder)
    args = ["mystudy.py:study", "--out", str(tmp_path / "out"), "--model.d_model=1000000000", "--no-profile"]
    assert main(["run", *args, "--no-pin", "--executor", "debug", "--no-analyze"]) == 1
    out = capsys.readouterr().out
    hint = out.split("failed runs keep their error in summary.json; `", 1)[1].split("`", 1)[0]
    assert hint == "marin-ablate status " + shlex.join(args)
    assert main(shlex.split(hint)[1:]) == 0
    assert "failed " in capsys.readouterr().out


def test_every_gpu_rung_puts_one_ep_shard_on_each_gpu_and_a_rung_that_cannot_tile_is_refused():
    from marin_ablate.ablations.ladders import GPU_RUNGS, _gpu

    assert {n: (r.gpus, r.model().ep_shards) for n, r in GPU_RUNGS.items()} == {
        "d512": (8, 8), "d768": (8, 8), "d1024": (16, 16), "d1536": (32, 32), "d2048": (64, 64)}
    assert _gpu("d1024", 256, 8).gpus == 8  # 2 of the 16 EP shards on each GPU
    with pytest.raises(ValueError, match=r"Rung 'd1024': gpus=12 neither divides nor is a multiple of "
                                         r"ep_shards=16; allowed values: divisors of 16 \(each GPU holds whole EP "
                                         r"shards, 1: virtual EP in one process\) or multiples of 16"):
        _gpu("d1024", 256, 12)


def test_gpus_per_run_that_cannot_hold_a_rung_s_ep_groups_is_refused_before_anything_is_written(tmp_path, capsys):
    from marin_ablate.ablations import get_study
    from marin_ablate.sweeps.executors import ExecOptions, SlurmOptions
    from marin_ablate.sweeps.sweep import check_layouts, planned_runs, study_resources

    study = get_study("marin535")
    runs = planned_runs(study, tmp_path)
    check_layouts(runs, ExecOptions(executor="slurm"), study_resources(study))  # the rungs' own GPUs tile
    # 8 GPUs hold d1024's 16 EP shards two each
    check_layouts(runs, ExecOptions(executor="slurm", slurm=SlurmOptions(gpus_per_run=8)), study_resources(study))
    with pytest.raises(ValueError, match=r"run \w+ \(rung d512, arm [^)]+\) on 12 GPUs: ModelConfig.ep_shards=8 "
                                         r"\(the EP group size\) with world_size=12: .*; use --slurm.gpus_per_run a "
                                         r"divisor or a multiple of its ModelConfig.ep_shards=8"):
        check_layouts(runs, ExecOptions(executor="slurm", slurm=SlurmOptions(gpus_per_run=12)), study_resources(study))
    assert not any(tmp_path.iterdir())
