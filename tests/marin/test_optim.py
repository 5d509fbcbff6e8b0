"""Hyperball (MuonH + AdamH + Adam) and baselines, docs/method.md §2.1."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from marin_ablate.marin.config import ModelConfig, Recipe, RunSpec, TrainConfig
from marin_ablate.marin.hparams import LRHeuristic
from marin_ablate.marin.presets import preset
from marin_ablate.marin.update_rules import (
    NS_COEFFS,
    NS_SCHEDULES,
    OptimHparams,
    build_optimizer,
    group_assignment,
    lr_multiplier,
    newton_schulz,
    ns_band,
    resolve_hparams,
    set_lr,
)


class _Toy(nn.Module):
    """One parameter of every role, shaped like the model's (expert stack E leading)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Parameter(torch.randn(32, 16))
        self.wq = nn.Parameter(torch.randn(16, 16) * 0.1)
        self.w_down = nn.Parameter(torch.randn(8, 16) * 0.1)
        self.experts = nn.Parameter(torch.randn(4, 8, 12) * 0.1)
        self.router = nn.Parameter(torch.randn(16, 4) * 0.1)
        self.gate = nn.Parameter(torch.zeros(16, 4))
        self.norm = nn.Parameter(torch.ones(16))
        self.sconv = nn.Parameter(torch.zeros(4, 16))
        self.lm_head = nn.Parameter(torch.randn(32, 16) * 0.1)

    def param_roles(self) -> dict[str, str]:
        return {"embed": "embed", "wq": "matrix", "w_down": "matrix", "experts": "expert",
                "router": "router", "gate": "gate", "norm": "norm", "sconv": "sconv", "lm_head": "lm_head"}

    def loss(self, tok: torch.Tensor) -> torch.Tensor:
        x = self.embed[tok] * self.norm
        x = x + torch.tanh(x @ self.wq) * (2 * torch.sigmoid(x @ self.gate)).mean(-1, keepdim=True)
        lat = x @ self.w_down.T
        y = torch.einsum("tl,elh->teh", lat, self.experts).pow(2).mean(-1)
        x = x + (torch.softmax(x @ self.router, -1) * y).sum(-1, keepdim=True) + self.sconv.sum(0)
        return nn.functional.cross_entropy(x @ self.lm_head.T, tok.roll(-1))


def _hp(level: str, lr: float = 0.05, adam_lr: float = 0.01) -> OptimHparams:
    return OptimHparams(level, lr, adam_lr, 0.9062, 0.99, 0.1, 0.95, 5)


@pytest.mark.parametrize("expert_sphere", ["bank", "expert"])
def test_hyperball_keeps_every_muonh_and_adamh_matrix_norm_over_100_steps(expert_sphere):
    from dataclasses import replace  # noqa: PLC0415

    from marin_ablate.marin.update_rules import sphere_norms  # noqa: PLC0415

    torch.manual_seed(0)
    model = _Toy()
    opt = build_optimizer(model, replace(_hp("hyperball"), expert_sphere=expert_sphere))
    kinds, roles = group_assignment(opt), model.param_roles()
    sphere = {n: p for n, p in model.named_parameters() if kinds[n] in ("muonh", "adamh")}
    init = {n: sphere_norms(p, roles[n], expert_sphere) for n, p in sphere.items()}
    before = {n: p.detach().clone() for n, p in sphere.items()}
    for _ in range(100):
        tok = torch.randint(0, 32, (64,))
        opt.zero_grad()
        model.loss(tok).backward()
        opt.step()
    for n, p in sphere.items():
        now = sphere_norms(p, roles[n], expert_sphere)  # per bank or per expert for the stack
        torch.testing.assert_close(now, init[n], rtol=1e-5, atol=0.0)
        assert not torch.equal(p.detach(), before[n]), f"{n} did not move"


def test_adamh_level_keeps_matrix_norms_and_adam_group_moves():
    torch.manual_seed(1)
    model = _Toy()
    opt = build_optimizer(model, _hp("adamh"))
    assert {k for n, k in group_assignment(opt).items() if n in ("wq", "experts", "lm_head")} == {"adamh"}
    from marin_ablate.marin.update_rules import sphere_norms  # noqa: PLC0415

    init = sphere_norms(model.experts, "expert")  # the default: one sphere for the bank
    emb0 = model.embed.detach().clone()
    for _ in range(20):
        opt.zero_grad()
        model.loss(torch.randint(0, 32, (64,))).backward()
        opt.step()
    torch.testing.assert_close(sphere_norms(model.experts, "expert"), init, rtol=1e-5, atol=0.0)
    assert not torch.equal(model.embed.detach(), emb0)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (3, 24, 40)])
def test_newton_schulz_singular_values_lie_in_the_quintic_band(shape):
    torch.manual_seed(2)
    u = torch.randn(*shape, dtype=torch.float64).float()
    s_in = torch.linalg.svdvals(u / torch.linalg.matrix_norm(u, keepdim=True))
    lo, hi = ns_band(float(s_in.min()) * 0.999)
    s_out = torch.linalg.svdvals(newton_schulz(u, 5))
    assert float(s_out.min()) >= lo - 1e-3 and float(s_out.max()) <= hi + 1e-3, (s_out.min(), s_out.max(), lo, hi)
    # singular vectors are kept: the output is U f(S) V^T, so it commutes with the input's polar factor
    uu, _, vh = torch.linalg.svd(u, full_matrices=False)
    f_s = torch.diagonal(uu.mT @ newton_schulz(u, 5) @ vh.mT, dim1=-2, dim2=-1)
    torch.testing.assert_close(torch.sort(f_s, -1).values, torch.sort(s_out, -1).values, atol=1e-3, rtol=1e-3)


def test_ns_band_of_the_documented_coefficients():
    # levanter optim/util.py NEWTON_SCHULZ_COEFFICIENTS["quintic"]: five triples, one per iteration
    assert NS_COEFFS == ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                         (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))
    lo, hi = ns_band(1e-2)
    assert 0.975 < lo < 0.980 and 1.030 < hi < 1.034
    lo3, hi3 = ns_band(1e-3)
    assert lo3 < lo and hi3 >= hi  # a wider start gives a wider band
    slo, shi = ns_band(1e-2, schedule=NS_SCHEDULES["simple"])  # K. Jordan's one repeated triple
    assert 0.67 < slo < 0.70 and 1.12 < shi < 1.15


def test_lr_schedules_warm_up_then_decay_to_final_fraction():
    n = 200  # 1% warmup -> 2 steps
    for sched in ("linear", "cosine", "wsd"):
        m = [lr_multiplier(s, n, sched, 0.01, 0.05) for s in range(n)]
        assert m[0] == pytest.approx(0.5) and m[1] == pytest.approx(1.0), sched
        assert m[-1] == pytest.approx(0.05), sched
        assert all(a >= b - 1e-12 for a, b in zip(m[1:], m[2:], strict=False)), \
            f"{sched} not non-increasing after warmup"
    lin = [lr_multiplier(s, n) for s in range(n)]
    assert lin[100] == pytest.approx(1 - 0.95 * 99 / 198)  # straight line from step 1 to step 199
    cos = [lr_multiplier(s, n, "cosine") for s in range(n)]
    assert cos[100] == pytest.approx(0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * 99 / 198)))
    wsd = [lr_multiplier(s, n, "wsd") for s in range(n)]
    assert wsd[159] == 1.0 and wsd[160] < 1.0  # decay over the last 20%
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_multiplier(0, n, "step")


def test_heuristic_values_and_overrides():
    cfg = ModelConfig(d_model=512, seq_len=4096)
    t = TrainConfig(steps=1000, batch_size=32)
    B = 32 * 4096
    D = 1000.0 * B
    adam = 0.087571 * D**-0.3461 * 512**-0.3448 * math.sqrt(B)  # Marin's August refit
    hp = resolve_hparams(RunSpec(model=cfg, train=t))
    assert hp.adam_lr == pytest.approx(min(0.05, adam))
    assert hp.lr == pytest.approx(min(0.05, 13 / 3 * min(0.05, adam)))
    assert hp.beta1 == 0.90 and hp.beta2 == pytest.approx(0.999)  # B = 131072 exactly
    assert hp.eps == pytest.approx(9.676e-18 * math.sqrt(1000.0), rel=1e-9, abs=0)
    assert LRHeuristic.beta2(4 * 131072) == pytest.approx(0.999**4)
    assert LRHeuristic.beta2(10**9) == 0.95 and LRHeuristic.beta2(1) == 0.9999
    over = resolve_hparams(RunSpec(model=cfg, train=TrainConfig(steps=1000, batch_size=32, lr=0.02, adam_lr=3e-3,
                                                                adam_eps=1e-10)))
    assert (over.lr, over.adam_lr, over.eps) == (0.02, 3e-3, 1e-10)
    aw = resolve_hparams(RunSpec(model=cfg, train=t, recipe=Recipe.baseline()))
    assert (aw.beta1, aw.beta2, aw.eps) == (0.9, 0.95, 1e-8) and aw.lr == aw.adam_lr == hp.adam_lr
    may = resolve_hparams(RunSpec(model=cfg, train=replace(t, lr_heuristic="may_5951")))
    assert may.adam_lr == pytest.approx(0.06602 * D**-0.395 * 512**-0.150 * math.sqrt(B)) and may.beta1 == 0.9062


def test_build_optimizer_gives_adam_groups_the_resolved_eps():
    hp = resolve_hparams(RunSpec(model=ModelConfig(d_model=512, seq_len=4096),
                                 train=TrainConfig(steps=1000, batch_size=32)))
    opt = build_optimizer(_Toy(), hp)
    eps = {g["kind"]: g["eps"] for g in opt.param_groups}
    assert eps["adam"] == hp.eps and eps["adamh"] == hp.eps and hp.eps < 1e-15


def test_baseline_groups_decay_matrices_but_not_gains_and_muon_scales_by_shape():
    model = _Toy()
    opt = build_optimizer(model, _hp("adamw"))
    wd = {n: g["weight_decay"] for g in opt.param_groups for n in g["names"]}
    assert wd["wq"] == wd["embed"] == wd["lm_head"] == 0.1 and wd["norm"] == wd["sconv"] == 0.0
    assert set(group_assignment(opt).values()) == {"adamw"}
    mu = build_optimizer(model, _hp("muon_adamw", lr=0.01))
    kinds = group_assignment(mu)
    assert kinds["wq"] == kinds["experts"] == "muon" and kinds["lm_head"] == kinds["router"] == "adamw"
    # plain Muon with zero decay moves W by lr * 0.2 * sqrt(max(m, n)) * NS(U): RMS-matched to AdamW
    for g in mu.param_groups:
        g["weight_decay"] = 0.0
    w0 = model.wq.detach().clone()
    mu.zero_grad()
    model.loss(torch.randint(0, 32, (64,))).backward()
    u = model.wq.grad.clone() * 1.95  # first Nesterov step: U = (1 + mu) G
    mu.step()
    expect = w0 - 0.01 * 0.2 * 4.0 * newton_schulz(u, 5)
    torch.testing.assert_close(model.wq.detach(), expect, atol=1e-6, rtol=1e-5)


def test_set_lr_scales_every_group_from_its_peak():
    opt = build_optimizer(_Toy(), _hp("hyperball", lr=0.04, adam_lr=0.002))
    set_lr(opt, 0.5)
    lrs = {g["kind"]: g["lr"] for g in opt.param_groups}
    assert lrs["muonh"] == 0.02 and lrs["adamh"] == 0.02 and lrs["adam"] == 0.001


def test_zero_norm_matrix_on_the_hyperball_is_rejected():
    model = _Toy()
    with torch.no_grad():
        model.wq.zero_()
    with pytest.raises(ValueError, match="'wq'.*zero Frobenius norm"):
        build_optimizer(model, _hp("hyperball"))


def test_unknown_role_is_rejected():
    model = _Toy()
    model.param_roles = lambda: {**_Toy.param_roles(model), "wq": "bias"}
    with pytest.raises(ValueError, match="'wq'.*allowed values"):
        build_optimizer(model, _hp("hyperball"))


def _design_kind(name: str) -> str:
    """docs/method.md §2.1 Hyperball groups, written from parameter names (independent of param_roles)."""
    if name == "lm_head.weight":
        return "adamh"
    if name == "embed.weight" or ".router." in name or name.endswith("attn.gate.weight") or ".sconv" in name:
        return "adam"
    if name.endswith(("norm.weight",)):  # attn/mlp/latent/final/q/k RMSNorm gains
        return "adam"
    if any(k in name for k in (".wq.", ".wk.", ".wv.", ".wo.", "moe.w_", "latent_down", "latent_up",
                               ".shared.", "gated_norm.w_")):
        return "muonh"
    raise AssertionError(f"{name}: not covered by the table in docs/method.md §2")


def test_tiny_model_parameters_land_in_the_design_groups_and_stay_on_the_sphere():
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.update_rules import sphere_norms  # noqa: PLC0415

    torch.manual_seed(0)
    cfg = preset("tiny", ["gated_norm=on", "seq_len=32"])
    for recipe in (Recipe(), Recipe(qk_norm="learned_gain", latent_moe="standard")):
        model = MarinModel(cfg, recipe)
        opt = build_optimizer(model, _hp("hyperball"))
        kinds = group_assignment(opt)
        assert kinds == {n: _design_kind(n) for n, _ in model.named_parameters()}
        assert any(".moe.w_up_EWH" in n for n in kinds) and any("gated_norm" in n for n in kinds)
        sphere = {n: p for n, p in model.named_parameters() if kinds[n] in ("muonh", "adamh")}
        roles = model.param_roles()
        init = {n: sphere_norms(p, roles[n]) for n, p in sphere.items()}
        for _ in range(3):
            tok = torch.randint(0, 256, (2, 33))
            opt.zero_grad()
            model(tok[:, :-1], None, tok[:, 1:]).loss.backward()
            opt.step()
            model.update_router_biases()
        for n, p in sphere.items():
            torch.testing.assert_close(sphere_norms(p, roles[n]), init[n], rtol=1e-5, atol=0.0)


def test_newton_schulz_of_an_expert_stack_equals_one_call_per_matrix():
    torch.manual_seed(3)
    for u in (torch.randn(3, 8, 12), torch.randn(2, 3, 12, 8)):  # wide and tall, one or two batch dims
        o = newton_schulz(u, 5)
        assert o.shape == u.shape
        for idx in itertools.product(*map(range, u.shape[:-2])):
            torch.testing.assert_close(o[idx], newton_schulz(u[idx], 5), atol=1e-5, rtol=1e-5)
