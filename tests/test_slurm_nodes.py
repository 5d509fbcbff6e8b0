"""Multi-node SLURM (docs/architecture.md, "Multi-node SLURM"): a cluster of several nodes, each a
network namespace with its own host name, address and slurmd (`MARIN_SLURM_NODES=2 bash
.ci/slurm.sh start`). Runs go through the product's own path (`run_study`, executor slurm): one
job of nodes x tasks_per_node srun tasks, ranks and rendezvous from SLURM's environment, gloo over
the bridge between the namespaces, EP inside a node and data parallelism across nodes.

Skipped with a reason without a cluster of at least 2 nodes; under CI (CI=true or
MARIN_REQUIRE_SLURM=1) the same condition FAILS.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ablations.designs import full_factorial
from ablations.ladders import Rung
from ablations.studies import Study
from marin.config import Recipe
from sweeps.executors import ExecOptions, wait
from sweeps.runs import read_json
from sweeps.sweep import planned_runs, run_study

NODES = 2
LOSS_TOL = 1e-5


def _nodes() -> list[tuple[str, str]]:
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=60)
    return [tuple(x.split()[:2]) for x in r.stdout.splitlines() if x.strip()] if r.returncode == 0 else []


def _problem() -> str | None:
    if not os.environ.get("SLURM_CONF"):
        return ("SLURM_CONF is unset (start one: MARIN_SLURM_NODES=2 bash .ci/slurm.sh start; "
                "source /tmp/marin-slurm/env.sh)")
    if shutil.which("sinfo") is None:
        return "sinfo is not on PATH"
    nodes = _nodes()
    if len(nodes) < NODES:
        return f"the cluster has {len(nodes)} node(s), these tests need {NODES} (MARIN_SLURM_NODES=2)"
    return None


PROBLEM = _problem()
REQUIRED = os.environ.get("CI", "").lower() == "true" or os.environ.get("MARIN_REQUIRE_SLURM") == "1"
pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(PROBLEM is not None and not REQUIRED, reason=f"no multi-node SLURM cluster: {PROBLEM}")]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    if PROBLEM is not None:
        pytest.fail(f"multi-node SLURM tests are required here (CI / MARIN_REQUIRE_SLURM) but: {PROBLEM}",
                    pytrace=False)


def two_node_study(steps: int = 6, checkpoint_every: int = 2, name: str = "two_nodes") -> Study:
    """A reduced hero-shaped run: 2 nodes x 2 ranks, EP over the 2 ranks of a node, data-parallel
    across the nodes; dropless, so any layout must equal one process (docs/architecture.md)."""
    rung = Rung("tiny2x2", "tiny", model_overrides={"seq_len": 64, "ep_shards": 2, "qb_estimator": "hist"},
                fixed_steps=steps, batch_size=4, nodes=NODES, tasks_per_node=2,
                train_overrides={"eval_batches": 1, "eval_every": steps, "checkpoint_every": checkpoint_every,
                                 "log_every": 1})
    return Study(name=name, description="2-node SLURM test study", factors=("xsa",), design=full_factorial(["xsa"]),
                 rungs=(rung,), seeds=(0,), base_recipe=Recipe(ep_transport="dropless"),
                 executor={"executor": "slurm", "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 20})


def _lines(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
    return [r for r in rows if "loss" in r]


def _assert_equal_runs(got_dir: Path, want_dir: Path) -> None:
    got, want = read_json(got_dir / "summary.json"), read_json(want_dir / "summary.json")
    assert got["status"] == want["status"] == "completed" and got["step"] == want["step"]
    # the last logged loss of every step (a resumed run logs the steps after its checkpoint again)
    g = {r["step"]: r for r in _lines(got_dir)}
    w = {r["step"]: r for r in _lines(want_dir)}
    assert sorted(g) == sorted(w) == list(range(want["step"]))
    for s in w:
        assert abs(g[s]["loss"] - w[s]["loss"]) < LOSS_TOL, (s, g[s]["loss"], w[s]["loss"])
        assert abs(g[s]["grad_norm"] - w[s]["grad_norm"]) < 1e-4 * w[s]["grad_norm"], s
    assert abs(got["eval_macro_loss"] - want["eval_macro_loss"]) < LOSS_TOL


def test_two_node_study_runs_across_hosts_equals_one_process_and_is_analysed(tmp_path):
    from analysis.results import collect, inventory

    study = two_node_study()
    ref = run_study(study, tmp_path / "ref", ExecOptions(executor="debug"), progress=False)
    assert ref.counts["completed"] == 2
    rep = run_study(study, tmp_path / "slurm", ExecOptions(executor="slurm", poll_s=1.0), progress=False)
    assert rep.submitted == 2 and rep.counts["completed"] == 2, rep
    script = next((tmp_path / "slurm" / "two_nodes" / "submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    hosts = set()
    for run in planned_runs(study, tmp_path / "slurm"):
        s = read_json(run.dir / "summary.json")
        assert "world 4: dp 2 x ep 2" in s["hardware"], s["hardware"]
        ranks = [read_json(run.dir / "ranks" / f"{r}.json") for r in range(4)]
        hosts |= {r["host"] for r in ranks}
        assert ranks[0]["host"] == ranks[1]["host"] != ranks[2]["host"] == ranks[3]["host"]  # EP inside a node
        _assert_equal_runs(run.dir, tmp_path / "ref" / "two_nodes" / "runs" / run.run_id)
    assert len(hosts) == NODES, hosts  # ranks ran on both nodes (their own host names)
    inv = inventory(collect(tmp_path / "slurm" / "two_nodes", write=False))
    assert inv.n_runs == inv.n_completed == 2 and not inv.excluded
