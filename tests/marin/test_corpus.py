"""marin/data prepare + shards + eval: prepare a real corpus into token shards (parallel, resumable), read it from
2 gloo ranks (disjoint, covering, resumable by content), and evaluate on a Paloma-layout directory."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
from ranks import free_port, run_ranks

from marin_ablate.marin import data
from marin_ablate.marin.data import prepare as prep
from marin_ablate.marin.data.eval import eval_domains, tokenizer_of
from marin_ablate.marin.data.loading import load_eval_corpus
from marin_ablate.marin.data.shards import PreparedCorpus, ShardedBatches
from marin_ablate.marin.data.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
DOCS_PER_DOMAIN = 60
DOCS_PER_SHARD = 25


@pytest.fixture(scope="module")
def rows():
    """(domain, text) documents of the embedded corpus, the first DOCS_PER_DOMAIN of each domain."""
    root = data.embedded_corpus_dir()
    out = []
    for domain in ("code", "docs", "prose"):
        lines = (root / domain / "train.jsonl").read_text().splitlines()[:DOCS_PER_DOMAIN]
        out += [(domain, json.loads(x)["text"]) for x in lines]
    return out


@pytest.fixture(scope="module")
def tokenizer_json(rows, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    data.train_bpe((t for _, t in rows), 512, path)
    return path


@pytest.fixture(scope="module")
def source(rows, tmp_path_factory):
    """The rows split into a jsonl file and a parquet file (sorted names: a.jsonl first), plus one
    empty document that preparation must skip."""
    d = tmp_path_factory.mktemp("src")
    half = len(rows) // 2
    with open(d / "a.jsonl", "w") as f:
        for dom, text in rows[:half]:
            f.write(json.dumps({"body": text, "source": dom}) + "\n")
        f.write(json.dumps({"body": "", "source": "prose"}) + "\n")
    pq.write_table(pa.table({"body": [t for _, t in rows[half:]], "source": [dm for dm, _ in rows[half:]]}),
                   d / "b.parquet")
    return d


def _reference(rows, tokenizer_json):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    return [np.asarray(tok.encode(t).ids, np.int64) for _, t in rows]


@pytest.fixture(scope="module")
def prepared(source, tokenizer_json, tmp_path_factory):
    """Prepared with 2 workers: first a time-boxed call (2 shards), then a 'killed' shard left half
    written, then a resuming call that finishes. Returns (out dir, mtimes of the first 2 metas)."""
    out = tmp_path_factory.mktemp("prepared")
    cfg = prep.PrepareConfig(source=str(source), tokenizer=str(tokenizer_json), out=str(out), text_column="body",
                             domain_column="source", num_proc=2, docs_per_shard=DOCS_PER_SHARD)
    assert prep.prepare(cfg, shard_limit=2) is None
    done = sorted((out / "shards").glob("*.meta.json"))
    assert [p.name for p in done] == ["00000.meta.json", "00001.meta.json"]
    assert not (out / "manifest.json").exists()
    mtimes = {p.name: p.stat().st_mtime_ns for p in done}
    (out / "shards" / "00003.tokens.bin").write_bytes(b"\x01\x02\x03")  # a worker killed mid-shard
    manifest = prep.prepare(cfg)
    assert manifest is not None
    return out, mtimes, manifest


def test_prepare_resumes_without_redoing_finished_shards(prepared):
    out, mtimes, manifest = prepared
    for name, t in mtimes.items():
        assert (out / "shards" / name).stat().st_mtime_ns == t
    n_rows = 3 * DOCS_PER_DOMAIN + 1
    assert len(manifest["shards"]) == -(-n_rows // DOCS_PER_SHARD)
    assert not [p for p in (out / "shards").iterdir() if p.name.startswith(".")]  # no temp file left


def test_shards_equal_a_direct_tokenization(prepared, rows, tokenizer_json):
    out, _, manifest = prepared
    ref = _reference(rows, tokenizer_json)
    corpus = PreparedCorpus(out)
    assert corpus.n_docs == len(rows) and manifest["documents"] == len(rows)
    assert manifest["skipped_empty"] == 1
    assert manifest["dtype"] == "uint16"
    assert corpus.n_tokens == manifest["tokens"] == sum(len(r) for r in ref)
    for j in range(len(rows)):
        np.testing.assert_array_equal(corpus.doc(j), ref[j])
    by_domain = {d: sum(len(ref[j]) for j, (dm, _) in enumerate(rows) if dm == d) for d in ("code", "docs", "prose")}
    assert {d: v["tokens"] for d, v in manifest["domains"].items()} == by_domain
    assert manifest["text_bytes"] == sum(len(t.encode()) for _, t in rows)


def test_manifest_records_source_files_and_tokenizer_by_sha256(prepared, source, tokenizer_json):
    _, _, manifest = prepared
    files = {f["path"]: f["sha256"] for f in manifest["source"]["files"]}
    assert files == {n: prep.sha256_file(source / n) for n in ("a.jsonl", "b.parquet")}
    assert manifest["tokenizer"]["sha256"] == prep.sha256_file(tokenizer_json)
    assert manifest["tokenizer"]["vocab_size"] == 512
    for sh in manifest["shards"]:
        assert prep.sha256_file(prepared[0] / sh["tokens_path"]) == sh["sha256"]


def test_prepare_refuses_an_out_dir_of_other_inputs_and_names_bad_columns(prepared, source, tokenizer_json):
    out = prepared[0]
    other = prep.PrepareConfig(source=str(source), tokenizer="byte", out=str(out), text_column="body")
    with pytest.raises(ValueError, match="different inputs.*tokenizer"):
        prep.prepare(other)
    bad = prep.PrepareConfig(source=str(source), tokenizer="byte", out=str(out) + "-x", text_column="text")
    with pytest.raises(ValueError, match=r"text_column='text' is not a column.*body"):
        prep.prepare(bad)
    with pytest.raises(ValueError, match="num_proc"):
        prep.PrepareConfig(source="x", tokenizer="byte", out="y", num_proc=0)


# ---------------------------------------------------------------------------------------------
# Loader
# ---------------------------------------------------------------------------------------------

SEQ, GLOBAL_B, SEED = 32, 4, 7


def _stream(corpus: PreparedCorpus, order: np.ndarray) -> np.ndarray:
    """Independent reference: the documents in `order`, concatenated one by one."""
    return np.concatenate([corpus.doc(int(j)) for j in order])


def test_single_rank_batches_are_the_shuffled_document_stream(prepared):
    corpus = PreparedCorpus(prepared[0])
    b = ShardedBatches(corpus, SEQ, GLOBAL_B, SEED, rank=0, world=1)
    stream = _stream(corpus, b.order(0))
    assert sorted(b.order(0)) == list(range(corpus.n_docs)) and list(b.order(0)) != list(range(corpus.n_docs))
    starts = set(np.cumsum(corpus.doc_lengths[b.order(0)]).tolist())  # stream positions where a document starts
    masked = 0
    for step in range(12):
        tokens, targets, doc_ids = b.batch(step)
        for i in range(GLOBAL_B):
            j = step * GLOBAL_B + i
            np.testing.assert_array_equal(tokens[i].numpy(), stream[j * SEQ:(j + 1) * SEQ])
            # a target is masked exactly where the next token starts another document
            boundary = np.array([(j * SEQ + t + 1) in starts for t in range(SEQ)])
            np.testing.assert_array_equal(targets[i].numpy() == data.IGNORE_INDEX, boundary)
            np.testing.assert_array_equal(doc_ids[i].numpy(), np.concatenate([[0], np.cumsum(boundary[:-1])]))
            masked += boundary.sum()
    assert masked > 0
    assert ShardedBatches(corpus, SEQ, GLOBAL_B, SEED + 1, 0, 1).batch(0)[0].tolist() != b.batch(0)[0].tolist()



def _rank_reader(rank: int, port: int, path: str, n_steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        loader = ShardedBatches(path, SEQ, GLOBAL_B, SEED)  # rank and world from torch.distributed
        seqs = []
        for _ in range(n_steps):
            tokens, _, _ = next(loader)
            seqs.append(tokens)
        gathered = [None, None]
        dist.all_gather_object(gathered, (loader.rank, loader.world, torch.stack(seqs).tolist()))
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two gloo ranks
def test_two_gloo_ranks_read_disjoint_slices_that_cover_the_stream(prepared, tmp_path):
    corpus = PreparedCorpus(prepared[0])
    n_steps = corpus.n_tokens // (GLOBAL_B * SEQ)  # one epoch, whole steps
    out = tmp_path / "ranks.json"
    run_ranks(_rank_reader, (free_port(), str(prepared[0]), n_steps, str(out)), 2, timeout_s=120)
    (r0, w0, seqs0), (r1, w1, seqs1) = json.loads(out.read_text())
    assert (r0, w0, r1, w1) == (0, 2, 1, 2)
    stream = _stream(corpus, ShardedBatches(corpus, SEQ, GLOBAL_B, SEED, 0, 1).order(0))
    read = []
    for step in range(n_steps):  # sequence order: step-major, rank 0's half then rank 1's
        read += seqs0[step] + seqs1[step]
    flat = np.array(read).reshape(-1)
    assert len(flat) == n_steps * GLOBAL_B * SEQ > 0.9 * corpus.n_tokens
    np.testing.assert_array_equal(flat, stream[:len(flat)])  # disjoint, in order, nothing skipped


def test_resumed_loader_continues_at_the_exact_next_token(prepared):
    b = ShardedBatches(prepared[0], SEQ, GLOBAL_B, SEED, rank=1, world=2)
    for _ in range(5):
        last = next(b)[0]
    state = json.loads(json.dumps(b.state_dict()))  # what a checkpoint stores
    after = next(b)[0]
    resumed = ShardedBatches(prepared[0], SEQ, GLOBAL_B, SEED, rank=1, world=2)
    resumed.load_state_dict(state)
    got = next(resumed)[0]
    assert torch.equal(got, after)
    # by content: rank 1's next sequence starts where the single-rank stream places it
    single = ShardedBatches(prepared[0], SEQ, GLOBAL_B, SEED, rank=0, world=1)
    stream = _stream(single.corpus, single.order(0))
    j = 5 * GLOBAL_B + GLOBAL_B // 2
    np.testing.assert_array_equal(got[0].numpy(), stream[j * SEQ:(j + 1) * SEQ])
    assert last[-1, -1] == stream[(j - GLOBAL_B // 2 - 1) * SEQ + SEQ - 1]
    with pytest.raises(ValueError, match="seed"):
        ShardedBatches(prepared[0], SEQ, GLOBAL_B, SEED + 1, 1, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch=3 must be a multiple"):
        ShardedBatches(prepared[0], SEQ, 3, SEED, 0, 2)


def test_batches_cross_epochs_with_a_fresh_order(prepared):
    b = ShardedBatches(prepared[0], SEQ, GLOBAL_B, SEED, 0, 1)
    assert list(b.order(0)) != list(b.order(1))
    step = b.tokens_per_epoch // b.tokens_per_step + 1  # wholly in epoch 1
    off = step * b.tokens_per_step - b.tokens_per_epoch
    stream1 = _stream(b.corpus, b.order(1))
    np.testing.assert_array_equal(b.batch(step)[0][0].numpy(), stream1[off:off + SEQ])


# ---------------------------------------------------------------------------------------------
# Paloma-layout eval sets
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paloma_dir(rows, tmp_path_factory):
    import gzip

    root = tmp_path_factory.mktemp("paloma")
    for dom in ("code", "docs", "prose"):
        texts = [t for d, t in rows if d == dom][:20]
        (root / dom / "val").mkdir(parents=True)
        (root / dom / "test").mkdir()
        with gzip.open(root / dom / "val" / "val_0.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        (root / dom / "test" / "test_0.jsonl").write_text(json.dumps({"text": "not the val split"}) + "\n")
    return root


def test_paloma_layout_eval_corpus_gives_eval_batches_and_bytes_per_token(paloma_dir, prepared, rows):
    tok = tokenizer_of(prepared[0])
    assert eval_domains(paloma_dir) == {d: paloma_dir / d / "val" for d in ("code", "docs", "prose")}
    ev = load_eval_corpus(paloma_dir, tok)
    assert ev.domains == ["code", "docs", "prose"]
    for dom in ev.domains:
        texts = [t for d, t in rows if d == dom][:20]
        ref = np.concatenate([tok.encode(t) for t in texts])
        np.testing.assert_array_equal(ev.heldout[dom].tokens, ref)
        assert data.bytes_per_token(ev, dom) == sum(len(t.encode()) for t in texts) / len(ref)
        batches = data.eval_batches(ev, dom, 16, 2, 3)
        np.testing.assert_array_equal(batches[0][0][0].numpy(), ref[:16])
    assert load_eval_corpus(paloma_dir, load_tokenizer("byte"), domains=("docs",)).domains == ["docs"]
    with pytest.raises(ValueError, match="allowed values: code, docs, prose"):
        load_eval_corpus(paloma_dir, tok, domains=("c4_en",))


# ---------------------------------------------------------------------------------------------
# `data prepare` and plan-time epoch accounting
# ---------------------------------------------------------------------------------------------


def test_data_prepare_cli_writes_the_same_shards(source, tokenizer_json, prepared, tmp_path, capsys):
    from marin_ablate.cli.main import main

    out = tmp_path / "cli"
    rc = main(["data", "prepare", str(source), "--tokenizer", str(tokenizer_json), "--corpus-dir", str(out),
               "--text-column", "body", "--domain-column", "source", "--docs-per-shard", str(DOCS_PER_SHARD)])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in prepared[2]["shards"]]
    assert f"--data.corpus={out}" in capsys.readouterr().out
    assert main(["data", "prepare", str(source), "--tokenizer", str(tmp_path / "none.json"),
                 "--corpus-dir", str(out)]) == 2


def _fake_prepared(path: Path, tokens: int, vocab: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({"format": prep.FORMAT, "tokens": tokens, "dtype": "uint16",
                                                    "documents": 1, "shards": [],
                                                    "tokenizer": {"vocab_size": vocab}}))
    return path


def test_plan_refuses_the_embedded_corpus_for_gpu_rungs_naming_the_setting(capsys):
    from marin_ablate.cli.main import main

    assert main(["plan", "marin535"]) == 2
    err = capsys.readouterr().err
    assert "data.corpus='embedded'" in err and "--data.corpus=DIR" in err and "data prepare" in err


def test_plan_shows_tokens_corpus_size_and_epochs_per_rung(tmp_path, capsys):
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.cli.main import main

    rungs = {r["name"]: r["tokens"] for r in get_study("marin535").describe()["rungs"]}
    big = _fake_prepared(tmp_path / "big", 2 * max(rungs.values()), 16384)
    (tmp_path / "eval" / "web" / "val").mkdir(parents=True)  # a prepared corpus needs an eval_dir (as `train` does)
    ev = [f"--data.eval_dir={tmp_path / 'eval'}"]
    assert main(["plan", "marin535", "--json", f"--data.corpus={big}", *ev]) == 0
    rows = json.loads(capsys.readouterr().out)["epochs"]
    assert [(r["rung"], r["tokens_needed"], r["corpus_tokens"]) for r in rows] == \
        [(k, v, 2 * max(rungs.values())) for k, v in rungs.items()]
    assert [r["epochs"] for r in rows] == [v / (2 * max(rungs.values())) for v in rungs.values()]
    assert main(["plan", "marin535", f"--data.corpus={big}", *ev]) == 0
    text = capsys.readouterr().out
    assert "tokens_needed" in text and f"{2 * max(rungs.values()):,}" in text

    small = _fake_prepared(tmp_path / "small", rungs["d768"], 16384)  # d1024 would repeat it
    assert main(["plan", "marin535", f"--data.corpus={small}"]) == 2
    err = capsys.readouterr().err
    assert rungs["d1024"] > rungs["d768"]
    assert "rung d1024" in err and f"{rungs['d1024'] / rungs['d768']:.2f} epochs" in err and "--allow-repeat" in err
    assert main(["plan", "marin535", "--json", "--allow-repeat", f"--data.corpus={small}", *ev]) == 0
    assert json.loads(capsys.readouterr().out)["epochs"][2]["epochs"] == rungs["d1024"] / rungs["d768"]
    wide = _fake_prepared(tmp_path / "wide", 10 ** 12, 128256)
    assert main(["plan", "marin535", f"--data.corpus={wide}"]) == 2
    assert "vocabulary of 128256, more than model.vocab_size=16384" in capsys.readouterr().err


def test_plan_refuses_a_corpus_whose_manifest_is_unreadable_or_of_another_format(tmp_path, capsys):
    from marin_ablate.cli.main import main

    bad = tmp_path / "bad"
    bad.mkdir()
    for text, says in (("{not json", "not a readable JSON file"), ('{"format": "other"}', "format 'other' is not")):
        (bad / "manifest.json").write_text(text)
        assert main(["plan", "marin535", f"--data.corpus={bad}"]) == 2
        err = capsys.readouterr().err
        assert says in err and "prepare the corpus again" in err


# ---------------------------------------------------------------------------------------------
# Through the trainer: 2 gloo ranks, resume by content, the `train` progress line, a tiny study
# ---------------------------------------------------------------------------------------------

TRAIN_SEQ, TRAIN_B = 64, 4


def _train_spec(prepared_dir: Path, paloma: Path, steps: int = 4):
    from marin_ablate.marin.config import DataConfig, Recipe, RunSpec, TrainConfig
    from marin_ablate.marin.presets import preset

    # ep_shards=2 with qb_estimator=hist: 2 ranks are the EP shards of one replica, each with 2 rows
    return RunSpec(model=preset("tiny", [f"seq_len={TRAIN_SEQ}", "vocab_size=512", "ep_shards=2",
                                         "qb_estimator=hist"]),
                   recipe=Recipe(ep_transport="ragged"),
                   train=TrainConfig(steps=steps, batch_size=TRAIN_B, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=2, threads=1),
                   data=DataConfig(corpus=str(prepared_dir), eval_dir=str(paloma), data_seed=SEED))


def _train_rank(rank: int, ports: list[int], spec, tmp: str) -> None:
    import traceback

    from marin_ablate.marin.train import train

    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    seen: list = []
    real = ShardedBatches.batch

    def spy(self, step):  # records what this rank's real loader gave the trainer (forked: this process only)
        out = real(self, step)
        seen.append([step, out[0].tolist()])
        return out

    ShardedBatches.batch = spy
    out: dict = {}
    try:
        for name, port, kw in (("full", ports[0], {"resume": False}),
                               ("cut", ports[1], {"resume": False, "stop_after": 2}), ("resumed", ports[2], {})):
            os.environ["MASTER_PORT"] = str(port)
            seen.clear()
            summary = train(spec, Path(tmp) / ("full" if name == "full" else "cut"), **kw)
            out[name] = {"summary": summary, "read": list(seen)}
    except Exception:
        out["error"] = traceback.format_exc()
    (Path(tmp) / f"r{rank}.json").write_text(json.dumps(out))


@pytest.mark.slow
def test_two_gloo_ranks_train_on_disjoint_slices_and_a_resume_continues_at_the_next_token(prepared, paloma_dir,
                                                                                          tmp_path):
    spec = _train_spec(prepared[0], paloma_dir)
    run_ranks(_train_rank, ([free_port() for _ in range(3)], spec, str(tmp_path)), 2, timeout_s=150)
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1))
    assert "error" not in r0 and "error" not in r1, (r0.get("error"), r1.get("error"))
    corpus = PreparedCorpus(prepared[0])
    stream = _stream(corpus, ShardedBatches(corpus, TRAIN_SEQ, TRAIN_B, SEED, 0, 1).order(0))
    half = TRAIN_B // 2

    def seqs(step: int, rank: int) -> list:  # the reference: rank r's rows are its half of the step's sequences
        j0 = step * TRAIN_B + rank * half
        return [stream[j * TRAIN_SEQ:(j + 1) * TRAIN_SEQ].tolist() for j in range(j0, j0 + half)]

    for rank, r in enumerate((r0, r1)):
        assert [s for s, _ in r["full"]["read"]] == [0, 1, 2, 3]
        for step, tokens in r["full"]["read"]:
            assert tokens == seqs(step, rank)  # disjoint halves, together the stream in order
        assert [s for s, _ in r["cut"]["read"]] == [0, 1] and r["cut"]["summary"]["status"] == "interrupted"
        assert r["resumed"]["read"] == r["full"]["read"][2:]  # the exact next sequences, by content
    full, resumed = r0["full"]["summary"], r0["resumed"]["summary"]
    assert resumed["status"] == "completed" and resumed["tokens"] == full["tokens"] == 4 * TRAIN_B * TRAIN_SEQ
    # the same tokens give the same loss; 1e-4: a 2-rank EP resume drifts by ~3e-5 on the embedded corpus too
    assert resumed["final_train_loss"] == pytest.approx(full["final_train_loss"], abs=1e-4)
    assert sorted(full["eval_domain_loss"]) == ["code", "docs", "prose"] and math.isfinite(full["macro_bpb"])
    assert full["data"]["eval_dir"] == str(paloma_dir.resolve()) and full["data"]["corpus_tokens"] == corpus.n_tokens
    # the resumed run's final checkpoint (kept by default; the interrupt's step-2 one is pruned) records where
    # the loader stands
    loop = json.loads((tmp_path / "cut" / "checkpoints" / "ckpt_000000004" / "meta.json").read_text())["loop"]
    assert loop["data"] == {"step": 4, "seed": SEED, "seq_len": TRAIN_SEQ, "global_batch": TRAIN_B,
                            "corpus": corpus.fingerprint}


def test_a_prepared_corpus_run_validates_eval_dir_and_vocabulary(prepared, paloma_dir, tmp_path):
    from marin_ablate.marin.train import train

    spec = _train_spec(prepared[0], paloma_dir, steps=1)
    no_eval = dataclasses.replace(spec, data=dataclasses.replace(spec.data, eval_dir=""))
    with pytest.raises(ValueError, match="DataConfig.eval_dir is empty.*prepared corpus"):
        train(no_eval, tmp_path / "a")
    missing = dataclasses.replace(spec, data=dataclasses.replace(spec.data, eval_dir=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="DataConfig.eval_dir=.*no such directory"):
        train(missing, tmp_path / "b")
    bad_dom = dataclasses.replace(spec, data=dataclasses.replace(spec.data, eval_domains=("c4_en",)))
    with pytest.raises(ValueError, match="DataConfig.eval_domains.*allowed values: code, docs, prose"):
        train(bad_dom, tmp_path / "c")
    small = dataclasses.replace(spec, model=dataclasses.replace(spec.model, vocab_size=256))
    with pytest.raises(ValueError, match=r"ModelConfig.vocab_size=256 is smaller.*\(512"):
        train(small, tmp_path / "d")


@pytest.mark.slow
def test_train_prints_one_progress_line_per_logged_step(prepared, paloma_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "marin_ablate", "train", "--preset", "tiny", f"--model.seq_len={TRAIN_SEQ}",
           "--model.vocab_size=512", f"--data.corpus={prepared[0]}",
           f"--data.eval_dir={paloma_dir}", "--train.steps", "3", "--train.batch_size=2", "--train.eval_every=0",
           "--train.eval_batches=1", "--train.log_every=1", "--train.threads=1", "--run-dir", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("step ")]  # not a TTY: plain lines
    recs = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "ce" in r]
    assert len(lines) == len(recs) == 3
    for line, rec in zip(lines, recs, strict=True):
        fields = line.split(" | ")
        k = rec["step"] + 1
        assert fields[0] == f"step {k}/3 ({100 * k // 3}%)" and fields[1] == f"loss {rec['loss']:.4f}"
        assert f"drop {100 * rec['drop_rate']:.2f}%" in fields
        assert any(f.endswith(" tok/s") for f in fields) == (rec["tokens_per_s"] is not None)
    assert all(x.split(" | ")[-1].startswith("eta ") for x in lines)
    spec = json.loads((out / "spec.json").read_text())
    assert spec["data"]["corpus"] == str(prepared[0]) and spec["model"]["vocab_size"] == 512
    assert spec["train"]["eval_every"] == 0


def real_data_study():
    """A tiny study: xsa x 3 short rungs, on whatever data `--data.*` names."""
    from marin_ablate.ablations.designs import full_factorial
    from marin_ablate.ablations.ladders import Rung
    from marin_ablate.ablations.study import Study

    rungs = tuple(Rung(f"tiny{n}", "tiny", model_overrides={"seq_len": TRAIN_SEQ}, fixed_steps=n, batch_size=2,
                       train_overrides={"eval_batches": 1, "checkpoint_every": n, "log_every": 1}) for n in (2, 4, 8))
    return Study(name="real_data", description="tiny study on a prepared corpus", factors=("xsa",),
                 design=full_factorial(["xsa"]), rungs=rungs, seeds=(0,),
                 executor={"executor": "debug", "max_parallel": 1, "cpus_per_task": 1, "timeout_min": 20})


@pytest.mark.slow
def test_a_tiny_study_on_a_prepared_corpus_reports_per_domain_loss_and_bpb(prepared, paloma_dir, tmp_path, capsys):
    from marin_ablate.cli.main import main
    from marin_ablate.sweeps.executors import ExecOptions
    from marin_ablate.sweeps.sweep import run_study

    sets = [f"data.corpus={prepared[0]}", f"data.eval_dir={paloma_dir}", "model.vocab_size=512"]  # run --data.F=V ...
    rep = run_study(real_data_study(), tmp_path, ExecOptions(executor="debug"), overrides=sets, progress=False)
    assert rep.counts["completed"] == 6
    sd = tmp_path / "real_data"
    summaries = [json.loads(p.read_text()) for p in sorted(sd.glob("runs/*/summary.json"))]
    assert len(summaries) == 6 and {s["status"] for s in summaries} == {"completed"}
    assert main(["analyze", str(sd), "--n-boot", "20", "--no-figures"]) == 0
    md = (sd / "report" / "report.md").read_text()
    section = md.split("## Evaluation sets", 1)[1].split("\n## ", 1)[0]
    assert f"eval sets: `{paloma_dir}`; domains: code, docs, prose" in section
    assert f"training corpus: `{prepared[0]}`" in section
    assert "all-off macro loss" in section  # the end arms per rung; every arm and domain in the appendix
    per_arm = md.split("### Evaluation per arm", 1)[1].split("\n### ", 1)[0]
    header = next(x for x in per_arm.splitlines() if x.startswith("| rung"))
    assert header == ("| rung | arm | macro loss | macro bpb | loss code | bpb code | loss docs | bpb docs | "
                      "loss prose | bpb prose |")
    s = summaries[0]
    assert f"{s['eval_macro_loss']:.4f}" in per_arm and f"{s['eval_domain_bpb']['docs']:.4f}" in per_arm
