"""The test command's xdist workers keep the SLURM tests on one worker (tests/conftest.py): they share one
cluster, and the multi-node test takes a node down under whatever else the cluster runs (docs/testing.md,
"Parallel runs"). Checked with the real conftest and real workers, on a copy of it beside planted tests."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

PLANTED = '''
import os, time
import pytest

def _record(name):
    time.sleep(0.3)  # long enough that an ungrouped schedule hands these to several workers
    with open(os.environ["WORKER_LOG"], "a") as f:
        f.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.MARKER
@pytest.mark.parametrize("i", range(4))
def test_NAME(i):
    _record(f"NAME{i}")
'''


def _planted(tmp_path: Path, files: dict[str, tuple[str, str]]) -> subprocess.CompletedProcess:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: shares the one SLURM cluster\n"
                                         "    other: runs anywhere\n")
    (tmp_path / "integration").mkdir()
    for path, (marker, name) in files.items():
        (tmp_path / path).write_text(PLANTED.replace("MARKER", marker).replace("NAME", name))
    env = {**os.environ, "WORKER_LOG": str(tmp_path / "workers.log")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "3", "--dist",
                           "loadgroup", "integration"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_slurm_files_run_on_one_xdist_worker_under_loadgroup(tmp_path):
    r = _planted(tmp_path, {"integration/test_slurm.py": ("slurm", "cluster"),
                            "integration/test_slurm_nodes.py": ("slurm", "nodes"),
                            "integration/test_elsewhere.py": ("other", "elsewhere")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = dict(line.split() for line in (tmp_path / "workers.log").read_text().splitlines())
    assert len(ran) == 12, ran
    assert len({ran[f"{name}{i}"] for name in ("cluster", "nodes") for i in range(4)}) == 1, ran


def test_a_slurm_marker_outside_the_slurm_files_fails_that_test_before_it_runs(tmp_path):
    r = _planted(tmp_path, {"integration/test_slurm.py": ("slurm", "cluster"),
                            "integration/test_elsewhere.py": ("slurm", "elsewhere")})
    ran = (tmp_path / "workers.log").read_text().split()
    assert r.returncode == 1 and "4 passed, 4 errors" in r.stdout, r.stdout[-3000:]
    assert "the `slurm` marker and the SLURM files" in r.stdout and "integration/test_elsewhere.py" in r.stdout
    assert not [x for x in ran if x.startswith("elsewhere")], ran
