"""Packing and eval batches: random access by step into one shuffled token stream, targets masked
across documents, document ids per sequence (the packing of Marin's data pipeline; see the package
docstring for the stream layout).
"""

from __future__ import annotations

import numpy as np
import torch

from marin.data.corpus import IGNORE_INDEX, _hash_hex
from marin.data.loading import Corpus


def _pack(tokens_NW: np.ndarray, docs_NW: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Windows of S+1 stream tokens with a global document key each -> (tokens, targets, doc_ids)."""
    same_NS = docs_NW[:, 1:] == docs_NW[:, :-1]
    targets_NS = np.where(same_NS, tokens_NW[:, 1:], IGNORE_INDEX)
    # renumber documents 0, 1, ... within each sequence, in order of appearance
    starts_NS = np.concatenate([np.zeros((len(docs_NW), 1), bool), ~same_NS[:, :-1]], axis=1)
    doc_ids_NS = np.cumsum(starts_NS, axis=1)
    return (torch.from_numpy(tokens_NW[:, :-1].astype(np.int64)), torch.from_numpy(targets_NS.astype(np.int64)),
            torch.from_numpy(doc_ids_NS.astype(np.int64)))


def _check_shape(seq_len: int, batch_size: int) -> None:
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")


class PackedBatches:
    """Fixed-length packed batches of a split, deterministic from `seed` and random-access by step.

    Documents of every domain of the split are ordered per epoch by sha256(seed, epoch, doc uid)
    and concatenated; batch `step` is sequences step*B .. step*B+B-1, sequence j the stream window
    [j*S, j*S + S] (S+1 tokens, so no target is lost between sequences). Epochs repeat with a fresh
    order. Nothing depends on the recipe or on previous calls: every arm gets identical batches and a
    resumed run continues exactly where it stopped."""

    def __init__(self, corpus: Corpus, split: str, seq_len: int, batch_size: int, seed: int):
        _check_shape(seq_len, batch_size)
        parts = corpus.split(split)
        self.corpus, self.split, self.seq_len, self.batch_size, self.seed = corpus, split, seq_len, batch_size, int(seed)
        uids, arrays, lengths = [], [], []
        for d in sorted(parts):
            ds = parts[d]
            uids.extend(f"{d}/{i}" for i in ds.doc_ids)
            arrays.append(ds.tokens)
            lengths.append(np.diff(ds.offsets))
        self._uids = uids
        self._flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        self._lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self.tokens_per_epoch = int(self._lengths.sum())
        need = batch_size * seq_len + 1
        if self.tokens_per_epoch < need:
            raise ValueError(f"corpus {corpus.name!r} split {split!r} has {self.tokens_per_epoch} tokens "
                             f"({len(uids)} documents), fewer than one batch needs: batch_size {batch_size} x "
                             f"seq_len {seq_len} + 1 = {need}")
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def epoch_of(self, step: int) -> float:
        """How many passes over the split the stream has made when batch `step` starts."""
        return step * self.tokens_per_step / self.tokens_per_epoch

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        if e not in self._epochs:
            # sha256-keyed order: stable across numpy versions and independent of storage order
            keys = np.array([int(_hash_hex(f"{self.seed}:{e}:{u}")[:15], 16) for u in self._uids], dtype=np.int64)
            perm = np.argsort(keys, kind="stable")
            cum = np.concatenate([[0], np.cumsum(self._lengths[perm])]).astype(np.int64)
            if len(self._epochs) >= 4:
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[e] = (perm, cum)
        return self._epochs[e]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens_BS, targets_BS, doc_ids_BS) LongTensors; targets -100 across documents."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        B, S = self.batch_size, self.seq_len
        seq_B = step * B + np.arange(B, dtype=np.int64)
        pos_BW = seq_B[:, None] * S + np.arange(S + 1, dtype=np.int64)[None, :]
        epoch_BW = pos_BW // self.tokens_per_epoch
        within_BW = pos_BW % self.tokens_per_epoch
        tokens_BW = np.empty(pos_BW.shape, np.int32)
        docs_BW = np.empty(pos_BW.shape, np.int64)
        n_docs = len(self._uids)
        for e in np.unique(epoch_BW):
            m = epoch_BW == e
            perm, cum = self._epoch(int(e))
            w = within_BW[m]
            k = np.searchsorted(cum, w, side="right") - 1
            tokens_BW[m] = self._flat[self._starts[perm[k]] + (w - cum[k])]
            docs_BW[m] = int(e) * n_docs + k
        return _pack(tokens_BW, docs_BW)


def eval_batches(corpus: Corpus, domain: str, seq_len: int, batch_size: int, n_batches: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Up to `n_batches` batches of the domain's held-out documents in stored order (independent
    of data_seed), non-overlapping: every held-out target is scored at most once. Fewer batches come
    back when the held-out split runs out; less than one batch is an error."""
    _check_shape(seq_len, batch_size)
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
        out.append(_pack(ds.tokens[pos_BW], docs[pos_BW]))
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
        cells = [f"{s} {x.n_docs} docs {x.n_tokens} tok {x.text_bytes} B" for s, x in (("train", tr), ("heldout", ho)) if x]
        lines.append(f"  {d:<12} " + " | ".join(cells))
    return "\n".join(lines)

