"""The `marin-ablate` command line: `main` dispatches each command to its module here (docs/architecture.md).

Torch-free at import, so `--help`, `plan` and `analyze` start fast; a command that trains imports torch when it runs.
"""
