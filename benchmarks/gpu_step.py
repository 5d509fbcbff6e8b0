#!/usr/bin/env python3
"""Real training steps on one GPU for benchmarks/gpu_check.sh: a GPU rung (or the hero's one-GPU slice) in the
layout planning.layout picks for this GPU's memory (virtual EP shards, micro-batches: marin/train/accum.py),
its step time and peak memory against the dry run's prediction for the same config; and the distributed
per-rank code (FSDP2 + EP sharding, the world-reduced step, the owner-rank optimizer) on a one-rank NCCL
group against the one-process step from the same weights. Prints rows and appends them to --md.

    python benchmarks/gpu_step.py step --study marin535 --rung d512 [--steps 3]
    python benchmarks/gpu_step.py step --study hero_gpu
    python benchmarks/gpu_step.py one-rank
    python benchmarks/gpu_step.py flex        # the hero's 65k-stage attention layer: peak vs _FlexFootprint
    python benchmarks/gpu_step.py precompute  # on CPU: the layouts' activation measurements, into the repository
    add --cpu-dry: the same code at a CPU's width (planning.dryrun.narrowed: d64, 2 layers, fp32, eager)

A layout needs one fake-tensor activation measurement per spec (planning.layout.cached_activations: CPU work,
~20-60 s a spec); `precompute` writes them for every spec the GPU check steps, GPU width and --cpu-dry width, to
benchmarks/gpu_check_layouts.json, which travels with the repository, so the lent GPU's minutes go to the GPU
(tests/repo/test_gpu_check.py fails when an entry is missing for the current specs).

Imports torch, numpy and marin_ablate only (no datasets, submitit, optuna or pandas: a lent GPU has none of them);
the batches are random tokens in documents of random length (a step's cost and memory do not depend on text).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import time
from pathlib import Path

import torch

GiB = 2**30
ROWS: list[tuple] = []
PRECOMPUTED = Path(__file__).with_name("gpu_check_layouts.json")
#: The (study, rung) of every step section of benchmarks/gpu_check.sh, in its order
STEPS = (("marin535", "d1024"), ("hero_gpu", None))


def row(section: str, name: str, value, unit: str = "", note: str = "") -> None:
    ROWS.append((section, name, value, unit, note))
    v = f"{value:,.4g}" if isinstance(value, (int, float)) else str(value)
    print(f"  {section:10s} {name:52s} {v:>12s} {unit:8s} {note}", flush=True)


def first_run(study_name: str, rung: str | None):
    """A rung's all-on arm as its study trains it (the rung's model and train config; built without the study's
    design, which needs pydoe), or a study's first run (the hero's smoke studies)."""
    from marin_ablate.ablations import get_study
    from marin_ablate.ablations.ladders import get_rung
    from marin_ablate.marin.config import Recipe, RunSpec

    if rung is not None:
        r = get_rung(rung)
        return RunSpec(model=r.model(), recipe=Recipe(), train=r.train_config())
    return get_study(study_name).runs()[0][0]


def batch(cfg, rows: int, dev, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=g)
    docs = torch.cumsum((torch.rand(rows, cfg.seq_len, generator=g) < 1 / 512).long(), 1)
    return tok.to(dev), tok.roll(-1, 1).to(dev), docs.to(dev)


def cpu_dry_spec(spec):
    from marin_ablate.planning.dryrun import narrowed

    small = narrowed(spec, 1, seqs_per_rank=4)
    return dataclasses.replace(small, train=dataclasses.replace(small.train, micro_batches=1))


def step_spec(study: str, rung: str | None, cpu_dry: bool):
    spec = first_run(study, rung)
    return cpu_dry_spec(spec) if cpu_dry else spec


def activations(spec) -> tuple[dict, str]:
    """The layout's activation measurement at one sequence: from PRECOMPUTED when it holds this spec, else measured
    now (planning.layout.cached_activations)."""
    import json

    from marin_ablate.planning.layout import activation_key, cached_activations

    got = json.loads(PRECOMPUTED.read_text()) if PRECOMPUTED.is_file() else {}
    key = activation_key(spec)
    if key in got:
        return got[key]["act1"], f"precomputed ({PRECOMPUTED.name})"
    return cached_activations(spec), "measured now (not in the precomputed file: run `gpu_step.py precompute`)"


def cmd_precompute(a) -> None:
    import json

    from marin_ablate.planning.layout import activation_key, cached_activations

    out = {}
    for study, rung in STEPS:
        for dry in (False, True):
            spec = step_spec(study, rung, dry)
            t0 = time.perf_counter()
            out[activation_key(spec)] = {"study": study, "rung": rung, "cpu_dry": dry, "act1": cached_activations(spec)}
            row("precompute", f"{study} {rung or ''} {'--cpu-dry' if dry else 'GPU width'}".replace("  ", " "),
                time.perf_counter() - t0, "s", activation_key(spec))
    PRECOMPUTED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


def cmd_step(a) -> None:
    from marin_ablate.marin.train.distributed import ParallelDims, build_train_model
    from marin_ablate.marin.train.step import optimizer_step
    from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams
    from marin_ablate.planning.layout import choose_layout, with_layout

    spec = step_spec(a.study, a.rung, a.cpu_dry)
    name = f"{a.study}" + (f" {a.rung}" if a.rung else "")
    dev = torch.device("cpu" if a.cpu_dry else "cuda")
    if a.cpu_dry:
        capacity = 1.0  # GiB: a small "device", so that the layout accumulates
    else:
        capacity = torch.cuda.get_device_properties(dev).total_memory / GiB
    t0 = time.perf_counter()
    act1, where = activations(spec)
    lay = choose_layout(spec, 1, capacity, act1=act1)
    if a.cpu_dry and lay["micro_batches"] == 1:  # the CPU width fits whole: accumulate anyway, it is the code path
        lay = {**lay, "micro_batches": 2, "sequences_per_micro_batch": lay["sequences_per_micro_batch"] // 2}
    row("layout", f"{name} on 1 GPU of {capacity:.1f} GiB: micro-batches x sequences",
        f"{lay['micro_batches']} x {lay['sequences_per_micro_batch']}", "",
        f"{lay['virtual_shards']} virtual EP shards; predicted {lay['predicted_gib']:.1f} GiB, {lay['free']:.1%} free; "
        f"activations {where}; chosen in {time.perf_counter() - t0:.0f} s")
    if lay.get("headroom_note"):
        row("layout", f"{name}: headroom", f"{lay['free']:.1%}", "free", lay["headroom_note"])
    spec = with_layout(spec, lay)
    t = spec.train
    torch.manual_seed(spec.seed)
    model = build_train_model(spec, dev)
    if t.compile:
        for block in model.blocks:
            block.compile()
    opt = build_optimizer(model, resolve_hparams(spec))
    amp = t.precision == "bf16"

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp)

    pd = ParallelDims()
    tok, tgt, docs = batch(spec.model, t.batch_size, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times, losses = [], []
    for i in range(a.steps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        ts = time.perf_counter()
        out, loss, ce, gnorm = pd.forward_backward(model, tok, tgt, docs, autocast, t.grad_clip, t.micro_batches)
        optimizer_step(model, opt)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - ts)
        losses.append(loss)
    ok = all(x == x and abs(x) < 1e4 for x in losses)
    row("step", f"{name}: losses of {a.steps} steps finite", "yes" if ok else "NO", "",
        " ".join(f"{x:.3f}" for x in losses))
    row("step", f"{name}: step time (after the first)" if len(times) > 1 else f"{name}: step time (one step)",
        min(times[1:] or times), "s", (f"first {times[0]:.1f} s (compile)" if len(times) > 1 else
                                       "compile included") if t.compile else "")
    tokens = t.batch_size * spec.model.seq_len
    row("step", f"{name}: tokens per second", tokens / min(times[1:] or times), "tok/s", f"{tokens} tokens a step")
    if dev.type == "cuda":
        alloc = torch.cuda.max_memory_allocated(dev) / GiB
        reserved = torch.cuda.max_memory_reserved(dev) / GiB
        row("memory", f"{name}: peak allocated vs predicted tensors", alloc, "GiB",
            f"predicted {lay['predicted_tensor_gib']:.1f} GiB ({alloc / lay['predicted_tensor_gib']:.0%})")
        row("memory", f"{name}: peak reserved vs predicted total", reserved, "GiB",
            f"predicted {lay['predicted_gib']:.1f} GiB of {capacity:.1f}")
    else:
        row("memory", f"{name}: peak (GPU only)", "n/a on CPU", "", f"predicted {lay['predicted_gib']:.3f} GiB")


def cmd_one_rank(a) -> None:
    import os

    import torch.distributed as dist

    from marin_ablate.marin import ep
    from marin_ablate.marin.train.distributed import ParallelDims, build_train_model
    from marin_ablate.marin.train.step import optimizer_step
    from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams

    dev = torch.device("cpu" if a.cpu_dry else "cuda")
    spec = cpu_dry_spec(first_run("marin535", "d512"))
    if not a.cpu_dry:  # bf16 compute on the GPU, fp32 master weights (the rungs' mixed precision)
        spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, device="cuda", precision="bf16",
                                                                   mixed_precision="bf16"))
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, ep_shards=1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    backend = "gloo" if a.cpu_dry else "nccl"
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        groups = ep.build_ep_groups(1, dev.type)
        pd = ParallelDims(1, 0, groups)
        torch.manual_seed(0)
        sharded = build_train_model(spec, dev, groups)
        single = build_train_model(spec, dev)  # the same layout-independent init
        amp = spec.train.precision == "bf16"

        def autocast():
            return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp)

        tok, tgt, docs = batch(spec.model, spec.train.batch_size, dev)
        o1 = build_optimizer(sharded, resolve_hparams(spec), expert_group=pd.expert_group)
        o2 = build_optimizer(single, resolve_hparams(spec))
        losses = []
        for _ in range(2):
            _, l1, _, g1 = pd.forward_backward(sharded, tok, tgt, docs, autocast, None)
            optimizer_step(sharded, o1, pd.world_group)
            _, l2, _, g2 = ParallelDims().forward_backward(single, tok, tgt, docs, autocast, None)
            optimizer_step(single, o2)
            losses.append((l1, l2, g1, g2))
        tol = 2e-2 if amp else 1e-4
        ok = all(abs(x - y) <= tol * abs(y) for x, y, _, _ in losses)
        row("one-rank", f"{backend} world 1, FSDP2 + EP 1: losses vs one process", "equal" if ok else "DIFFER", "",
            "; ".join(f"{x:.4f}/{y:.4f}" for x, y, _, _ in losses) + f" (tol {tol:g})")
    finally:
        dist.destroy_process_group()


def cmd_flex(a) -> None:
    """The hero's 65k context stage, one attention layer of each kind (local: window 2,048; global: causal) at its
    per-GPU shape (one sequence of 65,536 tokens, 48 query heads of 128, 12 / 6 KV heads), compiled flex forward +
    backward in bf16: the peak allocated above the inputs against the dry run's stand-in `_FlexFootprint` (out,
    fp32 logsumexp, dq, dk, dv, the fp32 row term) and the block masks. flex has no CPU backward: --cpu-dry runs
    the forward at 1,024 tokens and a head of 64 (eager), the backward is GPU only."""
    from torch.nn.attention.flex_attention import flex_attention

    from marin_ablate.ablations.studies import get_study
    from marin_ablate.marin.model import block_masks
    from marin_ablate.marin.train.stages import stage_specs

    (spec, _), = get_study("hero").runs()
    last, at, _ = stage_specs(spec)[-1]
    m = at.model
    rows = at.train.batch_size // get_study("hero").hero.gpus  # sequences per GPU at this stage
    S, H, h = last.seq_len, m.n_heads, m.head_dim
    dev, dt = (torch.device("cpu"), torch.float32) if a.cpu_dry else (torch.device("cuda"), torch.bfloat16)
    if a.cpu_dry:
        S, H, h = 1024, 4, 64
    attend = flex_attention if a.cpu_dry else torch.compile(flex_attention)
    for kind, kv in (("local", m.n_kv_heads), ("global", m.n_kv_heads_global)):
        kv = max(1, kv * H // m.n_heads)
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(rows, H, S, h, device=dev, dtype=dt, generator=g, requires_grad=not a.cpu_dry)
        k = torch.randn(rows, kv, S, h, device=dev, dtype=dt, generator=g, requires_grad=not a.cpu_dry)
        v = torch.randn(rows, kv, S, h, device=dev, dtype=dt, generator=g, requires_grad=not a.cpu_dry)
        grad = torch.randn(rows, H, S, h, device=dev, dtype=dt, generator=g)
        nb = -(-S // 128)  # _FlexFootprint: out, dq, dk, dv, the fp32 logsumexp and row term; the block masks
        size = (2 * q.numel() + k.numel() + v.numel()) * q.element_size() + 2 * rows * H * S * 4 + 32 * (nb + nb * nb)
        for attempt in ("warm-up", "measured"):  # the first call compiles
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                base = torch.cuda.memory_allocated(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            t0 = time.perf_counter()
            local, glob = block_masks(None, rows, S, m.window, dev)
            out = attend(q, k, v, block_mask=local if kind == "local" else glob, scale=h ** -0.5, enable_gqa=True)
            if not a.cpu_dry:
                out.backward(grad)
                torch.cuda.synchronize(dev)
            secs = time.perf_counter() - t0
            if attempt == "measured":
                if dev.type == "cuda":
                    peak = (torch.cuda.max_memory_allocated(dev) - base) / GiB
                    row("flex-65k", f"{kind} layer, {rows} x {S:,} tokens, {H} heads / {kv} KV: peak above inputs",
                        peak, "GiB", f"_FlexFootprint {size / GiB:.2f} GiB ({peak / (size / GiB):.0%}); {secs:.2f} s")
                else:
                    row("flex-65k", f"{kind} layer forward at {S:,} tokens (CPU: no flex backward)", tuple(out.shape),
                        "", f"the GPU measures forward + backward at {last.seq_len:,}; {secs:.2f} s")
            del out
            for t in (q, k, v):
                t.grad = None


def write_md(path: Path, header: str) -> None:
    lines = [f"\n### {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: {header}", "",
             "| section | measurement | value | unit | note |", "|---|---|---|---|---|"]
    for s, n, v, u, note in ROWS:
        v = f"{v:,.4g}" if isinstance(v, (int, float)) else str(v)
        lines.append(f"| {s} | {n} | {v} | {u} | {note} |")
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("step", "one-rank", "flex", "precompute"))
    ap.add_argument("--study", default="marin535")
    ap.add_argument("--rung", default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cpu-dry", action="store_true")
    ap.add_argument("--md", default=None, help="markdown file to append the rows to")
    a = ap.parse_args(argv)
    if a.cpu_dry:
        torch.set_num_threads(1)
    dev = "cpu" if a.cpu_dry or a.mode == "precompute" else torch.cuda.get_device_name(0)
    header = f"gpu_step.py {' '.join(argv or [])} on {dev}, torch {torch.__version__}".strip()
    print(header, flush=True)
    try:
        {"step": cmd_step, "one-rank": cmd_one_rank, "flex": cmd_flex, "precompute": cmd_precompute}[a.mode](a)
    finally:
        if a.md:
            write_md(Path(a.md), header)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
