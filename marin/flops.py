"""Analytic parameter and FLOP accounting per (ModelConfig, Recipe) (docs/method.md §2.2, §4.1). No torch.

Definitions (kept equal to what `MarinModel` builds; tests check both against the meta-device model
and against torch's FlopCounterMode):

- params_total: every trainable parameter, counted exactly: embedding, lm_head (untied), norms,
  attention, headwise gates, SConv kernels, GatedNorm, router, latent projections and latent norm,
  all routed experts, shared experts. Buffers (the router bias) are not parameters.
- params_active: the non-embedding parameters one token touches: params_total minus the embedding,
  minus the lm_head, minus the (E − K) routed experts a token does not use, in every layer. On top
  of Marin's count this includes the small terms: norm gains, gates, SConv, GatedNorm.
- params_active_marin: Marin's count exactly, the one its ladder sizes tokens by (docs/fidelity.md, its counting
  convention for active parameters).
- forward FLOPs per token: 2 × multiply-accumulates per token of every matmul (attention q/k/v/o and
  gate projections, the attention scores QKᵀ and AV over the keys a query sees, router, latent down
  and up, the K routed experts, shared experts, GatedNorm, lm_head) plus two small elementwise terms
  the recipe adds (SConv taps, the XSA projection). Attention keys per query: causal and windowed
  ("causal", the default: min(t+1, window) on local layers, t+1 on global ones, averaged over the
  sequence) or every position ("dense", what a masked S×S kernel computes); document masking is not
  discounted. Norms, softmax, activations and the embedding lookup are not counted.
- flops_per_token: training FLOPs per token = 3 × forward (backward = 2 × forward).
- dispatch_bytes_per_token: routed rows that cross the all-to-all per token, summed over layers,
  dispatch and return: n_layers · 2 · K · W · bytes_per_element.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from marin_ablate.marin.config import ModelConfig, Recipe, RunSpec, apply_overrides, split_overrides, to_dict
from marin_ablate.marin.optimizers import NS_COEFFS
from marin_ablate.marin.presets import preset
from marin_ablate.marin.schema import is_number

MATMUL_TERMS = ("attn_proj", "attn_gate", "attn_scores", "router", "latent", "routed", "shared",
                "gated_norm", "lm_head")
ELEMENTWISE_TERMS = ("sconv", "xsa")
ATTENTION_MODES = ("causal", "dense")


def _sconv_channels(cfg: ModelConfig, recipe: Recipe, layer: int) -> int:
    """Channels carrying an SConv in one layer (0 when sconv is off)."""
    if recipe.sconv != "short_conv":
        return 0
    kv = cfg.kv_heads_stored(layer) * cfg.head_dim
    width = {"k": kv, "v": kv, "attn_out": cfg.d_model, "mlp_out": cfg.d_model}
    return sum(width[s] for s in cfg.sconv_sites)


def layer_params(cfg: ModelConfig, recipe: Recipe, layer: int) -> dict[str, int]:
    """Parameters of one block, by component (routed = all E experts)."""
    d, H, h, Hkv = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.kv_heads_stored(layer)
    g = cfg.moe_geometry(recipe)
    return {
        "norms": 2 * d + (2 * h if recipe.qk_norm == "learned_gain" else 0) + (g.width if g.latent else 0),
        "attention": 2 * d * H * h + 2 * d * Hkv * h,
        "attn_gate": d * H if cfg.attn_gate else 0,
        "sconv": cfg.sconv_kernel * _sconv_channels(cfg, recipe, layer),
        "gated_norm": 2 * 2 * d * cfg.gated_norm_width if cfg.gated_norm == "on" else 0,
        "router": d * g.n_experts,
        "latent": 2 * d * g.width if g.latent else 0,
        "routed": g.n_experts * 3 * g.width * g.hidden,
        "shared": cfg.n_shared_experts * 3 * d * cfg.shared_hidden,
    }


def params_breakdown(cfg: ModelConfig, recipe: Recipe) -> dict[str, int]:
    gn = 2 * cfg.d_model * cfg.gated_norm_width if cfg.gated_norm == "on" else 0  # one GatedNorm: W_down, W_up
    out = {"embed": cfg.vocab_size * cfg.d_model, "lm_head": cfg.d_model * cfg.vocab_size,
           "final_norm": cfg.d_model, "embed_norm": cfg.d_model, "stem_gated_norms": 2 * gn}
    for layer in range(cfg.n_layers):
        for k, v in layer_params(cfg, recipe, layer).items():
            out[k] = out.get(k, 0) + v
    return out


def params_total(cfg: ModelConfig, recipe: Recipe) -> int:
    return sum(params_breakdown(cfg, recipe).values())


def params_routed(cfg: ModelConfig, recipe: Recipe) -> int:
    """All routed-expert parameters (E experts, every layer)."""
    return params_breakdown(cfg, recipe)["routed"]


def params_active(cfg: ModelConfig, recipe: Recipe) -> int:
    g = cfg.moe_geometry(recipe)
    b = params_breakdown(cfg, recipe)
    inactive = cfg.n_layers * (g.n_experts - g.top_k) * 3 * g.width * g.hidden
    return params_total(cfg, recipe) - b["embed"] - b["lm_head"] - inactive


def params_active_marin(cfg: ModelConfig, recipe: Recipe) -> int:
    """Marin's active count (small_scale_abl_launch.py _active_params): see the module docstring."""
    d, g = cfg.d_model, cfg.moe_geometry(recipe)
    kv = max(cfg.n_kv_heads, cfg.n_kv_heads_global)
    attn = 2 * d * cfg.n_heads * cfg.head_dim + 2 * d * kv * cfg.head_dim
    latent = 2 * d * g.width if g.latent else 0
    per_layer = attn + d * g.n_experts + g.top_k * 3 * g.width * g.hidden + latent \
        + cfg.n_shared_experts * 3 * d * cfg.shared_hidden
    return cfg.n_layers * per_layer


def mean_keys_per_query(seq_len: int, window: int | None) -> float:
    """Average number of keys a causal query attends to over positions 0..S-1 (window incl. self)."""
    S = seq_len
    if window is None or window >= S:
        return (S + 1) / 2
    w = window
    return (w * (w + 1) / 2 + (S - w) * w) / S


def forward_flops_breakdown(cfg: ModelConfig, recipe: Recipe, seq_len: int | None = None,
                            attention: str = "causal") -> dict[str, float]:
    """Forward FLOPs per token by term (see the module docstring)."""
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention={attention!r} is not known; allowed values: {', '.join(ATTENTION_MODES)}")
    S = cfg.seq_len if seq_len is None else seq_len
    d, H, h = cfg.d_model, cfg.n_heads, cfg.head_dim
    g = cfg.moe_geometry(recipe)
    out = dict.fromkeys(MATMUL_TERMS + ELEMENTWISE_TERMS, 0.0)
    for layer in range(cfg.n_layers):
        Hkv = cfg.kv_heads_stored(layer)  # W_k, W_v project every stored head
        keys = S if attention == "dense" else mean_keys_per_query(S, None if cfg.is_global(layer) else cfg.window)
        out["attn_proj"] += 2 * (2 * d * H * h + 2 * d * Hkv * h)
        out["attn_gate"] += 2 * d * H if cfg.attn_gate else 0
        out["attn_scores"] += 2 * 2 * H * h * keys  # QKᵀ and AV
        out["router"] += 2 * d * g.n_experts
        out["latent"] += 2 * 2 * d * g.width if g.latent else 0
        out["routed"] += 2 * g.top_k * 3 * g.width * g.hidden
        out["shared"] += 2 * cfg.n_shared_experts * 3 * d * cfg.shared_hidden
        out["gated_norm"] += 2 * 2 * 2 * d * cfg.gated_norm_width if cfg.gated_norm == "on" else 0
        out["sconv"] += 2 * cfg.sconv_kernel * _sconv_channels(cfg, recipe, layer)
        out["xsa"] += 2 * 3 * H * h if recipe.xsa == "xsa" else 0  # ⟨y,v⟩, ‖v‖², y − c·v
    out["gated_norm"] += 2 * 2 * 2 * d * cfg.gated_norm_width if cfg.gated_norm == "on" else 0  # embed, final
    out["lm_head"] = 2.0 * d * cfg.vocab_size
    return out


def forward_flops_per_token(cfg: ModelConfig, recipe: Recipe, seq_len: int | None = None,
                            attention: str = "causal") -> float:
    return sum(forward_flops_breakdown(cfg, recipe, seq_len, attention).values())


def flops_per_token(cfg: ModelConfig, recipe: Recipe, seq_len: int | None = None) -> float:
    """Training model FLOPs per token: 3 × forward (causal-windowed attention)."""
    return 3.0 * forward_flops_per_token(cfg, recipe, seq_len)


def dispatch_bytes_per_token(cfg: ModelConfig, recipe: Recipe, bytes_per_element: int = 2) -> int:
    """Routed rows through the all-to-all per token, all layers, dispatch + return (bf16 default)."""
    g = cfg.moe_geometry(recipe)
    return cfg.n_layers * 2 * g.top_k * g.width * bytes_per_element


def describe(cfg: ModelConfig, recipe: Recipe) -> dict:
    """Resolved config and accounting, for `marin-ablate plan --preset` and run summaries."""
    g = cfg.moe_geometry(recipe)
    return {
        "model": to_dict(cfg), "recipe": to_dict(recipe), "moe_geometry": to_dict(g),
        "params_total": params_total(cfg, recipe), "params_active": params_active(cfg, recipe),
        "params_active_marin": params_active_marin(cfg, recipe), "params_routed": params_routed(cfg, recipe),
        "params_breakdown": params_breakdown(cfg, recipe), "flops_per_token": flops_per_token(cfg, recipe),
        "forward_flops_per_token": forward_flops_per_token(cfg, recipe),
        "forward_flops_breakdown": forward_flops_breakdown(cfg, recipe),
        "dispatch_bytes_per_token": dispatch_bytes_per_token(cfg, recipe),
    }


def resolved(cfg: ModelConfig, recipe: Recipe, rung: dict | None = None) -> dict:
    """The values a reader compares with Marin's code (docs/fidelity.md), resolved for this preset. `rung`
    (ep_shards, batch_sequences, tokens_per_step, steps, tokens), when the preset is a ladder rung, is passed in by
    the caller (ablations.ladders.rung_of_preset): marin/ knows no ladders."""
    out = {
        "params_active_marin": params_active_marin(cfg, recipe),
        "qb_estimator": cfg.qb_estimator, "qb_hist_bins": cfg.qb_hist_bins,
        "gated_norm": cfg.gated_norm, "gated_norm_rank": cfg.gated_norm_width,
        "norm_eps": cfg.norm_eps, "init_std": cfg.init_scale / cfg.d_model ** 0.5, "init_trunc_sigmas": cfg.init_trunc,
        "ns_coefficients": [list(t) for t in NS_COEFFS],
        "ep_shards": cfg.ep_shards, "batch_sequences": None, "tokens_per_ep_shard": None,
    }
    if rung is not None:
        out.update(rung)
        # per rank as training holds them: the step's tokens over EP shards x replica groups (racks)
        out["tokens_per_ep_shard"] = rung["tokens_per_step"] // (rung["ep_shards"] * rung.get("replica_groups", 1))
    return out


def describe_preset(name: str, overrides: tuple[str, ...] = (), baseline: bool = False,
                    rung: dict | None = None) -> dict:
    """`plan --preset`'s record: the preset with its --model./--recipe. overrides, from Recipe() (or its baseline)."""
    sets = split_overrides(overrides, ("model", "recipe"))  # train./data. change neither count
    cfg = preset(name, sets["model"])
    recipe = apply_overrides(Recipe.baseline() if baseline else Recipe(), sets["recipe"])
    return {"preset": name, **describe(cfg, recipe), "resolved": resolved(cfg, recipe, rung)}


def _si(n: float) -> str:
    return next((f"{n / div:.3f}{unit}" for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3))
                 if abs(n) >= div), f"{n:g}")


def preset_lines(info: dict, rung: dict | None = None) -> list[str]:
    """`plan --preset`'s text of a `describe_preset` record."""
    g, pm = info["moe_geometry"], info["resolved"]["params_active_marin"]
    out = [
        f"preset {info['preset']}", "recipe  " + "  ".join(f"{k}={v}" for k, v in info["recipe"].items()),
        "model   " + "  ".join(f"{k}={v}" for k, v in info["model"].items()),
        f"moe     {g['n_experts']} experts, top-{g['top_k']}, width {g['width']}, hidden {g['hidden']}"
        f"{' (latent)' if g['latent'] else ''}",
        f"params_total   {_si(info['params_total'])} ({info['params_total']:,})",
        f"params_active  {_si(info['params_active'])} ({info['params_active']:,}, non-embedding)",
        f"  params_active_marin {_si(pm)}: Marin's count, which its ladder sizes tokens by (attention, router, "
        "routed and shared experts, latent; no norms, gates, SConv, GatedNorm: marin/flops.py)",
        f"flops_per_token {_si(info['flops_per_token'])} (training, 3 x forward)",
        *(f"  forward {k:<12} {_si(v)}" for k, v in info["forward_flops_breakdown"].items()),
        f"dispatch_bytes_per_token {_si(info['dispatch_bytes_per_token'])}"]
    if rung is not None and rung.get("rung_overrides") not in (None, "(none)"):
        out.append(f"rung {info['preset']} trains with {rung['rung_overrides']} (the model line above is the preset's)")
    return [*out, "resolved (docs/fidelity.md):", *(f"  {k:<22} {v}" for k, v in info["resolved"].items())]


# ---- What a run trains, and a summary.json that says otherwise -----------------------------------

#: Relative tolerance of a summary's FLOPs against its spec's: the trainer sums them step by step in floats
FLOPS_RTOL = 1e-6


def summary_contradiction(spec: Any, summary: Mapping, run: str) -> str | None:
    """Where a completed summary.json contradicts the spec.json beside it (a RunSpec's dict), in one line naming
    `run`, the field and both values: its `step`, `tokens` or `train_flops` are not what that spec trains (steps
    x batch_size x seq_len tokens, each at its stage's analytic FLOPs per token x flops_multiplier: marin.flops).
    A summary copied from another run with its run_id edited reads as this run's otherwise. None when they agree,
    the run did not complete, or spec.json is no RunSpec this code reads (an imported run's holds no model)."""
    if summary.get("status") != "completed" or not isinstance(spec, Mapping) or not {"model", "train"} <= set(spec):
        return None
    want = trained_totals(spec)
    if want is None:
        return None
    for key in ("step", "tokens"):
        got = summary.get(key)
        if is_number(got) and got != want[key]:
            return (f"{run}: summary.json has {key}={got!r} but spec.json trains {want[key]!r} ({want['what']}): a "
                    "summary of another run; left out (run the study again to train it)")
    got, (lo, hi) = summary.get("train_flops"), want["flops"]
    if is_number(got) and not lo * (1 - FLOPS_RTOL) <= got <= hi * (1 + FLOPS_RTOL):
        return (f"{run}: summary.json has train_flops={got:.6g} but spec.json trains "
                + (f"{lo:.6g}" if lo == hi else f"{lo:.6g}..{hi:.6g}") + f" ({want['what']}): a summary of another "
                "run; left out (run the study again to train it)")
    return None


def trained_totals(spec: Mapping) -> dict | None:
    """{step, tokens, flops (lo, hi: equal without context stages), what} the spec.json dict `spec` trains to its end
    (marin.train.loop's accounting), None when it is no RunSpec this code reads."""
    return _trained(json.dumps({k: v for k, v in spec.items() if k != "run_id"}, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _trained(spec_text: str) -> dict | None:
    try:
        spec = RunSpec.from_dict(json.loads(spec_text))
    except (ValueError, TypeError, KeyError):
        return None
    t = spec.train.effective()
    tokens = t.steps * t.batch_size * spec.model.seq_len  # every step holds this many (context stages divide the batch)
    lengths = {spec.model.seq_len, *(cs.seq_len for cs in t.context_stages)}
    fpt = [flops_per_token(spec.model, spec.recipe, n) * tokens * t.flops_multiplier for n in sorted(lengths)]
    return {"step": t.steps, "tokens": tokens, "flops": (min(fpt), max(fpt)),
            "what": f"{t.steps} steps of {t.batch_size} x {spec.model.seq_len} tokens"}
