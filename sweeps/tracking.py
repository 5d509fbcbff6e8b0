"""Send every run of a study to W&B and TensorBoard, grouped by study and tagged with arm, rung, seed and every
factor's level. `run --log-to` puts the sinks in $MARIN_LOG_TO, which the workers inherit; `tracked_train`
sets W&B's documented run variables (WANDB_PROJECT, WANDB_RUN_GROUP = study, WANDB_TAGS, WANDB_JOB_TYPE = rung)
around the run and writes the tags as TensorBoard text and hparams beside train's scalars. W&B runs online
when WANDB_API_KEY is set or WANDB_MODE says so, offline otherwise (`wandb sync` uploads later)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from marin_ablate.marin.schema import read_json

LOG_TO_ENV = "MARIN_LOG_TO"
KEEP_ENV = "MARIN_KEEP_CHECKPOINTS"  # `run --keep-checkpoints all`: workers inherit it like the sinks
SINKS = ("wandb", "tensorboard")


def parse_log_to(value: str | None) -> tuple[str, ...]:
    names = tuple(x.strip() for x in (value or "").split(",") if x.strip())
    bad = [n for n in names if n not in SINKS]
    if bad:
        raise ValueError(f"--log-to {value!r}: {', '.join(bad)} is not a sink; allowed values: {', '.join(SINKS)}")
    return names


def run_tags(meta: dict) -> dict[str, str]:
    """study, arm, rung, seed and one entry per factor: the labels a run is grouped and filtered by."""
    tags = {k: str(meta[k]) for k in ("study", "arm", "rung", "seed") if meta.get(k) is not None}
    tags.update({f: str(level) for f, level in (meta.get("factors") or {}).items()})
    return tags


@contextmanager
def env_set(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ for the block, the old values (or their absence) restored after it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_name(meta: dict) -> str:
    """study/rung/arm/seedN: the name a run shows in W&B and (with _ for /) TensorBoard."""
    parts = [str(meta.get(k)) for k in ("study", "rung", "arm") if meta.get(k) is not None]
    return "/".join(parts + ([f"seed{meta['seed']}"] if meta.get("seed") is not None else []))


def wandb_env(meta: dict) -> dict[str, str]:
    tags = run_tags(meta)
    env = {"WANDB_PROJECT": os.environ.get("WANDB_PROJECT", "marin-ablate"),
           "WANDB_RUN_GROUP": tags.get("study", "study"), "WANDB_JOB_TYPE": tags.get("rung", "run"),
           # W&B tags are short strings: key:value keeps the factor name with its level
           "WANDB_TAGS": ",".join(f"{k}:{v}"[:64] for k, v in tags.items() if k != "study")}
    if "WANDB_MODE" not in os.environ:
        env["WANDB_MODE"] = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return env


def write_tensorboard_tags(run_dir: str | Path, meta: dict) -> None:
    """The run's tags as a text summary and as TensorBoard hparams (its HPARAMS tab filters by them)."""
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    from marin_ablate.marin.train.metrics import RUN_NAME_ENV, tensorboard_dir

    tags = run_tags(meta)
    with env_set({RUN_NAME_ENV: run_name(meta)} if run_name(meta) else {}):
        w = SummaryWriter(str(tensorboard_dir(Path(run_dir))))
    try:
        w.add_text("tags", "  \n".join(f"{k}: {v}" for k, v in tags.items()), 0)
        exp, ssi, sei = hparams(tags, {"loss": float("nan")})
        for s in (exp, ssi, sei):
            w.file_writer.add_summary(s)
    finally:
        w.close()


def log_locations(study_dir: str | Path, log_to: tuple[str, ...]) -> list[str]:
    """Where a study's TensorBoard and W&B logs are and how to look at or upload them (end of `run`)."""
    runs = Path(study_dir) / "runs"
    lines = []
    if "tensorboard" in log_to:
        lines.append(f"TensorBoard logs: {runs}/*/tensorboard; view them together with: tensorboard --logdir {runs}")
    if "wandb" in log_to:
        offline = sorted(runs.glob("*/wandb/offline-run-*"))
        if offline:
            lines.append(f"W&B offline runs: {len(offline)} under {runs}/*/wandb; upload them with: "
                         f"wandb sync {runs}/*/wandb/offline-run-*")
        else:
            lines.append(f"W&B runs: {runs}/*/wandb "
                         f"(synced online, project {os.environ.get('WANDB_PROJECT', 'marin-ablate')})")
    return lines


def default_retention(spec: Any) -> str:
    """What a study's completed run keeps by default: a GPU run its final checkpoint (its model is
    worth keeping); a CPU run none (3 MB of weights and optimizer state per run, while the study's
    result is its summaries and metrics; `--keep-checkpoints final|all` keeps them)."""
    return "none" if spec.train.device == "cpu" else "final"


def retention(spec: Any) -> str:
    """The checkpoint retention of a study's run: `run --keep-checkpoints` ($MARIN_KEEP_CHECKPOINTS), else
    `default_retention`; every rank of a distributed run must use the same (the final save is collective)."""
    return os.environ.get(KEEP_ENV) or default_retention(spec)


def tracked_train(spec: Any, run_dir: str | Path, resume: bool = True) -> dict:
    """marin_ablate.marin.train.train with the sinks of $MARIN_LOG_TO, grouped and tagged (module docstring)."""
    from marin_ablate.marin.train import train

    log_to = parse_log_to(os.environ.get(LOG_TO_ENV))
    keep = retention(spec)
    if not log_to:
        return train(spec, run_dir, resume=resume, keep_checkpoints=keep)
    meta = read_json(Path(run_dir) / "meta.json") or {}
    if "tensorboard" in log_to:
        write_tensorboard_tags(run_dir, meta)
    if "wandb" in log_to:
        _wandb_teardown()  # an earlier wandb run in this process (not tracked here) must not lend its settings
    from marin_ablate.marin.train.metrics import RUN_NAME_ENV

    named = {RUN_NAME_ENV: run_name(meta)} if run_name(meta) else {}
    with env_set({**named, **(wandb_env(meta) if "wandb" in log_to else {})}):
        try:
            return train(spec, run_dir, resume=resume, log_to=log_to, keep_checkpoints=keep)
        finally:
            if "wandb" in log_to:
                _wandb_teardown()


def _wandb_teardown() -> None:
    """wandb reads its WANDB_* settings once per process (at its first init); dropping them makes the
    next run read its own group and tags."""
    import wandb

    wandb.teardown()


def set_log_to(log_to: str | None, keep_checkpoints: str | None) -> None:
    """The metric sinks and checkpoint retention of a study's runs, in the environment the workers inherit; a sink
    whose package is missing is refused before any run is launched (it would fail every run)."""
    if keep_checkpoints is not None:
        os.environ[KEEP_ENV] = keep_checkpoints
    if log_to is not None:
        from marin_ablate.marin.train.metrics import check_log_to

        names = parse_log_to(log_to)
        check_log_to(names)
        os.environ[LOG_TO_ENV] = ",".join(names)
