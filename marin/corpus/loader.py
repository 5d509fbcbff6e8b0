"""Packed training batches of a prepared corpus for many data-parallel ranks.

The corpus is one token stream per epoch: its documents in the order of a PCG64 permutation keyed by
(data seed, epoch), concatenated. A step consumes `global_batch` sequences of `seq_len` tokens;
sequence j is the stream window [j*S, j*S + S] (S+1 tokens: no target is lost between sequences),
and rank r of W reads sequences step*G + r*(G/W) ... + G/W - 1. So ranks read disjoint slices that
together cover the stream, the batches depend only on (corpus, seed, seq_len, global batch) —
every arm of a study trains on the same tokens in the same order — and a resumed run (even on a
different number of ranks) continues at the exact next sequence from `state_dict()["step"]`.
Documents are packed with per-sequence ids and cross-document targets masked by marin.data's
packer, as for the embedded corpus (PackedBatches).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from marin.corpus.prepare import read_manifest
from marin.data.packing import _pack


class PreparedCorpus:
    """A prepared corpus directory, memory-mapped: its documents as one virtual token array."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.manifest = read_manifest(self.path)
        self.fingerprint = hashlib.sha256((self.path / "manifest.json").read_bytes()).hexdigest()[:16]
        dtype = np.dtype(self.manifest["dtype"])
        self._tokens, starts, lengths = [], [], []
        base = 0
        self._shard_base = [0]
        for sh in self.manifest["shards"]:
            offsets = np.load(self.path / sh["offsets_path"], mmap_mode="r")
            if int(offsets[-1]) != sh["tokens"]:
                raise ValueError(f"{self.path / sh['offsets_path']}: {int(offsets[-1])} tokens, manifest says "
                                 f"{sh['tokens']}; prepare the corpus again")
            n_bytes = (self.path / sh["tokens_path"]).stat().st_size
            if n_bytes != sh["tokens"] * dtype.itemsize:
                raise ValueError(f"{self.path / sh['tokens_path']}: {n_bytes} bytes, manifest says {sh['tokens']} "
                                 f"{dtype.name} tokens; prepare the corpus again")
            self._tokens.append(np.memmap(self.path / sh["tokens_path"], dtype=dtype, mode="r")
                                if sh["tokens"] else np.zeros(0, dtype))
            starts.append(base + np.asarray(offsets[:-1], np.int64))
            lengths.append(np.diff(np.asarray(offsets, np.int64)))
            base += sh["tokens"]
            self._shard_base.append(base)
        self.doc_starts = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        self.doc_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self._shard_base_arr = np.asarray(self._shard_base, np.int64)
        self.n_tokens, self.n_docs = base, len(self.doc_lengths)

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    def gather(self, pos: np.ndarray) -> np.ndarray:
        """Tokens (int64) at global positions `pos` of the stored (unshuffled) token array."""
        pos = np.asarray(pos, np.int64)
        out = np.empty(pos.shape, np.int64)
        shard = np.searchsorted(self._shard_base_arr, pos, side="right") - 1
        for s in np.unique(shard):
            m = shard == s
            out[m] = self._tokens[s][pos[m] - self._shard_base[s]]
        return out

    def doc(self, j: int) -> np.ndarray:
        return self.gather(self.doc_starts[j] + np.arange(self.doc_lengths[j]))


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ShardedBatches:
    """This rank's packed batches of a prepared corpus; iterate, or index by step (random access).

    rank/world default to torch.distributed's (0/1 when not initialised); the batch a rank reads at
    a step is (global_batch / world) sequences."""

    def __init__(self, corpus: PreparedCorpus | str | Path, seq_len: int, global_batch: int, seed: int,
                 rank: int | None = None, world: int | None = None):
        self.corpus = corpus if isinstance(corpus, PreparedCorpus) else PreparedCorpus(corpus)
        r, w = _dist_rank_world()
        self.rank, self.world = (r if rank is None else rank), (w if world is None else world)
        for name, v in (("seq_len", seq_len), ("global_batch", global_batch), ("world", self.world)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank={self.rank} must be in 0..{self.world - 1}")
        if global_batch % self.world:
            raise ValueError(f"global_batch={global_batch} must be a multiple of the data-parallel world size {self.world}")
        self.seq_len, self.global_batch, self.seed = int(seq_len), int(global_batch), int(seed)
        self.batch_size = self.global_batch // self.world
        self.tokens_per_epoch = self.corpus.n_tokens
        need = self.global_batch * self.seq_len + 1
        if self.tokens_per_epoch < need:
            raise ValueError(f"prepared corpus {self.corpus.path} has {self.tokens_per_epoch} tokens, fewer than one "
                             f"step needs: global_batch {global_batch} x seq_len {seq_len} + 1 = {need}")
        self.step = 0
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def tokens_per_step(self) -> int:
        """Tokens one step consumes over all ranks."""
        return self.global_batch * self.seq_len

    def epoch_of(self, step: int) -> float:
        return step * self.tokens_per_step / self.tokens_per_epoch

    def order(self, epoch: int) -> np.ndarray:
        """The document order of `epoch` (a permutation of 0..n_docs-1)."""
        return self._epoch(epoch)[0]

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        if e not in self._epochs:
            perm = np.random.Generator(np.random.PCG64([self.seed, e])).permutation(self.corpus.n_docs)
            cum = np.concatenate([[0], np.cumsum(self.corpus.doc_lengths[perm])]).astype(np.int64)
            if len(self._epochs) >= 2:  # a batch spans at most two epochs
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[e] = (perm, cum)
        return self._epochs[e]

    def sequence_indices(self, step: int) -> np.ndarray:
        """Global indices of the sequences this rank reads at `step`."""
        return step * self.global_batch + self.rank * self.batch_size + np.arange(self.batch_size, dtype=np.int64)

    def windows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens_BW, docs_BW): the S+1-token stream windows of this rank's sequences and a global
        document key per token (epoch * n_docs + position of the document in the epoch's order)."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        S = self.seq_len
        pos_BW = self.sequence_indices(step)[:, None] * S + np.arange(S + 1, dtype=np.int64)[None, :]
        epoch_BW, within_BW = pos_BW // self.tokens_per_epoch, pos_BW % self.tokens_per_epoch
        tokens_BW = np.empty(pos_BW.shape, np.int64)
        docs_BW = np.empty(pos_BW.shape, np.int64)
        for e in np.unique(epoch_BW):
            m = epoch_BW == e
            perm, cum = self._epoch(int(e))
            w = within_BW[m]
            k = np.searchsorted(cum, w, side="right") - 1
            tokens_BW[m] = self.corpus.gather(self.corpus.doc_starts[perm[k]] + (w - cum[k]))
            docs_BW[m] = int(e) * self.corpus.n_docs + k
        return tokens_BW, docs_BW

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens_BS, targets_BS, doc_ids_BS) LongTensors of this rank at `step`; targets -100 across documents."""
        return _pack(*self.windows(step))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict:
        """What a checkpoint stores: the next step and what makes the stream this stream."""
        return {"step": self.step, "seed": self.seed, "seq_len": self.seq_len, "global_batch": self.global_batch,
                "corpus": self.corpus.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        for k in ("seed", "seq_len", "global_batch", "corpus"):
            if state.get(k) != mine[k]:
                raise ValueError(f"loader state {k}={state.get(k)!r} does not match this loader's {mine[k]!r}: "
                                 "resuming would read a different stream")
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"loader state step={step!r} must be an integer >= 0")
        self.step = step
