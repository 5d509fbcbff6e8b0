"""`run STUDY --until.halfwidth H` (docs/method.md §4.11): the study's seeds are the pilot, Stein's rule fixes from
their scatter how many seeds the study runs in all, the added seeds train, and the analysis reports Stein's interval for
the named values; a folder planned for another target is refused before anything runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from marin_ablate.analysis.study_folder import analysis_of
from marin_ablate.cli.main import main

STUDY = '''
import dataclasses

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.ladders import get_rung
from marin_ablate.ablations.study import Study


def study(seeds=(0, 1), rungs=("cpu_s16", "cpu_s32")):
    # two sequences a step: a quarter of the smoke rungs' tokens, enough for the loss to fall between them
    return Study("tiny_until", "xsa x sconv on two tiny rungs", ("xsa", "sconv"), full_factorial(["xsa", "sconv"]),
                 rungs=tuple(dataclasses.replace(get_rung(r), batch_size=2) for r in rungs), seeds=tuple(seeds))
'''


def _xsa(a) -> dict:
    c = a.components
    return c[(c["response"] == "ln_M") & (c["component"] == "xsa")].iloc[0].to_dict()


@pytest.mark.slow
def test_run_until_adds_the_seeds_steins_rule_asks_for_and_reports_steins_interval(tmp_path, capsys):
    src = tmp_path / "tiny_until.py"
    src.write_text(STUDY)
    out, name = tmp_path / "out", f"{src}:study"
    common = ["--executor", "debug", "--out", str(out)]
    assert main(["run", name, "--no-analyze", *common]) == 0  # the pilot alone, as a plain run makes it
    pilot, _ = analysis_of(out / "tiny_until")
    s0 = float(np.std([_xsa(x)["shapley"] for x in pilot.per_seed.values()], ddof=1))
    t, law = stats.t.ppf(0.975, 1), _xsa(pilot)["shapley_se_law"]
    h = math.sqrt((t * s0) ** 2 / 3.5 + (t * law) ** 2)  # Stein's N = ceil(3.5) = 4: two seeds more
    capsys.readouterr()
    assert main(["run", name, "--until.halfwidth", f"{h:.17g}", "--until.components", "xsa", *common]) == 0
    said = capsys.readouterr().out
    plan = json.loads((out / "tiny_until" / "until.json").read_text())
    assert plan["pilot"] == [0, 1] and plan["seeds"] == 4 and plan["needs"] == {"xsa": 4}
    assert plan["pilot_sd"]["xsa"] == pytest.approx(s0, rel=1e-9)
    assert plan["law_se"]["xsa"] == pytest.approx(law, rel=1e-9)
    assert "the pilot's 2 seeds ask for 4 in all (xsa 4)" in said
    a, table = analysis_of(out / "tiny_until")
    assert sorted(table["seed"].unique()) == [0, 1, 2, 3] and len(table) == 4 * 4 * 2  # 4 seeds x 4 arms x 2 rungs
    x = _xsa(a)
    # Stein: the pilot's sd, t on its 1 df, N = 4; at the pilot's law share the plan's half-width is within the target
    # (this study fits its law from its own runs, so the share moves as seeds are added; a pinned law's does not)
    assert t * math.sqrt(s0**2 / 4 + law**2) <= h + 1e-12 and x["shapley_df"] == 1
    half = t * math.sqrt(s0**2 / 4 + x["shapley_se_law"] ** 2)
    assert x["shapley_hi"] == pytest.approx(x["shapley"] + half, abs=1e-12)
    assert x["shapley_lo"] == pytest.approx(x["shapley"] - half, abs=1e-12)
    # the same plan resumes with nothing to run; another target is refused before anything runs
    before = sorted(p.name for p in (out / "tiny_until" / "runs").iterdir())
    assert main(["run", name, "--until.halfwidth", "0.5", *common]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "until.json was planned for pilot seeds [0, 1]" in err[0] and "delete the file" in err[0]
    assert sorted(p.name for p in (out / "tiny_until" / "runs").iterdir()) == before


def test_an_unknown_until_component_is_refused_before_anything_runs(tmp_path, capsys):
    src = tmp_path / "tiny_until.py"
    src.write_text(STUDY)
    assert main(["run", f"{src}:study", "--until.components", "xsa,nope", "--executor", "debug",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["marin-ablate run: error: --until.components nope: not a component of study 'tiny_until'; "
                   "allowed values: xsa, sconv, TOTAL"]
    assert not (tmp_path / "out").exists()


def test_plan_says_how_many_seeds_run_until_expects_and_what_they_cost(capsys):
    from marin_ablate.analysis.calibration.precision import default_noise, until_expectation
    from marin_ablate.analysis.fit.stopping import Until
    from marin_ablate.sweeps.sweep import resolve_study

    assert main(["plan", "smoke", "--until.halfwidth", "0.2", "--until.components", "optimizer,TOTAL"]) == 0
    out = capsys.readouterr().out
    want = until_expectation(resolve_study("smoke"), default_noise(), Until(0.2, ("optimizer", "TOTAL")))
    for r in want.itertuples():
        assert f"  {r.component}: seed sd {r.seed_sd:.3g} in ln M, {r.seeds} seeds" in out
    n = int(want["seeds"].max())
    assert f"expected: {n} seeds in all ({n - 8} added; capped at --until.max_seeds 64)" in out and n > 8
