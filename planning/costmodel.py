"""How long runs take on this machine: wall = overhead + seconds-per-FLOP x training FLOPs, a Bayesian linear
fit whose prior is the plan's assumption and whose data are finished runs (the study folder's and the user's
cache, `cache_dir`, of this host at the same number of runs at once: two runs on two cores each take longer than
one alone), stated with a 90% interval (docs/architecture.md §4). Noise is proportional to a run's size, so one
unusually short or long run moves the ETA only a little. The first run of each worker process pays one-time
costs (imports, the embedded corpus: 32 s against 5 s warm on `run smoke`), so the first `slots` runs of an
invocation are left out (`mark_cold`). Load: each finished run is fitted at its idle-equivalent time
(`run_slowdown`) and a prediction is scaled by the slowdown measured now (`slowdown_now`); where neither can be
measured the estimate says so."""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.flops import flops_per_token, params_active, params_total
from marin_ablate.marin.schema import read_json

Z90 = 1.645  # two-sided 90%: the interval stated beside every estimate
PRIOR_REL_SD = (1.0, 2.0)  # prior sd of (overhead, s/FLOP) relative to their assumed values: wide, a factor ~3
NOISE_REL_PRIOR = 0.25  # one run's wall time scatters ~25% around the fit until runs say otherwise
CACHE_FILE = "run_times.jsonl"
# the load while runs train scatters around the load probed before them: on the shared 2-core machine
# the 3 runs after a probe trained 1.2-1.7x slower than it said (its loaded share: half of it, 1 sd)
LOAD_REL_SD = 0.5
MAX_CACHE_LINES = 100_000  # the newest lines of the cache are read; older ones no longer describe the machine


def spec_flops(spec: RunSpec) -> float:
    """Training FLOPs of one run: per token x tokens of the schedule actually trained."""
    tr = spec.train.effective()
    return float(flops_per_token(spec.model, spec.recipe)) * tr.steps * tr.batch_size * spec.model.seq_len


def cache_dir(name: str) -> Path:
    """The user's cache folder `name` (run times, reference laws, layouts): under $MARIN_CACHE_DIR, else
    $XDG_CACHE_HOME/marin-ablate or ~/.cache/marin-ablate."""
    root = (os.environ.get("MARIN_CACHE_DIR")
            or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "marin-ablate")
    return Path(root) / name


@dataclass
class Estimate:
    """Seconds with a 90% interval, and what they rest on."""

    seconds: float
    lo: float
    hi: float
    n_measured: int
    load_note: str = ""  # how the load scaled it (`slowdown_now`), or why it could not

    def text(self, fmt=None) -> str:
        f = fmt or (lambda s: f"{s / 60:.1f} min")
        basis = f"fitted to {self.n_measured} measured runs" if self.n_measured else "assumed, no run measured yet"
        note = f"; {self.load_note}" if self.load_note else ""
        return f"{f(self.seconds)} (90%: {f(self.lo)}-{f(self.hi)}; {basis}{note})"


# ---- the machine's load --------------------------------------------------------------------------


def cores() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def runnable_now() -> float | None:
    """Threads running or waiting for a CPU right now, not counting this reader: /proc/loadavg's
    running count (instantaneous), else the 1-minute load average; None where neither can be read."""
    try:
        return max(0.0, float(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1.0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


_PROBE_BUF = b"\0" * (1 << 16)


def probe_share(window_s: float = 0.05) -> float | None:
    """The share of one CPU a thread of ours gets now: spin `window_s` (sha256, which releases the GIL)
    and compare this thread's CPU time with the wall clock. It sees what a count of runnable threads
    cannot: the scheduler's weights (nice levels, and autogroup's fair share per session). None where
    thread CPU time cannot be read."""
    try:
        w0, c0 = time.perf_counter(), time.thread_time()
        while time.perf_counter() - w0 < window_s:
            hashlib.sha256(_PROBE_BUF).digest()
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    except (AttributeError, OSError):
        return None
    return min(1.0, cpu / wall) if wall > 0 else None


def _autogroup() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def slowdown_now(demand: float, samples: int = 10, interval_s: float = 0.05) -> tuple[float | None, str]:
    """(how many times slower than idle `demand` CPU-bound threads of ours would run now, what it rests on).
    A thread alone gets the share s (`probe_share`, the mean of `samples`): with autogroup (a share per
    session, ours holding all our threads) D threads split our session's, D / s; without it each thread
    is one of W + D on C cores, with W = C / s - 1. Where s is a whole CPU, the other threads running
    (`runnable_now`, at most C - 1 of them) fill the cores. None (and why) where it cannot be measured."""
    got = []
    for i in range(samples):
        r = probe_share()
        if r is None:
            return None, "the machine's load cannot be measured here: not scaled for it"
        got.append(r)
        if i + 1 < samples:
            time.sleep(interval_s)
    share, n, d = sum(got) / len(got), cores(), max(1.0, demand)
    if share < 0.95:
        k = d / share if _autogroup() else (n / share - 1.0 + d) / n
    else:
        k = (min(n - 1.0, runnable_now() or 0.0) + d) / n
    k = max(1.0, k)
    return k, f"x{k:.2f} for the load now (a thread of ours gets {share:.0%} of a CPU; {d:g} threads on {n} cores)"


def run_slowdown(summary: dict) -> float | None:
    """How many times slower than idle a finished run trained: its threads x wall over the CPU time it got
    (summary.json's cpu_s, session_wall_s, threads; None for a run that did not record them)."""
    cpu, wall, threads = summary.get("cpu_s"), summary.get("session_wall_s"), summary.get("threads")
    if not (_positive(cpu) and _positive(wall) and _positive(threads)):
        return None
    return max(1.0, float(wall) * float(threads) / float(cpu))


@dataclass
class CostModel:
    """wall_s = a + b x flops; prior (a0, b0) from the plan's assumptions; obs [(flops, wall_s)]. The
    prior is wide (sd 100% of a, 200% of b): a plan that assumed 3x too fast a machine is corrected
    within the first few runs."""

    a0: float
    b0: float
    obs: list[tuple[float, ...]] = field(default_factory=list)  # (flops, wall_s[, slowdown while it ran])
    cached: list[dict] = field(default_factory=list)  # the cache rows `obs` is joined from (sweeps/progress.py)

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
        x = np.array([[1.0, self.b0 * o[0]] for o in self.obs])
        y = np.array([o[1] / (o[2] if len(o) > 2 else 1.0) for o in self.obs])  # idle-equivalent seconds
        for _ in range(3):  # noise from the residuals, shrunk towards the prior's when runs are few
            scale = np.maximum(x @ mean, 1e-3 + 0.1 * y)
            w = 1.0 / (rel * scale) ** 2
            prec = p0 + (x.T * w) @ x
            cov = np.linalg.inv(prec)
            mean = cov @ (p0 @ m0 + (x.T * w) @ y)
            r = (y - x @ mean) / np.maximum(x @ mean, 1e-3 + 0.1 * y)
            rel = max(0.03, math.sqrt((float(r @ r) + 2 * NOISE_REL_PRIOR**2) / (len(y) + 2)))
        return mean, cov, rel

    def predict(self, flops: Sequence[float], left: Sequence[float] | None = None, slots: int = 1,
                factor: float = 1.0, load_note: str = "") -> Estimate:
        """Wall seconds for runs of these FLOPs (each with the fraction `left` still to do), run
        `slots` at a time on a machine `factor` times slower than idle (`slowdown_now`); the interval adds
        the fit's uncertainty, each run's own scatter and the load's (LOAD_REL_SD of its loaded share)."""
        u = self.b0 * np.asarray(flops, dtype=float)
        lf = np.ones_like(u) if left is None else np.clip(np.asarray(left, dtype=float), 0.0, 1.0)
        mean, cov, rel = self.fit()
        per_run = np.maximum(mean[0] + mean[1] * u, 0.0) * lf
        g = np.array([lf.sum(), float(u @ lf)])
        var = float(g @ cov @ g) + float(((rel * per_run) ** 2).sum())
        total, sd = float(per_run.sum()), math.sqrt(max(var, 0.0))
        rel = math.hypot(sd / max(total, 1e-9), LOAD_REL_SD * (1.0 - 1.0 / max(factor, 1.0)))
        k, spread = max(1, slots), 1.0 + Z90 * rel  # a ratio interval: time is positive
        total *= max(factor, 1.0)
        return Estimate(total / k, total / spread / k, total * spread / k, len(self.obs), load_note)


def prior_from(flops: Sequence[float], assumed_s: Sequence[float], overhead_s: float) -> tuple[float, float]:
    """(a0, b0) matching the plan's assumed seconds per run: the overhead and the median s/FLOP beyond it."""
    rates = [(s - overhead_s) / f for f, s in zip(flops, assumed_s, strict=True) if f > 0 and s > overhead_s]
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
    """{run_id, flops, wall_s, device, started_at[, slowdown]} of the completed runs among `run_dirs`."""
    out = []
    for d in run_dirs:
        s = read_json(Path(d) / "summary.json") or {}
        if s.get("status") == "completed" and _positive(s.get("wall_s")) and _positive(s.get("train_flops")):
            device = ((read_json(Path(d) / "spec.json") or {}).get("train") or {}).get("device", "cpu")
            row = {"run_id": s.get("run_id") or Path(d).name, "flops": float(s["train_flops"]),
                   "wall_s": float(s["wall_s"]), "device": str(device).split(":")[0],
                   "started_at": float(s.get("started_at") or 0.0)}
            k = run_slowdown(s) if row["device"] == "cpu" else None
            if k is not None:
                row["slowdown"] = round(k, 4)
            out.append(row)
    return out


def record(rows: Sequence[dict], slots: int, path: Path | None = None) -> int:
    """Append finished runs to the user's cache (once per run id, host and slots); returns how many."""
    path = path or cache_dir(CACHE_FILE)
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


_WARNED: set[tuple[str, int]] = set()


def _cache_problem(path: Path, line: int, what: str, problems: list[str] | None) -> None:
    msg = f"{path} line {line}: {what}: skipped"
    if problems is not None:
        problems.append(msg)
    if (str(path), line) not in _WARNED:  # once per process: plan and the ETA both read the cache
        _WARNED.add((str(path), line))
        print(f"warning: {msg}", file=sys.stderr)


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def read_cache(path: Path | None = None, problems: list[str] | None = None) -> list[dict]:
    """The cache's usable rows. A line that is not JSON, or whose flops / wall_s is not a positive finite
    number (or slowdown / slots of the wrong kind), is skipped and named (file, line, field), never raised."""
    path = path or cache_dir(CACHE_FILE)
    out: list[dict] = []
    try:
        raw = path.read_bytes().splitlines()
    except OSError:
        return out
    first = max(0, len(raw) - MAX_CACHE_LINES)
    for i, b in enumerate(raw[first:], start=first + 1):
        if not b.strip():
            continue
        try:
            r = json.loads(b.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            _cache_problem(path, i, "not a JSON line", problems)
            continue
        if not isinstance(r, dict):
            _cache_problem(path, i, "not a JSON object", problems)
            continue
        if r.get("cold"):
            continue
        bad = next((k for k in ("flops", "wall_s") if not _positive(r.get(k))), None)
        if bad is None and r.get("slowdown") is not None and not (_positive(r["slowdown"]) and r["slowdown"] >= 1):
            bad = "slowdown"
        if bad is None and r.get("slots") is not None and not (isinstance(r["slots"], int) and r["slots"] > 0):
            bad = "slots"
        if bad is not None:
            _cache_problem(path, i, f"field {bad!r} is {r.get(bad)!r}, not a positive finite number", problems)
            continue
        out.append(r)
    return out


def observations(cached: Sequence[dict], folder: Sequence[dict]) -> list[tuple[float, float, float]]:
    """(flops, wall_s, slowdown) of every measured run, each run id once: the cache's row where there is
    one, else the study folder's (a run finished since the cache was written)."""
    seen: dict[str, dict] = {}
    for r in list(cached) + list(folder):
        rid = r.get("run_id")
        if r.get("cold") or not _positive(r.get("flops")) or not _positive(r.get("wall_s")):
            continue
        key = rid if rid is not None else f"_{len(seen)}"
        seen.setdefault(key, r)
    return [(float(r["flops"]), float(r["wall_s"]), max(1.0, float(r.get("slowdown") or 1.0))) for r in seen.values()]


def rungs_as_overridden(d: dict, runs: list, study: object) -> None:
    """The rung table and FLOP cost of the specs the --SECTION.F=V overrides give (the runs `run` trains)."""
    total = 0.0
    for row in d["rungs"]:
        specs = [s for s, m in runs if m["rung"] == row["name"]]
        if not specs:
            continue
        s = specs[0]
        tr = s.train.effective()
        row.update(d_model=s.model.d_model, n_layers=s.model.n_layers, n_heads=s.model.n_heads,
                   seq_len=s.model.seq_len, vocab_size=s.model.vocab_size, steps=tr.steps, batch_size=tr.batch_size,
                   tokens=tr.steps * tr.batch_size * s.model.seq_len,
                   params_active=params_active(s.model, study.base_recipe),
                   params_total=params_total(s.model, study.base_recipe),
                   flops_per_token=flops_per_token(s.model, study.base_recipe),
                   train_flops=sum(spec_flops(x) for x in specs))
        total += row["train_flops"]
    d["cost"]["train_flops"] = total
