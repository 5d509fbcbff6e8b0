"""Test helper: a training run that signals itself after a given step, as a scheduler or a user would.

In process: `signal_after(monkeypatch, step, sig)` wraps `Trainer.train_step`. As a subprocess:
`python tests/train_signalled.py STEP SIG <marin-ablate train arguments>` (SIG: TERM, INT, USR2, KILL).
The production loop has no hook for this; the wrapper lives here.
"""

from __future__ import annotations

import os
import signal
import sys


def _wrap(step: int, sig: int):
    from marin_ablate.marin.train.loop import Trainer

    original = Trainer.train_step

    def train_step(self, stage):
        out = original(self, stage)
        if self.st.step == step:  # train_step ran step `step`; run() has not advanced st.step yet
            os.kill(os.getpid(), sig)
        return out

    return Trainer, train_step


def signal_after(monkeypatch, step: int, sig: int) -> None:
    cls, fn = _wrap(step, sig)
    monkeypatch.setattr(cls, "train_step", fn)


if __name__ == "__main__":
    at, name = int(sys.argv[1]), sys.argv[2]
    cls, fn = _wrap(at, getattr(signal, f"SIG{name.upper()}"))
    cls.train_step = fn
    from marin_ablate.cli.main import main

    sys.exit(main(["train", *sys.argv[3:]]))
