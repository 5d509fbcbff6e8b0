"""`marin-ablate data prepare SOURCE --tokenizer PATH --out DIR`: tokenize a corpus once into token
shards with a manifest (marin/data/prepare.py); a study then trains on it with
`--set data.corpus=DIR`. Interrupted, the same command resumes: finished shards are kept."""

from __future__ import annotations

import argparse


def data_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("prepare", help="tokenize SOURCE into memory-mapped token shards under --out")
    p.add_argument("source", metavar="SOURCE",
                   help="a local jsonl/json[.gz]/parquet/arrow file or directory, a save_to_disk directory, "
                        "or a hub dataset name already in the HF cache")
    p.add_argument("--tokenizer", required=True, metavar="PATH", help="a tokenizer.json file, or 'byte'")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (manifest.json, shards/)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--domain-column", default=None, help="a column naming each document's domain (optional)")
    p.add_argument("--num-proc", type=int, default=1, help="worker processes, one shard at a time each")
    p.add_argument("--docs-per-shard", type=int, default=50_000)
    p.add_argument("--split", default="train", help="split of a hub dataset")


def cmd_data(args: argparse.Namespace) -> int:
    from marin.data.prepare import PrepareConfig, prepare

    cfg = PrepareConfig(source=args.source, tokenizer=args.tokenizer, out=args.out, text_column=args.text_column,
                        domain_column=args.domain_column, num_proc=args.num_proc,
                        docs_per_shard=args.docs_per_shard, split=args.split)
    m = prepare(cfg, log=print)
    doms = ", ".join(f"{k or '(none)'} {v['tokens']:,}" for k, v in sorted(m["domains"].items()))
    print(f"{args.out}: {m['tokens']:,} tokens, {m['documents']:,} documents ({m['skipped_empty']} empty skipped) "
          f"in {len(m['shards'])} shards, {m['dtype']}; per domain: {doms}")
    print(f"train on it: marin-ablate run STUDY --set data.corpus={args.out} --set data.eval_dir=EVAL_DIR "
          "(a Paloma-layout directory)")
    return 0
