"""Private names across modules (tests/repo/private_names.py): only the known third-party internals, and the checker
sees each way a private name is reached. Cycles and layers are the import contracts' (tests/repo/test_contracts.py)."""

from __future__ import annotations

from private_names import private_imports

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


def _tree(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_private_import_check_sees_from_imports_of_underscored_names(tmp_path):
    _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "_x = 1\ny = 2\n",
                     "pkg/b.py": "def f():\n    from pkg.a import _x, y\n    from pkg.a import __doc__\n"})
    assert private_imports(tmp_path, "pkg") == ["pkg/b.py:2 imports pkg.a._x"]


def test_the_private_import_check_sees_private_attributes_of_an_imported_module(tmp_path):
    _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "_x = 1\n",
                     "pkg/b.py": "from pkg import a\nimport pkg.a as m\nimport os\n\n"
                                 "def f():\n    return a._x, m._x, a.__doc__, os._exit, a.y\n"})
    assert private_imports(tmp_path, "pkg") == ["pkg/b.py:6 uses pkg.a._x", "pkg/b.py:6 uses pkg.a._x"]


def test_the_private_import_check_follows_a_linked_layer_folder_and_names_the_real_file(tmp_path):
    _tree(tmp_path, {"pkg/__init__.py": "", "layer/__init__.py": "", "layer/a.py": "_x = 1\n",
                     "pkg/b.py": "from pkg.layer.a import _x\n"})
    (tmp_path / "pkg" / "layer").symlink_to("../layer")
    assert private_imports(tmp_path, "pkg") == ["pkg/b.py:1 imports pkg.layer.a._x"]


def test_relative_imports_resolve_to_the_module_they_name():
    import ast

    from private_names import _imports

    assert [t for _, t, _ in _imports(ast.parse("from .x import y"), "pkg.sub.m", False)] == ["pkg.sub.x"]
    assert [t for _, t, _ in _imports(ast.parse("from . import y"), "pkg.sub", True)] == ["pkg.sub"]
