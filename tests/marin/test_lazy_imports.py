"""A GPU box may lack the data and sweep libraries: `train` on a prepared corpus needs torch and numpy only
(datasets, submitit, optuna and pandas are imported where used), and its eval reader reads JSON lines, JSON,
text and Parquet as the datasets library does."""

from __future__ import annotations

import gzip
import json
import sys

import pytest

from marin_ablate.marin import data
from marin_ablate.marin.data import prepare as prep
from marin_ablate.marin.data.eval import read_column

ABSENT = ("datasets", "submitit", "optuna", "pandas")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A byte-tokenized prepared corpus and a Paloma-layout eval folder from the embedded text."""
    root = tmp_path_factory.mktemp("lazy")
    rows = []
    for dom in ("code", "docs"):
        lines = (data.embedded_corpus_dir() / dom / "train.jsonl").read_text().splitlines()[:30]
        rows += [(dom, json.loads(x)["text"]) for x in lines]
    (root / "src").mkdir()
    with open(root / "src" / "a.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t, "source": d}) + "\n" for d, t in rows)
    prep.prepare(prep.PrepareConfig(source=str(root / "src"), tokenizer="byte", out=str(root / "corpus"),
                                    text_column="text", domain_column="source", num_proc=1))
    for dom in ("code", "docs"):
        (root / "eval" / dom / "val").mkdir(parents=True)
        with gzip.open(root / "eval" / dom / "val" / "val_0.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for d, t in rows if d == dom)
    return root


def test_train_on_a_prepared_corpus_runs_with_datasets_submitit_optuna_and_pandas_unimportable(corpus, monkeypatch,
                                                                                                tmp_path):
    for name in ABSENT:  # `import name` raises ImportError while its sys.modules entry is None
        monkeypatch.setitem(sys.modules, name, None)
    for var in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):  # nothing tells train how many threads
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ImportError):
        import datasets  # noqa: F401
    from marin_ablate.cli.train import cmd_train

    rc = cmd_train(["--preset", "tiny", "--run-dir", str(tmp_path / "run"), f"--data.corpus={corpus / 'corpus'}",
                    f"--data.eval_dir={corpus / 'eval'}", "--train.steps=2", "--train.batch_size=2",
                    "--train.eval_batches=1", "--train.eval_every=0", "--train.checkpoint_every=0",
                    "--model.seq_len=64"])
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and set(summary["eval_domain_loss"]) == {"code", "docs"}
    assert summary["threads"] == 1  # one torch thread unless --train.threads says otherwise


def test_the_eval_reader_reads_each_kind_as_the_datasets_library_does(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    prep_cfg = prep.PrepareConfig(source=str(tmp_path / "src"), tokenizer="byte", out=str(tmp_path / "out"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "x": 1}\n')
    (src / "b.json").write_text(json.dumps([{"text": "three"}, {"text": "four"}]))
    with gzip.open(src / "c.jsonl.gz", "wt") as f:
        f.write('{"text": "five"}\n')
    (src / "d.txt").write_text("six\nstill six\n")
    pq.write_table(pa.table({"text": ["seven", "eight"]}), src / "e.parquet")
    files = prep.source_files(str(src))
    got = read_column(files, "text")
    assert got == ["one", "two", "three", "four", "five", "six\nstill six\n", "seven", "eight"]
    pytest.importorskip("datasets")
    for f in files:  # each file against the datasets library's own reading
        assert read_column([f], "text") == list(prep.load_source(prep.PrepareConfig(
            source=str(f), tokenizer="byte", out=prep_cfg.out))["text"]), f.name
