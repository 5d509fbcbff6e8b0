"""Evaluation sets in Paloma's layout: a directory of domains, each a local dataset.

    EVAL_DIR/c4_en/val/val_0.jsonl.gz     (Paloma: allenai/paloma, one folder per source, val/ and test/)
    EVAL_DIR/wikitext_103/val/...
    EVAL_DIR/my_domain/*.parquet          (a domain without split folders is read whole)

`eval_texts` reads every domain's split; `marin.data.loading.load_eval_corpus` tokenizes it with the
training tokenizer into a `Corpus` whose held-out splits are the domains, so marin.data's `eval_batches`
(non-overlapping batches, each target scored at most once) and `bytes_per_token` (for bits per byte)
apply unchanged.
"""

from __future__ import annotations

from pathlib import Path

from marin_ablate.marin.data.corpus import data_cache_dir
from marin_ablate.marin.data.manifest import read_manifest
from marin_ablate.marin.data.prepare import (
    PrepareConfig,
    check_json_file,
    load_source,
    read_text_file,
    sha256_file,
    source_files,
)
from marin_ablate.marin.data.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

SPLIT_DIRS = {"val": ("val", "validation", "valid"), "test": ("test",)}


def _has_datasets() -> bool:
    try:
        import datasets  # noqa: F401
    except ImportError:
        return False
    return True


def read_column(files: list[Path], text_column: str) -> list | None:
    """`text_column` of every row of JSON lines / JSON array / text / Parquet files, in file and row order (a
    text file is one row), as `load_source` reads them, without the datasets library: training on a prepared
    corpus needs torch and numpy only (Parquet: pyarrow). None when a file is of another kind."""
    import gzip
    import json

    out: list = []
    for f in files:
        name = f.name.lower()
        if name.endswith((".txt", ".md", ".rst")):
            out.append(read_text_file(f))
        elif name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")):
            if f.stat().st_size == 0:
                raise ValueError(f"{f}: empty file; remove it or give it rows with a {text_column!r} column")
            check_json_file(f, text_column)  # UTF-8, and text values: the checks `load_source` makes
            with (gzip.open(f, "rt", encoding="utf-8") if name.endswith(".gz") else open(f, encoding="utf-8")) as fh:
                text = fh.read()
            array = name.endswith((".json", ".json.gz")) and text.lstrip().startswith("[")
            rows = json.loads(text) if array else [json.loads(line) for line in text.splitlines() if line.strip()]
            for n, row in enumerate(rows, start=1):
                if not isinstance(row, dict) or text_column not in row:
                    cols = ", ".join(row) if isinstance(row, dict) else type(row).__name__
                    raise ValueError(f"text_column={text_column!r} is not a column of {f} (row {n}); allowed values: "
                                     f"{cols}")
                out.append(row[text_column])
        elif name.endswith(".parquet"):
            import pyarrow.parquet as pq

            out += pq.read_table(f, columns=[text_column]).column(text_column).to_pylist()
        else:
            return None
    return out


def tokenizer_of(prepared: str | Path) -> Tokenizer:
    """The tokenizer a prepared corpus was made with (checked by sha256)."""
    info = read_manifest(prepared)["tokenizer"]
    if info["kind"] == "byte":
        return ByteTokenizer()
    path = Path(prepared).expanduser() / info["path"] if info.get("in_corpus") else Path(info["path"])
    if not path.is_file() or sha256_file(path) != info["sha256"]:
        raise ValueError(f"tokenizer {path} of prepared corpus {prepared} is missing or changed since it "
                         "was prepared (sha256 differs)")
    return load_tokenizer(path)


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


def eval_texts(eval_dir: str | Path, split: str = "val", text_column: str = "text",
               domains: tuple[str, ...] = ()) -> dict[str, tuple[list[str], list[str], list[dict]]]:
    """The one eval reader: domain -> (document ids, texts, files) of every domain of `eval_dir`
    (or only `domains`), read like a `data prepare` source."""
    found = eval_domains(eval_dir, split)
    if domains:
        bad = [d for d in domains if d not in found]
        if bad:
            raise ValueError(f"eval domains {bad} are not in {eval_dir}; allowed values: {', '.join(found)}")
        found = {d: found[d] for d in domains}
    root = Path(eval_dir).expanduser()
    out = {}
    for name, folder in found.items():
        cfg = PrepareConfig(source=str(folder), tokenizer="byte", out=str(data_cache_dir() / "eval"),
                            text_column=text_column)
        files = source_files(cfg.source) or []  # a clear error for a folder without data files
        # the datasets library where installed (its reader's checks name each bad file: tests/integration/
        # test_faults_data.py); without it (a GPU box) JSON, text and Parquet are read here
        column = None if _has_datasets() else read_column(files, text_column)
        if column is None:
            column = load_source(cfg)[text_column]
        texts = [t for t in ("" if t is None else str(t) for t in column) if t.strip()]
        out[name] = ([str(i) for i in range(len(texts))], texts,
                     [{"path": str(f.relative_to(root)), "bytes": f.stat().st_size} for f in files])
    return out
