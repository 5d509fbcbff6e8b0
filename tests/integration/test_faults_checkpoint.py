"""Checkpoint faults: crafted metadata pickles never run code (protocols 2-5, dotted names,
STACK_GLOBAL, nested pickles), a failed load leaves no partly loaded state, `--no-resume` never
deletes another run, retention keeps what verifies, and kills during checkpoint writes resume exactly."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import struct
from pathlib import Path

import pytest
import torch

from marin_ablate.marin.config import RunSpec, TrainConfig
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train import train
from marin_ablate.marin.train.checkpoint import _MetadataUnpickler
from marin_ablate.marin.train.files import file_digest

TINY = preset("tiny", ["seq_len=64"])


def _spec(steps: int, **kw) -> RunSpec:
    base = dict(steps=steps, batch_size=2, eval_every=0, eval_batches=1, log_every=1, checkpoint_every=0, threads=1)
    base.update(kw)
    return RunSpec(model=TINY, train=TrainConfig(**base))


# --- crafted pickles: opcodes written by hand, so that no pickler's own checks stand in the way ---


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _bytes(b: bytes) -> bytes:
    return b"B" + struct.pack("<I", len(b)) + b  # BINBYTES


def _stack_global(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + b"\x93"  # STACK_GLOBAL


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"  # GLOBAL (protocols 0-3)


def _call(proto: int, module: str, name: str, arg: bytes) -> bytes:
    """proto header, callable, one-argument tuple, REDUCE, STOP."""
    ref = _stack_global(module, name) if proto >= 4 else _global(module, name)
    return b"\x80" + bytes([proto]) + ref + arg + b"\x85R."


def _payloads(marker: Path) -> dict[str, bytes]:
    cmd = _str(f"touch {marker}")
    nested = _call(2, "os", "system", cmd)
    getattr_chain = (b"\x80\x04" + _stack_global("builtins", "getattr") + _stack_global("builtins", "__import__")
                     + _str("os") + b"\x85R" + _str("system") + b"\x86R" + cmd + b"\x85R.")
    return {
        "p2_global_os_system": _call(2, "os", "system", cmd),
        "p3_global_posix_system": _call(3, "posix", "system", cmd),
        "p4_dotted_under_dcp_filesystem": _call(4, "torch.distributed.checkpoint.filesystem", "os.system", cmd),
        "p5_dotted_under_dcp_metadata": _call(5, "torch.distributed.checkpoint.metadata", "os.system", cmd),
        "p4_dotted_through_torch": _call(4, "torch.distributed.checkpoint.metadata", "torch.serialization.os.system",
                                         cmd),
        "p4_dotted_torch_os": _call(4, "torch", "os.system", cmd),
        "p5_nested_pickle_loads": _call(5, "torch.distributed.checkpoint.filesystem", "pickle.loads", _bytes(nested)),
        "p2_nested_pickle_loads": _call(2, "pickle", "loads", _bytes(nested)),
        "p4_builtins_eval": _call(4, "builtins", "eval", _str(f"__import__('os').system('touch {marker}')")),
        "p4_builtins_getattr": getattr_chain,
        "p5_torch_serialization_dotted": _call(5, "torch.serialization", "os.system", cmd),
    }


@pytest.mark.parametrize("kind", sorted(_payloads(Path("m"))))
def test_crafted_metadata_pickles_are_refused_and_never_run(tmp_path, kind):
    marker = tmp_path / "pwned"
    payload = _payloads(marker)[kind]
    with pytest.raises(pickle.UnpicklingError, match="refusing to load it"):
        _MetadataUnpickler(io.BytesIO(payload)).load()
    assert not marker.exists()


def test_the_crafted_payloads_do_run_under_a_plain_unpickler(tmp_path):
    """The control: every payload is live (a plain pickle.loads runs it), so the refusal above matters."""
    for kind in sorted(_payloads(Path("m"))):
        marker = tmp_path / kind
        try:
            pickle.loads(_payloads(marker)[kind])
        except pickle.UnpicklingError:  # a nested payload's result is an int, not always a valid next op
            pass
        assert marker.exists(), kind


FS = "torch.distributed.checkpoint.filesystem"


def _builds() -> dict[str, bytes]:
    """BUILD (set attributes) through allowed names only: on an allowed class itself, and on an instance
    with a name that is no field of it (`__class__` would turn it into another class)."""
    evil = _stack_global("torch.serialization", "_get_layout")
    on_class = lambda proto, state: b"\x80" + bytes([proto]) + _stack_global(FS, "_StorageInfo") + state + b"b."
    slot = b"N}" + _str("__repr__") + evil + b"s\x86"  # (None, {"__repr__": _get_layout}): setattr on the target
    inst = _stack_global(FS, "_StorageInfo") + b")\x81"  # _StorageInfo.__new__(_StorageInfo)
    return {
        "p4_build_class_slotstate": on_class(4, slot),
        "p2_build_class_dict": b"\x80\x02" + _global(FS, "_StorageInfo") + b"}" + _str("__repr__")
                               + _global("torch.serialization", "_get_layout") + b"sb.",
        "p5_build_instance_class_swap": b"\x80\x05" + inst + b"N}" + _str("__class__")
                                        + _stack_global("torch", "Size") + b"s\x86b.",
        "p4_build_on_dtype": b"\x80\x04" + _stack_global("torch", "float32") + slot + b"b.",
    }


@pytest.mark.parametrize("kind", sorted(_builds()))
def test_metadata_build_on_anything_but_a_fresh_dcp_instance_is_refused(kind):
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    before = _StorageInfo.__repr__
    with pytest.raises(pickle.UnpicklingError, match="refusing to load it"):
        _MetadataUnpickler(io.BytesIO(_builds()[kind])).load()
    assert _StorageInfo.__repr__ is before


def test_the_build_payloads_do_rewrite_the_class_under_a_plain_unpickler():
    """The control: a plain unpickler lets the class-level BUILD replace `_StorageInfo.__repr__`."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    before = _StorageInfo.__repr__
    try:
        pickle.loads(_builds()["p4_build_class_slotstate"])
        assert _StorageInfo.__repr__ is not before
    finally:
        _StorageInfo.__repr__ = before


def test_real_dcp_metadata_round_trips_through_the_checked_unpickler():
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    m = Metadata(state_dict_metadata={"w": TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16),
                                                                 torch.Size([2, 3]), [ChunkStorageMetadata(
                                                                     torch.Size([0, 0]), torch.Size([2, 3]))])},
                 storage_data={MetadataIndex("w", torch.Size([0, 0])): _StorageInfo(Path("a/b"), 0, 10)},
                 storage_meta=StorageMeta(checkpoint_id=Path("/x")))
    for proto in (2, 3, 4, 5):
        assert _MetadataUnpickler(io.BytesIO(pickle.dumps(m, protocol=proto))).load() == m


def _rewrite(ck: Path, rel: str, data: bytes) -> None:
    """Replace a checkpoint file and record its new digest: a checkpoint that verifies but does not load."""
    (ck / rel).write_bytes(data)
    meta = json.loads((ck / "meta.json").read_text())
    meta["files"][rel] = file_digest(ck / rel)
    (ck / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def fresh6(tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("fresh") / "run"
    out = train(_spec(6, checkpoint_every=2), run)
    assert out["status"] == "completed" and out["resumed_from"] is None
    return out


def test_crafted_metadata_in_a_real_checkpoint_never_runs_and_the_run_falls_back(tmp_path, fresh6):
    run, marker = tmp_path / "run", tmp_path / "pwned"
    spec = _spec(6, checkpoint_every=2)
    assert train(spec, run, stop_after=4)["status"] == "interrupted"
    real = (run / "checkpoints" / "ckpt_000000002" / "dcp" / ".metadata").read_bytes()
    assert pickle.loads(real).state_dict_metadata.keys() == \
        _MetadataUnpickler(io.BytesIO(real)).load().state_dict_metadata.keys()  # a real one loads
    _rewrite(run / "checkpoints" / "ckpt_000000004", "dcp/.metadata",
             _payloads(marker)["p4_dotted_under_dcp_filesystem"])
    out = train(spec, run)
    assert not marker.exists()
    assert out["resumed_from"] == "ckpt_000000002"
    assert out["checkpoints_skipped"][0].startswith("ckpt_000000004: dcp/.metadata is unreadable (checkpoint metadata "
                                                    "refers to torch.distributed.checkpoint.filesystem.os.system")
    assert out["eval_macro_loss"] == pytest.approx(fresh6["eval_macro_loss"], rel=0, abs=1e-12)


@pytest.mark.parametrize("target", ["other_run", "absolute", "out_of_range"])
def test_a_rehashed_metadata_pointing_tensors_at_another_file_is_never_loaded(tmp_path, fresh6, target):
    """DCP's .metadata names the file and byte range of every tensor: one rewritten to read another run's
    weights (its digest re-recorded in meta.json, so it verifies) is refused naming the path, and the run
    resumes from its older checkpoint to the uninterrupted result."""
    import dataclasses

    run, other = tmp_path / "run", tmp_path / "other"
    spec = _spec(6, checkpoint_every=2)
    assert train(spec, run, stop_after=4)["status"] == "interrupted"
    assert train(_spec(6, checkpoint_every=2, seed_stream=1), other, stop_after=4)["status"] == "interrupted"
    ck = run / "checkpoints" / "ckpt_000000004"
    md = pickle.loads((ck / "dcp" / ".metadata").read_bytes())
    theirs = sorted((other / "checkpoints" / "ckpt_000000004" / "dcp").glob("*.distcp"))[0]
    path = {"other_run": os.path.relpath(theirs, ck / "dcp"), "absolute": str(theirs)}.get(target)
    md.storage_data = {k: dataclasses.replace(v, relative_path=path or v.relative_path,
                                              offset=v.offset + (10**9 if path is None else 0))
                       for k, v in md.storage_data.items()}
    _rewrite(ck, "dcp/.metadata", pickle.dumps(md))
    out = train(spec, run)
    assert out["resumed_from"] == "ckpt_000000002"
    why = out["checkpoints_skipped"][0]
    assert why.startswith("ckpt_000000004: dcp/.metadata ") and "never loaded" in why, why
    assert (path or "of ") in why
    assert out["eval_macro_loss"] == pytest.approx(fresh6["eval_macro_loss"], rel=0, abs=1e-12)


@pytest.mark.parametrize("which", ["every", "newest"])
def test_a_failed_load_leaves_no_partly_loaded_state(tmp_path, fresh6, which):
    """rng_0.pt is read after DCP has loaded the model and optimizer: a garbage one fails the load with
    the weights already overwritten. Every checkpoint failing gives exactly a clean fresh run (a partly
    loaded model used to give 5.0984 against 5.0661); the newest failing gives the older one's resume."""
    run = tmp_path / "run"
    spec = _spec(6, checkpoint_every=2)
    assert train(spec, run, stop_after=4)["status"] == "interrupted"
    cks = sorted((run / "checkpoints").glob("ckpt_*"))
    for ck in cks if which == "every" else cks[-1:]:
        _rewrite(ck, "rng_0.pt", b"not a torch file")
    out = train(spec, run)
    assert out["status"] == "completed"
    assert out["eval_macro_loss"] == pytest.approx(fresh6["eval_macro_loss"], rel=0, abs=1e-12)
    assert out["final_train_loss"] == pytest.approx(fresh6["final_train_loss"], rel=0, abs=1e-12)
    log = (run / "train.log").read_text()
    if which == "every":
        assert out["resumed_from"] is None and len(out["checkpoints_skipped"]) == 2
        assert "no checkpoint loads (2 skipped): starting fresh from step 0" in log
    else:
        assert out["resumed_from"] == "ckpt_000000002"
        assert "resumed" in log and "from ckpt_000000002 at step 2" in log


def _listing(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_no_resume_never_deletes_a_run_of_another_spec(tmp_path, capsys):
    from marin_ablate.cli.main import main as cli_main

    run = tmp_path / "run"
    assert train(_spec(2, checkpoint_every=1), run, stop_after=1)["status"] == "interrupted"
    (run / "train.log").unlink()  # the log is appended to by any attempt; the results must not change
    before = _listing(run)
    capsys.readouterr()
    argv = ["train", "--preset", "tiny", "--model.seq_len=64", "--train.steps", "3", "--train.batch_size=2",
            "--train.eval_batches=1", "--train.threads=1", "--run-dir", str(run), "--no-resume"]
    assert cli_main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "holds run" in err[0] and "(spec.json)" in err[0], err
    assert "--no-resume never deletes another run" in err[0] and "resume=False" not in err[0]
    (run / "train.log").unlink(missing_ok=True)
    assert _listing(run) == before  # spec, metrics and checkpoint all still there, unchanged
    (run / "spec.json").unlink()  # without spec.json, the checkpoints still say whose run it is
    with pytest.raises(ValueError, match=r"checkpoints/ckpt_000000001/meta.json"):
        train(_spec(3), run, resume=False)
    assert (run / "checkpoints" / "ckpt_000000001" / "meta.json").exists()


def test_a_setup_error_does_not_claim_the_directory_for_its_spec(tmp_path):
    from marin_ablate.marin.config import DataConfig

    empty = tmp_path / "eval"
    empty.mkdir()
    bad = RunSpec(model=TINY, train=_spec(2).train, data=DataConfig(eval_dir=str(empty)))
    with pytest.raises(ValueError, match="eval directory"):
        train(bad, tmp_path / "run")
    assert not (tmp_path / "run" / "spec.json").exists()
    assert train(_spec(2), tmp_path / "run")["status"] == "completed"  # the corrected rerun is not refused


def _names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_retention_keeps_the_newest_checkpoints_that_verify_and_a_completed_run_only_its_final_one(tmp_path):
    run = tmp_path / "run"
    spec = _spec(8, checkpoint_every=2)
    assert train(spec, run, stop_after=4)["status"] == "interrupted"
    assert _names(run) == ["ckpt_000000002", "ckpt_000000004"]

    bad = run / "checkpoints" / "ckpt_000000099"  # a damaged checkpoint with a higher step
    shutil.copytree(run / "checkpoints" / "ckpt_000000004", bad)
    shard = next((bad / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    assert train(spec, run, stop_after=2)["status"] == "interrupted"
    assert _names(run) == ["ckpt_000000004", "ckpt_000000006"]  # the damaged one goes, the last good one stays
    assert "ckpt_000000099 does not verify: removed" in (run / "train.log").read_text()
    assert train(spec, run)["status"] == "completed"
    assert _names(run) == ["ckpt_000000008"]  # completed: only its final checkpoint, of the last step


def test_keep_checkpoints_all_keeps_every_checkpoint_and_an_unknown_level_is_refused(tmp_path):
    run = tmp_path / "run"
    assert train(_spec(7, checkpoint_every=2), run, keep_checkpoints="all")["status"] == "completed"
    assert _names(run) == ["ckpt_000000002", "ckpt_000000004", "ckpt_000000006", "ckpt_000000007"]
    with pytest.raises(ValueError,
                       match="keep_checkpoints='some' is not a known level; allowed values: 'final', 'all', 'none'"):
        train(_spec(7), tmp_path / "other", keep_checkpoints="some")


def test_the_final_step_checkpoints_and_reloads_equal_to_the_trained_model(tmp_path, monkeypatch, recwarn):
    """`final` keeps the weights after step N (not the newest periodic one), verified, and they load
    back bit for bit equal to the model and optimizer in memory when the run finished."""
    from marin_ablate.marin.train import checkpoint as ckpt
    from marin_ablate.marin.train import loop
    from marin_ablate.marin.train.distributed import build_train_model
    from marin_ablate.marin.update_rules import build_optimizer, resolve_hparams

    held = {}
    finish = loop.Trainer.finish

    def spy(self, *a, **kw):  # the real finish, after copying what the trainer holds in memory
        held["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        held["opt"] = json.dumps(str(self.opt.state_dict()["param_groups"]))
        return finish(self, *a, **kw)

    monkeypatch.setattr(loop.Trainer, "finish", spy)
    run, spec = tmp_path / "run", _spec(7, checkpoint_every=3)
    assert train(spec, run, keep_checkpoints="final")["status"] == "completed"
    assert _names(run) == ["ckpt_000000007"]
    ck = run / "checkpoints" / "ckpt_000000007"
    meta = ckpt.read_meta(ck, spec.run_id)
    ckpt.verify(ck, meta)  # every file's digest as recorded
    assert meta["step"] == 7 and meta["loop"]["step"] == 7
    model = build_train_model(spec, torch.device("cpu"), None)
    opt = build_optimizer(model, resolve_hparams(spec))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = ckpt.restore(run / "checkpoints", spec.run_id, model, opt, torch.device("cpu"))
    assert found is not None and found[0] == ck
    got = model.state_dict()
    assert set(got) == set(held["model"])
    assert any(not torch.equal(before[k], held["model"][k]) for k in got)  # it trained: not the initial weights
    for k, v in held["model"].items():
        assert torch.equal(got[k], v), k
    assert json.dumps(str(opt.state_dict()["param_groups"])) == held["opt"]
    # one process saves and loads without DCP's "torch.distributed is disabled" UserWarning
    assert not [w for w in recwarn if "torch.distributed is disabled" in str(w.message)]


def test_a_completed_run_kept_at_none_writes_no_final_checkpoint_and_keeps_none(tmp_path):
    run = tmp_path / "run"
    assert train(_spec(5, checkpoint_every=2), run, keep_checkpoints="none")["status"] == "completed"
    assert _names(run) == []
    assert "checkpoint ckpt_000000005" not in (run / "train.log").read_text()


def test_a_symlink_in_a_run_folder_is_refused_naming_it(tmp_path):
    run = tmp_path / "run"
    spec = _spec(6, checkpoint_every=2)
    assert train(spec, run, stop_after=2)["status"] == "interrupted"
    ck = run / "checkpoints" / "ckpt_000000002"
    ck.rename(tmp_path / "elsewhere")
    ck.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=f"{ck} is a symbolic link .*replace the link with a copy, or remove it"):
        train(spec, run)
    assert (tmp_path / "elsewhere" / "meta.json").exists()  # nothing behind the link was touched


def test_a_stop_right_at_a_checkpoint_step_writes_it_once(tmp_path):
    run = tmp_path / "run"
    out = train(_spec(6, checkpoint_every=2), run, stop_after=2)
    assert out["status"] == "interrupted" and out["step"] == 2
    assert (run / "train.log").read_text().count("checkpoint ckpt_000000002") == 1


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MB filesystem (tmpfs; needs root): a checkpoint of the tiny model does not fit."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        if os.environ.get("CI"):  # CI runs as root: a skipped disk-full test there would hide a regression
            pytest.fail("cannot mount a tmpfs under CI (root is expected)")
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_disk_full_on_a_real_small_filesystem_names_the_path_and_the_bytes_needed(small_fs):
    import errno

    run = small_fs / "run"
    with pytest.raises(OSError) as e:
        train(_spec(4, checkpoint_every=2), run)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and "disk full" in msg, msg
    assert str(run / "checkpoints" / "ckpt_000000002") in msg
    assert "it needs about" in msg and "bytes)" in msg and "free there" in msg, msg
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]  # no temporary left behind


#: The file-system operations a checkpoint write is made of (Python audit events): each changes what a killed
#: process leaves on disk. A write-mode `open` creates or truncates a file; the rest create, rename or delete.
FS_EVENTS = ("open", "os.mkdir", "os.rename", "os.replace", "os.remove", "os.unlink", "os.rmdir", "shutil.rmtree",
             "os.truncate")


def _operation(event: str, args: tuple) -> str | None:
    """A checkpoint write's file operation as a name that is the same in every write: the event and the file's
    base name, step digits and random temporary suffixes masked (None: not a change to the disk)."""
    import re

    if event not in FS_EVENTS:
        return None
    if event == "open":
        mode, flags = args[1], args[2]
        if not (any(c in mode for c in "wax+") if mode else flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
            return None
    name = Path(str(args[0])).name if not isinstance(args[0], int) else "<fd>"
    name = re.sub(r"\.tmp\d+$", ".tmp*", re.sub(r"\.[a-z0-9_]{8}\.tmp$", ".*.tmp", re.sub(r"\d{9}", "#", name)))
    return f"{event} {name}"


def _fork_killed_at(spec: RunSpec, run: Path, target: tuple[str, int] | None, w: int) -> int:
    """Fork a real training process that SIGKILLs itself just before the `target` operation of a checkpoint
    write, (name, n): the n-th operation of that name within one write (("commit", 0): right after a write's
    commit; None: kill nothing and report each operation of the first write that prunes an older checkpoint).
    It writes every operation of its writes to `w`, one line each, so the parent sees where it died."""
    import signal
    import sys

    pid = os.fork()
    if pid != 0:
        return pid
    code = 1
    try:
        from marin_ablate.marin.train import checkpoint as ck

        inside, seen = [False], {}

        def at(op: str) -> None:
            n = seen.get(op, 0)
            seen[op] = n + 1
            os.write(w, f"{op}|{n}\n".encode())
            if (op, n) == target:
                os.kill(os.getpid(), signal.SIGKILL)

        def hook(event: str, args: tuple) -> None:
            op = _operation(event, args) if inside[0] else None
            if op is not None:
                at(op)

        sys.addaudithook(hook)  # for good: this process only trains, then exits
        begin, commit = ck.begin_save, ck.commit

        def begin_save(*a, **k):
            seen.clear()
            os.write(w, b"begin\n")
            inside[0] = True
            try:
                return begin(*a, **k)
            finally:
                inside[0] = False

        def commit_(p):
            inside[0] = True
            try:
                out = commit(p)
            finally:
                inside[0] = False
            pruned = any(op.startswith("shutil.rmtree ckpt_") for op in seen)
            at("commit")
            if target is None and pruned:
                os._exit(0)
            return out

        ck.begin_save, ck.commit = begin_save, commit_
        code = 0 if train(spec, run)["status"] == "completed" else 3
    finally:
        os._exit(code)


def _session(spec: RunSpec, run: Path, target: tuple[str, int] | None) -> tuple[int, list[str]]:
    """One forked training session to its end or its kill: (wait status, the lines it reported)."""
    r, w = os.pipe()
    pid = _fork_killed_at(spec, run, target, w)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return status, out.decode().splitlines()


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~22 forked sessions of a tiny model, each a setup, a step or two and a write
def test_a_kill_before_each_file_operation_of_a_checkpoint_write_then_resume_matches_an_uninterrupted_run(tmp_path):
    """A checkpoint write that prunes is a fixed sequence of file operations (the temporary folder, the DCP
    shards and metadata, the RNG file, meta.json, the rename that commits it, the old checkpoint's deletion file
    by file). SIGKILL lands just before each of them in turn, and once right after the commit, each in a
    session that resumes from the one before; the run then completes, and its result, metrics file and
    checkpoint folder are those of an uninterrupted run."""
    import signal

    spec = _spec(20, checkpoint_every=1, eval_every=4)
    want = train(spec, tmp_path / "ref")
    run = tmp_path / "run"
    # the operations of the first write that prunes (step 3), after which this session stops as if killed
    status, lines = _session(spec, run, None)
    assert os.waitstatus_to_exitcode(status) == 0
    last = len(lines) - 1 - lines[::-1].index("begin")
    points = [tuple(x.rsplit("|", 1)) for x in lines[last + 1:]]
    points = [(op, int(n)) for op, n in points]
    ops = [op for op, _ in points]
    assert "os.rename .ckpt_#.tmp" in ops and "shutil.rmtree ckpt_#" in ops and "os.remove meta.json" in ops, ops
    assert ops[-1] == "commit" and len(points) >= 15, points
    print(f"{len(points)} kill points:", ", ".join(f"{op}{f' #{n + 1}' if n else ''}" for op, n in points))
    for op, n in points:
        status, lines = _session(spec, run, (op, n))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (op, n, status)
        assert lines[-1] == f"{op}|{n}", (op, n, lines[-3:])  # it died there, not elsewhere
    got = train(spec, run)
    for key in ("final_train_loss", "eval_macro_loss", "eval_domain_loss", "loss_curve", "tokens", "step",
                "spike_steps", "max_grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=0, abs=1e-12) if isinstance(want[key], float) \
            else got[key] == want[key], key
    strip = ("tokens_per_s", "model_flops_per_s", "mfu")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    ref_lines = [json.loads(x) for x in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in x.items() if k not in strip} for x in lines] == \
        [{k: v for k, v in x.items() if k not in strip} for x in ref_lines]
    assert _names(run) == _names(tmp_path / "ref") and not [p for p in run.rglob("*") if ".tmp" in p.name]
