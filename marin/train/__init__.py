"""Training: the loop (`loop`), one step (`step`), distributed steps (`distributed`), checkpoints
(`checkpoint`), metric sinks (`metrics`), context stages (`stages`), hardware peaks (`hardware`),
checkpoint files (`files`), the choice of data (`source`) and the `marin-ablate train` command (`cli`).
docs/architecture.md maps them.
"""

from marin.train.cli import cmd_train, spec_from_args, train_args
from marin.train.distributed import ParallelDims, check_dist_layout, dist_forward_backward, launch_world_size
from marin.train.hardware import PEAK_FLOPS_BF16, code_version, hardware_name, peak_flops
from marin.train.loop import LoopState, Trainer, train
from marin.train.metrics import LOG_TO
from marin.train.stages import Stage, context_plan, is_spike, stage_at
from marin.train.step import evaluate, forward_backward, optimizer_step

__all__ = [
    "LOG_TO", "PEAK_FLOPS_BF16", "LoopState", "ParallelDims", "Stage", "Trainer", "check_dist_layout", "cmd_train",
    "code_version", "context_plan", "dist_forward_backward", "evaluate", "forward_backward", "hardware_name",
    "is_spike", "launch_world_size", "optimizer_step", "peak_flops", "spec_from_args", "stage_at", "train",
    "train_args",
]
