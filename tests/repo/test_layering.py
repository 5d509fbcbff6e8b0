"""The package layers: marin/ (model library) is the bottom and imports nothing of ablations/, sweeps/
or analysis/; ablations/ and analysis/ import no torch at module level (their own rule)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "marin_ablate"  # the one import name; each layer folder installs as its subpackage
LAYERS = ("marin", "ablations", "sweeps", "planning", "analysis")
UPPER_LAYERS = ("cli", "ablations", "sweeps", "planning", "analysis")


def layer(module: str) -> str | None:
    """The layer a module belongs to ('cli' for marin_ablate's own modules), None outside the project."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "cli"


def module_name(path: Path) -> str:
    """The installed module name of a file of the repository: marin/config.py -> marin_ablate.marin.config."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(parts).removesuffix(".__init__")
    return name if parts[0] == PACKAGE else f"{PACKAGE}.{name}"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (function-level imports count)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            out.append((node.lineno, str(node.args[0].value)))  # importlib.import_module("x.y")
    return out


def upper_layer_imports(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, mod in imported_modules(path):
            if layer(mod) in UPPER_LAYERS:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    return bad


def test_every_project_import_goes_through_the_one_package_name():
    """The old top-level names (marin, ablations, sweeps, planning, analysis) are not importable once installed:
    an import of one anywhere in the tree would load a second copy of a module from the checkout."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    bad = [f"{name}:{line} imports {mod}" for name in files for line, mod in imported_modules(ROOT / name)
           if mod.split(".")[0] in LAYERS]
    assert bad == []


def test_marin_imports_nothing_of_the_cli_ablations_sweeps_planning_or_analysis():
    assert upper_layer_imports("marin") == []


def test_the_layer_check_sees_function_level_and_importlib_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    from marin_ablate.ablations.ladders import RUNGS\n"
                 "    import marin_ablate.main\n"
                 "    importlib.import_module('marin_ablate.analysis.report.writer')\n")
    assert [m for _, m in imported_modules(f)] == ["os", "marin_ablate.ablations.ladders", "marin_ablate.main",
                                                   "marin_ablate.analysis.report.writer"]


@pytest.mark.parametrize("package", ["ablations", "analysis"])
def test_ablations_and_analysis_import_no_torch_at_module_level(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "torch"]
    assert bad == []


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


# Imported for real, in a fresh interpreter: the modules that must never pull in torch, transitively
# (function-level imports do not run here; the ast test above covers ablations/ and analysis/ sources).
def _modules(pkg: str) -> list[str]:
    return sorted(module_name(p) for p in (ROOT / pkg).rglob("*.py") if p.stem != "__main__")


TORCH_FREE = ("marin_ablate.marin.config", "marin_ablate.marin.optimizers", "marin_ablate.marin.switches",
              "marin_ablate.marin.plugins", "marin_ablate.marin.ep_layout",
              *_modules("ablations"), *_modules("analysis"),
              *(m for m in _modules("marin_ablate") if m != "marin_ablate.train"))


@pytest.mark.slow  # a fresh interpreter per module
def test_importing_the_torch_free_modules_loads_no_torch():
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
            "    if 'torch' in sys.modules:\n        print(m)\n        break\n")
    r = subprocess.run([sys.executable, "-c", code, *TORCH_FREE], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"importing {r.stdout.strip()} loads torch"
    assert len(TORCH_FREE) > 25 and "marin_ablate.analysis.report.writer" in TORCH_FREE
    assert "marin_ablate.ablations" in TORCH_FREE
