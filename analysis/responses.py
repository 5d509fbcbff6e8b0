"""The analysis responses, one table (docs/method.md §4.3; docs/extending.md adds one): each a ln-scale column
(`Response.column`) whose effects are attributed alike. Its `family`: "law" (the joint law fit, ln M_flop of each
run), "ols" (OLS of `transform(source)`: "ln", or "ln_ratio" to the all-off arm's mean on the same rung and
hardware) or "sum" (of `parts`: coefficients and covariances add). The pipeline, bootstrap, checks, report and
figures read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from marin_ablate.marin import plugins

FAMILIES = ("law", "ols", "sum")
TRANSFORMS = ("ln", "ln_ratio")


@dataclass(frozen=True)
class Response:
    name: str  # the key users pass (analyze_table(responses=...)) and the fits are stored under
    column: str  # the ln-scale column of the analysis table, and the `response` of its component rows
    label: str  # the Findings column, e.g. "quality M_flop"
    symbol: str  # the attribution table's column, e.g. "M_flop"
    axis: str  # a figure's axis label
    family: str = "ols"
    source: str | None = None  # "ols": the results-table column it is computed from
    transform: str = "ln"  # "ols": how the source becomes the column (TRANSFORMS)
    parts: tuple[str, ...] = ()  # "sum": the responses it adds
    truth_key: str | None = None  # the key a planted factor's truth uses for it (marin.schema TRUTH_KEYS)
    figure: bool = True  # draw its per-rung forest plot
    total_check: bool = True  # compare its model TOTAL with the all-on vs all-off runs ("law", "ols")
    unit: str = "baseline"  # what a multiplier of 2 doubles, in figure labels ("× compute")
    # The family its Findings verdicts are controlled in (analysis/report/findings.py `verdict_family`): responses
    # that share one are one family; empty: a family of its own, named after the response.
    verdicts: str = ""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"response {self.name!r}: family {self.family!r}; allowed values: {', '.join(FAMILIES)}")
        if self.family == "ols" and (not self.source or self.transform not in TRANSFORMS):
            raise ValueError(f"response {self.name!r}: an ols response needs a source column and a transform; "
                             f"allowed transforms: {', '.join(TRANSFORMS)}")
        if self.family == "sum" and len(self.parts) < 2:
            raise ValueError(f"response {self.name!r}: a sum response needs two or more parts")


RESPONSES: dict[str, Response] = {r.name: r for r in (
    Response("quality", "ln_M", "quality M_flop", "M_flop", "quality multiplier M_flop (compute-equivalent)",
             family="law", truth_key="M_flop", unit="compute", verdicts="quality"),
    Response("throughput", "ln_R", "throughput R", "R", "throughput ratio R", source="model_flops_per_s",
             transform="ln_ratio", truth_key="R", unit="baseline FLOP/s", verdicts="speed"),
    Response("wall", "ln_W", "wall-clock M_flop·R", "M_flop·R", "wall-clock multiplier M_flop·R", family="sum",
             parts=("quality", "throughput"), figure=False, total_check=False, unit="baseline wall-clock speed",
             verdicts="speed"),
)}


def register(r: Response) -> Response:
    """Adds a response to the table (every analysis from now on fits it); refuses a clash."""
    if r.name in RESPONSES or any(x.column == r.column for x in RESPONSES.values()):
        raise ValueError(f"response {r.name!r} (column {r.column!r}) clashes with a registered one; registered: "
                         f"{', '.join(RESPONSES)}")
    if r.family == "law" and any(x.family == "law" for x in RESPONSES.values()):
        raise ValueError(f"response {r.name!r}: one law response only (the joint law fit); family allowed values: "
                         "ols, sum")
    bad = [p for p in r.parts if p not in RESPONSES]
    if bad:
        raise ValueError(f"response {r.name!r}: parts {bad}; allowed values: {', '.join(RESPONSES)}")
    RESPONSES[r.name] = r
    plugins.note("response", r.name)
    return r


def by_column(column: str) -> Response | None:
    return next((r for r in RESPONSES.values() if r.column == column), None)


def ordered(names) -> list[Response]:
    """The responses named, in fitting order: law, then ols, then sums (a sum needs its parts)."""
    return sorted((RESPONSES[n] for n in names), key=lambda r: FAMILIES.index(r.family))


def law() -> Response:
    """The one law response (quality, ln M): the joint law fit on every run."""
    return next(r for r in RESPONSES.values() if r.family == "law")


def law_column() -> str:
    return law().column


def part_columns(column: str) -> tuple[str, ...]:
    """The columns a response adds (a sum: its parts', e.g. wall-clock = quality + throughput); else its own."""
    r = by_column(column)
    return tuple(RESPONSES[p].column for p in r.parts) if r is not None and r.family == "sum" else (column,)


def is_sum(column: str) -> bool:
    return len(part_columns(column)) > 1


def uses_law(column: str) -> bool:
    """The response is the law response or a sum with it among its parts (quality-based)."""
    return law_column() in part_columns(column)
