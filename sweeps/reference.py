"""The baseline arm's wide ladder that pins a study's reference law (docs/method.md §4.1; analysis/fit/reflaw.py).
Run once per machine and configuration: its runs and fit live in the user's cache (`cache_root()/<key>/`, key a
hash of the ladder's run ids, so anything that changes a run gives a new ladder), resumable; each study that uses
it gets a copy of the fit. The ladder runs the study's baseline levels at the heuristic LR on `reference_seeds`:
the law is the baseline recipe's, and a study refits A on its own all-off arm (its own seed and profiled LR)."""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from marin_ablate.ablations.ladders import ladder
from marin_ablate.ablations.study import Study
from marin_ablate.analysis.fit.reflaw import LAW_FILE, PinnedLaw, check_pinned, fit_reference, published
from marin_ablate.planning.costmodel import cache_dir
from marin_ablate.sweeps.executors import ExecOptions
from marin_ablate.sweeps.runs import atomic_write_json, plan_runs, read_json
from marin_ablate.sweeps.state import survey
from marin_ablate.sweeps.sweep import run_planned, study_resources
from marin_ablate.sweeps.tuning import profile_cost, profile_skipped, read_profile

REFERENCE_SEED = 0


def cache_root() -> Path:
    return cache_dir("reference_law")


def reference_specs(study: Any, overrides: Sequence[str] = ()) -> list[tuple[Any, dict]]:
    """(spec, meta) of the baseline arm at each of `study.reference_rungs` and `reference_seeds`, heuristic LR."""
    lv = study.baseline_levels()
    seeds = tuple(getattr(study, "reference_seeds", (REFERENCE_SEED,)))
    ladder_study = Study(f"{study.name}_reference", "", study.factors, study.design, study.reference_rungs,
                         seeds, study.data, study.base_recipe, study.executor, study.hardware, study.vary_data_seed)
    out = [(ladder_study.spec(r, lv, seed).with_overrides(overrides),
            dict(ladder_study.meta(r.name, "baseline", seed, None, lv), reference=True))
           for r in ladder_study.rungs for seed in seeds]
    if len({(s.train.steps, s.train.batch_size, s.model.d_model) for s, _ in out}) < len(ladder_study.rungs):
        raise ValueError(f"the overrides {' '.join(overrides)} make the baseline ladder's rungs "
                         f"({', '.join(study.reference_rungs)}) the same run; allowed: overrides that keep their "
                         "steps apart, or --no-pin")
    return out


def _wait_for_others(runs: list, poll_s: float = 5.0, limit_s: float = 4 * 3600.0) -> None:
    """Another study's `run` may be measuring the same cached ladder: wait while it holds some runs."""
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if not any(st.state in ("running", "queued") for st in survey(r.dir for r in runs)):
            return
        time.sleep(poll_s)


def reference_key(specs: list[tuple[Any, dict]]) -> str:
    return hashlib.sha256(",".join(sorted(s.run_id for s, _ in specs)).encode()).hexdigest()[:16]


def pin_reference_law(study: Any, sdir: Path, opts: ExecOptions, overrides: Sequence[str] = (),
                      progress: bool = True) -> PinnedLaw | str:
    """Run (or reuse) the baseline ladder, fit and cache its law, copy it to `sdir/reference_law.json`;
    a ladder whose fit cannot pin the law (analysis/fit/reflaw.py `fit_reference`) returns the reason as a
    line, and the study's analysis fits the law on its own rungs."""
    specs = reference_specs(study, overrides)
    key = reference_key(specs)
    cdir = cache_root() / key
    cached = read_json(cdir / LAW_FILE, strict=True)  # damaged: refused naming it (DamagedFile), not refitted
    if cached is not None and not cached.get("valley"):  # the former straight-ellipse fit: refit on its runs
        cached = None
    if cached is None:
        runs = plan_runs(specs, cdir)
        run_planned(runs, cdir, opts, resources=study_resources(study), label=f"{study.name} reference law",
                    progress=progress)
        _wait_for_others(runs)
        C, L, seeds, bad = [], [], [], []
        for r in runs:
            s = read_json(r.dir / "summary.json") or {}
            if s.get("status") == "completed" and s.get("eval_macro_loss") is not None:
                C.append(float(s["train_flops"]))
                L.append(float(s["eval_macro_loss"]))
                seeds.append(int(r.meta["seed"]))
            else:
                bad.append(r.meta["rung"])
        if bad:
            raise ValueError(f"reference law: the baseline ladder's run(s) at {', '.join(bad)} did not complete "
                             f"(see {cdir / 'runs'}); run again to resume, or --no-pin to fit the law on the design")
        try:
            law = fit_reference(C, L, seeds=seeds, key=key,
                                created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
        except ValueError as e:
            (sdir / LAW_FILE).unlink(missing_ok=True)
            return f"{e} (runs in {cdir / 'runs'}); the analysis fits the law on the design's rungs"
        law = PinnedLaw(**{**law.__dict__, "source": str(cdir / LAW_FILE)})
        atomic_write_json(cdir / LAW_FILE, law.to_dict())
    else:  # a cached file is read like input: a tampered or foreign one is refused, never copied into the study
        law = check_pinned(cached, str(cdir / LAW_FILE), key=key)
    sdir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(sdir / LAW_FILE, {**law.to_dict(), "study": study.name})  # `analyze` checks whose it is
    return law


def pin_published(study: Any, sdir: Path) -> PinnedLaw:
    """Copy a study's published law (`Study.published_law`, e.g. Marin's fast-ladder law) to
    `sdir/reference_law.json` (analysis/fit/reflaw.py `published`)."""
    law = published(study.published_law, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    sdir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(sdir / LAW_FILE, {**law.to_dict(), "study": study.name})  # `analyze` checks whose it is
    return law


def cached_law(study: Any):
    """The PinnedLaw this machine's cache holds for the study's baseline ladder, else None."""
    if not getattr(study, "reference_rungs", ()):
        return None
    key = reference_key(reference_specs(study))
    got = read_json(cache_root() / key / LAW_FILE, strict=True)
    if not got or not got.get("valley"):  # none, or a former fit: `run` refits it
        return None
    return check_pinned(got, str(cache_root() / key / LAW_FILE), key=key)


def before_design(study: Any, out: str) -> list[dict]:
    """The runs `run` makes before the design (docs/method.md §4.6, §4.1): the LR profile of each
    LR-coupled factor's levels and the baseline ladder that pins the reference law, with their cost."""
    rows = []
    skipped = profile_skipped(study)
    if skipped:
        rows.append({"what": f"no LR profile: {skipped}", "runs": 0, "rungs": "", "core_seconds": 0, "max_runs": 0,
                     "state": "", "n_runs": 0})
    pc = profile_cost(study)
    if pc is not None:
        done = read_profile(out, study.name)
        rows.append({"what": f"LR profile ({', '.join(pc['groups'])}, 5 log-spaced LRs each, at each of "
                             f"{len(pc['seeds'])} seed(s))", "runs": pc["runs"],
                     "rungs": pc["rung"], "core_seconds": pc["core_seconds"], "max_runs": pc["max_runs"],
                     "state": f"done ({done.get('created')})" if done else "", "n_runs": pc["runs"]})
    if getattr(study, "reference_rungs", ()):
        key = reference_key(reference_specs(study))
        cached = (cache_root() / key / "reference_law.json").exists()
        rungs = ladder(study.reference_rungs)
        n_seeds = len(getattr(study, "reference_seeds", (0,)))
        est = [r.est_wall_s() for r in rungs]
        rows.append({"what": f"baseline ladder pinning the reference law "
                             f"({n_seeds} seed(s); once per machine and config)",
                     "runs": len(rungs) * n_seeds, "rungs": f"{rungs[0].name}..{rungs[-1].name}",
                     "core_seconds": n_seeds * sum(est) if all(e is not None for e in est) else None,
                     "state": f"cached ({cache_root() / key})" if cached else ""})
    return rows


def pin_law(study: Any, sdir: Path, opts: ExecOptions, overrides: Sequence[str] = (), pin: bool = True) -> str | None:
    """The reference law `run` pins before the design: the study's published law, else its baseline ladder's (run
    now, when the executor waits), else none; `pin=False` removes a pinned law (the analysis then fits it on the
    design's rungs). Returns what was done, for the console."""
    if not pin:
        (sdir / LAW_FILE).unlink(missing_ok=True)
        return None
    if getattr(study, "published_law", None) is not None:
        return f"L∞ and α pinned to a published law: {pin_published(study, sdir).source}"
    if study.reference_rungs and opts.wait:
        law = pin_reference_law(study, sdir, opts, overrides)
        return f"reference law not pinned: {law}" if isinstance(law, str) else \
            f"reference law pinned: {law.describe()} ({law.source})"
    return None
