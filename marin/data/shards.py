"""Packed training batches of a prepared corpus for many data-parallel ranks: the one train loader.

The corpus is one token stream per epoch: its documents ordered by sha256(data seed, epoch, document
uid) (uid: "DOMAIN/ID" when the corpus has document ids and domains, else the document's index), and
concatenated. A step consumes `global_batch` sequences of `seq_len` tokens; sequence j is the stream
window [j*S, j*S + S] (S+1 tokens: no target is lost between sequences), and rank r of W reads
sequences step*G + r*(G/W) ... + G/W - 1. So ranks read disjoint slices that together cover the
stream, the batches depend only on (corpus, seed, seq_len, global batch) — every arm of a study
trains on the same tokens in the same order — and a resumed run (even on a different number of
ranks) continues at the exact next sequence from `state_dict()["step"]`. A window is copied from
the memory-mapped shards one document piece at a time (whole slices, never token by token).
Documents are packed with per-sequence ids and cross-document targets masked (`pack_stream`).

With a data mixture (`DataConfig.mixture`, marin/data/mixture.py) every domain is its own stream of this kind
(the corpus order restricted to it), drawn from in the phase's proportions.

Simulated epoching (`DataConfig.simulated_epoching_target`, levanter's experiment_budget /
target_budget): each component -- the corpus stream, or each domain stream of a mixture -- of n
sequences (its tokens // seq_len, as levanter counts a packed cache) is cut to its first
L = int(n · (run tokens / target)) sequences, and sequence j of the component reads its sequence
j mod L: the component repeats as often as it would in a run of `target` tokens (`simulated_length`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from marin_ablate.marin.data.corpus import IGNORE_INDEX, hash_hex
from marin_ablate.marin.data.index import FULL_VERIFY_BYTES, IndexedCorpus, IndexedStream
from marin_ablate.marin.data.manifest import domain_names, load_npy, manifest_fingerprint, read_manifest
from marin_ablate.marin.data.mixture import MixturePlan
from marin_ablate.marin.schema import sha256_file

# corpora (and loader indexes) up to FULL_VERIFY_BYTES are hashed whole when opened; larger: `data verify`
_VERIFIED: dict[tuple, bool] = {}  # (path, sizes and mtimes) -> verified in this process


def pack_stream(tokens_NW: np.ndarray, docs_NW: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Windows of S+1 stream tokens with a global document key each -> (tokens, targets, doc_ids)."""
    same_NS = docs_NW[:, 1:] == docs_NW[:, :-1]
    targets_NS = np.where(same_NS, tokens_NW[:, 1:], IGNORE_INDEX)
    # renumber documents 0, 1, ... within each sequence, in order of appearance
    starts_NS = np.concatenate([np.zeros((len(docs_NW), 1), bool), ~same_NS[:, :-1]], axis=1)
    doc_ids_NS = np.cumsum(starts_NS, axis=1)
    return (torch.from_numpy(tokens_NW[:, :-1].astype(np.int64)), torch.from_numpy(targets_NS.astype(np.int64)),
            torch.from_numpy(doc_ids_NS.astype(np.int64)))


def check_positive_ints(**values: object) -> None:
    """ValueError naming the first of `values` that is not a positive integer."""
    for name, v in values.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")


def shuffle_order(uids: list[str], seed: int, epoch: int) -> np.ndarray:
    """The documents' order in `epoch`: by sha256(seed:epoch:uid), stable across numpy versions and
    independent of how the documents are stored."""
    keys = np.array([int(hash_hex(f"{seed}:{epoch}:{u}")[:15], 16) for u in uids], dtype=np.int64)
    return np.argsort(keys, kind="stable")


def verify_corpus(path: str | Path, full: bool = True) -> dict:
    """Check a prepared corpus against its manifest: every shard's size, and with `full` its sha256
    (tokens and offsets) and token ids below the vocabulary. Raises ValueError naming the file."""
    root = Path(path).expanduser()
    manifest = read_manifest(root)
    dtype, vocab = np.dtype(manifest["dtype"]), int(manifest["tokenizer"]["vocab_size"])
    for sh in manifest["shards"]:
        tp, op = root / sh["tokens_path"], root / sh["offsets_path"]
        for f in (tp, op):
            if not f.is_file():
                raise ValueError(f"{f}: missing from prepared corpus {root}; prepare the corpus again")
        n_bytes = tp.stat().st_size
        if n_bytes != sh["tokens"] * dtype.itemsize:
            raise ValueError(f"{tp}: {n_bytes} bytes, manifest says {sh['tokens']} {dtype.name} tokens; "
                             "prepare the corpus again")
        if not full:
            continue
        if sha256_file(tp) != sh["sha256"]:
            raise ValueError(f"{tp}: content differs from manifest.json (sha256); the shard was changed after "
                             "preparation: prepare the corpus again")
        if "offsets_sha256" in sh and sha256_file(op) != sh["offsets_sha256"]:
            raise ValueError(f"{op}: content differs from manifest.json (sha256); prepare the corpus again")
        if sh["tokens"]:
            top = int(np.max(np.memmap(tp, dtype=dtype, mode="r")))
            if top >= vocab:
                raise ValueError(f"{tp}: token id {top} >= the tokenizer's vocabulary {vocab}; "
                                 "prepare the corpus again")
    return manifest


def _stamp(f: Path) -> tuple[int, int, int] | None:
    try:
        st = f.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def verify_once(path: Path, manifest: dict, fingerprint: str) -> None:
    """`verify_corpus` once per process and state of the shards: whole when at most FULL_VERIFY_BYTES."""
    total = sum(sh["tokens"] for sh in manifest["shards"]) * np.dtype(manifest["dtype"]).itemsize
    stamp = tuple(_stamp(path / sh[k]) for sh in manifest["shards"] for k in ("tokens_path", "offsets_path"))
    key = (str(path.resolve()), fingerprint, stamp)
    if key not in _VERIFIED:
        verify_corpus(path, full=total <= FULL_VERIFY_BYTES)
        _VERIFIED[key] = True


class PreparedCorpus:
    """A prepared corpus directory, memory-mapped, verified against its manifest when opened
    (whole when at most FULL_VERIFY_BYTES; larger ones by size, with `data verify` for the hashes)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.manifest = read_manifest(self.path)
        self.fingerprint = manifest_fingerprint(self.path)
        dtype = np.dtype(self.manifest["dtype"])
        verify_once(self.path, self.manifest, self.fingerprint)
        self._tokens, lengths, shard_of, local = [], [], [], []
        for s, sh in enumerate(self.manifest["shards"]):
            offsets = np.asarray(load_npy(self.path / sh["offsets_path"]), np.int64)
            if len(offsets) != sh["documents"] + 1 or int(offsets[-1]) != sh["tokens"]:
                raise ValueError(f"{self.path / sh['offsets_path']}: {len(offsets) - 1} documents / {int(offsets[-1])} "
                                 f"tokens, manifest says {sh['documents']} / {sh['tokens']}; prepare the corpus again")
            # a plain ndarray view: slicing an np.memmap subclass costs microseconds per slice
            self._tokens.append(np.memmap(self.path / sh["tokens_path"], dtype=dtype, mode="r").view(np.ndarray)
                                if sh["tokens"] else np.zeros(0, dtype))
            lengths.append(np.diff(offsets))
            local.append(offsets[:-1])
            shard_of.append(np.full(len(offsets) - 1, s, np.int64))
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
        self.doc_lengths, self._doc_shard, self._doc_local = cat(lengths), cat(shard_of), cat(local)
        self.doc_starts = np.concatenate([[0], np.cumsum(self.doc_lengths)[:-1]]).astype(np.int64)
        self.n_tokens, self.n_docs = int(self.doc_lengths.sum()), len(self.doc_lengths)

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @functools.cached_property
    def uids(self) -> list[str]:
        """Every document's shuffle key: DOMAIN/ID with an id column (DOMAIN/ only with a domain), else the index."""
        m = self.manifest
        if not m.get("id_column"):
            return [str(j) for j in range(self.n_docs)]
        uids: list[str] = []
        for sh in m["shards"]:
            if m.get("domain_column"):
                dom = load_npy(self.path / sh["domain_path"])
                uids += [f"{sh['domains'][int(d)]}/{i}" for d, i in zip(dom, sh["ids"], strict=True)]
            else:
                uids += list(sh["ids"])
        return uids

    def doc_domains(self) -> tuple[list[str], np.ndarray]:
        """(domain names, each document's index into them) from the shards' domain column; no domain
        column: ([], an empty array)."""
        m = self.manifest
        if not m.get("domain_column"):
            return [], np.zeros(0, np.int64)
        names, parts = domain_names(m), []
        for sh in m["shards"]:
            local = np.asarray(load_npy(self.path / sh["domain_path"]), np.int64)
            remap = np.array([names.index(n) for n in sh["domains"]], np.int64)
            parts.append(remap[local] if len(local) else local)
        return names, (np.concatenate(parts) if parts else np.zeros(0, np.int64))

    def piece(self, j: int, start: int, n: int) -> np.ndarray:
        """Tokens [start, start+n) of document j: one slice of one memory-mapped shard."""
        lo = self._doc_local[j] + start
        return self._tokens[self._doc_shard[j]][lo:lo + n]

    def doc(self, j: int) -> np.ndarray:
        return np.asarray(self.piece(j, 0, int(self.doc_lengths[j])), np.int64)


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class DocStream:
    """One token stream over `docs` (indices into the corpus; None: all of them): per epoch the
    documents in sha256(seed:epoch:uid) order, concatenated."""

    def __init__(self, corpus: PreparedCorpus, seed: int, docs: np.ndarray | None = None):
        self.corpus, self.seed, self.docs = corpus, seed, docs
        self.uids = corpus.uids if docs is None else [corpus.uids[j] for j in docs.tolist()]
        self.n_docs = corpus.n_docs if docs is None else len(docs)
        self.n_tokens = corpus.n_tokens if docs is None else int(corpus.doc_lengths[docs].sum())
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        """(perm, cum): the corpus indices of the documents in epoch e's order, and their token offsets."""
        if e not in self._epochs:
            perm = shuffle_order(self.uids, self.seed, e)
            perm = perm if self.docs is None else self.docs[perm]
            cum = np.concatenate([[0], np.cumsum(self.corpus.doc_lengths[perm])]).astype(np.int64)
            if len(self._epochs) >= 2:  # a batch spans at most two epochs of the corpus stream
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[e] = (perm, cum)
        return self._epochs[e]

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, docs): stream positions [lo, hi) and a document key per token (epoch * n_docs +
        position of the document in the epoch's order). The document pieces the range covers are found
        with array arithmetic, then copied as whole slices of the memory-mapped shards."""
        T, n_docs, c = self.n_tokens, self.n_docs, self.corpus
        tokens = np.empty(hi - lo, np.int64)
        pieces, keys, sizes = [], [], []
        for e in range(lo // T, (hi - 1) // T + 1):
            perm, cum = self.epoch(e)
            a, b = max(lo - e * T, 0), min(hi - e * T, T)  # this epoch's part, in epoch coordinates
            k_P = np.arange(np.searchsorted(cum, a, side="right") - 1, np.searchsorted(cum, b - 1, side="right"))
            lo_P, hi_P = np.maximum(cum[k_P], a), np.minimum(cum[k_P + 1], b)
            doc_P = perm[k_P]
            src_P = c._doc_local[doc_P] + lo_P - cum[k_P]
            n_P = hi_P - lo_P
            pieces += [c._tokens[s][o:o + n] for s, o, n in zip(c._doc_shard[doc_P].tolist(), src_P.tolist(),
                                                                  n_P.tolist(), strict=True)]
            keys.append(e * n_docs + k_P)
            sizes.append(n_P)
        np.concatenate(pieces, out=tokens)  # one copy, widened on the way
        return tokens, np.repeat(np.concatenate(keys), np.concatenate(sizes))


def _windows(tokens: np.ndarray, docs: np.ndarray, B: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    # row r is stream[r*S : r*S + S + 1]: overlapping views, no copy
    view = (lambda x: np.lib.stride_tricks.as_strided(x, (B, S + 1), (S * x.itemsize, x.itemsize), writeable=False))
    return view(tokens), view(docs)


def simulated_length(n_sequences: int, experiment_tokens: int, target_tokens: int) -> int:
    """A component's sequences under simulated epoching: levanter LmDataConfig.train_sets,
    `int(true_length * (experiment_budget / target_budget))` (float ratio, then truncated)."""
    return int(n_sequences * (experiment_tokens / target_tokens))


def _read_rows(stream: DocStream | IndexedStream, idx_R: np.ndarray, S: int,
               length: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Windows of the component's sequences `idx_R` (increasing), each mod `length` when the component
    is cut (simulated epoching): one read per run of consecutive sequences (an indexed stream: per row)."""
    idx_R = idx_R % length if length else idx_R
    if isinstance(stream, IndexedStream):
        return stream.rows(idx_R, S)
    tokens_RW, docs_RW = np.empty((len(idx_R), S + 1), np.int64), np.empty((len(idx_R), S + 1), np.int64)
    cuts = [0, *(np.flatnonzero(np.diff(idx_R) != 1) + 1).tolist(), len(idx_R)]
    for a, b in zip(cuts[:-1], cuts[1:], strict=False):
        lo = int(idx_R[a]) * S
        tokens_RW[a:b], docs_RW[a:b] = _windows(*stream.read(lo, lo + (b - a) * S + 1), b - a, S)
    return tokens_RW, docs_RW


class ShardedBatches:
    """This rank's packed batches of a prepared corpus; iterate, or index by step (random access).

    rank/world default to torch.distributed's (0/1 when not initialised); the batch a rank reads at
    a step is (global_batch / world) sequences. With `mixture` (DataConfig.mixture phases) and the
    run's `total_steps`, a step's sequences come from per-domain streams (marin/data/mixture.py)."""

    def __init__(self, corpus: PreparedCorpus | IndexedCorpus | str | Path, seq_len: int, global_batch: int, seed: int,
                 rank: int | None = None, world: int | None = None, mixture: tuple = (),
                 total_steps: int | None = None, mixture_block: int = 0, simulated_target: int = 0):
        self.corpus = corpus if isinstance(corpus, (PreparedCorpus, IndexedCorpus)) else PreparedCorpus(corpus)
        # DataConfig.shuffle: "indexed" reads the corpus's pre-built index (marin/data/index.py)
        self.indexed = isinstance(self.corpus, IndexedCorpus)
        r, w = _dist_rank_world()
        self.rank, self.world = (r if rank is None else rank), (w if world is None else world)
        check_positive_ints(seq_len=seq_len, global_batch=global_batch, world=self.world)
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank={self.rank} must be in 0..{self.world - 1}")
        if global_batch % self.world:
            raise ValueError(f"global_batch={global_batch} must be a multiple of the data-parallel world size "
                             f"{self.world}")
        self.seq_len, self.global_batch, self.seed = int(seq_len), int(global_batch), int(seed)
        self.batch_size = self.global_batch // self.world
        self.tokens_per_epoch = self.corpus.n_tokens
        need = self.global_batch * self.seq_len + 1
        if self.tokens_per_epoch < need:
            raise ValueError(f"prepared corpus {self.corpus.path} has {self.tokens_per_epoch} tokens, "
                             f"fewer than one batch needs: global_batch {global_batch} x seq_len {seq_len} + 1 = "
                             f"{need}")
        self.step = 0
        self._all = IndexedStream(self.corpus, self.seed) if self.indexed else DocStream(self.corpus, self.seed)
        self.mixture, self.total_steps = tuple(mixture), total_steps
        self.plan: MixturePlan | None = None
        if self.mixture:
            if total_steps is None:
                raise ValueError("ShardedBatches: a mixture needs the run's total_steps "
                                 "(its phases are fractions of them)")
            names = self.domain_names()
            self.plan = MixturePlan(self.mixture, names, total_steps, self.global_batch, self.seed,
                                    where=f"DataConfig.corpus ({self.corpus.path})", block=mixture_block)
            used = self.plan.w_PD.max(axis=0) > 0
            dom_N = None if self.indexed else self.corpus.doc_domains()[1]
            self.domain_streams = [None if not used[d] else IndexedStream(self.corpus, self.seed, d) if self.indexed
                                   else DocStream(self.corpus, self.seed, np.flatnonzero(dom_N == d))
                                   for d in range(len(names))]
            for d, st in enumerate(self.domain_streams):
                if st is not None and st.n_tokens == 0:
                    raise ValueError(f"DataConfig.mixture: domain {names[d]!r} of {self.corpus.path} has no tokens; "
                                     "allowed values: domains with tokens (or weight 0)")
        # simulated epoching: each component's sequences L (None: uncut), the corpus stream's or each domain's
        self.simulated_target = int(simulated_target)
        self.length: int | None = None
        self.domain_lengths: list[int | None] = []
        if self.simulated_target:
            if total_steps is None:
                raise ValueError("ShardedBatches: simulated epoching needs the run's total_steps "
                                 "(its experiment budget)")
            run_tokens = int(total_steps) * self.tokens_per_step
            if run_tokens > self.simulated_target:
                raise ValueError(f"DataConfig.simulated_epoching_target={self.simulated_target} is below this run's "
                                 f"{run_tokens} tokens ({total_steps} steps x {self.tokens_per_step}); "
                                 f"allowed values: 0 (off) or at least the run's tokens")
            comps = ([(f"domain {n!r}", st)
                      for n, st in zip(self.domain_names(), self.domain_streams, strict=True)]
                     if self.plan is not None else [("the corpus", self._all)])
            lengths = [None if st is None else simulated_length(st.n_tokens // self.seq_len, run_tokens,
                                                                  self.simulated_target) for _, st in comps]
            for (what, st), n in zip(comps, lengths, strict=True):
                if n == 0:
                    raise ValueError(f"DataConfig.simulated_epoching_target={self.simulated_target}: {what} of "
                                     f"{self.corpus.path} ({st.n_tokens // self.seq_len} sequences of {self.seq_len}) "
                                     f"is cut to 0 sequences at {run_tokens} run tokens; allowed values: 0 (off) or at "
                                     f"most {st.n_tokens // self.seq_len * run_tokens} for this corpus and run")
            if self.plan is None:
                self.length = lengths[0]
            else:
                self.domain_lengths = lengths

    def domain_names(self) -> list[str]:
        """The corpus's domains in the order mixture slots index them (`PreparedCorpus.doc_domains`)."""
        return list(self.corpus.domains) if self.indexed else self.corpus.doc_domains()[0]

    @property
    def tokens_per_step(self) -> int:
        """Tokens one step consumes over all ranks."""
        return self.global_batch * self.seq_len

    def epoch_of(self, step: int) -> float:
        return step * self.tokens_per_step / self.tokens_per_epoch

    def order(self, epoch: int) -> np.ndarray:
        """The document order of `epoch` of the corpus stream (a permutation of 0..n_docs-1)."""
        return self._documents().epoch(epoch)[0]

    def _documents(self) -> DocStream:
        if self.indexed:
            raise ValueError("an indexed loader (DataConfig.shuffle='indexed') has no per-epoch document order; "
                             "its sequences are Feistel-permuted windows (marin/data/index.py)")
        return self._all

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        return self._documents().epoch(e)

    def sequence_indices(self, step: int) -> np.ndarray:
        """Global indices of the sequences this rank reads at `step` (corpus stream; no mixture)."""
        return step * self.global_batch + self.rank * self.batch_size + np.arange(self.batch_size, dtype=np.int64)

    def row_domains(self, step: int) -> np.ndarray:
        """This rank's rows' domain at `step` (index into `corpus.doc_domains()[0]`); mixture only."""
        dom_G, _ = self.plan.slots(step)
        return dom_G[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def windows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens_BW, docs_BW): the S+1-token stream windows of this rank's sequences and their
        document keys (see `DocStream.read`). Without a mixture they are consecutive in the corpus
        stream, so one contiguous range; with one, each domain's rows are consecutive in its stream."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        B, S = self.batch_size, self.seq_len
        if self.plan is None:
            if self.length is None and not self.indexed:
                lo = int(self.sequence_indices(step)[0]) * S
                return _windows(*self._all.read(lo, lo + B * S + 1), B, S)
            return _read_rows(self._all, self.sequence_indices(step), S, self.length)
        dom_G, idx_G = self.plan.slots(step)
        mine = slice(self.rank * B, (self.rank + 1) * B)
        dom_B, idx_B = dom_G[mine], idx_G[mine]
        tokens_BW, docs_BW = np.empty((B, S + 1), np.int64), np.empty((B, S + 1), np.int64)
        for d in np.unique(dom_B).tolist():
            rows = np.flatnonzero(dom_B == d)  # this domain's rows: consecutive sequences of its stream
            length = self.domain_lengths[d] if self.domain_lengths else None
            tokens_BW[rows], docs_BW[rows] = _read_rows(self.domain_streams[d], idx_B[rows], S, length)
        return tokens_BW, docs_BW

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens_BS, targets_BS, doc_ids_BS) LongTensors of this rank at `step`; targets -100 across documents."""
        return pack_stream(*self.windows(step))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict:
        """What a checkpoint stores: the next step and what makes the stream this stream."""
        out = {"step": self.step, "seed": self.seed, "seq_len": self.seq_len, "global_batch": self.global_batch,
               "corpus": self.corpus.fingerprint}
        if self.indexed:  # absent for the documents shuffle: its checkpoints keep their state
            out["shuffle"] = "indexed"
        if self.plan is not None:  # absent without one: checkpoints of single-stream runs keep their state
            out["mixture"] = [[p.start_frac, [list(w) for w in p.weights]] for p in self.mixture]
            out["total_steps"] = self.total_steps
            out["phase_steps"] = self.plan.start_P.tolist()
        if self.simulated_target:  # absent when off: checkpoints of uncut runs keep their state
            out["simulated_target"] = self.simulated_target
            out["simulated_lengths"] = [self.length] if self.plan is None else list(self.domain_lengths)
        return out

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        keys = ("seed", "seq_len", "global_batch", "corpus", "shuffle", "mixture", "total_steps", "phase_steps",
                "simulated_target", "simulated_lengths")
        for k in keys:
            if state.get(k) != mine.get(k):
                raise ValueError(f"loader state {k}={state.get(k)!r} does not match this loader's {mine.get(k)!r}: "
                                 "resuming would read a different stream")
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"loader state step={step!r} must be an integer >= 0")
        self.step = step
