"""The backtest in words: the console tables of `analyze --backtest` and the one line Findings carry beside their
extrapolated numbers (analysis/backtest.py, docs/method.md §4.10)."""

from __future__ import annotations

import pandas as pd

from marin_ablate.analysis.backtest import Backtest


def backtest_console(bt: Backtest) -> list[str]:
    """Every prediction beside its measurement, then per component (scored, covered, decisions agreed, median
    ratio error), per (fit, later rung) with Kendall's τ, the notes, and the one-line summary."""
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 60):
        preds = bt.predictions().to_string(index=False)
        comp = bt.by_component().to_string(index=False, float_format="{:.3f}".format)
        pairs = bt.pairs.rename(columns={"k": "fitted rungs", "target": "rung #", "target_rung": "rung",
                                         "tau": "Kendall tau"}).to_string(index=False, float_format="{:.2f}".format)
    return [f"backtest over {len(bt.rungs)} rungs ({', '.join(bt.rungs)}): quality M_flop, {bt.level:.0%} intervals; "
            "ratio = predicted / measured; covered = the two agree within their combined interval "
            "(docs/method.md §4.10)", "", "per prediction:", preds, "", "per component:", comp, "",
            "per fit and later rung:", pairs, "", *[f"note: {n}" for n in bt.notes], f"backtest: {bt.summary()}"]


def backtest_lines(bt: Backtest | str | None) -> list[str]:
    """The one line under Findings: how the ladder's own extrapolations fared (none below three rungs), with a
    qualifier where a prediction at the next rung missed."""
    if bt is None:
        return []
    if isinstance(bt, str):
        return ["", f"How far these extrapolations travel: the backtest of this ladder was {bt}."]
    q = (" Where it missed, read the per-decade and extrapolated values of those components as unconfirmed by "
         "this ladder." if bt.failed() else "")
    return ["", f"How far these extrapolations travel (backtest, docs/method.md §4.10; `marin-ablate analyze STUDY "
                f"--backtest` for the table): {bt.summary()}.{q}"]
