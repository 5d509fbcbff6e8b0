"""Plugins: the registry rows (optimizers, responses, executors, studies) added outside this repository
reach every process that reads the registries (docs/architecture.md §4).

A row gets to a process in one of two ways:

  * by entry point: an installed distribution names a module (or a function, called once) in the
    `marin_ablate.plugins` group; `load_entry_points()` imports every one, as submitit finds its
    executors (submitit/core/plugins.py). The CLI, the driver and each worker call it.
  * by a recorded import: every `register_*` call notes the module whose top-level code made it (a
    study file named by path, `FILE.py:NAME`, is noted by its path). The driver writes those sources
    into each run's task and the study folder (`plugins.json`); a `local` or `slurm` worker, and a
    later `analyze` or `status` process, imports them (`ensure`) before it builds a run from plain data.

A row registered inside a function (not at a module's top level) has no source to import: it lives
in the registering process only, and `unreachable()` names it. Pure standard library, no torch.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Iterable

ENTRY_POINT_GROUP = "marin_ablate.plugins"
PLUGINS_FILE = "plugins.json"  # in a study folder: the sources its rows came from
PACKAGE = "marin_ablate"  # built-in rows register at their own import: a module of the package is no plugin source

#: (registry, row name) -> the module name or study file path whose import registers it (None: a function did)
REGISTERED: dict[tuple[str, str], str | None] = {}
_FILES: dict[str, str] = {}  # module name -> path, of the study files loaded by `load_file`
_LOADED_EPS: set[str] = set()


def load_file(path: str | Path) -> Any:
    """A study file imported from where it is, under a module name derived from its path (once per process)."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(str(path))
    mod_name = f"marin_study_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look a module up by name
    _FILES[mod_name] = str(path)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        _FILES.pop(mod_name, None)
        raise
    return module


def note(registry: str, name: str) -> None:
    """Record where the row `name` of `registry` came from: the innermost module whose top-level code
    is running (the one an import re-runs), or None when none is (a function registered it)."""
    frame = sys._getframe(1)
    source = None
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            mod = frame.f_globals.get("__name__", "")
            source = _FILES.get(mod, mod if mod != "__main__" else None)
            break
        frame = frame.f_back
    REGISTERED[(registry, name)] = source


def sources() -> list[str]:
    """The modules and study files to import so that this process's registered rows exist (in order)."""
    out: list[str] = []
    for src in REGISTERED.values():
        if src and src.split(".")[0] != PACKAGE and src not in out:
            out.append(src)
    return out


def unreachable(registry: str, names: Iterable[str]) -> list[str]:
    """Of these rows of `registry`, those registered by a function: no import brings them to another process."""
    return [n for n in names if (registry, n) in REGISTERED and REGISTERED[(registry, n)] is None]


def load_entry_points() -> list[str]:
    """Import every `marin_ablate.plugins` entry point not imported yet (a callable one is called once);
    returns the names of the ones loaded now."""
    new = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name}={ep.value}"
        if key in _LOADED_EPS:
            continue
        _LOADED_EPS.add(key)
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as e:
            raise ImportError(f"plugin entry point {ep.name!r} ({ep.value}, group {ENTRY_POINT_GROUP}) failed: "
                              f"{type(e).__name__}: {e}") from e
        new.append(ep.name)
    return new


def import_source(src: str) -> Any:
    """A recorded source: a study file path (`*.py`) or a module name."""
    if src.endswith(".py"):
        return load_file(src)
    return importlib.import_module(src)


def ensure(srcs: Iterable[str] = ()) -> None:
    """Entry points, then the recorded sources not imported in this process yet (a worker calls this
    before it builds a run)."""
    load_entry_points()
    loaded = set(_FILES.values())
    for src in srcs:
        if src in loaded or (not src.endswith(".py") and src in sys.modules):
            continue
        try:
            import_source(src)
        except Exception as e:
            raise ImportError(f"plugin source {src!r} (recorded where its rows were registered) cannot be "
                              f"imported here: {type(e).__name__}: {e}") from e


def write_sources(folder: str | Path) -> None:
    """`plugins.json` in a study folder: the sources of this process's rows (read back by `read_sources`)."""
    from marin_ablate.marin.schema import atomic_write_json

    old = read_sources(folder)
    srcs = old + [s for s in sources() if s not in old]  # a later run of the study adds, never forgets
    if srcs != old:
        atomic_write_json(Path(folder) / PLUGINS_FILE, {"imports": srcs})


def read_sources(folder: str | Path) -> list[str]:
    p = Path(folder) / PLUGINS_FILE
    return list(json.loads(p.read_text())["imports"]) if p.is_file() else []
