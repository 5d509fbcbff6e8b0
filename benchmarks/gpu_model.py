"""GPU benchmark, model: the fast path's parity with eager sdpa/torch, host syncs of a training step,
the recipe block vs a plain block (fwd+bwd TFLOP/s, eager and compiled) and a full-model step's MFU.
Run through benchmarks/gpu.py."""

from __future__ import annotations

import math
import time
import traceback

import gpu_common as common
from gpu_common import CEIL, H200_BF16_DENSE_TFLOPS, elapsed, random_doc_ids, row, section, sync, tflops_row, timeit


@section
def bench_model_parity(dev):
    """The whole model on the same weights and batch: kernels='triton' against kernels='torch', then
    the fast configuration (flex attention, Triton kernels, blocks compiled) against eager sdpa/torch."""
    from dataclasses import replace

    import torch

    from marin_ablate.marin.config import Recipe
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.presets import PRESETS

    cfg = PRESETS["cpu_l" if dev.type == "cuda" else "tiny"]()
    B, S = (4, cfg.seq_len) if dev.type == "cuda" else (1, 32)
    tokens = torch.randint(0, cfg.vocab_size, (B, S), device=dev)
    doc = random_doc_ids(B, S, 32, dev)
    amp = dev.type == "cuda"
    # CPU has no flex backward: there the fast configuration is checked forward only.
    fast = dict(attention="flex" if dev.type == "cuda" else "sdpa", kernels="triton", compiled=dev.type == "cuda")

    def run(attention, kernels, compiled, state=None):
        torch.manual_seed(0)
        with torch.device(dev):
            model = MarinModel(replace(cfg, kernels=kernels, attention=attention), Recipe()).eval()  # eval: dropless
        if state is not None:
            model.load_state_dict(state)
        if compiled:
            for block in model.blocks:
                block.compile()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(tokens, doc, tokens)
        out.loss.backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.loss.item(), grads, model.state_dict()

    ref_loss, ref_grads, state = run("sdpa", "torch", False)
    for label, kw in (("kernels=triton eager", dict(attention="sdpa", kernels="triton", compiled=False)),
                      (f"attention={fast['attention']} kernels=triton{' compiled' if fast['compiled'] else ''}", fast)):
        loss, grads, _ = run(**kw, state=state)
        rel = abs(loss - ref_loss) / abs(ref_loss)
        row("parity", f"model loss {label} vs sdpa/torch eager (bf16)", rel, "rel err", "ok" if rel <= 1e-2 else "FAIL",
            f"loss {ref_loss:.4f} vs {loss:.4f}")
        worst = max(((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm().clamp_min(1e-12)).item() for n in ref_grads)
        row("parity", f"  worst parameter-gradient rel. L2 error, {label}", worst, "rel err",
            "ok" if worst <= 5e-2 else "FAIL", f"{len(ref_grads)} parameters")


@section
def bench_syncs(dev):
    """Host syncs in one eager training forward+backward (kernels torch and triton, sdpa): CUDA's
    sync debug mode raises at the first op that waits for the device. On CPU there is nothing to
    wait for (tests/marin/test_compile.py checks the same through graph breaks)."""
    from dataclasses import replace

    import torch

    from marin_ablate.marin.config import Recipe
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.presets import PRESETS

    if dev.type != "cuda":
        row("syncs", "host syncs in forward+backward", "n/a on CPU", "")
        return
    cfg = PRESETS["cpu_l"]()
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), device=dev)
    doc = random_doc_ids(4, cfg.seq_len, 32, dev)
    for kernels in (["torch", "triton"] if common.TRITON_OK else ["torch"]):
        with torch.device(dev):
            model = MarinModel(replace(cfg, kernels=kernels), Recipe()).train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(tokens, doc, tokens).loss.backward()  # warm-up: lazy init may sync once
        sync(dev)
        try:
            torch.cuda.set_sync_debug_mode("error")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(tokens, doc, tokens)
            out.loss.backward()
            verdict, note = "none", ""
        except RuntimeError as e:
            verdict, note = "FOUND", str(e).splitlines()[0][:100]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        row("syncs", f"host syncs in a training fwd+bwd, kernels={kernels}", verdict, "",
            "ok" if verdict == "none" else "FAIL", note)


# ---- blocks ---------------------------------------------------------------------------------


def plain_block_cls():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from marin_ablate.marin.kernels.torch_ops import grouped_mm_torch

    class PlainBlock(nn.Module):
        """What a peer runs: pre-RMSNorm GQA attention (SDPA, causal, QK RMSNorm with learned gain) and
        a top-K softmax MoE (sorted rows, torch._grouped_mm SwiGLU experts, index_add combine) plus one
        shared SwiGLU expert. No document masking (the SDPA flash path)."""

        def __init__(self, d, H, Hkv, h, E, K, m, m_shared):
            super().__init__()
            self.H, self.Hkv, self.h, self.E, self.K = H, Hkv, h, E, K
            self.n1, self.n2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
            self.qn, self.kn = nn.Parameter(torch.ones(h)), nn.Parameter(torch.ones(h))
            self.wq, self.wk = nn.Linear(d, H * h, bias=False), nn.Linear(d, Hkv * h, bias=False)
            self.wv, self.wo = nn.Linear(d, Hkv * h, bias=False), nn.Linear(H * h, d, bias=False)
            self.router = nn.Linear(d, E, bias=False)
            s = 0.5 / math.sqrt(d)
            self.w_gate = nn.Parameter(torch.randn(E, d, m) * s)
            self.w_up = nn.Parameter(torch.randn(E, d, m) * s)
            self.w_down = nn.Parameter(torch.randn(E, m, d) * s)
            self.s_gate, self.s_up = nn.Linear(d, m_shared, bias=False), nn.Linear(d, m_shared, bias=False)
            self.s_down = nn.Linear(m_shared, d, bias=False)

        def forward(self, x_BSD):
            B, S, D = x_BSD.shape
            H, Hkv, h, E, K = self.H, self.Hkv, self.h, self.E, self.K
            a = F.rms_norm(x_BSD, (D,), self.n1)
            q = F.rms_norm(self.wq(a).view(B, S, H, h).transpose(1, 2), (h,), self.qn)
            k = F.rms_norm(self.wk(a).view(B, S, Hkv, h).transpose(1, 2), (h,), self.kn)
            v = self.wv(a).view(B, S, Hkv, h).transpose(1, 2)
            if Hkv != H:  # explicit GQA expansion keeps SDPA on its flash kernel in every torch version
                k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x_BSD = x_BSD + self.wo(y.transpose(1, 2).reshape(B, S, H * h))
            m_TD = F.rms_norm(x_BSD, (D,), self.n2).view(B * S, D)
            probs = self.router(m_TD).float().softmax(-1)
            wts_TK, idx_TK = probs.topk(K, dim=-1)
            flat = idx_TK.reshape(-1)
            order = torch.sort(flat, stable=True).indices
            tok = order // K
            counts = torch.zeros(E, device=flat.device, dtype=torch.int32).scatter_add_(
                0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            xs = m_TD[tok]
            hid = F.silu(grouped_mm_torch(xs, self.w_gate, offs)) * grouped_mm_torch(xs, self.w_up, offs)
            ys = grouped_mm_torch(hid, self.w_down, offs) * wts_TK.reshape(-1)[order, None].to(xs.dtype)
            routed = torch.zeros_like(m_TD).index_add(0, tok, ys)
            shared = self.s_down(F.silu(self.s_gate(m_TD)) * self.s_up(m_TD))
            return x_BSD + (routed + shared).view(B, S, D)

    return PlainBlock


def block_fwd_flops_per_token(d, H, Hkv, h, keys, E, K, width, m, n_shared, m_shared, latent):
    """Matmul FLOPs of one block per token (forward), counted as marin.flops counts them."""
    f = 2 * (2 * d * H * h + 2 * d * Hkv * h) + 4 * H * h * keys + 2 * d * E
    f += 2 * K * 3 * width * m + n_shared * 2 * 3 * d * m_shared
    if latent:
        f += 4 * d * width
    return f


def recipe_context(cfg, doc, B, S, dev):
    """The ForwardContext MarinModel.forward builds: dense masks for sdpa, BlockMasks for flex."""
    from marin_ablate.marin.model import ForwardContext, attention_masks, block_masks, rope_tables

    masks = (block_masks if cfg.attention == "flex" else attention_masks)(doc, B, S, cfg.window, dev)
    cos, sin = rope_tables(S, int(cfg.head_dim * cfg.rope_fraction), cfg.rope_theta, dev)
    return ForwardContext(doc, *masks, cos, sin, 1.0)


def recipe_variants(dev, compiled):
    """(attention, kernels) pairs to time, the target configuration first. Eager flex is torch's
    unfused reference (not a speed candidate), and CPU has no flex backward: sdpa there."""
    kernels = ["triton", "torch"] if common.TRITON_OK else ["torch"]
    if compiled and dev.type == "cuda":
        return [("flex", k) for k in kernels] + [("sdpa", kernels[0])]
    return [("sdpa", k) for k in kernels]


@section
def bench_blocks(dev, compiled=False):
    import torch

    from marin_ablate.marin.config import ModelConfig, Recipe
    from marin_ablate.marin.flops import mean_keys_per_query
    from marin_ablate.marin.model import Block

    bf = torch.bfloat16
    if common.ARGS.tiny:
        B, S, d, H, Hkv, h, E, K, m, win = 2, 64, 64, 4, 2, 16, 8, 2, 32, 32
    else:
        B, S, d, H, Hkv, h, E, K, m, win = 8, 4096, 2048, 16, 4, 128, 64, 8, 512, 2048
    T = B * S
    x = torch.randn(B, S, d, device=dev, dtype=bf)
    g = torch.randn(B, S, d, device=dev, dtype=bf)
    doc = random_doc_ids(B, S, S // 8, dev)
    geo = f"B{B} S{S} d{d}"

    # Plain: E experts top-K at width d, one shared expert of hidden m, causal attention.
    plain = plain_block_cls()(d, H, Hkv, h, E, K, m, m).to(dev, bf)
    f_plain = 3 * T * block_fwd_flops_per_token(d, H, Hkv, h, (S + 1) / 2, E, K, d, m, 1, m, False)

    # Recipe: all switches on; latent geometry 2E experts top-2K at d/2 (same routed FLOPs), a local
    # layer (sliding window, half-RoPE) with document masking.
    def recipe_block(attention, kernels):
        cfg = ModelConfig(d_model=d, n_layers=4, n_heads=H, head_dim=h, n_kv_heads=Hkv,
                          n_kv_heads_global=max(1, Hkv // 2),
                          vocab_size=256, seq_len=S, window=win, n_experts=2 * E, top_k=2 * K, expert_hidden=m,
                          n_shared_experts=1, shared_hidden=m, latent_ratio=2, ep_shards=8, kernels=kernels,
                          attention=attention)
        blk = Block(cfg, Recipe(), 0).to(dev, bf).train()
        with torch.no_grad():  # the model's init: identity SConv, zero gate, trunc-normal matrices
            for n_, p in blk.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0, 0.5 / math.sqrt(d))
                elif "sconv" in n_:
                    p.zero_()
                    p[0] = 1
        return blk, recipe_context(cfg, doc, B, S, dev)

    f_recipe = 3 * T * block_fwd_flops_per_token(d, H, Hkv, h, mean_keys_per_query(S, win), 2 * E, 2 * K, d // 2, m,
                                                 1, m, True)

    def step(mod, ctx):
        xg = x.clone().requires_grad_()

        def run():
            out = mod(xg, ctx)[0] if ctx is not None else mod(xg)
            out.backward(g)

        return run

    wrap = torch.compile if compiled else (lambda mod: mod)
    how = "torch.compile" if compiled else "eager"
    runs = [(f"plain {how}", lambda: (wrap(plain), None), f_plain)]
    runs += [(f"recipe {how} attention={a} kernels={k}",
              lambda a=a, k=k: (lambda b, c: (wrap(b), c))(*recipe_block(a, k)), f_recipe)
             for a, k in recipe_variants(dev, compiled)]
    tf = {}
    for name, build, flops in runs:
        if compiled and elapsed() > common.ARGS.budget_s - 90:  # a block compiles in about a minute
            row("blocks", name, "skipped (time budget)", "")
            continue
        try:
            t = time.time()
            mod, ctx = build()
            fn = step(mod, ctx)
            fn()
            sync(dev)
            first = time.time() - t
            ms = timeit(fn, dev, warmup=1, iters=3 if common.ARGS.quick else 5)
            tf[name] = tflops_row("blocks", f"{name} fwd+bwd {geo}", flops, ms, f"{ms:.1f} ms; first call {first:.1f}s")
            del mod, ctx, fn
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row("blocks", name, f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}", "")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    recipe_best = max((v for k, v in tf.items() if k.startswith("recipe")), default=None)
    if compiled and recipe_best and f"plain {how}" in tf:
        ratio = recipe_best / tf[f"plain {how}"]
        row("blocks", "best compiled recipe / compiled plain (target >= 1.1)", ratio, "x",
            "met" if ratio >= 1.1 else "not met")
    if not compiled:
        row("blocks", "plain: model FLOPs/token fwd", f_plain / 3 / T, "FLOP", None, "causal keys (S+1)/2")
        row("blocks", "recipe: model FLOPs/token fwd", f_recipe / 3 / T, "FLOP", None,
            f"window {win} keys, latent 2E/top-2K at d/2")


@section
def bench_full_model(dev):
    """A training step of the whole model with the recipe's own optimizer (Hyperball: Newton–Schulz
    on every matrix and expert stack), bf16 autocast, blocks compiled as TrainConfig.compile does."""
    from dataclasses import replace

    import torch

    from marin_ablate.marin.config import Recipe, RunSpec, TrainConfig
    from marin_ablate.marin.flops import flops_per_token
    from marin_ablate.marin.model import MarinModel
    from marin_ablate.marin.presets import PRESETS
    from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams

    name = "tiny" if common.ARGS.tiny else "d1024"
    recipe = Recipe()
    base = PRESETS[name]()
    B, S = (2, base.seq_len) if common.ARGS.tiny else (8, base.seq_len)
    tokens = torch.randint(0, base.vocab_size, (B, S), device=dev)
    targets = torch.randint(0, base.vocab_size, (B, S), device=dev)
    doc = random_doc_ids(B, S, max(8, S // 8), dev)
    amp = dev.type == "cuda"
    compile_ = dev.type == "cuda" or common.ARGS.compile_cpu
    attention, kernels = recipe_variants(dev, compile_)[0]
    cfg = replace(base, attention=attention, kernels=kernels)
    with torch.device(dev):  # initialise on the device: ~3B parameters at d1024
        model = MarinModel(cfg, recipe).train()
    if compile_:
        for block in model.blocks:
            block.compile()
    spec = RunSpec(model=cfg, recipe=recipe, train=TrainConfig(steps=1000, batch_size=B, device=dev.type))
    opt = build_optimizer(model, resolve_hparams(spec))

    def fwd_bwd():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(tokens, doc, targets)
        out.loss.backward()

    def train_step():
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.update_router_biases()

    t = time.time()
    train_step()
    sync(dev)
    first = time.time() - t
    iters = 2 if common.ARGS.tiny else 4
    ms = timeit(train_step, dev, warmup=1, iters=iters)
    ms_fb = timeit(fwd_bwd, dev, warmup=0, iters=iters)
    opt.zero_grad(set_to_none=True)
    fpt = flops_per_token(cfg, recipe, S)
    nparams = sum(p.numel() for p in model.parameters())
    label = f"{name} attention={attention} kernels={kernels}{' compiled blocks' if compile_ else ' eager'}"
    row("model", f"{label} train step (Hyperball) B{B} S{S}", ms, "ms", None,
        f"{nparams / 1e9:.2f}B params; first step {first:.1f}s")
    row("model", f"{name} forward+backward only", ms_fb, "ms", None, f"optimizer {ms - ms_fb:.1f} ms")
    row("model", f"{name} tokens/s", B * S / (ms * 1e-3), "tok/s")
    for what, t_ms in (("train step", ms), ("fwd+bwd", ms_fb)):
        achieved = fpt * B * S / (t_ms * 1e-3)
        if CEIL["matmul_TFLOPs"]:
            mfu = 100 * achieved / 1e12 / CEIL["matmul_TFLOPs"]
            row("model", f"{name} MFU ({what}) vs measured bf16 matmul", mfu, "%",
                ("met" if mfu >= 45 else "not met") if what == "train step" else None,
                f"{achieved / 1e12:.1f} TFLOP/s model FLOPs (marin.flops); target >= 45%")
        if dev.type == "cuda":
            row("model", f"{name} MFU ({what}) vs {H200_BF16_DENSE_TFLOPS:.0f} TFLOP/s datasheet",
                100 * achieved / 1e12 / H200_BF16_DENSE_TFLOPS, "%")
    if dev.type == "cuda":
        row("model", "peak memory", torch.cuda.max_memory_allocated(dev) / 2**30, "GiB")

