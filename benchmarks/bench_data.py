"""Data pipeline timings on this machine: embedded build, load, BPE, shard preparation, and the train
loader's read speed as a ratio to a plain memmap read of the same number of bytes (prints tables).

Run: OMP_NUM_THREADS=1 python benchmarks/bench_data.py  (uses a fresh temp MARIN_DATA_DIR)
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np


def _mean_seconds(fn, repeats: int) -> float:
    fn()  # warm: page cache, epoch order
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats


def main() -> None:
    os.environ["MARIN_DATA_DIR"] = tempfile.mkdtemp(prefix="marin-bench-data-")
    from marin_ablate.marin import data
    from marin_ablate.marin.config import DataConfig

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
    path = timed("prepared_train byte (first: write shards)", lambda: data.prepared_train(DataConfig()))
    timed("prepared_train byte (cached)", lambda: data.prepared_train(DataConfig()))
    from marin_ablate.marin.data import shards  # noqa: F401  (imports torch: not part of the open time)

    corpus = timed("PreparedCorpus open (sha256 verify)", lambda: data.PreparedCorpus(path))
    timed("train BPE 4096", lambda: data.get_tokenizer(DataConfig(tokenizer="bpe", bpe_vocab=4096)))
    timed("load_corpus bpe (tokenize + cache)", lambda: data.load_corpus(DataConfig(tokenizer="bpe")))
    data.clear_corpus_cache()
    timed("load_corpus bpe (token cache)", lambda: data.load_corpus(DataConfig(tokenizer="bpe")))
    print(data.describe(byte))
    print(f"{'step':<48} {'seconds':>8}")
    for name, sec in rows:
        print(f"{name:<48} {sec:>8.3f}")

    loader_table(corpus)
    mixture_table(corpus)


def mixture_table(corpus) -> None:
    """A step's read with a two-phase data mixture (per-domain streams) vs the single corpus stream,
    both measured in this run, and the mixture's slot layout alone at the hero's global batch."""
    from marin_ablate.marin import data
    from marin_ablate.marin.config import DataConfig
    from marin_ablate.marin.data.mixture import MixturePlan

    mix = DataConfig(mixture=((0.0, {"prose": 1, "scripture": 1, "docs": 1, "code": 1}),
                              (0.8, {"prose": 1, "scripture": 1, "docs": 2, "code": 2}))).mixture
    print(f"\n{'batch() of one step':<20} {'single ms':>10} {'mixture ms':>11} {'ratio':>7}")
    for b, s in ((16, 128), (64, 4096), (256, 4096)):
        plain = data.ShardedBatches(corpus, s, b, seed=0, rank=0, world=1)
        mixed = data.ShardedBatches(corpus, s, b, seed=0, rank=0, world=1, mixture=mix, total_steps=1000)
        step = [0]

        def read(loader):
            step[0] += 1
            return loader.batch(790 + step[0] % 20)  # both sides of the switch at step 800

        repeats = 20 if s < 1024 else 5
        t_plain, t_mixed = _mean_seconds(lambda: read(plain), repeats), _mean_seconds(lambda: read(mixed), repeats)
        print(f"{f'B{b} S{s}':<20} {t_plain * 1e3:>10.3f} {t_mixed * 1e3:>11.3f} {t_plain / t_mixed:>7.1%}")
    names, _ = corpus.doc_domains()
    plan = MixturePlan(mix, names, 390_251, 11_264, 0)
    t = _mean_seconds(lambda: plan.slots(312_300), 20)
    print(f"slot layout of one hero step (G 11,264, step 312,300): {t * 1e3:.3f} ms")


def _token_by_token(loader, step: int) -> np.ndarray:
    """The previous loader's read, for comparison: a shard lookup and an index per token."""
    corpus, S = loader.corpus, loader.seq_len
    pos_BW = loader.sequence_indices(step)[:, None] * S + np.arange(S + 1, dtype=np.int64)[None, :]
    w = pos_BW % loader.tokens_per_epoch
    perm, cum = loader._epoch(int(pos_BW[0, 0] // loader.tokens_per_epoch))
    k = np.searchsorted(cum, w, side="right") - 1
    glob = corpus.doc_starts[perm[k]] + (w - cum[k])
    shard_base = np.concatenate([[0], np.cumsum([len(t) for t in corpus._tokens])])
    shard = np.searchsorted(shard_base, glob, side="right") - 1
    out = np.empty(glob.shape, np.int64)
    for s in np.unique(shard):
        m = shard == s
        out[m] = corpus._tokens[s][glob[m] - shard_base[s]]
    return out


def loader_table(corpus) -> None:
    """The loader's read (windows) vs a plain memmap read of the same bytes, measured in this run
    (and the previous token-by-token read, for scale)."""
    from marin_ablate.marin import data

    flat = np.memmap(corpus.path / corpus.manifest["shards"][0]["tokens_path"], dtype=corpus.manifest["dtype"],
                     mode="r")
    print(f"\n{'read of one step':<16} {'memmap ms':>10} {'loader ms':>10} {'ratio':>7} {'per-token ms':>13} "
          f"{'ratio':>7} {'batch() ms':>11}")
    for b, s in ((16, 128), (64, 4096)):
        loader = data.ShardedBatches(corpus, s, b, seed=0, rank=0, world=1)
        n = b * (s + 1)
        step = [0]

        def read():
            step[0] += 1
            return loader.windows(step[0])

        def old():
            step[0] += 1
            return _token_by_token(loader, step[0])

        def plain():
            lo = (step[0] * n * 7919) % (len(flat) - n)
            step[0] += 1
            return np.asarray(flat[lo:lo + n], np.int64)

        repeats = 50 if s < 1024 else 10
        t_plain = _mean_seconds(plain, repeats)
        t_loader = _mean_seconds(read, repeats)
        t_old = _mean_seconds(old, repeats)
        t_batch = _mean_seconds(lambda: loader.batch(step[0]), repeats)
        print(f"{f'B{b} S{s}':<16} {t_plain * 1e3:>10.3f} {t_loader * 1e3:>10.3f} {t_plain / t_loader:>7.1%} "
              f"{t_old * 1e3:>13.3f} {t_plain / t_old:>7.1%} {t_batch * 1e3:>11.3f}")


if __name__ == "__main__":
    main()
