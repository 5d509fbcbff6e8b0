"""`marin-ablate plan STUDY [--json]`: a study's design, alias table, runs, cost and time, the runs made before the
design, and per rung the tokens needed against the corpus (a hero study: its time model and sbatch); `--dry-run`
rehearses the first run on CPU and `--precision` states the expected precision of the multipliers instead.
`plan --preset P` prints one model preset's resolved config, parameter and FLOP counts instead of a study's."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import ClassVar

from marin_ablate.ablations.study import plan_lines
from marin_ablate.cli.common import StudyOptions, study_from_args
from marin_ablate.cli.parse import flags_of, parse
from marin_ablate.marin.fields import option
from marin_ablate.marin.presets import PRESETS
from marin_ablate.sweeps.job import UntilOptions, exec_options
from marin_ablate.sweeps.sweep import ExecConfig


@dataclass(frozen=True)
class DryRunOptions:
    """On CPU, for the first run: (a) the training loop at the full world size through a fake process group
    (first, last and EP-edge ranks, narrowed width, 2 steps + eval); (b) one rank's memory at full width (fake
    tensors); (c) one step + checkpoint save with the accelerator and the host as different devices
    (planning/rehearsal.py); exit 1 naming the lines over budget or the call that fails."""

    gpus: int | None = option(None, lo=1, help="GPUs per run (none: the study's); a GPU study's rungs on fewer GPUs "
                                              "than their own take virtual EP shards and micro-batches that fit")
    ep: int | None = option(None, lo=1, help="EP group size (none: model.ep_shards)")
    capacity_gib: float = option(173.0, lo=0, lo_open=True, help="memory per GPU (GB200: 173 GiB)")
    reserve_gib: float = option(0.0, lo=0, help="kept free per GPU beyond the table's own lines (CUDA context, "
                                                "NCCL, fragmentation)")


@dataclass(frozen=True)
class PrecisionOptions:
    """Each component's expected 95% half-width of ln M at C_ref and 10x C_ref instead of the plan
    (analysis/calibration/precision.py)."""

    noise: str | None = option(None, metavar="PATH", help="a finished noise study or an analysed study (folder or "
                                                          "results file); none: a stated assumption")
    target_halfwidth: float | None = option(None, lo=0, lo_open=True, metavar="H",
                                            help="the cheapest seeds / rungs / fraction whose widest component "
                                                 "half-width at C_ref is <= H (ln scale)")


@dataclass(frozen=True)
class PlanOptions(StudyOptions):
    """Print a study's design, alias table, runs and cost (a hero study: its time model and sbatch), or with
    --preset P a model preset's resolved config, parameter and FLOP counts."""

    command: ClassVar[str] = "plan"
    study: str | None = option(None, positional=True, metavar="STUDY",
                               help="a registered study (`marin-ablate studies`), path/to/file.py:attribute or "
                                    "package.module:attribute; or none with --preset")
    preset: str | None = option(None, metavar="P", help=f"a model preset instead of a STUDY: its resolved config, "
                                                        f"parameter and FLOP counts; one of: {', '.join(PRESETS)}")
    baseline: bool = option(False, help="--preset: start from Recipe.baseline() instead of Recipe()")
    execution: ExecConfig = option(ExecConfig(), inline=True, section=ExecConfig)
    json: bool = option(False, help="machine-readable plan")
    runs: bool = option(False, help="list every run (id, rung, arm, seed)")
    allow_repeat: bool = option(False, help="accept a GPU rung that needs more tokens than its corpus holds "
                                            "(more than one epoch)")
    dry_run: DryRunOptions | None = option(None, section=DryRunOptions, mode=True, help=DryRunOptions.__doc__)
    precision: PrecisionOptions | None = option(None, section=PrecisionOptions, mode=True,
                                                help=PrecisionOptions.__doc__)
    until: UntilOptions | None = option(None, section=UntilOptions, help="what `run --until.*` expects to run")


def cmd_preset(args: PlanOptions) -> int:
    """`plan --preset P`: the preset's resolved config, parameter and FLOP counts (a ladder rung's batch and
    EP shards too); a study's options are refused naming them."""
    from marin_ablate.ablations.ladders import rung_of_preset
    from marin_ablate.marin.flops import describe_preset, preset_lines

    if args.study is not None:
        raise ValueError(f"STUDY {args.study!r} and --preset {args.preset}: plan takes one of them; allowed: "
                         f"`plan {args.study}` or `plan --preset {args.preset}`")
    # the study's options given (flags_of: the non-default ones; [1:] drops the empty STUDY)
    study_only = flags_of(replace(args, study="", preset=None, baseline=False, json=False, overrides=()))[1:]
    if study_only:
        raise ValueError(f"--preset {args.preset}: {study_only[0]} is a study's option; allowed with --preset: "
                         "--json, --baseline, --model.F=V, --recipe.F=V")
    bad = [x for x in args.overrides if not x.startswith(("model.", "recipe."))]
    if bad:
        raise ValueError(f"--preset {args.preset}: --{bad[0].split('=', 1)[0]} changes no count of a preset; allowed "
                         "sections: --model.F=V, --recipe.F=V")
    rung = rung_of_preset(args.preset)
    info = describe_preset(args.preset, args.overrides, args.baseline, rung)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print("\n".join(preset_lines(info, rung)))
    return 0


def cmd_plan(argv: list[str]) -> int:
    args = parse(PlanOptions, argv)
    if args.preset is not None:
        return cmd_preset(args)
    if args.study is None:
        raise ValueError("plan needs a STUDY (`marin-ablate studies` lists them) or --preset P (one of: "
                         f"{', '.join(PRESETS)})")
    if args.baseline:
        raise ValueError("--baseline starts a --preset from Recipe.baseline(); a study names its arms; allowed: "
                         "--preset P --baseline")
    study = study_from_args(args)
    if args.dry_run is not None:
        from marin_ablate.planning.layout_report import dry_run_study

        return dry_run_study(study, args)
    from marin_ablate.sweeps.reference import cached_law

    if args.precision is not None:
        from marin_ablate.analysis.calibration.precision import plan_precision

        pr = args.precision
        print(plan_precision(study, pr.noise, pr.target_halfwidth, args.json, pinned=cached_law(study)))
        return 0
    from marin_ablate.sweeps.study_plan import plan_record

    d, run_rows = plan_record(study, args.out, exec_options(args.execution, study), args.overrides, args.allow_repeat)
    if args.json:
        print(json.dumps(dict(d, runs=run_rows) if args.runs else d, indent=1, default=str))
        return 0
    print("\n".join(plan_lines(d, study, run_rows if args.runs else None)))
    if args.until is not None:
        from marin_ablate.analysis.calibration.precision import until_lines

        print("\n".join(until_lines(study, args.until.spec(), cached_law(study))))
    if "hero" in d:
        from marin_ablate.planning.timemodel import hero_lines

        print("\n".join(hero_lines(d["hero"])))
    return 0
