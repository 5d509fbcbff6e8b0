"""python -m marin_ablate.marin.data: build the embedded corpus and print its summary."""

from marin_ablate.marin.config import DataConfig
from marin_ablate.marin.data import describe, embedded_corpus_dir, load_corpus

print(embedded_corpus_dir())
print(describe(load_corpus(DataConfig())))
