"""Checkpoints: one format for one process and for any world size, loaded without running code.

`checkpoints/ckpt_<step:09d>/` holds dcp/ (model + optimizer: DCP reshards, so any layout loads any other),
rng_<rank>.pt and, written last by rank 0, meta.json (docs/architecture.md §3): a directory without it is
not a checkpoint.

Distributed runs write asynchronously (marin.parallel.AsyncCheckpointer, DCP async_save): `begin_save`
stages the shards in host memory and training goes on while a thread writes them; `commit` (at the
next checkpoint, at the end of the run, or at once on a preemption) waits for every rank's write
before meta.json is written, so a checkpoint never names data that is not on disk.

Safety and resume: docs/architecture.md §3 (DCP's metadata pickle through `_MetadataUnpickler`). The layout
follows torchtitan's checkpointer (torchtitan/components/checkpoint.py `CheckpointManager`): DCP for state, a
step-named folder, keep-last-k.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import io
import json
import logging
import pickle
import random
import re
import shutil
from pathlib import Path, PosixPath
from typing import Any, Callable

import torch
import torch.distributed as dist

from marin_ablate.marin import ep
from marin_ablate.marin.schema import atomic_write_text, read_json_text
from marin_ablate.marin.train import files as run_files
from marin_ablate.marin.train.files import atomic_write, disk_full_error, file_digest, is_disk_full
from marin_ablate.marin.update_rules import local_part

log = logging.getLogger("marin_ablate.marin.train")

FORMAT = 1
KEEP_LAST = 2  # while a run trains: the newest two that verify (one may be cut short by a kill)
#: retention level -> checkpoints a completed run keeps (None: all it wrote, never pruned; "none": its
#: summary and metrics are the result, as for a study's CPU runs, which retrain in seconds)
RETENTION: dict[str, int | None] = {"final": 1, "all": None, "none": 0}
META = "meta.json"
_NAME_RE = re.compile(r"^ckpt_(\d{9})$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: damaged, incomplete, or of another run."""


# ---- RNG state as tensors and plain containers (weights_only-loadable) ---------------------------


def rng_state(device: torch.device) -> dict:
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    st["python_meta"] = [random.getstate()[0], random.getstate()[2]]
    with contextlib.suppress(ImportError):
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        st["numpy"] = [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: dict, device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    version, gauss = st["python_meta"]
    random.setstate((version, tuple(st["python"]), gauss))
    if "numpy" in st:
        import numpy as np

        name, keys, pos, has_gauss, cached = st["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in st and device.type == "cuda":
        torch.cuda.set_rng_state(st["cuda"], device)


# ---- DCP without arbitrary unpickling ------------------------------------------------------------


#: DCP's metadata classes (torch.distributed.checkpoint.metadata): the dataclasses its .metadata pickle builds
_DCP_METADATA = ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "ChunkStorageMetadata")


def _metadata_classes() -> dict[tuple[str, str], Any]:
    """Every (module, name) DCP's .metadata pickle refers to, resolved here by attribute access on
    modules we import (never by the pickle's own lookup, which follows dotted names)."""
    import torch.distributed.checkpoint.filesystem as fs
    import torch.distributed.checkpoint.metadata as md
    import torch.serialization as ser

    mod = "torch.distributed.checkpoint.metadata"
    allowed = {(mod, n): getattr(md, n) for n in (*_DCP_METADATA, "_MEM_FORMAT_ENCODING")}
    allowed[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = fs._StorageInfo
    allowed[("torch.serialization", "_get_layout")] = ser._get_layout  # name -> torch.layout, a dict lookup
    allowed[("torch", "Size")] = torch.Size
    allowed[("pathlib", "PosixPath")] = PosixPath  # StorageMeta.checkpoint_id: a path, never opened
    allowed.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
    return allowed


def _buildable() -> tuple[type, ...]:
    """The classes whose instances DCP's metadata pickle fills in with BUILD (dataclass state)."""
    import torch.distributed.checkpoint.filesystem as fs
    import torch.distributed.checkpoint.metadata as md

    return (*(getattr(md, n) for n in _DCP_METADATA), fs._StorageInfo)


class _MetadataUnpickler(pickle._Unpickler):
    """DCP's .metadata is a pickle: an exact allow-list of (module, name) pairs, nothing else (a module
    prefix would admit `os.system` through a dotted name under protocol >= 4), and BUILD (the opcode
    that sets attributes) only on a fresh instance of exactly one of DCP's metadata classes, with that
    class's own fields: a BUILD on an allowed class itself would rewrite it (say its `__repr__`) for the
    rest of the process. The pure-Python unpickler: the C one's opcodes cannot be checked one by one."""

    _allowed: dict[tuple[str, str], Any] | None = None
    _build: tuple[type, ...] | None = None
    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str):
        if _MetadataUnpickler._allowed is None:
            _MetadataUnpickler._allowed = _metadata_classes()
        found = _MetadataUnpickler._allowed.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which a checkpoint "
                                         "never holds: refusing to load it")
        return found

    def persistent_load(self, pid):  # DCP metadata holds no persistent references
        raise pickle.UnpicklingError("checkpoint metadata holds a persistent reference: refusing to load it")

    def _checked_build(self) -> None:
        if _MetadataUnpickler._build is None:
            _MetadataUnpickler._build = _buildable()
        state, inst = self.stack[-1], self.stack[-2]
        cls = type(inst)
        if cls not in _MetadataUnpickler._build:
            what = inst.__name__ if isinstance(inst, type) else cls.__name__
            raise pickle.UnpicklingError(f"checkpoint metadata sets attributes on {what}, which a checkpoint never "
                                         "does: refusing to load it")
        if "__setstate__" not in vars(cls):  # a plain dataclass: its state is a dict of its own fields
            slots = state[1] if isinstance(state, tuple) and len(state) == 2 else None
            d = state[0] if isinstance(state, tuple) and len(state) == 2 else state
            names = {f.name for f in dataclasses.fields(cls)}
            for part in (d, slots):
                if part is not None and (not isinstance(part, dict) or not set(part) <= names):
                    bad = sorted(map(str, set(part) - names)) if isinstance(part, dict) else type(part).__name__
                    raise pickle.UnpicklingError(f"checkpoint metadata sets {bad} on {cls.__name__}, which has no "
                                                 "such field: refusing to load it")
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = _checked_build


def _safe_dcp():
    """(storage reader class, load planner class) that never run code from the checkpoint."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            with open(Path(self.path) / ".metadata", "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            from torch.distributed.checkpoint._traverse import set_element as _set

            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                _set(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeReader, SafePlanner


# ---- Save ----------------------------------------------------------------------------------------


def checkpoint_dirs(ckdir: Path) -> list[Path]:
    """Checkpoint directories by step, newest first (temporaries and other names are not listed)."""
    found = [p for p in ckdir.glob("ckpt_*") if p.is_dir() and _NAME_RE.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


@dataclasses.dataclass
class PendingSave:
    """A checkpoint whose shards are being written (`begin_save`); `commit` makes it a checkpoint."""

    ckdir: Path
    name: str
    meta: dict  # meta.json less the file digests
    writer: Any  # marin.parallel.AsyncCheckpointer, or None (already written)
    rank: int
    world: int
    keep: int | None = KEEP_LAST  # prune to this many after the commit (None: keep every one)

    @property
    def tmp(self) -> Path:
        return self.ckdir / f".{self.name}.tmp"


def _failed(p: PendingSave, e: BaseException, need: int | None = None) -> BaseException:
    """Clean up after a failed write; the error to raise (disk full: one that says so, with the bytes needed)."""
    # DCP's zip writer reports a full disk as "unexpected pos": judge by the space there was instead
    written = sum(f.stat().st_size for f in p.tmp.rglob("*") if f.is_file()) if p.tmp.is_dir() else 0
    full = is_disk_full(e) or (need is not None and _free_bytes(p.ckdir) + written < need)
    if p.rank == 0:
        shutil.rmtree(p.tmp, ignore_errors=True)
    return disk_full_error(p.ckdir / p.name, e, need) if full else e


def _free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 1 << 62


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """About what this rank's shards of a checkpoint take: its model and optimizer tensors, plus the
    ~2 KiB of zip records DCP's torch.save writes around each one."""
    tensors = [t for t in (*model.state_dict().values(), *(v for st in opt.state.values() for v in st.values()))
               if isinstance(t, torch.Tensor)]
    return sum(local_part(t).numel() * t.element_size() + 2048 for t in tensors)


def begin_save(ckdir: Path, step: int, run_id: str, loop: dict, model: torch.nn.Module,
               opt: torch.optim.Optimizer, device: torch.device, groups=None, rank: int = 0, world: int = 1,
               writer=None, keep: int | None = KEEP_LAST) -> PendingSave:
    """Every rank calls this (groups=None: one process). Model and optimizer shards go to a temporary
    directory: written before returning, or (`writer`, a marin.parallel.AsyncCheckpointer) staged in
    host memory and written in the background while training goes on. This rank's RNG state is
    written now. Nothing is a checkpoint until `commit`."""
    meta = {"format": FORMAT, "run_id": run_id, "step": step, "loop": loop, "world_size": world,
            "ep_size": groups.ep_size if groups is not None else 1}
    p = PendingSave(ckdir, f"ckpt_{step:09d}", meta, writer, rank, world, keep)
    need = state_bytes(model, opt)
    try:
        if rank == 0:
            shutil.rmtree(p.tmp, ignore_errors=True)
        if _free_bytes(ckdir) < need:  # this rank's shards alone do not fit: say so before writing any
            raise OSError(errno.ENOSPC, "No space left on device", str(ckdir))
        if rank == 0:
            p.tmp.mkdir()
        if world > 1:
            dist.barrier()
        if writer is not None:
            writer.save(model, p.tmp / "dcp", opt)
        else:
            ep.save_checkpoint(model, p.tmp / "dcp", groups, opt)
        rng = rng_state(device)

        def write_rng(f) -> None:
            buf = io.BytesIO()
            torch.save(rng, buf)
            run_files.write_stream(f, buf.getvalue())  # looked up at call time: fault-injection tests patch it

        atomic_write(p.tmp / f"rng_{rank}.pt", write_rng)
    except BaseException as e:
        if writer is not None:
            abandon(p)
        err = _failed(p, e, need)
        if err is e:
            raise
        raise err from e
    return p


def commit(p: PendingSave) -> Path:
    """Every rank calls this: wait until its shards are on disk, then rank 0 records every file's
    digest in meta.json (the last file written: only durable data is ever a checkpoint), renames the
    directory into place and prunes to the newest `p.keep` that verify (`prune`)."""
    final = p.ckdir / p.name
    ok = True
    try:
        if p.writer is not None:
            p.writer.wait()
        if p.world > 1:
            dist.barrier()
        if p.rank == 0:
            files = {f.relative_to(p.tmp).as_posix(): file_digest(f) for f in sorted(p.tmp.rglob("*")) if f.is_file()}
            atomic_write_text(p.tmp / META, json.dumps(dict(p.meta, files=files), indent=1))
            if final.exists():
                shutil.rmtree(final)
            p.tmp.rename(final)
            _mark_verified(final)
            log.info("checkpoint %s", p.name)
            prune(p.ckdir, p.meta["run_id"], p.keep, final)
    except BaseException as e:
        ok = False
        err = _failed(p, e)
        if err is e:
            raise
        raise err from e
    finally:
        if p.world > 1 and ok:
            dist.barrier()
    return final


_VERIFIED: dict[Path, int] = {}  # checkpoint -> its meta.json's mtime when this process last verified it


def _mark_verified(ck: Path) -> None:
    _VERIFIED[ck] = (ck / META).stat().st_mtime_ns


def _verifies(ck: Path, run_id: str) -> bool | None:
    """True when `ck` is a usable checkpoint of `run_id`, False when damaged, None when another run's."""
    with contextlib.suppress(OSError):
        if _VERIFIED.get(ck) == (ck / META).stat().st_mtime_ns:
            return True
    try:
        verify(ck, read_meta(ck, run_id))
    except CheckpointError:
        return False
    except ValueError:  # another run's: never ours to delete
        return None
    _mark_verified(ck)
    return True


def prune(ckdir: Path, run_id: str, keep: int | None, current: Path | None = None) -> list[Path]:
    """Keep the newest `keep` checkpoints that verify (`current`, just written, always), delete the
    rest of this run's (damaged ones too: they never load); None keeps everything. Returns the deleted."""
    if keep is None:
        return []
    kept, gone = 0, []
    for ck in checkpoint_dirs(ckdir):
        ok = True if ck == current else _verifies(ck, run_id)
        if ok is None or (ok and kept < keep):
            kept += bool(ok)
            continue
        if not ok:
            log.warning("checkpoint %s does not verify: removed (a newer one that verifies is kept)", ck.name)
        shutil.rmtree(ck)
        _VERIFIED.pop(ck, None)
        gone.append(ck)
    return gone


def check_no_symlinks(run_dir: Path) -> None:
    """A run directory holds only its own files: a symbolic link in it (a checkpoint folder linked from
    elsewhere) would be followed by resume and cannot be pruned; refuse it, naming the path."""
    tops = [t for t in (run_dir, run_dir / "checkpoints") if t.is_dir() and not (t.is_symlink() and t != run_dir)]
    cks = checkpoint_dirs(run_dir / "checkpoints")
    for what, paths in (("a run directory", (p for t in tops for p in t.iterdir())),
                        ("a checkpoint", (p for ck in cks for p in ck.rglob("*")))):
        for p in paths:
            if p.is_symlink():
                raise ValueError(f"{p} is a symbolic link (to {p.readlink()}); {what} holds only its own files: "
                                 "replace the link with a copy, or remove it")


def abandon(p: PendingSave) -> None:
    """On a failure elsewhere: let this rank's background write finish (a thread killed mid-write
    helps nobody) without making it a checkpoint; its temporary directory is removed on the next start."""
    if p.writer is not None:
        try:
            p.writer.wait()
        except BaseException as e:  # noqa: BLE001 - the failure being handled matters more
            log.warning("abandoned checkpoint %s: its write failed too (%s)", p.name, e)


def save(ckdir: Path, step: int, run_id: str, loop: dict, model: torch.nn.Module, opt: torch.optim.Optimizer,
         device: torch.device, groups=None, rank: int = 0, world: int = 1) -> Path:
    """A checkpoint written before returning: `begin_save` then `commit`."""
    return commit(begin_save(ckdir, step, run_id, loop, model, opt, device, groups, rank, world))


# ---- Load ----------------------------------------------------------------------------------------


def read_meta(ck: Path, run_id: str) -> dict:
    """meta.json of a checkpoint, checked for format and run identity before any tensor is read."""
    try:
        meta = read_json_text(ck / META)
    except FileNotFoundError:
        raise CheckpointError(f"{ck.name}: no {META} (an unfinished write)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ck.name}: {META} is unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        raise CheckpointError(f"{ck.name}: {META} is not a format-{FORMAT} checkpoint record")
    if meta.get("run_id") != run_id:
        raise ValueError(f"checkpoint {ck} belongs to run {meta.get('run_id')}, not {run_id}; use another "
                         "--run-dir, or move that directory aside first")
    return meta


def verify(ck: Path, meta: dict) -> None:
    """Every recorded file present with its recorded size and sha256 (size first: cheap)."""
    for rel, want in meta["files"].items():
        p = ck / rel
        if ".." in Path(rel).parts or not p.is_file():
            raise CheckpointError(f"{ck.name}: {rel} is missing")
        if p.stat().st_size != want.get("bytes"):
            raise CheckpointError(f"{ck.name}: {rel} has {p.stat().st_size} bytes, {want.get('bytes')} recorded")
        if file_digest(p)["sha256"] != want.get("sha256"):
            raise CheckpointError(f"{ck.name}: {rel} does not match its recorded sha256")
    if not any(rel.startswith("dcp/") for rel in meta["files"]):
        raise CheckpointError(f"{ck.name}: records no model state")
    _check_storage(ck, meta)


def _check_storage(ck: Path, meta: dict) -> None:
    """DCP's .metadata says which file (and byte range) holds each tensor: every one must be a file of this
    checkpoint that meta.json records (and `verify` hashed), inside its range; a .metadata pointing a tensor
    at another file (another run's weights, re-hashed into meta.json) is refused, naming the path."""
    if "dcp/.metadata" not in meta["files"]:
        return
    try:
        with open(ck / "dcp" / ".metadata", "rb") as f:
            md = _MetadataUnpickler(f).load()
    except Exception as e:  # noqa: BLE001 - any unpickling failure: the checkpoint is not used
        raise CheckpointError(f"{ck.name}: dcp/.metadata is unreadable ({e})") from None
    recorded = {rel[len("dcp/"):]: want.get("bytes") for rel, want in meta["files"].items() if rel.startswith("dcp/")}
    for info in (getattr(md, "storage_data", None) or {}).values():
        rel = getattr(info, "relative_path", None)
        size = recorded.get(rel) if isinstance(rel, str) else None
        if size is None or Path(rel).name != rel:
            raise CheckpointError(f"{ck.name}: dcp/.metadata points a tensor at {rel!r}, not a file of this "
                                  "checkpoint: never loaded")
        off, n = getattr(info, "offset", 0), getattr(info, "length", 0)
        if not (isinstance(off, int) and isinstance(n, int) and 0 <= off and 0 <= n and off + n <= size):
            raise CheckpointError(f"{ck.name}: dcp/.metadata reads bytes {off}..{off + n} of {rel!r}, which holds "
                                  f"{size}: never loaded")


def load_into(ck: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device,
              groups=None, rank: int = 0) -> None:
    """Model, optimizer and this rank's RNG from a verified checkpoint (no code from the files runs)."""
    reader, planner = _safe_dcp()
    ep.load_checkpoint(model, ck / "dcp", groups, opt, storage_reader=reader(str(ck / "dcp")), planner=planner())
    rng = ck / f"rng_{rank}.pt"
    if rng.exists():  # a checkpoint written by a smaller world has no state for this rank
        set_rng_state(torch.load(rng, map_location="cpu", weights_only=True), device)


def _dcp_error() -> type[BaseException]:
    """DCP reports a failed load as CheckpointException, a BaseException."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def candidates(ckdir: Path, run_id: str, skipped: list[str] | None = None) -> list[tuple[Path, dict]]:
    """Checkpoints that verify, newest first; each one skipped is logged (and added to `skipped`)."""
    skipped = [] if skipped is None else skipped
    out = []
    for ck in checkpoint_dirs(ckdir):
        try:
            meta = read_meta(ck, run_id)
            verify(ck, meta)
        except CheckpointError as e:
            skipped.append(str(e))
            log.warning("checkpoint skipped: %s", e)
            continue
        _mark_verified(ck)
        out.append((ck, meta))
    for stray in sorted(ckdir.glob("ckpt_*")):
        if not stray.is_dir():
            skipped.append(f"{stray.name} is not a checkpoint directory (never loaded)")
            log.warning("checkpoint skipped: %s", skipped[-1])
    return out


@dataclasses.dataclass
class _Fresh:
    """Model tensors (on the host), optimizer state and RNG before any load: put back after a failed
    one, so that a load is all-or-nothing (DCP writes into the live tensors, and initialises the
    optimizer's state with a zero-gradient step, before a later file can fail)."""

    tensors: dict[str, torch.Tensor] | None  # None: the model is not drawn yet (`init` redraws it)
    opt: dict
    rng: dict
    init: Callable[[], None] | None = None

    @classmethod
    def take(cls, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device,
             init: Callable[[], None] | None = None) -> _Fresh:
        own = dict(model.named_parameters()) | dict(model.named_buffers())
        tensors = None if init else {n: local_part(t).detach().to("cpu", copy=True) for n, t in own.items()}
        return cls(tensors, copy.deepcopy(opt.state_dict()), rng_state(device), init)

    def put_back(self, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device) -> None:
        own = dict(model.named_parameters()) | dict(model.named_buffers())
        with torch.no_grad():
            if self.init is not None:  # a half-loaded model: drawn afresh, as a fresh start would be
                self.init()
            else:
                for n, t in own.items():
                    local_part(t).copy_(self.tensors[n])
        for p in model.parameters():
            p.grad = None
        opt.state.clear()
        opt.load_state_dict(copy.deepcopy(self.opt))
        set_rng_state(self.rng, device)


def restore(ckdir: Path, run_id: str, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device,
            groups=None, rank: int = 0, world: int = 1, skipped: list[str] | None = None,
            init: Callable[[], None] | None = None) -> tuple[Path, dict] | None:
    """Load the newest checkpoint that verifies and loads on every rank; None when there is none.
    All-or-nothing: after a failed load the model, optimizer and RNG are put back as they were, so
    the next candidate (or a fresh start) begins from clean state. Rank 0 chooses the candidates (one
    decision for every rank); the reason each checkpoint was skipped is added to `skipped`. With `init`
    the model arrives undrawn (built on meta and materialised: a requeue draws no random weights only
    to overwrite them) and a failed load redraws it with `init` instead of copying a snapshot back."""
    skipped = [] if skipped is None else skipped
    box = [candidates(ckdir, run_id, skipped) if rank == 0 else None]
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    fresh = _Fresh.take(model, opt, device, init) if box[0] else None
    for ck, meta in box[0]:
        err = None
        try:
            load_into(ck, model, opt, device, groups, rank)
        except (Exception, _dcp_error()) as e:  # a file that verifies but does not load: fall back
            err = e
        if world > 1:
            flag = torch.tensor([0.0 if err is None else 1.0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            failed = bool(flag.item())
        else:
            failed = err is not None
        if not failed:
            return ck, meta
        fresh.put_back(model, opt, device)
        skipped.append(f"{ck.name} does not load ({err or 'on another rank'})")
        log.warning("checkpoint skipped: %s", skipped[-1])
    return None
