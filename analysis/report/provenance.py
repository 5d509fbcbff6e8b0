"""The report's provenance: what produced the numbers — the command, code versions, seeds, hardware,
the factors' coding, how each run's LR was set and the reference law it rests on (docs/method.md §4.6)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pandas as pd

from marin_ablate.analysis.io.results import factor_coding
from marin_ablate.analysis.pipeline import StudyAnalysis


def provenance(a: StudyAnalysis, raw: pd.DataFrame, command: str | None) -> list[str]:
    def uniq(col):
        return (", ".join(sorted({str(v) for v in raw[col].dropna()})) if col in raw and raw[col].notna().any()
                else "unknown")

    coding = factor_coding(raw) if "coding" in raw else {}
    try:
        ver = version("marin-ablate")
    except Exception:  # not installed: the analysis still runs from a checkout
        ver = "unknown"
    mixed = (raw[["run_id", "code_versions"]].dropna() if "code_versions" in raw else pd.DataFrame())
    return [f"- command: `{command or 'analyze_table (library call)'}`",
            f"- code version of the runs: {uniq('code_version')}; analysis package {ver}"
            + (f"; {len(mixed)} run(s) resumed under changed code, their steps trained by more than one version: "
               + ", ".join(f"{r} ({v})" for r, v in mixed.itertuples(index=False)) if len(mixed) else ""),
            f"- seeds: {uniq('seed')}; hardware: {uniq('hardware')}",
            f"- {len(raw)} runs in the table, {len(a.table)} analysed; factors: {', '.join(a.factors)}",
            "- coding: " + ("; ".join(f"{f}: +1 = {hi}, −1 = {lo}" for f, (lo, hi) in coding.items()
                                      if f in a.factors) or "unknown"),
            *lr_provenance(a), *pinned_law_provenance(a)]


def lr_provenance(a: StudyAnalysis) -> list[str]:
    """How the analysed runs' LRs were set: the heuristic, a profile or `run --tune` (file, date), the multipliers."""
    t = a.table
    if "lr_source" not in t or not t["lr_source"].notna().any():
        return ["- learning rates: not recorded (the runs predate LR provenance)"]
    out = []
    for src, g in t.groupby(t["lr_source"].fillna("heuristic"), sort=False):
        files = sorted({f"`{f}` ({d})"
                        for f, d in zip(g.get("lr_profile", []), g.get("lr_profile_date", []), strict=False)
                        if isinstance(f, str)})
        scale = pd.to_numeric(g.get("lr_scale", pd.Series(1.0, index=g.index)), errors="coerce")
        what = {"heuristic": "Marin's heuristic LR (no per-arm profile)",
                "profile": "profiled per level of each LR-coupled factor (and per seed, where the profile "
                           "record holds seeds) at the ladder's middle rung, carried up the ladder by the heuristic",
                "tuned": "`marin-ablate run --tune` multipliers per arm, carried up the ladder by the heuristic",
                }.get(src, src)
        out.append(f"- learning rates ({len(g)} runs): {what}" + (f" from {', '.join(files)}" if files else "")
                   + (f"; multipliers {scale.min():.3g}–{scale.max():.3g}" if src != "heuristic" else ""))
    return out


def pinned_law_provenance(a: StudyAnalysis) -> list[str]:
    """The pinned reference law's source and date, when the analysis pinned one."""
    p = getattr(a, "pinned_law", None)
    if p is None:
        return []
    source = p.source.replace(str(Path.home()), "~", 1)  # the report is shared: no home directory in it
    where = f"a published law (`{source}`)" if p.is_published else f"the baseline ladder (`{source}`, {p.created})"
    return [f"- reference law pinned from {where}: {p.describe()}; A refitted on this study's runs"]
