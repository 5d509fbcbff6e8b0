"""`marin-ablate data prepare SOURCE --tokenizer SPEC --out DIR`: tokenize a corpus once into token
shards with a manifest (marin/data/prepare.py); a study then trains on it with
`--set data.corpus=DIR`. Interrupted, the same command resumes: finished shards are kept.
`marin-ablate data verify DIR` checks every shard against the manifest's sha256."""

from __future__ import annotations

import argparse


def data_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("prepare", help="tokenize SOURCE into memory-mapped token shards under --out")
    p.add_argument("source", metavar="SOURCE",
                   help="a local txt/md/jsonl/json[.gz]/parquet/arrow file or folder (every such file under it), a "
                        "save_to_disk directory, or a hub dataset name already in the HF cache")
    p.add_argument("--tokenizer", required=True, metavar="SPEC",
                   help="'byte', a tokenizer.json file, 'bpe:VOCAB' (a byte-level BPE trained on SOURCE, saved as "
                        "OUT/tokenizer.json) or 'pkg:DISTRIBUTION/PATH' "
                        "(a tokenizer.json shipped by an installed package)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (manifest.json, shards/)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--domain-column", default=None, help="a column naming each document's domain (optional)")
    p.add_argument("--folder-domains", action="store_true",
                   help="each file's domain is its first folder under SOURCE (SOURCE/DOMAIN/...)")
    p.add_argument("--id-column", default=None, help="a column of document ids: the shuffle keys on them (optional)")
    p.add_argument("--num-proc", type=int, default=1, help="worker processes, one shard at a time each")
    p.add_argument("--docs-per-shard", type=int, default=50_000)
    p.add_argument("--split", default="train", help="split of a hub dataset")
    v = sub.add_parser("verify", help="check a prepared corpus' shards against its manifest (sizes, sha256, ids)")
    v.add_argument("corpus", metavar="DIR")


def cmd_data(args: argparse.Namespace) -> int:
    if args.action == "verify":
        from marin.data.shards import verify_corpus

        m = verify_corpus(args.corpus, full=True)
        print(f"{args.corpus}: {len(m['shards'])} shards, {m['tokens']:,} tokens match manifest.json (sha256)")
        return 0
    from marin.data.prepare import PrepareConfig, prepare

    cfg = PrepareConfig(source=args.source, tokenizer=args.tokenizer, out=args.out, text_column=args.text_column,
                        domain_column=args.domain_column, folder_domains=args.folder_domains,
                        id_column=args.id_column, num_proc=args.num_proc, docs_per_shard=args.docs_per_shard,
                        split=args.split)
    m = prepare(cfg, log=lambda line: print(line, flush=True))
    doms = ", ".join(f"{k or '(none)'} {v['tokens']:,}" for k, v in sorted(m["domains"].items()))
    tok = m["tokenizer"]
    print(f"{args.out}: {m['tokens']:,} tokens, {m['documents']:,} documents ({m['skipped_empty']} empty skipped) "
          f"in {len(m['shards'])} shards, {m['dtype']}, vocabulary {tok['vocab_size']:,}; per domain: {doms}")
    print(f"train on it: marin-ablate run STUDY --set data.corpus={args.out} --set data.eval_dir=EVAL_DIR "
          "(a Paloma-layout directory)")
    return 0
