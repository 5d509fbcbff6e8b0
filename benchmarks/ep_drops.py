"""Replay realistic routing through the fixed (cf 1.33), pooled-wave (cf 1.15, 3 waves: the transport
Marin's hero ran) and ragged (cf 1.15) EP transports and print drop rates and bytes moved: per GPU
rung at its planned load, and for S in {4, 16, 64} shards.

  rungs  every GPU rung (d512 .. d2048) at its planned EP layout: S = ep_shards = batch·seq/65,536
         shards of 65,536 tokens (ablations/ladders.py). Routing comes from the rung's own `Router`
         (marin/moe.py: 384 experts top-8, QB bias, hist estimator with 10,000 bins) at a narrowed
         input width (--rung-width); its inputs are packed documents (geometric lengths, mean
         --rung-mean-doc = 4,096 tokens, about 16 documents per shard as in Marin's runs), each token
         x = sqrt(rho)·u_doc + sqrt(1-rho)·n_tok with rho = --doc-locality, so documents prefer
         experts. The QB bias is first balanced over --qb-steps training forwards of fresh documents
         (as in training), then the rung's shards are routed and `plan_drops` (marin/dispatch.py)
         gives the drops. The rungs differ only in S; one stream of 64 shards serves all (rung = its
         first S shards).

Marin measured 5.5-7.1% drops for fixed against 0.01-0.14% for ragged and attributed it to how many
documents a shard holds; its hero's pooled-wave transport dropped about 3% at 4k context, climbing
to about 4% over its scaling ladder (sender pool per destination of ceil(1.15·T_s·K/(S·3)) rows per
wave, receiver buffer of ceil(1.15·T_s·K/(E_l·3)) rows per local expert and wave). Three routing
sources, each over packed documents, few per shard:

  tiny   the routing of a `tiny`-shaped MarinModel (64 experts top-8 latent, QB balancing) trained here
         for --train-steps steps on the embedded corpus, replayed dropless on held-out packed batches,
         1024 tokens per shard (--train-steps 0: the router at init plus a per-document Zipf skew, said
         in the output). With 64 experts, S=64 leaves one expert per receiver (a single chunk);
  zipf   a synthetic router at the hero geometry (384 experts top-8, 4096 tokens per shard): every
         document prefers experts by a Zipf law over its own random expert order, tokens sample their
         top-8 from it (Gumbel top-k); globally balanced, locally skewed;
  iid    the same synthetic router without document locality (a fresh expert order per token): the
         control that isolates the document effect.

    OMP_NUM_THREADS=1 python benchmarks/ep_drops.py [--train-steps 150] [--zipf 1.0] [--only rungs]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from marin_ablate.marin.dispatch import fixed_cell_capacity, plan_drops, transport_bytes

SHARDS = (4, 16, 64)
CF_FIXED, CF_RAGGED, CF_WAVE, WAVES = 1.33, 1.15, 1.15, 3
TRANSPORT_CF = (("fixed", CF_FIXED), ("pooled_wave", CF_WAVE), ("ragged", CF_RAGGED))


# ---------------------------------------------------------------------------------------------
# Routing sources
# ---------------------------------------------------------------------------------------------


def zipf_routing(n_tokens: int, E: int, K: int, mean_doc: int, zipf: float, local: bool, seed: int,
                 block: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert_idx_TK, doc_T): packed documents with geometric lengths (mean `mean_doc`); a document's
    expert distribution is p(e) ~ (rank_d(e)+1)^-zipf over its own random order rank_d; tokens draw K
    distinct experts from it by Gumbel top-k. local=False draws a fresh order per token."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < n_tokens:
        lengths.append(1 + int(torch.empty(1).geometric_(1.0 / mean_doc, generator=g)))
    doc_T = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:n_tokens]
    logw_E = -zipf * torch.log(torch.arange(1, E + 1, dtype=torch.float32))
    out = []
    for s in range(0, n_tokens, block):
        d = doc_T[s:s + block]
        n = d.numel()
        if local:
            uniq, inv = torch.unique(d, return_inverse=True)
            order_DE = torch.argsort(torch.rand(uniq.numel(), E, generator=g), dim=1)  # rank -> expert
            logp_DE = torch.empty(uniq.numel(), E).scatter_(1, order_DE, logw_E.expand(uniq.numel(), E))
            logp_TE = logp_DE[inv]
        else:
            order_TE = torch.argsort(torch.rand(n, E, generator=g), dim=1)
            logp_TE = torch.empty(n, E).scatter_(1, order_TE, logw_E.expand(n, E))
        gumbel = -torch.log(-torch.log(torch.rand(n, E, generator=g).clamp_min(1e-20)))
        out.append(torch.topk(logp_TE + gumbel, K, dim=1).indices)
    return torch.cat(out), doc_T


def tiny_routing(n_seqs: int, train_steps: int, zipf: float, seed: int) -> tuple[list[torch.Tensor], torch.Tensor, str]:
    """Per-layer expert_idx_TK of a tiny model on packed held-out data, doc ids, and a description."""
    from marin_ablate.marin.config import DataConfig, ModelConfig, Recipe
    from marin_ablate.marin.data import ShardedBatches, eval_batches, load_corpus, prepared_train
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.moe import Router

    torch.manual_seed(seed)
    cfg = ModelConfig(seq_len=256, window=64, n_experts=64, top_k=8, ep_shards=4)
    recipe = Recipe(optimizer="adamw")
    model = MarinModel(cfg, recipe)
    corpus = load_corpus(DataConfig())
    note = ""
    if train_steps > 0:
        train = ShardedBatches(prepared_train(DataConfig()), cfg.seq_len, 8, seed, rank=0, world=1)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        model.train()
        t0, first = time.time(), None
        for step in range(train_steps):
            tok, tgt, doc = train.batch(step)
            out = model(tok, doc, tgt)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            model.update_router_biases()
            first = first if first is not None else out.ce_loss.item()
        note = (f"trained {train_steps} steps x 8 x {cfg.seq_len} tokens in {time.time() - t0:.0f}s, "
                f"train CE {first:.2f} -> {out.ce_loss.item():.2f}")
    per = -(-n_seqs // len(corpus.domains))  # the held-out sequences, every domain alike
    rows = [eval_batches(corpus, d, cfg.seq_len, per, 1)[0] for d in corpus.domains]
    tok, doc = torch.cat([r[0] for r in rows])[:n_seqs], torch.cat([r[2] for r in rows])[:n_seqs]
    captured: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: captured.append(o.expert_idx_TK))
             for m in model.modules() if isinstance(m, Router)]
    model.eval()
    with torch.no_grad():
        model(tok, doc)
    for h in hooks:
        h.remove()
    # Document ids are per sequence; make them global so a shard counts its distinct documents.
    doc_T = (doc + (doc.max() + 1) * torch.arange(doc.shape[0])[:, None]).reshape(-1)
    if train_steps == 0:
        # Init routers are nearly uniform: add a per-document Zipf skew so the replay has locality.
        note = f"router at init plus a per-document Zipf({zipf}) skew (no training)"
        E = cfg.n_experts
        logw_E = -zipf * torch.log(torch.arange(1, E + 1, dtype=torch.float32))
        g = torch.Generator().manual_seed(seed)
        uniq, inv = torch.unique(doc_T, return_inverse=True)
        order = torch.argsort(torch.rand(uniq.numel(), E, generator=g), dim=1)
        logp = torch.empty(uniq.numel(), E).scatter_(1, order, logw_E.expand(uniq.numel(), E))[inv]
        x = model.embed(tok).reshape(-1, cfg.d_model)
        captured = []
        for m in model.modules():
            if isinstance(m, Router):
                with torch.no_grad():
                    s = torch.nn.functional.linear(x, m.weight)
                captured.append(torch.topk(s + logp, cfg.top_k, dim=1).indices)
    return captured, doc_T, note


def rung_routing(n_tokens: int, width: int, mean_doc: int, locality: float, qb_steps: int, seed: int,
                 block: int = 65_536) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(expert_idx_TK, doc_T, geometry) from a GPU rung's Router (384 experts top-8, QB hist 10,000
    bins, its init scale) at input width `width`, over packed documents with per-document direction."""
    from marin_ablate.ablations.ladders import GPU_RUNGS
    from marin_ablate.marin.config import Recipe
    from marin_ablate.marin.moe import Router

    cfg = GPU_RUNGS["d512"].model()
    g = cfg.moe_geometry(Recipe())
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    router = Router(width, g.n_experts, g.top_k, balance="quantile", combine_scale=cfg.combine_scale,
                    aux_weight=cfg.router_aux_weight, aux_free_rate=cfg.aux_free_rate,
                    qb_estimator=cfg.qb_estimator, qb_hist_bins=cfg.qb_hist_bins)
    torch.nn.init.trunc_normal_(router.weight, std=cfg.init_scale / width ** 0.5,
                                a=-cfg.init_trunc * cfg.init_scale / width ** 0.5,
                                b=cfg.init_trunc * cfg.init_scale / width ** 0.5)

    def tokens(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = []
        while sum(lengths) < n:
            lengths.append(1 + int(torch.empty(1).geometric_(1.0 / mean_doc, generator=gen)))
        doc_T = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:n]
        u_DW = torch.randn(len(lengths), width, generator=gen)
        x_TW = locality ** 0.5 * u_DW[doc_T] + (1 - locality) ** 0.5 * torch.randn(n, width, generator=gen)
        return x_TW, doc_T

    router.train()
    for _ in range(qb_steps):  # QB balances the global load, as over training steps
        x, _ = tokens(block)
        with torch.enable_grad():
            router(x)
        router.update_bias()
    router.eval()
    x_all, doc_all = tokens(n_tokens)
    with torch.no_grad():
        idx = torch.cat([router(x_all[s:s + block]).expert_idx_TK for s in range(0, n_tokens, block)])
    return idx, doc_all, {"n_experts": g.n_experts, "top_k": g.top_k, "qb": f"{cfg.qb_estimator} {cfg.qb_hist_bins}"}


def rung_rows(args) -> list[dict]:
    """One row per GPU rung: its planned S shards of 65,536 tokens replayed through both transports."""
    from marin_ablate.ablations.ladders import GPU_RUNGS, TOKENS_PER_EP_SHARD

    Ts = TOKENS_PER_EP_SHARD
    shards = {name: r.model().ep_shards for name, r in GPU_RUNGS.items()}
    t0 = time.time()
    idx, doc_T, geo = rung_routing(Ts * max(shards.values()), args.rung_width, args.rung_mean_doc,
                                   args.doc_locality, args.qb_steps, args.seed)
    rows = []
    for name, r in GPU_RUNGS.items():
        cfg = r.model()
        assert r.tokens_per_step // cfg.ep_shards == Ts, name
        row = replay(idx, doc_T, geo["n_experts"], cfg.ep_shards, Ts, row_bytes=cfg.d_model // 2 * 2)
        row.update(rung=name, batch=r.batch_size, seq=cfg.seq_len, d_model=cfg.d_model)
        rows.append(row)
    print(f"\n[rungs] each GPU rung at its planned load: S = batch x seq / {Ts:,} shards of {Ts:,} tokens; "
          f"Router {geo['n_experts']} experts top-{geo['top_k']}, QB {geo['qb']} bins, width {args.rung_width} "
          f"(narrowed), document locality rho={args.doc_locality}, mean document {args.rung_mean_doc} tokens, "
          f"{args.qb_steps} QB bias updates first; {time.time() - t0:.0f}s to route")
    print(f"{'rung':>6} {'batch x seq':>12} {'S':>3} {'T_s':>6} {'docs/shard':>10} {'cell cap':>8} "
          f"{'fixed drop':>11} {'wave drop':>10} {'ragged drop':>12} {'max load/mean':>14}   "
          "Marin: fixed 5.5-7.1%, pooled-wave ~3-4%, ragged 0.01-0.14%")
    for r in rows:
        print(f"{r['rung']:>6} {r['batch']:>5} x {r['seq']:<5} {r['S']:>3} {r['Ts']:>6} {r['docs_per_shard']:>10.1f} "
              f"{r['cell_rows']:>8} {100 * r['fixed_drop']:>10.2f}% {100 * r['pooled_wave_drop']:>9.2f}% "
              f"{100 * r['ragged_drop']:>11.3f}% {r['max_load']:>14.2f}")
    return rows


# ---------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------


def replay(idx_TK: torch.Tensor, doc_T: torch.Tensor, E: int, S: int, Ts: int, row_bytes: int) -> dict:
    """Drops and bytes of the first S*Ts tokens cut into S shards of Ts tokens (an EP group of S ranks,
    each holding Ts tokens: the per-shard token count stays fixed as S grows, as in a real run)."""
    K = idx_TK.shape[1]
    idx_TK, doc_T = idx_TK[:Ts * S], doc_T[:Ts * S]
    row = {"S": S, "Ts": Ts, "docs_per_shard": float(torch.tensor(
        [torch.unique(doc_T[s * Ts:(s + 1) * Ts]).numel() for s in range(S)], dtype=torch.float).mean())}
    for name, cf in TRANSPORT_CF:
        keep = plan_drops(idx_TK, n_experts=E, n_shards=S, transport=name, capacity_factor=cf, waves=WAVES)
        row[f"{name}_drop"] = 1.0 - keep.float().mean().item()
        row[f"{name}_bytes"] = transport_bytes(idx_TK, keep, n_experts=E, n_shards=S, transport=name,
                                               capacity_factor=cf, row_bytes=row_bytes, waves=WAVES) / S
    row["cell_rows"] = fixed_cell_capacity(Ts, K, E, CF_FIXED)
    load_E = torch.bincount(idx_TK.reshape(-1), minlength=E).float()
    row["max_load"] = float(load_E.max() / load_E.mean())  # global imbalance: what pooling cannot absorb
    return row


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'S':>4} {'T_s':>6} {'docs/shard':>10} {'cell cap':>8} {'fixed drop':>11} {'wave drop':>10} "
          f"{'ragged drop':>12} {'fixed MB/shard':>15} {'wave MB/shard':>14} {'ragged MB/shard':>16} "
          f"{'max load/mean':>14}")
    for r in rows:
        print(f"{r['S']:>4} {r['Ts']:>6} {r['docs_per_shard']:>10.1f} {r['cell_rows']:>8} "
              f"{100 * r['fixed_drop']:>10.2f}% "
              f"{100 * r['pooled_wave_drop']:>9.2f}% {100 * r['ragged_drop']:>11.3f}% {r['fixed_bytes'] / 1e6:>15.2f} "
              f"{r['pooled_wave_bytes'] / 1e6:>14.2f} {r['ragged_bytes'] / 1e6:>16.2f} {r['max_load']:>14.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-steps", type=int, default=150)
    ap.add_argument("--zipf", type=float, default=0.5, help="per-document Zipf exponent of the synthetic router")
    ap.add_argument("--tokens-per-shard", type=int, default=4096,
                    help="synthetic router (hero: one 4096-token sequence)")
    ap.add_argument("--mean-doc", type=int, default=1000, help="mean document length of the synthetic packing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("all", "rungs"), default="all", help="rungs: only the per-rung table")
    ap.add_argument("--rung-width", type=int, default=64, help="router input width of the rung replay (narrowed)")
    ap.add_argument("--rung-mean-doc", type=int, default=4096, help="mean document length of the rung replay")
    ap.add_argument("--doc-locality", type=float, default=0.1,
                    help="rho: share of a token's router input its document sets")
    ap.add_argument("--qb-steps", type=int, default=20, help="QB bias updates before the rung replay")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="write the per-rung rows there (OUT/STUDY/drops_at_scale.json: the report prints them)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"EP drop replay: fixed cf {CF_FIXED} (per sender-expert cell), pooled-wave cf {CF_WAVE} ({WAVES} waves, "
          f"sender pools + per-wave receiver buffers filled round-robin over senders), ragged cf {CF_RAGGED} "
          "(pooled per receiver, 2 chunks); MB/shard = bytes a shard sends off-shard, dispatch + return")
    summary = {}
    summary["rungs"] = rung_rows(args)
    if args.json:  # what the report prints beside a CPU study's own drop rates (analysis/report/writer.py)
        import json
        from pathlib import Path

        keep = ("rung", "S", "Ts", "docs_per_shard", "fixed_drop", "pooled_wave_drop", "ragged_drop")
        Path(args.json).write_text(json.dumps({"source": "benchmarks/ep_drops.py --only rungs", "rows": [
            {k: r[k] for k in keep} for r in summary["rungs"]]}, indent=1))
    if args.only == "rungs":
        return 0

    # Tiny model: S=64 shards of 4 sequences of 256 tokens.
    try:
        layers, doc_T, note = tiny_routing(n_seqs=4 * max(SHARDS), train_steps=args.train_steps, zipf=args.zipf,
                                           seed=args.seed)
        rows = []
        for S in SHARDS:
            per_layer = [replay(idx, doc_T, 64, S, 1024, row_bytes=32 * 4) for idx in layers]
            r = dict(per_layer[0])
            for k in ("fixed_drop", "ragged_drop", "pooled_wave_drop", "fixed_bytes", "ragged_bytes",
                      "pooled_wave_bytes", "max_load"):
                r[k] = sum(p[k] for p in per_layer) / len(per_layer)
            rows.append(r)
        print_rows(f"[tiny] {note}; 64 experts top-8, 1024 tokens/shard, latent rows 32 x fp32, mean of "
                   f"{len(layers)} layers", rows)
        summary["tiny"] = rows
    except Exception as e:  # the replay of the synthetic routers below does not need the corpus
        print(f"\n[tiny] skipped: {type(e).__name__}: {e}")

    E, K, Ts = 384, 8, args.tokens_per_shard
    for name, local in (("zipf", True), ("iid", False)):
        idx, doc_T = zipf_routing(Ts * max(SHARDS), E, K, args.mean_doc, args.zipf, local, args.seed)
        rows = [replay(idx, doc_T, E, S, Ts, row_bytes=3072 * 2) for S in SHARDS]
        what = ("per-document Zipf" if local else "no document locality, per-token Zipf")
        print_rows(f"[{name}] synthetic router, {what} (exponent {args.zipf}), 384 experts top-8, {Ts} tokens/shard, "
                   f"mean document {args.mean_doc} tokens, hero latent rows 3072 x bf16", rows)
        summary[name] = rows

    print(f"\n[zipf sweep] S=64, {Ts} tokens/shard: the per-document exponent is a free parameter of the "
          "synthetic router")
    for z in (0.3, 0.5, 0.7, 1.0):
        idx, doc_T = zipf_routing(Ts * 64, E, K, args.mean_doc, z, True, args.seed)
        r = replay(idx, doc_T, E, 64, Ts, row_bytes=3072 * 2)
        print(f"  zipf {z:.1f}: fixed {100 * r['fixed_drop']:6.2f}%  pooled-wave {100 * r['pooled_wave_drop']:6.2f}%  "
              f"ragged {100 * r['ragged_drop']:6.3f}%")

    print("\nMarin: fixed 5.5-7.1% vs ragged 0.01-0.14%; pooled-wave (the hero's) ~3% at 4k, ~4% over its ladder.")
    for name, rows in summary.items():
        f = [r["fixed_drop"] for r in rows]
        g = [r["ragged_drop"] for r in rows]
        same = min(f) >= 0.01 and max(g) <= 0.002
        print(f"  {name:>5}: fixed {100 * min(f):.2f}-{100 * max(f):.2f}%, "
              f"ragged {100 * min(g):.3f}-{100 * max(g):.3f}% "
              f"-> pattern (fixed >= 1% and ragged <= 0.2% at every S) {'reproduced' if same else 'NOT reproduced'}")
    print("Why: a fixed cell is one (sender, expert) pair, so it overflows whenever the few documents of a shard\n"
          "favour an expert, regardless of the global balance; a ragged receiver pools S senders over E/S\n"
          "experts, whose sum is balanced by the router (QB) — document locality averages out across senders.\n"
          "The iid control, with the same per-token skew but no locality, shows how much comes from documents.\n"
          "Ragged also sends fewer bytes: only accepted rows, while fixed pads every cell to capacity.\n"
          "Ragged pools only over the E/(S*chunks) experts of one chunk: when the GLOBAL load of an expert exceeds\n"
          "cf 1.15 times the mean (max load/mean column; a briefly trained tiny model, few experts per chunk) it\n"
          "drops too, and can then drop more than fixed's 1.33 per cell. Marin's hero had 384/64 = 6 experts per\n"
          "receiver and a long-trained QB router.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
