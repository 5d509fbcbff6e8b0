"""Real pretraining corpora: tokenize once into memory-mapped shards (prepare), read them from many
data-parallel ranks (loader), and evaluate on Paloma-layout domain directories (eval).

`prepare` imports neither torch nor marin.data, so `marin-ablate data prepare` and its worker
processes stay light; `loader` and `eval` reuse marin.data's packer so batches have the same shape,
targets and document ids as the embedded corpus's.
"""
