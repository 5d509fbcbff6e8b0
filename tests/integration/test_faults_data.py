"""Faults and bad inputs of the data path: concurrent preparations of one corpus, shards changed
after preparation, garbage tokenizer/manifest files, unreadable source and eval files, and
`data prepare` killed at random points (every rerun gives the uninterrupted corpus)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from marin_ablate.cli.main import main
from marin_ablate.marin.data import prepare as prep
from marin_ablate.marin.data import shards
from marin_ablate.marin.data.loading import load_eval_corpus
from marin_ablate.marin.data.tokenizer import ByteTokenizer, train_bpe

ROOT = Path(__file__).resolve().parents[2]


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) + "\n" for _ in range(n)]


@pytest.fixture
def source(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs(120)))
    return d


def _prepare(source: Path, out: Path, tokenizer: str = "byte", **kw) -> dict:
    return prep.prepare(prep.PrepareConfig(source=str(source), tokenizer=tokenizer, out=str(out),
                                           docs_per_shard=kw.pop("docs_per_shard", 40), **kw))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# --------------------------------------------------------------------------------------------
# Concurrent preparations
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_concurrent_prepares_into_one_out_never_both_succeed_with_different_tokenizers(source, tmp_path):
    tok = tmp_path / "tok.json"
    train_bpe(_docs(200, 1), 300, tok)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for race in range(2):
        out = tmp_path / f"out{race}"
        procs = [subprocess.Popen([sys.executable, "-m", "marin_ablate", "data", "prepare", str(source), "--tokenizer",
                                   t, "--corpus-dir", str(out), "--docs-per-shard", "10"], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for t in ("byte", str(tok))]
        results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
        ok = [i for i, (rc, _, _) in enumerate(results) if rc == 0]
        assert len(ok) == 1, results  # the lock serialises them; the second refuses the first's corpus
        loser = results[1 - ok[0]]
        assert loser[0] == 2 and "holds a preparation of different inputs (differs in tokenizer" in loser[2]
        m = shards.verify_corpus(out)  # the winner's corpus is on disk, whole
        assert m["tokenizer"]["vocab_size"] == (256 if ok[0] == 0 else 300)


def test_the_out_lock_is_exclusive_between_processes(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from marin_ablate.marin.data.prepare import out_lock\n"
                               "with out_lock(Path(sys.argv[1])):\n print('held', flush=True); time.sleep(3)",
                               str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert holder.stdout.readline().strip() == "held"
    t = time.monotonic()
    with prep.out_lock(out):
        waited = time.monotonic() - t
    holder.wait(timeout=30)
    assert waited > 1.0  # we got the lock only when the holder let go


# --------------------------------------------------------------------------------------------
# A corpus changed after preparation
# --------------------------------------------------------------------------------------------


def test_a_shard_changed_in_place_with_the_same_size_is_refused_when_opened(source, tmp_path, capsys):
    out = tmp_path / "out"
    _prepare(source, out)
    shards.PreparedCorpus(out)  # intact: opens
    f = out / "shards" / "00001.tokens.bin"
    raw = bytearray(f.read_bytes())
    raw[10] = (raw[10] + 1) % 256  # same size, one token different
    f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"00001.tokens.bin: content differs from manifest.json \(sha256\)"):
        shards.PreparedCorpus(out)
    assert main(["data", "verify", str(out)]) == 2
    assert "content differs from manifest.json" in _one_error_line(capsys)


def test_verify_passes_an_intact_corpus_and_its_fingerprint_covers_the_shards(source, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _prepare(source, a)
    assert main(["data", "verify", str(a)]) == 0
    assert "match manifest.json" in capsys.readouterr().out
    other = tmp_path / "src2"
    other.mkdir()
    docs = _docs(120)
    docs[5] = docs[5].upper()  # same bytes count, other content
    (other / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    _prepare(other, b)
    assert shards.PreparedCorpus(a).fingerprint != shards.PreparedCorpus(b).fingerprint


def test_token_ids_at_or_above_the_vocabulary_are_refused_naming_the_shard(source, tmp_path):
    out = tmp_path / "out"
    _prepare(source, out)
    f = out / "shards" / "00000.tokens.bin"
    toks = np.fromfile(f, np.uint16)
    toks[3] = 300  # byte vocabulary: 256
    toks.tofile(f)
    m = json.loads((out / "manifest.json").read_text())
    m["shards"][0]["sha256"] = prep.sha256_file(f)  # a consistent manifest: only the range check can catch it
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"00000.tokens.bin: token id 300 >= the tokenizer's vocabulary 256"):
        shards.PreparedCorpus(out)


@pytest.mark.parametrize("content", [b"", b"{not json", b"\x00\x01\x02", b"[1, 2]", b'{"format": "marin-tokens-v1"}'])
def test_a_garbage_manifest_is_one_clear_line(source, tmp_path, capsys, content):
    out = tmp_path / "out"
    _prepare(source, out)
    (out / "manifest.json").write_bytes(content)
    with pytest.raises(ValueError, match="manifest.json: .*prepare the corpus again"):
        shards.PreparedCorpus(out)
    assert main(["data", "verify", str(out)]) == 2
    assert "manifest.json" in _one_error_line(capsys)


# --------------------------------------------------------------------------------------------
# Bad tokenizer and source files: one line, no traceback
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"{}", b"not json at all", b'{"model": {"type": "BPE"}}'])
def test_a_garbage_tokenizer_json_is_one_clear_line(source, tmp_path, capsys, content):
    tok = tmp_path / "tokenizer.json"
    tok.write_bytes(content)
    rc = main(["data", "prepare", str(source), "--tokenizer", str(tok), "--corpus-dir", str(tmp_path / "out")])
    assert rc == 2
    assert f"tokenizer file {tok} is not an HF tokenizers file" in _one_error_line(capsys)
    assert not (tmp_path / "out" / "prepare.json").exists()


@pytest.mark.parametrize("spec", ["bpe:abc", "bpe:100", "bpe:"])
def test_a_bad_bpe_vocab_is_one_clear_line_before_the_source_is_read(tmp_path, capsys, spec):
    rc = main(["data", "prepare", str(tmp_path / "no-such-source"), "--tokenizer", spec,
               "--corpus-dir", str(tmp_path / "o")])
    assert rc == 2
    assert f"tokenizer={spec!r}: VOCAB of bpe:VOCAB must be an integer in 257..1048576" in _one_error_line(capsys)


def test_an_object_offsets_npy_with_a_rehashed_manifest_is_refused_naming_the_file(source, tmp_path, capsys):
    out = tmp_path / "out"
    _prepare(source, out)
    m = json.loads((out / "manifest.json").read_text())
    f = out / m["shards"][0]["offsets_path"]
    offsets = np.load(f)
    np.save(f, np.array(list(offsets), dtype=object), allow_pickle=True)  # loading it would unpickle
    m["shards"][0]["offsets_sha256"] = prep.sha256_file(f)  # consistent hashes: only the dtype check can catch it
    (out / "manifest.json").write_text(json.dumps(m))
    shards._VERIFIED.clear()
    with pytest.raises(ValueError, match=re.escape(str(f)) + r": not an integer \.npy array \(Object arrays"):
        shards.PreparedCorpus(out)
    np.save(f, offsets.astype(np.float64))  # numbers, but not integers
    m["shards"][0]["offsets_sha256"] = prep.sha256_file(f)
    (out / "manifest.json").write_text(json.dumps(m))
    shards._VERIFIED.clear()
    with pytest.raises(ValueError, match=re.escape(str(f)) + r": holds a float64 array"):
        shards.PreparedCorpus(out)


def _bad_sources(root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (folder, a regex of what the error says)"""
    cases = {}
    d = root / "empty"
    d.mkdir()
    (d / "a.jsonl").write_text("")
    cases["empty"] = (d, "a.jsonl: empty file")
    d = root / "binary"
    d.mkdir()
    (d / "a.jsonl").write_bytes(bytes(range(256)) * 8)
    cases["binary"] = (d, r"a.jsonl: not UTF-8 text \(byte 128\)")
    d = root / "binary_txt"
    d.mkdir()
    (d / "a.txt").write_bytes(b"ok\x00" + bytes(range(256)))
    cases["binary_txt"] = (d, "a.txt: binary file")
    d = root / "latin1_txt"
    d.mkdir()
    (d / "a.txt").write_bytes("caf\xe9".encode("latin-1"))
    cases["latin1_txt"] = (d, "a.txt: not UTF-8 text")
    d = root / "mixed"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps({"text": "hello there"}) + "\n")
    (d / "b.jsonl").write_text(json.dumps({"body": 3, "other": [1]}) + "\n")
    cases["mixed"] = (d, "cannot read as json")
    d = root / "mixed_kinds"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps({"body": "hello there", "n": 1}) + "\n")
    (d / "b.txt").write_text("plain text\n")
    cases["mixed_kinds"] = (d, r"text_column='text' is not a column of \S+/a\.jsonl; allowed values: body, n")
    for name, value, says in (("text_int", 5, "int"), ("text_object", {"a": 1}, "dict")):
        d = root / name
        d.mkdir()
        (d / "a.jsonl").write_text(json.dumps({"text": "hello there"}) + "\n")
        (d / "b.jsonl").write_text(json.dumps({"text": value}) + "\n")  # one schema per file, not across them
        cases[name] = (d, rf"/b\.jsonl: line 1: column 'text' holds {says} values, not text")
    d = root / "latin1_jsonl"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n")
    (d / "b.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    cases["latin1_jsonl"] = (d, r"/b\.jsonl: not UTF-8 text \(byte 13\)")
    return cases


@pytest.mark.parametrize("case", ["empty", "binary", "binary_txt", "latin1_txt", "mixed", "mixed_kinds", "text_int",
                                  "text_object", "latin1_jsonl"])
def test_unreadable_source_files_are_one_clear_line_in_prepare_and_in_eval_folders(tmp_path, capsys, case):
    folder, says = _bad_sources(tmp_path)[case]
    rc = main(["data", "prepare", str(folder), "--tokenizer", "byte", "--corpus-dir", str(tmp_path / "out")])
    assert rc == 2
    assert re.search(says, _one_error_line(capsys))
    evaldir = tmp_path / "eval"
    shutil.copytree(folder, evaldir / "dom" / "val")
    with pytest.raises(ValueError, match=says):
        load_eval_corpus(evaldir, ByteTokenizer())


# --------------------------------------------------------------------------------------------
# Killed at random points: every rerun gives the uninterrupted corpus
# --------------------------------------------------------------------------------------------

def _corpus_bytes(out: Path) -> dict[str, bytes]:
    m = json.loads((out / "manifest.json").read_text())
    files = ["manifest.json"] + [s[k] for s in m["shards"] for k in ("tokens_path", "offsets_path")]
    return {f: (out / f).read_bytes() for f in files}


def _killed_prepare(source: Path, out: Path, kill_at: int, torn: bool) -> None:
    """In a forked child: prepare, SIGKILLed at its kill_at-th file write, either after writing
    half of the file's temp copy (torn) or right after the write landed."""
    n = [0]
    real_bytes, real_json = prep.atomic_write_bytes, prep.atomic_write_json

    def hook(real):
        def write(path, obj):
            n[0] += 1
            if n[0] == kill_at and torn:
                body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                (Path(path).parent / f".{Path(path).name}.torn.tmp").write_bytes(body[:len(body) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            real(path, obj)
            if n[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return write

    prep.atomic_write_bytes, prep.atomic_write_json = hook(real_bytes), hook(real_json)
    _prepare(source, out, docs_per_shard=8)
    os._exit(0)  # not killed: the preparation had fewer writes


@pytest.mark.slow
def test_prepare_killed_at_20_random_points_always_resumes_to_the_uninterrupted_corpus(source, tmp_path):
    import multiprocessing as mp

    ref = tmp_path / "ref"
    _prepare(source, ref, docs_per_shard=8)
    expected = _corpus_bytes(ref)
    n_writes = 2 + 3 * len(list((ref / "shards").glob("*.meta.json")))  # prepare.json, 3 per shard, manifest
    rng = random.Random(20)
    points = sorted(rng.sample([(k, torn) for k in range(1, n_writes + 1) for torn in (False, True)], 20))
    ctx = mp.get_context("fork")
    for k, torn in points:
        out = tmp_path / f"k{k}-{int(torn)}"
        child = ctx.Process(target=_killed_prepare, args=(source, out, k, torn))
        child.start()
        child.join(timeout=120)
        assert child.exitcode == -signal.SIGKILL, (k, torn, child.exitcode)
        assert (out / "manifest.json").exists() == (k == n_writes and not torn)
        _prepare(source, out, docs_per_shard=8)  # the rerun resumes whatever the kill left
        assert _corpus_bytes(out) == expected, (k, torn)
        shards.verify_corpus(out)


@pytest.mark.slow
def test_sigterm_to_a_two_worker_prepare_stops_it_without_worker_tracebacks(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(4):
        (src / f"{k}.jsonl").write_text("".join(json.dumps({"text": t * 4}) + "\n" for t in _docs(3000, seed=k)))
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "marin_ablate", "data", "prepare", str(src), "--tokenizer", "bpe:2000",
                          "--num-proc", "2", "--docs-per-shard", "100", "--corpus-dir", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    deadline = time.time() + 240
    while time.time() < deadline and not list((out / "shards").glob("*.meta.json")) and p.poll() is None:
        time.sleep(0.2)  # SIGTERM while the workers write shards
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "marin-ablate data: interrupted (SIGTERM)"


# --------------------------------------------------------------------------------------------
# The loader index (DataConfig.shuffle='indexed') is read like input
# --------------------------------------------------------------------------------------------


def _indexed_corpus(tmp_path: Path) -> tuple[Path, Path]:
    """A prepared byte corpus with its loader index, and a Paloma-layout eval folder."""
    from marin_ablate.marin.data.synthetic import write_synthetic_corpus

    root, ev = tmp_path / "corpus", tmp_path / "eval"
    write_synthetic_corpus(root, 3_000, max_len=200, seed=1)
    (ev / "code" / "val").mkdir(parents=True)
    (ev / "code" / "val" / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs(8)))
    return root, ev


def test_a_loader_index_with_negative_offsets_is_one_line_naming_the_file_before_training(tmp_path, capsys):
    root, ev = _indexed_corpus(tmp_path)
    src = np.load(root / "index" / "src.npy")
    src[100] = -src[100] - 3  # a negative offset into the shards
    np.save(root / "index" / "src.npy", src)
    data = [f"--data.corpus={root}", f"--data.eval_dir={ev}", "--data.shuffle=indexed"]
    assert main(["train", "--preset", "tiny", "--train.steps=2", *data, "--run-dir", str(tmp_path / "run")]) == 2
    err = _one_error_line(capsys)
    assert f"{root / 'index' / 'src.npy'}: content differs from index.json (sha256)" in err, err
    assert f"marin-ablate data index {root}" in err
    assert not (tmp_path / "run" / "summary.json").exists()  # no verdict: the fixed corpus trains the run
    assert main(["plan", "smoke", "--rungs", "cpu_s32", "--seeds", "0", "--out", str(tmp_path / "out"), *data]) == 2
    assert f"{root / 'index' / 'src.npy'}: content differs from index.json (sha256)" in _one_error_line(capsys)
    assert main(["data", "index", str(root)]) == 0
    capsys.readouterr()
    assert main(["train", "--preset", "tiny", "--train.steps=2", "--train.eval_every=0", *data,
                 "--run-dir", str(tmp_path / "run")]) == 0


def test_data_verify_checks_the_loader_index_whole(tmp_path, capsys):
    root, _ = _indexed_corpus(tmp_path)
    assert main(["data", "verify", str(root)]) == 0
    assert "loader index" in capsys.readouterr().out
    cum = np.load(root / "index" / "cum.npy")
    cum[5] = 10**15
    np.save(root / "index" / "cum.npy", cum)
    assert main(["data", "verify", str(root)]) == 2
    assert f"{root / 'index' / 'cum.npy'}: content differs from index.json (sha256)" in _one_error_line(capsys)
