"""Making the hero fit: activation checkpointing and the chunked loss change no number; the hero's
eval batch and data path; the per-rank memory plan and its dry run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from marin_ablate.marin.config import ModelConfig, Recipe
from marin_ablate.marin.model import MarinModel

# Multi-process training, torch.compile, simulated studies or real SLURM jobs (minutes on 2 cores) are marked
# `slow` one by one: the development loop (`python -m pytest -m "not slow"`) keeps the fast checks of this file.


CFG = ModelConfig(seq_len=16, window=6, n_layers=2, global_every=2)
B, S = 2, 16


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, CFG.vocab_size, (B, S + 1), generator=g)
    docs = (torch.arange(S) >= S // 3).long().expand(B, S)
    targets = tok[:, 1:].clone()
    targets[0, :3] = -100  # some ignored targets: the sums must skip them
    return tok[:, :-1], docs, targets


def _twin(recipe: Recipe, cfg: ModelConfig = CFG, **kw) -> tuple[MarinModel, MarinModel]:
    torch.manual_seed(3)
    ref = MarinModel(cfg, recipe).train()
    other = MarinModel(cfg, recipe, **kw).train()
    other.load_state_dict(ref.state_dict())
    return ref, other


def _step(model: MarinModel, seed: int):
    tok, docs, targets = _batch(seed)
    out = model(tok, docs, targets)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.update_router_biases()
    biases = [r.bias_E.clone() for r in (b.moe.router for b in model.blocks)]
    model.zero_grad(set_to_none=True)
    return out, grads, biases


TOPK = dataclasses.replace(CFG, qb_estimator="topk")


@pytest.mark.slow
@pytest.mark.parametrize("recipe,cfg", [(Recipe(), CFG), (Recipe(), TOPK), (Recipe(router_balance="aux_free"), CFG),
                                        (Recipe(router_balance="switch_aux"), CFG)],
                         ids=["qb_hist", "qb_topk", "aux_free", "switch_aux"])
def test_block_checkpointing_leaves_losses_grads_and_router_biases_unchanged(recipe, cfg):
    ref, ck = _twin(recipe, cfg, activation_checkpoint="block")
    for seed in range(3):  # biases of step s steer the routing of step s+1: drift would compound
        a, ga, ba = _step(ref, seed)
        b, gb, bb = _step(ck, seed)
        torch.testing.assert_close(b.loss, a.loss, rtol=0, atol=0)
        torch.testing.assert_close(b.aux_loss, a.aux_loss, rtol=0, atol=0)
        for n in ga:
            torch.testing.assert_close(gb[n], ga[n], rtol=1e-6, atol=1e-7, msg=n)
        for x, y in zip(bb, ba, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    if recipe.router_balance != "switch_aux":  # the balancing really moved the biases
        assert any(bool(b.abs().sum() > 0) for b in ba)


@pytest.mark.slow
def test_block_checkpointing_records_router_statistics_once_per_forward():
    _, ck = _twin(Recipe(), TOPK, activation_checkpoint="block")
    tok, docs, targets = _batch()
    ck(tok, docs, targets).loss.backward()  # the backward reruns every block
    assert [b.moe.router._n_forwards for b in ck.blocks] == [1, 1]


@pytest.mark.parametrize("chunk", [1, 5, 7, B * S, 4 * B * S])
def test_chunked_loss_equals_full_loss_and_gradients(chunk):
    ref, ch = _twin(Recipe(), loss_chunk_tokens=chunk)
    a, ga, _ = _step(ref, 0)
    b, gb, _ = _step(ch, 0)
    assert a.logits_BSV is not None and b.logits_BSV is None  # the chunked forward never built them
    for f in ("loss", "ce_loss", "z_loss"):
        torch.testing.assert_close(getattr(b, f), getattr(a, f), rtol=1e-6, atol=1e-6)
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], rtol=1e-5, atol=1e-7, msg=n)


def test_loss_matches_an_independent_cross_entropy():
    torch.manual_seed(0)
    model = MarinModel(CFG, Recipe(), loss_chunk_tokens=5).train()
    tok, docs, targets = _batch()
    out = model(tok, docs, targets)
    with torch.no_grad():
        logits = MarinModel.forward(model, tok, docs).logits_BSV.double().reshape(B * S, -1)
    t = targets.reshape(-1)
    keep = t != -100
    lp = torch.log_softmax(logits[keep], -1)
    ce = -lp.gather(1, t[keep, None]).mean()
    z = CFG.z_loss_weight * torch.logsumexp(logits[keep], -1).pow(2).mean()
    torch.testing.assert_close(out.ce_loss.double(), ce, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.z_loss.double(), z, rtol=1e-5, atol=1e-9)


def test_all_targets_ignored_gives_zero_loss_with_a_graph():
    torch.manual_seed(0)
    model = MarinModel(CFG, Recipe(router_balance="quantile"), loss_chunk_tokens=7).train()
    tok, docs, targets = _batch()
    out = model(tok, docs, torch.full_like(targets, -100))
    assert float(out.ce_loss.detach()) == 0.0 and out.loss.requires_grad
    out.loss.backward()


def test_memory_switches_reject_bad_levels():
    with pytest.raises(ValueError, match="activation_checkpoint.*none, block"):
        MarinModel(CFG, Recipe(), activation_checkpoint="full")
    from marin_ablate.marin.config import TrainConfig
    with pytest.raises(ValueError, match="activation_checkpoint"):
        TrainConfig(activation_checkpoint="layer")
    with pytest.raises(ValueError, match="loss_chunk_tokens"):
        TrainConfig(loss_chunk_tokens=-1)
    with pytest.raises(ValueError, match="eval_batch_size"):
        TrainConfig(eval_batch_size=0)
    assert dataclasses.replace(TrainConfig(), activation_checkpoint="block").activation_checkpoint == "block"


def _small_hero(**train):
    """The hero's layout rules at a width and world a CPU test affords: 8 GPUs, EP 4, 2 sequences each."""
    from marin_ablate.marin.config import RunSpec, TrainConfig

    model = ModelConfig(d_model=64, n_layers=2, n_heads=4, head_dim=16, seq_len=64, window=32, n_experts=8,
                        top_k=2, ep_shards=4)
    t = TrainConfig(**{"batch_size": 16, "activation_checkpoint": "block", "loss_chunk_tokens": 32, **train})
    return RunSpec(model=model, recipe=Recipe(), train=t)


@pytest.mark.slow
def test_dry_run_at_a_reduced_layout_fits_with_checkpointing_and_names_the_line_without_it():
    from marin_ablate.planning.dryrun import GiB, dry_run

    on = dry_run(_small_hero(), 8, 4, capacity_gib=1.0, reserve_gib=0.5, levels=("hyperball", "adamw"))
    assert on["ranks"] == [0, 3, 4, 7] and on["experts_per_rank"] == 2 and on["sequences_per_rank"] == 2
    t = {lv: {r["line"].split(" (")[0]: r["bytes"] for r in on["tables"][lv]["rows"]} for lv in on["tables"]}
    assert t["hyperball"]["parameters"] == t["hyperball"]["gradients"] > 0
    assert t["hyperball"]["activations kept"] > 0 and t["hyperball"]["transient: backward working set"] > 0
    assert t["hyperball"]["transient: FSDP2 gathered weights + unsharded grads"] > 0
    # the AdamW arm keeps two moments where MuonH keeps one momentum
    assert t["adamw"]["optimizer adamw [matrix]"] == 2 * t["hyperball"]["optimizer muonh [matrix]"]
    # a budget between the two: checkpointing on fits, off does not, and the table says which line broke it
    total_on = on["tables"]["hyperball"]["total"]
    off_spec = _small_hero(activation_checkpoint="none")
    cap = 0.5 + 1.02 * total_on / GiB
    off = dry_run(off_spec, 8, 4, capacity_gib=cap, reserve_gib=0.5, levels=("hyperball",))
    assert total_on <= (cap - 0.5) * GiB and not off["ok"]
    kept_off = {r["line"].split(" (")[0]: r["bytes"] for r in off["tables"]["hyperball"]["rows"]}["activations kept"]
    assert kept_off > t["hyperball"]["activations kept"]
    assert off["tables"]["hyperball"]["over_budget"]


# ---------------------------------------------------------------------------------------------
# The hero's sbatch, its rack pre-flight and its checkpoint arithmetic (planning/hero.py)
# ---------------------------------------------------------------------------------------------


def test_hero_sbatch_sets_nccl_binding_segment_preflight_and_no_local_python():
    import sys

    from marin_ablate.ablations.studies import HeroPlan
    from marin_ablate.planning.hero import NCCL_ENV, render_sbatch

    script = render_sbatch(HeroPlan())
    for k, v in NCCL_ENV.items():
        assert f"export {k}={v}" in script
    for flag in ("#SBATCH --nodes=176", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=36", "#SBATCH --segment=16", "#SBATCH --signal=USR2@300",
                 "#SBATCH --exclusive", "#SBATCH --requeue", "#SBATCH --mem=0", "export OMP_NUM_THREADS=36"):
        assert flag in script, flag
    train_srun = [ln for ln in script.splitlines() if "submitit.core._submit" in ln]
    assert len(train_srun) == 1
    for arg in ("--cpu-bind=cores", "--gpu-bind=single:1", "--distribution=block:block", "--kill-on-bad-exit=1",
                "${MARIN_PYTHON:-python} -u -m submitit.core._submit"):
        assert arg in train_srun[0], arg
    # the pre-flight runs before the training srun and ends the job when it fails
    pre = script.index("-m marin_ablate.planning.hero check-racks --nodes-per-ep-group 16")
    assert pre < script.index("submitit.core._submit") and "|| exit 1" in script[pre:pre + 200]
    assert sys.executable not in script


def test_run_hero_submits_the_shape_plan_prints():
    from types import SimpleNamespace

    from marin_ablate.ablations import get_study
    from marin_ablate.planning.hero import NCCL_ENV
    from marin_ablate.sweeps.executors import SlurmOptions, sbatch_params, slurm_resources
    from marin_ablate.sweeps.sweep import study_resources

    study = get_study("hero")
    res = slurm_resources(SimpleNamespace(meta={"rung": "hero_535b"}), SlurmOptions(), study_resources(study))
    p = sbatch_params(res, SlurmOptions(), 1, "hero")
    assert res["python"] == "${MARIN_PYTHON:-python}" and p["nodes"] == 176 and p["signal_delay_s"] == 300
    assert "--gpu-bind=single:1" in p["srun_args"] and p["additional_parameters"]["segment"] == 16
    assert all(f"export {k}={v}" in p["setup"] for k, v in NCCL_ENV.items())
    assert hash(tuple(sorted(res.items())))  # runs are grouped by their resources


def _node(host: str, domain: str | None) -> tuple[str, str | None]:
    return host, domain


def test_rack_check_fails_on_ep_groups_that_straddle_racks():
    from marin_ablate.planning.hero import check_ep_racks

    # 2 racks of 18 trays, 32 nodes in job order: EP groups of 16 nodes
    ok = [_node(f"a{i}", "uuidA/1") for i in range(16)] + [_node(f"b{i}", "uuidB/1") for i in range(16)]
    check_ep_racks(ok, 16)
    # two spare trays of rack A fill the start of group 1: it straddles A and B
    bad = [_node(f"a{i}", "uuidA/1") for i in range(18)] + [_node(f"b{i}", "uuidB/1") for i in range(14)]
    with pytest.raises(ValueError, match=r"EP group 1 \(nodes 16\.\.31\) spans 2 NVLink domains: uuidA/1: a16, a17;"):
        check_ep_racks(bad, 16)
    # same ClusterUUID but another clique (a partition of the fabric) is another domain
    with pytest.raises(ValueError, match="EP group 0"):
        check_ep_racks([_node(f"a{i}", "uuidA/1" if i < 8 else "uuidA/2") for i in range(16)], 16)
    with pytest.raises(ValueError, match=r"nodes \['a3'\] report no NVLink fabric"):
        check_ep_racks([_node(f"a{i}", None if i == 3 else "uuidA/1") for i in range(16)], 16)
    with pytest.raises(ValueError, match="do not split into EP groups of 16"):
        check_ep_racks(ok[:20], 16)


FABRIC = """GPU 00000008:01:00.0
    Product Name                          : NVIDIA GB200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : {clique}
        ClusterUUID                       : {uuid}
        Health
            Bandwidth                     : Full
"""


def _report(uuid: str, clique: int = 32766, imex: bool = True, gpus: int = 4) -> str:
    head = "IMEX_CHANNEL channel0\n" if imex else ""
    return head + "\n".join(FABRIC.format(uuid=uuid, clique=clique) for _ in range(gpus))


def test_fabric_report_parses_the_domain_and_rejects_an_unready_fabric():
    from marin_ablate.planning.hero import parse_fabric

    u = "5f1e4bd7-3f1a-4c7e-9a0b-1c2d3e4f5a6b"
    assert parse_fabric(_report(u)) == {"domain": f"{u}/32766", "imex": True}
    assert parse_fabric(_report(u, imex=False))["imex"] is False
    assert parse_fabric(_report("00000000-0000-0000-0000-000000000000"))["domain"] is None
    assert parse_fabric(_report(u).replace("Completed", "In Progress", 1))["domain"] is None  # one GPU not ready
    assert parse_fabric("no fabric section")["domain"] is None


def test_check_racks_command_reads_the_preflight_folder_and_exits_1_on_a_straddle(tmp_path, capsys):
    from marin_ablate.planning.hero import main

    nodes = [f"n{i:03d}" for i in range(8)]
    (tmp_path / "nodes").write_text("\n".join(nodes) + "\n")
    for i, h in enumerate(nodes):
        (tmp_path / f"{h}.txt").write_text(_report("uuid-a" if i < 4 else "uuid-b"))
    assert main(["check-racks", "--dir", str(tmp_path), "--nodes-per-ep-group", "4"]) == 0
    assert main(["check-racks", "--dir", str(tmp_path), "--nodes-per-ep-group", "8"]) == 1
    assert "EP group 0 (nodes 0..7) spans 2 NVLink domains" in capsys.readouterr().err
    (tmp_path / "n005.txt").write_text(_report("uuid-b", imex=False))
    assert main(["check-racks", "--dir", str(tmp_path), "--nodes-per-ep-group", "4"]) == 1
    assert "['n005'] have no IMEX channel" in capsys.readouterr().err


def test_checkpoint_bytes_count_every_parameter_and_optimizer_buffer_of_the_built_model():
    from marin_ablate.marin.config import RunSpec
    from marin_ablate.planning.hero import checkpoint_plan, params_by_role

    spec = RunSpec(model=CFG, recipe=Recipe())
    model = MarinModel(CFG, Recipe())
    roles = model.param_roles()
    built: dict[str, int] = {}
    for n, p in model.named_parameters():
        built[roles[n]] = built.get(roles[n], 0) + p.numel()
    assert params_by_role(spec) == built
    cp = checkpoint_plan(spec, gpus=4, window_s=100.0)
    n = sum(built.values())
    one = built["matrix"] + built["expert"]  # MuonH: one momentum; Adam/AdamH: two moments
    assert cp["levels"]["hyperball"]["total_bytes"] == 4 * n + 4 * one + 8 * (n - one)
    assert cp["levels"]["adamw"]["total_bytes"] == 4 * n + 8 * n
    assert cp["levels"]["adamw"]["write_gb_per_s"] == pytest.approx(12 * n / 1e9 / 100.0)


def test_hero_checkpoint_needs_about_15_gb_per_s_inside_the_preemption_window():
    from marin_ablate.ablations import get_study
    from marin_ablate.planning.hero import HeroSlurm, checkpoint_plan

    study = get_study("hero")
    cp = checkpoint_plan(study.runs()[0][0], study.hero.gpus, HeroSlurm().preemption_window_s)
    hb = cp["levels"]["hyperball"]
    assert 4.2e12 < hb["total_bytes"] < 4.4e12 and 14 < hb["write_gb_per_s"] < 15  # 535B x (4 + 4 + ~4) bytes
    assert cp["levels"]["adamw"]["total_bytes"] == pytest.approx(12 * 535_477_088_256, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# The hero's data path and training loop at a reduced layout (plan --dry-run part (a))
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared_corpus(tmp_path_factory):
    """A prepared corpus (token shards + manifest) and a Paloma-layout eval folder from the embedded text."""
    import gzip
    import json

    from marin_ablate.marin import data
    from marin_ablate.marin.data import prepare as prep

    root = tmp_path_factory.mktemp("hero_data")
    rows = []
    for dom in ("code", "docs", "prose"):
        lines = (data.embedded_corpus_dir() / dom / "train.jsonl").read_text().splitlines()[:40]
        rows += [(dom, json.loads(x)["text"]) for x in lines]
    (root / "src").mkdir()
    with open(root / "src" / "a.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t, "source": d}) + "\n" for d, t in rows)
    data.train_bpe((t for _, t in rows), 512, root / "tokenizer.json")
    prep.prepare(prep.PrepareConfig(source=str(root / "src"), tokenizer=str(root / "tokenizer.json"),
                                    out=str(root / "corpus"), text_column="text", domain_column="source", num_proc=1))
    for dom in ("code", "docs"):
        (root / "paloma" / dom / "val").mkdir(parents=True)
        with gzip.open(root / "paloma" / dom / "val" / "val_0.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for d, t in rows if d == dom)
    return root / "corpus", root / "paloma"


def test_hero_study_refuses_the_embedded_corpus_at_plan_time():
    from marin_ablate.ablations import get_study
    from marin_ablate.ablations.epochs import check_study_epochs

    study = get_study("hero")
    with pytest.raises(ValueError, match="data.corpus='embedded' is the small CPU test corpus"):
        check_study_epochs(study.runs(), study.describe()["rungs"], allow_repeat=True)


@pytest.mark.slow
def test_hero_loop_at_a_reduced_layout_reads_rank_slices_evaluates_and_builds_its_checkpoint(prepared_corpus, tmp_path):
    """The hero preset through the real Trainer at world 4 = 2 racks x EP 2 (fake process group, HSDP as
    the hero's racks), narrowed to 16 experts: each rank reads its own slice of the prepared corpus, evaluates
    one sequence of the hero's one-per-GPU eval batch, and holds 8 experts; losses are finite; the state dict
    is complete."""
    from marin_ablate.ablations import get_study
    from marin_ablate.planning.dryrun import format_loop, loop_dry_run

    corpus, paloma = prepared_corpus
    spec = get_study("hero").runs()[0][0].with_overrides(
        ["model.n_experts=16", "model.top_k=4", "model.ep_shards=2", "train.replica_groups=2",
         f"data.corpus={corpus}", f"data.eval_dir={paloma}", "data.mixture="])
    assert spec.model.attention == "flex" and spec.train.eval_batch_size == 704  # the hero's; narrowed below
    rep = loop_dry_run(spec, 4, 2, tmp_path, seq_len=64)
    assert rep["ranks"] == [0, 1, 2, 3]
    for r in rep["rows"]:
        # the hero's two context stages (16k from 90%, 65k from 95%) each train a step: 3 steps, tokens per step held
        assert r["dp_ep"] == divmod(r["rank"], 2) and r["experts_per_rank"] == 8 and r["steps"] == 3
        assert {k: r["data"][k] for k in ("rank_slices", "train_rows")} == {"rank_slices": True, "train_rows": 4}
        assert [st[:3] for st in r["data"]["stages"]] == [(0, 16, 4), (1, 32, 2), (2, 64, 1)]
        assert np_finite(r["loss"]) and np_finite(r["eval_macro_loss"]) and r["all_to_alls"] > 0
        assert r["checkpoint_tensors"] > 0
    assert "rank     3 (dp, ep) = (1, 1): 8 experts" in format_loop(rep)


@pytest.mark.slow
def test_a_one_gpu_rung_dry_runs_as_one_process_with_virtual_ep_and_writes_its_final_checkpoint(tmp_path):
    """d512 on one GPU (`--slurm.gpus_per_run 1`, `plan --dry_run --dry_run.gpus 1`) trains with 8 virtual EP shards and
    no process group: the loop (a) and the state count run that single-process trainer (every expert local,
    no all-to-all), not an 8-rank group."""
    from marin_ablate.ablations import get_study
    from marin_ablate.planning.dryrun import current_sharding, format_loop, loop_dry_run, rank_state

    spec = get_study("marin535").runs()[0][0]
    assert spec.model.ep_shards == 8
    rep = loop_dry_run(spec, 1, spec.model.ep_shards, tmp_path, seq_len=64)
    (row,) = rep["rows"]
    n_e = spec.model.moe_geometry(spec.recipe).n_experts
    assert rep["ranks"] == [0] and row["dp_ep"] == (0, 0) and row["experts_per_rank"] == n_e
    assert row["all_to_alls"] == 0 and row["steps"] == 2 and np_finite(row["loss"])
    assert list((tmp_path / "rank0" / "checkpoints").glob("ckpt_000000002/meta.json"))
    assert "one process (virtual EP 8, no process group" in format_loop(rep)
    st = rank_state(spec, 1, 8, 0, current_sharding(spec))
    assert st["experts_per_rank"] == n_e and (st["dp_rank"], st["ep_rank"]) == (0, 0)


def np_finite(x) -> bool:
    import math

    return x is not None and math.isfinite(x)


def test_fake_collectives_reject_split_sizes_that_do_not_match_the_tensors():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from marin_ablate.planning.dryrun import FakeCollectives

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        with FakeCollectives() as fc:
            out = torch.ones(6)
            dist.all_to_all_single(out, torch.ones(5), [1, 2, 3, 0], [2, 1, 1, 1])
            assert fc.a2a == [(4, [2, 1, 1, 1], [1, 2, 3, 0])] and float(out.abs().sum()) == 0.0
            with pytest.raises(RuntimeError, match=r"input splits \[2, 1, 1, 2\] \(rows 5\)"):
                dist.all_to_all_single(out, torch.ones(5), [1, 2, 3, 0], [2, 1, 1, 2])
            g = torch.empty(8)
            dist.all_gather_into_tensor(g, torch.tensor([3.0, 4.0]))
            assert g.tolist() == [3.0, 4.0] * 4
        assert dist.all_to_all_single is not fc._all_to_all_single  # restored
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_flex_stand_in_keeps_what_the_flex_kernel_saves_and_a_flex_model_is_measured_on_cpu():
    from marin_ablate.marin.config import RunSpec, TrainConfig
    from marin_ablate.planning.memory import _FlexFootprint, activation_peak

    q = torch.randn(2, 8, 64, 16, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 64, 16, dtype=torch.bfloat16, requires_grad=True)  # GQA: k, v at their own heads
    v = torch.randn(2, 2, 64, 16, dtype=torch.bfloat16, requires_grad=True)
    out = _FlexFootprint.apply(q, k, v)
    saved = out.grad_fn.saved_tensors
    assert [(t.shape, t.dtype) for t in saved] == [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype),
                                                  (q.shape, q.dtype), (q.shape[:-1], torch.float32)]
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    # a flex model (no CPU backward in torch) is measured at all, and differently from sdpa
    cfg = ModelConfig(d_model=128, n_layers=1, n_heads=8, head_dim=16, n_kv_heads=2, n_kv_heads_global=1,
                      seq_len=256, window=64, n_experts=8, top_k=2, ep_shards=2)
    got = {att: activation_peak(RunSpec(model=dataclasses.replace(cfg, attention=att), recipe=Recipe(),
                                        train=TrainConfig(device="cuda", compile=True, precision="bf16")), 1, 2)
           for att in ("flex", "sdpa")}
    assert got["flex"] > 0 and got["flex"] != got["sdpa"]
