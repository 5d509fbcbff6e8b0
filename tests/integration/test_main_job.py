"""The main job as a new user meets it: the README's commands, `run smoke`, Ctrl-C and rerun.

The full smoke study takes minutes; these tests run the same command on its smallest rung with a
few steps, which exercises the same planning, local executor, resume and analysis code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from terminal import foreground

# Multi-process training, torch.compile, simulated studies or real SLURM jobs (minutes on 2 cores) are marked
# `slow` one by one: the development loop (`python -m pytest -m "not slow"`) keeps the fast checks of this file.


ROOT = Path(__file__).resolve().parents[2]
# the design alone: its LR profile and pinned law have their own tests (tests/sweeps/test_lr_profile.py)
SMALL = ["--rungs", "cpu_s", "--seeds", "0", "--train.steps=6", "--train.checkpoint_every=2", "--no-profile",
         "--no-pin"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "marin_ablate", *args]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _summaries(study_dir: Path) -> dict[str, dict]:
    out = {}
    for p in (study_dir / "runs").glob("*/summary.json"):
        try:
            out[p.parent.name] = {"status": json.loads(p.read_text())["status"], "mtime_ns": p.stat().st_mtime_ns,
                                  "text": p.read_text()}
        except (json.JSONDecodeError, KeyError):
            pass  # being written right now: atomic writes make this impossible, but never crash the poll
    return out


def _last_logged_step(run_dir: Path) -> int:
    """The 0-based index of the last step with a train line in metrics.jsonl (-1: none yet)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    return max((r["step"] for r in rows if "loss" in r), default=-1)


@pytest.mark.slow
def test_ctrl_c_checkpoints_each_running_run_at_its_current_step(tmp_path):
    # No periodic checkpoint can fall inside these runs (every 10,000 steps), so a checkpoint on disk
    # after Ctrl-C was written by the interrupt itself, at the step the run had reached.
    study_dir = tmp_path / "smoke"
    args = ["--rungs", "cpu_s", "--train.steps=2000", "--train.checkpoint_every=10000",
            "--no-profile", "--no-pin"]  # the design's runs, not the LR profile before it
    proc = subprocess.Popen(_cli("run", "smoke", *args, "--out", str(tmp_path), "--no-analyze"), cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=foreground)
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        started = ([d for d in (study_dir / "runs").glob("*") if _last_logged_step(d) >= 20] if study_dir.exists()
                   else [])
        if len(started) == 2:
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out  # the workers stop cleanly, they do not die on the keyboard signal
    interrupted = [d for d in (study_dir / "runs").glob("*")
                   if _last_logged_step(d) >= 0 and not (d / "summary.json").exists()]
    assert len(interrupted) == 2, out
    for d in interrupted:
        ckpts = sorted((d / "checkpoints").glob("ckpt_*"))
        assert len(ckpts) == 1 and (ckpts[0] / "meta.json").exists(), ckpts
        step, last = int(ckpts[0].name.split("_")[1]), _last_logged_step(d)
        assert last + 1 <= step <= last + 10, (step, last)  # the rung logs every 10th step


def test_readme_starts_with_the_two_commands_and_ci_runs_the_two_test_stages():
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines()]
    block = lines[lines.index("```bash") + 1: lines.index("```bash") + 3]
    assert block[0].endswith("marin-ablate run smoke") and "pip install -e ." in block[0]
    assert '".[dev,triton]"' in block[1] and "ruff check ." in block[1]
    # two stages, the fast gate first: together they select every test (a marker is either slow or not); the gate
    # in two xdist workers, the slow stage in three (the one that runs the SLURM tests mostly waits on the cluster)
    assert block[1].endswith('&& python -m pytest -m "not slow" -n 2 && python -m pytest -m slow -n 3 --dist loadgroup '
                             '--durations=30')
    assert block[1] in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.slow
def test_ctrl_c_then_rerun_completes_without_redoing_finished_runs(tmp_path):
    study_dir = tmp_path / "smoke"
    proc = subprocess.Popen(_cli("run", "smoke", *SMALL, "--out", str(tmp_path), "--no-analyze"), cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=foreground)
    deadline = time.time() + 300
    while time.time() < deadline and sum(s["status"] == "completed" for s in _summaries(study_dir).values()) < 2:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out  # interrupted, not finished
    before = {k: v for k, v in _summaries(study_dir).items() if v["status"] == "completed"}
    assert 2 <= len(before) < 16, out

    r = subprocess.run(_cli("run", "smoke", *SMALL, "--out", str(tmp_path)), cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    after = _summaries(study_dir)
    assert len(after) == 16 and all(s["status"] == "completed" for s in after.values())
    for run_id, s in before.items():  # finished runs were not run again
        assert after[run_id]["mtime_ns"] == s["mtime_ns"] and after[run_id]["text"] == s["text"]
    assert f"skipped: {len(before)} completed" in r.stdout
    table = pd.read_parquet(study_dir / "results.parquet")
    assert len(table) == 16 and (table["status"] == "completed").all()
    assert (study_dir / "report" / "report.md").exists()
