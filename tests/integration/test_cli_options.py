"""The command line as one typed config tree (marin_ablate/cli/parse.py): the flags the walker makes from
the option dataclasses, the sections and the modes they imply, the checks on the fields, the one
override form, and the old spellings refused naming the new ones."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, fields

import pytest

from marin_ablate.cli import parse as options
from marin_ablate.cli.main import main as cli_main
from marin_ablate.marin.fields import check_fields, option


def help_text(cls: type) -> str:
    """What `--help` prints for the options dataclass `cls`."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        options.parse(cls, ["--help"])
    return out.getvalue()


@dataclass(frozen=True)
class _Inner:
    size: int = option(3, lo=1, help="a size")
    label: str = option("x", choices=("x", "y"), help="a label")


@dataclass(frozen=True)
class _Outer:
    command = "outer"
    name: str = option(positional=True, help="a name")
    count: int = option(2, lo=0, hi=9, help="a count")
    ratio: float | None = option(None, lo=0, lo_open=True, help="a ratio")
    verbose: bool = option(False, help="talk")
    lines: tuple[str, ...] = option((), metavar="LINE", help="repeatable")
    inner: _Inner | None = option(None, section=_Inner, help="a mode")


def test_the_walker_makes_a_flag_per_field_with_its_default_in_help():
    text = " ".join(help_text(_Outer).split())  # wrapped lines joined
    for flag, default in (("--count", "default: 2"), ("--ratio", "default: none"), ("--verbose", "default: False"),
                          ("--lines", "default: empty"), ("--inner.size", "default: 3"),
                          ("--inner.label", "default: x")):
        assert flag in text and default in text, (flag, text)
    assert "allowed: an integer in 0..9" in text and "allowed: x, y" in text
    got = options.parse(_Outer, ["n", "--count", "4", "--lines", "a", "--lines", "b", "--verbose"])
    assert got == _Outer(name="n", count=4, lines=("a", "b"), verbose=True)


def test_every_slurm_option_of_the_executor_row_is_a_flag_of_plan_and_run():
    from marin_ablate.cli.plan import PlanOptions
    from marin_ablate.cli.run import RunOptions
    from marin_ablate.sweeps.executors import get_executor

    row = get_executor("slurm").options
    names = [f.name for f in fields(row) if "option" in f.metadata]
    assert {"partition", "time_min", "mem_gb", "setup", "signal_delay_s"} <= set(names)
    for cls in (PlanOptions, RunOptions):  # --help spells a field with dashes; as named parses too
        text = help_text(cls)
        assert all(f"--slurm.{n.replace('_', '-')}" in text for n in names), cls
        got = options.parse(cls, ["smoke", "--slurm.time_min", "5", "--slurm.mem-gb", "2"]).execution.backends
        assert got == (("slurm", row(time_min=5, mem_gb=2.0)),)


def test_a_section_option_implies_its_mode():
    from marin_ablate.cli.plan import DryRunOptions, PlanOptions, PrecisionOptions
    from marin_ablate.sweeps.job import exec_options

    assert options.parse(_Outer, ["n"]).inner is None
    assert options.parse(_Outer, ["n", "--inner"]).inner == _Inner()
    assert options.parse(_Outer, ["n", "--inner.size", "5"]).inner == _Inner(size=5)
    plan = options.parse(PlanOptions, ["smoke", "--dry-run.gpus", "8"])
    assert plan.dry_run == DryRunOptions(gpus=8) and plan.precision is None
    plan = options.parse(PlanOptions, ["smoke", "--precision.target_halfwidth", "0.05"])
    assert plan.precision == PrecisionOptions(target_halfwidth=0.05) and plan.dry_run is None
    plan = options.parse(PlanOptions, ["smoke", "--slurm.partition", "gpu"])
    ex = exec_options(plan.execution, None)
    assert ex.executor == "slurm" and ex.slurm.partition == "gpu"
    assert exec_options(options.parse(PlanOptions, ["smoke"]).execution, None).executor == "local"
    with pytest.raises(ValueError, match="--slurm.* options are the slurm executor's, given with --executor debug"):
        exec_options(options.parse(PlanOptions, ["smoke", "--executor", "debug", "--slurm.qos", "q"]).execution, None)


@pytest.mark.parametrize("argv, says", [
    (["n", "--count", "10"], "--count=10 is out of range; allowed values: an integer in 0..9"),
    (["n", "--ratio", "0"], "--ratio=0.0 is out of range; allowed values: None or a finite number > 0"),
    (["n", "--ratio", "nan"], "--ratio=nan is out of range; allowed values: None or a finite number > 0"),
    (["n", "--inner.label", "z"], "--inner.label='z' is not one of the allowed values; allowed values: x, y"),
    (["n", "--inner.size", "0"], "--inner.size=0 is out of range; allowed values: an integer >= 1"),
])
def test_a_bad_value_names_the_field_and_the_allowed_values(argv, says):
    with pytest.raises(ValueError) as e:
        options.parse(_Outer, argv)
    assert str(e.value) == says


def test_check_fields_names_the_owner_and_field_of_a_dataclass():
    with pytest.raises(ValueError, match=r"^_Outer.inner.size=0 is out of range; allowed values: an integer >= 1$"):
        check_fields(_Outer(name="n", inner=_Inner(size=0)))
    from marin_ablate.sweeps.executors import SlurmOptions

    with pytest.raises(ValueError, match=r"^slurm.time_min=0 is out of range; allowed values: None or an integer >= 1"):
        SlurmOptions(time_min=0)


def _renamed_cases():
    argv_of = {"train": ["train"], "analyze": ["analyze", "x"], "run": ["run", "smoke"],
               "data": ["data", "prepare", "x"], "*": ["plan", "smoke"]}
    for old, new in options.RENAMED.items():
        for command, repl in (new.items() if isinstance(new, dict) else [("*", new)]):
            yield pytest.param(argv_of[command], old, repl, id=f"{command}:{old}")


@pytest.mark.parametrize("argv, old, new", list(_renamed_cases()))
def test_every_renamed_flag_is_refused_naming_its_replacement(tmp_path, monkeypatch, capsys, argv, old, new):
    monkeypatch.chdir(tmp_path)
    assert cli_main([*argv, old, "v=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"marin-ablate {argv[0]}: error: {old} was renamed; use {new} (docs/cli.md)"]
    assert list(tmp_path.iterdir()) == []  # refused before any work
    assert cli_main([*argv, f"{old}=v"]) == 2  # the --flag=value form too


def test_a_model_override_reaches_the_runspec_the_same_way_for_train_and_for_studies(tmp_path):
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.cli.run import RunOptions
    from marin_ablate.cli.train import TrainOptions
    from marin_ablate.marin.presets import spec_of_preset
    from marin_ablate.sweeps.sweep import planned_runs

    tr = options.parse(TrainOptions, ["--preset", "tiny", "--run-dir", "x", "--model.d_model=48",
                                      "--train.steps", "3"])
    st = options.parse(RunOptions, ["smoke", "--model.d_model=48", "--train.steps", "3"])
    assert tr.overrides == st.overrides == ("model.d_model=48", "train.steps=3")
    spec = spec_of_preset(tr.preset, tr.overrides, tr.baseline, tr.seed)
    run = planned_runs(get_study("smoke"), tmp_path, overrides=st.overrides)[0].spec
    assert (spec.model.d_model, spec.train.steps) == (run.model.d_model, run.train.steps) == (48, 3)
    with pytest.raises(ValueError, match="ModelConfig has no field 'nope'; allowed values: .*d_model"):
        options.parse(RunOptions, ["smoke", "--model.nope=1"])


def test_flags_of_gives_the_command_line_that_parses_back_to_the_same_options():
    from marin_ablate.cli.status import StatusOptions

    st = StatusOptions(study="smoke", rungs="cpu_s32", out="elsewhere", overrides=("model.d_model=32",), tuned=True)
    assert options.parse(StatusOptions, options.flags_of(st)) == st
