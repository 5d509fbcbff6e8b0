"""`marin-ablate plan --preset P`: the resolved config of a preset, its parameter and FLOP counts.

Pure arithmetic over the config (marin.flops); importing it loads no torch. The command's entry is
`marin_ablate.plan.cmd_preset`, which checks the options and adds a ladder rung's batch and EP shards
(marin_ablate.common.rung_of_preset: marin/ imports no ablations); this module holds the arithmetic and
the printing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from marin_ablate.marin.config import PRESETS, Recipe, apply_overrides, preset, split_overrides
from marin_ablate.marin.fields import option
from marin_ablate.marin.flops import describe


@dataclass(frozen=True)
class DescribeOptions:
    """Resolved config, parameter and FLOP counts of a preset (what `plan --preset P` gave)."""

    preset: str = option("tiny", help=f"model preset; one of: {', '.join(PRESETS)}")
    overrides: tuple[str, ...] = option((), spec=("model", "recipe"),
                                        help="a recipe factor's level: --recipe.FACTOR=LEVEL")
    baseline: bool = option(False, help="start from Recipe.baseline() instead of Recipe()")
    json: bool = option(False, help="print one JSON object")


def _fmt(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f}{unit}"
    return f"{n:g}"


def resolved(cfg, recipe: Recipe, rung: dict | None = None) -> dict:
    """The values a reader compares with Marin's code (docs/fidelity.md), resolved for this preset.
    `rung` (ep_shards, batch_sequences, tokens_per_step, steps, tokens), when the preset is a ladder
    rung, is passed in by the caller: marin/ knows no ladders. Adam's epsilon and the peak learning
    rate per optimizer group join this dict from the hyperparameter resolver (they are not the model's)."""
    from marin_ablate.marin.flops import params_active_marin  # noqa: PLC0415
    from marin_ablate.marin.optimizers import NS_COEFFS  # noqa: PLC0415
    out = {
        "params_active_marin": params_active_marin(cfg, recipe),
        "qb_estimator": cfg.qb_estimator, "qb_hist_bins": cfg.qb_hist_bins,
        "gated_norm": cfg.gated_norm, "gated_norm_rank": cfg.gated_norm_width,
        "norm_eps": cfg.norm_eps, "init_std": cfg.init_scale / cfg.d_model ** 0.5, "init_trunc_sigmas": cfg.init_trunc,
        "ns_coefficients": [list(t) for t in NS_COEFFS],
        "ep_shards": cfg.ep_shards, "batch_sequences": None, "tokens_per_ep_shard": None,
    }
    if rung is not None:
        out.update(rung)
        # per rank as training holds them: the step's tokens over EP shards x replica groups (racks)
        out["tokens_per_ep_shard"] = rung["tokens_per_step"] // (rung["ep_shards"] * rung.get("replica_groups", 1))
    return out


def describe_info(args: DescribeOptions, rung: dict | None = None) -> dict:
    """The describe record of `args` (preset, --model./--recipe. overrides, --baseline); `rung` as in `resolved`."""
    sets = split_overrides(args.overrides, ("model", "recipe"))  # train./data. change neither count
    cfg = preset(args.preset, sets["model"])
    recipe = Recipe.baseline() if args.baseline else Recipe()
    recipe = apply_overrides(recipe, sets["recipe"]) if sets["recipe"] else recipe
    return {"preset": args.preset, **describe(cfg, recipe), "resolved": resolved(cfg, recipe, rung)}


def cmd_describe(args: DescribeOptions, rung: dict | None = None) -> int:
    """Print the describe record (the CLI's entry is marin_ablate.plan.cmd_preset, which adds the rung)."""
    info = describe_info(args, rung)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(f"preset {args.preset}")
    print("recipe  " + "  ".join(f"{k}={v}" for k, v in info["recipe"].items()))
    print("model   " + "  ".join(f"{k}={v}" for k, v in info["model"].items()))
    g = info["moe_geometry"]
    print(f"moe     {g['n_experts']} experts, top-{g['top_k']}, width {g['width']}, hidden {g['hidden']}"
          f"{' (latent)' if g['latent'] else ''}")
    print(f"params_total   {_fmt(info['params_total'])} ({info['params_total']:,})")
    print(f"params_active  {_fmt(info['params_active'])} ({info['params_active']:,}, non-embedding)")
    pm = info["resolved"]["params_active_marin"]
    print(f"  params_active_marin {_fmt(pm)}: Marin's count, which its ladder sizes tokens by (attention, router, "
          "routed and shared experts, latent; no norms, gates, SConv, GatedNorm: marin/flops.py)")
    print(f"flops_per_token {_fmt(info['flops_per_token'])} (training, 3 x forward)")
    for k, v in info["forward_flops_breakdown"].items():
        print(f"  forward {k:<12} {_fmt(v)}")
    print(f"dispatch_bytes_per_token {_fmt(info['dispatch_bytes_per_token'])}")
    if rung is not None and rung.get("rung_overrides") not in (None, "(none)"):
        print(f"rung {args.preset} trains with {rung['rung_overrides']} (the model line above is the preset's)")
    print("resolved (docs/fidelity.md):")
    for k, v in info["resolved"].items():
        print(f"  {k:<22} {v}")
    return 0
