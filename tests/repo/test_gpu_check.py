"""benchmarks/gpu_check.sh, the script a lent GPU runs, cannot rot: its --cpu-dry mode runs every section's
code on CPU at a CPU's width (Triton under its interpreter) and writes the table for benchmarks/RESULTS.md.
Its kernels and blocks sections are benchmarks/gpu.py's own CPU dry run, so that script is checked here too:
a GPU session has 15 minutes, and neither may meet its first bug there."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

pytestmark = pytest.mark.slow  # five sections in fresh interpreters: minutes on 2 cores


@pytest.mark.timeout(3600)  # ~15 minutes on 2 shared cores: the Triton interpreter and fake-tensor layouts
def test_the_gpu_check_script_runs_every_section_on_cpu_and_writes_its_table(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "MARIN_CACHE_DIR": str(tmp_path / "cache"), "GPU_CHECK_CPU_FACTOR": "8",
           "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(SCRIPT), "--cpu-dry"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=3600)
    table = (tmp_path / "gpu_check.md").read_text()
    assert r.returncode == 0, r.stdout[-3000:] + table
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and ln.split("|")[1].strip().isdigit()]
    assert [ln.split("|")[2].strip() for ln in rows] == ["step_d512", "one_rank", "kernels", "step_hero", "blocks"]
    assert all(ln.split("|")[3].strip() == "ok" for ln in rows), table
    assert "losses of 2 steps finite | yes" in table and "losses vs one process | equal" in table
    assert "micro-batches x sequences" in table  # the layout each step ran in
    for log in sorted(tmp_path.glob("[0-9]-*.log")):  # a section that caught its own failure exits 0: read it
        bad = [ln for ln in log.read_text().splitlines() if "SECTION FAILED" in ln or " FAIL " in ln]
        assert not bad, f"{log.name}: {bad}"
    # sections 3 and 5 are benchmarks/gpu.py's whole CPU dry run (--quick --tiny), split at its blocks: every
    # one of its sections ran, the Triton ones under the interpreter, and the blocks eager with both bodies
    gpu_py = (tmp_path / "3-kernels.log").read_text() + (tmp_path / "5-blocks.log").read_text()
    assert "FAILED" not in gpu_py
    for section in ("== ceilings", "== sconv", "== xsa", "== moe_permute", "== grouped_gemm", "== model_parity",
                    "== syncs", "== blocks"):
        assert section in gpu_py, f"{section} did not run"
    assert "recipe eager attention=sdpa kernels=triton" in gpu_py and "plain eager" in gpu_py


def test_the_gpu_check_script_stays_within_a_lent_device_s_budget():
    # the caps of the GPU sections sum to under 9 minutes, with `timeout` on every section
    text = SCRIPT.read_text()
    caps = {ln.split()[1]: int(ln.split()[2]) for ln in map(str.strip, text.splitlines()) if ln.startswith("section ")}
    assert list(caps) == ["step_d512", "one_rank", "kernels", "step_hero", "blocks"]  # most valuable first
    assert sum(caps.values()) + 5 * 10 < 9 * 60, caps  # + each section's kill-after grace
    assert "timeout --kill-after" in text and "pip" not in text and "curl" not in text
