"""The optimizer's share of a training step, per-parameter vs batched (marin/batched_updates.py, batched
Newton–Schulz in marin/update_rules.py), on the CPU rungs. Prints a table.

For each preset and each form, the real step of marin.train (forward with its losses, backward, the optimizer
of the recipe's level, router-bias update) on the same synthetic batches from the same weights; the optimizer
step (`opt.step()`, not the router-bias update) is timed on its own inside the step; "ops" counts the operators
one optimizer step dispatches (the kernel launches a GPU would make); "|dW| 1st" is the largest weight difference
of the two forms after their first step (later steps drift apart by routing choices that rounding flips). Both
forms alternate step by step, so a machine whose load drifts slows both alike; the ratios are within one run.
`--threads` pins torch's threads (1: a study worker's).

    OMP_NUM_THREADS=1 python benchmarks/optim_step.py                  # cpu_s, cpu_m, cpu_l; 20 steps
    python benchmarks/optim_step.py --presets cpu_s --steps 40 --recipe baseline
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch

from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train import forward_backward
from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams


def bench(name: str, recipe: Recipe, batch: int, steps: int, warmup: int) -> dict:
    cfg = preset(name)
    spec = RunSpec(model=cfg, recipe=recipe, train=TrainConfig(batch_size=batch))
    torch.manual_seed(0)
    ref = MarinModel(cfg, recipe).train()
    forms = {}
    for batched in (False, True):
        model = copy.deepcopy(ref)
        forms[batched] = (model, build_optimizer(model, resolve_hparams(spec), batched=batched))
    g = torch.Generator().manual_seed(1)
    times: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    for i in range(warmup + steps):
        tok = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
        docs = torch.cumsum((torch.rand(batch, cfg.seq_len, generator=g) < 4 / cfg.seq_len).long(), 1)
        if i == 1:  # after one step from the same weights and batch: the forms' difference is fp32 rounding
            (m0, _), (m1, _) = forms[False], forms[True]
            drift = max(float((a - b).detach().abs().max()) for a, b in zip(m0.parameters(), m1.parameters(),
                                                                            strict=True))
        for batched, (model, opt) in forms.items():
            t0 = time.perf_counter()
            forward_backward(model, tok, tok.roll(-1, 1), docs, contextlib.nullcontext, None)
            t1 = time.perf_counter()
            opt.step()  # what optimizer_step runs, the optimizer timed alone
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            model.update_router_biases()
            t3 = time.perf_counter()
            if i >= warmup:
                times[batched][0].append(t3 - t0)
                times[batched][1].append(t2 - t1)
    ops = {b: op_counts(opt) for b, (_, opt) in forms.items()}
    med = {b: (statistics.median(s), statistics.median(o)) for b, (s, o) in times.items()}
    return {"preset": name, "step_ms_per_param": 1e3 * med[False][0], "opt_ms_per_param": 1e3 * med[False][1],
            "step_ms_batched": 1e3 * med[True][0], "opt_ms_batched": 1e3 * med[True][1],
            "opt_share_per_param": med[False][1] / med[False][0], "opt_share_batched": med[True][1] / med[True][0],
            "opt_speedup": med[False][1] / med[True][1], "step_speedup": med[False][0] / med[True][0],
            "max_weight_diff": drift, "ops_per_param": ops[False], "ops_batched": ops[True]}


def op_counts(opt) -> int:
    """Operators one optimizer step dispatches (CPU: the launches a GPU would make), from torch's profiler;
    the gradients are the last step's."""
    from torch.profiler import ProfilerActivity, profile

    for g in opt.param_groups:  # a step needs gradients: zeros of each parameter's shape
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::") and e.key not in NOT_KERNELS)


#: operators that launch nothing (views, metadata, host scalars)
NOT_KERNELS = {"aten::view", "aten::reshape", "aten::as_strided", "aten::t", "aten::transpose", "aten::expand",
               "aten::detach", "aten::alias", "aten::empty", "aten::empty_strided", "aten::lift_fresh",
               "aten::unsqueeze", "aten::squeeze", "aten::split", "aten::slice", "aten::select", "aten::_unsafe_view",
               "aten::item",
               "aten::_local_scalar_dense", "aten::numpy_T", "aten::permute", "aten::to", "aten::resolve_conj",
               "aten::resolve_neg", "aten::result_type", "aten::narrow", "aten::chunk", "aten::unbind"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="cpu_s,cpu_m,cpu_l")
    ap.add_argument("--recipe", choices=("recipe", "baseline"), default="recipe")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    recipe = Recipe() if a.recipe == "recipe" else Recipe.baseline()
    print(f"optimizer share of a training step, {a.recipe} ({recipe.optimizer}), batch {a.batch}, {a.steps} steps "
          f"(median), {a.threads} thread(s), torch {torch.__version__}")
    print(f"{'preset':8} {'step ms':>9} {'opt ms':>8} {'share':>6} {'ops':>6} | {'step ms':>9} {'opt ms':>8} "
          f"{'share':>6} {'ops':>6} | {'opt x':>6} {'step x':>7} {'|dW| 1st':>9}")
    print(f"{'':8} {'per-parameter':>32} | {'batched':>32} |")
    for name in a.presets.split(","):
        r = bench(name, recipe, a.batch, a.steps, a.warmup)
        print(f"{name:8} {r['step_ms_per_param']:9.1f} {r['opt_ms_per_param']:8.1f} {r['opt_share_per_param']:6.1%} "
              f"{r['ops_per_param']:6d} | {r['step_ms_batched']:9.1f} {r['opt_ms_batched']:8.1f} "
              f"{r['opt_share_batched']:6.1%} {r['ops_batched']:6d} | {r['opt_speedup']:6.2f} {r['step_speedup']:7.2f} "
              f"{r['max_weight_diff']:9.1e}", flush=True)


if __name__ == "__main__":
    main()
