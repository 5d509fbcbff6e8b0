"""A run folder that contradicts itself (meta.json's levels or coding against the spec.json beside it, or
against the factor's definition) is left out of the analysis with a note naming the run and both values,
never analysed silently with its sign flipped (analysis/io/results.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from marin_ablate.ablations.studies import get_study
from marin_ablate.analysis.io.results import collect, inventory
from marin_ablate.cli.main import main
from marin_ablate.marin.schema import spec_json

RUNGS = ("cpu_s32", "cpu_s64")
COMPUTE = {"cpu_s32": 1e14, "cpu_s64": 4e14}
EFFECT = {"xsa": 0.03, "sconv": 0.02}  # ln quality gain of each recipe level (+1)


def _study(tmp: Path) -> Path:
    """The smoke study's own spec.json and meta.json for two rungs, with a summary from a known law."""
    study = get_study("smoke", rungs=RUNGS, seeds=[0])
    root = tmp / "smoke"
    for spec, meta in study.runs():
        d = root / "runs" / spec.run_id
        d.mkdir(parents=True)
        (d / "spec.json").write_text(spec_json(spec))
        (d / "meta.json").write_text(json.dumps(meta))
        code = {f: c["code"] for f, c in meta["coding"].items()}
        c = COMPUTE[meta["rung"]]
        m = math.exp(sum(EFFECT.get(f, 0.0) * x for f, x in code.items()))
        loss = 2.0 + 400 * (m * c) ** -0.2
        (d / "summary.json").write_text(json.dumps({
            "run_id": spec.run_id, "status": "completed", "eval_macro_loss": loss, "train_flops": c,
            "tokens": 1e7, "tokens_per_s": 1e4, "model_flops_per_s": 1e4 * c / 1e7, "hardware": "cpu",
            "code_version": "v1"}))
    return root


def _edit_meta(root: Path, edit, only: int | None = None) -> list[str]:
    dirs = sorted((root / "runs").iterdir())
    for d in dirs if only is None else dirs[only:only + 1]:
        meta = json.loads((d / "meta.json").read_text())
        edit(meta)
        (d / "meta.json").write_text(json.dumps(meta))
    return [d.name for d in (dirs if only is None else dirs[only:only + 1])]


def _swap_coding(meta: dict) -> None:
    c = meta["coding"]["xsa"]
    c["low"], c["high"] = c["high"], c["low"]
    c["code"] = -c["code"]  # a consistent edit: the file agrees with itself, not with its spec or the factor


def _flip_level(meta: dict) -> None:
    c = meta["coding"]["xsa"]
    meta["factors"]["xsa"] = c["high"] if meta["factors"]["xsa"] == c["low"] else c["low"]
    c["code"] = -c["code"]


def test_a_study_as_written_has_no_contradiction(tmp_path):
    t = collect(_study(tmp_path), write=False)
    assert set(t["status"]) == {"completed"} and len(t) == 32


def test_swapped_coding_in_every_run_is_refused_naming_the_run_and_both_values(tmp_path):
    root = _study(tmp_path)
    ids = _edit_meta(root, _swap_coding)
    t = collect(root, write=False).set_index("run_id")
    assert set(t["status"]) == {"contradictory"}
    err = t.loc[ids[0], "error"]
    assert err.startswith(f"runs/{ids[0]}: meta.json codes xsa −1 = 'xsa', +1 = 'none'") and "'none' is −1" in err
    assert "\n" not in err


def test_flipped_level_in_every_run_is_refused_naming_both_values(tmp_path):
    root = _study(tmp_path)
    ids = _edit_meta(root, _flip_level)
    t = collect(root, write=False).set_index("run_id")
    assert set(t["status"]) == {"contradictory"}
    spec = json.loads((root / "runs" / ids[0] / "spec.json").read_text())
    meta = json.loads((root / "runs" / ids[0] / "meta.json").read_text())
    assert t.loc[ids[0], "error"] == (
        f"runs/{ids[0]}: meta.json has xsa={meta['factors']['xsa']!r} (sets recipe.xsa={meta['factors']['xsa']!r}) "
        f"but spec.json has recipe.xsa={spec['recipe']['xsa']!r}; left out (which file is right is unknown)")
    # analyze says so in one line (nothing left to fit) instead of reading the gain as a loss
    assert main(["analyze", str(root), "--report-dir", str(tmp_path / "rep"), "--n-boot", "0"]) == 2


def test_a_code_that_contradicts_its_own_level_names_the_file(tmp_path):
    root = _study(tmp_path)
    [rid] = _edit_meta(root, lambda m: m["coding"]["xsa"].update(code=-m["coding"]["xsa"]["code"]), only=0)
    row = collect(root, write=False).set_index("run_id").loc[rid]
    assert row["status"] == "unreadable" and f"{rid}/meta.json" in row["error"] and "coding.xsa.code" in row["error"]


def test_a_factor_level_not_matching_its_recorded_value_is_refused(tmp_path):
    root = _study(tmp_path)
    [rid] = _edit_meta(root, lambda m: m["coding"]["xsa"].update(values={"none": "xsa", "xsa": "none"}), only=3)
    row = collect(root, write=False).set_index("run_id").loc[rid]
    assert row["status"] == "contradictory", row["error"]


@pytest.mark.slow
def test_one_flipped_run_is_left_out_and_the_report_is_written(tmp_path, capsys):
    root = _study(tmp_path)
    [rid] = _edit_meta(root, _flip_level, only=5)
    t = collect(root, write=False)
    assert inventory(t).excluded[0][0] == rid
    assert main(["analyze", str(root), "--report-dir", str(tmp_path / "rep"), "--n-boot", "0"]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"runs/{rid}: meta.json has xsa=" in md
    assert "- coding: xsa: +1 = xsa, −1 = none; sconv: +1 = short_conv, −1 = none" in md
