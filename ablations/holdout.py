"""Marin's hold-one-feature-out study: the recipe, then each feature removed alone, data-matched at d512 and d768
and read through Marin's fast-ladder law with its L∞ and α pinned (the one-factor-at-a-time path,
analysis/ofat.py), so a per-rung multiplier is read as Marin reads its Sc. The arms and the source of each level:
docs/holdout.md. No torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from marin_ablate.ablations.designs import arms
from marin_ablate.ablations.factors import Factor, recipe_factor
from marin_ablate.ablations.gb200 import H100
from marin_ablate.ablations.ladders import FAST_LADDER_LAW, GPU_DATA, ladder, ladder_family
from marin_ablate.ablations.study import CPU_EXECUTOR, Study, gpu_executor
from marin_ablate.marin.config import DataConfig, Recipe


@dataclass(frozen=True)
class HoldOut:
    """One arm: `factor`'s low level removes the feature, its high level is the recipe's. `marin` names
    Marin's ablation of the same change (None: Marin never held this feature out)."""

    arm: str
    factor: Factor
    marin: str | None
    doc: str


HOLDOUTS: tuple[HoldOut, ...] = (
    HoldOut("no_xsa", recipe_factor("xsa"), "drop_xsa", "the plain attention output (use_xsa=False)"),
    HoldOut("no_sconv", recipe_factor("sconv"), "drop_sconv", "no short convolutions (sconv=False)"),
    HoldOut("no_latent", recipe_factor("latent_moe", low="full_width"), "drop_latent",
            "384 experts top-8 at width d with half the expert hidden, no latent projections"),
    # Marin's drop_muonh routes the MuonH groups to AdamH at the same heuristic rates: not LR-coupled
    # here either (every arm at the heuristic), so no per-level profile runs before the design
    HoldOut("no_muonh",
            Factor("optimizer", field="recipe.optimizer", levels={"adamh": "adamh", "hyperball": "hyperball"}),
            "drop_muonh", "AdamH on every hyperball matrix at MuonH's rate (route_muonh_to_adamh)"),
    HoldOut("no_attn_gate", Factor("attn_gate", field="model.attn_gate", levels={"off": False, "on": True}),
            "drop_attn_gate", "no headwise attention gate"),
    HoldOut("no_gated_norm", Factor("gated_norm", field="model.gated_norm", levels={"off": "off", "on": "on"}),
            "drop_gated_norm", "RMSNorm alone, no GatedNorm after it"),
    HoldOut("full_rope_local", Factor("half_rope", field="model.rope_fraction", levels={"full": 1.0, "half": 0.5}),
            "full_rope_local", "RoPE on every head dim of the local layers, not half"),
    HoldOut("no_qk_norm", recipe_factor("qk_norm"), None, "RMSNorm on q and k with a learned gain, q multiplier 1"),
    HoldOut("no_qb", recipe_factor("router_balance"), None, "Switch aux loss 0.01 instead of quantile balancing"),
    HoldOut("no_ragged", recipe_factor("ep_transport"), None, "fixed per-(sender, expert) cells at cf 1.33"),
)

#: Marin's ablations with no arm here, and why: each changes the expert or head geometry, which a
#: rung fixes in several fields at once (a factor sets one field), and none is one of the recipe's features
MARIN_NOT_HELD_OUT = {
    "halve_granularity": "192 experts top-4 at twice the expert hidden (three fields of the rung's geometry)",
    "halve_sparsity": "192 experts top-8 (the rung's expert count, not a feature of the recipe)",
    "drop_gqa": "as many KV heads as query heads, local and global (two fields)",
}


def marin_arm(ablation: str) -> str:
    """Our arm for one of Marin's ablation names ("none": the recipe arm)."""
    ours = {"none": "recipe", **{h.marin: h.arm for h in HOLDOUTS if h.marin}}
    if ablation in ours:
        return ours[ablation]
    why = f" ({MARIN_NOT_HELD_OUT[ablation]}: no arm here)" if ablation in MARIN_NOT_HELD_OUT else ""
    raise ValueError(f"Marin ablation {ablation!r}{why}; allowed values: {', '.join(ours)}")


def holdout(rungs: Sequence[str] = ("d512", "d768"), seeds: Sequence[int] = (0,)) -> Study:
    """The recipe arm and one arm per `HOLDOUTS` row at Marin's fast-track rungs (d512, d768: batch 128,
    2,385 / 6,930 steps), 8 H100s per run; L∞ and α pinned to Marin's fast-ladder law. CPU rungs
    (`--rungs cpu_s32`) rehearse it on the embedded corpus with the local executor."""
    names = [h.factor.name for h in HOLDOUTS]
    n = len(names)
    rows = [[1] * n] + [[-1 if j == i else 1 for j in range(n)] for i in range(n)]
    design = arms(names, rows, labels=("recipe", *(h.arm for h in HOLDOUTS)))
    rs = ladder(tuple(rungs))
    cpu = ladder_family([r.name for r in rs]) is ladder_family(["cpu_s"])
    data, executor, hardware = (DataConfig(), CPU_EXECUTOR, None) if cpu else (GPU_DATA, gpu_executor(), H100)
    return Study("holdout", "Marin's hold-one-feature-out: the recipe, then each feature removed alone "
                 f"({n + 1} arms), read through Marin's fast-ladder law", tuple(h.factor for h in HOLDOUTS), design,
                 rs, tuple(seeds), data, Recipe(), executor, hardware, True, ("marin535",),
                 published_law=FAST_LADDER_LAW)
