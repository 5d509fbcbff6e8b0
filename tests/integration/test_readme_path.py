"""README "Quick start" (its studies and plan lines: plan --preset and plan STUDY) and docs/extending.md
"Adding a factor" run verbatim in a fresh folder outside the repository: the study file loaded by path, --rungs
honoured, a short run, and the block pasted at the end of a copy of ablations/studies.py and registered by name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from checkout import copy_checkout

ROOT = Path(__file__).resolve().parents[2]


def _section(title: str, doc: str = "README.md") -> str:
    return (ROOT / doc).read_text().split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _blocks(title: str, lang: str, doc: str = "README.md") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(title, doc), re.S)


def test_the_readme_shows_the_same_study_and_steps_as_the_tutorial_it_links():
    """README "Ablate your own recipe" is docs/extending.md "Adding a factor" in short: the same study file and
    the same commands, so the test below runs what both say."""
    (readme_py,) = _blocks("Ablate your own recipe", "python")
    (readme_sh,) = _blocks("Ablate your own recipe", "bash")
    study_py, _ = _blocks("Adding a factor", "python", "docs/extending.md")
    (steps,) = _blocks("Adding a factor", "bash", "docs/extending.md")
    assert readme_py == study_py
    assert [ln.split("#")[0].strip() for ln in readme_sh.splitlines()] == [
        ln.split("#")[0].strip() for ln in steps.splitlines()]


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "MARIN_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _bash(script: str, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.mark.slow  # README's quick-start lines as subprocesses
def test_quick_start_studies_and_plan_lines_run_verbatim(tmp_path):
    (block,) = _blocks("Quick start", "bash")
    lines = [ln for ln in block.splitlines()
             if ln.startswith(("marin-ablate studies", "marin-ablate plan"))]
    assert len(lines) == 3, "Quick start shows studies, plan --preset and plan smoke"
    r = _bash("\n".join(lines), tmp_path, _env(tmp_path))
    assert re.search(r"^smoke +CPU smoke: 7 recipe factors", r.stdout, re.M)
    assert "study smoke" in r.stdout and "runs: 256 (cpu_s32: 128, cpu_s64: 128)" in r.stdout
    assert "execution: local, 2 run(s) at once" in r.stdout and re.search(r"time: [\d.]+ min \(90%", r.stdout)
    assert not (tmp_path / "runs").exists()  # plan writes nothing


@pytest.mark.slow
def test_adding_a_factor_runs_verbatim_from_a_file_anywhere(tmp_path):
    study_py, register_py = _blocks("Adding a factor", "python", "docs/extending.md")
    (steps,) = _blocks("Adding a factor", "bash", "docs/extending.md")
    (tmp_path / "my_study.py").write_text(study_py)
    r = _bash(steps, tmp_path, _env(tmp_path))
    assert "study my_study" in r.stdout and "runs: 4 (cpu_s32: 4)" in r.stdout
    runs = sorted((tmp_path / "runs" / "my_study" / "runs").iterdir())
    assert len(runs) == 4  # --rungs cpu_s32 honoured: 4 arms x 1 rung x 1 seed
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["step"] == 4
        assert not list(run.glob("checkpoints/ckpt_*"))  # a completed CPU run keeps no checkpoint
    # registered by name: the block pasted at the end of ablations/studies.py, then the STUDIES line
    pkg = copy_checkout(tmp_path / "pkg")
    studies = pkg / "ablations" / "studies.py"
    studies.write_text(studies.read_text() + "\n\n" + study_py + "\n" + register_py)
    env = {**_env(tmp_path), "PYTHONPATH": str(pkg)}
    r = subprocess.run([sys.executable, "-c", "import sys; from marin_ablate.cli.main import main; "
                        "sys.exit(main(['plan', 'my_study', '--rungs', 'cpu_s32']))"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "study my_study" in r.stdout and "runs: 4 (cpu_s32: 4)" in r.stdout
