"""`marin-ablate`: one entry point. The table is static so that `--help` and `analyze` never import torch: a
command's module is imported when it runs, and its `cmd_<name>(argv)` parses its options dataclass (parse.py).
A bad option or setting is one line and exit 2, before any work; Ctrl-C is an interrupt, not a traceback."""

from __future__ import annotations

import importlib
import signal
import sys

from marin_ablate.marin import plugins

COMMANDS: dict[str, tuple[str, str]] = {
    "studies": ("common", "the registered studies (plugins' included), one line each"),
    "train": ("train", "train one run into an output directory"),
    "plan": ("plan", "print a study's design, alias table, runs and cost (--preset P: a preset's config, parameters, "
                     "FLOPs)"),
    "run": ("run", "run a study (local, debug or slurm executor), then analyse it (--tune: the per-arm LR profile)"),
    "status": ("status", "progress of a study's runs"),
    "analyze": ("analyze", "results table, multipliers, attribution, report and plots (--import.table FILE: read runs "
                           "from elsewhere; --forecast: pre-register a forecast)"),
    "data": ("data", "prepare a corpus: tokenize once into token shards with a manifest"),
}

#: Commands that became modes of another: refused (exit 2, before any work) naming the new form.
MOVED: dict[str, str] = {
    "describe": "marin-ablate plan --preset P",
    "tune": "marin-ablate run STUDY --tune [--tune.points N --tune.span S --tune.storage PATH|URL ...]",
    "import": "marin-ablate analyze --import.table FILE [--study-dir DIR] [--import.study NAME]",
    "forecast": "marin-ablate analyze STUDY --forecast --target FLOPS [--forecast.arm ARM --forecast.note TEXT]",
}

#: Commands whose interrupted work the same command line resumes (finished runs are skipped).
RESUMABLE = ("run",)


def version() -> str:
    """The installed package's version (importlib.metadata: no torch), or "unknown" from a bare checkout."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("marin-ablate")
    except PackageNotFoundError:
        return "unknown"


def usage() -> str:
    width = max(map(len, [*COMMANDS, *MOVED]))
    return ("usage: marin-ablate COMMAND [options]   (marin-ablate --version; marin-ablate COMMAND --help)\n\n"
            "commands:\n" + "\n".join(f"  {k:<{width}}  {v[1]}" for k, v in COMMANDS.items())
            + "\n\nmodes of a command now (the old names are refused):\n"
            + "\n".join(f"  {k:<{width}}  {v}" for k, v in MOVED.items()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv else ""
    if name in ("-V", "--version"):
        print(f"marin-ablate {version()}")
        return 0
    if name in MOVED:
        print(f"marin-ablate: {name!r} is now a mode of another command; use {MOVED[name]} (docs/cli.md)",
              file=sys.stderr)
        return 2
    if name not in COMMANDS:
        if name and name not in ("-h", "--help"):
            print(f"marin-ablate: unknown command {name!r}; allowed values: {', '.join(COMMANDS)}\n\n{usage()}",
                  file=sys.stderr)
            return 2
        print(usage())
        return 0
    try:  # Ctrl-C while the command's modules import (pandas, torch: seconds) is an interrupt too, not a traceback
        plugins.load_entry_points()  # installed plugins' rows, before any option is checked against a registry
        for line in plugins.failures():  # a broken installed plugin is named; commands that do not need it go on
            print(f"marin-ablate: warning: {line}; its rows are missing (fix or uninstall that package)",
                  file=sys.stderr)
        module = importlib.import_module(f"marin_ablate.cli.{COMMANDS[name][0]}")
        return int(getattr(module, f"cmd_{name}")(argv[1:]) or 0)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"marin-ablate {name}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file or folder the command cannot use: name it; anything else keeps its traceback
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f)
        print(f"marin-ablate {name}: error: {where + ': ' if where else ''}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: finished runs are kept; running again resumes the rest
        signum = int(getattr(e, "signum", signal.SIGINT))
        print(f"marin-ablate {name}: interrupted ({signal.Signals(signum).name})"
              + (f"; finished runs are kept: `marin-ablate {name} {argv[1]}` with the same options resumes the rest"
                 if name in RESUMABLE and len(argv) > 1 else ""), file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
