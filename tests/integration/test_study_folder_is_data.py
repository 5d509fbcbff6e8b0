"""A study folder is data (marin/plugins.py): `analyze DIR` and the analysis step of `run` never import a
module its `plugins.json` names (by absolute path, by a path relative to where the command runs, or a
standard-library module); the record is compared with what the process has registered and a mismatch is
named with the flag that would import it. Plugins come from installed entry points or the command line
(`analyze --plugin FILE`); a broken one is named and the rest goes on; one that fails only in a worker fails
its runs with the reason; a plugin cannot replace a registered study."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from marin_ablate.marin import plugins

ROOT = Path(__file__).resolve().parents[2]
ZEN = "Beautiful is better than ugly"  # what `import this` prints


def _cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "marin_ablate", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=cwd)


def _factorial_csv(path: Path) -> Path:
    """A 2x2 factorial at three rungs in the import schema (a law the fit recovers)."""
    rows = []
    for rung, c in (("s1", 1e15), ("s2", 4e15), ("s3", 1.6e16)):
        for x, s in itertools.product((0, 1), (0, 1)):
            rows.append({"arm": f"a{x}{s}", "rung": rung, "xsa": ("none", "xsa")[x],
                         "sconv": ("none", "short_conv")[s], "flops": c,
                         "loss": 3.0 + 100 * c ** -0.2 - 0.02 * x - 0.01 * s + 0.001 * x * s})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _imported_study(tmp_path: Path, where: Path) -> Path:
    r = _cli("analyze", "--import.table", str(_factorial_csv(tmp_path / "g.csv")), "--study-dir", str(where),
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return where


def _plant(folder: Path, marker: Path) -> Path:
    """A module beside the runs that leaves a marker file when it is imported."""
    evil = folder / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return evil


@pytest.mark.slow
def test_analyze_never_imports_a_module_named_by_the_folders_plugins_json(tmp_path):
    sd = _imported_study(tmp_path, tmp_path / "study")
    marker = tmp_path / "ran.txt"
    evil = _plant(sd, marker)
    (sd / "plugins.json").write_text(json.dumps({"imports": [str(evil), "this"]}))
    r = _cli("analyze", str(sd), "--n-boot", "0", "--no-figures", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists() and ZEN not in r.stdout
    assert f"records the source {evil}, not imported" in r.stdout and f"--plugin {evil}" in r.stdout
    assert "records the source this, not imported" in r.stdout
    assert (sd / "report" / "report.md").is_file()


@pytest.mark.slow
def test_analyze_by_name_never_imports_a_module_named_by_a_relative_path(tmp_path):
    sd = _imported_study(tmp_path, tmp_path / "runs" / "smoke")
    marker = tmp_path / "ran.txt"
    _plant(sd, marker)
    (sd / "plugins.json").write_text(json.dumps({"imports": ["runs/smoke/evil.py"]}))
    r = _cli("analyze", "smoke", "--n-boot", "0", "--no-figures", cwd=tmp_path)  # found as runs/smoke
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists()
    assert "records the source runs/smoke/evil.py, not imported" in r.stdout


STUDY_FILE = '''
import os
from marin_ablate.ablations import Factor, Study, full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.analysis.responses import Response, register
from marin_ablate.marin.switches import register_optimizer
from marin_ablate.marin.optimizers import OptimizerLevel

if os.environ.get("SUBMITIT_LOCAL_JOB_ID") and FAIL_IN_WORKERS:  # e.g. a library only the login node has
    raise ImportError("libcustom.so: cannot open shared object file")
register_optimizer(OptimizerLevel("adamw_f", {}, "adamw", "adamw", "AdamW under another name"))
register(Response("tokens", "ln_T", "tokens/s T", "T", "tokens per second ratio T", source="tokens_per_s",
                  transform="ln_ratio", figure=False, total_check=False))


def study():
    rungs = tuple(Rung(f"tiny{n}", "tiny", fixed_steps=n, batch_size=2,
                       train_overrides={"eval_batches": 1, "eval_every": n, "checkpoint_every": n, "log_every": 1})
                  for n in (2, 4, 8))
    opt = Factor("opt", field="recipe.optimizer", levels={"adamw": "adamw", "adamw_f": "adamw_f"})
    return Study("fstudy", "AdamW against itself under a plugin's name", (opt,), full_factorial(["opt"]), rungs,
                 seeds=(0,), executor={"executor": EXECUTOR})
'''


def _study_file(tmp_path: Path, executor: str, fail_in_workers: bool = False) -> Path:
    f = tmp_path / "fstudy.py"
    f.write_text(f"FAIL_IN_WORKERS = {fail_in_workers}\nEXECUTOR = {executor!r}\n" + STUDY_FILE)
    return f


@pytest.mark.slow
def test_the_analysis_step_of_run_never_imports_a_planted_module_and_records_its_own_rows(tmp_path):
    f = _study_file(tmp_path, "debug")
    sd = tmp_path / "out" / "fstudy"
    sd.mkdir(parents=True)
    marker = tmp_path / "ran.txt"
    evil = _plant(sd, marker)
    (sd / "plugins.json").write_text(json.dumps({"imports": [str(evil)]}))  # planted before the study ran
    r = _cli("run", f"{f}:study", "--out", str(tmp_path / "out"), "--no-pin", "--no-profile", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not marker.exists()
    assert "| tokens/s T |" in (sd / "report" / "report.md").read_text()  # the command's own study file's response
    rec = json.loads((sd / "plugins.json").read_text())
    assert rec["imports"] == [str(evil), str(f.resolve())]  # a record: the planted line kept, never imported
    assert ["response", "tokens", str(f.resolve())] in rec["rows"]
    assert ["optimizer", "adamw_f", str(f.resolve())] in rec["rows"]
    # a fresh analyze lacks the response and says how to get it; --plugin names the file and fits it
    r = _cli("analyze", str(sd), "--n-boot", "0", "--no-figures", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists()
    assert f"records optimizer 'adamw_f', response 'tokens' from {f.resolve()}, not imported" in r.stdout
    assert f"records the source {evil}, not imported" in r.stdout
    assert "| tokens/s T |" not in (sd / "report" / "report.md").read_text()
    r = _cli("analyze", str(sd), "--n-boot", "0", "--no-figures", "--plugin", str(f), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"from {f.resolve()}, not imported" not in r.stdout and not marker.exists()
    assert "| tokens/s T |" in (sd / "report" / "report.md").read_text()


@pytest.mark.slow
def test_a_plugin_that_fails_only_in_local_workers_fails_each_run_with_its_reason(tmp_path):
    f = _study_file(tmp_path, "local", fail_in_workers=True)
    r = _cli("run", f"{f}:study", "--out", str(tmp_path / "out"), "--no-pin", "--no-profile", "--workers", "1",
             "--no-analyze", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "fstudy").glob("runs/*/summary.json"))]
    assert len(summaries) == 6 and {s["status"] for s in summaries} == {"failed"}
    assert all("libcustom.so: cannot open shared object file" in s["error"] for s in summaries)
    assert all(s["run_id"] == p.parent.name for s, p in zip(
        summaries, sorted((tmp_path / "out" / "fstudy").glob("runs/*/summary.json")), strict=True))
    assert "6 failed" in r.stdout


def _dist(tmp_path: Path, name: str, module: str, body: str) -> dict:
    """An installed distribution (dist-info with entry_points.txt) on the path of a fresh process."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
    di = tmp_path / f"{name}-0.1.dist-info"
    di.mkdir()
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (di / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{name} = {module}\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_a_broken_installed_plugin_is_named_and_the_command_goes_on(tmp_path):
    env = _dist(tmp_path, "brokenplug", "brokenplug", "import no_such_module_here\n")
    r = _cli("studies", cwd=tmp_path, env=env)
    assert r.returncode == 0 and "smoke" in r.stdout, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert ("warning: plugin entry point 'brokenplug' (brokenplug, distribution brokenplug, group "
            "marin_ablate.plugins) failed to load: ModuleNotFoundError: No module named 'no_such_module_here'; "
            "its rows are missing") in r.stderr


@pytest.mark.slow
def test_a_plugin_cannot_replace_a_registered_study(tmp_path):
    env = _dist(tmp_path, "takeover", "takeover", '''
        from marin_ablate.ablations.studies import STUDIES
        STUDIES["smoke"] = lambda **kw: None
    ''')
    r = _cli("plan", "smoke", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "study 'smoke' is registered already; allowed values: a new name" in r.stderr
    assert "smoke" in r.stdout  # the built-in study, planned as it is


@pytest.mark.parametrize("text, field", [
    ("{not json", "unreadable"),
    ('{"imports": "evil.py"}', "field 'imports' is 'evil.py'"),
    ('{"imports": [], "rows": [["response", 3, "x.py"]]}', "field 'rows'"),
    ("[1, 2]", "field 'imports' is None"),
])
def test_a_damaged_plugins_json_is_one_line_naming_the_file(tmp_path, text, field):
    (tmp_path / "plugins.json").write_text(text)
    with pytest.raises(ValueError, match="plugins.json: ") as e:
        plugins.read_record(tmp_path)
    assert field in str(e.value) and "delete the file and the next run writes it again" in str(e.value)
    assert plugins.record_notes(tmp_path) == [f"{e.value} (a record only: nothing is imported from it)"]


def test_a_run_refuses_to_extend_a_damaged_plugins_json_before_writing_runs(tmp_path, capsys):
    from marin_ablate.cli.main import main

    sd = tmp_path / "smoke"
    sd.mkdir()
    (sd / "plugins.json").write_text("{torn")
    assert main(["run", "smoke", "--out", str(tmp_path), "--rungs", "cpu_s32", "--seeds", "0", "--no-pin",
                 "--no-profile", "--executor", "debug"]) == 2
    err = capsys.readouterr().err
    assert f"{sd / 'plugins.json'}: unreadable" in err and "delete the file" in err


def test_status_never_imports_a_module_named_by_the_folders_plugins_json(tmp_path, capsys):
    from marin_ablate.cli.main import main

    sd = tmp_path / "smoke"
    sd.mkdir()
    marker = tmp_path / "ran.txt"
    evil = _plant(sd, marker)
    (sd / "plugins.json").write_text(json.dumps({"imports": [str(evil)], "rows": [["optimizer", "x", str(evil)]]}))
    assert main(["status", "smoke", "--out", str(tmp_path), "--rungs", "cpu_s32", "--seeds", "0"]) == 0
    assert not marker.exists() and "smoke: 0/16 done" in capsys.readouterr().out
