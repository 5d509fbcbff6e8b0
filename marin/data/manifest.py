"""A prepared corpus's files as `marin-ablate data prepare` writes them, read back with their checks: the manifest
(`read_manifest`) and the integer arrays beside the token shards (`load_npy`). Torch-free: plan-time epoch accounting
(ablations/epochs.py) and the loader index (marin/data/index.py) read them without the loader."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from marin_ablate.marin.schema import read_json_text

FORMAT = "marin-tokens-v1"

MANIFEST_KEYS = ("tokenizer", "dtype", "tokens", "documents", "shards")


def setting_path(value: str, field: str) -> Path:
    """The path a data setting names (`field`: DataConfig.corpus, DataConfig.eval_dir), usable as one: a name the
    system refuses to look up (too long, not permitted) is a ValueError naming the field, not an OSError."""
    p = Path(value).expanduser()
    try:
        p.exists()
    except OSError as e:
        shown = f"{value[:100]!r}{'...' if len(value) > 100 else ''}"
        raise ValueError(f"{field}={shown}: cannot be used as a path ({e.strerror}); allowed values: an existing "
                         "directory or file") from None
    return p


def read_manifest(path: str | Path) -> dict:
    """The manifest of a prepared corpus directory (torch-free: plan-time epoch accounting uses it)."""
    p = Path(path).expanduser()
    m = p / "manifest.json" if p.is_dir() else p
    if not m.is_file():
        raise ValueError(f"data.corpus={str(path)!r} is not a prepared corpus (no manifest.json); "
                         "run `marin-ablate data prepare SOURCE --tokenizer PATH --corpus-dir DIR` first")
    try:
        manifest = read_json_text(m)
    except (OSError, ValueError) as e:
        raise ValueError(f"{m}: not a readable JSON file ({e}); prepare the corpus again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{m}: format {got!r} is not {FORMAT!r}; prepare the corpus again")
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise ValueError(f"{m}: fields {', '.join(missing)} missing; prepare the corpus again")
    return manifest


def manifest_fingerprint(root: Path) -> str:
    """The corpus fingerprint a loader state, a checkpoint and the loader index record: manifest.json's sha256."""
    return hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()[:16]


def domain_names(manifest: dict) -> list[str]:
    """The corpus's domains in order of first appearance over the shards (`[""]` without any)."""
    names: list[str] = []
    for sh in manifest["shards"]:
        names += [n for n in sh.get("domains", []) if n not in names]
    return names or [""]


def load_npy(path: Path) -> np.ndarray:
    """An integer .npy the harness wrote (offsets, domains): anything else, an object array above all (its
    load would unpickle), is refused naming the file."""
    try:
        a = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not an integer .npy array ({e}); prepare the corpus again") from None
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu" or a.ndim != 1:
        raise ValueError(f"{path}: holds a {getattr(a, 'dtype', type(a).__name__)} array of shape "
                         f"{getattr(a, 'shape', '?')}; allowed values: a 1-d integer array; prepare the corpus again")
    return a
