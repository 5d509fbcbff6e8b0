"""A copy of the package laid out as `pip install .` installs it: marin_ablate/ with each layer folder
(marin/, ablations/, sweeps/, planning/, analysis/) inside. A subprocess with the copy first on PYTHONPATH imports
the copy, not the installed checkout (run it from a folder other than the checkout's root, or with
PYTHONSAFEPATH=1, so that the working directory does not come first)."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "marin_ablate"
LAYERS = ("marin", "ablations", "sweeps", "planning", "analysis")


def package_tree(dest: Path, root: Path = ROOT) -> Path:
    """Copy `root`'s package folders into dest/marin_ablate/...; returns dest (the PYTHONPATH entry)."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(root / PACKAGE, dest / PACKAGE, ignore=ignore)
    for layer in LAYERS:
        shutil.copytree(root / layer, dest / PACKAGE / layer, ignore=ignore)
    return dest
