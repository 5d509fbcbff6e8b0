"""Progress of a study's runs: counts by state, elapsed time, an ETA with a 90% interval (planning/costmodel.py,
less the steps running runs have done) and per running run its step and last loss. On a terminal the line is
rewritten in place; otherwise a new line is printed only when something shown changes, so logs stay short.
Everything here reads run directories only."""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence, TextIO

from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.schema import loads_json, read_json
from marin_ablate.planning import costmodel as cm
from marin_ablate.planning.costmodel import (
    CostModel,
    Estimate,
    cores,
    mark_cold,
    prior_from,
    read_cache,
    spec_flops,
)
from marin_ablate.sweeps.state import count, survey

_TAIL_BYTES = 16384  # a train line is < 1 KB: the last ones are in this much of metrics.jsonl


def last_train_record(metrics_path: str | Path) -> dict | None:
    """The last train line of a metrics.jsonl (step, loss ...), reading only its tail."""
    p = Path(metrics_path)
    try:
        with open(p, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            rec = loads_json(line)
        except ValueError:  # the first, cut line of the tail, or a line being written
            continue
        if isinstance(rec, dict) and "loss" in rec and "eval_macro_loss" not in rec:
            return rec
    return None


def run_live(run_dir: str | Path, now: float | None = None) -> dict:
    """step (steps done), total, last loss, elapsed_s (since the running process took the run)."""
    d = Path(run_dir)
    rec = last_train_record(d / "metrics.jsonl")
    spec = read_json(d / "spec.json")
    try:
        # the steps trained, not the rung's: token_multiplier (calibration's extra-compute arm) scales them
        total = RunSpec.from_dict(spec).train.effective().steps if spec is not None else None
    except (ValueError, KeyError, TypeError):
        total = None
    since = (read_json(d / ".lock") or {}).get("since")
    elapsed = (now if now is not None else time.time()) - since if since else None
    return {"step": rec["step"] + 1 if rec else 0, "total": total, "loss": rec["loss"] if rec else None,
            "elapsed_s": elapsed}


def run_flops(run_dir: str | Path) -> float | None:
    """Training FLOPs of the run from its spec.json (None when unreadable)."""
    try:
        return spec_flops(RunSpec.from_dict(read_json(Path(run_dir) / "spec.json") or {}))
    except (ValueError, KeyError, TypeError):
        return None


def rung_prior(rung_rows: Sequence[dict]) -> tuple[float, float] | None:
    """(overhead s, s per training FLOP) the plan assumes: each rung's assumed seconds per run (its wall-time
    assumption, else its GPU-hours per run over its GPUs) over its FLOPs per run; the overhead is the smallest
    rung's assumed one (else a tenth of its run)."""
    est = {r["name"]: float(r["est_wall_s"]) if r.get("est_wall_s")
           else float(r["gpu_hours"]) * 3600 / r["n_runs"] / max(1, int(r.get("gpus") or 1))
           for r in rung_rows if r.get("est_wall_s") or (r.get("gpu_hours") and r.get("n_runs"))}
    rows = [r for r in rung_rows if r["name"] in est and r.get("train_flops") and r.get("n_runs")]
    if not rows:
        return None
    secs = [est[r["name"]] for r in rows]
    over = [r["est_wall_s"] - r["tokens"] / r["est_tokens_per_s"] for r in rows
            if r.get("est_wall_s") and r.get("est_tokens_per_s") and r.get("tokens")]
    return prior_from([r["train_flops"] / r["n_runs"] for r in rows], secs, min(over) if over else 0.1 * min(secs))


def eta_model(prior: tuple[float, ...] | None, slots: int, device: str = "cpu") -> CostModel | None:
    """The cost model an ETA starts from: the plan's assumption (`rung_prior`) as the prior; its data, the
    runs this host recorded at `slots` runs at once (planning/costmodel.py), are joined with the study
    folder's in `study_eta` (each run id once)."""
    if prior is None:
        return None
    cached = [r for r in read_cache() if r.get("host") == socket.gethostname()
              and r.get("slots") == slots and r.get("device", "cpu") == device]
    return CostModel(*prior, cached=cached)


def study_eta(runs: Sequence[dict], model: CostModel | None, slots: int, factor: float = 1.0,
              load_note: str = "") -> Estimate | None:
    """Time until every run is done, with a 90% interval. runs: {"state", "flops", "wall_s", "step",
    "total", "cold"[, "slowdown"]}; completed runs join the cached ones (each run id once; not `cold` ones:
    costmodel.mark_cold), running runs count the steps they have left; `factor`: the load's slowdown now
    (costmodel.slowdown_now), said in `load_note`."""
    if model is None or any(r.get("flops") is None for r in runs if r["state"] not in ("completed", "failed")):
        return None
    obs = cm.observations(model.cached, [r for r in runs if r["state"] == "completed"])
    todo = [r for r in runs if r["state"] not in ("completed", "failed")]
    left = [1.0 - min(r["step"] / r["total"], 1.0) if r.get("step") and r.get("total") else 1.0 for r in todo]
    return CostModel(model.a0, model.b0, obs).predict([r["flops"] for r in todo], left, slots, factor, load_note)


def load_factor(specs: Sequence[RunSpec], slots: int) -> tuple[float, str]:
    """The slowdown `slots` of these runs at once would see now (CPU runs; a GPU's runs are not scaled)."""
    if not specs or specs[0].train.device.split(":")[0] != "cpu":
        return 1.0, ""
    threads = specs[0].train.threads or max(1, cores() // max(1, slots))
    k, note = cm.slowdown_now(min(slots, len(specs)) * threads)
    return (k if k is not None else 1.0), note


def plan_estimate(specs: Sequence[RunSpec], prior: tuple[float, ...] | None, slots: int | None,
                  threads: int | None = None, run_dirs: Sequence[str | Path | None] = ()) -> Estimate | None:
    """The one cost model behind `plan`, `run` and `run --tune`: wall time of `specs` (the runs still to train;
    `run_dirs`, one per spec where it has a folder, count the ones done there), `slots` at a time with
    `threads` torch threads each (None: the cores shared out), scaled by the machine's load now."""
    if not specs:
        return None
    k = slots or len(specs)
    todo = list(specs)
    model = eta_model(prior, k, device=specs[0].train.device.split(":")[0])
    rows = []
    for i, spec in enumerate(specs):
        d = run_dirs[i] if i < len(run_dirs) else None
        summ = (read_json(Path(d) / "summary.json") or {}) if d is not None else {}
        done = summ.get("status") == "completed"
        rows.append({"run_id": spec.run_id, "state": "completed" if done else "pending", "flops": spec_flops(spec),
                     "wall_s": summ.get("wall_s"), "started_at": summ.get("started_at"),
                     "slowdown": cm.run_slowdown(summ) if done else None})
    if threads is not None:
        todo = [replace(specs[0], train=replace(specs[0].train, threads=threads))] * len(specs)
    factor, note = load_factor(todo, k)
    return study_eta(mark_cold(rows, 0.0, k), model, k, factor, note)


def format_eta(e: Estimate) -> str:
    return f"ETA {hms(e.seconds)} ({hms(e.lo)}-{hms(e.hi)})"


def hms(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def format_running(run_id: str, meta: dict, live: dict) -> str:
    loss = f"{live['loss']:.4f}" if live.get("loss") is not None else "-"
    el = f" {hms(live['elapsed_s'])}" if live.get("elapsed_s") is not None else ""
    return (f"  {run_id} {meta.get('rung')} {meta.get('arm')} seed {meta.get('seed')}: "
            f"step {live['step']}/{live['total']} loss {loss}{el}")


def format_counts(counts: dict[str, int], total: int, elapsed_s: float, label: str = "") -> str:
    done = counts.get("completed", 0)
    pending = counts.get("pending", 0) + counts.get("partial", 0)
    parts = [f"{done}/{total} done", f"{counts.get('running', 0)} running", f"{counts.get('failed', 0)} failed",
             f"{pending} pending"]
    if counts.get("queued"):
        parts.insert(2, f"{counts['queued']} queued")
    if counts.get("partial"):
        parts[-1] += f" ({counts['partial']} partial)"
    m, s = divmod(int(elapsed_s), 60)
    head = f"{label}: " if label else ""
    return f"{head}{', '.join(parts)} [{m}m{s:02d}s]"


class Progress:
    """runs (PlannedRun-like: .dir, .meta, .run_id, .spec) and prior (`rung_prior`) add an ETA and
    one line per running run; slots is how many runs execute at once."""

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, tty: bool | None = None,
                 runs: Sequence[Any] = (), prior: tuple[float, ...] | None = None, slots: int | None = None,
                 min_interval_s: float = 30.0, scale_for_load: bool = True):
        self.runs, self.slots = list(runs), slots
        # the ETA's cost model: the plan's assumption as prior, this host's measured runs as data
        self.model = eta_model(prior, slots or 1,
                               device=self.runs[0].spec.train.device.split(":")[0]) if self.runs else None
        self.scale_for_load = scale_for_load
        self._probed: tuple[float, str] | None = None
        self.min_interval_s = min_interval_s  # logs: a step/loss-only change prints at most this often
        self._last_print = 0.0
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.t0 = time.time()
        self._last_counts: tuple | None = None
        self._width = 0
        self.lines: list[str] = []

    def snapshot(self) -> tuple[dict[str, int], list[dict]]:
        """Counts by state and, per run, its state, rung, step/total, loss, elapsed and wall time."""
        statuses = survey(r.dir for r in self.runs)
        counts = count(statuses)
        rows = []
        for r, status in zip(self.runs, statuses, strict=True):
            st = status.state
            row = {"run_id": r.run_id, "rung": r.meta.get("rung"), "state": st, "meta": r.meta,
                   "work": r.spec.train.token_multiplier, "flops": spec_flops(r.spec)}
            if st in ("running", "partial"):
                row.update(run_live(r.dir))
            elif st == "completed":
                summ = read_json(Path(r.dir) / "summary.json") or {}
                row.update(wall_s=summ.get("wall_s"), started_at=summ.get("started_at"))
                row["slowdown"] = cm.run_slowdown(summ)
            rows.append(row)
        mark_cold(rows, self.t0, self.slots or 1)
        return counts, rows

    def update(self, counts: dict[str, int]) -> None:
        extra: list[str] = []
        if self.runs:
            counts, rows = self.snapshot()
            k = self.slots or max(1, counts.get("running", 0))
            eta = study_eta(rows, self.model, k, *self.load_factor(rows, k))
            line = format_counts(counts, self.total, time.time() - self.t0, self.label)
            if eta is not None and counts.get("completed", 0) + counts.get("failed", 0) < self.total:
                line += " " + format_eta(eta)
            extra = [format_running(r["run_id"], r["meta"], r) for r in rows if r["state"] == "running"]
            if self.tty and extra:  # one line in place: the first running run's step and loss
                line += " |" + extra[0].split(":", 1)[1] + (f" (+{len(extra) - 1} running)" if len(extra) > 1 else "")
        else:
            line = format_counts(counts, self.total, time.time() - self.t0, self.label)
        key = (dict(counts), tuple(extra))
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self.stream.flush()
            self._width = len(line)
        elif key != self._last_counts and (self._last_counts is None or key[0] != self._last_counts[0]
                                           or time.time() - self._last_print >= self.min_interval_s):
            self._last_print = time.time()
            self.stream.write("\n".join([line, *extra]) + "\n")
            self.stream.flush()
        if key != self._last_counts:
            self.lines.append(line)
        self._last_counts = key

    def load_factor(self, rows: list[dict], k: int) -> tuple[float, str]:
        """The load's slowdown for the ETA: the mean of the last 3 runs this invocation finished (as they
        trained), else the probe's once at the start (costmodel.slowdown_now)."""
        if not self.scale_for_load:
            return 1.0, ""
        recent = sorted((r for r in rows if r["state"] == "completed" and r.get("slowdown") and
                         (r.get("started_at") or 0) >= self.t0), key=lambda r: r["started_at"])[-3:]
        if recent:
            f = sum(r["slowdown"] for r in recent) / len(recent)
            return f, f"x{f:.2f} for the load the last {len(recent)} runs trained under"
        if self._probed is None:
            self._probed = load_factor([r.spec for r in self.runs], k)
        return self._probed

    def close(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def time_estimate(planned: list, prior: tuple[float, float] | None, slots: int | None,
                  threads: int | None = None) -> dict | None:
    """Wall time of the runs not done yet: the cost model of `run` and `run --tune` (`progress.plan_estimate`)."""
    e = plan_estimate([r.spec for r in planned], prior, slots, threads, [r.dir for r in planned])
    if e is None:
        return None
    done = sum(1 for r in planned if ((read_json(r.dir / "summary.json") or {}).get("status") == "completed"))
    return {"seconds": e.seconds, "lo_90": e.lo, "hi_90": e.hi, "n_measured": e.n_measured, "load": e.load_note,
            "completed": done, "text": e.text()}
