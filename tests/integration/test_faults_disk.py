"""A full disk at the start of `data prepare` (the datasets cache in --out) and of `train` (its run lock)
is one line naming the path, never a traceback or the source file blamed. Uses a 1 MiB tmpfs (root only;
skipped elsewhere), unmounted after each test."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from marin_ablate.main import main


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
