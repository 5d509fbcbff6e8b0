"""The run directory a training run claims: made and checked before anything in it changes (no symlinks, no other
run's spec, summary or checkpoints: docs/faults.md), and the summary as summary.json holds it."""

from __future__ import annotations

import json
from pathlib import Path

from marin_ablate.marin import schema
from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.flops import summary_contradiction
from marin_ablate.marin.train import checkpoint as ckpt


def summary_json(s: schema.RunSummary) -> dict:
    """The summary as summary.json holds it (lists, not tuples): what train() returns."""
    return json.loads(json.dumps(s.to_dict()))


def other_run(run_dir: Path, run_id: str, checkpoints: bool) -> tuple[str, str] | None:
    """(run id, the file that says so) when `run_dir` holds a run other than `run_id`: its spec.json,
    summary.json or (`checkpoints`: before they would be deleted) a checkpoint's meta.json."""
    try:
        old = schema.read_json(run_dir / "spec.json")
        held = RunSpec.from_dict(old).run_id if old is not None else None
    except (ValueError, TypeError, KeyError):  # a spec this version cannot read: its run id is unknown
        held = None
    if held is not None and held != run_id:
        return held, "spec.json"
    cks = ckpt.checkpoint_dirs(run_dir / "checkpoints") if checkpoints else []
    for where in ["summary.json", *(f"checkpoints/{ck.name}/{ckpt.META}" for ck in cks)]:
        d = schema.read_json(run_dir / where)
        if d is not None and isinstance(d.get("run_id"), str) and d["run_id"] != run_id:
            return d["run_id"], where
    return None


def claim_dir(run_dir: Path, spec: RunSpec, resume: bool) -> dict | None:
    """The run directory, made and checked before anything in it changes: the summary of this run when it
    is done already (`resume`), else None. A directory holding another run is refused (`other_run`); a
    fresh start (not `resume`) removes the old verdict, so a killed run does not leave it behind."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    ckpt.check_no_symlinks(run_dir)
    if resume:
        done = schema.read_summary(run_dir)  # a damaged verdict reads as none: train (or resume) again
        if done is not None and done.run_id == spec.run_id and summary_contradiction(
                spec.to_dict(), done.to_dict(), str(run_dir)) is None:  # nor does one of another run's training
            return summary_json(done)
    other = other_run(run_dir, spec.run_id, checkpoints=not resume)
    if other is not None:  # never resumed into, never deleted: another spec's results stay as they are
        held, where = other
        raise ValueError(f"run_dir {str(run_dir)!r} holds run {held} ({where}), not {spec.run_id}; "
                         "use another --run-dir, or move that directory aside first (--no-resume never deletes "
                         "another run)")
    if not resume:
        (run_dir / "summary.json").unlink(missing_ok=True)
    return None
