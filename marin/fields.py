"""Field helpers of the configuration dataclasses (marin/config.py): range rules checked in every
__post_init__, so `train`, `run`, `run --tune` and `plan` reject the same values with the same message, and
the `--section.field=value` overrides parsed by each field's type, and the dataclasses as plain dicts
(`to_dict`, and `non_default`: what a run id hashes). The validation helpers (`check`,
`check_level`, `is_int`, `is_num`) are public: marin/config.py and marin/phases.py raise with them.
Torch-free, like marin/config.py."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import fields, replace
from typing import Any, Mapping, Sequence

# ---- Validation helpers --------------------------------------------------------------------------


def check_level(owner: str, name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name}={value!r} is not a known level; "
                         f"allowed values: {', '.join(map(repr, allowed))}")


def check(cond: bool, owner: str, name: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{owner}.{name}: {msg}")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Range rules: (predicate, allowed-range text). A field's rule is checked in every __post_init__ below,
# so `train`, `run`, `run --tune` and `plan` reject the same values with the same message.
#: The largest integer a setting holds: what torch and numpy index with (int64); past it a count becomes a float
#: overflow or a loop without end somewhere downstream, never a result
INT_MAX = 2**63 - 1
POS_INT = (lambda v: is_int(v) and 1 <= v <= INT_MAX, "an integer >= 1 (below 2**63)")
NONNEG_INT = (lambda v: is_int(v) and 0 <= v <= INT_MAX, "an integer >= 0 (0 turns it off; below 2**63)")


def int_in(lo: int, hi: int, why: str = "") -> tuple:
    """The range rule of an integer in lo..hi (`why`: what the bound is, in a few words)."""
    return (lambda v: is_int(v) and lo <= v <= hi, f"an integer in {lo}..{hi:,}" + (f" ({why})" if why else ""))


POS = (lambda v: is_num(v) and v > 0, "a finite number > 0")
NONNEG = (lambda v: is_num(v) and v >= 0, "a finite number >= 0")
# an MoE capacity factor: slots per expert over the even share; past the largest expert count any
# token fits, and a huge one overflows the slot count
CAPACITY = (lambda v: is_num(v) and 0 < v <= 1024, "a number in (0, 1024]")
FRAC = (lambda v: is_num(v) and 0 <= v <= 1, "a number in [0, 1]")
MOMENTUM = (lambda v: is_num(v) and 0 <= v < 1, "a number in [0, 1)")
SEED = (lambda v: is_int(v) and 0 <= v < 2**64, "an integer in [0, 2**64)")  # torch.manual_seed's range


def optional(rule: tuple) -> tuple:
    pred, text = rule
    return (lambda v: v is None or pred(v), f"None or {text}")


def check_ranges(owner: str, obj: Any, rules: Mapping[str, tuple]) -> None:
    for name, (pred, text) in rules.items():
        v = getattr(obj, name)
        if not pred(v):
            raise ValueError(f"{owner}.{name}={v!r} is out of range; allowed values: {text}")


# ---- --section.field=value overrides -------------------------------------------------------------


def apply_overrides(cfg: Any, overrides: Mapping[str, str] | list[str]) -> Any:
    """Apply `field=value` strings (or a mapping) to a frozen dataclass, parsing by the field's type."""
    if isinstance(overrides, list):
        bad = next((item for item in overrides if "=" not in item), None)
        if bad is not None:
            raise ValueError(f"override {bad!r} must look like field=value")
        overrides = {k.strip(): v.strip() for k, v in (item.split("=", 1) for item in overrides)}
    names = {f.name: f for f in fields(cfg)}
    changes = {}
    for k, v in overrides.items():
        if k not in names:
            raise ValueError(f"{type(cfg).__name__} has no field {k!r}; allowed values: {', '.join(sorted(names))}")
        cur = getattr(cfg, k)
        where = f"{type(cfg).__name__}.{k}"
        rule = getattr(cfg, "RANGES", {}).get(k)
        changes[k] = (_parse_like(cur, v, where, str(names[k].type), rule[1] if rule else "") if isinstance(v, str)
                      else v)
    return replace(cfg, **changes)


def _parse_like(cur: Any, v: str, where: str, annotation: str = "", allowed: str = "") -> Any:
    """Parse `v` like the field's current value; an unset optional field parses by its annotation. A value that
    does not parse names `allowed` (the field's range text), else its type's."""
    if cur is None:
        if v.lower() in ("none", "null"):
            return None
        cur = {"int": 0, "float": 0.0, "str": "", "bool": False}.get(annotation.split("|")[0].strip(), 0.0)
    try:
        if isinstance(cur, bool):
            if v.lower() in ("1", "true", "yes", "on"):
                return True
            if v.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(cur, int):
            return int(v)
        if isinstance(cur, float):
            return float(v)
        if isinstance(cur, tuple):
            return tuple(x for x in v.split(",") if x)
        return v
    except ValueError:
        kind = type(cur).__name__
        allowed = allowed or {"int": "an integer", "float": "a finite number", "bool": "true or false"}.get(kind, kind)
        raise ValueError(f"{where}: cannot parse {v!r} as {kind}; allowed values: {allowed}") from None


#: The sections of a run's spec that `--section.field=value` reaches (marin.config.RunSpec).
SPEC_SECTIONS = ("model", "train", "data", "recipe")


def split_overrides(items: Sequence[str], sections: Sequence[str] = SPEC_SECTIONS) -> dict[str, list[str]]:
    """`section.field=value` items (`--section.field=value` flags) by section, the one syntax of describe,
    train, plan, run and tune; a bare `field=value` is `model.field=value`. A section the command cannot use is
    refused."""
    out: dict[str, list[str]] = {s: [] for s in SPEC_SECTIONS}
    for item in items:
        key, eq, value = item.partition("=")
        section, dot, name = key.strip().rpartition(".")
        section = section if dot else "model"
        if not eq or not name or section not in sections:
            raise ValueError(f"override {item!r} must look like section.field=value; allowed sections: "
                             f"{', '.join(sections)} (a bare field=value is model.field)")
        out[section].append(f"{name}={value}")
    return out


def to_dict(obj: Any) -> Any:
    """Dataclasses to plain JSON-able dicts (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    return obj


_DEFAULTS: dict[tuple[type, str], tuple[Any, Any]] = {}  # (class, field) -> (default, its to_dict), built once


def _default(cls: type, f: dataclasses.Field) -> tuple[Any, Any]:
    """A field's default and its plain dict, made once per class and field: a run id hashes every field's distance
    from its default, and building a default config (with its checks) per run made planning 48,000 runs take 45 s."""
    key = (cls, f.name)
    if key not in _DEFAULTS:
        missing = dataclasses.MISSING
        default = f.default if f.default is not missing else (
            f.default_factory() if f.default_factory is not missing else missing)
        _DEFAULTS[key] = (default, to_dict(default) if default is not missing else None)
    return _DEFAULTS[key]


_SCALARS = (str, int, float, bool, type(None))  # their plain dict is themselves


def non_default(obj: Any) -> dict:
    """The fields of a dataclass that differ from their defaults (nested dataclasses recursively)."""
    out = {}
    cls = type(obj)
    for f in fields(obj):
        v = getattr(obj, f.name)
        default, default_dict = _default(cls, f)
        if isinstance(v, _SCALARS) and default is not dataclasses.MISSING:
            if v != default_dict:
                out[f.name] = v
            continue
        if default is dataclasses.MISSING:
            out[f.name] = to_dict(v)
            continue
        if dataclasses.is_dataclass(v) and isinstance(v, type(default)):
            sub = non_default(v)
            if sub:
                out[f.name] = sub
        elif (d := to_dict(v)) != default_dict:
            out[f.name] = d
    return out


# ---- Options: a field's help, allowed values and range, on the field (the command line, marin_ablate/cli/parse.py)


def option(default: Any = dataclasses.MISSING, *, help: str = "", choices: Sequence | None = None,  # noqa: A002
           lo: float | None = None, hi: float | None = None, lo_open: bool = False, positional: bool = False,
           metavar: str | None = None, spec: Sequence[str] | None = None, inline: bool = False,
           section: Any = None, allowed: str | None = None, name: str | None = None, mode: bool = False,
           sections: Any = None) -> Any:
    """A dataclass field with its command-line description: `help`, `choices` (the allowed values),
    `lo`/`hi` (an inclusive range; `lo_open`: lo excluded), `positional` (an argument, not a flag),
    `spec` (the RunSpec sections `--SECTION.FIELD=VALUE` overrides reach: the field holds those
    items), `inline` (a nested options dataclass whose flags join this level's), `section` (the
    nested options dataclass, or a callable returning it, when the annotation cannot name it),
    `allowed` (the allowed values in words, when the range's own text reads worse), `name` (a
    section's flag name when the field's cannot be it: `import`), `mode` (a section that is one mode of
    its command: two modes at once are refused), `sections` (a callable returning {name: options
    dataclass}: one section per entry, known only when the parser is built: the executors' rows).
    `check_fields` checks the value against choices and range."""
    md = {"help": help, "choices": tuple(choices) if choices is not None else None, "lo": lo, "hi": hi,
          "lo_open": lo_open, "positional": positional, "metavar": metavar,
          "spec": tuple(spec) if spec is not None else None, "inline": inline, "section": section,
          "allowed": allowed, "name": name, "mode": mode, "sections": sections}
    if isinstance(default, (list, dict, set)):
        raise TypeError("option(): a mutable default; use a tuple")
    return dataclasses.field(default=default, metadata={"option": md})


def option_meta(f: dataclasses.Field) -> dict:
    """The option() description of a field ({} for a plain field)."""
    return dict(f.metadata.get("option", {}))


def base_type(f: dataclasses.Field) -> str:
    """The field's annotation without `| None`: 'int', 'float', 'str', 'bool', 'tuple' or a class name."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    parts = [p.strip() for p in t.replace("Optional[", "").rstrip("]").split("|") if p.strip() != "None"]
    name = parts[0] if parts else "str"
    return "tuple" if name.startswith(("tuple", "Tuple")) else name


def allowed_text(f: dataclasses.Field) -> str:
    """The allowed values of an option field, as the error and --help state them."""
    md, kind = option_meta(f), base_type(f)
    nullable = f.default is None
    if md.get("allowed"):
        text = md["allowed"]
    elif md.get("choices") is not None:
        text = ", ".join(map(str, md["choices"]))
    elif md.get("lo") is not None or md.get("hi") is not None:
        what = "an integer" if kind == "int" else "a finite number"
        lo, hi = md.get("lo"), md.get("hi")
        if lo is not None and hi is not None:
            text = f"{what} in {lo}..{hi}" if not md.get("lo_open") else f"{what} in ({lo}, {hi}]"
        elif lo is not None:
            text = f"{what} {'>' if md.get('lo_open') else '>='} {lo}"
        else:
            text = f"{what} <= {hi}"
    else:
        text = {"int": "an integer", "float": "a finite number", "bool": "true or false"}.get(kind, "")
    return f"None or {text}" if nullable and text else text


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a tab is text; a newline, CR or NUL never is in an option


def check_value(f: dataclasses.Field, value: Any, name: str) -> None:
    """ValueError naming `name` (the field or its flag), the value and the allowed values."""
    md, kind = option_meta(f), base_type(f)
    if value is None and f.default is None:
        return
    for text in (value if isinstance(value, tuple) else (value,)):
        if isinstance(text, str) and _CONTROL.search(text):  # a newline in an sbatch field ends its line there
            raise ValueError(f"{name}={value!r} holds a control character ({_CONTROL.search(text).group()!r}); allowed "
                             "values: one line of printable text")
    ok = True
    if md.get("choices") is not None:
        ok = value in md["choices"]
    elif kind == "int":
        ok = is_int(value)
    elif kind == "float":
        ok = is_num(value)
    if ok and (md.get("lo") is not None or md.get("hi") is not None):
        lo, hi = md.get("lo"), md.get("hi")
        ok = is_num(value) and (lo is None or (value > lo if md.get("lo_open") else value >= lo)) \
            and (hi is None or value <= hi)
    if not ok:
        what = "is not one of the allowed values" if md.get("choices") is not None else "is out of range"
        raise ValueError(f"{name}={value!r} {what}; allowed values: {allowed_text(f)}")


def check_fields(obj: Any, owner: str | None = None) -> None:
    """Check every option() field of a dataclass against its choices and range (nested option
    dataclasses too); the error names `owner.field` (owner: the class name unless given)."""
    owner = type(obj).__name__ if owner is None else owner
    for f in fields(obj):
        if "option" not in f.metadata:
            continue
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            check_fields(v, owner if option_meta(f).get("inline") else f"{owner}.{f.name}")
        else:
            check_value(f, v, f"{owner}.{f.name}")
