"""The project's import graph, read with `ast` (function-level and `importlib.import_module("x")` imports
count): module -> the project modules it imports, and the import cycles in it (strongly connected parts)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("marin", "marin_ablate", "ablations", "sweeps", "planning", "analysis")


def module_files(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """dotted module name -> file (a package is its __init__.py)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node, less the bodies of `if TYPE_CHECKING:` (imports for annotations only, never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _imports(tree: ast.AST, name: str, is_pkg: bool):
    """(line, module, imported names) of every import that runs in a module's tree, relative ones resolved."""
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_pkg else name.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join([*here, base] if base else here)
            yield node.lineno, base, tuple(a.name for a in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value, ()


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports (`from pkg import sub` names the submodule; a package's
    `__init__`, which Python runs first, is not counted for its submodules, as for `import pkg.sub`)."""
    files = module_files(root, packages)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for _, target, names in _imports(tree, mod, path.name == "__init__.py"):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in files]
            graph[mod].update(subs)
            if names and len(subs) == len(names):  # `from pkg import sub`: the submodule, as `import pkg.sub`
                continue
            parts = target.split(".")
            while parts and ".".join(parts) not in files:
                parts.pop()
            if parts and ".".join(parts) != mod:
                graph[mod].add(".".join(parts))
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected parts of more than one module (Tarjan), each an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                out.add(frozenset(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports(root: Path = ROOT, packages=PACKAGES) -> list[str]:
    """Another project module's private name used here (file:line): `from x import _y`, or `m._y` where
    `m` is bound by an import of another project module (`import a.b as m`, `from a import b`)."""
    files = module_files(root, packages)
    bad = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, target, names in _imports(tree, mod, path.name == "__init__.py"):
            for n in names:
                if _private(n) and target != mod:
                    bad.append(f"{path.relative_to(root)}:{line} imports {target}.{n}")
        bad += _private_attributes(tree, mod, files, path.relative_to(root))
    return bad


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_attributes(tree: ast.AST, mod: str, files: dict[str, Path], rel: Path) -> list[str]:
    """`m._y` (or `m.sub._y`) on a name bound to another project module by an import in this file."""
    bound = {}
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in files and a.name != mod and a.asname:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in files and full != mod:
                    bound[a.asname or a.name] = full
    out = []
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            path, v = [], node.value
            while isinstance(v, ast.Attribute):
                path.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in bound:
                out.append(f"{rel}:{node.lineno} uses {'.'.join([bound[v.id], *reversed(path), node.attr])}")
    return out
