"""One table per concept: an optimizer level and an executor are each added in one place (a registry
call here) and a tiny study runs through plan -> run -> analyze -> report with no other edit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import marin_ablate.marin.optimizers as optimizers
import marin_ablate.marin.switches as factors
from marin_ablate.ablations import Factor, Study, full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.marin.config import Recipe, RunSpec
from marin_ablate.marin.optimizers import GroupKind, OptimizerLevel
from marin_ablate.marin.presets import tiny
from marin_ablate.marin.switches import register_optimizer

LION_BETAS = (0.9, 0.99)


def lion_update(opt, p: torch.Tensor, g: dict) -> None:
    """Lion (Chen et al. 2023, arXiv 2302.06675): sign of an interpolated momentum, decoupled decay."""
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
    """Lion's lr a third of AdamW's (the paper's 3-10x smaller), betas (0.9, 0.99)."""
    return adam_lr / 3, adam_lr / 3, *LION_BETAS, 1e-8


@pytest.fixture
def registries():
    """Undo every registration after the test (the tables are module-level)."""
    saved = (dict(optimizers.KINDS), dict(optimizers.OPTIMIZERS), dict(factors.SPECS), dict(factors.RECIPE_LEVELS),
             factors.RECIPE_FACTOR_SPECS)
    yield
    for table, old in zip((optimizers.KINDS, optimizers.OPTIMIZERS, factors.SPECS, factors.RECIPE_LEVELS), saved,
                          strict=False):
        table.clear()
        table.update(old)
    factors.RECIPE_FACTOR_SPECS = saved[-1]


def register_lion() -> None:
    register_optimizer(OptimizerLevel("lion", {}, "lion", lion_rule, "Lion everywhere"),
                       [GroupKind("lion", state_buffers=1, orthogonalizes=False, lr="adam", decays=True,
                                  on_sphere=False, update=lion_update)])


def _rungs() -> tuple[Rung, ...]:
    return tuple(Rung(f"tiny{n}", "tiny", fixed_steps=n, batch_size=2,
                      train_overrides={"eval_batches": 1, "eval_every": n, "checkpoint_every": n, "log_every": 1})
                 for n in (2, 4, 8))


def lion_study() -> Study:
    opt = Factor("opt", field="recipe.optimizer", levels={"adamw": "adamw", "lion": "lion"})
    return Study("lion", "AdamW vs Lion", (opt,), full_factorial(["opt"]), _rungs(), seeds=(0,),
                 executor={"executor": "debug", "max_parallel": 1})


def _through_analyze(study_ref: str, name: str, out: Path, capsys, *extra: str) -> str:
    from marin_ablate.cli.main import main

    assert main(["plan", study_ref]) == 0
    assert main(["run", study_ref, "--out", str(out), "--no-analyze", *extra]) == 0
    sd = out / name
    summaries = [json.loads(p.read_text()) for p in sorted(sd.glob("runs/*/summary.json"))]
    assert len(summaries) == 6 and {s["status"] for s in summaries} == {"completed"}
    capsys.readouterr()
    assert main(["analyze", str(sd), "--n-boot", "0", "--no-figures"]) == 0
    return (sd / "report" / "report.md").read_text()


@pytest.mark.slow
def test_a_registered_optimizer_runs_a_study_from_plan_to_report(registries, tmp_path, capsys):
    register_lion()
    assert Recipe(optimizer="lion").optimizer == "lion"
    # the plan's costing reads the registry: one fp32 buffer, no Newton–Schulz transient
    from marin_ablate.planning.dryrun import Sharding, memory_table
    from marin_ablate.planning.hero import checkpoint_plan, params_by_role

    spec = RunSpec(model=tiny(), recipe=Recipe(optimizer="lion"))
    by_role = params_by_role(spec)
    n = sum(by_role.values())
    cp = checkpoint_plan(spec, gpus=1, window_s=10.0, levels=("lion", "adamw"))["levels"]
    assert cp["lion"]["optimizer_bytes"] == 4 * n and cp["adamw"]["optimizer_bytes"] == 8 * n
    state = {"by_role": by_role, "largest_matrix": by_role}
    act = {"n_local": 0, "per_local": 0, "n_global": 0, "per_global": 0, "base": 0, "recompute": False}
    rows = {r["line"]: r["bytes"] for r in memory_table(spec, state, 1, act, Sharding("t", None, False), "lion")}
    assert rows["transient: Newton-Schulz working set (one whole matrix)"] == 0
    assert sum(b for k, b in rows.items() if k.startswith("optimizer lion")) == 4 * n
    rows = {r["line"]: r["bytes"] for r in memory_table(spec, state, 1, act, Sharding("t", None, False), "hyperball")}
    assert rows["transient: Newton-Schulz working set (one whole matrix)"] > 0

    # the trainer builds it: one step of a decayed parameter is w - lr*(sign(g) + wd*w) (m starts at 0)
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.update_rules import build_optimizer, group_assignment, resolve_hparams

    torch.manual_seed(0)
    model = MarinModel(spec.model, spec.recipe)
    hp = resolve_hparams(spec)
    assert (hp.beta1, hp.beta2) == LION_BETAS
    opt = build_optimizer(model, hp)
    assert set(group_assignment(opt).values()) == {"lion"}
    tok = torch.randint(0, 256, (2, 33))
    model(tok[:, :-1], None, tok[:, 1:]).loss.backward()
    name, p = next((n, p) for n, p in model.named_parameters() if model.param_roles()[n] == "matrix")
    g = next(g for g in opt.param_groups if name in g["names"])
    want = p.detach() - g["lr"] * (torch.sign(p.grad) + g["weight_decay"] * p.detach())
    opt.step()
    torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
    assert len(opt.state[p]) == 1  # one state buffer, as registered

    md = _through_analyze("test_registries:lion_study", "lion", tmp_path, capsys)
    assert "# Attribution report: lion" in md and "| opt |" in md


def _anneal_groups(level: str) -> dict[str, float]:
    """role -> peak decay of the groups that anneal under `level` (the tiny model, default decay)."""
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams

    spec = RunSpec(model=tiny(), recipe=Recipe(optimizer=level))
    opt = build_optimizer(MarinModel(spec.model, spec.recipe), resolve_hparams(spec))
    return {g["role"]: g["peak_weight_decay"] for g in opt.param_groups if g["anneal_weight_decay"]}


def test_annealed_gate_router_decay_is_read_from_the_level_row(registries):
    wd = RunSpec(model=tiny()).train.gate_router_weight_decay
    assert _anneal_groups("hyperball") == {"gate": wd, "router": wd}
    assert _anneal_groups("adamw") == {}
    hb = optimizers.OPTIMIZERS["hyperball"]
    register_optimizer(OptimizerLevel("hb_nodecay", dict(hb.kinds), hb.default, hb.hparams))
    register_optimizer(OptimizerLevel("hb_embed", dict(hb.kinds), hb.default, hb.hparams, annealed_decay=("embed",)))
    assert _anneal_groups("hb_nodecay") == {}  # same kinds as hyperball, no row entry: no decay
    assert _anneal_groups("hb_embed") == {"embed": wd}


def test_annealed_decay_on_a_decaying_sphere_or_unknown_role_is_refused(registries):
    for kinds, default, roles in (({}, "adamw", ("router",)), ({"lm_head": "adamh"}, "adam", ("lm_head",)),
                                  ({}, "adam", ("norm",))):
        with pytest.raises(ValueError, match=f"annealed_decay roles \\['{roles[0]}'\\]; allowed values"):
            register_optimizer(OptimizerLevel("bad", kinds, default, "adamw", annealed_decay=roles))
    with pytest.raises(ValueError, match="roles \\['gates'\\]; allowed values: matrix"):
        OptimizerLevel("bad", {}, "adam", "adamw", annealed_decay=("gates",))
    assert "bad" not in optimizers.OPTIMIZERS


class InProcess:
    """An executor that runs its jobs on one background thread of this process, after `gate` opens;
    until then they are queued (its own table says so, as squeue does for SLURM)."""

    name, waits, shows_jobs, in_process, trains_here = "inproc", True, False, True, True

    def __init__(self):
        import concurrent.futures
        import threading

        self.gate = threading.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.jobs: dict[str, object] = {}
        self.submitted = 0

    def validate(self, opts) -> None:
        pass

    def submit(self, runs, study_dir, opts, resources, on_run_done):
        from marin_ablate.sweeps.executors import Submission, record_job
        from marin_ablate.sweeps.runs import RunTask, execute

        sub = Submission(self.name, runs=list(runs))
        for r in runs:
            job = _Job(f"inproc-{len(self.jobs)}", self.pool.submit(self._run, RunTask.of(r), execute))
            self.jobs[job.job_id] = job
            record_job(r, self.name, job.job_id)
            sub.jobs.append(job)
        self.submitted += len(runs)
        return sub

    def _run(self, task, execute):
        self.gate.wait(60)
        return execute(task)

    def queued(self, job_ids):
        return {j for j in job_ids if j in self.jobs and not self.jobs[j].done()}

    def cancel(self, sub) -> str:
        return ""

    def slots(self, opts):
        return 1


class _Job:
    def __init__(self, job_id, future):
        self.job_id, self.future = job_id, future

    def done(self) -> bool:
        return self.future.done()

    def result(self):
        return self.future.result()


def inproc_study() -> Study:
    xsa = Factor("xsa", field="recipe.xsa", levels={"none": "none", "xsa": "xsa"})
    return Study("inproc", "XSA on an in-process executor", (xsa,), full_factorial(["xsa"]), _rungs(), seeds=(0,),
                 executor={"executor": "debug", "max_parallel": 1})


@pytest.mark.slow
def test_a_registered_executor_runs_a_study_from_plan_to_report_and_never_submits_twice(tmp_path, capsys):
    from marin_ablate.cli.main import main
    from marin_ablate.sweeps.executors import EXECUTORS, ExecOptions, register_executor, wait
    from marin_ablate.sweeps.state import count_dirs
    from marin_ablate.sweeps.sweep import run_study

    ex = register_executor(InProcess())
    try:
        assert main(["plan", "test_registries:inproc_study"]) == 0
        opts = ExecOptions(executor="inproc", wait=False)
        rep = run_study(inproc_study(), tmp_path, opts, progress=False)
        assert rep.submitted == 6 and rep.counts["queued"] == 6  # the executor's own queue, asked by state
        again = run_study(inproc_study(), tmp_path, opts, progress=False)
        assert again.submitted == 0 and again.skipped == {"queued": 6} and ex.submitted == 6
        ex.gate.set()
        dirs = sorted((tmp_path / "inproc" / "runs").iterdir())
        assert wait(rep.submission, rep.submission.runs, poll_s=0.2, timeout_s=600) == count_dirs(dirs)
        assert count_dirs(dirs)["completed"] == 6
        capsys.readouterr()
        assert main(["run", "test_registries:inproc_study", "--out", str(tmp_path), "--executor", "inproc",
                     "--no-analyze"]) == 0
        assert "nothing to submit (6 runs; skipped: 6 completed)" in capsys.readouterr().out
        assert main(["analyze", str(tmp_path / "inproc"), "--n-boot", "0", "--no-figures"]) == 0
        md = (tmp_path / "inproc" / "report" / "report.md").read_text()
        assert "# Attribution report: inproc" in md and "| xsa |" in md
    finally:
        ex.gate.set()
        ex.pool.shutdown(wait=True)
        EXECUTORS.pop("inproc", None)
