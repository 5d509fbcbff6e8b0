"""Where a run's tokens come from: the one place the trainer chooses its data (docs/architecture.md, "Data").

- `DataConfig.corpus` a prepared directory (has manifest.json, `marin-ablate data prepare`): train
  batches from `marin.corpus.loader.ShardedBatches`, each data-parallel rank reading its own slice,
  the tokenizer the corpus was prepared with; evaluation needs `DataConfig.eval_dir`.
- otherwise the embedded corpus (or a local text corpus / Paloma copy) through marin.data: one
  global batch per step (`PackedBatches`), each rank keeping its rows.
- `DataConfig.eval_dir` a Paloma-layout directory: every (or each of `eval_domains`) domain's val
  split is the evaluation set, tokenized with the training tokenizer; otherwise the corpus's
  held-out domains.

Both loaders are random access by step and consume B*S tokens of one stream per step, so a resume
or a context stage that keeps B*S continues the same stream; the sharded loader's state (step and
what makes the stream this stream: seed, shape, corpus fingerprint) is kept in the checkpoint and
checked on resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marin.config import DataConfig, RunSpec

_CACHE: dict[tuple, Any] = {}  # per process: a sweep of short runs reuses corpora and loaders


def _cached(key: tuple, build):
    if key not in _CACHE:
        if len(_CACHE) > 32:
            _CACHE.clear()
        _CACHE[key] = build()
    return _CACHE[key]


def is_prepared(corpus: str) -> bool:
    return corpus not in ("embedded", "paloma") and (Path(corpus).expanduser() / "manifest.json").is_file()


def validate_data(data: DataConfig) -> None:
    """Paths of the data config exist (before any work); errors name the field."""
    if data.corpus not in ("embedded", "paloma") and not Path(data.corpus).expanduser().exists():
        raise ValueError(f"DataConfig.corpus={data.corpus!r}: no such file or directory; allowed values: "
                         "'embedded', 'paloma', a prepared corpus directory (marin-ablate data prepare), or an "
                         "existing local directory/file of text")
    if data.eval_dir and not Path(data.eval_dir).expanduser().is_dir():
        raise ValueError(f"DataConfig.eval_dir={data.eval_dir!r}: no such directory; allowed values: '' (the "
                         "corpus's held-out split) or a Paloma-layout directory (DOMAIN/val/*.jsonl[.gz])")
    if is_prepared(data.corpus) and not data.eval_dir:
        raise ValueError(f"DataConfig.eval_dir is empty but DataConfig.corpus={data.corpus!r} is a prepared corpus, "
                         "which has no held-out split; allowed values: a Paloma-layout directory "
                         "(DOMAIN/val/*.jsonl[.gz])")


@dataclass
class DataSource:
    """A run's train loaders (one per context-stage length), eval corpus and domains."""

    train: dict[int, Any]  # seq_len -> loader with .batch(step) -> (tokens, targets, doc_ids)
    rank_rows: bool  # True: .batch() gives this rank's rows; False: the global batch (the caller slices)
    eval_corpus: Any  # marin.data.Corpus whose held-out splits are the eval domains
    domains: list[str]
    vocab_size: int
    provenance: dict = field(default_factory=dict)  # what the summary records about the data

    def state(self, step: int, seq_len: int) -> dict | None:
        """The loader state a checkpoint keeps (sharded loader only)."""
        if not self.rank_rows:
            return None
        loader = self.train[seq_len]
        loader.step = step
        return loader.state_dict()

    def restore(self, state: dict | None, step: int, seq_len: int) -> None:
        """Check a checkpoint's loader state against this run's loader (same corpus, seed and shape)."""
        if not self.rank_rows:
            return
        if state is None:
            raise ValueError("the checkpoint has no loader state but this run reads a prepared corpus: it was "
                             "written by a run on another corpus")
        loader = self.train[seq_len]
        loader.load_state_dict(state)
        if loader.step != step:
            raise ValueError(f"checkpoint loader step {loader.step} differs from its loop step {step}")


def _eval_corpus(data: DataConfig, tokenizer) -> Any:
    from marin.corpus.eval import eval_domains, load_eval_corpus

    found = eval_domains(data.eval_dir)
    bad = [d for d in data.eval_domains if d not in found]
    if bad:
        raise ValueError(f"DataConfig.eval_domains: {bad} are not domains of DataConfig.eval_dir={data.eval_dir!r}; "
                         f"allowed values: {', '.join(found)}")
    key = ("eval", str(Path(data.eval_dir).expanduser().resolve()), tokenizer.fingerprint, tuple(data.eval_domains))
    return _cached(key, lambda: load_eval_corpus(data.eval_dir, tokenizer, domains=tuple(data.eval_domains)))


def build_data_source(spec: RunSpec, stages: list, seed: int, rank: int = 0, world: int = 1) -> DataSource:
    """The data of `spec` for this rank: stages are marin.train.stages.Stage (seq_len, batch_size)."""
    from marin import data as mdata

    data = spec.data
    validate_data(data)
    if is_prepared(data.corpus):
        from marin.corpus.eval import tokenizer_of
        from marin.corpus.loader import PreparedCorpus, ShardedBatches

        root = str(Path(data.corpus).expanduser().resolve())
        corpus = _cached(("prepared", root, (Path(root) / "manifest.json").stat().st_mtime_ns),
                         lambda: PreparedCorpus(root))
        tokenizer = tokenizer_of(root)
        train = {s.seq_len: ShardedBatches(corpus, s.seq_len, s.batch_size, seed, rank=rank, world=world)
                 for s in stages}
        ev = _eval_corpus(data, tokenizer)
        vocab, rank_rows = corpus.vocab_size, True
        prov = {"corpus": root, "corpus_tokens": corpus.n_tokens, "corpus_fingerprint": corpus.fingerprint}
    else:
        corpus = mdata.load_corpus(data)
        tokenizer = corpus.tokenizer
        train = {s.seq_len: _packer(corpus, s.seq_len, s.batch_size, seed) for s in stages}
        ev = _eval_corpus(data, tokenizer) if data.eval_dir else corpus
        vocab, rank_rows = tokenizer.vocab_size, False
        prov = {"corpus": data.corpus}
    if vocab > spec.model.vocab_size:
        raise ValueError(f"ModelConfig.vocab_size={spec.model.vocab_size} is smaller than the tokenizer's vocabulary "
                         f"({vocab}, DataConfig.corpus={data.corpus!r}, DataConfig.tokenizer={data.tokenizer!r}); "
                         f"allowed values: >= {vocab}")
    domains = list(data.eval_domains) or list(ev.domains)
    unknown = [d for d in domains if d not in ev.domains]
    if unknown:
        raise ValueError(f"DataConfig.eval_domains: unknown domains {unknown}; allowed values: {', '.join(ev.domains)}")
    if data.eval_dir:
        prov["eval_dir"] = str(Path(data.eval_dir).expanduser().resolve())
    prov["eval_domains"] = domains
    return DataSource(train, rank_rows, ev, domains, vocab, prov)


def _packer(corpus, seq_len: int, batch: int, seed: int):
    """PackedBatches are pure functions of their arguments; reuse them across runs of one process
    (a sweep of tiny runs spends most of a short run building the epoch order otherwise)."""
    from marin.data import PackedBatches

    key = ("packed", id(corpus), seq_len, batch, seed)
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not corpus:  # id() of a collected corpus can be reused
        if len(_CACHE) > 32:
            _CACHE.clear()
        _CACHE[key] = hit = (corpus, PackedBatches(corpus, "train", seq_len, batch, seed))
    return hit[1]


def global_tokens(batch: tuple[torch.Tensor, ...], rank_rows: bool, world: int) -> int:
    """Tokens of the global batch, from this rank's (rank_rows) or the global batch."""
    return batch[0].numel() * (world if rank_rows else 1)
