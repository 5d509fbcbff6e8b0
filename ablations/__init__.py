"""WHAT to run: factors, designs (full / fractional factorial), scale ladders, studies (docs/method.md §4-5).

Pure Python + numpy + pydoe; never imports torch, so a design can be planned and costed anywhere.
Entry points: `get_study(name)` -> Study (`.runs()`, `.describe()`); `fraction`, `full_factorial`,
`arms` -> Design; `Factor`, `recipe_factor`, `get_factor`; `Rung`, `get_rung`."""

from marin_ablate.ablations.designs import Design, arm_name, arms, fraction, full_factorial
from marin_ablate.ablations.factors import QUALITY_FACTORS, RECIPE_FACTORS, Factor, get_factor, recipe_factor
from marin_ablate.ablations.ladders import CPU_RUNGS, GPU_RUNGS, RUNGS, Rung, get_rung
from marin_ablate.ablations.studies import STUDIES, HeroPlan, get_study
from marin_ablate.ablations.study import Study

__all__ = [
    "Design", "arm_name", "arms", "fraction", "full_factorial",
    "QUALITY_FACTORS", "RECIPE_FACTORS", "Factor", "get_factor", "recipe_factor",
    "CPU_RUNGS", "GPU_RUNGS", "RUNGS", "Rung", "get_rung",
    "STUDIES", "HeroPlan", "Study", "get_study",
]
