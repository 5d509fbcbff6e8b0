"""Context-length stages: Marin's long-context extension keeps tokens per step fixed and scales the
attention logits by 1 + c·ln(L / L0), c by `TrainConfig.context_q_rule` (0.1: YaRN's mscale, Peng et
al. 2023, arXiv 2309.00071, eq. 20, the hero's; 0.2: twice it, docs/fidelity.md "context extension");
and the loss-spike rule the loop logs."""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from marin_ablate.marin.config import CONTEXT_Q_RULES, RunSpec

SPIKE_MIN_HISTORY = 10  # no spike verdict before this many losses are in the window


@dataclass(frozen=True)
class Stage:
    start_step: int
    seq_len: int
    batch_size: int
    q_scale: float  # 1 + c ln(L / L0), c = CONTEXT_Q_RULES[TrainConfig.context_q_rule]
    micro_batches: int = 1  # TrainConfig.micro_batches at stage 0; later, as many as hold its tokens per micro-batch


def context_plan(spec: RunSpec) -> list[Stage]:
    """Stage 0 is (model.seq_len, batch_size); each ContextStage starts at round(start_frac*steps)
    and divides the batch so that tokens per step stay batch_size * model.seq_len. A longer stage has fewer
    sequences, so it splits them into fewer micro-batches: ceil(micro_batches * its batch / stage 0's), no
    micro-batch holding more tokens than stage 0's (TrainConfig.micro_batches=16 of a 16-sequence step at 4k
    is 4 of 4 at 16k and 1 of 1 at 65k)."""
    t, l0 = spec.train.effective(), spec.model.seq_len
    c = CONTEXT_Q_RULES[t.context_q_rule]
    tokens = t.batch_size * l0

    def micro(seq_len: int) -> int:
        return -(-k * (tokens // seq_len) // t.batch_size)

    k = t.micro_batches
    stages = [Stage(0, l0, t.batch_size, 1.0, k)]
    for cs in t.context_stages:
        if cs.seq_len < 1 or tokens % cs.seq_len != 0:
            raise ValueError(f"TrainConfig.context_stages: seq_len={cs.seq_len} must divide the tokens per step "
                             f"batch_size*seq_len={tokens}; allowed values: divisors of {tokens}")
        start = int(round(cs.start_frac * t.steps))
        if start >= t.steps or (len(stages) > 1 and start <= stages[-1].start_step):
            at = "after the last step" if start >= t.steps else f"where the stage before it starts ({start})"
            raise ValueError(f"TrainConfig.context_stages: the stage at start_frac={cs.start_frac} (seq_len "
                             f"{cs.seq_len}) starts at step round({cs.start_frac} x {t.steps}) = {start}, {at}, so "
                             f"a stage never trains; allowed values: start fractions whose steps round(start_frac x "
                             f"{t.steps}) increase and stay below {t.steps}")
        stage = Stage(start, cs.seq_len, tokens // cs.seq_len, 1.0 + c * math.log(cs.seq_len / l0), micro(cs.seq_len))
        if start <= stages[-1].start_step:  # from step 0 (the check above): it replaces stage 0
            stages[-1] = stage
        else:
            stages.append(stage)
    return stages


def apply_q_scale(model: Any, q_scale: float) -> None:
    """Context extension: the model reads `q_scale` (1 + c ln(L/L0)) in every attention layer."""
    if hasattr(model, "set_q_scale"):
        model.set_q_scale(q_scale)
    elif hasattr(model, "q_scale"):
        model.q_scale = float(q_scale)
    elif q_scale != 1.0:
        raise ValueError("TrainConfig.context_stages changes seq_len but the model exposes no q_scale; "
                         "allowed values: context stages at the model's seq_len only")


def stage_at(stages: list[Stage], step: int) -> Stage:
    return stages[bisect.bisect_right([s.start_step for s in stages], step) - 1]


def is_spike(loss: float, history: "deque[float] | list[float]", factor: float, window: int) -> bool:
    """A spike: loss > factor x median of the previous `window` losses (TrainConfig.spike_*), judged
    once min(SPIKE_MIN_HISTORY, window) losses are known."""
    return len(history) >= min(SPIKE_MIN_HISTORY, window) and loss > factor * statistics.median(history)


def stage_specs(spec: RunSpec) -> list[tuple[Stage, RunSpec, int]]:
    """Each context stage as a spec of its own shape (model.seq_len, batch_size; no further stages) and its
    number of steps: what the memory dry run and the time model evaluate stage by stage."""
    stages, steps = context_plan(spec), spec.train.effective().steps
    ends = [s.start_step for s in stages[1:]] + [steps]
    return [(s, replace(spec, model=replace(spec.model, seq_len=s.seq_len),
                        train=replace(spec.train, batch_size=s.batch_size, micro_batches=s.micro_batches,
                                      context_stages=())), end - s.start_step)
            for s, end in zip(stages, ends, strict=True)]
