"""Optimizers: Hyperball (MuonH + AdamH + Adam, docs/method.md §2.1) and the peers' baselines.

One `torch.optim.Optimizer` holds every parameter group; each group carries a `kind`, a row of the
registry `marin.optimizers.KINDS` whose `update` is one of the functions at the end of this module.
Which parameter lands in which group is decided only by the model's ``param_roles()``:

| level        | matrix, expert | lm_head | embed, router, gate | norm, sconv |
|--------------|----------------|---------|---------------------|-------------|
| hyperball    | muonh          | adamh   | adam                | adam        |
| adamh        | adamh          | adamh   | adam                | adam        |
| adamw        | adamw (wd)     | adamw (wd) | adamw (wd)       | adamw, no wd |
| muon_adamw   | muon (wd)      | adamw (wd) | adamw (wd)       | adamw, no wd |

Baselines decay every weight matrix, embedding and router included (GPT-2/nanoGPT practice: decay
every >= 2-D weight), but not RMSNorm gains (decay pulls them off 1) nor the SConv taps (identity
at init; decay would pull the conv towards zero, i.e. switch the component off). Peak learning rates,
betas and Adam ε come from `marin.hparams.resolve_hparams`. The expert-bank sphere (`TrainConfig.expert_sphere`)
and Newton–Schulz (Marin's "quintic" schedule, Frobenius normalisation + `NS_EPS`) are docs/fidelity.md's rows;
`ns_band(x0_min)` is the interval a singular value x0 >= x0_min lands in after the schedule: [0.978, 1.032]
for x0 >= 1e-2, [0.475, 1.145] for x0 >= 1e-3 (Jordan's single triple, `NS_SCHEDULES["simple"]`: [0.682,
1.134] and [0.471, 1.202]). MuonH radius R is stored at the first step so round-off cannot drift it.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from marin_ablate.marin.config import LR_SCHEDULES
from marin_ablate.marin.hparams import ADAMW_BETAS, OptimHparams, resolve_hparams  # noqa: F401  (re-exported)
from marin_ablate.marin.optimizers import (
    KINDS,
    NO_DECAY_ROLES,
    NS_COEFFS,
    NS_SCHEDULES,  # noqa: F401  (re-exported: the schedules live with the torch-free optimizer table)
    ROLES,
    group_kinds,  # noqa: F401  (re-exported: planning/timemodel.py)
    optimizer_level,
    resolve_update,
)

WSD_DECAY_FRAC = 0.2  # WSD: linear decay over the last 20% of steps
MUON_RMS_MATCH = 0.2  # Moonlight: update RMS 0.2 * sqrt(max(m, n)) ~ AdamW's, so one lr serves both


# ---- Newton–Schulz -------------------------------------------------------------------------------


def ns_coefficient(schedule: tuple[tuple[float, float, float], ...], i: int) -> tuple[float, float, float]:
    """(a, b, c) of iteration i: the schedule cycles (levanter get_coefficient_iterator, mode "cycle")."""
    return schedule[i % len(schedule)]


def ns_band(x_min: float, steps: int = 5, n_grid: int = 20001,
            schedule: tuple[tuple[float, float, float], ...] = NS_COEFFS) -> tuple[float, float]:
    """The interval the singular values land in after `steps` iterations from any x0 in [x_min, 1]."""
    lo, hi = math.inf, -math.inf
    for i in range(n_grid):
        # geometric grid: the map is steep near 0, where the low end of the band is decided
        x = x_min * (1.0 / x_min) ** (i / (n_grid - 1))
        for k in range(steps):
            a, b, c = ns_coefficient(schedule, k)
            x = a * x + b * x**3 + c * x**5
        lo, hi = min(lo, x), max(hi, x)
    return lo, hi


NS_EPS = 1e-8  # Marin's hero and ladder MuonH: GrugMoeMuonHConfig.muon_epsilon


def newton_schulz(u_XMN: Tensor, steps: int = 5, eps: float = NS_EPS,
                  schedule: tuple[tuple[float, float, float], ...] = NS_COEFFS) -> Tensor:
    """Approximate the orthogonal polar factor of each trailing matrix of `u` (batched over leading
    dims: one Newton–Schulz per expert for expert stacks) with the per-iteration coefficient schedule
    (levanter optim/util.py zeropower_via_newtonschulz5, "quintic")."""
    dtype = torch.bfloat16 if u_XMN.is_cuda else torch.float32
    x = u_XMN.to(dtype)
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:  # iterate on the smaller Gram matrix
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x.float(), keepdim=True).to(dtype) + eps)
    for i in range(steps):
        a, b, c = ns_coefficient(schedule, i)
        gram = x @ x.mT
        poly = b * gram + c * (gram @ gram)
        x = a * x + poly @ x
    if transposed:
        x = x.mT
    return x.to(u_XMN.dtype)


#: Elements of one stack of same-shape matrices (64 MiB in fp32): bigger groups run as several stacks, and a
#: parameter bigger than this is a stack of its own, so the working set stays that of one parameter or one stack.
NS_STACK_ELEMS = 1 << 24


def batched_newton_schulz(dirs: list[Tensor], steps: list[int]) -> list[Tensor]:
    """`newton_schulz` of each tensor's trailing matrices, the same-shape ones (a tall matrix as its
    transpose) stacked into one batched-matmul chain per shape, at most NS_STACK_ELEMS elements a stack
    (batched Muon: one `bmm` chain per shape group instead of one per matrix)."""
    out: list[Tensor | None] = [None] * len(dirs)
    groups: dict[tuple, list[int]] = {}
    for i, d in enumerate(dirs):
        if d.numel() == 0 or d.ndim < 2:
            out[i] = newton_schulz(d, steps[i]) if d.numel() else d
            continue
        m, n = d.shape[-2:]
        groups.setdefault((min(m, n), max(m, n), steps[i], d.dtype, d.device), []).append(i)
    for (_, _, ns, _, _), idx in groups.items():
        stacks: list[list[int]] = [[]]
        size = 0
        for i in idx:
            if stacks[-1] and size + dirs[i].numel() > NS_STACK_ELEMS:
                stacks.append([])
                size = 0
            stacks[-1].append(i)
            size += dirs[i].numel()
        for stack in stacks:
            # a tall matrix joins its wide peers transposed: newton_schulz(X^T) = newton_schulz(X)^T
            mats = [_wide(dirs[i]).reshape(-1, *_wide(dirs[i]).shape[-2:]) for i in stack]
            o = newton_schulz(torch.cat(mats) if len(mats) > 1 else mats[0], ns)
            for i, part in zip(stack, o.split([m.shape[0] for m in mats]), strict=True):
                d = dirs[i]
                part = part.view(_wide(d).shape)
                out[i] = part.mT if d.shape[-2] > d.shape[-1] else part
    return out  # type: ignore[return-value]


def _wide(x: Tensor) -> Tensor:
    return x.mT if x.shape[-2] > x.shape[-1] else x


def _is_dtensor(t: Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local_part(t: Tensor) -> Tensor:
    """This rank's part of an FSDP2 DTensor (the tensor itself otherwise); in-place ops write through."""
    return t.to_local() if _is_dtensor(t) else t


def _sharded_dims(p: Tensor) -> set[int]:
    return {pl.dim for pl in p.placements if pl.is_shard()} if _is_dtensor(p) else set()


def shard_groups(p: Tensor) -> list:
    """The process groups of the mesh dims that shard p (none for a plain tensor)."""
    return [p.device_mesh.get_group(i) for i, pl in enumerate(p.placements) if pl.is_shard()] if _is_dtensor(p) else []


def _fro(x: Tensor, bank: bool = False) -> Tensor:
    """Frobenius norm of each trailing matrix (bank: of the whole tensor), shaped for broadcasting."""
    return x.norm().reshape((1,) * x.ndim) if bank or x.ndim < 2 else torch.linalg.matrix_norm(x, keepdim=True)


def sphere_norms(p: Tensor, role: str, expert_sphere: str = "bank") -> Tensor:
    """The norms the hyperball holds fixed for a parameter of `role`: one per matrix, one per bank
    for an expert stack under expert_sphere="bank"."""
    return _fro(p.detach().float(), bank=role == "expert" and expert_sphere == "bank")


# ---- Grouping by role ----------------------------------------------------------------------------


def _on_fake_group(p: Tensor) -> bool:
    """A shard on a fake process group (the plan's dry run): its collectives move no data, so the
    global norm of a shard cannot be read there (the same layout-independent init is checked unsharded)."""
    return hasattr(p, "device_mesh") and dist.is_initialized() and dist.get_backend() == "fake"


def check_sphere_norms(named_params: Iterable[tuple[str, Tensor]], roles: Mapping[str, str], hp: OptimHparams) -> None:
    """ValueError naming a parameter whose hyperball sphere would have radius 0 (its drawn init is zero)."""
    kinds = optimizer_level(hp.level).group_kinds()
    for name, p in named_params:
        k = KINDS[kinds[roles[name]]] if roles.get(name) in kinds else None
        if k is not None and k.on_sphere and not p.is_meta and not _on_fake_group(p) \
                and float(p.detach().float().norm()) == 0.0:
            raise ValueError(f"parameter {name!r} (role {roles[name]!r}) has zero Frobenius norm: it cannot live "
                             "on a hyperball; give it a nonzero init or another role")


def param_groups(named_params: Iterable[tuple[str, Tensor]], roles: Mapping[str, str],
                 hp: OptimHparams, drawn: bool = True) -> list[dict]:
    """One group per (kind, role) so the assignment can be read off `group["role"]`/`["names"]`.
    A role in the level's `annealed_decay` takes `hp.gate_router_weight_decay`, annealed by `set_lr`.
    `drawn=False`: the weights are not drawn yet (a model a checkpoint will fill): no radius check here."""
    named_params = list(named_params)
    if drawn:
        check_sphere_norms(named_params, roles, hp)
    level = optimizer_level(hp.level)
    kinds = level.group_kinds()
    buckets: dict[tuple[str, str], dict] = {}
    for name, p in named_params:
        if not p.requires_grad:
            continue
        if name not in roles:
            raise ValueError(f"param_roles() has no role for parameter {name!r}; allowed values: {', '.join(ROLES)}")
        role = roles[name]
        if role not in kinds:
            raise ValueError(f"param_roles()[{name!r}]={role!r} is not a known role; "
                             f"allowed values: {', '.join(ROLES)}")
        kind = kinds[role]
        k = KINDS[kind]
        key = (kind, role)
        if key not in buckets:
            lr = hp.adam_lr if k.lr == "adam" else hp.lr
            anneal = role in level.annealed_decay and hp.gate_router_weight_decay > 0
            wd = hp.gate_router_weight_decay if anneal else (
                hp.weight_decay if k.decays and role not in NO_DECAY_ROLES else 0.0)
            buckets[key] = dict(params=[], names=[], kind=kind, role=role, lr=lr, peak_lr=lr,
                                betas=(hp.beta1, hp.beta2), eps=hp.eps, weight_decay=wd, peak_weight_decay=wd,
                                anneal_weight_decay=anneal, momentum=hp.momentum, ns_steps=hp.ns_steps,
                                bank_sphere=role == "expert" and hp.expert_sphere == "bank")
        buckets[key]["params"].append(p)
        buckets[key]["names"].append(name)
    return list(buckets.values())


# ---- Distributed Newton–Schulz -------------------------------------------------------------------


def _matrix_split(p: Tensor) -> tuple[object, int] | None:
    """(process group, dim) of the FSDP2 shard that splits p's matrices (a trailing dim); None when
    every local matrix is whole (plain tensors, expert stacks split on the expert dim)."""
    if not _is_dtensor(p):
        return None
    for i, pl in enumerate(p.placements):
        if pl.is_shard() and pl.dim >= p.ndim - 2:
            return p.device_mesh.get_group(i), pl.dim
    return None


def ns_owners(params: list[Tensor]) -> dict[int, int]:
    """index -> owner (rank in its shard group) of every parameter whose matrices FSDP splits:
    round-robin over the group's ranks in order of decreasing size (Marin orthogonalizes each matrix
    once inside the rack). Every rank of a group computes the same assignment."""
    split = {i: s for i, p in enumerate(params) if (s := _matrix_split(p)) is not None}
    turn: dict[tuple[int, ...], int] = {}
    owners = {}
    for i in sorted(split, key=lambda i: (-params[i].numel(), i)):
        grp = split[i][0]
        key = tuple(dist.get_process_group_ranks(grp))
        owners[i] = turn.get(key, 0) % grp.size()
        turn[key] = turn.get(key, 0) + 1
    return owners


def _pad_to(x: Tensor, dim: int, size: int) -> Tensor:
    if x.shape[dim] == size:
        return x.contiguous()
    pad = list(x.shape)
    pad[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad)], dim)


def distributed_newton_schulz(params: list[Tensor], dirs: list[Tensor], steps: list[int],
                              batched: bool = True) -> list[Tensor]:
    """`newton_schulz` of each direction, `dirs[i]` being this rank's part of parameter `params[i]`'s.
    Whole local matrices are orthogonalized here; a matrix FSDP splits is gathered to its owner
    (`ns_owners`), orthogonalized there only, and its parts scattered back: no rank runs every matrix
    and no gather leaves the shard group (the rack under HSDP). Gathers, the owners' iterations and
    scatters run as three phases, so the owners compute at the same time. `batched`: the whole matrices here and
    the owned ones each as same-shape stacks (`batched_newton_schulz`), else one at a time (the reference)."""
    out: list[Tensor | None] = [None] * len(params)
    owners = ns_owners(params)
    whole = [i for i in range(len(dirs)) if i not in owners]
    orth = batched_newton_schulz([dirs[i] for i in whole], [steps[i] for i in whole]) if batched else \
        [newton_schulz(dirs[i], steps[i]) if dirs[i].numel() else dirs[i] for i in whole]
    for i, o in zip(whole, orth, strict=True):
        out[i] = o
    jobs = []  # (index, group, dim, chunk, owner, gather buffers on the owner)
    works = []
    for i in sorted(owners):
        grp, dim = _matrix_split(params[i])
        n, owner = grp.size(), owners[i]
        chunk = -(-params[i].shape[dim] // n)  # FSDP2's (torch.chunk) shard size on that dim
        part = _pad_to(dirs[i], dim, chunk)
        bufs = [torch.zeros_like(part) for _ in range(n)] if dist.get_rank(grp) == owner else None
        works.append(dist.gather(part, bufs, group=grp, group_dst=owner, async_op=True))
        jobs.append((i, grp, dim, chunk, owner, bufs))
    for w in works:
        w.wait()
    mine = [j for j, job in enumerate(jobs) if job[5] is not None]  # the matrices this rank owns, whole
    fulls = [torch.cat(jobs[j][5], jobs[j][2]).narrow(jobs[j][2], 0, params[jobs[j][0]].shape[jobs[j][2]])
             for j in mine]
    ns = [steps[jobs[j][0]] for j in mine]
    owned = dict(zip(mine, batched_newton_schulz(fulls, ns) if batched else
                     [newton_schulz(f, n) for f, n in zip(fulls, ns, strict=True)], strict=True))
    scattered, works = [], []
    for j, (i, grp, dim, chunk, owner, bufs) in enumerate(jobs):
        pieces = None
        if bufs is not None:
            o = _pad_to(owned[j], dim, chunk * grp.size())
            pieces = [t.contiguous() for t in o.split(chunk, dim)]
        shape = list(dirs[i].shape)
        shape[dim] = chunk
        recv = dirs[i].new_zeros(shape)  # zeros: a fake process group (the plan's dry run) moves no data
        works.append(dist.scatter(recv, pieces, group=grp, group_src=owner, async_op=True))
        scattered.append((i, dim, recv))
    for w in works:
        w.wait()
    for i, dim, recv in scattered:
        out[i] = recv.narrow(dim, 0, dirs[i].shape[dim])
    return out  # type: ignore[return-value]


# ---- The optimizer -------------------------------------------------------------------------------


class MarinOptimizer(torch.optim.Optimizer):
    """All groups of one run in one optimizer; `state_dict()` round-trips exactly (resume)."""

    def __init__(self, groups: list[dict], expert_group=None, batched: bool = True):
        super().__init__(groups, defaults=dict(lr=1e-3, peak_lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                               weight_decay=0.0, momentum=0.95, ns_steps=5, kind="adam",
                                               role="", names=[], bank_sphere=False, peak_weight_decay=0.0,
                                               anneal_weight_decay=False))
        # EP runs: the process group splitting each expert bank (a bank sphere spans it); not state
        self.expert_group = expert_group
        # the kinds' batched steps (marin.batched_updates, batched Newton–Schulz); False: one parameter at a
        # time, the reference the batched step is tested against
        self.batched = batched
        self._ready: dict[int, tuple[Tensor, Tensor]] = {}  # within step(): (direction, Newton–Schulz) by id

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ortho = [(p, g) for g in self.param_groups for p in g["params"]  # (param, group) of the Newton–Schulz kinds
                 if p.grad is not None and KINDS[g["kind"]].orthogonalizes]
        # every matrix orthogonalized once, by one owner rank of the shards that split it (a transient
        # of the owned whole matrices, ~1/n of them per rank), before the kinds' updates read the results
        dirs = nesterov_all(self, ortho) if self.batched else [self._nesterov(p, g) for p, g in ortho]
        outs = distributed_newton_schulz([p for p, _ in ortho], dirs, [g["ns_steps"] for _, g in ortho],
                                         batched=self.batched)
        self._ready = {id(p): (d, o) for (p, _), d, o in zip(ortho, dirs, outs, strict=True)}
        for g in self.param_groups:
            # never a group stacked into one tensor (a transient the size of the group: hundreds of GiB at
            # the hero): a batched kind steps lists of the parameters' own tensors
            kind = KINDS[g["kind"]]
            ps = [p for p in g["params"] if p.grad is not None]
            many = resolve_update(kind, batched=True) if self.batched else None
            if many is not None and ps:
                many(self, ps, g)
                continue
            update = resolve_update(kind)
            for p in ps:
                update(self, p, g)
        self._ready = {}
        return loss

    # -- sharded parameters (FSDP2 DTensors, EP expert slices) -------------------------------------
    def _fro(self, x: Tensor, p: Tensor, g: dict) -> Tensor:
        """`_fro` of the whole parameter from this rank's part `x` of it: sums of squares all-reduced
        over the shards a sphere spans (the FSDP mesh dims that split it; the EP group for a bank)."""
        bank = g.get("bank_sphere", False)  # groups saved before the option existed: per matrix
        groups = shard_groups(p)
        if bank and self.expert_group is not None:
            groups.append(self.expert_group)
        if not groups:
            return _fro(x, bank)
        if bank or x.ndim < 2:
            sq = x.pow(2).sum().reshape((1,) * x.ndim)
        elif any(d >= x.ndim - 2 for d in _sharded_dims(p)):  # the matrices themselves are split
            sq = x.pow(2).sum(dim=(-2, -1), keepdim=True)
        else:  # only a batch dim is split (experts): every matrix is whole here
            return torch.linalg.matrix_norm(x, keepdim=True)
        for grp in groups:
            dist.all_reduce(sq, group=grp)
        return sq.sqrt()

    # -- direction helpers ------------------------------------------------------------------------
    def _orthogonalize(self, p: Tensor, d: Tensor, steps: int) -> Tensor:
        """Newton–Schulz of this rank's part `d` of p's direction: this step's result of
        `distributed_newton_schulz` (computed for every parameter at once in `step`)."""
        ready = self._ready.get(id(p))
        return ready[1] if ready is not None else distributed_newton_schulz([p], [d], [steps])[0]

    def _nesterov(self, p: Tensor, g: dict) -> Tensor:
        ready = self._ready.get(id(p))
        if ready is not None:  # already advanced this step, for the batched Newton–Schulz
            return ready[0]
        st = self.state[p]
        if "momentum_buffer" not in st:
            st["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
        buf = local_part(st["momentum_buffer"])
        grad = local_part(p.grad).float()
        buf.mul_(g["momentum"]).add_(grad)
        return grad.add(buf, alpha=g["momentum"])

    def _adam_state(self, p: Tensor) -> dict:
        """p's Adam state (step, fp32 moments), created at its first step."""
        st = self.state[p]
        if "exp_avg" not in st:
            st["step"] = torch.zeros((), dtype=torch.float64)
            st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        return st

    def _adam_direction(self, p: Tensor, g: dict) -> Tensor:
        st = self._adam_state(p)
        b1, b2 = g["betas"]
        st["step"] += 1
        t = st["step"]  # a CPU float64 scalar tensor: the bias corrections never read a value on the host
        grad = local_part(p.grad).float()
        m, v = local_part(st["exp_avg"]), local_part(st["exp_avg_sq"])
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        return m_hat / (v_hat.sqrt() + g["eps"])

    def _project(self, p: Tensor, g: dict, direction: Tensor) -> None:
        """W <- R * normalize(W - eta * R * D / ||D||_F), per trailing matrix (per whole bank for a
        bank sphere); R fixed at its init. Norms span the whole parameter however it is sharded."""
        st = self.state[p]
        w = local_part(p).float()
        if "radius" not in st:
            st["radius"] = self._fro(w, p, g).clone()
        r = st["radius"]
        d_unit = direction / (self._fro(direction, p, g) + 1e-12)
        x = w - g["lr"] * r * d_unit
        local_part(p).copy_((x * (r / (self._fro(x, p, g) + 1e-30))).to(p.dtype))


def nesterov_all(opt: MarinOptimizer, ortho: list[tuple[Tensor, dict]]) -> list[Tensor]:
    """`MarinOptimizer._nesterov` of every (parameter, group), `torch._foreach_*` per momentum (the batched step):
    B <- mu B + G, U = G + mu B."""
    out: list[Tensor | None] = [None] * len(ortho)
    by_mu: dict[float, list[int]] = {}
    for i, (p, g) in enumerate(ortho):
        st = opt.state[p]
        if "momentum_buffer" not in st:
            st["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
        by_mu.setdefault(g["momentum"], []).append(i)
    for mu, idx in by_mu.items():
        bufs = [local_part(opt.state[ortho[i][0]]["momentum_buffer"]) for i in idx]
        grads = [local_part(ortho[i][0].grad).float() for i in idx]
        torch._foreach_mul_(bufs, mu)
        torch._foreach_add_(bufs, grads)
        for i, u in zip(idx, torch._foreach_add(grads, bufs, alpha=mu), strict=True):
            out[i] = u
    return out  # type: ignore[return-value]


# ---- Group kinds: the torch step of each row of marin.optimizers.KINDS ---------------------------


def muonh_update(opt: MarinOptimizer, p: Tensor, g: dict) -> None:
    opt._project(p, g, opt._orthogonalize(p, opt._nesterov(p, g), g["ns_steps"]).float())


def adamh_update(opt: MarinOptimizer, p: Tensor, g: dict) -> None:
    opt._project(p, g, opt._adam_direction(p, g))


def adam_update(opt: MarinOptimizer, p: Tensor, g: dict) -> None:
    """Adam, with decoupled weight decay when the group has one (AdamW)."""
    upd = opt._adam_direction(p, g)
    w = local_part(p)
    if g["weight_decay"]:
        w.mul_(1 - g["lr"] * g["weight_decay"])
    w.add_(upd.to(p.dtype), alpha=-g["lr"])


def muon_update(opt: MarinOptimizer, p: Tensor, g: dict) -> None:
    o = opt._orthogonalize(p, opt._nesterov(p, g), g["ns_steps"]).float()
    scale = MUON_RMS_MATCH * math.sqrt(max(p.shape[-2], p.shape[-1]))  # the global shape
    w = local_part(p)
    if g["weight_decay"]:
        w.mul_(1 - g["lr"] * g["weight_decay"])
    w.add_(o.to(p.dtype), alpha=-g["lr"] * scale)


def build_optimizer(model: torch.nn.Module, hp: OptimHparams, expert_group=None, drawn: bool = True,
                    batched: bool = True) -> MarinOptimizer:
    """Group `model`'s parameters by `model.param_roles()` for `hp.level`; `expert_group` is the EP
    group of an EP model (its expert stacks are slices of each layer's bank); `drawn` as `param_groups`;
    `batched=False`: the per-parameter step (the reference)."""
    return MarinOptimizer(param_groups(model.named_parameters(), model.param_roles(), hp, drawn), expert_group, batched)


def group_assignment(opt: torch.optim.Optimizer) -> dict[str, str]:
    """parameter name -> group kind (what the tests and `describe` print)."""
    return {n: g["kind"] for g in opt.param_groups for n in g["names"]}


# ---- Schedules -----------------------------------------------------------------------------------


def lr_multiplier(step: int, total_steps: int, schedule: str = "linear", warmup_frac: float = 0.01,
                  final_frac: float = 0.05) -> float:
    """Multiplier of the peak lr at 0-based `step`: linear warmup over max(1, warmup_frac*steps)
    steps reaching 1 at its last step, then linear / cosine / WSD decay reaching `final_frac` at the
    last step."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"TrainConfig.lr_schedule={schedule!r} is not a known level; allowed values: "
                         f"{', '.join(map(repr, LR_SCHEDULES))}")
    warm = max(1, round(warmup_frac * total_steps))
    if step < warm:
        return (step + 1) / warm
    last = total_steps - 1
    if schedule == "wsd":
        decay_start = max(warm, last - round(WSD_DECAY_FRAC * total_steps))
        if step <= decay_start:
            return 1.0
        p = min(1.0, (step - decay_start) / max(1, last - decay_start))
        return 1.0 - (1.0 - final_frac) * p
    p = min(1.0, (step - (warm - 1)) / max(1, last - (warm - 1)))
    if schedule == "linear":
        return 1.0 - (1.0 - final_frac) * p
    return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * p))


def decay_fraction(step: int, total_steps: int, start: int = 0) -> float:
    """The annealed (gate/router) weight decay's fraction of its peak at 0-based `step`: 1 - step/steps
    from `start` on, 0 before (Marin hero/optimizer.py: wd·clip(1 - count/total, 0), count = the
    updates before this one; TrainConfig.gate_router_decay_start: Marin's hero switched it on late)."""
    return max(0.0, 1.0 - step / total_steps) if step >= start else 0.0


def set_lr(opt: torch.optim.Optimizer, multiplier: float, decay: float = 1.0) -> None:
    """Learning rates at `multiplier` of their peaks; annealed weight decays (the gate/router decay)
    at `decay` of theirs (`decay_fraction`)."""
    for g in opt.param_groups:
        g["lr"] = g["peak_lr"] * multiplier
        if g.get("anneal_weight_decay"):
            g["weight_decay"] = g["peak_weight_decay"] * decay
