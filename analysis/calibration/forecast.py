"""Pre-registration (docs/method.md §4.7): an immutable, hashed, timestamped forecast of a target run.

`<study>/forecasts/forecast-<UTC>-<sha8>.json` holds {"content", "sha256" of its canonical JSON}, created exclusively
and made read-only; the report checks the hash and refuses a forecast written after the target run started.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from marin_ablate.analysis.io.results import factor_codes, factor_coding
from marin_ablate.analysis.pipeline import StudyAnalysis
from marin_ablate.marin.schema import DamagedFile, read_json

COMPUTE_TOLERANCE = 0.10  # a run is "the target" when its FLOPs are within 10% of the target compute
ARM_ALIASES = ("recipe", "baseline")


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=float)


def arm_codes(analysis: StudyAnalysis, arm: str) -> dict[str, int]:
    """Factor -> ±1 of an arm: 'recipe' (all on), 'baseline' (all off), or an arm name of the table."""
    if arm == "recipe":
        return {f: 1 for f in analysis.factors}
    if arm == "baseline":
        return {f: -1 for f in analysis.factors}
    t = analysis.table
    if "arm" in t and (t["arm"].astype(str) == arm).any():
        row = t[t["arm"].astype(str) == arm].iloc[0]
        return {f: int(row[f"x_{f}"]) for f in analysis.factors}
    known = sorted(set(t["arm"].astype(str))) if "arm" in t else []
    raise ValueError(f"arm {arm!r}; allowed values: {', '.join(ARM_ALIASES + tuple(known[:20]))}")


def _table_hash(df: pd.DataFrame) -> str:
    cols = [c for c in ("run_id", "eval_macro_loss", "train_flops", "status") if c in df]
    return hashlib.sha256(df[cols].sort_values("run_id").to_csv(index=False).encode()).hexdigest()


def _matching_runs(df: pd.DataFrame, factors: list[str], codes: dict[str, int], compute: float) -> pd.DataFrame:
    coding = factor_coding(df)
    m = np.ones(len(df), bool)
    for f in factors:
        m &= np.array([c is not None and c == codes[f] for c in factor_codes(df, f, coding)])
    C = pd.to_numeric(df["train_flops"], errors="coerce").to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        m &= np.abs(np.log(C / compute)) <= np.log1p(COMPUTE_TOLERANCE)
    return df[m]


def write_forecast(study_dir: str | Path, analysis: StudyAnalysis, raw_table: pd.DataFrame, *,
                   target_compute: float, arm: str = "recipe", note: str = "", now: float | None = None,
                   force: bool = False) -> Path:
    """Write the forecast once; refuse when a target run has already started."""
    if not target_compute > 0:
        raise ValueError(f"target_compute must be > 0 FLOPs, got {target_compute}")
    now = time.time() if now is None else now
    codes = arm_codes(analysis, arm)
    started = _matching_runs(raw_table, analysis.factors, codes, target_compute)
    st = pd.to_numeric(started.get("started_at", pd.Series(dtype=float)), errors="coerce").dropna()
    if len(st) and st.min() <= now:
        raise ValueError(f"target: a run of arm {arm!r} at {target_compute:.3g} FLOPs already started "
                         f"(run {started['run_id'].iloc[0]}); a forecast must precede it")
    pred = analysis.arm_prediction(codes, target_compute, force=force)
    fit = analysis.fits["quality"]
    content = {
        "kind": "marin-ablate forecast", "version": 1,
        "study": (str(raw_table["study"].dropna().iloc[0])
                  if "study" in raw_table and raw_table["study"].notna().any() else Path(study_dir).name),
        "created_at": now, "created_utc": datetime.fromtimestamp(now, timezone.utc).isoformat(),
        "note": note,
        "target": {"compute": float(target_compute), "arm": arm, "codes": codes},
        "prediction": pred,
        "fit": {"law": analysis.law.to_dict(), "c_ref": analysis.c_ref, "method": fit.method,
                "coefficients": fit.coef_table()[["term", "estimate", "se"]].to_dict("records")},
        "inputs": {"run_ids": sorted(analysis.table["run_id"].astype(str)), "table_sha256": _table_hash(raw_table)},
    }
    digest = hashlib.sha256(canonical(content).encode()).hexdigest()
    out = Path(study_dir) / "forecasts"
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = out / f"forecast-{stamp}-{digest[:8]}.json"
    with open(path, "x") as f:  # exclusive: an existing forecast is never overwritten
        f.write(json.dumps({"content": content, "sha256": digest}, indent=1, default=float))
    os.chmod(path, 0o444)
    return path


def read_forecasts(study_dir: str | Path) -> list[dict]:
    """All forecasts of a study, each with `valid_hash` set by recomputing the digest."""
    out = []
    for p in sorted((Path(study_dir) / "forecasts").glob("forecast-*.json")):
        d = read_json(p, strict=True)  # a damaged forecast is named, never skipped: it is a pre-registration
        if "content" not in d:
            raise DamagedFile(f"cannot read {p}: not a forecast (no 'content')")
        d["path"] = str(p)
        d["valid_hash"] = hashlib.sha256(canonical(d["content"]).encode()).hexdigest() == d.get("sha256")
        out.append(d)
    return out


def judge(forecast: dict, raw_table: pd.DataFrame, factors: list[str]) -> dict:
    """Outcome beside the forecast: status 'pending', 'scored', 'refused' (late) or 'tampered'."""
    c = forecast["content"]
    res = {"path": forecast["path"], "created_utc": c["created_utc"], "arm": c["target"]["arm"],
           "compute": c["target"]["compute"], "predicted": c["prediction"]["loss"],
           "lo": c["prediction"].get("loss_lo"), "hi": c["prediction"].get("loss_hi"), "outcome": None,
           "inside": None}
    if not forecast["valid_hash"]:
        return {**res, "status": "tampered: the sha256 does not match the content"}
    runs = _matching_runs(raw_table, [f for f in factors if f in c["target"]["codes"]], c["target"]["codes"],
                          c["target"]["compute"])
    st = pd.to_numeric(runs.get("started_at", pd.Series(dtype=float)), errors="coerce").dropna()
    if len(st) and st.min() < c["created_at"]:
        return {**res, "status": "refused: written after the target run started"}
    done = runs[runs["status"] == "completed"]
    if not len(done):
        return {**res, "status": "pending: no completed target run yet"}
    y = float(done["eval_macro_loss"].mean())
    inside = res["lo"] is not None and res["lo"] <= y <= res["hi"]
    return {**res, "status": "scored", "outcome": y, "inside": bool(inside)}
