"""Training: the loop (`loop`), one step (`step`), distributed steps (`distributed`), checkpoints
(`checkpoint`), metric sinks (`metrics`), context stages (`stages`), hardware peaks (`machine`),
checkpoint files (`files`), the choice of data (`source`), per-step progress (`step_progress`); the `marin-ablate train`
command is marin_ablate/cli/train.py.
docs/architecture.md maps them.
"""

from marin_ablate.marin.train.distributed import (
    ParallelDims,
    check_dist_layout,
    dist_forward_backward,
    launch_world_size,
)
from marin_ablate.marin.train.loop import LoopState, Trainer, train
from marin_ablate.marin.train.machine import PEAK_FLOPS_BF16, code_version, hardware_name, peak_flops
from marin_ablate.marin.train.metrics import LOG_TO
from marin_ablate.marin.train.stages import Stage, context_plan, is_spike, stage_at
from marin_ablate.marin.train.step import evaluate, forward_backward, optimizer_step

__all__ = [
    "LOG_TO", "PEAK_FLOPS_BF16", "LoopState", "ParallelDims", "Stage", "Trainer", "check_dist_layout",
    "code_version", "context_plan", "dist_forward_backward", "evaluate", "forward_backward", "hardware_name",
    "is_spike", "launch_world_size", "optimizer_step", "peak_flops", "stage_at", "train",
]
