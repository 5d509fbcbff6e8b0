"""Scale ladders: rungs of one model family, each sized by tokens per active parameter. A `Rung` turns into
(ModelConfig, TrainConfig): the preset plus overrides, tokens = tokens_per_active_param x active parameters
(rounded to whole steps), the batch, and a multiplier of the peak LRs that `marin.hparams.resolve_hparams` (the
resolver `train` uses too) derives from Marin's heuristic. Parameter and FLOP counts are `marin.flops`'s
(analytic, docs/method.md §2.2), re-exported here for the studies. No torch import."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from marin_ablate.marin.config import (
    LR_HEURISTICS,
    DataConfig,
    MixturePhase,
    ModelConfig,
    Recipe,
    RunSpec,
    TrainConfig,
    apply_overrides,
    check_mixture,
)
from marin_ablate.marin.flops import flops_per_token, params_active, params_active_marin, params_total  # noqa: F401  (re-exported)
from marin_ablate.marin.hparams import OptimHparams, resolve_hparams
from marin_ablate.marin.presets import preset


@dataclass(frozen=True)
class Rung:
    """One scale: a preset plus model overrides, a token budget, a batch and resources.
    tokens = tokens_per_active_param x params_active(model, reference recipe), rounded up to whole
    steps of batch_size x seq_len tokens. The reference recipe is `Recipe()` (all on) so every arm
    of a study trains on the same tokens in the same order (paired comparisons, docs/architecture.md §3), while its
    own FLOPs differ (docs/method.md §4.2 uses each run's own FLOPs)."""

    name: str
    preset: str
    model_overrides: Any = ()  # Mapping[field, value] of ModelConfig (width/depth/heads/experts ...)
    tokens_per_active_param: float = 60.0
    batch_size: int = 8  # sequences per step
    fixed_steps: int | None = None  # set the steps directly (CPU rungs sized by wall time); overrides tpp
    device: str = "cpu"
    precision: str = "fp32"
    threads: int | None = 1
    gpus: int = 0  # GPUs per run (0: CPU)
    # CPU runs under SLURM: nodes x tasks_per_node ranks (EP groups of ModelConfig.ep_shards ranks)
    nodes: int = 1
    tasks_per_node: int = 1
    # Hold this many tokens on each EP shard: ep_shards = batch·seq / tokens_per_ep_shard, as Marin's
    # ablations hold 65,536 (about 16 documents; drops depend on it: small_scale_abl_launch.py TARGETS).
    # None keeps the preset's ep_shards (CPU rungs).
    tokens_per_ep_shard: int | None = None
    train_overrides: Any = ()  # Mapping[field, value] of TrainConfig (eval_every, log_every ...)
    est_tokens_per_s: float | None = None  # CPU budgeting assumption, one run on its own core(s)
    overhead_s: float = 0.0  # per-run start-up + eval + checkpoint estimate (budgeting only)
    lr_heuristic: str = LR_HEURISTICS[0]  # TrainConfig.lr_heuristic of the rung's runs
    nearest_step: bool = False  # steps = round(target / tokens per step) (Marin's hero ladder); else ceil
    evals_per_run: int | None = None  # eval every steps/evals_per_run steps (Marin's hero ladder: 20, every 5%)
    # the rung's data-mixture schedule over the embedded corpus's domains (DataConfig.mixture phases;
    # Marin's hero ladder: HERO_MIXTURE); used when the study trains on the embedded corpus and sets
    # no mixture of its own. () keeps the study's DataConfig
    mixture: tuple[MixturePhase, ...] = ()
    mixture_block: int = 0  # DataConfig.mixture_block with `mixture` (Marin's hero ladder: 49,152 sequences)
    # DataConfig.simulated_epoching_target of the rung's runs (Marin's hero ladder: the hero's 18.75T, so
    # each data component repeats as in the hero); 0: off. A study's own nonzero value wins
    simulated_epoching_target: int = 0

    def __post_init__(self) -> None:
        for attr in ("model_overrides", "train_overrides"):
            v = getattr(self, attr)
            object.__setattr__(self, attr, tuple(sorted(dict(v).items())) if isinstance(v, Mapping) else tuple(v))
        if self.tokens_per_active_param <= 0:
            raise ValueError(f"Rung {self.name!r}: tokens_per_active_param must be > 0, "
                             f"got {self.tokens_per_active_param}")
        for attr in ("fixed_steps", "nodes", "tasks_per_node", "batch_size", "evals_per_run"):
            v = getattr(self, attr)
            if v is not None and v < 1:
                raise ValueError(f"Rung {self.name!r}: {attr} must be >= 1, got {v}")
        try:
            object.__setattr__(self, "mixture", check_mixture(self.mixture))
        except ValueError as e:
            raise ValueError(f"Rung {self.name!r}: {e}") from None
        m = self.model()  # validates preset and overrides now, naming the field
        if self.gpus > 1 and self.gpus % m.ep_shards and m.ep_shards % self.gpus:
            raise ValueError(f"Rung {self.name!r}: gpus={self.gpus} neither divides nor is a multiple of "
                             f"ep_shards={m.ep_shards}; allowed values: divisors of {m.ep_shards} (each GPU holds "
                             f"whole EP shards, 1: virtual EP in one process) or multiples of {m.ep_shards}")

    def model(self) -> ModelConfig:
        try:
            cfg = apply_overrides(preset(self.preset), dict(self.model_overrides))
            if self.tokens_per_ep_shard is not None:
                tokens = self.batch_size * cfg.seq_len
                if tokens % self.tokens_per_ep_shard:
                    raise ValueError(f"tokens_per_ep_shard={self.tokens_per_ep_shard} must divide the "
                                     f"{tokens} tokens of a step (batch_size x seq_len)")
                cfg = replace(cfg, ep_shards=tokens // self.tokens_per_ep_shard)
            return cfg
        except ValueError as e:
            raise ValueError(f"Rung {self.name!r}: {e}") from None

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model().seq_len

    def steps(self) -> int:
        if self.fixed_steps is not None:
            return self.fixed_steps
        # Marin's convention (small_scale_abl_launch.py _active_params): tokens per active parameter
        # count no embedding, lm_head, norms, gates, SConv or GatedNorm.
        target = self.tokens_per_active_param * params_active_marin(self.model(), Recipe())
        steps = round(target / self.tokens_per_step) if self.nearest_step else math.ceil(target / self.tokens_per_step)
        return max(1, steps)

    def tokens(self) -> int:
        return self.steps() * self.tokens_per_step

    def hparams(self, recipe: Recipe = Recipe(), lr_multiplier: float = 1.0) -> OptimHparams:
        """The resolved optimizer hyperparameters of an arm at this rung (`marin.hparams`)."""
        return resolve_hparams(RunSpec(model=self.model(), recipe=recipe,
                                       train=self.train_config(recipe, lr_multiplier)))

    def train_config(self, recipe: Recipe = Recipe(), lr_multiplier: float = 1.0) -> TrainConfig:
        """TrainConfig for one arm. Peak LRs stay unset (resolved from the spec by `resolve_hparams`);
        `lr_multiplier` carries a per-arm tuned LR up the ladder as `TrainConfig.lr_scale`."""
        if lr_multiplier <= 0:
            raise ValueError(f"lr_multiplier must be > 0, got {lr_multiplier}")
        steps = self.steps()
        base = dict(steps=steps, batch_size=self.batch_size, lr_scale=float(lr_multiplier),
                    lr_heuristic=self.lr_heuristic, device=self.device, precision=self.precision,
                    threads=self.threads, eval_every=steps, checkpoint_every=max(1, steps // 4),
                    log_every=max(1, min(10, steps // 20)))
        base.update(dict(self.train_overrides))
        if self.evals_per_run is not None:
            base["eval_every"] = max(1, round(steps / self.evals_per_run))
        try:
            return TrainConfig(**base)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Rung {self.name!r}: {e}") from None

    def est_wall_s(self) -> float | None:
        """Budget estimate of one run's wall time on its own core(s); None without a throughput."""
        if self.est_tokens_per_s is None:
            return None
        return self.tokens() / self.est_tokens_per_s + self.overhead_s

    def describe(self, recipe: Recipe = Recipe()) -> dict:
        cfg = self.model()
        hp = self.hparams(recipe)
        out = {
            "name": self.name, "preset": self.preset, "model_overrides": dict(self.model_overrides),
            "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "head_dim": cfg.head_dim,
            "n_experts": cfg.n_experts, "top_k": cfg.top_k, "seq_len": cfg.seq_len, "vocab_size": cfg.vocab_size,
            "params_active": params_active(cfg, recipe), "params_total": params_total(cfg, recipe),
            "params_active_marin": params_active_marin(cfg, recipe),
            "tokens_per_active_param": round(self.tokens() / params_active_marin(cfg, Recipe()), 4),
            # each rank's tokens, as training holds them: EP spans a rack, racks replicate (replica_groups)
            "ep_shards": cfg.ep_shards,
            "tokens_per_ep_shard": self.tokens_per_step // (cfg.ep_shards * self.train_config().replica_groups),
            "tokens": self.tokens(),
            "batch_size": self.batch_size, "tokens_per_step": self.tokens_per_step, "steps": self.steps(),
            "optimizer": hp.level, "lr": hp.lr, "lr_adam": hp.adam_lr, "beta1": hp.beta1, "beta2": hp.beta2,
            "adam_eps": hp.eps, "lr_heuristic": self.lr_heuristic,
            "device": self.device, "precision": self.precision, "threads": self.threads, "gpus": self.gpus,
            "flops_per_token": flops_per_token(cfg, recipe),
        }
        if self.est_tokens_per_s is not None:
            out.update(est_tokens_per_s=self.est_tokens_per_s, est_wall_s=round(self.est_wall_s(), 1))
        return out


# ---- Ladders used by the studies -----------------------------------------------------------------

#: CPU rungs for the smoke study (presets cpu_s/cpu_m/cpu_l; seq 128, byte vocab, 16 experts top-4,
#: batch 8 = 1024 tokens per step). They are sized by wall time, not tokens per parameter: steps are
#: fixed so the 48-run smoke fits 10 minutes on 2 cores (budget in `ablations.studies.smoke`).
#: est_tokens_per_s assumes ONE thread per run with the other core busy with the other run. Measured
#: 2026-11-29 (all-on recipe, 40 steps, 1 thread, machine shared with other jobs, load ~6 on 2 cores):
#: cpu_s 7.9k tok/s (14.9 s wall incl. ~5 s start-up/eval), cpu_m 3.8k, cpu_l 0.96k (68.8 s, ~7 s overhead).
#: The assumptions below are ~2-3x those contended numbers (one process per core); re-measure.
#: GatedNorm (on in every arm) costs ~11% at cpu_s: benchmarks/train_step.py, 2026-12-01, best of two
#: contended runs, 20 steps, on/off: all-on 13.0k/14.6k tok/s, all-off 18.8k/21.2k tok/s (ratio 0.89
#: both). The quiet-machine smoke rates (all-off 25.8k, all-on 15.8k) become ~23.0k/14.1k, mean ~18.5k,
#: so cpu_s{n}'s 15,000 stays a conservative assumption: `plan smoke` 652 core-s, ~5.4 min on 2 cores.
CPU_RUNGS: dict[str, Rung] = {
    "cpu_s": Rung("cpu_s", "cpu_s", fixed_steps=128, batch_size=8, est_tokens_per_s=15_000, overhead_s=6.0),
    "cpu_m": Rung("cpu_m", "cpu_m", fixed_steps=64, batch_size=8, est_tokens_per_s=6_000, overhead_s=6.0),
    "cpu_l": Rung("cpu_l", "cpu_l", fixed_steps=48, batch_size=8, est_tokens_per_s=3_000, overhead_s=7.0),
    # A token ladder at width 64 for the smoke study: compute grows 8x by training longer. On two
    # cores a width ladder cannot give the baseline enough tokens per parameter for its loss to fall
    # with compute (measured: all-off at cpu_s/m/l, 96 steps each: 3.13, 3.31, 3.30).
    # Runs of 1-30 s: no periodic checkpoint (a CPU run keeps none when it completes, and Ctrl-C still writes
    # one where it stops) and no eval of the untrained model (the analysis reads the final eval): measured
    # (cProfile, loaded machine), the two took 2.7 of a cpu_s32 run's 12.2 s (benchmarks/RESULTS.md, "The main
    # job's cost").
    **{f"cpu_s{n}": Rung(f"cpu_s{n}", "cpu_s", fixed_steps=n, batch_size=8, est_tokens_per_s=15_000, overhead_s=1.0,
                         train_overrides={"checkpoint_every": 0, "eval_at_start": False})
       for n in (16, 32, 64, 128, 256, 512, 1024)},
}


#: Tokens each EP shard holds on every GPU rung (Marin: 16 sequences of 4,096 per shard).
TOKENS_PER_EP_SHARD = 65_536


def _gpu(name: str, batch: int, gpus: int, **changes: Any) -> Rung:
    # Marin's fast ladder: 60 tokens per active parameter, bf16 on GPU, on the fast path (flex
    # attention, Triton kernels, compiled blocks; benchmarks/gpu.py checks it); EP shards follow the
    # batch so every shard holds TOKENS_PER_EP_SHARD tokens.
    fields = dict(preset=name, tokens_per_active_param=60.0, batch_size=batch, device="cuda", precision="bf16",
                  threads=None, gpus=gpus, tokens_per_ep_shard=TOKENS_PER_EP_SHARD,
                  model_overrides={"attention": "flex", "kernels": "triton"},
                  train_overrides={"eval_every": 500, "checkpoint_every": 500, "log_every": 10, "compile": True,
                                   "activation_checkpoint": "block", "mixed_precision": "bf16"})
    return Rung(name, **{**fields, **changes})


#: GPU rungs with the hero's routing geometry (presets._rung: 384 experts top-8, latent d/2, seq 4096)
#: and Marin's fast-ladder batches (128 sequences at d512/d768, 256 at d1024), doubling above. One EP
#: shard per GPU (world = EP, one data-parallel group): EP of 16 cannot run on 8 GPUs, and d512's 128
#: sequences on one GPU need ~206 GiB (`plan marin535 --dry_run --dry_run.gpus 1`; 29 GiB per GPU at 8).
GPU_RUNGS: dict[str, Rung] = {
    "d512": _gpu("d512", 128, 8),
    "d768": _gpu("d768", 128, 8),
    "d1024": _gpu("d1024", 256, 16),
    "d1536": _gpu("d1536", 512, 32),
    "d2048": _gpu("d2048", 1024, 64),
}

#: Marin's hero scaling ladder (experiments/grug/moe_hero_ep/launch_scaling_ladder.py): the same
#: widths 12x overtrained, 791 tokens per active parameter (18T at the d6144 hero), batch 1,024
#: sequences per GB200 rack (64 GPUs, 65,536 tokens per EP shard), the 128k Marin tokenizer, eval
#: every 5%, steps rounded to the nearest (11,420 / 15,276 / 15,128 / 20,072 as its table). EP spans
#: one rack (64 shards), replicated across racks, so ep_shards is 64 whatever the rack count; its d512
#: rung runs on one 8-GPU H100 node (`HERO_H100_GPUS`, 3,930 steps).
GPU_DATA = DataConfig(tokenizer="bpe", bpe_vocab=16_384)  # the GPU rungs' 16k vocab (docs/method.md §2.2)

HERO_LADDER_RACKS: dict[str, int] = {"d768": 1, "d1024": 2, "d1536": 6, "d2048": 11}
HERO_LADDER_TPP = 791.0
#: Marin's hero and its ladder train on a phased mixture whose cooldown starts at 80% of the steps
#: (launch_datakit_moe_mix.py `_PHASE_1_START_FRACTION`). Its weights are over 200 cluster x quality
#: cells of Marin's store, none of which is a domain of the embedded corpus, so the weights here are
#: ours: the four embedded domains equally, then a cooldown that doubles docs and code
#: (docs/fidelity.md "data mixture" says what maps and what does not).
HERO_MIXTURE_SWITCH = 0.8
HERO_MIXTURE_BLOCK = 49_152  # launch_datakit_moe_mix.py `_MIXTURE_BLOCK_SIZE`: the switch is block-aligned
HERO_MIXTURE: tuple[MixturePhase, ...] = check_mixture((
    (0.0, {"prose": 1.0, "scripture": 1.0, "docs": 1.0, "code": 1.0}),
    (HERO_MIXTURE_SWITCH, {"prose": 1.0, "scripture": 1.0, "docs": 2.0, "code": 2.0}),
))


#: Marin's hero ladder slices each data cell as if it trained the hero's budget (simulated epoching,
#: harrier_mix_2026_08_18.py: target TOTAL_TOKENS = 15T + 3.75T, on for runs <= 1e23 FLOPs, i.e. every
#: rung below the d6144 hero, which trains on the raw mixture)
HERO_EPOCHING_TARGET = 18_750_000_000_000


def _hero_rung(d: str, racks: int, gpus_per_rack: int = 64) -> Rung:
    r = _gpu(f"hero_{d}", 1024 * racks, gpus_per_rack * racks, preset=d, tokens_per_active_param=HERO_LADDER_TPP,
             nearest_step=True, evals_per_run=20, tokens_per_ep_shard=None, mixture=HERO_MIXTURE,
             mixture_block=HERO_MIXTURE_BLOCK, simulated_epoching_target=HERO_EPOCHING_TARGET,
             model_overrides={"attention": "flex", "kernels": "triton", "vocab_size": 128_256,
                              "ep_shards": gpus_per_rack})
    # rack-local sharding (HSDP) as the hero's: one copy of the model per rack, replicated across racks
    return replace(r, train_overrides={**dict(r.train_overrides), "replica_groups": racks})


#: Marin's H100 rung of the same ladder (launch_h100_scaling_ladder.py, d512: one node of 8 H100s, EP 8,
#: 1,024 sequences per step, 3,930 steps, 16B tokens): every EP shard holds 128 sequences (524,288 tokens),
#: 8x the GB200 rungs' 65,536, as Marin runs it
HERO_H100_GPUS = 8
HERO_RUNGS: dict[str, Rung] = {
    "hero_d512": _hero_rung("d512", 1, gpus_per_rack=HERO_H100_GPUS),
    **{f"hero_{d}": _hero_rung(d, racks) for d, racks in HERO_LADDER_RACKS.items()},
}

@dataclass(frozen=True)
class PublishedLaw:
    """A ladder's law L = L∞ + A·C^(−α) as its authors state it (C = training FLOPs): a study that pins it
    reads every multiplier through its L∞ and α, as the authors read theirs (`sweeps.reference.pin_published`)."""

    linf: float
    alpha: float
    A: float
    c_lo: float  # the compute span it was fitted on
    c_hi: float
    n: int  # runs it was fitted on
    source: str


#: Marin's fast ladder (experiments/grug/fast_track/README.md "Scaling law": the four MoE rungs d512..d1280,
#: Paloma macro loss, L∞ pinned at 1.2): the law its hold-one-feature-out Sc/Sw numbers are read through
FAST_LADDER_LAW = PublishedLaw(1.2, 0.0842, 58.67, 3.5e17, 4.3e19, 4,
                               "Marin's fast ladder, L = 1.2 + 58.67·C^(−0.0842) (experiments/grug/fast_track/"
                               "README.md, MoE rows, Paloma macro loss)")

#: The ladder families: a study's rungs come from one (analysis/calibration/precision.py proposes its other rungs).
LADDERS: dict[str, dict[str, Rung]] = {"cpu": CPU_RUNGS, "gpu": GPU_RUNGS, "hero": HERO_RUNGS}
RUNGS: dict[str, Rung] = {name: r for family in LADDERS.values() for name, r in family.items()}


def ladder_family(names: "list[str] | tuple[str, ...]") -> dict[str, Rung]:
    """The registered ladder family holding every rung named ({} when none does)."""
    return next((fam for fam in LADDERS.values() if all(n in fam for n in names)), {})


def get_rung(rung: str | Rung) -> Rung:
    if isinstance(rung, Rung):
        return rung
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; allowed values: {', '.join(RUNGS)}")
    return RUNGS[rung]


def ladder(names: "list[str | Rung] | tuple[str | Rung, ...]") -> tuple[Rung, ...]:
    """Rungs by name (or Rung objects), validated, in the given order; names must be distinct."""
    out = tuple(get_rung(r) for r in names)
    if not out:
        raise ValueError("a ladder needs at least one rung")
    names_ = [r.name for r in out]
    if len(set(names_)) != len(names_):
        raise ValueError(f"rung names repeat: {names_}")
    return out


def rung_of_preset(preset_name: str) -> dict | None:
    """The batch, EP shards, token budget and overrides of the ladder rung named like the preset, else None."""
    rung = RUNGS.get(preset_name)
    if rung is None or rung.preset != preset_name:
        return None
    # what the rung trains beyond the preset (the GPU rungs: flex attention, triton kernels, compile)
    over = {**{f"model.{k}": v for k, v in dict(rung.model_overrides).items()},
            **{f"train.{k}": v for k, v in dict(rung.train_overrides).items()}}
    return {"ep_shards": rung.model().ep_shards, "batch_sequences": rung.batch_size,
            "tokens_per_step": rung.tokens_per_step, "steps": rung.steps(), "tokens": rung.tokens(),
            "replica_groups": rung.train_config().replica_groups,
            "rung_overrides": " ".join(f"{k}={v}" for k, v in over.items()) or "(none)"}
