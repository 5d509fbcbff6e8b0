"""The house's import rules as import-linter contracts (pyproject.toml `[tool.importlinter]`, docs/architecture.md §1):
the checkout keeps them, the tool sees every module under its installed name, and a canary shows that a planted
cycle, a planted upward arrow and a planted torch import each break them."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib
from checkout import copy_checkout

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "marin_ablate"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CONTRACT_BY_ID = {c["id"]: c for c in PYPROJECT["tool"]["importlinter"]["contracts"]}
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` over the package under `root` (its own copy first on the path), run from `root`."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONSAFEPATH": "1", "COLUMNS": "400"}  # one line per contract
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def package_modules(root: Path = ROOT, package: str = PACKAGE) -> set[str]:
    """Every module of the package, named as installed: the files under marin_ablate/, its layer links followed."""
    out = set()
    for dirpath, dirs, files in os.walk(root / package, followlinks=True):
        dirs[:] = [d for d in dirs if d.isidentifier()]
        for f in files:
            if f.endswith(".py"):
                parts = (Path(dirpath) / f).relative_to(root).with_suffix("").parts
                out.add(".".join(parts).removesuffix(".__init__"))
    return out


def test_the_checkout_keeps_its_import_contracts():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert f"Contracts: {len(CONTRACT_BY_ID)} kept, 0 broken." in r.stdout


def test_the_contract_tool_sees_every_module_under_its_installed_name():
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    assert graph.modules == package_modules()
    assert {"marin_ablate.marin.model", "marin_ablate.sweeps.sweep", "marin_ablate.analysis.fit.joint"} <= graph.modules


def test_no_module_imports_by_a_string_the_contracts_cannot_see():
    """`importlib.import_module("a.b")` of a literal name is an import the checker cannot read: write `import a.b`."""
    bad = []
    for mod in sorted(package_modules()):
        path = ROOT / Path(*mod.split(".")).with_suffix(".py")
        path = path if path.exists() else ROOT / Path(*mod.split(".")) / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
                    ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
                bad.append(f"{mod}:{node.lineno} imports {node.args[0].value!r} by a string")
    assert bad == []


# The canary: a copy of the checkout keeps the contracts; the planted lines break the contract named.
PLANTS = {
    "acyclic": ("marin/runlock.py", "from marin_ablate.marin import flops  # noqa: F401\n",
                "marin/flops.py", "from marin_ablate.marin import runlock  # noqa: F401\n"),
    "layers": ("planning/memory.py", "from marin_ablate.sweeps import state  # noqa: F401\n"),
    "torch-free": ("analysis/responses.py", "def f():\n    import torch  # noqa: F401\n"),
}


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory) -> Path:
    root = copy_checkout(tmp_path_factory.mktemp("checkout"))
    r = lint(root)
    assert r.returncode == 0, r.stdout[-4000:]
    return root


@pytest.mark.parametrize("contract", sorted(PLANTS))
def test_a_planted_cycle_upward_arrow_or_torch_import_breaks_its_contract(contract, clean_copy, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(clean_copy, root, symlinks=True)
    plant = PLANTS[contract]
    for rel, line in zip(plant[::2], plant[1::2], strict=True):
        with open(root / rel, "a") as f:
            f.write("\n" + line)
    r = lint(root)
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-2000:]
    broken = [c["id"] for c in CONTRACT_BY_ID.values() if f"{c['name']} BROKEN" in r.stdout]
    assert contract in broken, r.stdout[-4000:]  # an upward arrow closes a cycle of the layers too
