"""Every section the code and the docs cite exists (docs/architecture.md: "Section numbers are stable"), and every
module the docs name imports under that name."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "marin_ablate"
LAYERS = tuple(p.name for p in (ROOT / PACKAGE).iterdir() if p.is_symlink())
# "docs/method.md §2.1, §4" or "[architecture.md](architecture.md) §2": a doc and one or more section ids
NUMBERED = re.compile(r"([\w-]+)\.md\)?,? ((?:§[0-9][0-9.]*[0-9]?(?:,? (?:and )?)?)+)")
# 'docs/architecture.md, "Run directory"' or 'docs/architecture.md ("Data")': a section by name
NAMED = re.compile(r"([\w-]+)\.md,?\s+\(?\"([^\"]+)\"")


def _files(*patterns: str) -> list[Path]:
    """The tracked files matching `patterns` (default: every .py and .md file)."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *(patterns or ("*.py", "*.md"))], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    out = [ROOT / n for n in names if (ROOT / n).is_file() and not (ROOT / n).is_symlink()]
    return [p for p in out if p != Path(__file__).resolve()]  # this file's examples cite missing sections


def _sections(doc: Path) -> tuple[set[str], set[str]]:
    """Section ids (headings "## §2.1 ..." and bold labels "**§4.1 ...") and the titles of headings,
    italic paragraph labels and table rows (their first cell) of a doc."""
    text = doc.read_text()
    ids = set(re.findall(r"^#+ §([0-9.]+)", text, re.M)) | set(re.findall(r"\*\*§([0-9.]+)", text))
    titles = {t.strip() for t in re.findall(r"^#+ (?:§[0-9.]+ )?(.+)$", text, re.M)}
    titles |= {t.split(" (")[0] for t in titles}  # a heading cited without its parenthetical: "Memory"
    # italic paragraph labels, also as list items: "*Joint law* (...).", "- *Which family ... control.*"
    titles |= set(re.findall(r"^(?:- )?\*([^*\n]+?)\.?\*", text, re.M))
    # table rows: docs/fidelity.md "KV layout"
    titles |= {t.strip() for t in re.findall(r"^\| ([^|\n]+?) \|", text, re.M)}
    return ids, titles


def cited_sections(files: list[Path]) -> list[tuple[str, str, str]]:
    """(where, doc, section) of every section citation; section is "§N" or a quoted name."""
    out = []
    for f in files:
        text = f.read_text(errors="replace")
        where = str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)
        for m in NUMBERED.finditer(text):
            out += [(where, m.group(1), s) for s in re.findall(r"§([0-9][0-9.]*[0-9]|[0-9])", m.group(2))]
        out += [(where, m.group(1), f'"{m.group(2)}"') for m in NAMED.finditer(text)]
    return out


def missing_sections(files: list[Path]) -> list[str]:
    docs = {p.stem: _sections(p) for p in (ROOT / "docs").glob("*.md")}
    bad = []
    for where, doc, sec in cited_sections(files):
        if doc not in docs:
            continue  # README.md, CHANGELOG-style files: not sectioned
        ids, titles = docs[doc]
        if (sec.strip('"') not in titles) if sec.startswith('"') else (sec not in ids):
            bad.append(f"{where}: {doc}.md {sec if sec.startswith(chr(34)) else '§' + sec}")
    return bad


def test_every_cited_section_exists():
    assert missing_sections(_files()) == []


def test_the_check_sees_numbered_and_named_citations(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""See docs/method.md §2.1, §9.9 and docs/architecture.md, "No such heading"; '
                 'docs/architecture.md §3."""\n')
    assert sorted(missing_sections([f])) == [f"{f}: architecture.md \"No such heading\"", f"{f}: method.md §9.9"]


# A dotted name in prose: `marin_ablate.marin.schema.write_spec`, or an old one (`marin.schema`) that imports no more.
DOTTED = re.compile(rf"(?<![\w/.-])(?:{'|'.join((PACKAGE, *LAYERS))})(?:\.[A-Za-z_]\w*)+")


def _resolves(name: str) -> bool:
    """`name` is a module, or an attribute path on the longest module prefix of it that imports."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def unimportable_names(files: list[Path]) -> list[str]:
    from marin_ablate.marin.plugins import ENTRY_POINT_GROUP

    bad = []
    for f in files:
        for i, line in enumerate(f.read_text().splitlines(), 1):
            for name in DOTTED.findall(line):
                if name != ENTRY_POINT_GROUP and not (name.startswith(f"{PACKAGE}.") and _resolves(name)):
                    bad.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}:{i}: {name}")
    return bad


def test_every_module_the_docs_name_imports_under_that_name():
    assert unimportable_names(_files("README.md", "docs/*.md")) == []


def test_the_name_check_sees_an_old_name_a_missing_module_and_a_missing_attribute(tmp_path):
    f = tmp_path / "a.md"
    f.write_text("`marin.schema` and marin_ablate.marin.schema.write_spec; marin_ablate.marin.nothing;\n"
                 "`marin_ablate.sweeps.sweep.no_such`, marin/schema.py, (marin_ablate.plugins entry points)\n")
    assert unimportable_names([f]) == [f"{f}:1: marin.schema", f"{f}:1: marin_ablate.marin.nothing",
                                       f"{f}:2: marin_ablate.sweeps.sweep.no_such"]
