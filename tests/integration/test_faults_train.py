"""Training under faults: crafted checkpoints never run code, damaged metrics never fail a run, a
damaged newest checkpoint falls back to an older one, a full disk is named and leaves no temporary,
one process per run directory, Ctrl-C checkpoints, and SIGKILL at random points resumes exactly.

(# --- training --- : the training half of the fault tests; kept in its own file for an easy merge.)
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkout import copy_checkout
from terminal import foreground

from marin_ablate.marin.config import RunSpec, TrainConfig
from marin_ablate.marin.presets import preset
from marin_ablate.marin.train import train
from marin_ablate.marin.train.files import file_digest

# Multi-process training, torch.compile, simulated studies or real SLURM jobs: minutes on 2 cores.
# `python -m pytest -m "not slow"` leaves this file out of the development loop; CI runs it.
pytestmark = pytest.mark.slow


ROOT = Path(__file__).resolve().parents[2]
TINY = preset("tiny", ["seq_len=64"])


def _spec(steps: int, **kw) -> RunSpec:
    base = dict(steps=steps, batch_size=2, eval_every=0, eval_batches=1, log_every=1, checkpoint_every=0, threads=1)
    base.update(kw)
    return RunSpec(model=TINY, train=TrainConfig(**base))


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _temps(run_dir: Path) -> list[str]:
    return [str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.name.startswith(".") and ".tmp" in p.name]


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in _lines(run_dir) if "loss" in r]


class _Payload:
    """Unpickling this creates `marker`: the side effect a code-executing load would leave."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def ref6(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ref") / "run"
    assert train(_spec(6), run)["status"] == "completed"
    return run


def test_crafted_pickle_checkpoints_never_run_and_the_run_resumes_from_its_own(tmp_path, ref6):
    run = tmp_path / "run"
    spec = _spec(6, checkpoint_every=2)
    assert train(spec, run, stop_after=2)["status"] == "interrupted"
    ck = run / "checkpoints"
    markers = [tmp_path / f"pwned{i}" for i in range(3)]
    # a stray .pt file named like an old checkpoint, newer than the real one
    (ck / "ckpt_000000099.pt").write_bytes(pickle.dumps({"run_id": spec.run_id, "x": _Payload(markers[0])}))
    # a directory checkpoint whose files are payloads, with a side file that records them correctly
    evil = ck / "ckpt_000000098"
    (evil / "dcp").mkdir(parents=True)
    (evil / "dcp" / ".metadata").write_bytes(pickle.dumps(_Payload(markers[1])))
    (evil / "rng_0.pt").write_bytes(pickle.dumps(_Payload(markers[2])))
    files = {rel: file_digest(evil / rel) for rel in ("dcp/.metadata", "rng_0.pt")}
    meta = json.loads((ck / "ckpt_000000002" / "meta.json").read_text())
    (evil / "meta.json").write_text(json.dumps(dict(meta, step=98, files=files)))

    out = train(spec, run)
    assert out["status"] == "completed"
    assert not [m for m in markers if m.exists()]  # no payload ran
    log = (run / "train.log").read_text()
    assert "ckpt_000000099.pt is not a checkpoint directory" in log
    # refused as it is verified (its .metadata names no tensor file it records), before any load is tried
    assert "ckpt_000000098: dcp/.metadata is unreadable (checkpoint metadata refers to" in log
    assert "from ckpt_000000002 at step 2" in log
    assert _losses(run) == _losses(ref6)


def test_a_checkpoint_of_another_run_fails_cleanly_before_any_tensor_is_read(tmp_path):
    run = tmp_path / "run"
    assert train(_spec(4, checkpoint_every=2), run, stop_after=2)["status"] == "interrupted"
    other = _spec(5, checkpoint_every=2)
    (run / "spec.json").unlink()
    with pytest.raises(ValueError, match="belongs to run .*, not " + other.run_id):
        train(other, run)


def _damage(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "nul_padded":
        path.write_bytes(raw + b"\0" * 300)
    elif how == "non_utf8":
        path.write_bytes(raw[:10] + b"\xff" + raw[11:])
    elif how == "garbage_line":
        path.write_bytes(raw + b"{not json\n" + b'{"step": 2, "loss": "x"\n')


@pytest.mark.parametrize("how", ["deleted", "truncated", "nul_padded", "non_utf8", "garbage_line"])
def test_a_damaged_metrics_file_never_fails_the_run(tmp_path, ref6, how):
    run = tmp_path / "run"
    assert train(_spec(6), run, stop_after=3)["status"] == "interrupted"
    _damage(run / "metrics.jsonl", how)
    out = train(_spec(6), run)
    assert out["status"] == "completed" and out["step"] == 6
    got, want = dict(_losses(run)), dict(_losses(ref6))
    assert set(range(3, 6)) <= set(got)  # the steps after the checkpoint are all there
    assert all(got[s] == want[s] for s in got)  # every kept line is the uninterrupted run's
    if how in ("nul_padded", "garbage_line"):
        assert _losses(run) == _losses(ref6)  # damage after the last good line loses nothing
    assert out["loss_curve"] == [[s, got[s]] for s in sorted(got)]


@pytest.mark.parametrize("how", ["truncated", "empty", "no_meta"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, ref6, how):
    run = tmp_path / "run"
    assert train(_spec(6, checkpoint_every=2), run, stop_after=4)["status"] == "interrupted"
    newest = run / "checkpoints" / "ckpt_000000004"
    shard = next((newest / "dcp").glob("*.distcp"))
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    elif how == "empty":
        shard.write_bytes(b"")
    else:
        (newest / "meta.json").unlink()
    out = train(_spec(6, checkpoint_every=2), run)
    assert out["status"] == "completed"
    log = (run / "train.log").read_text()
    assert "checkpoint skipped: ckpt_000000004" in log and "from ckpt_000000002 at step 2" in log
    assert _losses(run) == _losses(ref6) and out["final_train_loss"] == json.loads(
        (ref6 / "summary.json").read_text())["final_train_loss"]


def test_disk_full_during_a_checkpoint_names_the_path_and_leaves_no_temporary(tmp_path, monkeypatch):
    import marin_ablate.marin.train.files as files

    run = tmp_path / "run"
    (run / "checkpoints" / ".ckpt_000000001.tmp").mkdir(parents=True)  # a killed writer's leftovers
    (run / ".summary.json.tmp999").write_text("{")

    real = files.write_stream

    def full(f, data):  # the disk fills up when the first checkpoint is written
        if "checkpoints" in str(f.name):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data)

    monkeypatch.setattr(files, "write_stream", full)
    with pytest.raises(OSError) as e:
        train(_spec(4, checkpoint_every=2), run)
    assert e.value.errno == errno.ENOSPC and "disk full" in str(e.value)
    assert str(run / "checkpoints" / "ckpt_000000002") in str(e.value)
    assert _temps(run) == []


def _cli(out: Path, *extra: str, steps: int = 6) -> list[str]:
    return ["--preset", "tiny", "--model.seq_len=64", "--train.steps", str(steps), "--train.batch_size=2",
            "--train.eval_every=0", "--train.eval_batches=1", "--train.log_every=1",
            "--train.threads=1", "--run-dir", str(out), *extra]


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail(f"{path} did not reach {n} lines")


def test_a_second_train_on_the_same_out_fails_with_one_line(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen([sys.executable, "-m", "marin_ablate", "train", *_cli(tmp_path / "run", steps=2000)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lines(tmp_path / "run" / "metrics.jsonl", 1, first)
        second = subprocess.run([sys.executable, "-m", "marin_ablate", "train", *_cli(tmp_path / "run", steps=2000)],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2
    err = [x for x in second.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and "is in use by another training process" in err[0], second.stderr


def test_ctrl_c_checkpoints_like_sigterm_and_the_run_resumes(tmp_path, ref6):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "marin_ablate", "train", *_cli(run, steps=2000)], cwd=ROOT,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=foreground)
    _wait_for_lines(run / "metrics.jsonl", 2, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    status = json.loads(out.strip().splitlines()[-1])
    assert status["status"] == "interrupted"
    assert (run / "checkpoints" / f"ckpt_{status['step']:09d}" / "meta.json").exists()


def _fork_train(spec: RunSpec, run: Path) -> int:
    pid = os.fork()
    if pid == 0:  # the child trains and exits without running the parent's cleanup
        code = 1
        try:
            code = 0 if train(spec, run)["status"] == "completed" else 3
        finally:
            os._exit(code)
    return pid


def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(tmp_path):
    """A real training process (forked: torch and the corpus are loaded once) is killed with SIGKILL at
    random times, 20 times or more, and resumed each time. Checkpoints every step and a metrics line per
    step keep writes in flight most of the time, so kills land inside checkpoint and metrics writes."""
    spec = _spec(8, checkpoint_every=1, eval_every=4)
    ref = tmp_path / "ref"
    t = time.monotonic()
    assert train(spec, ref)["status"] == "completed"
    span = time.monotonic() - t
    rng = random.Random(1234)
    run, kills = tmp_path / "run", 0
    while True:
        pid = _fork_train(spec, run)
        if kills < 20:
            time.sleep(rng.uniform(0.02, 0.7 * span))  # setup, steps and their writes alike
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                kills += 1
                continue
        else:
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        if kills >= 20:
            break
        (run / "summary.json").unlink()  # finished before the kill landed: train it again from scratch
        for p in (run / "checkpoints").iterdir():
            __import__("shutil").rmtree(p)
    a, b = json.loads((run / "summary.json").read_text()), json.loads((ref / "summary.json").read_text())
    for key in ("final_train_loss", "eval_macro_loss", "eval_domain_loss", "loss_curve", "tokens", "step",
                "spike_steps", "max_grad_norm"):
        assert a[key] == b[key], key
    strip = ("tokens_per_s", "model_flops_per_s", "mfu")
    assert [{k: v for k, v in r.items() if k not in strip} for r in _lines(run)] == \
        [{k: v for k, v in r.items() if k not in strip} for r in _lines(ref)]
    assert _temps(run) == []


def test_a_resume_under_changed_code_is_warned_about_and_every_version_is_recorded(tmp_path):
    """The second session runs from a copy of marin/ with one source line more (another code version)."""

    from marin_ablate.analysis.io.results import collect
    from marin_ablate.analysis.report.provenance import provenance
    from marin_ablate.marin.train.machine import code_version

    spec = _spec(4)
    run = tmp_path / "study" / "runs" / spec.run_id  # a study's folder is named by its run id (marin.schema.foreign)
    assert train(spec, run, stop_after=2)["status"] == "interrupted"
    copy = copy_checkout(tmp_path / "src")
    with open(copy / "marin" / "train" / "machine.py", "a") as f:
        f.write("# a later commit\n")
    script = ("import sys, json; from marin_ablate.marin.config import RunSpec; "
              "from marin_ablate.marin.train import train; "
              "print(json.dumps(train(RunSpec.from_dict(json.loads(sys.argv[1])), sys.argv[2])['status']))")
    env = dict(os.environ, PYTHONPATH=str(copy))
    p = subprocess.run([sys.executable, "-c", script, json.dumps(spec.to_dict()), str(run)], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.stdout.strip() == '"completed"', p.stderr[-3000:]
    summ = json.loads((run / "summary.json").read_text())
    old = code_version()
    assert len(summ["code_versions"]) == 2 and summ["code_versions"][0] == old != summ["code_versions"][1]
    assert summ["code_version"] == summ["code_versions"][1]
    log = (run / "train.log").read_text()
    assert f"code changed since the checkpoint: {spec.run_id} trained steps 0-1 with {old}, continues at step 2" in log
    t = collect(tmp_path / "study", write=False)
    assert t.loc[0, "code_versions"] == " → ".join(summ["code_versions"])

    class A:
        factors, table = [], t

    line = provenance(A(), t, None)[1]
    assert "1 run(s) resumed under changed code" in line and f"{spec.run_id} ({old} → " in line


def test_a_trained_summary_agrees_with_its_spec_and_a_longer_runs_borrowed_one_is_trained_again(tmp_path):
    """What a run trains (steps, tokens, FLOPs at each context stage, token and FLOP multipliers) is what its own
    summary says; another run's summary with its run_id edited is no verdict: `train` resumes the run and
    writes its own (docs/faults.md)."""
    from marin_ablate.marin.config import ContextStage, RunSpec, TrainConfig
    from marin_ablate.marin.flops import summary_contradiction
    from marin_ablate.marin.presets import preset
    from marin_ablate.marin.train import train

    def spec(steps: int, **kw) -> RunSpec:
        return RunSpec(model=preset("tiny"), train=TrainConfig(steps=steps, batch_size=4, eval_every=0, eval_batches=1,
                                                               checkpoint_every=0, threads=1, **kw))

    for name, s in {"staged": spec(4, context_stages=(ContextStage(0.5, 128),)),
                    "multiplied": spec(2, token_multiplier=2, flops_multiplier=2.0)}.items():
        done = train(s, tmp_path / name)
        assert summary_contradiction(s.to_dict(), done, name) is None, name
    short, long_ = spec(4), spec(8)
    train(short, tmp_path / "short")
    longer = train(long_, tmp_path / "long")
    borrowed = {**longer, "run_id": short.run_id}
    why = summary_contradiction(short.to_dict(), borrowed, "runs/short")
    assert why.startswith("runs/short: summary.json has step=8 but spec.json trains 4 (4 steps of 4 x 64 tokens)")
    (tmp_path / "short" / "summary.json").write_text(json.dumps(borrowed))
    again = train(short, tmp_path / "short")
    assert again["step"] == 4 and again["tokens"] == 4 * 4 * 64 and again["resumed_from"] is not None
    assert json.loads((tmp_path / "short" / "summary.json").read_text())["step"] == 4
