"""Checkpoint files of a run directory: write a temporary beside the target, fsync, rename.

Text files of the run directory (spec.json, summary.json, metrics.jsonl rewrites, a checkpoint's
meta.json) go through marin.schema's `atomic_write_text`, the one text writer; this module keeps
what checkpoints need besides: streamed binary writes, disk-full reporting, stale-temporary cleanup
and digests. A failure at any point removes the temporary; a kill -9 can still leave one, so `remove_stale_temps`
clears them when a run starts (it holds the run lock, so nobody else is writing). A full disk is
reported as such, with the path (docs/architecture.md §3).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import IO, Callable

from marin_ablate.marin.schema import sha256_file

TMP_MARK = ".tmp"  # temporaries are ".<name>.tmp<pid>" (schema's: ".<name>.<random>.tmp"): hidden, never a result


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC (or EDQUOT) anywhere in the exception chain: torch and DCP wrap the OSError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(path: Path, exc: BaseException, need: int | None = None) -> OSError:
    """ENOSPC naming `path`, and (`need`: the bytes the write takes) how much it needs and how much is free."""
    size = ""
    if need is not None:
        try:
            free = shutil.disk_usage(next(p for p in (path, *path.parents) if p.exists())).free
            size = f" (it needs about {_mb(need)}, {_mb(free)} free there)"
        except (OSError, StopIteration):
            size = f" (it needs about {_mb(need)})"
    return OSError(errno.ENOSPC, f"disk full (no space left on device) while writing {path}{size}; free space "
                                f"or move the run directory, then run again to resume", str(path))


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB ({n} bytes)"


def write_stream(f: IO[bytes], data: bytes) -> None:
    """The one place a run-directory file's bytes are written (fault-injection tests patch it)."""
    f.write(data)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """write(f) into a temporary beside `path`, fsync, rename over `path`; nothing is left behind on
    failure, and a full disk raises OSError(ENOSPC) naming `path`."""
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full_error(path, e) from e
        raise


def remove_stale_temps(*dirs: Path) -> list[Path]:
    """Delete temporaries (files or directories) a killed writer left in `dirs`; returns them."""
    gone = [p for d in dirs if d.is_dir() for p in d.iterdir() if p.name.startswith(".") and TMP_MARK in p.name]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return gone


def file_digest(path: Path) -> dict:
    """{"bytes", "sha256"} of a file: what a checkpoint's side file records and resume verifies."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
