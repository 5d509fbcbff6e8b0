"""The marin-ablate transformer: one PyTorch model in which every Marin 535B-A23B recipe switch
(docs/method.md §2) is a visible branch in a forward().

Layout (Marin experiments/grug/moe_hero_ep/model.py Transformer): token embedding -> RMSNorm ->
GatedNorm -> n_layers x [pre-RMSNorm -> GatedNorm -> attention, pre-RMSNorm -> GatedNorm -> MoE] ->
final RMSNorm -> GatedNorm -> untied lm_head. Loss = token-mean CE + z-loss (1e-4·lse²) + Switch aux loss
(when that level is on).

Memory (training only, neither changes a number): `activation_checkpoint="block"` keeps each block's
input and recomputes the block in the backward; `loss_chunk_tokens > 0` computes lm_head + fp32 CE +
z-loss in checkpointed chunks of that many tokens, so the (tokens x vocab) logits never exist in full.

Fixed architecture (the hero's, docs/method.md §2 "Everything else", each with a ModelConfig field; causal
attention never crosses a packed document): none of it depends on the recipe.

Shape suffixes: B batch, S sequence, D model width, H query heads, K kv heads (in attention),
h head dim, V vocab, R rotated dims / 2, C channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint

from marin_ablate.marin.config import ACTIVATION_CHECKPOINTS, ModelConfig, Recipe
from marin_ablate.marin.kernels import get_kernels
from marin_ablate.marin.moe import (
    ROUTER_STATS,
    MoE,
    RMSNorm,
    RoutePin,
    Router,
    expert_load,
    select_experts,
    step_router_stats,
)

# Order of ModelOutput.stats_t: router statistics averaged over layers, then the worst layer's load.
MODEL_STATS = (*ROUTER_STATS, "max_load_ratio_worst", "dropped", "dispatch_bytes")


@dataclass
class ModelOutput:
    logits_BSV: Tensor | None  # None when the loss was computed in chunks (loss_chunk_tokens > 0)
    loss: Tensor | None  # ce + z_loss + aux_loss (when targets given)
    ce_loss: Tensor | None  # token-mean NLL
    z_loss: Tensor | None
    aux_loss: Tensor  # Switch aux, summed over layers (0 for other balance levels)
    stats_t: Tensor  # MODEL_STATS, on the device: forward never waits for the GPU to read them
    assigned: int  # routed assignments (T·K summed over layers)

    @cached_property
    def stats(self) -> dict[str, float]:
        """Router and dispatch statistics as floats (one device sync, on first access)."""
        return model_stats(self.stats_t, self.assigned)


def model_stats(stats_t: Tensor, assigned: int) -> dict[str, float]:
    """MODEL_STATS of a forward (or of a step's routing, StepRoutes.stats_t) as the loop logs them."""
    vals = dict(zip(MODEL_STATS, stats_t.tolist(), strict=True))
    stats = {k: vals[k] for k in ROUTER_STATS}
    stats["max_load_ratio"] = vals["max_load_ratio_worst"]
    stats.update(assigned=float(assigned), dropped=vals["dropped"],
                 drop_rate=vals["dropped"] / max(assigned, 1), dispatch_bytes=vals["dispatch_bytes"])
    return stats


# ---- Small pieces --------------------------------------------------------------------------------


def rms_norm(x: Tensor, eps: float) -> Tensor:
    """Parameter-free RMSNorm over the last dim (accumulates in fp32 for bf16 inputs)."""
    return F.rms_norm(x, (x.shape[-1],), None, eps)


class GatedNorm(nn.Module):
    """Learned per-dimension gate after RMSNorm: y ⊙ σ(silu(y·W_down)·W_up) (arXiv 2601.22966;
    Marin model.py GatedNorm). Both matrices take the model's truncated-normal init."""

    def __init__(self, d_model: int, rank: int):
        super().__init__()
        self.w_down = nn.Linear(d_model, rank, bias=False)
        self.w_up = nn.Linear(rank, d_model, bias=False)

    def forward(self, y: Tensor) -> Tensor:
        return y * torch.sigmoid(self.w_up(F.silu(self.w_down(y))))


class ShortConv(nn.Module):
    """Depthwise causal conv of kernel K over C channels, identity at init (w[0]=1, others 0)."""

    def __init__(self, channels: int, kernel: int, backend: str):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(kernel, channels))  # w_KC
        with torch.no_grad():
            self.weight[0] = 1.0
        self.sconv = get_kernels(backend).sconv

    def forward(self, x_BSC: Tensor, doc_ids_BS: Tensor | None) -> Tensor:
        return self.sconv(x_BSC, self.weight.to(x_BSC.dtype), doc_ids_BS)


def rope_tables(seq_len: int, rot_dims: int, theta: float, device) -> tuple[Tensor, Tensor]:
    """cos_SR, sin_SR for the `rot_dims` rotated dims (R = rot_dims/2 frequencies)."""
    inv_freq_R = theta ** (-torch.arange(0, rot_dims, 2, device=device, dtype=torch.float32) / rot_dims)
    ang_SR = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv_freq_R
    return ang_SR.cos(), ang_SR.sin()


def apply_rope(x_BHSh: Tensor, cos_SR: Tensor, sin_SR: Tensor) -> Tensor:
    """Rotate the first 2R dims of each head (half-RoPE: the rest pass through untouched)."""
    R = cos_SR.shape[-1]
    x1, x2, rest = x_BHSh[..., :R].float(), x_BHSh[..., R:2 * R].float(), x_BHSh[..., 2 * R:]
    out = torch.cat([x1 * cos_SR - x2 * sin_SR, x2 * cos_SR + x1 * sin_SR], -1).to(x_BHSh.dtype)
    return torch.cat([out, rest], -1)


def attention_masks(doc_ids_BS: Tensor | None, B: int, S: int, window: int, device) -> tuple[Tensor, Tensor]:
    """(local_B1SS, global_B1SS) boolean masks, True = may attend: causal, same document, and for
    local layers within the last `window` positions (self included)."""
    q_S1 = torch.arange(S, device=device)[:, None]
    k_1S = torch.arange(S, device=device)[None, :]
    causal_SS = k_1S <= q_S1
    local_SS = causal_SS & (q_S1 - k_1S < window)
    if doc_ids_BS is None:
        return local_SS.expand(B, 1, S, S), causal_SS.expand(B, 1, S, S)
    same_B1SS = (doc_ids_BS[:, :, None] == doc_ids_BS[:, None, :]).unsqueeze(1)
    return same_B1SS & local_SS, same_B1SS & causal_SS


def block_masks(doc_ids_BS: Tensor | None, B: int, S: int, window: int, device) -> tuple[BlockMask, BlockMask]:
    """(local, global) flex_attention BlockMasks with the rule of `attention_masks`: causal, same
    document, and for local layers within the last `window` positions (self included). Blocks of
    128×128 (S need not be a multiple: flex pads); fully masked blocks are skipped."""

    def global_mod(b, h, q_idx, kv_idx):
        keep = kv_idx <= q_idx
        if doc_ids_BS is not None:
            keep = keep & (doc_ids_BS[b, q_idx] == doc_ids_BS[b, kv_idx])
        return keep

    def local_mod(b, h, q_idx, kv_idx):
        return global_mod(b, h, q_idx, kv_idx) & (q_idx - kv_idx < window)

    Bm = None if doc_ids_BS is None else B  # without documents one mask broadcasts over the batch
    return (create_block_mask(local_mod, Bm, None, S, S, device=device),
            create_block_mask(global_mod, Bm, None, S, S, device=device))


@dataclass
class ForwardContext:
    """What every layer needs, built once per forward. The masks are those of cfg.attention: dense
    (B, 1, S, S) boolean masks for "sdpa", BlockMasks for "flex"."""

    doc_ids_BS: Tensor | None
    mask_local: Tensor | BlockMask
    mask_global: Tensor | BlockMask
    cos_SR: Tensor
    sin_SR: Tensor
    q_scale: float  # context-extension multiplier on q (1 + c·ln(L/L0), TrainConfig.context_q_rule; 1.0 at L0)
    routes: tuple[RoutePin, ...] | None = None  # per layer: a micro-batch's share of its step's routing


# ---- Attention -----------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, recipe: Recipe, layer: int):
        super().__init__()
        self.cfg, self.recipe = cfg, recipe
        self.is_global = cfg.is_global(layer)
        self.H, self.Hkv, self.h = cfg.n_heads, cfg.kv_heads(layer), cfg.head_dim
        # W_k, W_v project to the stored heads (kv_layout "stored": max(local, global) in every layer,
        # as Marin's hero); a layer that uses fewer takes the first Hkv of them
        D, qd, kvd = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.kv_heads_stored(layer) * cfg.head_dim
        self.wq = nn.Linear(D, qd, bias=False)
        self.wk = nn.Linear(D, kvd, bias=False)
        self.wv = nn.Linear(D, kvd, bias=False)
        self.wo = nn.Linear(qd, D, bias=False)
        if cfg.attn_gate:
            self.gate = nn.Linear(D, self.H, bias=False)  # W_g, zero-init: gate = 1 at init
        if recipe.qk_norm == "learned_gain":
            self.q_norm = RMSNorm(self.h, cfg.norm_eps)
            self.k_norm = RMSNorm(self.h, cfg.norm_eps)
        sites = cfg.sconv_sites if recipe.sconv == "short_conv" else ()
        self.sconv = nn.ModuleDict()
        for site, ch in (("k", kvd), ("v", kvd), ("attn_out", D)):
            if site in sites:
                self.sconv[site] = ShortConv(ch, cfg.sconv_kernel, cfg.kernels)
        self.kernels = get_kernels(cfg.kernels)

    def project_qkv(self, x_BSD: Tensor, ctx: ForwardContext) -> tuple[Tensor, Tensor, Tensor]:
        """q_BHSh, k_BKSh (normed, rotated, scaled as the attention sees them) and v_BKSh."""
        B, S, _ = x_BSD.shape
        q, k, v = self.wq(x_BSD), self.wk(x_BSD), self.wv(x_BSD)
        if self.recipe.sconv == "short_conv" and "k" in self.sconv:  # after W_k, before q/k norm and RoPE
            k = self.sconv["k"](k, ctx.doc_ids_BS)
        if self.recipe.sconv == "short_conv" and "v" in self.sconv:  # optional site
            v = self.sconv["v"](v, ctx.doc_ids_BS)
        if k.shape[-1] != self.Hkv * self.h:  # stored heads beyond the ones this layer uses
            k, v = k[..., :self.Hkv * self.h], v[..., :self.Hkv * self.h]
        q = q.view(B, S, self.H, self.h).transpose(1, 2)
        k = k.view(B, S, self.Hkv, self.h).transpose(1, 2)
        v = v.view(B, S, self.Hkv, self.h).transpose(1, 2)

        if self.recipe.qk_norm == "fixed_1.3":
            q, k = rms_norm(q, 1e-6), rms_norm(k, 1e-6)
        elif self.recipe.qk_norm == "learned_gain":
            q, k = self.q_norm(q), self.k_norm(k)
        # qk_norm == "none": q and k as projected

        if not self.is_global:  # local layers: half-RoPE; global layers are NoPE
            q, k = apply_rope(q, ctx.cos_SR, ctx.sin_SR), apply_rope(k, ctx.cos_SR, ctx.sin_SR)

        q_mult = ctx.q_scale * (self.cfg.qk_mult if self.recipe.qk_norm == "fixed_1.3" else 1.0)
        if q_mult != 1.0:
            q = q * q_mult
        return q, k, v

    def attention_logits(self, x_BSD: Tensor, ctx: ForwardContext) -> Tensor:
        """Pre-mask attention logits q·kᵀ/√h (B, H, S, S): the quantity qk_norm bounds."""
        q, k, _ = self.project_qkv(x_BSD, ctx)
        k = k.repeat_interleave(self.H // self.Hkv, dim=1)
        return q.float() @ k.float().transpose(-1, -2) / math.sqrt(self.h)

    def forward(self, x_BSD: Tensor, ctx: ForwardContext) -> Tensor:
        B, S, _ = x_BSD.shape
        q, k, v = self.project_qkv(x_BSD, ctx)
        mask = ctx.mask_global if self.is_global else ctx.mask_local
        if self.cfg.attention == "flex":  # block-sparse masks, native GQA
            # Called plainly (not torch.compile(flex_attention)): inside the trainer's compiled block it
            # becomes a fused flex kernel; a separately compiled flex would graph-break there.
            # Autocast casts SDPA's inputs to one dtype but not flex's in every torch version: cast here.
            q, k = q.to(v.dtype), k.to(v.dtype)
            y = flex_attention(q, k, v, block_mask=mask, scale=1.0 / math.sqrt(self.h), enable_gqa=True)
        else:
            rep = self.H // self.Hkv
            # Explicit GQA expansion: SDPA's enable_gqa falls back to the math kernel when a mask is given.
            k_rep = k.repeat_interleave(rep, dim=1) if rep > 1 else k
            v_rep = v.repeat_interleave(rep, dim=1) if rep > 1 else v
            y = F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask, scale=1.0 / math.sqrt(self.h))

        gate_BSH = self.gate(x_BSD) if self.cfg.attn_gate else None  # headwise gate 2σ(x·W_g)
        if self.recipe.xsa == "xsa":  # remove the component along the token's own value vector
            y = self.kernels.xsa(y, v) if gate_BSH is None else self.kernels.xsa_gate(y, v, gate_BSH)
        elif gate_BSH is not None:
            y = y * (2.0 * torch.sigmoid(gate_BSH.float())).transpose(1, 2).unsqueeze(-1).to(y.dtype)

        out = self.wo(y.transpose(1, 2).reshape(B, S, self.H * self.h))
        if self.recipe.sconv == "short_conv" and "attn_out" in self.sconv:  # on the branch after W_o
            out = self.sconv["attn_out"](out, ctx.doc_ids_BS)
        return out


# ---- Block and model -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, recipe: Recipe, layer: int):
        super().__init__()
        self.cfg, self.recipe, self.layer = cfg, recipe, layer
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, recipe, layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.moe = MoE(cfg, recipe)
        if cfg.gated_norm == "on":
            self.attn_gated_norm = GatedNorm(cfg.d_model, cfg.gated_norm_width)
            self.mlp_gated_norm = GatedNorm(cfg.d_model, cfg.gated_norm_width)
        if recipe.sconv == "short_conv" and "mlp_out" in cfg.sconv_sites:
            self.sconv_mlp_out = ShortConv(cfg.d_model, cfg.sconv_kernel, cfg.kernels)

    def attend(self, x_BSD: Tensor, ctx: ForwardContext) -> Tensor:
        """The attention half: x + attention(norms(x))."""
        a = self.attn_norm(x_BSD)
        if self.cfg.gated_norm == "on":
            a = self.attn_gated_norm(a)
        return x_BSD + self.attn(a, ctx)

    def mlp_input(self, x_BSD: Tensor) -> Tensor:
        m = self.mlp_norm(x_BSD)
        return self.mlp_gated_norm(m) if self.cfg.gated_norm == "on" else m

    def mix(self, x_BSD: Tensor, ctx: ForwardContext, pin: RoutePin | None = None):
        """The MoE half: x + MoE(norms(x)) (SConv mlp_out before the residual add)."""
        moe = self.moe(self.mlp_input(x_BSD), pin)
        y = moe.y_BSD
        if self.recipe.sconv == "short_conv" and "mlp_out" in self.cfg.sconv_sites:
            y = self.sconv_mlp_out(y, ctx.doc_ids_BS)  # SConv site mlp_out: before the residual add
        # the rows are in the residual sum; the block (an FSDP2 unit) returns no view of them
        return x_BSD + y, replace(moe, y_TD=None)

    def forward(self, x_BSD: Tensor, ctx: ForwardContext, stage: str = "full", pin: RoutePin | None = None):
        """The block; a routing pass (`MarinModel.plan_routes`) calls its halves one at a time, through this
        call so that FSDP2's hooks gather the block and a compiled block compiles them: stage "route" returns
        (h_BSD, expert_idx_TK, logits_TE) of the attention half and the router, "mix" the MoE half of h_BSD
        with `pin`'s routing."""
        if stage == "route":
            h = self.attend(x_BSD, ctx)
            m = self.mlp_input(h)
            r = self.moe.router(m.reshape(-1, m.shape[-1]))
            return h, r.expert_idx_TK, r.logits_TE
        if stage == "mix":
            return self.mix(x_BSD, ctx, pin)[0]
        return self.mix(self.attend(x_BSD, ctx), ctx, ctx.routes[self.layer] if ctx.routes is not None else None)


@dataclass
class LayerRoutes:
    """One layer's routing of a whole step (`MarinModel.plan_routes`): each micro-batch's pin, the step's router
    statistics (ROUTER_STATS), its dropped assignments and the bytes its dispatch moves across shards."""

    pins: tuple[RoutePin, ...]
    stats_R: Tensor
    dropped: Tensor
    bytes_moved: Tensor | int


@dataclass
class StepRoutes:
    """A step's routing (`MarinModel.forward(..., plan=True)`): `pins[j]` holds micro-batch j's RoutePin of
    every layer (ForwardContext.routes), `stats_t` the step's MODEL_STATS."""

    pins: list[tuple[RoutePin, ...]]
    stats_t: Tensor


def checkpointed_block(block: Block, x_BSD: Tensor, ctx: ForwardContext):
    """Block forward under a non-reentrant activation checkpoint (torch.utils.checkpoint): only x_BSD
    is kept; the backward reruns the block. The rerun must not record the router's balancing
    statistics a second time (QB/aux-free see each training forward once), so the router is put in
    eval mode for it: Router.training gates only that recording, the routing itself is unchanged."""
    calls = 0

    def run(x: Tensor):
        nonlocal calls
        calls += 1
        if calls == 1:
            return block(x, ctx)
        router = block.moe.router
        was = router.training
        router.training, router.recomputing = False, True
        try:
            return block(x, ctx)
        finally:
            router.training, router.recomputing = was, False

    return checkpoint(run, x_BSD, use_reentrant=False)


def lm_loss_sums(lm_head: nn.Module, h_ND: Tensor, targets_N: Tensor) -> Tensor:
    """[Σ CE, Σ lse²] over the valid targets of one chunk, from fp32 logits (Marin: CE + z-loss on
    fp32 logits). Ignored targets (-100) add nothing to either sum."""
    logits_NV = lm_head(h_ND).float()
    valid_N = targets_N != -100
    ce = F.cross_entropy(logits_NV, targets_N, ignore_index=-100, reduction="sum")
    z = (torch.logsumexp(logits_NV, -1).pow(2) * valid_N).sum()
    return torch.stack([ce, z])


class MarinModel(nn.Module):
    def __init__(self, cfg: ModelConfig, recipe: Recipe, *, activation_checkpoint: str = "none",
                 loss_chunk_tokens: int = 0):
        super().__init__()
        if activation_checkpoint not in ACTIVATION_CHECKPOINTS:
            raise ValueError(f"TrainConfig.activation_checkpoint={activation_checkpoint!r}; allowed values: "
                             f"{', '.join(ACTIVATION_CHECKPOINTS)}")
        if not (isinstance(loss_chunk_tokens, int) and loss_chunk_tokens >= 0):
            raise ValueError(f"TrainConfig.loss_chunk_tokens={loss_chunk_tokens!r}; allowed values: an integer >= 0")
        self.cfg, self.recipe = cfg, recipe
        self.activation_checkpoint, self.loss_chunk_tokens = activation_checkpoint, loss_chunk_tokens
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # The embedding norm fixes the residual stream's input scale whatever the optimizer arm does to
        # the embedding table (AdamW decays it; Adam does not).
        self.embed_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.blocks = nn.ModuleList(Block(cfg, recipe, i) for i in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if cfg.gated_norm == "on":
            self.embed_gated_norm = GatedNorm(cfg.d_model, cfg.gated_norm_width)
            self.final_gated_norm = GatedNorm(cfg.d_model, cfg.gated_norm_width)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rot_dims = int(cfg.head_dim * cfg.rope_fraction)
        # Context extension (docs/method.md §2.1): the trainer sets 1 + c·ln(L_new/L_0) at each stage.
        self.q_scale = 1.0
        self.reset_parameters()

    # ---- parameters ------------------------------------------------------------------------------
    def param_roles(self) -> dict[str, str]:
        """Parameter name -> role (the optimizer groups of docs/method.md §2.1 "Hyperball")."""
        return {f"{mname}.{pname}" if mname else pname: _role(self, mname, mod, p)
                for mname, mod in self.named_modules() for pname, p in mod.named_parameters(recurse=False)}

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.cfg.init_scale / math.sqrt(self.cfg.d_model)
        params = dict(self.named_parameters())
        for name, role in self.param_roles().items():
            p = params[name]
            if role in ("matrix", "expert", "lm_head", "embed", "router"):
                trunc_normal_init(p, std, self.cfg.init_trunc)
            elif role == "gate":
                p.zero_()
            elif role == "norm":
                p.fill_(1.0)
            elif role == "sconv":
                p.zero_()
                p[0].fill_(1.0)
        for mod in self.modules():
            if isinstance(mod, Router):
                mod.bias_E.zero_()

    # ---- forward ---------------------------------------------------------------------------------
    def context(self, tokens_BS: Tensor, doc_ids_BS: Tensor | None,
                routes: tuple[RoutePin, ...] | None = None) -> ForwardContext:
        cfg = self.cfg
        B, S = tokens_BS.shape
        dev = tokens_BS.device
        cos_SR, sin_SR = rope_tables(S, self.rot_dims, cfg.rope_theta, dev)
        if cfg.attention == "flex":  # one BlockMask per layer type (local / global)
            local_mask, global_mask = block_masks(doc_ids_BS, B, S, cfg.window, dev)
        else:  # dense (B, 1, S, S) boolean masks for SDPA
            local_mask, global_mask = attention_masks(doc_ids_BS, B, S, cfg.window, dev)
        return ForwardContext(doc_ids_BS, local_mask, global_mask, cos_SR, sin_SR, self.q_scale, routes)

    def embed_tokens(self, tokens_BS: Tensor) -> Tensor:
        x = self.embed_norm(self.embed(tokens_BS))
        return self.embed_gated_norm(x) if self.cfg.gated_norm == "on" else x

    @torch.no_grad()
    def plan_routes(self, tokens: list[Tensor], doc_ids: list[Tensor | None]) -> StepRoutes:
        """The routing of a step of micro-batches, layer by layer over all of them: route every micro-batch
        (its attention half and router), plan the drops of the step's tokens at once (the dispatcher's
        `plan`: what a one-batch step drops), then each micro-batch's MoE half with that routing pinned."""
        ctxs = [self.context(t, d) for t, d in zip(tokens, doc_ids, strict=True)]
        xs = [self.embed_tokens(t) for t in tokens]
        layers = []
        for block in self.blocks:
            g = block.moe.geometry
            router = block.moe.router
            qb_hist = router.balance == "quantile" and router.qb_estimator == "hist" and router.top_k < g.n_experts
            hs, ids, prob_sum_E, z_sum, ext = [], [], 0.0, 0.0, None
            for x, c in zip(xs, ctxs, strict=True):
                h, idx_TK, logits_TE = block(x, c, stage="route")
                hs.append(h)
                ids.append(idx_TK)
                prob_sum_E = prob_sum_E + torch.softmax(logits_TE, -1).sum(0)
                z_sum = z_sum + torch.logsumexp(logits_TE, -1).pow(2).sum()
                if qb_hist:  # the range of the step's QB margins (Router._record bins each micro-batch's in it)
                    m_TE = logits_TE - select_experts(logits_TE, router.bias_E, router.top_k)[1][:, None]
                    e = torch.stack([-m_TE.min(), m_TE.max()])
                    ext = e if ext is None else torch.maximum(ext, e)
            if ext is not None and router.stat_group is not None:
                dist.all_reduce(ext, op=dist.ReduceOp.MAX, group=router.stat_group)
            ids_TK = torch.cat(ids)
            T = ids_TK.shape[0]
            # rows carry the experts' input: the latent projection's output, in the autocast dtype when on
            dev = hs[0].device.type
            item = (torch.get_autocast_dtype(dev).itemsize if g.latent and torch.is_autocast_enabled(dev)
                    else hs[0].element_size())
            keep_TK, nbytes = block.moe.dispatcher.plan(ids_TK, g.n_experts, g.width * item)
            load_E = expert_load(ids_TK, g.n_experts)
            step_load_E, step_T = block.moe.router.world_loads(load_E, T)  # the Switch statistic's: the world's
            pins, start = [], 0
            for idx_TK in ids:
                pins.append(RoutePin(idx_TK, keep_TK[start:start + idx_TK.shape[0]], step_load_E, step_T, ext))
                start += idx_TK.shape[0]
            xs = [block(h, c, stage="mix", pin=pin) for h, c, pin in zip(hs, ctxs, pins, strict=True)]
            layers.append(LayerRoutes(tuple(pins), step_router_stats(load_E, prob_sum_E, z_sum, T),
                                      (~keep_TK).sum(), nbytes))
        stats_LR = torch.stack([lr.stats_R for lr in layers]).double()
        dropped = sum(lr.dropped.double() for lr in layers)
        moved = sum(lr.bytes_moved for lr in layers)
        stats_t = torch.cat([stats_LR.mean(0), stats_LR[:, 1].max().view(1),
                             torch.stack([dropped, dropped.new_zeros(()) + moved])])
        return StepRoutes([tuple(lr.pins[j] for lr in layers) for j in range(len(tokens))], stats_t)

    def forward(self, tokens_BS, doc_ids_BS=None, targets_BS: Tensor | None = None,
                routes: tuple[RoutePin, ...] | None = None, plan: bool = False):
        """The model's outputs and losses (ModelOutput); `routes`: a micro-batch's pins (its step's routing);
        `plan` (tokens and doc ids: lists over a step's micro-batches): the step's routing instead (StepRoutes),
        through this call so that FSDP2's hooks gather what each unit holds."""
        if plan:
            return self.plan_routes(tokens_BS, doc_ids_BS)
        cfg = self.cfg
        B, S = tokens_BS.shape
        ctx = self.context(tokens_BS, doc_ids_BS, routes)
        x = self.embed_tokens(tokens_BS)
        aux_loss = x.new_zeros((), dtype=torch.float32)
        router_stats, assigned, dropped, moved = [], 0, x.new_zeros((), dtype=torch.float64), 0
        recompute = self.activation_checkpoint == "block" and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            x, moe = checkpointed_block(block, x, ctx) if recompute else block(x, ctx)
            aux_loss = aux_loss + moe.aux_loss
            router_stats.append(moe.stats_R)
            assigned, dropped, moved = (assigned + moe.dispatch.assigned, dropped + moe.dispatch.dropped,
                                        moved + moe.dispatch.bytes_moved)
        h = self.final_norm(x)
        if cfg.gated_norm == "on":
            h = self.final_gated_norm(h)

        stats_LR = torch.stack(router_stats).double()
        dispatch_2 = torch.stack([dropped, dropped.new_zeros(()) + moved])  # float64: byte counts pass 2^24
        stats_t = torch.cat([stats_LR.mean(0), stats_LR[:, 1].max().view(1), dispatch_2]).detach()

        loss = ce_loss = z_loss = None
        chunk = self.loss_chunk_tokens
        logits_BSV = self.lm_head(h) if targets_BS is None or not chunk else None
        if targets_BS is not None:
            h_ND, targets_N = h.reshape(B * S, -1), targets_BS.reshape(-1)
            if logits_BSV is not None:
                sums_2 = lm_loss_sums(nn.Identity(), logits_BSV.reshape(B * S, -1), targets_N)
            else:  # one chunk's fp32 logits at a time, forward and (recomputed) backward
                grad = torch.is_grad_enabled()
                sums_2 = sum(checkpoint(lm_loss_sums, self.lm_head, h_ND[i:i + chunk], targets_N[i:i + chunk],
                                        use_reentrant=False) if grad else
                             lm_loss_sums(self.lm_head, h_ND[i:i + chunk], targets_N[i:i + chunk])
                             for i in range(0, B * S, chunk))
            # token means over valid targets; 0 (with a graph) when a batch has none
            n_valid = (targets_N != -100).sum().clamp(min=1)
            ce_loss = sums_2[0] / n_valid
            z_loss = cfg.z_loss_weight * sums_2[1] / n_valid
            loss = ce_loss + z_loss + aux_loss
        return ModelOutput(logits_BSV, loss, ce_loss, z_loss, aux_loss, stats_t, assigned)

    def update_router_biases(self, group=None) -> None:
        """QB / aux-free: compute each router's bias from the routing of the training forwards since
        the last call; it applies from the next forward (one step late). Eval uses it too."""
        for mod in self.modules():
            if isinstance(mod, Router):
                mod.update_bias(group)


def trunc_normal_init(p: Tensor, std: float, trunc: float) -> None:
    """Normal(0, std²) truncated at ±trunc·std (Marin model.py _init_weight: std·truncated_normal(−3, 3))."""
    nn.init.trunc_normal_(p, std=std, a=-trunc * std, b=trunc * std)


def _role(model: MarinModel, mname: str, mod: nn.Module, p: nn.Parameter) -> str:
    if mod is model.embed:
        return "embed"
    if mod is model.lm_head:
        return "lm_head"
    if isinstance(mod, Router):
        return "router"
    if isinstance(mod, RMSNorm):
        return "norm"
    if isinstance(mod, ShortConv):
        return "sconv"
    if mname.endswith("attn.gate"):
        return "gate"
    if p.dim() == 3:
        return "expert"
    if p.dim() == 2:
        return "matrix"
    raise ValueError(f"parameter {mname} has no role")  # a new parameter kind must be placed in a group
