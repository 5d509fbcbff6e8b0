"""Tables written for spreadsheets (`ofat.csv`), neutralised against CSV injection: a text cell that begins
with `=`, `+`, `-`, `@`, a tab or a carriage return is what Excel and LibreOffice evaluate as a formula (a rung
named `=1+1` computes, `=HYPERLINK(...)` makes a link), so it gets a leading `'` (OWASP, "CSV Injection").
Numbers stay numbers: a negative ln M is a value, not a formula, and is written as one, unquoted, while every
text cell is quoted (a carriage return inside one stays inside it)."""

from __future__ import annotations

import csv
from typing import Any

import pandas as pd

#: What a spreadsheet reads as the start of a formula (OWASP's list).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutral(v: Any) -> Any:
    """A text value that a spreadsheet would evaluate, prefixed with `'`; anything else as it is."""
    return "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v


def spreadsheet_csv(df: pd.DataFrame) -> bytes:
    """`df` as CSV bytes for a spreadsheet: every text cell and column name neutralised (`neutral`) and quoted,
    numeric columns untouched."""
    out = df.rename(columns=neutral)
    for c in out.columns:
        if out[c].dtype == object or pd.api.types.is_string_dtype(out[c]):
            out[c] = out[c].map(neutral)
    return out.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC).encode()
