"""The LR profile every study that varies an LR-coupled factor runs before its design (docs/method.md §4.6)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from marin_ablate.ablations.designs import full_factorial
from marin_ablate.ablations.factors import RECIPE_FACTORS, Factor
from marin_ablate.ablations.ladders import Rung
from marin_ablate.ablations.study import Study
from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.sweeps.executors import ExecOptions
from marin_ablate.sweeps.tuning import ProfileOptions, lr_plan, profile_loop, profile_study


def tiny_study(factors=("optimizer",), steps: int = 2) -> Study:
    """2^k arms of the tiny preset, a few steps each (as tests/sweeps/test_sweeps.py builds it)."""
    rung = Rung("tiny", "tiny", fixed_steps=steps, batch_size=2,
                train_overrides={"eval_batches": 1, "eval_every": steps, "checkpoint_every": 2, "log_every": 1})
    return Study(name="tiny", description="tiny test study", factors=tuple(factors),
                 design=full_factorial(list(factors)), rungs=(rung,), seeds=(0,),
                 executor={"executor": "local", "max_parallel": 2, "cpus_per_task": 1, "timeout_min": 20})


def planted(optima: dict[str, float], curvature: float = 0.05):
    """The eval loss of a level at log2 multiplier x: 3 + curvature·(x − its optimum)², every point run."""
    calls = []

    def run_points(grids):
        calls.append({g: list(v) for g, v in grids.items()})
        return {g: [(x, 3.0 + curvature * (x - optima[g]) ** 2) for x in xs] for g, xs in grids.items()}

    return run_points, calls


def test_lr_coupled_is_a_property_of_the_factor_row():
    assert RECIPE_FACTORS["optimizer"].lr_coupled and not RECIPE_FACTORS["xsa"].lr_coupled
    assert tiny_study(("xsa", "optimizer")).lr_coupled == (RECIPE_FACTORS["optimizer"],)
    own = Factor("wd", field="train.weight_decay", levels={"lo": 0.0, "hi": 0.1}, lr_coupled=True)
    assert own.to_dict()["lr_coupled"] is True
    with pytest.raises(ValueError, match="lr_coupled='yes'; allowed values: True, False"):
        Factor("wd", field="train.weight_decay", levels={"lo": 0.0, "hi": 0.1}, lr_coupled="yes")


def test_an_edge_optimum_extends_the_grid_until_it_is_interior():
    run_points, calls = planted({"optimizer=adamw": -0.3, "optimizer=hyperball": 3.3})
    prof, grids, n_ext = profile_loop(["optimizer=adamw", "optimizer=hyperball"], ProfileOptions(), run_points, "s")
    assert n_ext == 1 and len(calls) == 2
    assert grids["optimizer=adamw"] == [-2.0, -1.0, 0.0, 1.0, 2.0]  # interior at once: never extended
    assert grids["optimizer=hyperball"] == [-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    assert not any(p.edge for p in prof.values())
    assert prof["optimizer=hyperball"].x_opt == pytest.approx(3.3)
    assert prof["optimizer=adamw"].multiplier == pytest.approx(2 ** -0.3)


def test_an_optimum_past_every_extension_is_refused_naming_the_level_and_grid():
    run_points, calls = planted({"optimizer=adamw": 0.0, "optimizer=hyperball": -9.0})
    with pytest.raises(ValueError, match=r"LR profile of optimizer=hyperball: optimum on the grid's edge .* after 2 "
                                         r"extension\(s\) of the grid \(log2 multipliers \[-6\.0, -5\.0, .*, 2\.0\]\)"):
        profile_loop(["optimizer=adamw", "optimizer=hyperball"], ProfileOptions(), run_points, "s")
    assert len(calls) == 3


def test_a_planted_lr_offset_flips_the_sign_untuned_and_the_profiled_design_recovers_it():
    """Hyperball's true gain is ln M = +0.3 (all-off arm's law), but its heuristic LR is 4x too low
    (optimum at log2 = 2); each octave off costs 0.05·x² nats. The profile finds the offset (interior,
    after one extension); the design at the profiled LRs recovers the sign the heuristic one flips."""
    optima = {"optimizer=adamw": 0.0, "optimizer=hyperball": 2.0}
    run_points, _ = planted(optima)
    prof, grids, n_ext = profile_loop(list(optima), ProfileOptions(), run_points, "s")
    assert n_ext == 1 and not prof["optimizer=hyperball"].edge
    m_hb = prof["optimizer=hyperball"].multiplier
    assert m_hb == pytest.approx(4.0, rel=1e-6)
    truth = SimTruth(["xsa", "optimizer"], main={"xsa": 0.05, "optimizer": 0.15}, linf=2.0, A=400.0, alpha=0.2,
                     c_ref=1e14, noise_sd=0.003, seed_sd=0.0, flops_per_token=1e6)
    rungs = {f"r{n}": n * 8192.0 for n in (32, 64, 128, 256)}

    def table(mult_hb: float):
        df = simulate_table(truth, rungs=rungs, seeds=1, rng=np.random.default_rng(3))
        off = np.log2(mult_hb) - optima["optimizer=hyperball"]
        df.loc[df["optimizer"] == truth.level_names("optimizer")[1], "eval_macro_loss"] += 0.05 * off ** 2
        return df

    def optimizer_lnm(df):
        a = analyze_table(df, n_boot=0, boot_method="none", law_forms=("power",), replicates=False)
        c = a.components
        return float(c[(c["response"] == "ln_M") & (c["component"] == "optimizer")]["shapley"].iloc[0])

    assert optimizer_lnm(table(1.0)) < 0  # the heuristic LR: a loss
    assert optimizer_lnm(table(m_hb)) == pytest.approx(0.3, abs=0.05)  # profiled: the planted gain


@pytest.mark.slow  # real training runs of a profile, twice
def test_a_real_profile_records_its_runs_and_provenance_and_resumes(tmp_path):
    study = tiny_study(("optimizer",), steps=2)
    opts = ExecOptions(executor="debug")
    popts = ProfileOptions(points=3, span=2.0, max_extensions=4)
    res = profile_study(study, tmp_path, opts, popts, progress=False)
    # 2-step runs want far more than the heuristic LR: the grid is extended (measured: 3 times), never cut at its edge
    m0 = res.multipliers[0]
    assert res.extensions >= 1 and m0["optimizer"]["hyperball"] > m0["optimizer"]["adamw"]
    assert set(res.multipliers) == {0} and set(m0) == {"optimizer"} and set(m0["optimizer"]) == {"adamw", "hyperball"}
    assert not any(p.edge for p in res.profiles.values())
    assert set(res.pooled) == {"optimizer=adamw", "optimizer=hyperball"}
    got = json.loads((tmp_path / "tiny" / "profile" / "lr_profile.json").read_text())
    assert got["multipliers"] == {"0": m0} and got["created"] == res.created and got["seeds"] == [0]
    n_runs = sum(len(g) for g in res.grids.values())
    assert len(list((tmp_path / "tiny" / "profile" / "runs").iterdir())) == n_runs
    again = profile_study(study, tmp_path, opts, popts, progress=False)
    assert again.report.submitted == 0 and again.multipliers == res.multipliers and again.created == res.created
    mult, prov = lr_plan(study, tmp_path, None)
    assert prov == {"lr_source": "profile", "lr_profile": str(tmp_path / "tiny" / "profile" / "lr_profile.json"),
                    "lr_profile_date": res.created}
    hb = [a for a in study.arm_names if a != "all_off"][0]
    assert mult == {0: {"all_off": m0["optimizer"]["adamw"], hb: m0["optimizer"]["hyperball"]}}
    # a study at a seed the file lacks has no profile to read (status then plans the heuristic's runs)
    assert lr_plan(replace(study, seeds=(0, 1)), tmp_path, None)[1] == {"lr_source": "heuristic"}


def test_each_seed_runs_its_own_profiled_multipliers(tmp_path):
    from marin_ablate.sweeps.sweep import planned_runs

    study = replace(tiny_study(("optimizer",)), seeds=(0, 1))

    def lrs(mult, **kw):
        return {(r.meta["seed"], r.meta["arm"]): r.spec.train.lr_scale
                for r in planned_runs(study, tmp_path, lr_multipliers=mult, **kw)}

    hb = [a for a in study.arm_names if a != "all_off"][0]
    assert lrs({0: {"all_off": 0.5}, 1: {"all_off": 2.0}}) == {(0, "all_off"): 0.5, (1, "all_off"): 2.0,
                                                                (0, hb): 1.0, (1, hb): 1.0}
    # an override of the LR scale is the user's: it keeps its value at every arm
    assert set(lrs({0: {"all_off": 0.5}, 1: {}}, overrides=["train.lr_scale=3"]).values()) == {3.0}
    with pytest.raises(ValueError, match=r"lr_multipliers give no seed 1; allowed values: \{seed: \{arm: "):
        lrs({0: {"all_off": 0.5}})
    with pytest.raises(ValueError, match=r"lr_multipliers give no seed 0, 1; allowed values"):
        lrs({"all_off": 0.5})  # one shape: {seed: {arm: multiplier}}, never {arm: multiplier}
    with pytest.raises(ValueError, match=r"unknown arm\(s\) \['nope'\]"):
        lrs({0: {"nope": 0.5}, 1: {}})


def test_the_smoke_reference_ladder_is_the_baseline_arm_on_seven_rungs_and_three_seeds():
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.sweeps.reference import reference_key, reference_specs

    study = get_study("smoke")
    specs = reference_specs(study)
    assert len(specs) == 21 and len({s.run_id for s, _ in specs}) == 21
    assert {m["seed"] for _, m in specs} == {0, 1, 2} and all(m["factors"] == study.baseline_levels() for _, m in specs)
    assert sorted({s.train.steps for s, _ in specs}) == [16, 32, 64, 128, 256, 512, 1024]
    assert all(s.train.lr_scale == 1.0 for s, _ in specs)  # the heuristic LR: the key does not follow a profile
    assert reference_key(specs) == reference_key(reference_specs(get_study("smoke", seeds=[1])))
    with pytest.raises(ValueError, match="make the baseline ladder's rungs .* the same run; allowed: .* or --no-pin"):
        reference_specs(study, ["train.steps=6"])


def test_a_cached_law_of_the_former_ellipse_rule_is_refitted_from_its_finished_runs(tmp_path, monkeypatch):
    """A reference_law.json without a valley (the straight-ellipse rule's) in the cache is not reused: `run` refits
    it from the ladder's runs, which are done and not run again, and writes the profile's valley."""
    import json

    import numpy as np

    from marin_ablate.ablations.studies import get_study
    from marin_ablate.analysis.fit.reflaw import LAW_FILE, PinnedLaw
    from marin_ablate.marin.flops import trained_totals
    from marin_ablate.sweeps.executors import ExecOptions
    from marin_ablate.sweeps.reference import cache_root, pin_reference_law, reference_key, reference_specs
    from marin_ablate.sweeps.runs import plan_runs, read_json, write_run_files

    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "cache"))
    study = get_study("smoke")
    specs = reference_specs(study)
    cdir = cache_root() / reference_key(specs)
    rng = np.random.default_rng(0)
    written = {}
    for r in plan_runs(specs, cdir):  # finished runs of a planted law L = 2 + 400·C^−0.2 at the FLOPs each trains
        write_run_files(r)
        C = trained_totals(read_json(r.dir / "spec.json"))["flops"][0]
        loss = 2.0 + 400 * C**-0.2 + 0.01 * rng.standard_normal()
        written[r.dir] = json.dumps({"status": "completed", "train_flops": C, "eval_macro_loss": loss})
        (r.dir / "summary.json").write_text(written[r.dir])
    old = PinnedLaw(2.0, 0.2, np.array([[0.04, 0.005], [0.005, 0.001]]), 400.0, 1.6e10, 1e12, 21, 17, "k", "then")
    (cdir / LAW_FILE).write_text(json.dumps(old.to_dict()))
    law = pin_reference_law(study, tmp_path / "study", ExecOptions(), progress=False)
    assert isinstance(law, PinnedLaw) and len(law.valley) >= 3 and law.created != "then"
    assert read_json(cdir / LAW_FILE)["valley"] == [list(v) for v in law.valley]
    assert read_json(tmp_path / "study" / LAW_FILE)["valley"] == [list(v) for v in law.valley]
    assert all(d.joinpath("summary.json").read_text() == w for d, w in written.items())  # none trained again


def test_the_lr_profile_never_runs_at_full_scale_the_hero_takes_the_heuristic_and_says_why(tmp_path):
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.sweeps.tuning import PROFILE_MAX_RUN_FLOPS, lr_plan, profile_cost, profile_skipped

    hero = get_study("hero")
    assert hero.lr_coupled  # it would profile: the gate, not the study, stops it
    why = profile_skipped(hero)
    assert "hero_535b" in why and f"{PROFILE_MAX_RUN_FLOPS:.0e}" in why and "heuristic" in why
    assert profile_cost(hero) is None
    mult, prov = lr_plan(hero, tmp_path, None)
    assert mult is None and prov == {"lr_source": "heuristic", "lr_profile_skipped": why}
    assert not (tmp_path / "hero").exists()  # nothing ran or was written
    from marin_ablate.sweeps.reference import before_design

    assert sum(r["runs"] for r in before_design(hero, str(tmp_path))) == 0  # `plan hero` lists no profile run
    for name in ("smoke", "marin535"):  # studies whose profile rung is under the threshold still profile
        assert profile_skipped(get_study(name)) is None and profile_cost(get_study(name))["runs"] > 0


def _hyperball_like(x: float, opt: float = 2.3) -> float:
    """Flat near its optimum (0.02 nats per log2²), a nat higher at 1/4x: the asymmetric shape Hyperball's
    profiles have on the CPU rungs."""
    return 3.0 + 0.02 * (x - opt) ** 2 + 0.25 * max(0.0, -x) ** 2


def test_the_profile_vertex_is_the_best_point_and_its_neighbours_not_a_far_steep_point():
    from marin_ablate.analysis.fit.lr_profile import PROFILE_WINDOW
    from marin_ablate.sweeps.tuning import fit_profile

    grid = [-2.0, -1.0, 0.0, 1.0, 2.0]  # the default grid, 1/4x .. 4x
    loss = [_hyperball_like(x, opt=1.3) for x in grid]
    p = fit_profile(grid, loss, grid, window=PROFILE_WINDOW)
    assert p.x == (0.0, 1.0, 2.0) and not p.edge
    assert p.x_opt == pytest.approx(1.3, abs=1e-9)  # the local curve is exactly quadratic: its vertex is found
    assert p.coef[0] == pytest.approx(0.02, abs=1e-9)
    five = fit_profile(grid, loss, grid, window=5)  # every point, 1/4x included: bent and dragged away
    assert five.coef[0] > 0.05 and abs(five.x_opt - 1.3) > 0.3


def test_the_pooled_local_fit_describes_its_points_and_bounds_what_the_choice_costs():
    from marin_ablate.analysis.fit.lr_profile import choice_cost, local_window, optimum_interval

    grid = [-2.0, -1.0, 0.0, 1.0, 2.0]
    rng = np.random.default_rng(0)
    seeds = {s: [(x, _hyperball_like(x, opt=1.2 + 0.1 * s) + 0.3 * s + rng.normal(0, 0.002)) for x in grid]
             for s in range(4)}
    local = {s: list(zip(*local_window([x for x, _ in pts], [y for _, y in pts]), strict=True))
             for s, pts in seeds.items()}
    est = optimum_interval(local)
    every = optimum_interval(seeds)  # every point of every seed: the 1/4x point bends the shared quadratic
    assert est["resid_sd"] < 0.02 < every["resid_sd"]
    assert est["curvature"] == pytest.approx(0.02, abs=0.01) and every["curvature"] > 0.05
    assert est["lo"] < 1.35 < est["hi"]  # the seeds' mean optimum
    slope = 0.2  # nats per ln C at C_ref
    d = max(est["x_opt"] - est["lo"], est["hi"] - est["x_opt"])
    assert choice_cost(est, slope) == pytest.approx(est["curvature"] * d * d / slope)
    assert choice_cost({**est, "hi": float("inf")}, slope) == float("inf")
    assert np.isnan(choice_cost({**est, "x_opt": float("nan")}, slope))


@pytest.mark.parametrize("name", ["hero_gpu", "hero_node", "hero_rack", "hero_2rack"])
def test_the_hero_smoke_runs_profile_no_lr_and_plan_says_why(tmp_path, name):
    """docs/gpu.md step 3 runs them without --no-profile: one arm each, so no profile (hero_2rack's would have
    been 10-18 runs of 128 GPUs), and the two cluster-sized ones are over the GPU-hour budget too."""
    from marin_ablate.ablations.studies import get_study
    from marin_ablate.sweeps.reference import before_design as _before_design
    from marin_ablate.sweeps.tuning import PROFILE_MAX_GPU_HOURS, lr_plan, profile_cost, profile_skipped

    study = get_study(name)
    why = profile_skipped(study)
    assert why.startswith("no LR-coupled factor varies across its 1 arm(s) (optimizer=hyperball in every arm)")
    assert ("PROFILE_MAX_GPU_HOURS" in why) == (name in ("hero_rack", "hero_2rack")), why
    assert profile_cost(study) is None
    assert sum(r["runs"] for r in _before_design(study, str(tmp_path))) == 0
    assert "no LR profile" in _before_design(study, str(tmp_path))[0]["what"]
    mult, prov = lr_plan(study, tmp_path, ExecOptions(executor="debug"))  # what `run` calls, an executor given
    assert mult is None and prov == {"lr_source": "heuristic", "lr_profile_skipped": why}
    assert not any(tmp_path.iterdir())  # nothing submitted or written
    assert PROFILE_MAX_GPU_HOURS == 100.0


def test_a_multi_arm_gpu_study_profiles_within_the_gpu_hour_budget_and_not_above_it():
    """marin535 profiles at d768 (18 runs x 8 GPUs, ~54 H100-hours at its worst); restricted to d1024 its worst
    case is 18 runs x 16 GPUs, 334 H100-hours at the assumed 20% MFU: over the budget, the heuristic."""
    from marin_ablate.ablations.gb200 import H100
    from marin_ablate.ablations.ladders import flops_per_token
    from marin_ablate.ablations.studies import marin535
    from marin_ablate.marin.config import Recipe
    from marin_ablate.sweeps.tuning import PROFILE_MAX_GPU_HOURS, profile_rung, profile_skipped

    for rungs, skipped in ((("d512", "d768", "d1024"), False), (("d1024",), True)):
        study = marin535(rungs=rungs)
        r = next(x for x in study.rungs if x.name == profile_rung(study))
        worst = 18 * H100.gpu_hours(flops_per_token(r.model(), Recipe()) * r.tokens())
        assert (worst > PROFILE_MAX_GPU_HOURS) == skipped
        why = profile_skipped(study)
        assert (why is not None) == skipped
        if skipped:
            assert why.startswith(f"its profile (up to 18 runs of 16 GPUs at d1024) would take {worst:,.0f} GPU-hours")
