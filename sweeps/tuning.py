"""Per-arm learning-rate tuning (docs/method.md §4.6): each arm gets its own LR at the smallest rung.

For every arm, a few log-spaced multipliers of the heuristic LR (both the matrix and the Adam
group's rate scale together) are run at the smallest rung; the eval loss is profiled by a
quadratic in log2(multiplier); the fitted optimum is reported, flagged when it lies on (or past)
the grid's edge or the profile is not convex. The multiplier is carried up the ladder by the
heuristic (`Study.runs(lr_multipliers=...)`, `marin-ablate run --tuned`).

Optuna ask-and-tell records the trials: one Optuna study per arm, the grid points enqueued, so a
re-run of `tune` reuses finished trials. Storage: a journal file (`JournalFileBackend`, safe on
shared filesystems) by default, or an RDB URL; SQLite on NFS is refused (its locking is unsafe there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from marin.hparams import resolve_hparams
from sweeps.executors import ExecOptions, validate
from sweeps.runs import atomic_write_json, plan_runs, read_json, study_dir
from sweeps.sweep import RunReport, apply_spec_overrides, check_specs, run_planned, study_resources

PARAM = "log2_lr_multiplier"
_NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs")


@dataclass(frozen=True)
class TuneOptions:
    points: int = 5
    span: float = 4.0  # multipliers from 1/span to span
    storage: str | None = None  # None: journal file <study_dir>/tune/optuna.journal; else a journal path or RDB URL
    rung: str | None = None  # None: the study's smallest rung
    seed: int | None = None  # None: the study's first seed

    def __post_init__(self) -> None:
        if not isinstance(self.points, int) or self.points < 3:
            raise ValueError(f"points={self.points!r} must be an integer >= 3 (a quadratic needs three)")
        if not (math.isfinite(self.span) and self.span > 1.0):
            raise ValueError(f"span={self.span!r} must be > 1 (multipliers 1/span .. span)")


def lr_grid(points: int, span: float) -> list[float]:
    """log2 multipliers, evenly spaced in [-log2 span, log2 span] (0 = the heuristic's LR)."""
    h = math.log2(span)
    return [float(x) for x in np.round(np.linspace(-h, h, points), 12)]


@dataclass(frozen=True)
class Profile:
    """A quadratic loss(x) = a x^2 + b x + c in x = log2(LR multiplier) through the finished points."""

    x: tuple[float, ...]
    loss: tuple[float, ...]
    coef: tuple[float, float, float] | None  # (a, b, c)
    x_opt: float  # the fitted optimum, clipped to the grid; the best point when the fit is unusable
    loss_opt: float
    edge: bool  # the optimum sits on/past the grid's edge, or the profile is not convex
    reason: str

    @property
    def multiplier(self) -> float:
        return 2.0 ** self.x_opt


def fit_profile(x: Sequence[float], loss: Sequence[float], grid: Sequence[float] | None = None) -> Profile:
    """Quadratic profile in log LR; flags an optimum on the edge of `grid` (default: of x)."""
    xs = np.asarray(x, float)
    ys = np.asarray(loss, float)
    ok = np.isfinite(ys)
    xs, ys = xs[ok], ys[ok]
    if len(xs) == 0:
        raise ValueError("fit_profile: no finished points (every LR failed or is missing)")
    lo, hi = (min(grid), max(grid)) if grid is not None else (float(xs.min()), float(xs.max()))
    i_best = int(np.argmin(ys))
    best_x, best_y = float(xs[i_best]), float(ys[i_best])
    best_on_edge = best_x <= lo + 1e-12 or best_x >= hi - 1e-12
    if len(xs) < 3:
        return Profile(tuple(xs), tuple(ys), None, best_x, best_y, True,
                       f"only {len(xs)} finished point(s): no quadratic; best point reported")
    a, b, c = (float(v) for v in np.polyfit(xs, ys, 2))
    if a <= 0:
        return Profile(tuple(xs), tuple(ys), (a, b, c), best_x, best_y, True,
                       "profile not convex (a <= 0): best point reported; widen the grid")
    x_star = -b / (2 * a)
    if x_star <= lo or x_star >= hi or best_on_edge:
        xc = min(max(x_star, lo), hi)
        return Profile(tuple(xs), tuple(ys), (a, b, c), xc, float(a * xc * xc + b * xc + c), True,
                       f"optimum on the grid's edge (fitted log2 multiplier {x_star:.3f}, grid [{lo:g}, {hi:g}]); "
                       "widen the grid")
    return Profile(tuple(xs), tuple(ys), (a, b, c), x_star, float(a * x_star * x_star + b * x_star + c), False,
                   "interior optimum")


# ---------------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------------


def _fs_type(path: Path) -> str:
    """Filesystem type of the mount holding `path` (from /proc/mounts; '' when unknown)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return ""
    p = str(path.resolve())
    best, fstype = "", ""
    for m in mounts:
        if len(m) >= 3 and (p == m[1] or p.startswith(m[1].rstrip("/") + "/")) and len(m[1]) >= len(best):
            best, fstype = m[1], m[2]
    return fstype


def make_storage(storage: str | None, default_journal: Path) -> Any:
    """A journal file (default, or any path) or an RDB URL; `sqlite:///` on a network FS is refused."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if storage is None or "://" not in storage:
        path = Path(storage) if storage else default_journal
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if storage.startswith("sqlite"):
        db = Path(storage.split(":///", 1)[-1])
        fs = _fs_type(db.parent if db.parent.exists() else Path.cwd())
        if fs.startswith(_NETWORK_FS):
            raise ValueError(f"storage={storage!r}: SQLite on a network filesystem ({fs}) is unsafe; "
                             "allowed values: a journal file path (default) or a server RDB URL")
    try:
        return optuna.storages.RDBStorage(storage)
    except Exception as e:  # noqa: BLE001 - SQLAlchemy and the DB drivers raise many types (no driver, bad URL)
        why = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ValueError(f"--storage {storage!r} cannot be opened ({why}); allowed values: a journal file path "
                         "(default) or an RDB URL whose driver is installed (e.g. sqlite:///tune.db)") from None


# ---------------------------------------------------------------------------------------------
# Tuning a study
# ---------------------------------------------------------------------------------------------


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
        out = []
        for arm, p in self.profiles.items():
            lr0 = self.heuristic_lr.get(arm)
            out.append({"arm": arm, "points": len(p.x), "best_grid_multiplier": 2.0 ** p.x[int(np.argmin(p.loss))],
                        "multiplier": p.multiplier, "lr": lr0 * p.multiplier if lr0 else None,
                        "loss_opt": p.loss_opt, "edge": p.edge, "note": p.reason})
        return out

    def to_dict(self) -> dict:
        return {"study": self.study, "rung": self.rung, "seed": self.seed, "grid_log2": self.grid,
                "multipliers": self.multipliers, "rows": self.rows(),
                "profiles": {a: {"x": list(p.x), "loss": list(p.loss), "coef": p.coef} for a, p in self.profiles.items()},
                "missing": self.missing}


def smallest_rung(study: Any) -> str:
    from ablations.ladders import params_active
    from marin.config import Recipe

    return min(study.rungs, key=lambda r: params_active(r.model(), Recipe())).name


def tune_dir(out: str | Path, study_name: str) -> Path:
    return study_dir(out, study_name) / "tune"


def tuned_multipliers(out: str | Path, study_name: str) -> dict[str, float]:
    """The per-arm LR multipliers `tune` wrote (ValueError when it has not run)."""
    path = tune_dir(out, study_name) / "lr_multipliers.json"
    if not path.exists():
        raise ValueError(f"--tuned: {str(path)!r} does not exist; run `marin-ablate tune {study_name}` first")
    got = read_json(path)
    try:
        mult = {str(k): float(v) for k, v in (got or {}).items()} if got else _damaged(path)
    except (TypeError, ValueError):
        return _damaged(path)
    bad = {k: v for k, v in mult.items() if not (math.isfinite(v) and v > 0)}
    if bad:
        k, v = next(iter(bad.items()))
        raise ValueError(f"--tuned: {str(path)!r} gives arm {k!r} the multiplier {v}; allowed values: a finite "
                         "number > 0 (run `marin-ablate tune` again to rewrite it)")
    return mult


def _damaged(path: Path) -> dict:
    raise ValueError(f"--tuned: {str(path)!r} is damaged (not a JSON object of arm -> multiplier); "
                     "run `marin-ablate tune` again to rewrite it")


def tune_study(study: Any, out: str | Path, opts: ExecOptions, tune: TuneOptions = TuneOptions(),
               overrides: Sequence[str] = (), progress: bool = True) -> TuneResult:
    """Run the LR grid of every arm at the smallest rung, tell Optuna, fit the profiles."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tdir = tune_dir(out, study.name)
    rung = tune.rung or smallest_rung(study)
    seed = tune.seed if tune.seed is not None else study.seeds[0]
    if seed not in study.seeds:
        raise ValueError(f"seed={seed} is not a seed of study {study.name!r}; allowed values: {list(study.seeds)}")
    grid = lr_grid(tune.points, tune.span)
    lo, hi = grid[0], grid[-1]
    dist = optuna.distributions.FloatDistribution(lo, hi)

    # the runs: every arm at every grid multiplier
    specs: list[tuple[Any, dict]] = []
    for x in grid:
        for spec, meta in study.runs(lr_multipliers={a: 2.0 ** x for a in study.arm_names}, rungs=[rung]):
            if meta["seed"] != seed:
                continue
            if overrides:
                spec = apply_spec_overrides(spec, overrides)
            specs.append((spec, dict(meta, lr_multiplier=2.0 ** x, log2_lr_multiplier=x, tune=True)))
    runs = plan_runs(specs, tdir)
    check_specs(runs, opts.executor)  # before the study folder or the storage is made
    new_dirs = [d for d in (Path(out), tdir.parent, tdir) if not d.exists()]
    validate(opts, tdir)
    try:
        storage = make_storage(tune.storage, tdir / "optuna.journal")
    except BaseException:
        for d in reversed(new_dirs):  # a refused --storage leaves no empty study folder behind
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
    heuristic = {r.meta["arm"]: resolve_hparams(r.spec).lr for r in runs if abs(r.meta["log2_lr_multiplier"]) < 1e-12}

    # ask: one Optuna study per arm; reuse a trial already holding a grid point
    trials: dict[str, int] = {}  # run_id -> trial number
    ostudies = {}
    for r in runs:
        arm, x = r.meta["arm"], r.meta["log2_lr_multiplier"]
        if arm not in ostudies:
            ostudies[arm] = optuna.create_study(study_name=f"{study.name}/{rung}/seed{seed}/{arm}", storage=storage,
                                                direction="minimize", load_if_exists=True)
        os_ = ostudies[arm]
        found = [t for t in os_.get_trials(deepcopy=False) if abs(t.params.get(PARAM, math.inf) - x) < 1e-9]
        if found:
            trials[r.run_id] = found[-1].number
            continue
        os_.enqueue_trial({PARAM: x}, user_attrs={"run_id": r.run_id})
        t = os_.ask({PARAM: dist})
        t.set_user_attr("run_id", r.run_id)
        trials[r.run_id] = t.number

    report = run_planned(runs, tdir, opts, resources=study_resources(study), label=f"{study.name} tune",
                         progress=progress)

    # tell: the finished runs' eval loss; failed runs as FAIL
    from optuna.trial import TrialState

    by_number = {arm: {t.number: t for t in os_.get_trials(deepcopy=False)} for arm, os_ in ostudies.items()}
    for r in runs:
        os_ = ostudies[r.meta["arm"]]
        t = by_number[r.meta["arm"]][trials[r.run_id]]
        if t.state.is_finished():
            continue
        summary = read_json(r.dir / "summary.json") or {}
        if summary.get("status") == "completed" and summary.get("eval_macro_loss") is not None:
            os_.tell(trials[r.run_id], float(summary["eval_macro_loss"]))
        elif summary.get("status") == "failed":
            os_.tell(trials[r.run_id], state=TrialState.FAIL)

    profiles, missing, mult = {}, {}, {}
    for arm, os_ in ostudies.items():
        xs, ys = [], []
        for t in os_.get_trials(deepcopy=False):
            x = t.params.get(PARAM)
            if x is None or not any(abs(x - g) < 1e-9 for g in grid):
                continue
            if t.state == TrialState.COMPLETE:
                xs.append(x)
                ys.append(t.value)
            elif t.state == TrialState.FAIL:
                xs.append(x)
                ys.append(math.inf)  # diverged / failed: excluded from the fit, kept in the record
        done = {x for x, y in zip(xs, ys)}
        missing[arm] = [g for g in grid if not any(abs(g - d) < 1e-9 for d in done)]
        if any(math.isfinite(y) for y in ys):
            p = fit_profile(xs, ys, grid)
            profiles[arm] = p
            mult[arm] = p.multiplier
    res = TuneResult(study.name, rung, seed, grid, profiles, heuristic, mult, report,
                     {a: m for a, m in missing.items() if m})
    atomic_write_json(tdir / "profile.json", res.to_dict())
    if mult:
        atomic_write_json(tdir / "lr_multipliers.json", mult)
    return res
