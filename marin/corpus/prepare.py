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

import hashlib
import json
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marin.schema import atomic_write_bytes, sha256_file  # noqa: F401  (sha256_file re-exported)

FORMAT = "marin-tokens-v1"
_KINDS = {".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".json.gz": "json", ".parquet": "parquet",
          ".arrow": "arrow"}
_ENCODE_BATCH = 1000  # texts per encode_batch call: bounds memory per worker


@dataclass(frozen=True)
class PrepareConfig:
    source: str  # local file/directory, save_to_disk directory, or a cached hub dataset name
    tokenizer: str  # a tokenizer.json path (HF `tokenizers`, e.g. Llama 3's or the project's BPE) or "byte"
    out: str
    text_column: str = "text"
    domain_column: str | None = None
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


def _atomic_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode())


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
    files = sorted(x for x in p.rglob("*") if x.is_file() and _kind(x) and not x.name.startswith("."))
    if not files:
        raise ValueError(f"source {source!r}: no data files; allowed types: {', '.join(_KINDS)}")
    return files


def tokenizer_info(tokenizer: str) -> dict:
    if tokenizer == "byte":
        return {"kind": "byte", "path": None, "sha256": "byte", "vocab_size": 256}
    p = Path(tokenizer).expanduser()
    if not p.is_file():
        raise ValueError(f"tokenizer={tokenizer!r} is neither a tokenizer.json file nor a known tokenizer; "
                         "allowed values: a tokenizer.json path, 'byte'")
    from tokenizers import Tokenizer

    return {"kind": "tokenizers", "path": str(p.resolve()), "sha256": sha256_file(p),
            "vocab_size": Tokenizer.from_file(str(p)).get_vocab_size()}


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def load_source(cfg: PrepareConfig) -> Any:
    """The source as one HF `datasets.Dataset` (rows in reading order), its columns checked."""
    import datasets

    datasets.disable_progress_bars()
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
        parts = []
        for kind in sorted({_kind(f) for f in files}):
            fs = [str(f) for f in files if _kind(f) == kind]
            parts.append((fs[0], datasets.load_dataset(kind, data_files=fs, split="train", cache_dir=cache)))
        # one kind after another would reorder files; keep sorted-file order when kinds mix
        ds = datasets.concatenate_datasets([d for _, d in sorted(parts)]) if len(parts) > 1 else parts[0][1]
    for name, col in (("text_column", cfg.text_column), ("domain_column", cfg.domain_column)):
        if col is not None and col not in ds.column_names:
            raise ValueError(f"{name}={col!r} is not a column of {cfg.source!r}; allowed values: "
                             f"{', '.join(ds.column_names)}")
    return ds


def _source_record(cfg: PrepareConfig, ds: Any) -> dict:
    files = source_files(cfg.source)
    if files is None:
        return {"source": cfg.source, "split": cfg.split, "hub_fingerprint": getattr(ds, "_fingerprint", None),
                "files": []}
    root = Path(cfg.source).expanduser()
    rel = (lambda f: str(f.relative_to(root))) if root.is_dir() else (lambda f: f.name)
    return {"source": str(root.resolve()), "files": [{"path": rel(f), "bytes": f.stat().st_size,
                                                      "sha256": sha256_file(f)} for f in files]}


# ---------------------------------------------------------------------------------------------
# Workers: one shard each
# ---------------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _encoder(tok: dict):
    if tok["kind"] == "byte":
        return lambda texts: [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(tok["path"])
    return lambda texts: [np.asarray(e.ids, np.int64) for e in t.encode_batch(list(texts))]


def _shard_paths(out: Path, i: int) -> dict[str, Path]:
    base = out / "shards" / f"{i:05d}"
    return {k: Path(f"{base}.{k}") for k in ("tokens.bin", "offsets.npy", "domain.npy", "meta.json")}


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def prepare_shard(i: int) -> dict:
    """Tokenize rows [i*D, (i+1)*D) of the worker's dataset and write shard i; returns its meta."""
    cfg: PrepareConfig = _WORKER["cfg"]
    ds, tok = _WORKER["ds"], _WORKER["tok"]
    if "encode" not in _WORKER:
        _WORKER["encode"] = _encoder(tok)
    encode, dtype = _WORKER["encode"], token_dtype(tok["vocab_size"])
    out = Path(cfg.out).expanduser()
    lo, hi = i * cfg.docs_per_shard, min(len(ds), (i + 1) * cfg.docs_per_shard)
    part = ds.select(range(lo, hi))
    arrays: list[np.ndarray] = []
    domains: list[str] = []
    dom_index: dict[str, int] = {}
    doc_domain: list[int] = []
    text_bytes = skipped = 0
    per_domain: dict[str, list[int]] = {}
    for b in range(0, len(part), _ENCODE_BATCH):
        rows = part[b:b + _ENCODE_BATCH]
        texts = ["" if t is None else str(t) for t in rows[cfg.text_column]]
        labels = rows[cfg.domain_column] if cfg.domain_column else [None] * len(texts)
        for text, ids, label in zip(texts, encode(texts), labels):
            if len(ids) == 0:  # an empty document has no token to train on
                skipped += 1
                continue
            if ids.max() >= tok["vocab_size"]:
                raise ValueError(f"shard {i}: token id {int(ids.max())} >= vocab_size {tok['vocab_size']}")
            arrays.append(ids.astype(dtype))
            nb = len(text.encode("utf-8"))
            text_bytes += nb
            name = "" if label is None else str(label)
            if name not in dom_index:
                dom_index[name] = len(domains)
                domains.append(name)
            doc_domain.append(dom_index[name])
            c = per_domain.setdefault(name, [0, 0, 0])
            c[0] += 1
            c[1] += len(ids)
            c[2] += nb
    lengths = np.array([len(a) for a in arrays], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = (np.concatenate(arrays) if arrays else np.zeros(0, dtype)).astype(dtype).tobytes()
    p = _shard_paths(out, i)
    atomic_write_bytes(p["tokens.bin"], data)
    atomic_write_bytes(p["offsets.npy"], _npy_bytes(offsets))
    if cfg.domain_column:
        atomic_write_bytes(p["domain.npy"], _npy_bytes(np.array(doc_domain, np.int32)))
    meta = {"index": i, "rows": [lo, hi], "tokens": int(offsets[-1]), "documents": len(arrays),
            "skipped_empty": skipped, "text_bytes": text_bytes, "sha256": hashlib.sha256(data).hexdigest(),
            "domains": domains, "per_domain": {k: dict(zip(("documents", "tokens", "text_bytes"), v))
                                               for k, v in per_domain.items()}}
    _atomic_json(p["meta.json"], meta)  # last: the shard is done
    return meta


def _init_worker(cfg: PrepareConfig, ds: Any, tok: dict) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # num_proc processes already fill the cores
    _WORKER.clear()
    _WORKER.update(cfg=cfg, ds=ds, tok=tok)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _job_record(cfg: PrepareConfig, source: dict, tok: dict, n_rows: int) -> dict:
    return {"format": FORMAT, "source": source, "tokenizer": tok, "text_column": cfg.text_column,
            "domain_column": cfg.domain_column, "docs_per_shard": cfg.docs_per_shard, "rows": n_rows}


def prepare(cfg: PrepareConfig, *, shard_limit: int | None = None, log: Any = None) -> dict | None:
    """Prepare `cfg.source` into `cfg.out`; returns the manifest, or None when `shard_limit` new
    shards were written and some remain (a time-boxed job: calling again resumes). A directory
    holding a preparation of different inputs is refused, never mixed."""
    out = Path(cfg.out).expanduser()
    tok = tokenizer_info(cfg.tokenizer)
    ds = load_source(cfg)
    job = _job_record(cfg, _source_record(cfg, ds), tok, len(ds))
    job_path = out / "prepare.json"
    if job_path.is_file():
        old = json.loads(job_path.read_text())
        if old != job:
            diff = sorted(k for k in job if old.get(k) != job[k])
            raise ValueError(f"--out {str(out)!r} holds a preparation of different inputs (differs in "
                             f"{', '.join(diff)}); choose another --out or delete it")
    else:
        _atomic_json(job_path, job)
    n_shards = max(1, -(-len(ds) // cfg.docs_per_shard))
    remaining = [i for i in range(n_shards) if not _shard_paths(out, i)["meta.json"].is_file()]
    todo = remaining if shard_limit is None else remaining[:shard_limit]
    if log:
        log(f"{cfg.source}: {len(ds)} rows in {n_shards} shards, {n_shards - len(remaining)} done before, "
            f"{len(todo)} to write with {cfg.num_proc} worker(s)")
    if todo:
        if cfg.num_proc == 1 or len(todo) == 1:
            _init_worker(cfg, ds, tok)
            for i in todo:
                prepare_shard(i)
        else:
            # fork: the workers inherit the memory-mapped dataset; none has loaded a tokenizer yet
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            with ctx.Pool(min(cfg.num_proc, len(todo)), initializer=_init_worker, initargs=(cfg, ds, tok)) as pool:
                for _ in pool.imap_unordered(prepare_shard, todo):
                    pass
    metas = [_shard_paths(out, i)["meta.json"] for i in range(n_shards)]
    if not all(m.is_file() for m in metas):
        return None
    return _write_manifest(out, job, [json.loads(m.read_text()) for m in metas])


def _write_manifest(out: Path, job: dict, metas: list[dict]) -> dict:
    domains: dict[str, dict[str, int]] = {}
    for m in metas:
        for name, c in m["per_domain"].items():
            d = domains.setdefault(name, {"documents": 0, "tokens": 0, "text_bytes": 0})
            for k in d:
                d[k] += c[k]
    shards = []
    for m in metas:
        p = _shard_paths(out, m["index"])
        shards.append({"tokens_path": str(p["tokens.bin"].relative_to(out)),
                       "offsets_path": str(p["offsets.npy"].relative_to(out)),
                       "domain_path": str(p["domain.npy"].relative_to(out)) if job["domain_column"] else None,
                       "domains": m["domains"], **{k: m[k] for k in ("tokens", "documents", "sha256", "rows")}})
    manifest = {**job, "dtype": token_dtype(job["tokenizer"]["vocab_size"]).name,
                "tokens": sum(m["tokens"] for m in metas), "documents": sum(m["documents"] for m in metas),
                "skipped_empty": sum(m["skipped_empty"] for m in metas),
                "text_bytes": sum(m["text_bytes"] for m in metas), "domains": domains, "shards": shards}
    _atomic_json(out / "manifest.json", manifest)
    return manifest


def read_manifest(path: str | Path) -> dict:
    """The manifest of a prepared corpus directory (torch-free: plan-time epoch accounting uses it)."""
    p = Path(path).expanduser()
    m = p / "manifest.json" if p.is_dir() else p
    if not m.is_file():
        raise ValueError(f"data.corpus={str(path)!r} is not a prepared corpus (no manifest.json); "
                         "run `marin-ablate data prepare SOURCE --tokenizer PATH --out DIR` first")
    manifest = json.loads(m.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{m}: format {manifest.get('format')!r} is not {FORMAT!r}; prepare the corpus again")
    return manifest
