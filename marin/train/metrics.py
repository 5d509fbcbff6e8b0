"""Metric sinks: metrics.jsonl (always), TensorBoard and W&B (optional extras).

metrics.jsonl holds one JSON object per line: a train line per logged step (`step` = the 0-based
index of the step whose loss it reports) and an eval line carrying `eval_*` (`step` = optimizer steps
done, 0 for the untrained model). Lines are appended; on resume the file is rebuilt from its complete,
valid lines up to the checkpoint's step, whatever state it is in (missing, truncated, NUL-padded,
non-UTF-8, garbage lines), so a damaged line never fails a run (docs/architecture.md §3).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

from marin_ablate.marin.config import RunSpec
from marin_ablate.marin.schema import atomic_write_text, loads_json

log = logging.getLogger("marin_ablate.marin.train")

LOG_TO = ("wandb", "tensorboard")
LOSS_CURVE_POINTS = 200


def _parse(line: bytes) -> dict | None:
    try:
        rec = loads_json(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec.get("step"), bool):
        return None
    return rec


def _complete_lines(path: Path) -> tuple[list[dict], int]:
    """(valid records of complete lines, number of lines dropped) of a metrics file; a last line
    without its newline is an unfinished write."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends in a newline
    parsed = [_parse(line) for line in lines if line.strip()]
    recs = [r for r in parsed if r is not None]
    return recs, len(parsed) - len(recs) + int(bool(tail.strip(b"\0 \t\r")))


def is_eval(rec: dict) -> bool:
    return "eval_macro_loss" in rec


class MetricsLog:
    """metrics.jsonl of one run: append a line, rebuild on resume, read back tolerant of damage. Every line
    names the run (`run_id`): a file copied from another run is told apart (marin.schema.foreign)."""

    def __init__(self, path: Path, run_id: str | None = None):
        self.path = path
        self.run_id = run_id

    def reset(self) -> None:
        atomic_write_text(self.path, "")

    def append(self, rec: dict) -> None:
        if self.run_id is not None:
            rec = {"run_id": self.run_id, **rec}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")

    def recover(self, step: int) -> None:
        """Keep the records written before a checkpoint at `step`: train lines of steps < step, eval
        lines of steps <= step (the eval at a checkpoint's step precedes it); drop everything else."""
        recs, bad = _complete_lines(self.path)
        keep = [r for r in recs if (r["step"] <= step if is_eval(r) else r["step"] < step)]
        dropped = bad + len(recs) - len(keep)
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))
        if dropped:
            log.info("metrics.jsonl: kept %d lines up to step %d, dropped %d (after the checkpoint or damaged)",
                     len(keep), step, dropped)

    def records(self) -> list[dict]:
        return _complete_lines(self.path)[0]

    def loss_curve(self, n: int = LOSS_CURVE_POINTS) -> list[list]:
        curve = [[r["step"], r["loss"]] for r in self.records() if "loss" in r and not is_eval(r)]
        if len(curve) <= n:
            return curve
        idx = sorted({round(i * (len(curve) - 1) / (n - 1)) for i in range(n)})
        return [curve[i] for i in idx]


#: sink -> the modules it imports (all must import here) and the pip extra that installs them
SINK_MODULES = {"wandb": ("wandb",), "tensorboard": ("tensorboard", "torch.utils.tensorboard")}


def check_log_to(log_to: tuple[str, ...]) -> None:
    """ValueError naming the sink and its pip extra unless every sink's modules import (installed and
    working: a broken install fails here, before any run is launched, not in every run)."""
    for name in log_to:
        if name not in LOG_TO:
            raise ValueError(f"log_to={name!r} is not a known sink; allowed values: {', '.join(LOG_TO)}")
        if name == "wandb" and os.environ.get("WANDB_MODE") == "online" and not _wandb_key():
            raise ValueError("--log-to wandb with WANDB_MODE=online needs an API key, and none is set (WANDB_API_KEY, "
                             "or `wandb login`); allowed values: set WANDB_API_KEY, or WANDB_MODE=offline (sync later)")
        for module in SINK_MODULES[name]:
            try:
                importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - any failure to import means the sink cannot work
                raise ValueError(f"--log-to {name} needs the '{name}' extra, and {module} does not import here "
                                 f"({type(e).__name__}: {e}); "
                                 f"install it with: pip install 'marin-ablate[{name}]'") from None


RUN_NAME_ENV = "MARIN_RUN_NAME"  # a study's "study/rung/arm/seedN" (sweeps/tracking.py); a lone run: its id


def tensorboard_dir(run_dir: Path) -> Path:
    """run_dir/tensorboard, or under it a folder named like the run ($MARIN_RUN_NAME): TensorBoard names a
    run by its path, so a study's runs read study_rung_arm_seedN there, not a hex id alone."""
    name = os.environ.get(RUN_NAME_ENV)
    return run_dir / "tensorboard" / name.replace("/", "_") if name else run_dir / "tensorboard"


def _wandb_key() -> bool:
    """An API key wandb would find: WANDB_API_KEY, or the netrc entry `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class Sinks:
    def __init__(self, log_to: tuple[str, ...], run_dir: Path, spec: RunSpec):
        self.tb = self.wandb = None
        for name in log_to:
            if name not in LOG_TO:
                raise ValueError(f"log_to={name!r} is not a known sink; allowed values: {', '.join(LOG_TO)}")
        if "tensorboard" in log_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ValueError("log_to=tensorboard needs the 'tensorboard' extra: "
                                 "pip install marin-ablate[tensorboard]") from e
            self.tb = SummaryWriter(str(tensorboard_dir(run_dir)))
        if "wandb" in log_to:
            try:
                import wandb
            except ImportError as e:
                raise ValueError("log_to=wandb needs the 'wandb' extra: pip install marin-ablate[wandb]") from e
            os.environ.setdefault("WANDB_MODE", "offline")
            self.wandb = wandb.init(dir=str(run_dir), name=os.environ.get(RUN_NAME_ENV) or spec.run_id,
                                    id=spec.run_id, resume="allow",
                                    config=spec.to_dict())

    def log(self, rec: dict) -> None:
        flat = {k: v for k, v in rec.items() if isinstance(v, (int, float)) and v is not None and k != "step"}
        for k, v in rec.items():
            if isinstance(v, dict):
                flat.update({f"{k}/{kk}": vv for kk, vv in v.items() if isinstance(vv, (int, float))})
        if self.tb is not None:
            for k, v in flat.items():
                self.tb.add_scalar(k, v, rec["step"])
        if self.wandb is not None:
            self.wandb.log(flat, step=rec["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

