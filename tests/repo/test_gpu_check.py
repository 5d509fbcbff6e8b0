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
SECTIONS = ["fit_d1024", "flex_65k", "step_hero", "kernels", "one_rank", "blocks"]

@pytest.mark.slow  # six sections in fresh interpreters: minutes on 2 cores
@pytest.mark.timeout(3600)  # ~15 minutes on 2 shared cores: the Triton interpreter and fake-tensor layouts
def test_the_gpu_check_script_runs_every_section_on_cpu_and_writes_its_table(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "MARIN_CACHE_DIR": str(tmp_path / "cache"), "GPU_CHECK_CPU_FACTOR": "8",
           "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(SCRIPT), "--cpu-dry"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=3600)
    table = (tmp_path / "gpu_check.md").read_text()
    assert r.returncode == 0, r.stdout[-3000:] + table
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and ln.split("|")[1].strip().isdigit()]
    assert [ln.split("|")[2].strip() for ln in rows] == SECTIONS
    assert all(ln.split("|")[3].strip() == "ok" for ln in rows), table
    # each section's time against its cap here and its GPU cap
    assert all(int(ln.split("|")[4]) <= int(ln.split("|")[5]) and ln.split("|")[6].strip().isdigit() for ln in rows)
    assert "losses of 1 steps finite | yes" in table and "losses of 2 steps finite | yes" in table
    assert "losses vs one process | equal" in table and "flex-65k | local layer forward" in table
    assert "micro-batches x sequences" in table  # the layout each step ran in
    layouts = [ln for ln in table.splitlines() if ln.startswith("| layout |") and "micro-batches x sequences" in ln]
    assert len(layouts) == 2 and all("activations precomputed (gpu_check_layouts.json)" in ln for ln in layouts)
    for log in sorted(tmp_path.glob("[0-9]-*.log")):  # a section that caught its own failure exits 0: read it
        bad = [ln for ln in log.read_text().splitlines() if "SECTION FAILED" in ln or " FAIL " in ln]
        assert not bad, f"{log.name}: {bad}"
    # sections 4 and 6 are benchmarks/gpu.py's whole CPU dry run (--quick --tiny), split at its blocks: every
    # one of its sections ran, the Triton ones under the interpreter, and the blocks eager with both bodies
    gpu_py = (tmp_path / "4-kernels.log").read_text() + (tmp_path / "6-blocks.log").read_text()
    assert "FAILED" not in gpu_py
    for section in ("== ceilings", "== sconv", "== xsa", "== moe_permute", "== grouped_gemm", "== model_parity",
                    "== syncs", "== blocks"):
        assert section in gpu_py, f"{section} did not run"
    assert "recipe eager attention=sdpa kernels=triton" in gpu_py and "plain eager" in gpu_py


def test_the_gpu_check_script_stays_within_a_lent_device_s_budget():
    # a lent device gives 15 minutes, machine start included: the caps and each section's 10 s kill grace sum to 8
    # minutes at most, with `timeout` on every section, d1024's fit (the tightest) first
    text = SCRIPT.read_text()
    caps = {ln.split()[1]: int(ln.split()[2]) for ln in map(str.strip, text.splitlines()) if ln.startswith("section ")}
    assert list(caps) == SECTIONS  # most valuable first
    assert sum(caps.values()) + len(caps) * 10 <= 8 * 60, caps
    assert "timeout --kill-after=10" in text and "pip" not in text and "curl" not in text


def test_the_layouts_the_gpu_check_steps_are_precomputed_for_the_current_specs():
    """The fake-tensor activation fit (20-60 s a spec on CPU) must not spend the lent GPU's minutes: every spec the
    step sections lay out, at GPU width and --cpu-dry width, is in benchmarks/gpu_check_layouts.json; a changed
    spec (a new run identity) needs `python benchmarks/gpu_step.py precompute` on CPU."""
    import json

    sys.path.insert(0, str(ROOT / "tests"))
    from benchmod import bench

    from marin_ablate.planning.layout import activation_key

    g = bench("gpu_step")
    got = json.loads(g.PRECOMPUTED.read_text())
    for study, rung in g.STEPS:
        for dry in (False, True):
            key = activation_key(g.step_spec(study, rung, dry))
            assert key in got, f"{study} {rung} cpu_dry={dry}: run `python benchmarks/gpu_step.py precompute`"
            assert set(got[key]["act1"]) >= {"base", "per_local", "per_global", "peak"}
    assert [f"{s} {r}" if r else s for s, r in g.STEPS] == ["marin535 d1024", "hero_gpu"]
