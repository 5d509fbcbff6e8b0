"""Typed configuration for marin-ablate: the model, the seven recipe switches, training, data, runs.

Pure dataclasses and arithmetic (range rules and `--SECTION.F=V` override parsing in marin/fields.py); this module
never imports torch (docs/architecture.md §1) so that a design can be planned and costed on a laptop.
Every field that takes a named level is validated against its allowed values, and every error names
the field.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import ClassVar, Mapping, Sequence

from marin_ablate.marin.fields import (  # noqa: F401  (re-exported: the rules and overrides are part of the config API)
    CAPACITY,
    FRAC,
    MOMENTUM,
    NONNEG,
    NONNEG_INT,
    POS,
    POS_INT,
    SEED,
    apply_overrides,
    check,
    check_level,
    check_ranges,
    int_in,
    is_int,
    is_num,
    non_default,
    optional,
    split_overrides,
    to_dict,
)
from marin_ablate.marin.phases import MixturePhase, check_mixture  # noqa: F401  (re-exported: DataConfig.mixture's type)
from marin_ablate.marin.schema import seed_offset
from marin_ablate.marin.switches import (  # noqa: F401
    BASELINE_LEVELS,
    FACTORS,
    IDENTITY_LEVELS,
    MODEL_FACTORS,
    RECIPE_FACTOR_SPECS,
    RECIPE_LEVELS,
    factor_spec,
)

# ---- Recipe: one field per row of marin.switches.RECIPE_FACTOR_SPECS, defaulting to the recipe level. ----


class _RecipeMethods:
    """Validation and helpers of `Recipe`; the fields themselves come from the factor table."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            check_level("Recipe", f.name, getattr(self, f.name), RECIPE_LEVELS[f.name])

    @classmethod
    def baseline(cls) -> "Recipe":
        """Every switch at the level a peer would use."""
        return cls(**BASELINE_LEVELS)

    def with_(self, **levels: str) -> "Recipe":
        for k in levels:
            if k not in RECIPE_LEVELS:
                raise ValueError(f"unknown recipe factor {k!r}; allowed values: {', '.join(FACTORS)}")
        return replace(self, **levels)  # type: ignore[type-var]

    def is_on(self, factor: str) -> bool:
        """True when `factor` sits at the recipe level."""
        return getattr(self, factor) == factor_spec(factor).recipe


#: The Marin 535B-A23B recipe switches; defaults are the recipe (all on). A frozen dataclass built
#: from the factor table so that adding a row adds the field, its default and its validation.
Recipe = dataclasses.make_dataclass(
    "Recipe", [(s.name, str, field(default=s.recipe)) for s in RECIPE_FACTOR_SPECS],
    bases=(_RecipeMethods,), frozen=True,
    namespace={"__module__": __name__, "__doc__": "The recipe switches (one field per factor-table row); "
               "defaults are the recipe level. Levels: " + "; ".join(
                   f"{s.name} in {s.levels}" for s in RECIPE_FACTOR_SPECS)})


# ---- Model ---------------------------------------------------------------------------------------

QB_ESTIMATORS = ("hist", "topk")
GATED_NORM_LEVELS = ("on", "off")
KERNEL_BACKENDS = ("torch", "triton")
ATTENTION_BACKENDS = ("sdpa", "flex")
SCONV_SITES = ("k", "attn_out", "mlp_out", "v")
# "stored": every layer stores max(local, global) KV heads, a global layer uses the first n_kv_heads_global
# (Marin's hero; docs/fidelity.md "KV layout"); "per_layer": each layer stores only the heads it uses.
KV_LAYOUTS = ("stored", "per_layer")
# Router logits: "bf16" = b·W_r computed in bf16 then cast to fp32 (Marin's hero under its bf16
# compute dtype); "fp32" = fp32 throughout.
ROUTER_PRECISIONS = ("fp32", "bf16")


#: A model's sizes (widths, heads, experts, vocabulary, sequence length): 2**30 is far past any model (the hero's
#: largest is its 128,256-token vocabulary), and its products stay finite floats in the FLOP and memory accounting
SIZE_MAX = 2**30
# Numeric ranges of ModelConfig (structural constraints between fields are checked in __post_init__).
MODEL_RANGES: dict[str, tuple] = {
    **{k: int_in(1, SIZE_MAX) for k in (
        "d_model", "n_heads", "head_dim", "n_kv_heads", "n_kv_heads_global", "vocab_size", "seq_len", "window",
        "global_every", "n_experts", "top_k", "expert_hidden", "shared_hidden", "latent_ratio", "ep_shards",
        "ragged_chunks", "sconv_kernel", "gated_norm_rank", "pooled_waves")},
    # the FLOP and parameter counts visit every layer (the hero has 48)
    "n_layers": int_in(1, 10_000, "the accounting visits every layer"),
    "qb_hist_bins": int_in(2, SIZE_MAX), "n_shared_experts": int_in(0, SIZE_MAX),
    "rope_theta": POS, "norm_eps": POS, "qk_mult": POS, "combine_scale": POS, "init_trunc": POS,
    "rope_fraction": (lambda v: is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
    "router_aux_weight": NONNEG, "aux_free_rate": NONNEG, "capacity_fixed": CAPACITY,
    "capacity_ragged": CAPACITY, "capacity_pooled_wave": CAPACITY, "init_scale": POS,
    "z_loss_weight": NONNEG,
}


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one model. MoE numbers (n_experts, top_k) are the recipe's latent geometry;
    the `standard` latent_moe level divides both by `latent_ratio` and runs experts at width d
    (`full_width` keeps them and divides the expert hidden instead: `moe_geometry`)."""

    RANGES: ClassVar[dict[str, tuple]] = MODEL_RANGES  # the range rule of each numeric field

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int = 16
    n_kv_heads: int = 2  # local (sliding-window) layers
    n_kv_heads_global: int = 1  # global NoPE layers
    kv_layout: str = "stored"  # KV_LAYOUTS: how K/V heads are stored when local and global counts differ
    vocab_size: int = 256
    seq_len: int = 64
    window: int = 32  # sliding window of local layers (tokens, including self)
    global_every: int = 4  # every global_every-th layer is global (NoPE); the last layer is global too
    rope_theta: float = 10_000.0
    rope_fraction: float = 0.5  # half-RoPE on local layers: this fraction of head dims is rotated
    attn_gate: bool = True  # headwise sigmoid gate 2*sigmoid(x W_g), zero-initialised
    # GatedNorm after every RMSNorm (embedding, each block pre-norm, final), as Marin's hero
    # (experiments/grug/moe_hero_ep/model.py GatedNorm, _GATED_NORM_RANK = 128); "off" is a comparison.
    gated_norm: str = "on"
    gated_norm_rank: int = 128  # capped at d_model by `gated_norm_width` (tiny CPU widths)
    norm_eps: float = 1e-5  # learned-gain RMSNorms (Marin GrugModelConfig.layer_norm_eps)
    qk_mult: float = 1.3  # the fixed q multiplier of qk_norm=fixed_1.3
    # MoE (recipe / latent geometry)
    n_experts: int = 16
    top_k: int = 4
    expert_hidden: int = 32
    n_shared_experts: int = 2
    shared_hidden: int = 32
    latent_ratio: int = 2  # alpha: latent width = d_model // latent_ratio
    combine_scale: float = 2.5  # sigmoid combine weights renormalised to this sum
    router_aux_weight: float = 0.01  # Switch aux loss lambda (router_balance=switch_aux)
    aux_free_rate: float = 1e-3  # DeepSeek aux-free bias update speed (router_balance=aux_free)
    qb_estimator: str = "hist"  # Marin's hero and ladder (hero_recipe.py HERO_QB_HIST_BINS)
    qb_hist_bins: int = 10_000
    router_precision: str = "fp32"  # ROUTER_PRECISIONS ("bf16" at the GPU rungs and the hero, as Marin)
    # Expert parallel geometry: drops are decided as if tokens lived on ep_shards shards
    ep_shards: int = 4
    capacity_fixed: float = 1.33
    capacity_ragged: float = 1.15
    ragged_chunks: int = 2
    # pooled_wave (the hero's transport): sender pools per destination and per-wave receiver buffers,
    # both sized by this factor (Marin's ladder sets capacity_factor = pooled_transport_capacity_factor
    # = 1.15), striped over pooled_waves static waves (num_expert_waves = 3)
    capacity_pooled_wave: float = 1.15
    pooled_waves: int = 3
    # Short conv
    sconv_kernel: int = 4
    sconv_sites: tuple[str, ...] = ("k", "attn_out", "mlp_out")
    # Init / loss
    init_scale: float = 0.5  # truncated-normal sigma = init_scale / sqrt(d_model) for every matrix
    init_trunc: float = 3.0  # truncation at ±init_trunc·sigma (Marin model.py _init_weight: ±3)
    z_loss_weight: float = 1e-4
    kernels: str = "torch"
    # "sdpa": F.scaled_dot_product_attention with dense (B,1,S,S) boolean masks (the reference).
    # "flex": flex_attention with block-sparse BlockMasks and native GQA; fast only when the model is
    # torch.compile'd (eager flex is an unfused reference that materialises S×S scores, slow on GPU),
    # and on CPU it runs forward only (torch has no CPU flex backward).
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        o = "ModelConfig"
        check_ranges(o, self, MODEL_RANGES)
        check(self.d_model % self.n_heads == 0, o, "d_model",
              f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; allowed values: "
              "multiples of n_heads")
        for kv in ("n_kv_heads", "n_kv_heads_global"):
            check(self.n_heads % getattr(self, kv) == 0, o, kv,
                  f"n_heads={self.n_heads} is not divisible by {kv}={getattr(self, kv)}; allowed values: divisors "
                  "of n_heads")
        check(self.top_k <= self.n_experts, o, "top_k",
              f"top_k={self.top_k} exceeds n_experts={self.n_experts}; allowed values: 1..{self.n_experts}")
        check(self.d_model % self.latent_ratio == 0, o, "latent_ratio",
              f"latent_ratio={self.latent_ratio} does not divide d_model={self.d_model}; allowed values: "
              "divisors of d_model")
        for name in ("n_experts", "top_k"):
            check(getattr(self, name) % self.latent_ratio == 0, o, name,
                  f"{name}={getattr(self, name)} is not divisible by latent_ratio={self.latent_ratio} "
                  "(the standard level uses n_experts/alpha experts, top_k/alpha); allowed values: multiples of "
                  "latent_ratio")
        check((self.n_experts // self.latent_ratio) % self.ep_shards == 0, o, "ep_shards",
              f"ep_shards={self.ep_shards} must divide the expert count at every latent_moe level "
              f"({self.n_experts} and {self.n_experts // self.latent_ratio}); allowed values: their common divisors")
        check(self.window <= self.seq_len, o, "window",
              f"window={self.window} exceeds seq_len={self.seq_len}; allowed values: 1..{self.seq_len}")
        check(int(self.head_dim * self.rope_fraction) % 2 == 0, o, "rope_fraction",
              f"the rotated dims int(head_dim*rope_fraction)={int(self.head_dim * self.rope_fraction)} are odd; "
              "allowed values: a fraction that rotates an even number of the head's dims")
        check_level(o, "qb_estimator", self.qb_estimator, QB_ESTIMATORS)
        check_level(o, "kv_layout", self.kv_layout, KV_LAYOUTS)
        check_level(o, "router_precision", self.router_precision, ROUTER_PRECISIONS)
        check_level(o, "gated_norm", self.gated_norm, GATED_NORM_LEVELS)
        check_level(o, "kernels", self.kernels, KERNEL_BACKENDS)
        check_level(o, "attention", self.attention, ATTENTION_BACKENDS)
        for s in self.sconv_sites:
            check_level(o, "sconv_sites", s, SCONV_SITES)

    # ---- derived geometry --------------------------------------------------------------------
    def is_global(self, layer: int) -> bool:
        """Global NoPE layers: every global_every-th layer (1-based) and the last layer."""
        return (layer + 1) % self.global_every == 0 or layer == self.n_layers - 1

    def kv_heads(self, layer: int) -> int:
        """KV heads the layer's attention uses."""
        return self.n_kv_heads_global if self.is_global(layer) else self.n_kv_heads

    def kv_heads_stored(self, layer: int) -> int:
        """KV heads the layer's W_k and W_v project to (kv_layout)."""
        return max(self.n_kv_heads, self.n_kv_heads_global) if self.kv_layout == "stored" else self.kv_heads(layer)

    @property
    def gated_norm_width(self) -> int:
        """GatedNorm's low rank: gated_norm_rank, capped at d_model (CPU presets are narrower than 128)."""
        return min(self.gated_norm_rank, self.d_model)

    @property
    def latent_dim(self) -> int:
        return self.d_model // self.latent_ratio

    def moe_geometry(self, recipe: Recipe) -> "MoEGeometry":
        """Experts, top-k and expert width for the recipe's latent_moe level (docs/method.md §2.1):
        `latent` E experts top-K at width d/α behind the latent projections; `standard` E/α top-K/α at
        width d (the same routed parameters and FLOPs); `full_width` E top-K at width d with hidden m/α
        (Marin's drop_latent, fast_track/launch.py `_ablate_model`: the same per-expert parameters)."""
        a = self.latent_ratio
        if recipe.latent_moe == "latent":
            return MoEGeometry(self.n_experts, self.top_k, self.latent_dim, self.expert_hidden, True)
        if recipe.latent_moe == "full_width":
            if self.expert_hidden % a:
                raise ValueError(f"ModelConfig.expert_hidden={self.expert_hidden} is not divisible by latent_ratio={a}"
                                 " (latent_moe=full_width halves the expert hidden); allowed values: multiples of it")
            return MoEGeometry(self.n_experts, self.top_k, self.d_model, self.expert_hidden // a, False)
        return MoEGeometry(self.n_experts // a, self.top_k // a, self.d_model, self.expert_hidden, False)

    def capacity_factor(self, recipe: Recipe) -> float | None:
        return {"fixed": self.capacity_fixed, "ragged": self.capacity_ragged, "pooled_wave": self.capacity_pooled_wave,
                "dropless": None}[recipe.ep_transport]


@dataclass(frozen=True)
class MoEGeometry:
    n_experts: int
    top_k: int
    width: int  # the width the experts see (latent dim or d_model); also the dispatched row width
    hidden: int
    latent: bool


# ---- Training and data ---------------------------------------------------------------------------

LR_SCHEDULES = ("linear", "cosine", "wsd")
#: Marin's LR heuristic fits (coefficients in marin.hparams.HEURISTICS); the first is the default.
LR_HEURISTICS = ("aug_refit", "may_5951")
PRECISIONS = ("fp32", "bf16")
# The hyperball sphere of an expert stack [E, in, out]: "bank" = one per layer's whole bank (what Marin's hero
# ran), "expert" = one per expert matrix (Marin's later choice); docs/fidelity.md "expert-bank sphere".
EXPERT_SPHERES = ("bank", "expert")
# Activation checkpointing: "none" keeps every activation; "block" keeps each block's input only and
# recomputes the block in the backward (torchtitan's per-layer "full" AC).
ACTIVATION_CHECKPOINTS = ("none", "block")
# Sharded (FSDP2) runs: "bf16" gathers parameters in bf16 for compute, keeps fp32 master weights and
# reduces gradients in fp32 (Marin's hero: experiments/grug/moe_hero_ep); needs precision="bf16"
# (autocast). One process has nothing to gather or reduce: autocast alone is its bf16 compute.
MIXED_PRECISIONS = ("none", "bf16")
#: "cpu" (a host-side optimizer step) is refused for sharded runs by marin.train.distributed.check_no_host_update,
#: naming this field: the hero shards its expert state across racks instead (docs/hero.md "Memory")
OFFLOADS = ("none", "cpu")


#: Context extension's query multiplier at a stage of length L (base L0): q × (1 + c·ln(L/L0)), c by rule: "yarn"
#: 0.1 (YaRN's attention scale, arXiv 2309.00071 eq. 20, Marin's hero's), "yarn_x2" 0.2 (the other arm of Marin's
#: 4k -> 16k extension sweep); docs/fidelity.md "context extension"
CONTEXT_Q_RULES = {"yarn": 0.1, "yarn_x2": 0.2}


#: How a context stage is written: in a study file, and on the command line (`--train.context_stages=...`)
CONTEXT_STAGE_FORMS = ("ContextStage(start_frac, seq_len) in a study file, or FRAC:SEQ_LEN[,FRAC:SEQ_LEN...] on the "
                       "command line (--train.context_stages=0.5:16384,0.95:65536; empty: none)")


@dataclass(frozen=True)
class ContextStage:
    """From `start_frac` of training on, train at `seq_len` (tokens per step held constant)."""

    start_frac: float
    seq_len: int

    def __post_init__(self) -> None:
        check(is_num(self.start_frac) and 0 <= self.start_frac < 1, "TrainConfig", "context_stages",
              f"stage start_frac={self.start_frac!r} is out of range; allowed values: a number in [0, 1)")
        check(is_int(self.seq_len) and self.seq_len >= 1, "TrainConfig", "context_stages",
              f"stage seq_len={self.seq_len!r} is out of range; allowed values: an integer >= 1")


def _context_stage(s: object, i: int) -> ContextStage:
    """One stage from a ContextStage, a (start_frac, seq_len) pair, a {start_frac, seq_len} mapping (spec.json) or
    the command line's "FRAC:SEQ_LEN"."""
    if isinstance(s, ContextStage):
        return s
    if isinstance(s, str):
        frac, sep, length = s.partition(":")
        try:
            if not sep:
                raise ValueError
            return ContextStage(float(frac), int(length))
        except ValueError as e:
            if str(e).startswith("TrainConfig."):
                raise
            raise ValueError(f"TrainConfig.context_stages: stage {i} {s!r} does not parse; allowed values: "
                             f"{CONTEXT_STAGE_FORMS}") from None
    if isinstance(s, Mapping) and set(s) == {"start_frac", "seq_len"}:
        return ContextStage(s["start_frac"], s["seq_len"])
    if isinstance(s, (tuple, list)) and len(s) == 2:
        return ContextStage(*s)
    raise ValueError(f"TrainConfig.context_stages: stage {i} is {s!r}; allowed values: {CONTEXT_STAGE_FORMS}")


def check_context_stages(stages: object) -> tuple[ContextStage, ...]:
    """TrainConfig.context_stages normalised (marin.phases.check_mixture's way): a tuple of ContextStage from any
    form `_context_stage` reads (a whole command-line value "0.5:16384,0.95:65536" too), start fractions strictly
    increasing in [0, 1)."""
    if isinstance(stages, str):
        stages = tuple(x for x in stages.split(",") if x.strip())
    if not isinstance(stages, (tuple, list)):
        raise ValueError(f"TrainConfig.context_stages is {stages!r}; allowed values: {CONTEXT_STAGE_FORMS}")
    out = tuple(_context_stage(s, i) for i, s in enumerate(stages))
    fr = [s.start_frac for s in out]
    check(all(a < b for a, b in zip(fr, fr[1:], strict=False)), "TrainConfig", "context_stages",
          f"stage start fractions {fr}; allowed values: strictly increasing numbers in [0, 1)")
    return out


#: Steps of a run, token_multiplier's included: 2**40 is millions of times the hero's 390,251
STEPS_MAX = 2**40
TRAIN_RANGES: dict[str, tuple] = {
    "steps": int_in(1, STEPS_MAX), "batch_size": int_in(1, SIZE_MAX), "lr": optional(POS), "adam_lr": optional(POS),
    "adam_eps": optional(POS), "checkpoint_interval_s": NONNEG,
    "warmup_frac": FRAC, "final_lr_frac": FRAC, "weight_decay": NONNEG, "beta1": optional(MOMENTUM),
    "beta2": optional(MOMENTUM), "muon_momentum": MOMENTUM, "ns_steps": POS_INT, "grad_clip": optional(POS),
    "eval_every": NONNEG_INT, "eval_batches": POS_INT, "log_every": POS_INT, "checkpoint_every": NONNEG_INT,
    "spike_window": POS_INT, "spike_factor": (lambda v: is_num(v) and v > 1, "a finite number > 1"),
    "threads": optional(POS_INT), "flops_multiplier": POS, "seed_stream": SEED,
    "token_multiplier": int_in(1, 2**20),
    "loss_chunk_tokens": NONNEG_INT, "eval_batch_size": optional(POS_INT), "lr_scale": POS,
    "replica_groups": POS_INT, "gate_router_weight_decay": NONNEG, "gate_router_decay_start": NONNEG_INT,
    "micro_batches": POS_INT,
}


@dataclass(frozen=True)
class TrainConfig:
    RANGES: ClassVar[dict[str, tuple]] = TRAIN_RANGES  # the range rule of each numeric field

    steps: int = 200
    batch_size: int = 16  # sequences per step at the model's seq_len
    lr: float | None = None  # peak MuonH/AdamH lr (or AdamW lr); None -> marin.hparams.resolve_hparams
    adam_lr: float | None = None  # peak lr of the Adam group; None -> resolve_hparams
    lr_scale: float = 1.0  # multiplies the resolved heuristic LRs (a tuned arm's multiplier)
    lr_heuristic: str = "aug_refit"
    adam_eps: float | None = None  # None -> resolve_hparams (Marin's epsilon for Adam/AdamH, 1e-8 for AdamW)
    lr_schedule: str = "linear"
    warmup_frac: float = 0.01
    final_lr_frac: float = 0.05
    weight_decay: float = 0.1  # AdamW baseline only; Hyperball uses none
    # Decoupled decay on the attention-gate and router weights in the Adam group, annealed linearly
    # to 0 over training (Marin's hero and scaling ladder: --gate-router-weight-decay 0.02; 0 = off)
    gate_router_weight_decay: float = 0.02
    # The first step that decay applies (0 before it, then the same anneal wd·(1 - step/steps)): 0 on the
    # ladder; 58,014 for Marin's hero, which switched it on mid-run (docs/fidelity.md "gate/router decay")
    gate_router_decay_start: int = 0
    beta1: float | None = None  # None -> resolve_hparams (0.90 for Hyperball, 0.9 for AdamW)
    beta2: float | None = None  # None -> heuristic (clip(0.999^(B/131072)) / 0.95 for AdamW)
    muon_momentum: float = 0.95
    ns_steps: int = 5
    expert_sphere: str = "bank"  # EXPERT_SPHERES: MuonH/AdamH sphere of an expert stack
    activation_checkpoint: str = "none"  # ACTIVATION_CHECKPOINTS ("block" at the GPU rungs and the hero)
    loss_chunk_tokens: int = 0  # >0: lm_head + CE + z-loss in chunks of this many tokens (no full logits)
    eval_batch_size: int | None = None  # global eval sequences per batch; None -> the stage's batch_size
    grad_clip: float | None = None
    eval_every: int = 50
    eval_at_start: bool = True  # evaluate the untrained model first (where learning curves start)
    eval_batches: int = 4
    log_every: int = 10
    checkpoint_every: int = 50
    spike_window: int = 50  # a spike: loss > spike_factor * running median of the last spike_window
    spike_factor: float = 1.5
    context_stages: tuple[ContextStage, ...] = ()
    context_q_rule: str = "yarn"  # CONTEXT_Q_RULES: the q multiplier's growth with the stage's length
    precision: str = "fp32"
    mixed_precision: str = "none"  # MIXED_PRECISIONS ("bf16" at the GPU rungs and the hero)
    # Rack-local sharding (HSDP): the world as this many replicas ("racks") of world/replica_groups
    # ranks; parameters sharded inside a rack, replicated across (docs/architecture.md §5)
    replica_groups: int = 1
    device: str = "cpu"
    compile: bool = False
    offload: str = "none"  # OFFLOADS
    # >0: also a temporary checkpoint whenever this many seconds of wall clock passed since the last one
    # (Marin's hourly one), so a job's time limit never falls between two checkpoint_every saves
    checkpoint_interval_s: float = 0.0
    # torch threads of `train` (None: SLURM_CPUS_PER_TASK under SLURM, else OMP_NUM_THREADS, else 1: a CPU worker
    # at 2 threads on a shared machine was measured 7.9x slower per step than at 1)
    threads: int | None = None
    # Gradient accumulation (marin/train/accum.py): the step equals the one-batch step, so how a batch is split
    # is not part of the run id (NOT_IDENTITY); summary.json records it.
    micro_batches: int = 1
    # Planted factors of the calibration study (docs/calibration/): FLOPs counted per FLOP spent
    # (2 = "waste": same training, twice the compute counted), an extra seed stream mixed into the
    # model and data seeds (a placebo), and a multiplier on the rung's steps (more tokens, same ladder).
    flops_multiplier: float = 1.0
    seed_stream: int = 0
    token_multiplier: int = 1

    def __post_init__(self) -> None:
        o = "TrainConfig"
        check_ranges(o, self, TRAIN_RANGES)
        object.__setattr__(self, "context_stages", check_context_stages(self.context_stages))
        check(self.steps * self.token_multiplier <= STEPS_MAX, o, "token_multiplier",
              f"token_multiplier={self.token_multiplier} makes steps={self.steps} a run of "
              f"{self.steps * self.token_multiplier:,} steps; allowed values: at most {STEPS_MAX:,} steps in all")
        check_level(o, "lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_level(o, "lr_heuristic", self.lr_heuristic, LR_HEURISTICS)
        check_level(o, "precision", self.precision, PRECISIONS)
        check_level(o, "mixed_precision", self.mixed_precision, MIXED_PRECISIONS)
        check(self.mixed_precision == "none" or self.precision == "bf16", o, "mixed_precision",
              f"{self.mixed_precision!r} computes in bf16 and needs precision='bf16' (autocast), got "
              f"precision={self.precision!r}; allowed values with it: 'none'")
        check_level(o, "expert_sphere", self.expert_sphere, EXPERT_SPHERES)
        check_level(o, "context_q_rule", self.context_q_rule, tuple(CONTEXT_Q_RULES))
        check_level(o, "offload", self.offload, OFFLOADS)
        check_level(o, "activation_checkpoint", self.activation_checkpoint, ACTIVATION_CHECKPOINTS)

    def effective(self) -> "TrainConfig":
        """The schedule actually trained: steps (and eval/checkpoint cadence) times token_multiplier."""
        m = self.token_multiplier
        return self if m == 1 else replace(self, steps=self.steps * m, eval_every=self.eval_every * m,
                                           checkpoint_every=self.checkpoint_every * m, token_multiplier=1)

    def seed_offset(self) -> int:
        return seed_offset(self.seed_stream)


TOKENIZERS = ("byte", "bpe")
#: The train stream's order (marin/data/shards.py, marin/data/index.py): "documents" orders every document by
#: sha256(seed:epoch:uid) when a rank opens the corpus (~150 bytes per document per rank); "indexed" reads the
#: index `data prepare` wrote and permutes fixed windows per (seed, epoch): flat in the corpus size (the hero)
SHUFFLES = ("documents", "indexed")


DATA_RANGES: dict[str, tuple] = {
    "bpe_vocab": (lambda v: is_int(v) and 257 <= v <= 1 << 20, "an integer in 257..1048576 (256 bytes plus at least "
                                                               "one merge)"),
    "data_seed": SEED, "mixture_block": NONNEG_INT, "simulated_epoching_target": NONNEG_INT}


@dataclass(frozen=True)
class DataConfig:
    RANGES: ClassVar[dict[str, tuple]] = DATA_RANGES  # the range rule of each numeric field

    # "embedded", "paloma" when present locally, a local directory/file of text, or a prepared corpus
    # directory (`marin-ablate data prepare`: has manifest.json; its own tokenizer, `tokenizer` unused)
    corpus: str = "embedded"
    tokenizer: str = "byte"
    bpe_vocab: int = 4096
    data_seed: int = 0
    eval_domains: tuple[str, ...] = ()  # empty -> every domain of the corpus (or of eval_dir)
    # a Paloma-layout directory (DOMAIN/val/*.jsonl[.gz] | parquet): evaluate on it instead of the
    # corpus's held-out split; required for a prepared corpus, which has none
    eval_dir: str = ""
    # A data-mixture schedule (Marin's hero ladder: two phases switching at 80% of the steps): each
    # phase's start fraction of the steps and {domain: weight}; () = one stream over the whole corpus
    mixture: tuple[MixturePhase, ...] = ()
    # >0: a later phase starts at a multiple of block/gcd(block, batch) steps, rounded down (Marin's
    # mixture block of sequences, 49,152 on its hero ladder); 0: at floor(start_frac x steps)
    mixture_block: int = 0
    # Simulated epoching (levanter LmDataConfig experiment_budget / target_budget): >0, the budget in
    # tokens whose repetition a shorter run imitates: each component (each mixture domain, or the
    # corpus) is cut to its first int(n · run tokens / this) sequences and read round and round, so it
    # repeats as often as in a run of this many tokens (Marin's hero ladder: 18.75T); 0: off
    simulated_epoching_target: int = 0
    shuffle: str = "documents"  # SHUFFLES

    def __post_init__(self) -> None:
        object.__setattr__(self, "mixture", check_mixture(self.mixture))
        check_level("DataConfig", "tokenizer", self.tokenizer, TOKENIZERS)
        check_level("DataConfig", "shuffle", self.shuffle, SHUFFLES)
        check_ranges("DataConfig", self, DATA_RANGES)


#: Version of what a run computes from its spec. The run id (`RunSpec.identity_json`) hashes it, each
#: recipe switch away from its identity level and each other field away from its default: a new field
#: whose default keeps the old behaviour keeps every id; a new switch re-identifies the runs it changes.
#: Bump it when a default or what a level computes changes (tests/marin/test_run_ids.py pins them per version).
#: 3: the layout-independent init (marin.parallel.init_weights). 4: the recipe enters the id by its
#: switches away from their identity level (3: away from the recipe level, blind to a new switch).
#: 5: stored KV heads on global layers, gate/router weight decay, bf16 router logits at the GPU rungs.
#: 6: Newton–Schulz normalisation ε 1e-8 (Marin's hero path; was 1e-7).
SPEC_VERSION = 6

#: Fields that say how a run is laid out on its hardware, not what it computes: left out of the run id, so
#: the same run resumes (and keeps its id) on another GPU count with another micro-batch split.
NOT_IDENTITY: dict[str, tuple[str, ...]] = {"train": ("micro_batches",)}


@dataclass(frozen=True)
class RunSpec:
    """One run: (ModelConfig, Recipe, TrainConfig, data, seed). Its id hashes `identity_json`, so it
    changes exactly when what the run computes changes (docs/architecture.md §3)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    recipe: Recipe = field(default_factory=Recipe)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges("RunSpec", self, {"seed": SEED})
        check(not (self.model.attention == "flex" and self.train.device == "cpu"), "ModelConfig", "attention",
              "'flex' trains on CUDA only (torch has no flex_attention backward on CPU); allowed values with "
              "TrainConfig.device='cpu': 'sdpa'")
        # Eager flex_attention is torch's unfused reference: it materialises fp32 (B, H, S, S) scores
        # (51.5 GB per tensor at the hero's shape), so on a GPU flex runs compiled or not at all.
        check(not (self.model.attention == "flex" and self.train.device.startswith("cuda") and not self.train.compile),
              "ModelConfig", "attention",
              "'flex' on CUDA needs TrainConfig.compile=True (eager flex materialises (B, H, S, S) scores); "
              "allowed values with TrainConfig.compile=False: 'sdpa'")

    def to_dict(self) -> dict:
        return to_dict(self)

    def with_overrides(self, items: Sequence[str]) -> "RunSpec":
        """`section.field=value` items (marin.fields.split_overrides; `--section.field=value` on the command line)
        applied to this spec."""
        by_section = {s: v for s, v in split_overrides(items).items() if v}
        return replace(self, **{s: apply_overrides(getattr(self, s), v) for s, v in by_section.items()})

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def identity_json(self) -> str:
        """What the run id hashes: the spec version, each recipe switch away from its identity level
        (a new switch at its default changes the id) and each other value away from its default."""
        ident = non_default(self)
        ident.pop("recipe", None)
        for section, names in NOT_IDENTITY.items():
            for name in names:
                ident.get(section, {}).pop(name, None)
            if section in ident and not ident[section]:
                del ident[section]
        recipe = {k: v for k, v in to_dict(self.recipe).items() if v != IDENTITY_LEVELS[k]}
        if recipe:
            ident["recipe"] = recipe
        return json.dumps({"spec_version": SPEC_VERSION, **ident}, sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def run_id(self) -> str:
        """Computed once per spec (a study's plan asks for it many times)."""
        return hashlib.sha256(self.identity_json().encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, d: Mapping) -> "RunSpec":
        # lists in JSON; context stages and mixture phases are normalised by their config's __post_init__
        model = dict(d.get("model", {}))
        if "sconv_sites" in model:
            model["sconv_sites"] = tuple(model["sconv_sites"])
        data = dict(d.get("data", {}))
        if "eval_domains" in data:
            data["eval_domains"] = tuple(data["eval_domains"])
        return cls(model=ModelConfig(**model), recipe=Recipe(**d.get("recipe", {})),
                   train=TrainConfig(**d.get("train", {})), data=DataConfig(**data), seed=int(d.get("seed", 0)))
