"""Hardware identity and peak FLOP/s for MFU, and the code version recorded in every summary.

MFU follows PaLM's definition (Chowdhery et al. 2022, arXiv 2204.02311, App. B): model FLOPs per
second over the hardware's dense peak.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from pathlib import Path

import torch

# Dense bf16 peak FLOP/s by device-name substring (vendor datasheets); first match wins.
PEAK_FLOPS_BF16: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15), ("B200", 2.25e15), ("H200", 989e12), ("H100", 989e12), ("H800", 989e12),
    ("A100", 312e12), ("L40S", 362e12), ("A10G", 125e12),
)


def code_version() -> str:
    """Package version + a hash of the marin/ sources (works without git) + git HEAD when present."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("marin-ablate")
    except PackageNotFoundError:
        v = "0"
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]  # marin/
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    out = f"{v}+src.{h.hexdigest()[:12]}"
    head = root.parent / ".git" / "HEAD"
    with contextlib.suppress(OSError):
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            ref = (root.parent / ".git" / ref[5:]).read_text().strip()
        out += f".g{ref[:10]}"
    return out


def hardware_name(device: torch.device) -> str:
    """GPU name, or the CPU model and thread count (throughput ratios only compare like with like)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"cpu:{model} x{torch.get_num_threads()}"


def peak_flops(device: torch.device, precision: str) -> float | None:  # noqa: ARG001
    """Hardware peak for MFU: dense bf16 from PEAK_FLOPS_BF16 (fp32 runs on GPU use the same peak,
    so their MFU reads low, as it should); MARIN_PEAK_FLOPS overrides; CPU has no honest nominal
    peak, so MFU is None there unless MARIN_PEAK_FLOPS is set."""
    env = os.environ.get("MARIN_PEAK_FLOPS")
    if env:
        return float(env)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((val for key, val in PEAK_FLOPS_BF16 if key in name), None)
