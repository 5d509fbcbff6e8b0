"""Factor registry: what a design varies, and how a coded level (-1 / +1) becomes a config value.

A factor is two named levels of one field of a run: a `Recipe` switch (docs/method.md §2) or any
`ModelConfig` / `TrainConfig` / `DataConfig` field. Coding convention (docs/method.md §4): the first level
of `levels` is coded -1 and the second +1; for the seven recipe factors -1 is the baseline level a
peer would use and +1 the Marin recipe level. This module never imports torch."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from marin_ablate.marin.config import DataConfig, ModelConfig, Recipe, TrainConfig
from marin_ablate.marin.schema import TRUTH_KEYS, RunSummary
from marin_ablate.marin.switches import BASELINE_LEVELS, FACTORS, QUALITY_FACTORS, RECIPE_LEVELS, SPECS  # noqa: F401

# Names a factor cannot take: each run's row in the results table already has these columns.
RESERVED_NAMES = frozenset({f.name for f in fields(RunSummary)} | {
    "run_id", "study", "rung", "arm", "seed", "design_row", "coding", "random_stream"})

# The config sections a factor may address, and the dataclass that owns each section's fields.
SECTIONS: dict[str, type] = {"recipe": Recipe, "model": ModelConfig, "train": TrainConfig, "data": DataConfig}


@dataclass(frozen=True)
class Factor:
    """Two named levels of one config field; `levels` is ordered (coded -1, coded +1).
    Example: ``Factor("window", field="model.window", levels={"short": 32, "long": 64})``
    codes window=32 as -1 ("short") and window=64 as +1 ("long").

    `truth` plants a factor of known effect (docs/calibration/): its true multipliers, high level over
    low, e.g. ``truth={"M_flop": 0.5, "R": 2.0}``; the analysis checks its intervals against them.
    `regime=True` marks a condition rather than a component (e.g. tokens per parameter): the report
    shows every component's multiplier at each of its levels."""

    name: str
    field: str  # "<section>.<field>", section in SECTIONS
    levels: Any  # Mapping[level name -> value] (two entries); stored as a tuple of pairs
    truth: Any = None  # Mapping[TRUTH_KEYS -> multiplier > 0]; stored as a tuple of pairs
    regime: bool = False
    lr_coupled: bool = False  # its levels want different LRs: profiled per level before the design runs

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Factor.name={self.name!r} must be an identifier")
        if self.name in RESERVED_NAMES:
            raise ValueError(f"Factor.name={self.name!r} is a column of every run's results row; allowed values: "
                             f"any other identifier (not {', '.join(sorted(RESERVED_NAMES))})")
        section, _, attr = str(self.field).partition(".")
        if section not in SECTIONS:
            raise ValueError(f"Factor {self.name!r}: field={self.field!r} must start with a section; "
                             f"allowed values: {', '.join(s + '.<field>' for s in SECTIONS)}")
        allowed = [f.name for f in fields(SECTIONS[section])]
        if attr not in allowed:
            raise ValueError(f"Factor {self.name!r}: {SECTIONS[section].__name__} has no field {attr!r}; "
                             f"allowed values: {', '.join(allowed)}")
        pairs = tuple(self.levels.items()) if isinstance(self.levels, Mapping) else tuple(map(tuple, self.levels))
        if len(pairs) != 2 or any(len(p) != 2 for p in pairs):
            raise ValueError(f"Factor {self.name!r}: levels must be exactly two (name, value) pairs, "
                             f"got {self.levels!r}")
        (n0, v0), (n1, v1) = pairs
        if not (isinstance(n0, str) and isinstance(n1, str)) or n0 == n1:
            raise ValueError(f"Factor {self.name!r}: level names must be two distinct strings, got {n0!r}, {n1!r}")
        if v0 == v1:
            raise ValueError(f"Factor {self.name!r}: both levels set {self.field} to {v0!r}")
        if section == "recipe":
            for v in (v0, v1):
                if v not in RECIPE_LEVELS[attr]:
                    raise ValueError(f"Factor {self.name!r}: Recipe.{attr}={v!r} is not a known level; "
                                     f"allowed values: {', '.join(RECIPE_LEVELS[attr])}")
        object.__setattr__(self, "levels", pairs)
        for k in ("regime", "lr_coupled"):
            if not isinstance(getattr(self, k), bool):
                raise ValueError(f"Factor {self.name!r}: {k}={getattr(self, k)!r}; allowed values: True, False")
        if self.truth is not None:
            try:
                t = dict(self.truth.items() if isinstance(self.truth, Mapping) else self.truth)
            except (TypeError, ValueError):
                raise ValueError(f"Factor {self.name!r}: truth={self.truth!r}; allowed values: a mapping of "
                                 f"{', '.join(TRUTH_KEYS)} -> a multiplier > 0, e.g. {{'M_flop': 0.5}}") from None
            bad = [k for k in t if k not in TRUTH_KEYS]
            if not t or bad:
                raise ValueError(f"Factor {self.name!r}: truth keys {bad or '(none)'}; allowed values: "
                                 f"{', '.join(TRUTH_KEYS)}")
            for k, v in t.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < float("inf")):
                    raise ValueError(f"Factor {self.name!r}: truth[{k!r}]={v!r}; allowed values: a multiplier > 0")
            object.__setattr__(self, "truth", tuple((k, float(v)) for k, v in t.items()))

    @property
    def section(self) -> str:
        return self.field.split(".", 1)[0]

    @property
    def attr(self) -> str:
        return self.field.split(".", 1)[1]

    @property
    def level_names(self) -> tuple[str, str]:
        return (self.levels[0][0], self.levels[1][0])

    @property
    def low(self) -> str:
        """Level coded -1 (the baseline level for a recipe factor)."""
        return self.levels[0][0]

    @property
    def high(self) -> str:
        """Level coded +1 (the recipe level for a recipe factor)."""
        return self.levels[1][0]

    def level(self, code: int) -> str:
        """Level name for a coded value (+1 -> high, -1 -> low)."""
        if code not in (1, -1):
            raise ValueError(f"Factor {self.name!r}: coded level {code!r}; allowed values: -1, 1")
        return self.high if code == 1 else self.low

    def code(self, level: str) -> int:
        return -1 if self.check_level(level) == self.low else 1

    def check_level(self, level: str) -> str:
        if level not in self.level_names:
            raise ValueError(f"factor {self.name!r} has no level {level!r}; "
                             f"allowed values: {', '.join(self.level_names)}")
        return level

    def value(self, level: str) -> Any:
        """The config value the named level sets."""
        return dict(self.levels)[self.check_level(level)]

    @property
    def truth_dict(self) -> dict[str, float] | None:
        return dict(self.truth) if self.truth else None

    def to_dict(self) -> dict:
        return {"name": self.name, "field": self.field, "low": self.low, "high": self.high,
                "values": {n: v for n, v in self.levels},
                **{k: v for k, v in (("truth", self.truth_dict), ("regime", self.regime),
                                     ("lr_coupled", self.lr_coupled)) if v}}


def recipe_factor(name: str, low: str | None = None, high: str | None = None) -> Factor:
    """One of the seven recipe switches, by default baseline level (-1) vs recipe level (+1).
    `low` / `high` pick other levels of the same switch, e.g. ``recipe_factor("router_balance",
    low="aux_free")`` compares DeepSeek's aux-free bias against quantile balancing."""
    if name not in RECIPE_LEVELS:
        raise ValueError(f"unknown factor {name!r}; allowed values: {', '.join(FACTORS)}")
    low = BASELINE_LEVELS[name] if low is None else low
    high = RECIPE_LEVELS[name][0] if high is None else high
    for lv in (low, high):
        if lv not in RECIPE_LEVELS[name]:
            raise ValueError(f"factor {name!r} has no level {lv!r}; allowed values: {', '.join(RECIPE_LEVELS[name])}")
    return Factor(name, field=f"recipe.{name}", levels={low: low, high: high}, lr_coupled=SPECS[name].lr_coupled)


#: The seven recipe factors: name -> Factor(field "recipe.<name>", baseline (-1), recipe (+1)).
RECIPE_FACTORS: dict[str, Factor] = {name: recipe_factor(name) for name in FACTORS}


def get_factor(factor: str | Factor) -> Factor:
    """A registered recipe factor by name, or a Factor passed through unchanged."""
    if isinstance(factor, Factor):
        return factor
    if factor not in RECIPE_FACTORS:
        raise ValueError(f"unknown factor {factor!r}; allowed values: {', '.join(RECIPE_FACTORS)} "
                         "(or declare Factor(name, field='model.<field>', levels={...}))")
    return RECIPE_FACTORS[factor]


def resolve_factors(factors: "list[str | Factor] | tuple[str | Factor, ...]") -> tuple[Factor, ...]:
    out = tuple(get_factor(f) for f in factors)
    names = [f.name for f in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"factors {dup} are listed more than once")
    targets = [f.field for f in out]
    dupf = sorted({t for t in targets if targets.count(t) > 1})
    if dupf:
        raise ValueError(f"two factors set the same field(s) {dupf}")
    return out


def check_levels(factors: tuple[Factor, ...], levels: Mapping[str, str]) -> dict[str, str]:
    """Validate a {factor: level} mapping against the factors (unknown names or levels -> ValueError)."""
    by_name = {f.name: f for f in factors}
    for k, v in levels.items():
        if k not in by_name:
            raise ValueError(f"unknown factor {k!r}; allowed values: {', '.join(by_name)}")
        by_name[k].check_level(v)
    return dict(levels)


def apply_levels(factors: tuple[Factor, ...], levels: Mapping[str, str], *, model: ModelConfig | None = None,
                 recipe: Recipe | None = None, train: TrainConfig | None = None,
                 data: DataConfig | None = None) -> dict[str, Any]:
    """Set each factor's field to its level's value in the given config sections.
    Returns {"model": ..., "recipe": ..., "train": ..., "data": ...} (sections passed as None stay
    None; a factor addressing a missing section raises). Invalid combinations surface as the config's
    own ValueError, prefixed with the factor levels that produced them."""
    check_levels(factors, levels)
    sections: dict[str, Any] = {"model": model, "recipe": recipe, "train": train, "data": data}
    changes: dict[str, dict[str, Any]] = {}
    for f in factors:
        if f.name not in levels:
            continue
        if sections[f.section] is None:
            raise ValueError(f"factor {f.name!r} sets {f.field} but no {f.section} config was given")
        changes.setdefault(f.section, {})[f.attr] = f.value(levels[f.name])
    for sec, ch in changes.items():
        try:
            sections[sec] = replace(sections[sec], **ch)
        except ValueError as e:
            raise ValueError(f"levels {dict(levels)} give an invalid {sec} config: {e}") from None
    return sections
