"""`marin-ablate import FILE`: a CSV/JSON table of runs from elsewhere into a study folder (analysis/io/importer.py)."""

from __future__ import annotations

import argparse
import json

from analysis.io.importer import COLUMNS, import_file


def import_args(parser: argparse.ArgumentParser) -> None:
    parser.description = "read a CSV or JSON table of runs from elsewhere into a study folder `analyze` reads"
    parser.epilog = ("columns: " + "; ".join(f"{c}{' (required)' if req else ''}: {what}"
                                            for c, (req, what) in COLUMNS.items())
                     + "; every other column is a factor, its values the arm's levels. README: "
                       "'Importing results from elsewhere'.")
    parser.add_argument("file", metavar="FILE", help="a .csv or .json table, one row per run")
    parser.add_argument("--out", default=None, help="study folder to create (default: FILE without its suffix)")
    parser.add_argument("--study", default=None, help="study name (default: FILE's name without its suffix)")


def cmd_import(args) -> int:
    out = import_file(args.file, args.out, args.study)
    for note in json.loads((out / "import.json").read_text()).get("notes", []):
        print(f"note: {note}")
    n = sum(1 for _ in (out / "runs").iterdir())
    print(f"imported {n} runs into {out}; next: marin-ablate analyze {out}")
    return 0
