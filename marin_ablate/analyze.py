"""`marin-ablate analyze` and its modes: `--import.table FILE` (runs from elsewhere into a study folder,
analysis/io/importer.py), `--forecast` (an immutable pre-registered forecast) and `--backtest` (the scale
extrapolation refitted on the first rungs and scored on the later ones, analysis/fit/backtest.py). No torch
anywhere on this path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from marin_ablate import options
from marin_ablate.analysis.io.importer import COLUMNS, LAYOUTS
from marin_ablate.analysis.ofat import DESIGNS
from marin_ablate.marin import plugins
from marin_ablate.marin.fields import SEED, option

STUDY_ROOTS_ENV = "MARIN_ABLATE_STUDIES"


def resolve_study(study: str) -> tuple[Path, pd.DataFrame]:
    """STUDY = a study directory, a results .parquet/.csv, or a name under $MARIN_ABLATE_STUDIES, studies/, runs/."""
    from marin_ablate.analysis.io.importer import complete_table
    from marin_ablate.analysis.io.results import load_table

    p = Path(study)
    cands = [p]
    if not p.is_absolute():
        for root in (os.environ.get(STUDY_ROOTS_ENV), "studies", "runs", "results"):
            if root:
                cands.append(Path(root) / study)
    for c in cands:
        if c.is_file():
            return c.parent, complete_table(load_table(c), c)
        if c.is_dir() and ((c / "runs").is_dir() or (c / "results.parquet").exists()):
            for note in plugins.record_notes(c):  # a record, compared: nothing in a study folder is imported
                print(f"note: {note}")
            return c, load_table(c)
    raise ValueError(f"STUDY {study!r} not found; allowed values: a study directory (with runs/), a results "
                     f".parquet or .csv, a .csv in the import schema (docs/importing.md), or a name under "
                     f"${STUDY_ROOTS_ENV}, "
                     f"studies/, runs/, results/ (tried {', '.join(map(str, cands))})")


MAX_BOOT = 1_000_000  # replicates: beyond this the bootstrap takes days and its draws no longer fit in memory
SEED_MAX = 2**64 - 1  # torch.manual_seed's range, as a spec's seed


@dataclass(frozen=True)
class FitOptions:
    """How the study's table is fitted: what the report and the forecast share."""

    study: str = option(positional=True, metavar="STUDY",
                        help="a study directory (runs/, e.g. one `analyze --import.table` wrote), a results table "
                             "(.parquet or .csv in the results-table schema), or a study name")
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


def _boot_bytes(n_boot: int, n_factors: int) -> int:
    """Memory the bootstrap's draws take: per replicate 3 law parameters and, for each of 4 fits
    (full and main-effects quality and throughput), one value per term (intercept, factors, their
    pairs, scale terms); twice that for the copies the intervals are taken from."""
    terms = 1 + n_factors + n_factors * (n_factors - 1) // 2 + 2
    return 2 * 8 * n_boot * (3 + 4 * terms)


def _check_boot_memory(n_boot: int, table: pd.DataFrame) -> None:
    """Refuse a bootstrap whose draws would not fit in this machine's memory (before any is drawn)."""
    from marin_ablate.marin.config import FACTORS

    k = sum(f in table.columns for f in FACTORS) or len(FACTORS)
    need = _boot_bytes(n_boot, k)
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not on this platform: nothing to compare with
        return
    if need > ram // 2:
        most = max(0, (ram // 2) // _boot_bytes(1, k))
        raise ValueError(f"--n-boot {n_boot} needs about {need / 2**30:.1f} GiB for its draws, more than half of "
                         f"this machine's {ram / 2**30:.1f} GiB; allowed values here: an integer in 0..{most}")


def _ofat_or_none(args, table: pd.DataFrame, study_dir: Path | None = None):
    """The one-factor-at-a-time analysis when the runs (or --design ofat) call for it, else None
    (the factorial analysis), with the reason for a pooled design noted on the console. Without --pin-*
    values the study folder's pinned law gives L∞ and α (a baseline ladder's, or a published one: the
    `holdout` study reads every arm through Marin's fast-ladder law, as Marin reads its own)."""
    from marin_ablate.analysis.ofat import analyze_ofat, design_kind, find_star

    kind, star, note = design_kind(table) if args.design == "auto" else (args.design, None, "")
    if note:
        print(f"note: {note}")
    if kind == "factorial" and args.design == "auto" and args.pin_A is not None and star is not None \
            and star.covers_all:  # one change against a published law: the OFAT reading of a 2-arm design
        kind = "ofat"
    if kind == "factorial":
        if args.pin_A is not None:
            raise ValueError("--pin-A: the factorial analysis fits A jointly with every arm; allowed values: "
                             "omit it, or --design ofat for a one-factor-at-a-time study")
        return None
    if getattr(args, "target", None) is not None:
        raise ValueError("--target: a one-factor-at-a-time study is reported per rung, not extrapolated; "
                         "allowed values: omit --target, or --design factorial")
    pins, law = dict(pin_linf=args.pin_linf, pin_alpha=args.pin_alpha, pin_A=args.pin_A), _pinned(args, study_dir)
    if law is not None and args.pin_A is None:
        pins.update(pin_linf=law.linf, pin_alpha=law.alpha)
    a = analyze_ofat(table, **pins, star=star or find_star(table))
    if law is not None and args.pin_A is None:
        a.notes.insert(0, f"L∞ = {law.linf:.4g} and α = {law.alpha:.4g} pinned from the study folder's law: "
                          f"{law.source or 'reference_law.json'} (--no-pinned-law fits them on the baseline's runs)")
    return a


def _pinned(args, study_dir: Path | None, study: str | None = None):
    """The study folder's pinned reference law, unless --no-pinned-law or a --pin-* value is given."""
    from marin_ablate.analysis.fit.reflaw import read_pinned

    if study_dir is None or args.no_pinned_law or args.pin_linf is not None or args.pin_alpha is not None:
        return None
    return read_pinned(study_dir, study)


def _study_name(table: pd.DataFrame) -> str | None:
    """The study the table's runs name (their meta.json), None when they name none."""
    names = table["study"].dropna().astype(str).unique() if "study" in table else []
    return str(names[0]) if len(names) == 1 else None


def _fit_kw(args, study_dir: Path | None, table: pd.DataFrame) -> dict:
    """The fit options the report, the forecast and the backtest's refits share."""
    return dict(pin_linf=args.pin_linf, pin_alpha=args.pin_alpha,
                pinned_law=_pinned(args, study_dir, _study_name(table)), hc=args.hc, mixed=args.mixed,
                interactions=not args.no_interactions, third_levels=args.third_levels)


def _analyze(args, table: pd.DataFrame, target: float | None, study_dir: Path | None = None, n_boot: int | None = None):
    from marin_ablate.analysis.io.results import read_lr_profile
    from marin_ablate.analysis.pipeline import analyze_table

    n_boot = args.n_boot if n_boot is None else n_boot
    _check_boot_memory(n_boot, table)
    a = analyze_table(table, n_boot=n_boot, **_fit_kw(args, study_dir, table), boot_method=args.boot,
                      target_compute=target, seed=args.seed, force_extrapolation=args.force_extrapolation)
    a.lr_profile = read_lr_profile(study_dir) if study_dir is not None else None
    return a


def _backtest_of(args, a, table: pd.DataFrame, study_dir: Path | None, min_rungs: int):
    """The backtest of a factorial study's own ladder (analysis/fit/backtest.py)."""
    from marin_ablate.analysis.fit.backtest import backtest

    return backtest(table, a, min_rungs=min_rungs, **_fit_kw(args, study_dir, table))


def analysis_of(study: str | Path, argv: list[str] | tuple[str, ...] = ()):
    """(StudyAnalysis, results table) of a study folder as `marin-ablate analyze STUDY [argv]` computes it (the
    pinned law and LR profile of the folder included), without writing the report (benchmarks/seed_replication.py)."""
    args = options.parse(AnalyzeOptions, [str(study), *argv])
    study_dir, table = resolve_study(args.study)
    return _analyze(args, table, args.target, study_dir), table


@dataclass(frozen=True)
class ImportSection:
    """Instead of the report: read a CSV or JSON table of runs from elsewhere into a study folder (--study-dir)
    that `analyze` then reads."""

    table: str | None = option(None, metavar="FILE", help="a .csv or .json table, one row per run (required)")
    study: str | None = option(None, help="study name (none: FILE's name without its suffix)")
    layout: str = option("runs", choices=tuple(LAYOUTS),
                         help="runs: one row per run in the import schema; marin_holdout: Marin's hold-one-feature-"
                              "out table (ablation, rung, loss[, tokens_per_s]) as the holdout study's arms, its "
                              "fast-ladder law pinned (docs/holdout.md)")


@dataclass(frozen=True)
class ForecastSection:
    """Instead of the report: write an immutable pre-registered forecast of one arm's loss at --target FLOPS
    (required) into the study folder's forecasts/."""

    arm: str = option("recipe", help="recipe (all on), baseline (all off), or an arm name")
    note: str = option("", help="free text stored in the forecast")


@dataclass(frozen=True)
class BacktestSection:
    """Instead of the report: refit the analysis on the first k rungs of the study's ladder (k from
    --backtest.min_rungs to one below the top) and score its predictions of every later rung (each component's
    quality multiplier, TOTAL, verdicts) against what that rung measured (docs/method.md §4.10); prints a table
    per component and a one-line summary, and writes backtest.csv into the report directory."""

    min_rungs: int = option(2, lo=2, help="the fewest rungs a backtest fit uses (2: the fewest with a scale term)")


@dataclass(frozen=True)
class AnalyzeOptions(FitOptions):
    """Results table, multipliers, attribution, report and plots; or a mode: --import.table FILE, --forecast,
    --backtest."""

    command: ClassVar[str] = "analyze"
    epilog: ClassVar[str] = ("STUDY is read as: a study directory with runs/ (as `marin-ablate run` or `marin-ablate "
                             "analyze --import.table FILE` writes it), its results.parquet, a results .csv in the "
                             "same schema, or a study name. Results from elsewhere: `--import.table FILE` first "
                             "(docs/importing.md). The table's columns: "
                             + "; ".join(f"{c}{' (required)' if req else ''}: {what}"
                                         for c, (req, what) in COLUMNS.items())
                             + "; every other column is a factor, its values the arm's levels.")
    study: str | None = option(None, positional=True, metavar="STUDY",
                               help="a study directory (runs/, e.g. one `--import.table` wrote), a results table "
                                    "(.parquet or .csv in the results-table schema), or a study name; none with "
                                    "--import.table")
    report_dir: str | None = option(None, metavar="DIR", help="report directory (none: STUDY/report)")
    target: float | None = option(None, lo=0, lo_open=True, help="extrapolate multipliers to this compute (FLOPs); "
                                                                 "--forecast: the forecast's compute")
    no_figures: bool = option(False, help="no plots in the report")
    study_dir: str | None = option(None, metavar="DIR", help="the study folder this writes into: --import.table "
                                   "creates it (none: FILE without its suffix), --forecast adds forecasts/ to it "
                                   "(none: STUDY's)")
    imports: ImportSection | None = option(None, section=ImportSection, name="import", mode=True,
                                           help=ImportSection.__doc__)
    forecast: ForecastSection | None = option(None, section=ForecastSection, mode=True, help=ForecastSection.__doc__)
    backtest: BacktestSection | None = option(None, section=BacktestSection, mode=True, help=BacktestSection.__doc__)
    plugin: tuple[str, ...] = option((), metavar="FILE.py|MODULE",
                                     help="import this study file or module first: the responses it registers are "
                                          "fitted (repeatable; a study folder's plugins.json is a record only, never "
                                          "imported)")


def _import(args: AnalyzeOptions) -> int:
    """`analyze --import.table FILE`: the table into a study folder."""
    import json

    from marin_ablate.analysis.io.importer import import_file

    if args.imports.table is None:
        raise ValueError("--import needs --import.table FILE (a .csv or .json table, one row per run)")
    if args.study is not None:
        raise ValueError(f"STUDY {args.study!r} with --import.table: the import writes a study folder (--study-dir); "
                         f"allowed: `analyze --import.table {args.imports.table}`, then `analyze DIR`")
    out = import_file(args.imports.table, args.study_dir, args.imports.study, args.imports.layout)
    for note in json.loads((out / "import.json").read_text()).get("notes", []):
        print(f"note: {note}")
    rows = json.loads((out / "import.json").read_text())["rows"]
    n = sum(1 for p in (out / "runs").iterdir() if p.is_dir())
    print(f"imported {rows} rows as {n} runs into {out}; next: marin-ablate analyze {out}")
    return 0


def cmd_analyze(argv: list[str]) -> int:
    from marin_ablate.analysis.calibration.forecast import judge, read_forecasts
    from marin_ablate.analysis.io.results import write_table
    from marin_ablate.analysis.report.tables import attribution_table, informative
    from marin_ablate.analysis.report.writer import write_report

    args = options.parse(AnalyzeOptions, argv)
    plugins.load_named(args.plugin)  # named by the user, before STUDY is read
    if args.imports is not None:
        return _import(args)
    if args.study is None:
        raise ValueError("analyze needs a STUDY (a study directory, a results table or a study name), or "
                         "--import.table FILE")
    if args.forecast is not None:
        return _forecast(args)
    if args.backtest is not None:
        return _backtest(args)
    study_dir, table = resolve_study(args.study)
    out = Path(args.report_dir) if args.report_dir else study_dir / "report"
    if (study_dir / "runs").is_dir():  # collected afresh: keep the table, under --report-dir when given
        print(f"wrote {write_table(table, (out if args.report_dir else study_dir) / 'results.parquet')}")
    ofat = _ofat_or_none(args, table, study_dir)
    if ofat is not None:
        return _report_ofat(ofat, table, study_dir, out)
    a = _analyze(args, table, args.target, study_dir)
    fc = [judge(f, table, a.factors) for f in read_forecasts(study_dir)]
    bt = _report_backtest(args, a, table, study_dir)
    title = (str(table["study"].dropna().iloc[0]) if "study" in table and table["study"].notna().any()
             else study_dir.name)
    import sys

    md, html = write_report(a, table, out, forecasts=fc, title=title, figures=not args.no_figures,
                            command="marin-ablate " + " ".join(sys.argv[1:]), backtest=bt)
    tab, absent = informative(attribution_table(a))
    aliased = "aliased" in tab and (tab["aliased"] != "").any()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        # The alias chains are long at resolution IV: the report lists them; the console names them.
        print(tab.drop(columns=["aliased"], errors="ignore").to_string(index=False))
    if absent:
        print(f"note: {absent}")
    elif aliased:
        print("note: some two-factor interactions are aliased in this design; the alias groups are in the report")
    from marin_ablate.analysis.report.findings import rests_on

    print(rests_on(a))
    for n in a.notes:
        print(f"note: {n}")
    for w in a.warnings:
        print(f"warning: {w}")
    if bt is not None:
        print(f"backtest: {bt if isinstance(bt, str) else bt.summary()}")
    print(f"wrote {md} and {html}")
    return 0


def _report_ofat(a, table: pd.DataFrame, study_dir: Path, out: Path) -> int:
    from marin_ablate.analysis.ofat import report_lines
    from marin_ablate.analysis.report.spreadsheet import spreadsheet_csv
    from marin_ablate.marin.schema import atomic_write_bytes, atomic_write_text

    title = (str(table["study"].dropna().iloc[0]) if "study" in table and table["study"].notna().any()
             else study_dir.name)
    lines = report_lines(a, title)
    md, csv = out / "report.md", out / "ofat.csv"
    atomic_write_text(md, "\n".join(lines) + "\n")
    atomic_write_bytes(csv, spreadsheet_csv(a.table))  # a rung or arm named "=1+1" is text there, never a formula
    print("\n".join(lines[2:]))
    print(f"wrote {md} and {csv}")
    return 0


def _report_backtest(args, a, table: pd.DataFrame, study_dir: Path):
    """The report's backtest line's source: None below three rungs (nothing to backtest), the reason as
    text where the refits cannot run."""
    if len(a.rungs) < 3:
        return None
    try:
        return _backtest_of(args, a, table, study_dir, 2)
    except ValueError as e:
        return f"not run ({e})"
    except Exception as e:  # noqa: BLE001 — a diagnostic beside the report: its failure is printed there, not fatal
        return f"not run ({type(e).__name__}: {e}; `marin-ablate analyze STUDY --backtest` shows the traceback)"


def _backtest(args: AnalyzeOptions) -> int:
    """`analyze STUDY --backtest`: the scale extrapolation's record on the study's own ladder."""
    from marin_ablate.analysis.report.backtest import backtest_console
    from marin_ablate.marin.schema import atomic_write_bytes

    if args.target is not None:
        raise ValueError("--target with --backtest: the backtest predicts the study's own later rungs; allowed "
                         "values: omit --target")
    study_dir, table = resolve_study(args.study)
    if _ofat_or_none(args, table, study_dir) is not None:
        raise ValueError("--backtest needs the factorial model (a one-factor-at-a-time study is not extrapolated); "
                         "allowed values: a factorial study, or --design factorial")
    a = _analyze(args, table, None, study_dir, n_boot=0)
    bt = _backtest_of(args, a, table, study_dir, args.backtest.min_rungs)
    print("\n".join(backtest_console(bt)))
    out = Path(args.report_dir) if args.report_dir else study_dir / "report"
    csv = out / "backtest.csv"
    atomic_write_bytes(csv, bt.rows.to_csv(index=False).encode())
    print(f"wrote {csv}")
    return 0


def _forecast(args: AnalyzeOptions) -> int:
    """`analyze STUDY --forecast --target FLOPS`: an immutable pre-registered forecast (what `marin-ablate
    forecast` did)."""
    from marin_ablate.analysis.calibration.forecast import arm_codes, write_forecast

    if args.target is None:
        raise ValueError("--forecast needs --target FLOPS (the compute the forecast is for)")
    study_dir, table = resolve_study(args.study)
    if _ofat_or_none(args, table) is not None:
        raise ValueError("--forecast needs the factorial model; allowed values: a factorial study (--design factorial)")
    a = _analyze(args, table, args.target, study_dir)
    fc = args.forecast
    path = write_forecast(Path(args.study_dir) if args.study_dir else study_dir, a, table, target_compute=args.target,
                          arm=fc.arm, note=fc.note, force=args.force_extrapolation)
    pred = a.arm_prediction(arm_codes(a, fc.arm), args.target, force=args.force_extrapolation)
    print(f"forecast {path}: arm {fc.arm} at {args.target:.3g} FLOPs -> loss {pred['loss']:.4f} "
          f"[{pred['loss_lo']:.4f}, {pred['loss_hi']:.4f}]")
    return 0
