"""A study folder analysed: `analyze_study(folder, options)` reads its runs (or a results table), fits the
study's model with the folder's pinned law and LR profile, and writes the report; `backtest_study` and
`forecast_study` are its other two readings (docs/method.md §4). What `marin-ablate analyze` and `run`, the
notebook and the benchmarks call; each returns what it computed and the lines a console shows. No torch.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from marin_ablate.analysis.fit.replicates import Stein
from marin_ablate.analysis.fit.stopping import read_plan
from marin_ablate.analysis.io.importer import complete_table
from marin_ablate.analysis.io.pinned_law import read_pinned
from marin_ablate.analysis.io.results import DAMAGED, load_table, read_lr_profile, write_table
from marin_ablate.analysis.ofat import DESIGNS, analyze_ofat, design_kind, find_star, report_lines
from marin_ablate.analysis.report.spreadsheet import spreadsheet_csv
from marin_ablate.marin import plugins
from marin_ablate.marin.fields import SEED, option
from marin_ablate.marin.schema import atomic_write_bytes, atomic_write_text

STUDY_ROOTS_ENV = "MARIN_ABLATE_STUDIES"
MAX_BOOT = 1_000_000  # replicates: beyond this the bootstrap takes days and its draws no longer fit in memory
SEED_MAX = 2**64 - 1  # torch.manual_seed's range, as a spec's seed


@dataclass(frozen=True)
class AnalysisOptions:
    """How a study's table is fitted and reported: what `analyze`, `run`'s analysis, the forecast and the backtest
    share (the fields are `analyze`'s options: docs/cli.md)."""

    pin_linf: float | None = option(None, lo=0, help="pin L∞ of the reference law (a loss)")
    pin_alpha: float | None = option(None, lo=0, lo_open=True, help="pin α of the reference law")
    pin_A: float | None = option(None, lo=0, lo_open=True,
                                 help="pin A of the reference law (one-factor-at-a-time studies: with --pin-linf and "
                                      "--pin-alpha, a published law)")
    no_pinned_law: bool = option(False, help="fit the reference law on the study's own rungs, not the pinned one its "
                                             "folder holds (reference_law.json, from the baseline ladder "
                                             "`marin-ablate run` measures)")
    design: str = option("auto", choices=DESIGNS,
                         help="auto: one-factor-at-a-time when every arm is one change from one baseline arm, else "
                              "factorial (docs/method.md §4.8)")
    n_boot: int = option(200, lo=0, hi=MAX_BOOT, help="bootstrap replicates (0: none)")
    boot: str = option("wild", choices=("wild", "cells", "none"),
                       help="wild: Rademacher on residuals, refit law+model; cells: resample runs within arm×rung")
    hc: str = option("HC3", choices=("HC0", "HC1", "HC2", "HC3"),
                     help="robust SE type of the throughput fit (each contrast uses the larger of it and the model SE)")
    mixed: bool = option(False, help="statsmodels MixedLM for the OLS responses, a random intercept per (seed × "
                                     "rung) cluster")
    no_interactions: bool = option(False, help="main effects (+ scale) only")
    third_levels: str = option("drop", choices=("drop", "error"),
                               help="runs at a level other than recipe/baseline: leave out (noted) or refuse")
    seed: int = option(0, lo=0, hi=SEED_MAX, allowed=SEED[1], help="the bootstrap's seed")
    force_extrapolation: bool = option(False, help="allow a --target beyond 10x the top rung's compute (the "
                                                   "interval then says little)")
    target: float | None = option(None, lo=0, lo_open=True, help="extrapolate multipliers to this compute (FLOPs); "
                                                                 "--forecast: the forecast's compute")
    report_dir: str | None = option(None, metavar="DIR", help="report directory (none: STUDY/report)")
    no_figures: bool = option(False, help="no plots in the report")


@dataclass
class StudyResult:
    """What one reading of a study folder computed: the analysis (None for a one-factor-at-a-time study, whose
    `ofat` is set), its table, the files written and the console's lines."""

    folder: Path
    table: pd.DataFrame
    analysis: Any = None
    ofat: Any = None
    written: list[Path] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> str:
        """One line naming the run folders left out because they contradict themselves or cannot be read
        (analysis/io/results.py DAMAGED), '' when none: `analyze` ends with it, exit 2, once the report is written."""
        t = self.table
        bad = t[t["status"].isin(DAMAGED)] if "status" in t else t.iloc[:0]
        if not len(bad):
            return ""
        first = f"{bad['error'].iloc[0]}" if "error" in bad else str(bad["run_id"].iloc[0])
        more = f" (and {len(bad) - 1} more: see the report's Runs)" if len(bad) > 1 else ""
        md = next((p for p in self.written if p.name == "report.md"), None)
        where = f"; the report is written without {'them' if len(bad) > 1 else 'it'}: {md}" if md else ""
        return f"{len(bad)} run folder(s) left out as damaged: {first}{more}{where}"


def resolve_study(study: str | Path, lines: list[str] | None = None) -> tuple[Path, pd.DataFrame]:
    """STUDY = a study directory, a results .parquet/.csv, or a name under $MARIN_ABLATE_STUDIES, studies/, runs/;
    a study folder's plugin record is compared and noted in `lines`."""
    p = Path(study)
    roots = () if p.is_absolute() else (os.environ.get(STUDY_ROOTS_ENV), "studies", "runs", "results")
    cands = [p] + [Path(root) / study for root in roots if root]
    for c in cands:
        if c.is_file():
            return c.parent, complete_table(load_table(c), c)
        if c.is_dir() and ((c / "runs").is_dir() or (c / "results.parquet").exists()):
            # a record, compared: nothing in a study folder is imported
            (lines if lines is not None else []).extend(f"note: {n}" for n in plugins.record_notes(c))
            return c, load_table(c)
    raise ValueError(f"STUDY {str(study)!r} not found; allowed values: a study directory (with runs/), a results "
                     f".parquet or .csv, a .csv in the import schema (docs/importing.md), or a name under "
                     f"${STUDY_ROOTS_ENV}, studies/, runs/, results/ (tried {', '.join(map(str, cands))})")


def boot_bytes(n_boot: int, n_factors: int) -> int:
    """Memory the bootstrap's draws take: per replicate 3 law parameters and, for each of 4 fits
    (full and main-effects quality and throughput), one value per term (intercept, factors, their
    pairs, scale terms); twice that for the copies the intervals are taken from."""
    terms = 1 + n_factors + n_factors * (n_factors - 1) // 2 + 2
    return 2 * 8 * n_boot * (3 + 4 * terms)


def check_boot_memory(n_boot: int, table: pd.DataFrame) -> None:
    """Refuse a bootstrap whose draws would not fit in this machine's memory (before any is drawn)."""
    from marin_ablate.marin.config import FACTORS

    k = sum(f in table.columns for f in FACTORS) or len(FACTORS)
    need = boot_bytes(n_boot, k)
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not on this platform: nothing to compare with
        return
    if need > ram // 2:
        most = max(0, (ram // 2) // boot_bytes(1, k))
        raise ValueError(f"--n-boot {n_boot} needs about {need / 2**30:.1f} GiB for its draws, more than half of "
                         f"this machine's {ram / 2**30:.1f} GiB; allowed values here: an integer in 0..{most}")


def _pinned(opts: AnalysisOptions, folder: Path | None, study: str | None = None):
    """The study folder's pinned reference law, unless --no-pinned-law or a --pin-* value is given."""
    if folder is None or opts.no_pinned_law or opts.pin_linf is not None or opts.pin_alpha is not None:
        return None
    return read_pinned(folder, study)


def ofat_or_none(opts: AnalysisOptions, table: pd.DataFrame, folder: Path | None = None, lines: list | None = None):
    """The one-factor-at-a-time analysis when the runs (or --design ofat) call for it, else None (the factorial
    analysis), with the reason for a pooled design noted in `lines`. Without --pin-* values the study folder's
    pinned law gives L∞ and α (a baseline ladder's, or a published one: the `holdout` study reads every arm
    through Marin's fast-ladder law, as Marin reads its own)."""
    kind, star, note = design_kind(table) if opts.design == "auto" else (opts.design, None, "")
    if note and lines is not None:
        lines.append(f"note: {note}")
    if kind == "factorial" and opts.design == "auto" and opts.pin_A is not None and star is not None \
            and star.covers_all:  # one change against a published law: the OFAT reading of a 2-arm design
        kind = "ofat"
    if kind == "factorial":
        if opts.pin_A is not None:
            raise ValueError("--pin-A: the factorial analysis fits A jointly with every arm; allowed values: "
                             "omit it, or --design ofat for a one-factor-at-a-time study")
        return None
    if opts.target is not None:
        raise ValueError("--target: a one-factor-at-a-time study is reported per rung, not extrapolated; "
                         "allowed values: omit --target, or --design factorial")
    pins, law = dict(pin_linf=opts.pin_linf, pin_alpha=opts.pin_alpha, pin_A=opts.pin_A), _pinned(opts, folder)
    if law is not None and opts.pin_A is None:
        pins.update(pin_linf=law.linf, pin_alpha=law.alpha)
    a = analyze_ofat(table, **pins, star=star or find_star(table))
    if law is not None and opts.pin_A is None:
        a.notes.insert(0, f"L∞ = {law.linf:.4g} and α = {law.alpha:.4g} pinned from the study folder's law: "
                          f"{law.source or 'reference_law.json'} (--no-pinned-law fits them on the baseline's runs)")
    return a


def _title(table: pd.DataFrame, folder: Path) -> str:
    return str(table["study"].dropna().iloc[0]) if "study" in table and table["study"].notna().any() else folder.name


def fit_kw(opts: AnalysisOptions, folder: Path | None, table: pd.DataFrame) -> dict:
    """The fit options the report, the forecast and the backtest's refits share; a `run --until` study's pilot
    (until.json: its named values' intervals are Stein's, docs/method.md §4.11)."""
    plan = read_plan(folder) if folder is not None else None
    names = table["study"].dropna().astype(str).unique() if "study" in table else []  # the study its runs name
    return dict(pin_linf=opts.pin_linf, pin_alpha=opts.pin_alpha, hc=opts.hc, mixed=opts.mixed,
                pinned_law=_pinned(opts, folder, str(names[0]) if len(names) == 1 else None),
                interactions=not opts.no_interactions, third_levels=opts.third_levels,
                stein=Stein(plan.pilot, plan.components) if plan is not None else None)


def fit_study(opts: AnalysisOptions, table: pd.DataFrame, folder: Path | None = None, *, target: float | None = None,
              n_boot: int | None = None):
    """The factorial analysis of `table` (analysis/pipeline.py) with the folder's pinned law and LR profile."""
    from marin_ablate.analysis.pipeline import analyze_table

    n_boot = opts.n_boot if n_boot is None else n_boot
    check_boot_memory(n_boot, table)
    a = analyze_table(table, n_boot=n_boot, **fit_kw(opts, folder, table), boot_method=opts.boot,
                      target_compute=target, seed=opts.seed, force_extrapolation=opts.force_extrapolation)
    a.lr_profile = read_lr_profile(folder) if folder is not None else None
    return a


def analysis_of(study: str | Path, opts: AnalysisOptions = AnalysisOptions()):
    """(StudyAnalysis, results table) of a study folder as `analyze_study` fits it, without writing the report
    (benchmarks/seed_replication.py)."""
    folder, table = resolve_study(study)
    return fit_study(opts, table, folder, target=opts.target), table


def analyze_study(study: str | Path, opts: AnalysisOptions = AnalysisOptions(), *,
                  command: str | None = None) -> StudyResult:
    """`marin-ablate analyze STUDY`: the results table (kept as results.parquet when read from run folders), the
    factorial analysis with the forecasts the folder holds judged and a backtest line, or the one-factor-at-a-time
    report; the report under `opts.report_dir` (default STUDY/report). `command`: the command line the report
    records (default: this process's)."""
    from marin_ablate.analysis.calibration.forecast import judge, read_forecasts
    from marin_ablate.analysis.report.findings import rests_on
    from marin_ablate.analysis.report.tables import attribution_table, informative
    from marin_ablate.analysis.report.writer import write_report

    lines: list[str] = []
    folder, table = resolve_study(study, lines)
    out = Path(opts.report_dir) if opts.report_dir else folder / "report"
    res = StudyResult(folder, table, lines=lines)
    if (folder / "runs").is_dir():  # collected afresh: keep the table, under --report-dir when given
        res.written.append(write_table(table, (out if opts.report_dir else folder) / "results.parquet"))
        lines.append(f"wrote {res.written[-1]}")
    res.ofat = ofat_or_none(opts, table, folder, lines)
    if res.ofat is not None:
        return _report_ofat(res, out)
    a = res.analysis = fit_study(opts, table, folder, target=opts.target)
    fc = [judge(f, table, a.factors) for f in read_forecasts(folder)]
    bt = _report_backtest(opts, a, table, folder)
    command = command if command is not None else "marin-ablate " + " ".join(sys.argv[1:])
    md, html = write_report(a, table, out, forecasts=fc, title=_title(table, folder), figures=not opts.no_figures,
                            command=command, backtest=bt)
    tab, absent = informative(attribution_table(a))
    aliased = "aliased" in tab and (tab["aliased"] != "").any()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        # The alias chains are long at resolution IV: the report lists them; the console names them.
        lines.append(tab.drop(columns=["aliased"], errors="ignore").to_string(index=False))
    if absent:
        lines.append(f"note: {absent}")
    elif aliased:
        lines.append("note: some two-factor interactions are aliased in this design; the alias groups are in the "
                     "report")
    lines += [rests_on(a), *(f"note: {n}" for n in a.notes), *(f"warning: {w}" for w in a.warnings)]
    if bt is not None:
        lines.append(f"backtest: {bt if isinstance(bt, str) else bt.summary()}")
    res.written += [md, html]
    lines.append(f"wrote {md} and {html}")
    return res


def _report_ofat(res: StudyResult, out: Path) -> StudyResult:
    report = report_lines(res.ofat, _title(res.table, res.folder))
    md, csv = out / "report.md", out / "ofat.csv"
    atomic_write_text(md, "\n".join(report) + "\n")
    atomic_write_bytes(csv, spreadsheet_csv(res.ofat.table))  # a rung or arm named "=1+1" is text, never a formula
    res.written += [md, csv]
    res.lines += [*report[2:], f"wrote {md} and {csv}"]
    return res


def _report_backtest(opts: AnalysisOptions, a, table: pd.DataFrame, folder: Path):
    """The report's backtest line's source: None below three rungs (nothing to backtest), the reason as
    text where the refits cannot run."""
    from marin_ablate.analysis.backtest import backtest

    if len(a.rungs) < 3:
        return None
    try:
        return backtest(table, a, min_rungs=2, **fit_kw(opts, folder, table))
    except ValueError as e:
        return f"not run ({e})"
    except Exception as e:  # noqa: BLE001 — a diagnostic beside the report: its failure is printed there, not fatal
        return f"not run ({type(e).__name__}: {e}; `marin-ablate analyze STUDY --backtest` shows the traceback)"


def backtest_study(study: str | Path, opts: AnalysisOptions = AnalysisOptions(), min_rungs: int = 2) -> StudyResult:
    """`analyze STUDY --backtest`: the scale extrapolation's record on the study's own ladder (backtest.csv in the
    report directory)."""
    from marin_ablate.analysis.backtest import backtest
    from marin_ablate.analysis.report.backtest import backtest_console

    if opts.target is not None:
        raise ValueError("--target with --backtest: the backtest predicts the study's own later rungs; allowed "
                         "values: omit --target")
    lines: list[str] = []
    folder, table = resolve_study(study, lines)
    if ofat_or_none(opts, table, folder) is not None:
        raise ValueError("--backtest needs the factorial model (a one-factor-at-a-time study is not extrapolated); "
                         "allowed values: a factorial study, or --design factorial")
    a = fit_study(opts, table, folder, n_boot=0)
    bt = backtest(table, a, min_rungs=min_rungs, **fit_kw(opts, folder, table))
    csv = (Path(opts.report_dir) if opts.report_dir else folder / "report") / "backtest.csv"
    atomic_write_bytes(csv, bt.rows.to_csv(index=False).encode())
    return StudyResult(folder, table, a, written=[csv], lines=[*lines, *backtest_console(bt), f"wrote {csv}"])


def forecast_study(study: str | Path, opts: AnalysisOptions, arm: str = "recipe", note: str = "",
                   into: str | Path | None = None) -> StudyResult:
    """`analyze STUDY --forecast --target FLOPS`: an immutable pre-registered forecast of one arm's loss, in the
    forecasts/ of the study folder (or of `into`)."""
    from marin_ablate.analysis.calibration.forecast import arm_codes, write_forecast

    if opts.target is None:
        raise ValueError("--forecast needs --target FLOPS (the compute the forecast is for)")
    lines: list[str] = []
    folder, table = resolve_study(study, lines)
    if ofat_or_none(opts, table) is not None:
        raise ValueError("--forecast needs the factorial model; allowed values: a factorial study (--design factorial)")
    a = fit_study(opts, table, folder, target=opts.target)
    path = write_forecast(Path(into) if into else folder, a, table, target_compute=opts.target, arm=arm, note=note,
                          force=opts.force_extrapolation)
    pred = a.arm_prediction(arm_codes(a, arm), opts.target, force=opts.force_extrapolation)
    lines.append(f"forecast {path}: arm {arm} at {opts.target:.3g} FLOPs -> loss {pred['loss']:.4f} "
                 f"[{pred['loss_lo']:.4f}, {pred['loss_hi']:.4f}]")
    return StudyResult(folder, table, a, written=[path], lines=lines)
