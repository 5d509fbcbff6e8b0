"""Tokenizers: UTF-8 bytes (vocabulary 256) or a byte-level BPE (Sennrich et al. 2016, arXiv
1508.07909; GPT-2's byte-level variant) trained locally with HF `tokenizers` on the corpus' train split.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from marin.data.corpus import _publish_file, _sha256_file

BPE_SAMPLE_BYTES_PER_DOMAIN = 1_000_000  # BPE trains on this much train text of each domain


class Tokenizer:
    """encode/decode between text and token ids; ``fingerprint`` identifies the vocabulary."""

    name: str
    vocab_size: int
    fingerprint: str

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def encode_docs(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(self.encode(t), dtype=np.int32) for t in texts]


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes, vocabulary 256: needs no training and no file."""

    name = "byte"
    vocab_size = 256
    fingerprint = "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def encode_docs(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]


class BPETokenizer(Tokenizer):
    """A byte-level BPE (HF `tokenizers`), trained locally; every string roundtrips exactly."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as _HFTokenizer

        self.path = Path(path)
        self._tok = _HFTokenizer.from_file(str(self.path))
        self.vocab_size = self._tok.get_vocab_size()
        self.name = f"bpe-{self.vocab_size}"
        self.fingerprint = "bpe-" + _sha256_file(self.path)[:16]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    def encode_docs(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(list(texts))]


def train_bpe(texts: Iterable[str], vocab_size: int, path: str | Path) -> BPETokenizer:
    """Train a byte-level BPE on `texts` and publish it at `path` (first writer wins)."""
    from tokenizers import Tokenizer as _HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    _check_bpe_vocab(vocab_size)
    path = Path(path)
    if not path.is_file():
        tok = _HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
        tok.train_from_iterator(texts, trainer=trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        os.close(fd)
        tok.save(tmp)
        _publish_file(Path(tmp), path)
    return BPETokenizer(path)


def _check_bpe_vocab(v: int) -> None:
    if not isinstance(v, int) or not 257 <= v <= 1 << 20:
        raise ValueError(f"DataConfig.bpe_vocab={v!r} must be an integer in 257..{1 << 20} "
                         "(256 byte symbols plus at least one merge)")


def _bpe_sample(train_texts: dict[str, list[str]]) -> Iterator[str]:
    for domain in sorted(train_texts):
        used = 0
        for t in train_texts[domain]:
            if used >= BPE_SAMPLE_BYTES_PER_DOMAIN:
                break
            used += len(t)
            yield t

