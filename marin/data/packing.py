"""Eval batches of a corpus' held-out documents (packed like the train stream: targets masked across
documents, document ids per sequence), bytes per token and a corpus summary.
"""

from __future__ import annotations

import numpy as np
import torch

from marin_ablate.marin.data.loading import Corpus
from marin_ablate.marin.data.shards import check_positive_ints, pack_stream


def eval_batches(corpus: Corpus, domain: str, seq_len: int, batch_size: int, n_batches: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Up to `n_batches` batches of the domain's held-out documents in stored order (independent
    of data_seed), non-overlapping: every held-out target is scored at most once. Fewer batches come
    back when the held-out split runs out; less than one batch is an error."""
    check_positive_ints(seq_len=seq_len, batch_size=batch_size)
    ds = corpus.check_domain(domain)
    if n_batches < 1:
        raise ValueError(f"n_batches={n_batches} must be >= 1")
    per_batch = batch_size * seq_len
    available = (ds.n_tokens - 1) // per_batch
    if available < 1:
        raise ValueError(f"corpus {corpus.name!r} domain {domain!r} held-out split has {ds.n_tokens} tokens "
                         f"({ds.n_docs} documents), fewer than one eval batch needs: batch_size {batch_size} x "
                         f"seq_len {seq_len} + 1 = {per_batch + 1}")
    n = min(n_batches, available)
    docs = np.repeat(np.arange(ds.n_docs, dtype=np.int64), np.diff(ds.offsets))
    out = []
    for b in range(n):
        pos_BW = (b * batch_size + np.arange(batch_size))[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
        out.append(pack_stream(ds.tokens[pos_BW], docs[pos_BW]))
    return out


def bytes_per_token(corpus: Corpus, domain: str) -> float:
    """UTF-8 bytes per token of the domain's held-out text: bpb = loss_nats / ln 2 / bytes_per_token."""
    ds = corpus.check_domain(domain)
    if ds.n_tokens == 0:
        raise ValueError(f"corpus {corpus.name!r} domain {domain!r}: held-out split is empty")
    return ds.text_bytes / ds.n_tokens


def describe(corpus: Corpus) -> str:
    """One line per domain: documents, tokens and bytes of each split."""
    lines = [f"corpus {corpus.name} ({corpus.tokenizer.name}, vocab {corpus.tokenizer.vocab_size})"]
    for d in sorted(set(corpus.train) | set(corpus.heldout)):
        tr, ho = corpus.train.get(d), corpus.heldout.get(d)
        cells = [f"{s} {x.n_docs} docs {x.n_tokens} tok {x.text_bytes} B"
                 for s, x in (("train", tr), ("heldout", ho)) if x]
        lines.append(f"  {d:<12} " + " | ".join(cells))
    return "\n".join(lines)

