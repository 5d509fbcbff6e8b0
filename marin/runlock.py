"""The run lock: one process at a time trains a run directory (`marin-ablate train` and `run` alike).

Torch-free, so that `sweeps/` can take it without importing the model library (docs/architecture.md §1).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any


class RunLock:
    """An exclusive, non-blocking flock on `<run_dir>/.lock`.

    The kernel releases it when the holder dies (a killed or requeued job leaves no stale lock);
    on NFS the Linux client maps flock to byte-range locks, so it holds across machines. flock
    belongs to the open file: a second RunLock in the same process is excluded too, and probing
    does not drop a lock held through another descriptor (POSIX fcntl locks would). The file
    records who holds it (host, pid, job id)."""

    def __init__(self, run_dir_: str | Path):
        self.path = Path(run_dir_) / ".lock"
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK):
                return False
            raise
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(),
                  "job_id": os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID"))}
        if os.environ.get("SLURM_ARRAY_TASK_ID"):
            holder["job_id"] = f"{holder['job_id']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(holder).encode())
        except OSError as e:
            os.close(fd)
            if e.errno == errno.ENOSPC:  # the first write of a run: name where, not only what
                raise ValueError(f"disk full (no space left on device) while writing {self.path}; free space "
                                 "there, or use another --run-dir") from None
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def held_elsewhere(self) -> bool:
        """True when another process holds the lock (probe without keeping it)."""
        if self._fd is not None or not self.path.exists():
            return False
        if self.acquire():
            self.release()
            return False
        return True

    def __enter__(self) -> "RunLock":
        if not self.acquire():
            raise RuntimeError(f"run {self.path.parent.name} is locked by another worker")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

