"""Each command's options dataclass (fields made with `marin.fields.option`: help, choices, range) parsed by tyro
(docs/cli.md), which reads the flags, positionals, repeatable and nested options this module declares to it:

    a field                      --name-with-dashes VALUE   (a bool: a switch; a tuple: repeatable)
    a positional field           NAME
    a section (nested options)   --section.field VALUE      (`--section` alone, or any of its options, turns it on;
                                                             two `mode` sections at once are refused)
    a table of sections          one section per row        (the executors' `options`: --slurm.time_min 30)
    an inline dataclass          its fields at this level   (the execution options of plan and run)
    a spec field                 --model.F=V --train.F=V --data.F=V --recipe.F=V (marin.presets.spec_items)

tyro hands back every value as text; `parse` converts and checks it (`marin.fields.check_value`) and builds the
command's dataclass, whose own checks run too: an error is one line naming the flag and its allowed values. An old
spelling (`RENAMED`) is refused naming the new one."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from typing import Annotated, Any, Sequence, TypeVar

import tyro

from marin_ablate.marin.fields import allowed_text, base_type, check_value, option_meta

T = TypeVar("T")

#: Old spelling -> the new one (a dict: per command). Refused with exit 2 before anything runs.
_SLURM = ("partition", "account", "qos", "time_min", "gpus_per_run", "cpus_per_task", "mem_gb",
          "array_parallelism", "constraint", "exclude", "setup", "signal_delay_s")
RENAMED: dict[str, str | dict[str, str]] = {
    "--set": "--model.F=V, --train.F=V, --data.F=V or --recipe.F=V (one flag per field)",
    "--train-set": "--train.F=V", "--data-set": "--data.F=V", "--steps": "--train.steps=N",
    "--recipe": {"train": "--recipe.FACTOR=LEVEL, or --baseline for Recipe.baseline()", "*": "--recipe.FACTOR=LEVEL"},
    "--out": {"train": "--run-dir", "analyze": "--report-dir (the report) or --study-dir (--import.table, --forecast)",
              "data": "--corpus-dir"},
    **{f"--{s.replace('_', '-')}": f"--slurm.{s}" for s in _SLURM},
    "--gpus": "--dry-run.gpus", "--ep": "--dry-run.ep", "--capacity-gib": "--dry-run.capacity_gib",
    "--reserve-gib": "--dry-run.reserve_gib",
    "--noise": "--precision.noise", "--target-halfwidth": "--precision.target_halfwidth",
    "--points": {"run": "--tune.points"}, "--span": {"run": "--tune.span"}, "--storage": {"run": "--tune.storage"},
    "--arm": {"analyze": "--forecast.arm"}, "--note": {"analyze": "--forecast.note"},
}


def fields_of(cls: type, prefix: str = ""):
    """(field, flag or section name, kind, extra) per option of `cls`: kind 'value', 'bool', 'tuple', 'positional',
    'spec', 'inline' (extra: its class), 'section' (extra: {name: class}, one row) or 'sections' (one per row)."""
    for f in dataclasses.fields(cls):
        md = option_meta(f)
        if not md:
            continue
        if md.get("sections") is not None:
            yield f, prefix, "sections", dict(md["sections"]())
        elif md.get("section") is not None:
            sec = md["section"] if isinstance(md["section"], type) else md["section"]()
            if md.get("inline"):
                yield f, prefix, "inline", sec
            else:
                yield f, prefix, "section", {md.get("name") or f.name: sec}
        elif md.get("spec") is not None:
            yield f, prefix, "spec", None
        elif md.get("positional"):
            yield f, f.name, "positional", None
        else:
            kind = base_type(f)
            yield f, f"--{prefix.replace('_', '-')}{f.name}" if prefix else f"--{f.name.replace('_', '-')}", \
                kind if kind in ("bool", "tuple") else "value", None


def _help(f: dataclasses.Field) -> str:
    md = option_meta(f)
    allowed = allowed_text(f) if md.get("choices") is not None or md.get("lo") is not None else ""
    return "; ".join(b for b in (" ".join(md.get("help", "").split()), allowed and f"allowed: {allowed}") if b)


def _key(what: str, prefix: str, name: str) -> str:
    """The tyro field of a section's switch ("on") or options ("of"): a name no section can make a keyword."""
    return f"{what}__{prefix}{name}".replace(".", "__").replace("-", "_")


def _shown(v: Any) -> str:
    return "none" if v is None else "empty" if v in ((), "") else str(v)


def _tyro_class(cls: type, prefix: str = "") -> type:
    """The dataclass tyro parses for `cls`: every value as text (None: not given), a section as a switch and a
    nested class named by its flag."""
    out: list[tuple] = []
    for f, pre, kind, extra in fields_of(cls, prefix):
        md = option_meta(f)
        shown = "required" if f.default is dataclasses.MISSING else f"default: {_shown(f.default)}"
        metavar = md.get("metavar") or {"bool": None, "tuple": "VALUE"}.get(kind, base_type(f).upper())
        arg = tyro.conf.arg(help=_help(f), metavar=metavar, help_behavior_hint=f"({shown})" if kind != "bool" else None)
        if kind == "inline":
            out += [(g.name, g.type, g.default if g.default_factory is dataclasses.MISSING
                     else dataclasses.field(default_factory=g.default_factory))
                    for g in dataclasses.fields(_tyro_class(extra, pre))]
        elif kind in ("section", "sections"):
            for name, sub in extra.items():
                doc, flag = " ".join((sub.__doc__ or "").split()), f"{pre}{name}".replace("_", "-")
                out.append((_key("on", pre, name), Annotated[bool, tyro.conf.arg(
                    name=flag, help=f"{doc} (--{flag}.X turns it on too)")], False))
                nested = _tyro_class(sub, f"{pre}{name}.")
                out.append((_key("of", pre, name), Annotated[nested, tyro.conf.arg(name=flag)],
                            dataclasses.field(default_factory=nested)))
        elif kind == "positional":
            typ = Annotated[str | None if f.default is not dataclasses.MISSING else str, tyro.conf.Positional,
                            tyro.conf.arg(help=_help(f), metavar=md.get("metavar") or f.name.upper())]
            out.append((f.name, typ, None if f.default is not dataclasses.MISSING else dataclasses.MISSING))
        elif kind == "bool":
            out.append((f.name, Annotated[bool, arg], False))
        elif kind == "tuple":
            out.append((f.name, Annotated[tuple[str, ...], tyro.conf.UseAppendAction, arg], ()))
        elif kind == "value":
            required = f.default is dataclasses.MISSING
            out.append((f.name, Annotated[str if required else str | None, arg],
                        dataclasses.MISSING if required else None))
    return dataclasses.make_dataclass(f"{cls.__name__}Flags", [(n, t) if d is dataclasses.MISSING else (n, t, d)
                                                                for n, t, d in out],
                                      namespace={"__doc__": cls.__doc__}, kw_only=True)


def _typed(f: dataclasses.Field, flag: str, text: str) -> Any:
    kind = base_type(f)
    try:
        return {"int": int, "float": float}.get(kind, str)(text)
    except ValueError:
        raise ValueError(f"argument {flag}: {text!r} is not {'an integer' if kind == 'int' else 'a number'}; "
                         f"allowed values: {allowed_text(f) or kind}") from None


def _build(cls: type, got: Any, argv: Sequence[str], items: list[str], prefix: str = "") -> Any:
    """An instance of `cls` from tyro's text values (a section: its default unless its switch or one of its options
    was given). Two modes at once: ValueError."""
    kw, modes = {}, []

    def on(name: str) -> bool:
        return getattr(got, _key("on", prefix, name)) or any(
            t.startswith((f"--{prefix}{name}.".replace("_", "-"), f"--{prefix}{name}.")) for t in argv)

    for f, pre, kind, extra in fields_of(cls, prefix):
        if kind == "inline":
            kw[f.name] = _build(extra, got, argv, items, pre)
        elif kind in ("section", "sections"):
            made = {n: _build(c, getattr(got, _key("of", pre, n)), argv, items, f"{pre}{n}.")
                    for n, c in extra.items() if on(n)}
            if kind == "sections":
                kw[f.name] = tuple(made.items())
            else:
                kw[f.name] = next(iter(made.values()), f.default)
                modes += [f"--{pre}{n}".replace("_", "-") for n in made if option_meta(f).get("mode")]
        elif kind == "spec":
            kw[f.name] = tuple(items)
        else:
            v = getattr(got, f.name)
            if kind in ("bool", "tuple") and v == (False if kind == "bool" else ()):
                continue
            if v is None:
                continue  # the field's default
            v = _typed(f, pre, v) if kind in ("value", "positional") else tuple(v) if kind == "tuple" else v
            check_value(f, v, pre)
            kw[f.name] = v
    if len(modes) > 1:
        raise ValueError(f"{' and '.join(modes)} are two modes of {getattr(cls, 'command', 'this command')}; "
                         "allowed: one of them")
    return cls(**kw)


def spec_sections(cls: type) -> tuple[str, ...]:
    """The RunSpec sections the command's `--SECTION.F=V` overrides may name (none: the command takes none)."""
    for f, _, kind, extra in fields_of(cls):
        if kind == "spec":
            return option_meta(f)["spec"]
        if kind == "inline" and spec_sections(extra):
            return spec_sections(extra)
    return ()


def _sections_named(cls: type, prefix: str = "") -> list[str]:
    out = []
    for _, pre, kind, extra in fields_of(cls, prefix):
        if kind == "inline":
            out += _sections_named(extra, pre)
        elif kind in ("section", "sections"):
            out += [f"{pre}{n}".replace("_", "-") for n in extra]
    return out


def _refuse(argv: Sequence[str], cls: type) -> None:
    """An old spelling, a section spelled with underscores or a section the command lacks: one line naming the new."""
    command, sections = getattr(cls, "command", ""), _sections_named(cls)
    for tok in argv:
        if tok == "--":
            return
        head = tok.split("=", 1)[0]
        new = RENAMED.get(head)
        new = new.get(command, new.get("*")) if isinstance(new, dict) else new
        if new is not None:
            raise ValueError(f"{head} was renamed; use {new} (docs/cli.md)")
        sec = head[2:].split(".", 1)[0] if head.startswith("--") else ""
        if "_" in sec and sec.replace("_", "-") in sections:
            raise ValueError(f"{head} was renamed; use --{sec.replace('_', '-')}{head[2 + len(sec):]} (docs/cli.md)")
        if "." in head and sec and sec not in sections and sec not in spec_sections(cls):
            allowed = [*(f"--{s}.F=V" for s in spec_sections(cls)), *(f"--{s}.FIELD" for s in sections)]
            raise ValueError(f"{head}: this command has no section {sec!r}; allowed sections: "
                             f"{', '.join(allowed) or '(none)'}")


#: What argparse-style parsers take for an option, not a value, though it is a number: `-inf`, `-1e5`.
_NEGATIVE_NUMBER = re.compile(r"-(inf(inity)?|nan|(\d+\.?\d*|\.\d+)(e[-+]?\d+)?)", re.I)


def _joined(argv: list[str]) -> list[str]:
    """`--flag -inf` as `--flag=-inf`: a negative number after a flag is its value (then checked by its range)."""
    out: list[str] = []
    for i, tok in enumerate(argv):
        if tok == "--":
            return out + argv[i:]
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE_NUMBER.fullmatch(tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def parse(cls: type[T], argv: Sequence[str], prog: str | None = None) -> T:
    """argv -> an instance of the options dataclass `cls`; a bad option: ValueError naming it (`--help`: SystemExit)."""
    argv = list(argv)
    _refuse(argv, cls)
    items: list[str] = []
    if spec_sections(cls):  # the config's classes: imported only by a command that builds runs
        from marin_ablate.marin.presets import spec_items

        argv, items = spec_items(argv, spec_sections(cls))
    prog = prog or f"marin-ablate {getattr(cls, 'command', '')}".strip()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            got = tyro.cli(_tyro_class(cls), args=_joined(argv), prog=prog, description=getattr(cls, "epilog", None)
                           and f"{cls.__doc__}\n\n{cls.epilog}", config=(tyro.conf.FlagCreatePairsOff,))
    except SystemExit as e:
        if e.code:  # tyro's message (a box on a terminal, plain text here), as one line
            lines = [ln.strip().strip("│╭╮╰╯─").strip() for ln in err.getvalue().splitlines()]
            lines = [ln for ln in lines if ln and not set(ln) <= set("-─") and "--help" not in ln
                     and not ln.startswith("For full helptext")]
            head, rest = lines[0], " ".join(lines[1:])
            raise ValueError(rest if rest.startswith(head) else f"{head}: {rest}".rstrip(": ")) from None
        raise
    return _build(cls, got, argv, items)


def flags_of(obj: Any, cls: type | None = None, prefix: str = "") -> list[str]:
    """The command-line tokens that give `obj`'s non-default options (its spec items included)."""
    out: list[str] = []
    for f, pre, kind, extra in fields_of(cls or type(obj), prefix):
        v = getattr(obj, f.name)
        if kind == "inline":
            out += flags_of(v, extra, pre)
        elif kind in ("section", "sections"):
            rows = v if kind == "sections" else [(next(iter(extra)), v)] if v is not None else []
            for n, sub in rows:
                out += flags_of(sub, extra[n], f"{pre}{n}.") or [f"--{pre}{n}".replace("_", "-")]
        elif kind == "spec":
            out += [f"--{x}" for x in v]
        elif kind == "positional":
            out.append(str(v))
        elif v != f.default:
            out += [pre] if v is True else [t for x in v for t in (pre, str(x))] if isinstance(v, tuple) \
                else [pre, str(v)]
    return out

