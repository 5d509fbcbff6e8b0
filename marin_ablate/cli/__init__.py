"""The `marin-ablate` command line (docs/cli.md): `main` dispatches each command to its module here; each command's
options are a dataclass that tyro parses (`parse.py`). The command modules only parse, call into the layers below
and print; torch-free at import, so `--help`, `plan` and `analyze` start fast."""
