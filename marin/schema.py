"""The run directory's files, one writer and one reader each: spec.json, meta.json, summary.json.

spec.json (the RunSpec, `spec_json`, written before launch), meta.json (`RunMeta`: the run's place in its
study and its coding: for every factor the level, its definition (field, low −1, high +1) and the ±1 code;
the analysis reads factors from here, never from a list) and summary.json (`RunSummary`: the outcome of
training or of a failure); the table of docs/architecture.md §3.

Writes are atomic (temp file, fsync, rename). Pure Python: no torch, no other marin module, so the
analysis layer can read runs with it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

# ---- Atomic files --------------------------------------------------------------------------------

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then os.replace: a reader sees the old
    file or the new one, never a torn one (also on NFS, where rename is atomic per directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; run files are for every reader
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename is None:  # name the file
            raise OSError(errno.ENOSPC, "disk full (no space left on device); free space there and run again",
                          str(path)) from e
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (manifests and checkpoint side files record it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


class DamagedFile(ValueError):
    """A run file exists but cannot be read as a JSON object (torn, foreign or corrupted)."""


#: Bounds on every JSON text the harness reads (run files, manifests, imports, metrics lines): past them
#: a file is refused with a message, never a traceback (Python's int-digit limit raises a bare
#: ValueError, deep nesting a RecursionError) and never a multi-minute parse.
JSON_MAX_BYTES = 256 << 20
JSON_MAX_INT_DIGITS = 100


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > JSON_MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits; allowed values: at most {JSON_MAX_INT_DIGITS} digits")
    return int(text)


def loads_json(text: str | bytes) -> Any:
    """json.loads with integers of at most JSON_MAX_INT_DIGITS digits and nesting Python can read;
    anything else is a ValueError with one line (json.JSONDecodeError is one too)."""
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError("nested too deeply (more levels than Python's recursion limit)") from None


def read_json_text(path: str | Path) -> Any:
    """The JSON value in the file at `path` (at most JSON_MAX_BYTES); ValueError naming nothing but the
    fault (callers name the file), FileNotFoundError when absent."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > JSON_MAX_BYTES:
            raise ValueError(f"{size:,} bytes; allowed values: at most {JSON_MAX_BYTES:,} bytes")
        raw = f.read()
    return loads_json(raw.decode("utf-8"))


def read_json(path: str | Path, *, strict: bool = False) -> dict | None:
    """The JSON object at `path`; None when absent. A damaged file reads as None (a torn write from a
    killed process that did not use atomic writes), or raises DamagedFile naming it when `strict`."""
    try:
        out = read_json_text(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if strict:
            raise DamagedFile(f"cannot read {path}: {e}") from None
        return None
    if not isinstance(out, dict):
        if strict:
            raise DamagedFile(f"cannot read {path}: a JSON object was expected, got {type(out).__name__}")
        return None
    return out


# ---- Run identity: a run id is one safe path component, and every file of a run folder names it ----

#: A run id or a study name: one path component every filesystem and shell takes as it is (no `.`, `..`,
#: separator, control character, leading dot or dash).
SAFE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SAFE_NAME_TEXT = ("1 to 128 letters, digits, '.', '_', '-', the first a letter or digit (one path component: no "
                  "'.', '..', '/', control character)")


def check_name(value: Any, what: str) -> str:
    """`value` when it is a safe path component (SAFE_NAME_RE), else ValueError naming `what`."""
    if not isinstance(value, str) or not SAFE_NAME_RE.fullmatch(value):
        raise ValueError(f"{what} {value!r}; allowed values: {SAFE_NAME_TEXT}")
    return value


def _first_line_json(path: Path) -> Any:
    """The JSON value on the first line of a file (at most 1 MiB read), None when absent or unreadable."""
    try:
        with open(path, "rb") as f:
            return loads_json(f.readline(1 << 20))
    except (OSError, ValueError):
        return None


def _named_id(path: Path, first_line: bool = False) -> Any:
    """The `run_id` a run file records (None: the file is absent, damaged or names none)."""
    d = _first_line_json(path) if first_line else read_json(path)
    return d.get("run_id") if isinstance(d, dict) else None


def _run_files(d: Path) -> list[str]:
    """The files of a run folder that name its run, those present."""
    files = ["spec.json", "meta.json", "summary.json", "metrics.jsonl"]
    files += [str(p.relative_to(d)) for p in sorted(d.glob("checkpoints/ckpt_*/meta.json"))]
    return [f for f in files if (d / f).exists() or (d / f).is_symlink()]


def named_ids(run_dir: str | Path) -> dict[str, Any]:
    """{file: the run id it names} over the run folder's files that name one (metrics.jsonl: its first line)."""
    d = Path(run_dir)
    ids = {f: _named_id(d / f, first_line=f == "metrics.jsonl") for f in _run_files(d)}
    return {f: rid for f, rid in ids.items() if rid is not None}


def foreign(run_dir: str | Path, runs_root: str | Path) -> str | None:
    """Why the folder `runs_root/NAME` is not run NAME of this study, in one line naming the file and both
    ids; None when it is. It is not when it resolves outside `runs_root` (a symbolic link to another study's
    run, or to another folder here), when one of its files resolves outside it, or when spec.json,
    meta.json, summary.json, metrics.jsonl or a checkpoint's meta.json names another run id."""
    d, root = Path(run_dir), Path(runs_root)
    name, rel = d.name, f"runs/{d.name}"
    real = d.resolve()
    if real.parent != root.resolve() or real.name != name:
        return (f"{rel} resolves to {real}, outside this study's runs/ (a symbolic link): another study's run is "
                "not pooled; copy the run folder in, or remove the link")
    for f in _run_files(d):
        p = d / f
        if p.is_symlink() or p.resolve().parent != (real / f).parent:
            return (f"{rel}/{f} resolves to {p.resolve()}, outside {rel} (a symbolic link): a run folder holds its "
                    "own files; copy the file in, or remove the link")
    for f, other in named_ids(d).items():
        if other != name:
            return (f"{rel}/{f} names run {other!r}, not {name!r} (the folder's): a file of another run, left out; "
                    "move it back to runs/" + (other if isinstance(other, str) and SAFE_NAME_RE.fullmatch(other)
                                              else "ITS_RUN") + " or remove it")
    return None


# ---- spec.json -----------------------------------------------------------------------------------


def spec_json(spec: Any) -> str:
    """The one spec.json text of a RunSpec (or of its dict), used by sweeps and train alike; a RunSpec's
    names its run id too (`foreign` compares it with the folder's)."""
    d = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)
    if hasattr(spec, "run_id"):
        d["run_id"] = spec.run_id
    return json.dumps(d, indent=1, sort_keys=True)


def write_spec(run_dir: str | Path, spec: Any) -> None:
    atomic_write_text(Path(run_dir) / "spec.json", spec_json(spec))


# ---- meta.json: the run's place in its study and its coding --------------------------------------


def seed_offset(seed_stream: int) -> int:
    """Added to the model and data seeds: a large odd stride keeps streams apart from seed replicates."""
    return 1_000_003 * int(seed_stream)


def random_stream(spec: Mapping) -> str | None:
    """A run's random stream from its spec.json: the effective init seed and data order (data seed,
    corpus, tokenizer). The arms of one seed share it (common random numbers), so the noise it
    carries cancels in a contrast between arms unless a factor changes it (docs/method.md §4.4)."""
    if "seed" not in spec:
        return None
    data = spec.get("data") or {}
    off = seed_offset((spec.get("train") or {}).get("seed_stream", 0))
    return (f"init {int(spec['seed']) + off} | data {int(data.get('data_seed', 0)) + off} {data.get('corpus')} "
            f"{data.get('tokenizer')}")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    """An integer, or a float holding one (JSON writers may give 1.6e9 for 1600000000)."""
    return is_number(v) and (isinstance(v, int) or math.isfinite(v) and float(v).is_integer())


#: annotation text -> (check, allowed text): the types summary.json and meta.json fields are read as
_TYPES: dict[str, tuple] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "str | None": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "int": (_int, "an integer"),
    "int | None": (lambda v: v is None or _int(v), "an integer or null"),
    "float | None": (lambda v: v is None or is_number(v), "a number or null"),
    "Mapping[str, float] | None": (lambda v: v is None or (isinstance(v, dict) and all(
        isinstance(k, str) and (x is None or is_number(x)) for k, x in v.items())), "an object of numbers or null"),
    "tuple[int, ...]": (lambda v: isinstance(v, (list, tuple)) and all(map(_int, v)), "a list of integers"),
    "tuple": (lambda v: isinstance(v, (list, tuple)) and all(
        isinstance(x, (list, tuple)) and len(x) == 2 and all(map(is_number, x)) for x in v),
        "a list of [step, value] pairs"),
}


def _check_types(cls: type, d: Mapping) -> None:
    """ValueError naming the first field of `d` whose value is not of its declared type."""
    for f in fields(cls):
        rule = _TYPES.get(str(f.type))
        if rule is not None and f.name in d and not rule[0](d[f.name]):
            raise ValueError(f"field {f.name!r} is {d[f.name]!r}; allowed values: {rule[1]}")


def _check_truth(name: str, t: Any) -> None:
    if t is None:
        return
    if not isinstance(t, dict) or not set(t) <= set(TRUTH_KEYS) or not all(
            is_number(v) and math.isfinite(v) and v > 0 for v in t.values()):
        raise ValueError(f"coding.{name}.truth is {t!r}; allowed values: an object of {', '.join(TRUTH_KEYS)} "
                         "-> a finite number > 0 (a planted multiplier)")


#: What a planted factor may declare as its true effect (docs/calibration/): the quality multiplier
#: M_flop and the throughput ratio R of its high level over its low level.
TRUTH_KEYS = ("M_flop", "R")


@dataclass(frozen=True)
class FactorCoding:
    """One factor of a run: its definition (field, low −1, high +1), the run's level and, for a
    planted factor of known effect, its true multipliers ({"M_flop": ..., "R": ...})."""

    name: str
    level: str
    field: str | None = None
    low: str | None = None
    high: str | None = None
    truth: Mapping[str, float] | None = None
    regime: bool = False  # a condition (e.g. tokens per parameter) the report shows each component under
    values: Mapping[str, Any] | None = None  # level name -> the config value it sets (checked against spec.json)

    @property
    def code(self) -> int | None:
        """−1 at the low level, +1 at the high level, None at any other (extra) level."""
        return -1 if self.level == self.low else 1 if self.level == self.high else None

    def to_dict(self) -> dict:
        d = {"field": self.field, "low": self.low, "high": self.high, "code": self.code}
        if self.truth:
            d["truth"] = dict(self.truth)
        if self.regime:
            d["regime"] = True
        if self.values:
            d["values"] = dict(self.values)
        return d


@dataclass(frozen=True)
class RunMeta:
    """meta.json. `extra` keeps any other key (e.g. a tuning run's multiplier) through a round trip."""

    study: str | None = None
    rung: str | None = None
    arm: str | None = None
    seed: int | None = None
    design_row: int | None = None
    factors: tuple[FactorCoding, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def levels(self) -> dict[str, str]:
        return {f.name: f.level for f in self.factors}

    @property
    def codes(self) -> dict[str, int | None]:
        return {f.name: f.code for f in self.factors}

    def to_dict(self) -> dict:
        out = dict(self.extra)
        out.update(study=self.study, rung=self.rung, arm=self.arm, seed=self.seed, design_row=self.design_row,
                   factors=self.levels, coding={f.name: f.to_dict() for f in self.factors})
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "RunMeta":
        """Reads this schema; a meta.json without `coding` (older runs) gives factors with no definition."""
        _check_types(cls, d)
        coding = d.get("coding") or {}
        if not isinstance(d.get("factors") or {}, dict) or not isinstance(coding, dict):
            raise ValueError("fields 'factors' and 'coding' must be objects keyed by factor name")
        factors = []
        for name, level in (d.get("factors") or {}).items():
            c = coding.get(name) or {}
            if not isinstance(level, str) or not isinstance(c, dict):
                raise ValueError(f"factor {name!r}: its level must be a string and its coding an object")
            _check_truth(name, c.get("truth"))
            values = c.get("values")
            if values is not None and (not isinstance(values, dict)
                                       or not set(values) <= {c.get("low"), c.get("high")}):
                raise ValueError(f"coding.{name}.values is {values!r}; allowed values: an object of its low and high "
                                 "level -> the config value each sets")
            f = FactorCoding(name, level, c.get("field"), c.get("low"), c.get("high"), c.get("truth"),
                             c.get("regime") is True, values)
            if "code" in c and c["code"] != f.code:  # the file contradicts itself: which half is right is unknown
                raise ValueError(f"coding.{name}.code is {c['code']!r} but level {level!r} is coded {f.code!r} "
                                 f"(low {f.low!r}, high {f.high!r}); allowed values: a code that matches the level")
            factors.append(f)
        known = {"study", "rung", "arm", "seed", "design_row", "factors", "coding"}
        return cls(d.get("study"), d.get("rung"), d.get("arm"), d.get("seed"), d.get("design_row"), tuple(factors),
                   {k: v for k, v in d.items() if k not in known})


def write_meta(run_dir: str | Path, meta: RunMeta | Mapping) -> None:
    """meta.json, keys in insertion order: the factors keep the study's order (the analysis's order)."""
    d = meta.to_dict() if isinstance(meta, RunMeta) else dict(meta)
    atomic_write_text(Path(run_dir) / "meta.json", json.dumps(d, indent=1) + "\n")


def read_meta(run_dir: str | Path, *, strict: bool = False) -> RunMeta | None:
    path = Path(run_dir) / "meta.json"
    d = read_json(path, strict=strict)
    return None if d is None else _parsed(RunMeta, d, path, strict)


def _parsed(cls: Any, d: Mapping, path: Path, strict: bool) -> Any:
    """cls.from_dict(d); a wrongly typed field reads as none, or (`strict`) DamagedFile naming the file."""
    try:
        return cls.from_dict(d)
    except (ValueError, TypeError) as e:
        if strict:
            raise DamagedFile(f"cannot read {path}: {e}") from None
        return None


# ---- summary.json: the outcome of a run ----------------------------------------------------------

RUN_STATUSES = ("completed", "failed")


@dataclass(frozen=True)
class RunSummary:
    """summary.json. Every key below is always written (None when unknown); `extra` keeps any other
    key the trainer adds (peak LRs, per-domain bits per byte, ...)."""

    run_id: str
    status: str
    error: str | None = None
    failed_step: int | None = None
    step: int | None = None
    tokens: int | None = None
    params_total: int | None = None
    params_active: int | None = None
    flops_per_token: float | None = None
    train_flops: float | None = None
    eval_macro_loss: float | None = None
    eval_domain_loss: Mapping[str, float] | None = None
    macro_bpb: float | None = None
    final_train_loss: float | None = None
    tokens_per_s: float | None = None
    model_flops_per_s: float | None = None
    mfu: float | None = None
    drop_rate: float | None = None
    max_grad_norm: float | None = None
    spikes: int = 0
    spike_steps: tuple[int, ...] = ()
    wall_s: float | None = None
    hardware: str | None = None
    code_version: str | None = None
    loss_curve: tuple = ()
    started_at: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"RunSummary.status={self.status!r} is not a known level; allowed values: "
                             f"{', '.join(RUN_STATUSES)}")

    def to_dict(self) -> dict:
        out = dict(self.extra)
        for f in fields(self):
            if f.name != "extra":
                v = getattr(self, f.name)
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "RunSummary":
        _check_types(cls, d)
        names = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("spike_steps", "loss_curve"):
            if kw.get(k) is not None:
                kw[k] = tuple(tuple(x) if isinstance(x, list) else x for x in kw[k])
            else:
                kw.pop(k, None)
        if kw.get("spikes") is None:
            kw.pop("spikes", None)
        kw.setdefault("run_id", "")
        kw.setdefault("status", "completed")
        return cls(**kw, extra={k: v for k, v in d.items() if k not in names})


SUMMARY_KEYS: tuple[str, ...] = tuple(f.name for f in fields(RunSummary) if f.name != "extra")


def write_summary(run_dir: str | Path, summary: RunSummary | Mapping) -> RunSummary:
    """Write summary.json atomically (a dict, e.g. the trainer's, is validated through RunSummary)."""
    s = summary if isinstance(summary, RunSummary) else RunSummary.from_dict(summary)
    atomic_write_text(Path(run_dir) / "summary.json", json.dumps(s.to_dict(), indent=1) + "\n")
    return s


def read_summary(run_dir: str | Path, *, strict: bool = False) -> RunSummary | None:
    """The run's summary, or None when absent or torn (`strict`: DamagedFile when torn); accepts any
    summary dict train has written."""
    path = Path(run_dir) / "summary.json"
    d = read_json(path, strict=strict)
    if d is not None and strict and "status" in d and d["status"] not in RUN_STATUSES:  # a verdict nobody wrote
        raise DamagedFile(f"cannot read {path}: status {d['status']!r} is not a known level; allowed values: "
                          f"{', '.join(RUN_STATUSES)}")
    if d is None or d.get("status") not in RUN_STATUSES:
        return None
    return _parsed(RunSummary, d, path, strict)
