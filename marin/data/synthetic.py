"""A synthetic prepared corpus in `data prepare`'s exact format, written with numpy alone: the loader
scale benchmark (10^6 ... 10^8 documents, `benchmarks/bench_loader_scale.py`) and the loader's tests,
which need corpora far larger than any text this machine has, cheaply."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from marin_ablate.marin.data.index import build_index
from marin_ablate.marin.data.manifest import FORMAT
from marin_ablate.marin.data.prepare import token_dtype, write_manifest, write_shard


def write_synthetic_corpus(out: str | Path, n_docs: int, *, seed: int = 0, max_len: int = 3, vocab: int = 256,
                           docs_per_shard: int = 1_000_000, domains: tuple[str, ...] = (),
                           index: bool = True) -> dict:
    """`n_docs` documents of 1..max_len random tokens (document j's domain: domains[j % len(domains)]),
    in shards of `docs_per_shard`, a manifest and (with `index`) the loader index; returns the manifest."""
    out = Path(out).expanduser()
    (out / "shards").mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(vocab)
    rng = np.random.default_rng(seed)
    metas = []
    for i, lo in enumerate(range(0, n_docs, docs_per_shard)):
        k = min(docs_per_shard, n_docs - lo)
        lengths = rng.integers(1, max_len + 1, size=k, dtype=np.int64)
        offsets = np.zeros(k + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = rng.integers(0, vocab, size=int(offsets[-1]), dtype=np.int64).astype(dtype).tobytes()
        names = list(domains) or [""]
        dom = (np.arange(lo, lo + k) % len(names)).astype(np.int32)
        count = np.bincount(dom, minlength=len(names))
        tok = np.bincount(dom, weights=lengths, minlength=len(names)).astype(np.int64)
        per_domain = {n: {"documents": int(count[d]), "tokens": int(tok[d]), "text_bytes": int(tok[d])}
                      for d, n in enumerate(names)}
        metas.append(write_shard(out, i, (lo, lo + k), data, offsets, names, dom if domains else None, per_domain,
                                 0, int(offsets[-1])))
    job = {"format": FORMAT, "source": {"source": "synthetic", "seed": seed, "files": []},
           "tokenizer": {"kind": "byte" if vocab == 256 else "synthetic", "vocab_size": vocab},
           "text_column": "text", "domain_column": "domain" if domains else None, "folder_domains": False,
           "id_column": None, "docs_per_shard": docs_per_shard, "rows": n_docs}
    manifest = write_manifest(out, job, metas)
    if index:
        build_index(out)
    return manifest
