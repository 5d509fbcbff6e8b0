"""The global batch's step values from one rank's (`world_step`): the loss terms weighted by the rank's share of
the valid targets and the router statistics, all-reduced once; what the loop logs of a distributed step, whether
the rank ran it as one batch (marin.train.distributed) or in micro-batches (marin.train.accum)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from marin_ablate.marin.train.distributed import ParallelDims


@dataclass
class GlobalOut:
    """What the loop logs from a distributed step: world-reduced (ModelOutput's logged fields)."""

    stats: dict[str, float]
    aux_loss: torch.Tensor
    z_loss: torch.Tensor


def world_step(d: ParallelDims, st: dict, frac: float, dense_v: float, ce_v: float, z_v: float, aux_v: float,
               gnorm: float, dev: torch.device):
    """(out, loss, ce, grad_norm) of the global batch from this rank's values: `frac` of the global valid
    targets, its token-mean CE + z-loss (`dense_v`), CE, z-loss, Switch aux loss and statistics `st`."""
    vec = torch.tensor([dense_v * frac, ce_v * frac, z_v * frac, aux_v / d.world,
                        st.get("dropped", 0.0), st.get("assigned", 0.0), st.get("load_cv", 0.0) / d.world,
                        st.get("router_z", 0.0) / d.world], dtype=torch.float64, device=dev)
    dist.all_reduce(vec)
    mx = torch.tensor([st.get("max_load_ratio", 0.0)], dtype=torch.float64, device=dev)
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    v = vec.tolist()
    stats = dict(st, dropped=v[4], assigned=v[5], drop_rate=v[4] / max(v[5], 1.0), load_cv=v[6], router_z=v[7],
                 max_load_ratio=float(mx))
    g_out = GlobalOut(stats, torch.tensor(v[3]), torch.tensor(v[2]))
    return g_out, v[0] + v[3], v[1], gnorm
