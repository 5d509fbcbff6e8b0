"""Learning rates as measured quantities (docs/method.md §4.6): the LR grid runs and their quadratic profile in
log2(multiplier of the heuristic LR; the matrix and the Adam group's rates scale together), the optimum flagged
when it lies on (or past) the grid's edge or the profile is not convex; the LR profile every study that varies an
LR-coupled factor runs before its design, per level and per seed (`profile_study`); and `lr_plan`, which gives each
run its LR and provenance. `run --tune`'s per-arm grid is sweeps/tune_arms.py.

Optuna ask-and-tell records the trials (one Optuna study per group, the grid points enqueued), so a re-run
reuses finished trials; its storage is a journal file or an RDB URL, never SQLite on NFS (docs/architecture.md §5)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from marin_ablate.ablations.gb200 import H100
from marin_ablate.ablations.ladders import RUNGS, flops_per_token, params_active
from marin_ablate.analysis.fit.lr_profile import PROFILE_WINDOW, local_window
from marin_ablate.marin.config import Recipe
from marin_ablate.marin.fields import SEED, check_fields, option
from marin_ablate.marin.schema import loads_json
from marin_ablate.sweeps.executors import ExecOptions, validate
from marin_ablate.sweeps.runs import atomic_write_json, plan_runs, read_json, study_dir
from marin_ablate.sweeps.sweep import RunReport, run_planned, study_resources

PARAM = "log2_lr_multiplier"
_NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs")


#: LR points per arm at most: each is one run per arm (a profile needs 3 to 9; 64 is already a sweep).
POINTS_MAX = 64


@dataclass(frozen=True)
class TuneOptions:
    """Instead of the design: the per-arm learning-rate profile at the smallest rung (the multipliers
    `run --tuned` uses)."""

    points: int = option(5, lo=3, hi=POINTS_MAX, help="LR points per arm (log-spaced; a quadratic needs three; each is "
                                                      "one run per arm)")
    span: float = option(4.0, lo=1, lo_open=True, help="multipliers from 1/SPAN to SPAN of the heuristic LR")
    storage: str | None = option(None, metavar="PATH|URL", help="Optuna storage: a journal file path (none: "
                                 "OUT/STUDY/tune/optuna.journal) or an RDB URL")
    rung: str | None = option(None, help="rung to tune at (none: the smallest)")
    seed: int | None = option(None, lo=0, hi=2**64 - 1, allowed=SEED[1], help="seed to tune with (none: the study's "
                                                                                "first)")

    def __post_init__(self) -> None:
        check_fields(self)


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


def fit_profile(x: Sequence[float], loss: Sequence[float], grid: Sequence[float] | None = None,
                window: int | None = None) -> Profile:
    """Quadratic profile in log LR; flags an optimum on the edge of `grid` (default: of x).
    `window`: fit only the `window` finished points centred on the best one (analysis/fit/lr_profile.py
    `local_window`: the far side of an asymmetric curve would bend a single quadratic away from the optimum)."""
    if window is not None:
        x, loss = local_window(x, loss, window)
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


# ---- Storage -------------------------------------------------------------------------------------


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


def check_journal(path: Path) -> None:
    """An Optuna journal read like input before Optuna replays it: every line a JSON object with an integer
    `op_code` Optuna knows, ended by a newline. A torn line (a writer killed mid-append: Optuna then appends the
    next operation onto it and fails with an AttributeError), a damaged one or an unknown operation (Optuna's replay
    asserts "Should not reach.") is refused naming the file, the line and its byte offset."""
    from optuna.storages.journal._storage import JournalOperation  # the operations its replay handles

    known = sorted(int(op) for op in JournalOperation)

    if not path.is_file():
        return
    raw, offset = path.read_bytes(), 0
    for n, line in enumerate(raw.split(b"\n"), start=1):
        end = offset + len(line)
        if end == len(raw) and not line:
            return  # the file ends with its last newline
        torn = end == len(raw)  # the last line has no newline: its write did not finish
        try:
            rec = loads_json(line) if line.strip() else None
        except ValueError:
            rec = None
        op = rec.get("op_code") if isinstance(rec, dict) else None
        if torn or not (isinstance(op, int) and not isinstance(op, bool) and op in known):
            what = ("is torn (no newline at its end: a writer was killed mid-append)" if torn
                    else f"has op_code {op!r}, not an operation of Optuna {optuna_version()} ({known[0]}..{known[-1]})"
                    if isinstance(op, int) and not isinstance(op, bool)
                    else "is not an Optuna journal record (a JSON object with an integer op_code)")
            raise ValueError(f"Optuna journal {path} line {n} (byte {offset}) {what}; allowed values: a journal of "
                             f"complete records: cut the file there (`truncate -s {offset} {path}`) and run again "
                             "(the trials before it are kept)")
        offset = end + 1


def optuna_version() -> str:
    import optuna

    return optuna.__version__


def make_storage(storage: str | None, default_journal: Path) -> Any:
    """A journal file (default, or any path) or an RDB URL; `sqlite:///` on a network FS is refused."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if storage is None or "://" not in storage:
        path = Path(storage) if storage else default_journal
        check_journal(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return JournalStorage(JournalFileBackend(str(path)))
        except Exception as e:  # noqa: BLE001 - a record of a known operation with fields Optuna cannot replay
            why = f"{type(e).__name__}: {e}".splitlines()[0]
            raise ValueError(f"Optuna journal {path} cannot be replayed ({why}); allowed values: a journal Optuna "
                             f"{optuna_version()} wrote: move it aside and run again (its trials run again)") from None
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
        raise ValueError(f"--tune.storage {storage!r} cannot be opened ({why}); allowed values: a journal file path "
                         "(default) or an RDB URL whose driver is installed (e.g. sqlite:///tune.db)") from None


def open_storage(opts: ExecOptions, folder: Path, storage: str | None = None) -> Any:
    """The Optuna storage of a grid whose runs go to `folder` (`make_storage`; default `folder/optuna.journal`),
    opened once the executor's options and the folder are validated (`validate`: nothing is written before);
    a refused `storage` leaves no empty folder behind."""
    new_dirs = [d for d in (folder, *folder.parents) if not d.exists()]  # innermost first
    validate(opts, folder)
    try:
        return make_storage(storage, folder / "optuna.journal")
    except BaseException:
        for d in new_dirs:
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise


def profile_rung(study: Any) -> str:
    """The rung the default LR profile runs at: the one nearest the ladder's geometric-mean compute (the
    C_ref where the report reads its headline), the larger of two equally near (cpu_s64 on the smoke ladder).
    Measured on the four-rung smoke ladder: Hyperball's optimum at cpu_s32 (17.7x the heuristic), carried up
    by the heuristic, over-set its LR at cpu_s256, where AdamW then won; the middle of the ladder makes the
    LR fair where it is read."""
    c = {r.name: math.log(params_active(r.model(), Recipe()) * r.tokens()) for r in study.rungs}
    mid = sum(c.values()) / len(c)
    return min(c, key=lambda n: (round(abs(c[n] - mid), 9), -c[n]))


def run_grid(study: Any, key: str, points: dict[str, list[tuple[float, Any, dict]]], tdir: Path, opts: ExecOptions,
              storage: Any, *, label: str, progress: bool) -> tuple[dict[str, list[tuple[float, float]]], RunReport]:
    """Run every (log2 multiplier, spec, meta) of every group of `study`'s runs (its rungs give their job
    shape and the progress line's prior); Optuna ask-and-tell records them, one Optuna study per group
    named `key/group`, so a re-run reuses finished trials. Returns per group the (x, eval loss) of its
    finished points (inf for a failed one) and the run report."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    xs_all = [x for pts in points.values() for x, _, _ in pts]
    dist = optuna.distributions.FloatDistribution(min(xs_all), max(xs_all))
    specs = [(spec, dict(meta, group=g, lr_multiplier=2.0 ** x, log2_lr_multiplier=x))
             for g, pts in points.items() for x, spec, meta in pts]
    runs = plan_runs(specs, tdir)

    # ask: reuse a trial already holding a grid point
    trials: dict[str, int] = {}  # run_id -> trial number
    ostudies = {}
    for r in runs:
        g, x = r.meta["group"], r.meta["log2_lr_multiplier"]
        if g not in ostudies:
            ostudies[g] = optuna.create_study(study_name=f"{key}/{g}", storage=storage, direction="minimize",
                                              load_if_exists=True)
        os_ = ostudies[g]
        found = [t for t in os_.get_trials(deepcopy=False) if abs(t.params.get(PARAM, math.inf) - x) < 1e-9]
        if found:
            trials[r.run_id] = found[-1].number
            continue
        os_.enqueue_trial({PARAM: x}, user_attrs={"run_id": r.run_id})
        t = os_.ask({PARAM: dist})
        t.set_user_attr("run_id", r.run_id)
        trials[r.run_id] = t.number

    rung_rows = study.describe()["rungs"]
    report = run_planned(runs, tdir, opts, resources=study_resources(study), label=label, progress=progress,
                         rung_rows=rung_rows)

    # tell: the finished runs' eval loss; failed runs as FAIL
    by_number = {g: {t.number: t for t in os_.get_trials(deepcopy=False)} for g, os_ in ostudies.items()}
    for r in runs:
        os_ = ostudies[r.meta["group"]]
        t = by_number[r.meta["group"]][trials[r.run_id]]
        if t.state.is_finished():
            continue
        summary = read_json(r.dir / "summary.json") or {}
        if summary.get("status") == "completed" and summary.get("eval_macro_loss") is not None:
            os_.tell(trials[r.run_id], float(summary["eval_macro_loss"]))
        elif summary.get("status") == "failed":
            os_.tell(trials[r.run_id], state=TrialState.FAIL)

    out: dict[str, list[tuple[float, float]]] = {}
    for g, os_ in ostudies.items():
        grid = [x for x, _, _ in points[g]]
        got = []
        for t in os_.get_trials(deepcopy=False):
            x = t.params.get(PARAM)
            if x is None or not any(abs(x - v) < 1e-9 for v in grid):
                continue
            if t.state == TrialState.COMPLETE:
                got.append((x, float(t.value)))
            elif t.state == TrialState.FAIL:
                got.append((x, math.inf))  # diverged / failed: excluded from the fit, kept in the record
        out[g] = got
    return out, report


def grid_cost(study: Any, n_runs: int, rung: str) -> dict:
    """Runs and core-seconds of n_runs runs at `rung` (the rung's own wall-time assumption)."""
    est = (next((x for x in study.rungs if x.name == rung), None) or RUNGS[rung]).est_wall_s()
    return {"runs": n_runs, "rung": rung, "core_seconds": None if est is None else n_runs * est}


# ---- The profile every study that varies an LR-coupled factor runs before its design -------------

PROFILE_FILE = "lr_profile.json"


@dataclass(frozen=True)
class ProfileOptions:
    """The LR profile before a study's design (docs/method.md §4.6): per level of each LR-coupled
    factor, `points` multipliers from 1/span to span at `profile_rung` (the ladder's middle); an optimum on an edge adds
    `extend` points beyond it, at most `max_extensions` times, then the study is refused."""

    points: int = 5
    span: float = 4.0
    extend: int = 2
    max_extensions: int = 2

    def __post_init__(self) -> None:
        TuneOptions(points=self.points, span=self.span)  # the same checks as `run --tune`'s grid
        for k in ("extend", "max_extensions"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < (1 if k == "extend" else 0):
                raise ValueError(f"ProfileOptions.{k}={v!r}; allowed values: an integer >= {1 if k == 'extend' else 0}")

    def max_runs(self, n_groups: int) -> int:
        return n_groups * (self.points + self.extend * self.max_extensions)


@dataclass
class LRProfile:
    """Per seed and per level of each LR-coupled factor: its fitted LR multiplier (interior optimum); the
    optimum pooled over the seeds with its interval; where it came from."""

    study: str
    rung: str
    seeds: tuple[int, ...]
    multipliers: dict[int, dict[str, dict[str, float]]]  # seed -> factor -> level -> multiplier
    profiles: dict[str, Profile]  # "factor=level at seed s" -> its profile
    grids: dict[str, list[float]]
    created: str  # UTC date the multipliers were first fitted
    pooled: dict[str, dict] = field(default_factory=dict)  # "factor=level" -> analysis.fit.lr_profile.optimum_interval
    path: Path | None = None
    extensions: int = 0
    report: RunReport | None = None

    def provenance(self) -> dict:
        """What each design run's meta.json records about its LR (analysis/report/writer.py shows it)."""
        return {"lr_source": "profile", "lr_profile": str(self.path) if self.path else None,
                "lr_profile_date": self.created}

    def to_dict(self) -> dict:
        return {"study": self.study, "rung": self.rung, "seeds": list(self.seeds), "created": self.created,
                "multipliers": {str(s): m for s, m in self.multipliers.items()}, "extensions": self.extensions,
                "pooled": self.pooled,
                "profiles": {g: {"x": list(p.x), "loss": list(p.loss), "coef": p.coef, "x_opt": p.x_opt,
                                 "edge": p.edge, "note": p.reason, "grid_log2": self.grids[g]}
                             for g, p in self.profiles.items()}}


def seed_key(group: str, seed: int) -> str:
    """The key of one level's profile at one seed ("optimizer=hyperball at seed 1")."""
    return f"{group} at seed {seed}"


def profile_dir(out: str | Path, study_name: str) -> Path:
    return study_dir(out, study_name) / "profile"


def profile_groups(study: Any) -> dict[str, dict[str, str]]:
    """"factor=level" -> the levels of the arm it is profiled on: the baseline arm with that one factor set."""
    return {f"{f.name}={lv}": study.baseline_levels(**{f.name: lv}) for f in study.lr_coupled for lv in f.level_names}


def profile_points(study: Any, group: str, levels: dict[str, str], grid: list[float], rung: str, seed: int,
                   overrides: Sequence[str] = ()) -> list[tuple[float, Any, dict]]:
    """The (log2 multiplier, spec, meta) of each point of `grid` for one group ("factor=level" and its arm's
    levels, `profile_groups`), at `rung` and `seed`, with the `--section.field=value` overrides applied."""
    return [(x, study.spec(rung, levels, seed, 2.0 ** x).with_overrides(overrides),
             dict(study.meta(rung, group, seed, None, levels), profile=True)) for x in grid]


def _extended(grid: list[float], p: Profile, n: int) -> list[float]:
    """`grid` with n more points (its own step) beyond the edge the optimum leans on (both when centred)."""
    step = grid[1] - grid[0]
    lo, hi = grid[0], grid[-1]
    a = p.coef[0] if p.coef else 0.0
    x_star = -p.coef[1] / (2 * a) if p.coef and a > 0 else p.x[int(np.argmin(p.loss))]
    mid = 0.5 * (lo + hi)
    up = [hi + step * (k + 1) for k in range(n)]
    down = [lo - step * (k + 1) for k in range(n)]
    new = up if x_star > mid + 1e-12 else down if x_star < mid - 1e-12 else up[:1] + down[:1]
    return sorted(float(round(v, 12)) for v in grid + new)


def profile_loop(groups: Sequence[str], popts: ProfileOptions, run_points: Any, study_name: str,
                 where: Path | str = "") -> tuple[dict[str, Profile], dict[str, list[float]], int]:
    """Run each group's grid (`run_points(grids)` -> {group: [(x, loss)]}), fit it (a quadratic on the best
    point and its two neighbours, analysis/fit/lr_profile.py PROFILE_WINDOW), and extend the grid of every
    group whose optimum is on an edge, at most `max_extensions` times; then ValueError naming the group and
    its grid. Returns (profiles, grids, extensions)."""
    grids = {g: lr_grid(popts.points, popts.span) for g in groups}
    n_ext = 0
    while True:
        got = run_points(grids)
        profiles = {}
        for g in groups:
            fin = [(x, y) for x, y in got.get(g, []) if math.isfinite(y)]
            done = {x for x, _ in fin}
            bad = [x for x in grids[g] if not any(abs(x - d) < 1e-9 for d in done)]
            if bad:
                raise ValueError(f"LR profile of {g}: log2 multipliers {bad} have no finished run (see "
                                 f"{where}); run again to resume, or --no-profile to use the heuristic")
            profiles[g] = fit_profile([x for x, _ in fin], [y for _, y in fin], grids[g], window=PROFILE_WINDOW)
        edge = [g for g in groups if profiles[g].edge]
        if not edge:
            return profiles, grids, n_ext
        if n_ext >= popts.max_extensions:
            g = edge[0]
            raise ValueError(f"LR profile of {g}: {profiles[g].reason} after {n_ext} extension(s) of the grid "
                             f"(log2 multipliers {grids[g]}); the heuristic LR is far off for this level: run "
                             f"`marin-ablate run {study_name} --tune --tune.span S` with a wider span")
        for g in edge:
            grids[g] = _extended(grids[g], profiles[g], popts.extend)
        n_ext += 1


def profile_study(study: Any, out: str | Path, opts: ExecOptions, popts: ProfileOptions = ProfileOptions(),
                  overrides: Sequence[str] = (), progress: bool = True) -> LRProfile:
    """The LR profile a study runs before its design, at every seed (each seed is a full replication: its design
    uses its own profile's optimum, so the profile's noise is in the component x seed scatter the intervals rest
    on, docs/method.md §4.4, §4.6): `profile_loop` over real, resumable runs in `<study>/profile/`, and per level
    the optimum pooled over the seeds with its interval, recorded in PROFILE_FILE with the date it was fitted."""
    from marin_ablate.analysis.fit.lr_profile import optimum_interval

    groups = profile_groups(study)
    if not groups:
        raise ValueError(f"study {study.name!r} varies no LR-coupled factor: nothing to profile")
    pdir = profile_dir(out, study.name)
    storage = open_storage(opts, pdir)
    rung = profile_rung(study)
    seeds = tuple(study.seeds)
    keys = {seed_key(g, s): (g, s) for s in seeds for g in groups}
    report: list[RunReport] = []

    def run_points(grids: dict[str, list[float]]) -> dict[str, list[tuple[float, float]]]:
        points = {k: profile_points(study, g, groups[g], grids[k], rung, s, overrides)
                  for k, (g, s) in keys.items() if k in grids}
        got, rep = run_grid(study, f"{study.name}/profile/{rung}", points, pdir, opts, storage,
                             label=f"{study.name} LR profile", progress=progress)
        report.append(rep)
        return got

    profiles, grids, n_ext = profile_loop(list(keys), popts, run_points, f"{study.name}", pdir)
    mult: dict[int, dict[str, dict[str, float]]] = {s: {} for s in seeds}
    for k, p in profiles.items():
        g, s = keys[k]
        f, lv = g.split("=", 1)
        mult[s].setdefault(f, {})[lv] = float(p.multiplier)
    # the points each seed's own quadratic used, pooled: the optimum as a measured quantity
    pooled = {g: optimum_interval({s: list(zip(profiles[seed_key(g, s)].x, profiles[seed_key(g, s)].loss,
                                                   strict=True)) for s in seeds}) for g in groups}
    path = pdir / PROFILE_FILE
    old = read_json(path) or {}
    same = old.get("multipliers") == {str(s): m for s, m in mult.items()}
    created = old.get("created") if same and old.get("created") else datetime.now(timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")
    res = LRProfile(study.name, rung, seeds, mult, profiles, grids, created, pooled, path, n_ext, report[-1])
    atomic_write_json(path, res.to_dict())
    return res


def profile_multipliers(got: dict, seeds: Sequence[int]) -> dict[int, dict[str, dict[str, float]]] | None:
    """{seed: {factor: {level: multiplier}}} of an lr_profile.json for `seeds`; None when it lacks one of them.
    A file written before profiles were per seed (one {factor: {level: m}}) is refused: None."""
    if "seeds" not in got:
        return None
    per = {int(s): m for s, m in (got.get("multipliers") or {}).items()}
    return {s: per[s] for s in seeds} if all(s in per for s in seeds) else None


def read_profile(out: str | Path, study_name: str) -> dict | None:
    """The lr_profile.json a study's profile wrote, else None."""
    return read_json(profile_dir(out, study_name) / PROFILE_FILE)


#: The LR profile never runs at full scale: a study whose profile rung trains more than this many FLOPs per run
#: takes Marin's fitted heuristic LRs (marin.hparams, the August refit its hero used) and says so. 1e21 is about
#: the d2048 fast-ladder rung (~5e20); the hero ladder's hero_d2048 (~7e21) and the hero (~2.6e24) are above it.
PROFILE_MAX_RUN_FLOPS = 1e21
#: ... nor at cluster scale: the profile's worst case (every grid extension run, `ProfileOptions.max_runs`) may
#: spend at most this many GPU-hours at the study's assumed MFU. marin535's profile (d768, 18 runs x 8 GPUs) is
#: ~54 and noise's ~39 H100-hours; hero_rack's would be ~294 and hero_2rack's ~588 GB200-hours (128 GPUs a run).
PROFILE_MAX_GPU_HOURS = 100.0


def _profile_gpu_hours(study: Any, rung: Any, flops: float, n_runs: int) -> float:
    """GPU-hours of `n_runs` profile runs of `flops` each at the study's hardware assumption (the hero's GB200,
    a GPU study's own, H100 for a GPU rung of a study that names none); 0 for a CPU rung."""
    hw = study.hardware or getattr(getattr(study, "hero", None), "hardware", None) or (H100 if rung.gpus else None)
    return 0.0 if hw is None or not rung.gpus else n_runs * hw.gpu_hours(flops)


def profile_skipped(study: Any, popts: ProfileOptions = ProfileOptions()) -> str | None:
    """Why the LR profile of `study` is not run, else None; the study then trains every arm at the heuristic's
    LRs. The one place that decides (docs/method.md §4.6), each reason that holds named: no LR-coupled factor
    varies across the design's arms (a single-run study, e.g. the hero and its smoke runs: no levels to make
    fair), the profile rung above PROFILE_MAX_RUN_FLOPS per run, or the profile's worst case above
    PROFILE_MAX_GPU_HOURS."""
    groups = profile_groups(study)
    if not groups:
        return None
    why = []
    rows = range(study.design.n_runs)
    fixed = {f.name: sorted({study.levels(i)[f.name] for i in rows}) for f in study.lr_coupled}
    if all(len(v) == 1 for v in fixed.values()):
        held = ", ".join(f"{f}={v[0]}" for f, v in fixed.items())
        why.append(f"no LR-coupled factor varies across its {study.design.n_runs} arm(s) ({held} in every arm): "
                   "no levels to make fair")
    name = profile_rung(study)
    r = next(x for x in study.rungs if x.name == name)
    flops = flops_per_token(r.model(), Recipe()) * r.tokens()
    if flops > PROFILE_MAX_RUN_FLOPS:
        why.append(f"its profile rung {name} trains {flops:.2e} FLOPs per run, above PROFILE_MAX_RUN_FLOPS="
                   f"{PROFILE_MAX_RUN_FLOPS:.0e}")
    n = popts.max_runs(len(groups) * len(study.seeds))
    gpuh = _profile_gpu_hours(study, r, flops, n)
    if gpuh > PROFILE_MAX_GPU_HOURS:
        why.append(f"its profile (up to {n} runs of {r.gpus} GPUs at {name}) would take {gpuh:,.0f} GPU-hours, above "
                   f"PROFILE_MAX_GPU_HOURS={PROFILE_MAX_GPU_HOURS:g}")
    if not why:
        return None
    return "; ".join(why) + ": every arm at Marin's fitted heuristic LRs (marin.hparams)"


def tune_dir(out: str | Path, study_name: str) -> Path:
    return study_dir(out, study_name) / "tune"


def tuned_multipliers(out: str | Path, study_name: str) -> dict[str, float]:
    """The per-arm LR multipliers `run --tune` wrote (ValueError when it has not run)."""
    path = tune_dir(out, study_name) / "lr_multipliers.json"
    if not path.exists():
        raise ValueError(f"--tuned: {str(path)!r} does not exist; run `marin-ablate run {study_name} --tune` first")
    got = read_json(path)
    try:
        mult = {str(k): float(v) for k, v in (got or {}).items()} if got else _damaged(path)
    except (TypeError, ValueError):
        return _damaged(path)
    bad = {k: v for k, v in mult.items() if not (math.isfinite(v) and v > 0)}
    if bad:
        k, v = next(iter(bad.items()))
        raise ValueError(f"--tuned: {str(path)!r} gives arm {k!r} the multiplier {v}; allowed values: a finite "
                         "number > 0 (run `marin-ablate run STUDY --tune` again to rewrite it)")
    return mult


def _damaged(path: Path) -> dict:
    raise ValueError(f"--tuned: {str(path)!r} is damaged (not a JSON object of arm -> multiplier); "
                     "run `marin-ablate run STUDY --tune` again to rewrite it")


def lr_plan(study: Any, out: str | Path, opts: ExecOptions | None, *, tuned: bool = False, profile: bool = True,
            overrides: Sequence[str] = (), progress: bool = True) -> tuple[dict | None, dict]:
    """(LR multipliers {seed: {arm: multiplier}} or None, provenance for each run's meta.json): `run --tune`'s per-arm
    multipliers at every seed (tuned), the profile of each LR-coupled factor's levels at each seed (run now when
    `opts` is given, else read from its file; a file without every seed of the study counts as none), or the
    heuristic (no LR-coupled factor, profile=False, or a profile `profile_skipped` refuses: the provenance then says
    why, `lr_profile_skipped`)."""
    if tuned:
        mult = tuned_multipliers(out, study.name)
        path = tune_dir(out, study.name) / "lr_multipliers.json"
        date = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return {s: mult for s in study.seeds}, {"lr_source": "tuned", "lr_profile": str(path), "lr_profile_date": date}
    skipped = profile_skipped(study) if profile else None
    if skipped:
        return None, {"lr_source": "heuristic", "lr_profile_skipped": skipped}
    if profile and profile_groups(study):  # the levels of its LR-coupled factors: what `profile_study` runs
        if opts is not None:
            res = profile_study(study, out, opts, overrides=overrides, progress=progress)
            return {s: study.arm_multipliers(m) for s, m in res.multipliers.items()}, res.provenance()
        got = read_profile(out, study.name)
        per = profile_multipliers(got, study.seeds) if got is not None else None
        if per is not None:
            return {s: study.arm_multipliers(m) for s, m in per.items()}, {
                "lr_source": "profile", "lr_profile": str(profile_dir(out, study.name) / PROFILE_FILE),
                "lr_profile_date": got.get("created")}
    return None, {"lr_source": "heuristic"}


def profile_cost(study: Any, popts: ProfileOptions = ProfileOptions()) -> dict | None:
    """The profile's runs and core-seconds before the design (`plan`): every level's grid at every seed;
    None without an LR-coupled factor or when `profile_skipped` refuses it."""
    groups = profile_groups(study)
    if not groups or profile_skipped(study):
        return None
    rung = profile_rung(study)
    n = len(groups) * len(study.seeds)
    c = grid_cost(study, n * popts.points, rung)
    c["max_runs"] = popts.max_runs(n)
    c["groups"] = list(groups)
    c["seeds"] = list(study.seeds)
    return c
