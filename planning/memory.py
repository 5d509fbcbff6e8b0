"""Activation memory of one rank: measured under fake tensors, fitted over depth and layer kind, and
checked against a real CPU run (docs/hero.md "Memory"). `activation_peak` is the maximum over time of
activations + temporaries (MemTracker's ACT and TEMP) of a forward + backward: read where *total* memory
peaks instead, the weights and gradients move the snapshot late into the backward and it under-reports.
`fit_activations` fits base + n_local a_local + n_global a_global (local and global blocks keep different
bytes); `measured_step_peak` is the CPU allocator's report it is checked against; a kernel the CPU cannot
run under fake tensors is measured as its footprint (`substitutions` names them).
Precedent: torchtitan scripts/estimate/estimation.py (FakeTensorMode + FSDPMemTracker)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from marin_ablate.marin import model as mmodel
from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.hparams import resolve_hparams
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.update_rules import build_optimizer

#: Largest residual of the depth fit, as a fraction of one layer's kept bytes, before the dry run
#: refuses to extrapolate (a residual of a whole layer would make the 48-layer figure meaningless).
LINEARITY_TOL = 0.10


class ActivationTracker(MemTracker):
    """torch's MemTracker that also keeps `act_peak`: the maximum over time of ACT + TEMP bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.act_peak = 0

    def _update_peak_stats(self, peak_state) -> None:  # after every dispatched op; no per-module peaks
        for snap in self._curr_mem_snap.values():
            now = sum(v for k, v in snap.items() if str(k).endswith(("ACT", "TEMP")))
            self.act_peak = max(self.act_peak, now)


class _GroupedMMFootprint(torch.autograd.Function):
    """fp32 torch._grouped_mm under fake tensors (its meta kernel takes bf16 only; the CPU op runs
    fp32): the real op's footprint, its output and what its derivative saves (both operands)."""

    @staticmethod
    def forward(ctx, x_NI, w_EIO, offs=None):
        ctx.save_for_backward(x_NI, w_EIO)
        return x_NI.new_empty(x_NI.shape[0], w_EIO.shape[-1])

    @staticmethod
    def backward(ctx, g_NO):
        x, w = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w), None


def _grouped_mm_fp32(x_NI, w_EIO, offs=None, **kw):
    return _GroupedMMFootprint.apply(x_NI, w_EIO, offs)


class _FlexFootprint(torch.autograd.Function):
    """flex_attention's memory with no values: what its fused kernel keeps for the backward (torch
    torch/_higher_order_ops/flex_attention.py FlexAttentionAutogradOp: query, key, value, out and the
    fp32 logsumexp) and allocates in it (dq, dk, dv, the fp32 row term). flex has no CPU backward, so
    under fake tensors on CPU the attention of a flex model is this shape-exact stand-in."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, _, lse = ctx.saved_tensors
        delta = torch.empty_like(lse)  # noqa: F841 - counted while alive, as the kernel's
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _flex_block_masks(doc_ids_BS, B: int, S: int, window: int, device):
    """The BlockMask tensors of one (local, global) pair (int32 block counts and indices, both
    directions, partial and full blocks of 128), allocated, not computed."""
    nb = -(-S // 128)
    return tuple(tuple(torch.empty(shape, dtype=torch.int32, device=device)
                       for shape in ((B, 1, nb), (B, 1, nb, nb)) * 4) for _ in range(2))


def uses_flex_footprint(spec: RunSpec) -> bool:
    """Whether the dry run stands `_FlexFootprint` in for flex attention: only for a configuration that
    runs flex compiled (the fused kernel's footprint); eager flex is refused by RunSpec."""
    if spec.model.attention != "flex":
        return False
    if not spec.train.compile:
        raise ValueError("ModelConfig.attention='flex' without TrainConfig.compile=True runs torch's unfused "
                         "flex (S x S scores): the dry run cannot model it; allowed values: compile=True or 'sdpa'")
    return True


def substitutions(spec: RunSpec) -> list[str]:
    """What the CPU measurement runs in place of a GPU kernel, for the table."""
    out = []
    if uses_flex_footprint(spec):
        out.append("flex attention (compiled): the fused kernel's saved tensors and its backward's buffers "
                   "(_FlexFootprint), not run")
    if spec.train.precision != "bf16":
        out.append("fp32 grouped GEMM: its output and saved operands (_GroupedMMFootprint), not run")
    if spec.model.kernels == "triton":
        out.append("kernels='triton': torch's ops of the same functions measured in their place")
    return out


def activation_peak(spec: RunSpec, layers: int, seqs: int, global_every: int | None = None) -> int:
    """Max over time of activations + temporaries (bytes) of one rank's forward + backward at full width,
    `layers` layers (and `global_every`, default the model's), at the run's precision: bf16 autocast and
    bf16 weights (as FSDP2 gathers them) under mixed precision, fp32 otherwise."""
    from unittest import mock

    from torch._subclasses.fake_tensor import FakeTensorMode

    # Triton kernels need CUDA tensors: torch's ops stand in (substitutions() names it in the table)
    cfg = dataclasses.replace(spec.model, n_layers=layers, global_every=global_every or spec.model.global_every,
                              kernels="torch")
    flex = uses_flex_footprint(spec)
    bf16 = spec.train.precision == "bf16"
    with torch.device("meta"):
        model = mmodel.MarinModel(cfg, spec.recipe, activation_checkpoint=spec.train.activation_checkpoint,
                                  loss_chunk_tokens=spec.train.loss_chunk_tokens)
        if spec.train.mixed_precision == "bf16":
            model = model.to(torch.bfloat16)
    patches = contextlib.ExitStack()
    if flex:
        patches.enter_context(mock.patch.object(mmodel, "flex_attention",
                                                lambda q, k, v, **kw: _FlexFootprint.apply(q, k, v)))
        patches.enter_context(mock.patch.object(mmodel, "block_masks", _flex_block_masks))
    if not bf16:
        patches.enter_context(mock.patch.object(torch, "_grouped_mm", _grouped_mm_fp32))
    with FakeTensorMode(allow_non_fake_inputs=True), patches:
        model = model.to_empty(device="cpu").train()
        tok = torch.zeros(seqs, cfg.seq_len, dtype=torch.long)
        mt = ActivationTracker()
        mt.track_external(model)
        with mt:
            # no autocast cache: a cached bf16 copy of every weight is a one-process artefact
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False) if bf16 else contextlib.nullcontext():
                out = model(tok, torch.zeros_like(tok), tok)
            out.loss.backward()
    return mt.act_peak


def layer_kinds(n_layers: int, global_every: int) -> tuple[int, int]:
    """(local, global) block counts of a model (marin.config.ModelConfig.is_global)."""
    g = sum(1 for i in range(n_layers) if (i + 1) % global_every == 0 or i == n_layers - 1)
    return n_layers - g, g


#: Depths the fit measures: from 2 layers, where the peak sits in the backward of the last (global)
#: block with every earlier block's input kept (at 1 layer it sits elsewhere and bends the slope).
FIT_DEPTHS = (2, 3, 4)


def fit_points(global_every: int, depths: tuple[int, ...] = FIT_DEPTHS) -> list[tuple[int, int]]:
    """(layers, global_every) of the measured depths: `depths` layers of the model's own pattern, and
    an all-global model of the middle depth when the model has local layers (the slopes separate)."""
    pts = [(n, global_every) for n in depths]
    return pts + [(depths[len(depths) // 2], 1)] if global_every > 1 else pts


def fit_activations(spec: RunSpec, seqs: int, measure=activation_peak, depths: tuple[int, ...] = FIT_DEPTHS) -> dict:
    """Fit peak = base + n_local a_local + n_global a_global over `fit_points` (least squares), check
    linearity (every point within LINEARITY_TOL of the fit), extrapolate to the model's depth."""
    import numpy as np

    m = spec.model
    pts = fit_points(m.global_every, depths)
    kinds = [layer_kinds(n, g) for n, g in pts]
    peaks = [float(measure(spec, n, seqs, g)) for n, g in pts]
    has_local = m.global_every > 1
    X = np.array([[1.0, nl, ng] if has_local else [1.0, ng] for nl, ng in kinds])
    coef, *_ = np.linalg.lstsq(X, np.array(peaks), rcond=None)
    fitted = X @ coef
    slopes = [c for c in coef[1:] if c > 0]
    if not slopes:
        raise RuntimeError(f"activation peaks {peaks} do not grow with depth: nothing to extrapolate")
    resid = max(abs(f - p) for f, p in zip(fitted, peaks, strict=True)) / min(slopes)
    if resid > LINEARITY_TOL:
        raise RuntimeError(f"activation peaks "
                           f"{[(pt, round(p / 2**30, 3)) for pt, p in zip(pts, peaks, strict=True)]} (layers, "
                           f"global_every -> GiB) are not linear in the layer counts (residual {resid:.0%} of a "
                           f"layer > {LINEARITY_TOL:.0%}): the depth extrapolation would not hold")
    base, a_local, a_global = (coef[0], coef[1], coef[2]) if has_local else (coef[0], 0.0, coef[1])
    n_local, n_global = layer_kinds(m.n_layers, m.global_every)
    return {"base": float(base), "per_local": float(a_local), "per_global": float(a_global),
            "n_local": n_local, "n_global": n_global, "points": pts, "peaks": peaks, "residual": float(resid),
            "peak": float(base + n_local * a_local + n_global * a_global)}


def measured_step_peak(spec: RunSpec, steps: int = 2) -> dict:
    """A real CPU training step of `spec` (one process, the real model and optimizer, random tokens):
    the peak bytes of tensor storage during the last step, from the CPU allocator's own allocation and
    free events (torch.profiler profile_memory), plus what was live when the step began (parameters,
    optimizer state; gradients set to None)."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    m = spec.model
    model = MarinModel(m, spec.recipe, activation_checkpoint=spec.train.activation_checkpoint,
                       loss_chunk_tokens=spec.train.loss_chunk_tokens).train()
    opt = build_optimizer(model, resolve_hparams(spec))
    B = spec.train.batch_size
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        tok = torch.randint(0, m.vocab_size, (B, m.seq_len), generator=g)
        docs = torch.zeros_like(tok)
        opt.zero_grad(set_to_none=True)
        last = i == steps - 1
        with (profile(activities=[ProfilerActivity.CPU], profile_memory=True) if last
              else contextlib.nullcontext()) as prof:
            model(tok, docs, tok).loss.backward()
            opt.step()
        if last:
            live = _storage_bytes(list(model.parameters()) + [t for s in opt.state.values() for t in s.values()
                                                              if isinstance(t, torch.Tensor)])
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    peak = max([0, *itertools.accumulate(e.nbytes() for e in events)])  # the running total's highest point
    return {"peak": live + peak, "live_at_start": live, "step_peak": peak}


def _storage_bytes(ts: list[torch.Tensor]) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}.values())  # each once
