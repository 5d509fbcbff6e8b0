"""The recipe factors, declared once: one `FactorSpec` row per switch of the Marin 535B-A23B recipe.

Everything else follows from `RECIPE_FACTOR_SPECS`: `marin.config.Recipe` (its fields, defaults and
validation), `RECIPE_LEVELS`, `BASELINE_LEVELS`, `FACTORS`, `MODEL_FACTORS`, `QUALITY_FACTORS`, the
registered `ablations.factors.RECIPE_FACTORS` and, through each run's metadata, the ±1 coding the
analysis reads. Adding a recipe factor is one row here plus the visible branch in the model
(docs/extending.md, "Adding a factor"). Pure Python; never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from marin_ablate.marin import plugins
from marin_ablate.marin.optimizers import KINDS, OPTIMIZERS, GroupKind, OptimizerLevel


@dataclass(frozen=True)
class FactorSpec:
    """One recipe switch: its field name on `Recipe`, the recipe level (coded +1 and the default),
    the level a peer would use (coded −1), and further named levels a study may contrast."""

    name: str
    recipe: str  # Marin's level: Recipe's default, coded +1
    baseline: str  # the peer's level: Recipe.baseline(), coded -1
    extra: tuple[str, ...] = ()  # other levels (code None unless a study's factor contrasts them)
    changes_model: bool = True  # False: only the optimizer changes (MODEL_FACTORS leaves it out)
    quality: bool = True  # False: changes throughput and drops, studied apart (QUALITY_FACTORS)
    # True: its levels want different learning rates, so a study varying it profiles the LR of each
    # level before the design runs (docs/method.md §4.6, sweeps/tuning.py `profile_study`)
    lr_coupled: bool = False
    doc: str = ""
    # The level every run computed before this row existed (None: the baseline). The run id leaves a
    # switch at this level out of its hash (marin.config.RunSpec.identity_json), so adding a row keeps
    # the ids of runs that compute what they did and gives every other run a new id.
    before: str | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"FactorSpec.name={self.name!r} must be an identifier")
        lv = self.levels
        if len(set(lv)) != len(lv) or not all(isinstance(x, str) and x for x in lv):
            raise ValueError(f"FactorSpec {self.name!r}: levels {lv} must be distinct non-empty strings")
        if self.before is not None and self.before not in lv:
            raise ValueError(f"FactorSpec {self.name!r}: before={self.before!r} is not a level; allowed values: "
                             f"{', '.join(map(repr, lv))}")

    @property
    def identity_level(self) -> str:
        """The level a run id leaves out: what runs computed before this switch existed."""
        return self.baseline if self.before is None else self.before

    @property
    def levels(self) -> tuple[str, ...]:
        """Every level, the recipe level first, then the baseline, then the extras."""
        return (self.recipe, self.baseline, *self.extra)


_OPTIMIZERS = tuple(OPTIMIZERS)  # the optimizer registry's levels: recipe, baseline, then the others
RECIPE_FACTOR_SPECS: tuple[FactorSpec, ...] = (
    FactorSpec("xsa", "xsa", "none",
               doc="Exclusive Self Attention (arXiv 2603.09078) vs the plain attention output"),
    FactorSpec("sconv", "short_conv", "none",
               doc="short causal depthwise conv (kernel 4) at k, attn-out and mlp-out vs none"),
    FactorSpec("qk_norm", "fixed_1.3", "learned_gain", ("none",),
               doc="parameter-free q/k RMSNorm then q*1.3; baseline RMSNorm with a learned gain; extra: no norm"),
    FactorSpec("latent_moe", "latent", "standard", ("full_width",),
               doc="latent MoE: 2E experts top-2K at width d/alpha; baseline E experts top-K at width d; extra "
                   "full_width: 2E experts top-2K at width d, hidden m/alpha (Marin's drop_latent ablation)"),
    FactorSpec("router_balance", "quantile", "switch_aux", ("aux_free",),
               doc="quantile balancing bias (no aux loss); baseline Switch aux loss; extra DeepSeek aux-free bias"),
    FactorSpec("ep_transport", "ragged", "fixed", ("dropless", "pooled_wave"), quality=False,
               doc="ragged all-to-all with pooled receiver capacity vs fixed per-(sender, expert) capacity; "
                   "extras dropless and pooled_wave (the static pooled-wave all-to-all the hero ran)"),
    FactorSpec("optimizer", *_OPTIMIZERS[:2], _OPTIMIZERS[2:], changes_model=False, lr_coupled=True,
               doc="Hyperball (MuonH + AdamH + Adam) vs AdamW; extras Muon+AdamW, AdamH alone"),
)

SPECS: dict[str, FactorSpec] = {s.name: s for s in RECIPE_FACTOR_SPECS}
RECIPE_LEVELS: dict[str, tuple[str, ...]] = {s.name: s.levels for s in RECIPE_FACTOR_SPECS}
BASELINE_LEVELS: dict[str, str] = {s.name: s.baseline for s in RECIPE_FACTOR_SPECS}
IDENTITY_LEVELS: dict[str, str] = {s.name: s.identity_level for s in RECIPE_FACTOR_SPECS}
FACTORS: tuple[str, ...] = tuple(SPECS)
MODEL_FACTORS: tuple[str, ...] = tuple(s.name for s in RECIPE_FACTOR_SPECS if s.changes_model)
QUALITY_FACTORS: tuple[str, ...] = tuple(s.name for s in RECIPE_FACTOR_SPECS if s.quality)


def add_level(name: str, level: str) -> None:
    """A further level of a registered switch (`register_optimizer` adds optimizers)."""
    global RECIPE_FACTOR_SPECS
    spec = replace(factor_spec(name), extra=(*SPECS[name].extra, level))
    SPECS[name] = spec
    RECIPE_LEVELS[name] = spec.levels
    RECIPE_FACTOR_SPECS = tuple(spec if s.name == name else s for s in RECIPE_FACTOR_SPECS)


def register_optimizer(level: OptimizerLevel, kinds: tuple[GroupKind, ...] | list[GroupKind] = ()) -> None:
    """Add an optimizer level and the kinds it introduces (`marin.optimizers` tables): it becomes a level of
    `Recipe.optimizer` that studies, `train`, the plan and the hero accept. A name registered twice is an error."""
    taken = [k.name for k in kinds if k.name in KINDS] + ([level.name] if level.name in OPTIMIZERS else [])
    if taken:
        raise ValueError(f"register_optimizer: {taken} already registered")
    new = {k.name: k for k in kinds}
    level.check_kinds({**KINDS, **new})
    add_level("optimizer", level.name)
    KINDS.update(new)
    OPTIMIZERS[level.name] = level
    plugins.note("optimizer", level.name)


def factor_spec(name: str) -> FactorSpec:
    if name not in SPECS:
        raise ValueError(f"unknown recipe factor {name!r}; allowed values: {', '.join(FACTORS)}")
    return SPECS[name]
