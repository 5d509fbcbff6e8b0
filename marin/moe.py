"""Mixture of experts of the Marin recipe: router and balancing, latent projections, routed and
shared SwiGLU experts (docs/method.md §2.1 "Latent MoE", "Router and Quantile Balancing").

Legend of shape suffixes:
  B batch   S sequence   T tokens (B·S)   D model width   L latent width (D / latent_ratio)
  W dispatched width (L for latent MoE, D for the standard level)   E routed experts   K top-k
  H routed-expert hidden   F shared-expert hidden   N histogram bins

The router always reads the full-width input in fp32. Its bias c_E (a buffer, never trained)
only changes WHICH experts are chosen; combine weights come from the unbiased logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from marin_ablate.marin.config import ModelConfig, Recipe
from marin_ablate.marin.dispatch import DispatchStats, ExpertWeights, LocalDispatcher
from marin_ablate.marin.kernels import get_kernels
from marin_ablate.marin.kernels.torch_ops import count_ids

# Order of the per-layer router statistics tensor (logged only, never differentiated).
ROUTER_STATS = ("load_cv", "max_load_ratio", "router_z", "switch_balance")


# ---- Pure routing functions (tested one by one) --------------------------------------------------


def select_experts(logits_TE: Tensor, bias_E: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """(expert_idx_TK, alpha_T): top-K of s + c, and the token threshold alpha = the (K+1)-th value
    of s + c (QB step 1). alpha is -inf when K == E (no (K+1)-th expert)."""
    biased_TE = logits_TE + bias_E
    E = logits_TE.shape[1]
    if top_k < E:
        vals_TK1, idx_TK1 = biased_TE.topk(top_k + 1, dim=-1)
        return idx_TK1[:, :top_k], vals_TK1[:, top_k]
    idx_TK = biased_TE.topk(top_k, dim=-1).indices
    return idx_TK, logits_TE.new_full((logits_TE.shape[0],), -math.inf)


COMBINE_EPS = 1e-9  # Marin model.py MoEMLP: combine * (2.5 / (sum + 1e-9))


def combine_weights(logits_TE: Tensor, expert_idx_TK: Tensor, scale: float) -> Tensor:
    """Sigmoid of the UNBIASED logits of the chosen experts, renormalised to sum `scale` (2.5); the
    1e-9 keeps a token whose chosen sigmoids all underflow finite (weights ~0, as in Marin)."""
    g_TK = torch.sigmoid(logits_TE.gather(1, expert_idx_TK))
    return g_TK * (scale / (g_TK.sum(-1, keepdim=True) + COMBINE_EPS))


def expert_load(expert_idx_TK: Tensor, n_experts: int) -> Tensor:
    """Assignments per expert (before any transport drop), float."""
    return count_ids(expert_idx_TK, n_experts).float()


def router_probs(logits_TE: Tensor) -> Tensor:
    """P_ie for the Switch statistic: softmax of the unbiased logits over experts, as Marin's
    load-balancing statistic (model.py MoEMLP router_probs, _routing_stats); finite for any logits."""
    return torch.softmax(logits_TE, dim=-1)


def switch_balance(logits_TE: Tensor, expert_idx_TK: Tensor) -> Tensor:
    """E·Σ_e f_e·P_e with f_e the fraction of assignments to e and P_e the mean router probability
    (Switch Transformer, arXiv 2101.03961); 1 at perfect balance. Differentiable through P."""
    T, K = expert_idx_TK.shape
    E = logits_TE.shape[1]
    f_E = expert_load(expert_idx_TK, E) / (T * K)
    P_E = router_probs(logits_TE).mean(0)
    return E * (f_E * P_E).sum()


def pinned_switch_balance(logits_TE: Tensor, load_E: Tensor, tokens: int) -> Tensor:
    """A micro-batch's share of the step's Switch statistic E·Σ_e f_e·P_e: f_e from the step's loads
    (`load_E` over its `tokens` tokens), P_e from this micro-batch's probabilities summed over its tokens and
    divided by the step's; the shares of a step's micro-batches add up to its `switch_balance`, gradient included."""
    E = logits_TE.shape[1]
    f_E = load_E / load_E.sum()  # load_E sums to T·K
    return E * (f_E * router_probs(logits_TE).sum(0)).sum() / tokens


def step_router_stats(load_E: Tensor, prob_sum_E: Tensor, z_sum: Tensor, tokens: int) -> Tensor:
    """ROUTER_STATS from sums over a step's tokens (a batch's in `Router.forward`, or an accumulated step's
    micro-batches'): loads, summed router probabilities, summed lse²."""
    mean = load_E.mean()
    f_E = load_E / load_E.sum()
    return torch.stack([load_E.std(unbiased=False) / mean, load_E.max() / mean, z_sum / tokens,
                        load_E.shape[0] * (f_E * prob_sum_E / tokens).sum()])


def qb_n_star(n_tokens: int, top_k: int, n_experts: int) -> int:
    """n* = floor(T·K/E), the assignments each expert should receive (at least 1, at most T): the
    topk estimator's rank, rounded down like Marin's (levanter grug/grug_moe.py `qb_topk_physical_count`,
    `qb_beta_topk_shard`). The hist estimator uses the unrounded T·K/E, as Marin's `_qb_beta_hist`."""
    return max(1, min(n_tokens, n_tokens * top_k // n_experts))


def qb_threshold_topk(margins_TE: Tensor, n_star: int, n_shards: int = 1) -> Tensor:
    """beta_E (QB estimator "topk"): the n*-th largest margin of each column within each of n_shards
    contiguous token shards, averaged over the shards (Marin: a per-device top_k, then pmean)."""
    m_STE = margins_TE.view(n_shards, -1, margins_TE.shape[1])
    return m_STE.topk(n_star, dim=1).values[:, -1].mean(0)


def margin_histogram(margins_TE: Tensor, lo: Tensor, hi: Tensor, bins: int) -> Tensor:
    """counts_EN: per-expert histogram of margins over `bins` equal bins spanning [lo, hi]."""
    T, E = margins_TE.shape
    width = torch.clamp((hi - lo) / bins, min=1e-12)
    bin_TE = ((margins_TE - lo) / width).floor().long().clamp_(0, bins - 1)
    flat = (torch.arange(E, device=margins_TE.device) * bins + bin_TE).reshape(-1)
    counts = torch.zeros(E * bins, device=margins_TE.device, dtype=torch.float64)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))
    return counts.view(E, bins)


def qb_threshold_hist(counts_EN: Tensor, lo: Tensor, hi: Tensor, n_star: float) -> Tensor:
    """beta_E from a margin histogram (QB estimator "hist"): find the bin where the count from the
    top crosses n*, and interpolate linearly inside it (values assumed uniform within a bin)."""
    E, N = counts_EN.shape
    width = (hi - lo) / N
    from_top_EN = counts_EN.flip(1).cumsum(1).flip(1)  # count of margins in bin b or above
    b_E = ((from_top_EN >= n_star).sum(1) - 1).clamp(min=0)
    c_E = counts_EN.gather(1, b_E[:, None]).squeeze(1)
    above_E = from_top_EN.gather(1, b_E[:, None]).squeeze(1) - c_E
    frac_E = ((n_star - above_E) / c_E.clamp(min=1.0)).clamp(0.0, 1.0)
    upper_E = lo + (b_E + 1).to(counts_EN.dtype) * width
    return (upper_E - frac_E * width).float()


def qb_bias(beta_E: Tensor) -> Tensor:
    """Next step's bias c = −beta, mean-centred (a common shift of c changes no selection)."""
    c_E = -beta_E
    return c_E - c_E.mean()


# ---- Router --------------------------------------------------------------------------------------


@dataclass
class RoutePin:
    """The routing of one micro-batch at one layer, decided once for the whole step (marin/train/accum.py):
    its expert ids, which assignments survive the transport (planned over the step's tokens on every shard),
    and the step's per-expert loads over its `tokens` tokens (the Switch statistic's f)."""

    expert_idx_TK: Tensor
    keep_TK: Tensor
    load_E: Tensor
    tokens: int
    # QB hist: (-min, max) of the step's margins (the world's): each micro-batch bins its margins into the
    # step's histogram as it goes (float64 counts, exact), instead of keeping them for the update
    margin_ext: Tensor | None = None


@dataclass
class RouterOutput:
    expert_idx_TK: Tensor  # long
    combine_TK: Tensor  # fp32, rows sum to combine_scale
    logits_TE: Tensor  # fp32, unbiased s
    aux_loss: Tensor  # Switch aux loss (0 for other balance levels)
    stats_R: Tensor  # ROUTER_STATS, detached


class Router(nn.Module):
    """s = b·W_r in fp32 from the full-width input; selection by s + c; balancing by `balance`:
    "quantile" (QB bias), "switch_aux" (aux loss, c stays 0), "aux_free" (DeepSeek sign update)."""

    def __init__(self, d_model: int, n_experts: int, top_k: int, *, balance: str, combine_scale: float,
                 aux_weight: float, aux_free_rate: float, qb_estimator: str, qb_hist_bins: int,
                 precision: str = "fp32", qb_shards: int = 1):
        super().__init__()
        # precision "bf16" (ModelConfig.router_precision): 2.6% of expert sets differ from fp32 logits (measured).
        # qb_shards: the topk estimator averages each shard's threshold, as Marin's per-device top_k + pmean
        # (`qb_beta_topk_shard`): a real EP rank its own shards (marin/ep.py), a virtual-EP model cfg.ep_shards.
        self.precision, self.qb_shards = precision, qb_shards
        self.n_experts, self.top_k, self.balance = n_experts, top_k, balance
        self.combine_scale, self.aux_weight, self.aux_free_rate = combine_scale, aux_weight, aux_free_rate
        self.qb_estimator, self.qb_hist_bins = qb_estimator, qb_hist_bins
        self.weight = nn.Parameter(torch.empty(n_experts, d_model))  # W_r, Linear layout (E, D)
        self.register_buffer("bias_E", torch.zeros(n_experts))
        # A distributed run's world (marin.train.distributed.build_train_model sets it): the Switch statistic's
        # loads f are the world's (all-reduced), and a rank's share of P is scaled by its size, so that the
        # world mean of the ranks' aux losses and gradients is the one-process statistic's.
        self.stat_group, self.stat_world = None, 1
        self._switch_loads: tuple[Tensor, int] | None = None  # this step's (world loads, tokens), for the recompute
        self.recomputing = False  # marin.model.checkpointed_block's rerun: the loads of the forward it repeats
        self.reset_pending()

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        # The bias stays fp32 whatever dtype the model is cast to: QB thresholds are small gaps.
        self.bias_E = self.bias_E.float()
        return self

    def reset_pending(self) -> None:
        """Routing statistics of the training forwards since the last bias update (not state)."""
        self._n_forwards = 0
        self._margins: list[Tensor] = []  # QB: detached margins_TE per forward (the step's, at the update)
        # QB hist of an accumulated step: its histogram so far, tokens and range (RoutePin.margin_ext)
        self._counts_EN: Tensor | None = None
        self._hist_tokens = 0
        self._hist_ext: Tensor | None = None
        self._load_E: Tensor | None = None  # aux_free: assignments per expert

    def forward(self, x_TD: Tensor, pin: RoutePin | None = None) -> RouterOutput:
        """`pin` (a micro-batch of an accumulated step): the step's routing replaces this forward's own
        selection and its loads enter the Switch aux loss, so the micro-batches' losses add up to the step's."""
        with torch.autocast(device_type=x_TD.device.type, enabled=False):
            if self.precision == "bf16":
                logits_TE = F.linear(x_TD.bfloat16(), self.weight.bfloat16()).float()
            else:
                logits_TE = F.linear(x_TD.float(), self.weight.float())
        expert_idx_TK, alpha_T = select_experts(logits_TE.detach(), self.bias_E, self.top_k)
        if pin is not None:
            expert_idx_TK = pin.expert_idx_TK
        combine_TK = combine_weights(logits_TE, expert_idx_TK, self.combine_scale)

        if self.balance == "switch_aux" and pin is not None:
            aux_loss = self.aux_weight * self.stat_world * pinned_switch_balance(logits_TE, pin.load_E, pin.tokens)
        elif self.balance == "switch_aux" and self.stat_group is not None:
            if not (self.recomputing and self._switch_loads is not None):
                self._switch_loads = self.world_loads(expert_load(expert_idx_TK, self.n_experts), x_TD.shape[0])
            load_E, tokens = self._switch_loads
            aux_loss = self.aux_weight * self.stat_world * pinned_switch_balance(logits_TE, load_E, tokens)
        elif self.balance == "switch_aux":
            aux_loss = self.aux_weight * switch_balance(logits_TE, expert_idx_TK)
        else:
            aux_loss = logits_TE.new_zeros(())

        # QB statistics once per training forward (Marin: one beta per step): never from a no_grad
        # forward (eval-like probes in train mode); under a reentrant activation checkpoint the first
        # forward runs without grad and only the recompute records; the model's non-reentrant block
        # checkpoint (marin.model.checkpointed_block) puts the router in eval mode for its recompute.
        if self.training and torch.is_grad_enabled():
            self._record(logits_TE.detach(), expert_idx_TK, alpha_T, pin)

        with torch.no_grad():
            l_TE = logits_TE.detach()
            stats_R = step_router_stats(expert_load(expert_idx_TK, self.n_experts), router_probs(l_TE).sum(0),
                                        torch.logsumexp(l_TE, -1).pow(2).sum(), l_TE.shape[0])
        return RouterOutput(expert_idx_TK, combine_TK, logits_TE, aux_loss, stats_R)

    def world_loads(self, load_E: Tensor, tokens: int) -> tuple[Tensor, int]:
        """(loads, tokens) of the Switch statistic: this rank's, summed over the world in a distributed run
        (every rank holds as many tokens)."""
        if self.stat_group is None or self.balance != "switch_aux":
            return load_E, tokens
        load_E = load_E.clone()
        dist.all_reduce(load_E, group=self.stat_group)
        return load_E, tokens * self.stat_world

    def _record(self, logits_TE: Tensor, expert_idx_TK: Tensor, alpha_T: Tensor, pin: RoutePin | None = None) -> None:
        if self.balance == "quantile" and self.top_k < self.n_experts:
            margins_TE = logits_TE - alpha_T[:, None]  # QB step 3: m_ie = s_ie − alpha_i
            self._n_forwards += 1
            if self.qb_estimator == "hist" and pin is not None and pin.margin_ext is not None:
                ext = pin.margin_ext  # the step's range: binning now gives the step's counts
                counts_EN = margin_histogram(margins_TE, -ext[0], ext[1], self.qb_hist_bins)
                self._counts_EN = counts_EN if self._counts_EN is None else self._counts_EN + counts_EN
                self._hist_tokens += margins_TE.shape[0]
                self._hist_ext = ext
                return
            # both estimators read the step's margins at the update: the micro-batches of an accumulated
            # step are one batch to them (the shards of the topk estimator span micro-batches)
            self._margins.append(margins_TE)
        elif self.balance == "aux_free":
            load_E = expert_load(expert_idx_TK, self.n_experts)
            self._load_E = load_E if self._load_E is None else self._load_E + load_E

    @torch.no_grad()
    def update_bias(self, group=None) -> None:
        """Replace c from the routing recorded since the last call; it applies from the next forward.
        With a process group: topk thresholds are averaged over processes, histograms all-reduced,
        aux-free loads summed."""
        distributed = group is not None and dist.is_available() and dist.is_initialized()
        if self.balance == "quantile" and self.qb_estimator == "topk" and self._margins:
            margins_TE = torch.cat(self._margins)
            S = self.qb_shards if margins_TE.shape[0] % self.qb_shards == 0 else 1
            n_star = qb_n_star(margins_TE.shape[0] // S, self.top_k, self.n_experts)
            beta_E = qb_threshold_topk(margins_TE, n_star, S)
            stat = torch.cat([beta_E, beta_E.new_tensor([1.0])])
            if distributed:
                dist.all_reduce(stat, op=dist.ReduceOp.SUM, group=group)
            self.bias_E.copy_(qb_bias(stat[:-1] / stat[-1]))
        elif self.balance == "quantile" and self.qb_estimator == "hist" and (self._counts_EN is not None
                                                                              or self._margins):
            if self._counts_EN is not None:  # an accumulated step's, binned as it went
                lo, hi = -self._hist_ext[0], self._hist_ext[1]  # the world's already (the routing pass reduced it)
                counts_EN, tokens = self._counts_EN, self._counts_EN.new_tensor([self._hist_tokens])
            else:
                margins_TE = torch.cat(self._margins)
                ext = torch.stack([-margins_TE.min(), margins_TE.max()])
                if distributed:
                    dist.all_reduce(ext, op=dist.ReduceOp.MAX, group=group)
                lo, hi = -ext[0], ext[1]
                counts_EN = margin_histogram(margins_TE, lo, hi, self.qb_hist_bins)
                tokens = counts_EN.new_tensor([margins_TE.shape[0]])
            if distributed:
                dist.all_reduce(counts_EN, op=dist.ReduceOp.SUM, group=group)
                dist.all_reduce(tokens, op=dist.ReduceOp.SUM, group=group)
            n_star = float(tokens) * self.top_k / self.n_experts
            self.bias_E.copy_(qb_bias(qb_threshold_hist(counts_EN, lo.double(), hi.double(), n_star)))
        elif self.balance == "aux_free" and self._load_E is not None:
            load_E = self._load_E.clone()
            if distributed:
                dist.all_reduce(load_E, op=dist.ReduceOp.SUM, group=group)
            # DeepSeek-V3 auxiliary-loss-free balancing (arXiv 2412.19437): c_e += rate·sign(mean − load_e).
            self.bias_E.add_(self.aux_free_rate * torch.sign(load_E.mean() - load_E))
        self.reset_pending()


# ---- Experts and the MoE block -------------------------------------------------------------------


class SwiGLU(nn.Module):
    """Full-width SwiGLU, (silu(x Wg) * (x Wu)) Wd: one shared expert."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain (init 1); torch's kernel accumulates in fp32 for bf16 inputs."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


@dataclass
class MoEOutput:
    # the (B·S, D) rows, not their (B, S, D) view: FSDP2 hooks every tensor a unit returns, and an
    # in-place op on a returned view would skip its pre-backward all-gather (it warns at every step)
    y_TD: Tensor | None  # None once the block has added it to the residual (Block.forward)
    aux_loss: Tensor
    stats_R: Tensor  # ROUTER_STATS
    dispatch: DispatchStats
    batch_shape: tuple[int, int] = (0, 0)  # (B, S) of the input

    @property
    def y_BSD(self) -> Tensor:
        return self.y_TD.view(*self.batch_shape, self.y_TD.shape[-1])


class MoE(nn.Module):
    """Router + (latent) routed experts + shared experts. Geometry from cfg.moe_geometry(recipe):
    latent = 2E experts, top-2K at width L = D/alpha; standard = E experts, top-K at width D
    (the same routed parameters, FLOPs and dispatched bytes)."""

    def __init__(self, cfg: ModelConfig, recipe: Recipe):
        super().__init__()
        g = cfg.moe_geometry(recipe)
        if g.n_experts % cfg.ep_shards != 0:  # experts live contiguously on EP shards
            raise ValueError(f"ModelConfig.ep_shards={cfg.ep_shards} does not divide the {g.n_experts} routed experts "
                             f"of latent_moe={recipe.latent_moe!r}; allowed values: divisors of {g.n_experts}")
        self.recipe, self.geometry, self.init_trunc = recipe, g, cfg.init_trunc
        self.router = Router(cfg.d_model, g.n_experts, g.top_k, balance=recipe.router_balance,
                             combine_scale=cfg.combine_scale, aux_weight=cfg.router_aux_weight,
                             aux_free_rate=cfg.aux_free_rate, qb_estimator=cfg.qb_estimator,
                             qb_hist_bins=cfg.qb_hist_bins, precision=cfg.router_precision, qb_shards=cfg.ep_shards)
        if recipe.latent_moe == "latent":
            self.latent_down = nn.Linear(cfg.d_model, g.width, bias=False)  # W_down: D -> L
            # Marin measured +0.05 loss without this norm (docs/method.md §2.1).
            self.latent_norm = RMSNorm(g.width, cfg.norm_eps)
            self.latent_up = nn.Linear(g.width, cfg.d_model, bias=False)  # W_up: L -> D
        E, W, H = g.n_experts, g.width, g.hidden
        self.w_gate_EWH = nn.Parameter(torch.empty(E, W, H))
        self.w_up_EWH = nn.Parameter(torch.empty(E, W, H))
        self.w_down_EHW = nn.Parameter(torch.empty(E, H, W))
        self.shared = nn.ModuleList(SwiGLU(cfg.d_model, cfg.shared_hidden) for _ in range(cfg.n_shared_experts))
        # Virtual EP by default; the real EP dispatcher (marin/ep.py) implements the same protocol
        # and may replace this attribute.
        self.dispatcher = LocalDispatcher(recipe.ep_transport, cfg.ep_shards, cfg.capacity_factor(recipe),
                                          cfg.ragged_chunks, get_kernels(cfg.kernels), cfg.pooled_waves)
        self.reset_parameters(cfg.init_scale / math.sqrt(cfg.d_model))

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        """The model's rule (truncated normal, sigma = init_scale/sqrt(d)) for the tensors created with
        torch.empty, so a standalone MoE never computes with uninitialised memory."""
        for p in (self.router.weight, self.w_gate_EWH, self.w_up_EWH, self.w_down_EHW):
            nn.init.trunc_normal_(p, std=std, a=-self.init_trunc * std, b=self.init_trunc * std)

    def experts(self) -> ExpertWeights:
        return ExpertWeights(self.w_gate_EWH, self.w_up_EWH, self.w_down_EHW)

    def forward(self, x_BSD: Tensor, pin: RoutePin | None = None) -> MoEOutput:
        B, S, D = x_BSD.shape
        x_TD = x_BSD.reshape(B * S, D)
        r = self.router(x_TD, pin)

        if self.recipe.latent_moe == "latent":
            u_TW = self.latent_norm(self.latent_down(x_TD))
        else:
            u_TW = x_TD

        # Eval is always dropless; training drops what recipe.ep_transport ("ragged" pooled receiver
        # capacity | "fixed" per-(sender, expert) cells, set in the dispatcher) drops over cfg.ep_shards shards.
        dropless = not self.training or self.recipe.ep_transport == "dropless"
        routed_TW, dstats = self.dispatcher(u_TW, r.expert_idx_TK, r.combine_TK.to(u_TW.dtype), self.experts(),
                                            dropless=dropless, keep_TK=None if dropless or pin is None else pin.keep_TK)

        if self.recipe.latent_moe == "latent":
            routed_TD = self.latent_up(routed_TW)  # combined in latent space, one projection up
        else:
            routed_TD = routed_TW

        y_TD = routed_TD
        for expert in self.shared:
            y_TD = y_TD + expert(x_TD)
        return MoEOutput(y_TD, r.aux_loss, r.stats_R, dstats, (B, S))
