"""The report's figures and layout: a fixed heatmap scale masked by significance, nothing clipped,
readable log ticks, the Findings row carrying its qualifiers, end-arm eval loss in compute order,
both transports' drop rates, and no number for an unidentified law parameter."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import marin_ablate.analysis.report.plots as plots
from marin_ablate.analysis.calibration.simulate import SimTruth, simulate_table, study_design
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.report.writer import render_markdown

RUNGS = {"r10": 1.6e9, "r2": 1e8, "r5": 4e8}  # string order r10 < r2 < r5; compute order r2 < r5 < r10


def _analyze(df, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return analyze_table(df, n_boot=0, boot_method="none", replicates=False, **{"law_forms": ("power",), **kw})


def _study(factors, *, inter=None, seeds=2, rungs=RUNGS, design=None, seed=0, **kw):
    truth = SimTruth(factors=list(factors), main={f: 0.03 for f in factors}, inter=inter or {},
                     throughput={f: 0.01 for f in factors}, noise_sd=0.01, **kw)
    df = simulate_table(truth, rungs=rungs, seeds=seeds, rng=np.random.default_rng(seed), loss_curves=True,
                        design=design)
    return _analyze(df), df


@pytest.mark.slow
def test_interaction_heatmap_uses_one_fixed_scale_and_hatches_what_is_not_significant():
    noise, _ = _study(["xsa", "sconv", "qk_norm"])
    big, _ = _study(["xsa", "sconv", "qk_norm"], inter={("xsa", "sconv"): 0.4})
    norms = []
    for a in (noise, big):
        est, sig, ali = plots.interaction_cells(a)
        fig, ax = plots.draw_interactions(est, sig, ali, "t")
        mesh = ax.collections[0]
        norms.append((mesh.norm.vmin, mesh.norm.vmax))
        coloured = ~np.ma.getmaskarray(mesh.get_array()).reshape(est.shape)
        assert (coloured == (sig.to_numpy() & np.isfinite(est.to_numpy()))).all()  # colour only where significant
        hatched = sum(1 for p in ax.patches if p.get_hatch())
        assert hatched == int((~sig.to_numpy() & np.isfinite(est.to_numpy())).sum())  # one per non-significant cell
        plots.plt.close(fig)
    assert norms[0] == norms[1] == pytest.approx((-np.log(2), np.log(2)))  # the same scale for noise and effect
    est, sig, _ = plots.interaction_cells(noise)
    off = ~np.eye(3, dtype=bool)
    assert np.abs(est.to_numpy()[off]).max() < 0.25 * np.log(2)  # noise sits near the centre: not saturated
    assert not sig.to_numpy()[off].any()  # and hatched: no pair of pure noise is significant here
    est, sig, _ = plots.interaction_cells(big)
    assert sig.loc["xsa", "sconv"] and est.loc["xsa", "sconv"] > 0.5  # the planted pair: significant, strong


def _border_is_blank(png: Path, px: int = 2) -> bool:
    import matplotlib.image

    img = matplotlib.image.imread(png)[..., :3]
    frame = np.concatenate([img[:px].reshape(-1, 3), img[-px:].reshape(-1, 3), img[:, :px].reshape(-1, 3),
                            img[:, -px:].reshape(-1, 3)])
    return bool((frame > 0.98).all())


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 7])
def test_no_figure_is_clipped_and_every_log_axis_has_two_labelled_ticks(tmp_path, monkeypatch, k):
    """Every saved PNG is the figure's tight bounding box with a blank margin (a title or label cut at
    the edge would touch it), and each log axis labels at least two distinct ticks in its view."""
    factors = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer"][:k]
    if k == 7:
        a, df = _study(factors, seeds=1, rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8, "r3": 8e8},
                       design=study_design("smoke", factors))
    else:
        a, df = _study(factors)
    figs = []
    save = plots._save

    def spy(fig, path):
        fig.canvas.draw()
        figs.append((path.name, fig, fig.get_tightbbox(), fig.bbox_inches))
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", spy)
    out = plots.all_figures(a, df, tmp_path)
    drawn = [p for p in out.values() if p is not None]
    assert ({"forest_quality.png", "interactions.png", "scaling_fit.png", "shapley_waterfall.png"}
            <= {p.name for p in drawn})
    for p in drawn:
        assert _border_is_blank(p), f"{p.name}: something touches the image border (clipped)"
    n_log = 0
    for name, fig, tight, extent in figs:
        for ax in fig.axes:
            for which in ("x", "y"):
                if (ax.get_xscale() if which == "x" else ax.get_yscale()) != "log":
                    continue
                n_log += 1
                axis = ax.xaxis if which == "x" else ax.yaxis
                lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
                labels = [t.get_text() for t in axis.get_majorticklabels()
                          if t.get_text()
                          and lo <= (t.get_position()[0] if which == "x" else t.get_position()[1]) <= hi]
                assert len(labels) >= 2 and len(set(labels)) == len(labels), (name, labels)
        assert tight.width > 0 and tight.height > 0
    assert n_log >= 2  # forest and scaling at least


def test_log_ticks_label_a_span_under_a_decade_and_one_over_many_decades():
    for lo, hi in ((0.97, 1.03), (0.999, 1.001), (0.81, 1.08), (0.8, 1.6), (5e16, 1.5e18), (1e8, 1e13)):
        fig, ax = plots.plt.subplots()
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ticks = plots.log_ticks(ax)
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.xaxis.get_majorticklabels() if t.get_text()]
        plots.plt.close(fig)
        assert len(ticks) >= 3 and all(lo <= t <= hi for t in ticks), (lo, hi, ticks)
        assert len(set(labels)) == len(labels) >= 3, (lo, hi, labels)


def test_findings_lead_with_qualifiers_beside_each_verdict_then_the_forest_figure(tmp_path):
    factors = ["xsa", "optimizer", "ep_transport"]
    a, df = _study(factors)
    # both transports drop tokens; the recipe one more than the baseline one at every rung
    code = np.where(df["ep_transport"] == "on", 1, -1)
    rung_i = df["rung"].map({"r2": 0, "r5": 1, "r10": 2}).to_numpy()
    df["drop_rate"] = np.where(code > 0, 0.078, 0.064) + 0.001 * rung_i
    a = _analyze(df)
    figs = {"forest_quality": tmp_path / "figures" / "forest_quality.png", "waterfall": None}
    md = render_markdown(a, df, figs, tmp_path, title="t")
    find = md.split("## Findings")[1].split("## Warnings")[0]
    head = next(ln for ln in find.splitlines() if ln.startswith("| component "))
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert cols.index("qualifiers") == cols.index("wall-clock M_flop·R") + 1  # beside the verdicts
    table = find.split(head)[1].split("\n\n")[0]  # the verdict table (the paired per-rung one follows it)
    rows = {ln.split("|")[1].strip(): dict(zip(cols, (c.strip() for c in ln.strip("|").split("|")), strict=True))
            for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| component")}
    assert "LRs untuned" in rows["optimizer"]["qualifiers"] and "LRs untuned" not in rows["xsa"]["qualifiers"]
    assert re.search(r"off 6\.4–6\.6%, on 7\.8–8\.0%", rows["ep_transport"]["qualifiers"])
    assert rows["xsa"]["qualifiers"] == "—"
    # the forest figure comes right after the Findings table, before the warnings
    assert find.index("](figures/forest_quality.png)") > find.index("| TOTAL ")
    assert md.count("](figures/forest_quality.png)") == 1
    # the drop warning names both transports' rates at every rung, in compute order
    w = next(ln for ln in md.split("## Warnings")[1].splitlines() if "drop routed tokens" in ln)
    assert "(off / on, per rung): r2 6.4% / 7.8%, r5 6.5% / 7.9%, r10 6.6% / 8.0%" in w
    # the eval section: the two end arms per rung in compute order; every arm only in the appendix
    ev = md.split("## Evaluation sets")[1].split("## Reference law")[0]
    order = [ln.split("|")[1].strip() for ln in ev.splitlines() if re.match(r"\| r\d", ln)]
    assert order == ["r2", "r5", "r10"]
    assert "all-off macro loss" in ev and "all-on macro loss" in ev
    app = md.split("### Evaluation per arm")[1].split("###")[0]
    arms_rungs = [ln.split("|")[1].strip() for ln in app.splitlines() if re.match(r"\| r\d", ln)]
    assert len(arms_rungs) == 3 * 8 and arms_rungs == sorted(arms_rungs, key=lambda r: RUNGS[r])


def test_an_unidentified_law_parameter_is_never_a_number(tmp_path, monkeypatch):
    """One seed, three rungs shifted by their own init: L∞ and α are not identified (analysis/fit/joint.py);
    neither they nor A show a number in the law table, and the scaling figure's legend says so."""
    truth = SimTruth(factors=["qk_norm", "sconv"], main={"qk_norm": 0.05, "sconv": 0.08}, noise_sd=0.003,
                     seed_sd=0.003, rung_sd=0.01)
    df = simulate_table(truth, rungs={f"r{j}": 1e8 * 4**j for j in range(3)}, seeds=1, rng=np.random.default_rng(2))
    a = _analyze(df)
    assert {"linf", "alpha"} <= set(a.law.not_identified)
    md = render_markdown(a, df, {}, tmp_path, title="t")
    law = md.split("## Reference law")[1].split("\n\n")[1]
    for k in ("linf", "A", "alpha"):
        row = next(ln for ln in law.splitlines() if ln.startswith(f"| {k} "))
        assert row.count("not identified") == 3, row
    legends = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (legends.extend(
        t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()), save(fig, path))[1])
    plots.scaling_fit(a, tmp_path / "s.png")
    law_label = next(t for t in legends if "L∞" in t)
    assert law_label == "law (L∞, α, A not identified)" and not re.search(r"\d", law_label)
    # why the multipliers still stand: the local slope, with its own interval
    from marin_ablate.analysis.report.writer import local_slope

    s, lo, hi = local_slope(a)
    assert lo < s < hi < 0
    assert (f"Why the multipliers stand without L∞, α and A: a multiplier needs only how much loss an e-fold of "
            f"compute buys where the rungs are, the law's local slope dL/d ln C, which the ladder fixes: "
            f"{s:.4g} nats per token per e-fold [{lo:.4g}, {hi:.4g}]") in md


@pytest.mark.slow
def test_a_resolution_iv_heatmap_draws_each_alias_group_once_and_names_its_pairs(tmp_path):
    from marin_ablate.analysis.calibration.simulate import random_truth, study_design

    factors = ["xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer"]
    rng = np.random.default_rng(3)
    t = simulate_table(random_truth(factors, rng), rungs={"r0": 1e8, "r1": 2e8, "r2": 4e8, "r3": 8e8}, seeds=1,
                       rng=rng, design=study_design("smoke", factors))
    a = _analyze(t)
    keep, label = plots.alias_cells(a)
    assert int(keep.to_numpy().sum()) == 7 and len(label) == 7  # 21 pairs in 7 groups of three: 7 cells, not 42
    assert label[("optimizer", "xsa")] == "= CD = EF"  # AG = CD = EF, as `plan smoke` prints it
    est, sig, ali = plots.interaction_cells(a)
    fig, ax = plots.draw_interactions(est, sig, ali, "t", keep=keep, label=label)
    texts = [x.get_text() for x in ax.texts]
    assert len(texts) == 7 and all("\n= " in x for x in texts) and not any("(alias)" in x for x in texts)
    plots.plt.close(fig)
    assert plots.interaction_heatmap(a, tmp_path / "h.png").stat().st_size > 1000
