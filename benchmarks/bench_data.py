"""Data pipeline timings on this machine: embedded build, load, BPE, packing (prints a table).

Run: OMP_NUM_THREADS=1 python benchmarks/bench_data.py  (uses a fresh temp MARIN_DATA_DIR)
"""

from __future__ import annotations

import os
import tempfile
import time


def main() -> None:
    os.environ["MARIN_DATA_DIR"] = tempfile.mkdtemp(prefix="marin-bench-data-")
    from marin import data
    from marin.config import DataConfig

    rows = []

    def timed(name, fn):
        t = time.perf_counter()
        out = fn()
        rows.append((name, time.perf_counter() - t))
        return out

    timed("build embedded corpus", data.embedded_corpus_dir)
    byte = timed("load_corpus byte (first: datasets -> arrow)", lambda: data.load_corpus(DataConfig()))
    data.clear_corpus_cache()
    timed("load_corpus byte (arrow cached)", lambda: data.load_corpus(DataConfig()))
    timed("train BPE 4096", lambda: data.get_tokenizer(DataConfig(tokenizer="bpe", bpe_vocab=4096)))
    timed("load_corpus bpe (tokenize + cache)", lambda: data.load_corpus(DataConfig(tokenizer="bpe")))
    data.clear_corpus_cache()
    timed("load_corpus bpe (token cache)", lambda: data.load_corpus(DataConfig(tokenizer="bpe")))
    for b, s in ((16, 128), (64, 4096)):
        pb = data.PackedBatches(byte, "train", s, b, seed=0)
        pb.batch(0)
        t = time.perf_counter()
        for step in range(1, 21):
            pb.batch(step)
        rows.append((f"PackedBatches.batch B{b} S{s} (mean of 20)", (time.perf_counter() - t) / 20))
    print(data.describe(byte))
    print(f"{'step':<48} {'seconds':>8}")
    for name, sec in rows:
        print(f"{name:<48} {sec:>8.3f}")


if __name__ == "__main__":
    main()
