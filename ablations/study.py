"""A study: a design over factors, run at the rungs of a ladder with seed replicates (docs/method.md §4–5):
`Study.runs()` is what sweeps executes, `Study.describe()` what `marin-ablate plan --json` prints. The registered
studies are ablations/studies.py's. No torch import."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from marin_ablate.ablations.designs import Design, arm_name
from marin_ablate.ablations.factors import Factor, apply_levels, check_levels, resolve_factors
from marin_ablate.ablations.gb200 import Hardware, HeroPlan
from marin_ablate.ablations.ladders import (
    PublishedLaw,
    Rung,
    flops_per_token,
    ladder,
)
from marin_ablate.marin.config import FACTORS, DataConfig, Recipe, RunSpec, to_dict
from marin_ablate.marin.schema import FactorCoding, RunMeta

#: The CPU studies' executor: two local runs at once on a 2-core machine, one thread each.
CPU_EXECUTOR = {"executor": "local", "max_parallel": 2, "cpus_per_task": 1, "threads": 1, "mem_gb": 3,
                 "timeout_min": 10}


def gpu_executor(**extra: Any) -> dict:
    """The GPU studies' executor: a SLURM array, 16 CPUs and 120 GB per GPU (`extra` overrides)."""
    # per-rung time limits are in describe()["rungs"][i]["timeout_min"]
    ex = {"executor": "slurm", "max_parallel": 32, "cpus_per_gpu": 16, "mem_gb_per_gpu": 120,
          "slurm_array_parallelism": 32}
    ex.update(extra)
    return ex


def _level_values(f: Factor) -> dict | None:
    """{level name: config value} as meta.json records it (None where a value is not JSON): the analysis
    checks each run's level against the value its spec.json holds."""
    try:
        return json.loads(json.dumps(dict(f.levels)))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Study:
    """A design over factors x rungs x seeds.
    Levels of recipe switches that are not factors come from `base_recipe`. Every arm at a given
    (rung, seed) shares the data config, data seed, steps and batch (paired comparisons, docs/architecture.md §3);
    with `vary_data_seed` the data order changes with the seed replicate (data_seed + seed), so the
    seed panel measures init and data-order noise together."""

    name: str
    description: str
    factors: tuple[Factor, ...]
    design: Design
    rungs: tuple[Rung, ...]
    seeds: tuple[int, ...] = (0,)
    data: DataConfig = field(default_factory=DataConfig)
    base_recipe: Recipe = field(default_factory=Recipe)
    executor: Any = ()  # Mapping of executor defaults for sweeps (stored as sorted pairs)
    hardware: Hardware | None = None  # None: CPU study (costed by wall-time assumptions)
    vary_data_seed: bool = True
    companions: tuple[str, ...] = ()
    hero: HeroPlan | None = None
    # Rungs of the baseline arm's own ladder, over a wider compute span than the design's, that pin the
    # reference law's L∞ and α (docs/method.md §4.1, *Pinned reference law*); () fits it on the design.
    reference_rungs: tuple[str, ...] = ()
    reference_seeds: tuple[int, ...] = (0,)  # the ladder's seeds (each its own init and data order)
    published_law: PublishedLaw | None = None  # a stated law whose L∞ and α the analysis pins instead

    def __post_init__(self) -> None:
        object.__setattr__(self, "factors", resolve_factors(self.factors))
        object.__setattr__(self, "reference_rungs", tuple(self.reference_rungs))
        object.__setattr__(self, "reference_seeds", tuple(self.reference_seeds))
        if self.reference_rungs:
            ladder(self.reference_rungs)  # an unknown rung name is refused here, with the known ones
        object.__setattr__(self, "rungs", ladder(self.rungs))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "companions", tuple(self.companions))
        ex = self.executor
        object.__setattr__(self, "executor", tuple(sorted(dict(ex).items())) if isinstance(ex, Mapping) else tuple(ex))
        names = tuple(f.name for f in self.factors)
        if self.design.factors != names:
            raise ValueError(f"Study {self.name!r}: design factors {self.design.factors} differ from the "
                             f"study's {names}")
        if (not self.seeds or len(set(self.seeds)) != len(self.seeds)
                or not all(isinstance(s, int) and s >= 0 for s in self.seeds)):
            raise ValueError(f"Study {self.name!r}: seeds={self.seeds} must be distinct non-negative integers")

    def restrict(self, rungs: Sequence[str] | None = None, seeds: Sequence[int] | None = None) -> "Study":
        """This study on some of its rungs and seeds (in the order given); one it lacks is refused."""
        changes: dict[str, Any] = {}
        if rungs is not None:
            changes["rungs"] = tuple(self._rung(r) for r in rungs)
        if seeds is not None:
            bad = [s for s in seeds if s not in self.seeds]
            if bad:
                raise ValueError(f"Study {self.name!r} has no seed {', '.join(map(str, bad))}; allowed values: "
                                 f"{', '.join(map(str, self.seeds))}")
            changes["seeds"] = tuple(seeds)
        return replace(self, **changes) if changes else self

    @property
    def arm_names(self) -> list[str]:
        return [arm_name(self.design, i) for i in range(self.design.n_runs)]

    @property
    def lr_coupled(self) -> tuple[Factor, ...]:
        """The factors whose levels want their own LR (`Factor.lr_coupled`): profiled before the design."""
        return tuple(f for f in self.factors if f.lr_coupled)

    def baseline_levels(self, **changes: str) -> dict[str, str]:
        """Every factor at its low (baseline) level, except the ones named in `changes`."""
        out = {f.name: f.low for f in self.factors}
        out.update(check_levels(self.factors, changes))
        return out

    def arm_multipliers(self, per_level: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """{arm: LR multiplier} from profiled {factor: {level: multiplier}}: an arm's multiplier is the
        product over the LR-coupled factors of its level's (docs/method.md §4.6); unprofiled levels: 1."""
        return {arm: math.prod(float(per_level.get(f, {}).get(lv, 1.0)) for f, lv in self.levels(row).items())
                for row, arm in enumerate(self.arm_names)}

    def arm_key(self) -> str:
        """What an arm code such as `+-+` says: one sign per factor, in the design's order."""
        levels = ", ".join(f"{f.name} (+ {f.level(1)}, - {f.level(-1)})" for f in self.factors)
        return f"arm codes: one sign per factor in this order: {levels}; all_on / all_off: every factor + / -"

    def levels(self, row: int) -> dict[str, str]:
        """{factor: level name} of design row `row` (+1 = high = recipe level)."""
        if not 0 <= row < self.design.n_runs:
            raise ValueError(f"design_row={row}; allowed values: 0..{self.design.n_runs - 1}")
        return {f.name: f.level(c) for f, c in zip(self.factors, self.design.matrix[row], strict=True)}

    def _rung(self, rung: str | Rung) -> Rung:
        name = rung.name if isinstance(rung, Rung) else rung
        for r in self.rungs:
            if r.name == name:
                return r
        raise ValueError(f"Study {self.name!r} has no rung {name!r}; "
                         f"allowed values: {', '.join(r.name for r in self.rungs)}")

    def spec(self, rung: str | Rung, levels: Mapping[str, str], seed: int, lr_multiplier: float = 1.0) -> RunSpec:
        """The RunSpec of one arm (any level combination, not only design rows) at a rung and seed."""
        r = self._rung(rung)
        check_levels(self.factors, levels)
        missing = [f.name for f in self.factors if f.name not in levels]
        if missing:
            raise ValueError(f"levels miss factor(s) {missing}; every factor of study {self.name!r} needs a level")
        model = r.model()
        data = self.data
        if data.tokenizer == "bpe":
            data = replace(data, bpe_vocab=model.vocab_size)
        if self.vary_data_seed:
            data = replace(data, data_seed=self.data.data_seed + seed)
        if r.mixture and not data.mixture and data.corpus == "embedded":
            # the rung's own schedule (Marin's hero ladder) names the embedded domains; a study's
            # own mixture (`--data.mixture=...`) or another corpus keeps the study's data
            data = replace(data, mixture=r.mixture, mixture_block=r.mixture_block)
        if r.simulated_epoching_target and not data.simulated_epoching_target:
            data = replace(data, simulated_epoching_target=r.simulated_epoching_target)  # Marin's hero ladder
        train = r.train_config(self.base_recipe, lr_multiplier)
        s = apply_levels(self.factors, levels, model=model, recipe=self.base_recipe, train=train, data=data)
        return RunSpec(model=s["model"], recipe=s["recipe"], train=s["train"], data=s["data"], seed=seed)

    def meta(self, rung: str, arm: str, seed: int, row: int | None, levels: Mapping[str, str]) -> dict:
        """meta.json of a run (`marin.schema.RunMeta`): its cell of the study and its coding, i.e. for
        every factor the level, the definition (field, low −1, high +1) and the ±1 code."""
        coding = tuple(FactorCoding(f.name, levels[f.name], f.field, f.low, f.high, f.truth_dict, f.regime,
                                    _level_values(f)) for f in self.factors)
        return RunMeta(self.name, rung, arm, seed, row, coding).to_dict()

    def runs(self, rungs: Sequence[str] | None = None) -> list[tuple[RunSpec, dict]]:
        """Every run at the heuristic LRs: [(RunSpec, meta)] ordered by rung, seed, design row.
        meta = `Study.meta`: study, rung, arm, seed, design_row, factors {factor: level} and coding. `rungs`
        restricts to some rungs (e.g. the smallest, for tuning). An arm's LR multiplier at a seed (the LR profile,
        `run --tuned`) is `TrainConfig.lr_scale`, set by the sweep on the planned runs (sweeps/sweep.py `at_lrs`)."""
        names = self.arm_names
        chosen = self.rungs if rungs is None else tuple(self._rung(r) for r in rungs)
        out = [(self._grid[(r.name, seed, row)], self.meta(r.name, arm, seed, row, self.levels(row)))
               for r in chosen for seed in self.seeds for row, arm in enumerate(names)]
        ids = [s.run_id for s, _ in out]
        if len(set(ids)) != len(ids):
            raise ValueError(f"Study {self.name!r}: two runs have the same spec (factor levels that change nothing?)")
        return out

    @functools.cached_property
    def _grid(self) -> dict[tuple[str, int, int], RunSpec]:
        """(rung, seed, design row) -> spec at the heuristic LRs: built once per study (plan, run and
        describe read it; each spec computes its run id once)."""
        return {(r.name, seed, row): self.spec(r, self.levels(row), seed)
                for r in self.rungs for seed in self.seeds for row in range(self.design.n_runs)}

    def describe(self, alias_order: int = 3) -> dict:
        """Everything `plan --json` prints: design and alias structure, runs per rung/seed, cost."""
        d = self.design.describe(alias_order)
        n_rows, n_seeds = self.design.n_runs, len(self.seeds)
        par = int(dict(self.executor).get("max_parallel", 1))
        rung_rows, total_flops, total_wall, total_gpuh = [], 0.0, 0.0, 0.0
        specs = {(r.name, row): self._grid[(r.name, self.seeds[0], row)] for r in self.rungs for row in range(n_rows)}
        for r in self.rungs:
            info = r.describe(self.base_recipe)
            # the steps each arm trains (TrainConfig.effective(): token_multiplier scales the rung's)
            work = [s.train.token_multiplier for (rn, _), s in specs.items() if rn == r.name]
            flops = n_seeds * sum(flops_per_token(s.model, s.recipe) * r.tokens() * s.train.token_multiplier
                                  for (rn, _), s in specs.items() if rn == r.name)
            info.update(n_runs=n_rows * n_seeds, train_flops=flops)
            if self.hardware is not None:
                gh = self.hardware.gpu_hours(flops)
                per_run_h = gh / (n_rows * n_seeds)
                wall_h = per_run_h / max(1, r.gpus)
                # a SLURM time limit with 50% headroom, at least 30 min
                info.update(gpu_hours=gh, gpu_hours_per_run=per_run_h, wall_hours_per_run=wall_h,
                            timeout_min=max(30, math.ceil(1.5 * wall_h * 60)))
                total_gpuh += gh
            if r.est_wall_s() is not None:
                info.update(core_seconds=r.est_wall_s() * sum(work) * n_seeds,
                            timeout_min=max(2, math.ceil(3 * r.est_wall_s() * max(work) / 60)))
                total_wall += r.est_wall_s() * sum(work) * n_seeds
            if self.hero is not None:  # one job of the hero's requeued chain: sbatch --time (planning/hero.py)
                info.update(timeout_min=self.hero.job_time_min)
            total_flops += flops
            rung_rows.append(info)
        cost: dict[str, Any] = {"train_flops": total_flops}
        if self.hardware is not None:
            cost.update(hardware=self.hardware.name, assumed_mfu=self.hardware.mfu, gpu_hours=total_gpuh)
        if total_wall:
            cost.update(est_core_seconds=total_wall, max_parallel=par, est_wall_s=total_wall / par)
        fixed = {k: getattr(self.base_recipe, k) for k in FACTORS
                 if not any(f.field == f"recipe.{k}" for f in self.factors)}
        out = {
            "name": self.name, "description": self.description, "factors": [f.to_dict() for f in self.factors],
            "fixed_recipe": fixed, "design": d,
            **{k: d[k] for k in ("kind", "resolution", "defining_relation", "alias_table", "all_2fi_estimable")},
            "arms": self.arm_names, "n_runs_per_rung_seed": n_rows, "seeds": list(self.seeds), "rungs": rung_rows,
            "n_runs": n_rows * n_seeds * len(self.rungs),
            "n_runs_by_rung": {r.name: n_rows * n_seeds for r in self.rungs},
            "data": to_dict(self.data), "vary_data_seed": self.vary_data_seed, "executor": dict(self.executor),
            "cost": cost, "companions": list(self.companions),
            **({"published_law": to_dict(self.published_law)} if self.published_law is not None else {}),
        }
        if self.hero is not None:
            out["hero"] = self.hero.describe(self._grid[(self.rungs[0].name, self.seeds[0], 0)])
        return out


def format_num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def text_table(rows: Sequence[Mapping], cols: Sequence[str]) -> str:
    """Aligned columns (None as "-"), the header first: the console tables of plan, status and run --tune."""
    cells = [["-" if r.get(c) is None and c in r else format_num(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def plan_lines(d: Mapping, study: Study, run_rows: Sequence[Mapping] | None = None) -> list[str]:
    """`plan STUDY`'s text: the design (`Study.describe()`: factors, alias table, arms, seeds, rungs, runs, cost) and
    what the plan adds to it (the runs before the design, the execution, the time, each rung's data; `run_rows`:
    one line per run)."""
    des = d["design"]
    out = [f"study {d['name']}: {d['description']}",
           f"design: {des['kind']}, {des['n_runs']} arms over {len(d['factors'])} factors, "
           f"resolution {des.get('resolution_roman') or des.get('resolution')}"]
    if des.get("generators"):
        out.append(f"generators: {', '.join(des['generators'])}")
    if des.get("defining_relation"):
        rel = list(des["defining_relation"])
        out.append(f"defining relation: {' = '.join(rel if rel[0] == 'I' else ['I', *rel])}")
    out.append("\nfactors (letter  name  recipe level / baseline level):")
    out += [f"  {letter}  {f.get('name')}  {f.get('high', f.get('recipe', ''))} / {f.get('low', f.get('baseline', ''))}"
            for letter, f in zip(des.get("letters", ""), d["factors"], strict=True)]
    if d.get("fixed_recipe"):
        out.append("fixed: " + ", ".join(f"{k}={v}" for k, v in d["fixed_recipe"].items()))
    if d.get("alias_table"):
        out.append(f"\nalias table (up to order {des.get('alias_max_order', 3)}):")
        shown: set[frozenset] = set()
        for eff, al in d["alias_table"].items():  # an alias group once (AB = CD = EF is one line, not three)
            if not al or frozenset([eff, *al]) not in shown:
                shown.add(frozenset([eff, *al]))
                out.append(f"  {eff} = {' = '.join(al) if al else '(clear)'}")
    out += [f"all two-factor interactions estimable: {d.get('all_2fi_estimable')}",
            f"\narms ({len(d['arms'])}): {', '.join(d['arms'])}", study.arm_key(), f"seeds: {d['seeds']}\n\nrungs:"]
    cols = [c for c in ("name", "d_model", "n_layers", "params_active", "params_total", "tokens", "steps", "batch_size",
                        "n_runs", "train_flops", "gpus", "gpu_hours", "core_seconds", "timeout_min")
            if any(c in r for r in d["rungs"])]
    out.append(text_table(d["rungs"], cols))
    if "train_flops" in cols:
        out.append("(train_flops, gpu_hours, core_seconds: the rung's total over its n_runs runs)")
    out.append(f"\nruns: {d['n_runs']} ({', '.join(f'{k}: {v}' for k, v in d['n_runs_by_rung'].items())})")
    if d.get("analysis_refusal"):
        out.append(f"refused by `run`: {d['analysis_refusal']}")
    # the assumed seconds (est_*) stay in --json; plan's time line is the measured model's
    out.append("cost: " + ", ".join(f"{k}={format_num(v)}" for k, v in d["cost"].items()
                                    if not k.startswith(("est_", "max_par"))))
    for row in d["before_design"]:
        cs = f", ~{row['core_seconds']:.0f} core-s" if row.get("core_seconds") else ""
        at = f": {row['runs']} runs at {row['rungs']}" if row["runs"] else ""
        out.append(f"before the design: {row['what']}{at}{cs}"
                   + (f" (up to {row['max_runs']} when an optimum is on the grid's edge)" if row.get("max_runs")
                      else "") + (f"; {row['state']}" if row.get("state") else ""))
    if d.get("published_law"):
        law = d["published_law"]
        out.append(f"reference law: L∞ = {law['linf']:g} and α = {law['alpha']:g} pinned from {law['source']}")
    ex, t = d["execution"], d["time"]
    out.append(f"execution: {ex['executor']}, " + (f"{ex['workers']} run(s) at once (--workers)" if ex["workers"]
                                                   else "runs at once as the scheduler allows"))
    if t:
        out.append(f"time: {t['text']}" + (f"; {t['completed']} of {d['n_runs']} runs already done"
                                           if t["completed"] else ""))
    epochs = [{**r, "corpus_tokens": "unknown" if r["corpus_tokens"] is None else r["corpus_tokens"],
               "epochs": "-" if r["epochs"] is None else round(r["epochs"], 3)} for r in d["epochs"]]
    out += ["\ndata (tokens one run needs / tokens in data.corpus):",
            text_table(epochs, ["rung", "device", "tokens_needed", "corpus_tokens", "epochs", "corpus"])]
    if d.get("companions"):
        out.append(f"companion studies: {', '.join(d['companions'])}")
    if run_rows is not None:
        out.append("\n" + text_table(run_rows, ["run_id", "rung", "arm", "seed", "design_row"]))
    return out
