"""A study's job as `run` runs it: the design at the study's seeds (`run_design`: planned and checked once, then the LR
profile, the pinned reference law and the runs), and `run STUDY --until.halfwidth H`, which adds seed blocks until
the intervals are as narrow as asked (`run_until`; docs/method.md §4.11, Stein's two-stage rule; the arithmetic is
analysis/fit/stopping.py). Blocks are of the pilot's size, so Ctrl-C loses at most one block's unfinished runs
(which resume) and `--until.minutes` is checked between blocks."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from marin_ablate.analysis.fit.stopping import (
    UNTIL_FILE,
    SteinPlan,
    Until,
    core_seconds_per_seed,
    read_plan,
    stein_plan,
)
from marin_ablate.marin.fields import option
from marin_ablate.sweeps import reference
from marin_ablate.sweeps.executors import EXECUTORS, ExecOptions, SlurmOptions, get_executor
from marin_ablate.sweeps.runs import atomic_write_json, study_dir
from marin_ablate.sweeps.sweep import plan_study, run_plan
from marin_ablate.sweeps.tracking import set_log_to
from marin_ablate.sweeps.tuning import lr_plan, profile_skipped, read_profile


def exec_options(cfg: Any, study: Any, log: Any = None) -> Any:
    """The ExecOptions of the command line's ExecConfig (sweeps/sweep.py) and the study's defaults: a `--NAME.*` section
    implies `--executor NAME`; its options reach the executor as `ExecOptions.options` (the slurm row's
    also as `ExecOptions.slurm`). `log`: the runs' metric sinks and checkpoint retention, set for the workers."""
    if log is not None:
        set_log_to(log.log_to, log.keep_checkpoints)
    ex = dict(getattr(study, "executor", ()) or ())
    given = dict(cfg.backends)
    if len(given) > 1:
        raise ValueError(f"{' and '.join(f'--{n}.*' for n in given)}: the options of {len(given)} executors; "
                         "allowed: one executor's section")
    executor = cfg.executor or next(iter(given), None) or ex.get("executor") or "local"
    if executor not in EXECUTORS:
        raise ValueError(f"--executor={executor!r} is not known; allowed values: {', '.join(EXECUTORS)}")
    for name in given:
        if name != executor:
            raise ValueError(f"--{name}.* options are the {name} executor's, given with --executor {executor}; "
                             f"allowed: --executor {name}, or no --{name}.* option")
    own = getattr(EXECUTORS[executor], "options", None)
    backend = given.get(executor, own() if own is not None else None)
    slurm = backend if executor == "slurm" else SlurmOptions()
    if slurm.array_parallelism is None and ex.get("slurm_array_parallelism"):
        slurm = replace(slurm, array_parallelism=ex["slurm_array_parallelism"])
        backend = slurm if executor == "slurm" else backend
    workers = cfg.workers if cfg.workers is not None else int(ex.get("max_parallel", 2))
    return ExecOptions(executor=executor, workers=workers, threads=cfg.threads, retry_failed=cfg.retry_failed,
                       gpu_mem_gib=cfg.gpu_mem_gib, wait=not cfg.no_wait, slurm=slurm, options=backend)


@dataclass(frozen=True)
class UntilOptions:
    """After the study's seeds (the pilot), add seed blocks until each named value's 95% interval at C_ref is no
    wider than ±HALFWIDTH in ln M, or the budget is spent (Stein's two-stage rule: docs/method.md §4.11)."""

    halfwidth: float = option(0.2, lo=0, lo_open=True, metavar="H", help="the half-width asked for, ln scale "
                                                                           "(0.2: ×/÷ 1.22)")
    components: str | None = option(None, metavar="A,B", help="comma-separated components (TOTAL too) the target "
                                                               "is for (none: every component and the TOTAL)")
    max_seeds: int = option(64, lo=2, hi=10_000, help="seeds in all at most, the pilot's included")
    minutes: float | None = option(None, lo=0, lo_open=True, help="wall-clock minutes this invocation may spend "
                                                                  "(none: no limit)")

    def spec(self) -> Until:
        names = tuple(x.strip() for x in (self.components or "").split(",") if x.strip())
        return Until(self.halfwidth, names, self.max_seeds, self.minutes)


@dataclass(frozen=True)
class DesignOptions:
    """How `run` sets a design's LRs and law (the command line's --tuned, --no-profile, --no-pin, --allow-repeat)."""

    overrides: tuple[str, ...] = ()
    tuned: bool = False
    no_profile: bool = False
    no_pin: bool = False
    allow_repeat: bool = False


def run_design(study: Any, out: str | Path, opts: Any, d: DesignOptions, say: Callable[[str], None] = print) -> Any:
    """The design at the study's seeds: planned and checked once, before the LR profile or the reference ladder
    writes anything; then the profile (sweeps/tuning.py), the pinned law (sweeps/reference.py) and the runs. Returns
    the run report."""
    plan = plan_study(study, out, opts, overrides=d.overrides, epochs=True, allow_repeat=d.allow_repeat).check()
    if d.tuned:
        lr_plan(study, out, None, tuned=True)  # a missing or damaged file: refused before any run
    if (not opts.wait and study.lr_coupled and not (d.tuned or d.no_profile) and not profile_skipped(study)
            and not read_profile(out, study.name)):
        raise ValueError(f"--no-wait: the LR profile of {', '.join(f.name for f in study.lr_coupled)} must finish "
                         "before the design is submitted; allowed: run once without --no-wait, or --no-profile")
    mult, prov = lr_plan(study, out, opts if opts.wait else None, tuned=d.tuned, profile=not d.no_profile,
                         overrides=d.overrides)
    if prov.get("lr_profile_skipped"):
        say(f"{study.name}: no LR profile: {prov['lr_profile_skipped']}")
    if prov["lr_source"] == "profile":
        say(f"{study.name}: LRs profiled per level ({prov['lr_profile']}, {prov['lr_profile_date']})")
    law = reference.pin_law(study, plan.sdir, opts, d.overrides, pin=not d.no_pin)
    if law:
        say(f"{study.name}: {law}")
    rep = run_plan(plan.at_lrs(mult, prov))
    say("\n".join(rep.lines(get_executor(opts.executor).shows_jobs)))
    return rep


def pilot_plan(sdir: Path, pilot: tuple[int, ...], until: Until, workers: int, level: float = 0.95) -> SteinPlan:
    """Stein's plan from the pilot's finished runs in `sdir`: its per-seed estimates and law standard errors at C_ref
    as `analyze` computes them (the folder's pinned law), and what `until.minutes` buy at the pilot's measured cost
    per seed on `workers` parallel workers."""
    from marin_ablate.analysis.fit.reflaw import read_pinned
    from marin_ablate.analysis.io.results import load_table, profile_seconds
    from marin_ablate.analysis.pipeline import analyze_table
    from marin_ablate.analysis.responses import law, law_column

    table = load_table(sdir)
    table = table[table["seed"].isin(pilot)]
    a = analyze_table(table, n_boot=0, boot_method="none", responses=(law().name,), law_forms=("power",),
                      pinned_law=read_pinned(sdir, table["study"].dropna().iloc[0] if len(table) else None))
    col = law_column()
    est: dict[str, list[float]] = {}
    for seed in pilot:
        alone = a.per_seed.get(seed)
        c = alone.components if alone is not None else None
        for r in (c[c["response"] == col].itertuples() if c is not None and len(c) else ()):
            est.setdefault(str(r.component), []).append(float(r.shapley) if r.shapley_estimable else math.nan)
    c = a.components[a.components["response"] == col]
    law = {str(r.component): float(r.shapley_se_law) for r in c.itertuples()}
    est = {k: v + [math.nan] * (len(pilot) - len(v)) for k, v in est.items()}
    budget = None
    per_seed = core_seconds_per_seed(table, profile_seconds(sdir))
    if until.minutes is not None and math.isfinite(per_seed) and per_seed > 0:
        budget = int(until.minutes * 60 * max(workers, 1) // per_seed)  # seeds in all, the pilot's included
    plan = stein_plan(pilot, est, law, until, level, budget)
    return replace(plan, extra={"seconds_per_seed": per_seed, "workers": workers})


def run_until(study: Any, out: str | Path, until: Until, opts: Any, d: DesignOptions,
              say: Callable[[str], None] = print) -> Any:
    """Run the pilot (`run_design` at the study's seeds), plan N from it (or read the folder's plan), then the added
    seeds in blocks of the pilot's size; returns the last block's run report. A folder planned for another pilot,
    target or set of named values is refused before anything runs."""
    if not opts.wait:
        raise ValueError("--until adds seeds from the pilot's finished runs; allowed: --until without --no-wait")
    names = [f.name for f in study.factors] + ["TOTAL"]
    bad = [c for c in until.components if c not in names]
    if bad:
        raise ValueError(f"--until.components {','.join(bad)}: not a component of study {study.name!r}; allowed "
                         f"values: {', '.join(names)}")
    sdir = study_dir(out, study.name)
    pilot = tuple(study.seeds)
    old = read_plan(sdir)
    if old is not None and (old.pilot != pilot or abs(old.halfwidth - until.halfwidth) > 1e-12
                            or tuple(old.components) != tuple(until.components)):
        raise ValueError(f"{sdir / UNTIL_FILE} was planned for pilot seeds {list(old.pilot)}, until.halfwidth="
                         f"{old.halfwidth:g}, until.components={list(old.components) or 'all'}; allowed values: the "
                         "same pilot and target (its plan resumes), or delete the file to plan the study again")
    started = time.time()
    rep = run_design(study, out, opts, d, say)
    plan = old
    if plan is None:
        plan = pilot_plan(sdir, pilot, until, get_executor(opts.executor).slots(opts) or 1)
        atomic_write_json(sdir / UNTIL_FILE, plan.to_dict())
    named = ", ".join(f"{c} {plan.needs[c]}" for c in plan.needs)
    far = ", ".join(f"{c} ±{h:.3g}" for c, h in plan.out_of_reach().items())
    say(f"{study.name}: --until.halfwidth {plan.halfwidth:g}: the pilot's {len(pilot)} seeds ask for {plan.seeds} "
        f"in all ({named})" + (f"; capped by {plan.capped}" if plan.capped else "")
        + (f"; out of the seeds' reach, the pinned law's share alone: {far} (a longer reference ladder narrows it)"
           if far else ""))
    extra = [max(pilot) + 1 + i for i in range(plan.seeds - len(pilot))]
    done = len(pilot)
    while done < plan.seeds:
        if until.minutes is not None and time.time() - started > until.minutes * 60:
            say(f"{study.name}: --until.minutes {until.minutes:g} spent at {done} seeds of {plan.seeds}")
            break
        done = min(plan.seeds, done + len(pilot))
        rep = run_design(replace(study, seeds=pilot + tuple(extra[:done - len(pilot)])), out, opts, d, say)
    return rep
