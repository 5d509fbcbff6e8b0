"""`marin-ablate analyze --import.table FILE`: results from elsewhere (a CSV or JSON table) -> a study folder
(docs/importing.md "Importing results from elsewhere", docs/method.md §4.8).

Every row is validated before anything is written; an error is one line naming the row (1 = the first
data row), the column and the allowed values. The study folder is the run-directory format `collect`
reads (`runs/<run_id>/{meta,spec,summary}.json` through marin.schema), written into a temporary
sibling folder and renamed into place, so a failed import leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from marin_ablate.analysis.io.results import LOSS_MAX, mark_damaged_losses
from marin_ablate.marin.schema import (
    SAFE_NAME_RE,
    SAFE_NAME_TEXT,
    FactorCoding,
    RunMeta,
    RunSummary,
    atomic_write_json,
    sha256_file,
    write_meta,
    write_summary,
)

#: The schema's own columns; every other column is a factor (its values are the arm's levels).
#: name -> (required, what it holds). Compute: `flops`, or `params` and `tokens` (C = 6·params·tokens).
COLUMNS: dict[str, tuple[bool, str]] = {
    "arm": (True, "the arm's name (text)"),
    "rung": (True, "the scale's name (text); runs of one rung are compared with each other"),
    "loss": (True, "the evaluation loss (a finite number > 0; may be empty only on a failed row)"),
    "flops": (False, "training FLOPs (a number > 0); or give params and tokens"),
    "params": (False, "parameters (a number > 0), with tokens: C = 6·params·tokens"),
    "tokens": (False, "training tokens (a number > 0)"),
    "tokens_per_s": (False, "training throughput (a number > 0; needs tokens): the throughput ratio R"),
    "seed": (False, "replicate seed (an integer >= 0; default 0)"),
    "source": (False, "where the row comes from (text, kept in meta.json)"),
    "hardware": (False, "hardware (text; default 'imported'); throughput is compared on the same one"),
    "run_id": (False, "run id (1 to 128 letters, digits, . _ -, the first a letter or digit; default generated "
                      "from study, rung, arm, seed)"),
    "status": (False, "completed or failed (default completed)"),
    "error": (False, "a failed row's error (text)"),
    "changes": (False, "instead of factor columns: ';'-separated factor=level changes from the baseline arm"),
}
STATUSES = ("completed", "failed")
#: Bounds of an import: the file read, and the run folders it writes (one per row, ~16 KB each).
MAX_FILE_BYTES = 64 << 20
MAX_ROWS = 10_000


@dataclass
class Imported:
    rows: list[dict]  # validated rows
    factors: list[str]
    coding: dict[str, tuple[str, str]]  # factor -> (low, high)
    notes: list[str] = field(default_factory=list)  # how each factor was coded, where that needs saying


def _recipe():
    """The registered recipe factors (marin.switches, imported when a file is read: analysis modules
    load only marin.schema at import)."""
    from marin_ablate.marin import switches

    return switches.SPECS, switches.RECIPE_LEVELS, switches.BASELINE_LEVELS


def _err(row: int | None, col: str, msg: str) -> ValueError:
    where = f"row {row}, column {col!r}" if row is not None else f"column {col!r}"
    return ValueError(f"{where}: {msg}")


def _show(v) -> str:
    """A cell as an error message quotes it: a long one cut, its length given."""
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:40]}… ({len(str(v)):,} characters)"


def _json_int(text: str) -> int | str:
    """A JSON integer; one too long to convert stays text, refused by the row check that names its cell."""
    return int(text) if len(text) <= 100 else text


def read_rows(path: Path) -> list[dict]:
    """The file's rows as dicts of raw values (CSV: text; JSON: a list of objects, or {"runs": [...]})."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(f"FILE {str(path)!r} is {size:,} bytes; allowed values: at most {MAX_FILE_BYTES:,} bytes "
                         "(split the table)")
    if path.suffix.lower() == ".csv":
        try:
            df = pd.read_csv(path, dtype=str, keep_default_na=False)
        except Exception as e:  # noqa: BLE001 - pandas raises many types for a malformed file
            raise ValueError(f"cannot read {str(path)!r} as CSV: {type(e).__name__}: {e}") from None
        return df.to_dict("records")
    if path.suffix.lower() == ".json":
        try:
            d = json.loads(path.read_text(), parse_int=_json_int)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; deep nesting
            why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            raise ValueError(f"cannot read {str(path)!r} as JSON: {why}") from None
        rows = d.get("runs") if isinstance(d, dict) else d
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{str(path)!r}: allowed values: a JSON list of row objects, or {{\"runs\": [...]}}")
        out = []
        for r in rows:  # a row may hold its levels as {"factors": {name: level}}
            r = dict(r)
            fac = r.pop("factors", None) or {}
            if not isinstance(fac, dict):
                raise _err(len(out) + 1, "factors", f"{fac!r}; allowed values: an object factor -> level")
            out.append({**r, **fac})
        return out
    raise ValueError(f"FILE {str(path)!r}: allowed values: a .csv or .json file")


def _blank(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def _number(v, row: int, col: str, *, integer: bool = False, hi: float | None = None) -> float:
    allowed = "an integer >= 0" if integer else "a finite number > 0" + (f" and <= {hi:g}" if hi is not None else "")
    if isinstance(v, bool):
        raise _err(row, col, f"{_show(v)} is not a number; allowed values: {allowed}")
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise _err(row, col, f"{_show(v)} is not a number; allowed values: {allowed}") from None
    if integer:
        if not (math.isfinite(x) and x >= 0 and x == int(x)):
            raise _err(row, col, f"{_show(v)} is out of range; allowed values: {allowed}")
    elif not (math.isfinite(x) and x > 0 and (hi is None or x <= hi)):
        raise _err(row, col, f"{_show(v)} is out of range; allowed values: {allowed}")
    return x


def _changes(v, row: int) -> dict[str, str]:
    """'a=x;b' -> {a: x, b: recipe level (registered) or 'on'}; empty on the baseline arm."""
    specs = _recipe()[0]
    out: dict[str, str] = {}
    for part in ("" if _blank(v) else str(v)).split(";"):
        part = part.strip()
        if not part:
            continue
        name, _, level = (s.strip() for s in part.partition("="))
        if not name or name in COLUMNS:
            raise _err(row, "changes", f"{part!r}; allowed values: factor=level pairs separated by ';'")
        out[name] = level or (specs[name].recipe if name in specs else "on")
    return out


def validate(raw: list[dict]) -> Imported:
    """Every row checked; the first bad cell raises one line naming its row and column: the columns (`_columns`),
    each row's cells (`_row`) and arm in file order, then a `changes` table's baseline levels, ids and arms."""
    _, recipe_levels, baseline_levels = _recipe()
    if not raw:
        raise ValueError("FILE holds no rows; allowed values: a table with a header and at least one row")
    use_changes, factors = _columns(raw)
    rows, seen, arm_levels = [], {}, {}
    for i, r in enumerate(raw, start=1):
        out = _row(r, i, factors, use_changes, recipe_levels)
        levels, key = out["levels"], (out["arm"], out["rung"], out["seed"])
        if key in seen:
            raise _err(i, "arm", f"arm {key[0]!r} at rung {key[1]!r}, seed {key[2]} repeats row {seen[key]}; "
                                 "allowed values: one row per arm, rung and seed")
        seen[key] = i
        prev = arm_levels.setdefault(out["arm"], (i, levels))
        if prev[1] != levels and not use_changes:
            f = next(f for f in factors if prev[1].get(f) != levels.get(f))
            raise _err(i, f, f"arm {out['arm']!r} has level {levels[f]!r} here but {prev[1][f]!r} in row "
                             f"{prev[0]}; allowed values: one level per arm")
        if prev[1] != levels:
            raise _err(i, "changes", f"arm {out['arm']!r} lists other changes than in row {prev[0]}; allowed "
                                     "values: one set of changes per arm")
        rows.append(out)
    notes: list[str] = []
    if use_changes:  # a factor a row does not change sits at the baseline arm's level, which the file does not name
        factors = list(dict.fromkeys(f for r in rows for f in r["levels"]))
        base = {f: UNNAMED_BASELINE if f in baseline_levels else "off" for f in factors}
        notes += [f"changes: the baseline arm's {f} is not named in the file; recorded as {UNNAMED_BASELINE!r}, "
                  f"not as the registry's {baseline_levels[f]!r}" for f in factors if f in baseline_levels]
        for i, r in enumerate(rows, start=1):
            for f, lv in r["levels"].items():
                if lv == base[f]:
                    raise _err(i, "changes", f"{f}={lv} is the baseline's own level; allowed values: a level "
                                             f"other than {lv!r} (leave unchanged factors out)")
            r["levels"] = {**base, **r["levels"]}
    ids, arms = {}, {}
    for i, r in enumerate(rows, start=1):
        if r["run_id"] is not None and ids.setdefault(r["run_id"], i) != i:
            raise _err(i, "run_id", f"{r['run_id']!r} repeats row {ids[r['run_id']]}; allowed values: unique ids")
    for i, r in enumerate(rows, start=1):
        other = arms.setdefault(tuple(sorted(r["levels"].items())), (r["arm"], i))
        if other[0] != r["arm"]:
            raise _err(i, "arm", f"arm {r['arm']!r} has the same factor levels as arm {other[0]!r} (row {other[1]}); "
                                 "allowed values: arms that differ in at least one factor")
    coding = {}
    for f in factors:
        coding[f], why = _coding(f, rows)
        notes += why
    return Imported(rows, factors, coding, notes)


def _columns(raw: list[dict]) -> tuple[bool, list[str]]:
    """(levels from a `changes` column?, the factor columns), the required columns present and none clashing."""
    cols = list(dict.fromkeys(c for r in raw for c in r))
    for c in ("arm", "rung", "loss"):
        if c not in cols:
            raise _err(None, c, "missing; allowed values: a table with columns arm, rung, loss, "
                                "and flops or params + tokens")
    if "flops" not in cols and not {"params", "tokens"} <= set(cols):
        col = ("flops" if "params" not in cols and "tokens" not in cols
               else ("params" if "params" not in cols else "tokens"))
        raise _err(None, col, "missing; allowed values: a flops column, or params and tokens columns (the compute)")
    use_changes = "changes" in cols
    factors = [c for c in cols if c not in COLUMNS]
    from marin_ablate.ablations.factors import RESERVED_NAMES

    for c in factors:  # a factor column named like a results column would overwrite it
        if c in RESERVED_NAMES:
            raise _err(None, c, "is a column of every run's results row, so no factor can take its name; allowed "
                                f"values: a schema column ({', '.join(COLUMNS)}) or a factor named otherwise")
    if use_changes and factors:
        raise _err(None, "changes", f"given with factor columns {', '.join(factors)}; allowed values: one or the other")
    return use_changes, factors


def _row(r: dict, i: int, factors: list[str], use_changes: bool, recipe_levels: dict) -> dict:
    """Row i's cells, checked and converted: names, status, loss, compute and throughput, seed, texts, levels."""
    out: dict = {}
    for c in ("arm", "rung"):
        if _blank(r.get(c)):
            raise _err(i, c, "empty; allowed values: a non-empty name")
        out[c] = str(r[c]).strip()
    status = "completed" if _blank(r.get("status")) else str(r["status"]).strip()
    if status not in STATUSES:
        raise _err(i, "status", f"{status!r}; allowed values: {', '.join(STATUSES)}")
    out["status"] = status
    out["error"] = None if _blank(r.get("error")) else str(r["error"])
    if status == "failed" and _blank(r.get("loss")):
        out["loss"] = None
        out["error"] = out["error"] or "failed (imported)"
    elif _blank(r.get("loss")):
        raise _err(i, "loss", "empty; allowed values: a finite number > 0 (empty only with status failed)")
    else:
        out["loss"] = _number(r["loss"], i, "loss", hi=LOSS_MAX)  # nats per token: beyond it, damage
    for c in ("params", "tokens", "tokens_per_s", "flops"):
        out[c] = None if _blank(r.get(c)) else _number(r[c], i, c)
    if out["flops"] is None:
        for c in ("params", "tokens"):
            if out[c] is None:
                raise _err(i, c, "empty and no flops given; allowed values: a finite number > 0")
        out["flops"] = 6.0 * out["params"] * out["tokens"]
    if out["tokens_per_s"] is not None and out["tokens"] is None:
        raise _err(i, "tokens_per_s", "given without the row's tokens (needed for FLOP/s); allowed values: "
                                      "add a tokens column or leave tokens_per_s empty")
    out["seed"] = 0 if _blank(r.get("seed")) else int(_number(r["seed"], i, "seed", integer=True))
    for c, default in (("source", None), ("hardware", "imported"), ("run_id", None)):
        out[c] = default if _blank(r.get(c)) else str(r[c]).strip()
    if out["run_id"] is not None and not SAFE_NAME_RE.fullmatch(out["run_id"]):
        raise _err(i, "run_id", f"{_show(out['run_id'])}; allowed values: {SAFE_NAME_TEXT}")
    levels = _changes(r.get("changes"), i) if use_changes else {}
    for f in factors:
        if _blank(r.get(f)):
            raise _err(i, f, "empty; allowed values: the arm's level of this factor")
        levels[f] = str(r[f]).strip()
    for f, lv in levels.items():
        if f in recipe_levels and lv not in recipe_levels[f]:
            raise _err(i, "changes" if use_changes else f,
                       f"level {lv!r} of {f} is unknown; allowed values: {', '.join(recipe_levels[f])}")
    out["levels"] = levels
    return out


#: The level recorded for a registered factor the `changes` column leaves at the baseline arm's (unnamed) level.
UNNAMED_BASELINE = "baseline"


def _coding(f: str, rows: list[dict]) -> tuple[tuple[str, str], list[str]]:
    """((low, high), notes) of a factor from the levels the file holds, by the rule of docs/method.md §4.8
    (*Imported results*); a note when they differ from the registry's, and one naming any third level."""
    specs = _recipe()[0]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["levels"][f]] = counts.get(r["levels"][f], 0) + 1
    order = sorted(counts, key=lambda k: -counts[k])
    spec = specs.get(f)
    named = [r["levels"][f] for r in rows if r["arm"].strip().lower() == "baseline"]
    if spec is not None and spec.baseline in counts:
        low = spec.baseline
    elif named:
        low = named[0]
    elif spec is not None and spec.recipe in counts and len(order) > 1:
        low = next(k for k in order if k != spec.recipe)
    else:
        low = order[0]
    rest = [k for k in order if k != low]
    high = spec.recipe if spec is not None and spec.recipe in rest else (rest[0] if rest else low)
    notes = []
    if spec is not None and (low, high) != (spec.baseline, spec.recipe):
        notes.append(f"{f}: coded by the levels in the file, {low} (−1, the baseline arm's) and {high} (+1); the "
                     f"registry's are {spec.baseline} and {spec.recipe}")
    third = [k for k in order if k not in (low, high)]
    if third:
        notes.append(f"{f}: level(s) {', '.join(third)} ({sum(counts[k] for k in third)} run(s)) beyond the two coded "
                     f"({low}, {high}): a two-level analysis leaves those runs out")
    return (low, high), notes


def _run_id(r: dict, study: str) -> str:
    return r["run_id"] or hashlib.sha256(f"{study}|{r['rung']}|{r['arm']}|{r['seed']}".encode()).hexdigest()[:16]


def _values(r: dict) -> dict:
    """The summary fields of a validated row (model FLOP/s = tokens/s × FLOPs per token)."""
    C, tok, par, tps = r["flops"], r["tokens"], r["params"], r["tokens_per_s"]
    fpt = C / tok if tok else None
    return {"tokens": int(tok) if tok else None, "params_total": int(par) if par else None,
            "params_active": int(par) if par else None, "flops_per_token": fpt, "train_flops": C,
            "eval_macro_loss": r["loss"], "tokens_per_s": tps,
            "model_flops_per_s": tps * fpt if tps and fpt else None, "hardware": r["hardware"]}


def to_table(imp: Imported, study: str) -> pd.DataFrame:
    """The results table `collect` would read from the imported study folder (analyse a file in place)."""
    specs = _recipe()[0]
    coding = json.dumps({f: {"field": f"recipe.{f}" if f in specs else f"imported.{f}", "low": lo, "high": hi}
                         for f, (lo, hi) in imp.coding.items()})
    rows = [{"run_id": _run_id(r, study), "study": study, "rung": r["rung"], "arm": r["arm"], "seed": r["seed"],
             "design_row": None, **r["levels"], "coding": coding, "status": r["status"], "error": r["error"],
             "source": r["source"], **_values(r)} for r in imp.rows]
    return pd.DataFrame(rows)


def complete_table(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """A table file read by `analyze`: one in the import schema (a `loss` column, no `eval_macro_loss`)
    is validated and converted here; a results table lacking run_id, status or error gets them
    (generated ids, "completed", none) instead of failing on a missing column."""
    if "loss" in df.columns and "eval_macro_loss" not in df.columns:
        imp = validate(read_rows(path))
        for note in imp.notes:
            print(f"note: {note}")
        return to_table(imp, path.stem)
    df = df.copy()
    if "status" not in df.columns:
        df["status"] = "completed"
    if "error" not in df.columns:
        df["error"] = None
    df = mark_damaged_losses(df, path.name)
    if "run_id" not in df.columns:
        key = [df[c].astype(str) if c in df.columns else pd.Series("", index=df.index) for c in ("rung", "arm", "seed")]
        df["run_id"] = [hashlib.sha256(f"{path.stem}|{i}|{r}|{a}|{s}".encode()).hexdigest()[:16]
                        for i, r, a, s in zip(range(len(df)), *key, strict=True)]
    return df


def write_study_dir(imp: Imported, out: Path, study: str, source_file: Path) -> Path:
    """The run directories, built in a temporary sibling folder and renamed to `out` at the end."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--study-dir {str(out)!r} exists and is not empty; allowed values: a new or empty folder")
    if len(imp.rows) > MAX_ROWS:
        raise ValueError(f"FILE has {len(imp.rows):,} rows, each a run folder; allowed values: at most {MAX_ROWS:,} "
                         "rows (split the table, or analyze the file in place: marin-ablate analyze FILE)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    specs = _recipe()[0]
    ids = [_run_id(r, study) for r in imp.rows]
    first: dict[str, int] = {}
    for i, rid in enumerate(ids, start=1):  # a given id may equal a generated one: one folder per row, always
        if first.setdefault(rid, i) != i:
            raise _err(i, "run_id", f"run id {rid!r} is row {first[rid]}'s too; allowed values: one id per row")
    try:
        fields = {f: f"recipe.{f}" if f in specs else f"imported.{f}" for f in imp.factors}
        for r, rid in zip(imp.rows, ids, strict=True):
            v = _values(r)
            d = tmp / "runs" / rid
            d.mkdir(parents=True)
            factors = tuple(FactorCoding(f, r["levels"][f], fields[f], *imp.coding[f]) for f in imp.factors)
            extra = {"source": r["source"]} if r["source"] else {}
            write_meta(d, RunMeta(study, r["rung"], r["arm"], r["seed"], None, factors,
                                  {**extra, "imported": True, "run_id": rid}))
            atomic_write_json(d / "spec.json", {"seed": r["seed"], "imported_from": source_file.name, "run_id": rid})
            write_summary(d, RunSummary(run_id=rid, status=r["status"], error=r["error"], code_version="imported",
                                        **v))
        atomic_write_json(tmp / "import.json", {"file": str(source_file), "sha256": sha256_file(source_file),
                                                "rows": len(imp.rows), "factors": imp.factors,
                                                "coding": {f: list(v) for f, v in imp.coding.items()},
                                                "notes": imp.notes})
        written = sorted(p.name for p in (tmp / "runs").iterdir())
        if written != sorted(ids):  # rows in = runs written, or nothing is
            raise ValueError(f"FILE's {len(ids)} rows wrote {len(written)} run folders; nothing was imported")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


@dataclass(frozen=True)
class Layout:
    """How a table from elsewhere maps onto the import schema (`COLUMNS`): `convert` rewrites its raw rows
    into schema rows, `coding` fixes each factor's (low, high) where the file's counts would not, and
    `law` is a published law (ablations.ladders.PublishedLaw) the study folder pins (reference_law.json)."""

    name: str
    doc: str
    convert: Callable[[list[dict]], list[dict]]
    coding: Callable[[], dict[str, tuple[str, str]]] | None = None
    law: Callable[[], object] | None = None


#: Marin's hold-one-feature-out table (marin-community/marin#9288, experiments/grug/fast_track/launch.py
#: `ABLATIONS`): its columns, and what each becomes
MARIN_HOLDOUT_COLUMNS = {
    "ablation": "Marin's ablation name (none, drop_xsa, drop_sconv, drop_latent, drop_muonh, drop_attn_gate, "
                "drop_gated_norm, full_rope_local): the arm of the holdout study",
    "rung": "the fast-track rung (d512, d768, ...): a GPU rung of this harness",
    "loss": "Paloma macro loss", "tokens_per_s": "optional throughput", "seed": "optional", "source": "optional",
    "flops": "optional; none: this harness's analytic FLOPs of the same arm and rung (data-matched tokens)",
}


def _marin_holdout(raw: list[dict]) -> list[dict]:
    """Marin's rows as holdout-study arms: the arm's levels from `ablations.holdout.HOLDOUTS`, the rung's
    tokens, and (unless given) the arm's analytic FLOPs at that rung."""
    from marin_ablate.ablations.holdout import HOLDOUTS, holdout, marin_arm
    from marin_ablate.ablations.ladders import GPU_RUNGS, flops_per_token

    out = []
    for i, r in enumerate(raw, start=1):
        bad = [c for c in r if c not in MARIN_HOLDOUT_COLUMNS]
        if bad:
            raise _err(i, bad[0], f"not a column of Marin's hold-one-out table; allowed values: "
                                  f"{', '.join(MARIN_HOLDOUT_COLUMNS)}")
        for c in ("ablation", "rung"):
            if _blank(r.get(c)):
                raise _err(i, c, f"empty; allowed values: {MARIN_HOLDOUT_COLUMNS[c]}")
        try:
            arm = marin_arm(str(r["ablation"]).strip())
        except ValueError as e:
            raise _err(i, "ablation", str(e)) from None
        rung = str(r["rung"]).strip()
        if rung not in GPU_RUNGS:
            raise _err(i, "rung", f"{rung!r}; allowed values: {', '.join(GPU_RUNGS)}")
        levels = {h.factor.name: h.factor.low if h.arm == arm else h.factor.high for h in HOLDOUTS}
        row = {k: r[k] for k in ("loss", "tokens_per_s", "seed") if k in r}
        spec = holdout(rungs=(rung,)).spec(rung, levels, 0)
        tokens = GPU_RUNGS[rung].tokens()
        flops = r.get("flops") if not _blank(r.get("flops")) else flops_per_token(spec.model, spec.recipe) * tokens
        out.append({**row, "arm": arm, "rung": rung, "flops": flops, "tokens": tokens, "hardware": "H100 (Marin)",
                    "source": r.get("source") or "marin-community/marin#9288", **levels})
    bare = sorted({r["rung"] for r in out} - {r["rung"] for r in out if r["arm"] == "recipe"})
    if bare:  # each hold-one-out is read against the recipe at its rung: without it nothing is estimable there
        raise ValueError(f"rung(s) {', '.join(bare)}: no row of ablation 'none' (the recipe arm, which every "
                         "hold-one-out at its rung is read against); allowed values: a table with the recipe's row "
                         "at each rung it holds")
    return out


def _holdout_coding() -> dict[str, tuple[str, str]]:
    from marin_ablate.ablations.holdout import HOLDOUTS

    return {h.factor.name: (h.factor.low, h.factor.high) for h in HOLDOUTS}


def _fast_ladder_law():
    from marin_ablate.ablations.ladders import FAST_LADDER_LAW

    return FAST_LADDER_LAW


LAYOUTS: dict[str, Layout] = {la.name: la for la in (
    Layout("runs", "one row per run in the import schema (COLUMNS)", lambda rows: rows),
    Layout("marin_holdout", "Marin's hold-one-feature-out table: ablation, rung, loss[, tokens_per_s] "
           "(MARIN_HOLDOUT_COLUMNS), as the holdout study's arms, read through Marin's fast-ladder law",
           _marin_holdout, _holdout_coding, _fast_ladder_law),
)}


def import_file(path: str | Path, out: str | Path | None = None, study: str | None = None,
                layout: str = "runs") -> Path:
    """Validate FILE (its rows rewritten by `LAYOUTS[layout]` first), then write its study folder (default:
    FILE without its suffix), with the layout's published law pinned there."""
    path = Path(path)
    if layout not in LAYOUTS:
        raise ValueError(f"--import.layout {layout!r}; allowed values: {', '.join(LAYOUTS)}")
    if not path.is_file():
        raise ValueError(f"FILE {str(path)!r} not found; allowed values: a .csv or .json file")
    la = LAYOUTS[layout]
    imp = validate(la.convert(read_rows(path)))
    if la.coding is not None:  # the layout knows each factor's levels; the file's counts do not decide them
        fixed = la.coding()
        imp.coding.update({f: c for f, c in fixed.items() if f in imp.coding})
        imp.notes = [n for n in imp.notes if n.split(":")[0] not in fixed]
    target = write_study_dir(imp, Path(out) if out else path.with_suffix(""), study or path.stem, path)
    if la.law is not None:
        from marin_ablate.analysis.io.pinned_law import LAW_FILE, published

        atomic_write_json(target / LAW_FILE, published(la.law()).to_dict())
    return target
