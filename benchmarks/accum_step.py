"""What gradient accumulation costs (marin/train/accum.py): a training step of the same batch in 1, 2 and 4
micro-batches, on a CPU rung. Prints a table: step time, its ratio to the one-batch step, and the loss of the
first step (the same to fp32 rounding: the step is the one-batch step).

The accumulated step runs one more no-grad forward (the routing pass) and k smaller forwards and backwards;
`planning/layout.py wall_factor` assumes the pass costs a forward (+1/3 of a step without block recompute).
The forms alternate step by step on the same batches and weights, so a machine whose load drifts slows all alike.

    OMP_NUM_THREADS=1 python benchmarks/accum_step.py                 # cpu_s, batch 8, 10 steps
    python benchmarks/accum_step.py --preset cpu_m --steps 20
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
from marin_ablate.marin.train.distributed import ParallelDims
from marin_ablate.marin.train.step import optimizer_step
from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu_s")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--splits", default="1,2,4")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = preset(a.preset)
    spec = RunSpec(model=cfg, recipe=Recipe(), train=TrainConfig(batch_size=a.batch))
    torch.manual_seed(0)
    ref = MarinModel(cfg, spec.recipe).train()
    forms = {}
    for k in map(int, a.splits.split(",")):
        model = copy.deepcopy(ref)
        forms[k] = (model, build_optimizer(model, resolve_hparams(spec)), [], [])
    g = torch.Generator().manual_seed(1)
    pd = ParallelDims()
    for i in range(a.warmup + a.steps):
        tok = torch.randint(0, cfg.vocab_size, (a.batch, cfg.seq_len), generator=g)
        docs = torch.cumsum((torch.rand(a.batch, cfg.seq_len, generator=g) < 4 / cfg.seq_len).long(), 1)
        for k, (model, opt, times, losses) in forms.items():
            t0 = time.perf_counter()
            _, loss, _, _ = pd.forward_backward(model, tok, tok.roll(-1, 1), docs, contextlib.nullcontext, None, k)
            optimizer_step(model, opt)
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
            losses.append(loss)
    base = statistics.median(forms[min(forms)][2])
    print(f"accumulated steps, {a.preset} recipe, batch {a.batch} x {cfg.seq_len}, {a.steps} steps (median), 1 thread")
    print(f"{'micro-batches':>13} {'step ms':>9} {'x one batch':>12} {'first loss':>11} {'last loss':>10}")
    for k, (_, _, times, losses) in forms.items():
        med = statistics.median(times)
        print(f"{k:>13} {1e3 * med:9.1f} {med / base:12.2f} {losses[0]:11.6f} {losses[-1]:10.6f}", flush=True)


if __name__ == "__main__":
    main()
