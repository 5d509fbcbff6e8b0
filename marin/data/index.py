"""A prepared corpus's loader index: written once by `data prepare` (or `data index DIR`), so that a
rank opens a web-scale corpus at a cost that does not grow with it.

The `documents` shuffle (marin/data/shards.py) orders every document by sha256(seed:epoch:uid) at
each (re)start: every rank holds ~150 bytes per document and argsorts them all, which at ~10^10
documents is hours and terabytes per rank. The `indexed` shuffle (`DataConfig.shuffle`) reads
instead a pre-built index, as levanter's loader reads a pre-built cache ledger and permutes fixed
sequences with a Feistel network (levanter `data/permutation.py`, `EraShufflingDataset`):

    index/index.json    written last, atomically: format, the manifest's fingerprint, documents, tokens,
                        domain names and each domain's first document in the base order
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
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np

from marin_ablate.marin.data.manifest import load_npy, read_manifest
from marin_ablate.marin.data.mixture import splitmix64
from marin_ablate.marin.schema import atomic_write_json, read_json_text

INDEX_FORMAT = "marin-index-v1"
INDEX_DIR = "index"
FEISTEL_ROUNDS = 4
#: shard token files kept memory-mapped at once by one rank (a web-scale corpus has ~10^5 shards: more
#: maps than the kernel's default vm.max_map_count would allow)
OPEN_SHARDS = 64
_CHUNK = 1 << 22  # documents per Feistel evaluation while building


def manifest_fingerprint(root: Path) -> str:
    return hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()[:16]


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


def _domain_names(manifest: dict) -> list[str]:
    names: list[str] = []
    for sh in manifest["shards"]:
        for name in sh.get("domains") or [""]:
            if name not in names:
                names.append(name)
    return names or [""]


def build_index(root: str | Path, log=None) -> dict:
    """Write `root/index/` for the prepared corpus at `root` (module docstring); returns index.json.
    Memory while building: ~32 bytes per document, once (a rank reading it holds none of it)."""
    root = Path(root).expanduser()
    manifest = read_manifest(root)
    names = _domain_names(manifest)
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
    cum = np.zeros(n + 1, np.int64)
    np.cumsum(len_N[order], out=cum[1:])
    tokens = int(cum[-1])
    del len_N
    _save_npy(out / "cum.npy", cum)
    del cum
    _save_npy(out / "src.npy", src_N[order])
    _save_npy(out / "shards.npy", shard_starts)
    meta = {"format": INDEX_FORMAT, "manifest": manifest_fingerprint(root), "documents": n, "tokens": tokens,
            "domains": names, "domain_first_doc": first_D.tolist(), "feistel_rounds": FEISTEL_ROUNDS}
    atomic_write_json(out / "index.json", meta)  # last: the index is complete
    if log:
        log(f"{root}: loader index of {n:,} documents written to {out}")
    return meta


def _save_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:  # streamed to disk: a 10^10-document array never exists twice in memory
        np.save(f, arr, allow_pickle=False)
    tmp.replace(path)


def read_index(root: str | Path) -> dict:
    """index.json of a prepared corpus; ValueError naming the command that writes it when it is missing
    or was written for another manifest."""
    root = Path(root).expanduser()
    p = root / INDEX_DIR / "index.json"
    if not p.is_file():
        raise ValueError(f"data.corpus={str(root)!r} has no loader index ({p} missing), which "
                         "DataConfig.shuffle='indexed' reads; write it with `marin-ablate data index "
                         f"{root}` (data prepare writes it), or use DataConfig.shuffle='documents'")
    meta = read_json_text(p)
    if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
        raise ValueError(f"{p}: not a {INDEX_FORMAT} index; write it again with `marin-ablate data index {root}`")
    if meta.get("manifest") != manifest_fingerprint(root):
        raise ValueError(f"{p}: written for another manifest.json (the corpus was prepared again); write it again "
                         f"with `marin-ablate data index {root}`")
    return meta


def has_index(root: str | Path) -> bool:
    try:
        read_index(root)
    except (ValueError, OSError):
        return False
    return True


def _no_readahead(fd: int) -> None:
    """A rank's rows touch scattered pages: the kernel's default readahead would read ~32 pages for each (page
    cache charged to the rank's cgroup that grows with the documents per row)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


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
        _no_readahead(self.fd)

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
        _no_readahead(self.fd)


class IndexedCorpus:
    """A prepared corpus opened through its index: read by position (`PreadArray`: nothing mapped), nothing per
    document in memory."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.manifest = read_manifest(self.path)
        self.fingerprint = manifest_fingerprint(self.path)
        self.meta = read_index(self.path)
        d = self.path / INDEX_DIR
        self.cum = PreadArray(d / "cum.npy")
        self.src = PreadArray(d / "src.npy")
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
        if domain is None:
            a, b = 0, corpus.n_docs
        else:
            a, b = corpus.domain_first_doc[domain], corpus.domain_first_doc[domain + 1]
        self.doc_lo = a
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
