"""Where a run's tokens come from: the one place the trainer chooses its data (docs/architecture.md §3 "Data").

Train batches always come from `marin.data.shards.ShardedBatches`, each data-parallel rank reading its own
slice of a prepared corpus: `DataConfig.corpus` itself when it is one (its own tokenizer; evaluation needs
`DataConfig.eval_dir`), else the train split marin.data prepares on first use (`marin.data.prepared_train`).
Evaluation: the domains of `DataConfig.eval_dir` (a Paloma-layout directory, tokenized with the training
tokenizer), else the corpus's held-out domains. The loader's state (step, seed, shape, corpus fingerprint,
which covers the shards' sha256) is kept in the checkpoint and checked on resume.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marin_ablate.marin import data as mdata
from marin_ablate.marin.config import DataConfig, RunSpec
from marin_ablate.marin.data.corpus import EMBEDDED_SOURCES
from marin_ablate.marin.data.eval import eval_domains, tokenizer_of
from marin_ablate.marin.data.index import IndexedCorpus
from marin_ablate.marin.data.loading import load_eval_corpus
from marin_ablate.marin.data.manifest import read_manifest, setting_path
from marin_ablate.marin.data.mixture import check_mixture_domains
from marin_ablate.marin.data.shards import PreparedCorpus, ShardedBatches, verify_once
from marin_ablate.marin.flops import forward_flops_breakdown

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
    for name in ("corpus", "eval_dir"):  # a path the system refuses (too long, no permission) is a setting
        if getattr(data, name) not in ("", "embedded", "paloma"):
            setting_path(getattr(data, name), f"DataConfig.{name}")
    if data.corpus not in ("embedded", "paloma") and not Path(data.corpus).expanduser().exists():
        raise ValueError(f"DataConfig.corpus={data.corpus!r}: no such file or directory; allowed values: "
                         "'embedded', 'paloma', a prepared corpus directory (marin-ablate data prepare), or an "
                         "existing local directory/file of text")
    if data.eval_dir and not Path(data.eval_dir).expanduser().is_dir():
        raise ValueError(f"DataConfig.eval_dir={data.eval_dir!r}: no such directory; allowed values: '' (the "
                         "corpus's held-out split) or a Paloma-layout directory (DOMAIN/val/*.jsonl[.gz])")
    if data.eval_dir and data.eval_domains:  # the domains of the eval_dir given, never of the training corpus
        found = eval_domains(data.eval_dir)
        bad = [d for d in data.eval_domains if d not in found]
        if bad:
            raise ValueError(f"DataConfig.eval_domains: {bad} are not domains of DataConfig.eval_dir="
                             f"{data.eval_dir!r}; allowed values: {', '.join(found)}")
    if data.corpus == "embedded" and not data.eval_dir and data.eval_domains:  # its domains are known statically
        bad = [d for d in data.eval_domains if d not in EMBEDDED_SOURCES]
        if bad:
            raise ValueError(f"DataConfig.eval_domains: {bad} are not domains of the embedded corpus; allowed values: "
                             f"{', '.join(EMBEDDED_SOURCES)}")
    check_mixture_domains(data)
    if is_prepared(data.corpus) and not data.eval_dir:
        raise ValueError(f"DataConfig.eval_dir is empty but DataConfig.corpus={data.corpus!r} is a prepared corpus, "
                         "which has no held-out split; allowed values: a Paloma-layout directory "
                         "(DOMAIN/val/*.jsonl[.gz])")


#: Every tokenizer here is byte-level: 256 byte symbols at least (a BPE adds its merges).
BYTE_SYMBOLS = 256


def check_vocab(spec: RunSpec) -> None:
    """ModelConfig.vocab_size holds the tokenizer's vocabulary, checked before any work: a prepared corpus's
    from its manifest, any other against the 256 byte symbols every tokenizer has (`build_data_source` checks
    a trained BPE's exact size once it exists)."""
    vocab, where = BYTE_SYMBOLS, f"DataConfig.tokenizer={spec.data.tokenizer!r}"
    if is_prepared(spec.data.corpus):
        vocab = int(read_manifest(spec.data.corpus)["tokenizer"].get("vocab_size") or BYTE_SYMBOLS)
        where = f"the tokenizer of DataConfig.corpus={spec.data.corpus!r}"
    if spec.model.vocab_size < vocab:
        raise ValueError(f"ModelConfig.vocab_size={spec.model.vocab_size} is smaller than the tokenizer's vocabulary "
                         f"({vocab}, {where}); allowed values: >= {vocab}")


@dataclass
class DataSource:
    """A run's train loaders (one per context-stage length), eval corpus and domains."""

    train: dict[int, Any]  # seq_len -> this rank's ShardedBatches: .batch(step) -> (tokens, targets, doc_ids)
    eval_corpus: Any  # marin.data.Corpus whose held-out splits are the eval domains
    domains: list[str]
    vocab_size: int
    provenance: dict = field(default_factory=dict)  # what the summary records about the data
    # a user-prepared corpus requires the loader state in a checkpoint; a derived one (embedded ...)
    # accepts checkpoints written before its train split was read through shards (same stream)
    state_required: bool = True
    rank_rows = True  # .batch() gives this rank's rows: every loader is the sharded one (planning/dryrun.py reads it)

    def state(self, step: int, seq_len: int) -> dict | None:
        """The loader state a checkpoint keeps."""
        loader = self.train[seq_len]
        loader.step = step
        return loader.state_dict()

    def restore(self, state: dict | None, step: int, seq_len: int) -> None:
        """Check a checkpoint's loader state against this run's loader (same corpus, seed and shape)."""
        if state is None and not self.state_required:
            return
        if state is None:
            raise ValueError("the checkpoint has no loader state but this run reads a prepared corpus: it was "
                             "written by a run on another corpus")
        loader = self.train[seq_len]
        loader.load_state_dict(state)
        if loader.step != step:
            raise ValueError(f"checkpoint loader step {loader.step} differs from its loop step {step}")


def _indexed(root: str, make, verify) -> Any:
    c = make(root)
    verify(c.path, c.manifest, c.fingerprint)
    return c


def _eval_corpus(data: DataConfig, tokenizer) -> Any:
    """The eval_dir's domains (checked against DataConfig.eval_domains by `validate_data`), tokenized."""
    key = ("eval", str(Path(data.eval_dir).expanduser().resolve()), tokenizer.fingerprint, tuple(data.eval_domains))
    return _cached(key, lambda: load_eval_corpus(data.eval_dir, tokenizer, domains=tuple(data.eval_domains)))


def build_data_source(spec: RunSpec, stages: list, seed: int, rank: int = 0, world: int = 1) -> DataSource:
    """The data of `spec` for this rank: stages are marin.train.stages.Stage (seq_len, batch_size)."""
    data = spec.data
    validate_data(data)
    prepared = is_prepared(data.corpus)
    # with an eval_dir the eval domains are that folder's: the training corpus is read without them
    train_data = dataclasses.replace(data, eval_domains=()) if data.eval_dir else data
    root = str(Path(data.corpus if prepared else mdata.prepared_train(train_data)).expanduser().resolve())
    stamp = (Path(root) / "manifest.json").stat().st_mtime_ns
    if data.shuffle == "indexed":  # the pre-built index: nothing per document in this rank's memory
        corpus = _cached(("indexed", root, stamp), lambda: _indexed(root, IndexedCorpus, verify_once))
    else:
        corpus = _cached(("prepared", root, stamp), lambda: PreparedCorpus(root))
    steps = spec.train.effective().steps  # a mixture's phases are fractions of the steps trained
    train = {s.seq_len: ShardedBatches(corpus, s.seq_len, s.batch_size, seed, rank=rank, world=world,
                                       mixture=data.mixture, total_steps=steps, mixture_block=data.mixture_block,
                                       simulated_target=data.simulated_epoching_target)
             for s in stages}
    prov = {"corpus": root if prepared else data.corpus, "corpus_tokens": corpus.n_tokens,
            "corpus_fingerprint": corpus.fingerprint}
    if data.mixture:
        loader = next(iter(train.values()))
        prov["mixture_phase_steps"] = loader.plan.start_P.tolist()
    if data.simulated_epoching_target:  # each component's sequences after the cut, per stage length
        prov["simulated_epoch_sequences"] = {str(k): (v.domain_lengths or [v.length]) for k, v in train.items()}
    if prepared:
        tokenizer = tokenizer_of(root)
        ev = _eval_corpus(data, tokenizer)
    else:
        ev = mdata.load_corpus(train_data)  # its held-out split, unless eval_dir names another
        tokenizer = ev.tokenizer
        ev = _eval_corpus(data, tokenizer) if data.eval_dir else ev
    vocab = corpus.vocab_size
    if vocab > spec.model.vocab_size:
        raise ValueError(f"ModelConfig.vocab_size={spec.model.vocab_size} is smaller than the tokenizer's vocabulary "
                         f"({vocab}, DataConfig.corpus={data.corpus!r}, DataConfig.tokenizer={data.tokenizer!r}); "
                         f"allowed values: >= {vocab}")
    warn = vocab_warning(spec, vocab)
    if warn:
        warnings.warn(warn, stacklevel=2)
    domains = list(data.eval_domains) or list(ev.domains)  # checked against the corpus's by validate_data/load_corpus
    if data.eval_dir:
        prov["eval_dir"] = str(Path(data.eval_dir).expanduser().resolve())
    prov["eval_domains"] = domains
    return DataSource(train, ev, domains, vocab, prov, state_required=prepared)


#: the output layer may cost this many times the rest of the model per token before a run warns
VOCAB_COST_RATIO = 4.0


def vocab_warning(spec: RunSpec, vocab: int) -> str | None:
    """A warning when the vocabulary is far too large for the rung's width: the output layer
    (2·d·V FLOPs per token) would cost more than VOCAB_COST_RATIO times everything else."""
    terms = forward_flops_breakdown(dataclasses.replace(spec.model, vocab_size=vocab), spec.recipe)
    head = terms.pop("lm_head")
    rest = sum(terms.values())
    if head <= VOCAB_COST_RATIO * rest:
        return None
    return (f"vocabulary {vocab:,} is far too large for d_model={spec.model.d_model}, n_layers={spec.model.n_layers}: "
            f"the output layer costs {head / rest:.0f}x the rest of the model per token, so it takes most of "
            f"every step; use a smaller vocabulary (data prepare --tokenizer bpe:VOCAB, e.g. "
            f"bpe:{_suggest_vocab(spec, rest)}) or a wider rung")


def _suggest_vocab(spec: RunSpec, rest: float) -> int:
    v = int(rest / (2 * spec.model.d_model))  # the output layer costs about as much as the rest
    return max(512, 1 << max(9, v.bit_length() - 1))


def global_tokens(batch: tuple[torch.Tensor, ...], world: int) -> int:
    """Tokens of the global batch, from this rank's rows of it."""
    return batch[0].numel() * world
