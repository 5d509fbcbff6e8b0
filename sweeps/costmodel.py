"""How long runs take on this machine: wall = overhead + seconds-per-FLOP x training FLOPs, fitted to
measured runs and stated with a 90% interval (docs/architecture.md §4).

The prior is the plan's assumption (each rung's assumed throughput and overhead, or a GPU rung's
hardware rate); the data are finished runs: those of the study folder and those recorded in the
user's cache (`$MARIN_CACHE_DIR` or `~/.cache/marin-ablate/run_times.jsonl`, one line per completed
run, appended by `run`), restricted to this host and the same number of runs at once, since two
runs on two cores each take longer than one alone. A Bayesian linear fit with noise proportional
to the run's size: with no data it is the assumption with a wide interval; each finished run moves
it a little, so an ETA does not jump with the first, unusually short or long, run. The first run
each worker process trains pays one-time costs (imports, the embedded corpus: 32 s against 5 s for
the same run warm, measured on `run smoke`), so the first `slots` runs of an invocation are left
out of the fit (`mark_cold`).
"""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from marin.config import RunSpec
from marin.flops import flops_per_token
from marin.schema import read_json

Z90 = 1.645  # two-sided 90%: the interval stated beside every estimate
PRIOR_REL_SD = (1.0, 2.0)  # prior sd of (overhead, s/FLOP) relative to their assumed values: wide, a factor ~3
NOISE_REL_PRIOR = 0.25  # one run's wall time scatters ~25% around the fit until runs say otherwise
CACHE_FILE = "run_times.jsonl"


def spec_flops(spec: RunSpec) -> float:
    """Training FLOPs of one run: per token x tokens of the schedule actually trained."""
    tr = spec.train.effective()
    return float(flops_per_token(spec.model, spec.recipe)) * tr.steps * tr.batch_size * spec.model.seq_len


def cache_path() -> Path:
    root = os.environ.get("MARIN_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "marin-ablate"
    return Path(root) / CACHE_FILE


@dataclass
class Estimate:
    """Seconds with a 90% interval, and what they rest on."""

    seconds: float
    lo: float
    hi: float
    n_measured: int

    def text(self, fmt=None) -> str:
        f = fmt or (lambda s: f"{s / 60:.1f} min")
        basis = f"fitted to {self.n_measured} measured runs" if self.n_measured else "assumed, no run measured yet"
        return f"{f(self.seconds)} (90%: {f(self.lo)}-{f(self.hi)}; {basis})"


@dataclass
class CostModel:
    """wall_s = a + b x flops; prior (a0, b0) from the plan's assumptions; obs [(flops, wall_s)]. The
    prior is wide (sd 100% of a, 200% of b): a plan that assumed 3x too fast a machine is corrected
    within the first few runs."""

    a0: float
    b0: float
    obs: list[tuple[float, float]] = field(default_factory=list)

    def fit(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Posterior mean and covariance of (a, c) with b = c x b0 (c = 1 is the prior's rate: a
        well-conditioned scale), and the relative noise of one run."""
        m0 = np.array([self.a0, 1.0])
        sd0 = np.array([max(self.a0, 1.0) * PRIOR_REL_SD[0], PRIOR_REL_SD[1]])
        p0 = np.diag(1.0 / sd0**2)
        rel = NOISE_REL_PRIOR
        mean, cov = m0, np.diag(sd0**2)
        if not self.obs:
            return mean, cov, rel
        x = np.array([[1.0, self.b0 * f] for f, _ in self.obs])
        y = np.array([w for _, w in self.obs])
        for _ in range(3):  # noise from the residuals, shrunk towards the prior's when runs are few
            scale = np.maximum(x @ mean, 1e-3 + 0.1 * y)
            w = 1.0 / (rel * scale) ** 2
            prec = p0 + (x.T * w) @ x
            cov = np.linalg.inv(prec)
            mean = cov @ (p0 @ m0 + (x.T * w) @ y)
            r = (y - x @ mean) / np.maximum(x @ mean, 1e-3 + 0.1 * y)
            rel = max(0.03, math.sqrt((float(r @ r) + 2 * NOISE_REL_PRIOR**2) / (len(y) + 2)))
        return mean, cov, rel

    def predict(self, flops: Sequence[float], left: Sequence[float] | None = None, slots: int = 1) -> Estimate:
        """Wall seconds for runs of these FLOPs (each with the fraction `left` still to do), run
        `slots` at a time; the interval adds the fit's uncertainty and each run's own scatter."""
        u = self.b0 * np.asarray(flops, dtype=float)
        lf = np.ones_like(u) if left is None else np.clip(np.asarray(left, dtype=float), 0.0, 1.0)
        mean, cov, rel = self.fit()
        per_run = np.maximum(mean[0] + mean[1] * u, 0.0) * lf
        g = np.array([lf.sum(), float(u @ lf)])
        var = float(g @ cov @ g) + float(((rel * per_run) ** 2).sum())
        total, sd = float(per_run.sum()), math.sqrt(max(var, 0.0))
        k, spread = max(1, slots), 1.0 + Z90 * sd / max(total, 1e-9)  # a ratio interval: time is positive
        return Estimate(total / k, total / spread / k, total * spread / k, len(self.obs))


def prior_from(flops: Sequence[float], assumed_s: Sequence[float], overhead_s: float) -> tuple[float, float]:
    """(a0, b0) matching the plan's assumed seconds per run: the overhead and the median s/FLOP beyond it."""
    rates = [(s - overhead_s) / f for f, s in zip(flops, assumed_s) if f > 0 and s > overhead_s]
    if not rates:
        raise ValueError("no run has an assumed time: the cost model needs a rung throughput or hardware")
    return overhead_s, float(np.median(rates))


def mark_cold(rows: list[dict], since: float, slots: int) -> list[dict]:
    """Flag `cold` the `slots` earliest-started runs started at or after `since` (a new process each)."""
    fresh = sorted((r for r in rows if r.get("started_at") and r["started_at"] >= since), key=lambda r: r["started_at"])
    for r in fresh[:max(1, slots)]:
        r["cold"] = True
    return rows


def finished(run_dirs: Iterable[str | Path]) -> list[dict]:
    """{run_id, flops, wall_s, device} of the completed runs among `run_dirs`."""
    out = []
    for d in run_dirs:
        s = read_json(Path(d) / "summary.json") or {}
        if s.get("status") == "completed" and s.get("wall_s") and s.get("train_flops"):
            device = ((read_json(Path(d) / "spec.json") or {}).get("train") or {}).get("device", "cpu")
            out.append({"run_id": s.get("run_id") or Path(d).name, "flops": float(s["train_flops"]),
                        "wall_s": float(s["wall_s"]), "device": str(device).split(":")[0],
                        "started_at": float(s.get("started_at") or 0.0)})
    return out


def record(rows: Sequence[dict], slots: int, path: Path | None = None) -> int:
    """Append finished runs to the user's cache (once per run id, host and slots); returns how many."""
    path = path or cache_path()
    host = socket.gethostname()
    seen = {(r.get("run_id"), r.get("host"), r.get("slots")) for r in read_cache(path)}
    new = [dict(r, host=host, slots=slots) for r in rows if (r["run_id"], host, slots) not in seen]
    if not new:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:  # one short line per run: an append is atomic enough for a cache
            f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in new))
    except OSError:  # a read-only home: the estimate then rests on the study folder alone
        return 0
    return len(new)


def read_cache(path: Path | None = None) -> list[dict]:
    out = []
    try:
        lines = (path or cache_path()).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and r.get("flops") and r.get("wall_s") and not r.get("cold"):
            out.append(r)
    return out
