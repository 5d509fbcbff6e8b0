"""The optimizer registry: one row per update rule (`GroupKind`) and one per `Recipe.optimizer` level.

A level maps each parameter role (the model's `param_roles()`) to a kind (`GroupKind`'s fields say what a
kind does) and names the roles whose Adam group takes Marin's annealed gate/router decay. The trainer
(`marin.update_rules`), the hyperparameter resolver (`marin.hparams`), the plan's dry run (`planning/dryrun.py`)
and the hero's checkpoint plan (`planning/hero.py`) all read these tables. Adding an optimizer is one
`marin.switches.register_optimizer(...)` call (docs/extending.md, "Adding an optimizer or an executor"): it adds
the level to the recipe's optimizer factor too, which reads this table. Pure Python; never imports torch: a
kind's `update` is the import path ("module:function") of its torch step, resolved by `marin.update_rules`.
Table of levels: docs/method.md §2.1.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

ROLES = ("matrix", "expert", "lm_head", "embed", "router", "gate", "norm", "sconv")
NO_DECAY_ROLES = ("norm", "sconv")  # no decay on gains or the identity-init conv taps, whatever the level
LR_GROUPS = ("matrix", "adam")  # which resolved peak lr a kind takes: OptimHparams.lr or .adam_lr
#: Newton–Schulz coefficient schedules (a, b, c) per iteration, as marin.update_rules's module docstring derives them
NS_SCHEDULES: dict[str, tuple[tuple[float, float, float], ...]] = {
    "quintic": ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)),
    "simple": ((3.4445, -4.7750, 2.0315),),
}
NS_COEFFS = NS_SCHEDULES["quintic"]  # the schedule MuonH and Muon use


@dataclass(frozen=True)
class GroupKind:
    """One update rule. `update` is "module:function" (or the function) of signature
    `(opt: marin.update_rules.MarinOptimizer, p: Tensor, group: dict) -> None`, stepping one parameter;
    `batched` (optional) the same step of a list of a group's parameters at once, `(opt, params, group)`."""

    name: str
    state_buffers: int  # fp32 buffers per parameter element (momentum: 1; Adam moments: 2)
    orthogonalizes: bool  # Newton–Schulz on the direction (a transient of one whole matrix)
    lr: str  # LR_GROUPS
    decays: bool  # decoupled weight decay (TrainConfig.weight_decay) outside NO_DECAY_ROLES
    on_sphere: bool  # projected back onto its init Frobenius norm (needs a nonzero init)
    update: Any  # str "module:function" or a callable
    batched: Any = None  # str "module:function" or a callable; None: `update` per parameter

    def __post_init__(self) -> None:
        if self.lr not in LR_GROUPS:
            raise ValueError(f"GroupKind {self.name!r}: lr={self.lr!r}; allowed values: {', '.join(LR_GROUPS)}")
        if not (isinstance(self.state_buffers, int) and self.state_buffers >= 0):
            raise ValueError(f"GroupKind {self.name!r}: state_buffers={self.state_buffers!r}; "
                             "allowed values: an integer >= 0")

    @property
    def state_bytes(self) -> int:
        """Optimizer state bytes per parameter element (fp32 buffers)."""
        return 4 * self.state_buffers


@dataclass(frozen=True)
class OptimizerLevel:
    """One level of `Recipe.optimizer`: role -> kind (`default` for roles not listed), its
    hyperparameter rule (a name in `marin.hparams.HPARAM_RULES`, or a function of that signature) and
    `annealed_decay`: roles whose (non-decaying, off-sphere) group takes
    `OptimHparams.gate_router_weight_decay`, annealed linearly to 0 (Marin hero/optimizer.py
    `_scale_by_adam_gate_router_decay`: the attention-gate and router weights, not the bias)."""

    name: str
    kinds: Any  # Mapping[role -> kind name]; stored as sorted pairs
    default: str
    hparams: Any  # str or callable
    doc: str = ""
    annealed_decay: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        k = dict(self.kinds)
        bad = [r for r in (*k, *self.annealed_decay) if r not in ROLES]
        if bad:
            raise ValueError(f"OptimizerLevel {self.name!r}: roles {bad}; allowed values: {', '.join(ROLES)}")
        object.__setattr__(self, "kinds", tuple(sorted(k.items())))
        object.__setattr__(self, "annealed_decay", tuple(self.annealed_decay))

    def group_kinds(self) -> dict[str, str]:
        m = dict(self.kinds)
        return {r: m.get(r, self.default) for r in ROLES}

    def check_kinds(self, kinds: dict[str, GroupKind]) -> None:
        """Every kind is registered, and an annealed-decay role sits in a kind with no decay of its own
        and no sphere (one decay per parameter; a sphere fixes the norm decay would shrink)."""
        gk = self.group_kinds()
        unknown = sorted({k for k in gk.values() if k not in kinds})
        if unknown:
            raise ValueError(f"OptimizerLevel {self.name!r}: kinds {unknown} are not registered; "
                             f"allowed values: {', '.join(kinds)}")
        allowed = [r for r in ROLES if r not in NO_DECAY_ROLES and not kinds[gk[r]].decays
                   and not kinds[gk[r]].on_sphere]
        bad = [r for r in self.annealed_decay if r not in allowed]
        if bad:
            raise ValueError(f"OptimizerLevel {self.name!r}: annealed_decay roles {bad}; allowed values: "
                             f"{', '.join(allowed) or '(none: every role decays, sits on a sphere or never decays)'}")


_MARIN = "marin_ablate.marin.update_rules:"
_BATCHED = "marin_ablate.marin.batched_updates:"
GATE_ROUTER = ("gate", "router")  # Hyperball's Adam group decays these (OptimizerLevel.annealed_decay)
KINDS: dict[str, GroupKind] = {k.name: k for k in (
    GroupKind("muonh", 1, True, "matrix", False, True, _MARIN + "muonh_update", _BATCHED + "muonh_updates"),
    GroupKind("adamh", 2, False, "matrix", False, True, _MARIN + "adamh_update", _BATCHED + "adamh_updates"),
    GroupKind("adam", 2, False, "adam", False, False, _MARIN + "adam_update", _BATCHED + "adam_updates"),
    GroupKind("adamw", 2, False, "adam", True, False, _MARIN + "adam_update", _BATCHED + "adam_updates"),
    GroupKind("muon", 1, True, "matrix", True, False, _MARIN + "muon_update"),
)}

#: The levels; the first is the recipe level, the second the baseline (marin.switches "optimizer" row).
OPTIMIZERS: dict[str, OptimizerLevel] = {o.name: o for o in (
    OptimizerLevel("hyperball", {"matrix": "muonh", "expert": "muonh", "lm_head": "adamh"}, "adam", "hyperball",
                   "MuonH on matrices, AdamH on the lm head, Adam elsewhere", annealed_decay=GATE_ROUTER),
    OptimizerLevel("adamw", {}, "adamw", "adamw", "AdamW everywhere, one lr"),
    OptimizerLevel("muon_adamw", {"matrix": "muon", "expert": "muon"}, "adamw", "muon_adamw",
                   "Muon (Moonlight scale) on matrices, AdamW elsewhere"),
    OptimizerLevel("adamh", {"matrix": "adamh", "expert": "adamh", "lm_head": "adamh"}, "adam", "hyperball",
                   "AdamH on matrices and the lm head, Adam elsewhere", annealed_decay=GATE_ROUTER),
)}
for _level in OPTIMIZERS.values():
    _level.check_kinds(KINDS)


def optimizer_level(name: str) -> OptimizerLevel:
    if name not in OPTIMIZERS:
        raise ValueError(f"Recipe.optimizer={name!r} is not a known level; allowed values: "
                         f"{', '.join(map(repr, OPTIMIZERS))}")
    return OPTIMIZERS[name]


def group_kinds(level: str) -> dict[str, str]:
    """role -> kind name for an optimizer level."""
    return optimizer_level(level).group_kinds()


def state_bytes_by_role(level: str) -> dict[str, int]:
    """role -> optimizer state bytes per parameter element under `level`."""
    return {r: KINDS[k].state_bytes for r, k in group_kinds(level).items()}


def resolve_update(kind: GroupKind, batched: bool = False) -> Callable | None:
    """The torch step of a kind (imported on first use); `batched`: its step of a parameter list (None when it
    has none)."""
    ref = kind.batched if batched else kind.update
    if ref is None or callable(ref):
        return ref
    mod, _, fn = str(ref).partition(":")
    return getattr(importlib.import_module(mod), fn)
