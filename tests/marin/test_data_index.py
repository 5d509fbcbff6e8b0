"""The loader index (marin/data/index.py): a rank opens a corpus at a cost flat in its size, every
epoch reads every window once, and plan refuses what a rank could not hold."""

import json
import tracemalloc

import numpy as np
import pytest

from marin_ablate.marin.config import MixturePhase
from marin_ablate.marin.data.index import IndexedCorpus, IndexedStream, _round_keys, build_index, feistel, read_index
from marin_ablate.marin.data.shards import PreparedCorpus, ShardedBatches
from marin_ablate.marin.data.synthetic import write_synthetic_corpus


@pytest.fixture(scope="module")
def three_domains(tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "c"
    write_synthetic_corpus(out, 3_000, max_len=40, docs_per_shard=700, domains=("a", "b", "c"), seed=3)
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 4097])
def test_feistel_is_a_permutation_of_every_size(n):
    out = feistel(np.arange(n), n, _round_keys(5, 0, "t"))
    assert sorted(out.tolist()) == list(range(n))
    if n > 6:
        assert out.tolist() != list(range(n))
        assert out.tolist() != feistel(np.arange(n), n, _round_keys(5, 1, "t")).tolist()


def _documents(tokens, docs):
    return sorted(tuple(x.tolist()) for x in np.split(tokens, np.flatnonzero(np.diff(docs)) + 1))


def test_base_stream_holds_every_document_once_grouped_by_domain(three_domains):
    idx, plain = IndexedCorpus(three_domains), PreparedCorpus(three_domains)
    assert _documents(*idx.window(0, idx.n_tokens)) == sorted(tuple(plain.doc(j).tolist()) for j in range(plain.n_docs))
    names, dom_N = plain.doc_domains()
    assert idx.domains == names
    for d in range(len(names)):  # domain d is the slice [first[d], first[d+1]) of the base order
        a, b = idx.domain_first_doc[d], idx.domain_first_doc[d + 1]
        got = _documents(*idx.window(int(idx.cum[a]), int(idx.cum[b])))
        assert got == sorted(tuple(plain.doc(j).tolist()) for j in np.flatnonzero(dom_N == d))


def test_an_epoch_of_sequences_reads_every_window_once_in_its_own_order(three_domains):
    stream = IndexedStream(IndexedCorpus(three_domains), seed=0)
    S = 32
    n = stream.n_windows(S)
    e0, w0 = stream.window_ids(np.arange(n), S)
    e1, w1 = stream.window_ids(np.arange(n, 2 * n), S)
    assert set(e0.tolist()) == {0} and set(e1.tolist()) == {1}
    assert sorted(w0.tolist()) == list(range(n)) == sorted(w1.tolist())
    assert w0.tolist() != w1.tolist()
    tokens_RW, docs_RW = stream.rows(np.array([0, n + 3]), S)
    base, _ = stream.corpus.window(0, stream.n_tokens)
    assert tokens_RW[0].tolist() == base[w0[0] * S:w0[0] * S + S + 1].tolist()
    assert tokens_RW[1].tolist() == base[w1[3] * S:w1[3] * S + S + 1].tolist()
    assert docs_RW[1].min() >= stream.corpus.n_docs  # epoch 1's document keys differ from epoch 0's


def test_ranks_read_disjoint_parts_of_the_one_rank_batch_and_random_access_repeats(three_domains):
    c = IndexedCorpus(three_domains)
    whole = ShardedBatches(c, 32, 8, seed=1, rank=0, world=1).batch(5)
    parts = [ShardedBatches(c, 32, 8, seed=1, rank=r, world=4).batch(5) for r in range(4)]
    for k in range(3):
        assert np.array_equal(np.concatenate([p[k].numpy() for p in parts]), whole[k].numpy())
    again = ShardedBatches(c, 32, 8, seed=1, rank=0, world=1)
    assert np.array_equal(again.batch(5)[0].numpy(), whole[0].numpy())
    assert not np.array_equal(ShardedBatches(c, 32, 8, seed=2).batch(5)[0].numpy(), whole[0].numpy())
    state = again.state_dict()
    assert state["shuffle"] == "indexed"
    with pytest.raises(ValueError, match="shuffle"):
        ShardedBatches(PreparedCorpus(three_domains), 32, 8, seed=1).load_state_dict(state)


def test_a_mixture_on_the_index_reads_each_domain_from_its_own_slice(three_domains):
    c = IndexedCorpus(three_domains)
    loader = ShardedBatches(c, 32, 8, seed=0, mixture=(MixturePhase(0.0, (("b", 1.0),)),), total_steps=10)
    _, docs_BW = loader.windows(3)
    a, b = c.domain_first_doc[1], c.domain_first_doc[2]
    assert ((docs_BW % c.n_docs >= a) & (docs_BW % c.n_docs < b)).all()


def _first_batch_peak(root, indexed: bool) -> int:
    tracemalloc.start()
    corpus = IndexedCorpus(root) if indexed else PreparedCorpus(root)
    ShardedBatches(corpus, 64, 704 * 2, seed=0, rank=0, world=704).batch(0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_a_rank_index_memory_does_not_grow_with_the_corpus(tmp_path):
    """Opened as rank 0 of 704, the indexed loader's traced allocations to its first batch are the
    same within 64 KiB for 2,000 and 200,000 documents; the documents shuffle's grow ~100x."""
    small, large = tmp_path / "s", tmp_path / "l"
    write_synthetic_corpus(small, 2_000, max_len=100, seed=1)
    write_synthetic_corpus(large, 200_000, max_len=100, seed=1, docs_per_shard=50_000)
    grow_indexed = _first_batch_peak(large, True) - _first_batch_peak(small, True)
    grow_documents = _first_batch_peak(large, False) - _first_batch_peak(small, False)
    assert grow_indexed < 64 << 10, grow_indexed
    assert grow_documents > 10 << 20, grow_documents  # the comparison is real: ~100 bytes per document


def test_a_rank_maps_no_corpus_file_and_its_reads_bring_in_about_a_page_per_document_piece(tmp_path):
    """File-backed pages: the indexed loader reads the index and the shards by position, so no corpus file is
    mapped into the rank (a map's faults brought whole page-cache folios in: its file-backed RSS grew with the
    corpus, benchmarks/RESULTS.md "Loader at web scale, file-backed pages"), and, from a cold page cache, what its
    reads bring in (its cgroup's charge) is at most 2 pages per document piece plus the binary searches' pages."""
    import math
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmod import bench

    b = bench("bench_loader_scale")
    root = tmp_path / "c"
    n = 200_000
    write_synthetic_corpus(root, n, max_len=100, seed=2, docs_per_shard=50_000)
    b._drop_cache(root)
    evicted = b.cached_bytes(root) == 0  # a tmpfs keeps its pages: the charge bound is then not measurable
    sb = ShardedBatches(IndexedCorpus(root), 512, 64 * 8, seed=0, rank=3, world=64)
    pieces = 0
    for step in range(4):
        _, _, docs = sb.batch(step)
        pieces += int((docs.max(dim=1).values + 1).sum())
    maps = open("/proc/self/maps").read()
    assert str(root) not in maps, [x for x in maps.splitlines() if str(root) in x][:3]
    if evicted:
        rows = 4 * 8
        search_pages = rows * 2 * (math.ceil(math.log2(n / 512)) + 2)
        assert b.cached_bytes(root) <= (2 * pieces + search_pages + 4) * 4096, (b.cached_bytes(root), pieces)


def test_a_missing_or_stale_index_names_the_command_that_writes_it(tmp_path):
    root = tmp_path / "c"
    write_synthetic_corpus(root, 100, index=False)
    with pytest.raises(ValueError, match="marin-ablate data index"):
        IndexedCorpus(root)
    build_index(root)
    assert read_index(root)["documents"] == 100
    m = json.loads((root / "manifest.json").read_text())
    m["source"]["seed"] = 99  # prepared again: another manifest
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="another manifest"):
        IndexedCorpus(root)


def test_plan_refuses_a_corpus_whose_per_rank_document_index_would_not_fit(tmp_path):
    from marin_ablate.ablations.epochs import DOC_INDEX_BYTES, HOST_LOADER_BUDGET_BYTES, check_epochs, epoch_rows

    root = tmp_path / "web"
    write_synthetic_corpus(root, 100)
    m = json.loads((root / "manifest.json").read_text())
    m["documents"] = 10**10  # a web-scale manifest: plan reads only the manifest
    (root / "manifest.json").write_text(json.dumps(m))
    rows = epoch_rows([("hero", "cuda", 10**6, 256, str(root), 0, "documents")])
    with pytest.raises(ValueError) as e:
        check_epochs(rows, allow_repeat=True)
    msg = str(e.value)
    assert "10,000,000,000 documents" in msg and "shuffle=indexed" in msg
    assert f"{10**10 * DOC_INDEX_BYTES / 1e9:,.1f} GB" in msg and f"{HOST_LOADER_BUDGET_BYTES / 1e9:,.1f} GB" in msg
    with pytest.raises(ValueError, match="another manifest"):  # indexed: the index must be this manifest's
        check_epochs(epoch_rows([("hero", "cuda", 10**6, 256, str(root), 0, "indexed")]), allow_repeat=True)


def test_an_indexed_run_resumed_mid_stream_equals_the_uninterrupted_run(tmp_path):
    """The real loop on the embedded corpus read through its loader index (written on first use): a run
    stopped at step 3 and resumed reads where it stopped and ends where the uninterrupted run ends."""
    from marin_ablate.marin.config import DataConfig, RunSpec, TrainConfig
    from marin_ablate.marin.presets import preset
    from marin_ablate.marin.train import train

    spec = RunSpec(model=preset("tiny", ["seq_len=64"]), data=DataConfig(shuffle="indexed"),
                   train=TrainConfig(steps=6, batch_size=2, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=3, threads=1))
    ref = train(spec, tmp_path / "ref")
    assert train(spec, tmp_path / "cut", stop_after=3)["status"] == "interrupted"
    resumed = train(spec, tmp_path / "cut")
    assert resumed["status"] == "completed" and resumed["loss_curve"] == ref["loss_curve"]
    documents = train(RunSpec(model=spec.model, train=spec.train), tmp_path / "documents")
    assert documents["loss_curve"] != ref["loss_curve"]  # another order of the same corpus


def _damage(root, what: str) -> str:
    """Damage one file of `root`'s loader index as a careless collaborator would; returns the file's name."""
    d = root / "index"
    if what == "negative src offset":
        src = np.load(d / "src.npy")
        src[7] = -3
        np.save(d / "src.npy", src)
        return "src.npy"
    if what == "cum jump":
        cum = np.load(d / "cum.npy")
        cum[5] = 10**15
        np.save(d / "cum.npy", cum)
        return "cum.npy"
    if what == "truncated cum":
        raw = (d / "cum.npy").read_bytes()
        (d / "cum.npy").write_bytes(raw[:len(raw) // 2])
        return "cum.npy"
    if what == "object src":
        np.save(d / "src.npy", np.array([{"a": 1}] * 10, dtype=object), allow_pickle=True)
        return "src.npy"
    if what == "garbage index.json":
        (d / "index.json").write_text("{garbage")
        return "index.json"
    if what == "missing shards":
        (d / "shards.npy").unlink()
        return "shards.npy"
    raise AssertionError(what)


DAMAGE = ("negative src offset", "cum jump", "truncated cum", "object src", "garbage index.json", "missing shards")


@pytest.mark.parametrize("what", DAMAGE)
def test_a_damaged_index_file_is_refused_when_opened_naming_the_file(tmp_path, what):
    root = tmp_path / "c"
    write_synthetic_corpus(root, 300, max_len=20)
    name = _damage(root, what)
    with pytest.raises(ValueError) as e:
        IndexedCorpus(root)
    msg = str(e.value)
    assert msg.startswith(str(root / "index" / name)) and f"marin-ablate data index {root}" in msg, msg


@pytest.mark.parametrize("what, why", [
    ("negative src offset", "src.npy: document 7 starts at shard offset -3; allowed values: offsets in 0.."),
    ("cum jump", "cum.npy: token offsets decrease at document 5 (1000000000000000 -> "),
])
def test_index_invariants_hold_even_when_index_json_was_rehashed_to_match(tmp_path, what, why):
    from marin_ablate.marin.schema import sha256_file

    root = tmp_path / "c"
    write_synthetic_corpus(root, 300, max_len=20)
    name = _damage(root, what)
    meta = json.loads((root / "index" / "index.json").read_text())
    p = root / "index" / name
    meta["files"][name] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    (root / "index" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as e:
        IndexedCorpus(root)
    assert why in str(e.value), str(e.value)


def test_index_json_records_each_arrays_size_and_sha256(tmp_path):
    import hashlib

    root = tmp_path / "c"
    write_synthetic_corpus(root, 300, max_len=20)
    files = json.loads((root / "index" / "index.json").read_text())["files"]
    for name in ("cum.npy", "src.npy", "shards.npy"):
        raw = (root / "index" / name).read_bytes()
        assert files[name] == {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    assert sorted(p.name for p in (root / "index").iterdir()) == ["cum.npy", "index.json", "shards.npy", "src.npy"]


def test_an_index_written_before_checksums_is_written_again_on_first_use(tmp_path):
    """A v1 index (no checksums) is refused naming `data index`; the embedded corpus's cache rebuilds its own."""
    from marin_ablate.marin.data.index import has_index

    root = tmp_path / "c"
    write_synthetic_corpus(root, 300, max_len=20)
    meta = json.loads((root / "index" / "index.json").read_text())
    meta["format"] = "marin-index-v1"
    del meta["files"]
    (root / "index" / "index.json").write_text(json.dumps(meta))
    assert not has_index(root)
    with pytest.raises(ValueError, match=r"not a marin-index-v2 index \(format 'marin-index-v1'\); write it again"):
        IndexedCorpus(root)
    build_index(root)
    assert IndexedCorpus(root).n_docs == 300
