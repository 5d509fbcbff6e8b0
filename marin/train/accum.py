"""Gradient accumulation (TrainConfig.micro_batches): each rank's rows of a step in k equal micro-batches, one
forward and backward each, one update; the same step as one batch (docs/architecture.md §5 "Gradient
accumulation": the loss normalisation n_j / N, the routing pass that pins the step's routing and drops
(`MarinModel.forward(..., plan=True)`, marin.moe.RoutePin) and one bias update per step are kept whole there,
so a run's results do not depend on how its batch was split). The routing pass runs only when k > 1.
"""

from __future__ import annotations

from typing import Callable

import torch

from marin_ablate.marin.data import IGNORE_INDEX
from marin_ablate.marin.model import model_stats
from marin_ablate.marin.parallel import clip_grad_norm_
from marin_ablate.marin.train.world import GlobalOut, world_step


def split_rows(x_B: torch.Tensor, k: int) -> list[torch.Tensor]:
    """k equal micro-batches of a rank's rows, in order (micro-batch j: rows [j B/k, (j+1) B/k))."""
    if x_B.shape[0] % k:
        raise ValueError(f"TrainConfig.micro_batches={k} does not divide this rank's {x_B.shape[0]} rows of a step; "
                         f"allowed values: divisors of {x_B.shape[0]}")
    return list(x_B.chunk(k))


def accumulate_step(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor, doc_ids: torch.Tensor,
                    autocast: Callable, grad_clip: float | None, k: int, pd):
    """The step of this rank's rows in `k` micro-batches -> (out, loss, ce, grad_norm), as
    `ParallelDims.forward_backward` returns them for one batch (`pd`: the run's ParallelDims)."""
    toks, tgts, docs = split_rows(tokens, k), split_rows(targets, k), split_rows(doc_ids, k)
    with autocast():
        routes = model(toks, docs, plan=True)
    n_j = torch.stack([(t != IGNORE_INDEX).sum() for t in tgts]).tolist()  # one host read for the weights
    n_loc = sum(n_j)
    n_all = max(float(pd.all_reduce(torch.tensor([float(n_loc)], dtype=torch.float64, device=tokens.device))), 1.0)
    sums = torch.zeros(4, dtype=torch.float64, device=tokens.device)  # Σ n_j·(ce+z), n_j·ce, n_j·z; Σ aux
    assigned = 0
    for j in range(k):
        with autocast():
            out = model(toks[j], docs[j], tgts[j], routes=routes.pins[j])
        z = out.z_loss if out.z_loss is not None else out.aux_loss.new_zeros(())
        dense = out.ce_loss + z
        if n_j[j]:
            obj = dense * (n_j[j] * pd.world / n_all) + out.aux_loss
        else:  # every target of this micro-batch masked: its token means are 0 (with a graph)
            obj = out.aux_loss + 0.0 * dense
        obj.backward()
        sums += torch.stack([dense.detach() * n_j[j], out.ce_loss.detach() * n_j[j], z.detach() * n_j[j],
                             out.aux_loss.detach()]).double()
        assigned += out.assigned
    st = model_stats(routes.stats_t, assigned)
    dense_v, ce_v, z_v, aux_v = (sums / torch.tensor([max(n_loc, 1)] * 3 + [1.0], dtype=torch.float64,
                                                     device=sums.device)).tolist()
    if pd.groups is None:  # one process: the norm and clip of `forward_backward`
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        gnorm_t = torch.nn.utils.get_total_norm(grads)
        if grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(grads, grad_clip, gnorm_t)
        out = GlobalOut(st, torch.tensor(aux_v), torch.tensor(z_v))
        return out, dense_v + aux_v, ce_v, float(gnorm_t)
    gnorm = float(clip_grad_norm_(model, grad_clip, pd.rack_group))
    return world_step(pd, st, n_loc / n_all, dense_v, ce_v, z_v, aux_v, gnorm, tokens.device)
