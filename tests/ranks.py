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
