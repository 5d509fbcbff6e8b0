"""A prepared corpus's loader index: written once by `data prepare` (or `data index DIR`), so that a
rank opens a web-scale corpus at a cost that does not grow with it.

The `documents` shuffle (marin/data/shards.py) holds ~150 bytes per document per rank: hours and terabytes
at ~10^10 documents. The `indexed` shuffle (`DataConfig.shuffle`, docs/architecture.md §3 "Data") reads a
pre-built index instead, as levanter's loader reads a pre-built cache ledger and permutes fixed sequences
with a Feistel network (levanter `data/permutation.py`, `EraShufflingDataset`):

    index/index.json    written last, atomically: format, the manifest's fingerprint, documents, tokens,
                        domain names, each domain's first document in the base order, and the size and
                        sha256 of each array below (checked when a rank opens the index: `check_index`)
    index/cum.npy       int64, n_docs + 1: token offset of each document in the base stream
    index/src.npy       int64, n_docs: where that document's tokens start in the shards, as an offset
                        into the shards concatenated in manifest order
    index/shards.npy    int64, n_shards + 1: each shard's first token in that concatenation

The base stream is the documents grouped by domain (in order of first appearance, as
`PreparedCorpus.doc_domains`), each domain's documents in a fixed Feistel permutation of their
storage order (the precomputed deterministic shuffle), concatenated. A component -- the whole base
stream, or one domain's slice of it -- holds n = (tokens - 1) // S windows of S+1 tokens
(`stream[j*S : j*S + S + 1]`, the last < S tokens unread); its sequence g of the run is, with
(e, i) = divmod(g, n), window `feistel(i; seed, epoch e, component)`: every epoch reads every window
once, in an order of its own. A rank reads the arrays and the shards by position (`PreadArray`: pread,
no memory map, no readahead) and only what its rows need (two binary searches in `cum`, a slice of `src`
and one read per document piece per row), so its memory, file-backed pages included, and its start-up
time are flat in the corpus size (`benchmarks/bench_loader_scale.py`; docs/architecture.md §3).

The index is read like input (docs/faults.md; `check_index`). The arrays are written to temporaries and
renamed only once all three are on disk, index.json last; a full disk names the file it was writing.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from marin_ablate.marin.data.manifest import domain_names, load_npy, manifest_fingerprint, read_manifest
from marin_ablate.marin.data.mixture import splitmix64
from marin_ablate.marin.schema import atomic_write_json, read_json_text

INDEX_FORMAT = "marin-index-v2"  # v2: index.json records each array's size and sha256 (v1 did not: written again)
INDEX_DIR = "index"
#: The arrays of an index, in the order they are written; index.json records {"bytes", "sha256"} of each
ARRAYS = ("cum.npy", "src.npy", "shards.npy")
#: Indexes up to this size (the three arrays) are hashed and their invariants checked whole when opened;
#: larger ones by size and end points (`marin-ablate data verify` checks everything): marin.data.shards' rule
FULL_VERIFY_BYTES = 2 << 30
FEISTEL_ROUNDS = 4
#: shard token files kept memory-mapped at once by one rank (a web-scale corpus has ~10^5 shards: more
#: maps than the kernel's default vm.max_map_count would allow)
OPEN_SHARDS = 64
_CHUNK = 1 << 22  # documents per Feistel evaluation while building


def _round_keys(*parts: object) -> list[np.uint64]:
    h = hashlib.sha256(":".join(map(str, ("feistel", *parts))).encode()).digest()
    return [np.uint64(int.from_bytes(h[8 * r:8 * r + 8], "little")) for r in range(FEISTEL_ROUNDS)]


def feistel(i_N: np.ndarray, n: int, keys: list[np.uint64]) -> np.ndarray:
    """A keyed bijection of [0, n) applied to `i_N`: a balanced Feistel network (SplitMix64 round
    function) on the smallest even number of bits covering n, cycle-walked back into [0, n) (Black &
    Rogaway 2002): a permutation with O(1) state, evaluated at any position independently."""
    if n < 1:
        raise ValueError(f"feistel: n={n} must be >= 1")
    x = np.asarray(i_N, np.uint64).copy()
    if n == 1:
        return np.zeros(len(x), np.int64)
    half = max(1, math.ceil(math.log2(n) / 2))
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)

    def once(v: np.ndarray) -> np.ndarray:
        left, right = v >> shift, v & mask
        for k in keys:
            left, right = right, left ^ (splitmix64(right ^ k) & mask)
        return (left << shift) | right

    out = once(x)
    bad = out >= np.uint64(n)
    while bad.any():  # cycle walking: re-apply until the value is back in range (bijective on [0, n))
        out[bad] = once(out[bad])
        bad = out >= np.uint64(n)
    return out.astype(np.int64)


def build_index(root: str | Path, log=None) -> dict:
    """Write `root/index/` for the prepared corpus at `root` (module docstring); returns index.json.
    Memory while building: ~32 bytes per document, once (a rank reading it holds none of it)."""
    root = Path(root).expanduser()
    manifest = read_manifest(root)
    names = domain_names(manifest)
    n = int(manifest["documents"])
    src_N, len_N, dom_N = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int32)
    shard_starts = np.zeros(len(manifest["shards"]) + 1, np.int64)
    at = 0
    for s, sh in enumerate(manifest["shards"]):
        off = np.asarray(load_npy(root / sh["offsets_path"]), np.int64)
        k = len(off) - 1
        if k != sh["documents"] or int(off[-1]) != sh["tokens"]:
            raise ValueError(f"{root / sh['offsets_path']}: {k} documents / {int(off[-1])} tokens, manifest says "
                             f"{sh['documents']} / {sh['tokens']}; prepare the corpus again")
        src_N[at:at + k] = shard_starts[s] + off[:-1]
        len_N[at:at + k] = np.diff(off)
        if manifest.get("domain_column") and k:
            remap = np.array([names.index(x) for x in sh["domains"]], np.int32)
            dom_N[at:at + k] = remap[np.asarray(load_npy(root / sh["domain_path"]), np.int64)]
        shard_starts[s + 1] = shard_starts[s] + sh["tokens"]
        at += k
    if at != n:
        raise ValueError(f"{root / 'manifest.json'}: shards hold {at} documents, manifest says {n}; prepare again")
    # the base order: by domain, then a fixed Feistel permutation of each domain's storage order
    by_dom = np.argsort(dom_N, kind="stable")
    count_D = np.bincount(dom_N, minlength=len(names))
    first_D = np.concatenate([[0], np.cumsum(count_D)]).astype(np.int64)
    order = np.empty(n, np.int64)
    for d in range(len(names)):
        a, b = int(first_D[d]), int(first_D[d + 1])
        keys = _round_keys("index", d)
        for c in range(a, b, _CHUNK):  # chunked: the network's temporaries stay small at 10^10 documents
            order[c:min(b, c + _CHUNK)] = by_dom[a:b][feistel(np.arange(c - a, min(b, c + _CHUNK) - a), b - a, keys)]
    del by_dom, dom_N
    out = root / INDEX_DIR
    out.mkdir(exist_ok=True)
    (out / "index.json").unlink(missing_ok=True)  # the index is incomplete from here until it is written again
    files, written = {}, []
    try:
        cum = np.zeros(n + 1, np.int64)
        np.cumsum(len_N[order], out=cum[1:])
        tokens = int(cum[-1])
        del len_N
        files["cum.npy"] = _save_npy(out / "cum.npy", cum, written)
        del cum
        files["src.npy"] = _save_npy(out / "src.npy", src_N[order], written)
        files["shards.npy"] = _save_npy(out / "shards.npy", shard_starts, written)
        for tmp in written:  # all three are on disk: only now do they replace an older index's
            tmp.replace(out / tmp.name[1:-len(".tmp")])
        written.clear()
        meta = {"format": INDEX_FORMAT, "manifest": manifest_fingerprint(root), "documents": n, "tokens": tokens,
                "domains": names, "domain_first_doc": first_D.tolist(), "feistel_rounds": FEISTEL_ROUNDS,
                "files": files}
        atomic_write_json(out / "index.json", meta)  # last: the index is complete
    except BaseException as e:
        for tmp in written:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            where = e.filename or (str(out / written[-1].name[1:-len(".tmp")]) if written else str(out))
            raise OSError(errno.ENOSPC, f"disk full (no space left on device) while writing the loader index; free "
                                        f"space there and run `marin-ablate data index {root}` again", where) from e
        raise
    if log:
        log(f"{root}: loader index of {n:,} documents written to {out}")
    return meta


class _Hashing:
    """A file object that hashes what it writes (np.save into it streams the array in chunks)."""

    def __init__(self, f: Any):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, b: Any) -> int:
        self.h.update(b)
        self.n += len(memoryview(b).cast("B"))
        return self.f.write(b)


def _save_npy(path: Path, arr: np.ndarray, written: list[Path]) -> dict:
    """`arr` into the temporary `.NAME.tmp` beside `path` (appended to `written` first, so that a failure removes
    it); returns its {"bytes", "sha256"}. A full disk names `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    written.append(tmp)
    try:
        with open(tmp, "wb") as f:  # streamed to disk: a 10^10-document array never exists twice in memory
            h = _Hashing(f)
            np.save(h, arr, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    return {"bytes": h.n, "sha256": h.h.hexdigest()}


def read_index(root: str | Path, *, check: bool = True) -> dict:
    """index.json of a prepared corpus, and (`check`) its arrays checked (`check_index`); ValueError naming the file
    and the command that writes the index again when it is missing, damaged or written for another manifest."""
    root = Path(root).expanduser()
    p = root / INDEX_DIR / "index.json"
    again = f"write it again with `marin-ablate data index {root}`"
    if not p.is_file():
        raise ValueError(f"data.corpus={str(root)!r} has no loader index ({p} missing), which "
                         "DataConfig.shuffle='indexed' reads; write it with `marin-ablate data index "
                         f"{root}` (data prepare writes it), or use DataConfig.shuffle='documents'")
    try:
        meta = read_json_text(p)
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: cannot read ({e}); {again}") from None
    if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{p}: not a {INDEX_FORMAT} index (format {found!r}); {again}")
    if meta.get("manifest") != manifest_fingerprint(root):
        raise ValueError(f"{p}: written for another manifest.json (the corpus was prepared again); {again}")
    why = _bad_fields(meta)
    if why:
        raise ValueError(f"{p}: {why}; {again}")
    if check:
        check_index(root, meta)
    return meta


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _bad_fields(meta: dict) -> str | None:
    """What in index.json is not of its type (documents, tokens, domains, domain_first_doc, files), else None."""
    n = meta.get("documents")
    if not _count(n) or not _count(meta.get("tokens")):
        return (f"documents={n!r}, tokens={meta.get('tokens')!r}; allowed values: integers >= 0")
    names, first = meta.get("domains"), meta.get("domain_first_doc")
    if not isinstance(names, list) or not names or not all(isinstance(x, str) for x in names):
        return f"domains={names!r}; allowed values: a non-empty list of domain names"
    if (not isinstance(first, list) or len(first) != len(names) + 1 or not all(map(_count, first))
            or first[0] != 0 or first[-1] != n or any(a > b for a, b in zip(first, first[1:], strict=False))):
        return (f"domain_first_doc={first!r}; allowed values: {len(names) + 1} non-decreasing integers from 0 to "
                f"documents={n}")
    files = meta.get("files")
    if not isinstance(files, dict) or set(files) != set(ARRAYS) or not all(
            isinstance(f, dict) and _count(f.get("bytes")) and isinstance(f.get("sha256"), str)
            for f in files.values()):
        return f"files={files!r}; allowed values: {{bytes, sha256}} of each of {', '.join(ARRAYS)}"
    return None


_CHECKED: dict[tuple, bool] = {}  # (index folder, index.json and array stamps, full) -> checked in this process


def check_index(root: str | Path, meta: dict, full: bool | None = None) -> None:
    """The arrays of the index `meta` (read_index's) checked before a rank reads them, once per process and state
    of the files: each array present, a 1-d int64 .npy of its length and recorded size; with `full` (default: the
    arrays together at most FULL_VERIFY_BYTES) also its recorded sha256, `cum` non-decreasing from 0 to the tokens,
    `src` within the shards; at any size the end points (`cum`'s first and last, `shards` = the manifest's shard
    offsets). ValueError naming the file."""
    root = Path(root).expanduser()
    d = root / INDEX_DIR
    files = meta["files"]
    stamps = []
    for name in ("index.json", *ARRAYS):
        try:
            st = (d / name).stat()
        except FileNotFoundError:
            raise ValueError(f"{d / name}: missing from the loader index; write it again with "
                             f"`marin-ablate data index {root}`") from None
        stamps.append((st.st_size, st.st_mtime_ns, st.st_ino))
    if full is None:
        full = sum(files[a]["bytes"] for a in ARRAYS) <= FULL_VERIFY_BYTES
    key = (str(d.resolve()), tuple(stamps), full)
    if key in _CHECKED:
        return
    n, tokens = int(meta["documents"]), int(meta["tokens"])
    manifest = read_manifest(root)
    shard_tokens = np.array([0, *(int(sh["tokens"]) for sh in manifest["shards"])], np.int64)
    want_len = {"cum.npy": n + 1, "src.npy": n, "shards.npy": len(shard_tokens)}
    arrays = {}
    for name in ARRAYS:
        p, rec = d / name, files[name]
        fault, a = _array_fault(p, rec, want_len[name], full)
        if fault is None:
            arrays[name] = a
            fault = _invariant_fault(name, a, tokens, np.cumsum(shard_tokens), arrays, full)
        if fault is not None:
            raise ValueError(f"{p}: {fault}; the index was changed after it was written: write it again with "
                             f"`marin-ablate data index {root}`")
    for a in arrays.values():  # what the check read leaves the page cache: the rank's charge stays flat
        _fadvise(a.fd, "DONTNEED")
        a.close()
    _CHECKED[key] = True


def _array_fault(p: Path, rec: dict, length: int, full: bool) -> tuple[str | None, PreadArray | None]:
    """(what is wrong with one array file, else None; the array, read by position)."""
    size = p.stat().st_size
    if size != rec["bytes"]:
        return f"{size} bytes, index.json says {rec['bytes']}", None
    try:
        a = PreadArray(p)
    except (ValueError, OSError, EOFError) as e:  # truncated, garbage, or an object array (it would unpickle)
        return f"not a .npy array of integers ({e})", None
    if a.dtype != np.int64 or len(a) != length or a.offset + len(a) * a.dtype.itemsize != size:
        a.close()
        return (f"a {a.dtype} array of {len(a)} entries in {size} bytes; allowed values: a 1-d int64 array of "
                f"{length} entries"), None
    if full and _sha256_read(p) != rec["sha256"]:
        a.close()
        return "content differs from index.json (sha256)", None
    return None, a


#: Entries per slice of the invariant checks: a rank's memory while opening stays flat in the corpus size
_CHECK_CHUNK = 2048


def _invariant_fault(name: str, a: np.ndarray, tokens: int, shard_starts: np.ndarray, arrays: dict,
                     full: bool) -> str | None:
    """What breaks the index's invariants in array `name` (`arrays`: the ones checked before it), else None;
    read in slices of _CHECK_CHUNK entries."""
    if name == "cum.npy":
        if int(a[0]) != 0 or int(a[-1]) != tokens:
            return f"token offsets run from {int(a[0])} to {int(a[-1])}; allowed values: from 0 to tokens={tokens}"
        for lo in range(0, len(a) - 1, _CHECK_CHUNK) if full else ():
            step = np.diff(a[lo:lo + _CHECK_CHUNK + 1])
            if int(step.min()) < 0:
                i = lo + int(np.argmin(step))
                return (f"token offsets decrease at document {i} ({int(a[i])} -> {int(a[i + 1])}); allowed values: "
                        "non-decreasing offsets")
    elif name == "src.npy":
        cum, top = arrays["cum.npy"], int(shard_starts[-1])
        for lo in range(0, len(a), _CHECK_CHUNK) if full else ():
            src = a[lo:lo + _CHECK_CHUNK]
            bad = np.flatnonzero((src < 0) | (src + np.diff(cum[lo:lo + len(src) + 1]) > top))
            if len(bad):
                i = lo + int(bad[0])
                return (f"document {i} starts at shard offset {int(a[i])}; allowed values: offsets in 0..{top} with "
                        "the whole document inside the shards")
    elif name == "shards.npy" and not np.array_equal(a[:], shard_starts):
        return (f"shard offsets {a[:6].tolist()}... differ from manifest.json's "
                f"{shard_starts[:6].tolist()}...")
    return None


def _fadvise(fd: int, advice: str, lo: int = 0, n: int = 0) -> None:
    """posix_fadvise where the platform has it. DONTNEED drops a file's clean pages from the page cache (a
    check that read a whole index leaves no charge behind); RANDOM turns readahead off: a rank's rows touch
    scattered pages, and the default would read ~32 pages for each (page cache charged to the rank's cgroup
    that grows with the documents per row)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, lo, n, getattr(os, f"POSIX_FADV_{advice}"))


def _sha256_read(p: Path) -> str:
    """sha256 of a file in 32 KiB preads, nothing mapped, each range dropped from the page cache once hashed: the
    rank's memory, its file-backed pages and its cgroup's page-cache charge stay flat at any size."""
    h, step = hashlib.sha256(), 1 << 15
    fd = os.open(p, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        for lo in range(0, size, step):
            h.update(os.pread(fd, min(step, size - lo), lo))
            _fadvise(fd, "DONTNEED", lo, step)
    finally:
        os.close(fd)
    return h.hexdigest()


def verify_index(root: str | Path) -> dict | None:
    """`marin-ablate data verify`'s check of the loader index at any size (every sha256 and invariant): its
    index.json, or None when the corpus has none."""
    root = Path(root).expanduser()
    if not (root / INDEX_DIR).exists():
        return None
    meta = read_index(root, check=False)
    check_index(root, meta, full=True)
    return meta


def has_index(root: str | Path) -> bool:
    try:
        read_index(root)
    except (ValueError, OSError):
        return False
    return True


class PreadArray:
    """A 1-d array on disk (a .npy file, or raw `dtype` values from `offset`) read by position with pread: nothing
    is mapped. A memory map's page faults bring whole page-cache folios into the rank (on kernels that map large
    folios at once: most of each 60 MB shard for ~880 scattered pieces, measured), so its file-backed RSS grew
    with the corpus; a pread copies out the bytes asked for and maps nothing. `a[i]`, `a[i:j]` and `len(a)` as an
    array's; `searchsorted` reads O(log n) values."""

    BLOCK = 512  # values read at once at the end of a search (4 KiB of int64)

    def __init__(self, path: str | Path, dtype: np.dtype | None = None, offset: int = 0, n: int | None = None):
        self.path = Path(path)
        if dtype is None:  # a .npy file: its header says dtype, shape and where the values start
            with open(self.path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(f)
                offset = f.tell()
            if len(shape) != 1 or fortran or dtype.hasobject:
                raise ValueError(f"{self.path}: a {dtype} array of shape {shape}; allowed values: a 1-d numeric array; "
                                 "write the index again with `marin-ablate data index`")
            n = shape[0]
        self.dtype, self.offset = np.dtype(dtype), int(offset)
        self.fd = os.open(self.path, os.O_RDONLY)
        if n is None:
            n = (os.fstat(self.fd).st_size - self.offset) // self.dtype.itemsize
        self.n = int(n)
        _fadvise(self.fd, "RANDOM")

    def __len__(self) -> int:
        return self.n

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Values [lo, hi) (clipped to the array), a fresh array."""
        lo, hi = max(0, int(lo)), min(self.n, int(hi))
        if hi <= lo:
            return np.zeros(0, self.dtype)
        size = self.dtype.itemsize
        want = (hi - lo) * size
        buf = os.pread(self.fd, want, self.offset + lo * size)
        if len(buf) != want:
            raise ValueError(f"{self.path}: {len(buf)} bytes at value {lo}, expected {want} (the file is shorter than "
                             "its header says); write it again with `marin-ablate data index`")
        return np.frombuffer(buf, self.dtype).copy()

    def __getitem__(self, key: int | slice) -> np.ndarray | np.generic:
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.n)
            return self.read(lo, hi)[::step] if step != 1 else self.read(lo, hi)
        i = int(key) + (self.n if int(key) < 0 else 0)
        if not 0 <= i < self.n:
            raise IndexError(f"index {key} is out of bounds for {self.path} of {self.n} values")
        return self.read(i, i + 1)[0]

    def searchsorted(self, v: int, side: str = "left") -> int:
        """np.searchsorted of this (sorted) array for `v`: a binary search reading one value per halving, then
        one block."""
        lo, hi = 0, self.n
        while hi - lo > self.BLOCK:
            mid = (lo + hi) // 2
            x = self.read(mid, mid + 1)[0]
            if x < v or (side == "right" and x == v):
                lo = mid + 1
            else:
                hi = mid
        return lo + int(np.searchsorted(self.read(lo, hi), v, side=side))

    def close(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict:  # a copy in another process opens its own descriptor
        return {k: v for k, v in self.__dict__.items() if k != "fd"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.fd = os.open(self.path, os.O_RDONLY)
        _fadvise(self.fd, "RANDOM")


class IndexedCorpus:
    """A prepared corpus opened through its index: read by position (`PreadArray`: nothing mapped), nothing per
    document in memory."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.manifest = read_manifest(self.path)
        self.fingerprint = manifest_fingerprint(self.path)
        self.meta = read_index(self.path)
        d = self.path / INDEX_DIR
        self.cum, self.src = PreadArray(d / "cum.npy"), PreadArray(d / "src.npy")
        self.shard_starts = np.asarray(np.load(d / "shards.npy", allow_pickle=False), np.int64)
        self.dtype = np.dtype(self.manifest["dtype"])
        self.n_docs, self.n_tokens = int(self.meta["documents"]), int(self.meta["tokens"])
        if len(self.cum) != self.n_docs + 1 or len(self.src) != self.n_docs:
            raise ValueError(f"{d}: arrays of {len(self.cum) - 1} / {len(self.src)} documents, index.json says "
                             f"{self.n_docs}; write it again with `marin-ablate data index {self.path}`")
        self.domains: list[str] = list(self.meta["domains"])
        self.domain_first_doc: list[int] = list(self.meta["domain_first_doc"])
        self._shards: dict[int, PreadArray] = {}

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    def _shard(self, s: int) -> PreadArray:
        if s not in self._shards:
            if len(self._shards) >= OPEN_SHARDS:
                self._shards.pop(next(iter(self._shards))).close()
            sh = self.manifest["shards"][s]
            self._shards[s] = PreadArray(self.path / sh["tokens_path"], self.dtype, n=sh["tokens"])
        return self._shards[s]

    def window(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, docs) of base-stream positions [lo, hi): the token ids and each one's document
        (its position in the base order), one read per document piece from its shard."""
        k0 = self.cum.searchsorted(lo, side="right") - 1
        k1 = self.cum.searchsorted(hi - 1, side="right") - 1
        cum_K = np.asarray(self.cum[k0:k1 + 2], np.int64)
        src_K = np.asarray(self.src[k0:k1 + 1], np.int64)
        a_K, b_K = np.maximum(cum_K[:-1], lo), np.minimum(cum_K[1:], hi)  # each piece's stream positions
        g_K = src_K + (a_K - cum_K[:-1])  # where it starts in the concatenated shards (a document is in one)
        s_K = np.searchsorted(self.shard_starts, g_K, side="right") - 1
        tokens = np.empty(hi - lo, np.int64)
        for a, b, g, s in zip(a_K.tolist(), b_K.tolist(), g_K.tolist(), s_K.tolist(), strict=True):
            if b > a:
                at = g - int(self.shard_starts[s])
                tokens[a - lo:b - lo] = self._shard(s).read(at, at + b - a)
        return tokens, np.repeat(np.arange(k0, k1 + 1, dtype=np.int64), np.maximum(b_K - a_K, 0))


class IndexedStream:
    """One component of an indexed corpus -- the whole base stream, or domain `domain`'s slice of it
    -- as sequences of S+1-token windows in a per-(seed, epoch) Feistel order (module docstring)."""

    def __init__(self, corpus: IndexedCorpus, seed: int, domain: int | None = None):
        self.corpus, self.seed, self.component = corpus, int(seed), "all" if domain is None else f"domain{domain}"
        first = corpus.domain_first_doc
        a, b = (0, corpus.n_docs) if domain is None else (first[domain], first[domain + 1])
        self.tok_lo, self.tok_hi = int(corpus.cum[a]), int(corpus.cum[b])
        self.n_tokens = self.tok_hi - self.tok_lo
        self.n_docs = b - a
        self._keys: dict[int, list[np.uint64]] = {}

    def n_windows(self, S: int) -> int:
        return max(0, (self.n_tokens - 1) // S)

    def window_ids(self, idx_R: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray]:
        """(epoch_R, window_R): which window of the component each sequence index reads."""
        n = self.n_windows(S)
        if n < 1:
            raise ValueError(f"a component of {self.corpus.path} has {self.n_tokens} tokens, fewer than one sequence "
                             f"of {S} + 1")
        e_R, i_R = np.divmod(np.asarray(idx_R, np.int64), n)
        w_R = np.empty(len(i_R), np.int64)
        for e in np.unique(e_R).tolist():
            if e not in self._keys:
                self._keys = {e: _round_keys(self.seed, e, self.component, S)}  # one epoch at a time
            m = e_R == e
            w_R[m] = feistel(i_R[m], n, self._keys[e])
        return e_R, w_R

    def rows(self, idx_R: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens_RW, docs_RW) of the component's sequences `idx_R`; a document key is unique per
        (epoch, document), as `DocStream.read`'s."""
        e_R, w_R = self.window_ids(idx_R, S)
        tokens_RW, docs_RW = np.empty((len(w_R), S + 1), np.int64), np.empty((len(w_R), S + 1), np.int64)
        for r, (e, w) in enumerate(zip(e_R.tolist(), w_R.tolist(), strict=True)):
            lo = self.tok_lo + w * S
            tokens_RW[r], doc = self.corpus.window(lo, lo + S + 1)
            docs_RW[r] = e * self.corpus.n_docs + doc
        return tokens_RW, docs_RW
