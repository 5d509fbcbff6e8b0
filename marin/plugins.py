"""Plugins: the registry rows (optimizers, responses, executors, studies) added outside this repository
reach every process that reads the registries (docs/architecture.md §4, step 2).

A row gets to a process by an entry point of the `marin_ablate.plugins` group (`load_entry_points()`, as
submitit finds its executors: submitit/core/plugins.py; one that fails is named by `failures()`, the others
still load) or by the command line (a study file or module; `register_*` notes the module whose top-level code
made the row, and the driver passes those sources to its workers: `ensure`). A study folder's `plugins.json`
is a record only (`write_record`, compared by `record_notes`), never imported; a row registered inside a
function has no source to import (`unreachable()`). Pure standard library, no torch.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterable

from marin_ablate.marin.schema import atomic_write_json, read_json_text

ENTRY_POINT_GROUP = "marin_ablate.plugins"
PLUGINS_FILE = "plugins.json"  # in a study folder: a record of the sources its rows came from (never imported)
PACKAGE = "marin_ablate"  # built-in rows register at their own import: a module of the package is no plugin source

#: (registry, row name) -> the module name or study file path whose import registers it (None: a function did)
REGISTERED: dict[tuple[str, str], str | None] = {}
_FILES: dict[str, str] = {}  # module name -> path, of the study files loaded by `load_file`
_LOADED_EPS: set[str] = set()
_FAILED_EPS: dict[str, str] = {}  # entry point "name=value" -> why it did not load


#: What foreign code (a study file, a plugin, an entry point) may raise that is its failure, not the user's stop: an
#: exit() at its top level (SystemExit, any code) is a failed import, reported; Ctrl-C (KeyboardInterrupt) stops
FOREIGN_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)


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
            # only a module an import can re-run counts: not __main__, nor code exec'd under a name that
            # sys.modules lacks (pytest-xdist's workers run the test loop as "__channelexec__")
            importable = mod != "__main__" and mod in sys.modules
            source = _FILES.get(mod, mod if importable else None)
            break
        frame = frame.f_back
    REGISTERED[(registry, name)] = source


def sources() -> list[str]:
    """The modules and study files to import so that this process's registered rows exist (in order)."""
    return list(dict.fromkeys(src for src in REGISTERED.values() if src and src.split(".")[0] != PACKAGE))


def unreachable(registry: str, names: Iterable[str]) -> list[str]:
    """Of these rows of `registry`, those registered by a function: no import brings them to another process."""
    return [n for n in names if (registry, n) in REGISTERED and REGISTERED[(registry, n)] is None]


def load_entry_points() -> list[str]:
    """Import every `marin_ablate.plugins` entry point not imported yet (a callable one is called once);
    returns the names of the ones loaded now. One that raises is recorded (`failures()`), not raised: a
    broken installed package must not stop every command, only the runs that need its rows."""
    from importlib.metadata import entry_points  # here: 0.2 s of imports the CLI's start need not wait for

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
        except FOREIGN_FAILURES as e:  # any failure of foreign code is reported, by name
            dist = getattr(getattr(ep, "dist", None), "name", None)
            where = f"{ep.value}, distribution {dist}" if dist else ep.value
            _FAILED_EPS[key] = (f"plugin entry point {ep.name!r} ({where}, group {ENTRY_POINT_GROUP}) failed to load: "
                                f"{type(e).__name__}: {e}")
            continue
        new.append(ep.name)
    return new


def failures() -> list[str]:
    """One line per entry point that failed to load in this process (its rows are missing here)."""
    return list(_FAILED_EPS.values())


def import_source(src: str) -> Any:
    """A recorded source: a study file path (`*.py`) or a module name."""
    return load_file(src) if src.endswith(".py") else importlib.import_module(src)


def load_named(srcs: Iterable[str], flag: str = "--plugin") -> None:
    """The sources the user named on the command line (`flag`): study files by path, or module names.
    ValueError naming the flag and the source when one cannot be imported."""
    for src in srcs:
        try:
            import_source(str(Path(src).expanduser().resolve()) if src.endswith(".py") else src)
        except FOREIGN_FAILURES as e:  # a user's module failing (or exiting) is a bad argument
            raise ValueError(f"{flag} {src!r} cannot be imported: {type(e).__name__}: {e}; allowed values: a "
                             "path/to/file.py or an importable module name") from None


def ensure(srcs: Iterable[str] = ()) -> None:
    """Entry points, then the sources the driver was given, not imported in this process yet (a worker
    calls this before it builds a run; the sources come from the driver's task, never from a folder)."""
    load_entry_points()
    loaded = set(_FILES.values())
    for src in srcs:
        if src in loaded or (not src.endswith(".py") and src in sys.modules):
            continue
        try:
            import_source(src)
        except FOREIGN_FAILURES as e:
            raise ImportError(f"plugin source {src!r} (the driver imported it) cannot be imported here: "
                              f"{type(e).__name__}: {e}") from e


# ---- plugins.json: a record, compared, never imported --------------------------------------------


def _rows() -> list[list[str]]:
    """[registry, name, source] of this process's rows registered by a source outside the package."""
    return [[reg, name, src] for (reg, name), src in REGISTERED.items() if src and src.split(".")[0] != PACKAGE]


def write_record(folder: str | Path) -> None:
    """`plugins.json` in a study folder: which rows came from which source, the old record's kept (a
    later run of the study adds, never forgets). A damaged record is refused (`read_record`)."""
    old = read_record(folder) or {"imports": [], "rows": []}
    srcs = old["imports"] + [s for s in sources() if s not in old["imports"]]
    rows = old["rows"] + [r for r in _rows() if r not in old["rows"]]
    if (srcs, rows) != (old["imports"], old["rows"]):
        atomic_write_json(Path(folder) / PLUGINS_FILE, {"imports": srcs, "rows": rows})


_RECORD_SHAPE = ('{"imports": [source, ...], "rows": [[registry, name, source], ...]} (what `marin-ablate run` '
                 'writes; delete the file and the next run writes it again)')


def read_record(folder: str | Path) -> dict | None:
    """The study folder's `plugins.json` ({"imports": [...], "rows": [[registry, name, source]]}), None when
    absent; ValueError naming the file and what is wrong when it is not that shape. Reading it imports nothing."""
    p = Path(folder) / PLUGINS_FILE
    if not p.is_file():
        return None
    try:
        d = read_json_text(p)
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: unreadable ({e}); allowed values: {_RECORD_SHAPE}") from None
    imports = d.get("imports") if isinstance(d, dict) else None
    rows = d.get("rows", []) if isinstance(d, dict) else None
    if not (isinstance(imports, list) and all(isinstance(s, str) for s in imports)):
        raise ValueError(f"{p}: field 'imports' is {imports!r}; allowed values: {_RECORD_SHAPE}")
    if not (isinstance(rows, list) and all(isinstance(r, list) and len(r) == 3 and all(isinstance(x, str) for x in r)
                                           for r in rows)):
        raise ValueError(f"{p}: field 'rows' is {rows!r}; allowed values: {_RECORD_SHAPE}")
    return {"imports": list(imports), "rows": [list(r) for r in rows]}


def record_notes(folder: str | Path) -> list[str]:
    """What `folder/plugins.json` records that this process lacks or has from another source, one line
    each, with the command-line flag that would import it; a damaged record is one line too. Nothing
    recorded is imported: a study folder received from someone is data."""
    try:
        rec = read_record(folder)
    except ValueError as e:
        return [f"{e} (a record only: nothing is imported from it)"]
    if rec is None:
        return []
    out, missing = [], {}
    for reg, name, src in rec["rows"]:
        here = REGISTERED.get((reg, name), _ABSENT)
        if here is _ABSENT:
            missing.setdefault(src, []).append(f"{reg} {name!r}")
        elif here != src:
            out.append(f"{Path(folder) / PLUGINS_FILE} records {reg} {name!r} from {src}, but this process has it "
                       f"from {here or 'a function'}; the results are read with this process's row")
    for src, rows in missing.items():
        out.append(f"{Path(folder) / PLUGINS_FILE} records {', '.join(rows)} from {src}, not imported (code in or "
                   f"named by a study folder never runs); to use it: --plugin {src}")
    with_rows = {src for _, _, src in rec["rows"]}
    for src in rec["imports"]:  # a source with no row recorded (an older record, or a line someone added)
        if src not in with_rows and src not in sources():
            out.append(f"{Path(folder) / PLUGINS_FILE} records the source {src}, not imported (code in or named by "
                       f"a study folder never runs); to use it: --plugin {src}")
    return out


_ABSENT = object()
