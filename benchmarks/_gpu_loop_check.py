"""Temporary device check (deleted after use): train() on CUDA bf16 with synthetic data, resume, stages."""
import json, sys, time, types, shutil
import torch
import marin

data = types.ModuleType("marin.data")
class Tok: vocab_size = 256
class Corpus:
    domains = ["a", "b"]; tokenizer = Tok(); name = "synthetic"
def load_corpus(dc): return Corpus()
class PackedBatches:
    def __init__(self, corpus, split, seq_len, batch_size, seed): self.S, self.B, self.seed = seq_len, batch_size, seed
    def batch(self, step):
        g = torch.Generator().manual_seed(self.seed * 100003 + step)
        base = torch.randint(0, 64, (self.B, 1), generator=g)
        t = (base + torch.arange(self.S + 1) * torch.randint(1, 4, (self.B, 1), generator=g)) % 256
        return t[:, :-1], t[:, 1:].clone(), torch.zeros(self.B, self.S, dtype=torch.long)
def eval_batches(c, d, S, B, n):
    p = PackedBatches(c, "x", S, B, 7 if d == "a" else 8); return [p.batch(i) for i in range(n)]
data.load_corpus = load_corpus; data.PackedBatches = PackedBatches; data.eval_batches = eval_batches
data.bytes_per_token = lambda c, d: 1.0
sys.modules["marin.data"] = data; marin.data = data

from marin.config import *
from marin.train import train
out = sys.argv[1]
import os; DEV = os.environ.get("DEV", "cuda")
for prec in ("bf16", "fp32"):
    cfg = preset("cpu_l", ["vocab_size=256"])
    t = TrainConfig(steps=40, batch_size=8, eval_every=20, eval_batches=2, log_every=5, checkpoint_every=10,
                    device=DEV, precision=prec, context_stages=(ContextStage(0.5, 256),))
    spec = RunSpec(model=cfg, train=t)
    t0 = time.time()
    try:
        ref = train(spec, f"{out}/ref_{prec}", resume=False)
    except Exception as e:
        import traceback; print(prec, "FAILED:", "".join(traceback.format_exc().splitlines(True)[-6:]), flush=True); continue
    t1 = time.time()
    cut = train(spec, f"{out}/cut_{prec}", resume=False, stop_after=15)
    res = train(spec, f"{out}/cut_{prec}")
    print(prec, "ref", ref["status"], ref["final_train_loss"], ref["eval_macro_loss"], "resumed", res["final_train_loss"],
          res["eval_macro_loss"], "bit-identical" if res["final_train_loss"] == ref["final_train_loss"] else "DIFFERS",
          "tps", ref["tokens_per_s"], "mfu", ref["mfu"], "hw", ref["hardware"], "wall", round(t1 - t0, 1), flush=True)
    lines = [json.loads(l) for l in open(f"{out}/ref_{prec}/metrics.jsonl")]
    print([(l["step"], l.get("seq_len"), l.get("loss"), l.get("eval_macro_loss")) for l in lines], flush=True)
    shutil.rmtree(f"{out}/cut_{prec}/checkpoints"); shutil.rmtree(f"{out}/ref_{prec}/checkpoints")
# a diverging run on GPU
s = train(RunSpec(model=preset("cpu_s"), recipe=Recipe.baseline(), train=TrainConfig(steps=5, batch_size=4, lr=1e30, adam_lr=1e30, eval_every=0, device=DEV, precision="fp32")), f"{out}/nan", resume=False)
print("nan run", s["status"], s["failed_step"], s["error"])
