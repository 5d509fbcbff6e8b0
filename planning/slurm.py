"""A SLURM job's parameters, shared by the executor that submits a study's runs (sweeps/executors.py) and the
hero's own sbatch script (planning/hero.py): the slurm options (`--slurm.FIELD` on plan and run) and the sbatch
parameters of a run's resources, one task per GPU started by srun (docs/architecture.md §5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin_ablate.marin.fields import check_fields, option


@dataclass(frozen=True)
class SlurmOptions:
    """sbatch resources (the slurm row's options: `--slurm.FIELD` on plan and run)."""

    partition: str | None = option(None, help="sbatch --partition")
    account: str | None = option(None, help="sbatch --account")
    qos: str | None = option(None, help="sbatch --qos")
    time_min: int | None = option(None, lo=1, help="time limit per run in minutes (none: the study's per rung, or 60)")
    gpus_per_run: int | None = option(None, lo=0, help="GPUs per run, one task each (none: the rung's)")
    nodes: int | None = option(None, lo=1, help="CPU runs: nodes per run (none: the rung's, or 1); GPU runs: from GPUs")
    tasks_per_node: int | None = option(None, lo=1, help="CPU runs: ranks per node (none: the rung's, or 1)")
    cpus_per_task: int | None = option(None, lo=1, help="per task (= per GPU for GPU runs); none: 1 on CPU, the "
                                                        "study's cpus_per_gpu on GPU")
    mem_gb: float | None = option(None, lo=0, lo_open=True, help="memory per run in GB; none: the study's mem_gb "
                                                                 "(CPU) or mem_gb_per_gpu x GPUs")
    array_parallelism: int | None = option(None, lo=1, help="array tasks running at once (none: the study's)")
    signal_delay_s: int = option(90, lo=1, help="USR2 this long before the time limit (checkpoint, requeue)")
    max_num_timeout: int = option(3, lo=0, help="requeues after a time-out before submitit gives up")
    constraint: str | None = option(None, help="sbatch --constraint")
    exclude: str | None = option(None, help="sbatch --exclude")
    setup: tuple[str, ...] = option((), metavar="LINE", help="shell line before srun (module load, source venv ...; "
                                                            "repeatable)")
    use_srun: bool = True

    def __post_init__(self) -> None:
        check_fields(self, "slurm")


def sbatch_params(res: dict, s: SlurmOptions, n: int, name: str) -> dict:
    gpus, per_node = res["gpus"], res.get("gpus_per_node") or res["gpus"]
    nodes = -(-gpus // per_node) if gpus else res.get("nodes", 1)
    if gpus and gpus % per_node:
        raise ValueError(f"slurm gpus_per_run={gpus} does not fill whole nodes of {per_node} GPUs")
    p: dict[str, Any] = {
        "job_name": f"marin-{res.get('job_name') or name}",
        "time": res["time_min"],
        "nodes": nodes,
        # one task per GPU (srun starts them; torch.distributed env from SLURM), on CPU the rung's ranks
        "ntasks_per_node": max(1, per_node if gpus else res.get("tasks_per_node", 1)),
        "cpus_per_task": res["cpus_per_task"],
        # short CPU jobs: USR2 no earlier than 3/4 through the limit
        "signal_delay_s": res.get("signal_delay_s") or max(1, min(s.signal_delay_s, res["time_min"] * 60 // 4)),
        "array_parallelism": s.array_parallelism or n,
        "use_srun": s.use_srun,
        # a rank that fails ends its job: the other ranks would wait in their next collective
        "srun_args": ["--kill-on-bad-exit=1", *res.get("srun_args", ())],
        "additional_parameters": {"requeue": True, **dict(res.get("additional", ()))},
    }
    if gpus:
        p["gpus_per_node"] = per_node
    if res.get("exclusive"):
        p["exclusive"] = True
    if res.get("mem_gb"):
        p["mem"] = f"{int(round(float(res['mem_gb']) * 1024))}M"
    for k in ("partition", "account", "qos", "constraint", "exclude"):
        if getattr(s, k, None) or res.get(k):
            p[k] = getattr(s, k, None) or res[k]
    p["setup"] = [f"export OMP_NUM_THREADS={res['cpus_per_task']}", *s.setup, *res.get("setup", ())]
    return p
