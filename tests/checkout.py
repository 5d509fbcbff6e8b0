"""A copy of the checkout (its tracked files and the untracked ones git does not ignore, links kept as links) that
imports as the package: marin_ablate/ holds a relative link to each layer folder (docs/architecture.md §1), so with
the copy first on PYTHONPATH `marin_ablate` and all its layers are the copy's. Run a subprocess over it from a folder
other than the checkout's root, or with PYTHONSAFEPATH=1, so that the working directory does not come first."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(dest: Path, root: Path = ROOT) -> Path:
    """Copy `root`'s files into `dest` (created); returns dest, the PYTHONPATH entry of the copy."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        src = root / rel
        if src.is_symlink() or src.is_file():  # a deleted, not yet committed file is neither
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest
