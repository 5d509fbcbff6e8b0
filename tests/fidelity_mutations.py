"""Mutation check of docs/fidelity.md: every row's detail, changed alone, makes the row's named test fail.

Each `Mutation` rewrites one detail of Marin's recipe in a temporary copy of the repository (exact
text substitutions, each of which must match exactly once) and runs the test that docs/fidelity.md
names for that row. A mutation the test does not catch is a detail no test pins.

    python tests/fidelity_mutations.py              # every row; exits 1 if a mutation survives
    python tests/fidelity_mutations.py --rows QB    # rows whose name starts with QB
    python tests/fidelity_mutations.py --list

`tests/repo/test_fidelity_mutations.py` checks the table itself on every test run (each doc row has a
mutation, each substitution still matches once, each named test exists); this script is the slow
half, run by hand, its latest output in docs/fidelity.md "Mutation check".
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from checkout import copy_checkout

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "fidelity.md"


@dataclass(frozen=True)
class Mutation:
    row: str  # the docs/fidelity.md row (its first column)
    what: str  # the detail as changed
    edits: tuple[tuple[str, str, str], ...]  # (file, old text, new text), each old matching once


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M("stem", "no RMSNorm after the embedding",
      (("marin/model.py", "x = self.embed_norm(self.embed(tokens_BS))", "x = self.embed(tokens_BS)"),)),
    M("head", "final RMSNorm bypassed", (("marin/model.py", "h = self.final_norm(x)", "h = x"),)),
    M("block", "GatedNorm before the pre-RMSNorm",
      (("marin/model.py", "a = self.attn_norm(x_BSD)\n        if self.cfg.gated_norm == \"on\":\n"
                          "            a = self.attn_gated_norm(a)",
        "a = x_BSD\n        if self.cfg.gated_norm == \"on\":\n"
        "            a = self.attn_gated_norm(a)\n        a = self.attn_norm(a)"),)),
    M("GatedNorm", "no silu inside the gate",
      (("marin/model.py", "torch.sigmoid(self.w_up(F.silu(self.w_down(y))))",
        "torch.sigmoid(self.w_up(self.w_down(y)))"),)),
    M("GatedNorm group", "GatedNorm matrices in the Adam group",
      (("marin/model.py", 'if mname.endswith("attn.gate"):',
        'if mname.endswith("attn.gate") or "gated_norm" in mname:'),)),
    M("norms", "RMSNorm eps 1e-4", (("marin/config.py", "norm_eps: float = 1e-5", "norm_eps: float = 1e-4"),)),
    M("QK norm", "q multiplier 1.0", (("marin/config.py", "qk_mult: float = 1.3", "qk_mult: float = 1.0"),)),
    M("QK norm", "q/k RMSNorm eps 1e-2",
      (("marin/model.py", "q, k = rms_norm(q, 1e-6), rms_norm(k, 1e-6)",
        "q, k = rms_norm(q, 1e-2), rms_norm(k, 1e-2)"),)),
    M("init", "sigma 1.0/sqrt(d)", (("marin/config.py", "init_scale: float = 0.5", "init_scale: float = 1.0"),)),
    M("init", "truncated at 2 sigma", (("marin/config.py", "init_trunc: float = 3.0", "init_trunc: float = 2.0"),)),
    M("gate", "gate sigma(x W_g), not 2 sigma",
      (("marin/model.py", "y = y * (2.0 * torch.sigmoid(gate_BSH.float()))",
        "y = y * (1.0 * torch.sigmoid(gate_BSH.float()))"),
       ("marin/kernels/__init__.py", "return z * (2.0 * torch.sigmoid(", "return z * (1.0 * torch.sigmoid("))),
    M("XSA", "eps 1e-2 in the projection", (("marin/kernels/reference.py", "XSA_EPS = 1e-6", "XSA_EPS = 1e-2"),)),
    M("SConv", "kernel 3", (("marin/config.py", "sconv_kernel: int = 4", "sconv_kernel: int = 3"),)),
    M("SConv", "no SConv at mlp-out",
      (("marin/config.py", 'sconv_sites: tuple[str, ...] = ("k", "attn_out", "mlp_out")',
        'sconv_sites: tuple[str, ...] = ("k", "attn_out")'),)),
    M("router", "alpha = the K-th biased logit",
      (("marin/moe.py", "return idx_TK1[:, :top_k], vals_TK1[:, top_k]",
        "return idx_TK1[:, :top_k], vals_TK1[:, top_k - 1]"),)),
    M("combine", "renormalised with eps 1e-3",
      (("marin/moe.py", "COMBINE_EPS = 1e-9", "COMBINE_EPS = 1e-3"),)),
    M("combine", "weights sum to 2.0",
      (("marin/config.py", "combine_scale: float = 2.5", "combine_scale: float = 2.0"),)),
    M("Switch statistic", "normalised sigmoids for P",
      (("marin/moe.py", "return torch.softmax(logits_TE, dim=-1)",
        "return torch.sigmoid(logits_TE) / torch.sigmoid(logits_TE).sum(-1, keepdim=True)"),)),
    M("QB", "1,000 histogram bins", (("marin/config.py", "qb_hist_bins: int = 10_000", "qb_hist_bins: int = 1_000"),)),
    M("QB", "no interpolation in the crossing bin",
      (("marin/moe.py", "return (upper_E - frac_E * width).float()", "return (upper_E - 0.5 * width).float()"),)),
    M("QB", "bias -beta not mean-centred",
      (("marin/moe.py", "    return c_E - c_E.mean()", "    return c_E"),)),
    M("QB", "bias accumulated, not replaced (topk)",
      (("marin/moe.py", "self.bias_E.copy_(qb_bias(stat[:-1] / stat[-1]))",
        "self.bias_E.add_(qb_bias(stat[:-1] / stat[-1]))"),)),
    M("QB", "bias accumulated, not replaced (hist, the hero's)",
      (("marin/moe.py", "self.bias_E.copy_(qb_bias(qb_threshold_hist(counts_EN, lo.double(), hi.double(), n_star)))",
        "self.bias_E.add_(qb_bias(qb_threshold_hist(counts_EN, lo.double(), hi.double(), n_star)))"),)),
    M("QB rank", "n* rounded up",
      (("marin/moe.py", "return max(1, min(n_tokens, n_tokens * top_k // n_experts))",
        "return max(1, min(n_tokens, -(-n_tokens * top_k // n_experts)))"),)),
    M("QB timing", "recorded in no-grad forwards too",
      (("marin/moe.py", "if self.training and torch.is_grad_enabled():", "if self.training:"),)),
    M("latent MoE", "no RMSNorm in latent space",
      (("marin/moe.py", "u_TW = self.latent_norm(self.latent_down(x_TD))", "u_TW = self.latent_down(x_TD)"),)),
    M("transports", "fixed cells at cf 1.25",
      (("marin/config.py", "capacity_fixed: float = 1.33", "capacity_fixed: float = 1.25"),)),
    M("transports", "ragged pool at cf 1.25",
      (("marin/config.py", "capacity_ragged: float = 1.15", "capacity_ragged: float = 1.25"),)),
    M("transports", "ragged receivers in one chunk (capacity pooled over all local experts)",
      (("marin/config.py", "ragged_chunks: int = 2", "ragged_chunks: int = 1"),)),
    M("tokens per EP shard", "32,768 tokens per shard",
      (("ablations/ladders.py", "TOKENS_PER_EP_SHARD = 65_536", "TOKENS_PER_EP_SHARD = 32_768"),)),
    M("tokens per EP shard", "the rung table divides by EP shards alone (not x racks)",
      (("ablations/ladders.py", "self.tokens_per_step // (cfg.ep_shards * self.train_config().replica_groups)",
        "self.tokens_per_step // cfg.ep_shards"),)),
    M("tokens per EP shard", "describe divides by EP shards alone (not x racks)",
      (("marin/flops.py", 'rung["tokens_per_step"] // (rung["ep_shards"] * rung.get("replica_groups", 1))',
        'rung["tokens_per_step"] // rung["ep_shards"]'),)),
    M("optimizer groups", "lm_head in MuonH",
      (("marin/optimizers.py", 'OptimizerLevel("hyperball", {"matrix": "muonh", "expert": "muonh", "lm_head": "adamh"}',
        'OptimizerLevel("hyperball", {"matrix": "muonh", "expert": "muonh", "lm_head": "muonh"}'),)),
    M("optimizer groups", "AdamH at the Adam rate",
      (("marin/optimizers.py", 'GroupKind("adamh", 2, False, "matrix",', 'GroupKind("adamh", 2, False, "adam",'),)),
    M("MuonH step", "step eta, not eta times the radius",
      (("marin/update_rules.py", 'x = w - g["lr"] * r * d_unit', 'x = w - g["lr"] * d_unit'),
       ("marin/batched_updates.py", 'torch._foreach_mul_(du, torch._foreach_mul(rs, g["lr"]))',
        'torch._foreach_mul_(du, g["lr"])'))),
    M("expert-bank sphere", "one sphere per expert by default",
      (("marin/config.py", 'expert_sphere: str = "bank"', 'expert_sphere: str = "expert"'),)),
    M("Newton–Schulz", "Jordan's single triple first",
      (("marin/optimizers.py", '"quintic": ((4.0848, -6.8946, 2.9270),', '"quintic": ((3.4445, -4.7750, 2.0315),'),)),
    M("Newton–Schulz", "normalisation eps 1e-2",
      (("marin/update_rules.py", "NS_EPS = 1e-8  #", "NS_EPS = 1e-2  #"),)),
    M("Newton–Schulz", "normalisation eps 1e-7 (levanter's default, not the hero path's)",
      (("marin/update_rules.py", "NS_EPS = 1e-8  #", "NS_EPS = 1e-7  #"),)),
    M("Newton–Schulz", "4 iterations in the trainer, not 5",
      (("marin/config.py", "ns_steps: int = 5", "ns_steps: int = 4"),)),
    M("Adam ε", "coefficient 1e-17",
      (("marin/hparams.py", "eps_coeff: float = 9.676e-18", "eps_coeff: float = 1e-17"),)),
    M("LR heuristic", "coefficient 0.09",
      (("marin/hparams.py", 'LRHeuristic("aug_refit", coeff=0.087571,', 'LRHeuristic("aug_refit", coeff=0.09,'),)),
    M("LR heuristic", "beta1 0.9062",
      (("marin/hparams.py", "dim_exp=-0.3448, beta1=0.90)", "dim_exp=-0.3448, beta1=0.9062)"),)),
    M("ladder shapes", "local KV heads d/256",
      (("marin/presets.py", "kv = max(1, n_heads // 4)", "kv = max(1, n_heads // 2)"),)),
    M("ladder batch/tokens", "d512 batch 64",
      (("ablations/ladders.py", '"d512": _gpu("d512", 128, 8),', '"d512": _gpu("d512", 64, 8),'),)),
    M("ladder batch/tokens", "59 tokens per active parameter",
      (("ablations/ladders.py", "fields = dict(preset=name, tokens_per_active_param=60.0,",
        "fields = dict(preset=name, tokens_per_active_param=59.0,"),)),
    M("sliding window", "ladder window 512",
      (("marin/presets.py", "vocab_size=vocab, seq_len=4096, window=2048,",
        "vocab_size=vocab, seq_len=4096, window=512,"),)),
    M("sliding window", "hero window 512",
      (("marin/presets.py", "vocab_size=128_256, seq_len=4096, window=2048, global_every=4,",
        "vocab_size=128_256, seq_len=4096, window=512, global_every=4,"),)),
    M("global layers", "ladder global every 6th",
      (("marin/presets.py", "        global_every=4, n_experts=384, top_k=8, expert_hidden=d // 2,",
        "        global_every=6, n_experts=384, top_k=8, expert_hidden=d // 2,"),)),
    M("global layers", "hero global every 6th",
      (("marin/presets.py", "vocab_size=128_256, seq_len=4096, window=2048, global_every=4,",
        "vocab_size=128_256, seq_len=4096, window=2048, global_every=6,"),)),
    M("global layers", "last layer local",
      (("marin/config.py", "return (layer + 1) % self.global_every == 0 or layer == self.n_layers - 1",
        "return (layer + 1) % self.global_every == 0"),)),
    M("hero shape", "8 local KV heads",
      (("marin/presets.py", "n_heads=48, head_dim=128, n_kv_heads=12, n_kv_heads_global=6,",
        "n_heads=48, head_dim=128, n_kv_heads=8, n_kv_heads_global=4,"),)),
    M("hero run", "12 racks",
      (("ablations/studies.py", "def hero(ep_groups: int = 11,", "def hero(ep_groups: int = 12,"),)),
    M("gate/router decay", "no decay",
      (("marin/config.py", "gate_router_weight_decay: float = 0.02", "gate_router_weight_decay: float = 0.0"),)),
    M("gate/router decay", "not in hyperball's registry row",
      (("marin/optimizers.py", '"MuonH on matrices, AdamH on the lm head, Adam elsewhere", annealed_decay=GATE_ROUTER)',
        '"MuonH on matrices, AdamH on the lm head, Adam elsewhere")'),)),
    M("gate/router decay", "not annealed",
      (("marin/update_rules.py", "return max(0.0, 1.0 - step / total_steps) if step >= start else 0.0",
        "return 1.0 if step >= start else 0.0"),)),
    M("gate/router decay", "anneal index one step late (1 - (t+1)/T)",
      (("marin/update_rules.py", "return max(0.0, 1.0 - step / total_steps) if step >= start else 0.0",
        "return max(0.0, 1.0 - (step + 1) / total_steps) if step >= start else 0.0"),)),
    M("gate/router decay", "switch-on step ignored (on from step 0)",
      (("marin/update_rules.py", "return max(0.0, 1.0 - step / total_steps) if step >= start else 0.0",
        "return max(0.0, 1.0 - step / total_steps)"),)),
    M("gate/router decay", "the trainer's call site one step late (decay of step t+1 at step t)",
      (("marin/train/loop.py", "set_lr(self.opt, mult, decay_fraction(step, t.steps, t.gate_router_decay_start))",
        "set_lr(self.opt, mult, decay_fraction(step + 1, t.steps, t.gate_router_decay_start))"),)),
    M("gate/router decay", "the trainer's call site one step early (decay of step t-1 at step t)",
      (("marin/train/loop.py", "set_lr(self.opt, mult, decay_fraction(step, t.steps, t.gate_router_decay_start))",
        "set_lr(self.opt, mult, decay_fraction(step - 1, t.steps, t.gate_router_decay_start))"),)),
    M("gate/router decay", "hero switches the decay on at step 0",
      (("ablations/studies.py", "HERO_GATE_ROUTER_DECAY_START = 58_014", "HERO_GATE_ROUTER_DECAY_START = 0"),)),
    M("KV layout", "global layers store only their own heads",
      (("marin/config.py", 'kv_layout: str = "stored"', 'kv_layout: str = "per_layer"'),)),
    M("router precision", "hero router in fp32",
      (("marin/presets.py", 'attention="flex", router_precision="bf16",',
        'attention="flex", router_precision="fp32",'),)),
    M("QB top-k shards", "one global top-k",
      (("marin/moe.py", "qb_hist_bins=cfg.qb_hist_bins, precision=cfg.router_precision, qb_shards=cfg.ep_shards)",
        "qb_hist_bins=cfg.qb_hist_bins, precision=cfg.router_precision, qb_shards=1)"),)),
    M("pooled-wave transport", "receivers fill sender by sender",
      (("marin/dispatch.py", "recv_rank_N = ranks_in_groups(group_N, W * n_experts + 1, slot_N * S + shard_N)",
        "recv_rank_N = ranks_in_groups(group_N, W * n_experts + 1, shard_N * pool + slot_N)"),)),
    M("pooled-wave transport", "one wave", (("marin/config.py", "pooled_waves: int = 3", "pooled_waves: int = 1"),)),
    M("hero ladder", "60 tokens per active parameter",
      (("ablations/ladders.py", "HERO_LADDER_TPP = 791.0", "HERO_LADDER_TPP = 60.0"),)),
    M("hero ladder", "d512 on an H100 node of 16 GPUs",
      (("ablations/ladders.py", "HERO_H100_GPUS = 8", "HERO_H100_GPUS = 16"),)),
    M("hold-one-out arms", "no_latent at the factorial's standard level",
      (("ablations/holdout.py", 'recipe_factor("latent_moe", low="full_width")',
        'recipe_factor("latent_moe")'),)),
    M("hold-one-out arms", "full_width keeps the whole expert hidden",
      (("marin/config.py",
        "return MoEGeometry(self.n_experts, self.top_k, self.d_model, self.expert_hidden // a, False)",
        "return MoEGeometry(self.n_experts, self.top_k, self.d_model, self.expert_hidden, False)"),)),
    M("hold-one-out arms", "no_muonh at AdamW",
      (("ablations/holdout.py", 'levels={"adamh": "adamh", "hyperball": "hyperball"}',
        'levels={"adamw": "adamw", "hyperball": "hyperball"}'),)),
    M("hold-one-out arms", "the fast ladder's alpha 0.09",
      (("ablations/ladders.py", "FAST_LADDER_LAW = PublishedLaw(1.2, 0.0842,",
        "FAST_LADDER_LAW = PublishedLaw(1.2, 0.09,"),)),
    M("data mixture", "cooldown from 90% of the steps",
      (("ablations/ladders.py", "HERO_MIXTURE_SWITCH = 0.8", "HERO_MIXTURE_SWITCH = 0.9"),)),
    M("data mixture", "switch not rounded to Marin's mixture block",
      (("ablations/ladders.py", "HERO_MIXTURE_BLOCK = 49_152", "HERO_MIXTURE_BLOCK = 0"),)),
    M("data mixture", "sequences drawn equally, not by the phase's weights",
      (("marin/data/mixture.py", "self.w_PD[p, index[d]] = w", "self.w_PD[p, index[d]] = 1.0"),)),
    M("RoPE pairing", "rotated pairs (2j, 2j+1) read as split halves",
      (("marin/model.py", "x1, x2, rest = x_BHSh[..., :R].float(), x_BHSh[..., R:2 * R].float(), x_BHSh[..., 2 * R:]",
        "x1, x2, rest = x_BHSh[..., 0:2 * R:2].float(), x_BHSh[..., 1:2 * R:2].float(), x_BHSh[..., 2 * R:]"),)),
    M("z-loss", "weight 1e-3", (("marin/config.py", "z_loss_weight: float = 1e-4", "z_loss_weight: float = 1e-3"),)),
    M("eval dropless", "eval drops as training does",
      (("marin/moe.py", 'dropless = not self.training or self.recipe.ep_transport == "dropless"',
        'dropless = self.recipe.ep_transport == "dropless"'),)),
    M("simulated epoching", "the cut rounded up",
      (("marin/data/shards.py", "return int(n_sequences * (experiment_tokens / target_tokens))",
        "return int(np.ceil(n_sequences * (experiment_tokens / target_tokens)))"),)),
    M("simulated epoching", "the cut not repeated (reads on past it)",
      (("marin/data/shards.py", "idx_R = idx_R % length if length else idx_R", "idx_R = idx_R"),)),
    M("simulated epoching", "off on the hero ladder",
      (("ablations/ladders.py", "mixture_block=HERO_MIXTURE_BLOCK, simulated_epoching_target=HERO_EPOCHING_TARGET,",
        "mixture_block=HERO_MIXTURE_BLOCK,"),)),
    M("simulated epoching", "target our hero's 18.0T tokens, not the mixture's 18.75T",
      (("ablations/ladders.py", "HERO_EPOCHING_TARGET = 18_750_000_000_000",
        "HERO_EPOCHING_TARGET = 18_005_144_633_344"),)),
    M("simulated epoching", "the loader state forgets the cut (resume unchecked)",
      (("marin/data/shards.py", '"simulated_target", "simulated_lengths")', ")"),)),
    M("context extension", "twice YaRN's coefficient (0.2, the older row) in place of Marin's 0.1",
      (("ablations/studies.py", '"context_stages": HERO_CONTEXT_STAGES, "context_q_rule": "yarn"})',
        '"context_stages": HERO_CONTEXT_STAGES, "context_q_rule": "yarn_x2"})'),)),
    M("context extension", "the yarn rule at 0.2",
      (("marin/config.py", 'CONTEXT_Q_RULES = {"yarn": 0.1,', 'CONTEXT_Q_RULES = {"yarn": 0.2,'),)),
    M("context extension", "16k from 90% of the steps (the older plan), not the handoff near step 216,000",
      (("ablations/studies.py", "ContextStage(HERO_CONTEXT_16K_STEP / 390_251, 16_384)",
        "ContextStage(0.90, 16_384)"),)),
    M("context extension", "the hero at 4k throughout",
      (("ablations/studies.py", '"context_stages": HERO_CONTEXT_STAGES, "context_q_rule": "yarn"})',
        '"context_q_rule": "yarn"})'),)),
    M("context extension", "q scaled on global layers only",
      (("marin/model.py", "q_mult = ctx.q_scale * (self.cfg.qk_mult",
        "q_mult = (ctx.q_scale if self.is_global else 1.0) * (self.cfg.qk_mult"),)),
)


def doc_rows(doc: Path = DOC) -> dict[str, list[str]]:
    """row name -> the test node ids its last column names (test files by basename, under tests/)."""
    rows: dict[str, list[str]] = {}
    for line in doc.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] in ("component", "---") or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0]] = re.findall(r"(test_\w+\.py::test_\w+)", cells[-1])
    return rows


def find_test_file(name: str, root: Path = ROOT) -> Path:
    """The test file a row names by basename (tests/<package>/test_x.py), relative to root."""
    hits = sorted((root / "tests").rglob(name))
    if len(hits) != 1:
        raise ValueError(f"{name}: {len(hits)} test files of that name under tests/; expected exactly one")
    return hits[0].relative_to(root)


def apply(tree: Path, m: Mutation) -> None:
    for rel, old, new in m.edits:
        p = tree / rel
        text = p.read_text()
        n = text.count(old)
        if n != 1:
            raise ValueError(f"{m.row}: {rel} holds {n} copies of {old!r}; a mutation must match exactly once")
        p.write_text(text.replace(old, new))


def run(m: Mutation, tests: list[str], timeout: int) -> tuple[str, float]:
    """'caught by TEST' (the first named test that fails on the mutated tree), 'SURVIVED' when all pass."""
    with tempfile.TemporaryDirectory(prefix="fidelity-mutation-") as tmp:
        tree = Path(tmp)
        copy_checkout(tree)
        apply(tree, m)
        t0 = time.time()
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               *[f"{find_test_file(t.split('::')[0], tree)}::{t.split('::')[1]}" for t in tests]]
        env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
               "TRITON_INTERPRET": "1", "HF_DATASETS_OFFLINE": "1", "HOME": tmp}
        try:
            r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", time.time() - t0
        if r.returncode == 1:
            failed = re.findall(r"^FAILED \S*?(test_\w+\.py::test_\w+)", r.stdout, re.M)
            return f"caught by {failed[0]}" if failed else "caught", time.time() - t0
        if r.returncode == 0:
            return "SURVIVED", time.time() - t0
        return f"error (pytest exit {r.returncode})", time.time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="*", default=None, help="only rows whose name starts with one of these")
    ap.add_argument("--list", action="store_true", help="print the mutations and their tests, run nothing")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutation (default 600)")
    args = ap.parse_args(argv)
    rows = doc_rows()
    chosen = [m for m in MUTATIONS if not args.rows or any(m.row.startswith(r) for r in args.rows)]
    print("| row | mutation | test | result | s |\n|---|---|---|---|---|")
    survived = 0
    for m in chosen:
        tests = rows.get(m.row)
        if not tests:
            print(f"| {m.row} | {m.what} | (row names no test) | NOT PINNED | |")
            survived += 1
            continue
        if args.list:
            print(f"| {m.row} | {m.what} | {', '.join(tests)} | | |")
            continue
        result, secs = run(m, tests, args.timeout)
        survived += not result.startswith("caught")
        print(f"| {m.row} | {m.what} | {', '.join(tests)} | {result} | {secs:.0f} |", flush=True)
    if not args.list:
        print(f"\n{len(chosen) - survived} of {len(chosen)} mutations caught by the test their row names")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
