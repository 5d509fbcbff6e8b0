"""Real torch.distributed ranks for the tests: forked processes on a free loopback port."""

from __future__ import annotations

import socket
import time

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn, args: tuple, nprocs: int, timeout_s: float) -> None:
    """Fork `nprocs` ranks of fn(rank, *args) and wait, killing them all past `timeout_s`."""
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="fork")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"distributed ranks did not finish within {timeout_s} s")


def write_result(path: str, fn) -> None:
    """In a rank: write fn()'s dict as JSON to `path`, or {"error": traceback} when it raises."""
    import json
    import traceback

    try:
        out = fn()
    except Exception:
        out = {"error": traceback.format_exc()}
    with open(path, "w") as f:
        json.dump(out, f)


def read_results(paths) -> list[dict]:
    """Every rank's `write_result` dict, failing the test with the first rank's error."""
    import json
    from pathlib import Path

    outs = [json.loads(Path(p).read_text()) for p in paths]
    for o in outs:
        assert "error" not in o, o["error"]
    return outs


class count_host_reads:
    """Counts what reads a tensor's value on the host (a device sync on GPU) while active: .tolist(),
    .item(), int/float/bool/index of a tensor, .numpy(), nonzero, and repeat_interleave with tensor
    repeats and no output_size. `with count_host_reads() as c: ...; c.n` (c.calls names them)."""

    _METHODS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "nonzero")

    def __enter__(self):
        import torch

        self.calls: list[str] = []
        self._saved = [(torch.Tensor, m, getattr(torch.Tensor, m)) for m in self._METHODS]
        self._saved += [(torch, "nonzero", torch.nonzero), (torch, "repeat_interleave", torch.repeat_interleave)]
        for owner, name, fn in self._saved:
            setattr(owner, name, self._wrap(name, fn))
        return self

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            tensor_repeats = len(args) > 1 and hasattr(args[1], "shape") and args[1].dim() > 0
            if name != "repeat_interleave" or (tensor_repeats and kwargs.get("output_size") is None):
                self.calls.append(name)
            return fn(*args, **kwargs)
        return counted

    def __exit__(self, *exc):
        for owner, name, fn in self._saved:
            setattr(owner, name, fn)
        return False

    @property
    def n(self) -> int:
        return len(self.calls)
