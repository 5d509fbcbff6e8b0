"""Precision bought with seeds (docs/method.md §4.11): how many seeds a stated half-width takes, Stein's
two-stage rule that `run STUDY --until` follows (exact, where stopping on a narrow-looking interval under-covers:
Stein 1945; the pinned law's share of the standard error, which no seed narrows, kept beside the seeds'), and the
report's "What it would take". No torch import.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

#: The file a `run --until` study keeps beside its runs: the request and the pilot's plan.
UNTIL_FILE = "until.json"
#: A half-width the report aims at for an interval wider than ×/÷ 1.5, and the narrowest it proposes for a
#: value consistent with no effect (within ×/÷ 1.05 of 1).
WIDE_HALF, FLOOR_HALF = math.log(1.5), math.log(1.05)
#: Seeds the report or the planner proposes at most (a proposal beyond it says so).
SEEDS_CAP = 256


@dataclass(frozen=True)
class Until:
    """`run STUDY --until.halfwidth H`: add seed blocks until each named value's 95% interval at C_ref has
    half-width at most H in ln M, or a budget is spent (`max_seeds` in all, `minutes` of this machine's wall
    clock for the whole invocation, the pilot's included). `components` () names every component and the TOTAL."""

    halfwidth: float
    components: tuple[str, ...] = ()
    max_seeds: int = 64
    minutes: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))
        if not (isinstance(self.halfwidth, (int, float)) and math.isfinite(self.halfwidth) and self.halfwidth > 0):
            raise ValueError(f"until.halfwidth={self.halfwidth!r}; allowed values: a positive ln-scale half-width, "
                             "e.g. 0.2 (×/÷ 1.22)")
        if not isinstance(self.max_seeds, int) or not 2 <= self.max_seeds <= 10_000:
            raise ValueError(f"until.max_seeds={self.max_seeds!r}; allowed values: an integer in 2..10000")
        if self.minutes is not None and not (math.isfinite(self.minutes) and self.minutes > 0):
            raise ValueError(f"until.minutes={self.minutes!r}; allowed values: a positive number of minutes")


@dataclass(frozen=True)
class SteinPlan:
    """What the pilot decided: per named value (component or TOTAL) its pilot sd s0, the pinned law's standard
    error se_law and the seeds it needs; `seeds` the study's N (the largest need, capped by the budget)."""

    pilot: tuple[int, ...]
    halfwidth: float
    level: float
    pilot_sd: dict[str, float]
    law_se: dict[str, float]
    needs: dict[str, int]
    seeds: int
    capped: str = ""  # why N is below the largest need ('' when it is not)
    components: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    def expected_half(self, name: str, n: int | None = None) -> float:
        """The half-width at n seeds (default N) of one named value: t(n0−1)·√(s0²/n + se_law²)."""
        n = self.seeds if n is None else n
        law = self.law_se.get(name, 0.0)
        return stein_t(len(self.pilot), self.level) * math.sqrt(self.pilot_sd[name] ** 2 / n + law**2)

    def out_of_reach(self) -> dict[str, float]:
        """Named values whose target lies inside the pinned law's own share: {name: that share's half-width}."""
        t = stein_t(len(self.pilot), self.level)
        return {c: t * s for c, s in self.law_se.items() if t * s >= self.halfwidth}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pilot"], d["components"] = list(self.pilot), list(self.components)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "SteinPlan":
        keys = {f for f in cls.__dataclass_fields__}
        bad = [k for k in ("pilot", "halfwidth", "level", "pilot_sd", "law_se", "needs", "seeds") if k not in d]
        if bad:
            raise ValueError(f"{UNTIL_FILE}: missing field(s) {bad}; delete the file to plan the study again")
        d = {k: v for k, v in d.items() if k in keys}
        return cls(**{**d, "pilot": tuple(int(s) for s in d["pilot"]),
                      "components": tuple(d.get("components", ()))})


def stein_t(n0: int, level: float = 0.95) -> float:
    return float(stats.t.ppf(0.5 + level / 2, n0 - 1))


def seeds_for(sd: float, law_se: float, k: int, target: float, level: float = 0.95) -> int:
    """Seeds in all that bring a value to half-width `target` from k seeds (Stein's N for its seed sd on k − 1 df
    beside the law's standard error, which seeds do not narrow): at least k; SEEDS_CAP + 1 where the law's share
    alone is `target` or wider."""
    t = stein_t(k, level)
    room = target**2 - (t * law_se) ** 2 if math.isfinite(law_se) else target**2
    if room <= 0:
        return SEEDS_CAP + 1
    if not (math.isfinite(sd) and sd > 0):
        return k
    return max(k, math.ceil((t * sd) ** 2 / room))


def stein_plan(pilot: Sequence[int], estimates: Mapping[str, Sequence[float]], law_se: Mapping[str, float],
               until: Until, level: float = 0.95, budget_seeds: int | None = None) -> SteinPlan:
    """The plan from the pilot: each named value's pilot estimates (one per pilot seed, in ln M) and its pinned
    law's standard error (0 without a pinned law); N = the largest need, capped at `until.max_seeds` and at
    `budget_seeds` (what the minutes buy). A named value without an estimate at every pilot seed is refused
    naming it."""
    names = list(until.components or estimates)
    unknown = [c for c in names if c not in estimates]
    if unknown:
        raise ValueError(f"until.components {unknown}: no estimate at the pilot; allowed values: "
                         f"{', '.join(estimates)}")
    n0 = len(pilot)
    if n0 < 2:
        raise ValueError(f"--until needs a pilot of at least 2 seeds, the study runs {n0}; allowed values: "
                         "--seeds with two or more seeds")
    short = [c for c in names if sum(math.isfinite(v) for v in estimates[c]) < n0]
    if short:
        raise ValueError(f"--until: {', '.join(short)} not estimable at every pilot seed "
                         f"({', '.join(map(str, pilot))}); the pilot cannot size the study")
    sd = {c: float(np.std(estimates[c], ddof=1)) for c in names}
    law = {c: float(law_se.get(c, 0.0)) for c in names}
    needs = {c: seeds_for(sd[c], law[c], n0, until.halfwidth, level) for c in names}
    n, capped = max(needs.values()), ""
    for cap, why in ((until.max_seeds, f"until.max_seeds={until.max_seeds}"),
                     (budget_seeds, f"until.minutes={until.minutes}")):
        if cap is not None and n > max(cap, n0):
            n, capped = max(cap, n0), why
    return SteinPlan(tuple(pilot), until.halfwidth, level, sd, law, needs, n, capped, tuple(until.components))


def read_plan(study_dir: str | Path) -> SteinPlan | None:
    """The study folder's Stein plan (`until.json`), None without one; a damaged file is refused naming it."""
    p = Path(study_dir) / UNTIL_FILE
    if not p.is_file():
        return None
    try:
        return SteinPlan.from_dict(json.loads(p.read_text()))
    except (ValueError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: {e}; delete it to plan the study again (its runs are kept)") from None


# What it would take: the report's section


def target_half(est: float, lo: float, hi: float, verdict: str) -> float | None:
    """The half-width the report proposes for one Findings value, None when it needs none: an interval wider than
    ×/÷ 1.5 is brought to ×/÷ 1.5; a value consistent with no effect to half its estimate (the interval then
    excludes 1 at the measured size with about 97.5% probability before family control), at least ×/÷ 1.05."""
    half = (hi - lo) / 2
    goals = []
    if half > WIDE_HALF:
        goals.append(WIDE_HALF)
    if verdict.startswith("consistent with no effect"):
        goals.append(max(abs(est) / 2, FLOOR_HALF))
    goals = [g for g in goals if g < half]
    return min(goals) if goals else None


def core_seconds_per_seed(table, profile_s: Mapping[int, float] | None = None) -> float:
    """The mean CPU or GPU seconds one seed costs: its design runs' `wall_s` (each run holds its own cores) plus its
    LR profile's (`profile_s`, {seed: seconds}); NaN without timings."""
    if "wall_s" not in table or "seed" not in table:
        return math.nan
    w = table.assign(w=table["wall_s"].astype(float)).groupby("seed")["w"].sum()
    per = [float(v) + float((profile_s or {}).get(int(s), 0.0)) for s, v in w.items() if math.isfinite(v)]
    return float(np.mean(per)) if per else math.nan


def what_it_would_take(rows: Sequence[Mapping], k: int, study: str, seconds_per_seed: float, workers: int,
                       level: float = 0.95) -> list[dict]:
    """Per Findings value (rows: component, est, lo, hi, verdict, seed_sd, law_se): the half-width proposed,
    the seeds in all it takes from k, the added minutes on `workers` parallel workers, and the `run` line."""
    out = []
    for r in rows:
        goal = target_half(r["est"], r["lo"], r["hi"], r["verdict"])
        if goal is None:
            continue
        sd, law = float(r.get("seed_sd", math.nan)), float(r.get("law_se", 0.0))
        if k < 2 or not math.isfinite(sd):
            out.append({**r, "target": goal, "seeds": None, "minutes": math.nan,
                        "how": "no seed scatter measured yet (one seed): run two or more seeds first"})
            continue
        n = seeds_for(sd, law, k, goal, level)
        minutes = (n - k) * seconds_per_seed / max(workers, 1) / 60 if math.isfinite(seconds_per_seed) else math.nan
        comp = f" --until.components {r['component']}"
        out.append({**r, "target": goal, "seeds": n if n <= SEEDS_CAP else None, "minutes": minutes,
                    "how": (f"marin-ablate run {study} --until.halfwidth {goal:.3g}{comp}" if n <= SEEDS_CAP else
                            f"more than {SEEDS_CAP} seeds at this seed scatter: a larger rung or a lower-noise "
                            "setup, not seeds")})
    return out
