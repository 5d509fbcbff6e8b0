"""`marin-ablate describe`: the resolved config of a preset, its parameter and FLOP counts (DESIGN §2.2).

Pure arithmetic over the config (marin.flops); it imports no torch, so it answers instantly.
"""

from __future__ import annotations

import argparse
import json

from marin.config import PRESETS, RECIPE_LEVELS, Recipe, preset
from marin.flops import describe


def describe_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="tiny", help=f"model preset; one of: {', '.join(PRESETS)}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a ModelConfig field (repeatable)")
    parser.add_argument("--recipe", dest="recipe", action="append", default=[], metavar="FACTOR=LEVEL",
                        help=f"set a recipe factor to a level (repeatable); factors: {', '.join(RECIPE_LEVELS)}")
    parser.add_argument("--baseline", action="store_true", help="start from Recipe.baseline() instead of Recipe()")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def parse_recipe(items: list[str], baseline: bool = False) -> Recipe:
    """`factor=level` strings on top of Recipe() (or Recipe.baseline())."""
    levels = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--recipe {item!r} must look like factor=level; factors: {', '.join(RECIPE_LEVELS)}")
        k, v = (s.strip() for s in item.split("=", 1))
        levels[k] = v
    base = Recipe.baseline() if baseline else Recipe()
    return base.with_(**levels)


def _fmt(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f}{unit}"
    return f"{n:g}"


def cmd_describe(args: argparse.Namespace) -> int:
    cfg = preset(args.preset, args.overrides)
    recipe = parse_recipe(args.recipe, args.baseline)
    info = {"preset": args.preset, **describe(cfg, recipe)}
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
    print(f"flops_per_token {_fmt(info['flops_per_token'])} (training, 3 x forward)")
    for k, v in info["forward_flops_breakdown"].items():
        print(f"  forward {k:<12} {_fmt(v)}")
    print(f"dispatch_bytes_per_token {_fmt(info['dispatch_bytes_per_token'])}")
    return 0
