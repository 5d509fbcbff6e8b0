"""The import graph (tests/repo/import_graph.py, built with `ast`; function-level imports count): no
cycles among the project's modules, and the checker sees each kind of import."""

from __future__ import annotations

import ast

from import_graph import _imports, cycles, import_graph, module_files, private_imports


def test_the_import_graph_has_no_cycles():
    assert cycles(import_graph()) == set()


# Private names still imported across modules: third-party internals with no public form (submitit's
# sbatch renderer, statsmodels' sandwich of a given covariance, the FSDP2 hooks the rehearsal stands in
# for on the meta device). The set must shrink, never grow.
KNOWN_PRIVATE_IMPORTS = {
    "planning/hero.py imports submitit.slurm.slurm._make_sbatch_string",
    "analysis/fit/attribution.py imports statsmodels.stats.sandwich_covariance._HCCM",
    "planning/rehearsal.py imports torch.distributed.fsdp._fully_shard._fsdp_param_group",
    "planning/rehearsal.py imports torch.distributed.fsdp._fully_shard._fully_shard",
}


def test_no_module_imports_another_modules_private_names_beyond_the_known_ones():
    found = {f"{hit.split(':')[0]} {hit.split(' ', 1)[1]}" for hit in private_imports()}
    assert found == KNOWN_PRIVATE_IMPORTS


def test_the_private_import_check_sees_from_imports_of_underscored_names(tmp_path):
    _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "_x = 1\ny = 2\n",
                     "pkg/b.py": "def f():\n    from pkg.a import _x, y\n    from pkg.a import __doc__\n"})
    assert private_imports(tmp_path, ("pkg",)) == ["pkg/b.py:2 imports pkg.a._x"]


def test_the_private_import_check_sees_private_attributes_of_an_imported_module(tmp_path):
    _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "_x = 1\n",
                     "pkg/b.py": "from pkg import a\nimport pkg.a as m\nimport os\n\n"
                                 "def f():\n    return a._x, m._x, a.__doc__, os._exit, a.y\n"})
    assert private_imports(tmp_path, ("pkg",)) == ["pkg/b.py:6 uses pkg.a._x", "pkg/b.py:6 uses pkg.a._x"]


def _tree(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return import_graph(tmp_path, ("pkg",))


def test_a_cycle_closed_by_a_function_level_import_is_found(tmp_path):
    g = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import f\n",
                         "pkg/b.py": "def f():\n    from pkg import a\n", "pkg/c.py": "import pkg.a\n"})
    assert g["pkg.b"] == {"pkg.a"} and cycles(g) == {frozenset({"pkg.a", "pkg.b"})}


def test_type_checking_imports_and_a_package_init_close_no_cycle(tmp_path):
    g = _tree(tmp_path, {"pkg/__init__.py": "from pkg.a import X\n",
                         "pkg/a.py": "from typing import TYPE_CHECKING\nfrom pkg import b\nX = 1\n",
                         "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n"})
    assert g == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()} and cycles(g) == set()


def test_relative_and_importlib_imports_resolve(tmp_path):
    files = {"pkg/__init__.py": "", "pkg/sub/__init__.py": "from . import m\n",
             "pkg/sub/m.py": "from ..a import f\nimport importlib\nimportlib.import_module('pkg.b')\n",
             "pkg/a.py": "", "pkg/b.py": ""}
    g = _tree(tmp_path, files)
    assert g["pkg.sub"] == {"pkg.sub.m"} and g["pkg.sub.m"] == {"pkg.a", "pkg.b"}
    assert set(module_files(tmp_path, ("pkg",))) == {"pkg", "pkg.sub", "pkg.sub.m", "pkg.a", "pkg.b"}
    assert [t for _, t, _ in _imports(ast.parse("from .x import y"), "pkg.sub.m", False)] == ["pkg.sub.x"]
