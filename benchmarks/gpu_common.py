"""Shared state and helpers of the GPU benchmark (benchmarks/gpu.py): options, the result rows and
their ceilings, timing, a section wrapper that reports a failure as a row, markdown output."""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the GPU machine runs the repo without installing it

H200_BF16_DENSE_TFLOPS = 989.4  # datasheet dense bf16, for a second MFU column



def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--quick", action="store_true",
                   help="a ~1-minute subset: no config sweeps, no compile, no full model")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU dry run of the code paths)")
    p.add_argument("--out", default=None, help="markdown file to append to (default benchmarks/RESULTS.md on cuda)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--budget-s", type=float, default=450.0, help="skip remaining optional sections past this")
    p.add_argument("--compile-cpu", action="store_true", help="also run the torch.compile'd blocks on CPU (slow)")
    p.add_argument("--no-blocks", action="store_true", help="leave the eager blocks out (a section of their own)")
    p.add_argument("--blocks-only", action="store_true",
                   help="the ceilings, then the compiled recipe block vs the compiled plain block (eager on CPU "
                        "without --compile-cpu) only: benchmarks/gpu_check.sh's last section")
    args = p.parse_args(argv)
    if args.device not in (None, "cuda", "cpu"):
        p.error(f"--device={args.device!r}; allowed values: 'cuda', 'cpu'")
    return args


ARGS: argparse.Namespace = None  # type: ignore[assignment]  # set by gpu.main
ROWS: list[dict] = []
CEIL = {"copy_GBps": None, "matmul_TFLOPs": None}
T0 = time.time()


def row(section, name, value, unit, vs=None, note=""):
    ROWS.append(dict(section=section, name=name, value=value, unit=unit, vs=vs, note=note))
    v = f"{value:,.3g}" if isinstance(value, (int, float)) and value is not None else str(value)
    print(f"  {section:10s} {name:48s} {v:>12s} {unit:8s} {vs or '':>10s} {note}", flush=True)


def gbps_row(section, name, nbytes, ms, note=""):
    gb = nbytes / (ms * 1e-3) / 1e9
    vs = f"{100 * gb / CEIL['copy_GBps']:.0f}% copy" if CEIL["copy_GBps"] else None
    row(section, name, gb, "GB/s", vs, note or f"{ms:.3f} ms")
    return gb


def tflops_row(section, name, flops, ms, note=""):
    tf = flops / (ms * 1e-3) / 1e12
    vs = f"{100 * tf / CEIL['matmul_TFLOPs']:.0f}% mm" if CEIL["matmul_TFLOPs"] else None
    row(section, name, tf, "TFLOP/s", vs, note or f"{ms:.2f} ms")
    return tf


def err_row(section, name, got, ref, tol):
    got, ref = got.float(), ref.float()
    rel = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
    row(section, name, rel, "rel err", "ok" if rel <= tol else "FAIL", f"max|Δ|/max|ref|, tol {tol:g}")
    return rel


def elapsed() -> float:
    return time.time() - T0


def section(fn):
    """Run one section; report its failure as a row and carry on."""

    def run(*a, **k):
        name = fn.__name__.removeprefix("bench_")
        print(f"\n== {name} (t={elapsed():.0f}s)", flush=True)
        t = time.time()
        try:
            fn(*a, **k)
        except Exception as e:  # noqa: BLE001 - one failure must not kill the rest
            traceback.print_exc()
            row(name, "SECTION FAILED", f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}",
                "", None)
        print(f"   ({time.time() - t:.1f}s)", flush=True)

    return run


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timeit(fn, dev, warmup=2, iters=10) -> float:
    """Milliseconds per call (CUDA events on GPU, wall clock on CPU)."""
    import torch

    if ARGS.tiny:
        warmup, iters = 1, 2
    for _ in range(warmup):
        fn()
    sync(dev)
    if dev.type == "cuda":
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize(dev)
        return s.elapsed_time(e) / iters
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) * 1e3 / iters


def random_doc_ids(B, S, mean_len, dev):
    """Packed-document ids: boundaries at random positions, ~S/mean_len documents per row."""
    import torch

    starts = (torch.rand(B, S, device=dev) < 1.0 / mean_len).long()
    starts[:, 0] = 1
    return torch.cumsum(starts, 1) - 1



TRITON_OK = False


def get_kernels(backend):
    from marin_ablate.marin.kernels import get_kernels as gk

    return gk(backend)


def write_markdown(path: Path, dev_name: str, header: str) -> None:
    lines = [f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC — {dev_name}", "",
             header, "", "| section | measurement | value | unit | vs | note |", "|---|---|---|---|---|---|"]
    for r in ROWS:
        v = r["value"]
        v = f"{v:,.4g}" if isinstance(v, (int, float)) else str(v)
        lines.append(f"| {r['section']} | {r['name'].strip()} | {v} | {r['unit']} | {r['vs'] or ''} | {r['note']} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a") as f:
        if new:
            f.write("# GPU benchmark results\n\nAppended by `benchmarks/gpu.py` (one section per run).\n")
        f.write("\n".join(lines) + "\n")
    print(f"\nappended {len(ROWS)} rows to {path}")


