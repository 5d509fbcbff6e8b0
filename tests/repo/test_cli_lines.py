"""Every `marin-ablate ...` line a user can read -- README, docs/, and the messages the code prints -- uses
only commands, flags, spec overrides and studies that exist: each line is checked against the CLI's own
options dataclasses (the flags marin_ablate/cli/parse.py gives tyro), never run."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from marin_ablate.ablations.studies import STUDIES
from marin_ablate.cli import parse as options
from marin_ablate.cli.main import COMMANDS, MOVED
from marin_ablate.marin.presets import spec_items

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"marin-ablate +([a-z][a-z_-]*)([^`\n|;&#)]*)")
STOP = {"|", "||", "&&", ";", ">", "2>&1", "#"}
# A record's format tag, not a command line: forecast files name their kind so (hashed; kept for old files).
FORMAT_TAGS = ("marin-ablate forecast",)


def _command_classes() -> dict[str, type]:
    """command (or 'data ACTION') -> its options dataclass."""
    import importlib

    out = {}
    for name, (module, _) in COMMANDS.items():
        mod = importlib.import_module(f"marin_ablate.cli.{module}")
        if name == "data":
            out.update({f"data {a}": cls for a, cls in mod.ACTIONS.items()})
            continue
        (cls,) = {v for v in vars(mod).values() if isinstance(v, type) and getattr(v, "command", None) == name
                  and v.__module__ == mod.__name__}
        out[name] = cls
    return out


def _sources() -> list[tuple[str, str]]:
    """(where, text) of every readable line: Markdown files, and the string constants of the package's code."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md", "*.py"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    out = []
    for rel in files:
        path = ROOT / rel
        if rel.endswith(".md"):
            if rel.startswith("benchmarks/"):  # a log of past measurements, in the words of their day
                continue
            out += [(f"{rel}:{i}", ln) for i, ln in enumerate(path.read_text().splitlines(), 1)]
        elif not rel.startswith(("tests/", "benchmarks/")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.JoinedStr):  # an f-string: its placeholders read as a value "X"
                    text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
                    out.append((f"{rel}:{node.lineno}", text))
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.append((f"{rel}:{node.lineno}", node.value))
    return out


def _tokens(rest: str) -> list[str]:
    try:
        toks = shlex.split(rest)
    except ValueError:
        toks = rest.split()
    out = []
    for t in toks:
        if t in STOP:
            break
        out.append(t.strip(".,:'\"[]()"))
    return [t for t in out if t and t not in ("...", "\\")]


def known_flags(cls: type, prefix: str = "") -> set[str]:
    """Every flag the parser of `cls` accepts (a section's fields as the docs spell them: --dry-run.capacity_gib)."""
    out = {"-h", "--help"}
    for _, pre, kind, extra in options.fields_of(cls, prefix):
        if kind == "inline":
            out |= known_flags(extra, pre)
        elif kind in ("section", "sections"):
            for n, sub in extra.items():
                out |= {f"--{pre}{n}".replace("_", "-"), *known_flags(sub, f"{pre}{n}.")}
        elif kind in ("value", "bool", "tuple"):
            out.add(pre)
    return out


def problems(where: str, command: str, toks: list[str], classes: dict[str, type], defined=()) -> list[str]:
    """What is wrong with one line (`defined`: study names its own document defines, as a tutorial does)."""
    if command in MOVED:
        return [f"{where}: `marin-ablate {command}` is refused (now `{MOVED[command]}`)"]
    if command == "data" and toks and toks[0] in ("prepare", "verify"):
        command, toks = f"data {toks[0]}", toks[1:]
    if command not in classes:  # prose ("marin-ablate answers ..."), or `data` with its action as a placeholder
        return []
    cls, bad = classes[command], []
    flags = known_flags(cls)
    sections = options.spec_sections(cls)
    for i, tok in enumerate(toks):
        if not tok.startswith("--"):
            if i == 0 and command in ("run", "plan", "status") and re.fullmatch(r"[a-z][a-z0-9_]*", tok):
                if tok not in STUDIES and tok not in defined:
                    bad.append(f"{where}: `marin-ablate {command} {tok}`: no study {tok!r}")
            continue
        head = tok.split("=", 1)[0]
        if head in flags:
            continue
        if re.fullmatch(r"--(model|train|data|recipe)\.[A-Za-z_]+", head) and "F" not in head.split(".")[1:]:
            try:
                spec_items([f"{head}=0"], sections)
            except ValueError as e:
                bad.append(f"{where}: {e}")
            continue
        if re.fullmatch(r"--(model|train|data|recipe)\.F", head):  # the generic form in prose
            if head.split(".")[0][2:] not in sections:
                bad.append(f"{where}: `marin-ablate {command}` takes no {head} overrides")
            continue
        if re.fullmatch(r"--[a-z-]+\.(FIELD|X|\*)", head) and f"--{head[2:].split('.')[0]}" in flags:
            continue  # a section's generic form
        bad.append(f"{where}: `marin-ablate {command}` has no flag {head}")
    # a line without placeholders goes through the parser itself (prose may leave out what a command requires)
    if not bad and not any(re.search(r"\b[A-Z]+\b|\.F\b|\*|\|", t) for t in toks):
        try:
            options.parse(cls, toks)
        except ValueError as e:
            if not str(e).startswith(("Required options", "Missing argument", "plan needs")):
                bad.append(f"{where}: `marin-ablate {command} {shlex.join(toks)}`: {e}")
    return bad


def test_every_marin_ablate_line_in_the_readme_docs_and_messages_parses_against_the_cli():
    classes = _command_classes()
    bad, seen = [], 0
    defined: dict[str, set[str]] = {}
    for where, text in _sources():
        defined.setdefault(where.split(":")[0], set()).update(re.findall(r"def (\w+)\(", text))
    for where, text in _sources():
        for m in LINE.finditer(text):
            if m.group(0).startswith(FORMAT_TAGS) and not m.group(2).strip(" ,.\"'"):
                continue
            seen += 1
            bad += problems(where, m.group(1), _tokens(m.group(2)), classes, defined[where.split(":")[0]])
    assert seen > 100
    assert bad == []


@pytest.mark.parametrize("line, says", [
    ("marin-ablate run smoke --no-such-flag", "has no flag --no-such-flag"),
    ("marin-ablate data prepare SRC --out DIR", "has no flag --out"),
    ("marin-ablate run smoke --train.nope=1", "TrainConfig has no field 'nope'"),
    ("marin-ablate plan no_such_study", "no study 'no_such_study'"),
    ("marin-ablate tune smoke", "is refused"),
    ("marin-ablate run my_studdy", "no study 'my_studdy'"),
    ("marin-ablate analyze runs/smoke --dry-run", "has no flag --dry-run"),
    ("marin-ablate analyze runs/smoke --n-boot many", "'many' is not an integer"),
    ("marin-ablate plan smoke --dry-run --precision", "are two modes of plan"),
])
def test_the_line_check_catches_each_kind_of_stale_line(line, says):
    m = LINE.search(line)
    found = problems("x", m.group(1), _tokens(m.group(2)), _command_classes())
    assert len(found) == 1 and says in found[0], found
