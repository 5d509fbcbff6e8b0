"""What `marin-ablate plan STUDY` states, computed: the study's description with the runs `run` would make (the
command line's overrides applied), its execution and time on this machine, each rung's data against its corpus, the
runs before the design and, for the hero, its checkpoints, sbatch and time model. Everything `run` refuses is refused
here too; nothing is written (docs/architecture.md §4)."""

from __future__ import annotations

from typing import Any, Sequence

from marin_ablate.ablations.epochs import check_study_epochs
from marin_ablate.planning.costmodel import rungs_as_overridden
from marin_ablate.planning.timemodel import hero_plan
from marin_ablate.sweeps.executors import ExecOptions, get_executor
from marin_ablate.sweeps.progress import rung_prior, time_estimate
from marin_ablate.sweeps.reference import before_design
from marin_ablate.sweeps.sweep import analysis_refusal, check_layouts, check_specs, planned_runs, study_resources


def plan_record(study: Any, out: str, opts: ExecOptions, overrides: Sequence[str] = (),
                allow_repeat: bool = False) -> tuple[dict, list[dict]]:
    """(the plan, one row per run: run_id, rung, arm, seed, design_row)."""
    d = study.describe()
    planned = planned_runs(study, out, overrides=overrides)  # the runs, ids and specs `run` makes
    runs = [(r.spec, r.meta) for r in planned]
    prior = rung_prior(d["rungs"])  # the time prior: the rungs as the study defines them
    if overrides:
        rungs_as_overridden(d, runs, study)
    d["epochs"] = check_study_epochs(runs, d["rungs"], allow_repeat)
    check_specs(planned, opts.executor)  # what `train` and `run` refuse, plan refuses too (before costing them)
    d["analysis_refusal"] = analysis_refusal(planned)  # what `run` refuses as a table `analyze` would refuse
    slots = get_executor(opts.executor).slots(opts)
    d["execution"] = {"executor": opts.executor, "workers": slots}
    d["time"] = time_estimate(planned, prior, slots, opts.threads)
    check_layouts(planned, opts, study_resources(study))
    d["before_design"] = before_design(study, out)
    if "hero" in d:
        hero_plan(d["hero"], study.hero, runs[0][0])
    return d, [{"run_id": s.run_id, **{k: m[k] for k in ("rung", "arm", "seed", "design_row")}} for s, m in runs]
