"""Every setting the command line reaches, spelled badly: one line naming the field and the allowed values, exit 2,
never a traceback (docs/faults.md). The spec fields (`--model.F=V`, `--train.F=V`, `--data.F=V`,
`--recipe.F=V`) are walked from marin.config's dataclasses, so a new field is walked the day it is added; the
command lines go through the real entry point in a fresh interpreter (tests/cli_walk.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marin_ablate.marin.config import DataConfig, ModelConfig, Recipe, TrainConfig
from marin_ablate.marin.fields import base_type

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "recipe": Recipe}

#: Spellings no field takes, by the field's type: each must be refused in one line naming the field.
BAD = {
    "int": ("abc", "1.5", "nan", "-1"),
    "float": ("abc", "nan", "-inf"),
    "bool": ("maybe", "2"),
    "str": ("no-such-level",),
    "tuple": ("no-such-level",),
}
#: Spellings some fields take and others refuse: accepted, or refused in one line; never a traceback.
ODD = ("1e30", "-1e30", "inf", "9" * 400, str(2**63 - 1), str(2**30), "", "None", "0", "[1, 2]", "0.5:128",
       "1_000")

#: Free-text fields whose "no-such-level" is a path or a name the check looks up.
FREE_TEXT = {("data", "corpus"), ("data", "eval_dir"), ("train", "device")}


def _walk(cases: list[list[str]], tmp_path: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parents[1]),
                                                                    os.environ.get("PYTHONPATH")) if p)}
    got = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "cli_walk.py")], input=json.dumps(cases),
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert got.returncode == 0, got.stderr[-3000:]
    return [json.loads(line) for line in got.stdout.splitlines()]


def _fields() -> list[tuple[str, str, str]]:
    return [(sec, f.name, base_type(f)) for sec, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def _bad(section: str, name: str, kind: str) -> tuple[str, ...]:
    if kind not in BAD:  # a typed field of its own (none today): its str spellings
        kind = "str"
    if (section, name) in FREE_TEXT:
        return ("/no/such/path",) if section == "data" else ("no-such-device",)
    return BAD[kind]


def _cases(tmp_path: Path) -> tuple[list[list[str]], list[bool]]:
    """(argv, must it be refused) per case: every field's bad spellings through `plan` and `train`, its odd ones
    through `plan` (it makes every check `train` makes: docs/faults.md)."""
    base = {"plan": ["plan", "smoke", "--rungs", "cpu_s32", "--seeds", "0", "--out", str(tmp_path / "out")],
            "train": ["train", "--preset", "tiny", "--run-dir", str(tmp_path / "run"), "--train.steps=1"]}
    cases, must = [], []
    for section, name, kind in _fields():
        for value in _bad(section, name, kind):
            for cmd in ("plan", "train"):
                cases.append([*base[cmd], f"--{section}.{name}={value}"])
                must.append(True)
        for value in ODD:
            cases.append([*base["plan"], f"--{section}.{name}={value}"])
            must.append(False)
    return cases, must


def _problems(results: list[dict], must: list[bool]) -> list[str]:
    out = []
    for r, strict in zip(results, must, strict=True):
        flag, cmd = r["argv"][-1], r["argv"][0]
        name = flag.split("=", 1)[0].rsplit(".", 1)[1]
        if r["escaped"]:
            out.append(f"{flag[:80]} ({cmd}): traceback {r['escaped'][-400:]}")
        elif strict and r["rc"] != 2:
            out.append(f"{flag[:80]} ({cmd}): accepted (exit {r['rc']})")
        elif r["rc"] not in (0, 2):
            out.append(f"{flag[:80]} ({cmd}): exit {r['rc']}: {r['err'][-1:]}")
        elif r["rc"] == 2 and (len(r["err"]) != 1 or name not in r["err"][0] or "allowed" not in r["err"][0]):
            out.append(f"{flag[:80]} ({cmd}): refusal {[x[:300] for x in r['err']]}")
    return out


@pytest.mark.slow
def test_every_spec_field_spelled_badly_is_one_line_exit_2_no_traceback(tmp_path):
    cases, must = _cases(tmp_path)
    results = _walk(cases, tmp_path)
    assert len(results) == len(cases)
    problems = _problems(results, must)
    assert not problems, f"{len(problems)} of {len(cases)}:\n" + "\n".join(problems[:60])
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize("value, why", [
    ("[[0.5, 128]]", "stage 0 '[[0.5' does not parse; allowed values: ContextStage(start_frac, seq_len) in a study "
                     "file, or FRAC:SEQ_LEN"),
    ("1.5:128", "stage start_frac=1.5 is out of range; allowed values: a number in [0, 1)"),
    ("nan:128", "stage start_frac=nan is out of range"),
    ("0.5:1e30", "stage 0 '0.5:1e30' does not parse"),
    ("0.5:0", "stage seq_len=0 is out of range; allowed values: an integer >= 1"),
    ("0.5:128,0.5:64", "stage start fractions [0.5, 0.5]; allowed values: strictly increasing"),
    ("0.99:128", "starts at step round(0.99 x 32) = 32, after the last step, so a stage never trains"),
    ("0.5:96", "seq_len=96 must divide the tokens per step"),
])
def test_context_stages_on_the_command_line_are_one_line_naming_the_form(tmp_path, capsys, value, why):
    from marin_ablate.cli.main import main

    for argv in (["plan", "smoke", "--rungs", "cpu_s32", "--seeds", "0", "--out", str(tmp_path / "out")],
                 ["train", "--preset", "cpu_s", "--train.steps=32", "--train.batch_size=8",
                  "--run-dir", str(tmp_path / "run")]):
        assert main([*argv, f"--train.context_stages={value}"]) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(err) == 1 and "TrainConfig.context_stages" in err[0] and why in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_context_stages_in_the_command_line_form_plan_and_train(tmp_path, capsys):
    from marin_ablate.cli.main import main

    assert main(["train", "--preset", "tiny", "--train.steps=4", "--train.eval_every=0",
                 "--train.context_stages=0.5:128", "--run-dir", str(tmp_path / "run")]) == 0
    spec = json.loads((tmp_path / "run" / "spec.json").read_text())
    assert spec["train"]["context_stages"] == [{"start_frac": 0.5, "seq_len": 128}]
    assert "context stage: seq_len 128 batch 8" in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.parametrize("command", ["plan", "run"])
def test_run_and_plan_refuse_micro_batches_that_do_not_split_the_batch_before_writing(tmp_path, capsys, command):
    from marin_ablate.cli.main import main

    argv = [command, "smoke", "--rungs", "cpu_s32", "--seeds", "0", "--out", str(tmp_path / "out"),
            "--train.micro_batches=3"] + (["--executor", "debug"] if command == "run" else [])
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "TrainConfig.micro_batches=3: 8 sequences per rank" in err[0] and \
        "allowed values: divisors of 8" in err[0], err
    assert not (tmp_path / "out").exists()  # nothing planned into a folder, nothing launched


def test_run_refuses_and_plan_names_a_seed_list_whose_table_analyze_would_refuse(tmp_path, capsys):
    """`analyze` refuses a table whose joint fit costs more than rows x seeds^2 = JOINT_COST_MAX; run says so before
    anything is written (the 2-arm seed panel at 300 seeds: 600 x 300^2 = 5.4e7), plan names it; 292 seeds pass
    (2 x 292^3 <= 5e7 < 2 x 293^3)."""
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.analysis.table_shape import JOINT_COST_MAX
    from marin_ablate.cli.main import main
    from marin_ablate.sweeps.sweep import analysis_refusal, planned_runs

    assert JOINT_COST_MAX == 5e7  # the numbers below
    many = ["noise_cpu", "--seeds", ",".join(map(str, range(300))), "--out", str(tmp_path / "out")]
    assert main(["run", *many, "--executor", "debug"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert err == ["marin-ablate run: error: 600 runs of 300 seeds: `analyze` refuses their table (its joint law fit "
                   "carries one loss shift per seed and costs about rows x seeds^2 = 5.4e+07 per step, beyond 5e+07); "
                   "allowed values: --seeds with at most 292 seeds (2 runs each)"], err
    assert not (tmp_path / "out").exists()
    assert main(["plan", *many]) == 0
    assert "refused by `run`: 600 runs of 300 seeds" in capsys.readouterr().out
    for n, refused in ((292, False), (293, True)):
        runs = planned_runs(get_study("noise_cpu", seeds=list(range(n))), tmp_path / "out")
        assert (analysis_refusal(runs) is not None) is refused, n
