"""`marin-ablate data prepare SOURCE --tokenizer SPEC --corpus-dir DIR`: tokenize a corpus once into token
shards with a manifest (marin/data/prepare.py); a study then trains on it with `--data.corpus=DIR`.
Interrupted, the same command resumes: finished shards are kept.
`marin-ablate data verify DIR` checks every shard against the manifest's sha256; `marin-ablate data index DIR`
writes the loader index (marin/data/index.py) of a corpus prepared before `data prepare` wrote one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from marin_ablate.cli.parse import parse
from marin_ablate.marin.fields import option


@dataclass(frozen=True)
class PrepareOptions:
    """Tokenize SOURCE into memory-mapped token shards under --corpus-dir."""

    command: ClassVar[str] = "data"
    source: str = option(positional=True, metavar="SOURCE",
                         help="a local txt/md/jsonl/json[.gz]/parquet/arrow file or folder (every such file under it), "
                              "a save_to_disk directory, or a hub dataset name already in the HF cache")
    tokenizer: str = option(metavar="SPEC",
                            help="'byte', a tokenizer.json file, 'bpe:VOCAB' (a byte-level BPE trained on SOURCE, "
                                 "saved as DIR/tokenizer.json) or 'pkg:DISTRIBUTION/PATH' (a tokenizer.json shipped "
                                 "by an installed package)")
    corpus_dir: str = option(metavar="DIR", help="output directory (manifest.json, shards/)")
    text_column: str = option("text", help="the column holding each document's text")
    domain_column: str | None = option(None, help="a column naming each document's domain (optional)")
    folder_domains: bool = option(False, help="each file's domain is its first folder under SOURCE (SOURCE/DOMAIN/...)")
    id_column: str | None = option(None, help="a column of document ids: the shuffle keys on them (optional)")
    num_proc: int = option(1, lo=1, help="worker processes, one shard at a time each")
    docs_per_shard: int = option(50_000, lo=1, help="documents per shard")
    split: str = option("train", help="split of a hub dataset")


@dataclass(frozen=True)
class VerifyOptions:
    """Check a prepared corpus' shards against its manifest (sizes, sha256, ids)."""

    command: ClassVar[str] = "data"
    corpus: str = option(positional=True, metavar="DIR", help="a prepared corpus directory")


@dataclass(frozen=True)
class IndexOptions:
    """Write the loader index of a prepared corpus (DataConfig.shuffle='indexed' reads it)."""

    command: ClassVar[str] = "data"
    corpus: str = option(positional=True, metavar="DIR", help="a prepared corpus directory")


ACTIONS = {"prepare": PrepareOptions, "verify": VerifyOptions, "index": IndexOptions}


def cmd_data(argv: list[str]) -> int:
    action = argv[0] if argv else ""
    if action in ("-h", "--help"):
        print(f"usage: marin-ablate data {{{','.join(ACTIONS)}}} ...\n\n"
              + "\n".join(f"  {k:<8} {v.__doc__.splitlines()[0]}" for k, v in ACTIONS.items()))
        return 0
    if action not in ACTIONS:
        raise ValueError(f"ACTION {action!r} is not known; allowed values: {', '.join(ACTIONS)}")
    args = parse(ACTIONS[action], argv[1:], prog=f"marin-ablate data {action}")
    if action == "verify":
        from marin_ablate.marin.data.index import verify_index
        from marin_ablate.marin.data.shards import verify_corpus

        m, idx = verify_corpus(args.corpus, full=True), verify_index(args.corpus)
        print(f"{args.corpus}: {len(m['shards'])} shards, {m['tokens']:,} tokens match manifest.json (sha256)"
              + (f"; the loader index of {idx['documents']:,} documents matches index.json (sha256)" if idx else ""))
    elif action == "index":
        from marin_ablate.marin.data.index import build_index
        from marin_ablate.marin.data.prepare import out_lock

        with out_lock(Path(args.corpus).expanduser()):
            meta = build_index(args.corpus)
        print(f"{args.corpus}: loader index of {meta['documents']:,} documents, {meta['tokens']:,} tokens, "
              f"{len(meta['domains'])} domain(s)")
    else:
        from marin_ablate.marin.data.prepare import PrepareConfig, prepare

        kw = {k: getattr(args, k) for k in ("source", "tokenizer", "text_column", "domain_column", "folder_domains",
                                            "id_column", "num_proc", "docs_per_shard", "split")}
        m = prepare(PrepareConfig(out=args.corpus_dir, **kw), log=lambda line: print(line, flush=True))
        doms = ", ".join(f"{k or '(none)'} {v['tokens']:,}" for k, v in sorted(m["domains"].items()))
        print(f"{args.corpus_dir}: {m['tokens']:,} tokens, {m['documents']:,} documents ({m['skipped_empty']} empty "
              f"skipped) in {len(m['shards'])} shards, {m['dtype']}, vocabulary {m['tokenizer']['vocab_size']:,}; "
              f"per domain: {doms}")
        print(f"train on it: marin-ablate run STUDY --data.corpus={args.corpus_dir} --data.eval_dir=EVAL_DIR "
              "(a Paloma-layout directory)")
    return 0
