"""A results table's shape before any fit (docs/method.md §4.4): its rungs (labelled, each one compute) and the
bounds it must meet, refused naming the field, the value and what is allowed, so that `analyze` (and `run`, before
anything is planned) stops in one line."""

from __future__ import annotations

import numpy as np
import pandas as pd

from marin_ablate.analysis.io.pinned_law import PinnedLaw

#: Extrapolation beyond this multiple of the top rung's compute is refused unless forced.
EXTRAPOLATION_LIMIT = 10.0


def check_extrapolation(target: float, top: float, force: bool) -> None:
    if not target > 0:
        raise ValueError(f"target_compute must be > 0 FLOPs, got {target}")
    if target > EXTRAPOLATION_LIMIT * top and not force:
        raise ValueError(f"target_compute {target:.3g} FLOPs is {target / top:.0f}x the top rung ({top:.3g} FLOPs); "
                         f"the limit is {EXTRAPOLATION_LIMIT:g}x: force it (--force-extrapolation) to go beyond")


#: The joint law fit's steps cost about rows × seeds² (one loss shift per seed): beyond this bound a table is
#: refused before any fit (docs/method.md §4.4; 8,192 rows of 32 seeds, 8.4e6, take 43 CPU s with the bootstrap).
JOINT_COST_MAX = 5e7


def check_seed_blocks(ok: pd.DataFrame) -> None:
    """Refuse, before any fit, a table whose joint fit would cost more than JOINT_COST_MAX (rows × seeds²)."""
    n, rows = (int(ok["seed"].nunique()) if "seed" in ok else 1), len(ok)
    if n > 1 and rows * n * n > JOINT_COST_MAX:
        most = int((JOINT_COST_MAX / rows) ** 0.5)
        raise ValueError(f"{rows:,} completed runs of {n:,} seeds: the joint law fit carries one loss shift per seed "
                         f"and costs about rows × seeds² = {rows * n * n:.2g} per step, beyond {JOINT_COST_MAX:.0e} "
                         f"(hours); allowed values: at most {most} seeds for {rows:,} runs (split the table by seed, "
                         "or average each arm, rung and seed group into one row first)")


def check_pinned_linf(ok: pd.DataFrame, linf: float | None, pinned_law: PinnedLaw | None) -> None:
    """A pinned L∞ at or above every kept run's loss puts the law L∞ + A·C^(−α) (A > 0) above all of them: nothing
    to fit, and every multiplier's interval ran to 1e308. Refused before any fit, naming the largest loss and its
    run (an L∞ above some runs only is a strained fit the law's residuals show)."""
    if linf is None or not len(ok):
        return
    loss = ok["eval_macro_loss"].to_numpy(float)
    i = int(np.argmax(loss))
    if linf >= loss[i]:
        what = (f"pin_linf={linf:g} (--pin-linf)" if pinned_law is None
                else f"the pinned law's L∞ = {linf:g} ({pinned_law.origin})")
        run = f", run {ok['run_id'].iloc[i]}" if "run_id" in ok else ""
        raise ValueError(f"{what} is not below any loss of the runs kept (the largest {loss[i]:.6g}{run}): the law "
                         f"L∞ + A·C^(−α) lies above every run; allowed values: 0 <= L∞ < {loss[i]:.6g}")


def check_rung_computes(rungs: pd.DataFrame) -> None:
    """Rungs are scales: two rung labels at one compute (within 1e-6) leave the law and the scale terms no
    span between them; refused naming them, before any fit."""
    key = np.round(np.log(rungs["compute"].to_numpy(float)), 6)
    same = {}
    for name, k in zip(rungs["rung"], key, strict=True):
        same.setdefault(k, []).append(str(name))
    groups = "; ".join(f"rungs {', '.join(v)} are all at {float(np.exp(k)):.4g} FLOPs"
                       for k, v in same.items() if len(v) > 1)
    if groups:
        raise ValueError(f"{groups}: a rung is a scale, and rungs at one compute give the law and the scale terms "
                         "no span; allowed values: one rung label per compute (relabel the runs, or give each rung "
                         "its own training FLOPs)")


def rung_labels(df: pd.DataFrame, C: np.ndarray) -> pd.Series:
    """Each run's rung: its `rung` label, else its cluster of ln C (gaps wider than ln 1.5 part them)."""
    if "rung" in df and df["rung"].notna().all():
        return df["rung"].astype(str)
    order = np.argsort(C)
    lab = np.zeros(len(C), int)
    lc = np.log(C[order])
    lab[order] = np.concatenate([[0], np.cumsum(np.diff(lc) > np.log(1.5))])
    return pd.Series([f"r{i}" for i in lab], index=df.index)


def rung_table(ok: pd.DataFrame, C: np.ndarray, c_ref: float) -> pd.DataFrame:
    """rung, compute (the geometric mean of its runs'), z = ln(compute / C_ref); in order of compute."""
    names = list(dict.fromkeys(ok["rung"]))
    lab = ok["rung"].to_numpy()
    rungs = pd.DataFrame({"rung": names, "compute": [float(np.exp(np.log(C[lab == r]).mean())) for r in names]})
    rungs["z"] = np.log(rungs["compute"] / c_ref)
    check_rung_computes(rungs)
    return rungs.sort_values("compute").reset_index(drop=True)
