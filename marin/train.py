"""The training loop: one process, CPU (fp32) or one GPU (bf16 autocast); eval, spikes, context
stages, atomic checkpoints, preemption, exact resume, summary.json (DESIGN §3, CONTRACTS).

Run directory: spec.json, metrics.jsonl (a train line per logged step: `step` is the 0-based index
of the step whose loss it reports; an eval line carries `eval_*` and `step` = optimizer steps done,
0 for the untrained model),
summary.json (atomic, at the end), checkpoints/ckpt_<step>.pt (atomic), train.log.

Preemption: SIGTERM or SIGUSR2 only sets a flag; the loop writes a checkpoint at the next step
boundary and returns {"status": "interrupted"}. The signal is then handed back to the handler that
was installed before ours, if any (submitit's USR2 requeues the job; a local worker's TERM stops it).

Distributed (DESIGN §5). Launched with a world size W > 1 (torchrun variables, or a SLURM task, see
`marin.ep.dist_env`), the loop runs real expert parallelism over EP groups of `ModelConfig.ep_shards`
ranks and data parallelism over the D = W / ep_shards groups (`marin.ep` mesh: rank = dp_rank * ep +
ep_rank). Token layout: the global batch is the single-process batch (B rows of L tokens) and rank r
takes rows [r B/W, (r+1) B/W). So DP replica g holds the contiguous rows [g B/D, (g+1) B/D), and EP
rank s of it holds the s-th contiguous 1/ep of the replica's row-major tokens: exactly shard s of
`plan_drops`. With D = 1 (W = ep_shards) the real run therefore drops what the single-process
virtual-EP run drops on the same global batch; with D > 1 it drops what the single-process run drops
on each replica's B/D rows on their own (per-shard token count T_s = B L / W sets the capacities).
Losses: every rank's CE and z-loss (token means over its valid targets) are reweighted by
n_r W / N (n_r its valid targets, N the global count) so that the all-reduced gradient mean is the
gradient of the global token mean, as in one process; the Switch aux loss is the mean of the ranks'
(a product of batch means: not exactly the global one), QB-topk thresholds are averaged over ranks
(QB-hist and aux-free are exact). Gradients are plain tensors (parallelize(dp="none") + sync_grads),
so MuonH's Newton–Schulz sees full matrices and per-expert slices. Rank 0 alone writes spec.json,
metrics.jsonl, summary.json and train.log; checkpoints are directories checkpoints/ckpt_<step>/
holding a torch.distributed.checkpoint of model + optimizer (dcp/, any layout can load it),
rng_<rank>.pt per rank, and loop.json (step, counters, spike window, metrics offset) written last
by rank 0, so a directory without loop.json is not a checkpoint. Any world size (one process too)
resumes such a directory (DCP reshards); a distributed run refuses a newer single-process .pt one.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import importlib.util
import json
import logging
import math
import os
import platform
import random
import signal
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from marin.config import (
    FACTORS,
    RECIPE_LEVELS,
    DataConfig,
    Recipe,
    RunSpec,
    TrainConfig,
    apply_overrides,
    preset,
)
from marin.optim import build_optimizer, lr_multiplier, resolve_hparams, set_lr

log = logging.getLogger("marin.train")

# Dense bf16 peak FLOP/s by device-name substring (vendor datasheets); first match wins.
PEAK_FLOPS_BF16: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15), ("B200", 2.25e15), ("H200", 989e12), ("H100", 989e12), ("H800", 989e12),
    ("A100", 312e12), ("L40S", 362e12), ("A10G", 125e12),
)
LOG_TO = ("wandb", "tensorboard")
SIGNAL_SELF_ENV = "MARIN_SIGNAL_SELF_AT"  # "STEP:TERM" -> the process signals itself after STEP (tests)
SPIKE_MIN_HISTORY = 10  # no spike verdict before this many losses are in the window
LOSS_CURVE_POINTS = 200


# ---------------------------------------------------------------------------------------------
# Small utilities
# ---------------------------------------------------------------------------------------------


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def code_version() -> str:
    """Package version + a hash of the marin/ sources (works without git) + git HEAD when present."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("marin-ablate")
    except PackageNotFoundError:
        v = "0"
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    out = f"{v}+src.{h.hexdigest()[:12]}"
    head = root.parent / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            ref = (root.parent / ".git" / ref[5:]).read_text().strip()
        out += f".g{ref[:10]}"
    except OSError:
        pass
    return out


def hardware_name(device: torch.device) -> str:
    """GPU name, or the CPU model and thread count (throughput ratios only compare like with like)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu:{model} x{torch.get_num_threads()}"


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Hardware peak for MFU: dense bf16 from PEAK_FLOPS_BF16 (fp32 runs on GPU use the same peak,
    so their MFU reads low, as it should); MARIN_PEAK_FLOPS overrides; CPU has no honest nominal
    peak, so MFU is None there unless MARIN_PEAK_FLOPS is set."""
    env = os.environ.get("MARIN_PEAK_FLOPS")
    if env:
        return float(env)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, val in PEAK_FLOPS_BF16:
        if key in name:
            return val
    return None


# ---------------------------------------------------------------------------------------------
# Context stages
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    start_step: int
    seq_len: int
    batch_size: int
    q_scale: float  # 1 + 0.1 ln(L / L0) (YaRN mscale)


def context_plan(spec: RunSpec) -> list[Stage]:
    """Stage 0 is (model.seq_len, batch_size); each ContextStage starts at round(start_frac*steps)
    and divides the batch so that tokens per step stay batch_size * model.seq_len."""
    t, l0 = spec.train.effective(), spec.model.seq_len
    tokens = t.batch_size * l0
    stages = [Stage(0, l0, t.batch_size, 1.0)]
    for cs in t.context_stages:
        if cs.seq_len < 1 or tokens % cs.seq_len != 0:
            raise ValueError(f"TrainConfig.context_stages: seq_len={cs.seq_len} must divide the tokens per step "
                             f"batch_size*seq_len={tokens}; allowed values: divisors of {tokens}")
        start = int(round(cs.start_frac * t.steps))
        if start <= stages[-1].start_step:
            stages[-1] = replace(stages[-1], seq_len=cs.seq_len, batch_size=tokens // cs.seq_len,
                                 q_scale=1.0 + 0.1 * math.log(cs.seq_len / l0))
            continue
        stages.append(Stage(start, cs.seq_len, tokens // cs.seq_len, 1.0 + 0.1 * math.log(cs.seq_len / l0)))
    return stages


def stage_at(stages: list[Stage], step: int) -> Stage:
    return stages[bisect.bisect_right([s.start_step for s in stages], step) - 1]


# ---------------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------------


class _StopFlag:
    """SIGTERM/SIGUSR2 set a flag; the loop acts on it at a step boundary (never mid-step)."""

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        for s in (signal.SIGTERM, signal.SIGUSR2):
            try:
                self.previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: the caller owns signals
                return

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.signum = signum

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous = {}


# ---------------------------------------------------------------------------------------------
# Logging sinks (optional extras)
# ---------------------------------------------------------------------------------------------


class _Sinks:
    def __init__(self, log_to: tuple[str, ...], run_dir: Path, spec: RunSpec):
        self.tb = self.wandb = None
        for name in log_to:
            if name not in LOG_TO:
                raise ValueError(f"log_to={name!r} is not a known sink; allowed values: {', '.join(LOG_TO)}")
        if "tensorboard" in log_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ValueError("log_to=tensorboard needs the 'tensorboard' extra: pip install marin-ablate[tensorboard]") from e
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if "wandb" in log_to:
            try:
                import wandb
            except ImportError as e:
                raise ValueError("log_to=wandb needs the 'wandb' extra: pip install marin-ablate[wandb]") from e
            os.environ.setdefault("WANDB_MODE", "offline")
            self.wandb = wandb.init(dir=str(run_dir), name=spec.run_id, id=spec.run_id, resume="allow",
                                    config=spec.to_dict())

    def log(self, rec: dict) -> None:
        flat = {k: v for k, v in rec.items() if isinstance(v, (int, float)) and v is not None and k != "step"}
        for k, v in rec.items():
            if isinstance(v, dict):
                flat.update({f"{k}/{kk}": vv for kk, vv in v.items() if isinstance(vv, (int, float))})
        if self.tb is not None:
            for k, v in flat.items():
                self.tb.add_scalar(k, v, rec["step"])
        if self.wandb is not None:
            self.wandb.log(flat, step=rec["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


# ---------------------------------------------------------------------------------------------
# Loop state (everything a resume needs besides model and optimizer)
# ---------------------------------------------------------------------------------------------


@dataclass
class LoopState:
    step: int = 0  # next step to run
    tokens: int = 0
    spike_history: list[float] = field(default_factory=list)
    spike_steps: list[int] = field(default_factory=list)
    max_grad_norm: float = 0.0
    dropped: float = 0.0
    assigned: float = 0.0
    train_flops: float = 0.0
    timed_tokens: int = 0
    timed_flops: float = 0.0
    timed_s: float = 0.0
    wall_s: float = 0.0
    last_loss: float | None = None
    last_eval: dict | None = None


def _rng_state(device: torch.device) -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        st["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def _set_rng_state(st: dict, device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "numpy" in st:
        import numpy as np

        np.random.set_state(st["numpy"])
    if "cuda" in st and device.type == "cuda":
        torch.cuda.set_rng_state(st["cuda"], device)


def latest_checkpoint(run_dir: Path) -> Path | None:
    ck = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    return ck[-1] if ck else None


# ---------------------------------------------------------------------------------------------
# Validation before any work
# ---------------------------------------------------------------------------------------------


def _validate_data_path(data: DataConfig) -> None:
    if data.corpus in ("embedded", "paloma"):
        return
    if not Path(data.corpus).expanduser().exists():
        raise ValueError(f"DataConfig.corpus={data.corpus!r}: no such file or directory; allowed values: "
                         "'embedded', 'paloma', or an existing local directory/file")


def _device(t: TrainConfig) -> torch.device:
    if t.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"TrainConfig.device={t.device!r} but CUDA is not available; allowed values here: 'cpu'")
    if not (t.device == "cpu" or t.device.startswith("cuda")):
        raise ValueError(f"TrainConfig.device={t.device!r} is not supported; allowed values: 'cpu', 'cuda', 'cuda:N'")
    return torch.device(t.device)


# ---------------------------------------------------------------------------------------------
# Eval
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: dict[str, list], bpt: dict[str, float], device: torch.device,
             autocast: Callable, dist_ctx: "_Dist | None" = None) -> dict:
    """Dropless eval: per-domain token-mean NLL, macro loss = unweighted mean over domains, bpb.
    Distributed: each rank scores its rows of every batch; NLL sums and counts are all-reduced."""
    was_training = model.training
    model.eval()
    sums: dict[str, list[float]] = {}
    for dom, bs in batches.items():
        nll, count = 0.0, 0
        for tokens, targets, doc_ids in bs:
            if dist_ctx is not None:
                tokens, targets, doc_ids = dist_ctx.rows(tokens), dist_ctx.rows(targets), dist_ctx.rows(doc_ids)
            tokens, targets, doc_ids = tokens.to(device), targets.to(device), doc_ids.to(device)
            with autocast():
                out = model(tokens, doc_ids)
            logits = out.logits_BSV.float()
            nll += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                         ignore_index=-100, reduction="sum"))
            count += int((targets != -100).sum())
        sums[dom] = [nll, float(count)]
    if dist_ctx is not None:
        flat = torch.tensor([v for pair in sums.values() for v in pair], dtype=torch.float64, device=device)
        dist.all_reduce(flat)
        sums = {dom: flat[2 * i:2 * i + 2].tolist() for i, dom in enumerate(sums)}
    domain_loss = {dom: nll / max(count, 1) for dom, (nll, count) in sums.items()}
    model.train(was_training)
    domain_bpb = {d: v / math.log(2) / bpt[d] for d, v in domain_loss.items()}
    return {"eval_macro_loss": statistics.fmean(domain_loss.values()), "eval_domain_loss": domain_loss,
            "macro_bpb": statistics.fmean(domain_bpb.values()), "eval_domain_bpb": domain_bpb}


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def is_spike(loss: float, history: "deque[float] | list[float]", factor: float, window: int) -> bool:
    """A spike: loss > factor x median of the previous `window` losses (TrainConfig.spike_*), judged
    once min(SPIKE_MIN_HISTORY, window) losses are known."""
    return len(history) >= min(SPIKE_MIN_HISTORY, window) and loss > factor * statistics.median(history)


def forward_backward(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                     doc_ids: torch.Tensor, autocast: Callable, grad_clip: float | None):
    """One forward and backward (z-loss and aux loss come with the model's loss) -> (out, loss,
    ce, grad_norm) as floats; the grad norm is the unclipped global L2 norm."""
    with autocast():
        out = model(tokens, doc_ids, targets)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    gnorm_t = torch.nn.utils.get_total_norm(grads)  # foreach kernels, computed once and reused to clip
    if grad_clip is not None:
        torch.nn.utils.clip_grads_with_norm_(grads, grad_clip, gnorm_t)
    loss_v = float(out.loss.detach())
    ce_v = float(out.ce_loss.detach()) if out.ce_loss is not None else loss_v
    return out, loss_v, ce_v, float(gnorm_t)


def optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, group=None) -> None:
    """Update, clear grads, then the router biases from this step's routing (apply from the next);
    `group` (distributed runs: the world) pools the routing statistics of every rank."""
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.update_router_biases(group)


# ---------------------------------------------------------------------------------------------
# Distributed: layout, the step, checkpoints (module docstring, DESIGN §5)
# ---------------------------------------------------------------------------------------------


@dataclass
class _Dist:
    """This process's place in a distributed run."""

    groups: Any  # marin.ep.EPGroups
    rank: int
    world: int
    owns_pg: bool  # train() initialised the process group, so train() destroys it

    @property
    def main(self) -> bool:
        return self.rank == 0

    def rows(self, x_B: torch.Tensor) -> torch.Tensor:
        """Rank r's rows [r B/W, (r+1) B/W) of a global batch: EP rank s of DP replica g gets the
        s-th contiguous token shard of the replica's rows (what plan_drops assumes)."""
        b = x_B.shape[0] // self.world
        return x_B[self.rank * b:(self.rank + 1) * b]


def launch_world_size() -> int:
    """World size of this launch: an initialised process group, torchrun's WORLD_SIZE, a SLURM task
    with SLURM_NTASKS > 1 (marin.ep.dist_env), else 1 (the single-process loop)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["WORLD_SIZE"])
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        from marin.ep import dist_env

        return dist_env().world_size
    return 1


def check_dist_layout(spec: RunSpec, stages: list[Stage], world: int) -> None:
    """Before any collective: EP groups of ModelConfig.ep_shards ranks must tile the world and hold
    the experts evenly, and every stage's global batch must split into equal rows per rank."""
    from marin.ep import check_ep_layout

    ep = spec.model.ep_shards
    try:
        check_ep_layout(spec.model.moe_geometry(spec.recipe).n_experts, ep, world)
    except ValueError as e:
        raise ValueError(f"ModelConfig.ep_shards={ep} (the EP group size) with world_size={world}: {e}") from None
    for s in stages:
        if s.batch_size % world != 0:
            raise ValueError(f"TrainConfig.batch_size: the global batch of {s.batch_size} sequences (seq_len "
                             f"{s.seq_len}) does not split over world_size={world} ranks; allowed values: "
                             f"multiples of {world}")


def _init_dist(spec: RunSpec, device: torch.device) -> tuple[_Dist, torch.device]:
    from marin import ep

    owns = not dist.is_initialized()
    groups = ep.init_ep(spec.model.moe_geometry(spec.recipe).n_experts, spec.model.ep_shards,
                        backend="gloo" if device.type == "cpu" else None)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return _Dist(groups, dist.get_rank(), dist.get_world_size(), owns), device


@dataclass
class _GlobalOut:
    """What the loop logs from a distributed step: world-reduced (ModelOutput's logged fields)."""

    stats: dict[str, float]
    aux_loss: torch.Tensor
    z_loss: torch.Tensor


def dist_forward_backward(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                          doc_ids: torch.Tensor, autocast: Callable, grad_clip: float | None, d: _Dist):
    """forward_backward on this rank's rows -> (out, loss, ce, grad_norm) of the global batch.
    CE and z-loss are reweighted by n_r W / N so that the averaged gradient (sync_grads) is the
    gradient of the global token mean; the grad norm (and clipping) is over the full model, expert
    slices summed over the EP group."""
    from marin import ep

    dev = tokens.device
    n_loc = int((targets != -100).sum())
    n_all = torch.tensor([float(n_loc)], dtype=torch.float64, device=dev)
    dist.all_reduce(n_all)
    n_all_f = max(float(n_all), 1.0)
    with autocast():
        out = model(tokens, doc_ids, targets)
    zero = out.aux_loss.new_zeros(())
    z = out.z_loss if out.z_loss is not None else zero
    dense = out.ce_loss + z
    if n_loc:
        obj = dense * (n_loc * d.world / n_all_f) + out.aux_loss
    else:  # every target masked here: still run the backward, its all-to-alls are collective
        obj = out.aux_loss + 0.0 * out.logits_BSV.float().sum()
    obj.backward()
    ep.sync_grads(model, d.groups)
    expert_ids = {id(p) for _, m in ep.moe_layers(model) for p in (getattr(m, n) for n in ep.EXPERT_PARAM_NAMES)}
    grads = [(p.grad, id(p) in expert_ids) for p in model.parameters() if p.grad is not None]
    dense_sq = sum(float(g.float().pow(2).sum()) for g, is_e in grads if not is_e)
    expert_sq = sum(float(g.float().pow(2).sum()) for g, is_e in grads if is_e)
    st = out.stats
    frac = n_loc / n_all_f
    dense_v = float(dense.detach()) if n_loc else 0.0
    ce_v = float(out.ce_loss.detach()) if n_loc else 0.0
    z_v = float(z.detach()) if n_loc else 0.0
    vec = torch.tensor([dense_v * frac, ce_v * frac, z_v * frac, float(out.aux_loss.detach()) / d.world,
                        st.get("dropped", 0.0), st.get("assigned", 0.0), st.get("load_cv", 0.0) / d.world,
                        st.get("router_z", 0.0) / d.world, expert_sq], dtype=torch.float64, device=dev)
    dist.all_reduce(vec)
    mx = torch.tensor([st.get("max_load_ratio", 0.0)], dtype=torch.float64, device=dev)
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    v = vec.tolist()
    # expert slices are replicated over the dp dimension: the world sum counts each dp_size times
    gnorm = math.sqrt(dense_sq + v[8] / d.groups.dp_size)
    if grad_clip is not None:
        coef = grad_clip / (gnorm + 1e-6)  # torch.nn.utils.clip_grad_norm_'s rule
        if coef < 1.0:
            for g, _ in grads:
                g.mul_(coef)
    stats = dict(st, dropped=v[4], assigned=v[5], drop_rate=v[4] / max(v[5], 1.0), load_cv=v[6], router_z=v[7],
                 max_load_ratio=float(mx))
    g_out = _GlobalOut(stats, torch.tensor(v[3]), torch.tensor(v[2]))
    return g_out, v[0] + v[3], v[1], gnorm


def latest_dist_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete distributed checkpoint directory (loop.json is written last)."""
    ck = sorted(p for p in (run_dir / "checkpoints").glob("ckpt_*") if p.is_dir() and (p / "loop.json").exists())
    return ck[-1] if ck else None


def _newest(single: Path | None, distributed: Path | None) -> Path | None:
    """The later of a ckpt_<step>.pt file and a ckpt_<step>/ directory."""
    cands = [p for p in (single, distributed) if p is not None]
    return max(cands, key=lambda p: p.name.split(".")[0]) if cands else None


def _load_dist_checkpoint(ck: Path, spec: RunSpec, model: torch.nn.Module, opt: torch.optim.Optimizer,
                          d: _Dist | None, device: torch.device, metrics_path: Path) -> LoopState:
    """Load a checkpoint directory into this layout (any world size; d=None: one process, which DCP
    reshards into), restore this rank's RNG and truncate metrics.jsonl to the checkpoint's offset."""
    from marin import ep

    loop = json.loads((ck / "loop.json").read_text())
    if loop["run_id"] != spec.run_id:
        raise ValueError(f"checkpoint {ck} belongs to run {loop['run_id']}, not {spec.run_id}")
    ep.load_checkpoint(model, ck / "dcp", d.groups if d is not None else None, opt)
    rng = ck / f"rng_{d.rank if d is not None else 0}.pt"
    if rng.exists():  # a checkpoint written by a smaller world has no state for this rank
        _set_rng_state(torch.load(rng, map_location="cpu", weights_only=False), device)
    if d is None or d.main:
        with open(metrics_path, "a+b") as f:  # drop lines logged after the checkpoint
            f.truncate(loop["metrics_offset"])
    log.info("resumed %s from %s at step %d", spec.run_id, ck.name, loop["loop"]["step"])
    return LoopState(**loop["loop"])



def _subsample(curve: list[list], n: int = LOSS_CURVE_POINTS) -> list[list]:
    if len(curve) <= n:
        return curve
    idx = sorted({round(i * (len(curve) - 1) / (n - 1)) for i in range(n)})
    return [curve[i] for i in idx]


def _read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


_PACKERS: dict[tuple, Any] = {}


def _packer(mdata, corpus, seq_len: int, batch: int, seed: int):
    """PackedBatches are pure functions of their arguments; reuse them across runs of one process
    (a sweep of tiny runs spends most of a short run building the epoch order otherwise)."""
    key = (id(corpus), seq_len, batch, seed)
    if key not in _PACKERS or _PACKERS[key][0] is not corpus:
        if len(_PACKERS) > 16:
            _PACKERS.clear()
        _PACKERS[key] = (corpus, mdata.PackedBatches(corpus, "train", seq_len, batch, seed))
    return _PACKERS[key][1]


def _build_model(spec: RunSpec):
    from marin.model import MarinModel

    return MarinModel(spec.model, spec.recipe)


def _set_q_scale(model: torch.nn.Module, q_scale: float) -> None:
    """Context extension: the model reads `q_scale` (1 + 0.1 ln(L/L0)) in every attention layer."""
    if hasattr(model, "set_q_scale"):
        model.set_q_scale(q_scale)
    elif hasattr(model, "q_scale"):
        model.q_scale = float(q_scale)
    elif q_scale != 1.0:
        raise ValueError("TrainConfig.context_stages changes seq_len but the model exposes no q_scale; "
                         "allowed values: context stages at the model's seq_len only")


def train(spec: RunSpec, run_dir: str | Path, *, resume: bool = True, stop_after: int | None = None,
          log_to: tuple[str, ...] = ()) -> dict:
    """Train `spec` into `run_dir`; returns the summary (also summary.json), or
    {"status": "interrupted", ...} when stopped by a signal or `stop_after` (a checkpoint is written).
    Launched with a world size > 1 every rank calls this (module docstring); all return the summary."""
    t0 = time.perf_counter()
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec, got {type(spec).__name__}")
    t = spec.train.effective()  # token_multiplier: the rung trained that many times longer
    run_dir = Path(run_dir)
    _validate_data_path(spec.data)
    device = _device(t)
    stages = context_plan(spec)
    if stop_after is not None and stop_after < 1:
        raise ValueError(f"stop_after={stop_after} must be >= 1")
    for name in log_to:
        if name not in LOG_TO:
            raise ValueError(f"log_to={name!r} is not a known sink; allowed values: {', '.join(LOG_TO)}")
        if importlib.util.find_spec(name) is None:
            raise ValueError(f"log_to={name} needs the '{name}' extra: pip install marin-ablate[{name}]")
    world = launch_world_size()
    if world > 1:
        check_dist_layout(spec, stages, world)

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    summary_path = run_dir / "summary.json"
    if resume and summary_path.exists():
        done = json.loads(summary_path.read_text())
        if done.get("run_id") == spec.run_id:
            return done
    if not resume and summary_path.exists():
        summary_path.unlink()  # a fresh run must not leave the old verdict behind if it is killed
    spec_path = run_dir / "spec.json"
    if spec_path.exists() and resume:
        old = RunSpec.from_dict(json.loads(spec_path.read_text()))
        if old.run_id != spec.run_id:
            raise ValueError(f"run_dir {str(run_dir)!r} holds run {old.run_id}, not {spec.run_id}; "
                             "use another --out or resume=False")
    d: _Dist | None = None
    if world > 1:
        d, device = _init_dist(spec, device)
    main = d is None or d.main
    if main:
        _atomic_write_text(spec_path, json.dumps(spec.to_dict(), indent=1, sort_keys=True))

    handler = logging.FileHandler(run_dir / "train.log") if main else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    stop = _StopFlag()
    sinks = None
    try:
        if t.threads is not None:
            torch.set_num_threads(int(t.threads))
        elif os.environ.get("SLURM_CPUS_PER_TASK"):
            torch.set_num_threads(int(os.environ["SLURM_CPUS_PER_TASK"]))
        from marin import data as mdata

        corpus = mdata.load_corpus(spec.data)
        domains = list(spec.data.eval_domains) or list(corpus.domains)
        unknown = [dom for dom in domains if dom not in corpus.domains]
        if unknown:
            raise ValueError(f"DataConfig.eval_domains: unknown domains {unknown}; allowed values: {', '.join(corpus.domains)}")
        packers = {s.seq_len: _packer(mdata, corpus, s.seq_len, s.batch_size,
                                           spec.data.data_seed + t.seed_offset()) for s in stages}
        bpt = {dom: mdata.bytes_per_token(corpus, dom) for dom in domains}
        if corpus.tokenizer.vocab_size > spec.model.vocab_size:
            raise ValueError(f"ModelConfig.vocab_size={spec.model.vocab_size} is smaller than the tokenizer's "
                             f"vocabulary ({corpus.tokenizer.vocab_size}, DataConfig.tokenizer="
                             f"{spec.data.tokenizer!r}); allowed values: >= {corpus.tokenizer.vocab_size}")

        torch.manual_seed(spec.seed + t.seed_offset())
        model = _build_model(spec).to(device)
        if d is not None:
            from marin import ep

            # every rank built the full model from one seed; it keeps its experts (plain tensors, no
            # FSDP: MuonH's Newton-Schulz needs whole matrices)
            ep.parallelize(model, d.groups, dp="none")
            log.info("distributed: world %d = dp %d x ep %d, rank %d", d.world, d.groups.dp_size,
                     d.groups.ep_size, d.rank)
        hp = resolve_hparams(spec)
        opt = build_optimizer(model, hp)
        if t.compile:  # per block, as torchtitan does: one graph per layer kind, whatever the depth
            for block in model.blocks:
                block.compile()

        amp = t.precision == "bf16"
        if amp and device.type == "cpu":
            log.warning("bf16 autocast on CPU is ~14x slower than fp32 here (environment notes)")

        def autocast():
            return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)

        # built up front: a held-out split too small for one eval batch fails before any training
        eval_sets = {s.seq_len: {dom: mdata.eval_batches(corpus, dom, s.seq_len, s.batch_size, t.eval_batches)
                                 for dom in domains} for s in stages}

        def eval_now(seq_len: int) -> dict:
            return evaluate(model, eval_sets[seq_len], bpt, device, autocast, d)

        from marin import flops as mflops

        # attention FLOPs per token grow with the context: one value per stage length
        fpt_at = {s.seq_len: float(mflops.flops_per_token(spec.model, spec.recipe, s.seq_len)) for s in stages}
        fpt = fpt_at[stages[0].seq_len]
        params_total = int(mflops.params_total(spec.model, spec.recipe))
        params_active = int(mflops.params_active(spec.model, spec.recipe))
        peak = peak_flops(device, t.precision)

        st = LoopState()
        metrics_path = run_dir / "metrics.jsonl"
        if d is not None:
            ck = None
            if resume:
                found = [(latest_dist_checkpoint(run_dir), latest_checkpoint(run_dir)) if d.main else None]
                dist.broadcast_object_list(found, src=0)  # one decision for every rank
                ck, single_ck = found[0]
                if single_ck is not None and (ck is None or single_ck.stem > ck.name):
                    raise ValueError(f"checkpoint {single_ck} was written by a single-process run; resume it "
                                     "in one process (that can load any checkpoint), or pass resume=False")
            if ck is not None:
                st = _load_dist_checkpoint(ck, spec, model, opt, d, device, metrics_path)
            else:
                if d.main:
                    if not resume:
                        import shutil

                        for p in (run_dir / "checkpoints").glob("ckpt_*"):
                            shutil.rmtree(p) if p.is_dir() else p.unlink()
                    metrics_path.write_text("")
                log.info("start %s: %s", spec.run_id, spec.canonical_json())
            dist.barrier()
        elif resume and (ck := _newest(latest_checkpoint(run_dir), latest_dist_checkpoint(run_dir))) is not None \
                and ck.is_dir():
            st = _load_dist_checkpoint(ck, spec, model, opt, None, device, metrics_path)
        elif (ck := latest_checkpoint(run_dir) if resume else None) is not None:
            blob = torch.load(ck, map_location="cpu", weights_only=False)  # RNG states must stay on CPU
            if blob["run_id"] != spec.run_id:
                raise ValueError(f"checkpoint {ck} belongs to run {blob['run_id']}, not {spec.run_id}")
            model.load_state_dict(blob["model"])
            opt.load_state_dict(blob["optimizer"])
            st = LoopState(**blob["loop"])
            _set_rng_state(blob["rng"], device)
            with open(metrics_path, "a+b") as f:  # drop lines logged after the checkpoint
                f.truncate(blob["metrics_offset"])
            log.info("resumed %s from %s at step %d", spec.run_id, ck.name, st.step)
        else:
            if not resume:
                import shutil

                for p in (run_dir / "checkpoints").glob("ckpt_*"):
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            metrics_path.write_text("")
            log.info("start %s: %s", spec.run_id, spec.canonical_json())
        sinks = _Sinks(tuple(log_to) if main else (), run_dir, spec)
        stop.install()
        self_signal = _parse_self_signal()

        def checkpoint_dist() -> None:
            """Every rank: DCP shards + its RNG into a temporary directory; rank 0 then writes
            loop.json and renames the directory (a crash leaves no half checkpoint behind)."""
            import shutil

            ckdir = run_dir / "checkpoints"
            name = f"ckpt_{st.step:09d}"
            tmp = ckdir / f".{name}.tmp"
            if d.main:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
            dist.barrier()
            ep.save_checkpoint(model, tmp / "dcp", d.groups, opt)
            _atomic_torch_save(_rng_state(device), tmp / f"rng_{d.rank}.pt")
            dist.barrier()
            if d.main:
                loop = dict(st.__dict__, wall_s=st.wall_s + (time.perf_counter() - t0))
                _atomic_write_text(tmp / "loop.json", json.dumps(
                    {"run_id": spec.run_id, "loop": loop, "metrics_offset": metrics_path.stat().st_size,
                     "world_size": d.world, "ep_size": d.groups.ep_size}))
                final = ckdir / name
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
                for old in sorted(p for p in ckdir.glob("ckpt_*") if p.is_dir())[:-2]:
                    shutil.rmtree(old)
                log.info("checkpoint %s", name)
            dist.barrier()

        def checkpoint() -> None:
            if d is not None:
                return checkpoint_dist()
            ckdir = run_dir / "checkpoints"
            loop = dict(st.__dict__, wall_s=st.wall_s + (time.perf_counter() - t0))
            blob = {"run_id": spec.run_id, "model": model.state_dict(), "optimizer": opt.state_dict(),
                    "loop": loop, "rng": _rng_state(device),
                    "metrics_offset": metrics_path.stat().st_size}
            path = ckdir / f"ckpt_{st.step:09d}.pt"
            _atomic_torch_save(blob, path)
            for old in sorted(ckdir.glob("ckpt_*.pt"))[:-2]:
                old.unlink()
            log.info("checkpoint %s", path.name)

        def emit(rec: dict) -> None:
            if not main:
                return
            with open(metrics_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            sinks.log(rec)

        model.train()
        if ck is None and t.eval_every:  # the untrained model's eval: where learning curves start
            emit({"step": 0, **eval_now(stages[0].seq_len)})
        steps_this_session = 0
        interval_tokens, interval_s = 0, 0.0
        window = deque(st.spike_history, maxlen=t.spike_window)
        cur_stage: Stage | None = None
        while st.step < t.steps:
            stop_now = stop.signum is not None
            if d is not None:  # a signal seen by any rank stops every rank at the same step
                flag = torch.tensor([float(stop_now)], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stop_now = bool(flag.item())
            if stop_now or (stop_after is not None and steps_this_session >= stop_after):
                checkpoint()
                st_out = {"run_id": spec.run_id, "status": "interrupted", "step": st.step,
                          "signal": stop.signum}
                log.info("interrupted at step %d (signal %s)", st.step, stop.signum)
                return st_out
            step = st.step
            stage = stage_at(stages, step)
            if stage != cur_stage:
                _set_q_scale(model, stage.q_scale)
                if cur_stage is not None:
                    log.info("context stage: seq_len %d batch %d q_scale %.4f from step %d",
                             stage.seq_len, stage.batch_size, stage.q_scale, step)
                cur_stage = stage
            mult = lr_multiplier(step, t.steps, t.lr_schedule, t.warmup_frac, t.final_lr_frac)
            set_lr(opt, mult)

            ts = time.perf_counter()
            tokens, targets, doc_ids = packers[stage.seq_len].batch(step)
            n_tok = tokens.numel()  # the global batch's tokens
            if d is not None:
                tokens, targets, doc_ids = d.rows(tokens), d.rows(targets), d.rows(doc_ids)
            tokens, targets, doc_ids = tokens.to(device), targets.to(device), doc_ids.to(device)
            if d is not None:
                out, loss_v, ce_v, gnorm = dist_forward_backward(model, tokens, targets, doc_ids, autocast,
                                                                 t.grad_clip, d)
            else:
                out, loss_v, ce_v, gnorm = forward_backward(model, tokens, targets, doc_ids, autocast,
                                                            t.grad_clip)
            if not (math.isfinite(loss_v) and math.isfinite(gnorm)):
                what = "loss" if not math.isfinite(loss_v) else "grad norm"
                val = loss_v if not math.isfinite(loss_v) else gnorm
                reason = f"diverged: non-finite {what} ({val}) at step {step}"
                log.error(reason)
                emit({"step": step, "loss": loss_v, "ce": ce_v, "grad_norm": gnorm, "lr": opt.param_groups[0]["lr"]})
                summary = _summary(spec, st, "failed", reason, step, params_total, params_active, fpt, peak,
                                   device, t0, metrics_path, hp, d)
                if main:
                    _atomic_write_text(summary_path, json.dumps(summary, indent=1))
                return summary
            optimizer_step(model, opt, dist.group.WORLD if d is not None else None)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - ts

            st.tokens += n_tok
            st.train_flops += fpt_at[stage.seq_len] * n_tok * t.flops_multiplier  # >1: FLOPs counted, not spent
            stats = dict(out.stats)
            st.dropped += float(stats.get("dropped", 0.0))
            st.assigned += float(stats.get("assigned", 0.0))
            st.max_grad_norm = max(st.max_grad_norm, gnorm)
            if steps_this_session > 0 or t.steps - step == 1:  # the first step of a session warms up
                st.timed_tokens += n_tok
                st.timed_flops += fpt_at[stage.seq_len] * n_tok * t.flops_multiplier
                st.timed_s += dt
                interval_tokens += n_tok
                interval_s += dt
            if is_spike(loss_v, window, t.spike_factor, t.spike_window):
                st.spike_steps.append(step)
                log.warning("loss spike at step %d: %.4f > %.2f x median %.4f", step, loss_v, t.spike_factor,
                            statistics.median(window))
            window.append(loss_v)
            st.spike_history = list(window)
            st.last_loss = loss_v
            st.step = step + 1
            steps_this_session += 1

            last = st.step == t.steps
            if step % t.log_every == 0 or last:
                tps = interval_tokens / interval_s if interval_s > 0 else None
                rec = {"step": step, "loss": loss_v, "ce": ce_v, "lr": opt.param_groups[0]["lr"],
                       "lr_mult": mult, "grad_norm": gnorm, "seq_len": stage.seq_len, "batch_size": stage.batch_size, "q_scale": stage.q_scale,
                       "drop_rate": (stats["dropped"] / stats["assigned"]) if stats.get("assigned") else 0.0,
                       "tokens": st.tokens, "tokens_per_s": tps,
                       "model_flops_per_s": fpt_at[stage.seq_len] * tps if tps else None,
                       "mfu": fpt_at[stage.seq_len] * tps / peak if (tps and peak) else None,
                       "load_cv": stats.get("load_cv"), "max_load_ratio": stats.get("max_load_ratio"),
                       "router_z": stats.get("router_z"), "aux_loss": float(out.aux_loss.detach()),
                       "z_loss": float(out.z_loss.detach()) if out.z_loss is not None else None}
                emit(rec)
                interval_tokens, interval_s = 0, 0.0
            if (t.eval_every and st.step % t.eval_every == 0) or last:
                ev = eval_now(stage.seq_len)
                st.last_eval = ev
                emit({"step": st.step, **ev})
                log.info("step %d eval macro %.4f bpb %.4f", step, ev["eval_macro_loss"], ev["macro_bpb"])
            if self_signal is not None and step == self_signal[0]:
                os.kill(os.getpid(), self_signal[1])
            if not last and t.checkpoint_every and st.step % t.checkpoint_every == 0:
                checkpoint()

        summary = _summary(spec, st, "completed", None, None, params_total, params_active, fpt, peak, device, t0,
                           metrics_path, hp, d)
        if main:
            _atomic_write_text(summary_path, json.dumps(summary, indent=1))
        log.info("done %s: eval macro %.4f", spec.run_id, summary["eval_macro_loss"])
        return summary
    finally:
        prev_handler = stop.previous.get(stop.signum) if stop.signum is not None else None
        stop.restore()
        if sinks is not None:
            sinks.close()
        log.removeHandler(handler)
        handler.close()
        if d is not None and d.owns_pg and dist.is_initialized():
            dist.destroy_process_group()
        if callable(prev_handler):
            # A caller installed a handler before us (submitit's USR2 requeues the job; a local
            # worker's TERM stops it taking the next run): hand the signal back. Our checkpoint is
            # on disk, or the run completed because the signal came during its last step.
            os.kill(os.getpid(), stop.signum)


def _parse_self_signal() -> tuple[int, int] | None:
    v = os.environ.get(SIGNAL_SELF_ENV)
    if not v:
        return None
    step, name = v.split(":")
    return int(step), getattr(signal, f"SIG{name.upper()}")


def _summary(spec: RunSpec, st: LoopState, status: str, error: str | None, failed_step: int | None,
             params_total: int, params_active: int, fpt: float, peak: float | None, device: torch.device,
             t0: float, metrics_path: Path, hp, d: _Dist | None = None) -> dict:
    """The summary (CONTRACTS); distributed: rank 0's, broadcast so that every rank returns it."""
    if d is not None:
        box = [_summary(spec, st, status, error, failed_step, params_total, params_active, fpt, peak, device, t0,
                        metrics_path, hp) if d.main else None]
        dist.broadcast_object_list(box, src=0)
        box[0]["hardware"] = f"{box[0]['hardware']} [world {d.world}: dp {d.groups.dp_size} x ep {d.groups.ep_size}]"
        return box[0]
    tps = st.timed_tokens / st.timed_s if st.timed_s > 0 else None
    mfps = st.timed_flops / st.timed_s if st.timed_s > 0 else None
    if st.tokens:  # token-weighted over context stages, so that train_flops = flops_per_token * tokens
        fpt = st.train_flops / st.tokens
    ev = st.last_eval or {}
    curve = [[r["step"], r["loss"]] for r in _read_metrics(metrics_path) if "loss" in r and "eval_macro_loss" not in r]
    return {
        "run_id": spec.run_id, "status": status, "error": error, "failed_step": failed_step,
        "step": st.step if failed_step is None else failed_step, "tokens": st.tokens,
        "params_total": params_total, "params_active": params_active, "flops_per_token": fpt,
        "train_flops": st.train_flops,
        "eval_macro_loss": ev.get("eval_macro_loss"), "eval_domain_loss": ev.get("eval_domain_loss"),
        "macro_bpb": ev.get("macro_bpb"), "eval_domain_bpb": ev.get("eval_domain_bpb"),
        "final_train_loss": st.last_loss, "tokens_per_s": tps,
        "model_flops_per_s": mfps, "mfu": mfps / peak if (mfps and peak) else None,
        "drop_rate": st.dropped / st.assigned if st.assigned else 0.0, "max_grad_norm": st.max_grad_norm,
        "spikes": len(st.spike_steps), "spike_steps": list(st.spike_steps),
        "wall_s": st.wall_s + (time.perf_counter() - t0), "hardware": hardware_name(device),
        "code_version": code_version(), "loss_curve": _subsample(curve),
        "lr_peak": hp.lr, "adam_lr_peak": hp.adam_lr, "optimizer": hp.level,
    }


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def train_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", required=True, help="model preset (marin.config.PRESETS)")
    parser.add_argument("--recipe", action="append", default=[], metavar="FACTOR=LEVEL",
                        help="set a recipe switch; 'baseline' alone gives Recipe.baseline()")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="ModelConfig override")
    parser.add_argument("--train-set", action="append", default=[], metavar="FIELD=VALUE", help="TrainConfig override")
    parser.add_argument("--data-set", action="append", default=[], metavar="FIELD=VALUE", help="DataConfig override")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--no-resume", action="store_true", help="ignore checkpoints in --out and start over")
    parser.add_argument("--stop-after", type=int, default=None, help="checkpoint and stop after N steps of this session")
    parser.add_argument("--log-to", default="", help=f"comma-separated extra sinks: {', '.join(LOG_TO)}")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    model = preset(args.preset, list(args.set))
    recipe = Recipe()
    for item in args.recipe:
        if item == "baseline":
            recipe = Recipe.baseline()
            continue
        if "=" not in item:
            raise ValueError(f"--recipe {item!r} must look like factor=level; factors: {', '.join(FACTORS)}")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in RECIPE_LEVELS:
            raise ValueError(f"unknown recipe factor {k!r}; allowed values: {', '.join(FACTORS)}")
        recipe = recipe.with_(**{k: v})
    tr = _int_fields(apply_overrides(TrainConfig(), list(args.train_set)))
    if args.steps is not None:
        tr = replace(tr, steps=args.steps)
    data = apply_overrides(DataConfig(), list(args.data_set))
    return RunSpec(model=model, recipe=recipe, train=tr, data=data, seed=args.seed)


def _int_fields(cfg):
    """apply_overrides parses a None-default field as float; `int | None` fields want ints (so that
    `--train-set threads=1` and threads=1 give the same run id)."""
    fix = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, float) and str(f.type).replace(" ", "") in ("int|None", "Optional[int]"):
            if not v.is_integer():
                raise ValueError(f"{type(cfg).__name__}.{f.name}={v!r} must be an integer")
            fix[f.name] = int(v)
    return replace(cfg, **fix) if fix else cfg


def cmd_train(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    log_to = tuple(x for x in args.log_to.split(",") if x)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    out = train(spec, args.out, resume=not args.no_resume, stop_after=args.stop_after, log_to=log_to)
    print(json.dumps({k: out.get(k) for k in ("run_id", "status", "step", "eval_macro_loss", "final_train_loss",
                                               "error")}))
    if out["status"] == "interrupted":
        sig = out.get("signal")
        return 128 + sig if sig else 0  # 143 after SIGTERM, 140 after SIGUSR2: "stopped, resumable"
    return 0 if out["status"] == "completed" else 1
