"""`marin-ablate analyze` and its modes: `--import.table FILE` (runs from elsewhere into a study folder,
analysis/io/importer.py), `--forecast` (an immutable pre-registered forecast) and `--backtest` (the scale
extrapolation refitted on the first rungs and scored on the later ones). The analysis itself is the library's
(analysis/study_folder.py `analyze_study`, `forecast_study`, `backtest_study`); this module parses and prints.
No torch anywhere on this path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from marin_ablate.analysis.io.importer import COLUMNS, LAYOUTS
from marin_ablate.analysis.study_folder import AnalysisOptions
from marin_ablate.cli.parse import parse
from marin_ablate.marin import plugins
from marin_ablate.marin.fields import option


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
class AnalyzeOptions(AnalysisOptions):
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


def cmd_analyze(argv: list[str]) -> int:
    args = parse(AnalyzeOptions, argv)  # an AnalysisOptions too: the library reads its fields
    from marin_ablate.analysis.io.importer import import_file
    from marin_ablate.analysis.study_folder import analyze_study, backtest_study, forecast_study

    plugins.load_named(args.plugin)  # named by the user, before STUDY is read
    if args.imports is not None:  # the table into a study folder
        if args.imports.table is None:
            raise ValueError("--import needs --import.table FILE (a .csv or .json table, one row per run)")
        if args.study is not None:
            raise ValueError(f"STUDY {args.study!r} with --import.table: the import writes a study folder (--study-"
                             f"dir); allowed: `analyze --import.table {args.imports.table}`, then `analyze DIR`")
        out = import_file(args.imports.table, args.study_dir, args.imports.study, args.imports.layout)
        rec = json.loads((out / "import.json").read_text())
        n = sum(1 for p in (out / "runs").iterdir() if p.is_dir())
        print("\n".join([*(f"note: {note}" for note in rec.get("notes", [])),
                         f"imported {rec['rows']} rows as {n} runs into {out}; next: marin-ablate analyze {out}"]))
        return 0
    if args.study is None:
        raise ValueError("analyze needs a STUDY (a study directory, a results table or a study name), or "
                         "--import.table FILE")
    if args.forecast is not None:
        res = forecast_study(args.study, args, args.forecast.arm, args.forecast.note, args.study_dir)
    elif args.backtest is not None:
        res = backtest_study(args.study, args, args.backtest.min_rungs)
    else:
        res = analyze_study(args.study, args)
    print("\n".join(res.lines))
    if res.damaged:  # written without them, and said last: a damaged folder is not a clean analysis
        raise ValueError(res.damaged)
    return 0
