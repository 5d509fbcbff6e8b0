"""`marin-ablate studies`, and what `plan`, `run` and `status` share: `StudyOptions` (the study, its rungs and seeds,
the output root and the `--model.F=V`, `--train.F=V`, `--data.F=V`, `--recipe.F=V` overrides) and the study it names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from marin_ablate.cli.parse import parse
from marin_ablate.marin.fields import SPEC_SECTIONS, option


@dataclass(frozen=True)
class StudiesOptions:
    """The registered studies (plugins' included), one line each."""

    command: ClassVar[str] = "studies"
    json: bool = option(False, help="a JSON list of {name, description} (default: a table)")


def cmd_studies(argv: list[str]) -> int:
    """Every registered study with its one-line description: what `plan`, `run` and `status` accept as STUDY."""
    from marin_ablate.ablations.studies import STUDIES, get_study

    opts = parse(StudiesOptions, argv)
    rows = [{"name": n, "description": get_study(n).description} for n in STUDIES]
    if opts.json:
        print(json.dumps(rows, indent=1))
    else:
        width = max(len(r["name"]) for r in rows)
        print("\n".join(f"{r['name']:<{width}}  {r['description']}" for r in rows))
    return 0


@dataclass(frozen=True)
class StudyOptions:
    """What names a study's runs: the study, its rungs and seeds, the output root and the spec overrides."""

    study: str = option(positional=True, metavar="STUDY",
                        help="a registered study (`marin-ablate studies`), path/to/file.py:attribute or "
                             "package.module:attribute (a Study or a function returning one)")
    rungs: str | None = option(None, metavar="A,B", help="comma-separated rungs (none: the study's)")
    seeds: str | None = option(None, metavar="0,1", help="comma-separated seeds (none: the study's)")
    out: str = option("runs", metavar="DIR", help="output root; runs go to OUT/STUDY/runs/RUN_ID")
    overrides: tuple[str, ...] = option((), spec=SPEC_SECTIONS, help="e.g. --data.corpus=DIR (a prepared corpus)")


def study_from_args(opts: Any) -> Any:
    """The study of the command line's STUDY, --rungs and --seeds (comma-separated)."""
    from marin_ablate.sweeps.sweep import resolve_study

    try:
        rungs, seeds = ([cast(x.strip()) for x in v.split(",") if x.strip()] if v is not None else None
                        for v, cast in ((opts.rungs, str), (opts.seeds, int)))
    except ValueError:
        raise ValueError(f"--seeds {opts.seeds!r}: not a comma-separated list of integers") from None
    return resolve_study(opts.study, rungs, seeds)
