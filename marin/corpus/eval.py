"""Evaluation sets in Paloma's layout: a directory of domains, each a local dataset.

    EVAL_DIR/c4_en/val/val_0.jsonl.gz     (Paloma: allenai/paloma, one folder per source, val/ and test/)
    EVAL_DIR/wikitext_103/val/...
    EVAL_DIR/my_domain/*.parquet          (a domain without split folders is read whole)

`load_eval_corpus` tokenizes every domain's split with the training tokenizer into a marin.data
`Corpus` whose held-out splits are the domains, so marin.data's `eval_batches` (non-overlapping
batches, each target scored at most once) and `bytes_per_token` (for bits per byte) apply unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from marin.corpus.prepare import PrepareConfig, load_source, read_manifest, sha256_file, source_files
from marin.data import BPETokenizer, ByteTokenizer, Corpus, DomainSplit, Tokenizer, data_cache_dir

SPLIT_DIRS = {"val": ("val", "validation", "valid"), "test": ("test",)}


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """'byte' or a tokenizer.json path (any HF `tokenizers` file: the project's BPE, Llama 3's ...)."""
    if str(spec) == "byte":
        return ByteTokenizer()
    p = Path(spec).expanduser()
    if not p.is_file():
        raise ValueError(f"tokenizer={str(spec)!r} is not a file; allowed values: a tokenizer.json path, 'byte'")
    return BPETokenizer(p)


def tokenizer_of(prepared: str | Path) -> Tokenizer:
    """The tokenizer a prepared corpus was made with (checked by sha256)."""
    info = read_manifest(prepared)["tokenizer"]
    if info["kind"] == "byte":
        return ByteTokenizer()
    if not Path(info["path"]).is_file() or sha256_file(info["path"]) != info["sha256"]:
        raise ValueError(f"tokenizer {info['path']} of prepared corpus {prepared} is missing or changed since it "
                         "was prepared (sha256 differs)")
    return BPETokenizer(info["path"])


def eval_domains(eval_dir: str | Path, split: str = "val") -> dict[str, Path]:
    """domain name -> the folder its `split` documents are read from."""
    if split not in SPLIT_DIRS:
        raise ValueError(f"split={split!r} is not an eval split; allowed values: {', '.join(SPLIT_DIRS)}")
    root = Path(eval_dir).expanduser()
    if not root.is_dir():
        raise ValueError(f"eval directory {str(eval_dir)!r} does not exist")
    out: dict[str, Path] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        named = [d / s for s in SPLIT_DIRS[split] if (d / s).is_dir()]
        other = [d / s for k, v in SPLIT_DIRS.items() if k != split for s in v if (d / s).is_dir()]
        if named:
            out[d.name] = named[0]
        elif not other:  # no split folders: the whole domain folder is the eval set
            out[d.name] = d
    if not out:
        raise ValueError(f"eval directory {root} has no domain folders with {split!r} data "
                         "(expected DOMAIN/val/*.jsonl[.gz] or DOMAIN/*.parquet ...)")
    return out


def load_eval_corpus(eval_dir: str | Path, tokenizer: Tokenizer, split: str = "val", text_column: str = "text",
                     domains: tuple[str, ...] = ()) -> Corpus:
    """Every domain of `eval_dir` (or only `domains`) tokenized as held-out splits of a Corpus."""
    found = eval_domains(eval_dir, split)
    if domains:
        bad = [d for d in domains if d not in found]
        if bad:
            raise ValueError(f"eval domains {bad} are not in {eval_dir}; allowed values: {', '.join(found)}")
        found = {d: found[d] for d in domains}
    heldout: dict[str, DomainSplit] = {}
    files: dict[str, list[dict]] = {}
    for name, folder in found.items():
        cfg = PrepareConfig(source=str(folder), tokenizer="byte", out=str(data_cache_dir() / "eval"),
                            text_column=text_column)
        source_files(cfg.source)  # a clear error for a folder without data files
        ds = load_source(cfg)
        texts = [t for t in ("" if t is None else str(t) for t in ds[text_column]) if t.strip()]
        toks = tokenizer.encode_docs(texts)
        lengths = np.array([len(t) for t in toks], np.int64)
        heldout[name] = DomainSplit(
            doc_ids=[str(i) for i in range(len(texts))],
            tokens=np.concatenate(toks).astype(np.int32) if toks else np.zeros(0, np.int32),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            text_bytes=sum(len(t.encode("utf-8")) for t in texts))
        files[name] = [{"path": str(f.relative_to(Path(eval_dir).expanduser())), "bytes": f.stat().st_size}
                       for f in source_files(str(folder)) or []]
    root = Path(eval_dir).expanduser().resolve()
    manifest = {"eval_dir": str(root), "split": split, "domains": {d: {"files": files[d], "documents": s.n_docs,
                                                                        "tokens": s.n_tokens, "text_bytes": s.text_bytes}
                                                                    for d, s in heldout.items()}}
    return Corpus(name=root.name, domains=list(heldout), manifest=manifest, tokenizer=tokenizer, train={},
                  heldout=heldout, path=root, fingerprint=tokenizer.fingerprint)
