"""The training loop: one process, CPU (fp32) or one GPU (bf16 autocast), or a distributed launch
(marin.train.distributed); eval, spikes, context stages, checkpoints, preemption, exact resume,
summary.json. The run directory is described in docs/architecture.md §3.

Preemption: SIGTERM, SIGUSR2 (and SIGINT, when nobody else handles it) only set a flag; the loop
writes a checkpoint at the next step boundary, returns {"status": "interrupted"} and hands the signal back
to the handler installed before ours (`train`'s last lines say why, and what a failing one leaves). The loop's
shape follows torchtitan's Trainer (torchtitan/train.py): setup once, then `train_step` per step with logging,
eval and checkpoint hooks.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from marin_ablate.marin import data as mdata
from marin_ablate.marin import flops as mflops
from marin_ablate.marin import schema
from marin_ablate.marin.config import RunSpec, TrainConfig
from marin_ablate.marin.train import checkpoint as ckpt
from marin_ablate.marin.train.distributed import (
    ParallelDims,
    build_train_model,
    check_launch,
    check_micro_batches,
    init_train_model,
    parallel_dims,
)
from marin_ablate.marin.train.files import disk_full_error, is_disk_full, remove_stale_temps
from marin_ablate.marin.train.machine import code_version, hardware_name, peak_flops
from marin_ablate.marin.train.metrics import MetricsLog, Sinks, check_log_to, is_eval
from marin_ablate.marin.train.run_dir import claim_dir, summary_json
from marin_ablate.marin.train.source import build_data_source, check_vocab, global_tokens, validate_data
from marin_ablate.marin.train.stages import Stage, apply_q_scale, context_plan, is_spike, stage_at
from marin_ablate.marin.train.step import evaluate, optimizer_step
from marin_ablate.marin.train.step_progress import StepProgress
from marin_ablate.marin.update_rules import (
    build_optimizer,
    check_sphere_norms,
    decay_fraction,
    lr_multiplier,
    resolve_hparams,
    set_lr,
)

log = logging.getLogger("marin_ablate.marin.train")


@dataclass
class LoopState:
    """Everything a resume needs besides model, optimizer and RNG (saved in the checkpoint's meta.json)."""

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
    data: dict | None = None  # the sharded loader's state (prepared corpora): checked on resume
    code_versions: list = field(default_factory=list)  # [code version, first step it trained], each session's


class StopFlag:
    """Preemption signals set a flag; the loop acts on it at a step boundary (never mid-step)."""

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        for s in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
            try:
                if s == signal.SIGINT and signal.getsignal(s) is not signal.default_int_handler:
                    continue  # a caller owns Ctrl-C (a sweep worker ignores it): leave it alone
                self.previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: the caller owns signals
                return

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.signum = signum

    def hand_back(self) -> Any:
        """The handler to pass our signal on to: the caller's own, never Python's KeyboardInterrupt."""
        prev = self.previous.get(self.signum) if self.signum is not None else None
        return prev if callable(prev) and prev is not signal.default_int_handler else None

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous = {}


def _device(t: TrainConfig, here: bool = True) -> torch.device:
    """The run's device; `here`: it exists on this machine (a study whose runs train elsewhere, in SLURM
    jobs, checks the name only)."""
    dev, sep, index = t.device.partition(":")
    if dev not in ("cpu", "cuda") or (dev == "cpu" and sep) or (sep and not index.isdigit()):
        raise ValueError(f"TrainConfig.device={t.device!r} is not supported; allowed values: 'cpu', 'cuda', 'cuda:N'")
    if here and dev == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"TrainConfig.device={t.device!r} but CUDA is not available; allowed values here: 'cpu'")
    if here and index and int(index) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ValueError(f"TrainConfig.device={t.device!r} but this machine has {n} CUDA device(s); allowed values "
                         f"here: 'cuda', {', '.join(f'cuda:{i}' for i in range(n))}")
    return torch.device(t.device)


def check_spec(spec: RunSpec, *, here: bool = True) -> tuple[TrainConfig, torch.device, list[Stage]]:
    """Every check `train` makes of a spec before it writes anything: the data paths and domains, the
    device (on this machine when `here`), the context stages. `run` (and `run --tune`) and `plan` call it for every
    run of a study before anything is launched, so a setting `train` refuses is refused there too."""
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec, got {type(spec).__name__}")
    t = spec.train.effective()
    validate_data(spec.data)
    check_vocab(spec)
    stages = context_plan(spec)
    check_micro_batches(spec, stages, 1)  # whole rows on one rank; a launch of more checks its own (check_launch)
    return t, _device(t, here), stages


def _allocated(build: Any, spec: RunSpec, device: torch.device) -> Any:
    """`build()`, with a model too large for the device's memory named as a setting, not a traceback."""
    try:
        return build()
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        text = str(e)
        if not (isinstance(e, MemoryError) or "allocate" in text or "out of memory" in text):
            raise
        m = spec.model
        why = next((ln.strip() for ln in text.splitlines() if "allocate" in ln or "memory" in ln), type(e).__name__)
        raise ValueError(f"the model (ModelConfig.d_model={m.d_model}, n_layers={m.n_layers}, n_experts={m.n_experts}, "
                         f"vocab_size={m.vocab_size}) does not fit in the memory of {device} ({why[:200]}); allowed "
                         "values: a smaller model, or a device with more memory") from None


class Trainer:
    """One run's model, optimizer, data and state; `run()` trains to the end or to a stop."""

    def __init__(self, spec: RunSpec, run_dir: Path, stages: list[Stage], device: torch.device, pd: ParallelDims,
                 t0: float, keep_checkpoints: str = "final"):
        # token_multiplier: the rung trained that many times longer (the calibration study's extra compute)
        self.spec, self.t, self.run_dir, self.stages, self.pd, self.t0 = (
            spec, spec.train.effective(), run_dir, stages, pd, t0)
        self.main = pd.main
        t = self.t
        self.data = src = build_data_source(spec, stages, spec.data.data_seed + self.t.seed_offset(), pd.rank, pd.world)
        self.bpt = {dom: mdata.bytes_per_token(src.eval_corpus, dom) for dom in src.domains}

        torch.manual_seed(spec.seed + self.t.seed_offset())
        # one process: the whole model; distributed: this rank's shards only (FSDP2 + EP), the same
        # global weights either way (layout-independent init). Built on meta and materialised, not drawn:
        # `start` loads a checkpoint into it, or draws the initial weights (`init_model`) when none loads
        self.model = model = _allocated(lambda: build_train_model(spec, device, pd.groups, init=False), spec, device)
        if pd.groups is not None:
            log.info("distributed:%s rank %d; FSDP2 sharded, mixed precision %s", pd.describe(), pd.rank,
                     t.mixed_precision)
        # distributed checkpoints are written in the background (committed at the next one, the end
        # of the run or a preemption); one process writes before going on
        self.writer = pd.checkpointer()
        self.pending: ckpt.PendingSave | None = None
        self.keep_checkpoints = keep_checkpoints  # a ckpt.RETENTION level
        self.saved_step: int | None = None  # the step of the newest checkpoint written or loaded
        self.hp = resolve_hparams(spec)
        # EP: an expert bank's sphere spans the EP group's slices of it
        self.opt = build_optimizer(model, self.hp, expert_group=pd.expert_group, drawn=False)
        if t.compile:  # per block, as torchtitan does: one graph per layer kind, whatever the depth
            for block in model.blocks:
                block.compile()
        self.device = device
        self.amp = t.precision == "bf16"
        if self.amp and device.type == "cpu":
            log.warning("bf16 autocast on CPU is ~14x slower than fp32 here (environment notes)")
        # built up front: a held-out split too small for one eval batch fails before any training
        self.eval_sets = {s.seq_len: {dom: mdata.eval_batches(src.eval_corpus, dom, s.seq_len,
                                                              t.eval_batch_size or s.batch_size, t.eval_batches)
                                      for dom in src.domains} for s in stages}
        # attention FLOPs per token grow with the context: one value per stage length
        self.fpt_at = {s.seq_len: float(mflops.flops_per_token(spec.model, spec.recipe, s.seq_len)) for s in stages}
        self.params_total = int(mflops.params_total(spec.model, spec.recipe))
        self.params_active = int(mflops.params_active(spec.model, spec.recipe))
        self.peak = peak_flops(device, t.precision)
        self.st = LoopState()
        self.metrics = MetricsLog(run_dir / "metrics.jsonl", spec.run_id)
        self.sinks: Sinks | None = None
        self.resumed = False
        self.resumed_from: str | None = None  # the checkpoint this session started from (summary.json)
        self.skipped: list[str] = []  # checkpoints passed over, with the reason
        self.progress: StepProgress | None = None
        self.cpu0 = time.process_time()  # this session's CPU time: how much slower than idle it trained

    # -- helpers ---------------------------------------------------------------------------------

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp)

    def eval_now(self, seq_len: int) -> dict:
        return evaluate(self.model, self.eval_sets[seq_len], self.bpt, self.device, self.autocast, self.pd)

    def emit(self, rec: dict) -> None:
        if not self.main:
            return
        self.metrics.append(rec)
        self.sinks.log(rec)
        if self.progress is not None and "loss" in rec and not is_eval(rec):
            self.progress.update(rec)

    # -- resume and checkpoint -------------------------------------------------------------------

    def begin(self, resume: bool, log_to: tuple[str, ...] = ()) -> None:
        """What `train` does once the trainer is built: claim the run directory (rank 0 writes spec.json,
        only now that the run could be set up: a setup error, a bad eval_dir, must not claim it), resume
        or start afresh (`start`), then open the metric sinks (rank 0's)."""
        if self.main:
            schema.write_spec(self.run_dir, self.spec)
        self.start(resume)
        self.sinks = Sinks(tuple(log_to) if self.main else (), self.run_dir, self.spec)

    def init_model(self) -> None:
        """Draw the initial weights (a fresh start; never on a resume whose checkpoint loads)."""
        init_train_model(self.spec, self.model, self.pd.groups)
        check_sphere_norms(self.model.named_parameters(), self.model.param_roles(), self.hp)

    def start(self, resume: bool) -> None:
        """Resume from the newest usable checkpoint into the undrawn model, or draw it and start afresh
        (metrics.jsonl emptied)."""
        ckdir, pd = self.run_dir / "checkpoints", self.pd
        found = ckpt.restore(ckdir, self.spec.run_id, self.model, self.opt, self.device, pd.groups, pd.rank,
                             pd.world, self.skipped, init=self.init_model) if resume else None
        if found is not None:
            ck, meta = found
            self.st = LoopState(**meta["loop"])
            self.data.restore(self.st.data, self.st.step, stage_at(self.stages, self.st.step).seq_len)
            if self.main:
                self.metrics.recover(self.st.step)
            self.resumed, self.resumed_from, self.saved_step = True, ck.name, self.st.step
            log.info("resumed %s from %s at step %d", self.spec.run_id, ck.name, self.st.step)
        else:  # a fresh start, or no checkpoint loads: the initial weights are drawn now
            self.init_model()
            if self.skipped:
                log.warning("no checkpoint loads (%d skipped): starting fresh from step 0 with the initial "
                            "model, optimizer, RNG and data state", len(self.skipped))
            if self.main:
                if not resume:
                    for p in ckdir.glob("ckpt_*"):
                        shutil.rmtree(p) if p.is_dir() else p.unlink()
                self.metrics.reset()
            log.info("start %s: %s", self.spec.run_id, self.spec.canonical_json())
        self._note_code_version()
        self.pd.barrier()

    def _note_code_version(self) -> None:
        """Record the code version of this session; a resume under other code is warned about (the run's
        steps then come from more than one version: summary.json lists them all, the report shows it)."""
        now = code_version()
        seen = self.st.code_versions
        if seen and seen[-1][0] != now:
            log.warning("code changed since the checkpoint: %s trained steps %d-%d with %s, continues at step %d "
                        "with %s", self.spec.run_id, seen[-1][1], self.st.step - 1, seen[-1][0], self.st.step, now)
        if not seen or seen[-1][0] != now:
            seen.append([now, self.st.step])

    def checkpoint(self, now: bool = False) -> None:
        """Checkpoint the state after the last step. The previous background write is committed first;
        `now` (a preemption) commits this one too before returning."""
        self.commit_pending()
        if self.saved_step == self.st.step:  # a stop right after a periodic checkpoint: it is that one
            return
        self.st.data = self.data.state(self.st.step, stage_at(self.stages, min(self.st.step, self.t.steps - 1)).seq_len)
        loop = dict(self.st.__dict__, wall_s=self.st.wall_s + (time.perf_counter() - self.t0))
        keep = ckpt.KEEP_LAST if ckpt.RETENTION[self.keep_checkpoints] is not None else None
        self.pending = ckpt.begin_save(self.run_dir / "checkpoints", self.st.step, self.spec.run_id, loop, self.model,
                                       self.opt, self.device, self.pd.groups, self.pd.rank, self.pd.world, self.writer,
                                       keep)
        self.saved_step = self.st.step
        if now or self.writer is None:
            self.commit_pending()

    def checkpoint_due(self, step: int) -> bool:
        """Every checkpoint_every steps, and (checkpoint_interval_s > 0) whenever that much wall clock
        passed since the last save: Marin's hourly temporary checkpoint, so a job's time limit loses at
        most that interval. Ranks agree through one MAX all-reduce (the save is collective)."""
        t = self.t
        due = bool(t.checkpoint_every and step % t.checkpoint_every == 0)
        if t.checkpoint_interval_s and not due:
            late = time.perf_counter() - getattr(self, "last_save_t", self.t0) >= t.checkpoint_interval_s
            flag = torch.tensor([float(late)], device=self.device)
            due = bool(self.pd.all_reduce(flag, dist.ReduceOp.MAX).item() > 0)
        if due:
            self.last_save_t = time.perf_counter()
        return due

    def commit_pending(self) -> None:
        if self.pending is not None:
            p, self.pending = self.pending, None
            ckpt.commit(p)

    # -- one step ----------------------------------------------------------------------------------

    def train_step(self, stage: Stage) -> tuple[Any, float, float, float, int, float]:
        """Batch of this step -> forward, backward, update: (out, loss, ce, grad_norm, tokens, seconds)."""
        pd, device = self.pd, self.device
        ts = time.perf_counter()
        batch = self.data.train[stage.seq_len].batch(self.st.step)
        n_tok = global_tokens(batch, pd.world)
        tokens, targets, doc_ids = (t.to(device) for t in batch)
        out, loss_v, ce_v, gnorm = pd.forward_backward(self.model, tokens, targets, doc_ids, self.autocast,
                                                       self.t.grad_clip, stage.micro_batches)
        if math.isfinite(loss_v) and math.isfinite(gnorm):
            optimizer_step(self.model, self.opt, pd.world_group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        return out, loss_v, ce_v, gnorm, n_tok, time.perf_counter() - ts

    def _stop_requested(self, stop: StopFlag, stop_after: int | None, steps_this_session: int) -> bool:
        # a signal seen by any rank stops every rank at the same step
        flag = torch.tensor([float(stop.signum is not None)], device=self.device)
        stop_now = bool(self.pd.all_reduce(flag, dist.ReduceOp.MAX).item())
        return stop_now or (stop_after is not None and steps_this_session >= stop_after)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, stop: StopFlag, stop_after: int | None) -> dict:
        t, st, spec = self.t, self.st, self.spec
        self.model.train()
        if self.main:
            self.progress = StepProgress(t.steps, start_step=st.step)
        if not self.resumed and t.eval_every and t.eval_at_start:  # the untrained model: where learning curves start
            self.emit({"step": 0, **self.eval_now(self.stages[0].seq_len)})
        steps_this_session = 0
        interval_tokens, interval_s = 0, 0.0
        window = deque(st.spike_history, maxlen=t.spike_window)
        cur_stage: Stage | None = None
        while st.step < t.steps:
            if self._stop_requested(stop, stop_after, steps_this_session):
                self.checkpoint(now=True)  # on disk before the signal is handed back
                log.info("interrupted at step %d (signal %s)", st.step, stop.signum)
                return {"run_id": spec.run_id, "status": "interrupted", "step": st.step, "signal": stop.signum}
            step = st.step
            stage = stage_at(self.stages, step)
            if stage != cur_stage:
                apply_q_scale(self.model, stage.q_scale)
                if cur_stage is not None:
                    log.info("context stage: seq_len %d batch %d q_scale %.4f from step %d",
                             stage.seq_len, stage.batch_size, stage.q_scale, step)
                cur_stage = stage
            mult = lr_multiplier(step, t.steps, t.lr_schedule, t.warmup_frac, t.final_lr_frac)
            set_lr(self.opt, mult, decay_fraction(step, t.steps, t.gate_router_decay_start))
            out, loss_v, ce_v, gnorm, n_tok, dt = self.train_step(stage)
            if not (math.isfinite(loss_v) and math.isfinite(gnorm)):
                what, val = ("loss", loss_v) if not math.isfinite(loss_v) else ("grad norm", gnorm)
                reason = f"diverged: non-finite {what} ({val}) at step {step}"
                log.error(reason)
                self.emit({"step": step, "loss": loss_v, "ce": ce_v, "grad_norm": gnorm,
                           "lr": self.opt.param_groups[0]["lr"]})
                return self.finish("failed", reason, step)

            fpt = self.fpt_at[stage.seq_len]
            st.tokens += n_tok
            st.train_flops += fpt * n_tok * self.t.flops_multiplier  # >1: FLOPs counted, not spent
            stats = dict(out.stats)
            st.dropped += float(stats.get("dropped", 0.0))
            st.assigned += float(stats.get("assigned", 0.0))
            st.max_grad_norm = max(st.max_grad_norm, gnorm)
            if steps_this_session > 0 or t.steps - step == 1:  # the first step of a session warms up
                st.timed_tokens += n_tok
                st.timed_flops += fpt * n_tok * self.t.flops_multiplier
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
                self.emit({"step": step, "loss": loss_v, "ce": ce_v, "lr": self.opt.param_groups[0]["lr"],
                           "lr_mult": mult, "grad_norm": gnorm, "seq_len": stage.seq_len,
                           "batch_size": stage.batch_size, "q_scale": stage.q_scale,
                           "drop_rate": (stats["dropped"] / stats["assigned"]) if stats.get("assigned") else 0.0,
                           "tokens": st.tokens, "tokens_per_s": tps,
                           "model_flops_per_s": fpt * tps if tps else None,
                           "mfu": fpt * tps / self.peak if (tps and self.peak) else None,
                           "load_cv": stats.get("load_cv"), "max_load_ratio": stats.get("max_load_ratio"),
                           "router_z": stats.get("router_z"), "aux_loss": float(out.aux_loss.detach()),
                           "z_loss": float(out.z_loss.detach()) if out.z_loss is not None else None})
                interval_tokens, interval_s = 0, 0.0
            if (t.eval_every and st.step % t.eval_every == 0) or last:
                ev = self.eval_now(stage.seq_len)
                st.last_eval = ev
                self.emit({"step": st.step, **ev})
                log.info("step %d eval macro %.4f bpb %.4f", st.step, ev["eval_macro_loss"], ev["macro_bpb"])
            # the last step's: the final weights, what `final` (a GPU run's default) keeps
            if (last and ckpt.RETENTION[self.keep_checkpoints] != 0) or (not last and self.checkpoint_due(st.step)):
                self.checkpoint()
        summary = self.finish("completed", None, None)
        if self.main:  # a completed run keeps only what its retention level says (default: its newest checkpoint)
            ckpt.prune(self.run_dir / "checkpoints", spec.run_id, ckpt.RETENTION[self.keep_checkpoints])
        log.info("done %s: eval macro %.4f", spec.run_id, summary["eval_macro_loss"])
        return summary

    # -- the summary -----------------------------------------------------------------------------

    def finish(self, status: str, error: str | None, failed_step: int | None) -> dict:
        """summary.json (rank 0 writes it; distributed: broadcast so that every rank returns it)."""
        self.commit_pending()  # the last periodic checkpoint, written in the background
        summary = None
        if self.main:
            path = self.run_dir / "summary.json"
            try:
                summary = summary_json(schema.write_summary(self.run_dir, self.summary(status, error, failed_step)))
            except OSError as e:
                if is_disk_full(e):
                    raise disk_full_error(path, e) from e
                raise
        return self.pd.broadcast_object(summary)

    def summary(self, status: str, error: str | None, failed_step: int | None) -> schema.RunSummary:
        st, hp = self.st, self.hp
        tps = st.timed_tokens / st.timed_s if st.timed_s > 0 else None
        mfps = st.timed_flops / st.timed_s if st.timed_s > 0 else None
        fpt = self.fpt_at[self.stages[0].seq_len]
        if st.tokens:  # token-weighted over context stages, so that train_flops = flops_per_token * tokens
            fpt = st.train_flops / st.tokens
        ev = st.last_eval or {}
        hardware = hardware_name(self.device) + self.pd.describe()
        return schema.RunSummary(
            run_id=self.spec.run_id, status=status, error=error, failed_step=failed_step,
            step=st.step if failed_step is None else failed_step, tokens=st.tokens,
            params_total=self.params_total, params_active=self.params_active, flops_per_token=fpt,
            train_flops=st.train_flops,
            eval_macro_loss=ev.get("eval_macro_loss"), eval_domain_loss=ev.get("eval_domain_loss"),
            macro_bpb=ev.get("macro_bpb"), final_train_loss=st.last_loss, tokens_per_s=tps,
            model_flops_per_s=mfps, mfu=mfps / self.peak if (mfps and self.peak) else None,
            drop_rate=st.dropped / st.assigned if st.assigned else 0.0, max_grad_norm=st.max_grad_norm,
            spikes=len(st.spike_steps), spike_steps=tuple(st.spike_steps),
            wall_s=st.wall_s + (time.perf_counter() - self.t0), hardware=hardware,
            code_version=code_version(), loss_curve=tuple(tuple(p) for p in self.metrics.loss_curve()),
            started_at=time.time() - (st.wall_s + (time.perf_counter() - self.t0)),
            extra={"eval_domain_bpb": ev.get("eval_domain_bpb"), "lr_peak": hp.lr, "adam_lr_peak": hp.adam_lr,
                   "optimizer": hp.level, "data": self.data.provenance, "resumed_from": self.resumed_from,
                   "checkpoints_skipped": list(self.skipped),
                   # the cost model reads threads x wall / CPU time as the load's slowdown (planning/costmodel.py)
                   "cpu_s": time.process_time() - self.cpu0, "session_wall_s": time.perf_counter() - self.t0,
                   "threads": torch.get_num_threads(), "micro_batches": self.t.micro_batches,
                   "code_versions": [v for v, _ in st.code_versions] or [code_version()]},
        )


def check_train(spec: RunSpec, stop_after: int | None = None, log_to: tuple[str, ...] = (),
                keep_checkpoints: str = "final") -> tuple[TrainConfig, torch.device, list[Stage], int]:
    """Everything `train` refuses before it touches the run directory: the spec (`check_spec`), `stop_after`,
    the metric sinks, the retention level and the launch (`check_launch`). Returns (the effective train
    config, the device, the context stages, the world size)."""
    t, device, stages = check_spec(spec)
    if stop_after is not None and stop_after < 1:
        raise ValueError(f"stop_after={stop_after} must be >= 1")
    check_log_to(tuple(log_to))
    if keep_checkpoints not in ckpt.RETENTION:
        raise ValueError(f"keep_checkpoints={keep_checkpoints!r} is not a known level; allowed values: "
                         f"{', '.join(map(repr, ckpt.RETENTION))}")
    return t, device, stages, check_launch(spec, stages)


def _note_failed_hand_back(run_dir: Path | None, signum: int, err: Exception) -> None:
    line = (f"the handler {signal.Signals(signum).name} was handed back to raised {type(err).__name__}: {err}; "
            "the run stays as it stopped (a checkpoint on disk, resumable)")
    log.warning(line)
    if run_dir is not None:  # train's own log handler is closed by now
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(run_dir / "train.log", "a") as f:
            f.write(f"{stamp} WARNING {line}\n")


def train(spec: RunSpec, run_dir: str | Path, *, resume: bool = True, stop_after: int | None = None,
          log_to: tuple[str, ...] = (), keep_checkpoints: str = "final") -> dict:
    """Train `spec` into `run_dir`; returns the summary (also summary.json), or
    {"status": "interrupted", ...} when stopped by a signal or `stop_after` (a checkpoint is written).
    Launched with a world size > 1 every rank calls this; all return the summary. `keep_checkpoints`
    (ckpt.RETENTION): "final" keeps a completed run's newest checkpoint only, "all" never prunes."""
    t0 = time.perf_counter()
    t, device, stages, world = check_train(spec, stop_after, log_to, keep_checkpoints)
    run_dir = Path(run_dir)
    done = claim_dir(run_dir, spec, resume)
    if done is not None:
        return done
    pd, device = parallel_dims(spec, world, device)
    main = pd.main
    if main:
        for p in remove_stale_temps(run_dir, run_dir / "checkpoints"):
            log.info("removed a temporary file left by a killed writer: %s", p.name)

    handler = logging.FileHandler(run_dir / "train.log") if main else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    stop = StopFlag()
    trainer: Trainer | None = None
    try:
        # one thread unless told (TrainConfig.threads, a SLURM task's CPUs, a local worker's OMP_NUM_THREADS):
        # torch's default takes every core, and workers sharing a machine then slow each other down
        # (docs/architecture.md §5)
        env = os.environ
        torch.set_num_threads(int(t.threads) if t.threads is not None else
                              int(env.get("SLURM_CPUS_PER_TASK") or env.get("OMP_NUM_THREADS") or 1))
        trainer = Trainer(spec, run_dir, stages, device, pd, t0, keep_checkpoints)
        trainer.begin(resume, log_to)
        stop.install()
        return trainer.run(stop, stop_after)
    finally:
        if trainer is not None and trainer.pending is not None:  # failed mid-run: no collective commit
            ckpt.abandon(trainer.pending)
        prev_handler = stop.hand_back()
        stop.restore()
        for part in (trainer.sinks, trainer.progress) if trainer is not None else ():
            if part is not None:
                part.close()
        log.removeHandler(handler)
        handler.close()
        pd.close()
        if prev_handler is not None:
            # A caller installed a handler before us (submitit's USR2 requeues the job; a local
            # worker's TERM stops it taking the next run): hand the signal back. Our checkpoint is
            # on disk, or the run completed because the signal came during its last step.
            try:
                os.kill(os.getpid(), stop.signum)  # the handler runs inside this call (CPython checks at once)
            except Exception as e:  # noqa: BLE001 - SystemExit (submitit's exit after a requeue) passes
                # A handler that fails leaves the run as train left it: interrupted with its checkpoint (or
                # completed), never failed. Seen: submitit's `scontrol requeue` killed by the SIGTERM of the
                # very requeue it asked for, on a loaded node; SLURM starts the job again and it resumes.
                _note_failed_hand_back(run_dir if main else None, stop.signum, e)
