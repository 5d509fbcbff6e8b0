"""Forward+backward throughput of the recipe vs the baseline model (docs/method.md §4.3: the throughput ratio R
is model FLOP/s of the arm over the baseline's, on the same hardware). Prints a table.

Run: OMP_NUM_THREADS=1 python benchmarks/model_step.py                      (CPU, fp32, tiny)
     python benchmarks/model_step.py --preset d1024 --batch 4 --steps 10    (CUDA: bf16, d1024 default)
     add --factors to time each single factor switched on from the baseline.

A step = forward, backward and the router-bias update (no optimizer). Achieved FLOP/s uses the
analytic training FLOPs of marin.flops (3 × forward, causal-windowed attention).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from marin_ablate.marin import flops
from marin_ablate.marin.config import MODEL_FACTORS, RECIPE_LEVELS, Recipe
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.presets import preset


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_arm(cfg, recipe: Recipe, *, batch: int, seq: int, steps: int, warmup: int, device, dtype,
             compile_: bool) -> dict:
    torch.manual_seed(0)
    with torch.device(device):  # init on the device: a d1024 model holds ~3B routed parameters
        model = MarinModel(cfg, recipe)
    model = model.to(dtype).train()
    step_fn = torch.compile(model) if compile_ else model
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    docs = torch.cumsum((torch.rand(batch, seq, device=device) < 1 / 512).long(), 1)  # ~512-token documents
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, drops = [], []
    for i in range(warmup + steps):
        _sync(device)
        t = time.perf_counter()
        out = step_fn(tokens, docs, tokens.roll(-1, 1))
        out.loss.backward()
        model.update_router_biases()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t)
            drops.append(out.stats["drop_rate"])
        model.zero_grad(set_to_none=True)
    step_s = sorted(times)[len(times) // 2]  # median step
    tok_s = batch * seq / step_s
    fpt = flops.flops_per_token(cfg, recipe, seq)
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    del model, step_fn
    return {"step_ms": 1e3 * step_s, "tokens_per_s": tok_s, "flops_per_token": fpt, "flop_s": fpt * tok_s,
            "params_active": flops.params_active(cfg, recipe), "drop_rate": sum(drops) / len(drops), "mem_gib": mem}


def profile_arm(cfg, recipe: Recipe, *, batch: int, seq: int, device, dtype, rows: int = 25) -> None:
    """torch.profiler over 2 steps (after 2 warm-up steps): the top ops by device (or CPU) self time."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    with torch.device(device):
        model = MarinModel(cfg, recipe)
    model = model.to(dtype).train()
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    docs = torch.cumsum((torch.rand(batch, seq, device=device) < 1 / 512).long(), 1)

    def step():
        model(tokens, docs, tokens.roll(-1, 1)).loss.backward()
        model.update_router_biases()
        model.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            step()
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))


def check_kernels(cfg, device, dtype, seq: int) -> None:
    """Before timing: on this device the triton and torch kernel sets agree (eval logits, training grads),
    eval stays causal, and every gradient is finite, for the recipe and the baseline."""
    for recipe in (Recipe(), Recipe.baseline()):
        torch.manual_seed(0)
        with torch.device(device):
            ref = MarinModel(dataclasses.replace(cfg, kernels="torch"), recipe)
            tri = MarinModel(dataclasses.replace(cfg, kernels="triton"), recipe)
        tri.load_state_dict(ref.state_dict())
        ref, tri = ref.to(dtype), tri.to(dtype)
        tok = torch.randint(0, cfg.vocab_size, (2, seq), device=device)
        docs = torch.cumsum((torch.rand(2, seq, device=device) < 4 / seq).long(), 1)
        t = seq // 2
        tok2 = tok.clone()
        tok2[:, t + 1:] = torch.randint(0, cfg.vocab_size, (2, seq - t - 1), device=device)
        with torch.no_grad():
            a = ref.eval()(tok, docs).logits_BSV.float()
            b = tri.eval()(tok, docs).logits_BSV.float()
            c = tri(tok2, docs).logits_BSV.float()
        print(f"# check {recipe.xsa:>4}: torch-vs-triton logits max|d| {(a - b).abs().max():.3g} "
              f"(max|logit| {a.abs().max():.3g}); causal max|d| {(c[:, :t + 1] - b[:, :t + 1]).abs().max():.3g}")
        for m in (ref, tri):
            out = m.train()(tok, docs, tok.roll(-1, 1))
            out.loss.backward()
            bad = [n for n, p in m.named_parameters() if not torch.isfinite(p.grad).all()]
            print(f"#   {m.cfg.kernels:<6} loss {out.loss.item():.4f} drop {out.stats['drop_rate']:.4f} "
                  f"non-finite grads {bad}")
        g_ref = {n: p.grad.float() for n, p in ref.named_parameters()}
        rel = {n: ((p.grad.float() - g_ref[n]).norm() / (g_ref[n].norm() + 1e-12)).item()
               for n, p in tri.named_parameters()}
        worst = max(rel, key=rel.get)
        print(f"#   worst grad rel diff torch-vs-triton {rel[worst]:.3g} ({worst})")
        del ref, tri


def main(argv: list[str] | None = None) -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="d1024" if cuda else "tiny")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 4 on CUDA, 8 on CPU)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--kernels", choices=("torch", "triton"), default=None,
                   help="default triton on CUDA when importable, torch otherwise")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--factors", action="store_true", help="also time the baseline with each single factor on")
    p.add_argument("--profile", action="store_true", help="profile the recipe arm instead of timing the arms")
    p.add_argument("--check", type=int, default=0, metavar="SEQ",
                   help="first check triton vs torch kernels at this sequence length (4 layers of the preset)")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    kernels = args.kernels
    if kernels is None:
        kernels = "torch"
        if device.type == "cuda":
            try:
                import triton  # noqa: F401

                kernels = "triton"
            except ImportError:
                pass
    cfg = preset(args.preset, args.overrides + [f"kernels={kernels}"])
    seq = args.seq or cfg.seq_len
    batch = args.batch or (4 if device.type == "cuda" else 8)

    if args.check:
        check_kernels(dataclasses.replace(cfg, n_layers=min(cfg.n_layers, 4)), device, dtype, args.check)

    if args.profile:
        for name, recipe in (("recipe", Recipe()), ("baseline", Recipe.baseline())):
            print(f"# profile {name}: preset {args.preset} batch {batch} seq {seq} {dtype} kernels {kernels}")
            profile_arm(cfg, recipe, batch=batch, seq=seq, device=device, dtype=dtype)
        return

    arms = [("recipe", Recipe()), ("baseline", Recipe.baseline())]
    if args.factors:
        arms += [(f"baseline+{f}", Recipe.baseline().with_(**{f: RECIPE_LEVELS[f][0]})) for f in MODEL_FACTORS]
    print(f"# preset {args.preset}  device {device}  dtype {dtype}  kernels {kernels}  batch {batch}  seq {seq}  "
          f"steps {args.steps} (median)  compile {args.compile}")
    rows = {}
    for name, recipe in arms:
        rows[name] = time_arm(cfg, recipe, batch=batch, seq=seq, steps=args.steps, warmup=args.warmup,
                              device=device, dtype=dtype, compile_=args.compile)
    base = rows["baseline"]
    header = f"{'arm':<24} {'active':>9} {'GFLOP/tok':>10} {'step ms':>9} {'tok/s':>11} {'TFLOP/s':>9} " \
             f"{'tok/s ratio':>11} {'FLOP/s ratio':>12} {'drop %':>7} {'mem GiB':>8}"
    print(header)
    print("-" * len(header))
    for name, r in rows.items():
        print(f"{name:<24} {r['params_active'] / 1e6:>8.2f}M {r['flops_per_token'] / 1e9:>10.4f} {r['step_ms']:>9.1f} "
              f"{r['tokens_per_s']:>11.0f} {r['flop_s'] / 1e12:>9.4f} "
              f"{r['tokens_per_s'] / base['tokens_per_s']:>11.3f} "
              f"{r['flop_s'] / base['flop_s']:>12.3f} {100 * r['drop_rate']:>7.2f} {r['mem_gib']:>8.2f}")


if __name__ == "__main__":
    main()
