"""Data: the embedded multi-domain corpus, tokenizers, packing with document ids, eval domains.

docs/architecture.md ("Data"). Everything here runs offline: the embedded corpus is built at first use
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

Modules: `corpus` (the embedded corpus builder), `tokenizer`, `loading` (HF datasets, one path),
`packing` (train stream and eval batches).
"""

from marin.data.corpus import (
    EMBEDDED_VERSION,
    HELDOUT_CAP_BYTES,
    HELDOUT_EVERY,
    IGNORE_INDEX,
    SPLITS,
    TRAIN_CAP_BYTES,
    _sha256_file,
    data_cache_dir,
    embedded_corpus_dir,
    heldout_of,
    paloma_search_paths,
    verify_manifest,
)
from marin.data.loading import Corpus, DomainSplit, clear_corpus_cache, find_paloma, get_tokenizer, load_corpus
from marin.data.packing import PackedBatches, bytes_per_token, describe, eval_batches
from marin.data.tokenizer import BPE_SAMPLE_BYTES_PER_DOMAIN, BPETokenizer, ByteTokenizer, Tokenizer, train_bpe

__all__ = [
    "BPE_SAMPLE_BYTES_PER_DOMAIN", "BPETokenizer", "ByteTokenizer", "Corpus", "DomainSplit", "EMBEDDED_VERSION",
    "HELDOUT_CAP_BYTES", "HELDOUT_EVERY", "IGNORE_INDEX", "PackedBatches", "SPLITS", "TRAIN_CAP_BYTES", "Tokenizer",
    "bytes_per_token", "clear_corpus_cache", "data_cache_dir", "describe", "embedded_corpus_dir", "eval_batches",
    "find_paloma", "get_tokenizer", "heldout_of", "load_corpus", "paloma_search_paths", "train_bpe",
    "verify_manifest",
]
