"""A one-line progress display of a study's runs: done / running / failed / pending, elapsed time.

On a terminal the line is rewritten in place; otherwise (CI logs, pipes) a new line is printed
only when the counts change, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_counts(counts: dict[str, int], total: int, elapsed_s: float, label: str = "") -> str:
    done = counts.get("completed", 0)
    pending = counts.get("pending", 0) + counts.get("partial", 0)
    parts = [f"{done}/{total} done", f"{counts.get('running', 0)} running", f"{counts.get('failed', 0)} failed",
             f"{pending} pending"]
    if counts.get("queued"):
        parts.insert(2, f"{counts['queued']} queued")
    if counts.get("partial"):
        parts[-1] += f" ({counts['partial']} partial)"
    m, s = divmod(int(elapsed_s), 60)
    head = f"{label}: " if label else ""
    return f"{head}{', '.join(parts)} [{m}m{s:02d}s]"


class Progress:
    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, tty: bool | None = None):
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.t0 = time.time()
        self._last_counts: dict[str, int] | None = None
        self._width = 0
        self.lines: list[str] = []

    def update(self, counts: dict[str, int]) -> None:
        line = format_counts(counts, self.total, time.time() - self.t0, self.label)
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self.stream.flush()
            self._width = len(line)
        elif counts != self._last_counts:
            self.stream.write(line + "\n")
            self.stream.flush()
        if counts != self._last_counts:
            self.lines.append(line)
        self._last_counts = dict(counts)

    def close(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
