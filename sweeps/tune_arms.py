"""`run --tune`: each arm its own LR at one rung (docs/method.md §4.6), written as the multipliers `run --tuned`
carries up the ladder with the heuristic. For every arm a few log-spaced multipliers of the heuristic LR run at the
smallest rung (sweeps/tuning.py `run_grid`, Optuna ask-and-tell), the eval loss is profiled by a quadratic in
log2(multiplier) and the optimum reported, flagged on the grid's edge or where the profile is not convex."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from marin_ablate.ablations.ladders import params_active
from marin_ablate.ablations.study import text_table
from marin_ablate.marin.config import Recipe
from marin_ablate.marin.hparams import resolve_hparams
from marin_ablate.sweeps.executors import ExecOptions
from marin_ablate.sweeps.runs import atomic_write_json, plan_runs
from marin_ablate.sweeps.sweep import RunReport, at_lrs, check_specs, planned_runs
from marin_ablate.sweeps.tuning import (
    Profile,
    TuneOptions,
    fit_profile,
    grid_cost,
    lr_grid,
    open_storage,
    run_grid,
    tune_dir,
)


@dataclass
class TuneResult:
    study: str
    rung: str
    seed: int
    grid: list[float]
    profiles: dict[str, Profile]
    heuristic_lr: dict[str, float | None]
    multipliers: dict[str, float]
    report: RunReport | None = None
    missing: dict[str, list[float]] = field(default_factory=dict)

    def rows(self) -> list[dict]:
        return [{"arm": arm, "points": len(p.x), "best_grid_multiplier": 2.0 ** p.x[int(np.argmin(p.loss))],
                 "multiplier": p.multiplier, "lr": lr0 * p.multiplier if (lr0 := self.heuristic_lr.get(arm)) else None,
                 "loss_opt": p.loss_opt, "edge": p.edge, "note": p.reason} for arm, p in self.profiles.items()]

    def lines(self) -> list[str]:
        """`run --tune`'s account: the grid, per arm its profile's optimum, the edges and the missing points."""
        rows = self.rows()
        return [f"{self.study}: LR profile at rung {self.rung}, seed {self.seed}, log2 multipliers {self.grid}",
                *([text_table(rows, ["arm", "points", "best_grid_multiplier", "multiplier", "lr", "loss_opt", "edge"])]
                  if rows else []),
                *(f"edge: {r['arm']}: {r['note']}" for r in rows if r["edge"]),
                *(f"missing: {a}: log2 multipliers {xs} have no finished run" for a, xs in self.missing.items())]

    def to_dict(self) -> dict:
        return {"study": self.study, "rung": self.rung, "seed": self.seed, "grid_log2": self.grid,
                "multipliers": self.multipliers, "rows": self.rows(),
                "profiles": {a: {"x": list(p.x), "loss": list(p.loss), "coef": p.coef}
                             for a, p in self.profiles.items()},
                "missing": self.missing}


def smallest_rung(study: Any) -> str:
    return min(study.rungs, key=lambda r: params_active(r.model(), Recipe())).name


def tune_study(study: Any, out: str | Path, opts: ExecOptions, tune: TuneOptions = TuneOptions(),
               overrides: Sequence[str] = (), progress: bool = True) -> TuneResult:
    """Run the LR grid of every arm at the smallest rung, tell Optuna, fit the profiles."""
    tdir = tune_dir(out, study.name)
    rung = tune.rung or smallest_rung(study)
    seed = tune.seed if tune.seed is not None else study.seeds[0]
    if seed not in study.seeds:
        raise ValueError(f"seed={seed} is not a seed of study {study.name!r}; allowed values: {list(study.seeds)}")
    grid = lr_grid(tune.points, tune.span)

    # the runs: every arm at every grid multiplier
    points: dict[str, list[tuple[float, Any, dict]]] = {}
    heuristic: dict[str, float | None] = {}
    base = planned_runs(study, out, rungs=[rung], overrides=overrides, sdir=tdir)
    base = [r for r in base if r.meta["seed"] == seed]
    for x in grid:
        for r in at_lrs(base, tdir, {seed: {a: 2.0 ** x for a in study.arm_names}}, overrides=overrides):
            points.setdefault(r.meta["arm"], []).append((x, r.spec, dict(r.meta, tune=True)))
            if abs(x) < 1e-12:
                heuristic[r.meta["arm"]] = resolve_hparams(r.spec).lr
    # what `train` refuses is refused before the study folder or the storage is made
    check_specs(plan_runs([(sp, m) for pts in points.values() for _, sp, m in pts], tdir), opts.executor)
    storage = open_storage(opts, tdir, tune.storage)
    cost = grid_cost(study, sum(map(len, points.values())), rung)
    if progress:
        print(f"{study.name} tune: {len(points)} arms x {len(grid)} LR points = {cost['runs']} runs at {rung}"
              + (f", ~{cost['core_seconds']:.0f} core-s" if cost["core_seconds"] else ""), flush=True)
    got, report = run_grid(study, f"{study.name}/{rung}/seed{seed}", points, tdir, opts, storage,
                            label=f"{study.name} tune", progress=progress)
    profiles = {arm: fit_profile([x for x, _ in pts], [y for _, y in pts], grid) for arm, pts in got.items()
                if any(math.isfinite(y) for _, y in pts)}
    missing = {arm: [g for g in grid if not any(abs(g - x) < 1e-9 for x, _ in pts)] for arm, pts in got.items()}
    mult = {arm: p.multiplier for arm, p in profiles.items()}
    res = TuneResult(study.name, rung, seed, grid, profiles, heuristic, mult, report,
                     {a: m for a, m in missing.items() if m})
    atomic_write_json(tdir / "profile.json", res.to_dict())
    if mult:
        atomic_write_json(tdir / "lr_multipliers.json", mult)
    return res
