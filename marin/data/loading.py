"""Loading a corpus: the embedded one, a local Paloma copy, or local files (jsonl/json/parquet/txt),
read through HF ``datasets`` (offline) and tokenized into per-domain token documents, cached per
process and, for BPE, on disk beside the tokenizer.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from marin_ablate.marin.config import DataConfig
from marin_ablate.marin.data.corpus import (
    HELDOUT_NAMES,
    SPLITS,
    TEXT_SUFFIXES,
    data_cache_dir,
    embedded_corpus_dir,
    hash_hex,
    heldout_of,
    paloma_search_paths,
    sha256_file,
    verify_manifest,
)
from marin_ablate.marin.data.eval import eval_domains, eval_texts
from marin_ablate.marin.data.index import build_index, has_index
from marin_ablate.marin.data.manifest import read_manifest
from marin_ablate.marin.data.prepare import PrepareConfig, out_lock, prepare, read_text_file
from marin_ablate.marin.data.prepare import load_files as _read_rows
from marin_ablate.marin.data.tokenizer import ByteTokenizer, Tokenizer, bpe_sample, load_tokenizer, train_bpe
from marin_ablate.marin.schema import atomic_write_bytes


@dataclass
class DomainSplit:
    """The token documents of one (domain, split): doc i is tokens[offsets[i]:offsets[i+1]]."""

    doc_ids: list[str]
    tokens: np.ndarray  # int32, all documents concatenated
    offsets: np.ndarray  # int64, n_docs + 1
    text_bytes: int  # UTF-8 bytes of the documents' text (for bits per byte)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def n_docs(self) -> int:
        return len(self.doc_ids)

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


@dataclass
class Corpus:
    """Train and held-out token documents per domain. ``domains`` are the eval domains (those
    with a held-out split, filtered by DataConfig.eval_domains); training mixes every train domain."""

    name: str
    domains: list[str]
    manifest: dict
    tokenizer: Tokenizer
    train: dict[str, DomainSplit]
    heldout: dict[str, DomainSplit]
    path: Path | None = None
    fingerprint: str = ""  # identifies the text (manifest hash); with tokenizer.fingerprint, the tokens

    def split(self, name: str) -> dict[str, DomainSplit]:
        if name not in SPLITS:
            raise ValueError(f"split={name!r} is not a known split; allowed values: {', '.join(map(repr, SPLITS))}")
        return self.train if name == "train" else self.heldout

    def check_domain(self, domain: str) -> DomainSplit:
        if domain not in self.domains:
            raise ValueError(f"domain {domain!r} is not an eval domain of corpus {self.name!r}; "
                             f"allowed values: {', '.join(map(repr, self.domains))}")
        return self.heldout[domain]


def _read_file(path: Path, kind: str) -> tuple[list[str], list[str]]:
    """(ids, texts) of one local file, read like a `data prepare` source; rows need a "text" column;
    a text file is one document."""
    if kind == "text":
        return [path.name], [read_text_file(path)]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    ds = _read_rows(kind, [path], "text", str(data_cache_dir() / "hf-datasets"))
    cols = ds.column_names
    if "text" not in cols:
        raise ValueError(f"corpus file {path}: no 'text' column; columns found: {cols}")
    texts = [t or "" for t in ds["text"]]
    ids = [str(i) for i in ds["id"]] if "id" in cols else [str(i) for i in range(len(texts))]
    return ids, texts


def _kind_of(path: Path) -> str:
    n = path.name.lower()
    if n.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    if n.endswith(".parquet"):
        return "parquet"
    return "text"


def load_files(files: list[Path], paragraphs: bool = False) -> tuple[list[str], list[str]]:
    """(ids, texts) of a domain's files; ids are prefixed with the file name (unique per domain).
    paragraphs=True splits text files into one document per blank-line-separated paragraph."""
    ids: list[str] = []
    texts: list[str] = []
    for f in files:
        kind = _kind_of(f)
        i, t = _read_file(f, kind)
        if kind == "text" and paragraphs:
            t = [p.strip("\n") + "\n" for p in t[0].split("\n\n") if p.strip()]
            i = [str(k) for k in range(len(t))]
        ids.extend(f"{f.name}:{x}" if kind != "text" or paragraphs else x for x in i)
        texts.extend(t)
    keep = [k for k, t in enumerate(texts) if t.strip()]
    return [ids[k] for k in keep], [texts[k] for k in keep]


@dataclass
class _RawCorpus:
    """A corpus before tokenization. Texts load lazily, so a cached corpus or a saved tokenizer is
    found from the manifest alone."""

    name: str
    path: Path | None
    manifest: dict
    derived_dir: Path  # where tokenizers / token caches of this corpus live
    eval_domains: list[str]  # domains with a held-out split
    load: Callable[[], tuple[dict, dict]]  # -> (train, heldout): domain -> (ids, texts)

    @functools.cached_property
    def _texts(self) -> tuple[dict, dict]:
        return self.load()

    @property
    def train(self) -> dict[str, tuple[list[str], list[str]]]:
        return self._texts[0]

    @property
    def heldout(self) -> dict[str, tuple[list[str], list[str]]]:
        return self._texts[1]


def _manifest_fingerprint(manifest: dict) -> str:
    return hash_hex(json.dumps(manifest, sort_keys=True))[:16]


def _raw_marin_format(path: Path, name: str) -> _RawCorpus:
    manifest = json.loads((path / "manifest.json").read_text())

    def load():
        verify_manifest(path)  # a damaged cache fails loudly instead of training on other text
        files = {d: manifest["domains"][d]["files"] for d in sorted(manifest["domains"])}
        return tuple({d: _read_file(path / fs[split]["path"], "json") for d, fs in files.items()} for split in SPLITS)

    return _RawCorpus(name, path, manifest, path, sorted(manifest["domains"]), load)


def _split_by_hash(domain: str, ids: list[str], texts: list[str]):
    tr, ho = ([], []), ([], [])
    for i, t in zip(ids, texts, strict=True):
        dst = ho if heldout_of(f"{domain}/{i}") else tr
        dst[0].append(i)
        dst[1].append(t)
    return tr, ho


def _data_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and p.name.lower().endswith(TEXT_SUFFIXES))


def _raw_local(path: Path) -> _RawCorpus:
    """A local directory or file. Directory layouts: <dir>/<domain>/<files> (one domain per
    subdirectory) or <dir>/<files> (one domain named after the directory). Files whose name starts
    with heldout/val/validation/valid/test form the held-out split; without any, documents are
    split by the hash rule. jsonl/json/parquet rows need a "text" column; .txt files are one
    document each (a single .txt given as the corpus: one document per paragraph)."""
    if (path / "manifest.json").is_file():
        m = json.loads((path / "manifest.json").read_text())
        if m.get("format") == "marin-ablate-corpus":
            return _raw_marin_format(path, path.name)
    if path.is_file():
        groups = {path.stem.split(".")[0]: [path]}
        paragraphs = _kind_of(path) == "text"
    else:
        subdirs = sorted(d for d in path.iterdir() if d.is_dir() and not d.name.startswith(".") and _data_files(d))
        groups = {d.name: _data_files(d) for d in subdirs}
        if _data_files(path):
            groups[path.name] = _data_files(path)
        paragraphs = False
    if not groups:
        raise ValueError(f"DataConfig.corpus={str(path)!r}: no data files ({', '.join(TEXT_SUFFIXES)}) "
                         "in the directory or its subdirectories")
    manifest = {"format": "local", "name": path.name, "path": str(path), "domains": {
        domain: {"domain": domain, "source": str(path), "licence": "unknown (local files)",
                 "files": [{"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in files]}
        for domain, files in groups.items()}}

    def load():
        train, heldout = {}, {}
        for domain, files in groups.items():
            ho_files = [f for f in files if f.name.lower().startswith(HELDOUT_NAMES)]
            tr_files = [f for f in files if f not in ho_files]
            if ho_files and tr_files:
                train[domain], heldout[domain] = load_files(tr_files, paragraphs), load_files(ho_files, paragraphs)
            else:
                train[domain], heldout[domain] = _split_by_hash(domain, *load_files(files, paragraphs))
        return train, heldout

    return _RawCorpus(path.name, path, manifest, data_cache_dir() / "derived" / _manifest_fingerprint(manifest),
                      sorted(groups), load)


def find_paloma() -> Path | None:
    for p in paloma_search_paths():
        if p.is_dir() and any(p.glob("*/val/*")):
            return p
    return None


def _raw_paloma() -> _RawCorpus:
    """Real Paloma (local copy): held-out = each Paloma source's val split; training uses the
    embedded corpus' train split (Paloma is an evaluation set only)."""
    root = find_paloma()
    if root is None:
        raise ValueError("DataConfig.corpus='paloma': no local Paloma copy found (the allenai/paloma layout "
                         "<domain>/val/*.jsonl[.gz]); looked in: "
                         + ", ".join(str(p) for p in paloma_search_paths())
                         + ". Set MARIN_PALOMA_DIR, or use corpus='embedded'")
    base = _raw_marin_format(embedded_corpus_dir(), "embedded")
    domains = eval_domains(root)
    manifest = {"format": "paloma", "path": str(root), "train": base.manifest, "domains": {
        d: {"domain": d, "source": f"Paloma {d} val", "licence": "see Paloma",
            "files": [{"path": str(f), "bytes": f.stat().st_size} for f in sorted(folder.iterdir()) if f.is_file()]}
        for d, folder in domains.items()}}

    def load():
        return base.train, {d: (ids, texts) for d, (ids, texts, _) in eval_texts(root).items()}

    return _RawCorpus("paloma", root, manifest, base.derived_dir, sorted(domains), load)


def _raw_corpus(data: DataConfig) -> _RawCorpus:
    if data.corpus == "embedded":
        return _raw_marin_format(embedded_corpus_dir(), "embedded")
    if data.corpus == "paloma":
        return _raw_paloma()
    path = Path(data.corpus).expanduser()
    if not path.exists():
        raise ValueError(f"DataConfig.corpus={data.corpus!r}: path does not exist; allowed values: "
                         "'embedded', 'paloma', or an existing local directory/file")
    return _raw_local(path.resolve())


def _tokenizer_for(data: DataConfig, raw: _RawCorpus) -> Tokenizer:
    if data.tokenizer == "byte":
        return ByteTokenizer()
    path = raw.derived_dir / "tokenizers" / f"bpe-{data.bpe_vocab}.json"
    if path.is_file():
        return load_tokenizer(path)
    return train_bpe(bpe_sample({d: t for d, (_, t) in raw.train.items()}), data.bpe_vocab, path)


def get_tokenizer(data: DataConfig) -> Tokenizer:
    """Byte-level (256) or the corpus' BPE of DataConfig.bpe_vocab (trained once, saved beside it)."""
    return ByteTokenizer() if data.tokenizer == "byte" else _tokenizer_for(data, _raw_corpus(data))


def _domain_split(tok: Tokenizer, ids: list[str], texts: list[str]) -> DomainSplit:
    arrays = tok.encode_docs(texts)
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    return DomainSplit(ids, np.concatenate(arrays).astype(np.int32) if arrays else np.zeros(0, np.int32),
                       np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), _text_bytes(texts))


def _text_bytes(texts: list[str]) -> int:
    return sum(len(t.encode("utf-8")) for t in texts)


def _tokenize(tok: Tokenizer, ids: list[str], texts: list[str], cache: Path | None) -> DomainSplit:
    if cache is not None and cache.is_file():
        # numbers only (an object array would unpickle); a damaged cache is built again
        with (contextlib.suppress(ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile),
              np.load(cache, allow_pickle=False) as z):
            if int(z["n_docs"]) == len(ids):
                return DomainSplit(ids, np.asarray(z["tokens"]), np.asarray(z["offsets"]), _text_bytes(texts))
    split = _domain_split(tok, ids, texts)
    if cache is not None:
        buf = io.BytesIO()
        np.savez(buf, tokens=split.tokens, offsets=split.offsets, n_docs=np.int64(len(ids)))
        atomic_write_bytes(cache, buf.getvalue())
    return split


_CORPUS_CACHE: dict[tuple, Corpus] = {}


def clear_corpus_cache() -> None:
    """Forget the corpora load_corpus cached in this process (the next call reads the files again)."""
    _CORPUS_CACHE.clear()


def load_corpus(data: DataConfig) -> Corpus:
    """The corpus named by DataConfig.corpus ("embedded", "paloma" or a local path), read through HF
    datasets and tokenized with get_tokenizer(data). Cached per process."""
    raw = _raw_corpus(data)
    fp = _manifest_fingerprint(raw.manifest)
    for d in data.eval_domains:
        if d not in raw.eval_domains:
            raise ValueError(f"DataConfig.eval_domains: unknown domain {d!r}; allowed values: "
                             f"{', '.join(map(repr, raw.eval_domains))}")
    tok = _tokenizer_for(data, raw)
    key = (str(raw.path), fp, tok.fingerprint, tuple(data.eval_domains))
    if key in _CORPUS_CACHE:
        return _CORPUS_CACHE[key]
    domains = [d for d in raw.eval_domains if not data.eval_domains or d in data.eval_domains]
    # BPE tokenization of a few MB costs seconds: cache it beside the tokenizer; bytes need none
    cache_dir = None if tok.name == "byte" else raw.derived_dir / "tokenizers" / f"tokens-{tok.fingerprint}-{fp}"
    splits = {split: {d: _tokenize(tok, *getattr(raw, split)[d], None if cache_dir is None
                                   else cache_dir / f"{d}.{split}.npz") for d in sorted(getattr(raw, split))}
              for split in SPLITS}
    corpus = Corpus(name=raw.name, domains=domains, manifest=raw.manifest, tokenizer=tok,
                    train=splits["train"], heldout=splits["heldout"], path=raw.path, fingerprint=fp)
    _CORPUS_CACHE[key] = corpus
    return corpus


def prepared_train(data: DataConfig, log=None) -> Path:
    """The train split of DataConfig's corpus ("embedded", "paloma" or local text) prepared into
    token shards with its tokenizer, on first use (cached beside the corpus, under the preparation
    lock), so every run reads its train stream through the one loader (marin.data.shards). The
    shuffle keys on DOMAIN/ID, so the stream depends only on (corpus, tokenizer, data_seed)."""
    raw = _raw_corpus(data)
    tok = _tokenizer_for(data, raw)
    key = f"{tok.fingerprint}-{_manifest_fingerprint(raw.manifest)}"
    out = raw.derived_dir / "prepared" / key
    if (out / "manifest.json").is_file():
        read_manifest(out)
        if not has_index(out):  # prepared before the loader index existed: write it once, under the lock
            with out_lock(out):
                if not has_index(out):
                    build_index(out, log=log)
        return out
    src = raw.derived_dir / "prepared" / f"source-{key}"
    for domain, (ids, texts) in sorted(raw.train.items()):
        body = "".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n"
                       for i, t in zip(ids, texts, strict=True))
        f = src / domain / "train.jsonl"
        if not f.is_file() or f.stat().st_size != len(body.encode("utf-8")):
            atomic_write_bytes(f, body.encode("utf-8"))
    prepare(PrepareConfig(source=str(src), tokenizer="byte" if tok.name == "byte" else str(tok.path),
                          out=str(out), folder_domains=True, id_column="id", docs_per_shard=100_000), log=log)
    return out


def load_eval_corpus(eval_dir: str | Path, tokenizer: Tokenizer, split: str = "val", text_column: str = "text",
                     domains: tuple[str, ...] = ()) -> Corpus:
    """Every domain of `eval_dir` (or only `domains`) tokenized as held-out splits of a Corpus."""
    heldout: dict[str, DomainSplit] = {}
    files: dict[str, list[dict]] = {}
    for name, (ids, texts, fs) in eval_texts(eval_dir, split, text_column, domains).items():
        heldout[name], files[name] = _domain_split(tokenizer, ids, texts), fs
    root = Path(eval_dir).expanduser().resolve()
    manifest = {"eval_dir": str(root), "split": split,
                "domains": {d: {"files": files[d], "documents": s.n_docs, "tokens": s.n_tokens,
                                "text_bytes": s.text_bytes}
                            for d, s in heldout.items()}}
    return Corpus(name=root.name, domains=list(heldout), manifest=manifest, tokenizer=tokenizer, train={},
                  heldout=heldout, path=root, fingerprint=tokenizer.fingerprint)
