"""The pinned reference law is read like input (analysis/fit/reflaw.py `check_pinned`): a study folder's or the
cache's `reference_law.json` with an inadmissible L∞ or α, a NaN, a covariance that is not one, another
ladder's key or another study's name is refused in one line naming the file and the field, and `run` never
copies a tampered cached law into a study."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from marin_ablate.analysis.fit.reflaw import LAW_FILE, PinnedLaw, check_pinned, read_pinned
from marin_ablate.cli.main import main

GOOD = PinnedLaw(2.0, 0.2, np.array([[0.04, 0.005], [0.005, 0.001]]), 400.0, 1e11, 1e13, 7, 4, "0123456789abcdef",
                 "2026-12-06 05:00 UTC", "cache", valley=((0.0, 0.1), (2.0, 0.2))).to_dict()


def _write(folder: Path, **edit) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LAW_FILE).write_text(json.dumps({**GOOD, **edit}))
    return folder / LAW_FILE


def test_an_admissible_law_reads_back_as_written(tmp_path):
    _write(tmp_path, study="smoke")
    law = read_pinned(tmp_path, "smoke")
    assert (law.linf, law.alpha, law.A, law.key) == (2.0, 0.2, 400.0, "0123456789abcdef")
    assert np.array_equal(law.cov, np.asarray(GOOD["cov"]))


@pytest.mark.parametrize("edit, field, allowed", [
    ({"linf": -50.0}, "linf", "a finite number >= 0 (a loss)"),
    ({"linf": float("nan")}, "linf", "a finite number >= 0"),
    ({"alpha": 0.0}, "alpha", "a finite number in (0, 3]"),
    ({"alpha": float("inf")}, "alpha", "a finite number in (0, 3]"),
    ({"A": -1.0}, "A", "a finite number > 0"),
    ({"c_hi": 1e10}, "c_hi", "a finite number > c_lo"),
    ({"dof": 8}, "n", "an integer >= dof, >= 1"),
    ({"cov": [[-0.04, 0.0], [0.0, 0.001]]}, "cov", "a symmetric positive semi-definite 2x2 matrix"),
    ({"cov": [[0.04, 0.1], [0.1, 0.001]]}, "cov", "positive semi-definite"),  # diagonal >= 0, determinant < 0
    ({"cov": [[0.04, 0.005], [0.0, 0.001]]}, "cov", "symmetric"),
    ({"cov": [[0.04, float("nan")], [float("nan"), 0.001]]}, "cov", "finite numbers"),
    ({"valley": [[-1.0, 0.1]]}, "valley", "a list of [L∞ >= 0, α in (0, 3]] pairs"),
    ({"key": 5}, "key", "a string"),
])
def test_an_inadmissible_law_is_refused_naming_the_file_and_field(tmp_path, edit, field, allowed):
    path = _write(tmp_path, **edit)
    with pytest.raises(ValueError) as e:
        read_pinned(tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: field {field!r} is ") and allowed in msg and "\n" not in msg, msg


def test_a_law_pinned_for_another_study_or_ladder_is_refused_naming_both(tmp_path):
    _write(tmp_path, study="noise_cpu")
    with pytest.raises(ValueError, match=f"{tmp_path / LAW_FILE}: pinned for study 'noise_cpu', not 'smoke'"):
        read_pinned(tmp_path, "smoke")
    with pytest.raises(ValueError, match="its ladder key is '0123456789abcdef', not 'ffffffffffffffff'"):
        check_pinned(GOOD, "cache/reference_law.json", key="ffffffffffffffff")


@pytest.mark.parametrize("text, why", [
    ('{"linf": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"linf": 2.0', "Expecting"),
])
def test_a_damaged_law_file_is_one_line_naming_it(tmp_path, text, why):
    (tmp_path / LAW_FILE).write_text(text)
    with pytest.raises(ValueError, match="is damaged") as e:
        read_pinned(tmp_path)
    assert why in str(e.value) and str(tmp_path / LAW_FILE) in str(e.value)


def test_analyze_refuses_another_studys_law_in_the_folder(tmp_path, capsys):
    rows = [{"arm": f"a{x}", "rung": r, "xsa": ("none", "xsa")[x], "flops": c, "loss": 3.0 + 100 * c ** -0.2 - 0.02 * x}
            for r, c in (("s1", 1e15), ("s2", 4e15), ("s3", 1.6e16)) for x in (0, 1)]
    pd.DataFrame(rows).to_csv(tmp_path / "g.csv", index=False)
    assert main(["analyze", "--import.table", str(tmp_path / "g.csv")]) == 0
    path = _write(tmp_path / "g", study="smoke")
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "g"), "--n-boot", "0", "--no-figures"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"marin-ablate analyze: error: {path}: pinned for study 'smoke', not 'g' (this folder's): another "
                   "study's law; delete the file and run again, or analyze with --no-pinned-law")
    assert not (tmp_path / "g" / "report").exists()


def test_run_never_copies_a_tampered_cached_law_into_the_study(tmp_path, capsys, monkeypatch):
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.sweeps.reference import cache_root, reference_key, reference_specs

    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    study = get_study("smoke")
    assert study.reference_rungs
    key = reference_key(reference_specs(study))
    cached = _write(cache_root() / key, linf=-50.0, key=key)
    assert main(["run", "smoke", "--out", str(tmp_path / "out"), "--no-profile", "--executor", "debug"]) == 2
    err = capsys.readouterr().err
    assert f"{cached}: field 'linf' is -50.0; allowed values: a finite number >= 0 (a loss)" in err, err
    assert not (tmp_path / "out" / "smoke" / LAW_FILE).exists() and not (tmp_path / "out" / "smoke" / "runs").exists()
    _write(cache_root() / key, key="0" * 16)  # a sound law of another ladder, under this ladder's key
    assert main(["run", "smoke", "--out", str(tmp_path / "out"), "--no-profile", "--executor", "debug"]) == 2
    assert f"{cached}: its ladder key is '{'0' * 16}', not '{key}'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "smoke" / LAW_FILE).exists()
