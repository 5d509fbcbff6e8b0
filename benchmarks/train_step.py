"""Training-step throughput and MFU of Recipe() against Recipe.baseline() in one process (docs/method.md §4.3:
the throughput ratio R = model FLOP/s of the arm / of the baseline on the same hardware).

Each arm runs the real step of marin.train (forward with z-loss/aux loss, backward, its own optimizer
level, router-bias update) on the same synthetic packed batches (random tokens, documents of random
length), so no corpus is needed. CPU: fp32; GPU: bf16 autocast. MFU uses marin.train.peak_flops
(None on CPU unless MARIN_PEAK_FLOPS is set).

    python benchmarks/train_step.py                      # CPU, preset cpu_s
    python benchmarks/train_step.py --preset d512 --batch 8 --device cuda
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
from marin_ablate.marin.flops import flops_per_token
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train import forward_backward, hardware_name, optimizer_step, peak_flops
from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams


def synthetic_batches(n: int, batch: int, seq_len: int, vocab: int, seed: int = 0):
    """Random tokens; documents of random length (mean seq_len/4) so masks and drops look packed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tok = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
        starts = torch.rand(batch, seq_len, generator=g) < 4.0 / seq_len
        starts[:, 0] = False
        doc = starts.long().cumsum(1)
        tgt = tok[:, 1:].clone()
        tgt[:, :-1][doc[:, 1:] != doc[:, :-1]] = -100
        out.append((tok[:, :-1], tgt, doc))
    return out


def bench_arm(name: str, recipe: Recipe, cfg, batch: int, steps: int, warmup: int, device: torch.device,
              bf16: bool, batches, lr: float | None) -> dict:
    torch.manual_seed(0)
    spec = RunSpec(model=cfg, recipe=recipe, train=TrainConfig(steps=1000, batch_size=batch, lr=lr, adam_lr=lr))
    model = MarinModel(cfg, recipe).to(device)
    opt = build_optimizer(model, resolve_hparams(spec))
    model.train()

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dropped = assigned = opt_s = 0.0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            t0 = time.perf_counter()
        tok, tgt, doc = (x.to(device, non_blocking=True) for x in batches[i % len(batches)])
        out, loss, _, _ = forward_backward(model, tok, tgt, doc, autocast, None)
        sync()
        t_opt = time.perf_counter()
        optimizer_step(model, opt)
        sync()
        if i >= warmup:
            opt_s += time.perf_counter() - t_opt
        if i >= warmup:
            dropped += out.stats.get("dropped", 0.0)
            assigned += out.stats.get("assigned", 0.0)
    sync()
    dt = time.perf_counter() - t0
    tps = steps * batch * cfg.seq_len / dt
    fpt = flops_per_token(cfg, recipe, cfg.seq_len)
    peak = peak_flops(device, "bf16" if bf16 else "fp32")
    return {"arm": name, "tokens_per_s": tps, "model_flops_per_s": fpt * tps, "mfu": fpt * tps / peak if peak else None,
            "flops_per_token": fpt, "step_ms": 1e3 * dt / steps, "opt_ms": 1e3 * opt_s / steps,
            "drop_rate": dropped / max(assigned, 1.0),
            "final_loss": loss,
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=None, help="default: cpu_s on CPU, d512 on CUDA")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 8 CPU, 8 GPU)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda")
    ap.add_argument("--lr", default="1e-6", help="peak lr of every group, or 'heuristic'. Default 1e-6: "
                    "synthetic tokens carry nothing to learn and real lrs collapse the baseline's routing "
                    "within a few steps (91%% drops seen at d512), which would make the baseline look fast")
    ap.add_argument("--precision", default="auto", help="auto (bf16 autocast on CUDA, fp32 on CPU), bf16, fp32")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    dev = ("cuda" if args.device == "auto" and torch.cuda.is_available()
           else ("cpu" if args.device == "auto" else args.device))
    device = torch.device(dev)
    cfg = preset(args.preset or ("d512" if device.type == "cuda" else "cpu_s"), list(args.set))
    batch = args.batch or 8
    bf16 = device.type == "cuda" if args.precision == "auto" else args.precision == "bf16"
    batches = synthetic_batches(4, batch, cfg.seq_len, cfg.vocab_size)
    lr = None if args.lr == "heuristic" else float(args.lr)
    rows = [bench_arm(n, r, cfg, batch, args.steps, args.warmup, device, bf16, batches, lr)
            for n, r in (("recipe", Recipe()), ("baseline", Recipe.baseline()))]
    print(f"hardware {hardware_name(device)}  preset {args.preset or 'default'} d{cfg.d_model} L{cfg.n_layers} "
          f"seq {cfg.seq_len} batch {batch}  {'bf16 autocast' if bf16 else 'fp32'}  {args.steps} timed steps")
    print(f"{'arm':<9} {'tokens/s':>12} {'model TFLOP/s':>14} {'MFU':>8} {'step ms':>9} {'optim ms':>9} "
          f"{'drop rate':>10} {'GFLOP/tok':>10}")
    for r in rows:
        mfu = f"{100 * r['mfu']:.2f}%" if r["mfu"] is not None else "n/a"
        print(f"{r['arm']:<9} {r['tokens_per_s']:>12.0f} {r['model_flops_per_s'] / 1e12:>14.4f} {mfu:>8} "
              f"{r['step_ms']:>9.1f} {r['opt_ms']:>9.1f} {r['drop_rate']:>10.4f} {r['flops_per_token'] / 1e9:>10.4f}")
    a, b = rows
    print(f"ratio recipe/baseline: tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.3f}  "
          f"model FLOP/s (R) {a['model_flops_per_s'] / b['model_flops_per_s']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
