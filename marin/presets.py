"""Named model shapes (the CPU ladder's, Marin's small shapes, the 535B hero) and the RunSpec a command line builds
from one: `preset(name)`, `spec_items` (the `--section.field=value` tokens of argv), `spec_of_preset` (`marin-ablate
train`'s spec). The configs themselves are marin/config.py's."""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

from marin_ablate.marin.config import (
    DataConfig,
    ModelConfig,
    Recipe,
    RunSpec,
    TrainConfig,
    apply_overrides,
    split_overrides,
)


def tiny() -> ModelConfig:
    """CPU tests: seconds per step."""
    return ModelConfig()


def _rung(d: int, n_layers: int, vocab: int = 16_384) -> ModelConfig:
    """Hero routing geometry at width d: 384 experts top-8, latent d/2, expert and shared hidden d/2,
    window 2048, head dim 128, a global layer every 4th layer and last, GQA 4:1 local, 8:1 global."""
    n_heads = d // 128
    kv = max(1, n_heads // 4)
    return ModelConfig(
        d_model=d, n_layers=n_layers, n_heads=n_heads, head_dim=128, n_kv_heads=kv,
        n_kv_heads_global=max(1, n_heads // 8), vocab_size=vocab, seq_len=4096, window=2048,
        global_every=4, n_experts=384, top_k=8, expert_hidden=d // 2, n_shared_experts=2,
        shared_hidden=d // 2, latent_ratio=2, ep_shards=8, router_precision="bf16",
    )


def hero_535b() -> ModelConfig:
    """The Marin 535B-A23B hero; flex attention with block-sparse masks as the GPU rungs (dense
    (B, 1, S, S) SDPA masks at 4,096 tokens would cost memory the hero does not have)."""
    return ModelConfig(
        d_model=6144, n_layers=48, n_heads=48, head_dim=128, n_kv_heads=12, n_kv_heads_global=6,
        vocab_size=128_256, seq_len=4096, window=2048, global_every=4, n_experts=384, top_k=8,
        expert_hidden=3072, n_shared_experts=2, shared_hidden=3072, latent_ratio=2, ep_shards=64,
        attention="flex", router_precision="bf16",
    )


PRESETS = {
    "tiny": tiny,
    # CPU ladder for the smoke study: seconds to minutes per run on 2 cores.
    "cpu_s": lambda: ModelConfig(d_model=64, n_layers=2, n_heads=4, head_dim=16, seq_len=128, window=64),
    "cpu_m": lambda: ModelConfig(d_model=96, n_layers=3, n_heads=6, head_dim=16, n_kv_heads=3,
                                 n_kv_heads_global=1, seq_len=128, window=64, expert_hidden=48,
                                 shared_hidden=48),
    "cpu_l": lambda: ModelConfig(d_model=128, n_layers=4, n_heads=8, head_dim=16, n_kv_heads=4,
                                 n_kv_heads_global=2, seq_len=128, window=64, expert_hidden=64,
                                 shared_hidden=64),
    "d512": lambda: _rung(512, 6),
    "d768": lambda: _rung(768, 8),
    # Marin's small shapes (experiments/grug/moe_hero_ep/small_scale_abl_launch.py SMALL_SHAPES).
    "d1024": lambda: _rung(1024, 12),
    "d1536": lambda: _rung(1536, 16),
    "d2048": lambda: _rung(2048, 22),
    "hero_535b": hero_535b,
}


def preset(name: str, overrides: Mapping[str, str] | list[str] | None = None) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; allowed values: {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    return apply_overrides(cfg, overrides) if overrides else cfg


_SPEC_RE = re.compile(r"^--(model|train|data|recipe)\.([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$", re.S)


def spec_items(argv: Sequence[str], sections: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the rest of argv, `section.field=value` items) from the `--section.field=value` (or `--section.field value`)
    tokens of a command line (what follows `--` is left alone); an unknown section or field is refused naming the
    allowed ones."""
    classes = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "recipe": Recipe}
    argv, rest, items, i = list(argv), [], [], 0
    while i < len(argv):
        tok = argv[i]
        m = _SPEC_RE.match(tok)
        if tok == "--":
            rest += argv[i:]
            break
        if m is None:
            rest.append(tok)
            i += 1
            continue
        section, name, value = m.groups()
        if value is None:
            if i + 1 >= len(argv):
                raise ValueError(f"--{section}.{name} needs a value: --{section}.{name}=VALUE")
            value, i = argv[i + 1], i + 1
        if section not in sections:
            raise ValueError(f"--{section}.{name}: this command takes no {section}. overrides; allowed sections: "
                             f"{', '.join(f'--{s}.F=V' for s in sections) or '(none)'}")
        names = [f.name for f in dataclasses.fields(classes[section])]
        if name not in names:
            raise ValueError(f"--{section}.{name}: {classes[section].__name__} has no field {name!r}; "
                             f"allowed values: {', '.join(sorted(names))}")
        items.append(f"{section}.{name}={value}")
        i += 1
    return rest, items


def spec_of_preset(name: str, overrides: Sequence[str] = (), baseline: bool = False, seed: int = 0) -> RunSpec:
    """`marin-ablate train`'s RunSpec: the preset, Recipe() (or its baseline), the `section.F=V` overrides."""
    sets = split_overrides(overrides)
    recipe = apply_overrides(Recipe.baseline() if baseline else Recipe(), sets["recipe"])
    train, data = apply_overrides(TrainConfig(), sets["train"]), apply_overrides(DataConfig(), sets["data"])
    return RunSpec(model=preset(name, sets["model"]), recipe=recipe, train=train, data=data, seed=seed)
