"""Results table, report, forecasts, notebook and the no-torch rule of `analysis`."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from marin_ablate.analysis.calibration.forecast import judge, read_forecasts, write_forecast
from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, write_study
from marin_ablate.analysis.io.results import collect, factor_codes, factor_coding, factor_columns
from marin_ablate.analysis.pipeline import analyze_table

FACTORS3 = ["xsa", "sconv", "ep_transport"]
RUNGS = {"r0": 1e8, "r1": 4e8, "r2": 1.6e9}


def _study(tmp_path: Path, *, fail=0, missing=0, seed=0, drop_arms=()) -> tuple[Path, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    df = simulate_table(random_truth(FACTORS3, rng), rungs=RUNGS, seeds=2, rng=rng, fail=fail, missing=missing,
                        loss_curves=True)
    df = df[~df["arm"].isin(drop_arms)]
    return write_study(df, tmp_path / "study"), df


def test_analysis_imports_no_torch():
    code = ("import importlib, pkgutil, sys\nfrom marin_ablate import analysis\n"
            "for m in pkgutil.walk_packages(analysis.__path__, 'marin_ablate.analysis.'):\n"
            "    importlib.import_module(m.name)\n"
            "import marin_ablate.cli.analyze, marin_ablate.analysis.report.plots, marin_ablate.analysis.report.writer\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "extra = sorted(k for k in sys.modules if k.startswith('marin_ablate.marin'))\n"
            "assert extra == ['marin_ablate.marin', 'marin_ablate.marin.fields', 'marin_ablate.marin.plugins',\n"
            "                 'marin_ablate.marin.schema'], extra\n"
            "print(len([k for k in sys.modules if k.startswith('marin_ablate.analysis')]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) >= 10


def test_collect_reads_each_factor_and_its_coding_from_the_runs(tmp_path):
    rng = np.random.default_rng(0)
    truth = random_truth(["window", "router_balance"], rng,
                         levels={"window": ("short", "long"), "router_balance": ("aux_free", "quantile")})
    sd = write_study(simulate_table(truth, rungs=RUNGS, seeds=1, rng=rng), tmp_path / "s")
    t = collect(sd, write=False)
    assert factor_coding(t) == {"window": ("short", "long"), "router_balance": ("aux_free", "quantile")}
    assert factor_columns(t) == ["window", "router_balance"]  # the study's order
    codes = factor_codes(t, "window")
    assert set(codes) == {-1, 1} and all((c == 1) == (lv == "long") for c, lv in zip(codes, t["window"], strict=True))
    with pytest.raises(ValueError, match="unknown factor 'xsa'; allowed values .*window, router_balance"):
        factor_codes(t, "xsa")


def test_collect_reports_missing_and_failed_runs(tmp_path):
    sd, df = _study(tmp_path, fail=2, missing=3)
    t = collect(sd)
    assert (sd / "results.parquet").exists()
    assert len(t) == len(df)
    assert t["status"].value_counts().to_dict() == {"completed": len(df) - 5, "failed": 2, "missing": 3}
    for col in ("run_id", "study", "rung", "arm", "seed", "xsa", "ep_transport", "train_flops", "eval_macro_loss",
                "loss_web", "model_flops_per_s", "drop_rate", "status", "error", "hardware", "code_version"):
        assert col in t.columns, col
    assert t.loc[t["status"] == "failed", "error"].str.contains("simulated failure").all()
    assert set(t["xsa"]) == {"off", "on"} and all(sorted(json.loads(c)) == sorted(FACTORS3) for c in t["coding"])
    pd.testing.assert_frame_equal(pd.read_parquet(sd / "results.parquet"), t)


def test_unbalanced_failed_study_is_analysed_with_what_is_estimable(tmp_path):
    # Two whole arms lost (+ failures): one of the 2FIs is no longer estimable.
    sd, df = _study(tmp_path, fail=2, missing=3, drop_arms=("++-", "+-+"))
    from marin_ablate.cli.main import main

    rc = main(["analyze", str(sd), "--n-boot", "20", "--no-figures", "--report-dir", str(tmp_path / "rep")])
    assert rc == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    nf, nm = int((df["status"] == "failed").sum()), int((df["status"] == "missing").sum())
    assert nm > 0 and f"{nf} failed, {nm} missing" in md and "missing: " in md
    assert "Not estimable" in md and "main-effects model" in md
    t = collect(sd, write=False)
    a = analyze_table(t, n_boot=0)
    assert a.not_estimable()
    c = a.components[a.components["response"] == "ln_M"].set_index("component")
    # every Shapley value is reported (from the main-effects model); what the full model cannot
    # estimate is reported as such, never as a number
    assert "quality" in a.reduced and c.loc[FACTORS3, "shapley_estimable"].all()
    assert (~c["loo_estimable"]).any() and c.loc[~c["loo_estimable"], "loo"].isna().all()


@pytest.mark.slow  # a full analysis with its bootstrap and every figure
def test_report_writes_markdown_html_and_relative_figure_links(tmp_path, capsys):
    sd, _ = _study(tmp_path, fail=1)
    from marin_ablate.cli.main import main

    assert main(["analyze", str(sd), "--n-boot", "20", "--target", "5e18"]) == 0
    out = capsys.readouterr().out
    assert "component" in out and "M_flop" in out and "M_flop·R" in out and "TOTAL" in out
    rep = sd / "report"
    md, html = (rep / "report.md").read_text(), (rep / "report.html").read_text()
    for name in ("forest_quality", "shapley_waterfall", "interactions", "loss_curves", "scaling_fit", "drop_rate"):
        assert f"](figures/{name}.png)" in md
        assert (rep / "figures" / f"{name}.png").stat().st_size > 1000
        assert f'src="figures/{name}.png"' in html
    assert "<table>" in html and "Extrapolation to the target compute" in md


def test_analyze_refuses_unknown_study_with_exit_2(tmp_path, capsys):
    from marin_ablate.cli.main import main

    assert main(["analyze", str(tmp_path / "nope")]) == 2
    assert "STUDY" in capsys.readouterr().err


def test_forecast_is_immutable_hashed_and_scored_beside_the_outcome(tmp_path):
    sd, df = _study(tmp_path)
    t = collect(sd)
    a = analyze_table(t, n_boot=30)
    target = 6.4e9 * 6e8
    path = write_forecast(sd, a, t, target_compute=target, arm="recipe", now=1.8e9)
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    with pytest.raises(FileExistsError):  # the same forecast is never rewritten
        write_forecast(sd, a, t, target_compute=target, arm="recipe", now=1.8e9)
    (fc,) = read_forecasts(sd)
    assert fc["valid_hash"] and (fc["content"]["prediction"]["loss_lo"] < fc["content"]["prediction"]["loss"]
                                 < fc["content"]["prediction"]["loss_hi"])
    assert judge(fc, t, a.factors)["status"].startswith("pending")
    # the target run arrives after the forecast: scored beside it
    truth_loss = fc["content"]["prediction"]["loss"] + 0.001
    run = t[t["arm"] == "+++"].iloc[0].copy()
    run["run_id"], run["rung"], run["train_flops"], run["eval_macro_loss"], run["started_at"] = (
        "tgt", "r3", target, truth_loss, 1.9e9)
    t2 = pd.concat([t, run.to_frame().T], ignore_index=True)
    j = judge(fc, t2, a.factors)
    assert j["status"] == "scored" and j["outcome"] == pytest.approx(truth_loss)
    # a forecast written after the target run started is refused
    t3 = t2.copy()
    t3.loc[t3["run_id"] == "tgt", "started_at"] = 1.7e9
    assert judge(fc, t3, a.factors)["status"].startswith("refused")
    with pytest.raises(ValueError, match="already started"):
        write_forecast(sd, a, t3, target_compute=target, arm="recipe", now=1.8e9 + 5)
    # tampering with the content breaks the hash
    d = json.loads(path.read_text())
    d["content"]["prediction"]["loss"] += 0.1
    os.chmod(path, 0o644)
    path.write_text(json.dumps(d))
    assert judge(read_forecasts(sd)[0], t2, a.factors)["status"].startswith("tampered")


def test_forecast_command_writes_and_report_shows_it(tmp_path, capsys):
    sd, _ = _study(tmp_path)
    from marin_ablate.cli.main import main

    assert main(["analyze", str(sd), "--forecast", "--target", "4e18", "--n-boot", "20"]) == 0
    assert "forecast " in capsys.readouterr().out
    assert main(["analyze", str(sd), "--n-boot", "0", "--no-figures"]) == 0
    md = (sd / "report" / "report.md").read_text()
    assert "pending: no completed target run yet" in md


NOTEBOOK = Path(__file__).parents[2] / "analysis" / "notebooks" / "attribution.ipynb"


def _run_notebook(args: list[str], launch: Path, **env) -> subprocess.CompletedProcess:
    """Runs a notebook tool as a user would from a shell in `launch` (the shell sets PWD)."""
    e = {k: v for k, v in os.environ.items() if k not in ("MARIN_RESULTS", "MARIN_SIMULATE", "MARIN_CWD")}
    e.update(PWD=str(launch), MARIN_N_BOOT="10", **env)
    return subprocess.run([sys.executable, "-m", *args], cwd=launch, env=e, capture_output=True, text=True, timeout=300)


def _outputs(path: Path) -> list[dict]:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


@pytest.mark.slow
def test_notebook_executes_headless_on_a_relative_path_from_where_it_was_launched(tmp_path):
    """nbconvert runs the kernel in the notebook's folder; MARIN_RESULTS=study (relative) still means
    the study beside the user's shell. papermill's `-p results` does the same."""
    pytest.importorskip("nbconvert")
    pytest.importorskip("papermill")
    rng = np.random.default_rng(1)
    launch = tmp_path / "launch"
    write_study(simulate_table(random_truth(FACTORS3, rng), rungs=RUNGS, seeds=2, rng=rng), launch / "study")
    (tmp_path / "tmp").mkdir()
    r = _run_notebook(["nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK),
                       "--output-dir", str(tmp_path / "nbc")],
                      launch, MARIN_RESULTS="study", TMPDIR=str(tmp_path / "tmp"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list((tmp_path / "tmp").glob("attribution-*"))  # the figures live in the notebook, not in /tmp
    outs = _outputs(tmp_path / "nbc" / "attribution.ipynb")
    assert any("48 runs" in o.get("text", "") and str(launch / "study") in o.get("text", "") for o in outs)
    assert not any("SIMULATED" in o.get("text", "") for o in outs)
    assert sum("image/png" in o.get("data", {}) for o in outs) >= 3
    r = _run_notebook(["papermill", str(NOTEBOOK), str(tmp_path / "pm.ipynb"), "-p", "results", "study"], launch)
    assert r.returncode == 0, r.stderr[-3000:]
    assert any("48 runs" in o.get("text", "") for o in _outputs(tmp_path / "pm.ipynb"))


@pytest.mark.slow
def test_notebook_refuses_simulated_data_unless_asked(tmp_path):
    pytest.importorskip("nbconvert")
    r = _run_notebook(["nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK), "--output-dir", str(tmp_path)],
                      tmp_path)
    assert r.returncode != 0 and "no results to analyse" in r.stderr and "MARIN_SIMULATE=1" in r.stderr
    r = _run_notebook(["nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK), "--output-dir", str(tmp_path)],
                      tmp_path, MARIN_RESULTS="nope")
    assert r.returncode != 0 and f"resolves to {tmp_path / 'nope'}, which does not exist" in r.stderr
    r = _run_notebook(["nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK), "--output-dir", str(tmp_path)],
                      tmp_path, MARIN_SIMULATE="1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert any("SIMULATED study" in o.get("text", "") for o in _outputs(tmp_path / "attribution.ipynb"))


def test_a_resolution_iv_fraction_shows_every_alias_group_estimate_in_the_heatmap_and_coefficients():
    from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, study_design
    from marin_ablate.analysis.fit.attribution import interaction_matrix
    from marin_ablate.analysis.pipeline import analyze_table

    factors = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer"]
    rng = np.random.default_rng(3)
    truth = random_truth(factors, rng)
    t = simulate_table(truth, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8, "r3": 8e8}, seeds=1, rng=rng,
                       design=study_design("smoke", factors))
    fit = analyze_table(t, n_boot=0, boot_method="none").fits["quality"]
    coef = fit.coef_table()
    aliased = coef[coef["aliased"]]
    assert len(aliased) == 7 and np.isfinite(aliased["estimate"]).all() and np.isfinite(aliased["se"]).all()
    _, ali = interaction_matrix(fit)
    off_diagonal = ~np.eye(len(factors), dtype=bool)
    assert ali.to_numpy()[off_diagonal].all()  # every pair sits in an alias group of three
    for j, term in enumerate(fit.terms):  # each pair's cell is its group's estimated sum, as seen from it
        if term.kind == "2fi":
            e, *_ = fit.contrast(fit.alias_sum(j))
            assert np.isfinite(e)


def test_a_damaged_forecast_file_is_named_not_skipped(tmp_path):
    from marin_ablate.analysis.calibration.forecast import read_forecasts
    from marin_ablate.marin.schema import DamagedFile

    (tmp_path / "forecasts").mkdir()
    bad = tmp_path / "forecasts" / "forecast-20261201.json"
    bad.write_text('{"content": {"torn')
    with pytest.raises(DamagedFile, match="forecast-20261201.json"):
        read_forecasts(tmp_path)


def test_a_joint_fit_that_did_not_converge_is_a_report_warning(tmp_path, monkeypatch):
    import marin_ablate.analysis.fit.joint as joint
    from marin_ablate.analysis.report.writer import render_markdown

    _, df = _study(tmp_path)
    a = analyze_table(df, n_boot=0, boot_method="none", replicates=False)
    assert all(jf.converged for jf in a.joint.values())
    assert not any("did not converge" in w for w in a.warnings)
    # one Levenberg–Marquardt step per start: a real, unfinished fit
    monkeypatch.setattr(joint, "MAX_ITER", 1)
    a = analyze_table(df, n_boot=0, boot_method="none", replicates=False)
    assert not a.joint["power"].converged
    w = [w for w in a.warnings if "joint law fit (power) did not converge" in w]
    assert len(w) == 1
    assert f"- {w[0]}" in render_markdown(a, df, {}, tmp_path, title="t")


def two_seed_study():
    """The fault tests' tiny study (one factor, one rung, a few steps per run) with two seeds."""
    from test_faults import sweep_study

    return sweep_study(seeds=(0, 1), name="bpb")


@pytest.mark.slow
def test_a_response_registered_in_one_place_runs_through_plan_run_analyze_report(tmp_path, monkeypatch, capsys):
    """A second metric column the trainer writes (macro bits per byte) becomes an analysis response
    by one row in analysis/responses.py: plan, run (real tiny training runs), analyze, report."""
    from marin_ablate.analysis.responses import RESPONSES, Response
    from marin_ablate.cli.main import main

    bpb = Response("bpb", "ln_bpb", "macro bits/byte ratio", "bpb", "macro bits per byte ratio", source="macro_bpb")
    monkeypatch.setitem(RESPONSES, bpb.name, bpb)  # the one edit
    assert main(["plan", "test_analysis_report:two_seed_study"]) == 0
    assert main(["run", "test_analysis_report:two_seed_study", "--out", str(tmp_path), "--executor", "debug",
                 "--no-analyze"]) == 0
    sd = tmp_path / "bpb"
    t = collect(sd)
    assert (t["status"] == "completed").sum() == 4 and t["macro_bpb"].gt(0).all()
    assert main(["analyze", str(sd), "--n-boot", "20", "--pin-alpha", "0.3"]) == 0
    capsys.readouterr()
    md = (sd / "report" / "report.md").read_text()
    assert "macro bits/byte ratio" in md.split("## Warnings")[0]  # a Findings column
    find = md.split("## Findings")[1].split("## Warnings")[0]
    head = next(ln for ln in find.splitlines() if ln.startswith("| component "))
    row = next(ln for ln in find.splitlines() if ln.startswith("| xsa "))
    cell = dict(zip(head.split("|"), row.split("|"), strict=True))[" macro bits/byte ratio "]
    assert re.fullmatch(r" \d+\.\d+ \[\d+\.\d+, \d+\.\d+\].*", cell), cell  # a multiplier with its interval
    assert "](figures/forest_bpb.png)" in md and (sd / "report" / "figures" / "forest_bpb.png").stat().st_size > 1000
    # the ratio it reports is the runs' own: exp(Shapley) = geometric-mean bpb ratio of xsa on vs off
    a = analyze_table(t, n_boot=0, boot_method="none", pin_alpha=0.3)
    c = a.components.set_index(["response", "component"]).loc[("ln_bpb", "xsa")]
    x = a.table["x_xsa"].to_numpy()
    lb = np.log(a.table["macro_bpb"].to_numpy(float))
    assert c["shapley"] == pytest.approx(lb[x > 0].mean() - lb[x < 0].mean(), abs=1e-9)


def test_a_response_that_cannot_be_fitted_is_refused_naming_the_field():
    from marin_ablate.analysis.responses import RESPONSES, Response, register

    with pytest.raises(ValueError, match="family 'glm'; allowed values: law, ols, sum"):
        Response("x", "ln_x", "x", "x", "x", family="glm", source="x")
    with pytest.raises(ValueError, match="allowed transforms: ln, ln_ratio"):
        Response("x", "ln_x", "x", "x", "x", source="macro_bpb", transform="sqrt")
    with pytest.raises(ValueError, match="clashes with a registered one"):
        register(Response("quality2", "ln_M", "x", "x", "x", source="macro_bpb"))
    with pytest.raises(ValueError, match="one law response only"):
        register(Response("loss2", "ln_L2", "x", "x", "x", family="law"))
    with pytest.raises(ValueError, match=r"parts \['nope'\]; allowed values: quality, throughput, wall"):
        register(Response("s", "ln_s", "x", "x", "x", family="sum", parts=("quality", "nope")))
    assert list(RESPONSES) == ["quality", "throughput", "wall"]
    with pytest.raises(ValueError, match=r"responses \['bpb'\]; allowed values: quality, throughput, wall"):
        analyze_table(pd.DataFrame({"status": [], "train_flops": [], "eval_macro_loss": []}), responses=("bpb",))


@pytest.mark.slow  # a full analysis with every figure
def test_a_report_on_a_narrow_ladder_says_what_its_numbers_rest_on(tmp_path, capsys, recwarn):
    """C_ref defined, loss units, per-decade stated as a rate beyond a 0.6-decade ladder, the local slope
    that carries the multipliers where the law is not identified, and no raw RuntimeWarning escapes."""
    rng = np.random.default_rng(3)
    df = simulate_table(random_truth(FACTORS3, rng), rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8}, seeds=2, rng=rng,
                        loss_curves=True)
    sd = write_study(df, tmp_path / "study")
    from marin_ablate.cli.main import main

    assert main(["analyze", str(sd), "--n-boot", "0"]) == 0
    captured = capsys.readouterr()
    md = (sd / "report" / "report.md").read_text()
    assert re.search(r"C_ref = \S+ FLOPs is the reference compute: "
                     r"the geometric mean of the runs' training compute", md)
    assert "held-out cross-entropy in nats per token" in md and "L, L∞ and A are in nats per token." in md
    assert "Per decade of compute: the slope across the ladder, which spans 0.6 decades" in md
    assert md.count("Per decade of compute: the slope") == 1  # said once, not per row
    from marin_ablate.analysis.io.results import factor_coding

    coding = factor_coding(df)
    assert ("Coding (each multiplier is the +1 level over the −1 level): "
            + "; ".join(f"{f}: +1 = {coding[f][1]}, −1 = {coding[f][0]}" for f in FACTORS3) + ".") in md
    from marin_ablate.analysis.pipeline import analyze_table
    from marin_ablate.analysis.report.writer import local_slope

    a = analyze_table(df, n_boot=0)
    s, lo, hi = local_slope(a)
    assert lo < s < hi < 0  # loss falls with compute, with its own interval
    if a.law.not_identified:
        assert f"{s:.4g} nats per token per e-fold [{lo:.4g}, {hi:.4g}]" in md
    assert "RuntimeWarning" not in captured.out + captured.err
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_numerical_warning_while_fitting_is_a_report_warning_not_console_output(monkeypatch, recwarn):
    from marin_ablate.analysis import pipeline

    rng = np.random.default_rng(0)
    df = simulate_table(random_truth(FACTORS3, rng), rungs=RUNGS, seeds=2, rng=rng)
    real = pipeline._analyze_table

    def overflowing(*a, **kw):  # what an unidentified law's exp does, inside the real analysis
        np.exp(np.array([1000.0]))
        return real(*a, **kw)

    monkeypatch.setattr(pipeline, "_analyze_table", overflowing)
    a = pipeline.analyze_table(df, n_boot=0)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert any(w.startswith("numerical: overflow encountered in exp while fitting") for w in a.warnings)


@pytest.mark.slow  # two full analyses of a study
def test_the_report_puts_the_studys_drop_rates_beside_the_measured_ones_at_scale(tmp_path, capsys):
    """Without STUDY/drops_at_scale.json the section names the command that measures it; with it (as
    benchmarks/ep_drops.py --json writes it) the rates at 65,536 tokens per shard are printed."""
    sd, _ = _study(tmp_path)
    from marin_ablate.cli.main import main

    assert main(["analyze", str(sd), "--n-boot", "0", "--no-figures"]) == 0
    md = (sd / "report" / "report.md").read_text()
    assert "## Drop rates: this study's shards and the scale of Marin's claim" in md
    assert "python benchmarks/ep_drops.py --only rungs --json STUDY_DIR/drops_at_scale.json" in md
    assert re.search(r"This study's EP transports drop \w+ \d+\.\d–\d+\.\d%, \w+ \d+\.\d–\d+\.\d%", md)
    assert "Here the recipe's transport drops less, as at scale." in md  # the simulated recipe drops 0.4%, 3% off
    (sd / "drops_at_scale.json").write_text(json.dumps({"rows": [
        {"rung": "d512", "S": 8, "Ts": 65536, "fixed_drop": 0.0512, "ragged_drop": 0.0007}]}))
    assert main(["analyze", str(sd), "--n-boot", "0", "--no-figures"]) == 0
    md = (sd / "report" / "report.md").read_text()
    assert "d512 (8 shards of 65,536 tokens) fixed 5.12%, ragged 0.070%" in md
    (sd / "drops_at_scale.json").write_text("{not json")
    assert main(["analyze", str(sd), "--n-boot", "0", "--no-figures"]) == 0
    assert "drops_at_scale.json could not be read" in (sd / "report" / "report.md").read_text()
    capsys.readouterr()
    from marin_ablate.analysis.pipeline import analyze_table
    from marin_ablate.analysis.report.writer import drops_section

    df = pd.read_parquet(sd / "results.parquet")  # the smoke's reading: the recipe drops more at tiny shards
    on = df["ep_transport"] == "on"
    df.loc[on, "drop_rate"], df.loc[~on, "drop_rate"] = 0.08, 0.05
    text = " ".join(drops_section(analyze_table(df, n_boot=0), None))
    assert "so ragged drops more here" in text and "the smaller factor overflows more often" in text
    assert "python benchmarks/ep_drops.py --only rungs --json" in text


def test_a_qualifier_of_most_findings_rows_is_said_once_naming_the_rows_it_skips():
    from marin_ablate.analysis.report.writer import say_once

    q = "quality: interval spans over 10x"
    tab = pd.DataFrame({"component": ["a", "b", "c", "d", "TOTAL"],
                        "qualifiers": [q, f"LRs untuned for this arm; {q}", q, "—", q]})
    out, note = say_once(tab)
    assert list(out["qualifiers"]) == ["—", "LRs untuned for this arm", "—", "—", "—"]
    assert note == ["", "Qualifiers of most rows, said once:", f"- {q} (all rows but d)"]
    few = tab.assign(qualifiers=[q, q, "—", "—", "—"])  # two rows of five: stays where it is
    assert say_once(few)[0].equals(few) and say_once(few)[1] == []
