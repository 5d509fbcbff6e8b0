"""Every section the code and the docs cite exists (docs/architecture.md: "Section numbers are stable")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("marin", "marin_ablate", "sweeps", "planning", "ablations", "analysis", "benchmarks", "tests", "docs")
# "docs/method.md §2.1, §4" or "[architecture.md](architecture.md) §2": a doc and one or more section ids
NUMBERED = re.compile(r"([\w-]+)\.md\)?,? ((?:§[0-9][0-9.]*[0-9]?(?:,? (?:and )?)?)+)")
# 'docs/architecture.md, "Run directory"' or 'docs/architecture.md ("Data")': a section by name
NAMED = re.compile(r"([\w-]+)\.md,?\s+\(?\"([^\"]+)\"")


def _files() -> list[Path]:
    out = [ROOT / "README.md"]
    for d in SOURCES:
        out += sorted(p for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md") and p.is_file())
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
