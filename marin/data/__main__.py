"""python -m marin.data: build the embedded corpus and print its summary."""

from marin.config import DataConfig
from marin.data import describe, embedded_corpus_dir, load_corpus

print(embedded_corpus_dir())
print(describe(load_corpus(DataConfig())))
