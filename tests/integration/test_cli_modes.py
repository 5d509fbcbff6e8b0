"""Commands that are modes of one (README "Command line"): `plan --preset`, `run --tune`, `analyze
--import.table` and `analyze --forecast`; the old command names refused naming the new form; two modes at
once refused naming both; section flags spelled with dashes; an executor row's `options` as its own section."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from test_cli_options import help_text

from marin_ablate.cli import parse as options
from marin_ablate.cli.main import MOVED
from marin_ablate.cli.main import main as cli_main
from marin_ablate.marin.fields import option


@pytest.mark.parametrize("old, new", [("describe", "marin-ablate plan --preset P"),
                                      ("tune", "marin-ablate run STUDY --tune"),
                                      ("import", "marin-ablate analyze --import.table FILE"),
                                      ("forecast", "marin-ablate analyze STUDY --forecast --target FLOPS")])
def test_each_moved_command_is_refused_naming_its_new_form(tmp_path, monkeypatch, capsys, old, new):
    monkeypatch.chdir(tmp_path)
    assert MOVED[old].startswith(new)
    assert cli_main([old, "smoke", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"marin-ablate: {old!r} is now a mode of another command; use {MOVED[old]} (docs/cli.md)"]
    assert list(tmp_path.iterdir()) == []  # refused before any work


def test_plan_preset_prints_the_presets_record(capsys):
    from marin_ablate.ablations.ladders import rung_of_preset
    from marin_ablate.marin.flops import describe_preset

    assert cli_main(["plan", "--preset", "tiny", "--baseline", "--model.d_model=32", "--recipe.xsa=xsa", "--json"]) == 0
    want = describe_preset("tiny", ("model.d_model=32", "recipe.xsa=xsa"), True, rung_of_preset("tiny"))
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(want))
    assert cli_main(["plan", "--preset", "d512"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("preset d512\n") and "params_total" in out and "tokens_per_ep_shard    65536" in out


@pytest.mark.parametrize("argv, says", [
    (["plan", "smoke", "--preset", "tiny"], "STUDY 'smoke' and --preset tiny: plan takes one of them"),
    (["plan"], "plan needs a STUDY (`marin-ablate studies` lists them) or --preset P"),
    (["plan", "--preset", "tiny", "--runs"], "--preset tiny: --runs is a study's option"),
    (["plan", "smoke", "--dry-run", "--precision"], "--dry-run and --precision are two modes of plan; allowed: one"),
    (["analyze", "x", "--import.table", "t.csv", "--forecast"], "--import and --forecast are two modes of analyze"),
    (["analyze", "x", "--forecast"], "--forecast needs --target FLOPS"),
    (["analyze", "x", "--import.table", "t.csv"], "STUDY 'x' with --import.table"),
    (["run", "smoke", "--tune", "--tuned"], "--tune profiles the LRs instead of running the design; --tuned"),
    (["plan", "smoke", "--dry_run"], "--dry_run was renamed; use --dry-run (docs/cli.md)"),
    (["plan", "smoke", "--dry_run.gpus", "8"], "--dry_run.gpus was renamed; use --dry-run.gpus"),
])
def test_a_mode_given_wrong_is_one_line_naming_what_to_give(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.chdir(tmp_path)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_analyze_import_then_forecast_on_a_tiny_study_folder(tmp_path, capsys):
    src = tmp_path / "ladder.csv"
    rows = ["arm,rung,seed,xsa,sconv,loss,flops,tokens,tokens_per_s"]
    for r, (c, base) in enumerate([(1e18, 1.79), (4e18, 1.76), (1.6e19, 1.735)]):
        for seed in range(2):
            for arm, xsa, sconv, d in (("all_off", "none", "none", 0), ("x", "xsa", "none", -0.003),
                                       ("s", "none", "short_conv", -0.006), ("all_on", "xsa", "short_conv", -0.009)):
                rows.append(f"{arm},s{r},{seed},{xsa},{sconv},{base + d + 0.001 * seed:.4f},{c},{c / 1e8},20000")
    src.write_text("\n".join(rows) + "\n")
    sd = tmp_path / "study"
    assert cli_main(["analyze", "--import.table", str(src), "--study-dir", str(sd), "--import.study", "ladder"]) == 0
    assert f"imported 24 rows as 24 runs into {sd}; next: marin-ablate analyze {sd}" in capsys.readouterr().out
    assert cli_main(["analyze", str(sd), "--forecast", "--target", "1e20", "--forecast.note", "n",
                     "--design", "factorial", "--n-boot", "10"]) == 0
    assert "arm recipe at 1e+20 FLOPs -> loss" in capsys.readouterr().out
    (fc,) = (sd / "forecasts").iterdir()
    assert json.loads(fc.read_text())["content"]["note"] == "n"


@pytest.mark.slow  # real tuning runs of every arm
def test_run_tune_profiles_every_arm_as_tune_did(tmp_path, capsys):
    from marin_ablate.sweeps.tuning import tuned_multipliers

    study = "tests/sweeps/test_sweeps.py:tiny_study"
    assert cli_main(["run", study, "--tune", "--tune.points", "3", "--executor", "debug", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny: LR profile at rung tiny, seed 0, log2 multipliers [-2.0, 0.0, 2.0]" in out
    # the study as given (a path:attribute, not its name `tiny`) and its --out: the command that finds the file
    assert f"use `marin-ablate run {study} --out {tmp_path} --tuned`" in out
    assert (tmp_path / "tiny" / "tune" / "optuna.journal").stat().st_size > 0
    assert set(tuned_multipliers(tmp_path, "tiny")) == {"all_off", "all_on"}


@dataclass(frozen=True)
class CloudOptions:
    """A plugin executor's own options."""

    zone: str = option("eu-1", help="where the runs go")
    spot_price: float | None = option(None, lo=0, lo_open=True, help="the most it pays per hour")


class CloudExecutor:
    """A plugin row with an `options` dataclass: `--fake-cloud.*` on plan and run; `slots` records what reached it."""

    name, waits, shows_jobs, in_process, trains_here = "fake_cloud", True, True, False, False
    options = CloudOptions
    seen: list = []

    def validate(self, opts) -> None:
        pass

    def slots(self, opts):
        self.seen.append(opts.options)
        return 4


@pytest.fixture
def cloud():
    from marin_ablate.sweeps.executors import EXECUTORS, register_executor

    ex = register_executor(CloudExecutor())
    try:
        yield ex
    finally:
        EXECUTORS.pop("fake_cloud", None)
        ex.seen.clear()


def test_a_plugin_executors_options_are_its_own_section_and_reach_it(cloud, tmp_path, capsys):
    from marin_ablate.cli.run import RunOptions
    from marin_ablate.sweeps.job import exec_options

    text = help_text(RunOptions)
    assert "--fake-cloud.zone" in text and "--fake-cloud.spot-price" in text and "--slurm.partition" in text
    args = options.parse(RunOptions, ["smoke", "--fake-cloud.spot_price", "0.5"])
    ex = exec_options(args.execution, None)
    assert ex.executor == "fake_cloud" and ex.options == CloudOptions(spot_price=0.5)  # the section implies --executor
    assert cli_main(["plan", "smoke", "--fake-cloud.zone", "us-2", "--json", "--out", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["execution"] == {"executor": "fake_cloud", "workers": 4}
    assert cloud.seen == [CloudOptions(zone="us-2")]
    for argv, says in ((["--fake-cloud.spot_price", "0"], "--fake-cloud.spot_price=0.0 is out of range"),
                       (["--fake_cloud.zone", "x"], "--fake_cloud.zone was renamed; use --fake-cloud.zone"),
                       (["--executor", "debug", "--fake-cloud.zone", "x"],
                        "--fake_cloud.* options are the fake_cloud executor's, given with --executor debug"),
                       (["--fake-cloud", "--slurm.qos", "q"], "the options of 2 executors")):
        assert cli_main(["plan", "smoke", *argv, "--out", str(tmp_path)]) == 2
        assert says in capsys.readouterr().err, argv


def test_help_lists_each_moved_command_with_its_new_form(capsys):
    assert cli_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(k in out and v in out for k, v in MOVED.items())
    assert not any(f"\n  {k} " in out.split("modes of a command now")[0] for k in MOVED)  # no longer a command


def test_run_plans_and_checks_its_design_once_then_runs_it_at_the_tuned_lrs(tmp_path, monkeypatch, capsys):
    """`run --tuned`: the design enumerated once (`Study.runs`) and checked once (`check_specs`, in `preflight`),
    before anything is written; the LR multipliers then change only the planned runs' LR scale (`at_lrs`)."""
    from marin_ablate.ablations.study import Study
    from marin_ablate.sweeps import sweep
    from marin_ablate.sweeps.tuning import tune_dir

    calls: dict = {"runs": 0, "checks": []}
    real_runs, real_check = Study.runs, sweep.check_specs

    def runs(self, *a, **kw):
        calls["runs"] += 1
        return real_runs(self, *a, **kw)

    def check_specs(planned, *a, **kw):
        calls["checks"].append(len(planned))
        return real_check(planned, *a, **kw)

    monkeypatch.setattr(Study, "runs", runs)
    monkeypatch.setattr(sweep, "check_specs", check_specs)
    (tune_dir(tmp_path, "tiny")).mkdir(parents=True)
    (tune_dir(tmp_path, "tiny") / "lr_multipliers.json").write_text('{"all_off": 0.5, "all_on": 2.0}')
    argv = ["run", "tests/sweeps/test_lr_profile.py:tiny_study", "--tuned", "--executor", "debug", "--out",
            str(tmp_path), "--no-analyze"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert calls == {"runs": 1, "checks": [2]}  # 3 and [2, 2] before
    lr = {json.loads((d / "meta.json").read_text())["arm"]: json.loads((d / "spec.json").read_text())
          for d in (tmp_path / "tiny" / "runs").iterdir()}
    assert {a: s["train"]["lr_scale"] for a, s in lr.items()} == {"all_off": 0.5, "all_on": 2.0}
