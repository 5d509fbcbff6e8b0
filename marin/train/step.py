"""One training step and the evaluation pass, single process (fp32 on CPU, bf16 autocast on GPU).

The step follows torchtitan's train step (pytorch/torchtitan, torchtitan/train.py `train_step`):
forward with the model's own losses (CE + z-loss + router aux loss), backward, one global-norm clip,
optimizer step; the router-bias update of auxiliary-loss-free balancing (DeepSeek-V3, arXiv
2412.19437 §2.1.2) runs after the step, from this step's routing.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import torch

from marin_ablate.marin.data import IGNORE_INDEX


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: dict[str, list], bpt: dict[str, float], device: torch.device,
             autocast: Callable, pd=None) -> dict:
    """Dropless eval: per-domain token-mean NLL, macro loss = unweighted mean over domains, bpb.
    Each rank scores its rows of every batch (`pd`, a ParallelDims: one process when None); NLL sums
    and counts are all-reduced."""
    # One process by hand rather than a ParallelDims(): marin.train.distributed builds on this module.
    rows = pd.rows if pd is not None else (lambda x: x)
    all_reduce = pd.all_reduce if pd is not None else (lambda t: t)
    was_training = model.training
    model.eval()
    sums: dict[str, list[float]] = {}
    for dom, bs in batches.items():
        nll, count = 0.0, 0
        for tokens, targets, doc_ids in bs:
            tokens, targets, doc_ids = (rows(t).to(device) for t in (tokens, targets, doc_ids))
            with autocast():  # the model's own fp32 CE (chunked when loss_chunk_tokens > 0)
                out = model(tokens, doc_ids, targets)
            n = int((targets != IGNORE_INDEX).sum())
            nll += float(out.ce_loss) * n
            count += n
        sums[dom] = [nll, float(count)]
    flat = all_reduce(torch.tensor([v for pair in sums.values() for v in pair], dtype=torch.float64, device=device))
    sums = {dom: flat[2 * i:2 * i + 2].tolist() for i, dom in enumerate(sums)}
    domain_loss = {dom: nll / max(count, 1) for dom, (nll, count) in sums.items()}
    model.train(was_training)
    domain_bpb = {d: v / math.log(2) / bpt[d] for d, v in domain_loss.items()}
    return {"eval_macro_loss": statistics.fmean(domain_loss.values()), "eval_domain_loss": domain_loss,
            "macro_bpb": statistics.fmean(domain_bpb.values()), "eval_domain_bpb": domain_bpb}


def forward_backward(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                     doc_ids: torch.Tensor, autocast: Callable, grad_clip: float | None):
    """One forward and backward (z-loss and aux loss come with the model's loss) -> (out, loss,
    ce, grad_norm) as floats; the grad norm is the unclipped global L2 norm."""
    with autocast():
        out = model(tokens, doc_ids, targets)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    gnorm_t = torch.nn.utils.get_total_norm(grads)  # foreach kernels, computed once and reused to clip
    if grad_clip is not None:
        torch.nn.utils.clip_grads_with_norm_(grads, grad_clip, gnorm_t)
    loss_v = float(out.loss.detach())
    ce_v = float(out.ce_loss.detach()) if out.ce_loss is not None else loss_v
    return out, loss_v, ce_v, float(gnorm_t)


def optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, group=None) -> None:
    """Update, clear grads, then the router biases from this step's routing (apply from the next);
    `group` (distributed runs: the world) pools the routing statistics of every rank."""
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.update_router_biases(group)

