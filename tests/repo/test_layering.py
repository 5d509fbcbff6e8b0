"""The package's folders and names: every import goes through the one name, the layers are the folders linked into
it, no file cites a document outside the repository, and the torch-free modules load no torch when imported (the
layers' import rules are the contracts of tests/repo/test_contracts.py)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "marin_ablate"  # the one import name; each layer folder is linked into it (docs/architecture.md §1)
LAYERS = tuple(sorted(p.name for p in (ROOT / PACKAGE).iterdir() if p.is_symlink()))


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in the file, at any depth (function-level imports count)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_every_project_import_goes_through_the_one_package_name():
    """The old top-level names (marin, ablations, sweeps, planning, analysis) are not importable once installed:
    an import of one anywhere in the tree would load a second copy of a module from the checkout."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    bad = [f"{name}:{line} imports {mod}" for name in files for line, mod in imported_modules(ROOT / name)
           if mod.split(".")[0] in LAYERS]
    assert bad == []


def test_the_layers_are_the_linked_folders():
    assert LAYERS == ("ablations", "analysis", "marin", "planning", "sweeps")
    assert all((ROOT / PACKAGE / x).resolve() == ROOT / x for x in LAYERS)


# Things a clone of this repository does not contain: the steering repo's design notes, a contracts
# document, the shared folder beside a checkout, and issue numbers of a tracker the user cannot see.
# (the literals are split so that this file does not match itself)
OUTSIDE_REFERENCES = re.compile(r"DESIGN ?§|DESIGN\.md|" r"CONTRACT" r"S|\.\./shared|[Ii]ssue #?\d{1,3}\b")


def outside_references(root: Path) -> list[str]:
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.ipynb", "*.sh", "*.toml"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        if name == "benchmarks/RESULTS.md":  # a measurement log, quoting the sessions that measured it
            continue
        for i, line in enumerate((root / name).read_text(errors="replace").splitlines(), 1):
            if OUTSIDE_REFERENCES.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    return hits


def test_no_file_refers_to_a_document_outside_the_repository():
    assert outside_references(ROOT) == []


def test_the_reference_check_sees_each_kind_of_outside_reference(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "a.py").write_text('"""See DESIGN ' '§2.1."""\n# fixed in iss' 'ue 12\nx = 1  # CONTRACT' 'S schema\n')
    (tmp_path / "b.md").write_text("Read ../sha" "red/DESIGN" ".md first.\nMarin's heuristic (#5951) is fine.\n")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert [h.split(":")[:2] for h in outside_references(tmp_path)] == [["a.py", "1"], ["a.py", "2"], ["a.py", "3"],
                                                                        ["b.md", "1"]]


# Imported for real, in a fresh interpreter: the modules that must never pull in torch (the torch-free contract's
# sources, pyproject.toml) and the command line's, whose commands import torch only when they run.
def _torch_free() -> list[str]:
    from test_contracts import CONTRACT_BY_ID, package_modules

    mods = package_modules()
    sources = CONTRACT_BY_ID["torch-free"]["source_modules"]
    cli = [m for m in mods if m.startswith(f"{PACKAGE}.cli") and m != f"{PACKAGE}.cli.train"]
    return sorted({m for m in mods for s in sources if m == s or m.startswith(s + ".")} | set(cli))


@pytest.mark.slow  # a fresh interpreter per module
def test_importing_the_torch_free_modules_loads_no_torch():
    torch_free = _torch_free()
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
            "    if 'torch' in sys.modules:\n        print(m)\n        break\n")
    r = subprocess.run([sys.executable, "-c", code, *torch_free], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"importing {r.stdout.strip()} loads torch"
    assert len(torch_free) > 25 and "marin_ablate.analysis.report.writer" in torch_free
    assert "marin_ablate.ablations" in torch_free and "marin_ablate.cli.main" in torch_free
