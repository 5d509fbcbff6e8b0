"""Private names used across the project's modules, read with `ast` (function-level imports count, the bodies of
`if TYPE_CHECKING:` do not): `from x import _y`, or `m._y` where `m` is bound to another project module."""

from __future__ import annotations

import ast
from pathlib import Path

from test_contracts import PACKAGE, ROOT, package_modules


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """installed module name -> its file, as the repository holds it (a package is its __init__.py)."""
    out = {}
    for mod in package_modules(root, package):
        path = root.joinpath(*mod.split("."))
        out[mod] = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).resolve()
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


def private_imports(root: Path = ROOT, package: str = PACKAGE) -> list[str]:
    """Another project module's private name used here (file:line, the file as the repository holds it)."""
    files = module_files(root, package)
    bad = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(root.resolve())
        for line, target, names in _imports(tree, mod, path.name == "__init__.py"):
            for n in names:
                if _private(n) and target != mod:
                    bad.append(f"{rel}:{line} imports {target}.{n}")
        bad += _private_attributes(tree, mod, files, rel)
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
