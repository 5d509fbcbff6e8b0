"""The per-step progress of `train`: step/total, loss, tokens/s, MFU, drop rate, ETA.

The trainer calls `StepProgress.update(rec)` with each logged metrics record (the dict it writes
to metrics.jsonl). On a terminal it is a tqdm bar whose postfix carries the numbers; elsewhere
(SLURM logs, pipes) one plain line per call, so a log shows the run advancing every `log_every`
steps. The ETA extrapolates this session's step rate (steps since the session began, including a
resume's start step, over wall time since then).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _si(v: float) -> str:
    return next((f"{v / scale:.3g}{unit}" for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)) if abs(v) >= scale),
                f"{v:.3g}")


def _dur(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def format_fields(rec: dict, total: int, eta_s: float | None) -> str:
    """`loss 3.4512 | 12.3k tok/s | mfu 31.2% | drop 0.40% | eta 1m05s` (absent fields left out)."""
    parts = [rec.get("loss") is not None and f"loss {rec['loss']:.4f}",
             rec.get("tokens_per_s") and f"{_si(rec['tokens_per_s'])} tok/s",
             rec.get("mfu") is not None and f"mfu {100 * rec['mfu']:.1f}%",
             rec.get("drop_rate") is not None and f"drop {100 * rec['drop_rate']:.2f}%",
             eta_s is not None and f"eta {_dur(eta_s)}"]
    return " | ".join(p for p in parts if p)


def format_line(rec: dict, total: int, eta_s: float | None) -> str:
    """`step 20/100 (20%) | loss ...`; rec["step"] is the 0-based index of the step just taken."""
    done = rec["step"] + 1
    return f"step {done}/{total} ({100 * done // max(1, total)}%) | " + format_fields(rec, total, eta_s)


class StepProgress:
    def __init__(self, total: int, start_step: int = 0, stream: TextIO | None = None, tty: bool | None = None,
                 clock=time.monotonic):
        self.total, self.start_step, self.clock = int(total), int(start_step), clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.t0 = clock()
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=self.start_step, file=self.stream, unit="step",
                            dynamic_ncols=True, leave=True)

    def eta_s(self, done: int) -> float | None:
        steps = done - self.start_step
        return (self.clock() - self.t0) / steps * max(0, self.total - done) if steps > 0 else None

    def update(self, rec: dict) -> str:
        """Show one logged record; returns the plain line (what a log gets)."""
        done = rec["step"] + 1
        eta = self.eta_s(done)
        line = format_line(rec, self.total, eta)
        if self.bar is not None:
            self.bar.n = done
            self.bar.set_postfix_str(format_fields(rec, self.total, None), refresh=False)
            self.bar.refresh()
        else:
            self.stream.write(line + "\n")
            self.stream.flush()
        return line

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
