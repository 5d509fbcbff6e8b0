"""The registered studies (`STUDIES`, `get_study(name)`; a study is ablations/study.py's `Study`, docs/method.md
§4–5): each builder's docstring says its design and why, and `marin-ablate studies` lists them. No torch import."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any, Callable, Sequence

from marin_ablate.ablations.designs import arms, fraction, full_factorial
from marin_ablate.ablations.factors import Factor
from marin_ablate.ablations.gb200 import GB200, H100, Hardware, HeroPlan  # noqa: F401  (re-exported)
from marin_ablate.ablations.holdout import holdout
from marin_ablate.ablations.ladders import (
    GPU_DATA,
    HERO_MIXTURE,
    HERO_MIXTURE_BLOCK,
    Rung,
    ladder,
    params_active,
)
from marin_ablate.ablations.study import CPU_EXECUTOR, Study, gpu_executor
from marin_ablate.marin.config import ContextStage, DataConfig, Recipe
from marin_ablate.marin.presets import preset
from marin_ablate.marin.schema import check_name

#: The seven recipe switches and the six that change the trained model, listed here so that a study
#: keeps its arms when a factor is added to the table (a new factor joins a study by name).
SEVEN = ("xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "ep_transport", "optimizer")
SIX_QUALITY = ("xsa", "sconv", "qk_norm", "latent_moe", "router_balance", "optimizer")

#: The baseline arm's ladder that pins the CPU studies' reference law: 64x in compute (the design's
#: rungs span 8x, too little for the law's curvature; docs/method.md §4.1).
CPU_REFERENCE_RUNGS = ("cpu_s16", "cpu_s32", "cpu_s64", "cpu_s128", "cpu_s256", "cpu_s512", "cpu_s1024")
#: Three seeds: one seed's ladder, measured, left α = 0.237 [−0.084, 0.559] on 4 residual df (its valley, §4.1,
#: then spans L∞ 0..2.54); three give the slope 16 df.
CPU_REFERENCE_SEEDS = (0, 1, 2)
#: The main job's seeds: each a full replication (its own init, data order and LR profile; docs/method.md §4.4);
#: eight, because the error term of every effect is its component x seed term (docs/method.md §4.11)
SMOKE_SEEDS = tuple(range(8))


def smoke(seeds: Sequence[int] = SMOKE_SEEDS, rungs: Sequence[str] = ("cpu_s32", "cpu_s64")) -> Study:
    """The README's CPU study: all seven factors, 2^(7-3) resolution IV, on a two-rung token ladder, eight
    seeds, each a full replication of the experiment (its own initialisation, data order and LR profile), so
    every component's interval rests on its component x seed scatter (docs/method.md §4.4).

    Design: 16 arms, generators chosen by pydoe.fracfact_by_res(7, 4) and verified (resolution IV:
    main effects clear of 2FIs; 2FIs aliased in threes). The all-on and all-off arms are in the
    fraction. ep_transport stays a factor: virtual-EP drops (fixed cf 1.33 vs ragged cf 1.15 over 4
    shards) change the trained model even on CPU.

    Rungs: the cpu_s model (d64, 2 layers) trained for 32 and 64 steps of 1024 tokens (2x in compute: a scale
    trend; the law's curvature comes from the pinned reference ladder, §4.1). A width ladder does not work at
    this budget: the all-off arm's loss did not fall with width (3.13, 3.31, 3.30 at cpu_s/m/l, 96 steps each),
    because the bigger baseline models lose 40-55% of their routed assignments to fixed-capacity drops in so
    short a run.

    Seeds, not rungs: an effect's error term is its component x seed term, replicated once per seed (a seed's
    init, data order and LR profile move the optimizer's effect by 0.33 in ln M, sconv's by 0.15), so a third
    rung buys no precision while a seed does. At the budget of three seeds on three rungs, six seeds on two take
    the optimizer's 95% half-width from 0.67 to 0.33 and the power of sconv's verdict at a true 1.5x from 0.14
    to 0.90; eight make the optimizer's half-width at most ln 1.5 in 97% of studies (benchmarks/design_power.py,
    docs/method.md §4.11). `run smoke --until.halfwidth H` adds seeds until an asked precision.

    Before the design, `run` profiles the optimizer's two levels at cpu_s64 at every seed (5 LRs each, up to
    2 x 2 more when an optimum is on the grid's edge; the design at seed s uses seed s's optimum, docs/method.md
    §4.6) and, once per machine, runs the all-off arm on CPU_REFERENCE_RUNGS (cpu_s16..cpu_s1024) x
    CPU_REFERENCE_SEEDS to pin the reference law (§4.1). `plan smoke` prints the cost on this machine."""
    names = list(SEVEN)
    design = fraction(names, resolution=4)
    return Study("smoke", "CPU smoke: 7 recipe factors, 2^(7-3) resolution IV, a 2-rung CPU token ladder x 8 "
                 "seeds, LRs profiled per optimizer level and seed, a 64x baseline ladder for the reference law",
                 tuple(names), design, ladder(rungs), tuple(seeds), DataConfig(), Recipe(),
                 CPU_EXECUTOR, None, True, ("noise_cpu",), reference_rungs=CPU_REFERENCE_RUNGS,
                 reference_seeds=CPU_REFERENCE_SEEDS)


def noise_cpu(seeds: Sequence[int] = (0, 1, 2, 3, 4), rungs: Sequence[str] = ("cpu_s",)) -> Study:
    """Seed panel on CPU: all-on and all-off over the seven factors, 5 seeds at cpu_s (10 runs,
    ~10 x 14.7 core-s = 147 core-s, ~75 s on 2 cores)."""
    names = list(SEVEN)
    return Study("noise_cpu", "CPU seed panel: all-on vs all-off, 5 seeds at cpu_s", tuple(names),
                 arms(names, ["all_on", "all_off"]), ladder(rungs), tuple(seeds), DataConfig(), Recipe(),
                 CPU_EXECUTOR, None, True, ("smoke",))


def calibration(seeds: Sequence[int] = tuple(range(10)), rungs: Sequence[str] = ("cpu_s32", "cpu_s64", "cpu_s128"),
                real: Sequence[str] = ("xsa", "qk_norm")) -> Study:
    """Planted factors of known effect beside two real ones, on the smoke ladder (docs/calibration/).
    - placebo: only the seed stream of model init and data order differs (true M_flop = R = 1);
    - waste: the same training with twice the FLOPs counted (true M_flop = 0.5 exactly: same losses at
      2x C, and R = 2: twice the FLOPs counted per second; waste is crossed with every other arm, so
      each waste run has an identical twin);
    - extra_compute: twice the steps (tokens) of the rung on the same ladder (true M_flop = 1 when the
      power law holds: the arm is the next rung's compute reached by the same training recipe; R = 1).
    Design: the four others in 2^(4-1) (extra_compute = xsa·qk_norm·placebo) crossed with waste: 16
    arms, resolution IV, every two-factor interaction with waste clear.
    Replicates: each seed (its own init and data order) is one replicate of the 48-run study; the
    analysis also analyses each seed alone and reports how many replicates' intervals cover each
    planted truth (analysis/fit/replicates.py). Ten by default: a coverage rate, not one draw.
    Budget: ~16 arms x (32+64+128 steps) x 1.5 (extra_compute) x 1024 tokens / ~15k tok/s + 3 x 2 s
    = ~30 core-s per arm; measured ~6 min per seed on 2 cores, so ~1 h for the ten."""
    planted = (Factor("placebo", field="train.seed_stream", levels={"stream0": 0, "stream1": 1},
                      truth={"M_flop": 1.0, "R": 1.0}),
               Factor("extra_compute", field="train.token_multiplier", levels={"x1": 1, "x2": 2},
                      truth={"M_flop": 1.0, "R": 1.0}),
               Factor("waste", field="train.flops_multiplier", levels={"counted_once": 1.0, "counted_twice": 2.0},
                      truth={"M_flop": 0.5, "R": 2.0}))
    factors = tuple(real) + planted
    names = [f if isinstance(f, str) else f.name for f in factors]
    letters = "ABCDE"
    gen = f"{letters[len(real) + 1]}={letters[: len(real) + 1]}"  # extra_compute = real... x placebo
    design = fraction(names, generators=[gen])
    return Study("calibration", "Calibration: placebo, waste (2x FLOPs counted) and extra-compute (2x tokens) "
                 "planted beside two real factors on the CPU token ladder", factors, design, ladder(rungs),
                 tuple(seeds), DataConfig(), Recipe(), CPU_EXECUTOR, None, True, ())


def marin535(rungs: Sequence[str] = ("d512", "d768", "d1024"), seeds: Sequence[int] = (0,),
             include_d1536: bool = False) -> Study:
    """The six quality factors, 2^(6-1) half fraction F=ABCDE (I=ABCDEF, resolution VI): every main
    effect and 2FI is clear (main effects alias 5FIs, 2FIs alias 4FIs). EP transport fixed at the
    recipe's ragged (cf 1.15) so drops do not confound the quality factors; it has its own study
    (`marin535_ep`). Seed noise comes from `noise`. One EP shard per GPU: 8 GPUs per run at d512/d768,
    16 at d1024, 32 at d1536. Cost at the assumed 20% MFU on H100/H200 in `describe()`."""
    names = list(SIX_QUALITY)
    design = fraction(names, generators=["F=ABCDE"], resolution=6)
    rs = tuple(rungs) + (("d1536",) if include_d1536 and "d1536" not in rungs else ())
    return Study("marin535", "Six quality factors of the Marin 535B recipe, 2^(6-1) resolution VI (F=ABCDE)",
                 tuple(names), design, ladder(rs), tuple(seeds), GPU_DATA, Recipe(), gpu_executor(), H100, True,
                 ("marin535_ep", "noise"))


def marin535_ep(rungs: Sequence[str] = ("d512", "d768", "d1024"), seeds: Sequence[int] = (0, 1)) -> Study:
    """EP transport alone: ragged (pooled receiver cf 1.15) vs fixed (per sender-expert cf 1.33), the
    other six switches at the recipe level. Measures drop rate, its quality cost and throughput; each run
    uses the real EP transport over its rung's GPUs, one EP group of one shard per GPU (8 at d512 and d768,
    16 at d1024), so tokens/s and MFU are comparable.
    Why ragged vs fixed and not the hero's own pooled-wave transport: the recipe as published names the
    ragged all-to-all and the factor's levels are ragged / fixed; pooled_wave (an extra level, real EP
    included) is a third arm a study can add (benchmarks/ep_drops.py and ep_step.py set the four
    transports side by side)."""
    design = full_factorial(["ep_transport"])
    return Study("marin535_ep", "EP transport (ragged vs fixed): drops, quality and throughput, 2 arms",
                 ("ep_transport",), design, ladder(rungs), tuple(seeds), GPU_DATA, Recipe(),
                 gpu_executor(), H100, True, ("marin535",))


def noise(seeds: Sequence[int] = (0, 1, 2, 3, 4), rungs: Sequence[str] = ("d512",)) -> Study:
    """Seed panel: the all-on and all-off arms of the six quality factors, 5 seeds at d512 (10 runs),
    run before the factorial to size its replication (docs/method.md §4.5)."""
    names = list(SIX_QUALITY)
    return Study("noise", "Seed panel: all-on vs all-off over the six quality factors, 5 seeds at d512",
                 tuple(names), arms(names, ["all_on", "all_off"]), ladder(rungs), tuple(seeds), GPU_DATA,
                 Recipe(), gpu_executor(), H100, True, ("marin535",))


#: The hero's loss chunk: 8,192 tokens x 128,256 vocab fp32 logits = 4.2 GB (and as much for their gradient)
HERO_LOSS_CHUNK = 8_192


#: The hero's context extension as Marin's newest hero record has it (docs/fidelity.md "context extension"):
#: 4k -> 16k at the handoff near step 216,000 of 390,251 (55%), 65k from 95% of the steps, no change to the LR
#: schedule, tokens per step held (11,264 -> 2,816 -> 704 sequences), the q multiplier 1.3·(1 + 0.1·ln(L/4096))
#: (`context_q_rule="yarn"`: 1.48 at 16k, 1.66 at 65k)
HERO_CONTEXT_16K_STEP = 216_000
HERO_CONTEXT_STAGES = (ContextStage(HERO_CONTEXT_16K_STEP / 390_251, 16_384), ContextStage(0.95, 65_536))


#: The step at which Marin's hero switched its gate/router weight decay on (docs/fidelity.md "gate/router decay")
HERO_GATE_ROUTER_DECAY_START = 58_014


def hero(ep_groups: int = 11, corpus: str = "embedded", steps: int = 390_251, name: str = "hero",
         n_layers: int | None = None, ep_size: int = 64, gpus_per_node: int = 4) -> Study:
    """The full recipe at 535B-A23B on GB200 NVL72, as Marin ran it (launch_scaling_ladder.py d6144 row):
    390,251 steps x 11,264 x 4,096 tokens (18.0T), EP64 within a rack, `ep_groups` racks as data-parallel
    replicas (default 11 -> 176 nodes, 704 GPUs), evaluation every 3,000 steps. A plan: sweeps prints the
    sbatch from `describe()["hero"]`. Every variant keeps the hero's per-GPU shape: 16 sequences x 4,096
    tokens per GPU and EP shard per step (1,024 sequences per EP64 rack) and 6 experts per rank per layer
    (8 on one GPU, for top-8 routing);
    `n_layers` / `ep_size` / `gpus_per_node` shrink it for the smoke runs (`hero_rack`, `hero_node`,
    `hero_gpu`): n_experts = max(6 x ep_size, top_k).
    `corpus` is the pretraining mix (a local path on the cluster); the embedded corpus is a placeholder.
    EP transport: `ragged`, the recipe's level and the hero's MoE backend since step 81,716 (docs/fidelity.md
    "pooled-wave transport"); `--recipe.ep_transport=pooled_wave` runs too, but its receive buffers are not what
    the hero's memory plan measures. The gate/router decay switches on at step 58,014 as the hero's did."""
    plan = HeroPlan(ep_groups=ep_groups, ep_size=ep_size, gpus_per_node=gpus_per_node)
    model = preset("hero_535b")
    per_rank_experts = model.n_experts // model.ep_shards
    # at least top_k experts: one GPU holds 8 (top-8 routing), every other variant 6 per rank
    model = replace(model, n_layers=n_layers or model.n_layers,
                    n_experts=max(per_rank_experts * ep_size, model.top_k), ep_shards=ep_size)
    batch = HERO_SEQS_PER_GPU * plan.gpus  # 11,264 at 11 racks
    tokens = steps * batch * model.seq_len
    rung = Rung(name if name != "hero" else "hero_535b", "hero_535b",
                tokens_per_active_param=tokens / params_active(model, Recipe()),
                batch_size=batch, fixed_steps=steps, device="cuda", precision="bf16", threads=None, gpus=plan.gpus,
                # the fused path of the GPU rungs: flex compiled (eager flex OOMs at its first attention)
                model_overrides={"kernels": "triton", "n_layers": model.n_layers, "n_experts": model.n_experts,
                                 "ep_shards": ep_size},
                train_overrides={"compile": True, "eval_every": min(3_000, steps),
                                 "checkpoint_every": min(1_000, max(1, steps // 4)),
                                 # 1,000 steps are longer than a 4 h job: an hourly temporary checkpoint as
                                 # Marin's (planning/timemodel.py checks it against HeroPlan.job_time_min)
                                 "checkpoint_interval_s": 3600.0,
                                 "log_every": 10,
                                 # what fits a GB200 (`plan hero --dry_run`): blocks recomputed, the loss
                                 # in chunks of 8,192 tokens, eval one sequence per GPU
                                 "activation_checkpoint": "block", "loss_chunk_tokens": HERO_LOSS_CHUNK,
                                 "eval_batch_size": plan.gpus, "mixed_precision": "bf16",
                                 # rack-local sharding (HSDP), Marin's (replica_dcn, data, expert) mesh; each
                                 # rank's expert slice ZeRO-sharded across the racks (marin.parallel.ExpertShard):
                                 # nothing on the host, the optimizer steps on the GPU
                                 "replica_groups": ep_groups,
                                 # Marin's hero switched the gate/router decay on mid-run (the ladder: step 0)
                                 "gate_router_decay_start": HERO_GATE_ROUTER_DECAY_START,
                                 "context_stages": HERO_CONTEXT_STAGES, "context_q_rule": "yarn"})
    names = list(SEVEN)
    what = "full recipe, 18T tokens" if steps == 390_251 else f"full recipe, {steps:,} steps"
    shape = f"{ep_groups} x EP{ep_size}" + (f", {model.n_layers} layers" if n_layers else "")
    return Study(name, f"Marin 535B-A23B {name}: {what}, GB200 NVL72, {shape}",
                 tuple(names), arms(names, ["all_on"]), (rung,), (0,),
                 DataConfig(corpus=corpus, tokenizer="bpe", bpe_vocab=model.vocab_size,
                            # Marin's phased mixture on the embedded domains; a cluster corpus names its own
                            mixture=HERO_MIXTURE if corpus == "embedded" else (),
                            mixture_block=HERO_MIXTURE_BLOCK if corpus == "embedded" else 0,
                            # a web-scale corpus: each rank reads the pre-built loader index (marin/data/index.py)
                            shuffle="indexed"), Recipe(),
                 {"executor": "slurm", "nodes": plan.nodes, "gpus_per_node": plan.gpus_per_node}, None,
                 False, (), plan)


#: The hero's per-GPU batch: 16 sequences x 4,096 tokens per GPU and EP shard (Marin: 1,024 per rack)
HERO_SEQS_PER_GPU = 16
#: Smoke-run depths (docs/hero.md "Smoke runs"): one rack cannot hold the hero's 48 layers' training
#: state (12 bytes per parameter over 64 GPUs: 93 GiB of expert state per rank before activations)
HERO_SMOKE_LAYERS = {"hero_2rack": 16, "hero_rack": 16, "hero_node": 4, "hero_gpu": 2}


def overtrain(seeds: Sequence[int] = (0,), rungs: Sequence[str] = ("cpu_s32", "cpu_s64"), ratio: int = 4,
              factors: Sequence[str] = ("xsa", "qk_norm")) -> Study:
    """Does an effect change with overtraining? The components crossed with `token_ratio`, a factor on the
    rung's tokens per parameter (x1 as the ladder sets them, x`ratio`: the same model trained longer;
    Marin's fast ladder trains 60 tokens per active parameter, its hero ladder 791, ~13x). Each
    component's interaction with `token_ratio` is the change of its effect with overtraining; the report
    shows the component's multiplier at both levels (docs/method.md "Effects by regime").
    2 components x tokens, full factorial, 2 rungs: 16 runs, about 3 minutes on 2 cores."""
    tokens = Factor("token_ratio", field="train.token_multiplier", levels={"x1": 1, f"x{ratio}": ratio}, regime=True)
    names = [*factors, "token_ratio"]
    return Study("overtrain", f"{' x '.join(factors)} crossed with tokens per parameter x1 / x{ratio}",
                 (*factors, tokens), full_factorial(names), ladder(rungs), tuple(seeds), DataConfig(), Recipe(),
                 CPU_EXECUTOR, None, True, ())


class StudyTable(dict):
    """The registered studies: a name is added once. A plugin (or a study file) that assigns a name already
    taken, `STUDIES["smoke"] = ...`, is refused: replacing a built-in study silently would run other runs
    under its name."""

    def __setitem__(self, name: str, study: Callable[..., Study] | Study) -> None:
        if name in self:
            raise ValueError(f"study {name!r} is registered already; allowed values: a new name (registered: "
                             f"{', '.join(self)})")
        super().__setitem__(check_name(name, "study name"), study)  # `run NAME` names a folder OUT/NAME too

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, name: str, study: Any = None) -> Any:
        if name not in self:
            self[name] = study
        return self[name]


#: Studies by name: a builder (a function returning a Study, given `rungs`/`seeds` when it takes
#: them) or a Study object; `get_study(name, rungs=, seeds=)` builds one.
STUDIES: StudyTable = StudyTable({
    "smoke": smoke, "noise_cpu": noise_cpu, "calibration": calibration, "overtrain": overtrain,
    "marin535": marin535, "marin535_ep": marin535_ep, "noise": noise, "hero": hero, "holdout": holdout,
    # the smoke runs before the full job, first to last (docs/gpu.md, "Before a hero run"), each 200 steps
    # with a checkpoint every 50 at the hero's per-GPU shape: one GPU (the per-rank step), one 4-GPU
    # tray (EP4), one NVL72 rack (EP64, 16 trays: NCCL over NVLink, the pre-flight, a requeue)
    "hero_gpu": lambda **kw: hero(**{"ep_groups": 1, "steps": 200, "name": "hero_gpu", "ep_size": 1,
                                     "gpus_per_node": 1, "n_layers": HERO_SMOKE_LAYERS["hero_gpu"], **kw}),
    "hero_node": lambda **kw: hero(**{"ep_groups": 1, "steps": 200, "name": "hero_node", "ep_size": 4,
                                      "n_layers": HERO_SMOKE_LAYERS["hero_node"], **kw}),
    "hero_rack": lambda **kw: hero(**{"ep_groups": 1, "steps": 200, "name": "hero_rack",
                                      "n_layers": HERO_SMOKE_LAYERS["hero_rack"], **kw}),
    # two racks (128 GPUs, HSDP over 2 replicas): the cross-rack code before the full job -- the expert
    # slice ZeRO-sharded across racks, Newton-Schulz's cross-rack owner gather/scatter, the world-wide clip
    # all-reduce and the replica all-reduce, none of which a one-rack smoke run has
    "hero_2rack": lambda **kw: hero(**{"ep_groups": 2, "steps": 200, "name": "hero_2rack",
                                       "n_layers": HERO_SMOKE_LAYERS["hero_2rack"], **kw}),
})


STUDY_FORMS = "a Study, or a function returning one (a builder)"


def build_study(obj: Any, label: str, rungs: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
                **kwargs: Any) -> Study:
    """`obj` as a study at the requested rungs and seeds: a builder gets `rungs`/`seeds` when its
    signature takes them; a fixed Study (or a builder that does not take them) is restricted to them,
    refusing a rung or seed the study does not have. Never silently ignored."""
    want = {"rungs": rungs, "seeds": seeds}
    if not _is_study(obj):
        if not callable(obj):
            raise ValueError(f"study {label!r} is a {type(obj).__name__}; allowed values: {STUDY_FORMS}")
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            params = {}
        takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
        passed = {k: v for k, v in want.items() if v is not None and (k in params or takes_all)}
        try:
            inspect.signature(obj).bind(**kwargs, **passed)
        except (TypeError, ValueError):
            raise ValueError(f"study {label!r} is a {type(obj).__name__} that cannot be called with "
                             f"{({**kwargs, **passed}) or 'no arguments'}; allowed values: {STUDY_FORMS}") from None
        obj = obj(**kwargs, **passed)
        if not _is_study(obj):
            raise ValueError(f"study {label!r} returned a {type(obj).__name__}; allowed values: {STUDY_FORMS}")
        want = {k: None if k in passed else v for k, v in want.items()}
    elif kwargs:
        raise ValueError(f"study {label!r} is a fixed Study and takes no {', '.join(kwargs)}")
    if want["rungs"] is None and want["seeds"] is None:
        return obj
    if not isinstance(obj, Study):
        raise ValueError(f"study {label!r} is a {type(obj).__name__}, which cannot be restricted to "
                         f"--rungs/--seeds; allowed values: a Study, or a builder taking rungs and seeds")
    return obj.restrict(want["rungs"], want["seeds"])


def _is_study(obj: Any) -> bool:
    return hasattr(obj, "runs") and hasattr(obj, "name") and not isinstance(obj, type)


def get_study(name: str, rungs: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
              **kwargs: Any) -> Study:
    """A registered study: `STUDIES[name]` is a builder or a Study (`build_study`)."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; allowed values: {', '.join(STUDIES)}")
    return build_study(STUDIES[name], name, rungs, seeds, **kwargs)
