"""torch.compile through the Triton kernels (marin/kernels): each is a torch.library custom op with a
fake (shape-only) implementation and registered autograd, so a compiled block holds them as graph
nodes, forward and backward, with no graph break.

CPU only: the kernels run under the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py) on
tiny fp32 shapes. fullgraph=True makes any graph break an error, including one a host read of a
tensor value (.item(), .tolist()) in a wrapper would cause.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is an optional extra (pip install -e '.[triton]')")

from marin_ablate.marin.kernels import get_kernels  # noqa: E402
from marin_ablate.marin.kernels.torch_ops import sort_by_expert  # noqa: E402

# Multi-process training, torch.compile, simulated studies or real SLURM jobs: minutes on 2 cores.
# `python -m pytest -m "not slow"` leaves this file out of the development loop; CI runs it.
pytestmark = pytest.mark.slow


KS = get_kernels("triton")  # imports the kernel modules, which registers the marin:: ops
T, K, E, W = 6, 2, 3, 16  # tokens, top_k, experts, width


def _routing():
    """All T*K assignments, a third of them dropped (listed after offsets[-1]), as the dispatcher routes."""
    keep = torch.rand(T, K) > 0.3
    return sort_by_expert(torch.randint(0, E, (T, K)), E, keep)


def _op_samples() -> dict[str, tuple]:
    """Sample args per registered op, keyed "<op name>[-variant]": the forwards with inputs requiring
    grad (so opcheck checks their autograd registration), the backwards with plain inputs."""
    r = torch.randn
    g = dict(requires_grad=True)
    src, offsets = _routing()
    docs = torch.tensor([[0, 0, 1, 1, 1, 2]])
    return {
        "sconv_fwd-docs": (r(1, 6, 4, **g), r(3, 4, **g), docs),
        "sconv_fwd-no_docs": (r(1, 6, 4, **g), r(3, 4, **g), None),
        "sconv_bwd": (r(1, 6, 4), r(3, 4), docs, r(1, 6, 4)),
        "xsa_fwd": (r(1, 4, 3, 8, **g), r(1, 2, 3, 8, **g), None),
        "xsa_fwd-gate": (r(1, 4, 3, 8, **g), r(1, 2, 3, 8, **g), r(1, 3, 4, **g)),
        "xsa_bwd": (r(1, 4, 3, 8), r(1, 2, 3, 8), None, r(1, 4, 3, 8)),
        "xsa_bwd-gate": (r(1, 4, 3, 8), r(1, 2, 3, 8), r(1, 3, 4), r(1, 4, 3, 8)),
        "permute_fwd": (r(T, W, **g), src, K),
        "permute_bwd": (r(T * K, W), src, T, K),
        "unpermute_fwd": (r(T * K, W, **g), src, torch.rand(T, K, **g)),
        "unpermute_fwd-partial_src": (r(T, W, **g), src[:T], torch.rand(T, K, **g)),
        "unpermute_bwd": (r(T, W), r(T * K, W), src, torch.rand(T, K)),
        "grouped_mm_fwd": (r(T * K, W, **g), r(E, W, 8, **g), offsets),
        "grouped_mm_dw": (r(T * K, W), r(T * K, 8), offsets),
    }


@pytest.mark.parametrize("case", list(_op_samples()))
def test_every_kernel_op_passes_opcheck(case):
    # opcheck's default utils, all four: schema (no mutation or aliasing), autograd registration,
    # fake vs real metadata (shapes, dtypes, strides) and AOT dispatch with dynamic shapes.
    op = getattr(torch.ops.marin, case.split("-")[0]).default
    torch.library.opcheck(op, _op_samples()[case])


def _block(x_BSC, w_KC, docs_BS, y_BHSD, v_BKSD, gate_BSH, x_TW, src_N, combine_TK, w_EIO, offsets_E):
    """All six public kernels, as an attention + MoE block chains them."""
    s = KS.sconv(x_BSC, w_KC, docs_BS)
    z = KS.xsa(y_BHSD, v_BKSD)
    zg = KS.xsa_gate(y_BHSD, v_BKSD, gate_BSH)
    h = KS.unpermute(KS.grouped_mm(KS.permute(x_TW, src_N, K), w_EIO, offsets_E), src_N, combine_TK)
    return s, z, zg, h


_DIFFERENTIABLE = (0, 1, 3, 4, 5, 6, 8, 9)  # positions of _block's float inputs


def _block_inputs():
    src, offsets = _routing()
    return [torch.randn(1, 6, 4), torch.randn(3, 4), torch.tensor([[0, 0, 1, 1, 1, 2]]), torch.randn(1, 4, 3, 8),
            torch.randn(1, 2, 3, 8), torch.randn(1, 3, 4), torch.randn(T, W), src, torch.rand(T, K),
            torch.randn(E, W, 8), offsets]


def _outputs_and_grads(fn, inputs):
    leaves = [t.clone().requires_grad_(i in _DIFFERENTIABLE) for i, t in enumerate(inputs)]
    outs = fn(*leaves)
    # A distinct random cotangent per output, so no gradient is a plain sum.
    cot = [torch.randn_like(o) for o in outs]
    loss = sum((o * c).sum() for o, c in zip(outs, cot, strict=True))
    return outs, torch.autograd.grad(loss, [leaves[i] for i in _DIFFERENTIABLE])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_block_of_all_six_kernels_has_no_graph_break_and_matches_eager(backend):
    inputs = _block_inputs()
    torch.manual_seed(1)
    outs, grads = _outputs_and_grads(_block, inputs)
    torch._dynamo.reset()
    torch.manual_seed(1)
    c_outs, c_grads = _outputs_and_grads(torch.compile(_block, fullgraph=True, backend=backend), inputs)
    for a, b in zip(outs + grads, c_outs + c_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # XSA's output keeps its (B, S, H, D) storage under compile: the reshape before W_o stays free.
    assert c_outs[1].stride() == outs[1].stride() and c_outs[1].transpose(1, 2).is_contiguous()


def test_compiled_block_is_one_graph_holding_the_marin_ops_forward_and_backward():
    # The kernels are nodes of the compiled graphs themselves, not run eagerly around them.
    explained = torch._dynamo.explain(_block)(*_block_inputs())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = {"fw": set(), "bw": set()}

    def recorder(kind):
        def compiler(gm, example_inputs):
            seen[kind] |= {str(n.target.overloadpacket) for n in gm.graph.nodes
                           if n.op == "call_function" and str(n.target).startswith("marin.")}
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    fn = torch.compile(_block, fullgraph=True,
                       backend=aot_autograd(fw_compiler=recorder("fw"), bw_compiler=recorder("bw")))
    _outputs_and_grads(fn, _block_inputs())
    assert seen["fw"] == {f"marin.{n}" for n in ("sconv_fwd", "xsa_fwd", "permute_fwd", "grouped_mm_fwd",
                                                  "unpermute_fwd")}
    # dx of the grouped GEMM is the forward op on a transposed view of w.
    assert seen["bw"] == {f"marin.{n}" for n in ("sconv_bwd", "xsa_bwd", "permute_bwd", "grouped_mm_fwd",
                                                  "grouped_mm_dw", "unpermute_bwd")}
