"""`marin-ablate`: one entry point; each subcommand lives with the package that owns it.

The table below is static so that `marin-ablate --help` and `analyze` never import torch; the
owning module is imported only when its command runs. Each owner exposes `cmd_<name>(argv) -> int`,
which parses its options dataclass with one call (`options.parse(RunOptions, argv)`: marin_ablate/options.py).
"""

from __future__ import annotations

import importlib
import signal
import sys

from marin_ablate.marin import plugins

COMMANDS: dict[str, tuple[str, str]] = {
    "studies": ("marin_ablate.common", "the registered studies (plugins' included), one line each"),
    "train": ("marin_ablate.train", "train one run into an output directory"),
    "plan": ("marin_ablate.plan", "print a study's design, alias table, runs and cost (--preset P: a preset's "
                                  "config, parameters, FLOPs)"),
    "run": ("marin_ablate.run", "run a study (local, debug or slurm executor), then analyse it (--tune: the "
                                "per-arm LR profile)"),
    "status": ("marin_ablate.status", "progress of a study's runs"),
    "analyze": ("marin_ablate.analyze", "results table, multipliers, attribution, report and plots (--import.table "
                                        "FILE: read runs from elsewhere; --forecast: pre-register a forecast)"),
    "data": ("marin_ablate.data", "prepare a corpus: tokenize once into token shards with a manifest"),
}

#: Commands that became modes of another: refused (exit 2, before any work) naming the new form.
MOVED: dict[str, str] = {
    "describe": "marin-ablate plan --preset P",
    "tune": "marin-ablate run STUDY --tune [--tune.points N --tune.span S --tune.storage PATH|URL ...]",
    "import": "marin-ablate analyze --import.table FILE [--study-dir DIR] [--import.study NAME]",
    "forecast": "marin-ablate analyze STUDY --forecast --target FLOPS [--forecast.arm ARM --forecast.note TEXT]",
}


def version() -> str:
    """The installed package's version (importlib.metadata: no torch), or "unknown" from a bare checkout."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("marin-ablate")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-V", "--version"):
        print(f"marin-ablate {version()}")
        return 0
    if argv and argv[0] in MOVED:
        print(f"marin-ablate: {argv[0]!r} is now a mode of another command; use {MOVED[argv[0]]} "
              "(docs/cli.md)", file=sys.stderr)
        return 2
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {k:<{width}}  {v[1]}" for k, v in COMMANDS.items()]
        msg = ("usage: marin-ablate COMMAND [options]   (marin-ablate --version; marin-ablate COMMAND --help)\n\n"
               "commands:\n" + "\n".join(lines)
               + "\n\nmodes of a command now (the old names are refused):\n"
               + "\n".join(f"  {k:<{max(width, *map(len, MOVED))}}  {v}" for k, v in MOVED.items()))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"marin-ablate: unknown command {argv[0]!r}; allowed values: {', '.join(COMMANDS)}\n",
                  file=sys.stderr)
            print(msg, file=sys.stderr)
            return 2
        print(msg)
        return 0
    name = argv[0]
    plugins.load_entry_points()  # installed plugins' rows, before any option is checked against a registry
    module = importlib.import_module(COMMANDS[name][0])
    try:
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


#: Commands whose interrupted work the same command line resumes (finished runs are skipped).
RESUMABLE = ("run",)


if __name__ == "__main__":
    sys.exit(main())
