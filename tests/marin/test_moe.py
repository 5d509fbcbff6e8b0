"""Router, balancing and (latent) MoE block (docs/method.md §2.1 "Latent MoE", "Router and Quantile Balancing")."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from ranks import free_port

from marin_ablate.marin.config import ModelConfig, Recipe
from marin_ablate.marin.moe import (
    MoE,
    Router,
    combine_weights,
    expert_load,
    margin_histogram,
    qb_bias,
    qb_n_star,
    qb_threshold_hist,
    qb_threshold_topk,
    select_experts,
    switch_balance,
)

E, K = 16, 4


def _router(balance: str, estimator: str = "topk", rate: float = 1e-2) -> Router:
    """A router whose logits are its input: W_r = I (d = E)."""
    r = Router(E, E, K, balance=balance, combine_scale=2.5, aux_weight=0.01, aux_free_rate=rate,
               qb_estimator=estimator, qb_hist_bins=256)
    with torch.no_grad():
        r.weight.copy_(torch.eye(E))
    return r.train()


def _skewed(T: int = 8192) -> torch.Tensor:
    return torch.randn(T, E) + torch.linspace(-2.0, 2.0, E)


def test_selection_uses_biased_logits_and_alpha_is_the_k_plus_first_value():
    s = torch.randn(64, E)
    c = torch.randn(E)
    idx, alpha = select_experts(s, c, K)
    ranked = (s + c).sort(-1, descending=True)
    assert torch.equal(idx.sort(-1).values, ranked.indices[:, :K].sort(-1).values)
    torch.testing.assert_close(alpha, ranked.values[:, K])


def test_combine_weights_come_from_unbiased_logits_and_sum_to_scale():
    s = torch.randn(256, E)
    idx_plain, _ = select_experts(s, torch.zeros(E), K)
    idx_biased, _ = select_experts(s, 0.3 * torch.randn(E), K)
    w = combine_weights(s, idx_biased, 2.5)
    torch.testing.assert_close(w.sum(-1), torch.full((256,), 2.5))
    g = torch.sigmoid(s.gather(1, idx_biased))
    torch.testing.assert_close(w, 2.5 * g / g.sum(-1, keepdim=True))
    # Where the bias leaves the chosen set unchanged, each chosen expert keeps exactly its weight.
    same = (idx_plain.sort(-1).values == idx_biased.sort(-1).values).all(-1)
    assert same.any() and (~same).any()
    w_plain = combine_weights(s, idx_plain, 2.5)
    for t in torch.nonzero(same).squeeze(1).tolist():
        a = dict(zip(idx_plain[t].tolist(), w_plain[t].tolist(), strict=True))
        b = dict(zip(idx_biased[t].tolist(), w[t].tolist(), strict=True))
        assert a.keys() == b.keys() and all(abs(a[e] - b[e]) < 1e-6 for e in a)


def test_topk_threshold_is_the_n_star_th_largest_margin_per_expert():
    m = torch.randn(100, E)
    n = qb_n_star(100, K, E)
    assert n == 25
    beta = qb_threshold_topk(m, n)
    assert torch.equal((m >= beta).sum(0), torch.full((E,), n))


def test_hist_threshold_interpolates_to_within_a_bin_of_the_exact_quantile():
    m = torch.randn(8192, E) * torch.linspace(0.5, 2, E)
    n = qb_n_star(8192, K, E)
    lo, hi = m.min().double(), m.max().double()
    counts = margin_histogram(m, lo, hi, 256)
    assert torch.equal(counts.sum(1), torch.full((E,), 8192.0, dtype=torch.float64))
    beta = qb_threshold_hist(counts, lo, hi, n)
    width = float(hi - lo) / 256
    assert ((beta - qb_threshold_topk(m, n)).abs() < width).all()


@pytest.mark.parametrize("estimator", ["topk", "hist"])
def test_quantile_balancing_evens_a_skewed_stream_within_a_few_steps(estimator):
    router = _router("quantile", estimator)
    n_star = 8192 * K / E
    for step in range(4):
        s = _skewed()
        out = router(s)
        load = expert_load(out.expert_idx_TK, E)
        if step == 0:
            assert load.max() > 2 * n_star  # skewed before any bias
        # The bias never touches the combine weights of a chosen expert.
        torch.testing.assert_close(out.combine_TK, combine_weights(s, out.expert_idx_TK, 2.5))
        router.update_bias()
        assert abs(router.bias_E.mean().item()) < 1e-5
    assert ((load / n_star - 1).abs() < 0.15).all(), load / n_star
    assert out.aux_loss == 0


def test_qb_bias_is_minus_threshold_mean_centred():
    beta = torch.tensor([1.0, 2.0, 3.0, 6.0])
    torch.testing.assert_close(qb_bias(beta), torch.tensor([2.0, 1.0, 0.0, -3.0]))


def test_aux_free_bias_moves_each_expert_by_rate_towards_mean_load():
    router = _router("aux_free", rate=0.01)
    out = router(_skewed(1024))
    load = expert_load(out.expert_idx_TK, E)
    router.update_bias()
    torch.testing.assert_close(router.bias_E, 0.01 * torch.sign(load.mean() - load))


def test_switch_aux_loss_is_lambda_at_uniform_probs_and_pushes_load_off_busy_experts():
    s = torch.zeros(32, E, requires_grad=True)
    idx = torch.arange(K).expand(32, K)  # everyone picks experts 0..K-1
    aux = 0.01 * switch_balance(s, idx)
    torch.testing.assert_close(aux, torch.tensor(0.01))
    aux.backward()
    assert (s.grad[:, :K] > 0).all() and (s.grad[:, K:] < 0).all()
    router = _router("switch_aux")
    out = router(_skewed(256))
    assert out.aux_loss > 0.01 and out.aux_loss.requires_grad
    router.update_bias()
    assert (router.bias_E == 0).all()


def _moe_loop_reference(moe: MoE, x_BSD: torch.Tensor) -> torch.Tensor:
    """Token-by-token: shared experts + W_up(Σ_k c_k·SwiGLU_e(u)) with u = RMSNorm(W_down x)."""
    x = x_BSD.reshape(-1, x_BSD.shape[-1])
    r = moe.router(x)
    latent = moe.recipe.latent_moe == "latent"
    u = moe.latent_norm(moe.latent_down(x)) if latent else x
    out = []
    for t in range(x.shape[0]):
        acc = torch.zeros_like(u[t])
        for k in range(r.expert_idx_TK.shape[1]):
            e = int(r.expert_idx_TK[t, k])
            h = F.silu(u[t] @ moe.w_gate_EWH[e]) * (u[t] @ moe.w_up_EWH[e])
            acc = acc + r.combine_TK[t, k] * (h @ moe.w_down_EHW[e])
        y = moe.latent_up(acc) if latent else acc
        out.append(y + sum(sh(x[t]) for sh in moe.shared))
    return torch.stack(out).view_as(x_BSD)


@pytest.mark.parametrize("latent", ["latent", "standard"])
def test_dropless_moe_equals_a_token_by_token_loop(latent):
    cfg = ModelConfig()
    moe = MoE(cfg, Recipe(latent_moe=latent))
    with torch.no_grad():
        for p in (moe.w_gate_EWH, moe.w_up_EWH, moe.w_down_EHW):
            p.normal_(0, 0.1)
    moe.eval()
    x = torch.randn(2, 8, cfg.d_model)
    with torch.no_grad():
        torch.testing.assert_close(moe(x).y_BSD, _moe_loop_reference(moe, x), rtol=1e-4, atol=1e-5)
    g = moe.geometry
    assert (g.n_experts, g.top_k, g.width) == ((16, 4, 32) if latent == "latent" else (8, 2, 64))
    assert moe.w_gate_EWH.shape == (g.n_experts, g.width, cfg.expert_hidden)


def test_latent_and_standard_moe_hold_equal_routed_parameters():
    cfg = ModelConfig()
    lat, std = MoE(cfg, Recipe(latent_moe="latent")), MoE(cfg, Recipe(latent_moe="standard"))
    n = lambda m: sum(p.numel() for p in (m.w_gate_EWH, m.w_up_EWH, m.w_down_EHW))  # noqa: E731
    assert n(lat) == n(std)


# ---- the process-group path of update_bias (gloo, 2 processes) ---------------------------------



def _qb_worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        streams = [_skewed(512) + 0.5 * r for r in range(world)]  # rank r sees stream r
        for est in ("topk", "hist"):
            router = _router("quantile", est)
            router(streams[rank])
            router.update_bias(group=dist.group.WORLD)
            results[(est, rank)] = router.bias_E.clone()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_qb_bias_over_a_process_group_pools_every_process():
    world = 2
    results = mp.Manager().dict()
    # fork: the workers need no fresh interpreter, and start in well under a second
    mp.start_processes(_qb_worker, args=(world, free_port(), results), nprocs=world, start_method="fork")
    torch.manual_seed(0)
    streams = [_skewed(512) + 0.5 * r for r in range(world)]
    alphas = [select_experts(s, torch.zeros(E), K)[1] for s in streams]
    margins = [s - a[:, None] for s, a in zip(streams, alphas, strict=True)]
    # topk: per-process thresholds, averaged
    betas = [qb_threshold_topk(m, qb_n_star(512, K, E)) for m in margins]
    torch.testing.assert_close(results[("topk", 0)], qb_bias((betas[0] + betas[1]) / 2))
    # hist: one histogram over every process's margins
    m = torch.cat(margins)
    lo, hi = m.min().double(), m.max().double()
    want = qb_bias(qb_threshold_hist(margin_histogram(m, lo, hi, 256), lo, hi, 1024 * K / E))
    torch.testing.assert_close(results[("hist", 0)], want)
    for est in ("topk", "hist"):
        torch.testing.assert_close(results[(est, 0)], results[(est, 1)])
