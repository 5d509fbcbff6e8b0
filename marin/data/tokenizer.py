"""Tokenizers: UTF-8 bytes (vocabulary 256) or a byte-level BPE (Sennrich et al. 2016, arXiv
1508.07909; GPT-2's byte-level variant) trained locally with HF `tokenizers` on the corpus' train split.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from marin_ablate.marin.data.corpus import dist_file, publish_file, sha256_file

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
        self.path = Path(path)
        self._tok = _hf_tokenizer(self.path)
        self.vocab_size = self._tok.get_vocab_size()
        self.name = f"bpe-{self.vocab_size}"
        self.fingerprint = "bpe-" + sha256_file(self.path)[:16]

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

    check_bpe_vocab(vocab_size)
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
        publish_file(Path(tmp), path)
    return BPETokenizer(path)


def check_bpe_vocab(v: int) -> None:
    if not isinstance(v, int) or not 257 <= v <= 1 << 20:
        raise ValueError(f"DataConfig.bpe_vocab={v!r} must be an integer in 257..{1 << 20} "
                         "(256 byte symbols plus at least one merge)")


def bpe_sample(train_texts: dict[str, list[str]]) -> Iterator[str]:
    for domain in sorted(train_texts):
        used = 0
        for t in train_texts[domain]:
            if used >= BPE_SAMPLE_BYTES_PER_DOMAIN:
                break
            used += len(t)
            yield t


_TOKENIZER_SPECS = "'byte', a tokenizer.json path, 'pkg:DISTRIBUTION/PATH' (shipped by an installed package)"


def _hf_tokenizer(path: Path):
    from tokenizers import Tokenizer as _HFTokenizer

    try:
        return _HFTokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the Rust loader raises a bare Exception for any bad file
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ValueError(f"tokenizer file {path} is not an HF tokenizers file ({msg})") from None


def tokenizer_path(spec: str | Path) -> Path | None:
    """The tokenizer.json a spec names (None for 'byte'): a path, or 'pkg:DIST/PATH' inside an
    installed distribution (found through importlib.metadata, so it works offline)."""
    spec = str(spec)
    if spec == "byte":
        return None
    if spec.startswith("pkg:"):
        dist, _, inner = spec[4:].partition("/")
        p = dist_file(dist, inner) if dist and inner else None
        if p is None:
            raise ValueError(f"tokenizer={spec!r}: no file {inner!r} in an installed distribution {dist!r}; "
                             f"allowed values: {_TOKENIZER_SPECS}")
        return p
    p = Path(spec).expanduser()
    if not p.is_file():
        raise ValueError(f"tokenizer={spec!r} is neither a tokenizer.json file nor a known tokenizer; "
                         f"allowed values: {_TOKENIZER_SPECS}")
    return p


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """The one tokenizer loader: 'byte', a tokenizer.json path (any HF `tokenizers` file: the project's
    BPE, Llama 3's ...) or 'pkg:DIST/PATH'."""
    p = tokenizer_path(spec)
    return ByteTokenizer() if p is None else BPETokenizer(p)


def tokenizer_info(spec: str) -> dict:
    """What a prepared corpus records about its tokenizer (torch-free)."""
    p = tokenizer_path(spec)
    return {"kind": "byte", "path": None, "sha256": "byte", "vocab_size": 256} if p is None else {
        "kind": "tokenizers", "path": str(p.resolve()), "sha256": sha256_file(p),
        "vocab_size": _hf_tokenizer(p).get_vocab_size()}
