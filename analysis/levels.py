"""Two-level coding of the recipe factors (DESIGN §2), copied so `analysis` never imports `marin`.

+1 is the recipe level (index 0 of `marin.config.RECIPE_LEVELS`), −1 the baseline level a peer
would use (`marin.config.BASELINE_LEVELS`); tests check the copy against the source.
"""

from __future__ import annotations

RECIPE_LEVEL: dict[str, str] = {
    "xsa": "xsa",
    "sconv": "short_conv",
    "qk_norm": "fixed_1.3",
    "latent_moe": "latent",
    "router_balance": "quantile",
    "ep_transport": "ragged",
    "optimizer": "hyperball",
}

BASELINE_LEVEL: dict[str, str] = {
    "xsa": "none",
    "sconv": "none",
    "qk_norm": "learned_gain",
    "latent_moe": "standard",
    "router_balance": "switch_aux",
    "ep_transport": "fixed",
    "optimizer": "adamw",
}

FACTORS: tuple[str, ...] = tuple(RECIPE_LEVEL)


def code_level(factor: str, level: str) -> int | None:
    """+1 for the recipe level, −1 for the baseline level, None for any other (extra) level."""
    if factor not in RECIPE_LEVEL:
        raise ValueError(f"unknown factor {factor!r}; allowed values: {', '.join(FACTORS)}")
    if level == RECIPE_LEVEL[factor]:
        return 1
    if level == BASELINE_LEVEL[factor]:
        return -1
    return None
