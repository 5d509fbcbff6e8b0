"""One resolver for a run's optimizer hyperparameters: peak LR per group, Adam ε, betas.

Studies (`ablations.ladders.Rung`), `marin-ablate train` and `marin.update_rules.build_optimizer` all call
`resolve_hparams(spec)`; a rung or a tuned arm sets only `TrainConfig.lr_scale`. Pure arithmetic, never imports
torch. Marin's compute-scaling heuristic (experiments/grug/moe_hero_ep/heuristic.py `MoeHeuristic`; its
formulas in docs/method.md §2.1 "Hyperball"): the default `aug_refit` is the August LR-sweep refit the hero
used, `may_5951` the earlier May fit, kept as a named comparison (`HEURISTICS` holds both fits' coefficients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from marin_ablate.marin.config import LR_HEURISTICS, RunSpec, TrainConfig
from marin_ablate.marin.optimizers import optimizer_level

#: What a peer runs with AdamW (nanoGPT / GPT-3 betas, PyTorch's default ε).
ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8


@dataclass(frozen=True)
class LRHeuristic:
    """Marin's `MoeHeuristic`: peak LRs, ε and β2 from the token budget, width and batch."""

    name: str
    coeff: float
    tokens_exp: float
    dim_exp: float
    beta1: float
    muonh_ratio: float = 13 / 3
    cap: float = 0.05
    eps_coeff: float = 9.676e-18

    def adam_lr(self, tokens: float, d_model: int, tokens_per_batch: int) -> float:
        return min(self.cap, self.coeff * tokens**self.tokens_exp * d_model**self.dim_exp * math.sqrt(tokens_per_batch))

    def muonh_lr(self, tokens: float, d_model: int, tokens_per_batch: int) -> float:
        return min(self.cap, self.muonh_ratio * self.adam_lr(tokens, d_model, tokens_per_batch))

    def eps(self, tokens: float, tokens_per_batch: int) -> float:
        return self.eps_coeff * math.sqrt(tokens / tokens_per_batch)

    @staticmethod
    def beta2(tokens_per_batch: int) -> float:
        return max(0.95, min(0.9999, 0.999 ** (tokens_per_batch / 131_072)))


HEURISTICS: dict[str, LRHeuristic] = {
    "aug_refit": LRHeuristic("aug_refit", coeff=0.087571, tokens_exp=-0.3461, dim_exp=-0.3448, beta1=0.90),
    "may_5951": LRHeuristic("may_5951", coeff=0.06602, tokens_exp=-0.395, dim_exp=-0.150, beta1=0.9062),
}
assert tuple(HEURISTICS) == LR_HEURISTICS


def heuristic(name: str) -> LRHeuristic:
    if name not in HEURISTICS:
        raise ValueError(f"TrainConfig.lr_heuristic={name!r} is not a known level; "
                         f"allowed values: {', '.join(HEURISTICS)}")
    return HEURISTICS[name]


@dataclass(frozen=True)
class OptimHparams:
    """Resolved peak learning rates, betas and ε of one run."""

    level: str  # Recipe.optimizer
    lr: float  # peak lr of the matrix group (MuonH / AdamH η, Muon lr, or AdamW lr)
    adam_lr: float  # peak lr of the Adam / AdamW group
    beta1: float
    beta2: float
    weight_decay: float  # used by the AdamW/Muon baselines only
    momentum: float
    ns_steps: int
    eps: float = ADAMW_EPS  # ε of every Adam-family group (Adam, AdamH, AdamW)
    expert_sphere: str = "bank"  # TrainConfig.expert_sphere: one hyperball per expert bank or per expert
    gate_router_weight_decay: float = 0.0  # Adam-group decay of gate and router weights, annealed to 0


def _hyperball_rule(h: LRHeuristic, tokens: float, d: int, tokens_per_batch: int, adam_lr: float,
                    t: TrainConfig) -> tuple[float, float, float, float, float]:
    """hyperball, adamh: η = η_MuonH, Adam group adam_lr, Marin's β1/β2/ε."""
    lr = t.lr_scale * h.muonh_lr(tokens, d, tokens_per_batch)
    return lr, adam_lr, h.beta1, h.beta2(tokens_per_batch), h.eps(tokens, tokens_per_batch)


def _adamw_rule(h: LRHeuristic, tokens: float, d: int, tokens_per_batch: int, adam_lr: float,
                t: TrainConfig) -> tuple[float, float, float, float, float]:
    """adamw: one lr everywhere (adam_lr, what a peer runs), betas (0.9, 0.95), ε 1e-8."""
    lr = t.lr if t.lr is not None else adam_lr
    return lr, lr, *ADAMW_BETAS, ADAMW_EPS


def _muon_adamw_rule(h: LRHeuristic, tokens: float, d: int, tokens_per_batch: int, adam_lr: float,
                     t: TrainConfig) -> tuple[float, float, float, float, float]:
    """muon_adamw: Muon's update is RMS-matched to AdamW's (Moonlight scale 0.2·√max(m, n)), so Muon
    shares AdamW's lr, not the Hyperball η (a MuonH η is a relative step on a fixed-norm sphere, a
    different quantity); betas and ε as AdamW."""
    return adam_lr, adam_lr, *ADAMW_BETAS, ADAMW_EPS


#: name -> rule(heuristic, tokens D, d_model, tokens per batch B, heuristic adam_lr, train) ->
#: (lr, adam_lr, β1, β2, ε) before explicit TrainConfig values; `marin.optimizers.OptimizerLevel.hparams`.
HPARAM_RULES = {"hyperball": _hyperball_rule, "adamw": _adamw_rule, "muon_adamw": _muon_adamw_rule}


def resolve_hparams(spec: RunSpec) -> OptimHparams:
    """The run's hyperparameters: the level's rule (`HPARAM_RULES`) on the heuristic's values ×
    `lr_scale`; explicit TrainConfig values (lr, adam_lr, beta1, beta2, adam_eps) win."""
    t: TrainConfig = spec.train.effective()  # D is the tokens the run trains (token_multiplier included)
    level = optimizer_level(spec.recipe.optimizer)
    rule = HPARAM_RULES[level.hparams] if isinstance(level.hparams, str) else level.hparams
    h = heuristic(t.lr_heuristic)
    tokens_per_batch = t.batch_size * spec.model.seq_len
    tokens = float(t.steps * tokens_per_batch)
    d = spec.model.d_model
    adam_lr = t.adam_lr if t.adam_lr is not None else t.lr_scale * h.adam_lr(tokens, d, tokens_per_batch)
    lr, adam_lr, b1, b2, eps = rule(h, tokens, d, tokens_per_batch, adam_lr, t)
    lr = t.lr if t.lr is not None else lr
    b1 = t.beta1 if t.beta1 is not None else b1
    b2 = t.beta2 if t.beta2 is not None else b2
    eps = t.adam_eps if t.adam_eps is not None else eps
    return OptimHparams(level.name, float(lr), float(adam_lr), float(b1), float(b2), float(t.weight_decay),
                        float(t.muon_momentum), int(t.ns_steps), float(eps), t.expert_sphere,
                        float(t.gate_router_weight_decay))
