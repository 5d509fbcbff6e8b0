"""A study simulator with known truth: per-component multipliers, interactions, scale trends, seed noise.

Truth (±1 coding, z = ln(C/c_ref)): ln M(x, z) = b0 + b_z z + Σβ_i x_i + Σβ_ij x_i x_j + Σγ_i x_i z, with
b0 and b_z chosen so that the all-baseline arm has ln M ≡ 0 (it *is* the reference law). A run's loss
is L = L∞ + A·(M·C)^(−α) + seed shift + noise, C its own FLOPs (sconv-like factors add FLOPs/token).
Effects that are not linear in z (`SimTruth.steps`, a `ScaleStep` per factor) add s_i(z)·(x_i + 1)/2: a
smooth step of the component's Shapley value from one level at small compute to another at large
compute, saturating when both share a sign, sign-changing when they do not (docs/method.md §4.10).
Used by the tests (coverage, Shapley algebra) and by benchmarks/analysis.py; handy for planning.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from marin_ablate.analysis.io.results import SUMMARY_COLUMNS
from marin_ablate.marin.schema import FactorCoding, RunMeta


@dataclass(frozen=True)
class ScaleStep:
    """A component's ln M that moves from `small` (far below `mid_compute`) to `large` (far above) along a
    logistic in ln C of `width` e-folds: s(z) = large + (small − large)·σ(−(ln C − ln mid)/width)."""

    small: float
    large: float
    mid_compute: float
    width: float = 1.0

    def __post_init__(self):
        if not (self.mid_compute > 0 and self.width > 0):
            raise ValueError(f"ScaleStep: mid_compute {self.mid_compute} and width {self.width}; allowed values: "
                             "both > 0")

    def value(self, C) -> np.ndarray:
        u = (np.log(np.asarray(C, float)) - np.log(self.mid_compute)) / self.width
        return self.large + (self.small - self.large) / (1 + np.exp(u))


@dataclass
class SimTruth:
    factors: list[str]
    main: dict[str, float]
    inter: dict[tuple[str, str], float] = field(default_factory=dict)
    scale: dict[str, float] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)  # ln R = Σ ρ_i (x_i + 1)
    flops_extra: dict[str, float] = field(default_factory=dict)  # FLOPs/token fraction added when on
    linf: float = 2.0
    A: float = 400.0
    alpha: float = 0.2
    c_ref: float = 1e17
    seed_sd: float = 0.005
    noise_sd: float = 0.005
    flops_per_token: float = 6e8
    noise_hetero: float = 0.0  # noise sd × exp(noise_hetero · mean x): arms differ in noise
    break_c: float | None = None  # broken law: L = L∞ + A·C^−α·(1 + C/break_c)^−break_delta
    break_delta: float = 0.0
    throughput_allon: float = 0.0  # extra ln R of the all-on arm alone (beyond two-factor terms)
    levels: dict[str, tuple[str, str]] = field(default_factory=dict)  # factor -> (low, high); default off/on
    planted: dict[str, dict[str, float]] = field(default_factory=dict)  # factor -> truth recorded in the coding
    # Common random numbers: the arms of one seed share a random stream (its noise cancels between
    # them) unless a stream factor changes it; each (seed, stream-factor levels, rung) then draws its
    # own loss shift with sd stream_sd, seen by every arm in it (docs/calibration/).
    stream_factors: tuple[str, ...] = ()
    stream_sd: float = 0.0
    # GPU-style ladders: each rung draws its own init and data order, so every arm of one (seed, rung)
    # shares a loss shift with sd rung_sd, which moves the rung's whole cloud of points off the law.
    rung_sd: float = 0.0
    # Effects whose ln M is not linear in ln C (saturating, sign-changing): factor -> its step, added to
    # its main and scale terms; the all-off arm keeps ln M ≡ 0.
    steps: dict[str, ScaleStep] = field(default_factory=dict)
    # Component x seed variation: at each seed a component's Shapley value (2β_i) moves by N(0, sd_i²), as a
    # per-seed LR profile and the seed's own init and data order move it; the truth is the mean over seeds.
    seed_effect_sd: dict[str, float] = field(default_factory=dict)

    def law_loss(self, C_eff) -> np.ndarray:
        C_eff = np.asarray(C_eff, float)
        out = self.A * C_eff ** (-self.alpha)
        if self.break_c is not None:
            out = out * (1 + C_eff / self.break_c) ** (-self.break_delta)
        return self.linf + out

    def __post_init__(self):
        if len(set(self.factors)) != len(self.factors) or not all(isinstance(f, str) and f for f in self.factors):
            raise ValueError(f"factors: {self.factors!r}; allowed values: distinct non-empty names")
        unknown = [f for f in [*self.levels, *self.planted, *self.stream_factors, *self.steps, *self.seed_effect_sd]
                   if f not in self.factors]
        if unknown:
            raise ValueError(f"levels/planted/stream_factors/steps/seed_effect_sd: {unknown} name no factor; "
                             f"allowed values: {', '.join(self.factors)}")

    def level_names(self, f: str) -> tuple[str, str]:
        """(low, high) level names of factor `f`, the run metadata the analysis codes from."""
        return self.levels.get(f, ("off", "on"))

    def coding_json(self) -> str:
        return json.dumps({f: {"field": f"sim.{f}", "low": self.level_names(f)[0], "high": self.level_names(f)[1],
                               **({"truth": self.planted[f]} if f in self.planted else {})} for f in self.factors})

    def _b(self, f: str) -> float:
        return self.main.get(f, 0.0)

    def _bij(self, a: str, b: str) -> float:
        return self.inter.get((a, b), self.inter.get((b, a), 0.0))

    def log_m(self, X_nk: np.ndarray, z_n: np.ndarray) -> np.ndarray:
        k = len(self.factors)
        out = np.zeros(len(X_nk))
        b0 = (sum(self._b(f) for f in self.factors)
              - sum(self._bij(a, b) for a, b in itertools.combinations(self.factors, 2)))
        bz = sum(self.scale.get(f, 0.0) for f in self.factors)
        out += b0 + bz * z_n
        for i in range(k):
            f = self.factors[i]
            out += self._b(f) * X_nk[:, i] + self.scale.get(f, 0.0) * X_nk[:, i] * z_n
            for j in range(i + 1, k):
                out += self._bij(f, self.factors[j]) * X_nk[:, i] * X_nk[:, j]
            if f in self.steps:
                out += 0.5 * self.steps[f].value(self.c_ref * np.exp(z_n)) * (X_nk[:, i] + 1)
        return out

    def z(self, C) -> np.ndarray:
        return np.log(np.asarray(C, float) / self.c_ref)

    def shapley(self, C: float) -> dict[str, float]:
        """True Shapley value (ln scale) of each component at compute C: 2β_i + 2γ_i z."""
        z = float(self.z(C))
        return {f: 2 * self._b(f) + 2 * self.scale.get(f, 0.0) * z
                + (float(self.steps[f].value(C)) if f in self.steps else 0.0) for f in self.factors}

    def loo(self, C: float) -> dict[str, float]:
        s = self.shapley(C)
        return {f: s[f] + 2 * sum(self._bij(f, g) for g in self.factors if g != f) for f in self.factors}

    def aoi(self, C: float) -> dict[str, float]:
        s = self.shapley(C)
        return {f: s[f] - 2 * sum(self._bij(f, g) for g in self.factors if g != f) for f in self.factors}

    def throughput_total(self) -> float:
        return sum(2 * self.throughput.get(f, 0.0) for f in self.factors) + self.throughput_allon

    def throughput_effect(self) -> dict[str, float]:
        """True Shapley value of each factor's ln R: 2·main, plus an equal share of the all-on-only
        effect (an effect present only when all k factors are on is split k ways by symmetry)."""
        return {f: 2 * self.throughput.get(f, 0.0) + self.throughput_allon / len(self.factors) for f in self.factors}


def random_truth(factors: list[str], rng: np.random.Generator, *, main_sd: float = 0.08, inter_sd: float = 0.03,
                 scale_sd: float = 0.02, **kw) -> SimTruth:
    """A truth with random effects of realistic size (multipliers within ~±30%)."""
    return SimTruth(
        factors=list(factors),
        main={f: float(rng.normal(0, main_sd)) for f in factors},
        inter={p: float(rng.normal(0, inter_sd)) for p in itertools.combinations(factors, 2)},
        scale={f: float(rng.normal(0, scale_sd)) for f in factors},
        throughput={f: float(rng.normal(0, 0.03)) for f in factors},
        flops_extra={f: (0.01 if f == "sconv" else 0.0) for f in factors}, **kw)


def design_rows(k: int, fraction: int = 0) -> np.ndarray:
    """Full 2^k factorial, or a regular 2^(k−p) fraction (p ≤ 2) whose last factors are products."""
    if fraction not in (0, 1, 2):
        raise ValueError(f"fraction {fraction}; allowed values: 0, 1, 2")
    base = k - fraction
    X = np.array(list(itertools.product((-1.0, 1.0), repeat=base)))[:, ::-1]
    if fraction >= 1:
        X = np.column_stack([X, np.prod(X, axis=1)])  # generator: last = product of all base factors
    if fraction == 2:
        X = np.column_stack([X, np.prod(X[:, : base - 1], axis=1)])
    return X


def study_design(name: str, factors: list[str] | None = None) -> np.ndarray:
    """The ±1 design matrix of a registered study (ablations/studies.py, torch-free), columns in the
    order of `factors` (default: the study's own order)."""
    from marin_ablate.ablations.studies import get_study

    st = get_study(name)
    names = [f.name for f in st.factors]
    factors = names if factors is None else list(factors)
    bad = [f for f in factors if f not in names]
    if bad or len(factors) != len(names):
        raise ValueError(f"factors {factors}: study {name!r} has factors {', '.join(names)} (all of them, any order)")
    M = np.asarray(st.design.matrix, float)
    return M[:, [names.index(f) for f in factors]]


def simulate_table(truth: SimTruth, *, rungs: dict[str, float], seeds: int = 2, fraction: int = 0,
                   rng: np.random.Generator | None = None, study: str = "sim", hardware: str = "H100",
                   fail: int = 0, missing: int = 0, loss_curves: bool = False, fail_baseline: int = 0,
                   design: np.ndarray | None = None) -> pd.DataFrame:
    """A results table (run-table schema) of a simulated study; `rungs`: rung name -> tokens.
    `design`: a ±1 matrix (rows = arms, columns = truth.factors), e.g. `study_design("smoke", factors)`;
    default the simulator's own 2^(k−fraction)."""
    rng = rng or np.random.default_rng(0)
    k = len(truth.factors)
    if design is None:
        D = design_rows(k, fraction)
    else:
        D = np.asarray(design, float)
        if D.ndim != 2 or D.shape[1] != k or not np.all(np.abs(D) == 1):
            raise ValueError(f"design must be a ±1 matrix with {k} columns (one per truth factor), got shape {D.shape}")
    seed_shift = {s: rng.normal(0, truth.seed_sd) for s in range(seeds)}
    # each seed's own main effects (drawn only when planted, so other studies keep their random sequence)
    at_seed = {s: truth if not truth.seed_effect_sd else
               replace(truth, main={f: truth._b(f) + rng.normal(0, truth.seed_effect_sd.get(f, 0.0)) / 2
                                    for f in truth.factors}) for s in range(seeds)}
    stream_shift: dict[tuple, float] = {}
    rows = []
    for rung, tokens in rungs.items():
        for s in range(seeds):
            for r, x in enumerate(D):
                lv = {f: truth.level_names(f)[int(x[i] > 0)] for i, f in enumerate(truth.factors)}
                fpt = truth.flops_per_token * np.prod([1 + truth.flops_extra.get(f, 0.0) * (x[i] > 0)
                                                       for i, f in enumerate(truth.factors)])
                C = fpt * tokens
                lnm = float(at_seed[s].log_m(x[None], truth.z(C)[None])[0])
                sd = truth.noise_sd * np.exp(truth.noise_hetero * float(np.mean(x)))
                L = float(truth.law_loss(np.exp(lnm) * C)) + seed_shift[s] + rng.normal(0, sd)
                stream = f"seed {s}" + "".join(f" {f}={lv[f]}" for f in truth.stream_factors)
                if truth.stream_sd > 0:  # drawn only when asked, so other studies keep their random sequence
                    L += stream_shift.setdefault((stream, rung), rng.normal(0, truth.stream_sd))
                if truth.rung_sd > 0:
                    L += stream_shift.setdefault(("rung", s, rung), rng.normal(0, truth.rung_sd))
                lnr = sum(truth.throughput.get(f, 0.0) * (x[i] + 1) for i, f in enumerate(truth.factors))
                lnr += truth.throughput_allon * bool(np.all(x > 0))
                mfs = 4e14 * np.exp(lnr) * np.exp(rng.normal(0, 0.01))
                arm = "".join("+" if v > 0 else "-" for v in x)
                rid = hashlib.sha256(f"{study}|{rung}|{s}|{arm}".encode()).hexdigest()[:16]
                row = {"run_id": rid, "study": study, "rung": rung, "arm": arm, "seed": s, "design_row": r,
                       **lv, "coding": truth.coding_json(), "random_stream": stream,
                       "params_total": 1e8, "params_active": 2e7, "flops_per_token": fpt, "tokens": tokens,
                       "train_flops": C, "eval_macro_loss": L, "loss_web": L + 0.05, "loss_code": L - 0.05,
                       "macro_bpb": L / np.log(2) / 4, "final_train_loss": L - 0.02, "tokens_per_s": mfs / fpt,
                       "model_flops_per_s": mfs, "mfu": mfs / 9.9e14,
                       "drop_rate": max(0.0, (0.004
                                              if dict(zip(truth.factors, x, strict=True)).get("ep_transport", -1) > 0
                                              else 0.03)
                                        + rng.normal(0, 0.002)),
                       "max_grad_norm": 1.0, "spikes": 0, "status": "completed", "error": None,
                       "wall_s": C / mfs, "hardware": hardware, "code_version": "sim", "started_at": 1.7e9}
                if loss_curves:
                    steps = np.linspace(10, 1000, 20)
                    row["loss_curve"] = json.dumps([[int(t), float(L + 3.0 * (t / 1000) ** -0.5 - 3.0)] for t in steps])
                rows.append(row)
    df = pd.DataFrame(rows)
    if fail or missing or fail_baseline:
        nonbase = df.index[df["arm"] != "-" * k].to_numpy()
        pick = list(rng.choice(nonbase, size=fail + missing, replace=False))
        base = df.index[df["arm"] == "-" * k].to_numpy()
        pick[fail:fail] = list(rng.choice(base, size=min(fail_baseline, len(base)), replace=False))
        fail += min(fail_baseline, len(base))
        for j, i in enumerate(pick):
            if j < fail:
                df.loc[i, ["status", "error"]] = ["failed", "simulated failure: loss NaN at step 17"]
            else:
                df.loc[i, "status"] = "missing"
            df.loc[i, ["eval_macro_loss", "model_flops_per_s"]] = np.nan
    return df


def write_study(df: pd.DataFrame, study_dir: str | Path) -> Path:
    """Lay a simulated table out as run directories (meta.json, spec.json, summary.json)."""
    study_dir = Path(study_dir)
    for row in df.to_dict("records"):
        d = study_dir / "runs" / row["run_id"]
        d.mkdir(parents=True, exist_ok=True)
        coding = json.loads(row["coding"])
        factors = tuple(FactorCoding(f, row[f], c["field"], c["low"], c["high"]) for f, c in coding.items())
        meta = RunMeta(row["study"], row["rung"], row["arm"], int(row["seed"]), int(row["design_row"]), factors)
        (d / "meta.json").write_text(json.dumps(meta.to_dict()))
        (d / "spec.json").write_text(json.dumps({"seed": int(row["seed"])}))
        if row["status"] == "missing":
            continue
        summ = {k: row.get(k) for k in ("run_id", "status", *SUMMARY_COLUMNS, "started_at")}
        summ = {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in summ.items()}
        summ["failed_step"] = 17 if row["status"] == "failed" else None
        summ["eval_domain_loss"] = {d_: row[f"loss_{d_}"] for d_ in ("web", "code")
                                    if isinstance(row.get(f"loss_{d_}"), float) and np.isfinite(row[f"loss_{d_}"])}
        lc = row.get("loss_curve")
        summ["loss_curve"] = json.loads(lc) if isinstance(lc, str) else []
        (d / "summary.json").write_text(json.dumps(summ))
    return study_dir
