"""Real expert parallelism on gloo: EP transports and the EP MoE equal the single-process computation,
drops equal the planner's, sharded checkpoints reshard, bad layouts fail early (docs/method.md §2.1,
docs/architecture.md §5).

Two process launches serve every test, forked (a spawned rank imports torch again): 2 ranks (EP 2) and 4
ranks (EP 4 for the dispatcher, EP 2 x DP 2 for the MoE block). Each rank records its checks in a JSON file;
the tests below assert on them.
"""

import json
import os
import time
import traceback

import pytest
import torch
import torch.distributed as dist
from ranks import count_host_reads, free_port, run_ranks

from marin_ablate.marin.config import ModelConfig, Recipe
from marin_ablate.marin.dispatch import ExpertWeights, LocalDispatcher, plan_drops, pooled_wave_keep
from marin_ablate.marin.ep import init_ep
from marin_ablate.marin.ep_layout import check_ep_layout

# Multi-process training, torch.compile, simulated studies or real SLURM jobs (minutes on 2 cores) are marked
# `slow` one by one: the development loop (`python -m pytest -m "not slow"`) keeps the fast checks of this file.


# (transport, cf, dropless, routing): "random" top-k, or "hot" (most tokens pick experts 0 and 1, so
# pooled_wave drops both at the sender's pool for shard 0 and at its receiver's per-wave buffers)
TRANSPORT_CASES = (("fixed", 0.6, False, "random"), ("ragged", 0.6, False, "random"), ("ragged", 0.6, True, "random"),
                   ("pooled_wave", 1.0, False, "hot"))
TOL = 1e-9  # float64 for the dispatcher checks
TIMEOUT_S = 600  # seconds a launch may take before its ranks are killed



def _global_routing(T, K, E, W, H, routing="random"):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, W, generator=g, dtype=torch.float64)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    if routing == "hot":  # a hand-made imbalanced router: 70% of tokens pick expert 0 (and 1 second)
        hot = torch.rand(T, generator=g) < 0.7
        idx[:, 0] = torch.where(hot, 0, idx[:, 0])
        idx[:, 1] = torch.where(hot & (idx[:, 1] == 0), 1, idx[:, 1])
    comb = torch.rand(T, K, generator=g, dtype=torch.float64)
    ex = ExpertWeights(*(torch.randn(E, a, b, generator=g, dtype=torch.float64) / a**0.5
                         for a, b in ((W, H), (W, H), (H, W))))
    return x, idx, comb, ex


def _moe_cfg(S: int) -> ModelConfig:
    # Small capacities so that both transports drop in the training forward.
    return ModelConfig(d_model=32, n_heads=2, head_dim=16, n_experts=8, top_k=4, expert_hidden=16,
                       shared_hidden=16, ep_shards=S, capacity_fixed=0.6, capacity_ragged=0.6, capacity_pooled_wave=0.6)


def _init_moe(moe, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(moe.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return moe


class _Holder(torch.nn.Module):
    """A bare MoE block as the trainer's sharding sees a model: an MoE layer inside a root module."""

    def __init__(self, moe):
        super().__init__()
        self.moe = moe

    def forward(self, x):
        return self.moe(x)


def _sharded(model, groups):
    """The trainer's sharding (marin.parallel): experts sliced over EP, FSDP2 over the rest."""
    from marin_ablate.marin.ep import shard_experts
    from marin_ablate.marin.parallel import apply_fsdp

    return apply_fsdp(shard_experts(model, groups), groups)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _maxdiff(a, b) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def _host_reads(disp, idx, comb, dropless):
    """Host reads of one fp32 forward + backward through `disp`, widths 8 (16-byte rows: the grouped
    GEMM's native path, which reads nothing on the host, so what is counted is the exchange's)."""
    g = torch.Generator().manual_seed(8)
    x, comb = torch.randn(idx.shape[0], 8, generator=g).requires_grad_(), comb.float().requires_grad_()
    ex = ExpertWeights(*(torch.randn(disp.n_local, 8, 8, generator=g).requires_grad_() for _ in range(3)))
    with count_host_reads() as c:
        y, _ = disp(x, idx, comb, ex, dropless=dropless)
        y.sum().backward()
    return c.calls


def _check_dispatcher(rank, S, out):
    from marin_ablate.marin.ep import EPDispatcher

    T, K, E, W, H = 12 * S, 2, 2 * S, 6, 5
    Ts, El = T // S, E // S
    group = dist.new_group(list(range(S)))
    for transport, cf, dropless, routing in TRANSPORT_CASES:
        name = f"dispatch_{transport}{'_dropless' if dropless else ''}"
        try:
            x, idx, comb, ex = _global_routing(T, K, E, W, H, routing)
            xr, cr = x.clone().requires_grad_(), comb.clone().requires_grad_()
            exr = ExpertWeights(*(w.clone().requires_grad_() for w in (ex.w_gate_EWH, ex.w_up_EWH, ex.w_down_EHW)))
            y_ref, _ = LocalDispatcher(transport, S, cf)(xr, idx, cr, exr, dropless=dropless)
            g = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
            refs = torch.autograd.grad((y_ref * g).sum(), (xr, cr, exr.w_gate_EWH, exr.w_up_EWH, exr.w_down_EHW))
            sl, el = slice(rank * Ts, (rank + 1) * Ts), slice(rank * El, (rank + 1) * El)
            xl, cl = x[sl].clone().requires_grad_(), comb[sl].clone().requires_grad_()
            exl = ExpertWeights(*(w[el].clone().requires_grad_() for w in (ex.w_gate_EWH, ex.w_up_EWH, ex.w_down_EHW)))
            disp = EPDispatcher(transport, group, E, cf)
            y, stats = disp(xl, idx[sl], cl, exl, dropless=dropless)
            grads = torch.autograd.grad((y * g[sl]).sum(), (xl, cl, exl.w_gate_EWH, exl.w_up_EWH, exl.w_down_EHW))
            keep = plan_drops(idx, n_experts=E, n_shards=S, transport="dropless" if dropless else transport,
                              capacity_factor=cf)
            sender_keep, _ = pooled_wave_keep(idx, n_experts=E, n_shards=S, capacity_factor=cf, waves=3)
            out[name] = dict(
                y=_maxdiff(y, y_ref[sl]),
                grads=max(_maxdiff(a, b)
                          for a, b in zip(grads, (refs[0][sl], refs[1][sl]) + tuple(r[el] for r in refs[2:]),
                                          strict=True)),
                dropped=int(stats.dropped), planner_dropped=int((~keep[sl]).sum()), total_dropped=int((~keep).sum()),
                sender_dropped=int((~sender_keep).sum()), receiver_dropped=int((sender_keep.view(T, K) & ~keep).sum()),
                assigned=stats.assigned, host_reads=_host_reads(disp, idx[sl], comb[sl], dropless))
        except Exception:
            out[name] = dict(error=traceback.format_exc())


def _check_moe(rank, world, ep, out, tmp):
    from marin_ablate.marin.ep import build_ep_groups
    from marin_ablate.marin.moe import MoE

    groups = build_ep_groups(ep)
    B_l, L = 2, 8
    n_groups, Bg = world // ep, ep * B_l  # EP groups hold consecutive ranks, Bg sequences each
    for transport in ("fixed", "ragged", "pooled_wave"):
        name = f"moe_{transport}_ep{ep}_dp{n_groups}"
        try:
            cfg, recipe = _moe_cfg(ep), Recipe(ep_transport=transport)
            gen = torch.Generator().manual_seed(3)
            x = torch.randn(world * B_l, L, cfg.d_model, generator=gen)
            g = torch.randn(world * B_l, L, cfg.d_model, generator=gen)
            # Reference: one process, each EP group's tokens as ep virtual shards (drops are decided
            # per EP group), loss summed over all tokens.
            ref = _init_moe(MoE(cfg, recipe), seed=4).train()
            y_ref = torch.cat([ref(x[i * Bg:(i + 1) * Bg]).y_BSD for i in range(n_groups)])
            (y_ref * g).sum().backward()
            keep = torch.cat([plan_drops(_routing(ref, x[i * Bg:(i + 1) * Bg]), n_experts=cfg.n_experts, n_shards=ep,
                                         transport=transport, capacity_factor=cfg.capacity_factor(recipe))
                              for i in range(n_groups)])
            ep_moe = _sharded(_Holder(_init_moe(MoE(cfg, recipe), seed=4).train()), groups)
            sl = slice(rank * B_l, (rank + 1) * B_l)
            o = ep_moe(x[sl])
            (o.y_BSD * g[sl]).sum().backward()
            El = ref.w_gate_EWH.shape[0] // ep
            el = slice(groups.ep_rank * El, (groups.ep_rank + 1) * El)
            ref_p = dict(ref.named_parameters())
            gdiff = 0.0
            for n, p in ep_moe.named_parameters():
                n = n.removeprefix("moe.")
                want = ref_p[n].grad[el] if n.endswith("_EWH") or n.endswith("_EHW") else ref_p[n].grad
                # gradients of the mean of the per-rank losses (FSDP2 DTensors over dp, or EP slices)
                gdiff = max(gdiff, _maxdiff(_full(p.grad) * world, want))
            Ts = B_l * L
            out[name] = dict(y=_maxdiff(o.y_BSD, y_ref[sl]), grads=gdiff, dropped=int(o.dispatch.dropped),
                             planner_dropped=int((~keep[rank * Ts:(rank + 1) * Ts]).sum()),
                             total_dropped=int((~keep).sum()))
        except Exception:
            out[name] = dict(error=traceback.format_exc())


def _check_model(rank, world, ep, out):
    from marin_ablate.marin.ep import build_ep_groups
    from marin_ablate.marin.model import MarinModel

    groups = build_ep_groups(ep)
    n_groups, L = world // ep, 16
    for transport in ("fixed", "ragged"):
        name = f"model_{transport}_ep{ep}_dp{n_groups}"
        try:
            cfg = ModelConfig(seq_len=L, window=8, ep_shards=ep, capacity_fixed=0.6, capacity_ragged=0.6)
            recipe = Recipe(ep_transport=transport)
            gen = torch.Generator().manual_seed(5)
            tok = torch.randint(0, cfg.vocab_size, (world, L + 1), generator=gen)
            doc = (torch.arange(L) >= L // 2).long().expand(world, L)  # two packed documents per row
            torch.manual_seed(6)
            ref = MarinModel(cfg, recipe).train()
            state = {k: v.clone() for k, v in ref.state_dict().items()}
            # The objective of data parallel: the mean of per-rank mean losses = mean of per-group losses.
            outs = [ref(tok[i * ep:(i + 1) * ep, :-1], doc[i * ep:(i + 1) * ep], tok[i * ep:(i + 1) * ep, 1:])
                    for i in range(n_groups)]
            (sum(o.loss for o in outs) / n_groups).backward()
            logits_ref = torch.cat([o.logits_BSV for o in outs])
            model = MarinModel(cfg, recipe)
            model.load_state_dict(state)
            model = _sharded(model.train(), groups)
            o = model(tok[rank:rank + 1, :-1], doc[rank:rank + 1], tok[rank:rank + 1, 1:])
            o.loss.backward()
            El = cfg.n_experts // ep
            el = slice(groups.ep_rank * El, (groups.ep_rank + 1) * El)
            ref_p = dict(ref.named_parameters())
            gdiff = 0.0
            for n, p in model.named_parameters():
                want = ref_p[n].grad[el] if n.endswith("_EWH") or n.endswith("_EHW") else ref_p[n].grad
                gdiff = max(gdiff, _maxdiff(_full(p.grad), want))
            out[name] = dict(y=_maxdiff(o.logits_BSV, logits_ref[rank:rank + 1]), grads=gdiff,
                             dropped=o.stats["dropped"])
        except Exception:
            out[name] = dict(error=traceback.format_exc())


def _ckpt_reference():
    """One AdamW step of the ragged MoE block on 4 sequences, in one process: what the 2-rank run
    (2 sequences per rank, loss averaged over ranks) saves."""
    from marin_ablate.marin.moe import MoE

    cfg = _moe_cfg(2)
    ref = _init_moe(MoE(cfg, Recipe(ep_transport="ragged")), seed=4).train()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x = torch.randn(4, 8, cfg.d_model, generator=torch.Generator().manual_seed(7))
    (ref(x).y_BSD.pow(2).sum() / 2).backward()
    opt.step()
    return ref, opt, x


def _check_checkpoint(rank, world, out, tmp):
    """2 ranks (EP 2, FSDP2) take the reference step and save model + optimizer; 4 ranks (EP 2 x DP 2)
    load both into a differently initialised model."""
    from marin_ablate.marin.ep import build_ep_groups, load_checkpoint, save_checkpoint
    from marin_ablate.marin.moe import MoE

    try:
        groups = build_ep_groups(2)
        cfg = _moe_cfg(2)
        ref, ref_opt, x = _ckpt_reference()
        if world == 2:
            moe = _sharded(_Holder(_init_moe(MoE(cfg, Recipe(ep_transport="ragged")), seed=4).train()), groups)
            opt = torch.optim.AdamW(moe.parameters(), lr=1e-2)
            moe(x[2 * rank:2 * rank + 2]).y_BSD.pow(2).sum().backward()
            opt.step()
            save_checkpoint(moe, os.path.join(tmp, "ckpt"), groups, opt)
            return
        moe = _sharded(_Holder(_init_moe(MoE(cfg, Recipe(ep_transport="ragged")), seed=99).train()), groups)
        opt = torch.optim.AdamW(moe.parameters(), lr=1e-2)
        load_checkpoint(moe, os.path.join(tmp, "ckpt"), groups, opt)
        El = cfg.n_experts // 2
        el = slice(groups.ep_rank * El, (groups.ep_rank + 1) * El)
        ref_p = dict(ref.named_parameters())
        pdiff = sdiff = 0.0
        for n, p in moe.named_parameters():
            q = ref_p[n.removeprefix("moe.")]
            full = (lambda t: t.full_tensor()) if hasattr(p, "full_tensor") else (lambda t: t)
            want = (lambda t: t[el]) if (n.endswith("_EWH") or n.endswith("_EHW")) else (lambda t: t)
            pdiff = max(pdiff, _maxdiff(full(p).detach(), want(q).detach()))
            for k in ("exp_avg", "exp_avg_sq"):
                r = want(ref_opt.state[q][k])
                sdiff = max(sdiff, _maxdiff(full(opt.state[p][k]), r) / (float(r.abs().max()) + 1e-12))
            sdiff = max(sdiff, abs(float(opt.state[p]["step"]) - float(ref_opt.state[q]["step"])))
        out["ckpt_load_4"] = dict(params=pdiff, optim=sdiff)  # optim: relative to the largest entry
    except Exception:
        out["ckpt_load_4"] = dict(error=traceback.format_exc())


def _routing(moe, x):
    """The routing the MoE block used (its router is deterministic given weights and input)."""
    with torch.no_grad():
        return moe.router(x.reshape(-1, x.shape[-1])).expert_idx_TK


def _worker(rank, world, port, tmp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = {}
    try:
        t0 = time.perf_counter()
        _check_dispatcher(rank, world, out)
        t1 = time.perf_counter()
        _check_moe(rank, world, 2, out, tmp)
        t2 = time.perf_counter()
        _check_model(rank, world, 2, out)
        _check_checkpoint(rank, world, out, tmp)
        out["seconds"] = dict(dispatch=t1 - t0, moe=t2 - t1, model=time.perf_counter() - t2)
    finally:
        with open(os.path.join(tmp, f"w{world}_r{rank}.json"), "w") as f:
            json.dump(out, f)
        dist.barrier()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ep_runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("ep"))
    results = {}
    for world in (2, 4):
        run_ranks(_worker, (world, free_port(), tmp), world, TIMEOUT_S)
        results[world] = [json.load(open(os.path.join(tmp, f"w{world}_r{r}.json"))) for r in range(world)]
    return tmp, results


def _rows(results, name):
    rows = [r[name] for r in results]
    for row in rows:
        assert "error" not in row, row.get("error")
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", ["dispatch_fixed", "dispatch_ragged", "dispatch_ragged_dropless",
                                  "dispatch_pooled_wave"])
def test_ep_dispatcher_equals_single_process_forward_backward_and_drops(ep_runs, world, case):
    rows = _rows(ep_runs[1][world], case)
    for row in rows:
        assert row["y"] < TOL and row["grads"] < TOL
        assert row["dropped"] == row["planner_dropped"]
    if "dropless" in case:
        assert rows[0]["total_dropped"] == 0
    else:
        assert rows[0]["total_dropped"] > 0  # the case must exercise dropping
    if case == "dispatch_pooled_wave":  # both gates drop: the sender's pools and the receivers' buffers
        assert rows[0]["sender_dropped"] > 0 and rows[0]["receiver_dropped"] > 0
        assert sum(row["dropped"] for row in rows) == rows[0]["total_dropped"]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case,reads", [("dispatch_fixed", 0), ("dispatch_pooled_wave", 0), ("dispatch_ragged", 1),
                                        ("dispatch_ragged_dropless", 1)])
def test_ep_exchange_host_reads_static_transports_none_ragged_one_per_dispatch(ep_runs, world, case, reads):
    # forward + backward of one dispatch, 2 chunks for ragged: its split sizes are read in one .tolist()
    for row in _rows(ep_runs[1][world], case):
        assert len(row["host_reads"]) == reads, row["host_reads"]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("transport", ["fixed", "ragged", "pooled_wave"])
def test_ep_moe_block_with_data_parallel_equals_single_process(ep_runs, world, transport):
    rows = _rows(ep_runs[1][world], f"moe_{transport}_ep2_dp{world // 2}")
    for row in rows:
        assert row["y"] < 1e-5 and row["grads"] < 1e-4
        assert row["dropped"] == row["planner_dropped"]
    assert rows[0]["total_dropped"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("transport", ["fixed", "ragged"])
def test_ep_marin_model_with_fsdp2_equals_single_process(ep_runs, world, transport):
    rows = _rows(ep_runs[1][world], f"model_{transport}_ep2_dp{world // 2}")
    for row in rows:
        assert row["y"] < 1e-4 and row["grads"] < 1e-5
    assert sum(row["dropped"] for row in rows) > 0


@pytest.mark.slow
def test_checkpoint_saved_by_2_ranks_loads_in_1_and_in_4(ep_runs):
    from marin_ablate.marin.ep import load_checkpoint
    from marin_ablate.marin.moe import MoE

    tmp, results = ep_runs
    ref, ref_opt, _ = _ckpt_reference()
    one = _Holder(_init_moe(MoE(_moe_cfg(2), Recipe(ep_transport="ragged")), seed=99))
    opt = torch.optim.AdamW(one.parameters(), lr=1e-2)
    load_checkpoint(one, os.path.join(tmp, "ckpt"), optimizer=opt)
    for (n, p), (_, q) in zip(one.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), n
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(opt.state[p][k], ref_opt.state[q][k], rtol=1e-4, atol=1e-6), (n, k)
        assert float(opt.state[p]["step"]) == 1.0
    for row in _rows(results[4], "ckpt_load_4"):
        assert row["params"] < 1e-6 and row["optim"] < 1e-5


def test_bad_ep_layout_names_the_numbers():
    with pytest.raises(ValueError, match=r"n_experts=6.*ep_size=4"):
        check_ep_layout(6, 4, 4)
    with pytest.raises(ValueError, match=r"ep_size=3.*world_size=4"):
        check_ep_layout(12, 3, 4)
    check_ep_layout(8, 2, 4)


def test_init_ep_rejects_bad_layout_before_any_collective(monkeypatch):
    # WORLD_SIZE=4 with no peers: reaching init_process_group would hang, so a prompt error proves
    # the check runs first.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    with pytest.raises(ValueError, match=r"n_experts=6"):
        init_ep(n_experts=6, ep_size=4, backend="gloo")
    with pytest.raises(ValueError, match=r"ep_size=3.*world_size=4"):
        init_ep(n_experts=12, ep_size=3, backend="gloo")
    assert not dist.is_initialized()


def test_dist_env_reads_torchrun_then_slurm_variables(monkeypatch):
    from marin_ablate.marin.ep import dist_env

    # submitit's export writes os.environ directly: setenv first so monkeypatch restores every key.
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "SUBMITIT_EXECUTOR", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    assert dist_env().source == "single" and dist_env().world_size == 1
    slurm = dict(SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="42", SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1",
                 SLURM_JOB_NODELIST="localhost,node2", SLURM_STEP_NODELIST="localhost,node2", SLURM_JOB_NUM_NODES="2",
                 SLURM_NODEID="1")
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    e = dist_env()
    assert (e.source, e.rank, e.world_size, e.local_rank) == ("slurm", 3, 4, 1)
    # exported for init_process_group: the first node, resolved; the port from the job id
    assert os.environ["RANK"] == "3" and os.environ["MASTER_ADDR"] == "127.0.0.1"
    assert os.environ["MASTER_PORT"] == str(20000 + 42)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert dist_env().source == "torchrun" and dist_env().rank == 1
