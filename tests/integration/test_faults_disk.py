"""A full disk at the start of `data prepare` (the datasets cache in --out) and of `train` (its run lock)
is one line naming the path, never a traceback or the source file blamed. Uses a 1 MiB tmpfs (root only;
skipped elsewhere), unmounted after each test."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from marin_ablate.cli.main import main


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)  # lazy: a worker may still hold a file open


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_disk_full_in_prepare_names_the_path_under_out_not_the_source(tmp_path, small_disk, capsys):
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(0)
    (src / "a.jsonl").write_text("".join(
        json.dumps({"text": " ".join(rng.choice("ab cd ef".split()) for _ in range(100))}) + "\n"
        for _ in range(3000)))  # ~0.9 MB: its cache does not fit in 1 MiB
    out = small_disk / "out"
    assert main(["data", "prepare", str(src), "--tokenizer", "byte", "--corpus-dir", str(out)]) == 2
    err = _one_line(capsys)  # the datasets cache or a shard, whichever fills the disk first: a path under --out
    assert f"{out}/" in err and "disk full (no space left on device)" in err and "cannot read" not in err


def test_disk_full_at_train_start_names_the_path(small_disk, capsys):
    with open(small_disk / "filler", "wb") as f:  # fill the disk to its last byte
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    out = small_disk / "run"
    assert main(["train", "--preset", "tiny", "--train.steps=1", "--run-dir", str(out)]) == 2
    assert f"disk full (no space left on device) while writing {out / '.lock'}" in _one_line(capsys)


def _fill(d) -> None:
    with open(d / "filler", "wb", buffering=0) as f:  # the disk to its last byte (unbuffered: close cannot fail)
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_disk_full_while_writing_a_figure_names_the_figure(small_disk):
    import errno

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from marin_ablate.analysis.report.plots import _save

    fig, ax = plt.subplots()
    ax.plot(range(1000), [x * x for x in range(1000)])
    _fill(small_disk)
    with pytest.raises(OSError) as e:
        _save(fig, small_disk / "figures" / "law.png")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(small_disk / "figures" / "law.png")
    assert not list((small_disk / "figures").glob("*.png")) and not list((small_disk / "figures").glob(".*tmp"))


def test_disk_full_while_writing_the_report_is_one_line_naming_a_file_under_it(tmp_path, small_disk, capsys):
    import itertools

    import pandas as pd

    rows = [{"arm": f"a{x}{s}", "rung": r, "xsa": ("none", "xsa")[x], "sconv": ("none", "short_conv")[s], "flops": c,
             "loss": 3.0 + 100 * c ** -0.2 - 0.02 * x - 0.01 * s}
            for r, c in (("s1", 1e15), ("s2", 4e15), ("s3", 1.6e16)) for x, s in itertools.product((0, 1), (0, 1))]
    pd.DataFrame(rows).to_csv(tmp_path / "g.csv", index=False)
    _fill(small_disk)
    assert main(["analyze", str(tmp_path / "g.csv"), "--n-boot", "0", "--report-dir", str(small_disk / "rep")]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"marin-ablate analyze: error: {small_disk / 'rep'}/") and "disk full" in err, err


def test_disk_full_while_writing_the_loader_index_names_the_file_and_leaves_no_partial_index(tmp_path, small_disk,
                                                                                               capsys):
    from marin_ablate.marin.data.synthetic import write_synthetic_corpus

    root = tmp_path / "corpus"
    write_synthetic_corpus(root, 20_000, max_len=4, index=False)  # 160 KB of index: cum.npy fits, src.npy does not
    (small_disk / "index").mkdir()
    (root / "index").symlink_to(small_disk / "index")
    with open(small_disk / "filler", "wb") as f:
        f.write(b"\0" * ((1 << 20) - 200_000))
    assert main(["data", "index", str(root)]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"marin-ablate data: error: {root / 'index'}/") and "disk full" in err, err
    assert f"run `marin-ablate data index {root}` again" in err
    assert sorted(p.name for p in (small_disk / "index").iterdir()) == []  # no temporary, no lone array
    (small_disk / "filler").unlink()
    assert main(["data", "index", str(root)]) == 0
    assert sorted(p.name for p in (small_disk / "index").iterdir()) == ["cum.npy", "index.json", "shards.npy",
                                                                         "src.npy"]
