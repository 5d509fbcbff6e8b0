"""The optimizer kinds' steps over a whole parameter group at once (GroupKind.batched): `torch._foreach_*` for
the Adam moments and the hyperball projection (the momenta: marin.update_rules `nesterov_all`), so a step launches
one kernel per operation and group instead of one per parameter (PyTorch's own `foreach` Adam, torch/optim/adam.py
`_multi_tensor_adam`). Each is the per-parameter update of marin.update_rules (`muonh_update`, `adamh_update`,
`adam_update`) to fp32 rounding; tests/marin/test_batched_optim.py holds them to it.

Norms: a sphere whose norm is one number per parameter (a matrix, a vector, an expert bank's "bank" sphere)
is normed for the whole group by `torch._foreach_norm`, sums of squares all-reduced over each set of shard
groups in one collective; a per-expert sphere of an expert stack (one norm per matrix) takes the
per-parameter path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from marin_ablate.marin.update_rules import MarinOptimizer, local_part, shard_groups


def adam_directions(opt: MarinOptimizer, ps: list[Tensor], g: dict) -> list[Tensor]:
    """`MarinOptimizer._adam_direction` of every parameter of a group: m_hat / (sqrt(v_hat) + eps)."""
    sts = [opt._adam_state(p) for p in ps]
    b1, b2 = g["betas"]
    torch._foreach_add_([st["step"] for st in sts], 1.0)
    grads = [local_part(p.grad).float() for p in ps]
    ms, vs = [local_part(st["exp_avg"]) for st in sts], [local_part(st["exp_avg_sq"]) for st in sts]
    torch._foreach_lerp_(ms, grads, 1 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
    # the steps are host (CPU) scalars: the bias corrections read no device value
    m_hat = torch._foreach_div(ms, [float(1 - b1 ** st["step"]) for st in sts])
    denom = torch._foreach_div(vs, [float(1 - b2 ** st["step"]) for st in sts])
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, g["eps"])
    torch._foreach_div_(m_hat, denom)
    return m_hat


def _whole_norm(p: Tensor, g: dict) -> bool:
    """One sphere norm for the whole parameter: a vector, a matrix, or an expert bank under the bank sphere."""
    return p.ndim <= 2 or g.get("bank_sphere", False)


def _norms(opt: MarinOptimizer, ps: list[Tensor], g: dict, xs: list[Tensor]) -> list[Tensor]:
    """The Frobenius norm of each whole parameter from this rank's parts `xs` (`MarinOptimizer._fro` of a
    whole-norm sphere): local norms by one foreach, the sharded ones' squares all-reduced per set of groups."""
    norms = list(torch._foreach_norm(xs))
    sharded: dict[tuple, list[int]] = {}
    for i, p in enumerate(ps):
        groups = shard_groups(p)
        if g.get("bank_sphere", False) and opt.expert_group is not None:
            groups.append(opt.expert_group)
        if groups:
            sharded.setdefault(tuple(groups), []).append(i)
    for groups, idx in sharded.items():
        sq = torch.stack([norms[i] for i in idx]).pow(2)
        for grp in groups:
            torch.distributed.all_reduce(sq, group=grp)
        for i, n in zip(idx, sq.sqrt(), strict=True):
            norms[i] = n
    return [n.reshape((1,) * x.ndim) for n, x in zip(norms, xs, strict=True)]


def project_all(opt: MarinOptimizer, ps: list[Tensor], g: dict, dirs: list[Tensor]) -> None:
    """`MarinOptimizer._project` of every parameter of a group: W <- R normalize(W - eta R D/||D||)."""
    whole = [i for i, p in enumerate(ps) if _whole_norm(p, g)]
    for i in (i for i in range(len(ps)) if not _whole_norm(ps[i], g)):  # a per-expert sphere: one norm per matrix
        opt._project(ps[i], g, dirs[i])
    if not whole:
        return
    ps, dirs = [ps[i] for i in whole], [dirs[i] for i in whole]
    ws = [local_part(p).float() for p in ps]
    for p, w in zip(ps, ws, strict=True):
        st = opt.state[p]
        if "radius" not in st:
            st["radius"] = opt._fro(w, p, g).clone()
    rs = [opt.state[p]["radius"] for p in ps]
    dn = _norms(opt, ps, g, dirs)
    torch._foreach_add_(dn, 1e-12)
    du = torch._foreach_div(dirs, dn)
    torch._foreach_mul_(du, torch._foreach_mul(rs, g["lr"]))
    xs = torch._foreach_sub(ws, du)
    xn = _norms(opt, ps, g, xs)
    torch._foreach_add_(xn, 1e-30)
    torch._foreach_mul_(xs, torch._foreach_div(rs, xn))
    torch._foreach_copy_([local_part(p) for p in ps], [x.to(p.dtype) for p, x in zip(ps, xs, strict=True)])


# ---- Group kinds: the batched step of each row of marin.optimizers.KINDS that has one ------------


def muonh_updates(opt: MarinOptimizer, ps: list[Tensor], g: dict) -> None:
    project_all(opt, ps, g, [opt._ready[id(p)][1].float() for p in ps])


def adamh_updates(opt: MarinOptimizer, ps: list[Tensor], g: dict) -> None:
    project_all(opt, ps, g, adam_directions(opt, ps, g))


def adam_updates(opt: MarinOptimizer, ps: list[Tensor], g: dict) -> None:
    """Adam, with decoupled weight decay when the group has one (AdamW)."""
    upd = adam_directions(opt, ps, g)
    ws = [local_part(p) for p in ps]
    if g["weight_decay"]:
        torch._foreach_mul_(ws, 1 - g["lr"] * g["weight_decay"])
    torch._foreach_add_(ws, [u.to(p.dtype) for p, u in zip(ps, upd, strict=True)], alpha=-g["lr"])
