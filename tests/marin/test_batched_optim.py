"""The batched optimizer step (marin/batched_updates.py; batched Newton–Schulz in marin/update_rules.py) equals
the per-parameter step it replaces, to fp32 rounding, for every optimizer level and both expert spheres;
Newton–Schulz over a same-shape stack equals it matrix by matrix. The distributed owner-rank path is held to the
one-process per-parameter step in tests/marin/test_sharded_optim.py."""

from __future__ import annotations

import copy

import pytest
import torch

from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
from marin_ablate.marin.model import MarinModel
from marin_ablate.marin.optimizers import KINDS, OPTIMIZERS
from marin_ablate.marin.presets import preset
from marin_ablate.marin.update_rules import (
    NS_STACK_ELEMS,
    batched_newton_schulz,
    build_optimizer,
    newton_schulz,
    resolve_hparams,
)


def test_newton_schulz_of_a_same_shape_stack_equals_each_matrix_alone():
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 32), (32, 16), (16, 32), (4, 16, 32), (8, 8), (3, 5)]  # a tall one joins its wide peers
    dirs = [torch.randn(*s, generator=g) for s in shapes]
    got = batched_newton_schulz(dirs, [5] * len(dirs))
    for d, o in zip(dirs, got, strict=True):
        assert o.shape == d.shape
        torch.testing.assert_close(o, newton_schulz(d, 5), rtol=0, atol=2e-6)


def test_a_stack_never_exceeds_its_element_cap_unless_one_parameter_does(monkeypatch):
    import marin_ablate.marin.update_rules as ur

    seen = []
    real = ur.newton_schulz
    monkeypatch.setattr(ur, "newton_schulz", lambda x, steps: seen.append(x.numel()) or real(x, steps))
    monkeypatch.setattr(ur, "NS_STACK_ELEMS", 3 * 64)
    dirs = [torch.randn(8, 8) for _ in range(7)] + [torch.randn(5, 8, 8)]
    ur.batched_newton_schulz(dirs, [5] * len(dirs))
    assert seen == [192, 192, 64, 320]  # 3 + 3 + 1 matrices, then the 5-matrix parameter whole
    assert NS_STACK_ELEMS == 1 << 24


@pytest.mark.parametrize("sphere", ["bank", "expert"])
@pytest.mark.parametrize("level", list(OPTIMIZERS))
def test_the_batched_step_equals_the_per_parameter_step(level, sphere):
    spec = RunSpec(model=preset("tiny"), recipe=Recipe(optimizer=level), train=TrainConfig(expert_sphere=sphere))
    torch.manual_seed(0)
    ref = MarinModel(spec.model, spec.recipe).train()
    bat = copy.deepcopy(ref)
    w0 = {n: p.detach().clone() for n, p in ref.named_parameters()}
    hp = resolve_hparams(spec)
    o_ref, o_bat = build_optimizer(ref, hp, batched=False), build_optimizer(bat, hp)
    assert o_bat.batched and not o_ref.batched
    g = torch.Generator().manual_seed(1)
    for _ in range(2):  # the second step reads the momenta, moments and radii the first one left
        tok = torch.randint(0, spec.model.vocab_size, (2, spec.model.seq_len), generator=g)
        for m, o in ((ref, o_ref), (bat, o_bat)):
            o.zero_grad(set_to_none=True)
            m(tok, None, tok.roll(-1, 1)).loss.backward()
        for p, q in zip(ref.parameters(), bat.parameters(), strict=True):
            q.grad = p.grad.clone()  # the same gradients: only the optimizers differ
        o_ref.step()
        o_bat.step()
    for n, p in ref.named_parameters():
        q = dict(bat.named_parameters())[n]
        moved = float((p.detach() - w0[n]).abs().max())
        assert moved > 0, n
        # fp32 rounding of a different op order (stacked matmuls, foreach), well under what the step moves
        assert float((q.detach() - p.detach()).abs().max()) <= 1e-4 * moved + 1e-7, n
        for k, v in o_ref.state[p].items():
            if isinstance(v, torch.Tensor):
                torch.testing.assert_close(o_bat.state[q][k], v, rtol=1e-5, atol=1e-7, msg=f"{n}.{k}")


def test_every_built_in_kind_but_plain_muon_has_a_batched_step():
    assert {k for k, v in KINDS.items() if v.batched is None} == {"muon"}
