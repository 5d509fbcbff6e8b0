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
from marin_ablate.marin.flops import trained_totals
from marin_ablate.marin.schema import spec_json

RUNGS = ("cpu_s32", "cpu_s64")
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
        own = trained_totals(spec.to_dict())  # the summary is this spec's training: its steps, tokens, FLOPs
        c, tokens = own["flops"][0], own["tokens"]
        m = math.exp(sum(EFFECT.get(f, 0.0) * x for f, x in code.items()))
        loss = 2.0 + 400 * (m * c) ** -0.2
        (d / "summary.json").write_text(json.dumps({
            "run_id": spec.run_id, "status": "completed", "eval_macro_loss": loss, "train_flops": c,
            "tokens": tokens, "tokens_per_s": 1e4, "model_flops_per_s": 1e4 * c / tokens, "hardware": "cpu",
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
def test_one_flipped_run_is_left_out_the_report_written_and_analyze_ends_naming_it_exit_2(tmp_path, capsys):
    root = _study(tmp_path)
    [rid] = _edit_meta(root, _flip_level, only=5)
    t = collect(root, write=False)
    assert inventory(t).excluded[0][0] == rid
    assert main(["analyze", str(root), "--report-dir", str(tmp_path / "rep"), "--n-boot", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"marin-ablate analyze: error: 1 run folder(s) left out as damaged: "
                                               f"runs/{rid}: meta.json has xsa=")
    assert err[0].endswith(f"the report is written without it: {tmp_path / 'rep' / 'report.md'}")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"runs/{rid}: meta.json has xsa=" in md
    assert "- coding: xsa: +1 = xsa, −1 = none; sconv: +1 = short_conv, −1 = none" in md


def _borrow(root: Path) -> tuple[str, str]:
    """A cpu_s64 run's summary copied into a cpu_s32 run's folder with its run_id edited to the folder's (the
    careless collaborator's fix of a 'names another run' refusal): (the folder's id, the lender's id)."""
    by_rung: dict[str, list[Path]] = {}
    for d in sorted((root / "runs").iterdir()):
        by_rung.setdefault(json.loads((d / "meta.json").read_text())["rung"], []).append(d)
    mine, theirs = by_rung["cpu_s32"][2], by_rung["cpu_s64"][2]
    s = json.loads((theirs / "summary.json").read_text())
    (mine / "summary.json").write_text(json.dumps({**s, "run_id": mine.name}))
    return mine.name, theirs.name


def test_a_borrowed_summary_with_its_run_id_edited_is_left_out_naming_tokens_and_flops(tmp_path, capsys):
    root = _study(tmp_path)
    rid, _ = _borrow(root)
    t = collect(root, write=False).set_index("run_id")
    assert t.loc[rid, "status"] == "contradictory" and (t["status"] == "completed").sum() == len(t) - 1
    spec = json.loads((root / "runs" / rid / "spec.json").read_text())
    tokens = spec["train"]["steps"] * spec["train"]["batch_size"] * spec["model"]["seq_len"]  # what it trains
    err = t.loc[rid, "error"]
    assert err.startswith(f"runs/{rid}: summary.json has tokens=") and f"but spec.json trains {tokens} (" in err, err
    assert "left out" in err and "\n" not in err
    assert main(["status", "smoke", "--rungs", ",".join(RUNGS), "--seeds", "0", "--out", str(tmp_path), "--all"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"damaged {rid}"))
    assert "summary.json has tokens=" in line and "the next `run` trains it again" in line, line


@pytest.mark.slow
def test_analyze_leaves_out_a_borrowed_summary_names_it_in_the_report_and_ends_in_one_line_exit_2(tmp_path, capsys):
    root = _study(tmp_path)
    rid, _ = _borrow(root)
    assert main(["analyze", str(root), "--report-dir", str(tmp_path / "rep"), "--n-boot", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"left out as damaged: runs/{rid}: summary.json has tokens=" in err[0], err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"- left out: {rid}: runs/{rid}: summary.json has tokens=" in md


def test_a_summary_of_an_unknown_status_is_named_damaged_not_pending(tmp_path, capsys):
    root = _study(tmp_path)
    d = sorted((root / "runs").iterdir())[4]
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**s, "status": "finished"}))
    assert main(["status", "smoke", "--rungs", ",".join(RUNGS), "--seeds", "0", "--out", str(tmp_path), "--all"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"damaged {d.name}"))
    assert f"cannot read {d / 'summary.json'}: status 'finished' is not a known level; allowed values: completed, " \
           "failed" in line, line
    row = collect(root, write=False).set_index("run_id").loc[d.name]
    assert row["status"] == "unreadable" and "status 'finished' is not a known level" in row["error"]


def test_a_loss_of_1e308_is_left_out_naming_the_run_file_or_row(tmp_path):
    """A finite loss no model has (nats per token beyond LOSS_MAX) is damage, named where it sits: a run folder's
    summary.json, a results file's row, an imported table's row (refused); the fit never sees it."""
    import pandas as pd

    from marin_ablate.analysis.io.importer import complete_table, import_file

    root = _study(tmp_path)
    d = sorted((root / "runs").iterdir())[5]
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**s, "eval_macro_loss": 1e308}))
    t = collect(root, write=False).set_index("run_id")
    assert t.loc[d.name, "status"] == "unreadable"
    assert t.loc[d.name, "error"] == (f"cannot read runs/{d.name}/summary.json: eval_macro_loss=1e+308 is out of "
                                      "range; allowed values: a finite number in [0, 1e+06] nats per token")
    table = tmp_path / "results.csv"
    pd.DataFrame([{"rung": "r", "arm": "a", "eval_macro_loss": 3.0, "train_flops": 1e15},
                  {"rung": "r", "arm": "b", "eval_macro_loss": 1e308, "train_flops": 1e15}]).to_csv(table, index=False)
    got = complete_table(pd.read_csv(table), table)
    assert list(got["status"]) == ["completed", "unreadable"] and got["error"].iloc[1].startswith(
        "results.csv: row 2: eval_macro_loss=1e+308 is out of range")
    imported = tmp_path / "imp.csv"
    pd.DataFrame([{"arm": "a", "rung": "r", "loss": 3.0, "flops": 1e15},
                  {"arm": "b", "rung": "r", "loss": 1e308, "flops": 1e15}]).to_csv(
        imported, index=False)
    with pytest.raises(ValueError, match=r"^row 2, column 'loss': .*1e\+308.* is out of range; allowed values: a "
                                         r"finite number > 0 and <= 1e\+06$"):
        import_file(imported, tmp_path / "imp_out")
    assert not (tmp_path / "imp_out").exists()


def test_a_pinned_linf_above_every_kept_runs_loss_is_refused_naming_the_largest(tmp_path):
    from marin_ablate.analysis.pipeline import analyze_table

    t = collect(_study(tmp_path), write=False)
    top = t.loc[t["eval_macro_loss"].idxmax()]
    for pin in (50.0, float(top["eval_macro_loss"])):
        with pytest.raises(ValueError) as e:
            analyze_table(t, pin_linf=pin, n_boot=0)
        assert str(e.value) == (f"pin_linf={pin:g} (--pin-linf) is not below any loss of the runs kept (the largest "
                                f"{top['eval_macro_loss']:.6g}, run {top['run_id']}): the law L∞ + A·C^(−α) lies "
                                f"above every run; allowed values: 0 <= L∞ < {top['eval_macro_loss']:.6g}")


@pytest.mark.slow
def test_analyze_with_one_loss_of_1e308_names_the_run_and_estimates_the_multipliers(tmp_path):
    root = _study(tmp_path)
    d = sorted((root / "runs").iterdir())[5]
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**s, "eval_macro_loss": 1e308}))
    assert main(["analyze", str(root), "--report-dir", str(tmp_path / "rep"), "--n-boot", "0"]) == 2  # named last
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"- left out: {d.name}: cannot read runs/{d.name}/summary.json: eval_macro_loss=1e+308" in md
    assert "SVD did not converge" not in md
    xsa = next(x for x in md.splitlines() if x.startswith("| xsa | "))
    assert xsa.split("|")[2].strip()[:1].isdigit(), xsa  # a multiplier, not n/a
