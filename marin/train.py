"""The training loop: one process, CPU (fp32) or one GPU (bf16 autocast); eval, spikes, context
stages, atomic checkpoints, preemption, exact resume, summary.json (DESIGN §3, CONTRACTS).

Run directory: spec.json, metrics.jsonl (a train line per logged step: `step` is the 0-based index
of the step whose loss it reports; an eval line carries `eval_*` and `step` = optimizer steps done,
0 for the untrained model),
summary.json (atomic, at the end), checkpoints/ckpt_<step>.pt (atomic), train.log.

Preemption: SIGTERM or SIGUSR2 only sets a flag; the loop writes a checkpoint at the next step
boundary and returns {"status": "interrupted"}. Under submitit, SIGUSR2 is then handed back to the
handler that was installed before ours (submitit's, which requeues the job).
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
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu:{platform.machine()}x{torch.get_num_threads()}"


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
    t, l0 = spec.train, spec.model.seq_len
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
             autocast: Callable) -> dict:
    """Dropless eval: per-domain token-mean NLL, macro loss = unweighted mean over domains, bpb."""
    was_training = model.training
    model.eval()
    domain_loss: dict[str, float] = {}
    for dom, bs in batches.items():
        nll, count = 0.0, 0
        for tokens, targets, doc_ids in bs:
            tokens, targets, doc_ids = tokens.to(device), targets.to(device), doc_ids.to(device)
            with autocast():
                out = model(tokens, doc_ids)
            logits = out.logits_BSV.float()
            nll += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                         ignore_index=-100, reduction="sum"))
            count += int((targets != -100).sum())
        domain_loss[dom] = nll / max(count, 1)
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


def forward_backward(model: torch.nn.Module, fwd: Callable, tokens: torch.Tensor, targets: torch.Tensor,
                     doc_ids: torch.Tensor, autocast: Callable, grad_clip: float | None):
    """One forward and backward (z-loss and aux loss come with the model's loss) -> (out, loss,
    ce, grad_norm) as floats; the grad norm is the unclipped global L2 norm."""
    with autocast():
        out = fwd(tokens, doc_ids, targets)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    gnorm_t = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    loss_v = float(out.loss.detach())
    ce_v = float(out.ce_loss.detach()) if out.ce_loss is not None else loss_v
    return out, loss_v, ce_v, float(gnorm_t)


def optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Update, clear grads, then the router biases from this step's routing (apply from the next)."""
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.update_router_biases()


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
    {"status": "interrupted", ...} when stopped by a signal or `stop_after` (a checkpoint is written)."""
    t0 = time.perf_counter()
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec, got {type(spec).__name__}")
    t = spec.train
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
    _atomic_write_text(spec_path, json.dumps(spec.to_dict(), indent=1, sort_keys=True))

    handler = logging.FileHandler(run_dir / "train.log")
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
        unknown = [d for d in domains if d not in corpus.domains]
        if unknown:
            raise ValueError(f"DataConfig.eval_domains: unknown domains {unknown}; allowed values: {', '.join(corpus.domains)}")
        packers = {s.seq_len: _packer(mdata, corpus, s.seq_len, s.batch_size, spec.data.data_seed) for s in stages}
        bpt = {d: mdata.bytes_per_token(corpus, d) for d in domains}
        if corpus.tokenizer.vocab_size > spec.model.vocab_size:
            raise ValueError(f"ModelConfig.vocab_size={spec.model.vocab_size} is smaller than the tokenizer's "
                             f"vocabulary ({corpus.tokenizer.vocab_size}, DataConfig.tokenizer="
                             f"{spec.data.tokenizer!r}); allowed values: >= {corpus.tokenizer.vocab_size}")

        torch.manual_seed(spec.seed)
        model = _build_model(spec).to(device)
        hp = resolve_hparams(spec)
        opt = build_optimizer(model, hp)
        fwd = torch.compile(model) if t.compile else model

        amp = t.precision == "bf16"
        if amp and device.type == "cpu":
            log.warning("bf16 autocast on CPU is ~14x slower than fp32 here (environment notes)")

        def autocast():
            return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)

        # built up front: a held-out split too small for one eval batch fails before any training
        eval_sets = {s.seq_len: {d: mdata.eval_batches(corpus, d, s.seq_len, s.batch_size, t.eval_batches)
                                 for d in domains} for s in stages}

        def eval_now(seq_len: int) -> dict:
            return evaluate(fwd, eval_sets[seq_len], bpt, device, autocast)

        from marin import flops as mflops

        # attention FLOPs per token grow with the context: one value per stage length
        fpt_at = {s.seq_len: float(mflops.flops_per_token(spec.model, spec.recipe, s.seq_len)) for s in stages}
        fpt = fpt_at[stages[0].seq_len]
        params_total = int(mflops.params_total(spec.model, spec.recipe))
        params_active = int(mflops.params_active(spec.model, spec.recipe))
        peak = peak_flops(device, t.precision)

        st = LoopState()
        metrics_path = run_dir / "metrics.jsonl"
        ck = latest_checkpoint(run_dir) if resume else None
        if ck is not None:
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
                for p in (run_dir / "checkpoints").glob("ckpt_*.pt"):
                    p.unlink()
            metrics_path.write_text("")
            log.info("start %s: %s", spec.run_id, spec.canonical_json())
        sinks = _Sinks(tuple(log_to), run_dir, spec)
        stop.install()
        self_signal = _parse_self_signal()

        def checkpoint() -> None:
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
            if stop.signum is not None or (stop_after is not None and steps_this_session >= stop_after):
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
            tokens, targets, doc_ids = tokens.to(device), targets.to(device), doc_ids.to(device)
            out, loss_v, ce_v, gnorm = forward_backward(model, fwd, tokens, targets, doc_ids, autocast, t.grad_clip)
            if not (math.isfinite(loss_v) and math.isfinite(gnorm)):
                what = "loss" if not math.isfinite(loss_v) else "grad norm"
                val = loss_v if not math.isfinite(loss_v) else gnorm
                reason = f"diverged: non-finite {what} ({val}) at step {step}"
                log.error(reason)
                emit({"step": step, "loss": loss_v, "ce": ce_v, "grad_norm": gnorm, "lr": opt.param_groups[0]["lr"]})
                summary = _summary(spec, st, "failed", reason, step, params_total, params_active, fpt, peak,
                                   device, t0, metrics_path, hp)
                _atomic_write_text(summary_path, json.dumps(summary, indent=1))
                return summary
            optimizer_step(model, opt)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - ts

            n_tok = tokens.numel()
            st.tokens += n_tok
            st.train_flops += fpt_at[stage.seq_len] * n_tok
            stats = dict(out.stats)
            st.dropped += float(stats.get("dropped", 0.0))
            st.assigned += float(stats.get("assigned", 0.0))
            st.max_grad_norm = max(st.max_grad_norm, gnorm)
            if steps_this_session > 0 or t.steps - step == 1:  # the first step of a session warms up
                st.timed_tokens += n_tok
                st.timed_flops += fpt_at[stage.seq_len] * n_tok
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
                           metrics_path, hp)
        _atomic_write_text(summary_path, json.dumps(summary, indent=1))
        log.info("done %s: eval macro %.4f", spec.run_id, summary["eval_macro_loss"])
        return summary
    finally:
        prev_usr2 = stop.previous.get(signal.SIGUSR2)
        stop.restore()
        if sinks is not None:
            sinks.close()
        log.removeHandler(handler)
        handler.close()
        if stop.signum == signal.SIGUSR2 and callable(prev_usr2):
            # submitit (or any caller) installed a USR2 handler before us: hand the signal back so
            # it can requeue the job; our checkpoint is already on disk.
            os.kill(os.getpid(), signal.SIGUSR2)


def _parse_self_signal() -> tuple[int, int] | None:
    v = os.environ.get(SIGNAL_SELF_ENV)
    if not v:
        return None
    step, name = v.split(":")
    return int(step), getattr(signal, f"SIG{name.upper()}")


def _summary(spec: RunSpec, st: LoopState, status: str, error: str | None, failed_step: int | None,
             params_total: int, params_active: int, fpt: float, peak: float | None, device: torch.device,
             t0: float, metrics_path: Path, hp) -> dict:
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
