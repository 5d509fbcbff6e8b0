"""The train loader at web scale: one rank's memory, file-backed pages included, against the corpus size.

Synthetic prepared corpora (`marin/data/synthetic.py`, `data prepare`'s exact format with its loader index) of
10^6, 3·10^6 and 10^7 documents by default, every one of 1..`--max-len` random tokens (120: ~60 on average), so
a batch covers the same number of document pieces at every size and only the corpus grows. Each is opened as
rank 0 of 704 at the hero's shape (seq 4,096, 11,264 sequences per step: 16 rows) in a fresh process, which
reads its first batch and then `--batches` batches in all, with the page cache

- hot: every file of the corpus read just before (what a node that trained the step before holds), and
- cold: every file of the corpus evicted from the page cache just before (`posix_fadvise(DONTNEED)`; the
  benchmark's own files only, nothing system-wide).

Per case: time to the first batch and per batch after it; peak RSS; anonymous and file-backed RSS (RssAnon,
RssFile from /proc/self/status) above a process that imported the loader and opened nothing; and the page cache
of the corpus's files resident after the batches, counted with mincore(2) from the parent: cold, that is what
the rank's reads brought in, which a SLURM job's memory cgroup is charged for (cgroup v1 and v2 charge a page
cache page to the cgroup that first reads it; reclaimable, but counted against the job's limit until reclaimed).
Hot, it is the whole corpus and charged to whoever read it first (here the benchmark), not to the rank.
The `documents` shuffle (every document's key in memory) is run hot up to `--documents-max`, for comparison.

Run: OMP_NUM_THREADS=1 python benchmarks/bench_loader_scale.py [--docs 1e6,3e6,1e7] [--max-len 120]
     [--batches 8] [--documents-max 1e6] [--dir /tmp/marin-loader-scale]   (corpora written once there, reused)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

_CHILD = r"""
import json, sys, time
def status_kib(key):  # this process's own (ru_maxrss would carry the parent's peak over fork + exec)
    return int(next(x for x in open("/proc/self/status") if x.startswith(key + ":")).split()[1])
from marin_ablate.marin.data.index import IndexedCorpus
from marin_ablate.marin.data.shards import PreparedCorpus, ShardedBatches
root, shuffle, n_batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.perf_counter()
pieces, first = 0, None
if n_batches:
    corpus = IndexedCorpus(root) if shuffle == "indexed" else PreparedCorpus(root)
    sb = ShardedBatches(corpus, 4096, 11264, seed=0, rank=0, world=704)
    for step in range(n_batches):
        tokens, targets, docs = sb.batch(step)
        assert tokens.shape == (16, 4096)
        pieces += int((docs.max(dim=1).values + 1).sum())
        if step == 0:
            first = time.perf_counter() - t
dt = time.perf_counter() - t
print(json.dumps({"first_s": first, "s": dt, "hwm_kib": status_kib("VmHWM"), "anon_kib": status_kib("RssAnon"),
                  "file_kib": status_kib("RssFile"), "pieces": pieces}))
"""


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size)


def _drop_cache(root: Path) -> None:
    """Evict the corpus's own clean pages from the page cache (nothing else: no system-wide drop)."""
    for p in _files(root):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # a dirty page (a corpus just written) is not evicted
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _warm_cache(root: Path) -> None:
    for p in _files(root):
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))


def cached_bytes(root: Path) -> int:
    """Bytes of the corpus's files resident in the page cache: mincore(2) over a map of each file, which touches
    no page (so neither faults one in nor counts in anyone's RSS)."""
    import numpy as np

    page, total = mmap.PAGESIZE, 0
    for p in _files(root):
        size = p.stat().st_size
        with open(p, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
            view = np.frombuffer(m, np.uint8)  # the map's address; no page is read
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            rc = _libc.mincore(ctypes.c_void_p(view.ctypes.data), size, vec)
            del view  # the map closes only once nothing exports it
            if rc != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {p}")
            total += int(np.frombuffer(vec, np.uint8).__and__(1).sum()) * page
    return total


def _run(root: Path, shuffle: str, batches: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(root), shuffle, str(batches)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", default="1e6,3e6,1e7")
    ap.add_argument("--max-len", type=int, default=120, help="documents of 1..max-len tokens at every size")
    ap.add_argument("--batches", type=int, default=8, help="batches each rank reads (the first one timed alone)")
    ap.add_argument("--documents-max", type=float, default=1e6,
                    help="largest corpus opened with the documents shuffle (1e7: ~1.7 GB and ~2 min)")
    ap.add_argument("--dir", default="/tmp/marin-loader-scale")
    a = ap.parse_args()
    from marin_ablate.marin.data.synthetic import write_synthetic_corpus

    rows = []
    for n in [int(float(x)) for x in a.docs.split(",")]:
        root = Path(a.dir) / f"n{n}_L{a.max_len}"
        if not (root / "index" / "index.json").is_file():
            t = time.perf_counter()
            m = write_synthetic_corpus(root, n, max_len=a.max_len, docs_per_shard=1_000_000, seed=n % 1000)
            print(f"wrote {root}: {m['documents']:,} documents, {m['tokens']:,} tokens, {len(m['shards'])} shards, "
                  f"{time.perf_counter() - t:.0f} s (tokens + index)", flush=True)
        disk = sum(p.stat().st_size for p in _files(root))
        floor = _run(root, "indexed", 0)  # the interpreter with the loader imported, nothing opened
        for shuffle, cache in (("indexed", "hot"), ("indexed", "cold"), ("documents", "hot")):
            if shuffle == "documents" and n > a.documents_max:
                rows.append((n, shuffle, cache, None, disk, floor, None))
                continue
            if cache == "cold":
                _drop_cache(root)
                left = cached_bytes(root)
            else:
                _warm_cache(root)
                left = None
            r = _run(root, shuffle, a.batches)
            after = cached_bytes(root)
            rows.append((n, shuffle, cache, r, disk, floor, (left, after)))
            fil, anon = (r["file_kib"] - floor["file_kib"]) / 1024, (r["anon_kib"] - floor["anon_kib"]) / 1024
            print(f"  {n:>12,} {shuffle:<9} {cache:<4} first batch {r['first_s']:6.2f} s, file RSS {fil:7.1f} MiB, "
                  f"anon {anon:6.1f} MiB, page cache after {after / 2**20:7.1f} MiB", flush=True)
    print(f"\nrank 0 of 704, seq 4096, 11,264 sequences per step (16 rows), {a.batches} batches; documents of "
          f"1..{a.max_len} tokens; RSS above a process that imported the loader and opened nothing")
    print("| documents | shuffle | page cache | first batch (s) | per later batch (s) | peak RSS (MiB) | "
          "anonymous RSS (MiB) | file-backed RSS (MiB) | corpus page cache after (MiB) | document pieces read | "
          "corpus on disk (GB) |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, shuffle, cache, r, disk, floor, pc in rows:
        if r is None:
            print(f"| {n:,} | {shuffle} | {cache} | not run (> --documents-max) | | | | | | | {disk / 1e9:.2f} |")
            continue
        later = (r["s"] - r["first_s"]) / max(1, a.batches - 1)
        anon = (r["anon_kib"] - floor["anon_kib"]) / 1024
        fil = (r["file_kib"] - floor["file_kib"]) / 1024
        cache_after = f"{pc[1] / 2**20:,.1f}" + (" (rank's)" if cache == "cold" else " (all)")
        print(f"| {n:,} | {shuffle} | {cache} | {r['first_s']:.3f} | {later:.3f} | {r['hwm_kib'] / 1024:,.0f} | "
              f"{anon:,.1f} | {fil:,.1f} | {cache_after} | {r['pieces']:,} | {disk / 1e9:.2f} |")


if __name__ == "__main__":
    main()
