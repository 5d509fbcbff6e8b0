"""Hardware cost assumptions and the hero's layout on GB200 NVL72 (plan only; the sbatch is
planning/hero.py, the memory and time checks planning/dryrun.py and planning/timemodel.py). No torch import."""

from __future__ import annotations

from dataclasses import dataclass

from marin_ablate.ablations.ladders import flops_per_token, params_active, params_total
from marin_ablate.marin.config import RunSpec


@dataclass(frozen=True)
class Hardware:
    """Cost assumptions: peak dense bf16 FLOP/s per accelerator and the model FLOPs utilisation."""

    name: str
    peak_flops: float
    mfu: float

    def gpu_hours(self, flops: float) -> float:
        return flops / (self.peak_flops * self.mfu) / 3600.0


#: H100/H200 SXM dense bf16 peak 989 TFLOP/s; MFU 0.20 for small MoE rungs (environment.md: the
#: d1024-rung MoE block ran at 209-270 TFLOP/s fwd+bwd, i.e. 21-27% of peak, before attention/optimizer).
H100 = Hardware("H100/H200 (989 TFLOP/s bf16 dense)", 989e12, 0.20)
#: One GB200 GPU (NVL72: 180 PFLOP/s dense bf16 over 72 GPUs = 2.5 PFLOP/s each); MFU 0.30 assumed.
GB200 = Hardware("GB200 NVL72 (2.5 PFLOP/s bf16 dense per GPU)", 2.5e15, 0.30)


# ---- The hero run's resources (plan only) --------------------------------------------------------


@dataclass(frozen=True)
class HeroPlan:
    """The hero's layout on GB200 NVL72 (what to run; how to run it, the sbatch, is planning/hero.py).
    Assumptions: a node is one NVL72 compute tray = 4 B200 GPUs; a rack is 18 trays = 72 GPUs in one
    NVLink domain. EP64 = 16 trays of one rack, so every all-to-all stays on NVLink (2 trays per rack
    stay free as spares). Data parallel over the `ep_groups` replicas."""

    ep_groups: int = 11  # Marin: REFERENCE_RACKS = 11 (launch_checkpoint_restore_test.py), one EP64 group per rack
    gpus_per_node: int = 4
    ep_size: int = 64
    gpus_per_nvl_domain: int = 72
    hbm_gb_per_gpu: float = 186.0  # GB200: 186 GB = 173 GiB
    hardware: Hardware = GB200
    # one SLURM job of the requeued chain (sbatch --time, the rung's timeout_min); the checkpoint
    # cadence must leave no gap this long (planning/timemodel.py checkpoint_cadence)
    job_time_min: int = 240

    def __post_init__(self) -> None:
        if self.ep_size % self.gpus_per_node:
            raise ValueError(f"HeroPlan.ep_size={self.ep_size} must be a multiple of "
                             f"gpus_per_node={self.gpus_per_node}")
        if self.ep_size > self.gpus_per_nvl_domain:
            raise ValueError(f"HeroPlan.ep_size={self.ep_size} exceeds the NVLink domain of "
                             f"{self.gpus_per_nvl_domain} GPUs")
        if self.job_time_min < 1:
            raise ValueError(f"HeroPlan.job_time_min must be >= 1 minute, got {self.job_time_min}")
        if self.ep_groups < 1:
            raise ValueError(f"HeroPlan.ep_groups must be >= 1, got {self.ep_groups}")

    @property
    def gpus(self) -> int:
        return self.ep_groups * self.ep_size

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def nodes_per_ep_group(self) -> int:
        return self.ep_size // self.gpus_per_node

    def check(self, spec: RunSpec) -> None:
        if spec.train.batch_size % self.gpus:
            raise ValueError(f"HeroPlan: batch_size={spec.train.batch_size} sequences do not split over "
                             f"{self.gpus} GPUs; allowed ep_groups divide {spec.train.batch_size // self.ep_size}")
        g = spec.model.moe_geometry(spec.recipe)
        if g.n_experts % self.ep_size:
            raise ValueError(f"HeroPlan: {g.n_experts} experts do not split over ep_size={self.ep_size}")
        r = spec.train.replica_groups
        if r != self.ep_groups:  # the time model and the dry run assume rack-local sharding (HSDP)
            raise ValueError(f"TrainConfig.replica_groups={r} must equal HeroPlan.ep_groups={self.ep_groups}: "
                             "parameters sharded inside a rack, replicated across racks; allowed values: "
                             f"{self.ep_groups}")

    def describe(self, spec: RunSpec) -> dict:
        self.check(spec)
        m, t = spec.model, spec.train.effective()
        tokens = t.steps * t.batch_size * m.seq_len
        fpt = flops_per_token(m, spec.recipe)
        g = m.moe_geometry(spec.recipe)
        n_total = params_total(m, spec.recipe)
        routed = m.n_layers * g.n_experts * 3 * g.width * g.hidden
        return {
            "preset": "hero_535b", "n_layers": m.n_layers, "n_experts": g.n_experts,
            "params_total": n_total, "params_active": params_active(m, spec.recipe),
            "tokens": tokens, "steps": t.steps, "batch_sequences": t.batch_size, "seq_len": m.seq_len,
            "eval_every": t.eval_every,
            "flops_per_token": fpt, "train_flops": fpt * tokens, "hardware": self.hardware.name,
            "nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "gpus": self.gpus,
            "layout": {
                "ep_size": self.ep_size, "ep_groups": self.ep_groups, "data_parallel_replicas": self.ep_groups,
                "nodes_per_ep_group": self.nodes_per_ep_group, "nvl72_racks": self.ep_groups,
                "experts_per_gpu": g.n_experts // self.ep_size,
                "routed_params_per_gpu_unsharded": routed // self.ep_size,
                "sequences_per_gpu_per_step": t.batch_size // self.gpus,
                "tokens_per_gpu_per_step": t.batch_size // self.gpus * m.seq_len,
                "tokens_per_ep_shard": t.batch_size // self.gpus * m.seq_len,  # one EP shard per GPU
                # per-rank memory (state, activations, transients) is measured by `plan hero --dry_run`
                "hbm_gb_per_gpu": self.hbm_gb_per_gpu,
                "hbm_gib_per_gpu": round(self.hbm_gb_per_gpu * 1e9 / 2**30, 1),
            },
            # the duration is the time model's (planning/timemodel.py, `plan hero`): one number, one model
            "job_time_min": self.job_time_min,
        }
