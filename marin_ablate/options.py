"""The command line as one typed config tree: each command's options are a dataclass (its fields made
with `marin.fields.option`: help, choices, range), and this walker over `dataclasses.fields` turns
it into argparse flags and the parsed arguments back into the dataclass.

    a field                      --name-with-dashes VALUE   (a bool: a switch; a tuple: repeatable)
    a positional field           NAME
    a nested options dataclass   --section.field VALUE      (the section with dashes, the field as spelled:
                                 --dry-run.capacity_gib 80); `--section` alone, or any of its options,
                                 turns the section (a mode) on; two `mode` sections at once are refused
    a table of sections          one section per row        (the executors' `options`: --slurm.time_min 30)
    an inline dataclass          its fields at this level   (the execution options of plan and run)
    a spec field                 --model.F=V --train.F=V --data.F=V --recipe.F=V (the RunSpec's fields)

`parse(cls, argv)` refuses an old spelling first (`RENAMED`: one table; a section spelled with
underscores, `--dry_run`, is refused naming `--dry-run`), then parses, checks every
value against its field's choices and range (`marin.fields.check_fields`'s rule), and returns an
instance of `cls`. A bad option raises ValueError naming the flag and the allowed values (exit 2,
marin_ablate/main.py), before any work. Every option's default is shown in `--help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any, Sequence, TypeVar

from marin_ablate.marin.fields import SPEC_SECTIONS, allowed_text, base_type, check_value, option_meta

T = TypeVar("T")

_NOT_GIVEN = object()
SPEC_FLAGS = {s: f"--{s}.F=V" for s in SPEC_SECTIONS}

#: Old spelling -> the new one (a dict: per command). Refused with exit 2 before anything runs.
_SLURM = ("partition", "account", "qos", "time_min", "gpus_per_run", "cpus_per_task", "mem_gb",
          "array_parallelism", "constraint", "exclude", "setup", "signal_delay_s")
RENAMED: dict[str, str | dict[str, str]] = {
    "--set": "--model.F=V, --train.F=V, --data.F=V or --recipe.F=V (one flag per field)",
    "--train-set": "--train.F=V",
    "--data-set": "--data.F=V",
    "--recipe": {"train": "--recipe.FACTOR=LEVEL, or --baseline for Recipe.baseline()",
                 "*": "--recipe.FACTOR=LEVEL"},
    "--steps": "--train.steps=N",
    "--out": {"train": "--run-dir", "analyze": "--report-dir (the report) or --study-dir (--import.table, --forecast)",
              "data": "--corpus-dir"},
    **{f"--{s.replace('_', '-')}": f"--slurm.{s}" for s in _SLURM},
    "--gpus": "--dry-run.gpus", "--ep": "--dry-run.ep", "--capacity-gib": "--dry-run.capacity_gib",
    "--reserve-gib": "--dry-run.reserve_gib",
    "--noise": "--precision.noise", "--target-halfwidth": "--precision.target_halfwidth",
    "--points": {"run": "--tune.points"}, "--span": {"run": "--tune.span"}, "--storage": {"run": "--tune.storage"},
    "--arm": {"analyze": "--forecast.arm"}, "--note": {"analyze": "--forecast.note"},
}


def refuse_renamed(argv: Sequence[str], command: str) -> None:
    """ValueError naming the new spelling of the first old flag in `argv` (after `--`: not a flag)."""
    for tok in argv:
        if tok == "--":
            return
        flag = tok.split("=", 1)[0]
        new = RENAMED.get(flag)
        if isinstance(new, dict):
            new = new.get(command, new.get("*"))
        if new is not None:
            raise ValueError(f"{flag} was renamed; use {new} (docs/cli.md)")


def _dashed(prefix: str) -> str:
    """A dest prefix (section names and dots: `dry_run.`) as its flag spells it (`dry-run.`)."""
    return prefix.replace("_", "-")


def _flag(name: str, prefix: str) -> str:
    return f"--{_dashed(prefix)}{name}" if prefix else f"--{name.replace('_', '-')}"


def _section_type(f: dataclasses.Field) -> type | None:
    sec = option_meta(f).get("section")
    if sec is not None:
        return sec() if not isinstance(sec, type) else sec
    return None


def _section_name(f: dataclasses.Field) -> str:
    return option_meta(f).get("name") or f.name


def _sections_of(f: dataclasses.Field) -> dict[str, type]:
    """A table-of-sections field's rows: {section name: options dataclass}."""
    return dict(option_meta(f)["sections"]())


def _walk(cls: type, prefix: str = ""):
    """(field, flag, kind) per option of `cls`: kind 'value', 'positional', 'spec', 'section', 'sections'
    (a table of sections: extra is {name: options dataclass}) or 'inline'."""
    for f in dataclasses.fields(cls):
        md = option_meta(f)
        if not md:
            continue
        sec = _section_type(f)
        if md.get("sections") is not None:
            yield f, _sections_of(f), "sections"
        elif sec is not None:
            yield f, sec, "inline" if md.get("inline") else "section"
        elif md.get("spec") is not None:
            yield f, None, "spec"
        elif md.get("positional"):
            yield f, f.name, "positional"
        else:
            yield f, _flag(f.name, prefix), "value"


def _default_text(f: dataclasses.Field) -> str:
    d = f.default
    if d is dataclasses.MISSING:
        return "required"
    if d == () or d is None or d == "":
        return "default: none" if d is None else "default: empty"
    return f"default: {d}"


def _help(f: dataclasses.Field) -> str:
    md = option_meta(f)
    allowed = allowed_text(f) if md.get("choices") is not None or md.get("lo") is not None else ""
    bits = [md.get("help", "").replace("%", "%%")]
    if allowed:
        bits.append(f"allowed: {allowed}")
    bits.append(_default_text(f))
    return "; ".join(b for b in bits if b)


def _add(parser: argparse.ArgumentParser, cls: type, prefix: str, dests: dict) -> None:
    """The flags of `cls`'s fields on `parser`; `dests` maps each argparse dest to (path, field)."""
    for f, extra, kind in _walk(cls, prefix):
        md = option_meta(f)
        if kind == "inline":
            _add(parser, extra, prefix, dests)
            continue
        if kind in ("section", "sections"):
            rows = extra if kind == "sections" else {_section_name(f): extra}
            for sname, scls in rows.items():
                name, flag = f"{prefix}{sname}", f"--{_dashed(prefix + sname)}"
                what = " ".join((md.get("help") or "").format(name=sname).split())  # a docstring: one paragraph
                if kind == "sections":  # a row's own doc first
                    what = f"{' '.join((scls.__doc__ or sname).split())} ({what})"
                g = parser.add_argument_group(flag, what + f" (`{flag}` alone, or any {flag}.X, turns it on)")
                dests[f"S:{name}"] = (name, f)
                g.add_argument(flag, dest=f"S:{name}", action="store_true", default=_NOT_GIVEN,
                               help=f"turn {flag[2:]} on with the defaults below")
                _add(g, scls, f"{name}.", dests)
            continue
        if kind == "spec":
            continue  # taken out of argv before argparse (spec_overrides)
        dest = f"{prefix}{f.name}"
        dests[dest] = (dest, f)
        kw: dict[str, Any] = {"help": _help(f), "default": _NOT_GIVEN}
        t = base_type(f)
        if kind == "positional":
            kw.pop("default")
            if f.default is not dataclasses.MISSING:
                kw.update(nargs="?", default=f.default)
            parser.add_argument(dest, metavar=md.get("metavar") or f.name.upper(), **kw)
            continue
        if f.default is dataclasses.MISSING:
            kw.update(required=True)
            kw.pop("default")
        if t == "bool":
            kw["action"] = "store_true"
        elif t == "tuple":  # append needs a list default: None stands for "not given"
            kw.update(action="append", default=None, metavar=md.get("metavar") or "VALUE")
        else:
            kw.update(type={"int": int, "float": float}.get(t, str), metavar=md.get("metavar") or t.upper())
        parser.add_argument(extra, dest=dest, **kw)


def _build(cls: type, ns: dict, prefix: str, given: set[str], spec_items: list[str]) -> Any:
    """An instance of `cls` from the parsed values (a section: None unless one of its options was given;
    a table of sections: the (name, options) pairs of those given). Two modes at once: ValueError."""
    kw, modes = {}, []

    def on(name: str) -> bool:
        return ns.get(f"S:{name}") is True or any(g.startswith(f"{name}.") for g in given)

    for f, extra, kind in _walk(cls, prefix):
        if kind == "inline":
            kw[f.name] = _build(extra, ns, prefix, given, spec_items)
        elif kind == "section":
            name = f"{prefix}{_section_name(f)}"
            kw[f.name] = _build(extra, ns, f"{name}.", given, spec_items) if on(name) else f.default
            if on(name) and option_meta(f).get("mode"):
                modes.append(f"--{_dashed(name)}")
        elif kind == "sections":
            kw[f.name] = tuple((n, _build(c, ns, f"{prefix}{n}.", given, spec_items)) for n, c in extra.items()
                               if on(f"{prefix}{n}"))
        elif kind == "spec":
            kw[f.name] = tuple(spec_items)
        else:
            dest = f"{prefix}{f.name}"
            v = ns.get(dest, _NOT_GIVEN)
            if v is _NOT_GIVEN or v is None:
                continue  # the field's default
            if base_type(f) == "tuple":
                v = tuple(v)
            check_value(f, v, dest if kind == "positional" else _flag(f.name, prefix))
            kw[f.name] = v
    if len(modes) > 1:
        raise ValueError(f"{' and '.join(modes)} are two modes of {getattr(cls, 'command', 'this command')}; "
                         f"allowed: one of them")
    return cls(**kw)


def _spec_field(cls: type) -> dataclasses.Field | None:
    for f, _, kind in _walk(cls):
        if kind == "spec":
            return f
        if kind == "inline":
            got = _spec_field(_section_type(f))
            if got is not None:
                return got
    return None


_SPEC_RE = re.compile(r"^--(model|train|data|recipe)\.([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$", re.S)


def spec_overrides(argv: list[str], sections: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the rest of argv, `section.field=value` items) from the `--section.field=value` (or
    `--section.field value`) tokens; an unknown section or field is refused naming the allowed ones."""
    from marin_ablate.marin.config import DataConfig, ModelConfig, Recipe, TrainConfig

    classes = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "recipe": Recipe}
    rest, items, i = [], [], 0
    while i < len(argv):
        tok = argv[i]
        m = _SPEC_RE.match(tok) if tok.startswith("--") else None
        if tok == "--":
            rest += argv[i:]
            break
        if m is None:
            rest.append(tok)
            i += 1
            continue
        section, name, value = m.groups()
        if value is None:
            if i + 1 >= len(argv):
                raise ValueError(f"--{section}.{name} needs a value: --{section}.{name}=VALUE")
            value, i = argv[i + 1], i + 1
        if section not in sections:
            raise ValueError(f"--{section}.{name}: this command takes no {section}. overrides; allowed sections: "
                             f"{', '.join(f'--{s}.F=V' for s in sections)}")
        names = [f.name for f in dataclasses.fields(classes[section])]
        if name not in names:
            raise ValueError(f"--{section}.{name}: {classes[section].__name__} has no field {name!r}; "
                             f"allowed values: {', '.join(sorted(names))}")
        items.append(f"{section}.{name}={value}")
        i += 1
    return rest, items


def parser_for(cls: type, prog: str | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The argparse parser of `cls` (and its dest table): what `--help` prints."""
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    p = argparse.ArgumentParser(prog=prog or f"marin-ablate {getattr(cls, 'command', '')}".strip(),
                                description=doc, allow_abbrev=False,
                                epilog=getattr(cls, "epilog", None),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    dests: dict = {}
    _add(p, cls, "", dests)
    sf = _spec_field(cls)
    if sf is not None:
        secs = option_meta(sf)["spec"]
        p.add_argument_group("spec overrides", f"{' '.join(SPEC_FLAGS[s] for s in secs)}: set field F of every "
                           f"run's spec ({', '.join(secs)} sections of marin.config.RunSpec) to V; repeatable, "
                           f"changes run ids. {option_meta(sf).get('help', '')}")
    return p, dests


def parse(cls: type[T], argv: Sequence[str], prog: str | None = None) -> T:
    """argv -> an instance of the options dataclass `cls` (old spellings refused first)."""
    argv = list(argv)
    command = getattr(cls, "command", "")
    refuse_renamed(argv, command)
    sf = _spec_field(cls)
    items: list[str] = []
    if sf is not None:
        argv, items = spec_overrides(argv, option_meta(sf)["spec"])
    p, dests = parser_for(cls, prog)
    sections = sorted({_dashed(d.split(".", 1)[0]) for d in dests if "." in d})
    for tok in argv:
        if tok == "--":
            break
        head = tok.split("=", 1)[0]
        sec = head[2:].split(".", 1)[0] if head.startswith("--") else ""
        if "_" in sec and _dashed(sec) in sections:  # a section is spelled with dashes, its fields as named
            raise ValueError(f"{head} was renamed; use --{_dashed(sec)}{head[2 + len(sec):]} (docs/cli.md)")
        if head.startswith("--") and "." in head and sec not in sections:
            allowed = [*(f"--{s}.F=V" for s in (option_meta(sf)["spec"] if sf is not None else ())),
                       *(f"--{s}.FIELD" for s in sections)]
            raise ValueError(f"{head}: this command has no section {head[2:].split('.', 1)[0]!r}; allowed sections: "
                             f"{', '.join(allowed) or '(none)'}")
    ns = vars(p.parse_args(argv))
    given = {k for k, v in ns.items() if v is not _NOT_GIVEN and v is not None and not k.startswith("S:")}
    return _build(cls, ns, "", given, items)


def known_flags(cls: type) -> set[str]:
    """Every flag the parser of `cls` accepts: options, section switches and section fields (the spec overrides
    `--model.F=V` ... are checked by `spec_overrides`)."""
    _, dests = parser_for(cls)
    out = {"-h", "--help"}
    for dest, (path, f) in dests.items():
        if dest.startswith("S:"):
            out.add(f"--{_dashed(path)}")
        elif not option_meta(f).get("positional"):
            out.add(_flag(f.name, dest[: len(dest) - len(f.name)]))
    return out


def flags_of(obj: Any, cls: type | None = None, prefix: str = "") -> list[str]:
    """The command-line tokens that give `obj`'s non-default options (its spec items included)."""
    cls = cls or type(obj)
    out: list[str] = []
    for f, extra, kind in _walk(cls, prefix):
        v = getattr(obj, f.name)
        if kind == "inline":
            out += flags_of(v, extra, prefix)
        elif kind == "section":
            if v is not None:
                name = f"{prefix}{_section_name(f)}"
                out += flags_of(v, extra, f"{name}.") or [f"--{_dashed(name)}"]
        elif kind == "sections":
            for n, sub in v:
                out += flags_of(sub, extra[n], f"{prefix}{n}.") or [f"--{_dashed(prefix + n)}"]
        elif kind == "spec":
            out += [f"--{x}" for x in v]
        elif kind == "positional":
            out.append(str(v))
        elif v != f.default:
            if v is True:
                out.append(_flag(f.name, prefix))
            elif isinstance(v, tuple):
                for x in v:
                    out += [_flag(f.name, prefix), str(x)]
            else:
                out += [_flag(f.name, prefix), str(v)]
    return out


__all__ = ["RENAMED", "allowed_text", "flags_of", "known_flags", "parse", "parser_for", "refuse_renamed",
           "spec_overrides"]
