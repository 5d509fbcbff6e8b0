"""Triton kernels (marin/kernels) against the pure-torch references, forward and backward.

Runs the kernels under the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py) on tiny
fp32 / fp64 shapes: bf16 arithmetic is wrong in the interpreter, so bf16 is checked on a GPU
(benchmarks/gpu.py). Block sizes are forced small where a test needs several programs per axis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is an optional extra (pip install -e '.[triton]')")

from marin_ablate.marin.kernels import get_kernels, xsa_gate_torch  # noqa: E402
from marin_ablate.marin.kernels.moe import gmm_dw, gmm_fwd, grouped_mm_triton, permute_triton, unpermute_triton  # noqa: E402
from marin_ablate.marin.kernels.reference import sconv_reference, xsa_reference  # noqa: E402
from marin_ablate.marin.kernels.sconv import sconv_bwd, sconv_fwd, sconv_triton  # noqa: E402
from marin_ablate.marin.kernels.torch_ops import grouped_mm_torch, permute_torch, sort_by_expert, unpermute_torch  # noqa: E402
from marin_ablate.marin.kernels.xsa import xsa_gate_triton, xsa_triton  # noqa: E402


def _grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------


def test_torch_backend_never_imports_triton(monkeypatch):
    # A None entry in sys.modules makes `import triton` raise; the torch set's modules are re-imported.
    import marin_ablate.marin.kernels as pkg

    monkeypatch.setitem(sys.modules, "triton", None)
    for name in [m for m in sys.modules if m.startswith("marin_ablate.marin.kernels.")]:
        monkeypatch.delitem(sys.modules, name)
        monkeypatch.setattr(pkg, name.rsplit(".", 1)[1], getattr(pkg, name.rsplit(".", 1)[1]), raising=False)
    s = get_kernels("torch")
    assert s.backend == "torch" and s.sconv.__module__ == "marin_ablate.marin.kernels.reference"


def test_get_kernels_returns_references_for_torch_and_kernels_for_triton():
    t, k = get_kernels("torch"), get_kernels("triton")
    assert t.sconv is sconv_reference and t.xsa is xsa_reference
    assert k.sconv is sconv_triton and k.xsa is xsa_triton and k.xsa_gate is xsa_gate_triton
    assert k.grouped_mm is grouped_mm_triton and t.grouped_mm is grouped_mm_torch


def test_get_kernels_rejects_unknown_backend_naming_allowed_values():
    with pytest.raises(ValueError, match="'torch', 'triton'"):
        get_kernels("cuda")


def test_triton_kernels_on_cpu_without_interpreter_raise_value_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        sconv_triton(torch.randn(1, 4, 2), torch.randn(4, 2), None)


# ---------------------------------------------------------------------------------------------
# SConv
# ---------------------------------------------------------------------------------------------

DOCS_BS = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3], [5] * 11])


def test_sconv_forward_and_backward_match_reference_with_document_masking():
    x = torch.randn(2, 11, 6, requires_grad=True)
    w = torch.randn(4, 6, requires_grad=True)
    out, ref = sconv_triton(x, w, DOCS_BS), sconv_reference(x, w, DOCS_BS)
    _close(out, ref)
    g = torch.randn_like(ref)
    for a, b in zip(_grads(out, (x, w), g), _grads(ref, (x, w), g), strict=True):
        _close(a, b)


def test_sconv_without_doc_ids_matches_reference_on_strided_input():
    base = torch.randn(2, 6, 9, requires_grad=True)
    x = base.transpose(1, 2)  # (2, 9, 6) with channel stride 9: the kernel must honour strides
    w = torch.randn(4, 6, requires_grad=True)
    out, ref = sconv_triton(x, w, None), sconv_reference(x, w, None)
    _close(out, ref)
    g = torch.randn_like(ref)
    for a, b in zip(_grads(out, (base, w), g), _grads(ref, (base, w), g), strict=True):
        _close(a, b)


def test_sconv_backward_sums_dw_over_many_programs_and_tiles():
    # Blocks of 2 rows x 4 channels, 2 tiles per program: 3 S-programs x 2 C-programs x 2 batch rows.
    x, w = torch.randn(2, 11, 6), torch.randn(4, 6)
    dy = torch.randn(2, 11, 6)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    dx_ref, dw_ref = _grads(sconv_reference(xr, wr, DOCS_BS), (xr, wr), dy)
    dx, dw = sconv_bwd(x, w, DOCS_BS, dy, block_s=2, block_c=4, tiles=2)
    _close(dx, dx_ref)
    _close(dw, dw_ref)
    _close(sconv_fwd(x, w, DOCS_BS, block_s=2, block_c=4), sconv_reference(x, w, DOCS_BS))


def test_sconv_never_reads_across_a_document_boundary():
    x, w = torch.randn(1, 11, 3), torch.randn(4, 3)
    x2 = x.clone()
    x2[0, :3] += 100.0  # change document 0 only
    out, out2 = sconv_triton(x, w, DOCS_BS[:1]), sconv_triton(x2, w, DOCS_BS[:1])
    torch.testing.assert_close(out[0, 3:], out2[0, 3:], rtol=0, atol=0)
    assert (out[0, :3] - out2[0, :3]).abs().min() > 0


def test_sconv_gradcheck_float64():
    x = torch.randn(1, 9, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1]])
    assert torch.autograd.gradcheck(lambda a, b: sconv_triton(a, b, docs), (x, w), fast_mode=True)


def test_sconv_rejects_mismatched_weight_shape():
    with pytest.raises(ValueError, match="w_KC"):
        sconv_triton(torch.randn(1, 4, 3), torch.randn(4, 2), None)


# ---------------------------------------------------------------------------------------------
# XSA
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("H,K", [(4, 2), (4, 1), (2, 2)])
def test_xsa_forward_and_backward_match_reference_under_gqa(H, K):
    y = torch.randn(2, H, 5, 6, requires_grad=True)
    v = torch.randn(2, K, 5, 6, requires_grad=True)
    z, ref = xsa_triton(y, v), xsa_reference(y, v)
    _close(z, ref)
    g = torch.randn_like(ref)
    for a, b in zip(_grads(z, (y, v), g), _grads(ref, (y, v), g), strict=True):
        _close(a, b, 1e-4)


def test_xsa_output_is_orthogonal_to_own_value_and_transposes_to_bshd_for_free():
    y, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    z = xsa_triton(y, v)
    dots = (z.view(1, 2, 2, 3, 8) * v.unsqueeze(2)).sum(-1)
    assert dots.abs().max() < 1e-5
    assert z.transpose(1, 2).is_contiguous()  # (B,S,H,D) storage: the reshape before W_o is a view


def test_xsa_gate_fused_matches_unfused_gate_forward_and_backward():
    y = torch.randn(2, 4, 5, 6, requires_grad=True)
    v = torch.randn(2, 2, 5, 6, requires_grad=True)
    a = torch.randn(2, 5, 4, requires_grad=True)
    z, ref = xsa_gate_triton(y, v, a), xsa_gate_torch(y, v, a)
    _close(z, ref)
    g = torch.randn_like(ref)
    for p, q in zip(_grads(z, (y, v, a), g), _grads(ref, (y, v, a), g), strict=True):
        _close(p, q, 1e-4)


def test_xsa_gradcheck_float64_gqa_with_gate():
    y = torch.randn(1, 4, 3, 5, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 3, 5, dtype=torch.float64, requires_grad=True)
    a = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(xsa_triton, (y, v), fast_mode=True)
    assert torch.autograd.gradcheck(xsa_gate_triton, (y, v, a), fast_mode=True)


def test_xsa_rejects_query_heads_not_divisible_by_kv_heads():
    with pytest.raises(ValueError, match="multiple of KV heads"):
        xsa_triton(torch.randn(1, 3, 2, 4), torch.randn(1, 2, 2, 4))


# ---------------------------------------------------------------------------------------------
# MoE permute / unpermute / grouped GEMM
# ---------------------------------------------------------------------------------------------


def _routing(T=7, K=3, E=4, drop=0.3):
    expert_idx = torch.randint(0, E, (T, K))
    keep = torch.rand(T, K) > drop
    src_N, offsets_E = sort_by_expert(expert_idx, E, keep)
    return expert_idx, keep, src_N, offsets_E


@pytest.mark.parametrize("dropped", ["listed_as_zero_rows", "absent"])
def test_permute_and_unpermute_match_torch_with_dropped_assignments(dropped):
    # sort_by_expert lists all T*K assignments, the dropped ones after offsets[-1], where the grouped
    # GEMM leaves zero rows; a src_N of the kept assignments alone (N < T*K) is accepted as well.
    T, K = 7, 3
    _, keep, src, offsets = _routing(T, K)
    assert (~keep).any() and keep.any() and src.numel() == T * K
    n_kept = int(offsets[-1])
    if dropped == "absent":
        src = src[:n_kept]
    x = torch.randn(T, 5, requires_grad=True)
    c = torch.rand(T, K, requires_grad=True)
    xn, xn_ref = permute_triton(x, src, K), permute_torch(x, src, K)
    _close(xn, xn_ref)
    g = torch.randn_like(xn_ref)
    _close(_grads(xn, x, g)[0], _grads(xn_ref, x, g)[0])
    yn = torch.randn(src.numel(), 5)
    yn[n_kept:] = 0  # the grouped GEMM's output for the dropped rows
    yn.requires_grad_()
    y, y_ref = unpermute_triton(yn, src, c), unpermute_torch(yn, src, c)
    _close(y, y_ref)
    g = torch.randn_like(y_ref)
    (dyn, dc), (dyn_ref, dc_ref) = _grads(y, (yn, c), g), _grads(y_ref, (yn, c), g)
    _close(dyn, dyn_ref)
    _close(dc, dc_ref)
    assert (dc[~keep] == 0).all()  # a dropped assignment gets no combine-weight gradient


def test_permute_unpermute_gradcheck_float64():
    T, K = 5, 2
    _, _, src, _ = _routing(T, K, drop=0.2)
    x = torch.randn(T, 3, dtype=torch.float64, requires_grad=True)
    yn = torch.randn(src.numel(), 3, dtype=torch.float64, requires_grad=True)
    c = torch.rand(T, K, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: permute_triton(a, src, K), (x,), fast_mode=True)
    assert torch.autograd.gradcheck(lambda a, b: unpermute_triton(a, src, b), (yn, c), fast_mode=True)


def test_grouped_mm_matches_torch_with_empty_group_multi_tile_group_and_trailing_rows():
    # Groups of 20, 0, 9 and 4 rows (20 > one 16-row tile); rows 33..35 lie past the last group.
    offsets = torch.tensor([20, 20, 29, 33], dtype=torch.int32)
    x = torch.randn(36, 16, requires_grad=True)
    w = torch.randn(4, 16, 24, requires_grad=True)
    y, ref = grouped_mm_triton(x, w, offsets), grouped_mm_torch(x, w, offsets)
    _close(y, ref, 1e-4)
    assert (y[33:] == 0).all()
    g = torch.randn_like(ref)
    (dx, dw), (dx_ref, dw_ref) = _grads(y, (x, w), g), _grads(ref, (x, w), g)
    _close(dx, dx_ref, 1e-4)
    _close(dw, dw_ref, 1e-4)
    assert (dw[1] == 0).all() and (dx[33:] == 0).all()


def test_grouped_mm_rows_past_last_group_are_zero_forward_and_backward():
    # The dispatcher's contract: rows past offsets[-1] (dropped assignments) belong to no group.
    # Whatever x and dy hold there, y and dx are exact zeros there and dw never reads them.
    offsets = torch.tensor([0, 20, 20, 29], dtype=torch.int32)  # empty groups 0 and 2; 20 rows > one tile
    x, w, dy = torch.randn(40, 16), torch.randn(4, 16, 24), torch.randn(40, 24)
    x[29:] = float("nan")
    dy[29:35], dy[35:] = float("nan"), 1e30
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = grouped_mm_triton(xt, wt, offsets)
    dx, dw = _grads(y, (xt, wt), dy)
    assert (y[29:] == 0).all() and (dx[29:] == 0).all()  # exact: a NaN or 1e30 row fails `== 0`
    xr, wr = x[:29].clone().requires_grad_(), w.clone().requires_grad_()
    y_ref = grouped_mm_torch(xr, wr, offsets)
    dx_ref, dw_ref = _grads(y_ref, (xr, wr), dy[:29])
    _close(y[:29], y_ref, 1e-4)
    _close(dx[:29], dx_ref, 1e-4)
    _close(dw, dw_ref, 1e-4)  # finite, and equal to the sum over grouped rows only


def test_grouped_mm_backward_kernels_with_small_blocks_match_torch():
    offsets = torch.tensor([5, 21, 21, 40], dtype=torch.int32)
    x, w, dy = torch.randn(40, 32), torch.randn(4, 32, 16), torch.randn(40, 16)
    _close(gmm_fwd(dy, w, offsets, w_transposed=True, blocks=(16, 16, 16, 4, 2)),
           grouped_mm_torch(dy, w.transpose(1, 2), offsets), 1e-4)
    _close(gmm_dw(x, dy, offsets, blocks=(16, 16, 16, 4)),
           torch.stack([x[s:e].T @ dy[s:e] for s, e in zip([0, 5, 21, 21], offsets.tolist(), strict=True)]), 1e-4)


def test_grouped_mm_gradcheck_float64():
    offsets = torch.tensor([6, 6, 17], dtype=torch.int32)
    x = torch.randn(17, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 16, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: grouped_mm_triton(a, b, offsets), (x, w), fast_mode=True)


def test_moe_pipeline_triton_equals_torch_end_to_end():
    # permute -> grouped GEMM -> unpermute, as a dispatcher chains them.
    T, K, E = 8, 2, 4
    _, _, src, offsets = _routing(T, K, E, drop=0.25)
    x = torch.randn(T, 16)
    w = torch.randn(E, 16, 16)
    c = torch.rand(T, K)
    ks, kt = get_kernels("triton"), get_kernels("torch")
    out = ks.unpermute(ks.grouped_mm(ks.permute(x, src, K), w, offsets), src, c)
    ref = kt.unpermute(kt.grouped_mm(kt.permute(x, src, K), w, offsets), src, c)
    _close(out, ref, 1e-4)


@pytest.mark.slow  # a model forward and backward in the Triton interpreter
def test_model_with_triton_kernels_matches_torch_kernels_loss_and_gradients():
    # The kernels on the tensors the model really hands them (strided k/v views, the fused gate).
    from dataclasses import replace

    from marin_ablate.marin.config import Recipe
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.presets import preset

    cfg = preset("tiny")
    tokens = torch.randint(0, cfg.vocab_size, (1, 32))
    docs = torch.tensor([[0] * 10 + [1] * 22])
    ref = MarinModel(replace(cfg, kernels="torch"), Recipe()).eval()  # eval: dropless routing
    with torch.no_grad():  # move SConv off identity and the gate off zero so their gradients matter
        for name, p in ref.named_parameters():
            if "sconv" in name or name.endswith("gate.weight"):
                p.normal_(0, 0.3)
    tri = MarinModel(replace(cfg, kernels="triton"), Recipe()).eval()
    tri.load_state_dict(ref.state_dict())
    out_ref, out_tri = ref(tokens, docs, tokens), tri(tokens, docs, tokens)
    _close(out_tri.loss, out_ref.loss)
    out_ref.loss.backward()
    out_tri.loss.backward()
    grads_tri = dict(tri.named_parameters())
    for name, p in ref.named_parameters():
        if p.grad is not None:
            _close(grads_tri[name].grad, p.grad, 1e-4)


# ---------------------------------------------------------------------------------------------
# The real compiler (the interpreter accepts code it rejects)
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_without_spills_and_gmm_uses_wgmma():
    # A subprocess: TRITON_INTERPRET=1 (conftest) patches triton.language in this process.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "marin_ablate.marin.kernels.sm90", "--json"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    builds = json.loads(out.stdout.strip().splitlines()[-1])
    names = {b["name"] for b in builds}
    assert names == {"sconv_fwd_kernel", "sconv_bwd_kernel", "xsa_fwd_kernel", "xsa_bwd_kernel",
                     "gather_rows_kernel", "combine_rows_kernel", "unpermute_bwd_kernel", "gmm_kernel",
                     "gmm_dw_kernel"}
    for b in builds:
        if b["name"].startswith(("_sconv", "_xsa")):  # the memory-bound hot paths: default tiles fit
            assert b["stack_bytes"] == 0, b
        if b["name"].startswith("_gmm"):  # Hopper tensor-core instructions, not mma.sync
            assert b["uses_wgmma"], b


def test_cpu_grouped_mm_with_rows_not_16_byte_aligned_takes_the_loop():
    # torch's CPU _grouped_mm raises on 24-byte fp32 rows (width 6) and 20-byte output rows (5);
    # such widths must still compute, through the per-group loop.
    offsets = torch.tensor([3, 3, 7], dtype=torch.int32)
    x, w = torch.randn(8, 6), torch.randn(3, 6, 5)
    y = grouped_mm_torch(x, w, offsets)
    _close(y[:3], x[:3] @ w[0], 1e-5)
    _close(y[3:7], x[3:7] @ w[2], 1e-5)
    assert (y[7:] == 0).all()
