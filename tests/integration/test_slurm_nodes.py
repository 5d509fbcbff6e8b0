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

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.ablations.study import Study
from marin_ablate.marin.config import Recipe
from marin_ablate.sweeps.executors import ExecOptions, wait
from marin_ablate.sweeps.runs import read_json
from marin_ablate.sweeps.sweep import planned_runs, run_study

NODES = 2
# Relative: 4 ranks (EP 2 x DP 2) sum in another order than one process, and over 16 MoE steps that
# float noise grows to ~4e-6 of the loss (measured 1.5e-5 at a loss of 4.09); a resume that lost or
# repeated a step is off by orders of magnitude more.
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
pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(PROBLEM is not None and not REQUIRED,
                                 reason=f"no multi-node SLURM cluster: {PROBLEM}")]


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
        assert abs(g[s]["loss"] - w[s]["loss"]) < LOSS_TOL * abs(w[s]["loss"]), (s, g[s]["loss"], w[s]["loss"])
        assert abs(g[s]["grad_norm"] - w[s]["grad_norm"]) < 1e-4 * w[s]["grad_norm"], s
    assert abs(got["eval_macro_loss"] - want["eval_macro_loss"]) < LOSS_TOL * abs(want["eval_macro_loss"])


def test_two_node_study_runs_across_hosts_equals_one_process_and_is_analysed(tmp_path, capsys):
    from marin_ablate.analysis.io.results import collect, inventory
    from marin_ablate.cli.main import main as cli_main

    study = two_node_study()
    ref = run_study(study, tmp_path / "ref", ExecOptions(executor="debug"), progress=False)
    assert ref.counts["completed"] == 2
    # the product's own path: `marin-ablate run STUDY --executor slurm`, then its analysis
    rc = cli_main(["run", f"{__name__}:two_node_study", "--out", str(tmp_path / "slurm"), "--executor", "slurm"])
    out = capsys.readouterr().out
    assert rc == 0 and "analysis skipped" not in out and "stopped" not in out, out[-2000:]
    assert any((tmp_path / "slurm" / "two_nodes" / "report").iterdir()), out[-2000:]
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


def _one_run_study(steps: int, name: str) -> Study:
    from marin_ablate.ablations.designs import arms

    s = two_node_study(steps=steps, checkpoint_every=4, name=name)
    return Study(name=s.name, description=s.description, factors=s.factors, design=arms(["xsa"], ["all_on"]),
                 rungs=s.rungs, seeds=s.seeds, base_recipe=s.base_recipe, executor=dict(s.executor))


@pytest.fixture(scope="module")
def resume_reference(tmp_path_factory) -> Path:
    """The one-run study of the requeue and killed-node tests done in one go by one process: what each
    interrupted run must end equal to (one reference for both: the same study, run ids and steps)."""
    out = tmp_path_factory.mktemp("reference")
    rep = run_study(_one_run_study(steps=16, name="resume2"), out, ExecOptions(executor="debug"), progress=False)
    assert rep.counts["completed"] == 1, rep
    return out / "resume2" / "runs"


def _steps(run_dir: Path) -> int:
    return max([r["step"] for r in _lines(run_dir)] or [-1])


def _sacct_states(job_id: str) -> list[str]:
    r = subprocess.run(["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                       text=True, timeout=60)
    return [s.split()[0] for s in r.stdout.split("\n") if s.strip()]


def _start_mid_run(study: Study, tmp_path: Path, after_step: int, limit_s: float = 240):
    """Submit the one-run study (no wait) and return (run, job) once it has trained past `after_step`."""
    rep = run_study(study, tmp_path / "slurm", ExecOptions(executor="slurm", wait=False, poll_s=1.0), progress=False)
    (run,), (job,) = rep.submission.runs, rep.submission.jobs
    t0 = time.time()
    while _steps(run.dir) < after_step:
        assert time.time() - t0 < limit_s, f"the run did not reach step {after_step}"
        time.sleep(0.2)
    return rep, run, job


def test_requeued_two_node_run_resumes_from_its_sharded_checkpoint_to_the_same_result(tmp_path, monkeypatch,
                                                                                       resume_reference):
    """`scontrol requeue` (preemption in REQUEUE mode) SIGTERMs the ranks on both nodes: they stop at
    one step, write the distributed checkpoint (shards from ranks on both hosts), SLURM starts the
    job again and it resumes to the result of one uninterrupted process."""
    monkeypatch.setenv("MARIN_KEEP_CHECKPOINTS", "final")  # a completed CPU run keeps none by default
    study = _one_run_study(steps=16, name="resume2")
    rep, run, job = _start_mid_run(study, tmp_path, after_step=5)  # past the checkpoint at step 4
    subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=60)
    counts = wait(rep.submission, rep.submission.runs, poll_s=1.0, timeout_s=400)
    assert counts["completed"] == 1, counts
    log = (run.dir / "train.log").read_text()
    assert log.count("interrupted at step") == 1 and "signal 15" in log and log.count("resumed") == 1, log[-2000:]
    assert "REQUEUED" in _sacct_states(job.job_id)
    # the distributed checkpoint holds one shard per rank, written from both hosts
    hosts = {read_json(run.dir / "ranks" / f"{r}.json")["host"] for r in range(4)}
    ck = sorted((run.dir / "checkpoints").glob("ckpt_*"))[-1]
    assert len(hosts) == NODES and (ck / "meta.json").exists()
    assert sorted(p.name for p in (ck / "dcp").glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    _assert_equal_runs(run.dir, resume_reference / run.run_id)


def _wait_until(what: str, ok, limit_s: float) -> None:
    t0 = time.time()
    while not ok():
        assert time.time() - t0 < limit_s, what
        time.sleep(0.2)


def _ci(*args: str) -> None:
    subprocess.run(["bash", str(Path(__file__).resolve().parents[2] / ".ci" / "slurm.sh"), *args], check=True,
                   timeout=180)


def test_a_killed_node_is_survived_the_run_resumes_from_its_last_checkpoint_and_nothing_is_lost(tmp_path,
                                                                                                resume_reference):
    """Node marin-n1 dies mid-run (every process of its namespace, slurmd and the job's steps, is
    frozen then SIGKILLed, as a host losing power): the ranks on the other node lose their peers,
    SLURM marks the node down after SlurmdTimeout and requeues the job (JobRequeue=1, NODE_FAIL);
    once the node is back the job runs again and resumes from the last verified checkpoint to the
    uninterrupted result."""
    study = _one_run_study(steps=16, name="resume2")
    rep, run, job = _start_mid_run(study, tmp_path, after_step=9)
    # a checkpoint written in the background is committed when the next one starts (step 12 commits
    # step 8's): kill once ckpt_000000008 is committed, so the run has one to fall back on past step 4
    t0 = time.time()
    while not (run.dir / "checkpoints" / "ckpt_000000008").is_dir():
        assert time.time() - t0 < 240, "ckpt_000000008 was never committed"
        time.sleep(0.2)
    _ci("kill-node", "1")
    committed = max(p.name for p in (run.dir / "checkpoints").glob("ckpt_*") if p.is_dir())
    t0 = time.time()
    try:
        while "NODE_FAIL" not in _sacct_states(job.job_id):
            assert time.time() - t0 < 150, f"SLURM did not notice the dead node: {_sacct_states(job.job_id)}"
            time.sleep(1)
    finally:
        _ci("start-node", "1")
    counts = wait(rep.submission, rep.submission.runs, poll_s=1.0, timeout_s=400)
    log = (run.dir / "train.log").read_text()
    assert counts["completed"] == 1, (counts, log[-2000:])
    assert "resumed" in log and f"from {committed}" in log, (committed, log[-2000:])
    _assert_equal_runs(run.dir, resume_reference / run.run_id)


@pytest.mark.parametrize("nodes_per_ep_group,ok", [(2, False), (1, True)])
def test_hero_preflight_on_the_cluster_refuses_an_ep_group_split_over_racks(tmp_path, nodes_per_ep_group, ok):
    """The hero's rack pre-flight inside a real 2-node job, racks from SLURM's topology.conf (one node
    per rack switch here): an EP group of 2 nodes would straddle two racks, so the job fails before
    any rank starts; EP groups of 1 node pass and the ranks run."""
    import sys

    out = tmp_path / "job.out"
    script = "\n".join([
        "#!/bin/bash",
        (f'{sys.executable} -m marin_ablate.planning.hero check-racks --topology "$SLURM_JOB_NODELIST" '
         f"--nodes-per-ep-group {nodes_per_ep_group} || exit 1"),
        'srun --ntasks-per-node=1 bash -c "echo rank $SLURM_PROCID ran on $(hostname)"', ""])
    # not `sbatch --wait`: it polls at 2, 10 and 42 s, so a job slowed past 10 s by a loaded machine costs 42
    job = subprocess.run(["sbatch", "--parsable", "-N", str(NODES), "--ntasks-per-node=1", "-c", "1", "--mem=200M",
                          "-o", str(out), "-D", str(Path(__file__).resolve().parents[2])], input=script,
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip().split(";")[0]
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    _wait_until(f"job {job} did not end", lambda: any(s in ended for s in _sacct_states(job)), 180)
    state, text = _sacct_states(job)[0], out.read_text()
    if ok:
        assert state == "COMPLETED" and text.count(" ran on ") == NODES, (state, text)
        assert "hero pre-flight: 2 nodes, 2 EP groups" in text
    else:
        assert state == "FAILED" and " ran on " not in text, (state, text)
        assert "hero pre-flight FAILED" in text and "EP group 0 (nodes 0..1) spans 2" in text
        assert "rack0" in text and "rack1" in text
