"""Time one MoE-block training step (forward, backward, FSDP2 + expert-grad sync, AdamW) under real
expert parallelism for each EP transport (docs/method.md §2.1 "EP transports").

    OMP_NUM_THREADS=1 python benchmarks/ep_step.py                # 2 gloo CPU processes
    python benchmarks/ep_step.py --world 8 --tokens 16384 --d 1024  # GPUs with NCCL, when present

On CPU every rank uses one thread. With CUDA the world is capped at the GPU count (NCCL needs one
GPU per rank); one GPU gives a 1-rank EP group: it then times the transports' compute and buffer
work (fixed and pooled_wave pad to static capacity, ragged computes only received rows), not the
network. Prints one row per transport (fixed, pooled_wave: Marin's hero transport, ragged, dropless)
with its step time relative to dropless measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TRANSPORTS = ("fixed", "pooled_wave", "ragged", "dropless")  # dropless last: the ratios' baseline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Root(torch.nn.Module):
    """The MoE block inside a root module, as `marin.parallel.apply_fsdp` shards a model."""

    def __init__(self, moe: torch.nn.Module):
        super().__init__()
        self.moe = moe

    def forward(self, x):
        return self.moe(x)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out_dir: str) -> None:
    from marin_ablate.marin.config import ModelConfig, Recipe
    from marin_ablate.marin.ep import build_ep_groups, shard_experts
    from marin_ablate.marin.moe import MoE
    from marin_ablate.marin.parallel import apply_fsdp

    # A bare MoE block returns a view; FSDP2 warns about in-place ops on it, and we do none.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available() and not args.cpu
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(args.threads)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    groups = build_ep_groups(world, "cuda" if cuda else "cpu")
    base = ModelConfig(d_model=args.d, n_heads=max(1, args.d // 64), head_dim=64, n_kv_heads=1, n_kv_heads_global=1,
                       n_experts=args.experts, top_k=args.top_k, expert_hidden=args.hidden,
                       shared_hidden=args.hidden, ep_shards=world)
    seq = 256
    B = max(1, args.tokens // seq)
    results = {}
    for transport in TRANSPORTS:
        cfg = replace(base)
        torch.manual_seed(0)
        moe = MoE(cfg, Recipe(ep_transport=transport))
        with torch.no_grad():
            for p in moe.parameters():
                p.normal_(0, 0.5 / args.d**0.5)
        moe = apply_fsdp(shard_experts(_Root(moe.to(dev, dtype).train()), groups), groups)  # the trainer's sharding
        opt = torch.optim.AdamW(moe.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(1 + rank)
        times, drops, moved = [], [], []
        for step in range(args.warmup + args.steps):
            x = torch.randn(B, seq, args.d, generator=gen).to(dev, dtype)
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            o = moe(x)
            o.y_BSD.float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if step >= args.warmup:
                times.append(dt)
                # read once the step is timed: the static transports keep their counts on the device
                drops.append(float(o.dispatch.dropped) / o.dispatch.assigned)
                moved.append(float(o.dispatch.bytes_moved))
        # The step is as slow as the slowest rank.
        t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        results[transport] = dict(step_s=float(t), drop_rate=statistics.mean(drops), bytes_moved=statistics.mean(moved))
    if rank == 0:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(dict(results=results, world=world, device=str(dev), dtype=str(dtype), tokens_per_rank=B * seq), f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per rank per step")
    ap.add_argument("--d", type=int, default=128, help="model width (latent width d/2 is dispatched)")
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is present")
    args = ap.parse_args(argv)
    world = args.world
    if torch.cuda.is_available() and not args.cpu:
        world = min(world, torch.cuda.device_count())
    if args.experts % world:
        raise ValueError(f"--experts={args.experts} is not divisible by the world size {world}")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, _free_port(), args, tmp), nprocs=world, join=True)
        with open(os.path.join(tmp, "result.json")) as f:
            res = json.load(f)
    print(f"EP step benchmark: world={res['world']} device={res['device']} dtype={res['dtype']} "
          f"tokens/rank={res['tokens_per_rank']} d={args.d} experts={args.experts} top_k={args.top_k} "
          f"hidden={args.hidden} (latent MoE: rows of width {args.d // 2})")
    base = res["results"]["dropless"]["step_s"]
    print(f"{'transport':>11} {'step ms':>9} {'/ dropless':>10} {'drop %':>7} {'MB sent/rank':>13}")
    for tr, r in res["results"].items():
        print(f"{tr:>11} {1e3 * r['step_s']:9.2f} {r['step_s'] / base:10.3f} {100 * r['drop_rate']:7.2f} "
              f"{r['bytes_moved'] / 1e6:13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
