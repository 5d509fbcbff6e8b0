"""Drop decision, grouped GEMM and the virtual-EP dispatcher (docs/method.md §2.1)."""

import pytest
import torch
import torch.nn.functional as F

from marin_ablate.marin.dispatch import (
    DispatchStats,
    ExpertWeights,
    LocalDispatcher,
    fixed_cell_capacity,
    grouped_mm,
    plan_drops,
    ragged_capacities,
)
from marin_ablate.marin.kernels.torch_ops import _CPU_GROUPED_MM_DTYPES, native_grouped_mm_ok


def _idx(rows):
    return torch.tensor(rows, dtype=torch.long)


def _mask(rows):
    return torch.tensor(rows, dtype=torch.bool)


def _experts(E, W, H, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return ExpertWeights(
        torch.randn(E, W, H, generator=g, dtype=dtype) / W**0.5,
        torch.randn(E, W, H, generator=g, dtype=dtype) / W**0.5,
        torch.randn(E, H, W, generator=g, dtype=dtype) / H**0.5,
    )


def _dense_reference(x_TW, idx_TK, comb_TK, keep_TK, ex: ExpertWeights):
    """Per-token, per-assignment loop: the definition of the MoE output."""
    T, K = idx_TK.shape
    rows = []
    for t in range(T):
        acc = torch.zeros_like(x_TW[t])
        for k in range(K):
            if keep_TK[t, k]:
                e = int(idx_TK[t, k])
                h = F.silu(x_TW[t] @ ex.w_gate_EWH[e]) * (x_TW[t] @ ex.w_up_EWH[e])
                acc = acc + comb_TK[t, k] * (h @ ex.w_down_EHW[e])
        rows.append(acc)
    return torch.stack(rows)


# ---- fixed transport: per-(sender, expert) cells of ceil(cf*T_s*K/E) rows -------------------------


def test_fixed_keeps_earliest_positions_of_each_sender_expert_cell():
    # S=2 shards of 4 tokens, E=4, K=1, cf=1 -> each cell holds ceil(4/4)=1 row.
    idx = _idx([[0], [0], [1], [0], [2], [2], [2], [3]])
    keep = plan_drops(idx, n_experts=4, n_shards=2, transport="fixed", capacity_factor=1.0)
    assert torch.equal(keep, _mask([[1], [0], [1], [0], [1], [0], [0], [1]]))


def test_fixed_orders_a_cell_by_token_then_k():
    # T=4, K=2, S=2 (T_s=2), E=4, cf=1 -> cell capacity ceil(2*2/4)=1; (t0,k0) beats (t1,k1) for
    # expert 0 and (t0,k1) beats (t1,k0) for expert 1.
    idx = _idx([[0, 1], [1, 0], [2, 3], [3, 2]])
    keep = plan_drops(idx, n_experts=4, n_shards=2, transport="fixed", capacity_factor=1.0)
    assert torch.equal(keep, _mask([[1, 1], [0, 0], [1, 1], [0, 0]]))
    # cf 1.5 -> ceil(1.5)=2 rows per cell: nothing overflows.
    assert bool(plan_drops(idx, n_experts=4, n_shards=2, transport="fixed", capacity_factor=1.5).all())


def test_fixed_cell_capacity_rounds_up_without_float_noise():
    assert fixed_cell_capacity(4, 1, 4, 1.0) == 1
    assert fixed_cell_capacity(20, 1, 1, 1.15) == 23  # 1.15*20 = 22.999999999999996 in floats
    assert fixed_cell_capacity(100, 8, 384, 1.33) == 3  # ceil(2.77)


# ---- ragged transport: pooled receiver capacity, 2 chunks of local experts --------------------------

# S=2, E=4 (2 local experts per receiver), T=8 (T_s=4), K=1, cf=1 -> pooled ceil(1*4*1)=4 rows per
# receiver; 2 chunks of 1 expert each with ceil(4/2)=2 rows.
_RAGGED_IDX = [[0], [0], [0], [1], [0], [1], [1], [1]]


def test_ragged_clips_an_overflowing_chunk_earlier_senders_first():
    keep = plan_drops(_idx(_RAGGED_IDX), n_experts=4, n_shards=2, transport="ragged", capacity_factor=1.0)
    # chunk 0 (expert 0): sender 0 sends 3, sender 1 sends 1 -> sender 0 fills both rows (t0, t1).
    # chunk 1 (expert 1): sender 0 sends 1 (t3), sender 1 sends 3 -> t3 and t5 fit, t6, t7 dropped.
    assert torch.equal(keep, _mask([[1], [1], [0], [1], [0], [1], [0], [0]]))


def test_ragged_single_chunk_pools_capacity_earlier_experts_first():
    keep = plan_drops(_idx(_RAGGED_IDX), n_experts=4, n_shards=2, transport="ragged", capacity_factor=1.0,
                      n_chunks=1)
    # One chunk of 4 rows in (expert, sender) order: e0/s0 takes 3, e0/s1 takes 1, expert 1 gets none.
    assert torch.equal(keep, _mask([[1], [1], [1], [0], [1], [0], [0], [0]]))


def test_ragged_keeps_an_unbalanced_cell_when_its_chunk_has_room():
    # cf=2: sender 0 sends all 4 of its rows to expert 0. Fixed cells hold ceil(2*4/4)=2 rows, so 2 are
    # dropped; ragged chunk 0 of receiver 0 (expert 0 alone) holds ceil(8/2)=4 rows, so none is.
    idx = _idx([[0], [0], [0], [0], [2], [2], [3], [3]])
    ragged = plan_drops(idx, n_experts=4, n_shards=2, transport="ragged", capacity_factor=2.0)
    fixed = plan_drops(idx, n_experts=4, n_shards=2, transport="fixed", capacity_factor=2.0)
    assert bool(ragged.all())
    assert torch.equal(fixed, _mask([[1], [1], [0], [0], [1], [1], [1], [1]]))


def test_ragged_capacity_splits_evenly_over_chunks_and_falls_back_to_one_chunk():
    assert ragged_capacities(4, 1, 2, 1.0, 2) == (4, 2)
    assert ragged_capacities(100, 8, 48, 1.15, 2) == (920, 460)
    assert ragged_capacities(100, 8, 3, 1.15, 2) == (920, 920)  # 3 local experts: one chunk
    assert ragged_capacities(1, 1, 4, 1.0, 2) == (4, 2)  # never below one row per local expert


def test_dropless_keeps_everything():
    idx = _idx(_RAGGED_IDX)
    assert bool(plan_drops(idx, n_experts=4, n_shards=2, transport="dropless", capacity_factor=None).all())


@pytest.mark.parametrize("kwargs, field", [
    (dict(n_shards=3), "n_shards"),  # T=8 not divisible by 3
    (dict(n_experts=6, n_shards=4), "n_experts"),
    (dict(transport="sparse"), "transport"),
    (dict(capacity_factor=None), "capacity_factor"),
    (dict(n_experts=1, n_shards=1), "0..0"),
])
def test_plan_drops_rejects_bad_layout_naming_the_field(kwargs, field):
    args = dict(n_experts=4, n_shards=2, transport="ragged", capacity_factor=1.0) | kwargs
    with pytest.raises(ValueError, match=field):
        plan_drops(_idx(_RAGGED_IDX), **args)


# ---- grouped GEMM -----------------------------------------------------------------------------------


def _loop_reference(x, w, counts, N):
    """The grouped GEMM written as a loop over experts, zeros past the last group."""
    ref, start = [], 0
    for e, c in enumerate(counts):
        ref.append(x[start:start + c] @ w[e])
        start += c
    ref.append(x.new_zeros(N - start, w.shape[2]))
    return torch.cat(ref)


def test_grouped_mm_equals_a_per_expert_loop_including_gradients():
    E, I, O = 5, 6, 7
    counts = [3, 0, 4, 0, 2]  # empty groups and 2 trailing rows past the last group
    N = sum(counts) + 2
    x = torch.randn(N, I, dtype=torch.float64, requires_grad=True)
    w = torch.randn(E, I, O, dtype=torch.float64, requires_grad=True)
    offs = torch.cumsum(torch.tensor(counts), 0).to(torch.int32)
    y = grouped_mm(x, w, offs)
    ref = _loop_reference(x, w, counts, N)
    assert torch.allclose(y, ref)
    g = torch.randn_like(ref)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    rx, rw = torch.autograd.grad(ref, (x, w), g)
    assert torch.allclose(gx, rx) and torch.allclose(gw, rw)
    assert torch.count_nonzero(gw[1]) == 0 and torch.count_nonzero(gx[-2:]) == 0


def _cpu_native(dtype):
    # torch builds before 2.9 have no CPU torch._grouped_mm; the pinned 2.13 has fp32 and bf16
    return pytest.param(dtype, marks=pytest.mark.skipif(
        dtype not in _CPU_GROUPED_MM_DTYPES, reason=f"this torch build has no CPU torch._grouped_mm for {dtype}"))


@pytest.mark.parametrize("dtype", [_cpu_native(torch.float32), _cpu_native(torch.bfloat16)])
def test_native_grouped_mm_zeroes_rows_past_the_last_group_without_a_host_sync(dtype):
    # torch._grouped_mm leaves those rows unspecified (uninitialised memory on CPU, garbage dx on
    # H200); the dropped assignments of a static-shape dispatch live there, so y and dx must be 0
    # even when x and dy hold NaN there.
    E, I, O = 4, 16, 8
    counts = [5, 0, 7, 3]
    N = sum(counts) + 6
    x = torch.randn(N, I).to(dtype)
    x[-6:] = float("nan")
    x.requires_grad_()
    w = (torch.randn(E, I, O) / I**0.5).to(dtype).requires_grad_()
    offs = torch.cumsum(torch.tensor(counts), 0).to(torch.int32)
    assert native_grouped_mm_ok(x, w)  # the native path, not the loop
    y = grouped_mm(x, w, offs)
    dy = torch.randn(N, O).to(dtype)
    dy[-6:] = float("nan")
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = x.detach().float()[:-6].requires_grad_(), w.detach().float().requires_grad_()
    ref = _loop_reference(xr, wr, counts, N - 6)
    rx, rw = torch.autograd.grad(ref, (xr, wr), dy[:-6].float())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)
    assert torch.count_nonzero(y[-6:]) == 0 and torch.count_nonzero(gx[-6:]) == 0
    assert torch.allclose(y[:-6].float(), ref, **tol)
    assert torch.allclose(gx[:-6].float(), rx, **tol) and torch.allclose(gw.float(), rw, **tol)


# ---- LocalDispatcher ------------------------------------------------------------------------------


def _routing(T, K, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    comb = torch.rand(T, K, generator=g, dtype=torch.float64)
    return idx, comb


def test_local_dispatcher_dropless_equals_dense_reference_with_gradients():
    T, K, E, W, H = 16, 2, 4, 6, 5
    ex = _experts(E, W, H)
    for p in (ex.w_gate_EWH, ex.w_up_EWH, ex.w_down_EHW):
        p.requires_grad_(True)
    x = torch.randn(T, W, dtype=torch.float64, requires_grad=True)
    idx, comb = _routing(T, K, E)
    comb.requires_grad_(True)
    y, stats = LocalDispatcher("fixed", 4, 1.0)(x, idx, comb, ex, dropless=True)
    ref = _dense_reference(x, idx, comb, torch.ones(T, K, dtype=torch.bool), ex)
    assert torch.allclose(y, ref)
    assert stats.dropped == 0 and stats.assigned == T * K
    leaves = (x, comb, ex.w_gate_EWH, ex.w_up_EWH, ex.w_down_EHW)
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(ref, leaves, g), strict=True):
        assert torch.allclose(a, b)


def test_local_dispatcher_dropless_runs_token_counts_the_shards_do_not_divide():
    T, K, E, W, H = 9, 2, 4, 6, 5  # 9 tokens over 4 shards: fine for eval (nothing is dropped)
    ex = _experts(E, W, H)
    x = torch.randn(T, W, dtype=torch.float64)
    idx, comb = _routing(T, K, E)
    d = LocalDispatcher("ragged", 4, 1.15)
    y, stats = d(x, idx, comb, ex, dropless=True)
    assert torch.allclose(y, _dense_reference(x, idx, comb, torch.ones(T, K, dtype=torch.bool), ex))
    assert stats.dropped == 0 and stats.dropped_per_shard is None
    with pytest.raises(ValueError, match="n_shards=4"):
        d(x, idx, comb, ex, dropless=False)


@pytest.mark.parametrize("transport, cf", [("fixed", 1.0), ("ragged", 0.8)])
def test_local_dispatcher_drops_exactly_the_planned_assignments(transport, cf):
    T, K, E, W, H, S = 32, 2, 8, 6, 5, 4
    ex = _experts(E, W, H)
    x = torch.randn(T, W, dtype=torch.float64)
    idx, comb = _routing(T, K, E, seed=1)
    keep = plan_drops(idx, n_experts=E, n_shards=S, transport=transport, capacity_factor=cf)
    assert not bool(keep.all())  # the case must actually drop
    y, stats = LocalDispatcher(transport, S, cf)(x, idx, comb, ex, dropless=False)
    assert torch.allclose(y, _dense_reference(x, idx, comb, keep, ex))
    assert stats.dropped == int((~keep).sum())
    assert stats.dropped_per_shard.tolist() == (~keep).view(S, -1).sum(1).tolist()
    assert isinstance(stats, DispatchStats) and stats.bytes_moved > 0


def _document_routing(n_shards, tokens_per_shard, docs_per_shard, E, K, preferred, p_pref, seed=0):
    """Packed documents, each with its own preferred experts: a shard holding few documents sends most
    of its rows to a few experts, while globally the load stays balanced."""
    g = torch.Generator().manual_seed(seed)
    n_docs = n_shards * docs_per_shard
    doc_len = tokens_per_shard // docs_per_shard
    pref_D = torch.stack([torch.randperm(E, generator=g)[:preferred] for _ in range(n_docs)])
    T = n_shards * tokens_per_shard
    doc_T = torch.arange(T) // doc_len
    scores_TE = torch.rand(T, E, generator=g)
    boost = torch.zeros(T, E)
    boost.scatter_(1, pref_D[doc_T], 1.0)
    use_pref = (torch.rand(T, 1, generator=g) < p_pref).float()
    return torch.topk(scores_TE + 2.0 * boost * use_pref, K, dim=1).indices


def test_fixed_drops_far_more_than_ragged_when_shards_hold_few_documents():
    S, Ts, E, K = 8, 512, 64, 4
    idx = _document_routing(S, Ts, docs_per_shard=2, E=E, K=K, preferred=24, p_pref=0.5)
    fixed = 1 - plan_drops(idx, n_experts=E, n_shards=S, transport="fixed", capacity_factor=1.33).float().mean()
    ragged = 1 - plan_drops(idx, n_experts=E, n_shards=S, transport="ragged", capacity_factor=1.15).float().mean()
    print(f"\ndocument-skewed routing S={S} T_s={Ts} E={E} K={K}: fixed cf1.33 drops {fixed:.2%}, "
          f"ragged cf1.15 drops {ragged:.2%}")
    assert fixed > 5 * ragged and fixed > 0.05


# ---- CUDA: the native grouped GEMM (skipped without a GPU) ------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_grouped_mm_on_cuda_matches_the_loop_and_accepts_zero_stride_gradients():
    E, I, O = 6, 64, 128
    counts = [40, 0, 17, 64, 0, 9]
    N = sum(counts) + 8  # trailing rows past the last group come back as zeros
    g = torch.Generator().manual_seed(0)
    x32 = torch.randn(N, I, generator=g)
    w32 = torch.randn(E, I, O, generator=g) / I**0.5
    offs = torch.cumsum(torch.tensor(counts), 0).to(torch.int32)
    x = x32.cuda().bfloat16().requires_grad_()
    w = w32.cuda().bfloat16().requires_grad_()
    cap = torch.cuda.get_device_capability()
    assert native_grouped_mm_ok(x, w) == (cap >= (9, 0))
    y = grouped_mm(x, w, offs.cuda())
    y.float().sum().backward()  # an expanded (zero-stride) upstream gradient
    xr, wr = x.detach().float().cpu().requires_grad_(), w.detach().float().cpu().requires_grad_()
    ref = _loop_reference(xr, wr, counts, N)  # a per-expert loop on the same bf16 values, in fp32
    ref.sum().backward()
    assert torch.allclose(y.float().cpu(), ref, atol=3e-2, rtol=2e-2)
    assert torch.count_nonzero(y[-8:]) == 0
    assert torch.allclose(x.grad.float().cpu(), xr.grad, atol=5e-2, rtol=2e-2)
    assert torch.allclose(w.grad.float().cpu(), wr.grad, atol=1e-1, rtol=2e-2)


@cuda
@pytest.mark.parametrize("transport, cf", [("fixed", 1.0), ("ragged", 0.8)])
def test_local_dispatcher_on_cuda_bf16_matches_cpu(transport, cf):
    T, K, E, W, H, S = 256, 4, 16, 64, 32, 4
    ex = _experts(E, W, H, dtype=torch.float32)
    x = torch.randn(T, W)
    idx, comb = _routing(T, K, E, seed=3)
    comb = comb.float()
    keep_cpu = plan_drops(idx, n_experts=E, n_shards=S, transport=transport, capacity_factor=cf)
    keep_gpu = plan_drops(idx.cuda(), n_experts=E, n_shards=S, transport=transport, capacity_factor=cf)
    assert torch.equal(keep_cpu, keep_gpu.cpu())
    exg = ExpertWeights(*(w.cuda().bfloat16() for w in (ex.w_gate_EWH, ex.w_up_EWH, ex.w_down_EHW)))
    y, stats = LocalDispatcher(transport, S, cf)(x.cuda().bfloat16(), idx.cuda(), comb.cuda().bfloat16(), exg,
                                                 dropless=False)
    exc = ExpertWeights(*(w.float().cpu() for w in (exg.w_gate_EWH, exg.w_up_EWH, exg.w_down_EHW)))
    ref = _dense_reference(x.bfloat16().float(), idx, comb.bfloat16().float(), keep_cpu, exc)
    assert stats.dropped == int((~keep_cpu).sum())
    assert (y.float().cpu() - ref).norm() / ref.norm() < 2e-2
