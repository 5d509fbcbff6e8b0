"""Command-line edges: a negative number after a flag is its value (`--pin-alpha -inf`), a value that does not
parse names the allowed values, `--tune.points` is bounded, a control character in a string option (an sbatch
field) is refused, the `--tuned` hint repeats the study as given, and the Optuna journal is read like input
(sweeps/tuning.py `check_journal`: the file, line and byte named)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from marin_ablate.cli.main import main


def _err(capsys) -> str:
    return capsys.readouterr().err


@pytest.mark.parametrize("value, shown", [("-inf", "-inf"), ("-1e5", "-100000.0"), ("-nan", "nan"),
                                          ("-Infinity", "-inf")])
def test_a_negative_number_after_a_flag_is_its_value_and_its_range_refuses_it(tmp_path, capsys, monkeypatch, value,
                                                                               shown):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "nowhere", "--pin-alpha", value]) == 2
    err = _err(capsys).strip()
    assert err == (f"marin-ablate analyze: error: --pin-alpha={shown} is out of range; allowed values: None or a "
                   "finite number > 0"), err
    assert list(tmp_path.iterdir()) == []


def test_a_double_dash_keeps_what_follows_positional():
    from marin_ablate.cli import parse as options
    from marin_ablate.cli.analyze import AnalyzeOptions

    assert options.parse(AnalyzeOptions, ["--pin-linf", "2", "--", "-5"]).study == "-5"


@pytest.mark.parametrize("argv, line", [
    (["run", "smoke", "--tune", "--tune.points", "1e20"],
     "argument --tune.points: '1e20' is not an integer; allowed values: an integer in 3..64"),
    (["run", "smoke", "--tune", "--tune.points", "100000000000000000000"],
     "--tune.points=100000000000000000000 is out of range; allowed values: an integer in 3..64"),
    (["analyze", "x", "--n-boot", "many"], "argument --n-boot: 'many' is not an integer; allowed values: an integer in "
                                           "0..1000000"),
])
def test_a_value_out_of_type_or_range_names_the_allowed_values_before_any_work(tmp_path, capsys, monkeypatch, argv,
                                                                                line):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert _err(capsys).strip().splitlines() == [f"marin-ablate {argv[0]}: error: {line}"]
    assert list(tmp_path.iterdir()) == []


def test_the_cli_bound_on_tune_points_is_the_tuners():
    from marin_ablate.cli.run import RunOptions
    from marin_ablate.sweeps.tuning import POINTS_MAX, TuneOptions

    tune = next(f for f in dataclasses.fields(RunOptions) if f.name == "tune")
    assert tune.metadata["option"]["section"] is TuneOptions  # the CLI's section is the tuner's own options
    f = next(f for f in dataclasses.fields(TuneOptions) if f.name == "points")
    assert f.metadata["option"]["hi"] == POINTS_MAX == 64
    with pytest.raises(ValueError, match="allowed values: an integer in 3..64"):
        TuneOptions(points=10**20)


@pytest.mark.parametrize("flag", ["--slurm.partition", "--slurm.account", "--slurm.setup", "--slurm.constraint"])
def test_a_newline_in_an_sbatch_field_is_refused_before_anything_is_written(tmp_path, capsys, flag):
    assert main(["run", "smoke", "--out", str(tmp_path), flag, "gpu\n#SBATCH --qos=high"]) == 2
    err = _err(capsys)
    assert f"{flag}=" in err and "holds a control character ('\\n'); allowed values: one line of printable text" in err
    assert list(tmp_path.iterdir()) == []


def test_the_tuned_hint_repeats_the_study_as_given_with_its_out_and_overrides():
    from marin_ablate.cli import parse as options
    from marin_ablate.cli.run import RunOptions, _hint

    args = options.parse(RunOptions, ["my dir/s.py:study", "--tune", "--tune.points", "4", "--out", "o", "--rungs",
                                      "cpu_s32", "--train.steps=4", "--workers", "1"])
    want = "marin-ablate run 'my dir/s.py:study' --rungs cpu_s32 --out o --train.steps=4 --tuned"
    assert _hint(args, "run", tuned=True) == want


def _journal(path: Path) -> bytes:
    """A real Optuna journal: one study, two finished trials."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(path))), study_name="s")
    for v in (1.0, 2.0):
        t = st.ask()
        st.tell(t, v)
    return path.read_bytes()


def test_a_sound_journal_passes_and_a_torn_last_line_is_refused_naming_file_line_and_cut(tmp_path):
    from marin_ablate.sweeps.tuning import check_journal, make_storage

    path = tmp_path / "optuna.journal"
    raw = _journal(path)
    check_journal(path)
    n = raw.count(b"\n")
    path.write_bytes(raw + b'{"op_code": 5, "worker_id": "a", "trial_id": 2, "sta')  # a writer killed mid-line
    with pytest.raises(ValueError) as e:
        make_storage(None, path)
    assert str(e.value) == (f"Optuna journal {path} line {n + 1} (byte {len(raw)}) is torn (no newline at its end: a "
                            f"writer was killed mid-append); allowed values: a journal of complete records: cut the "
                            f"file there (`truncate -s {len(raw)} {path}`) and run again (the trials before it are "
                            "kept)")
    path.write_bytes(raw)  # the cut it names: Optuna reads the trials before it
    assert len(make_storage(None, path).get_all_studies()) == 1


def test_a_damaged_journal_line_is_refused_by_run_tune_naming_it(tmp_path, capsys):
    from marin_ablate.sweeps.tuning import tune_dir

    path = tune_dir(tmp_path, "smoke") / "optuna.journal"
    path.parent.mkdir(parents=True)
    raw = _journal(path)
    first = raw.index(b"\n") + 1
    path.write_bytes(raw[:first] + b'{"op_kode": 1}\n' + raw[first:])
    assert main(["run", "smoke", "--tune", "--out", str(tmp_path), "--executor", "debug"]) == 2
    err = _err(capsys)
    assert (f"Optuna journal {path} line 2 (byte {first}) is not an Optuna journal record (a JSON object with an "
            "integer op_code)") in err, err
    assert sorted(p.name for p in path.parent.iterdir()) == ["optuna.journal"]  # no run written


def test_a_journal_line_of_an_unknown_operation_is_refused_naming_it_not_an_assertion(tmp_path):
    """Optuna's replay asserts "Should not reach." on an op_code it does not know; a known op_code whose fields it
    cannot replay is a refusal naming the journal too."""
    import optuna

    from marin_ablate.sweeps.tuning import make_storage

    path = tmp_path / "optuna.journal"
    raw = _journal(path)
    first = raw.index(b"\n") + 1
    path.write_bytes(raw[:first] + b'{"op_code": 99, "worker_id": "w"}\n' + raw[first:])
    with pytest.raises(ValueError) as e:
        make_storage(None, path)
    assert str(e.value).startswith(f"Optuna journal {path} line 2 (byte {first}) has op_code 99, not an operation of "
                                   f"Optuna {optuna.__version__} (0..10); allowed values: a journal of complete "
                                   "records: cut the file there"), str(e.value)
    path.write_bytes(raw[:first] + b'{"op_code": 4, "worker_id": "w"}\n' + raw[first:])  # CREATE_TRIAL, no fields
    with pytest.raises(ValueError, match=rf"^Optuna journal {path} cannot be replayed \(KeyError: "):
        make_storage(None, path)


@pytest.mark.parametrize("override, line", [
    ("--model.vocab_size=1", "ModelConfig.vocab_size=1 is smaller than the tokenizer's vocabulary (256, "
                             "DataConfig.tokenizer='byte'); allowed values: >= 256"),
    ("--data.eval_domains=nonesuch", "DataConfig.eval_domains: ['nonesuch'] are not domains of the embedded corpus; "
                                     "allowed values: prose, scripture, docs, code"),
])
def test_run_and_train_refuse_a_spec_train_cannot_run_before_anything_is_written(tmp_path, capsys, override, line):
    assert main(["run", "smoke", "--out", str(tmp_path / "out"), "--no-profile", override]) == 2
    assert line in _err(capsys)
    assert main(["train", "--preset", "tiny", "--run-dir", str(tmp_path / "run"), override]) == 2
    assert line in _err(capsys)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_the_command_imports_is_an_interrupt_not_a_traceback(tmp_path):
    """SIGINT while `analyze` is importing pandas (seconds on a loaded machine): exit 130, one line. The child
    starts as a terminal's foreground job (SIGINT at its default: a CI shell's background job inherits it
    ignored) and a sitecustomize holds it inside that import until the signal comes, so the signal cannot
    arrive after the imports, however late this process reads the child's output."""
    import os
    import signal
    import subprocess
    import sys

    from terminal import foreground

    root = Path(__file__).resolve().parents[2]
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import sys, time\n"
        "class _HoldPandas:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pandas':\n"
        "            sys.stderr.write('importing pandas\\n'); sys.stderr.flush()\n"
        "            time.sleep(120)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _HoldPandas())\n")
    path = [str(hook), str(root), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    p = subprocess.Popen([sys.executable, "-m", "marin_ablate", "analyze", "nowhere"], stderr=subprocess.PIPE,
                         text=True, env=env, cwd=tmp_path, preexec_fn=foreground)
    first = p.stderr.readline()
    assert first == "importing pandas\n", first + p.stderr.read()[-3000:]
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    p.wait(timeout=300)
    assert "Traceback" not in rest, rest[-3000:]
    assert rest.splitlines() == ["marin-ablate analyze: interrupted (SIGINT)"] and p.returncode == 130, (rest,
                                                                                                     p.returncode)


@pytest.mark.parametrize("argv, line", [
    (["plan", "smoke", "--bogus"], "marin-ablate plan: error: Unrecognized options: --bogus"),
    (["plan", "smoke", "--out"], "marin-ablate plan: error: Missing argument: Missing value for argument '--out'."),
])
def test_an_option_the_parser_refuses_is_one_line_naming_it(tmp_path, capsys, monkeypatch, argv, line):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = _err(capsys).strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err
