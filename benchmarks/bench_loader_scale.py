"""The train loader at web scale: synthetic prepared corpora of 10^6 ... 10^8 documents (random lengths
1..L, L = max(3, 1.2·10^8 / n): at least the 46M tokens one hero step reads; the 10^8 case is 1-3 tokens
per document, ~3.4 GB on disk with its index), each opened as rank 0 of 704 at the hero's
shape (seq 4,096, 11,264 sequences per step), time and peak RSS to the first batch, for both
`DataConfig.shuffle` levels; each case in a fresh process (its RSS is its own). Prints a table.

Run: OMP_NUM_THREADS=1 python benchmarks/bench_loader_scale.py [--docs 1e6,1e7,1e8] [--documents-max 1e7]
     [--dir /tmp/marin-loader-scale]   (corpora are written once there and reused)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

_CHILD = r"""
import json, sys, time
def status_kib(key):  # this process's own (ru_maxrss would carry the parent's peak over fork + exec)
    return int(next(x for x in open("/proc/self/status") if x.startswith(key + ":")).split()[1])
def hwm_kib():
    return status_kib("VmHWM")
from marin_ablate.marin.data.index import IndexedCorpus
from marin_ablate.marin.data.shards import PreparedCorpus, ShardedBatches
root, shuffle, open_only = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
base = hwm_kib()
t = time.perf_counter()
if not open_only:
    corpus = IndexedCorpus(root) if shuffle == "indexed" else PreparedCorpus(root)
    tokens, targets, docs = ShardedBatches(corpus, 4096, 11264, seed=0, rank=0, world=704).batch(0)
    assert tokens.shape == (16, 4096)
    n_docs = int((docs.max(dim=1).values + 1).sum())
else:
    n_docs = 0
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "rss_kib": hwm_kib(), "import_rss_kib": base, "anon_kib": status_kib("RssAnon"),
                  "file_kib": status_kib("RssFile"), "batch_docs": n_docs}))
"""


def _run(root: Path, shuffle: str, open_only: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(root), shuffle, "1" if open_only else "0"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", default="1e6,1e7,1e8")
    ap.add_argument("--documents-max", type=float, default=1e7,
                    help="largest corpus opened with the documents shuffle (1e8: ~15 GB and minutes)")
    ap.add_argument("--dir", default="/tmp/marin-loader-scale")
    a = ap.parse_args()
    from marin_ablate.marin.data.synthetic import write_synthetic_corpus

    rows = []
    for n in [int(float(x)) for x in a.docs.split(",")]:
        root = Path(a.dir) / f"n{n}"
        if not (root / "index" / "index.json").is_file():
            t = time.perf_counter()
            m = write_synthetic_corpus(root, n, max_len=max(3, -(-120_000_000 // n)), docs_per_shard=1_000_000,
                                       seed=n % 1000)
            print(f"wrote {root}: {m['documents']:,} documents, {m['tokens']:,} tokens, {len(m['shards'])} shards, "
                  f"{time.perf_counter() - t:.0f} s (tokens + index)", flush=True)
        disk = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        floor = _run(root, "indexed", open_only=True)  # the interpreter with the loader imported
        for shuffle in ("indexed", "documents"):
            if shuffle == "documents" and n > a.documents_max:
                rows.append((n, shuffle, None, None, disk, floor))
                continue
            r = _run(root, shuffle)
            rows.append((n, shuffle, r, r["rss_kib"], disk, floor))
            print(f"  {n:>12,} {shuffle:<9} {r['s']:8.2f} s  {r['rss_kib'] / 1024:8.0f} MiB", flush=True)
    print("\nrank 0 of 704, seq 4096, 11,264 sequences per step: open + first batch (16 x 4096)")
    print("| documents | shuffle | time to first batch (s) | peak RSS (MiB) | peak above import (MiB) | "
          "anonymous RSS above import (MiB) | file-backed RSS (MiB) | document pieces in the batch | "
          "corpus on disk (GB) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, shuffle, r, rss, disk, floor in rows:
        if r is None:
            print(f"| {n:,} | {shuffle} | not run (> --documents-max) | | | | | | {disk / 1e9:.2f} |")
            continue
        anon = (r["anon_kib"] - floor["anon_kib"]) / 1024
        print(f"| {n:,} | {shuffle} | {r['s']:.3f} | {rss / 1024:,.0f} | {(rss - floor['rss_kib']) / 1024:,.0f} | "
              f"{anon:,.0f} | {r['file_kib'] / 1024:,.0f} | {r['batch_docs']:,} | {disk / 1e9:.2f} |")


if __name__ == "__main__":
    main()
