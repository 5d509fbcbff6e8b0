"""A CPU rung that asks for several nodes becomes one SLURM job of nodes x tasks_per_node srun tasks
(docs/architecture.md, "Multi-node SLURM"); bad numbers are refused naming the field."""

from types import SimpleNamespace

import pytest

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.ladders import Rung
from marin_ablate.ablations.study import Study
from marin_ablate.sweeps.executors import SlurmOptions, sbatch_params, slurm_resources
from marin_ablate.sweeps.sweep import study_resources

# Multi-process training, torch.compile, simulated studies or real SLURM jobs (minutes on 2 cores) are marked
# `slow` one by one: the development loop (`python -m pytest -m "not slow"`) keeps the fast checks of this file.


def _study(**rung_kw) -> Study:
    rung = Rung("r", "tiny", fixed_steps=2, batch_size=4, **rung_kw)
    return Study(name="mn", description="", factors=("xsa",), design=full_factorial(["xsa"]), rungs=(rung,),
                 executor={"executor": "slurm", "cpus_per_task": 1, "mem_gb": 1})


def _params(study: Study, opts: SlurmOptions = SlurmOptions()) -> dict:
    res = slurm_resources(SimpleNamespace(meta={"rung": "r"}), opts, study_resources(study))
    return sbatch_params(res, opts, 1, study.name)


@pytest.mark.slow
def test_cpu_rung_with_two_nodes_asks_slurm_for_two_nodes_of_its_ranks():
    p = _params(_study(nodes=2, tasks_per_node=2))
    assert p["nodes"] == 2 and p["ntasks_per_node"] == 2 and "gpus_per_node" not in p
    p1 = _params(_study())
    assert p1["nodes"] == 1 and p1["ntasks_per_node"] == 1
    # the command line's options win over the rung's
    p3 = _params(_study(nodes=2, tasks_per_node=2), SlurmOptions(nodes=3, tasks_per_node=1))
    assert p3["nodes"] == 3 and p3["ntasks_per_node"] == 1


def test_bad_node_counts_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        Rung("r", "tiny", nodes=0)
    with pytest.raises(ValueError, match="tasks_per_node"):
        SlurmOptions(tasks_per_node=0)
