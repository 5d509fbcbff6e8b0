"""Tokenize a text dataset once into memory-mapped token shards with a manifest.

    prepare(PrepareConfig(source="data/*.parquet dir", tokenizer="llama3/tokenizer.json", out="corpus/"))

A source is a local file or directory (jsonl/json[.gz], parquet, arrow; every such file under a
directory, in sorted order), a `save_to_disk` directory, or the name of a hub dataset already in the
HF cache. Rows are read through HF `datasets`; the text column is chosen by name, an optional
domain column labels each document. Documents (rows) are cut into shards of `docs_per_shard` rows;
shard i is written by one of `num_proc` worker processes as

    shards/00000.tokens.bin   every document's tokens, concatenated (uint16 when vocab <= 65536, else uint32)
    shards/00000.offsets.npy  int64, n_docs + 1: document j is tokens[offsets[j]:offsets[j+1]]
    shards/00000.domain.npy   int32 per document: index into the shard's meta "domains" (domain column only)
    shards/00000.meta.json    written last, atomically: a shard is done exactly when this exists

so an interrupted preparation resumes by redoing only the shards without meta. `manifest.json`
(source, files with sha256, tokenizer sha256, tokens, documents, per-domain counts, shards) is
written when every shard is done; its sha256 is the corpus fingerprint the loader checks on resume.
No end-of-document token is added: the packer marks document boundaries by document ids.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import itertools
import json
import logging
import multiprocessing as mp
import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from marin_ablate.marin.data.index import build_index
from marin_ablate.marin.data.manifest import FORMAT
from marin_ablate.marin.data.tokenizer import tokenizer_info, train_bpe
from marin_ablate.marin.schema import atomic_write_bytes, atomic_write_json, read_json_text, sha256_file

_KINDS = {".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".json.gz": "json", ".parquet": "parquet",
          ".arrow": "arrow", ".txt": "text", ".md": "text", ".rst": "text"}
_ENCODE_BATCH = 1000  # texts per encode_batch call: bounds memory per worker
BPE_TRAIN_BYTES = 200_000_000  # a `bpe:VOCAB` tokenizer trains on at most this much source text


@dataclass(frozen=True)
class PrepareConfig:
    source: str  # local file/directory, save_to_disk directory, or a cached hub dataset name
    # "byte", a tokenizer.json path, "bpe:VOCAB" (trained on the source, saved as OUT/tokenizer.json)
    # or "pkg:DISTRIBUTION/PATH" (a tokenizer.json shipped by an installed package)
    tokenizer: str
    out: str
    text_column: str = "text"
    domain_column: str | None = None
    folder_domains: bool = False  # each file's domain is its first folder under `source`
    id_column: str | None = None  # a column of document ids: the shuffle keys on them
    num_proc: int = 1
    docs_per_shard: int = 50_000
    split: str = "train"  # hub datasets only

    def __post_init__(self) -> None:
        for name in ("num_proc", "docs_per_shard"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PrepareConfig.{name}={v!r} must be a positive integer")
        if not self.text_column:
            raise ValueError("PrepareConfig.text_column must name a column")
        if self.folder_domains and self.domain_column:
            raise ValueError("PrepareConfig.folder_domains and domain_column both name a domain; allowed: one of them")


def _kind(path: Path) -> str | None:
    n = path.name.lower()
    for suf, kind in _KINDS.items():
        if n.endswith(suf):
            return kind
    return None


def source_files(source: str) -> list[Path] | None:
    """The data files of a local source in reading order; None for a hub dataset name."""
    p = Path(source).expanduser()
    if not p.exists():
        return None
    if p.is_file():
        if _kind(p) is None:
            raise ValueError(f"source {source!r}: unknown file type; allowed values: {', '.join(_KINDS)}")
        return [p]
    if (p / "state.json").is_file() and (p / "dataset_info.json").is_file():  # save_to_disk layout
        return sorted(x for x in p.rglob("*") if x.is_file())
    files = sorted(x for x in p.rglob("*") if x.is_file() and _kind(x) and not x.name.startswith(".")
                   and not any(part.startswith(".") for part in x.relative_to(p).parts))
    if not files:
        raise ValueError(f"source {source!r}: no data files; allowed types: {', '.join(_KINDS)}")
    return files


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def read_text_file(f: Path) -> str:
    raw = f.read_bytes()
    if b"\0" in raw[:8192]:
        raise ValueError(f"{f}: binary file (NUL bytes), not text; allowed: UTF-8 text files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{f}: not UTF-8 text (byte {e.start}); allowed: UTF-8 text files") from None


def load_files(kind: str, files: list[Path], text_column: str, cache: str) -> Any:
    """One HF dataset of `files` (all of one kind); a text file is one document."""
    import datasets

    datasets.logging.set_verbosity(logging.CRITICAL)  # a bad file is reported once, as one line, below
    if kind == "text":
        return datasets.Dataset.from_dict({text_column: [read_text_file(f) for f in files]})
    for f in files:
        if f.stat().st_size == 0:
            raise ValueError(f"{f}: empty file; remove it or give it rows with a {text_column!r} column")
        if kind == "json":  # Arrow's JSON reader keeps invalid UTF-8 (failing later, naming no file) and
            check_json_file(f, text_column)  # casts a later file's numbers or objects to the first one's text
    names = files[0] if len(files) == 1 else f"{files[0].parent} ({len(files)} {kind} files)"
    try:
        ds = datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train", cache_dir=cache)
    except Exception as e:  # noqa: BLE001 - the datasets loader raises many types for one bad file: one clear line
        # the reader's own error says what is wrong: the innermost one, or a full disk on the way there
        while not (isinstance(e, OSError) and e.errno == errno.ENOSPC) and (e.__cause__ or e.__context__):
            e = e.__cause__ or e.__context__
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:  # the cache's disk, not the source, is at fault
            raise ValueError(f"disk full (no space left on device) while writing the datasets cache {cache} from "
                             f"{names}; free space there, or prepare into another --corpus-dir") from None
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ValueError(f"{names}: cannot read as {kind} ({type(e).__name__}: {msg}); every row needs a "
                         f"{text_column!r} column and one schema across files") from None
    feature = ds.features.get(text_column)
    dtype = getattr(feature, "dtype", None)
    if feature is not None and dtype not in ("string", "large_string", "null"):  # a number or object: no text
        raise ValueError(f"{names}: column {text_column!r} holds {dtype or type(feature).__name__} values, not "
                         "text; allowed values: a string in every row")
    return ds


def check_json_file(f: Path, text_column: str) -> None:
    """ValueError naming `f` when it is not UTF-8 (read in 1 MiB chunks), or when a row of its first MiB
    holds a `text_column` that is not a string (Arrow keeps one type per file: the first rows tell)."""
    import codecs
    import gzip

    dec, pos = codecs.getincrementaldecoder("utf-8")(), 0
    with (gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")) as fh:
        for chunk in [*iter(lambda: fh.read(1 << 20), b""), b""]:
            try:
                text = dec.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                raise ValueError(f"{f}: not UTF-8 text (byte {pos + e.start}); allowed: UTF-8 JSON lines") from None
            if pos == 0 and ".jsonl" in f.name:
                _check_text_rows(f, text.split("\n")[:-1] if chunk else text.split("\n"), text_column)
            pos += len(chunk)


def _check_text_rows(f: Path, lines: list[str], text_column: str) -> None:
    for n, line in enumerate(lines[:1000], start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except (ValueError, RecursionError):
            return  # Arrow's reader names a malformed line itself
        v = row.get(text_column) if isinstance(row, dict) else None
        if v is not None and not isinstance(v, str):
            raise ValueError(f"{f}: line {n}: column {text_column!r} holds {type(v).__name__} values, not text; "
                             "allowed values: a string in every row")


def load_source(cfg: PrepareConfig) -> Any:
    """The source as one HF `datasets.Dataset` (rows in reading order), its columns checked."""
    import datasets

    datasets.disable_progress_bars()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    files = source_files(cfg.source)
    cache = str(Path(cfg.out).expanduser() / ".hf-cache")
    if files is None:
        try:
            ds = datasets.load_dataset(cfg.source, split=cfg.split)
        except Exception as e:  # noqa: BLE001 - the hub loader raises many types; one clear line
            raise ValueError(f"source {cfg.source!r} is not a local path and not a loadable hub dataset "
                             f"(split {cfg.split!r}): {type(e).__name__}: {e}") from e
    elif (Path(cfg.source) / "state.json").is_file():
        ds = datasets.load_from_disk(cfg.source)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[cfg.split]
    else:
        root = Path(cfg.source).expanduser()
        # runs of consecutive files of one kind (and one folder domain), in sorted-file order
        runs = itertools.groupby(files, key=lambda f: (_kind(f), _folder_domain(root, f) if cfg.folder_domains else ""))
        parts = []
        for (kind, dom), group in runs:
            fs = list(group)
            part = load_files(kind, fs, cfg.text_column, cache)
            if cfg.text_column not in part.column_names:  # else concatenation fills it with None: text lost
                where = f"{fs[0]}{f' (and {len(fs) - 1} more)' if len(fs) > 1 else ''}"
                raise ValueError(f"text_column={cfg.text_column!r} is not a column of {where}; allowed values: "
                                 f"{', '.join(part.column_names)}")
            if cfg.folder_domains:
                part = part.add_column("domain", [dom] * len(part))
            parts.append(part)
        try:
            ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
        except ValueError as e:
            raise ValueError(f"source {cfg.source!r}: files with different columns cannot form one corpus "
                             f"({str(e).splitlines()[0][:200]})") from None
    cols = ds.column_names
    for name, col in (("text_column", cfg.text_column), ("domain_column", cfg.domain_column),
                      ("id_column", cfg.id_column)):
        if col is not None and col not in cols:
            raise ValueError(f"{name}={col!r} is not a column of {cfg.source!r}; allowed values: {', '.join(cols)}")
    return ds


def _folder_domain(root: Path, f: Path) -> str:
    rel = f.relative_to(root).parts if root.is_dir() else ()
    return rel[0] if len(rel) > 1 else (root.name if root.is_dir() else root.stem)


def _source_record(cfg: PrepareConfig, ds: Any) -> dict:
    files = source_files(cfg.source)
    if files is None:
        return {"source": cfg.source, "split": cfg.split, "hub_fingerprint": getattr(ds, "_fingerprint", None),
                "files": []}
    root = Path(cfg.source).expanduser()
    rel = (lambda f: str(f.relative_to(root))) if root.is_dir() else (lambda f: f.name)
    return {"source": str(root.resolve()), "files": [{"path": rel(f), "bytes": f.stat().st_size,
                                                      "sha256": sha256_file(f)} for f in files]}


# ---- Workers: one shard each ---------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _encoder(tok: dict, out: Path):
    if tok["kind"] == "byte":
        return lambda texts: [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(out / tok["path"]) if tok.get("in_corpus") else tok["path"])
    return lambda texts: [np.asarray(e.ids, np.int64) for e in t.encode_batch(list(texts))]


def shard_paths(out: Path, i: int) -> dict[str, Path]:
    base = out / "shards" / f"{i:05d}"
    return {k: Path(f"{base}.{k}") for k in ("tokens.bin", "offsets.npy", "domain.npy", "meta.json")}


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def write_shard(out: Path, i: int, rows: tuple[int, int], data: bytes, offsets: np.ndarray, domains: list[str],
                doc_domain: np.ndarray | None, per_domain: dict, skipped: int, text_bytes: int,
                ids: list[str] | None = None) -> dict:
    """Shard i's files (tokens, offsets, each document's domain when given) and, last, its meta.json: a shard is
    done exactly when its meta exists. Returns the meta."""
    p, offsets_bytes = shard_paths(out, i), npy_bytes(offsets)
    atomic_write_bytes(p["tokens.bin"], data)
    atomic_write_bytes(p["offsets.npy"], offsets_bytes)
    if doc_domain is not None:
        atomic_write_bytes(p["domain.npy"], npy_bytes(doc_domain))
    meta = {"index": i, "rows": list(rows), "tokens": int(offsets[-1]), "documents": len(offsets) - 1,
            "skipped_empty": skipped, "text_bytes": text_bytes, "sha256": hashlib.sha256(data).hexdigest(),
            "offsets_sha256": hashlib.sha256(offsets_bytes).hexdigest(), "domains": domains, "per_domain": per_domain}
    if ids is not None:
        meta["ids"] = ids
    atomic_write_json(p["meta.json"], meta)
    return meta


def _domain_column(cfg: PrepareConfig) -> str | None:
    return "domain" if cfg.folder_domains else cfg.domain_column


def prepare_shard(i: int) -> dict:
    """Tokenize rows [i*D, (i+1)*D) of the worker's dataset and write shard i; returns its meta."""
    cfg: PrepareConfig = _WORKER["cfg"]
    ds, tok = _WORKER["ds"], _WORKER["tok"]
    out = Path(cfg.out).expanduser()
    if "encode" not in _WORKER:
        _WORKER["encode"] = _encoder(tok, out)
    encode, dtype = _WORKER["encode"], token_dtype(tok["vocab_size"])
    dcol = _domain_column(cfg)
    lo, hi = i * cfg.docs_per_shard, min(len(ds), (i + 1) * cfg.docs_per_shard)
    part = ds.select(range(lo, hi))
    arrays: list[np.ndarray] = []
    dom_index: dict[str, int] = {}  # domain name -> its index in the shard's meta "domains", in order of appearance
    doc_domain: list[int] = []
    ids: list[str] = []
    text_bytes = skipped = 0
    per_domain: dict[str, list[int]] = {}
    for b in range(0, len(part), _ENCODE_BATCH):
        rows = part[b:b + _ENCODE_BATCH]
        texts = ["" if t is None else str(t) for t in rows[cfg.text_column]]
        labels = rows[dcol] if dcol else [None] * len(texts)
        row_ids = rows[cfg.id_column] if cfg.id_column else [None] * len(texts)
        for text, toks, label, rid in zip(texts, encode(texts), labels, row_ids, strict=True):
            if len(toks) == 0:  # an empty document has no token to train on
                skipped += 1
                continue
            if toks.max() >= tok["vocab_size"]:
                raise ValueError(f"shard {i}: token id {int(toks.max())} >= vocab_size {tok['vocab_size']}")
            arrays.append(toks.astype(dtype))
            nb = len(text.encode("utf-8"))
            text_bytes += nb
            name = "" if label is None else str(label)
            doc_domain.append(dom_index.setdefault(name, len(dom_index)))
            if cfg.id_column:
                ids.append(str(rid))
            c = per_domain.setdefault(name, [0, 0, 0])
            c[0] += 1
            c[1] += len(toks)
            c[2] += nb
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays], dtype=np.int64)]).astype(np.int64)
    data = (np.concatenate(arrays) if arrays else np.zeros(0, dtype)).astype(dtype).tobytes()
    counts = {k: dict(zip(("documents", "tokens", "text_bytes"), v, strict=True)) for k, v in per_domain.items()}
    return write_shard(out, i, (lo, hi), data, offsets, list(dom_index),
                       np.array(doc_domain, np.int32) if dcol else None, counts, skipped, text_bytes,
                       ids if cfg.id_column else None)


class _Terminated(KeyboardInterrupt):
    signum = signal.SIGTERM


def _terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


def _init_worker(cfg: PrepareConfig, ds: Any, tok: dict) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # num_proc processes already fill the cores
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops the pool; a worker never prints a traceback
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER.clear()
    _WORKER.update(cfg=cfg, ds=ds, tok=tok)


# ---- Driver --------------------------------------------------------------------------------------


@contextmanager
def out_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on `out` (flock on out/.lock): one preparation writes a corpus at a time;
    a second waits, then finds the first's prepare.json (and reuses or refuses it)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _job_record(cfg: PrepareConfig, source: dict, tok: dict, n_rows: int) -> dict:
    return {"format": FORMAT, "source": source, "tokenizer": tok, "text_column": cfg.text_column,
            "domain_column": _domain_column(cfg), "folder_domains": cfg.folder_domains, "id_column": cfg.id_column,
            "docs_per_shard": cfg.docs_per_shard, "rows": n_rows}


def _corpus_tokenizer(cfg: PrepareConfig, ds: Any, out: Path, log: Any) -> dict:
    """tokenizer_info of cfg.tokenizer; `bpe:VOCAB` is trained on the source once and kept as
    OUT/tokenizer.json, so the corpus carries its own tokenizer."""
    spec = cfg.tokenizer
    if not spec.startswith("bpe:"):
        return tokenizer_info(spec)
    vocab = _bpe_vocab(spec)
    path, made_by = out / "tokenizer.json", out / ".tokenizer-spec"
    if path.is_file() and (not made_by.is_file() or made_by.read_text() != spec):
        if made_by.is_file():
            raise ValueError(f"--corpus-dir {str(out)!r} holds a tokenizer made by {made_by.read_text()!r}, "
                             f"not {spec!r}; choose another --corpus-dir or delete it")
        path.unlink()  # killed between training and recording it: train again
    if not path.is_file():
        if log:
            log(f"training a byte-level BPE of vocabulary {vocab} on {cfg.source} (up to {BPE_TRAIN_BYTES:,} bytes)")
        train_bpe(_bpe_texts(ds, cfg.text_column), vocab, path)
        atomic_write_bytes(made_by, spec.encode())
    # the trainer stops early when the text has fewer merges to learn: the file's vocabulary is the truth
    return {**tokenizer_info(str(path)), "path": "tokenizer.json", "in_corpus": True, "spec": spec}


def _bpe_vocab(spec: str) -> int:
    """VOCAB of a 'bpe:VOCAB' tokenizer spec, checked."""
    try:
        vocab = int(spec[4:])
    except ValueError:
        vocab = None
    if vocab is None or not 257 <= vocab <= 1 << 20:
        raise ValueError(f"tokenizer={spec!r}: VOCAB of bpe:VOCAB must be an integer in 257..{1 << 20}; allowed "
                         "values: 'byte', 'bpe:VOCAB', 'pkg:DIST/PATH', a tokenizer.json path")
    return vocab


def _bpe_texts(ds: Any, column: str) -> Iterator[str]:
    used = 0
    for b in range(0, len(ds), _ENCODE_BATCH):
        for t in ds[b:b + _ENCODE_BATCH][column]:
            if t:
                used += len(t)
                yield t
            if used >= BPE_TRAIN_BYTES:
                return


def prepare(cfg: PrepareConfig, *, shard_limit: int | None = None, log: Any = None) -> dict | None:
    """Prepare `cfg.source` into `cfg.out`; returns the manifest, or None when `shard_limit` new
    shards were written and some remain (a time-boxed job: calling again resumes). A directory
    holding a preparation of different inputs is refused, never mixed; concurrent preparations of
    one `out` run one after the other (out_lock)."""
    out = Path(cfg.out).expanduser()
    if cfg.tokenizer.startswith("bpe:"):  # a bad tokenizer fails before the source is read
        _bpe_vocab(cfg.tokenizer)
    else:
        tokenizer_info(cfg.tokenizer)
    ds = load_source(cfg)
    with out_lock(out):
        return _prepare_locked(cfg, ds, out, shard_limit, log)


def _prepare_locked(cfg: PrepareConfig, ds: Any, out: Path, shard_limit: int | None, log: Any) -> dict | None:
    job_path = out / "prepare.json"
    old = _read_job(job_path)
    if old is not None and cfg.tokenizer.startswith("bpe:") and old["tokenizer"].get("spec") != cfg.tokenizer:
        raise ValueError(f"--corpus-dir {str(out)!r} holds a preparation of different inputs (differs in tokenizer); "
                         "choose another --corpus-dir or delete it")
    tok = _corpus_tokenizer(cfg, ds, out, log)
    job = _job_record(cfg, _source_record(cfg, ds), tok, len(ds))
    if old is not None:
        if old != job:
            diff = sorted(k for k in job if old.get(k) != job[k])
            raise ValueError(f"--corpus-dir {str(out)!r} holds a preparation of different inputs (differs in "
                             f"{', '.join(diff)}); choose another --corpus-dir or delete it")
    else:
        atomic_write_json(job_path, job)
    n_shards = max(1, -(-len(ds) // cfg.docs_per_shard))
    remaining = [i for i in range(n_shards) if not shard_paths(out, i)["meta.json"].is_file()]
    todo = remaining if shard_limit is None else remaining[:shard_limit]
    if log:
        log(f"{cfg.source}: {len(ds)} rows in {n_shards} shards, {n_shards - len(remaining)} done before, "
            f"{len(todo)} to write with {cfg.num_proc} worker(s)")
    done = n_shards - len(remaining)

    def progress(meta: dict) -> None:
        nonlocal done
        done += 1
        if log:
            log(f"  shard {meta['index']:05d}: {meta['documents']:,} documents, {meta['tokens']:,} tokens "
                f"({done}/{n_shards} shards done)")

    if todo:
        if cfg.num_proc == 1 or len(todo) == 1:
            _init_worker(cfg, ds, tok)
            for i in todo:
                progress(prepare_shard(i))
        else:
            # fork: the workers inherit the memory-mapped dataset; none has loaded a tokenizer yet
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            prev = signal.getsignal(signal.SIGTERM)
            with ctx.Pool(min(cfg.num_proc, len(todo)), initializer=_init_worker, initargs=(cfg, ds, tok)) as pool:
                # SIGTERM to the driver stops it as Ctrl-C does: the pool is terminated on the way out (its
                # workers exit quietly), never left writing into a closed pipe; written shards are kept
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, _terminated)
                try:
                    for meta in pool.imap_unordered(prepare_shard, todo):
                        progress(meta)
                finally:
                    if threading.current_thread() is threading.main_thread():
                        signal.signal(signal.SIGTERM, prev)
    metas = [shard_paths(out, i)["meta.json"] for i in range(n_shards)]
    if not all(m.is_file() for m in metas):
        return None
    manifest = write_manifest(out, job, [json.loads(m.read_text()) for m in metas])
    build_index(out, log=log)  # the loader index DataConfig.shuffle="indexed" reads (marin/data/index.py)
    return manifest


def _read_job(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        job = read_json_text(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e}); delete the folder and prepare again") from None
    if not isinstance(job, dict) or not isinstance(job.get("tokenizer"), dict):
        raise ValueError(f"{path}: not a preparation record; delete the folder and prepare again")
    return job


def write_manifest(out: Path, job: dict, metas: list[dict]) -> dict:
    domains: dict[str, dict[str, int]] = {}
    for m in metas:
        for name, c in m["per_domain"].items():
            d = domains.setdefault(name, {"documents": 0, "tokens": 0, "text_bytes": 0})
            for k in d:
                d[k] += c[k]
    shards = []
    for m in metas:
        p = shard_paths(out, m["index"])
        shards.append({"tokens_path": str(p["tokens.bin"].relative_to(out)),
                       "offsets_path": str(p["offsets.npy"].relative_to(out)),
                       "domain_path": str(p["domain.npy"].relative_to(out)) if job["domain_column"] else None,
                       **{k: m[k] for k in ("domains", "tokens", "documents", "sha256", "offsets_sha256", "rows",
                                            *(("ids",) if job.get("id_column") else ()))}})
    manifest = {**job, "dtype": token_dtype(job["tokenizer"]["vocab_size"]).name,
                "tokens": sum(m["tokens"] for m in metas), "documents": sum(m["documents"] for m in metas),
                "skipped_empty": sum(m["skipped_empty"] for m in metas),
                "text_bytes": sum(m["text_bytes"] for m in metas), "domains": domains, "shards": shards}
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


