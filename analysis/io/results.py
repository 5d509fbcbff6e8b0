"""Run directories -> the results table (docs/architecture.md §3).

`collect(study_dir)` reads `<study_dir>/runs/<run_id>/{meta,summary}.json` through `marin.schema` (torch-free) into
one row per run (status "missing" without a summary; a failed run keeps its error). The factors come from the runs:
each level in a column named after its factor, each factor's definition (field, low −1, high +1) in the `coding`
column (`factor_coding`, `factor_columns`, `factor_codes`); no list of factors lives in `analysis`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from marin_ablate.marin.schema import (
    DamagedFile,
    atomic_write_bytes,
    foreign,
    named_ids,
    random_stream,
    read_json,
    read_meta,
    read_summary,
)

SUMMARY_COLUMNS: tuple[str, ...] = (
    "params_total", "params_active", "flops_per_token", "tokens", "train_flops", "eval_macro_loss",
    "macro_bpb", "final_train_loss", "tokens_per_s", "model_flops_per_s", "mfu", "drop_rate",
    "max_grad_norm", "spikes", "wall_s", "hardware", "code_version", "error",
)
ID_COLUMNS: tuple[str, ...] = ("run_id", "study", "rung", "arm", "seed", "design_row")
STATUSES: tuple[str, ...] = ("completed", "failed", "missing")  # and, for a folder left out: "unreadable",
# "duplicate" (a copy of another run), "contradictory" (meta.json and spec.json disagree on a factor, or summary.json's
# steps, tokens or FLOPs are not what spec.json trains), "foreign"
# (a file names another run, or the folder resolves outside the study: marin.schema.foreign)
LEFT_OUT: tuple[str, ...] = ("duplicate", "unreadable", "contradictory", "foreign")
#: The left-out folders that are damage, not a copy: `analyze` names the first and exits 2 after writing its report
DAMAGED: tuple[str, ...] = ("unreadable", "contradictory", "foreign")


@dataclass
class Inventory:
    """What a study directory holds: counts by status and the ids of runs that did not complete."""

    n_runs: int
    n_completed: int
    missing: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (run_id, error)
    # completed runs the fit cannot use, copies of a run, unreadable run folders: (run_id, reason)
    excluded: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{self.n_runs} runs: {self.n_completed} completed, {len(self.failed)} failed, "
               f"{len(self.missing)} missing" + (f", {len(self.excluded)} left out" if self.excluded else "")]
        out += [f"missing: {r}" for r in self.missing]
        out += [f"failed: {r}: {e}" for r, e in self.failed]
        out += [f"left out: {r}: {e}" for r, e in self.excluded]
        return out

    def why_none(self, limit: int = 20) -> str:
        """When no run is usable: the counts and each run's reason (the first `limit`), one line each, to
        follow an error (a refusal that names no run leaves the user to open every folder)."""
        lines = self.lines()
        more = len(lines) - 1 - limit
        return "\n  ".join(["", *lines[:1 + limit]] + ([f"... and {more} more"] if more > 0 else []))


def _copy_of(run_dir: Path) -> str | None:
    """The run id a plain copy of another run folder of this study names (every file the same id, that
    run's folder beside it: `_dedupe` counts it once), else None."""
    ids = set(named_ids(run_dir).values())
    rid = next(iter(ids)) if len(ids) == 1 else None
    ok = isinstance(rid, str) and not run_dir.is_symlink() and (run_dir.parent / rid).is_dir()
    return rid if ok and foreign(run_dir.parent / rid, run_dir.parent) is None else None


def _row_or_reason(run_dir: Path) -> dict:
    why = foreign(run_dir, run_dir.parent)
    copy = _copy_of(run_dir) if why is not None else None
    if why is not None and copy is None:
        return {"run_id": run_dir.name, "status": "foreign", "error": why}
    try:
        return {**_row(run_dir), **({"run_id": copy} if copy else {})}
    except DamagedFile as e:
        return {"run_id": run_dir.name, "status": "unreadable", "error": str(e)}
    except Contradiction as e:
        return {"run_id": run_dir.name, "status": "contradictory", "error": str(e)}


def _dedupe(rows: list[dict], dirs: list[Path]) -> None:
    """One row per run id: a copied run folder is the same run. The kept row is the folder named
    after the id (else the first completed, else the first); the others become status "duplicate"."""
    by_id: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_id.setdefault(str(r["run_id"]), []).append(i)
    for rid, idx in by_id.items():
        if len(idx) < 2:
            continue
        keep = next((i for i in idx if dirs[i].name == rid),
                    next((i for i in idx if rows[i].get("status") == "completed"), idx[0]))
        for i in idx:
            if i != keep:
                rows[i]["status"] = "duplicate"
                rows[i]["error"] = f"runs/{dirs[i].name} holds the same run as runs/{dirs[keep].name}; counted once"


#: A language model's evaluation loss in nats per token beyond which a number is damage, not a measurement: a
#: uniform guess over any vocabulary this harness takes (at most 2**30 tokens) scores under 21 nats, and a loss
#: like 1e308 overflows every square of the law's fit ("SVD did not converge" for every multiplier)
LOSS_MAX = 1e6
LOSS_ALLOWED = f"a finite number in [0, {LOSS_MAX:g}] nats per token"


def loss_fault(v: object) -> str | None:
    """Why a completed run's finite eval_macro_loss is no measurement (below 0 or above LOSS_MAX), else None (a
    non-finite loss is named by `inventory`)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and not 0 <= v <= LOSS_MAX:
        return f"eval_macro_loss={v!r} is out of range; allowed values: {LOSS_ALLOWED}"
    return None


def mark_damaged_losses(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """A table's completed rows whose loss is no measurement (`loss_fault`) become status "unreadable", each
    error naming `where` and the row, so the fit leaves them out by name."""
    if "eval_macro_loss" not in df.columns or "status" not in df.columns:
        return df
    for i, (st, v) in enumerate(zip(df["status"], pd.to_numeric(df["eval_macro_loss"], errors="coerce"),
                                    strict=True)):
        why = loss_fault(float(v)) if st == "completed" else None
        if why:
            df.iloc[i, df.columns.get_loc("status")] = "unreadable"
            df.iloc[i, df.columns.get_loc("error")] = f"{where}: row {i + 1}: {why}"
    return df


class Contradiction(ValueError):
    """A run folder whose meta.json and spec.json disagree on a factor, or whose summary.json is not what its spec.json
    trains (marin_ablate.marin.flops.summary_contradiction): the run is left out, by name."""


_MISSING = object()


def contradiction(meta, spec: Mapping, run: str) -> str | None:
    """Where `meta`'s coding contradicts the run's `spec.json` (or the factor's field definition), one line
    naming the run, the factor and both values; None when they agree or the spec does not hold the field.

    A recipe switch's level names are its values, and in a planned run its baseline level is coded −1, its
    recipe level +1 (marin/switches.py); any other factor's levels map to the values its meta.json records."""
    from marin_ablate.marin.switches import BASELINE_LEVELS, RECIPE_LEVELS

    for f in meta.factors:
        section, _, attr = str(f.field or "").partition(".")
        sec = spec.get(section) if isinstance(spec, Mapping) else None
        value = sec.get(attr, _MISSING) if isinstance(sec, Mapping) else _MISSING
        # the orientation is the registry's for a run this harness planned (its spec holds the switch); an
        # imported table codes the levels its baseline arm holds (analysis/io/importer.py), e.g. Marin's
        # QK-norm ladder, whose baseline is the recipe level
        if section == "recipe" and attr in RECIPE_LEVELS and value is not _MISSING:
            base, rec = BASELINE_LEVELS[attr], RECIPE_LEVELS[attr][0]
            if f.high == base or f.low == rec:
                return (f"{run}: meta.json codes {f.name} −1 = {f.low!r}, +1 = {f.high!r}, but {f.field}'s baseline "
                        f"level {base!r} is −1 and its recipe level {rec!r} is +1")
        if f.values and f.level in f.values:
            want = f.values[f.level]
        elif section == "recipe":
            want = f.level
        else:
            continue
        if value is not _MISSING and json.dumps(value, sort_keys=True) != json.dumps(want, sort_keys=True):
            return (f"{run}: meta.json has {f.name}={f.level!r} (sets {f.field}={want!r}) but spec.json has "
                    f"{f.field}={value!r}")
    return None


def _row(run_dir: Path) -> dict:
    from marin_ablate.marin.flops import summary_contradiction  # the FLOP accounting: imported only to read runs

    meta = read_meta(run_dir, strict=True)
    spec = read_json(run_dir / "spec.json", strict=True) or {}
    why = contradiction(meta, spec, f"runs/{run_dir.name}") if meta is not None else None
    if why:
        raise Contradiction(why + "; left out (which file is right is unknown)")
    summ = read_summary(run_dir, strict=True)
    if summ is not None and summ.status == "completed" and loss_fault(summ.eval_macro_loss):
        raise DamagedFile(f"cannot read runs/{run_dir.name}/summary.json: {loss_fault(summ.eval_macro_loss)}")
    why = summary_contradiction(spec, summ.to_dict(), f"runs/{run_dir.name}") if summ is not None else None
    if why:
        raise Contradiction(why)
    row: dict = {
        "run_id": run_dir.name,  # every file names it (`foreign` checked them)
        "study": meta and meta.study, "rung": meta and meta.rung, "arm": meta and meta.arm,
        "seed": meta.seed if meta is not None and meta.seed is not None else spec.get("seed"),
        "design_row": meta and meta.design_row,
    }
    factors = meta.factors if meta is not None else ()
    row.update({f.name: f.level for f in factors})
    row["coding"] = json.dumps({f.name: {"field": f.field, "low": f.low, "high": f.high,
                                         **({"truth": dict(f.truth)} if f.truth else {}),
                                         **({"regime": True} if f.regime else {})} for f in factors})
    if summ is None:
        return {**row, "status": "missing", "error": None}
    d = summ.to_dict()
    row["status"] = summ.status
    row.update({c: d.get(c) for c in SUMMARY_COLUMNS})
    row.update({f"loss_{dom}": loss for dom, loss in (summ.eval_domain_loss or {}).items()})
    row.update({f"bpb_{dom}": bpb for dom, bpb in (summ.extra.get("eval_domain_bpb") or {}).items()})
    versions = summ.extra.get("code_versions")
    if isinstance(versions, list) and len(versions) > 1:  # resumed under other code: its steps mix versions
        row["code_versions"] = " → ".join(map(str, versions))
    data = spec.get("data") or {}  # what the run trained and was evaluated on (the report names it)
    row["data_corpus"], row["data_eval_dir"] = data.get("corpus"), data.get("eval_dir") or None
    row["random_stream"] = random_stream(spec)
    # how the run's LR was set (sweeps/tuning.py `lr_plan`): heuristic, a profile's or tune's multiplier
    extra = dict(meta.extra) if meta is not None else {}
    row["lr_scale"] = float((spec.get("train") or {}).get("lr_scale", 1.0))
    row["lr_source"] = extra.get("lr_source") or ("heuristic" if row["lr_scale"] == 1.0 else "tuned")
    row["lr_profile"], row["lr_profile_date"] = extra.get("lr_profile"), extra.get("lr_profile_date")
    row["loss_curve"] = json.dumps([list(p) for p in summ.loss_curve])
    # Start time of the run, for refusing forecasts written after it.
    started = summ.started_at
    if started is None and summ.wall_s is not None:
        started = os.path.getmtime(run_dir / "summary.json") - float(summ.wall_s)
    row["started_at"] = started
    return row


def collect(study_dir: str | Path, *, write: bool = True) -> pd.DataFrame:
    """One row per run directory under `study_dir/runs`; writes `study_dir/results.parquet` (write).

    Every folder gets a row: a run whose files cannot be read is status "unreadable" with the file
    and reason in `error`; a copy of a run (same run id) is status "duplicate" (see `_dedupe`)."""
    study_dir = Path(study_dir)
    runs = study_dir / "runs"
    if not runs.is_dir():
        raise ValueError(f"study_dir {str(study_dir)!r} has no runs/ directory")
    dirs = [d for d in sorted(runs.iterdir()) if d.is_dir()
            and ((d / "meta.json").exists() or (d / "summary.json").exists())]
    rows = [_row_or_reason(d) for d in dirs]
    _dedupe(rows, dirs)
    df = pd.DataFrame(rows)
    for c in ID_COLUMNS + SUMMARY_COLUMNS + ("status", "loss_curve", "started_at", "coding"):
        if c not in df.columns:
            df[c] = None
    for c in [c for c in SUMMARY_COLUMNS if c not in ("hardware", "code_version", "error")] + ["started_at"]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    if write and len(df):
        write_table(df, study_dir / "results.parquet")
    return df


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """The results table as parquet, atomically (a reader never sees a torn file)."""
    path = Path(path)
    atomic_write_bytes(path, df.to_parquet(index=False))
    return path


def inventory(df: pd.DataFrame) -> Inventory:
    """Counts and ids of missing and failed runs."""
    st = df["status"].fillna("missing")
    excluded = [(str(r), str(e))
                for r, e in df.loc[st.isin(LEFT_OUT), ["run_id", "error"]]
                .itertuples(index=False)]
    done = df[st == "completed"]
    for col in ("eval_macro_loss", "train_flops"):  # a completed run the fit cannot use is named, not dropped silently
        if col in done:
            v = pd.to_numeric(done[col], errors="coerce").astype(float)
            excluded += [(str(r), f"completed, but {col} is {x}") for r, x in zip(done["run_id"], v, strict=True)
                         if not np.isfinite(x)]
    return Inventory(
        n_runs=int((~st.isin(["duplicate"])).sum()), n_completed=int((st == "completed").sum()),
        missing=sorted(df.loc[st == "missing", "run_id"].astype(str)),
        failed=[(str(r), str(e)) for r, e in df.loc[st == "failed", ["run_id", "error"]].itertuples(index=False)],
        excluded=excluded,
    )


def _read_table(p: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
    except Exception as e:  # noqa: BLE001 - pyarrow and pandas raise many types for a damaged file
        raise ValueError(f"cannot read results table {str(p)!r}: {type(e).__name__}: {e}") from None


def load_table(source: str | Path | pd.DataFrame, *, write: bool = False) -> pd.DataFrame:
    """A results table from a DataFrame, a parquet file, or a study directory (collected afresh;
    written to its results.parquet only when `write`)."""
    if isinstance(source, pd.DataFrame):
        return source.copy()
    p = Path(source)
    if p.is_file():
        if p.suffix not in (".parquet", ".csv"):
            raise ValueError(f"source {str(p)!r}: allowed values: a study directory, a .parquet or .csv file")
        return _read_table(p)
    if p.is_dir():
        if (p / "runs").is_dir():
            return collect(p, write=write)
        if (p / "results.parquet").exists():
            return _read_table(p / "results.parquet")
    raise ValueError(f"source {str(p)!r} is neither a study directory (with runs/) nor a results file")


def factor_coding(df: pd.DataFrame) -> dict[str, tuple[str | None, str | None]]:
    """{factor: (low level, high level)} from the runs' recorded definitions, in first-seen order.

    Runs of one study agree; when runs disagree (e.g. two studies' runs pooled), the definition most
    completed runs carry wins and a run at a level outside it is coded None (left out, by name)."""
    if "coding" not in df.columns:
        raise ValueError("results table lacks column 'coding' (each run's factor definitions); collect it "
                         "again from the run directories with analysis.io.results.collect")
    ok = df[df["status"] == "completed"] if "status" in df else df
    votes: dict[str, dict[tuple, int]] = {}
    for coding, k in codings(ok) + codings(df):  # completed runs count first, then all
        for name, d in coding.items():
            votes.setdefault(name, {}).setdefault((d.get("low"), d.get("high")), 0)
            votes[name][(d.get("low"), d.get("high"))] += k
    return {name: max(v, key=v.get) for name, v in votes.items()}


def codings(df: pd.DataFrame) -> list[tuple[dict, int]]:
    """Each distinct `coding` of the table parsed once, with the number of rows carrying it, in
    first-seen order (a study's runs share one coding: parsing every row made the analysis slow)."""
    counts: dict = {}
    for raw in df["coding"] if "coding" in df.columns else ():
        counts[raw] = counts.get(raw, 0) + 1
    return [(json.loads(raw) if isinstance(raw, str) and raw else {}, k) for raw, k in counts.items()]


def factor_codes(df: pd.DataFrame, factor: str, coding: Mapping[str, tuple] | None = None) -> np.ndarray:
    """The ±1 code of each run for `factor` (object array; None at any other level or when absent)."""
    coding = factor_coding(df) if coding is None else coding
    if factor not in coding:
        raise ValueError(f"unknown factor {factor!r}; allowed values (recorded by the runs): "
                         f"{', '.join(coding) or 'none'}")
    low, high = coding[factor]
    col = df[factor] if factor in df.columns else pd.Series([None] * len(df), index=df.index)
    return np.array([-1 if v == low and low is not None else 1 if v == high and high is not None else None
                     for v in col], dtype=object)


def factor_columns(df: pd.DataFrame) -> list[str]:
    """The study's factors (recorded by its runs) whose level varies among the completed runs."""
    ok = df[df["status"] == "completed"] if "status" in df else df
    return [f for f in factor_coding(df) if f in ok.columns and ok[f].dropna().nunique() > 1]


def read_lr_profile(study_dir: str | Path) -> dict | None:
    """The study folder's LR profile record (`<study>/profile/lr_profile.json`, sweeps/tuning.py), else None;
    a damaged file counts as none (the report then says only how the runs' LRs were set)."""
    got = read_json(Path(study_dir) / "profile" / "lr_profile.json")
    return got if isinstance(got, dict) else None


def profile_seconds(study_dir: str | Path) -> dict[int, float]:
    """{seed: the summed `wall_s` of its LR-profile runs} under `<study>/profile/runs/` (what a seed's profile
    costs, for the report's "What it would take"); {} without a profile. Unreadable runs are skipped."""
    out: dict[int, float] = {}
    for d in sorted((Path(study_dir) / "profile" / "runs").glob("*")):
        try:
            meta, summ = read_meta(d), read_summary(d)
        except (DamagedFile, ValueError, OSError):
            continue
        w = getattr(summ, "wall_s", None) if summ is not None else None
        if meta is None or meta.seed is None or w is None or not math.isfinite(float(w)):
            continue
        out[int(meta.seed)] = out.get(int(meta.seed), 0.0) + float(w)
    return out
