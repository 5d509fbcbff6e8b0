"""`marin-ablate import FILE`: a CSV/JSON table of runs from elsewhere into a study folder (analysis/io/importer.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from analysis.io.importer import COLUMNS, import_file
from marin.fields import option
from marin_ablate import options


@dataclass(frozen=True)
class ImportOptions:
    """Read a CSV or JSON table of runs from elsewhere into a study folder `analyze` reads."""

    command: ClassVar[str] = "import"
    epilog: ClassVar[str] = ("columns: " + "; ".join(f"{c}{' (required)' if req else ''}: {what}"
                                                    for c, (req, what) in COLUMNS.items())
                             + "; every other column is a factor, its values the arm's levels. README: "
                               "'Importing results from elsewhere'.")
    file: str = option(positional=True, metavar="FILE", help="a .csv or .json table, one row per run")
    study_dir: str | None = option(None, metavar="DIR", help="study folder to create (none: FILE without its "
                                                             "suffix)")
    study: str | None = option(None, help="study name (none: FILE's name without its suffix)")


def cmd_import(argv: list[str]) -> int:
    args = options.parse(ImportOptions, argv)
    out = import_file(args.file, args.study_dir, args.study)
    for note in json.loads((out / "import.json").read_text()).get("notes", []):
        print(f"note: {note}")
    n = sum(1 for _ in (out / "runs").iterdir())
    print(f"imported {n} runs into {out}; next: marin-ablate analyze {out}")
    return 0
