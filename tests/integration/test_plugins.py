"""Registry rows added outside the repository reach every process (marin/plugins.py): a study file named by path
registers a Lion-like optimizer and a custom response, and its runs execute in `local` worker processes (and
SLURM array tasks: tests/integration/test_slurm.py) that receive only plain data; a fresh `analyze` process
given the file (`--plugin`) fits the response. An installed distribution's `marin_ablate.plugins` entry point
reaches a fresh process too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import marin_ablate.marin.optimizers as optimizers
import marin_ablate.marin.switches as factors
from marin_ablate.marin import plugins

ROOT = Path(__file__).resolve().parents[2]

# A study file as a user writes it: rows registered at its top level; torch only inside the update
# (the driver's `plan` and `analyze` stay torch-free).
STUDY_FILE = '''
from marin_ablate.ablations import Factor, Study, full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.analysis.responses import Response, register
from marin_ablate.marin.switches import register_optimizer
from marin_ablate.marin.optimizers import GroupKind, OptimizerLevel


def lion_update(opt, p, g):
    """Lion (Chen et al. 2023, arXiv 2302.06675): sign of an interpolated momentum, decoupled decay."""
    import torch

    st = opt.state[p]
    if "exp_avg" not in st:
        st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
    m, grad = st["exp_avg"], p.grad.float()
    b1, b2 = g["betas"]
    if g["weight_decay"]:
        p.mul_(1 - g["lr"] * g["weight_decay"])
    p.add_(torch.sign(m * b1 + grad * (1 - b1)).to(p.dtype), alpha=-g["lr"])
    m.lerp_(grad, 1 - b2)


def lion_rule(h, tokens, d, tokens_per_batch, adam_lr, train):
    return adam_lr / 3, adam_lr / 3, 0.9, 0.99, 1e-8


register_optimizer(OptimizerLevel("lionx", {}, "lionx", lion_rule, "Lion everywhere"),
                   [GroupKind("lionx", 1, False, "adam", True, False, lion_update)])
register(Response("tokens", "ln_T", "tokens/s T", "T", "tokens per second ratio T", source="tokens_per_s",
                  transform="ln_ratio", figure=False, total_check=False))


def study():
    rungs = tuple(Rung(f"tiny{n}", "tiny", fixed_steps=n, batch_size=2,
                       train_overrides={"eval_batches": 1, "eval_every": n, "checkpoint_every": n, "log_every": 1})
                  for n in (2, 4, 8))
    opt = Factor("opt", field="recipe.optimizer", levels={"adamw": "adamw", "lionx": "lionx"})
    return Study("lionx", "AdamW vs a Lion registered in a study file", (opt,), full_factorial(["opt"]), rungs,
                 seeds=(0,), executor=EXECUTOR)
'''


@pytest.fixture
def registries():
    """Undo every registration (and the study files' modules) after the test."""
    saved = (dict(optimizers.KINDS), dict(optimizers.OPTIMIZERS), dict(factors.SPECS), dict(factors.RECIPE_LEVELS),
             factors.RECIPE_FACTOR_SPECS, dict(plugins.REGISTERED))
    yield
    for table, old in zip((optimizers.KINDS, optimizers.OPTIMIZERS, factors.SPECS, factors.RECIPE_LEVELS,
                           plugins.REGISTERED), saved[:4] + saved[5:], strict=True):
        table.clear()
        table.update(old)
    factors.RECIPE_FACTOR_SPECS = saved[4]


def _env(**extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return {**env, **extra}


def _cli(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marin_ablate", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout, cwd=ROOT)


def _study_to_report(tmp_path: Path, executor: dict) -> tuple[Path, str]:
    """Write the study file, `run` it (its own process, `executor` from the study) and `analyze` it in a
    third process; returns (study folder, report.md)."""
    f = tmp_path / "lion_study.py"
    f.write_text(STUDY_FILE + f"\nEXECUTOR = {executor!r}\n")
    out = tmp_path / "out"
    r = _cli("run", f"{f}:study", "--out", str(out), "--no-analyze")
    assert r.returncode == 0, r.stderr[-3000:]
    sd = out / "lionx"
    summaries = [json.loads(p.read_text()) for p in sorted(sd.glob("runs/*/summary.json"))]
    assert [s["status"] for s in summaries] == ["completed"] * 6, [s.get("error") for s in summaries]
    specs = [json.loads(p.read_text()) for p in sorted(sd.glob("runs/*/spec.json"))]
    assert sorted(s["recipe"].get("optimizer", "") for s in specs).count("lionx") == 3
    rec = json.loads((sd / "plugins.json").read_text())  # a record; a later analyze imports what its command names
    assert rec["imports"] == [str(f.resolve())] and ["response", "tokens", str(f.resolve())] in rec["rows"]
    r = _cli("analyze", str(sd), "--n-boot", "0", "--no-figures", "--plugin", str(f))
    assert r.returncode == 0, r.stderr[-3000:]
    return sd, (sd / "report" / "report.md").read_text()


@pytest.mark.slow
def test_a_study_file_optimizer_and_response_reach_local_workers_and_a_fresh_analyze(tmp_path):
    sd, md = _study_to_report(tmp_path, {"executor": "local", "max_parallel": 2})
    # the runs ran in submitit's worker processes (two, each pulling runs), which got plain data only
    pids = {json.loads(p.read_text())["pid"] for p in sd.glob("runs/*/job.json")}
    assert 1 <= len(pids) <= 2 and len(list(sd.glob("submitit/local-*"))) == 1
    assert "# Attribution report: lionx" in md and "| opt |" in md
    assert "| tokens/s T |" in md  # the study file's response in Findings, fitted by a process that never ran the study


def test_registration_notes_the_module_whose_import_makes_it(registries, tmp_path):
    f = tmp_path / "plug.py"
    f.write_text("from marin_ablate.marin.switches import register_optimizer\n"
                 "from marin_ablate.marin.optimizers import OptimizerLevel\n"
                 "register_optimizer(OptimizerLevel('adamw2', {}, 'adamw', 'adamw'))\n")
    plugins.load_file(f)
    factors.register_optimizer(optimizers.OptimizerLevel("adamw3", {}, "adamw", "adamw"))  # in a function
    assert plugins.REGISTERED[("optimizer", "adamw2")] == str(f.resolve())
    assert plugins.REGISTERED[("optimizer", "adamw3")] is None
    assert str(f.resolve()) in plugins.sources() and None not in plugins.sources()
    assert plugins.unreachable("optimizer", ["adamw", "adamw2", "adamw3"]) == ["adamw3"]
    sys.modules.pop(next(m for m, p in plugins._FILES.items() if p == str(f.resolve())))


def test_registration_from_code_exec_d_under_a_name_no_import_finds_is_unreachable(registries):
    # a test runner's loop (pytest-xdist's "__channelexec__") or exec() at top level: no import re-runs it
    code = ("from marin_ablate.marin.switches import register_optimizer\n"
            "from marin_ablate.marin.optimizers import OptimizerLevel\n"
            "register_optimizer(OptimizerLevel('adamw5', {}, 'adamw', 'adamw'))\n")
    exec(compile(code, "<remote>", "exec"), {"__name__": "not_an_importable_module"})
    assert plugins.REGISTERED[("optimizer", "adamw5")] is None
    assert plugins.unreachable("optimizer", ["adamw5"]) == ["adamw5"]


def test_a_local_run_of_a_level_registered_in_a_function_is_refused_before_anything_is_written(registries, tmp_path):
    from marin_ablate.ablations import Factor, Study, full_factorial
    from marin_ablate.ablations.ladders import Rung
    from marin_ablate.sweeps.executors import ExecOptions
    from marin_ablate.sweeps.sweep import run_study

    factors.register_optimizer(optimizers.OptimizerLevel("adamw4", {}, "adamw", "adamw"))
    opt = Factor("opt", field="recipe.optimizer", levels={"adamw": "adamw", "adamw4": "adamw4"})
    study = Study("fn", "a level registered in a function", (opt,), full_factorial(["opt"]),
                  (Rung("tiny2", "tiny", fixed_steps=2, batch_size=2),), seeds=(0,))
    with pytest.raises(ValueError, match="Recipe.optimizer='adamw4' was registered inside a function, so a local "
                                         "worker cannot import it"):
        run_study(study, tmp_path, ExecOptions(executor="local"), progress=False)
    assert not (tmp_path / "fn" / "runs").exists()


@pytest.mark.slow  # a fresh interpreter that imports the package and its plugins
def test_an_installed_entry_point_registers_its_rows_in_a_fresh_process(tmp_path):
    """A real distribution on the path (dist-info with entry_points.txt), found by importlib.metadata."""
    (tmp_path / "lionplug.py").write_text(textwrap.dedent('''
        from marin_ablate.marin.switches import register_optimizer
        from marin_ablate.marin.optimizers import OptimizerLevel
        register_optimizer(OptimizerLevel("adamw_ep", {}, "adamw", "adamw", "AdamW, from an entry point"))
    '''))
    di = tmp_path / "lionplug-0.1.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: lionplug\nVersion: 0.1\n")
    (di / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nadamw_ep = lionplug\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    code = ("from marin_ablate.marin import plugins; from marin_ablate.marin.config import Recipe; "
            "print(plugins.load_entry_points()); "
            "print(Recipe(optimizer='adamw_ep').optimizer, plugins.REGISTERED[('optimizer', 'adamw_ep')])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:2] == ["['adamw_ep']", "adamw_ep lionplug"]
    # and the CLI loads it before it checks a study's levels against the registry
    (tmp_path / "s.py").write_text(textwrap.dedent('''
        from marin_ablate.ablations import Factor, Study, full_factorial
        from marin_ablate.ablations.ladders import Rung
        opt = Factor("opt", field="recipe.optimizer", levels={"adamw": "adamw", "adamw_ep": "adamw_ep"})
        study = Study("ep", "an entry point's level", (opt,), full_factorial(["opt"]),
                      (Rung("tiny2", "tiny", fixed_steps=2, batch_size=2),), seeds=(0,))
    '''))
    r = _cli("plan", f"{tmp_path / 's.py'}:study", env=env, timeout=300)
    assert r.returncode == 0 and "adamw_ep" in r.stdout, r.stderr[-2000:]


def test_a_plugin_or_study_file_that_exits_is_refused_naming_it_not_a_silent_exit_0(tmp_path, capsys):
    """`raise SystemExit(0)` at a plugin's top level is its failure to import, not the command's exit."""
    from marin_ablate.cli.main import main

    (tmp_path / "quits.py").write_text("raise SystemExit(0)\n")
    assert main(["analyze", str(tmp_path / "nowhere"), "--plugin", str(tmp_path / "quits.py")]) == 2
    assert f"--plugin '{tmp_path / 'quits.py'}' cannot be imported: SystemExit: 0" in capsys.readouterr().err
    assert main(["plan", f"{tmp_path / 'quits.py'}:study"]) == 2
    assert "cannot import (SystemExit: 0)" in capsys.readouterr().err


def test_an_entry_point_that_exits_is_reported_as_failed_and_the_command_goes_on(tmp_path, monkeypatch):
    (tmp_path / "quitplug.py").write_text("raise SystemExit(3)\n")
    di = tmp_path / "quitplug-0.1.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: quitplug\nVersion: 0.1\n")
    (di / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nquits = quitplug\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_LOADED_EPS", set())
    monkeypatch.setattr(plugins, "_FAILED_EPS", {})
    assert "quits" not in plugins.load_entry_points()
    [line] = [x for x in plugins.failures() if "'quits'" in x]
    assert "distribution quitplug" in line and line.endswith("failed to load: SystemExit: 3")
